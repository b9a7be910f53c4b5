"""Which sources make the main job's default corpus, and how many segments its tokenizer needs.

For every mix of sources (`--mixes`, each a '+'-joined list of fetched source names) and every
segment count (`--segments`), the main job's tokenizer is fitted as `andrea main` fits it (every
source an equal share, `andrea.mainjob.prepared_tokenizer`, cached) and measured on what the
lesson and the word-similarity scores need, without training a model:

  coverage   the share of SimLex-999's and WordSim-353's words (and pairs) that are one token in
             their word-initial form (" cat"), and whether the lesson's words (cat, dog, pet,
             Tuesday, ...) are;
  B/token    bytes per token on the held-out documents of the everyday sources and of the
             literary ones (higher: more text per model step);
  PPMI       Spearman ρ on SimLex-999 and WordSim-353 (all pairs, pieces averaged; n and the null
             spread 1/√(n − 1)) of the count-based reference on the mix's own training tokens
             (`andrea.inside.wordsim.ppmi_vectors`, ±2 tokens, SVD to --dim): what the text itself lets a
             learner recover, before any network is trained on it.

    .venv/bin/python benchmarks/bench_default_corpus.py
    .venv/bin/python benchmarks/bench_default_corpus.py --mixes chitchat+brown+big-txt+austen --segments 2048 4096 8192
"""

from __future__ import annotations

import argparse
import math
import sys
import time

from common import machine_line, md_table, say

from andrea.corpus.registry import EVERYDAY_SOURCES, LITERARY_SOURCES

EVERYDAY = list(EVERYDAY_SOURCES)
LITERARY = list(LITERARY_SOURCES)
MIXES = ["+".join(EVERYDAY), *("+".join(EVERYDAY + [s]) for s in LITERARY), "+".join(EVERYDAY + ["sotu", "moby-dick"]),
         "+".join(LITERARY)]


def held_out_bpt(tok, names: list[str]) -> float:
    """Bytes per token over the held-out documents of `names` together."""
    from andrea.tokenizer.sample import load_documents

    docs = [d for n in names for d in load_documents(n, "val")]
    n_bytes = sum(len(d.encode("utf-8")) for d in docs)
    return n_bytes / max(1, sum(map(len, tok.encode_batch(docs, bos=False))))


def ppmi_scores(tok, index, names: list[str], dim: int, sets) -> dict:
    """ρ of the PPMI reference on the mix's training tokens (each document after a BOS)."""
    import numpy as np

    from andrea.inside.wordsim import PAIR_SETS, ppmi_vectors, similarity
    from andrea.tokenizer.sample import load_documents

    ids = [np.asarray(t, dtype=np.int64) for n in names for t in tok.encode_batch(load_documents(n, "train"))]
    vectors = ppmi_vectors([np.concatenate(ids)], tok.vocab_size, dim)
    report = similarity({"ppmi": vectors}, index, sets, analogies=False)
    raw = report.tables["ppmi"]["raw"]
    return {name: raw[name]["all"] for name in PAIR_SETS} | {"tokens": int(sum(len(i) for i in ids))}


def rho(s: dict) -> str:
    return "n/a" if not math.isfinite(s["rho"]) else f"{s['rho']:+.3f} (±{s['null']:.3f})"


def measure(names: list[str], n_segments: int, dim: int, sets) -> list:
    from andrea.inside.wordsim import LESSON_WORDS, word_index
    from andrea.mainjob import prepared_tokenizer

    t = time.perf_counter()
    tok, _ = prepared_tokenizer(n_segments, names, log=say)
    fitted = time.perf_counter() - t
    index = word_index(tok, tok.vocab_size, sets)
    counts = index.counts(sets)
    lesson = [w for w in LESSON_WORDS if index.single(w)]
    everyday = [n for n in names if n in EVERYDAY]
    literary = [n for n in names if n not in EVERYDAY]
    scores = ppmi_scores(tok, index, names, dim, sets)
    share = {k: f"{c['single_token_words'] / c['words']:.0%} ({c['single_token_words']}/{c['words']})"
             for k, c in counts.items()}
    return ["+".join(names), f"{n_segments:,}", share["simlex999"], share["wordsim353"],
            f"{len(lesson)}/{len(LESSON_WORDS)}: {' '.join(lesson) or '-'}",
            f"{held_out_bpt(tok, everyday):.3f}" if everyday else "-",
            f"{held_out_bpt(tok, literary):.3f}" if literary else "-",
            rho(scores["simlex999"]), rho(scores["wordsim353"]), f"{scores['tokens']:,}", f"{fitted:.0f} s"]


def main(argv=None) -> int:
    from andrea.corpus.registry import fetch_source
    from andrea.errors import AndreaError
    from andrea.inside.wordsim import LESSON_WORDS, load_wordsets

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mixes", nargs="+", default=MIXES, metavar="A+B+...", help="source mixes (default: the everyday "
                    "four alone, with each literary source, with sotu and moby-dick, and the four literary alone)")
    ap.add_argument("--segments", nargs="+", type=int, default=[4096], help="segment counts (default 4096)")
    ap.add_argument("--dim", type=int, default=256, help="PPMI vectors' dimensions (default 256, the main job's d)")
    args = ap.parse_args(argv)
    try:
        sets = load_wordsets()
        known = {**EVERYDAY_SOURCES, **LITERARY_SOURCES}
        for mix in args.mixes:
            for name in mix.split("+"):
                if name not in known:
                    raise AndreaError(f"{name} is not an everyday or literary source ({', '.join(known)}).")
                fetch_source(known[name], log=say)
    except AndreaError as e:
        print(f"bench_default_corpus: {e}", file=sys.stderr)
        return 2
    rows = []
    for mix in args.mixes:
        for n in args.segments:
            say(f"{mix}, {n:,} segments")
            rows.append(measure(mix.split("+"), n, args.dim, sets))
    print("## The default corpus and its vocabulary, measured on the tokenizer (`bench_default_corpus.py`)\n")
    print(machine_line() + "\n")
    print(f"Each mix's tokenizer fitted as `andrea main` fits it (an equal share of text per source); lesson words: "
          f"{', '.join(LESSON_WORDS)}. Single-token share: SimLex-999's and WordSim-353's words whose word-initial "
          f"form is one token. B/token: held-out bytes per token. PPMI ρ: the count-based reference on the mix's "
          f"training tokens, all pairs (null spread in brackets), d {args.dim}.\n")
    print(md_table(["mix", "segments", "SimLex words single", "WordSim words single", "lesson words single",
                    "B/token everyday", "B/token literary", "PPMI SimLex ρ", "PPMI WordSim ρ", "training tokens",
                    "tokenizer fit"], rows, right={1, 5, 6, 9, 10}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
