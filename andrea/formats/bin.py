"""ANDREA's `.bin` checkpoint: weights and Adam moments as little-endian float32.

    [int32 step][int32 n][n × f32 weights][n × f32 Adam m][n × f32 Adam v]

Order of the n values: wte [V,d], wpe [T,d]; per layer ln_1.weight, ln_1.bias, wq, wk, wv, wo
[d,d], ln_2.weight, ln_2.bias, fc1 [4d,d], fc2 [d,4d]; then ln_f.weight, ln_f.bias, lm_head
[V,d]; matrices [out][in], row-major (torch's nn.Linear layout). RMSNorm has no bias entries and
a model without learned positions has no wpe. m and v are torch Adam's exp_avg and exp_avg_sq;
the step in the header is Adam's step count.

A .bin holds no config, so one is given alongside (a preset, a config JSON, or the config JSON of
a release folder: the .bin, harris_segments.json and a config JSON).

Releases need not follow our layout to the letter; reading one finds where it differs:
  norms        n itself says whether the norms have weight and bias (layernorm), a weight only
               (rmsnorm) or no parameters at all (then they get unit weights and zero biases)
  orientation  a flat file shows no shapes, so whether matrices are stored [out][in] or [in][out]
               (and the tables one row per token or one column) is told by running the model:
               each of the four layouts scores a probe text, and a trained model predicts it far
               better in its own layout. Untrained weights score alike in every layout; then our
               layout is assumed and the notes say so.
Converting to the native form fills what a .bin lacks for `andrea train --resume` with defaults:
the optimizer groups of the chosen recipe, a fresh smoothed loss and the data order of the
default seed from its start. Recipe v3 trains the blocks' matrices with Muon, whose momentum is
not an Adam moment: a .bin written from a v3 checkpoint holds zeros for their m and v (and says
so), and a .bin read for v3 starts their momentum from zero.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from andrea.checkpoint import Checkpoint
from andrea.config import ModelConfig, count_params, norm_params
from andrea.errors import AndreaError
from andrea.files import atomic_output
from andrea.formats.common import (
    RELEASE_CONFIG,
    SEGMENTS_FILE,
    adam_moments,
    adam_state,
    check_weights,
    checked_tokenizer,
    is_norm,
    is_table,
    muon_trained,
    param_shapes,
    read_segments,
    resume_meta,
)
from andrea.model import ANDREA
from andrea.tokenizer.harris import HarrisTokenizer

HEADER = struct.Struct("<ii")
F32 = np.dtype("<f4")
INT32_MAX = 2**31 - 1
NORM_KINDS = {"layernorm": "weight and bias", "rmsnorm": "a weight only", "none": "no parameters"}
DECISIVE_NATS = 0.5  # how much better one layout must predict the probe to count as found
PROBE_TEXT = (
    "The old man walked down to the harbour in the early morning, when the boats were still tied up and "
    "the water was quiet. He had lived in the town all his life, and he knew every house and every street. "
    "When he was young, he wanted to see the world, but he stayed to help his father with the work. "
    "Now he thought that he had been right to stay. There is a kind of knowledge that comes only from "
    "watching the same place for a long time: how the light changes, which birds come back in spring, "
    "and what the people say to each other when they think that nobody is listening."
)


@dataclass(frozen=True)
class Orientation:
    linear: str = "out-in"  # "out-in": [out][in] (ours); "in-out": each linear matrix transposed
    tables: str = "rows"  # "rows": wte and wpe one row per token/position; "columns": transposed

    def describe(self) -> str:
        lin = "[out][in] as ours" if self.linear == "out-in" else "[in][out] (transposed from ours)"
        tab = "one row per token, as ours" if self.tables == "rows" else "one column per token (transposed from ours)"
        return f"linear matrices {lin}, embedding tables {tab}"


ORIENTATIONS = {"out-in": Orientation("out-in"), "in-out": Orientation("in-out")}
CANDIDATES = [Orientation(lin, tab) for tab in ("rows", "columns") for lin in ("out-in", "in-out")]


# ---------------------------------------------------------------- layouts


def model_config(cfg: ModelConfig, norms: str) -> ModelConfig:
    """The config of the model a file with these norms is read into."""
    return cfg if norms == "none" else cfg.replace(norm=norms)


def stored_shapes(cfg: ModelConfig, norms: str) -> dict[str, tuple[int, ...]]:
    """The parameters a file holds, in file order, with their shapes in our layout."""
    shapes = param_shapes(model_config(cfg, norms))
    return {n: s for n, s in shapes.items() if not (norms == "none" and is_norm(n))}


def counts(cfg: ModelConfig) -> dict[str, int]:
    """n_params of a file for this config with each kind of norms, by arithmetic (no model is
    built, so a config of a million layers costs nothing to compare)."""
    out = {kind: count_params(cfg.replace(norm=kind)) for kind in ("layernorm", "rmsnorm")}
    out["none"] = out[cfg.norm] - (2 * cfg.n_layer + 1) * norm_params(cfg)
    return out


def _flipped(name: str, shape: tuple, orient: Orientation) -> bool:
    if len(shape) != 2:
        return False
    return orient.tables == "columns" if is_table(name) else orient.linear == "in-out"


def unpack(flat: np.ndarray, shapes: dict, orient: Orientation) -> dict[str, torch.Tensor]:
    """Split one flat array into tensors in our layout."""
    out, pos = {}, 0
    for name, shape in shapes.items():
        size = math.prod(shape)
        chunk = flat[pos : pos + size]
        pos += size
        if _flipped(name, shape, orient):
            t = torch.from_numpy(chunk.reshape(shape[::-1]).T.copy())
        else:
            t = torch.from_numpy(chunk.reshape(shape).copy())
        out[name] = t
    return out


def _first_bad(flat: np.ndarray, shapes: dict, ok) -> str | None:
    """Name of the first parameter whose values fail ok (a vectorised check), or None."""
    bad = np.flatnonzero(~ok(flat))
    if not len(bad):
        return None
    pos = 0
    for name, shape in shapes.items():
        pos += math.prod(shape)
        if bad[0] < pos:
            return name
    return "?"


# ---------------------------------------------------------------- reading


def read_header(path: Path) -> tuple[int, int]:
    """(step, n) after checking that the file is exactly 8 + 12·n bytes long."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(HEADER.size)
    except FileNotFoundError:
        raise AndreaError(f"{path} does not exist.") from None
    except IsADirectoryError:
        raise AndreaError(f"{path} is a folder, not a .bin file.") from None
    if size < HEADER.size:
        raise AndreaError(f"{path} is {size} bytes, too short for a .bin header (8 bytes: step and n_params).")
    step, n = HEADER.unpack(head)
    if n <= 0:
        raise AndreaError(f"{path} is not a .bin checkpoint: its header says n_params = {n:,}, which is not a parameter count.")
    if size != HEADER.size + 12 * n:
        raise AndreaError(f"{path} is not a complete .bin checkpoint: its header says n_params = {n:,}, so it should be "
                          f"8 + 12·{n:,} = {HEADER.size + 12 * n:,} bytes, but it is {size:,} bytes.")
    if step < 0:
        raise AndreaError(f"{path} has a negative step count ({step}) in its header.")
    return step, n


