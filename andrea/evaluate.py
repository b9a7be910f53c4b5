"""Validation loss and bits per byte: the one place they are computed.

Bits per byte is the loss in bits summed over the predicted tokens, divided by the bytes those
tokens stand for (BOS stands for none): nats / (ln 2 · bytes). It compares models whatever their
tokenizers, since a byte is a byte. Training's evaluations (`evaluate`, per source and over all)
and the positions experiment (`andrea.experiments.positions`) both use `bits_per_byte`.
"""

from __future__ import annotations

import math

import torch

from andrea.shards import TokenData

LOG2 = math.log(2)


def bits_per_byte(nats: float, nbytes: float) -> float:
    """Summed nats over the bytes their tokens stand for, in bits (0 bytes counts as 1)."""
    return float(nats) / (LOG2 * max(float(nbytes), 1.0))



def token_byte_lengths(tokenizer, vocab_size: int) -> torch.Tensor:
    """(V,) float64: how many bytes each token stands for."""
    return torch.tensor([len(tokenizer.token_bytes(i)) for i in range(vocab_size)], dtype=torch.float64)


@torch.no_grad()
def evaluate(model, data: TokenData, seq_len: int, windows: int, micro_batch: int, byte_len: torch.Tensor,
             device, autocast) -> dict:
    """Validation loss (nats/token) and bits per byte, per source and over all of them."""
    model.eval()
    out, total_nats, total_bytes, total_tokens = {}, 0.0, 0.0, 0
    for name in data.names:
        x, y = data.val_windows(name, seq_len, windows)
        nats = torch.zeros((), dtype=torch.float64, device=device)  # summed on the device, read once per source
        for i in range(0, len(x), micro_batch):
            xb, yb = x[i : i + micro_batch].to(device), y[i : i + micro_batch].to(device)
            with autocast:
                logits, _ = model(xb)
            nats += torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), yb.flatten(), reduction="sum")
        nats = nats.item()
        nbytes = byte_len[y.flatten()].sum().item()
        out[name] = {"loss": nats / y.numel(), "bpb": bits_per_byte(nats, nbytes), "tokens": y.numel()}
        total_nats, total_bytes, total_tokens = total_nats + nats, total_bytes + nbytes, total_tokens + y.numel()
    out["all"] = {"loss": total_nats / total_tokens, "bpb": bits_per_byte(total_nats, total_bytes), "tokens": total_tokens}
    model.train()
    return out
