"""Does the main job's model answer in the chat format? Replies to a fixed set of lines, measured.

Each of PROMPTS is sent, as the first line of a new conversation, to `andrea chat`'s own code
(`andrea.decoding.generate.Chat`, which `andrea serve`'s chat completions share through
`chat_prompt_ids`) with its defaults (`andrea.decoding`'s CHAT_TEMPERATURE and CHAT_TOP_K), at most 256 new tokens.
Once per seed. A reply is empty when it holds nothing but spaces; it ends at the turn's end when
the model wrote a newline (the turn format's end of a reply), at BOS, or at the length limit; it
is readable when it has 3 words or more, ends at the turn and repeats no 4 words of the prompt.
Several checkpoints are measured side by side (a model of today's corpus beside one of another),
each on the same prompts and seeds. Beside them, the corpus's own: the first replies of the
default corpus's conversations (chitchat's training text) to an opening line of 3 words or more,
as every prompt here is, judged by the same rule; what a model that wrote as its data does would
reach.

    .venv/bin/python benchmarks/bench_chat.py                                   # newest runs/main-*
    .venv/bin/python benchmarks/bench_chat.py --checkpoint before=runs/a after=runs/b
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from common import machine_line, md_table, say

# Lines a person might open a chat with: greetings, questions about the day, about likes and plans.
PROMPTS = [
    "Hi, how are you?",
    "What did you do today?",
    "Do you have any pets?",
    "What is your favourite food?",
    "Where are you from?",
    "What are you studying?",
    "Do you like to read?",
    "What music do you listen to?",
    "Any plans for the weekend?",
    "How was your day?",
    "What do you do for fun?",
    "Have you seen any good movies lately?",
    "Do you play any sports?",
    "What is the weather like there?",
    "I just got a new dog.",
    "I am so tired today.",
    "What is your favourite season?",
    "Do you like to travel?",
    "Tell me about your family.",
    "What do you want to do after college?",
    "Do you cook?",
    "I love cats.",
]
SEEDS = (1, 2, 3)
MAX_NEW_TOKENS = 256  # andrea chat's default


def newest_main_run(root: Path = Path("runs")) -> Path:
    runs = sorted((p.parent for p in root.glob("main-*/latest.safetensors")), key=lambda p: p.stat().st_mtime)
    if not runs:
        from andrea.errors import AndreaError

        raise AndreaError(f"no runs/main-*/latest.safetensors under {root}; run `andrea main` or pass --checkpoint.")
    return runs[-1]


def measure(checkpoint: Path, prompts: list[str], seeds, max_new_tokens: int, **sampling) -> dict:
    """Every reply to every prompt under every seed, with how it ended; `sampling` (temperature,
    top_k, top_p) replaces andrea chat's defaults."""
    from andrea.decoding.generate import load

    generator = load(checkpoint)
    replies = []
    t0 = time.time()
    for seed in seeds:
        for prompt in prompts:
            chat = generator.chat(max_new_tokens=max_new_tokens, seed=seed, **sampling)
            text = "".join(chat.reply(prompt))
            replies.append({"prompt": prompt, "seed": seed, "reply": text, "ended": chat.ended})
    n = len(replies)
    share = lambda test: sum(map(test, replies)) / n  # noqa: E731
    return {
        "checkpoint": str(checkpoint),
        "replies": replies,
        "seconds": time.time() - t0,
        "non_empty": share(lambda r: bool(r["reply"].strip())),
        "turn": share(lambda r: r["ended"] == "turn"),
        "bos": share(lambda r: r["ended"] == "bos"),
        "limit": share(lambda r: r["ended"] == "limit"),
        "words": sum(len(r["reply"].split()) for r in replies) / n,
        "readable": share(readable),
    }


def readable(r: dict) -> bool:
    """A reply a learner wants to read: 3 words or more, ended at the turn (not at BOS or the
    length limit), and no 4 words in a row taken from the prompt."""
    words = r["reply"].split()
    said = {tuple(g) for g in ngrams(r["prompt"].split(), 4)}
    return len(words) >= 3 and r["ended"] == "turn" and not any(tuple(g) in said for g in ngrams(words, 4))


def parse_sampling(text: str) -> dict:
    """`default` -> {} (andrea chat's own settings); "T[,K[,P]]" -> temperature, top_k, top_p, where
    a K or P left out or given as - is none (every token), not andrea chat's default."""
    if text == "default":
        return {}
    parts = text.split(",")
    if not 1 <= len(parts) <= 3:
        raise ValueError(f"--sampling {text!r}: give default or T[,K[,P]]")
    parts += ["-"] * (3 - len(parts))
    keys, kinds = ("temperature", "top_k", "top_p"), (float, int, float)
    return {k: None if v == "-" else kind(v) for k, kind, v in zip(keys, kinds, parts)}


def describe(sampling: dict) -> str:
    if not sampling:
        from andrea.decoding import CHAT_TEMPERATURE, CHAT_TOP_K

        return f"andrea chat's defaults (temperature {CHAT_TEMPERATURE:g}, top-k {CHAT_TOP_K})"
    return ", ".join(f"{k.replace('_', '-')} {'none' if v is None else format(v, 'g')}" for k, v in sampling.items())


