"""`andrea generate` and `andrea chat`: text from a checkpoint, streamed as it is produced."""

from __future__ import annotations

import sys

from andrea.cli.common import MAX_PROMPT_BYTES, read_stdin
from andrea.decoding import CHAT_TEMPERATURE, CHAT_TOP_K
from andrea.errors import AndreaError
from andrea.validate import MAX_SEED, flag_number

PROMPT_ADVICE = "give a shorter prompt (a model sees only the last part of it that fits its context)"


def _check_prompt(prompt: str) -> str:
    """A prompt from the command line: undecodable bytes in it arrive as lone surrogates."""
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError:
        raise AndreaError("the --prompt is not UTF-8 text; andrea reads prompts as UTF-8.") from None
    return prompt


def _sampling(args) -> dict:
    from andrea.decoding.generate import check_sampling

    check_sampling(args.max_new_tokens, args.temperature, args.top_k, args.top_p, args.seed)
    return dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                top_p=args.top_p, seed=args.seed, greedy=args.greedy)


def _device(args) -> str:
    """--device: auto is CUDA where torch sees a device (decoded as a replayed CUDA graph), else the CPU."""
    import torch

    from andrea.errors import AndreaError

    if args.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if args.device == "cuda" and not torch.cuda.is_available():
        raise AndreaError("--device cuda: torch sees no CUDA device here; use --device cpu (or auto).")
    return args.device


def cmd_generate(args) -> int:
    from andrea.decoding.generate import load

    sampling = _sampling(args)
    if args.prompt is not None:
        prompt = _check_prompt(args.prompt)
    else:
        prompt = read_stdin("the prompt on standard input", MAX_PROMPT_BYTES, advice=PROMPT_ADVICE)
        if prompt.endswith("\n"):
            prompt = prompt[:-1]
    generator = load(args.checkpoint, _device(args))
    out = sys.stdout
    for piece in generator.stream(prompt, **sampling):
        out.write(piece)
        out.flush()
    out.write("\n")
    out.flush()
    return 0


def cmd_chat(args) -> int:
    from andrea.decoding.generate import load

    sampling = _sampling(args)
    chat = load(args.checkpoint, _device(args)).chat(**sampling)
    out, interactive = sys.stdout, sys.stdin.isatty()
    while True:
        if interactive:
            out.write("> ")
            out.flush()
        line = read_stdin("a line on standard input", MAX_PROMPT_BYTES, line=True, advice=PROMPT_ADVICE).rstrip("\r\n")
        if not line.strip() or line.strip() == "/quit":
            break
        out.write("< ")
        for piece in chat.reply(line):
            out.write(piece)
            out.flush()
        out.write("\n")
        out.flush()
    return 0


def _add_sampling_args(p, temperature: float = 1.0, top_k: int | None = None) -> None:
    p.add_argument("--checkpoint", required=True, help="a checkpoint file or a run folder (best, else latest)")
    p.add_argument("--max-new-tokens", type=flag_number(int, 1, 1_000_000), default=256, help="most tokens to generate (default 256)")
    p.add_argument("--temperature", type=flag_number(float, 0, 1_000), default=temperature,
                   help=f"divide the logits by T before sampling; 0 is greedy (default {temperature:g})")
    p.add_argument("--top-k", type=flag_number(int, 1, 10_000_000), default=top_k,
                   help="sample only among the K most likely tokens" + (f" (default {top_k}; V or more: every token)"
                                                                         if top_k else ""))
    p.add_argument("--top-p", type=flag_number(float, 0, 1, lo_open=True), default=None, help="sample only among the most likely tokens holding probability P (0 < P <= 1)")
    p.add_argument("--seed", type=flag_number(int, 0, MAX_SEED), default=None, help="seed of the sampler: the same seed gives the same text")
    p.add_argument("--greedy", action="store_true", help="always take the most likely token")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="where the model runs (default auto: a CUDA GPU if torch sees one, else the CPU)")


def register(sub) -> None:
    p = sub.add_parser("generate", help="continue a prompt, streaming the text as it is produced",
                       description="Continue a prompt with a trained model and print the new text (without the "
                                   "prompt) as it is produced. Generation stops at BOS or after --max-new-tokens; past "
                                   "the context, the window slides to its last half.")
    _add_sampling_args(p)
    p.add_argument("--prompt", help="the text to continue (default: standard input, less one final newline)")
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("chat", help="talk with a model, one line each, in ANDREA's `> ` / `< ` turn format",
                       description="Read a line, print the model's one-line answer after `< `, repeat. The history "
                                   "stays within the context (the oldest turns are dropped). An empty line, /quit or "
                                   "end of input ends the chat. It samples at temperature "
                                   f"{CHAT_TEMPERATURE:g} among the {CHAT_TOP_K} most likely tokens unless told otherwise.")
    _add_sampling_args(p, CHAT_TEMPERATURE, CHAT_TOP_K)
    p.set_defaults(func=cmd_chat)
