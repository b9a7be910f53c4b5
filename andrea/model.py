"""The ANDREA model: two lookup tables summed, pre-norm transformer blocks, an untied head.

    x_t = wte[id_t] + wpe[t]                      the embedding layer (plain indexing)
    x   = x + attn(ln_1(x)); x = x + mlp(ln_2(x))  per block
    logits = lm_head(ln_f(x))                     untied: lm_head is not wte

Parameter names and their order follow the `.bin` layout of the specification:
wte, wpe, then per block ln_1, attn.{wq,wk,wv,wo}, ln_2, mlp.{fc1,fc2}; then ln_f, lm_head.

Looking inside: `ANDREA.trace` reads what each block takes in and gives out, `ANDREA.removed` runs
any pass with parts zeroed; every view, lesson and score that looks inside reads them.
"""

from __future__ import annotations

import functools
import math
import threading
from contextlib import contextmanager

import torch
import torch.nn as nn
import torch.nn.functional as F

from andrea.config import ModelConfig, count_params
from andrea.errors import AndreaError, longer_than_context
from andrea.loss import chunked_cross_entropy, loss_chunk_rows
from andrea.memory import check_memory, model_bytes
from andrea.positions import RotaryEmbedding, sinusoidal_table


def make_norm(cfg: ModelConfig) -> nn.Module:
    if cfg.norm == "layernorm":
        return nn.LayerNorm(cfg.n_embd, eps=1e-5)
    return nn.RMSNorm(cfg.n_embd, eps=1e-5)


class KVCache:
    """Preallocated keys and values for every layer: (n_layer, B, n_head, max_len, head_dim).

    `length` is how many positions are filled; each `ANDREA.forward` call with a cache appends its
    tokens there, so a new token costs one position of compute. `ANDREA.step` writes at positions
    given as a tensor instead and attends over all `max_len` positions with a mask, so every step
    has the same shapes (what a CUDA graph needs); its caller keeps `length`.

    The cache only stores: how the weights are multiplied while decoding is the decode plan's
    business (`andrea.decoding.plan`), passed to the model as `linear`.
    """

    def __init__(self, cfg: ModelConfig, batch_size: int, max_len: int | None = None, device=None, dtype=torch.float32):
        max_len = max_len or cfg.block_size
        shape = (cfg.n_layer, batch_size, cfg.n_head, max_len, cfg.head_dim)
        _check_cache_memory(shape, device, dtype)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.positions = torch.arange(max_len, device=device)  # a key's position, for the masks of fixed-shape steps
        self.max_len = max_len
        self.length = 0

    def reset(self) -> None:
        self.length = 0

    def check_fits(self, ids: torch.Tensor) -> None:
        """Raise an AndreaError naming the cache's size when ids do not fit in it."""
        B, T = ids.shape
        if B != self.k.shape[1]:
            raise AndreaError(f"the KV cache was made for batch size {self.k.shape[1]}, got a batch of {B}.")
        if self.length + T > self.max_len:
            raise AndreaError(f"the KV cache holds {self.max_len} positions: {self.length} are filled and {T} more do not fit.")


