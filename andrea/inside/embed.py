"""The two tables: what the lookup table (wte), the position table and the untied head hold.

Every function here computes and returns plain data (numbers, lists, numpy arrays); the `plot_*`
functions draw such data into PNG files with matplotlib's headless Agg backend. The
`andrea embed` commands print what these functions return. What the blocks do with these rows is
andrea.inside.blocks'.

Tables. `input` is the token embedding wte, a (V, d) matrix: row i is what token i puts into the
input of block 1. `output` is the head lm_head.weight, also (V, d): the logit of token i is
h · row_i, h being the last hidden state after ln_f. The two are untied, so every token has two
vectors, trained for different jobs, that need not agree.

Geometry. For rows u and v: u·v = ‖u‖ ‖v‖ cos θ. The dot product is the unnormalised
similarity that attention and the head compute; cos θ removes the lengths. The arithmetic (cosine,
nearest rows, what a zero row gives, how ties break) is andrea.inside.vectors'.

Looking up a word (`lookup`). A learner who types `king` means the word, and inside running text a
word carries the space before it: `␣king` is a different token from the word-internal piece `king`
(as in `making`). So, in this order:
    "#123"     token id 123                                                     (form "id")
    " king"    text that starts with a space is looked up as typed             (form "as typed")
    "king"     looked up as " king", its word-initial form                     (form "word-initial")
    bare=True  "king" looked up as typed, the bare piece                       (form "bare")
When the text looked up is not one token, it is represented by the mean of its tokens' rows, and
every result built on such a mean says so. Every result names the form it used.

Whole words. A neighbour list can be limited to whole-word tokens (andrea.inside.vectors.whole_word_mask).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from andrea.checkpoint import load_model
from andrea.config import BOS, N_SPECIAL, get_preset, norm_params, param_rows
from andrea.errors import AndreaError
from andrea.inside.vectors import cosine_matrix, nearest, pca_2d, table, tsne_2d, vector_stats, whole_word_mask
from andrea.model import ANDREA
from andrea.tokenizer.harris import HarrisTokenizer, label_bytes
from andrea.usage import STANDALONE_RULE
from andrea.validate import check_seed

TABLES = ("input", "output")
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

    def word_ids(self, word: str) -> list[int]:
        return self.encode(" " + word, bos=False)

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
    checkpoint: str | None = None  # the checkpoint file or run folder it was loaded from (None: a fresh preset)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "model"


def load_subject(checkpoint=None, preset=None, seed: int = 0, tokenizer_dir=None, meta: bool = False) -> Subject:
    """A checkpoint's model, or a freshly initialised preset (seeded), with a tokenizer: the
    checkpoint's, the one in tokenizer_dir, or else the byte-level stand-in. With meta, a preset
    is built without memory (shapes only: enough to count parameters of the largest presets)."""

    if checkpoint and preset:
        raise AndreaError("give either a checkpoint or a preset, not both.")
    if not checkpoint and not preset:
        raise AndreaError("give a checkpoint (a trained model) or a preset (a freshly initialised one).")
    check_seed(seed)  # torch takes seeds in 0..2^64-1 only
    tokenizer = None
    if tokenizer_dir:

        tokenizer = HarrisTokenizer.load(tokenizer_dir)
    if checkpoint:

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
        note = "no tokenizer: text is looked up as UTF-8 bytes (ids 0-255); name other tokens as #ID, or give a tokenizer folder."
    return Subject(model, tokenizer, name, slug, note, str(checkpoint) if checkpoint else None)


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
    the final norm, the head and the total: andrea.config.param_rows regrouped (the blocks hold
    attention, MLP and their two norms each), checked against the model's own parameter count."""
    cfg = model.config
    rows = {r.key: r for r in param_rows(cfg)}
    L, total = cfg.n_layer, rows["total"].count
    counted = sum(p.numel() for p in model.parameters())
    if counted != total:
        raise AndreaError(f"the model has {counted:,} parameters but its config accounts for {total:,}; the lab "
                          f"cannot say where they live.")
    final_norm = norm_params(cfg)
    blocks = rows["attention"].count + rows["mlp"].count + rows["norms"].count - final_norm
    table = [
        ("token embedding (wte)", rows["wte"].shape, rows["wte"].count, True),
        ("position embedding (wpe)", rows["wpe"].shape, rows["wpe"].count, True),
        ("embedding total", "", rows["embedding"].count, False),
        ("transformer blocks", f"{L} × {blocks // L if L else 0:,}", blocks, True),
        ("final norm (ln_f)", f"{cfg.n_embd:,}" + (" × 2" if cfg.norm == "layernorm" else ""), final_norm, True),
        ("output head (lm_head)", rows["lm_head"].shape, rows["lm_head"].count, True),
        ("total", "", total, False),
    ]
    return [ParamGroup(n, shape, c, c / total, part) for n, shape, c, part in table]


