"""The decode plan: how one generation runs on the device it finds.

The model computes (`ANDREA.forward` with a `KVCache`, and `ANDREA.step`, its fixed-shape
one-token step); the plan decides how: the layout each weight is multiplied in, whether every
step has the same shapes, which attention kernel runs, and whether the step is replayed as a
CUDA graph. `andrea.decoding.generate` makes one plan per generation (the weights do not change during
one), runs the prompt through `prefill` and every new token through `step`.

Modes:

- "dynamic": a step attends over the filled part of the cache only, so its key length grows by
  one a token: the model's own forward pass with the cache, module by module.
- "direct": "dynamic"'s arithmetic for one token, run by `DirectStep` straight on the plan's
  weights and the cache's per-layer views, without the module tree: no module calls and a third
  fewer torch calls a token; each operation is the model's, in the model's order. At the main
  job's shape a token is small enough that those calls are a large part of its time on a CPU:
  the CPU default (for every position scheme, norm and activation; not for a sharded model).
- "static": every one-token step runs `ANDREA.step`: the token and its position sit in small
  device buffers, keys and values are written at that position, and attention covers the whole
  preallocated cache with a length mask. Every step has the same shapes and reads nothing back
  to the host.
- "graph": "static", captured once as a CUDA graph (after a warm-up on a side stream) and
  replayed for every token, so a token costs one graph launch instead of a few hundred kernel
  launches. Where a capture fails (or there is no CUDA device), the plan says why in `fallback`
  and runs the same step eagerly. The CUDA default, unless the model's parameters are sharded.

Attention kernel on CUDA: SDPA may use flash attention (causal prefill), the memory-efficient
kernel (masked steps) or the math kernel, never cuDNN attention, which builds a new execution
plan for every new key length. Fixed-shape caches are a multiple of 64 positions long.

Weight layouts. Decoding multiplies one row vector by each matrix, which is most of a token's
time. On a CPU a single matrix-vector product runs on one thread, so each matrix is split by
output columns into one (in, out/k) block per thread the layout is made for (zero-padded to split
evenly) and multiplied as one batched matmul, whose blocks run in parallel. The layout, not how
many threads then compute it, decides a product's rounding (measured bit for bit on the CPUs we
test on; tests/test_web_api.py checks it where it runs): `andrea serve` computes a layout made
for two threads on one, and keeps `andrea generate`'s greedy tokens. With one thread, a widening
matrix is kept (in, out), which BLAS streams up to twice as fast as torch's (out, in) layout.
(Measured on the 2-core CPUs we test on: see benchmarks/bench_decode.py.) Elsewhere the weights
are used as they are, except that q, k and v are stacked into one matrix once per generation
instead of every step.
"""

from __future__ import annotations

import functools
import weakref
from contextlib import nullcontext

import torch
import torch.nn as nn
import torch.nn.functional as F

from andrea.errors import AndreaError
from andrea.model import KVCache, activate, attend

MODES = ("auto", "dynamic", "direct", "static", "graph")
ALIGN = 64  # fixed-shape caches are a multiple of this many positions


class CPULayouts:
    """`linear` for CPUs: each weight copied once into the layout that decodes fastest with
    `threads` threads (default: torch's thread count when the plan is made), whatever number of
    threads then computes with it."""

    def __init__(self, threads: int | None = None):
        self.parts = threads or torch.get_num_threads()
        self.weights: dict = {}  # key -> (layout, out features, the weight in that layout)

    def entry(self, key, weight) -> tuple[str, int, torch.Tensor]:
        """(layout, out features, the weight in that layout) for the matrix `key`; `weight` is
        the tensor, or a function that makes it, used the first time."""
        if key not in self.weights:
            w = (weight() if callable(weight) else weight).detach()
            out = w.shape[0]
            if self.parts > 1:
                # (parts, in, out/parts), zero rows padding out to a multiple of parts: one batched
                # matmul whose blocks run on separate threads
                w = F.pad(w, (0, 0, 0, -out % self.parts))
                blocks = w.t().reshape(w.shape[1], self.parts, -1).permute(1, 0, 2).contiguous()
                self.weights[key] = ("split", out, blocks)
            elif out > w.shape[1]:
                self.weights[key] = ("in-out", out, w.t().contiguous())
            else:
                self.weights[key] = ("out-in", out, w)
        return self.weights[key]

    def __call__(self, x: torch.Tensor, key, weight) -> torch.Tensor:
        layout, out, w = self.entry(key, weight)
        if layout == "split":
            rows = x.reshape(-1, x.shape[-1])
            y = torch.bmm(rows.expand(w.shape[0], *rows.shape), w)  # (parts, rows, out/parts)
            return y.permute(1, 0, 2).reshape(*x.shape[:-1], -1)[..., :out]
        return x @ w if layout == "in-out" else F.linear(x, w)


