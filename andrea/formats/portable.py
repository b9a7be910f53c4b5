"""The portable JSON model: everything the standard-library engine (andrea/stdlib_engine.py) needs.

    {"format": "andrea-json", "version": 1,
     "config": {vocab_size, n_embd, n_head, n_layer, block_size, pos, norm, act},
     "step": 1200,
     "tokenizer": {... HarrisTokenizer.to_dict(): "segments" in id order, "word_pattern", ...},
     "tensors": {"wte.weight": {"shape": [V, d], "data": [V·d numbers, row-major]}, ...}}

Tensors are named as in the model (`h.0.attn.wq.weight`) and listed in the .bin's order; each is
a flat list with its shape, or a nested list (read only). Numbers are written as the exact
decimal of each float32 weight, so a round trip through JSON is bitwise exact. The tokenizer
may be null. A matrix whose shape is the transpose of ours is read transposed when its shape
shows it (fc1, fc2, lm_head, and the tables wte and wpe); the square ones (wq, wk, wv, wo) have
no shape to tell, and follow fc1, fc2 and lm_head.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from andrea.checkpoint import Checkpoint
from andrea.config import ModelConfig
from andrea.errors import AndreaError
from andrea.files import atomic_output
from andrea.files import read_json as read_json_file
from andrea.formats.common import check_weights, checked_tokenizer, is_table, param_shapes

FORMAT = "andrea-json"
VERSION = 1


def write_json(path, ckpt: Checkpoint) -> list[str]:
    """Write ckpt's model and tokenizer as a portable JSON model (atomically)."""
    path = Path(path)
    state = check_weights(ckpt.config, ckpt.model_state, "the model")
    head = {"format": FORMAT, "version": VERSION, "config": ckpt.config.to_dict(), "step": ckpt.step,
            "tokenizer": ckpt.tokenizer_dict}
    with atomic_output(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        # one tensor at a time, so a large model is never one giant string in memory
        f.write(json.dumps(head, ensure_ascii=True)[:-1] + ', "tensors": {')
        for i, (name, t) in enumerate(state.items()):
            f.write(("," if i else "") + f'\n"{name}": {{"shape": {list(t.shape)}, "data": ')
            f.write(json.dumps(t.reshape(-1).tolist()))
            f.write("}")
        f.write("}}\n")
    notes = [] if ckpt.optim_state is None else ["the JSON model holds no optimizer state (weights and tokenizer only)."]
    if ckpt.tokenizer_dict is None:
        notes.append("the model has no tokenizer, so the JSON model can only run on token ids.")
    return notes


def read_json(path) -> tuple[Checkpoint, list[str]]:
    """A checkpoint (weights, config, tokenizer, step) from a portable JSON model."""
    path = Path(path)
    doc = read_json_file(path, "JSON model")
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise AndreaError(f"{path} is JSON but not an ANDREA JSON model (no \"format\": \"{FORMAT}\").")
    if not isinstance(doc.get("version"), int) or doc["version"] > VERSION:
        raise AndreaError(f"{path} is ANDREA JSON version {doc.get('version')!r}; this andrea reads up to {VERSION}.")
    cfg = ModelConfig.from_dict(doc.get("config"))
    tensors = doc.get("tensors")
    if not isinstance(tensors, dict):
        raise AndreaError(f"{path} has no \"tensors\" object.")
    step = doc.get("step", 0)
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise AndreaError(f"{path} has step {step!r}; expected a whole number >= 0.")
    if cfg.n_layer > len(tensors):  # counted before the config's model is laid out, block by block
        raise AndreaError(f"{path}: its config has {cfg.n_layer:,} layers, but the file holds only {len(tensors):,} "
                          f"tensors (a layer has six or more); the config or the tensors are damaged.")
    raw = {name: _tensor(name, value, path) for name, value in tensors.items()}
    shapes = param_shapes(cfg)
    state, notes = _orient(raw, shapes, path)
    state = check_weights(cfg, state, str(path))
    meta = {"step": step}
    tok = checked_tokenizer(doc.get("tokenizer"), cfg, f"the tokenizer in {path}")
    if tok is not None:
        meta["tokenizer"] = tok
    return Checkpoint(config=cfg, model_state=state, meta=meta), notes


def _tensor(name: str, value, path: Path) -> torch.Tensor:
    """A float32 tensor from {"shape": [...], "data": [flat]} or a nested list."""
    if isinstance(value, dict):
        shape, data = value.get("shape"), value.get("data")
        if not isinstance(shape, list) or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape):
            raise AndreaError(f"{path}: tensor {name} has no valid \"shape\" (a list of whole numbers).")
        if not isinstance(data, list) or len(data) != math.prod(shape):
            found = len(data) if isinstance(data, list) else type(data).__name__
            raise AndreaError(f"{path}: tensor {name} has shape {shape}, so {math.prod(shape):,} values, but its data holds {found}.")
    elif isinstance(value, list):
        shape, data = _nested_shape(value, name, path), value
        for _ in range(len(shape) - 1):
            data = [x for row in data for x in row]
    else:
        raise AndreaError(f"{path}: tensor {name} is a {type(value).__name__}; expected a list or {{\"shape\", \"data\"}}.")
    if not all(type(x) in (int, float) for x in data):
        bad = next(x for x in data if type(x) not in (int, float))
        raise AndreaError(f"{path}: tensor {name} holds {bad!r}, which is not a number.")
    try:
        return torch.tensor(data, dtype=torch.float32).reshape(shape)
    except (OverflowError, RuntimeError):
        raise AndreaError(f"{path}: tensor {name} holds a number too large for float32.") from None