def read_bin(path, config: ModelConfig, tokenizer: dict | None = None, orientation: str = "auto",
             recipe: str = "v1") -> tuple[Checkpoint, list[str]]:
    """A checkpoint (with Adam state for `recipe`) from a .bin and its config; notes on its layout."""
    path = Path(path)
    if orientation != "auto" and orientation not in ORIENTATIONS:
        raise AndreaError(f"orientation must be auto, out-in or in-out, got {orientation!r}.")
    step, n = read_header(path)
    expected = counts(config)
    norms = next((kind for kind, k in expected.items() if k == n), None)
    if norms is None:
        raise AndreaError(f"{path} holds {n:,} parameters, but its config ({_describe(config)}) needs "
                          f"{expected['layernorm']:,} with layernorm norms (weight and bias), {expected['rmsnorm']:,} "
                          f"with weight-only norms or {expected['none']:,} without norm parameters.")
    cfg = model_config(config, norms)
    shapes = stored_shapes(config, norms)
    with open(path, "rb") as f:
        f.seek(HEADER.size)
        weights, m, v = (np.fromfile(f, dtype=F32, count=n) for _ in range(3))
    for what, flat, ok in (("weight", weights, np.isfinite), ("Adam m of", m, np.isfinite),
                           ("Adam v of", v, lambda a: np.isfinite(a) & (a >= 0))):
        bad = _first_bad(flat, shapes, ok)
        if bad is not None:
            extra = "" if what != "Adam v of" else " or negative"
            raise AndreaError(f"{path}: {what} {bad} holds NaN or infinite{extra} values.")
    tokenizer = checked_tokenizer(tokenizer, cfg, "the tokenizer")
    notes = [_norm_note(config, norms, n)]
    if orientation == "auto":
        orient, note = detect_orientation(cfg, shapes, weights, tokenizer)
    else:
        orient = ORIENTATIONS[orientation]
        note = f"layout as given: {orient.describe()}."
    notes.append(note)
    state = _with_norms(cfg, unpack(weights, shapes, orient), 1.0)
    moments_m = _with_norms(cfg, unpack(m, shapes, orient), 0.0)
    moments_v = _with_norms(cfg, unpack(v, shapes, orient), 0.0)
    state = check_weights(cfg, state, str(path))
    moments = {name: (moments_m[name], moments_v[name]) for name in state}
    meta = resume_meta(step, recipe)
    if tokenizer is not None:
        meta["tokenizer"] = tokenizer
    optim = adam_state(cfg, step, moments, recipe)
    return Checkpoint(config=cfg, model_state=state, optim_state=optim, meta=meta), notes


