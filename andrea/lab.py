"""The embedding lab: what the lookup tables and the untied head hold.

Every function here computes and returns plain data (numbers, lists, numpy arrays); the `plot_*`
functions draw such data into PNG files with matplotlib's headless Agg backend. The
`andrea embed` commands print what these functions return.

Tables. `input` is the token embedding wte, a (V, d) matrix: row i is what token i puts into the
input of block 1. `output` is the head lm_head.weight, also (V, d): the logit of token i is
h · row_i, h being the last hidden state after ln_f. The two are untied, so every token has two
vectors, trained for different jobs, that need not agree.

Geometry. For rows u and v: u·v = ‖u‖ ‖v‖ cos θ. The dot product is the unnormalised
similarity that attention and the head compute; cos θ removes the lengths.

Looking up a word (`lookup`), in this order:
    "#123"   token id 123
    "cat"    the text as typed, when it is one token;
             else " cat" (with the leading space a word has inside running text), when that is
             one token;
             else the tokens of the text as typed: a word that is not one token is represented by
             the mean of its tokens' rows, and every result built on such a mean says so.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from andrea.config import N_SPECIAL, get_preset
from andrea.errors import AndreaError
from andrea.tokenizer import label_bytes

BOS = 256
TABLES = ("input", "output")
METRICS = ("cos", "dot")
DEFAULT_DISTANCES = (1, 8, 64, 512)

POSITION_NOTES = {
    "learned": "learned: wpe is a (T, d) table trained like wte; row t is added to the token at position t.",
    "sinusoidal": "sinusoidal: there is no learned table; the model adds a fixed table PE[t, 2i] = sin(t/10000^(2i/d)), "
                  "PE[t, 2i+1] = cos(...), scaled by sqrt(2/d) so each row has norm 1. Shown here is that fixed table's similarity, which depends only on the "
                  "distance between positions.",
    "rope": "rope: there is no position table at all; positions enter inside every attention layer, where q and k "
            "are rotated by angles t/10000^(2i/d_head), so a q·k score depends only on the distance between them.",
    "none": "none: the model has no position information in its input; only the causal mask tells positions apart.",
}


# ---------------------------------------------------------------- what is being inspected


class ByteTokenizer:
    """A stand-in with no segments: text is its UTF-8 bytes (ids 0-255), 256 is BOS, and ids
    257 and up are labelled by number. It lets a model without a tokenizer be inspected by id."""

    BOS = BOS
    segments: list[str] = []

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size

    def encode(self, text: str, bos: bool = True) -> list[int]:
        return ([BOS] if bos else []) + list(text.encode("utf-8", "surrogatepass"))

    def token_bytes(self, i: int) -> bytes:
        return bytes([i]) if i < 256 else b""

    def id_to_piece(self, i: int) -> str:
        if i < 256:
            return label_bytes(bytes([i]))
        return "<BOS>" if i == BOS else f"<#{i}>"

    def decode(self, ids) -> str:
        return b"".join(self.token_bytes(i) for i in ids).decode("utf-8", "replace")


@dataclass
class Subject:
    """A model under inspection, with the tokenizer its words are looked up with."""

    model: torch.nn.Module
    tokenizer: object
    name: str  # how it is named in output: the checkpoint path or the preset
    slug: str  # the same, safe in a file name
    tokenizer_note: str | None = None  # set when lookups fall back to bytes


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "model"


def load_subject(checkpoint=None, preset=None, seed: int = 0, tokenizer_dir=None, meta: bool = False) -> Subject:
    """A checkpoint's model, or a freshly initialised preset (seeded), with a tokenizer: the
    checkpoint's, the one in tokenizer_dir, or else the byte-level stand-in. With meta, a preset
    is built without memory (shapes only: enough to count parameters of the largest presets)."""
    from andrea.model import ANDREA

    if checkpoint and preset:
        raise AndreaError("give either --checkpoint or --preset, not both.")
    if not checkpoint and not preset:
        raise AndreaError("give --checkpoint PATH (a trained model) or --preset NAME (a freshly initialised one).")
    tokenizer = None
    if tokenizer_dir:
        from andrea.tokenizer import HarrisTokenizer

        tokenizer = HarrisTokenizer.load(tokenizer_dir)
    if checkpoint:
        from andrea.checkpoint import load_model

        model, ckpt_tokenizer, _ = load_model(checkpoint)
        V = model.config.vocab_size
        if tokenizer is not None and tokenizer.vocab_size != V:
            raise AndreaError(f"the tokenizer in {tokenizer_dir} has V = {tokenizer.vocab_size:,} but the model has V = {V:,}.")
        tokenizer = tokenizer or ckpt_tokenizer
        path = Path(checkpoint)
        name = str(path)
        slug = _slug(f"{path.parent.name}-{path.stem}" if path.is_file() else path.name)
    else:
        cfg = get_preset(preset)
        if tokenizer is not None and tokenizer.vocab_size != cfg.vocab_size:
            cfg = cfg.replace(vocab_size=tokenizer.vocab_size)
        torch.manual_seed(seed)
        with torch.device("meta" if meta else "cpu"):
            model = ANDREA(cfg).eval()
        name = f"{preset} (fresh, seed {seed}{', V = ' + format(cfg.vocab_size, ',') + ' to fit the tokenizer' if cfg != get_preset(preset) else ''})"
        slug = _slug(f"{preset}-seed{seed}")
    note = None
    if tokenizer is None:
        tokenizer = ByteTokenizer(model.config.vocab_size)
        note = "no tokenizer: text is looked up as UTF-8 bytes (ids 0-255); name other tokens as #ID, or give --tokenizer DIR."
    return Subject(model, tokenizer, name, slug, note)


def table(model, which: str) -> np.ndarray:
    """The (V, d) matrix of the input table (wte) or the output head (lm_head), as float64."""
    if which == "input":
        w = model.wte.weight
    elif which == "output":
        w = model.lm_head.weight
    else:
        raise AndreaError(f"the table must be one of {', '.join(TABLES)}, got {which!r}.")
    return w.detach().double().cpu().numpy()


# ---------------------------------------------------------------- where the parameters live


@dataclass(frozen=True)
class ParamGroup:
    name: str
    shape: str
    count: int
    share: float
    part: bool  # a part of the model (True) or a subtotal / total (False)


def parameter_groups(model) -> list[ParamGroup]:
    """The embedding table of the specification (token, position, their total), then the blocks,
    the final norm, the head and the total, counted from the model's own parameters."""
    cfg = model.config
    d, V, T, L = cfg.n_embd, cfg.vocab_size, cfg.block_size, cfg.n_layer
    counts = {"wte": 0, "wpe": 0, "h": 0, "ln_f": 0, "lm_head": 0}
    for name, p in model.named_parameters():
        head = name.split(".")[0]
        if head not in counts:
            raise AndreaError(f"the model has a parameter {name} that the lab does not know where to put.")
        counts[head] += p.numel()
    total = sum(counts.values())
    wpe_shape = f"{T:,} × {d:,}" if cfg.pos == "learned" else f"none ({cfg.pos})"
    per_block = counts["h"] // L if L else 0
    rows = [
        ("token embedding (wte)", f"{V:,} × {d:,}", counts["wte"], True),
        ("position embedding (wpe)", wpe_shape, counts["wpe"], True),
        ("embedding total", "", counts["wte"] + counts["wpe"], False),
        ("transformer blocks", f"{L} × {per_block:,}", counts["h"], True),
        ("final norm (ln_f)", f"{d:,}" + (" × 2" if cfg.norm == "layernorm" else ""), counts["ln_f"], True),
        ("output head (lm_head)", f"{V:,} × {d:,}", counts["lm_head"], True),
        ("total", "", total, False),
    ]
    return [ParamGroup(n, s, c, c / total, part) for n, s, c, part in rows]


