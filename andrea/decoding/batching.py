"""Continuous batching: many generations decoded together, one forward per step.

A `BatchDecoder` holds one KV cache of `max_batch` slots, each a whole context long. A sequence
`join`s a free slot (its prompt runs alone, as `andrea.decoding.generate` runs it), and from then on every
`step` samples one token for every sequence in its slot and feeds the tokens that go on back as
one forward over all of them, each at its own position in its own slot. Sequences join and `leave`
between steps; a slot left is free for the next one at once. The windows slide as in
`andrea.decoding.generate`: a sequence whose window is full re-runs its last `block_size // 2` tokens alone.

Batch invariance. The tokens of a sequence do not depend on what else is in the batch:

- everything a row computes apart from its matrix products (the embedding sum, the norms, the
  activation, the residual sums) is computed row by row by torch's kernels, whichever rows sit
  beside it; attention runs once per sequence over its own slot's filled positions, the same call
  `andrea.decoding.generate` makes (the step is the model's own forward with `andrea.model.Rows`);
- a greedy sequence's matrix products run on its one row alone, exactly as the decode plan of
  `andrea.decoding.generate` runs them with its weights laid out for the same number of threads
  (the layout decides a product's rounding, not how many threads compute it), so its tokens are
  token for token those of `andrea generate --greedy`;
- the sampled sequences' rows are multiplied together, in one product of at least `MIN_ROWS` rows
  (padded with zero rows): BLAS picks one kernel for every product of that many rows or more,
  and a row's result does not depend on the others (tests/test_web_api.py checks it on the machine
  it runs on);
- the step's tokens are drawn for all rows at once (`andrea.decoding.generate.sample_rows`), by
  kernels that work row by row, each row drawing from its own generator.

A seeded request therefore gives the same text alone or in a crowd; it need not give `andrea
generate --seed`'s, whose products are of one row. The rows of a step are ordered greedy first,
then sampled, so each group is one slice.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from andrea.config import BOS
from andrea.decoding.generate import check_prompt_ids, check_sampling, sample_rows, window_keep
from andrea.decoding.plan import CPULayouts, attention_kernels
from andrea.errors import AndreaError
from andrea.model import KVCache, Rows

MIN_ROWS = 4  # the sampled rows of a step are multiplied as at least this many (zero rows pad)


@dataclass(eq=False)
class Sequence:
    """One generation in a slot: its tokens so far, where its window starts, how it samples."""

    ids: list[int]
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    owner: object = None  # whatever the caller attaches (the server's request)
    slot: int = -1
    start: int = 0  # the window: ids[start:] sit at positions 0 ..
    new_tokens: int = 0
    logits: torch.Tensor | None = field(default=None, repr=False)  # the next token's, (V,)
    generator: torch.Generator | None = field(default=None, repr=False)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def position(self) -> int:
        """The position of the last token fed: the next token is fed at position + 1."""
        return len(self.ids) - self.start - 1


class _SlotCache(KVCache):
    """One slot of a batch cache, as a cache of batch size 1 (a view: writes land in the slot)."""

    def __init__(self, cache: KVCache, slot: int):  # (KVCache.__init__ would allocate a cache of its own)
        self.k, self.v = cache.k[:, slot : slot + 1], cache.v[:, slot : slot + 1]
        self.positions, self.max_len, self.length = cache.positions, cache.max_len, 0


class _RowLinear:
    """`linear` for a step's rows: the first `exact` rows one at a time (as a single generation's
    decode plan multiplies them), the rest in one product of at least MIN_ROWS rows."""

    def __init__(self, layouts: CPULayouts):
        self.layouts, self.exact = layouts, 0

    def __call__(self, x: torch.Tensor, key, weight) -> torch.Tensor:
        e, n = self.exact, x.shape[0]
        parts = [self.layouts(x[i : i + 1], key, weight) for i in range(e)]
        if n > e:
            rest = x[e:]
            if n - e < MIN_ROWS:
                rest = F.pad(rest, (0, 0, 0, 0, 0, MIN_ROWS - (n - e)))
            parts.append(self.layouts(rest, key, weight)[: n - e])
        return parts[0] if len(parts) == 1 else torch.cat(parts)


class BatchDecoder:
    """Up to `max_batch` sequences decoded together on the CPU (see the module's text), its weights
    laid out for `layout_threads` threads (default: torch's count now; `andrea.decoding.plan.CPULayouts`)."""

    def __init__(self, model, max_batch: int, layout_threads: int | None = None):
        if model.wte.weight.device.type != "cpu":
            raise AndreaError("batched decoding runs on the CPU; load the model there.")
        if not 1 <= max_batch:
            raise AndreaError(f"the batch must hold at least one sequence, got {max_batch}.")
        self.model = model.eval()
        self.config = cfg = model.config
        self.max_batch = max_batch
        self.cache = KVCache(cfg, max_batch, cfg.block_size, dtype=model.wte.weight.dtype)
        self.layouts = CPULayouts(layout_threads)
        self.rows = _RowLinear(self.layouts)
        self.slots: list[Sequence | None] = [None] * max_batch

    @property
    def active(self) -> list[Sequence]:
        return [s for s in self.slots if s is not None]

    @property
    def free(self) -> int:
        return self.slots.count(None)

    # ------------------------------------------------------------ joining and leaving

    def join(self, prompt_ids, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
             seed: int | None = None, owner=None) -> Sequence:
        """Run the prompt in a free slot; the sequence samples its first token at the next step."""
        check_sampling(1, temperature, top_k, top_p, seed)
        ids = check_prompt_ids(prompt_ids, self.config.vocab_size)
        if None not in self.slots:
            raise AndreaError(f"all {self.max_batch} slots are taken; a sequence must leave first.")
        T = self.config.block_size
        seq = Sequence(ids, float(temperature), top_k, top_p, seed, owner)
        seq.start = 0 if len(ids) <= T else len(ids) - window_keep(T)
        seq.generator = torch.Generator()
        if seed is None:
            seq.generator.seed()
        else:
            seq.generator.manual_seed(seed)
        seq.slot = self.slots.index(None)
        self._prefill(seq)
        self.slots[seq.slot] = seq
        return seq

    def leave(self, seq: Sequence) -> None:
        """Free the sequence's slot (a sequence not in a slot is left alone)."""
        if 0 <= seq.slot < self.max_batch and self.slots[seq.slot] is seq:
            self.slots[seq.slot] = None
        seq.slot, seq.logits = -1, None

    @torch.inference_mode()
    def _prefill(self, seq: Sequence) -> None:
        """Run seq's window alone into its slot (what a single generation's prefill does)."""
        cache = _SlotCache(self.cache, seq.slot)
        x = torch.tensor([seq.ids[seq.start :]], dtype=torch.long)
        with attention_kernels(x.device):
            logits, _ = self.model(x, cache=cache, linear=self.layouts)
        seq.logits = logits[0, -1]

    # ------------------------------------------------------------ one step

    def pick(self) -> list[tuple[Sequence, int]]:
        """Each sequence's next token, sampled from its logits with its own generator, all rows at
        once (`andrea.decoding.generate.sample_rows`, whose rows do not depend on each other)."""
        seqs = self.active
        if not seqs:
            return []
        toks = sample_rows(torch.stack([s.logits for s in seqs]), [s.temperature for s in seqs],
                           [s.top_k for s in seqs], [s.top_p for s in seqs], [s.greedy for s in seqs],
                           [s.generator for s in seqs])
        return list(zip(seqs, toks))

    def feed(self, pairs) -> None:
        """Append each (sequence, token) and compute its next logits: sequences whose window is
        full slide and re-run alone, the others go through one forward together."""
        T, keep = self.config.block_size, window_keep(self.config.block_size)
        rows = []
        for seq, tok in pairs:
            if self.slots[seq.slot] is not seq:
                raise AndreaError("a sequence fed to the batch must be in one of its slots.")
            seq.ids.append(int(tok))
            seq.new_tokens += 1
            if len(seq.ids) - seq.start > T:
                seq.start = len(seq.ids) - keep
                self._prefill(seq)
            else:
                rows.append(seq)
        if rows:
            rows.sort(key=lambda s: not s.greedy)  # greedy rows first (a stable sort keeps the rest in order)
            logits = self._forward(rows)
            for i, seq in enumerate(rows):
                seq.logits = logits[i]

    @torch.inference_mode()
    def _forward(self, rows: list[Sequence]) -> torch.Tensor:
        """(len(rows), V) logits: each row's last token at its own position in its own slot, by
        the model's own forward (`Rows`)."""
        self.rows.exact = sum(1 for s in rows if s.greedy)
        ids = torch.tensor([[s.ids[-1]] for s in rows], dtype=torch.long)
        with attention_kernels(ids.device):
            logits, _ = self.model(ids, cache=self.cache, linear=self.rows,
                                   rows=Rows([s.slot for s in rows], [s.position for s in rows]))
        return logits[:, -1]


def generate_batch(model, prompts, max_new_tokens, max_batch: int, arrivals=None, settings=None,
                   layout_threads: int | None = None) -> list[list[int]]:
    """The new ids for each prompt, decoded together (stopping at BOS or after max_new_tokens, one
    number or one per prompt): prompt `i` joins at step arrivals[i] (default 0) or once a slot is
    free, sampling with settings[i] (BatchDecoder.join's keywords; default greedy), the weights laid
    out for `layout_threads` (BatchDecoder's). For tests and measurements; the server drives a
    BatchDecoder itself."""
    n = len(prompts)
    arrivals = list(arrivals) if arrivals is not None else [0] * n
    settings = list(settings) if settings is not None else [{"temperature": 0.0}] * n
    limits = [max_new_tokens] * n if isinstance(max_new_tokens, int) else list(max_new_tokens)
    waiting = sorted(range(len(prompts)), key=lambda i: arrivals[i])
    out: list[list[int]] = [[] for _ in prompts]
    dec, step = BatchDecoder(model, max_batch, layout_threads), 0
    while waiting or dec.active:
        while waiting and arrivals[waiting[0]] <= step and dec.free:
            i = waiting.pop(0)
            dec.join(prompts[i], owner=i, **settings[i])
        go = []
        for seq, tok in dec.pick():
            if tok == BOS:
                dec.leave(seq)
                continue
            out[seq.owner].append(tok)
            if len(out[seq.owner]) == limits[seq.owner]:
                dec.leave(seq)
            else:
                go.append((seq, tok))
        dec.feed(go)
        step += 1
    return out
