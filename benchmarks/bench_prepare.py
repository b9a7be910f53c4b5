"""`andrea prepare` on a corpus of several GB: throughput and peak memory, beside the tokenizers.

The corpus is made from the default sources (their documents, shuffled anew for every file) and
written as .txt, .txt.gz, .jsonl.zst and .parquet files of about 100 MB each into a cache folder
(`$ANDREA_CACHE/bench-prepare`, reused while its settings match); nothing of it is kept in the
repository. The tokenizer is the Harris tokenizer of andrea-120m (8,192 segments) fitted on the
default corpus. Then, side by side on this machine:

    andrea prepare   the whole corpus, one source, under /usr/bin/time -v; its rate is the text
                     bytes of the manifest over the wall time; memory: the largest single-process
                     peak RSS (/usr/bin/time) and the peak total PSS of all its processes (sampled
                     every 0.2 s from /proc; forked workers share pages, which PSS splits fairly)
    encode_batch     HarrisTokenizer.encode_batch (a tokenizer fresh from disk, every core) on the
                     first --sample-mb MB of the same documents, held in memory
    BPE              `tokenizers` byte-level BPE (V 8,449, fitted on the same default text)
                     encode_batch on the same sample

    python benchmarks/bench_prepare.py [--gigabytes 2] [--sample-mb 64] [--keep]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, machine_line, md_table  # noqa: E402

from andrea.corpus.registry import DEFAULT_SOURCE_NAMES as DEFAULT_SOURCES  # noqa: E402  (the default corpus)

FORMATS = [".txt", ".jsonl.zst", ".parquet", ".txt.gz"]
FILE_BYTES = 100_000_000


def make_corpus(folder: Path, gigabytes: float, log) -> tuple[int, int]:
    """Write the corpus (cached); return (files, text bytes)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard

    from andrea.tokenizer.sample import load_documents

    settings = {"gigabytes": gigabytes, "formats": FORMATS, "file_bytes": FILE_BYTES, "version": 1}
    done = folder / "corpus.json"
    if done.exists() and json.loads(done.read_text()).get("settings") == settings:
        info = json.loads(done.read_text())
        return info["files"], info["bytes"]
    shutil.rmtree(folder, ignore_errors=True)
    (folder / "data").mkdir(parents=True)
    docs = [d for s in DEFAULT_SOURCES for split in ("train", "val") for d in load_documents(s, split)]
    target, written, k = int(gigabytes * 1e9), 0, 0
    while written < target:
        rng = random.Random(k)
        batch, size = [], 0
        while size < FILE_BYTES:
            order = list(range(len(docs)))
            rng.shuffle(order)
            for i in order:
                batch.append(docs[i])
                size += len(docs[i].encode())
                if size >= FILE_BYTES:
                    break
        fmt = FORMATS[k % len(FORMATS)]
        path = folder / "data" / f"part{k:03d}{fmt}"
        if fmt == ".txt":
            path.write_text("\n\n".join(batch), encoding="utf-8")
        elif fmt == ".txt.gz":
            path.write_bytes(gzip.compress("\n\n".join(batch).encode(), compresslevel=1))
        elif fmt == ".jsonl.zst":
            lines = "".join(json.dumps({"text": d}, ensure_ascii=False) + "\n" for d in batch).encode()
            path.write_bytes(zstandard.ZstdCompressor(level=3, threads=-1).compress(lines))
        else:
            pq.write_table(pa.table({"text": batch}), path, row_group_size=2048)
        written += size
        k += 1
        log(f"  wrote {path.name} ({size / 1e6:.0f} MB of text, {path.stat().st_size / 1e6:.0f} MB on disk)")
    done.write_text(json.dumps({"settings": settings, "files": k, "bytes": written}))
    return k, written


