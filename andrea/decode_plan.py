"""The decode plan: how one generation runs on the device it finds.

The model computes (`ANDREA.forward` with a `KVCache`, and `ANDREA.step`, its fixed-shape
one-token step); the plan decides how: the layout each weight is multiplied in, whether every
step has the same shapes, which attention kernel runs, and whether the step is replayed as a
CUDA graph. `andrea.generate` makes one plan per generation (the weights do not change during
one), runs the prompt through `prefill` and every new token through `step`.

Modes:

- "dynamic": a step attends over the filled part of the cache only, so its key length grows by
  one a token. The least arithmetic, and on a CPU nothing is gained by fixed shapes: the CPU
  default.
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
output columns into one (in, out/k) block per thread (zero-padded to split evenly) and multiplied
as one batched matmul, whose blocks run in parallel. With one thread, a widening matrix is kept
(in, out), which BLAS streams up to twice as fast as torch's (out, in) layout. (Measured on the
2-core CPUs we test on: see benchmarks/bench_decode.py.) Elsewhere the weights are used as they
are, except that q, k and v are stacked into one matrix once per generation instead of every step.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
import torch.nn.functional as F

from andrea.errors import AndreaError
from andrea.model import KVCache

MODES = ("auto", "dynamic", "static", "graph")
ALIGN = 64  # fixed-shape caches are a multiple of this many positions


class CPULayouts:
    """`linear` for CPUs: each weight copied once into the layout that decodes fastest with
    `threads` threads (default: torch's thread count when the plan is made)."""

    def __init__(self, threads: int | None = None):
        self.parts = threads or torch.get_num_threads()
        self.weights: dict = {}  # key -> (layout, out features, the weight in that layout)

    def __call__(self, x: torch.Tensor, key, weight) -> torch.Tensor:
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
        layout, out, w = self.weights[key]
        if layout == "split":
            rows = x.reshape(-1, x.shape[-1])
            y = torch.bmm(rows.expand(w.shape[0], *rows.shape), w)  # (parts, rows, out/parts)
            return y.permute(1, 0, 2).reshape(*x.shape[:-1], -1)[..., :out]
        return x @ w if layout == "in-out" else F.linear(x, w)


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
        if mode == "auto":
            mode = "graph" if self.device.type == "cuda" and not is_sharded(model) else "dynamic"
        self.mode = mode
        T = model.config.block_size
        max_len = min(max_len or T, T)
        if mode != "dynamic":
            max_len = -(-max_len // ALIGN) * ALIGN
        self.cache = KVCache(model.config, 1, max_len, device=self.device, dtype=weight.dtype)
        self.linear = CPULayouts() if self.device.type == "cpu" else StackedQKV()
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