# ---------------------------------------------------------------- tokens and words


@dataclass
class Lookup:
    query: str
    ids: list[int]
    pieces: list[str]
    note: str | None = None  # why the ids are not simply the query as one token

    @property
    def single(self) -> bool:
        return len(self.ids) == 1

    @property
    def label(self) -> str:
        if self.single:
            return show_piece(self.pieces[0])
        return f"{show_piece(self.query)} (mean of {len(self.ids)})"


def show_piece(piece: str) -> str:
    """A piece as one visible line: spaces as ␣, newlines and tabs escaped."""
    return piece.replace(" ", "␣").replace("\n", "\\n").replace("\t", "\\t").replace("\r", "\\r")


def token_kind(i: int) -> str:
    if i < 256:
        return "byte"
    return "BOS" if i == BOS else "segment"


def lookup(tokenizer, query: str, vocab_size: int) -> Lookup:
    """The token(s) of a query: "#ID", a single token as typed, the same with a leading space, or
    else the several tokens the text splits into (see the module docstring)."""
    if not isinstance(query, str) or query == "":
        raise AndreaError("give a word or a token id (#ID), not an empty string.")
    if re.fullmatch(r"#\d+", query):
        i = int(query[1:])
        if i >= vocab_size:
            raise AndreaError(f"token id {i} is out of range: ids are 0 to {vocab_size - 1} (V = {vocab_size:,}).")
        return Lookup(query, [i], [tokenizer.id_to_piece(i)])
    ids = tokenizer.encode(query, bos=False)
    if len(ids) == 1:
        return Lookup(query, ids, [tokenizer.id_to_piece(ids[0])])
    if not query.startswith(" "):
        spaced = tokenizer.encode(" " + query, bos=False)
        if len(spaced) == 1:
            piece = tokenizer.id_to_piece(spaced[0])
            return Lookup(query, spaced, [piece],
                          f"{query!r} is not one token, but {' ' + query!r} (with the leading space it has in running text) is.")
    pieces = [tokenizer.id_to_piece(i) for i in ids]
    parts = " + ".join(show_piece(p) for p in pieces)
    return Lookup(query, ids, pieces,
                  f"{query!r} is not a single token in the vocabulary: it splits into {len(ids)} tokens "
                  f"{parts} (ids {', '.join(map(str, ids))}); the mean of their rows stands for it.")


