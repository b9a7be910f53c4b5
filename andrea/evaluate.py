"""Validation loss and bits per byte: the one place they are computed.

Bits per byte is the loss in bits summed over the predicted tokens, divided by the bytes those
tokens stand for (BOS stands for none): nats / (ln 2 · bytes). It compares models whatever their
tokenizers, since a byte is a byte. Training's evaluations (`evaluate`, per source and over all)
and the positions experiment (`andrea.experiments.positions`) both use `bits_per_byte`.

Every figure comes with its standard error over the windows read (`standard_error`). Evaluations
during training read a few windows per source, to stay cheap; the main job's final figure
(`final_evaluation`) reads every source's held-out text whole, enough for an error of a few
thousandths of a bit per byte, and is timed apart from the training budget. Over all sources
each source weighs alike, however much held-out text it has (`combine`).
"""

from __future__ import annotations

import math
from contextlib import nullcontext

import torch

from andrea.shards import TokenData

LOG2 = math.log(2)


def bits_per_byte(nats: float, nbytes: float) -> float:
    """Summed nats over the bytes their tokens stand for, in bits (0 bytes counts as 1)."""
    return float(nats) / (LOG2 * max(float(nbytes), 1.0))


def summed_nats(logits: torch.Tensor, targets: torch.Tensor) -> float:
    """The loss in nats summed over every prediction of (..., V) logits against (...) targets, in
    float64: for a reader that turns the last state into logits its own way (a lesson's lens at
    each block, or another table as the head), the same cross-entropy as every other figure here."""
    return float(torch.nn.functional.cross_entropy(logits.double().flatten(0, -2), targets.flatten(), reduction="sum"))


def token_byte_lengths(tokenizer, vocab_size: int) -> torch.Tensor:
    """(V,) float64: how many bytes each token stands for."""
    return torch.tensor([len(tokenizer.token_bytes(i)) for i in range(vocab_size)], dtype=torch.float64)


@torch.no_grad()
def position_nats(model, x: torch.Tensor, y: torch.Tensor, micro_batch: int, device=None, autocast=None,
                  dtype=torch.float32) -> torch.Tensor:
    """(windows, T) float64, on the CPU: the loss in nats of every prediction of every window,
    `micro_batch` windows' logits at a time, the cross-entropy computed in `dtype` (float32 for
    training's evaluations; the lessons ask float64)."""
    out = []
    for i in range(0, len(x), micro_batch):
        xb, yb = x[i : i + micro_batch], y[i : i + micro_batch]
        if device is not None:
            xb, yb = xb.to(device), yb.to(device)
        with autocast or nullcontext():
            logits, _ = model(xb)
        nats = torch.nn.functional.cross_entropy(logits.to(dtype).flatten(0, 1), yb.flatten(), reduction="none")
        out.append(nats.view(len(xb), -1).double())
    return torch.cat(out).cpu()  # read once per call


def window_nats(model, x: torch.Tensor, y: torch.Tensor, micro_batch: int, device, autocast) -> torch.Tensor:
    """(windows,) float64: the summed loss in nats of each window's predictions."""
    return position_nats(model, x, y, micro_batch, device, autocast).sum(1)


def combine(parts: list[tuple[torch.Tensor, torch.Tensor]], seq_len: int) -> dict:
    """Loss, bits per byte, tokens and standard error over parts [(nats per window, bytes per
    window)], one part per source, each source weighed alike whatever its count of windows: the
    ratio of the sum of each source's mean nats per window to the sum of its mean bytes per window
    (with equal counts, simply all nats over all bytes). The standard error, in bits per byte, is
    the delta method's, sqrt(Σ_s var_s(n − R·b) / k_s) / Σ_s mean_s(b): windows of one source follow
    each other in its text and are not quite independent, so it is a floor. None below two
    windows in a part."""
    nats = sum(float(n.mean()) for n, _ in parts)
    nbytes = sum(float(b.mean()) for _, b in parts)
    R = nats / max(nbytes, 1.0)
    se = None
    if parts and all(len(n) >= 2 for n, _ in parts):
        var = sum(float((n - R * b).var()) / len(n) for n, b in parts)
        se = math.sqrt(var) / (LOG2 * max(nbytes, 1.0))
    return {"loss": nats / (seq_len * len(parts)), "bpb": bits_per_byte(nats, nbytes),
            "tokens": seq_len * sum(len(n) for n, _ in parts), "se": se}


@torch.no_grad()
def evaluate(model, data: TokenData, seq_len: int, windows: int, micro_batch: int, byte_len: torch.Tensor,
             device, autocast) -> dict:
    """Validation loss (nats/token) and bits per byte, per source and over all of them (`combine`),
    each with its standard error (`se`, bits per byte; None below two windows), on the first
    `windows` windows of every source's held-out text."""
    model.eval()
    out, parts = {}, []
    for name in data.names:
        x, y = data.val_windows(name, seq_len, windows)
        nats = window_nats(model, x, y, micro_batch, device, autocast)
        parts.append((nats, byte_len[y].sum(1)))
        out[name] = combine(parts[-1:], seq_len)
    out["all"] = combine(parts, seq_len)
    model.train()
    return out


def held_out_windows(data: TokenData, seq_len: int) -> int:
    """How many windows of seq_len the largest source's held-out text holds: asked for that many,
    `evaluate` reads every source's held-out text whole."""
    return max(sum(max(0, (len(shard) - 1) // seq_len) for shard in data.sources[name].val.shards) for name in data.names)


def final_evaluation(model, data: TokenData, seq_len: int, byte_len: torch.Tensor, micro_batch: int = 16,
                     device="cpu", autocast=None, windows: int | None = None) -> dict:
    """`evaluate` on every source's held-out text, whole (or on its first `windows` windows): the
    figure runs are compared by, with its standard error, and `seconds`, what it took."""
    import contextlib
    import time

    t0 = time.time()
    windows = held_out_windows(data, seq_len) if windows is None else windows
    result = evaluate(model, data, seq_len, max(1, windows), micro_batch, byte_len, device,
                      autocast or contextlib.nullcontext())
    result["all"]["seconds"] = time.time() - t0
    return result