# ---------------------------------------------------------------- tokens and words


FORMS = ("id", "word-initial", "bare", "as typed")


@dataclass
class Lookup:
    query: str
    ids: list[int]
    pieces: list[str]
    note: str | None = None  # why the ids are not simply the text looked up as one token
    form: str = "as typed"  # one of FORMS: how the query became the text looked up
    text: str = ""  # the text looked up (" king" for "king" in its word-initial form)

    @property
    def single(self) -> bool:
        return len(self.ids) == 1

    @property
    def label(self) -> str:
        if self.single:
            return show_piece(self.pieces[0])
        return f"{show_piece(self.text or self.query)} (mean of {len(self.ids)})"


FORM_NOTES = {
    "id": "a token named by its id",
    "word-initial": "the word-initial form, with the leading space a word has in running text",
    "bare": "the bare piece as typed, without a leading space",
    "as typed": "as typed",
}


def show_piece(piece: str) -> str:
    """A piece as one visible line: spaces as ␣, newlines and tabs escaped."""
    return piece.replace(" ", "␣").replace("\n", "\\n").replace("\t", "\\t").replace("\r", "\\r")


def token_kind(i: int) -> str:
    if i < 256:
        return "byte"
    return "BOS" if i == BOS else "segment"


def lookup(tokenizer, query: str, vocab_size: int, bare: bool = False) -> Lookup:
    """The token(s) of a query: "#ID"; else the text in its word-initial form (" " + query) unless
    the query starts with a space or `bare` asks for the piece as typed; a text that is not one
    token is represented by its tokens (see the module docstring)."""
    if not isinstance(query, str) or query == "":
        raise AndreaError("give a word or a token id (#ID), not an empty string.")
    if re.fullmatch(r"#\d+", query):
        i = int(query[1:])
        if i >= vocab_size:
            raise AndreaError(f"token id {i} is out of range: ids are 0 to {vocab_size - 1} (V = {vocab_size:,}).")
        return Lookup(query, [i], [tokenizer.id_to_piece(i)], form="id", text=tokenizer.id_to_piece(i))
    if query[0].isspace():
        form, text = "as typed", query
    elif bare:
        form, text = "bare", query
    else:
        form, text = "word-initial", " " + query
    ids = tokenizer.word_ids(query) if form == "word-initial" else tokenizer.encode(text, bos=False)
    pieces = [tokenizer.id_to_piece(i) for i in ids]
    if len(ids) == 1:
        return Lookup(query, ids, pieces, form=form, text=text)
    parts = " + ".join(show_piece(p) for p in pieces)
    note = (f"{show_piece(text)} is not a single token in the vocabulary: it splits into {len(ids)} tokens "
            f"{parts} (ids {', '.join(map(str, ids))}); the mean of their rows stands for it.")
    if form == "word-initial":
        plain = tokenizer.encode(query, bos=False)
        if len(plain) == 1:
            note += f" (The bare piece {show_piece(query)} is one token, id {plain[0]}: look it up bare to use it.)"
    return Lookup(query, ids, pieces, note, form, text)


def word_vector(matrix: np.ndarray, lk: Lookup) -> np.ndarray:
    """The row of a single token, or the mean of the rows of a word's tokens."""
    return matrix[lk.ids].mean(axis=0)


def plane_coords(u: np.ndarray, v: np.ndarray) -> dict:
    """u and v drawn in the plane they span: u along the first axis, (‖u‖, 0); v at
    (v·e1, v·e2), e2 being the unit part of v orthogonal to u. Lengths and the angle survive."""
    u, v = np.asarray(u, dtype=np.float64), np.asarray(v, dtype=np.float64)
    nu = float(np.linalg.norm(u))
    if nu == 0:
        return {"u": [0.0, 0.0], "v": [float(np.linalg.norm(v)), 0.0]}
    e1 = u / nu
    a = float(v @ e1)
    b = float(np.linalg.norm(v - a * e1))
    return {"u": [nu, 0.0], "v": [a, b]}


def compare(model, tokenizer, a: str, b: str, bare: bool = False) -> dict:
    """The geometry of two tokens or words in the input table and in the output head, with the
    two vectors' coordinates in the plane they span."""
    V = model.config.vocab_size
    la, lb = lookup(tokenizer, a, V, bare), lookup(tokenizer, b, V, bare)
    out = {"a": _lookup_dict(la), "b": _lookup_dict(lb)}
    for which in TABLES:
        m = table(model, which)
        u, v = word_vector(m, la), word_vector(m, lb)
        out[which] = {**vector_stats(u, v), "plane": plane_coords(u, v)}
    return out