def _check_cache_memory(shape: tuple, device, dtype) -> None:
    """Refuse a KV cache that cannot fit, by arithmetic, before it is allocated."""
    device = torch.device(device) if device is not None else torch.get_default_device()
    if device.type == "meta":
        return
    need = 2 * math.prod(shape) * torch.empty(0, dtype=dtype).element_size()
    cuda = device.type == "cuda"
    check_memory(need, f"a KV cache of {shape[3]:,} positions over {shape[0]:,} layers", "generate from a model "
                 "with a shorter context", have=torch.cuda.mem_get_info(device)[0] if cuda else None,
                 where="the GPU" if cuda else "this machine")


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

    def forward(self, x, rope=None, cache: KVCache | None = None, layer: int = 0, linear=None, at=None, mask=None):
        """Causal attention over x, or with a cache over x and what the cache holds (`attend`):
        `at` says where x's tokens sit (None: from cache.length, or 0 without a cache)."""
        B, T, d = x.shape
        if linear is None:
            qkv = F.linear(x, self.qkv_weight())
        else:
            qkv = linear(x, ("qkv", layer), self.qkv_weight)
        q, k, v = qkv.view(B, T, 3, self.n_head, self.head_dim).permute(2, 0, 3, 1, 4)  # each (B, nh, T, hs)
        if at is None:
            at = cache.length if cache is not None else 0
        if rope is not None:
            positions = at.positions[:, None] if isinstance(at, Rows) else at
            q, k = rope(q, positions), rope(k, positions)
        y = attend(q, k, v, *((cache.k[layer], cache.v[layer]) if cache is not None else (None, None)), at, mask)
        y = y.transpose(1, 2).reshape(B, T, d)
        return self.wo(y) if linear is None else linear(y, ("wo", layer), self.wo.weight)


class Rows:
    """Where the rows of a batched decoding step sit: row i's one new token at position
    positions[i] of cache slot slots[i] (a batch cache's index along its batch dimension), each
    row attending over its own slot's positions 0 .. positions[i]."""

    def __init__(self, slots: list[int], positions: list[int]):
        self.slot_list, self.ends = list(slots), [p + 1 for p in positions]
        self.slots = torch.tensor(self.slot_list, dtype=torch.long)
        self.positions = torch.tensor(list(positions), dtype=torch.long)


def one_query_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """One query's attention over keys k and values v (a decoding step): SDPA on CUDA; on a CPU
    softmax(q·kᵀ/√hs)·v in plain products. SDPA's CPU kernel splits a single query's keys among
    torch's threads, so its rounding follows the thread count (torch 2.13, tests/test_web_api.py's
    case: it differed at 42 of 64 key lengths over 1, 2 and 3 threads); each head's plain products
    run on one thread, so they round alike on any count, which lets `andrea serve` decode on fewer
    threads than `andrea generate` and keep its tokens; benchmarks/bench_decode.py times it. The
    products run in float32 whatever the model's dtype, as SDPA accumulates, and only the result
    takes the model's dtype."""
    if q.device.type != "cpu":
        return F.scaled_dot_product_attention(q, k, v)
    weights = torch.softmax((q.float() @ k.float().transpose(-1, -2)) * q.shape[-1] ** -0.5, dim=-1)
    return (weights @ v.float()).to(v.dtype)


