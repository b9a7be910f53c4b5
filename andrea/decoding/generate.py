"""Generation: a preallocated KV cache, sampling, a sliding context window, streaming, chat.

Each new token costs one position of compute: the prompt is run once through the model with a
`KVCache`, then every sampled token is fed alone and its keys and values are appended. How the
steps run on the device (weight layouts, fixed shapes, CUDA graphs) is the decode plan's choice
(`andrea.decoding.plan`).

Sliding window. Positions are a learned table of `block_size` rows and cannot extrapolate, so a
sequence never sits at positions past `block_size - 1`. The model sees a window `seq[w:]` of the
whole sequence (prompt plus generated tokens), placed at positions 0, 1, ... When the window
would grow past `block_size` tokens, it restarts from the last `block_size // 2` tokens
(`window_keep`): the cache is reset and those tokens are run again at positions 0 ..; then
decoding goes on one token at a time. A prompt longer than the context starts from its last
`block_size // 2` tokens by the same rule. Keeping half the context costs one re-run of half a
window every `block_size // 2` tokens, so the cost per token stays about one position. The path
without a cache uses the same windows and recomputes the whole current window for every token,
so both paths see the same context and give the same tokens.

Sampling: logits / temperature, then top-k (keep the k largest), then top-p (keep the smallest
set of most likely tokens whose probability reaches p), then one draw from a `torch.Generator`
seeded with `seed`. Greedy (or temperature 0) takes the argmax. Generation stops at BOS (256),
which is not returned, or after `max_new_tokens`.
"""

from __future__ import annotations

import codecs
import math
from numbers import Integral, Real
from typing import Iterator

import torch

from andrea.checkpoint import load_model
from andrea.config import BOS
from andrea.decoding import CHAT_TEMPERATURE, CHAT_TOP_K
from andrea.decoding.plan import MODES, DecodePlan
from andrea.errors import AndreaError
from andrea.validate import check_seed


def window_keep(block_size: int) -> int:
    """How many of the latest tokens a full window keeps when it slides."""
    return max(1, block_size // 2)


def check_prompt_ids(prompt_ids, vocab_size: int) -> list[int]:
    """The prompt's token ids as ints, once they are known to be at least one and all below V."""
    ids = [int(t) for t in prompt_ids]
    if not ids:
        raise AndreaError("the prompt is empty; give at least one token.")
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise AndreaError(f"token id {bad[0]} is out of range: ids must be in 0..{vocab_size - 1} (V = {vocab_size}).")
    return ids


def check_sampling(max_new_tokens: int, temperature: float, top_k: int | None, top_p: float | None,
                   seed: int | None = None) -> None:
    """Raise an AndreaError naming the first sampling value out of range."""

    if seed is not None:
        check_seed(seed)
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, Integral) or max_new_tokens < 1:
        raise AndreaError(f"max-new-tokens must be a positive integer, got {max_new_tokens!r}.")
    if not isinstance(temperature, Real) or not math.isfinite(temperature) or temperature < 0:
        raise AndreaError(f"temperature must be a finite number >= 0 (0 means greedy), got {temperature!r}.")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, Integral) or top_k < 1):
        raise AndreaError(f"top-k must be an integer >= 1, got {top_k!r}.")
    if top_p is not None and (not isinstance(top_p, Real) or not 0 < top_p <= 1):
        raise AndreaError(f"top-p must be in (0, 1], got {top_p!r}.")


@torch.inference_mode()
def sample_next(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
                top_p: float | None = None, greedy: bool = False, generator: torch.Generator | None = None) -> int:
    """One token id from a (V,) vector of logits: `sample_rows` on one row."""
    return sample_rows(logits[None], [temperature], [top_k], [top_p], [greedy], [generator])[0]


