"""What each attention head attends to, scored on a repeated random sequence, and kept while a run trains.

On BOS + r + r, for random token sequences r of n distinct tokens drawn from the COMMON most used
segments (the tokenizer numbers segments most used first; the same draw for every model of a V),
each head's mean attention weight on the key of a kind:

    previous    the token before (i − 1), over positions 2 .. 2n
    first       the first token, BOS (0), over positions 1 .. 2n
    same        the same token's earlier copy (i − n), over the second copy
    induction   the token after that copy (i − n + 1), over the second copy: what an induction
                head attends to, to predict that the sequence goes on as it did

Why the most used: an induction head matches a token to its earlier copy, and a token a small run
has hardly seen keeps a row near its random start, which no head can match; over all 8,704
segments of the main job's vocabulary, a 15-minute run's rare tokens would score the heads' lack
of data, not their kind (`score_heads(common=None)` draws from all of them, for comparison). Why
r is at most RANDOM_LEN = 32 tokens: a head learns the distances it is shown. benchmarks/bench_induction.py trains on
copies at most 32 tokens apart and scores its final models at several lengths of r (`score_heads(
n=...)`; BENCHMARKS.md, "When an induction head forms"): heads that copy at 32 score far less at
63. The score asks whether a head copies, not how far. A kind is present when its best head's score passes PRESENT (0.3). Even attention
over the keys a query sees scores 1/(i + 1) averaged over the same positions (`head_scores`' chance).

While a run trains, `score_heads` runs at every embedding snapshot (steps 0, 1, 2, 4, … and
evaluations, andrea.snapshots.store) and its scores go to metrics.jsonl as {"step", "heads"}: a
forward pass over RANDOM_SEQS sequences, so the run keeps the scores rather than the whole model
at each step. The lab's Growth view and benchmarks/bench_induction.py read them there.
"""

from __future__ import annotations

import numpy as np
import torch

from andrea.config import BOS, N_SPECIAL
from andrea.errors import AndreaError

KINDS = ("previous", "first", "same", "induction")
PRESENT = 0.3  # a kind of head is present when its best head's mean weight passes this
RANDOM_LEN, RANDOM_SEQS, RANDOM_SEED = 32, 8, 1234
COMMON = 1_000  # r is drawn from this many of the most used segments


def random_repeats(vocab_size: int, n: int = RANDOM_LEN, seqs: int = RANDOM_SEQS, seed: int = RANDOM_SEED,
                   common: int | None = COMMON) -> np.ndarray:
    """(seqs, 2n + 1) ids: BOS, then n distinct random tokens, then the same n again. The `common`
    most used segments (None: every segment) where the vocabulary has n of them, else any token but BOS."""
    rng = np.random.default_rng(seed)
    top = vocab_size if common is None else min(vocab_size, N_SPECIAL + common)
    pool = np.arange(N_SPECIAL, top) if top - N_SPECIAL >= n else np.delete(np.arange(vocab_size), BOS)
    if len(pool) < n:
        raise AndreaError(f"a vocabulary of {vocab_size} tokens has fewer than {n} to draw a random sequence from.")
    rows = [rng.choice(pool, size=n, replace=False) for _ in range(seqs)]
    return np.stack([np.concatenate([[BOS], r, r]) for r in rows])


def head_scores(p: np.ndarray, n: int) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """Each head's score of each kind from patterns p (L, B, nh, 2n + 1, 2n + 1) on BOS + r + r:
    the mean weight a query puts on the key of its kind (kind: (L, nh)); and the score of even
    attention over the keys a query sees (kind: chance)."""
    pos = {"previous": (np.arange(2, 2 * n + 1), -1), "first": (np.arange(1, 2 * n + 1), None),
           "same": (np.arange(n + 1, 2 * n + 1), -n), "induction": (np.arange(n + 1, 2 * n + 1), 1 - n)}
    scores, chance = {}, {}
    for kind, (rows, shift) in pos.items():
        cols = np.zeros_like(rows) if shift is None else rows + shift
        scores[kind] = p[..., rows, cols].mean(axis=(1, -1))
        chance[kind] = float((1.0 / (rows + 1)).mean())
    return scores, chance


@torch.no_grad()
def patterns(model, ids: np.ndarray) -> np.ndarray:
    """Every block's attention weights (L, B, nh, T, T) on a batch of sequences."""
    trace = model.trace(torch.as_tensor(ids, device=model.wte.weight.device), keep=("weights",))
    return torch.stack([w.double().cpu() for w in trace["weights"]]).numpy()


def sequence_length(block_size: int) -> int:
    """n of BOS + r + r that fits a context of block_size (at most RANDOM_LEN)."""
    return min(RANDOM_LEN, (block_size - 1) // 2)


@torch.no_grad()
def score_heads(model, common: int | None = COMMON, n: int | None = None) -> dict | None:
    """{"n", "scores": {kind: (L, nh) list}, "best": {kind: float}} of a model on sequences of the
    `common` most used segments, r of n tokens (default: sequence_length of its context), or None
    where its context holds no repeated sequence of 2 tokens."""
    cfg = model.config
    if n is not None and not 2 <= n <= (cfg.block_size - 1) // 2:
        raise AndreaError(f"r of {n} tokens twice after BOS does not fit a context of {cfg.block_size}; "
                          f"give 2 to {(cfg.block_size - 1) // 2}.")
    n = sequence_length(cfg.block_size) if n is None else n
    if n < 2 or not len(model.h):
        return None
    scores, _ = head_scores(patterns(model, random_repeats(cfg.vocab_size, n, common=common)), n)
    return {"n": n, "scores": {k: np.round(v, 4).tolist() for k, v in scores.items()},
            "best": {k: round(float(v.max()), 4) for k, v in scores.items()}}
