"""Memory counted before it is taken: the bytes a model, a training process and a KV cache need,
by arithmetic from the config, against what this machine (or the GPU) has left. Work that cannot
fit is refused in one sentence naming the fix, before anything is allocated."""

from __future__ import annotations

import os

from andrea.config import ModelConfig, count_params, position_table_size
from andrea.errors import AndreaError

FLOAT_BYTES = 4  # weights, gradients and moments are float32
LAYER_BYTES = 32_768  # the Python objects of one block's modules (measured: about 36 KB)


def model_bytes(cfg: ModelConfig) -> int:
    """Bytes a model of cfg takes in memory: its weights, its computed position tables and its
    blocks' Python objects (which a model of a million tiny layers is mostly made of)."""
    return FLOAT_BYTES * (count_params(cfg) + position_table_size(cfg)) + LAYER_BYTES * cfg.n_layer


def training_bytes(cfg: ModelConfig, micro_batch: int, seq_len: int, loss_rows: int | None = None) -> int:
    """A lower bound on the bytes one training process holds: the model, its gradients and two
    Adam moments; per micro-batch the windows (int64) and, per token and layer, the sixteen d-wide
    activations a block keeps for the backward pass (its input, the first norm's output, q, k
    and v, attention's output, the residual sum, the second norm's output, and the MLP's two
    4d-wide ones); and the loss's logits: whole, they and their log-softmax (2 × tokens × V);
    in blocks of `loss_rows` rows, one block and the gradient of the final norm's output."""
    tokens = micro_batch * seq_len
    if loss_rows is None or loss_rows >= tokens:
        logits = 2 * tokens * cfg.vocab_size
    else:
        logits = loss_rows * cfg.vocab_size + tokens * cfg.n_embd
    return (model_bytes(cfg) + 3 * FLOAT_BYTES * count_params(cfg) + 16 * micro_batch * (seq_len + 1)
            + FLOAT_BYTES * 16 * tokens * cfg.n_layer * cfg.n_embd + FLOAT_BYTES * logits)


def available_memory() -> int | None:
    """Bytes of memory this process can still take: the kernel's MemAvailable, within the
    process's control group's limit where it has one; None where neither can be read."""
    have = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    have = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    if have is None:
        try:
            have = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            pass
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        with open("/sys/fs/cgroup/memory.current") as f:
            left = int(limit) - int(f.read()) if limit.isdigit() else None
        if left is not None:
            have = left if have is None else min(have, left)
    except (OSError, ValueError):
        pass
    return have


def _gb(n: int) -> str:
    return f"{n / 1e9:,.1f} GB" if n >= 1e8 else f"{n / 1e6:,.0f} MB"


def check_memory(need: int, what: str, advice: str, have: int | None = None, where: str = "this machine") -> None:
    """Refuse, in one sentence, work that needs more memory than there is (`have`, default what
    available_memory finds); where it cannot be known, nothing is refused."""
    have = available_memory() if have is None else have
    if have is not None and need > have:
        raise AndreaError(f"{what} needs at least {_gb(need)} of memory, but {where} has {_gb(max(0, have))} available; "
                          f"{advice}.")


def check_training_memory(model_cfg: ModelConfig, seq_len: int, micro: int, device) -> None:
    """Refuse, before anything is built, a run whose model and micro-batch cannot fit: counted by
    arithmetic (`training_bytes`, the loss in the blocks of rows it takes on `device`,
    `andrea.loss.loss_chunk_rows`), against the GPU's free memory or the machine's."""
    import torch

    from andrea.loss import loss_chunk_rows

    cuda = device.type == "cuda"
    need = training_bytes(model_cfg, micro, seq_len, loss_chunk_rows(device))
    have = torch.cuda.mem_get_info(device)[0] if cuda else None
    check_memory(need, f"training this model on micro-batches of {micro:,} × {seq_len:,} tokens", "lower "
                 "--batch-size, or give --micro-batch so that gradients accumulate over smaller batches, or choose a "
                 "smaller model", have=have, where="the GPU" if cuda else "this machine")
