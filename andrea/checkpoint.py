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
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import save_file

from andrea.config import ModelConfig
from andrea.errors import AndreaError
from andrea.files import atomic_output

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


def load_checkpoint(path) -> Checkpoint:
    """Read a checkpoint written by `save_checkpoint`; any other file ends in an AndreaError."""
    path = Path(path)
    if path.is_dir():
        for name in ("best.safetensors", "latest.safetensors"):
            if (path / name).exists():
                path = path / name
                break
        else:
            raise AndreaError(f"{path} is a folder with no best.safetensors or latest.safetensors in it.")
    if not path.exists():
        raise AndreaError(f"checkpoint {path} does not exist.")
    try:
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:
            header = f.metadata() or {}
            tensors = {name: f.get_tensor(name) for name in f.keys()}
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise AndreaError(f"{path} is not a readable checkpoint ({str(e).splitlines()[0][:120]}).") from None
    try:
        meta = json.loads(header["andrea"])
    except (KeyError, json.JSONDecodeError, TypeError):
        meta = None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise AndreaError(f"{path} is a safetensors file but not an andrea checkpoint.")
    if meta.get("version", 0) > VERSION:
        raise AndreaError(f"{path} is checkpoint format version {meta['version']}; this andrea reads up to {VERSION}.")
    config = ModelConfig.from_dict(meta["config"])
    model_state = {k[6:]: v for k, v in tensors.items() if k.startswith("model.")}
    optim_tensors = {k: v for k, v in tensors.items() if k.startswith("optim.")}
    optim_state = _unflatten_optimizer(optim_tensors, meta["optimizer"]) if "optimizer" in meta else None
    if "rng.torch" in tensors:
        meta["rng_torch"] = tensors["rng.torch"]
    return Checkpoint(config=config, model_state=model_state, optim_state=optim_state, meta=meta)


def build_model(ckpt: Checkpoint, device="cpu"):
    """The model of a checkpoint, weights loaded, in eval mode."""
    from andrea.model import ANDREA

    model = ANDREA(ckpt.config)
    missing, unexpected = model.load_state_dict(ckpt.model_state, strict=False)
    if missing or unexpected:
        what = f"missing {', '.join(missing[:3])}" if missing else f"unexpected {', '.join(unexpected[:3])}"
        raise AndreaError(f"the checkpoint's weights do not fit its config ({what}).")
    for name, t in ckpt.model_state.items():
        if not torch.isfinite(t).all():
            raise AndreaError(f"the checkpoint's weight {name} holds NaN or infinite values.")
    return model.to(device).eval()


def load_model(path, device="cpu"):
    """(model, tokenizer or None, checkpoint) from a checkpoint file or run folder."""
    ckpt = load_checkpoint(path)
    model = build_model(ckpt, device)
    tokenizer = None
    if ckpt.tokenizer_dict is not None:
        from andrea.tokenizer import HarrisTokenizer

        tokenizer = HarrisTokenizer.from_dict(ckpt.tokenizer_dict)
        if tokenizer.vocab_size != ckpt.config.vocab_size:
            raise AndreaError(f"the checkpoint's tokenizer has V = {tokenizer.vocab_size} but its model has V = {ckpt.config.vocab_size}.")
    return model, tokenizer, ckpt
