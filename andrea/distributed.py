"""Many processes under `torchrun`: the process group, each process's device, gradient clipping
and the whole model and optimizer state gathered from (or handed back to) FSDP shards.

One process needs none of this: every function here is the identity, or close to it, when
WORLD_SIZE is 1 and FSDP is off. Under FSDP a checkpoint still holds the state a plain
single-process optimizer would have (keyed by parameter index), so any run can resume any other.
"""

from __future__ import annotations

import os
from contextlib import nullcontext

import torch
import torch.distributed as dist

from andrea.config import ModelConfig
from andrea.errors import AndreaError
from andrea.model import meta_model, tune_for_training
from andrea.optim import param_groups, param_names_in_order


def local_part(t: torch.Tensor) -> torch.Tensor:
    """This process's part of a (possibly FSDP-sharded) parameter."""
    return t.to_local() if hasattr(t, "to_local") else t.detach()


def setup_processes():
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend)
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def pick_device() -> torch.device:
    if torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        return torch.device("cuda", local)
    return torch.device("cpu")


def clip_gradients(train_model, max_norm: float, fsdp: bool) -> torch.Tensor:
    """Clip the gradients to max_norm; their total norm before clipping, left on the device."""
    norm = torch.nn.utils.clip_grad_norm_(train_model.parameters(), max_norm)
    return norm.full_tensor() if fsdp else norm


def full_options(**kw):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, cpu_offload=True, **kw)


def full_state(model, fsdp: bool) -> dict:
    if not fsdp:
        return model.state_dict()
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return get_model_state_dict(model, options=full_options())


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


def wrap_model(model, device: torch.device, world: int, fsdp: bool):
    """The model as the training step uses it (`tune_for_training`): itself on one process, else
    under DDP or sharded by FSDP2 (each block, then the rest)."""
    tune_for_training(model, device)
    if world == 1:
        return model
    if fsdp:
        from torch.distributed.fsdp import fully_shard  # loaded only under FSDP

        for block in model.h:
            fully_shard(block)
        fully_shard(model)
        return model
    from torch.nn.parallel import DistributedDataParallel as DDP  # loaded only under DDP

    return DDP(model, device_ids=[device.index] if device.type == "cuda" else None)


def any_rank(flag: bool, world: int, device: torch.device) -> bool:
    """Whether the flag is set on any process."""
    if world == 1:
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def grad_sync(model, train_model, fsdp: bool, world: int, last: bool):
    """A context for one micro-batch's backward: gradients are averaged over processes only on
    the last micro-batch of a step."""
    if fsdp:
        model.set_requires_gradient_sync(last)
        return nullcontext()
    return nullcontext() if (last or world == 1) else train_model.no_sync()


def all_finite(tensors) -> torch.Tensor:
    """Whether every value of every tensor is finite, as a tensor on their device (no wait for it)."""
    flags = [torch.isfinite(t).all() for t in tensors]
    return torch.stack(flags).all() if flags else torch.tensor(True)
