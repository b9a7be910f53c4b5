"""What the file formats share: the release folder's file names, checks of weights and tokenizers
against a config, and Adam's moments by parameter name (the .bin keeps them in model order)."""

from __future__ import annotations

from pathlib import Path

import torch

from andrea.config import ModelConfig
from andrea.errors import AndreaError
from andrea.files import read_json
from andrea.model import meta_model, param_shapes
from andrea.optim import check_recipe, make_optimizer, param_groups
from andrea.optim_state import optimizer_order
from andrea.tokenizer.harris import HarrisTokenizer

RELEASE_CONFIG = "config.json"  # the config file of a release folder this package writes
SEGMENTS_FILE = "harris_segments.json"


# ---------------------------------------------------------------- the parameters of a config


def check_weights(cfg: ModelConfig, state: dict, where: str) -> dict[str, torch.Tensor]:
    """state's tensors as float32, in model order, after checking names, shapes and values."""
    shapes = param_shapes(cfg)
    for name in state:
        if name not in shapes:
            raise AndreaError(f"{where} has a weight {name} that the config has no place for.")
    out = {}
    for name, shape in shapes.items():
        if name not in state:
            raise AndreaError(f"{where} has no weight {name}, which the config needs.")
        t = state[name]
        if tuple(t.shape) != shape:
            raise AndreaError(f"{where}: weight {name} has shape {list(t.shape)}, but the config needs {list(shape)}.")
        if not t.is_floating_point():
            raise AndreaError(f"{where}: weight {name} holds {t.dtype} values, not floats.")
        if not torch.isfinite(t).all():
            raise AndreaError(f"{where}: weight {name} holds NaN or infinite values.")
        out[name] = t.float()
    return out


def is_table(name: str) -> bool:
    """The embedding tables: one row per token or position."""
    return name in ("wte.weight", "wpe.weight")


def is_norm(name: str) -> bool:
    return ".ln_" in name or name.startswith("ln_f.")


# ---------------------------------------------------------------- optimizer moments by name


def adam_moments(cfg: ModelConfig, optim_state: dict | None) -> dict[str, tuple[torch.Tensor, torch.Tensor]] | None:
    """{name: (exp_avg, exp_avg_sq)} of an Adam/AdamW state dict; None when there is no state.

    A parameter trained by Muon (recipe v3's block matrices) has a momentum but no Adam moments:
    it gets zeros for both (`muon_trained` names those parameters, so a writer can say so)."""
    if not optim_state or not optim_state.get("state"):
        return None
    shapes = param_shapes(cfg)
    try:
        order = optimizer_order(cfg, optim_state["param_groups"])
        ids = [i for g in optim_state["param_groups"] for i in g["params"]]
    except (KeyError, TypeError):
        raise AndreaError("the optimizer state has no readable parameter groups.") from None
    out = {}
    for idx, name in zip(ids, order):
        per = optim_state["state"].get(idx, optim_state["state"].get(str(idx)))
        if per is None:  # a parameter that never got a gradient has no state yet
            zero = torch.zeros(shapes[name])
            out[name] = (zero, zero.clone())
            continue
        if "momentum_buffer" in per and "exp_avg" not in per:
            zero = torch.zeros(shapes[name])
            out[name] = (zero, zero.clone())
            continue
        if "exp_avg" not in per or "exp_avg_sq" not in per:
            raise AndreaError(f"the optimizer state of {name} has no exp_avg and exp_avg_sq; only Adam's moments fit a .bin.")
        m, v = per["exp_avg"], per["exp_avg_sq"]
        if tuple(m.shape) != shapes[name] or tuple(v.shape) != shapes[name]:
            raise AndreaError(f"the optimizer state of {name} has shape {list(m.shape)}, but the weight is {list(shapes[name])}.")
        out[name] = (m.float(), v.float())
    return out


def muon_trained(cfg: ModelConfig, optim_state: dict | None) -> list[str]:
    """The parameters whose state is Muon's momentum rather than Adam's moments."""
    if not optim_state or not optim_state.get("state"):
        return []
    order = optimizer_order(cfg, optim_state["param_groups"])
    ids = [i for g in optim_state["param_groups"] for i in g["params"]]
    state = optim_state["state"]
    return [name for idx, name in zip(ids, order) if "momentum_buffer" in state.get(idx, state.get(str(idx), {}))]


def adam_state(cfg: ModelConfig, step: int, moments: dict, recipe: str) -> dict:
    """An optimizer state dict that the trainer's optimizer for `recipe` loads on resume. Under
    v3 the Muon-trained matrices get no state: their momentum starts from zero, as in a new run."""

    check_recipe(recipe)
    groups = make_optimizer(meta_model(cfg), recipe, device="meta").state_dict()["param_groups"]
    ids = [i for g in groups for i in g["params"] if "momentum" not in g]  # Muon's groups have a momentum
    names = [n for g, ours in zip(groups, _groups_names(cfg, recipe)) for n in ours if "momentum" not in g]
    state = {}
    for idx, name in zip(ids, names):
        m, v = moments[name]
        state[idx] = {"step": torch.tensor(float(step), dtype=torch.float32), "exp_avg": m, "exp_avg_sq": v}
    return {"state": state, "param_groups": groups}


def _groups_names(cfg: ModelConfig, recipe: str) -> list[list[str]]:

    return [g["names"] for g in param_groups(meta_model(cfg), recipe)]


def resume_meta(step: int, recipe: str) -> dict:
    """What `andrea train --resume` reads besides weights and optimizer, for a file that lacks it:
    the step and the recipe. The rest of the run's state (the smoothed loss, the data order, the
    curriculum) then starts afresh from the run's seed, as `andrea.runstate.RunState` documents."""
    return {"step": step, "train": {"recipe": recipe}}


# ---------------------------------------------------------------- tokenizers


def tokenizer_from_segments(segments, where: str) -> dict:
    """The tokenizer dict a checkpoint embeds, from a list of segments in id order."""

    if not isinstance(segments, list) or not all(isinstance(s, str) for s in segments):
        raise AndreaError(f"{where} is not a JSON list of segment strings.")
    return HarrisTokenizer(segments).to_dict()


def read_segments(path) -> dict:
    """The tokenizer dict of a harris_segments.json file."""
    path = Path(path)
    return tokenizer_from_segments(read_json(path, "segments file"), str(path))


def checked_tokenizer(tok: dict | None, cfg: ModelConfig, where: str) -> dict | None:
    """A tokenizer dict that fits the config's vocabulary (or None)."""
    if tok is None:
        return None

    t = HarrisTokenizer.from_dict(tok, where)
    if t.vocab_size != cfg.vocab_size:
        raise AndreaError(f"{where} has {t.n_segments:,} segments (V = {t.vocab_size:,}) but the model has V = {cfg.vocab_size:,}.")
    return t.to_dict()