def corpus_first_replies(split: str = "train") -> dict:
    """The default corpus's own first replies: in each of chitchat's conversations (its cached
    `split`.jsonl, fetched from its package as `andrea main` does) that opens with a `> ` line of
    3 words or more and answers with a `< ` line, that answer, judged by `readable`."""
    import json

    from andrea.corpus.registry import EVERYDAY_SOURCES, fetch_source

    folder = fetch_source(EVERYDAY_SOURCES["chitchat"], log=say)
    replies = []
    with open(folder / f"{split}.jsonl", encoding="utf-8") as f:
        for line in f:
            turns = json.loads(line)["text"].split("\n")
            if len(turns) > 1 and turns[0].startswith("> ") and turns[1].startswith("< ") \
                    and len(turns[0][2:].split()) >= 3:
                replies.append({"prompt": turns[0][2:], "reply": turns[1][2:], "ended": "turn"})
    return {"n": len(replies), "readable": sum(map(readable, replies)) / max(1, len(replies)),
            "words": sum(len(r["reply"].split()) for r in replies) / max(1, len(replies))}


def ngrams(words: list[str], n: int) -> list[list[str]]:
    return [words[i : i + n] for i in range(len(words) - n + 1)]


def main(argv=None) -> int:
    from andrea.errors import AndreaError

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", nargs="+", metavar="[LABEL=]PATH", help="run folders or checkpoint files, each "
                    "with a name to show when given as LABEL=PATH (default: the newest runs/main-*)")
    ap.add_argument("--seeds", nargs="+", type=int, default=list(SEEDS), help="sampling seeds (default 1 2 3)")
    ap.add_argument("--max-new-tokens", type=int, default=MAX_NEW_TOKENS, help="the length limit (default 256, "
                    "andrea chat's)")
    ap.add_argument("--examples", type=int, default=4, help="replies shown per checkpoint (default 4; 0: none)")
    ap.add_argument("--sampling", nargs="+", default=["default"], metavar="T[,K[,P]]",
                    help="sampling settings to measure each checkpoint under: `default` (andrea chat's own) or "
                         "temperature,top-k,top-p, a top-k or top-p left out or - being none, e.g. 1.0 or 0.7,-,0.9 "
                         "(default: default)")
    args = ap.parse_args(argv)
    try:
        given = [c.partition("=") if "=" in c else (c, "", c) for c in args.checkpoint or [str(newest_main_run())]]
        settings = [(s, parse_sampling(s)) for s in args.sampling]
        results = []
        for label, _, ckpt in given:
            ckpt = Path(ckpt)
            for name, sampling in settings:
                say(f"bench_chat: {len(PROMPTS)} prompts x {len(args.seeds)} seeds against {ckpt}, sampling {name}")
                shown = label if len(settings) == 1 else f"{label}, {name if sampling else 'andrea chat default'}"
                results.append((shown, measure(ckpt, PROMPTS, args.seeds, args.max_new_tokens, **sampling)))
    except (AndreaError, ValueError) as e:
        print(f"bench_chat: error: {e}", file=sys.stderr)
        return 2

    n = len(PROMPTS) * len(args.seeds)
    print("## Chatting with the main job's model\n")
    print(f"machine: {machine_line()}\n")
    print(f"{len(PROMPTS)} opening lines × seeds {', '.join(map(str, args.seeds))} ({n} replies per model), each the "
          f"first turn of a new `andrea chat` conversation (`andrea.decoding.generate.Chat`, "
          f"{' or '.join(describe(s) for _, s in settings)}, at most {args.max_new_tokens} new tokens). Non-empty: the reply holds more than spaces. Ends at the turn: the model "
          f"wrote the newline that ends a reply in the turn format; at the limit: it wrote {args.max_new_tokens} tokens "
          f"without one. Readable: 3 words or more, ends at the turn, and no 4 words in a row of the prompt.\n")
    rows = [[label, f"`{r['checkpoint']}`", f"{100 * r['non_empty']:.0f}%", f"{100 * r['turn']:.0f}%",
             f"{100 * r['bos']:.0f}%", f"{100 * r['limit']:.0f}%", f"{100 * r['readable']:.0f}%", f"{r['words']:.1f}",
             f"{r['seconds']:.0f} s"]
            for label, r in results]
    print(md_table(["model", "checkpoint", "non-empty", "ends at the turn", "ends at BOS", "ends at the limit",
                    "readable", "words per reply", "time"], rows, right={2, 3, 4, 5, 6, 7, 8}))
    own = corpus_first_replies()
    print(f"\nThe corpus's own: of chitchat's {own['n']:,} training conversations that open with a line of 3 words or "
          f"more, {100 * own['readable']:.0f}% answer it readably by the same rule ({own['words']:.1f} words per reply).")
    for label, r in results if args.examples else ():
        print(f"\nThe first {args.examples} replies of {label} (seed {args.seeds[0]}):\n\n```text")
        for rep in r["replies"][: args.examples]:
            text = rep["reply"] if len(rep["reply"]) <= 300 else rep["reply"][:297] + "..."
            print(f"> {rep['prompt']}\n< {text}")
        print("```")
    return 0


if __name__ == "__main__":
    sys.exit(main())