def word_vector(matrix: np.ndarray, lk: Lookup) -> np.ndarray:
    """The row of a single token, or the mean of the rows of a word's tokens."""
    return matrix[lk.ids].mean(axis=0)


def vector_stats(u: np.ndarray, v: np.ndarray) -> dict:
    """‖u‖, ‖v‖, u·v, cos θ and θ in degrees (θ is nan when a vector is zero)."""
    u, v = np.asarray(u, dtype=np.float64), np.asarray(v, dtype=np.float64)
    nu, nv, dot = float(np.linalg.norm(u)), float(np.linalg.norm(v)), float(u @ v)
    cos = dot / (nu * nv) if nu > 0 and nv > 0 else float("nan")
    angle = math.degrees(math.acos(max(-1.0, min(1.0, cos)))) if math.isfinite(cos) else float("nan")
    return {"norm_u": nu, "norm_v": nv, "dot": dot, "cos": cos, "angle_deg": angle}


def compare(model, tokenizer, a: str, b: str) -> dict:
    """The geometry of two tokens or words in the input table and in the output head."""
    V = model.config.vocab_size
    la, lb = lookup(tokenizer, a, V), lookup(tokenizer, b, V)
    out = {"a": _lookup_dict(la), "b": _lookup_dict(lb)}
    for which in TABLES:
        m = table(model, which)
        out[which] = vector_stats(word_vector(m, la), word_vector(m, lb))
    return out


def _lookup_dict(lk: Lookup) -> dict:
    return {"query": lk.query, "ids": lk.ids, "pieces": lk.pieces, "single": lk.single, "note": lk.note}


def scores(matrix: np.ndarray, vector: np.ndarray, metric: str) -> np.ndarray:
    """Every row's similarity to vector: the dot product, or cos θ."""
    if metric not in METRICS:
        raise AndreaError(f"the metric must be one of {', '.join(METRICS)}, got {metric!r}.")
    dots = matrix @ vector
    if metric == "dot":
        return dots
    norms = np.linalg.norm(matrix, axis=1) * np.linalg.norm(vector)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(norms > 0, dots / norms, 0.0)


def nearest(matrix: np.ndarray, vector: np.ndarray, k: int, metric: str = "cos", exclude=()) -> list[tuple[int, float]]:
    """The k rows most similar to vector, best first (ties by lower id), leaving out `exclude`."""
    if k < 1:
        raise AndreaError(f"-k must be at least 1, got {k}.")
    s = scores(matrix, vector, metric)
    keep = np.ones(len(s), dtype=bool)
    keep[list(exclude)] = False
    ids = np.flatnonzero(keep)
    order = ids[np.lexsort((ids, -s[ids]))][:k]
    return [(int(i), float(s[i])) for i in order]


def neighbors(model, tokenizer, word: str, k: int = 10, metric: str = "cos", which: str = "input") -> dict:
    """The k tokens nearest to a token or word (its own tokens left out)."""
    lk = lookup(tokenizer, word, model.config.vocab_size)
    m = table(model, which)
    rows = nearest(m, word_vector(m, lk), k, metric, exclude=set(lk.ids))
    return {"word": _lookup_dict(lk), "table": which, "metric": metric,
            "neighbors": [{"id": i, "piece": tokenizer.id_to_piece(i), "score": s} for i, s in rows]}


