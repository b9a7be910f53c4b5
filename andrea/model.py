"""The ANDREA model: two lookup tables summed, pre-norm transformer blocks, an untied head.

    x_t = wte[id_t] + wpe[t]                      the embedding layer (plain indexing)
    x   = x + attn(ln_1(x)); x = x + mlp(ln_2(x))  per block
    logits = lm_head(ln_f(x))                     untied: lm_head is not wte

Parameter names and their order follow the `.bin` layout of the specification:
wte, wpe, then per block ln_1, attn.{wq,wk,wv,wo}, ln_2, mlp.{fc1,fc2}; then ln_f, lm_head.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from andrea.config import ModelConfig
from andrea.errors import AndreaError
from andrea.positions import RotaryEmbedding, sinusoidal_table


def make_norm(cfg: ModelConfig) -> nn.Module:
    if cfg.norm == "layernorm":
        return nn.LayerNorm(cfg.n_embd, eps=1e-5)
    return nn.RMSNorm(cfg.n_embd, eps=1e-5)


class KVCache:
    """Preallocated keys and values for every layer: (n_layer, B, n_head, max_len, head_dim).

    `length` is how many positions are filled; each forward call appends its tokens there, so a
    new token costs one position of compute.

    A cache belongs to one generation, during which the weights do not change, so it also keeps
    copies of the weights in the layout that decodes fastest, built on first use. Decoding
    multiplies one row vector by each matrix, which is most of a token's time, and a single
    matrix-vector product runs on one thread. On a CPU each matrix is therefore split by output
    columns into one (in, out/k) block per thread (zero-padded to split evenly) and multiplied as
    one batched matmul, whose blocks run in parallel. With one thread, a widening matrix is kept
    (in, out), which BLAS streams up to twice as fast as torch's (out, in) layout.
    (Measured on the 2-core CPUs we test on: see benchmarks/bench_decode.py.)
    """

    def __init__(self, cfg: ModelConfig, batch_size: int, max_len: int | None = None, device=None, dtype=torch.float32):
        max_len = max_len or cfg.block_size
        shape = (cfg.n_layer, batch_size, cfg.n_head, max_len, cfg.head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.max_len = max_len
        self.length = 0
        self.weights: dict = {}  # (name, layer) -> the weight in its decoding layout, built on first use

    def reset(self) -> None:
        self.length = 0

    def linear(self, x: torch.Tensor, key, weight) -> torch.Tensor:
        """x @ weightᵀ for an (out, in) weight; `weight` is the tensor, or a function that makes it
        (the stacked q/k/v matrix, made once per generation)."""
        if key not in self.weights:
            w = (weight() if callable(weight) else weight).detach()
            out = w.shape[0]
            parts = torch.get_num_threads() if w.device.type == "cpu" else 1
            if parts > 1:
                # (parts, in, out/parts), zero rows padding out to a multiple of parts: one batched
                # matmul whose blocks run on separate threads
                w = F.pad(w, (0, 0, 0, -out % parts))
                self.weights[key] = ("split", out, w.t().reshape(w.shape[1], parts, -1).permute(1, 0, 2).contiguous())
            elif out > w.shape[1]:
                self.weights[key] = ("in-out", out, w.t().contiguous())
            else:
                self.weights[key] = ("out-in", out, w)
        layout, out, w = self.weights[key]
        if layout == "split":
            rows = x.reshape(-1, x.shape[-1])
            y = torch.bmm(rows.expand(w.shape[0], *rows.shape), w)  # (parts, rows, out/parts)
            return y.permute(1, 0, 2).reshape(*x.shape[:-1], -1)[..., :out]
        return x @ w if layout == "in-out" else F.linear(x, w)

    def check_fits(self, ids: torch.Tensor) -> None:
        """Raise a ValueError naming the cache's size when ids do not fit in it."""
        B, T = ids.shape
        if B != self.k.shape[1]:
            raise AndreaError(f"the KV cache was made for batch size {self.k.shape[1]}, got a batch of {B}.")
        if self.length + T > self.max_len:
            raise AndreaError(f"the KV cache holds {self.max_len} positions: {self.length} are filled and {T} more do not fit.")


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d = cfg.n_embd
        self.n_head, self.head_dim = cfg.n_head, cfg.head_dim
        self.wq = nn.Linear(d, d, bias=False)
        self.wk = nn.Linear(d, d, bias=False)
        self.wv = nn.Linear(d, d, bias=False)
        self.wo = nn.Linear(d, d, bias=False)

    def qkv_weight(self) -> torch.Tensor:
        """wq, wk and wv stacked into one (3d, d) matrix, so q, k and v take one matmul (the three
        tables stay separate parameters, and gradients flow back to each)."""
        return torch.cat([self.wq.weight, self.wk.weight, self.wv.weight])

    def forward(self, x, rope=None, cache: KVCache | None = None, layer: int = 0):
        B, T, d = x.shape
        if cache is None:
            qkv = F.linear(x, self.qkv_weight())
        else:
            qkv = cache.linear(x, ("qkv", layer), self.qkv_weight)
        q, k, v = qkv.view(B, T, 3, self.n_head, self.head_dim).permute(2, 0, 3, 1, 4)
        start = cache.length if cache is not None else 0
        if rope is not None:
            q, k = rope(q, start), rope(k, start)
        if cache is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            end = start + T
            cache.k[layer, :, :, start:end] = k
            cache.v[layer, :, :, start:end] = v
            k, v = cache.k[layer, :, :, :end], cache.v[layer, :, :, :end]
            if T == 1:
                y = F.scaled_dot_product_attention(q, k, v)
            else:
                # query i sits at absolute position start + i and sees keys 0 .. start + i
                mask = torch.ones(T, end, dtype=torch.bool, device=x.device).tril(diagonal=start)
                y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        y = y.transpose(1, 2).reshape(B, T, d)
        return self.wo(y) if cache is None else cache.linear(y, ("wo", layer), self.wo.weight)


