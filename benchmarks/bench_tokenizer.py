"""The Harris tokenizer against a byte-level BPE (Hugging Face `tokenizers`), side by side.

Both get the same training text (the train split of the default corpus, about 38 MB) and the
same vocabulary size (8,192 segments + 257 = 8,449 = 256 bytes + BOS + 8,192 merges). Measured:
training time, encoding throughput of encode_batch on the training text (a fresh tokenizer, so
its word cache starts empty), and bytes per token on the held-out validation split. Timings are
the best of --repeat runs, as the machine may be shared. Prints a markdown table.

    python benchmarks/bench_tokenizer.py [--sources chitchat brown ...] [--repeat 3]
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import tempfile
import time

from common import fit_bpe


def best_time(fn, repeat):
    """(fastest wall time, the result of the last run)."""
    best, out = float("inf"), None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def main(argv=None) -> int:
    import tokenizers

    from andrea.corpus.registry import DEFAULT_SOURCE_NAMES
    from andrea.errors import AndreaError
    from andrea.tokenizer.harris import HarrisTokenizer
    from andrea.tokenizer.sample import load_documents
    from andrea.tokenizer.train import train_tokenizer

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sources", nargs="+", default=list(DEFAULT_SOURCE_NAMES), help="sources (default: the default corpus)")
    ap.add_argument("--segments", type=int, default=8192)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)

    try:
        train = [d for s in args.sources for d in load_documents(s, "train")]
        val = [d for s in args.sources for d in load_documents(s, "val")]
    except AndreaError as e:
        print(f"bench_tokenizer: {e}", file=sys.stderr)
        return 2
    train_bytes = sum(len(d.encode()) for d in train)
    val_bytes = sum(len(d.encode()) for d in val)
    vocab = args.segments + 257

    # ---- training
    t_harris, harris = best_time(lambda: train_tokenizer(train, args.segments), args.repeat)

    t_bpe, bpe = best_time(lambda: fit_bpe(train, vocab), args.repeat)
    assert bpe.get_vocab_size() == harris.vocab_size == vocab

    # ---- encoding: a tokenizer as it comes from disk, its cache empty, on every run
    with tempfile.TemporaryDirectory() as tmp:
        harris.save(tmp)
        e_harris, ids = best_time(lambda: HarrisTokenizer.load(tmp).encode_batch(train, bos=False), args.repeat)
    harris_tokens = sum(map(len, ids))
    e_bpe, enc = best_time(lambda: bpe.encode_batch(train), args.repeat)
    bpe_tokens = sum(len(e.ids) for e in enc)
    # encode_batch_fast (tokenizers >= 0.20) skips the character offsets encode_batch computes
    e_fast = best_time(lambda: bpe.encode_batch_fast(train), args.repeat)[0] if hasattr(bpe, "encode_batch_fast") else None
    for (i, d), e in zip(enumerate(train[:50]), enc):
        assert harris.decode(ids[i]) == d and bpe.decode(e.ids) == d  # both round-trip

    # ---- compression on held-out text
    h_bpt = val_bytes / sum(map(len, harris.encode_batch(val, bos=False)))
    b_bpt = val_bytes / sum(len(e.ids) for e in bpe.encode_batch(val))

    mb = train_bytes / 1e6
    print(f"## Harris tokenizer vs byte-level BPE (`tokenizers` {tokenizers.__version__})\n")
    print(f"{datetime.date.today().isoformat()}, {platform.platform()}, {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} CPUs, Python {platform.python_version()}; best of {args.repeat} runs.")
    print(f"Training text: train split of {', '.join(args.sources)} ({len(train):,} documents, {train_bytes:,} bytes); "
          f"held out: val split ({len(val):,} documents, {val_bytes:,} bytes). V = {vocab:,} for both.\n")
    print("| | Harris (andrea) | byte-level BPE | Harris / BPE | target |")
    print("|---|---:|---:|---:|---|")
    print(f"| training time | {t_harris:.2f} s | {t_bpe:.2f} s | {t_harris / t_bpe:.2f}x | <= 2x |")
    print(f"| encode_batch, train text | {mb / e_harris:.1f} MB/s | {mb / e_bpe:.1f} MB/s | "
          f"{e_bpe / e_harris:.2f}x | >= 1x |")
    if e_fast is not None:
        print(f"| encode_batch_fast (BPE), train text | {mb / e_harris:.1f} MB/s | {mb / e_fast:.1f} MB/s | "
              f"{e_fast / e_harris:.2f}x | |")
    print(f"| bytes/token, train text | {train_bytes / harris_tokens:.3f} | {train_bytes / bpe_tokens:.3f} | "
          f"{bpe_tokens / harris_tokens:.3f}x | |")
    print(f"| bytes/token, held out | {h_bpt:.3f} | {b_bpt:.3f} | {h_bpt / b_bpt:.3f}x | >= 0.9x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