def _with_norms(cfg: ModelConfig, state: dict, weight: float) -> dict:
    """state with the norm parameters a file without them lacks: weight (1 for weights, 0 for
    optimizer moments) for norm weights, 0 for norm biases."""
    out = {}
    for name, shape in param_shapes(cfg).items():
        if name in state:
            out[name] = state[name]
        else:
            out[name] = torch.full(shape, weight if name.endswith(".weight") else 0.0)
    return out


def _describe(cfg: ModelConfig) -> str:
    return (f"V={cfg.vocab_size:,}, d={cfg.n_embd:,}, {cfg.n_layer:,} layers, T={cfg.block_size:,}, "
            f"positions {cfg.pos}, {cfg.norm}")


def _norm_note(config: ModelConfig, norms: str, n: int) -> str:
    if norms == "none":
        extra = " and zero biases" if config.norm == "layernorm" else ""
        return f"norms: the file holds none ({n:,} parameters), so the {config.norm} layers get unit weights{extra}."
    if norms == config.norm:
        return f"norms: {norms} with {NORM_KINDS[norms]} ({n:,} parameters), as the config says."
    return (f"norms: the file's norms have {NORM_KINDS[norms]} ({n:,} parameters), so the model is read as {norms}, "
            f"not the config's {config.norm}.")


def detect_orientation(cfg: ModelConfig, shapes: dict, weights: np.ndarray, tokenizer: dict | None) -> tuple[Orientation, str]:
    """The layout in which the weights predict a probe text best, when one stands out."""

    ids = probe_ids(cfg, tokenizer)
    x, y = torch.tensor([ids[:-1]]), torch.tensor([ids[1:]])
    torch_state = torch.get_rng_state()
    model = ANDREA(cfg).eval()
    torch.set_rng_state(torch_state)  # building a model draws numbers; reading a file should not
    losses = []
    for orient in CANDIDATES:
        state = _with_norms(cfg, unpack(weights, shapes, orient), 1.0)
        model.load_state_dict(state)
        with torch.no_grad():
            _, loss = model(x, y)
        value = loss.item()
        losses.append((value if math.isfinite(value) else math.inf, orient))
    losses.sort(key=lambda p: p[0])
    (best, orient), (second, _) = losses[0], losses[1]
    square = "the square matrices (wq, wk, wv, wo) have no shape to tell, and are taken to follow fc1, fc2 and lm_head"
    if second - best >= DECISIVE_NATS:
        return orient, (f"layout found: {orient.describe()}; told apart by next-token loss on a probe text "
                        f"({best:.2f} nats against {second:.2f} for the next best layout); {square}.")
    return Orientation(), (f"layout assumed: {Orientation().describe()}; the layouts predict a probe text alike "
                           f"({best:.2f} and {second:.2f} nats, as untrained weights do), so the file cannot show its "
                           f"orientation; pass --orientation in-out to read the matrices transposed.")


def probe_ids(cfg: ModelConfig, tokenizer: dict | None) -> list[int]:
    """The probe text as ids: the release's tokenizer when there is one, else its raw bytes."""
    if tokenizer is not None:

        ids = HarrisTokenizer.from_dict(tokenizer).encode(PROBE_TEXT)
    else:
        ids = [256, *PROBE_TEXT.encode()]
    return ids[: min(cfg.block_size, 256) + 1]


# ---------------------------------------------------------------- writing


