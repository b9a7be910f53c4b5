"""Arithmetic on embedding rows, defined once: a model's two tables as arrays, cosine, unit rows,
nearest rows, whole-word tokens, and the two 2-D projections of the maps (PCA, t-SNE).

Every view of the tables (the lab's Token and Growth views, `andrea embed`, the similarity scores,
the timeline, the lesson) computes with these, so two views of one table always agree.

- A zero vector has no direction: its cosine with anything is 0, never NaN, and a zero row stays
  zero under `unit_rows`. (`vector_stats` still reports its angle as NaN: there is none.)
- A row that is not finite (NaN marks a row a snapshot did not keep) has cosine 0 as well; leave
  such rows out of `nearest` with `only`.
- `nearest` ranks best first and breaks ties by the lower token id.
- A whole-word token is a space followed by letters only (`␣father`, not `ing`, `␣,` or a byte);
  whether it is used as a whole word is another matter (andrea.usage).
"""

from __future__ import annotations

import math

import numpy as np

from andrea.config import N_SPECIAL
from andrea.errors import AndreaError

METRICS = ("cos", "dot")


def table(model, which: str) -> np.ndarray:
    """The (V, d) matrix of the input table (wte) or the output head (lm_head), as float64."""
    if which == "input":
        w = model.wte.weight
    elif which == "output":
        w = model.lm_head.weight
    else:
        raise AndreaError(f"the table must be one of input, output, got {which!r}.")
    return w.detach().double().cpu().numpy()


def cosine(u, v) -> float:
    """cos θ of two vectors; 0 when either is zero or not finite."""
    u, v = np.asarray(u, dtype=np.float64), np.asarray(v, dtype=np.float64)
    nu, nv = float(np.linalg.norm(u)), float(np.linalg.norm(v))
    if not (nu > 0 and nv > 0 and math.isfinite(nu * nv)):
        return 0.0
    return float(u @ v) / (nu * nv)


def vector_stats(u, v) -> dict:
    """‖u‖, ‖v‖, u·v, cos θ and θ in degrees (cos θ 0 and θ NaN when a vector is zero)."""
    u, v = np.asarray(u, dtype=np.float64), np.asarray(v, dtype=np.float64)
    nu, nv = float(np.linalg.norm(u)), float(np.linalg.norm(v))
    cos = cosine(u, v)
    angle = math.degrees(math.acos(max(-1.0, min(1.0, cos)))) if nu > 0 and nv > 0 else float("nan")
    return {"norm_u": nu, "norm_v": nv, "dot": float(u @ v), "cos": cos, "angle_deg": angle}


def unit_rows(matrix: np.ndarray) -> np.ndarray:
    """Rows scaled to length 1; a zero or non-finite row becomes zero."""
    matrix = np.asarray(matrix)
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    ok = (norms > 0) & np.isfinite(norms)
    return np.divide(matrix, norms, out=np.zeros_like(matrix, dtype=np.result_type(matrix, np.float32)), where=ok)


def cosine_matrix(rows: np.ndarray) -> np.ndarray:
    """cos θ between every pair of rows (a zero row has cosine 0 with everything)."""
    unit = unit_rows(rows)
    return unit @ unit.T


def scores(matrix: np.ndarray, vector, metric: str = "cos") -> np.ndarray:
    """Every row's similarity to vector: cos θ (0 for a zero row or vector) or the dot product."""
    if metric not in METRICS:
        raise AndreaError(f"the metric must be one of {', '.join(METRICS)}, got {metric!r}.")
    vector = np.asarray(vector, dtype=np.float64)
    if metric == "dot":
        return np.asarray(matrix, dtype=np.float64) @ vector
    nv = float(np.linalg.norm(vector))
    if not (nv > 0 and math.isfinite(nv)):
        return np.zeros(len(matrix))
    return unit_rows(np.asarray(matrix, dtype=np.float64)) @ (vector / nv)


def nearest(matrix: np.ndarray, vector, k: int, metric: str = "cos", exclude=(),
            only: np.ndarray | None = None) -> list[tuple[int, float]]:
    """The k rows most similar to vector, best first (ties by lower id), leaving out `exclude`
    and, when `only` (a boolean mask over rows) is given, every row it does not mark."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise AndreaError(f"the number of neighbours k must be an integer of at least 1, got {k!r}.")
    s = scores(matrix, vector, metric)
    keep = np.ones(len(s), dtype=bool) if only is None else np.asarray(only, dtype=bool).copy()
    keep[list(exclude)] = False
    ids = np.flatnonzero(keep)
    order = ids[np.lexsort((ids, -s[ids]))][:k]
    return [(int(i), float(s[i])) for i in order]


def whole_word_mask(tokenizer, vocab_size: int) -> np.ndarray:
    """(V,) bool: tokens that are a space followed by letters only; where the tokenizer marks word
    ends (version 5), only those: its plain " cat" begins longer words."""
    mask = np.zeros(vocab_size, dtype=bool)
    ends = getattr(tokenizer, "word_ends", None)
    for i in range(N_SPECIAL, vocab_size):
        piece = tokenizer.id_to_piece(i)
        mask[i] = len(piece) > 1 and piece[0] == " " and piece[1:].isalpha() and (not ends or i in ends)
    return mask


def pca_2d(vectors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The vectors projected on their first two principal components, and the share of the
    variance each component explains."""
    vectors = np.asarray(vectors, dtype=np.float64)
    if len(vectors) < 2:
        raise AndreaError(f"a map needs at least two tokens, got {len(vectors)}.")
    centred = vectors - vectors.mean(axis=0)
    _, s, vt = np.linalg.svd(centred, full_matrices=False)
    var = s ** 2
    comps = vt[:2]
    # a fixed sign per component, so the same vectors always give the same picture
    for c in comps:
        if c[np.argmax(np.abs(c))] < 0:
            c *= -1
    coords = centred @ comps.T
    if coords.shape[1] < 2:
        coords = np.pad(coords, ((0, 0), (0, 2 - coords.shape[1])))
    share = var[:2] / var.sum() if var.sum() > 0 else np.zeros(2)
    return coords, np.pad(share, (0, 2 - len(share)))


def tsne_2d(vectors: np.ndarray, seed: int = 0) -> np.ndarray:
    """A non-linear 2-D map (scikit-learn's t-SNE, seeded, PCA-initialised): near neighbours stay
    near; distances between far clusters and the axes carry no meaning. Up to 200 points use the
    exact gradient; more use Barnes-Hut on one thread (its OpenMP threads, competing for the cores
    of a busy machine, made it tens of times slower here)."""
    from sklearn.manifold import TSNE  # scikit-learn: heavy, loaded only when a t-SNE map is asked for
    from threadpoolctl import threadpool_limits

    vectors = np.asarray(vectors, dtype=np.float64)
    n = len(vectors)
    if n < 3:
        raise AndreaError(f"a t-SNE map needs at least three tokens, got {n}.")
    perplexity = float(min(30.0, max(1.0, (n - 1) / 3)))
    method = "exact" if n <= 200 else "barnes_hut"
    with threadpool_limits(limits=1):
        return TSNE(n_components=2, perplexity=perplexity, init="pca", random_state=seed,
                    method=method).fit_transform(vectors)
