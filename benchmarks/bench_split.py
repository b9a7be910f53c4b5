"""One token, the words it begins: do the blocks pull `␣cat` in cat, cats and category apart?

The tokenizer before word ends (version 4) gives `␣cat` to cat, cats, category, catholic, …: one
row for all of them, and a causal model cannot see at `␣cat` how the word goes on. This script
fits that tokenizer on the main job's training text (an equal share per source, the main job's
segment count; cached under --out), tokenizes the default corpus with it, trains the main job's CPU
model on it (the main job's recipe, batch and seed, --minutes), and then, for each token asked
(default ␣cat and ␣pet), reads the residual stream at the token in up to 32 uses of each of its
6 commonest words (`andrea.inside.context_vectors.split_states`): the share of the spread between the
words and leave-one-out naming, at the input row and after every block. Last, the same token's
uses under the main job's own tokenizer (version 5, word ends), counted in its shards: what is
left to pull apart there.

    .venv/bin/python benchmarks/bench_split.py
    .venv/bin/python benchmarks/bench_split.py --minutes 5 --tokens " cat" " pet" " the"
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from common import REPO, machine_line, md_table, say

from andrea.checkpoint import load_model
from andrea.config import get_preset
from andrea.corpus.registry import fetch_default_corpus
from andrea.errors import AndreaError
from andrea.inside.context_vectors import CONTEXT, SPLIT_USES, SPLIT_WORDS, begun_words, split_states
from andrea.mainjob import MainJob, main_job_data
from andrea.mainjob_settings import MAIN_SEGMENTS
from andrea.prepare import prepare
from andrea.shards import TokenData, open_token_data
from andrea.tokenizer.harris import HarrisTokenizer
from andrea.tokenizer.sample import load_training_texts
from andrea.tokenizer.train import train_tokenizer
from andrea.train import train
from andrea.usage import starts_word

VERSION = 4  # the tokenizer before word ends


def v4_data(out: Path, names: list[str]) -> tuple[HarrisTokenizer, Path]:
    """The version-4 tokenizer at the main job's segment count and the default corpus in its tokens (cached)."""
    tok_dir, data_dir = out / f"tokenizer-v{VERSION}-{MAIN_SEGMENTS}", out / f"data-v{VERSION}-{MAIN_SEGMENTS}"
    if (tok_dir / "harris_segments.json").is_file():
        tok = HarrisTokenizer.load(tok_dir)
    else:
        say(f"fitting the version-{VERSION} tokenizer ({MAIN_SEGMENTS:,} segments), an equal share of text per source")
        texts, weights = load_training_texts(names, {n: 1.0 for n in names})
        tok = train_tokenizer(texts, MAIN_SEGMENTS, weights=weights, version=VERSION)
        tok.save(tok_dir)
    if not (data_dir / "manifest.json").is_file():
        say(f"tokenizing {len(names)} sources into {data_dir}")
        prepare(tok, names, data_dir, log=say, progress=False)
    return tok, data_dir


def word_end_uses(tok, data: TokenData, token: str) -> str:
    """What `token` begins under the main job's own tokenizer, counted in its shards: one line."""
    ids = tok.encode(token, bos=False)
    pieces = " + ".join(tok.decode([i]).replace(" ", "␣") for i in ids)
    if len(ids) != 1:
        return f"`{token.replace(' ', '␣')}` is {len(ids)} tokens there ({pieces})"
    shards = [s for src in data.sources.values() for s in src.train.shards]
    found = begun_words(shards, ids[0], starts_word(tok), tok.decode, 1)
    total = sum(len(u) for u in found.values())
    top = sorted(found.items(), key=lambda kv: -len(kv[1]))[:4]
    share = ", ".join(f"{w} {100 * len(u) / max(total, 1):.1f}%" for w, u in top)
    return f"`{token.replace(' ', '␣')}` is one token (id {ids[0]}) in {total:,} uses, beginning: {share}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, default=15.0, help="training minutes (default 15, the main job's)")
    ap.add_argument("--tokens", nargs="+", default=[" cat", " pet"], help="tokens to split (default ' cat' ' pet')")
    ap.add_argument("--out", type=Path, default=REPO / "runs" / "bench-split")
    ap.add_argument("--reuse", action="store_true", help="score the run already in --out instead of training again")
    args = ap.parse_args()
    start = time.time()
    try:
        names = list(fetch_default_corpus(log=say))
        tok, data_dir = v4_data(args.out, names)
        job = MainJob.on("cpu", minutes=args.minutes)
        shape = job.shape("cpu")
        cfg = get_preset(shape["preset"]).replace(vocab_size=tok.vocab_size)
        run = args.out / f"v{VERSION}-seed-{job.seed}"
        if not (args.reuse and (run / "metrics.jsonl").is_file()):
            say(f"training {shape['preset']} (V {cfg.vocab_size:,}) for {args.minutes:g} minutes into {run}")
            result = train(cfg, job.options(shape, cfg.block_size), data_dir, run, log=say, progress=False, resume=False)
            trained = f"{result.step:,} steps, validation {result.eval['all']['bpb']:.4f} bits per byte (last evaluation)"
        else:
            trained = "the run already there"
        model, _, _ = load_model(run)
        model.eval()
        data = open_token_data(data_dir)
        results = [split_states(model, tok, data, t, log=say) for t in args.tokens]
        _, v5, _, v5_dir = main_job_data(MAIN_SEGMENTS, log=say)
        today = [word_end_uses(v5, open_token_data(v5_dir), t) for t in args.tokens]
    except AndreaError as e:
        print(f"bench_split: {e}", file=sys.stderr)
        return 2
    print("## One token, the words it begins (`benchmarks/bench_split.py`)\n")
    print(f"{machine_line()}. Tokenizer version {VERSION} (before word ends), {MAIN_SEGMENTS:,} segments, fitted on the "
          f"main job's training text; {shape['preset']} trained as the main job trains ({shape['batch_size']} × "
          f"{shape['seq_len']}, recipe {job.recipe}, seed {job.seed}) for {args.minutes:g} minutes: {trained}. "
          f"Per token: up to {SPLIT_USES} uses of each of its {SPLIT_WORDS} commonest words, the state at the token "
          f"in windows of {CONTEXT} tokens ending there. Between words: the share of the states' spread between the "
          f"words' means (words given at random score the null); named right: leave-one-out nearest mean. "
          f"{time.time() - start:.0f} s in all.\n")
    print("Under the main job's own tokenizer (version 5, word ends), counted in its training shards: "
          + "; ".join(today) + ".\n")
    for r in results:
        found = ", ".join(f"{w['word']} {w['uses']:,}" for w in r["found"][:8])
        print(f"`{r['token'].replace(' ', '␣')}`: {r['uses']:,} uses in the training text; the words it began: {found}.\n")
        rows = [[x["layer"], f"{x['between']:.3f}", f"{r['null']:.3f}", f"{100 * x['accuracy']:.0f}%",
                 f"{100 * r['chance']:.0f}%"] for x in r["layers"]]
        print(md_table(["layer", "between words", "null", "named right", "chance"], rows))
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