def _nested_shape(value, name: str, path: Path) -> list[int]:
    shape, level = [], value
    while isinstance(level, list):
        shape.append(len(level))
        if not level:
            break
        level = level[0]

    def check(x, depth):
        if depth == len(shape):
            if isinstance(x, list):
                raise AndreaError(f"{path}: tensor {name} is a ragged nested list (deeper in some places).")
            return
        if not isinstance(x, list) or len(x) != shape[depth]:
            raise AndreaError(f"{path}: tensor {name} is a ragged nested list (rows of different lengths).")
        for y in x:
            check(y, depth + 1)

    check(value, 0)
    return shape


def _orient(raw: dict, shapes: dict, path: Path) -> tuple[dict, list[str]]:
    """raw with matrices given transposed turned into our layout, as far as shapes show it."""
    def transposed(name):
        want, got = shapes.get(name), raw.get(name)
        return (got is not None and want is not None and len(want) == 2 and want[0] != want[1]
                and tuple(got.shape) == want[::-1])

    linear = [n for n, s in shapes.items() if len(s) == 2 and not is_table(n) and s[0] != s[1]]
    flipped = [n for n in linear if transposed(n)]
    if flipped and len(flipped) != len(linear):
        kept = [n for n in linear if n not in flipped]
        raise AndreaError(f"{path} mixes orientations: {flipped[0]} is stored [in][out] but {kept[0]} [out][in].")
    notes = []
    out = dict(raw)
    if flipped:
        for name, s in shapes.items():
            if len(s) == 2 and not is_table(name) and name in out and out[name].dim() == 2:
                out[name] = out[name].T.contiguous()
        notes.append("layout found: linear matrices [in][out] (transposed from ours), told by the shapes of fc1, fc2 "
                     "and lm_head; the square matrices (wq, wk, wv, wo) have no shape to tell, and follow them.")
    for name in ("wte.weight", "wpe.weight"):
        if transposed(name):
            out[name] = out[name].T.contiguous()
            notes.append(f"layout found: {name} stored one column per {'token' if name[1] == 't' else 'position'} "
                         f"(transposed from ours), told by its shape.")
    return out, notes