def write_bin(path, ckpt: Checkpoint) -> list[str]:
    """Write ckpt as a .bin in our layout (atomically); notes say what a .bin cannot hold."""
    path = Path(path)
    cfg = ckpt.config
    state = check_weights(cfg, ckpt.model_state, "the model")
    n = sum(t.numel() for t in state.values())
    if n > INT32_MAX:
        raise AndreaError(f"the model has {n:,} parameters, more than a .bin's int32 header can count.")
    step = ckpt.step
    if not 0 <= step <= INT32_MAX:
        raise AndreaError(f"step {step} does not fit a .bin's int32 header.")
    notes = []
    moments = adam_moments(cfg, ckpt.optim_state)
    muon = muon_trained(cfg, ckpt.optim_state)
    if muon:
        notes.append(f"{len(muon)} matrices were trained with Muon (recipe v3), which keeps a momentum but no Adam "
                     f"moments: their m and v are written as zeros; the other parameters' Adam moments are kept.")
    if moments is None:
        notes.append("the checkpoint holds no optimizer state, so Adam m and v are written as zeros.")
        moments = {name: (torch.zeros_like(t), torch.zeros_like(t)) for name, t in state.items()}
    with atomic_output(path) as tmp, open(tmp, "wb") as f:
        f.write(HEADER.pack(step, n))
        for block in (state, {k: m for k, (m, _) in moments.items()}, {k: v for k, (_, v) in moments.items()}):
            for name in state:  # one tensor at a time, in the model's order
                f.write(block[name].detach().cpu().contiguous().numpy().astype(F32, copy=False).tobytes())
    return notes


# ---------------------------------------------------------------- release folders


def read_bin_or_release(path, config: ModelConfig | None, segments=None, orientation: str = "auto",
                        recipe: str = "v1") -> tuple[Checkpoint, list[str]]:
    """A .bin file (config given) or a release folder: a .bin, harris_segments.json, a config JSON."""
    path = Path(path)
    notes = []
    if path.is_dir():
        bins = sorted(p for p in path.glob("*.bin") if p.name != "pytorch_model.bin")
        if len(bins) != 1:
            raise AndreaError(f"{path} holds {len(bins)} .bin files; a release folder holds exactly one.")
        bin_path = bins[0]
        if config is None:
            config = _release_config(path)
        if segments is None:
            if (path / SEGMENTS_FILE).exists():
                segments = path / SEGMENTS_FILE
            else:
                notes.append(f"{path} has no {SEGMENTS_FILE}, so the model comes without a tokenizer.")
    else:
        bin_path = path
        if config is None:
            raise AndreaError(f"{path} is a .bin, which holds no config; give --preset or --config.")
    tokenizer = read_segments(segments) if segments is not None else None
    ckpt, more = read_bin(bin_path, config, tokenizer, orientation, recipe)
    return ckpt, notes + more


def _release_config(folder: Path) -> ModelConfig:
    skip = {SEGMENTS_FILE, "tokenizer.json"}
    found = sorted(p for p in folder.glob("*.json") if p.name not in skip)
    if (folder / RELEASE_CONFIG).exists():
        found = [folder / RELEASE_CONFIG]
    if not found:
        raise AndreaError(f"{folder} has a .bin but no config JSON; add one or give --preset or --config.")
    if len(found) > 1:
        raise AndreaError(f"{folder} has several JSON files that could be its config ({', '.join(p.name for p in found)}); "
                          f"name one {RELEASE_CONFIG} or give --config.")
    return ModelConfig.load(found[0])


def write_bin_or_release(path, ckpt: Checkpoint) -> list[str]:
    """A path ending in .bin gets the file alone; any other path becomes a release folder with
    model.bin, config.json and (when the model has a tokenizer) harris_segments.json."""
    path = Path(path)
    if path.suffix == ".bin":
        notes = write_bin(path, ckpt)
        return notes + [f"a .bin holds no config: read it back with --config (this model: {ckpt.config.to_dict()})."]
    path.mkdir(parents=True, exist_ok=True)
    notes = write_bin(path / "model.bin", ckpt)
    ckpt.config.save(path / RELEASE_CONFIG)
    tok = ckpt.tokenizer_dict
    if tok is not None:
        saved = HarrisTokenizer.from_dict(tok)
        saved.save(path)
        if saved.word_ends:
            notes.append(f"{SEGMENTS_FILE} marks word ends (\" cat</w>\", tokenizer version 5); a reader of ANDREA's "
                         f"release format older than that takes the mark for text.")
    else:
        notes.append(f"the model has no tokenizer, so {path} has no {SEGMENTS_FILE}.")
    return notes
