"""A training run's observers of its embedding tables: the snapshots (andrea.snapshots.store) and the
word-similarity scores written to metrics.jsonl at every evaluation (andrea.inside.wordsim); and, with each
snapshot, what each attention head attends to (andrea.inside.heads), also into metrics.jsonl.

Observers never stop the run: a snapshot that cannot be written ends the snapshots with a note.
A large table keeps only some rows in its snapshots: the most frequent tokens (counted on a sample
of the training text) and every word of the similarity sets and the lesson.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from andrea.inside.heads import score_heads
from andrea.inside.wordsim import brief, model_tables, similarity, try_load_wordsets, word_index
from andrea.metrics import append_row
from andrea.snapshots import store as snapshots
from andrea.snapshots.store import Growth, choose_rows
from andrea.trainconfig import TrainConfig


def make_growth(cfg: TrainConfig, model_cfg, tokenizer, data, out: Path, log, ckpt, step: int):
    """(the snapshot taker, the similarity scorer (index, sets) or None) of a run on the main process."""
    V, d = model_cfg.vocab_size, model_cfg.n_embd
    sets = try_load_wordsets(log)
    index = word_index(tokenizer, V, sets)
    counts = None
    if V * d > snapshots.WHOLE_LIMIT:  # a large table keeps its most frequent rows: count a sample of the tokens
        counts = np.zeros(V, dtype=np.int64)
        for src in data.sources.values():
            counts += np.bincount(np.asarray(src.train[: 10_000_000]), minlength=V)[:V]
    rows, dtype = choose_rows(V, d, counts, index.rows(), cfg.snapshot_rows)
    growth = Growth(out, V, d, rows, dtype, cfg.recipe, log, cfg.snapshot_mb)
    if ckpt is not None:
        growth.load_state_dict(ckpt.meta.get("growth", {"evals_seen": 0, "evals_kept": 0, "seen_ids": [],
                                                        "seen_counts": [], "last_step": None}),
                               step, out / "latest.safetensors", table=ckpt.model_state.get("wte.weight"))
    else:
        log(growth.describe())
    if sets is None:
        log("note: word-similarity scores are off: the sets are not fetched (`andrea data fetch wordsets`).")
    return growth, ((index, sets) if sets is not None else None)


def _fmt_rho(rho) -> str:
    return "n/a" if rho is None else f"{rho:+.3f}"


def score_similarity(model, scorer, growth: Growth, metrics_path: Path, step: int, say) -> None:
    """Score both tables on the word sets, add the row to metrics.jsonl and say the headline."""
    t0 = time.perf_counter()
    index, sets = scorer
    scores = brief(similarity(model_tables(model), index, sets))
    growth.seconds += time.perf_counter() - t0
    append_row(metrics_path, {"step": step, "similarity": scores, "growth_seconds": round(growth.seconds, 3)})
    s = scores["input_centred"]
    say(f"step {step:,}: word similarity, input table centred: SimLex-999 ρ {_fmt_rho(s['simlex999'])}, "
        f"WordSim-353 ρ {_fmt_rho(s['wordsim353'])}; cos cat·dog {s['cat_dog']:+.3f}, cat·Tuesday {s['cat_tuesday']:+.3f}")


def record_heads(model, growth: Growth, metrics_path: Path, step: int) -> None:
    """The heads' scores at a snapshot's step, added to metrics.jsonl as {"step", "heads"}."""
    t0 = time.perf_counter()
    heads = score_heads(model)
    growth.seconds += time.perf_counter() - t0
    if heads is not None:
        append_row(metrics_path, {"step": step, "heads": heads})