def row_times(x: torch.Tensor, entry) -> torch.Tensor:
    """One row x (1, in) times a `CPULayouts.entry`: (1, out), as F.linear(x, weight) gives it."""
    layout, out, w = entry
    if layout == "split":  # a single row: the blocks' outputs side by side are the output's columns
        y = torch.bmm(x.expand(w.shape[0], 1, x.shape[1]), w).view(1, -1)
        return y if y.shape[1] == out else y[:, :out]
    return x @ w if layout == "in-out" else F.linear(x, w)


_KEPT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> (what its layouts were made from, layouts)


def kept_layouts(model) -> CPULayouts:
    """The model's `CPULayouts`, kept from one plan to the next while its parameters and torch's
    thread count stay as they were: a chat makes a plan for every reply, which would otherwise
    copy every matrix again. A parameter changed in place (an optimizer step, `load_state_dict`,
    `copy_` under no_grad) has a new version, one replaced a new address; an inference tensor,
    which keeps no version, is laid out afresh by every plan. A write through `.data`, which torch
    does not count, is not seen: the next plan would multiply the old weights."""
    try:
        made_from = (torch.get_num_threads(), tuple((p.data_ptr(), p._version) for p in model.parameters()))
    except RuntimeError:  # inference tensors have no version counter
        return CPULayouts()
    kept = _KEPT.get(model)
    if kept is None or kept[0] != made_from:
        kept = _KEPT[model] = (made_from, CPULayouts(made_from[0]))
    return kept[1]


def norm_function(norm: nn.Module):
    """The function a LayerNorm or RMSNorm module computes, with its parameters bound."""
    if isinstance(norm, nn.LayerNorm):
        return functools.partial(F.layer_norm, normalized_shape=norm.normalized_shape, weight=norm.weight,
                                 bias=norm.bias, eps=norm.eps)
    return functools.partial(F.rms_norm, normalized_shape=norm.normalized_shape, weight=norm.weight, eps=norm.eps)


class DirectStep:
    """The next token's logits at batch 1, as `ANDREA.forward` with a cache computes them, run
    without the module tree: `x = embed(id, n)`, then per block `x += attn(norm_1(x))` over keys
    and values 0 .. n, `x += mlp(norm_2(x))`, and `head(norm_f(x))`. Every matrix is one of the
    plan's `CPULayouts`, each block's norms, matrices and cache views are gathered once, and the
    embedding, rotary positions, cache write, attention and activation are the model's own
    functions (`ANDREA.embed`, `RotaryEmbedding`, `andrea.model.attend`, `activate`)."""

    def __init__(self, model, cache: KVCache, layouts: CPULayouts):
        cfg = model.config
        self.model, self.rope, self.act = model, model.rope, cfg.act
        self.d, self.heads, self.head_dim = cfg.n_embd, cfg.n_head, cfg.head_dim
        self.blocks = [(norm_function(b.ln_1), layouts.entry(("qkv", i), b.attn.qkv_weight), cache.k[i],
                        cache.v[i], layouts.entry(("wo", i), b.attn.wo.weight), norm_function(b.ln_2),
                        layouts.entry(("fc1", i), b.mlp.fc1.weight), layouts.entry(("fc2", i), b.mlp.fc2.weight))
                       for i, b in enumerate(model.h)]
        self.norm_f = norm_function(model.ln_f)
        self.head = layouts.entry("lm_head", model.lm_head.weight)

    def __call__(self, token: int, n: int) -> torch.Tensor:
        """The (V,) logits after `token` at position n, its keys and values written at n (the
        caller checks both)."""
        d, rope = self.d, self.rope
        x = self.model.embed(torch.tensor([[token]]), n).view(1, d)
        for norm_1, qkv, keys, values, wo, norm_2, fc1, fc2 in self.blocks:
            # each (1, heads, 1, head_dim): four dimensions, or SDPA takes its slow path on a CPU
            q, k, v = row_times(norm_1(x), qkv).view(3, 1, self.heads, 1, self.head_dim)
            if rope is not None:
                q, k = rope(q, n), rope(k, n)
            y = attend(q, k, v, keys, values, n)  # the model's cache write and attention call
            x = x + row_times(y.view(1, d), wo)  # the heads side by side, as the model's transpose + reshape
            x = x + row_times(activate(row_times(norm_2(x), fc1), self.act), fc2)
        return row_times(self.norm_f(x), self.head)[0]


class StackedQKV:
    """`linear` for accelerators: the weights as they are, the stacked q/k/v matrix made once."""

    def __init__(self):
        self.weights: dict = {}

    def __call__(self, x: torch.Tensor, key, weight) -> torch.Tensor:
        if callable(weight):
            if key not in self.weights:
                self.weights[key] = weight().detach()
            weight = self.weights[key]
        return F.linear(x, weight)


