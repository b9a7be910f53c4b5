"""Many processes under `torchrun`: the process group, each process's device, gradient clipping
and the whole model and optimizer state gathered from (or handed back to) FSDP shards.

One process needs none of this: every function here is the identity, or close to it, when
WORLD_SIZE is 1 and FSDP is off. (The optimizer's state gathered from shards and handed back to
them is `andrea.optim_state`'s.)
"""

from __future__ import annotations

import os
from contextlib import nullcontext

import torch
import torch.distributed as dist

from andrea.model import tune_for_training


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
