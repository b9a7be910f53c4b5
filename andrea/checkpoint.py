"""Checkpoints: one safetensors file holding model, optimizer and everything needed to resume.

Layout of a checkpoint file:
  tensors   "model.<name>"              every parameter, in the model's own order
            "optim.<i>.<key>"           the optimizer's per-parameter state (Adam m and v, step)
            "rng.torch"                 torch's CPU generator state
  metadata  {"andrea": JSON}            format version, model config, step, optimizer param
                                        groups, the tokenizer, data position, RNG states and
                                        whatever the trainer adds (metrics, curriculum state)

safetensors holds only tensors and strings, so loading a checkpoint never executes code. Writes
are atomic: a temporary file in the same folder is written, fsynced and renamed over the target,
then the folder is fsynced; a crash leaves either the old checkpoint or the new one, never half.

Reading checks before it uses: the metadata's fields, then the config against the tensors' names,
shapes and types as the file's header lists them (by arithmetic first, then on the meta device),
so a damaged or hostile file never makes andrea allocate more than the file holds; then the
values (finite weights; finite Adam moments with a non-negative second moment).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import save_file

from andrea.config import ModelConfig, count_params, position_table_size
from andrea.errors import AndreaError
from andrea.files import atomic_output, check_regular, parse_json
from andrea.model import ANDREA, param_shapes
from andrea.optim_state import check_optimizer_layout, check_optimizer_values
from andrea.tokenizer.harris import HarrisTokenizer
from andrea.validate import is_int

FORMAT = "andrea-checkpoint"
VERSION = 1


@dataclass
class Checkpoint:
    config: ModelConfig
    model_state: dict[str, torch.Tensor]
    optim_state: dict | None = None
    meta: dict = field(default_factory=dict)

    @property
    def step(self) -> int:
        return int(self.meta.get("step", 0))

    @property
    def tokenizer_dict(self) -> dict | None:
        return self.meta.get("tokenizer")


def _flatten_optimizer(state: dict) -> tuple[dict[str, torch.Tensor], dict]:
    tensors, scalars = {}, {}
    for idx, per_param in state["state"].items():
        for key, value in per_param.items():
            if torch.is_tensor(value):
                tensors[f"optim.{idx}.{key}"] = value.detach().cpu().contiguous()
            else:
                scalars[f"{idx}.{key}"] = value
    return tensors, {"param_groups": state["param_groups"], "scalars": scalars}


def _unflatten_optimizer(tensors: dict[str, torch.Tensor], info: dict) -> dict:
    state: dict[int, dict] = {}
    for name, value in tensors.items():
        _, idx, key = name.split(".", 2)
        state.setdefault(int(idx), {})[key] = value
    for name, value in info.get("scalars", {}).items():
        idx, key = name.split(".", 1)
        state.setdefault(int(idx), {})[key] = value
    return {"state": state, "param_groups": info["param_groups"]}


def save_checkpoint(path, config: ModelConfig, model_state: dict, optim_state: dict | None = None, meta: dict | None = None) -> Path:
    path = Path(path)
    tensors = {f"model.{k}": v.detach().cpu().contiguous() for k, v in model_state.items()}
    meta = dict(meta or {})
    if optim_state is not None:
        optim_tensors, meta["optimizer"] = _flatten_optimizer(optim_state)
        tensors.update(optim_tensors)
    tensors["rng.torch"] = torch.get_rng_state()
    meta.update(format=FORMAT, version=VERSION, config=config.to_dict())
    with atomic_output(path) as tmp:
        save_file(tensors, str(tmp), metadata={"andrea": json.dumps(meta)})
    return path


FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")
TABLE_ALLOWANCE = 1 << 24  # values of computed position tables allowed beyond the model's size


def _resolve(path) -> Path:
    path = Path(path)
    if path.is_dir():
        for name in ("best.safetensors", "latest.safetensors"):
            if (path / name).exists():
                return check_regular(path / name, "checkpoint")
        raise AndreaError(f"{path} is a folder with no best.safetensors or latest.safetensors in it.")
    return check_regular(path, "checkpoint")  # a FIFO would block safetensors' reader forever


def load_checkpoint(path, optimizer: bool = True) -> Checkpoint:
    """Read a checkpoint written by `save_checkpoint`; any other file ends in an AndreaError.

    Everything is checked before it is used, and the file's layout before any tensor is read: the
    metadata's fields, the config against the names, shapes and types of the tensors (so a config
    that claims a larger model than the file holds is refused without allocating it), then the
    values (finite weights; finite, non-negative Adam moments). `optimizer=False` skips the
    optimizer's tensors (for sampling and inspecting, which do not need them)."""
    path = _resolve(path)
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            meta = _read_meta(f.metadata() or {}, path)
            config = _read_config(meta, path)
            layout = {}
            for name in f.keys():
                piece = f.get_slice(name)
                layout[name] = (tuple(piece.get_shape()), piece.get_dtype())
            order = check_layout(config, layout, meta, path, optimizer)
            tensors = {name: f.get_tensor(name) for name in layout if optimizer or not name.startswith("optim.")}
    except AndreaError:
        raise
    except (SafetensorError, OSError, ValueError, RuntimeError, TypeError) as e:
        raise AndreaError(f"{path} is not a readable checkpoint ({str(e).splitlines()[0][:120] if str(e) else type(e).__name__}).") from None
    model_state = {k[6:]: v for k, v in tensors.items() if k.startswith("model.")}
    for name, t in model_state.items():
        if not torch.isfinite(t).all():
            raise AndreaError(f"{path}: weight {name} holds NaN or infinite values.")
    optim_state = None
    if optimizer and "optimizer" in meta:
        optim_state = _unflatten_optimizer({k: v for k, v in tensors.items() if k.startswith("optim.")}, meta["optimizer"])
        check_optimizer_values(optim_state, order, path)
    if "rng.torch" in tensors:
        meta["rng_torch"] = tensors["rng.torch"]
    return Checkpoint(config=config, model_state=model_state, optim_state=optim_state, meta=meta)