def show_tokens(model, tokenizer, text: str, n_values: int = 6) -> list[dict]:
    """Per token of text: id, piece, kind (segment, byte fallback, BOS), its input row's norm and
    first values, and its output head row's norm."""
    if text == "":
        raise AndreaError("give some text to show; it is empty.")
    ids = tokenizer.encode(text, bos=False)
    wte, head = table(model, "input"), table(model, "output")
    return [{"id": i, "piece": tokenizer.id_to_piece(i), "kind": token_kind(i), "norm": float(np.linalg.norm(wte[i])),
             "values": wte[i, :n_values].tolist(), "head_norm": float(np.linalg.norm(head[i]))} for i in ids]


# ---------------------------------------------------------------- positions


def position_rows(model) -> np.ndarray | None:
    """The (T, d) rows added at each position: the learned wpe, the fixed sinusoidal table, or None."""
    pos = model.config.pos
    if pos == "learned":
        return model.wpe.weight.detach().double().cpu().numpy()
    if pos == "sinusoidal":
        return model.pos_table.double().cpu().numpy()
    return None


def cosine_matrix(rows: np.ndarray) -> np.ndarray:
    """cos θ between every pair of rows (a zero row has similarity 0 to everything)."""
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    unit = np.divide(rows, norms, out=np.zeros_like(rows), where=norms > 0)
    return unit @ unit.T


def similarity_at_distances(sim: np.ndarray, distances=DEFAULT_DISTANCES) -> dict[int, float]:
    """Mean cos θ between positions t and t + k, for each distance k shorter than the table."""
    return {k: float(np.diagonal(sim, k).mean()) for k in distances if 0 < k < len(sim)}


def positions(model, distances=DEFAULT_DISTANCES) -> dict:
    """What the model's position scheme is, and for a table, its similarity figures."""
    pos = model.config.pos
    rows = position_rows(model)
    out = {"scheme": pos, "note": POSITION_NOTES[pos], "table": None}
    if rows is not None:
        sim = cosine_matrix(rows)
        out["table"] = "learned" if pos == "learned" else "fixed (not learned)"
        out["positions"] = len(rows)
        out["norm_mean"] = float(np.linalg.norm(rows, axis=1).mean())
        out["similarity_at"] = similarity_at_distances(sim, distances)
        out["similarity"] = sim
    return out


# ---------------------------------------------------------------- the input to block 1


def forward_matrix(model, ids: list[int]) -> dict:
    """x = wte[ids] + wpe[0:T], the matrix that enters block 1, with its two parts."""
    t = torch.tensor([ids], dtype=torch.long)
    model.check_ids(t)
    with torch.no_grad():
        x = model.embed(t)[0].double().cpu().numpy()
    tok = table(model, "input")[ids]
    rows = position_rows(model)
    pos = rows[: len(ids)] if rows is not None else np.zeros_like(tok)
    return {"x": x, "token_part": tok, "position_part": pos}


# ---------------------------------------------------------------- maps


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


def map_points(model, tokenizer, words=None, top: int | None = None, which: str = "input") -> dict:
    """2-D PCA coordinates of chosen words (means for words of several tokens) or of the `top`
    most used segments (the tokenizer lists segments most used first, from id 257)."""
    V = model.config.vocab_size
    m = table(model, which)
    if words:
        lks = [lookup(tokenizer, w, V) for w in words]
    elif top:
        n = min(top, V - N_SPECIAL)
        if n < 2:
            raise AndreaError(f"--top needs at least two segments; this vocabulary has {V - N_SPECIAL}.")
        lks = [Lookup(f"#{i}", [i], [tokenizer.id_to_piece(i)]) for i in range(N_SPECIAL, N_SPECIAL + n)]
    else:
        raise AndreaError("give the words to map, or --top N for the N most used segments.")
    coords, share = pca_2d(np.stack([word_vector(m, lk) for lk in lks]))
    return {"table": which, "points": [{**_lookup_dict(lk), "label": lk.label, "x": float(c[0]), "y": float(c[1])}
                                       for lk, c in zip(lks, coords)], "explained": share.tolist()}


# ---------------------------------------------------------------- export