@torch.inference_mode()
def sample_rows(logits: torch.Tensor, temperatures, top_ks, top_ps, greedy, generators) -> list[int]:
    """One token id for each row of (N, V) logits, row i sampled with temperatures[i], top_ks[i],
    top_ps[i], greedy[i] and generators[i]: the argmax where greedy[i] or the temperature is 0,
    else one draw from its `distributions`, the rows drawing one after another (so rows that share
    a generator, or use torch's default one, draw as N calls of `sample_next` would). A row's token
    does not depend on the rows beside it, only on its own generator."""
    n = logits.shape[0]
    out: list[int] = [0] * n
    argmax = [i for i in range(n) if greedy[i] or temperatures[i] == 0]
    if argmax:
        for i, t in zip(argmax, _rows(logits, argmax).argmax(dim=1).tolist()):
            out[i] = t
    drawn = [i for i in range(n) if not (greedy[i] or temperatures[i] == 0)]
    if not drawn:
        return out
    groups = _distributions(_rows(logits, drawn), [temperatures[i] for i in drawn], [top_ks[i] for i in drawn],
                            [top_ps[i] for i in drawn])
    # torch.multinomial's own draw of one sample, for many rows at once: the argmax of p / q, q ~
    # Exp(1) of the row's size from the row's generator, drawn in row order (tests/test_generate.py
    # pins it to torch.multinomial). A group's row r is drawn[r], a row of `logits`.
    size = {r: probs.shape[1] for rows, probs, _ in groups for r in rows}
    q = {r: torch.empty(size[r], dtype=torch.float64, device=logits.device).exponential_(1, generator=generators[i])
         for r, i in enumerate(drawn)}
    for rows, probs, ids in groups:
        picks = (probs / torch.stack([q[r] for r in rows])).argmax(dim=1, keepdim=True)
        for r, tok in zip(rows, (picks if ids is None else ids.gather(1, picks)).squeeze(1).tolist()):
            out[drawn[r]] = tok
    return out


def distributions(logits: torch.Tensor, temperatures, top_ks, top_ps) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """What each row of (N, V) logits is drawn from: (probabilities, their token ids), the ids None
    where the probabilities are the whole vocabulary's in order.

    The rule: scaled logits s = (l - max l) / temperature in float64 (the largest subtracted first,
    so any temperature the checks allow, down to the smallest float above 0, gives finite values of
    at most 0, never a NaN); top-k keeps the tokens whose s is at least the k-th largest s (ties
    with the k-th included), in id order; the softmax of the kept s; then top-p keeps the most
    likely token whatever p is, so no p in (0, 1] leaves nothing to draw from. A row that holds a
    NaN or +inf, or only -inf, has nothing to draw from: an AndreaError says so.

    How it is computed, which gives those numbers bit for bit: s is a non-decreasing function of l,
    so its k-th largest is the k-th largest l, scaled, and the tokens kept are the k largest l,
    unless the (k+1)-th ties the k-th or scaling merges it into it (a huge or tiny temperature):
    then the row's s is computed over the whole vocabulary. So most rows scale only the k tokens
    they keep. Rows are computed together by kernels that work row by row, so a row's numbers do
    not depend on the rows beside it (tests/test_generate.py checks both)."""
    out: list = [None] * logits.shape[0]
    for rows, probs, ids in _distributions(logits, temperatures, top_ks, top_ps):
        for j, r in enumerate(rows):
            out[r] = (probs[j], None if ids is None else ids[j])
    return out


NOTHING_TO_DRAW = "the model's logits hold a NaN or +inf, or only -inf: no token can be drawn from them."


@torch.inference_mode()
def _distributions(logits, temperatures, top_ks, top_ps) -> list[tuple[list[int], torch.Tensor, torch.Tensor | None]]:
    """`distributions` as groups of rows of one size: (row numbers, their probabilities, their ids).
    A row the shortcut takes sits in its k's one group; a row computed whole, in a group of its own."""
    n, V = logits.shape
    t = torch.tensor([float(v) for v in temperatures], dtype=torch.float64, device=logits.device)[:, None]
    groups, whole, by_k = [], [], {}
    for i, k in enumerate(top_ks):
        if k is not None and k < V:
            by_k.setdefault(int(k), []).append(i)
        else:
            whole.append(i)
    for k, rows in by_k.items():
        x, tr = _rows(logits, rows), _rows(t, rows)
        values, ids = torch.topk(x, k + 1, dim=1)
        values = values.double()
        largest, kth, below = values[:, 0:1], values[:, k - 1 : k], values[:, k : k + 1]
        # the (k+1)-th largest, scaled, stays below the k-th (no tie, no merge; a NaN or an infinity
        # compares false): the k largest are the tokens kept
        fast = ((below - largest) / tr < (kth - largest) / tr).squeeze(1).tolist()
        if all(fast):
            ids = ids[:, :k].sort(dim=1).values  # in id order, as the rule keeps them
            s = (x.gather(1, ids).double() - largest) / tr
            groups.append((rows, torch.softmax(s, dim=-1), ids))
            continue
        s = _scaled(x, tr)  # a tie or a merge in some row: each row by the rule itself, over all V
        for j, i in enumerate(rows):
            kept = (s[j] >= torch.topk(s[j], k).values[-1]).nonzero().squeeze(1)
            groups.append(([i], torch.softmax(s[j, kept], dim=-1)[None], kept[None]))
    if whole:
        groups.append((whole, torch.softmax(_scaled(_rows(logits, whole), _rows(t, whole)), dim=-1), None))
    for rows, probs, _ in groups:
        for j, i in enumerate(rows):
            p = top_ps[i]
            if p is not None and p < 1:
                sorted_probs, order = probs[j].sort(descending=True)
                # drop a token when the tokens ranked above it already hold p; the first always stays
                drop = sorted_probs.cumsum(0) - sorted_probs >= p
                drop[0] = False
                sorted_probs[drop] = 0
                probs[j] = torch.zeros_like(probs[j]).scatter_(0, order, sorted_probs)
    return groups


