"""The main job, end to end: corpus → tokenizer → shards → a CPU-sized model → samples.

Every stage is cached under the cache folder (`~/.cache/andrea`, or `$ANDREA_CACHE`): the corpus
by source, the tokenizer by its settings, the shards by the tokenizer's fingerprint. A second run
reuses them and only trains.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass
from pathlib import Path

from andrea.config import get_preset
from andrea.corpus import cache_root, fetch_default_corpus, load_documents
from andrea.errors import AndreaError

TOKENIZER_SAMPLE_BYTES = 4_000_000  # the tokenizer is fitted on this much text


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


def curriculum_sample(sources: dict[str, list[str]], weights: dict[str, float], n_bytes: int, seed: int) -> list[str]:
    """Documents drawn source by source in proportion to `weights`, about `n_bytes` in all.

    The tokenizer is fitted on this sample rather than on a raw file head, so each source has
    the say in the segment alphabet that the curriculum will give it in training.
    """
    rng = random.Random(seed)
    total = sum(weights.values())
    picked = []
    for name, docs in sources.items():
        budget = n_bytes * weights[name] / total
        order = list(range(len(docs)))
        rng.shuffle(order)
        got = 0
        for i in order:
            if got >= budget:
                break
            doc = docs[i][: int(budget - got) + 1000]  # a long document is cut so one source cannot swamp
            picked.append(doc)
            got += len(doc.encode("utf-8"))
    return picked


def prepared_tokenizer(n_segments: int, sources: dict[str, list[str]], seed: int, log=print):
    """The tokenizer for the main job: trained once, then loaded from the cache."""
    from andrea.tokenizer import HarrisTokenizer

    names = sorted(sources)
    key = f"harris-{n_segments}-{'+'.join(names)}-{TOKENIZER_SAMPLE_BYTES}-{seed}"
    folder = cache_root() / "tokenizers" / key
    if (folder / "harris_segments.json").exists():
        return HarrisTokenizer.load(folder), folder
    log(f"training the Harris tokenizer ({n_segments:,} segments) on a {TOKENIZER_SAMPLE_BYTES / 1e6:.0f} MB sample, "
        f"equal weight per source")
    texts = curriculum_sample(sources, {n: 1.0 for n in names}, TOKENIZER_SAMPLE_BYTES, seed)
    tok = HarrisTokenizer.train(texts, n_segments)
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


def run_main_job(job: MainJob, log=print) -> dict:
    from andrea.generate import TextGenerator
    from andrea.train import TrainOptions, train

    t0 = time.time()
    log("1/4 corpus")
    got = fetch_default_corpus(log=log)
    names = list(got)
    cfg = get_preset(job.preset)
    log("2/4 tokenizer")
    docs = {n: load_documents(n, "train") for n in names}
    tokenizer, tok_dir = prepared_tokenizer(cfg.n_segments, docs, job.seed, log)
    if tokenizer.vocab_size != cfg.vocab_size:
        raise AndreaError(f"the tokenizer found {tokenizer.n_segments:,} segments, the preset needs {cfg.n_segments:,}.")
    log("3/4 token shards")
    data_dir = prepared_data(tokenizer, names, log)
    out = Path(job.out) if job.out else Path("runs") / time.strftime("main-%Y%m%d-%H%M%S")
    log(f"4/4 training {job.preset} for {job.minutes:g} minutes into {out}")
    opts = TrainOptions(recipe="v2", batch_size=job.batch_size, micro_batch=job.batch_size, seq_len=job.seq_len,
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