def write_projector(out_dir, model, tokenizer, which: str = "input") -> tuple[Path, Path]:
    """vectors.tsv (one row per token, tab-separated) and metadata.tsv (piece, id, kind, with a
    header) for the TensorFlow Embedding Projector (projector.tensorflow.org, "Load")."""
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise AndreaError(f"cannot write to {out} ({e.strerror}).") from None
    m = table(model, which)
    vectors, meta = out / "vectors.tsv", out / "metadata.tsv"
    np.savetxt(vectors, m, delimiter="\t", fmt="%.6g")
    lines = ["piece\tid\tkind"]
    for i in range(len(m)):
        lines.append(f"{show_piece(tokenizer.id_to_piece(i))}\t{i}\t{token_kind(i)}")
    meta.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return vectors, meta


# ---------------------------------------------------------------- plots


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path) -> Path:
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path)
    except OSError as e:
        raise AndreaError(f"cannot write the picture {path} ({e.strerror}).") from None
    finally:
        _pyplot().close(fig)
    return path


def plot_parameter_groups(groups: list[ParamGroup], path, title: str) -> Path:
    plt = _pyplot()
    parts = [g for g in groups if g.part]
    fig, ax = plt.subplots(figsize=(9, 4.2), dpi=100)
    colors = ["C0", "C1", "0.6", "0.8", "C2"]
    y = np.arange(len(parts))[::-1]
    ax.barh(y, [g.count for g in parts], color=colors[: len(parts)])
    for yi, g in zip(y, parts):
        share = f"{100 * g.share:.1f}%" if g.share >= 0.001 else f"{100 * g.share:.3f}%"
        ax.text(g.count, yi, f"  {g.count:,} ({share})", va="center", fontsize=9)
    ax.set_yticks(y, [f"{g.name}\n{g.shape}" for g in parts], fontsize=9)
    ax.set_xlim(0, max(g.count for g in parts) * 1.45)
    ax.set_xlabel("parameters")
    ax.xaxis.set_major_formatter(lambda v, _: f"{v / 1e6:g}M" if v else "0")
    total = groups[-1].count
    emb = next(g for g in groups if g.name == "embedding total")
    ax.set_title(f"{title}\n{total:,} parameters; embedding layer {emb.count:,} ({100 * emb.share:.1f}%)", fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return _save(fig, path)


def plot_position_similarity(sim: np.ndarray, at: dict, path, title: str) -> Path:
    plt = _pyplot()
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.8), dpi=100, gridspec_kw={"width_ratios": [1.1, 1]})
    im = ax.imshow(sim, cmap="RdBu_r", vmin=-1, vmax=1, interpolation="nearest")
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label="cos θ")
    ax.set_xlabel("position"), ax.set_ylabel("position")
    ax.set_title("cosine similarity between positions", fontsize=10)
    ks = np.arange(1, len(sim))
    mean_by_k = np.array([np.diagonal(sim, k).mean() for k in ks])
    ax2.plot(ks, mean_by_k, color="C0")
    for k, v in at.items():
        ax2.plot([k], [v], "o", color="C3")
        ax2.annotate(f"{v:+.3f}", (k, v), textcoords="offset points", xytext=(4, 6), fontsize=8)
    ax2.set_xscale("log"), ax2.axhline(0, color="0.5", lw=0.8)
    ax2.set_xlabel("distance k (log scale)"), ax2.set_ylabel("mean cos θ(t, t + k)")
    ax2.set_title("mean similarity by distance", fontsize=10), ax2.grid(alpha=0.3)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    return _save(fig, path)


def plot_map(points: list[dict], explained, path, title: str) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 7), dpi=100)
    xs, ys = [p["x"] for p in points], [p["y"] for p in points]
    single = [p["single"] for p in points]
    ax.scatter([x for x, s in zip(xs, single) if s], [y for y, s in zip(ys, single) if s], s=14, color="C0",
               label="one token: its row")
    if not all(single):
        ax.scatter([x for x, s in zip(xs, single) if not s], [y for y, s in zip(ys, single) if not s], s=14,
                   color="C1", label="a word of several tokens: the mean of their rows")
        ax.legend(fontsize=8, loc="best")
    fontsize = 9 if len(points) <= 60 else 7
    for p in points:
        ax.annotate(p["label"], (p["x"], p["y"]), textcoords="offset points", xytext=(3, 3), fontsize=fontsize)
    ax.set_xlabel(f"PC 1 ({100 * explained[0]:.1f}% of variance)")
    ax.set_ylabel(f"PC 2 ({100 * explained[1]:.1f}% of variance)")
    ax.axhline(0, color="0.85", lw=0.8), ax.axvline(0, color="0.85", lw=0.8)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.2)
    fig.tight_layout()
    return _save(fig, path)