def tree_pss_kb(root: int) -> int:
    """Total PSS (kB) of a process and its descendants."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                ppid = int(Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d))
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        try:
            m = re.search(r"^Pss:\s+(\d+) kB", Path(f"/proc/{pid}/smaps_rollup").read_text(), re.M)
            total += int(m.group(1)) if m else 0
        except OSError:
            pass
    return total


def run_prepare(tok_dir: Path, corpus: Path, out: Path) -> dict:
    cmd = ["/usr/bin/time", "-v", str(REPO / ".venv" / "bin" / "andrea"), "prepare", "--tokenizer", str(tok_dir),
           "--out", str(out), "--no-progress", f"bench={corpus}"]
    if not Path(cmd[2]).exists():
        cmd[2:3] = [sys.executable, "-m", "andrea"]
    peak = [0]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def watch():
        while proc.poll() is None:
            peak[0] = max(peak[0], tree_pss_kb(proc.pid))
            time.sleep(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    out_text, err = proc.communicate()
    wall = time.perf_counter() - t0
    watcher.join()
    if proc.returncode != 0:
        raise SystemExit(f"bench_prepare: andrea prepare failed:\n{err[-2000:]}")
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", err).group(1))
    elapsed = re.search(r"Elapsed \(wall clock\) time.*: (.+)", err).group(1).strip()
    return {"wall": wall, "max_rss_kb": rss, "peak_pss_kb": peak[0], "elapsed": elapsed, "stdout": out_text}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gigabytes", type=float, default=2.0, help="corpus size in GB of text (default 2)")
    ap.add_argument("--sample-mb", type=float, default=64, help="text the encode_batch rates are measured on (default 64 MB)")
    ap.add_argument("--segments", type=int, default=8192)
    ap.add_argument("--keep", action="store_true", help="keep the prepared shards (default: removed after)")
    args = ap.parse_args(argv)

    import tokenizers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from andrea.cache import cache_root
    from andrea.corpus.sources import read_documents
    from andrea.errors import AndreaError
    from andrea.tokenizer.harris import HarrisTokenizer
    from andrea.tokenizer.sample import load_documents
    from andrea.tokenizer.train import train_tokenizer

    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    machine = machine_line()
    folder = cache_root() / "bench-prepare"
    try:
        train = [d for s in DEFAULT_SOURCES for d in load_documents(s, "train")]
    except AndreaError as e:
        print(f"bench_prepare: {e}", file=sys.stderr)
        return 2
    log(f"corpus: {folder / 'data'}")
    n_files, corpus_bytes = make_corpus(folder, args.gigabytes, log)
    disk = sum(p.stat().st_size for p in (folder / "data").iterdir())

    tok_dir = folder / f"harris-{args.segments}"
    if not (tok_dir / "harris_segments.json").exists():
        train_tokenizer(train, args.segments).save(tok_dir)
    harris = HarrisTokenizer.load(tok_dir)

    # ---- the same documents, the first sample-mb MB, in memory
    sample, size = [], 0
    for text, _ in read_documents(str(folder / "data"), "train"):
        sample.append(text)
        size += len(text.encode())
        if size >= args.sample_mb * 1e6:
            break

    def encode_batch_seconds() -> tuple[float, int]:
        log(f"encode_batch on {size / 1e6:.0f} MB ...")
        fresh = HarrisTokenizer.load(tok_dir)  # its word cache starts empty
        t = time.perf_counter()
        ids = fresh.encode_batch(sample, bos=True)
        return time.perf_counter() - t, sum(map(len, ids))

    t_before, sample_tokens = encode_batch_seconds()

    # ---- andrea prepare, the whole corpus
    out = Path(tempfile.mkdtemp(prefix="prepare-", dir=folder))
    log("andrea prepare ...")
    try:
        r = run_prepare(tok_dir, folder / "data", out)
        manifest = json.loads((out / "manifest.json").read_text())
    finally:
        if not args.keep:
            shutil.rmtree(out, ignore_errors=True)
    entry = manifest["sources"]["bench"]
    text_bytes = entry["train"]["bytes"] + entry["val"]["bytes"]
    tokens = entry["train"]["tokens"] + entry["val"]["tokens"]
    shards = len(entry["train"]["shards"]) + len(entry["val"]["shards"])
    prep_rate = text_bytes / 1e6 / r["wall"]

    t_after, _ = encode_batch_seconds()  # before and after: the machine may be shared
    t_harris = (t_before + t_after) / 2
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(train, trainers.BpeTrainer(vocab_size=harris.vocab_size, special_tokens=["<BOS>"], show_progress=False,
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    log("BPE encode_batch ...")
    t = time.perf_counter()
    enc = bpe.encode_batch(sample)
    t_bpe = time.perf_counter() - t
    del enc
    harris_rate, bpe_rate = size / 1e6 / t_harris, size / 1e6 / t_bpe

    print("## andrea prepare on a multi-GB corpus\n")
    print(f"machine: {machine}; tokenizers {tokenizers.__version__}\n")
    print(f"corpus: {n_files} files ({', '.join(FORMATS)}, cycled), {corpus_bytes:,} bytes of text from the default "
          f"sources' documents, {disk:,} bytes on disk; one source (a folder). Tokenizer: Harris, "
          f"{harris.n_segments:,} segments (V {harris.vocab_size:,}). Encoding processes: {os.cpu_count()}.\n")
    print(md_table(["measure", "value"], [
        ["text bytes prepared (train + val)", f"{text_bytes:,}"],
        ["tokens written", f"{tokens:,} in {shards} shards"],
        ["documents (train / val)", f"{entry['train']['documents']:,} / {entry['val']['documents']:,}"],
        ["wall time", f"{r['wall']:.1f} s"],
        ["throughput", f"{prep_rate:.2f} MB/s"],
        ["peak RSS of one process (/usr/bin/time -v)", f"{r['max_rss_kb'] / 1024:.0f} MB"],
        ["peak PSS of all its processes (sampled)", f"{r['peak_pss_kb'] / 1024:.0f} MB"],
    ]))
    print()
    print(f"Side by side on the first {size / 1e6:.0f} MB of the same training documents ({len(sample):,} documents, "
          f"held in memory; {sample_tokens:,} Harris tokens):\n")
    print(md_table(["encoder", "MB/s", "andrea prepare / this", "target"], [
        ["andrea prepare (whole corpus, from disk to shards)", f"{prep_rate:.2f}", "1.00", ""],
        ["HarrisTokenizer.encode_batch (in memory; mean of a run before and one after)", f"{harris_rate:.2f}",
         f"{prep_rate / harris_rate:.2f}", ">= 0.80"],
        ["tokenizers byte-level BPE encode_batch (in memory)", f"{bpe_rate:.2f}", f"{prep_rate / bpe_rate:.2f}", ""],
    ]))
    print(f"\nencode_batch alone: {size / 1e6 / t_before:.2f} MB/s before andrea prepare, {size / 1e6 / t_after:.2f} MB/s after.\n")
    met = lambda ok: "met" if ok else "not met"  # noqa: E731
    print(f"targets: >= 80% of encode_batch: {met(prep_rate >= 0.8 * harris_rate)} ({prep_rate / harris_rate:.0%}); "
          f"peak memory under 1.5 GB: {met(max(r['max_rss_kb'], r['peak_pss_kb']) < 1.5 * 1024 * 1024)} "
          f"({max(r['max_rss_kb'], r['peak_pss_kb']) / 1024:.0f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