class ReLUSquared(torch.autograd.Function):
    """relu(x)², differentiated as 2·relu(x)·grad from the one tensor it keeps.

    Same numbers as `F.relu(x).square()`, whose autograd keeps both x and relu(x) and makes an
    extra pass over the (B, T, 4d) activations for relu's backward.
    """

    @staticmethod
    def forward(ctx, x):
        r = F.relu(x)
        ctx.save_for_backward(r)
        return r * r

    @staticmethod
    def backward(ctx, grad):
        (r,) = ctx.saved_tensors
        return grad.mul(r).mul_(2)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.fc1 = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=False)
        self.fc2 = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=False)
        self.act = cfg.act

    def forward(self, x, cache: KVCache | None = None, layer: int = 0):
        h = self.fc1(x) if cache is None else cache.linear(x, ("fc1", layer), self.fc1.weight)
        if self.act == "relu2":
            h = ReLUSquared.apply(h)
        elif self.act == "relu":
            h = F.relu(h)
        else:
            h = F.gelu(h)
        return self.fc2(h) if cache is None else cache.linear(h, ("fc2", layer), self.fc2.weight)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.ln_1 = make_norm(cfg)
        self.attn = Attention(cfg)
        self.ln_2 = make_norm(cfg)
        self.mlp = MLP(cfg)

    def forward(self, x, rope=None, cache=None, layer=0):
        x = x + self.attn(self.ln_1(x), rope, cache, layer)
        return x + self.mlp(self.ln_2(x), cache, layer)


class ANDREA(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        if cfg.pos == "learned":
            self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        elif cfg.pos == "sinusoidal":
            self.register_buffer("pos_table", sinusoidal_table(cfg.block_size, cfg.n_embd), persistent=False)
        self.rope = RotaryEmbedding(cfg.head_dim, cfg.block_size) if cfg.pos == "rope" else None
        self.h = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = make_norm(cfg)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        # Computing the head's matmul over a vocabulary padded with zero rows to a multiple of 64
        # runs faster on tensor cores; the logical vocabulary, the parameters and the files stay
        # unpadded (the trainer sets this on GPUs; 1 means no padding).
        self.vocab_multiple = 1
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Embedding tables N(0, 1/sqrt(d)); linears N(0, 0.02), residual outputs scaled by depth."""
        std_emb = 1.0 / math.sqrt(self.config.n_embd)
        for name, p in self.named_parameters():
            if name.startswith(("wte.", "wpe.")):
                nn.init.normal_(p, 0.0, std_emb)
            elif name.endswith(("attn.wo.weight", "mlp.fc2.weight")):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * self.config.n_layer))
            elif p.dim() == 2:
                nn.init.normal_(p, 0.0, 0.02)
            elif name.endswith(".weight"):
                nn.init.ones_(p)
            else:
                nn.init.zeros_(p)

    def check_ids(self, ids: torch.Tensor, start: int = 0) -> None:
        """Raise a ValueError naming the limit for ids a user could get wrong."""
        if ids.dim() != 2:
            raise AndreaError(f"ids must be a (batch, time) tensor, got shape {tuple(ids.shape)}.")
        if ids.shape[1] == 0:
            raise AndreaError("the sequence is empty; give at least one token.")
        if start + ids.shape[1] > self.config.block_size:
            raise AndreaError(
                f"the sequence has {start + ids.shape[1]} positions but the context is {self.config.block_size}."
            )
        if ids.device.type != "cpu":
            return  # a value check would stall the GPU every step; shards and prompts are checked on the CPU
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= self.config.vocab_size:
            bad = lo if lo < 0 else hi
            raise AndreaError(f"token id {bad} is out of range: ids must be in 0..{self.config.vocab_size - 1} (V = {self.config.vocab_size}).")

    def embed(self, ids: torch.Tensor, start: int = 0) -> torch.Tensor:
        """The matrix that enters block 1: wte[ids] + wpe[start : start + T]."""
        x = self.wte(ids)
        T = ids.shape[1]
        if self.config.pos == "learned":
            x = x + self.wpe.weight[start : start + T]
        elif self.config.pos == "sinusoidal":
            x = x + self.pos_table[start : start + T]
        return x

    def forward(self, ids: torch.Tensor, targets: torch.Tensor | None = None, cache: KVCache | None = None):
        """Logits (B, T, V) and, with targets, the mean cross-entropy over all positions."""
        start = cache.length if cache is not None else 0
        self.check_ids(ids, start)
        if cache is not None:
            cache.check_fits(ids)
        x = self.embed(ids, start)
        for i, block in enumerate(self.h):
            x = block(x, self.rope, cache, i)
        h = self.ln_f(x)
        logits = self.head(h) if cache is None else cache.linear(h, "lm_head", self.lm_head.weight)
        if cache is not None:
            cache.length += ids.shape[1]
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))
        return logits, loss

    def head(self, h: torch.Tensor) -> torch.Tensor:
        V, m = self.config.vocab_size, self.vocab_multiple
        if m <= 1 or V % m == 0:
            return self.lm_head(h)
        weight = F.pad(self.lm_head.weight, (0, 0, 0, m - V % m))
        return F.linear(h, weight)[..., :V]

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())