def _read_meta(header: dict, path: Path) -> dict:
    try:
        meta = parse_json(header["andrea"], f"the metadata of {path}")
    except (KeyError, TypeError):
        meta = None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise AndreaError(f"{path} is a safetensors file but not an andrea checkpoint.")
    version = meta.get("version")
    if not is_int(version) or version < 1:
        raise AndreaError(f"{path} has no valid format version (found {str(version)[:40]!r}).")
    if version > VERSION:
        raise AndreaError(f"{path} is checkpoint format version {version}; this andrea reads up to {VERSION}.")
    if "step" in meta and (not is_int(meta["step"]) or meta["step"] < 0):
        raise AndreaError(f"{path} has a step that is not a non-negative integer ({str(meta['step'])[:40]!r}).")
    for key in ("train", "tokenizer", "optimizer"):
        if key in meta and not isinstance(meta[key], dict):
            raise AndreaError(f"{path}: the metadata field {key!r} must be a JSON object, got {type(meta[key]).__name__}.")
    return meta


def _read_config(meta: dict, path: Path) -> ModelConfig:
    if "config" not in meta:
        raise AndreaError(f"{path} has no model config in its metadata.")
    try:
        return ModelConfig.from_dict(meta["config"])
    except AndreaError as e:
        raise AndreaError(f"{path}: {e}") from None
    except TypeError:
        raise AndreaError(f"{path} has a malformed model config in its metadata.") from None


def check_layout(config: ModelConfig, layout: dict[str, tuple[tuple, str]], meta: dict, path, optimizer: bool = True):
    """Check the tensors' names, shapes and types (from the file's header, nothing read) against
    the config and the optimizer's groups; return the parameter names in optimizer index order
    (None without an optimizer state). The config is compared by arithmetic first, so a config
    that claims a model far larger than the file is refused before anything is built."""

    model = {k[6:]: v for k, v in layout.items() if k.startswith("model.")}
    for name in layout:
        if not name.startswith(("model.", "optim.")) and name != "rng.torch":
            raise AndreaError(f"{path} holds a tensor {name!r} that is no part of a checkpoint.")
    held = sum(math.prod(shape) for shape, _ in model.values())
    claimed = count_params(config)
    if claimed != held:
        raise AndreaError(f"{path}: its config describes a model of {claimed:,} parameters, but the file holds "
                          f"{held:,} model values; the config or the weights are damaged.")
    tables = position_table_size(config)
    if tables > max(claimed, TABLE_ALLOWANCE):
        raise AndreaError(f"{path}: its config asks for a context of {config.block_size:,} positions, whose {config.pos} "
                          f"tables ({tables:,} values) would far outweigh the model itself; the config is damaged.")
    shapes = param_shapes(config)
    for name in model:
        if name not in shapes:
            raise AndreaError(f"{path} has a weight {name} that its config has no place for.")
    for name, shape in shapes.items():
        if name not in model:
            raise AndreaError(f"{path} has no weight {name}, which its config needs.")
        found, dtype = model[name]
        if found != shape:
            raise AndreaError(f"{path}: weight {name} has shape {list(found)}, but its config needs {list(shape)}.")
        if dtype not in FLOAT_DTYPES:
            raise AndreaError(f"{path}: weight {name} holds {dtype} values, not floats.")
    if "rng.torch" in layout:
        shape, dtype = layout["rng.torch"]
        if dtype != "U8" or shape != tuple(torch.get_rng_state().shape):
            raise AndreaError(f"{path}: its random-generator state has shape {list(shape)} of {dtype}, not torch's.")
    optim = {k: v for k, v in layout.items() if k.startswith("optim.")}
    if not optimizer:
        return None
    if "optimizer" not in meta:
        if optim:
            raise AndreaError(f"{path} holds optimizer tensors but no optimizer groups in its metadata.")
        return None
    return check_optimizer_layout(config, shapes, meta["optimizer"], optim, path)


def build_model(ckpt: Checkpoint, device="cpu"):
    """The model of a checkpoint, weights loaded, in eval mode."""

    model = ANDREA(ckpt.config)
    missing, unexpected = model.load_state_dict(ckpt.model_state, strict=False)
    if missing or unexpected:
        what = f"missing {', '.join(missing[:3])}" if missing else f"unexpected {', '.join(unexpected[:3])}"
        raise AndreaError(f"the checkpoint's weights do not fit its config ({what}).")
    return model.to(device).eval()


def load_model(path, device="cpu"):
    """(model, tokenizer or None, checkpoint) from a checkpoint file or run folder."""
    ckpt = load_checkpoint(path, optimizer=False)
    model = build_model(ckpt, device)
    tokenizer = None
    if ckpt.tokenizer_dict is not None:

        tokenizer = HarrisTokenizer.from_dict(ckpt.tokenizer_dict)
        if tokenizer.vocab_size != ckpt.config.vocab_size:
            raise AndreaError(f"the checkpoint's tokenizer has V = {tokenizer.vocab_size} but its model has V = {ckpt.config.vocab_size}.")
    return model, tokenizer, ckpt
