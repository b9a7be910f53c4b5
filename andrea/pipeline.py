"""The main job, end to end: corpus → tokenizer → shards → a CPU-sized model → samples.

Every stage is cached under the cache folder (`~/.cache/andrea`, or `$ANDREA_CACHE`): the corpus
by source, the tokenizer by its settings, the shards by the tokenizer's fingerprint. A second run
reuses them and only trains.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path

from andrea.config import get_preset
from andrea.corpus import cache_root, fetch_default_corpus
from andrea.errors import AndreaError

TOKENIZER_VERSION = 2  # part of the tokenizer cache key: bump when training changes


@dataclass
class MainJob:
    preset: str = "andrea-cpu"
    minutes: float = 15.0
    out: Path | None = None
    sampling: str = "ucb"
    seed: int = 1337
    batch_size: int = 16
    seq_len: int = 256
    lr: float = 2e-3
    samples: int = 3


def prepared_tokenizer(n_segments: int, names: list[str], log=print):
    """The tokenizer for the main job: trained once, then loaded from the cache.

    It is fitted on the training text of every source weighted as the curriculum opens (an equal
    share each), not on a raw file head, so a large source cannot dominate the segment alphabet.
    """
    from andrea.corpus import load_training_texts
    from andrea.tokenizer import WORD_PATTERN, HarrisTokenizer

    names = sorted(names)
    key = hashlib.sha256(f"{n_segments}|{'+'.join(names)}|{WORD_PATTERN}|{TOKENIZER_VERSION}".encode()).hexdigest()[:16]
    folder = cache_root() / "tokenizers" / f"harris-{n_segments}-{key}"
    if (folder / "harris_segments.json").exists():
        return HarrisTokenizer.load(folder), folder
    log(f"training the Harris tokenizer ({n_segments:,} segments), an equal share of text per source")
    texts, weights = load_training_texts(names, {n: 1.0 for n in names})
    tok = HarrisTokenizer.train(texts, n_segments, weights=weights, progress=True)
    tok.save(folder)
    return tok, folder


def prepared_data(tokenizer, source_names: list[str], log=print) -> Path:
    from andrea.data import TokenData, prepare

    folder = cache_root() / "shards" / tokenizer.fingerprint()[:16]
    if (folder / "manifest.json").exists():
        try:
            TokenData(folder)
            return folder
        except AndreaError as e:
            log(f"note: preparing the shards again ({e})")
    log(f"tokenizing {len(source_names)} sources into {folder}")
    prepare(tokenizer, source_names, folder, log=log)
    return folder


def main_job_data(n_segments: int, log=print) -> tuple[list[str], object, Path, Path]:
    """Stages 1-3 of the main job: (source names, tokenizer, its folder, shard folder), cached."""
    names = list(fetch_default_corpus(log=log))
    tokenizer, tok_dir = prepared_tokenizer(n_segments, names, log)
    if tokenizer.n_segments != n_segments:
        raise AndreaError(f"the tokenizer found {tokenizer.n_segments:,} segments, the model needs {n_segments:,}.")
    return names, tokenizer, tok_dir, prepared_data(tokenizer, names, log)


def run_main_job(job: MainJob, log=print) -> dict:
    from andrea.generate import TextGenerator
    from andrea.train import TrainOptions, train

    t0 = time.time()
    cfg = get_preset(job.preset)
    log("1/4 corpus, 2/4 tokenizer, 3/4 token shards (each cached after its first run)")
    names, tokenizer, tok_dir, data_dir = main_job_data(cfg.n_segments, log)
    out = Path(job.out) if job.out else Path("runs") / time.strftime("main-%Y%m%d-%H%M%S")
    log(f"4/4 training {job.preset} for {job.minutes:g} minutes into {out}")
    opts = TrainOptions(recipe="v2", batch_size=job.batch_size, micro_batch=job.batch_size,
                        seq_len=min(job.seq_len, cfg.block_size),
                        lr=job.lr, warmup_steps=50, time_limit=job.minutes * 60, eval_every=250,
                        checkpoint_every=100, seed=job.seed, sampling=job.sampling, eval_windows=16)
    result = train(cfg, opts, data_dir, out, log=log)
    from andrea.checkpoint import load_model

    model, tok, _ = load_model(result.checkpoint)
    generator = TextGenerator(model, tok)
    samples = []
    for i, prompt in enumerate(["The people of the United States", "And it came to pass", "Call me"][: job.samples]):
        samples.append(prompt + generator.generate(prompt, max_new_tokens=60, temperature=0.8, top_k=40, seed=i))
    summary = {
        "val_bpb": result.eval["all"]["bpb"],
        "val_bpb_by_source": {n: m["bpb"] for n, m in result.eval.items() if n != "all"},
        "steps": result.step,
        "tokens_per_s": result.tokens_per_s,
        "mfu": result.mfu,
        "train_seconds": result.elapsed,
        "total_seconds": time.time() - t0,
        "checkpoint": str(result.checkpoint),
        "tokenizer": str(tok_dir),
        "data": str(data_dir),
        "samples": samples,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary
