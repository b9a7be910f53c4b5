"""What checking a data folder's shards costs before a run's first step (`andrea.shards.verify_shards`).

A data folder of random ids (V = 8,961, the main job's tokenizer's) is written in shards of
--shard-tokens, with a manifest recording each shard's SHA-256 and largest id, as `andrea prepare`
writes them. The check is then run three times: in full (every shard read: numpy's max and
hashlib's SHA-256 block by block), again (every shard found unchanged in verified.json: a stat
each), and in full once more after verified.json is removed. The default size is about the main
job's shards (10M tokens, 20 MB).

    .venv/bin/python benchmarks/bench_shard_check.py [--tokens 10000000] [--shard-tokens 5000000]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from andrea.config import get_preset  # noqa: E402
from andrea.shards import MANIFEST_VERSION, VERIFIED_FILE, TokenData, open_token_data, verify_shards, write_shard  # noqa: E402
from benchmarks.common import machine_line, md_table  # noqa: E402

V = get_preset("andrea-cpu").vocab_size  # the main job's


def make_folder(folder: Path, tokens: int, shard_tokens: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    shards = []
    for part, start in enumerate(range(0, tokens, shard_tokens)):
        ids = rng.integers(0, V, size=min(shard_tokens, tokens - start), dtype=np.uint16)
        name = f"bench.train.{part:05d}.tok"
        write_shard(folder / name, ids)
        shards.append({"file": name, "tokens": len(ids), "sha256": hashlib.sha256(ids.astype("<u2").tobytes()).hexdigest(),
                       "max_id": int(ids.max())})
    val = rng.integers(0, V, size=10_000, dtype=np.uint16)
    write_shard(folder / "bench.val.00000.tok", val)
    val_entry = {"file": "bench.val.00000.tok", "tokens": len(val), "sha256": hashlib.sha256(val.astype("<u2").tobytes()).hexdigest(),
                 "max_id": int(val.max())}
    manifest = {"format": "andrea-shards", "version": MANIFEST_VERSION, "tokenizer": "bench", "vocab_size": V,
                "sources": {"bench": {"train": {"tokens": tokens, "shards": shards},
                                      "val": {"tokens": len(val), "shards": [val_entry]}}}}
    (folder / "manifest.json").write_text(json.dumps(manifest))


def timed(data: TokenData) -> tuple[float, str]:
    said = []
    start = time.perf_counter()
    verify_shards(data, said.append)
    return time.perf_counter() - start, said[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=10_000_000)
    ap.add_argument("--shard-tokens", type=int, default=5_000_000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        make_folder(folder, args.tokens, args.shard_tokens)
        data = open_token_data(folder)  # the gate checks every shard once; the timings start from nothing
        (folder / VERIFIED_FILE).unlink()
        size = sum(p.stat().st_size for p in folder.glob("*.tok"))
        rows = []
        for what in ("full check (first start)", "unchanged (later starts)", "full check (verified.json removed)"):
            if what.startswith("full check (v"):
                (folder / VERIFIED_FILE).unlink()
            seconds, line = timed(data)
            rows.append([what, f"{seconds:.3f} s", f"{size / seconds / 1e6:,.0f} MB/s" if "full" in what else "", line])
    print(f"machine: {machine_line()}\n")
    print(f"data: {args.tokens:,} training tokens in shards of {args.shard_tokens:,} (+ 10,000 val), {size:,} bytes "
          f"(the files were just written, so they are in the page cache)\n")
    print(md_table(["check", "time", "rate", "what the run prints"], rows, right={1, 2}))


if __name__ == "__main__":
    main()
