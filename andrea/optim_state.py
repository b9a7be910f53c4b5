"""An optimizer's saved state: which parameter each entry belongs to, whether it fits a model and
recipe, and how a run loads it and gathers it.

A state dict numbers parameters by index, group after group in the recipe's order
(`andrea.optim.param_groups`); `optimizer_order` names them again from the groups' sizes. A
checkpoint's state is checked in two passes before it is believed: its layout by the file's
header (`check_optimizer_layout`, before any tensor is read) and then its values
(`check_optimizer_values`). On `--resume` it must fit the run's model and recipe
(`check_optimizer_fits`); `load_optimizer_state` hands it to the run's optimizer, which under FSDP
means scattering it to the shards by name, and `full_optim_state` gathers it back as one
process's state, so any run can resume any other.
"""

from __future__ import annotations

import math

import torch

from andrea.config import ModelConfig
from andrea.distributed import full_options
from andrea.errors import AndreaError
from andrea.model import meta_model
from andrea.optim import param_groups, param_names_in_order
from andrea.trainconfig import RECIPES
from andrea.validate import is_int

ADAM_KEYS = ("exp_avg", "exp_avg_sq", "step")  # what Adam and AdamW keep per parameter
MUON_KEYS = ("momentum_buffer",)  # what Muon keeps (recipe v3's block matrices)
OPTIM_KEYS = ADAM_KEYS + MUON_KEYS
FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")


def optimizer_order(cfg: ModelConfig, groups: list) -> list[str]:
    """Parameter names in the index order of an optimizer state with these groups: the order of
    the recipe whose group sizes they match (how a checkpoint's state is read by name)."""
    sizes = [len(g.get("params", [])) for g in groups]
    model = meta_model(cfg)
    for recipe in RECIPES:
        ours = param_groups(model, recipe)
        if sizes == [len(g["names"]) for g in ours]:
            return [n for g in ours for n in g["names"]]
    described = "; ".join(f"recipe {r} {[len(g['names']) for g in param_groups(model, r)]}" for r in RECIPES)
    raise AndreaError(f"the optimizer state has parameter groups of sizes {sizes}, which match no recipe ({described}).")


def check_optimizer_layout(config: ModelConfig, shapes: dict, info: dict, optim: dict, path) -> list[str]:
    """The parameter names in the order of a saved optimizer state, once its groups (`info`, from
    the checkpoint's metadata) and its entries (`optim`: "optim.<i>.<key>" -> (shape, dtype), as
    the file's header lists them) are known to fit the model of `config` whose weights have
    `shapes`: every parameter numbered once, each entry a known key of a known parameter, floats
    of the weight's shape, and every parameter's state whole (Adam's three, or Muon's one)."""
    groups, scalars = info.get("param_groups"), info.get("scalars", {})
    if (not isinstance(groups, list) or not groups or not all(isinstance(g, dict) for g in groups)
            or not all(isinstance(g.get("params"), list) and all(is_int(i) for i in g["params"]) for g in groups)):
        raise AndreaError(f"{path} has no readable optimizer parameter groups in its metadata.")
    if not isinstance(scalars, dict) or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                                                for v in scalars.values()):
        raise AndreaError(f"{path} has malformed optimizer scalars in its metadata.")
    ids = [i for g in groups for i in g["params"]]
    if sorted(ids) != list(range(len(ids))):
        raise AndreaError(f"{path}: its optimizer groups do not number the parameters 0..{len(ids) - 1} once each.")
    try:
        order = optimizer_order(config, groups)
    except AndreaError as e:
        raise AndreaError(f"{path}: {e}") from None
    name_of = dict(zip(ids, order))
    present: dict[int, set] = {}
    entries = [(k, v) for k, v in optim.items()] + [("optim." + k, None) for k in scalars]
    for key, layout in entries:
        parts = key.split(".", 2)
        if len(parts) != 3 or not parts[1].isdigit() or int(parts[1]) not in name_of or parts[2] not in OPTIM_KEYS:
            raise AndreaError(f"{path} holds an optimizer entry {key!r} that fits no parameter of its groups.")
        idx, what = int(parts[1]), parts[2]
        if what in present.setdefault(idx, set()):
            raise AndreaError(f"{path} holds the optimizer entry {what} of parameter {idx} twice.")
        present[idx].add(what)
        if layout is None:
            continue
        shape, dtype = layout
        if dtype not in FLOAT_DTYPES:
            raise AndreaError(f"{path}: the optimizer's {what} of {name_of[idx]} holds {dtype} values, not floats.")
        want = () if what == "step" else shapes[name_of[idx]]
        if shape != want and not (what == "step" and math.prod(shape) == 1):
            raise AndreaError(f"{path}: the optimizer's {what} of {name_of[idx]} has shape {list(shape)}, "
                              f"but the weight is {list(shapes[name_of[idx]])}.")
    if present:  # a state that was never stepped is empty; one that was holds every part of every parameter
        for idx, name in name_of.items():
            have = present.get(idx, set())
            if not have:  # no state yet (Muon's momentum after a .bin, which holds none, starts at zero)
                continue
            keys = MUON_KEYS if "momentum_buffer" in have else ADAM_KEYS
            missing = [k for k in keys if k not in have]
            if missing or have - set(keys):
                what = f"no {', '.join(missing)}" if missing else f"both Adam's and Muon's entries ({', '.join(sorted(have))})"
                raise AndreaError(f"{path}: the optimizer state of {name} has {what}.")
    return order


