"""Position schemes other than the learned table: fixed sinusoids and rotary (RoPE).

`learned` is a plain `nn.Embedding(T, d)` in the model; `none` adds nothing. These two are the
alternatives the literature offers, kept here so the model file stays about the model.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def sinusoidal_table(n_positions: int, dim: int) -> torch.Tensor:
    """Vaswani et al. (2017): PE[t, 2i] = sin(t / 10000^(2i/d)), PE[t, 2i+1] = cos(...), times sqrt(2/d).

    The factor gives every row norm 1, the size of a token row at initialisation (std 1/sqrt(d)),
    so neither part of x = wte[id] + PE[t] swamps the other. (Vaswani et al. scaled the token
    embeddings up by sqrt(d) instead; ANDREA's token table is initialised small, so the fixed table
    comes down to meet it.)
    """
    t = torch.arange(n_positions, dtype=torch.float64).unsqueeze(1)
    freq = torch.exp(-math.log(10000.0) * torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    table = torch.zeros(n_positions, dim, dtype=torch.float64)
    table[:, 0::2] = torch.sin(t * freq)
    table[:, 1::2] = torch.cos(t * freq[: dim // 2])
    return (table * math.sqrt(2.0 / dim)).float()


class RotaryEmbedding(nn.Module):
    """Rotates pairs (x[2i], x[2i+1]) of each query and key by the angle t / 10000^(2i/d_head).

    No parameters; dot products of rotated q and k depend only on the distance between them.
    """

    def __init__(self, head_dim: int, max_positions: int, base: float = 10000.0):
        super().__init__()
        inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
        angles = torch.outer(torch.arange(max_positions, dtype=torch.float64), inv_freq)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)

    def forward(self, x: torch.Tensor, start: int | torch.Tensor = 0) -> torch.Tensor:
        """x: (B, H, T, head_dim), positions start .. start + T - 1, or those in the tensor start:
        T positions, or (B, T), each row's own (looked up on the device, never read back: within
        the table)."""
        T = x.shape[-2]
        if isinstance(start, torch.Tensor):
            cos, sin = F.embedding(start, self.cos).to(x.dtype), F.embedding(start, self.sin).to(x.dtype)
            if start.dim() == 2:  # (B, T, hd/2): the same angles for every head of a row
                cos, sin = cos[:, None], sin[:, None]
        elif start + T > self.cos.shape[0]:
            # beyond the table: compute the angles on the fly (rope extrapolates by formula)
            angles = torch.outer(torch.arange(start, start + T, dtype=torch.float64, device=x.device), self.inv_freq)
            cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        else:
            cos, sin = self.cos[start : start + T].to(x.dtype), self.sin[start : start + T].to(x.dtype)
        x1, x2 = x[..., 0::2], x[..., 1::2]
        out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
        return out.flatten(-2)