PLAIN_ATTENTION_MAX_T = 128  # the longest window whose training attention runs in plain products (below)


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention of a window (B, nh, T, hs): SDPA, except while a CPU trains in bfloat16
    at T ≤ PLAIN_ATTENTION_MAX_T, where softmax(q·kᵀ/√hs)·v runs in plain products (the scores'
    softmax in float32, as SDPA's kernel computes it). There SDPA's CPU backward is the slow
    part of the step: `benchmarks/bench_train.py --bf16` times the step in the other kernel
    beside the chosen one (BENCHMARKS "Training step against transformers' GPT-2", at the main
    job's 128). Longer windows keep SDPA, whose memory stays linear in T where the plain
    products' float32 scores grow as T²; so do float32, GPUs and every pass without gradients
    (evaluation, decoding)."""
    T = q.shape[2]
    plain = (q.device.type == "cpu" and q.dtype == torch.bfloat16 and T <= PLAIN_ATTENTION_MAX_T
             and torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad))
    return plain_causal_attention(q, k, v) if plain else F.scaled_dot_product_attention(q, k, v, is_causal=True)


def plain_causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(q·kᵀ/√hs, the future masked)·v in plain products, the scores and their softmax in at
    least float32, the products in q's and v's dtype."""
    T = q.shape[2]
    scores = (q @ k.transpose(-1, -2)).to(torch.promote_types(q.dtype, torch.float32)) * q.shape[-1] ** -0.5
    later = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
    return scores.masked_fill(later, float("-inf")).softmax(-1).to(v.dtype) @ v


def attend(q, k, v, keys=None, values=None, at: int | torch.Tensor | Rows = 0, mask=None) -> torch.Tensor:
    """Scaled dot-product attention of queries q over keys k and values v (B, nh, T, hs), the one
    place a forward pass writes a KV cache and calls the attention kernel.

    Without a cache (`keys` None): causal attention over the T positions. With one layer's cache
    views `keys`, `values` (B, nh, max_len, hs), k and v are written into them first, and `at`
    says where:
      an int         positions at .. at + T - 1; the queries see keys 0 .. their own position;
      a tensor       the T positions it holds (a fixed-shape step: attention covers the whole
                     cache through `mask` (T, max_len), so every step has the same shapes);
      `Rows`         one token a row, each at its own position of its own slot (batched decoding).
    """
    if keys is None:
        return causal_attention(q, k, v)
    if isinstance(at, Rows):
        keys[at.slots, :, at.positions] = k[:, :, 0]
        values[at.slots, :, at.positions] = v[:, :, 0]
        return torch.cat([one_query_attention(q[i : i + 1], keys[s : s + 1, :, :end], values[s : s + 1, :, :end])
                          for i, (s, end) in enumerate(zip(at.slot_list, at.ends))])
    if isinstance(at, torch.Tensor):
        keys.index_copy_(2, at, k)
        values.index_copy_(2, at, v)
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
    T = q.shape[2]
    end = at + T
    keys[:, :, at:end] = k
    values[:, :, at:end] = v
    k, v = keys[:, :, :end], values[:, :, :end]
    if T == 1:
        return one_query_attention(q, k, v)
    if at == 0:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    # query i sits at absolute position at + i and sees keys 0 .. at + i
    mask = torch.ones(T, end, dtype=torch.bool, device=q.device).tril(diagonal=at)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def attention_weights(attn: "Attention", h: torch.Tensor, rope=None) -> torch.Tensor:
    """The (B, nh, T, T) attention weights of one attention layer on its input h (after ln_1):
    softmax over keys j <= i of q_i·k_j / √d_head, 0 above the diagonal (the causal mask). The
    one place they are computed (the attention kernel never forms them); `ANDREA.trace` keeps
    them as "weights"."""
    B, T, _ = h.shape
    q, k, _ = F.linear(h, attn.qkv_weight()).view(B, T, 3, attn.n_head, attn.head_dim).permute(2, 0, 3, 1, 4)
    if rope is not None:
        q, k = rope(q, 0), rope(k, 0)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(attn.head_dim)
    causal = torch.ones(T, T, dtype=torch.bool, device=h.device).tril()
    return torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)


TRACE_PARTS = ("input", "normed", "weights", "heads", "attention", "middle", "hidden", "mlp", "output")


@contextmanager
def _inputs_of(module):
    """A list that receives the first input of each call of `module` inside the block (None:
    an empty list, nothing hooked)."""
    seen: list = []
    handle = module.register_forward_pre_hook(lambda _m, args: seen.append(args[0])) if module is not None else None
    try:
        yield seen
    finally:
        if handle is not None:
            handle.remove()


class Trace:
    """What one traced pass kept (`ANDREA.trace`): `embedded`, the (B, T, d) matrix that enters
    block 1, and `blocks`, one dict a block run, holding the parts asked for."""

    def __init__(self, embedded: torch.Tensor, blocks: list[dict]):
        self.embedded, self.blocks = embedded, blocks

    def __getitem__(self, part: str) -> list[torch.Tensor]:  # that part of every block run, in order
        return [b[part] for b in self.blocks]

    def stream(self) -> list[torch.Tensor]:
        """The residual stream: after the embedding and after each block run (needs "output")."""
        return [self.embedded] + self["output"]


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

    def forward(self, x, layer: int = 0, linear=None):
        h = self.fc1(x) if linear is None else linear(x, ("fc1", layer), self.fc1.weight)
        h = activate(h, self.act)
        return self.fc2(h) if linear is None else linear(h, ("fc2", layer), self.fc2.weight)


def activate(h: torch.Tensor, act: str) -> torch.Tensor:
    """The MLP's activation (cfg.act: relu2, relu or gelu) of its hidden layer h."""
    if act == "relu2":
        # without gradients (decoding) the plain ops: an autograd.Function's call costs more
        # than the op itself on one token
        return ReLUSquared.apply(h) if torch.is_grad_enabled() else F.relu(h).square_()
    return F.relu(h) if act == "relu" else F.gelu(h)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.ln_1 = make_norm(cfg)
        self.attn = Attention(cfg)
        self.ln_2 = make_norm(cfg)
        self.mlp = MLP(cfg)

    def forward(self, x, rope=None, cache=None, layer=0, linear=None, at=None, mask=None):
        x = x + self.attn(self.ln_1(x), rope, cache, layer, linear, at, mask)
        return x + self.mlp(self.ln_2(x), layer, linear)


class ANDREA(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        if torch.get_default_device().type != "meta":  # counted by arithmetic before anything is allocated
            check_memory(model_bytes(cfg), f"a model of {count_params(cfg):,} parameters ({cfg.n_layer:,} layers, "
                         f"width {cfg.n_embd:,}, context {cfg.block_size:,})", "choose a smaller model config")
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
        # Rows of logits per block when the training loss is computed in blocks (chunked_cross_entropy):
        # None computes it in blocks of andrea.loss.LOSS_CHUNK rows on CUDA and CPU_LOSS_CHUNK elsewhere; 0 whole.
        self.loss_chunk: int | None = None
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
            raise AndreaError(longer_than_context(start + ids.shape[1], self.config.block_size, "sequence"))
        if ids.device.type != "cpu" or torch.compiler.is_compiling():
            # a value check would stall the GPU every step, and break a compiled graph in two;
            # shards are checked before training and prompts on the CPU
            return
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= self.config.vocab_size:
            bad = lo if lo < 0 else hi
            raise AndreaError(f"token id {bad} is out of range: ids must be in 0..{self.config.vocab_size - 1} (V = {self.config.vocab_size}).")

    def embed(self, ids: torch.Tensor, start: int | torch.Tensor = 0) -> torch.Tensor:
        """The matrix that enters block 1: wte[ids] + wpe[start : start + T], or wte[ids] +
        wpe[start] when start is a tensor of positions: T of them, or one (B, T) per row."""
        x = self.wte(ids)
        if self.config.pos in ("learned", "sinusoidal"):
            table = self.wpe.weight if self.config.pos == "learned" else self.pos_table
            if isinstance(start, torch.Tensor):
                x = x + F.embedding(start, table)
            else:
                x = x + table[start : start + ids.shape[1]]
        return x

    def forward(self, ids: torch.Tensor, targets: torch.Tensor | None = None, cache: KVCache | None = None,
                linear=None, rows: Rows | None = None):
        """Logits (B, T, V) and, with targets, the mean cross-entropy over all positions.

        With targets and the loss computed in chunks (`loss_chunk`; the default) the
        logits are never made whole, and None is returned in their place. With a cache, ids
        continue the cached sequence at position cache.length. `linear(x, key, weight)` replaces
        the plain `x @ weightᵀ` of every matrix (a decode plan's weight layouts, andrea.decoding.plan):
        `key` names the matrix (("qkv", layer), ("wo", layer), ("fc1", layer), ("fc2", layer) or
        "lm_head") and `weight` is the tensor, or a function that makes it (the stacked q/k/v).
        With `rows` (batched decoding) ids is (B, 1), each row's token at its own position of its
        own slot of the cache (`Rows`; the caller checks them and keeps each slot's length).
        """
        if rows is None:
            start = cache.length if cache is not None else 0
            self.check_ids(ids, start)
            if cache is not None:
                cache.check_fits(ids)
        x = self.embed(ids, start if rows is None else rows.positions[:, None])
        for i, block in enumerate(self.h):
            x = block(x, self.rope, cache, i, linear, rows)
        h = self.ln_f(x)
        if cache is not None and rows is None:
            cache.length += ids.shape[1]
        if targets is not None:
            chunk = self.loss_chunk if self.loss_chunk is not None else loss_chunk_rows(h.device)
            if chunk > 0:
                return None, chunked_cross_entropy(h, self.lm_head.weight, targets, chunk, self.vocab_multiple)
        logits = self.head(h) if linear is None else linear(h, "lm_head", self.lm_head.weight)
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))
        return logits, loss

    def step(self, ids: torch.Tensor, cache: KVCache, pos: torch.Tensor, linear=None) -> torch.Tensor:
        """Logits (B, T, V) for ids at positions pos .. pos + T - 1 of the cache, with every shape
        fixed and nothing read back to the host: pos is a 0-d long tensor on the model's device,
        keys and values are written there, and attention covers all cache.max_len positions with
        a mask hiding those after each query. The same call at any position runs the same
        kernels on the same buffers, so a CUDA graph can capture it once and replay it. The
        caller checks that the positions fit the context and the cache, and keeps cache.length.
        """
        where = pos + torch.arange(ids.shape[1], device=ids.device)
        mask = cache.positions <= where[:, None]  # (T, max_len): query i sees keys 0 .. pos + i
        x = self.embed(ids, where)
        for i, block in enumerate(self.h):
            x = block(x, self.rope, cache, i, linear, where, mask)
        h = self.ln_f(x)
        return self.head(h) if linear is None else linear(h, "lm_head", self.lm_head.weight)

    @torch.no_grad()
    def trace(self, ids: torch.Tensor, keep=("output",), blocks: int | None = None, at=None) -> Trace:
        """One pass over ids (B, T) keeping, for each block, the parts named in `keep`:

            input      x, what enters the block (the residual stream; block 1's is the embedding)
            normed     ln_1(x), what attention reads
            weights    the attention weights (B, nh, T, T), `attention_weights`
            heads      each head's weighted values, what W_o joins (B, nh, T, d_head)
            attention  attn(ln_1(x)), what attention adds to the stream (after W_o)
            middle     x + attention, what enters ln_2
            hidden     the MLP's activations (B, T, 4d), after fc1 and its activation
            mlp        mlp(ln_2(middle)), what the MLP adds
            output     middle + mlp, what leaves the block

        Only the first `blocks` blocks run (default all), and only what is kept is computed
        beyond the pass itself ("weights" takes one product more). `at` (an index or slice of
        positions) keeps those positions only (of the queries, for weights). The pass calls each
        block's own modules (ln_1, attn, ln_2, mlp) in `Block.forward`'s order, so `output` of the
        last block is what `forward` sends to ln_f, bit for bit, and hooks on those modules
        (`removed`) act here as in `forward`; a Block whose forward is replaced, or a hook on a
        Block itself, is not seen (the block lesson compares the logits with `forward`'s).
        """
        if unknown := set(keep) - set(TRACE_PARTS):
            raise AndreaError(f"a trace keeps {', '.join(TRACE_PARTS)}; not {', '.join(sorted(unknown))}.")
        self.check_ids(ids)
        sel = (lambda t: t) if at is None else (lambda t: t[..., at, :])
        x = embedded = self.embed(ids)
        runs = []
        for block in self.h[:blocks]:
            n1 = block.ln_1(x)
            part = {"weights": attention_weights(block.attn, n1, self.rope)} if "weights" in keep else {}
            with _inputs_of(block.attn.wo if "heads" in keep else None) as into_wo:
                a = block.attn(n1, self.rope)
            mid = x + a
            with _inputs_of(block.mlp.fc2 if "hidden" in keep else None) as hidden:
                m = block.mlp(block.ln_2(mid))
            out = mid + m
            if into_wo:
                B, T, _ = n1.shape
                part["heads"] = into_wo[0].view(B, T, block.attn.n_head, block.attn.head_dim).transpose(1, 2)
            if hidden:
                part["hidden"] = hidden[0]
            named = {"input": x, "normed": n1, "attention": a, "middle": mid, "mlp": m, "output": out}
            part.update((k, t) for k, t in named.items() if k in keep)
            runs.append({k: sel(t) for k, t in part.items()})
            x = out
        return Trace(sel(embedded), runs)

    @contextmanager
    def removed(self, heads=(), attention=(), mlp=()):
        """Inside the block, the model runs with parts removed (their outputs zeroed): `heads`
        (block, head) pairs, 0-based, whose weighted values are zeroed before W_o; whole
        `attention` layers and `mlp`s by block index. Every pass through the modules (forward,
        trace, evaluation) in the thread that entered the block sees it, not a decode plan's direct
        step, which multiplies the weights itself; a pass in another thread (the lab answering a
        lens or a chat while a lesson removes heads) sees the whole model. The hooks go when the
        block ends, however it ends."""
        L, nh = self.config.n_layer, self.config.n_head
        bad = [f"block {i}" for i in (*attention, *mlp) if not 0 <= i < L] + [
            f"head {(i, h)}" for i, h in heads if not (0 <= i < L and 0 <= h < nh)]
        if bad:
            raise AndreaError(f"no {', '.join(bad)} in a model of {L} blocks of {nh} heads (counted from 0).")
        hd, handles, owner = self.config.head_dim, [], threading.get_ident()

        def here() -> bool:
            return threading.get_ident() == owner

        def zero_heads(which):
            def hook(_module, args):
                if not here():
                    return None
                x = args[0].clone()
                for h in which:
                    x[..., h * hd : (h + 1) * hd] = 0
                return (x,)
            return hook

        by_block: dict[int, list[int]] = {}
        for layer, head in heads:
            by_block.setdefault(int(layer), []).append(int(head))
        try:
            for i, block in enumerate(self.h):
                if i in by_block:
                    handles.append(block.attn.wo.register_forward_pre_hook(zero_heads(by_block[i])))
                if i in attention:
                    handles.append(block.attn.register_forward_hook(lambda _m, _a, out: torch.zeros_like(out) if here() else None))
                if i in mlp:
                    handles.append(block.mlp.register_forward_hook(lambda _m, _a, out: torch.zeros_like(out) if here() else None))
            yield self
        finally:
            for handle in handles:
                handle.remove()

    def head(self, h: torch.Tensor) -> torch.Tensor:
        V, m = self.config.vocab_size, self.vocab_multiple
        if m <= 1 or V % m == 0:
            return self.lm_head(h)
        weight = F.pad(self.lm_head.weight, (0, 0, 0, m - V % m))
        return F.linear(h, weight)[..., :V]

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


def tune_for_training(model, device: torch.device) -> None:
    """What the training step sets on the model for its device. On CUDA: TF32 matmuls and the
    head's matmul padded to 64 rows (tensor cores' tiles). On a CPU: padded to 16 rows, so that
    every row of the logits starts on a 64-byte line (6,401 floats a row leave all but the first
    off it, and the head's three matmuls run well below the machine's rate; `bench_train.py`)."""
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        model.vocab_multiple = 64
    elif device.type == "cpu":
        model.vocab_multiple = 16


@functools.lru_cache(maxsize=4)
def meta_model(cfg: ModelConfig) -> ANDREA:
    """The model of cfg on the meta device: names and shapes, no memory (cached: read-only)."""
    with torch.device("meta"):
        return ANDREA(cfg)


def param_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every parameter's name and shape, in the model's (and the .bin's) order."""
    return {name: tuple(p.shape) for name, p in meta_model(cfg).named_parameters()}