def check_optimizer_values(state: dict, order: list[str] | None, path) -> None:
    """Adam's moments finite, its second moment non-negative, its step count a finite count."""
    for idx, per in state["state"].items():
        name = order[idx] if order is not None else str(idx)
        for key, value in per.items():
            t = value if torch.is_tensor(value) else torch.tensor(float(value))
            if not torch.isfinite(t).all():
                raise AndreaError(f"{path}: the optimizer's {key} of {name} holds NaN or infinite values.")
            if key in ("exp_avg_sq", "step") and (t < 0).any():
                raise AndreaError(f"{path}: the optimizer's {key} of {name} holds negative values.")


def full_optim_state(optimizer, train_model, recipe: str, fsdp: bool) -> dict:
    """The optimizer state as a plain single-process optimizer has it: keyed by index."""
    if not fsdp:
        return optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    full = get_optimizer_state_dict(train_model, optimizer, options=full_options())
    if not full:  # only rank 0 receives the gathered state
        return {}
    index = {n: i for i, n in enumerate(param_names_in_order(train_model, recipe))}
    return {"state": {index[n]: v for n, v in full["state"].items()},
            "param_groups": [{**g, "params": [index[n] for n in g["params"]]} for g in full["param_groups"]]}


def check_optimizer_fits(state: dict, model_cfg: ModelConfig, recipe: str, path) -> None:
    """The saved optimizer state belongs to this model and recipe: the same groups of the same
    parameters. (Shapes, presence and finiteness were checked when the file was read.)"""
    ours = [len(g["names"]) for g in param_groups(meta_model(model_cfg), recipe)]
    saved = [len(g["params"]) for g in state["param_groups"]]
    if ours != saved:
        raise AndreaError(f"{path} holds an optimizer state with parameter groups of sizes {saved}, but recipe {recipe} "
                          f"on this model has {ours}; resume with the recipe it was trained with.")


def load_optimizer_state(optimizer, state: dict, train_model, recipe: str, fsdp: bool, path) -> None:
    # the saved groups give only which parameters are where; the hyperparameters are this run's
    ours = optimizer.state_dict()["param_groups"]
    state = {"state": state["state"], "param_groups": [{**g, "params": s["params"]} for g, s in zip(ours, state["param_groups"])]}
    if not fsdp:
        try:
            optimizer.load_state_dict(state)
        except (ValueError, RuntimeError, KeyError, TypeError) as e:
            raise AndreaError(f"the optimizer state in {path} does not fit this run ({str(e).splitlines()[0][:100]}).") from None
        return
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    names = param_names_in_order(train_model, recipe)
    keyed = {"state": {names[int(i)]: v for i, v in state["state"].items()},
             "param_groups": [{**g, "params": [names[int(i)] for i in g["params"]]} for g in state["param_groups"]]}
    set_optimizer_state_dict(train_model, optimizer, keyed, options=full_options())