def _lookup_dict(lk: Lookup) -> dict:
    return {"query": lk.query, "form": lk.form, "text": lk.text, "ids": lk.ids, "pieces": lk.pieces,
            "single": lk.single, "label": lk.label, "note": lk.note}


def neighbours(model, tokenizer, word: str, k: int = 10, metric: str = "cos", which: str = "input",
              bare: bool = False, whole_words: bool = False, usage=None) -> dict:
    """The k tokens nearest to a token or word (its own tokens left out), optionally only among
    whole words; with the word's row norm. With `usage` (andrea.usage, the training data's), the
    word's usage and each neighbour's standalone share come too, and whole words are the
    whole-word tokens that mostly stand alone and were seen enough; without it, every token of a
    space and letters counts as a whole word."""
    V = model.config.vocab_size
    lk = lookup(tokenizer, word, V, bare)
    m = table(model, which)
    vec = word_vector(m, lk)
    only = None
    if whole_words:
        only = whole_word_mask(tokenizer, V)
        if usage is not None:
            only &= usage.standalone_words()
    rows = nearest(m, vec, k, metric, exclude=set(lk.ids), only=only)
    out = {"word": _lookup_dict(lk), "table": which, "metric": metric, "whole_words": whole_words,
           "whole_words_rule": None if not whole_words else "a space and letters" if usage is None else
           f"a space and letters, {STANDALONE_RULE}",
           "norm": float(np.linalg.norm(vec)),
           "neighbours": [{"id": i, "piece": tokenizer.id_to_piece(i), "score": s} for i, s in rows]}
    if usage is not None:
        label = lambda i: show_piece(getattr(tokenizer, "segment_label", tokenizer.id_to_piece)(i))  # noqa: E731  ␣cat</w>
        out["usage"] = usage.record(lk.ids[0], label) if lk.single else None
        out["usage_line"] = usage.sentence(lk.ids[0], label) if lk.single else None
        for n in out["neighbours"]:
            n["standalone_share"] = usage.share(n["id"])
    return out


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


def similarity_at_distances(sim: np.ndarray, distances=DEFAULT_DISTANCES) -> dict[int, float]:
    """Mean cos θ between positions t and t + k, for each distance k shorter than the table."""
    return {k: float(np.diagonal(sim, k).mean()) for k in distances if 0 < k < len(sim)}


def similarity_by_distance(sim: np.ndarray) -> list[float]:
    """Mean cos θ between positions t and t + k for every k from 1 to T - 1 (entry k - 1)."""
    return [float(np.diagonal(sim, k).mean()) for k in range(1, len(sim))]


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


MAP_METHODS = ("pca", "tsne")


def map_points(model, tokenizer, words=None, top: int | None = None, which: str = "input", bare: bool = False,
               method: str = "pca") -> dict:
    """2-D coordinates (PCA, or t-SNE) of chosen words (means for words of several tokens) or of
    the `top` most used segments (the tokenizer lists segments most used first, from id 257)."""
    if method not in MAP_METHODS:
        raise AndreaError(f"the map method must be one of {', '.join(MAP_METHODS)}, got {method!r}.")
    V = model.config.vocab_size
    m = table(model, which)
    if words:
        lks = [lookup(tokenizer, w, V, bare) for w in words]
    elif top:
        if top < 2:
            raise AndreaError(f"a map of the most used segments needs at least two, got {top}.")
        n = min(top, V - N_SPECIAL)
        if n < 2:
            raise AndreaError(f"a map needs at least two segments; this vocabulary has {V - N_SPECIAL}.")
        lks = [Lookup(f"#{i}", [i], [tokenizer.id_to_piece(i)], form="id", text=tokenizer.id_to_piece(i))
               for i in range(N_SPECIAL, N_SPECIAL + n)]
    else:
        raise AndreaError("give the words to map, or a number of most used segments.")
    vectors = np.stack([word_vector(m, lk) for lk in lks])
    if method == "pca":
        coords, share = pca_2d(vectors)
        explained = share.tolist()
    else:
        coords, explained = tsne_2d(vectors), None
    return {"table": which, "method": method, "explained": explained,
            "points": [{**_lookup_dict(lk), "x": float(c[0]), "y": float(c[1])} for lk, c in zip(lks, coords)]}


def preset_parameter_groups(name: str) -> list[ParamGroup]:
    """parameter_groups of a preset, counted on a model built without memory."""

    cfg = get_preset(name)
    with torch.device("meta"):
        return parameter_groups(ANDREA(cfg))