def attention_kernels(device: torch.device):
    """SDPA's kernels for decoding on device: on CUDA flash, memory-efficient or math (not cuDNN)."""
    if device.type != "cuda":
        return nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


def is_sharded(model) -> bool:
    """Whether the model's parameters are sharded (FSDP): a graph or a direct `step` would see shards."""
    return any(type(p).__name__ == "DTensor" for p in model.parameters())


def capture_graph(run, device: torch.device, warmup: int = 2):
    """(graph, output) for `run()`, a function of static buffers: warmed up `warmup` times on a
    side stream (kernels chosen, workspaces allocated), then captured as a CUDA graph.
    `graph.replay()` reruns it on whatever the buffers hold and writes `output` again."""
    if device.type != "cuda":
        raise RuntimeError("CUDA graphs need a CUDA device")
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(warmup):
            run()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        output = run()
    return graph, output


class DecodePlan:
    """One generation's decoding: a KV cache of `max_len` positions (at most the context) and
    how each step runs on the model's device (see the module's text for `mode`)."""

    def __init__(self, model, max_len: int | None = None, mode: str = "auto"):
        if mode not in MODES:
            raise AndreaError(f"decode mode must be one of {', '.join(MODES)}, got {mode!r}.")
        weight = model.wte.weight
        self.model, self.device = model, weight.device
        cpu, sharded = self.device.type == "cpu", is_sharded(model)
        if mode == "auto":
            whole = {"cpu": "direct", "cuda": "graph"}.get(self.device.type, "dynamic")
            mode = "dynamic" if sharded else whole
        if mode == "direct" and (not cpu or sharded):
            raise AndreaError(f"decode mode direct runs on a CPU with the whole model; this one is on {self.device.type}"
                              f"{' and sharded' if sharded else ''}: use auto or dynamic.")
        self.mode = mode
        T = model.config.block_size
        max_len = min(max_len or T, T)
        if mode in ("static", "graph"):
            max_len = -(-max_len // ALIGN) * ALIGN
        self.cache = KVCache(model.config, 1, max_len, device=self.device, dtype=weight.dtype)
        self.linear = kept_layouts(model) if cpu else StackedQKV()
        self.direct = DirectStep(model, self.cache, self.linear) if mode == "direct" else None
        self.ids = torch.zeros((1, 1), dtype=torch.long, device=self.device)  # the static step's input token
        self.pos = torch.zeros((), dtype=torch.long, device=self.device)  # and its position
        self.graph = None
        self.output = None  # the graph's logits buffer
        self.fallback: str | None = None  # why a "graph" plan runs its steps eagerly

    def _run_step(self) -> torch.Tensor:
        with attention_kernels(self.device):
            return self.model.step(self.ids, self.cache, self.pos, self.linear)

    @torch.inference_mode()
    def prefill(self, ids: list[int]) -> torch.Tensor:
        """Start the cache over with ids at positions 0 ..; the (V,) logits after the last one."""
        self.cache.reset()
        x = torch.tensor([ids], dtype=torch.long, device=self.device)
        with attention_kernels(self.device):
            logits, _ = self.model(x, cache=self.cache, linear=self.linear)
        return logits[0, -1]

    @torch.inference_mode()
    def step(self, token: int) -> torch.Tensor:
        """Feed one token at the next position; the (V,) logits after it. In "graph" mode the
        logits are the graph's output buffer, which the next step overwrites."""
        if self.mode == "dynamic":
            x = torch.tensor([[token]], dtype=torch.long, device=self.device)
            with attention_kernels(self.device):
                logits, _ = self.model(x, cache=self.cache, linear=self.linear)
            return logits[0, -1]
        n = self.cache.length
        if n + 1 > min(self.cache.max_len, self.model.config.block_size):
            self.cache.check_fits(self.ids)  # names the cache's size
            self.model.check_ids(self.ids, n)  # names the context
        if not 0 <= token < self.model.config.vocab_size:
            self.model.check_ids(torch.tensor([[token]]))  # names the vocabulary
        if self.direct is not None:
            logits = self.direct(token, n)
            self.cache.length = n + 1
            return logits
        self.ids.fill_(token)
        self.pos.fill_(n)
        if self.mode == "graph" and self.graph is None and self.fallback is None:
            try:
                self.graph, self.output = capture_graph(self._run_step, self.device)
            except Exception as e:  # an operation that cannot be captured: the same step, eagerly
                self.fallback = f"{type(e).__name__}: {e}".strip()
                self.graph = None
        if self.graph is not None:
            self.graph.replay()
            logits = self.output
        else:
            logits = self._run_step()
        self.cache.length = n + 1
        return logits[0, -1]