def _scaled(logits: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """The rule's s over the whole vocabulary, (l - the row's max) / t in float64; an AndreaError
    where a row has nothing to draw from (a NaN or +inf in it, or only -inf, make NaNs)."""
    s = logits.double()
    s = (s - s.max(dim=1, keepdim=True).values) / t
    if bool(s.isnan().any()):
        raise AndreaError(NOTHING_TO_DRAW)
    return s


def _rows(x: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """x[rows], without a copy where rows are all of x's in order."""
    return x if rows == list(range(x.shape[0])) else x[rows]


@torch.inference_mode()
def _last_logits(model, ids: list[int]) -> torch.Tensor:
    x = torch.tensor([ids], dtype=torch.long, device=model.wte.weight.device)
    logits, _ = model(x)
    return logits[0, -1]


def _id_stream(model, seq: list[int], max_new_tokens: int, pick, use_cache: bool, stop_at_bos: bool,
               decode: str) -> Iterator[int]:
    T = model.config.block_size
    keep = window_keep(T)
    w = 0 if len(seq) <= T else len(seq) - keep
    plan = None
    if use_cache:
        # the window never holds more than its start plus the tokens fed back, nor more than T
        plan = DecodePlan(model, max_len=len(seq) - w + max_new_tokens, mode=decode)
        logits = plan.prefill(seq[w:])
    else:
        logits = _last_logits(model, seq[w:])
    for i in range(max_new_tokens):
        tok = pick(logits)
        if stop_at_bos and tok == BOS:
            return
        yield tok
        if i + 1 == max_new_tokens:
            return
        seq.append(tok)
        if len(seq) - w > T:  # the window is full: slide it and re-run what it keeps
            w = len(seq) - keep
            logits = plan.prefill(seq[w:]) if plan is not None else _last_logits(model, seq[w:])
        elif plan is not None:
            logits = plan.step(tok)
        else:
            logits = _last_logits(model, seq[w:])


def stream_ids(model, prompt_ids, max_new_tokens: int = 256, temperature: float = 1.0, top_k: int | None = None,
               top_p: float | None = None, seed: int | None = None, greedy: bool = False, use_cache: bool = True,
               stop_at_bos: bool = True, decode: str = "auto", on_step=None) -> Iterator[int]:
    """Yield new token ids one at a time as they are sampled (the prompt is not repeated).

    Arguments are checked here, before the first token; `stop_at_bos=False` lets a BOS through
    as an ordinary token (for measurements that need a run of fixed length). `decode` is the
    decode plan's mode (andrea.decoding.plan: auto, dynamic, direct, static or graph); without a cache every
    token recomputes its window. `on_step(logits, token)`, when given, sees each token's (V,)
    logits as it is picked (the lab shows them).
    """
    check_sampling(max_new_tokens, temperature, top_k, top_p, seed)
    if decode not in MODES:
        raise AndreaError(f"decode mode must be one of {', '.join(MODES)}, got {decode!r}.")
    seq = check_prompt_ids(prompt_ids, model.config.vocab_size)
    generator = torch.Generator(device=model.wte.weight.device)
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)

    def pick(logits):
        tok = sample_next(logits, temperature, top_k, top_p, greedy, generator)
        if on_step is not None:
            on_step(logits, tok)
        return tok

    return _id_stream(model, seq, max_new_tokens, pick, use_cache, stop_at_bos, decode)


def generate_ids(model, prompt_ids, max_new_tokens: int = 256, temperature: float = 1.0, top_k: int | None = None,
                 top_p: float | None = None, seed: int | None = None, greedy: bool = False, use_cache: bool = True,
                 stop_at_bos: bool = True, decode: str = "auto") -> list[int]:
    """The new token ids after prompt_ids (see `stream_ids`)."""
    return list(stream_ids(model, prompt_ids, max_new_tokens, temperature, top_k, top_p, seed, greedy,
                           use_cache, stop_at_bos, decode))


def stream_text_pieces(tokenizer, ids: Iterator[int]) -> Iterator[str]:
    """Text of a stream of token ids, piece by piece, never splitting a multi-byte character.

    Bytes that are not valid UTF-8 come out as U+FFFD, as `bytes.decode(errors='replace')` does.
    """
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    for tok in ids:
        piece = decoder.decode(tokenizer.token_bytes(tok))
        if piece:
            yield piece
    tail = decoder.decode(b"", final=True)
    if tail:
        yield tail


class TextGenerator:
    """A model and its tokenizer, ready to turn prompts into text."""

    def __init__(self, model, tokenizer):
        if tokenizer.vocab_size != model.config.vocab_size:
            raise AndreaError(f"the tokenizer has V = {tokenizer.vocab_size} but the model has V = {model.config.vocab_size}.")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.config = model.config

    def encode_prompt(self, prompt: str) -> list[int]:
        if not isinstance(prompt, str) or not prompt:
            raise AndreaError("the prompt is empty; give some text to continue.")
        return self.tokenizer.encode(prompt, bos=True)

    def stream(self, prompt: str, max_new_tokens: int = 256, temperature: float = 1.0, top_k: int | None = None,
               top_p: float | None = None, seed: int | None = None, greedy: bool = False) -> Iterator[str]:
        """Yield the continuation of prompt as text pieces, as they are produced."""
        ids = stream_ids(self.model, self.encode_prompt(prompt), max_new_tokens, temperature, top_k, top_p, seed, greedy)
        return stream_text_pieces(self.tokenizer, ids)

    def generate(self, prompt: str, max_new_tokens: int = 256, temperature: float = 1.0, top_k: int | None = None,
                 top_p: float | None = None, seed: int | None = None, greedy: bool = False) -> str:
        """The continuation of prompt (without the prompt)."""
        return "".join(self.stream(prompt, max_new_tokens, temperature, top_k, top_p, seed, greedy))

    def chat(self, max_new_tokens: int = 256, **sampling) -> "Chat":
        return Chat(self, max_new_tokens, **sampling)


class Chat:
    """A conversation in ANDREA's turn format: `> ` starts the person's line, `< ` the model's.

    The model sees BOS, then the turns so far, then `> line\\n<`, and its reply ends at the first
    newline (or BOS, or max_new_tokens). The prompt stops before the space after `<`: in the
    training text that space begins the reply's first word (" im good" is the token " im", then
    " good"), so a prompt ending in a space token asks for a continuation the model never saw
    (measured: BENCHMARKS.md's chat section). The model writes the space with its first word, and
    the reply is its text without that one space. The oldest turns are dropped whenever the
    conversation plus room for a reply (max_new_tokens, at most half the context) would not fit
    the context.
    """

    def __init__(self, generator: TextGenerator, max_new_tokens: int = 256, temperature: float = CHAT_TEMPERATURE,
                 top_k: int | None = CHAT_TOP_K, top_p: float | None = None, seed: int | None = None,
                 greedy: bool = False):
        check_sampling(max_new_tokens, temperature, top_k, top_p)
        self.generator = generator
        self.max_new_tokens = max_new_tokens
        self.sampling = dict(temperature=temperature, top_k=top_k, top_p=top_p, greedy=greedy)
        self.seed = seed
        self.turns: list[tuple[str, str]] = []
        self.n_replies = 0
        self.ended: str | None = None  # how the last reply ended: "turn" (a newline), "bos" or "limit" (max_new_tokens)

    def prompt_ids(self, line: str) -> list[int]:
        """The ids the model sees before replying to line, after dropping turns that do not fit."""
        ids, dropped = chat_prompt_ids(self.generator.tokenizer, self.generator.config.block_size, self.max_new_tokens,
                                       self.turns, line)
        del self.turns[:dropped]
        return ids

    def reply(self, line: str) -> Iterator[str]:
        """Stream the model's answer to line; the turn joins the history once the answer ends."""
        line = line.replace("\n", " ")
        seed = None if self.seed is None else (self.seed + self.n_replies) % 2**64  # a seed stays in 0..2^64-1
        self.n_replies += 1
        ids = stream_ids(self.generator.model, self.prompt_ids(line), self.max_new_tokens, seed=seed, **self.sampling)
        counted = [0]

        def count(ids):
            for i in ids:
                counted[0] += 1
                yield i

        answer, self.ended, first = [], None, True
        for piece in stream_text_pieces(self.generator.tokenizer, count(ids)):
            if first and piece:  # the format's space after `<`, written by the model with its first word
                piece, first = piece.removeprefix(" "), False
            piece, newline, _ = piece.partition("\n")
            if piece:
                answer.append(piece)
                yield piece
            if newline:
                self.ended = "turn"
                break
        if self.ended is None:
            self.ended = "limit" if counted[0] >= self.max_new_tokens else "bos"
        self.turns.append((line, "".join(answer)))


def chat_prompt_ids(tokenizer, block_size: int, max_new_tokens: int, turns, line: str, preamble: str = "",
                    max_token_bytes: int | None = None) -> tuple[list[int], int]:
    """(ids, n): what the model sees before replying to line after the turns (person, model) so
    far, in ANDREA's turn format after BOS and `preamble`, once the n oldest turns are dropped
    because the whole plus room for a reply (max_new_tokens, at most half the context) would not
    fit the context. With max_token_bytes (the longest token's bytes), turns too long in bytes
    to fit in any tokenization are dropped before anything is encoded."""
    room = block_size - min(max_new_tokens, window_keep(block_size))
    texts = [f"> {person}\n< {model}\n" for person, model in turns]
    tail = preamble + f"> {line}\n<"  # the reply's space comes with its first word, as in training
    n = 0
    if max_token_bytes:
        size = len(tail.encode("utf-8")) + sum(len(t.encode("utf-8")) for t in texts)
        while n < len(texts) and 1 + -(-size // max_token_bytes) > room:
            size -= len(texts[n].encode("utf-8"))
            n += 1
    while True:
        ids = tokenizer.encode(preamble + "".join(texts[n:]) + f"> {line}\n<", bos=True)
        if len(ids) <= room or n == len(texts):
            return ids, n
        n += 1


def generate_steps(model, tokenizer, prompt: str, max_new_tokens: int = 40, temperature: float = 1.0,
                   top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
                   alternatives: int = 5):
    """Checks the settings and returns an iterator over the generated tokens, each with the
    model's probability for it (softmax of its logits, before sampling settings) and the most
    likely alternatives. Arguments are checked before the first token is produced."""
    if isinstance(alternatives, bool) or not isinstance(alternatives, int) or alternatives < 1:
        raise AndreaError(f"the number of alternatives must be an integer of at least 1, got {alternatives!r}.")
    gen = TextGenerator(model, tokenizer)
    seen: list[torch.Tensor] = []
    ids = stream_ids(model, gen.encode_prompt(prompt), max_new_tokens, temperature, top_k, top_p, seed,
                     on_step=lambda logits, tok: seen.append(logits))

    def steps():
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        for tok in ids:
            probs = torch.softmax(seen.pop().double(), dim=-1)
            top = torch.topk(probs, min(alternatives, probs.numel()))
            yield {"id": tok, "piece": tokenizer.id_to_piece(tok), "text": decoder.decode(tokenizer.token_bytes(tok)),
                   "prob": float(probs[tok]),
                   "alternatives": [{"id": int(i), "piece": tokenizer.id_to_piece(int(i)), "prob": float(p)}
                                    for p, i in zip(top.values, top.indices)]}

    return steps()


def load(path, device="cpu") -> TextGenerator:
    """A TextGenerator for the checkpoint at path (a file or a run folder)."""

    model, tokenizer, _ = load_model(path, device)
    if tokenizer is None:
        raise AndreaError(f"the checkpoint {path} holds no tokenizer, so it cannot turn text into tokens.")
    return TextGenerator(model, tokenizer)
