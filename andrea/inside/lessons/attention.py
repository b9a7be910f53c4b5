"""The attention lesson, claim by claim, on the learner's own model: `andrea lesson attention`.

The embedding lesson ends where this one starts: a query's dot product with a key scores each past
token, block 1 runs scaled dot-product attention with a causal mask and a softmax, and the blocks
hold most of the parameters. Each step checks one claim on the model and gives a verdict
(andrea.inside.lessons.report). The steps, in order:

    scores     block 1's q_i = ln_1(x_i)·W_q and k_j = ln_1(x_j)·W_k, per head, on a prompt, and their
               dot products q_i·k_j: holds when some head's scaled scores spread ≥ 1 over the keys a
               query sees (its softmax picks tokens), a caveat from 0.3, does not hold below (nearly
               even attention, as a fresh model's)
    scale      dividing by √d_head keeps the scores' spread near 1: random q, k of unit components at
               d_head 8, 32, 128 and the model's own, before and after; then the model's block 1
               before and after (a caveat when its scaled spread is outside 1/3 .. 3: its learned
               W_q and W_k set a scale of their own)
    mask       after the mask and the softmax the upper triangle is 0 and every row sums to 1, and
               the model's block 1 output at earlier positions does not change when the last token does
    rebuild    block 1's attention output rebuilt in float64 as W_o · concat_h softmax(q·k/√d_head)·v
               and matched to the model's own (hooked) to within float error
    heads      which past tokens each head of each block attends to, on BOS + r + r for random token
               sequences r of n tokens (the same draw for every model of a V): previous token (weight
               on i−1), first token (on 0, BOS), same token (on the earlier copy, i−n) and induction
               (on the token after the earlier copy, i−n+1); a kind is present when its best head's
               mean weight passes 0.3 and "not yet" otherwise; holds when the previous-token kind
               (the first to form) is present, a caveat when any other kind is not yet
    ablation   removing one head (its slice of the attention output zeroed before W_o), one at a
               time, then all at once: the held-out loss it costs, in bits per byte, on the first 4
               validation windows of each source (holds when some head costs ≥ 0.01; a caveat when
               only all of them together do: the heads share the work)
    later      later tokens are predicted better: the held-out loss at positions 0–15 minus the loss
               at the last 32 positions of each window (a quarter of the context each where it is
               shorter than 128), in nats per token, over up to 64 windows a source (holds when it
               exceeds twice its standard error over windows)

The last two need the run's held-out text (its train.json names the data); a bare model file gets
the other five and those two say what they lack. Every figure of a sentence is also a number in
the step's `numbers`, with the prompt's score matrices before and after the mask and the softmax
and each head's pattern on one random sequence, for the lab to draw.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from andrea.checkpoint import load_model
from andrea.config import BOS
from andrea.errors import AndreaError
from andrea.evaluate import bits_per_byte, position_nats, token_byte_lengths
from andrea.inside.heads import COMMON, KINDS, PRESENT, head_scores, patterns, random_repeats, sequence_length
from andrea.inside.lessons.report import CANNOT, CAVEAT, FAILS, HOLDS, Step, report_json, report_text, walk
from andrea.shards import TokenData
from andrea.usage import run_data

PROMPT = "the cat sat on the mat and the cat slept"
SPREAD_PICKS, SPREAD_FLAT = 1.0, 0.3  # a head's scaled-score spread: it picks tokens; nearly even below
SCALE_DIMS = (8, 32, 128)
SCALE_SAMPLES = 4096
MICRO = 4  # held-out windows whose logits are made at once
WINDOWS_PER_SOURCE = 4  # held-out windows per source for the ablation (a forward pass per head)
# and for the later-tokens score (one forward pass): at 16 a source the main job's models scored
# +0.13 to +0.22 nats with a standard error of 0.10, so the verdict turned on the draw; at 64, 0.05
LATER_WINDOWS_PER_SOURCE = 64
MIN_COST = 0.01  # bits per byte: a head whose removal costs this does measurable work
EARLY, LATE = 16, 32  # positions 0 .. EARLY-1 against the last LATE of each window


@dataclass
class Inputs:
    """What the attention lesson is computed from: the model and tokenizer and, where known, the
    run's training data (for its held-out windows)."""

    model: torch.nn.Module
    tokenizer: object
    name: str
    data: TokenData | None = None
    data_note: str = "no run folder was given"
    prompt: str = PROMPT
    block: dict | None = None  # block_one on the prompt, computed once for the steps that read it
    windows: tuple | None = None  # the block lesson's held-out (x, y, bytes), made once


def load_inputs(checkpoint, log=None) -> Inputs:
    """The model of a checkpoint file or run folder, with the data its run folder names."""
    model, tokenizer, _ = load_model(checkpoint)
    if tokenizer is None:
        raise AndreaError(f"{checkpoint} holds no tokenizer: the lesson encodes its prompt with the run's own.")
    return inputs_for(model.eval(), tokenizer, str(checkpoint), checkpoint)


def inputs_for(model, tokenizer, name: str, checkpoint) -> Inputs:
    data, note = run_data(checkpoint, tokenizer)
    return Inputs(model, tokenizer, name, data, note)


# ---------------------------------------------------------------- block 1, computed from its weights


@torch.no_grad()
def block_one(model, ids: list[int]) -> dict:
    """Block 1 on ids (one sequence), in float64 from its weights: q, k, v per head (nh, T, hs),
    the raw scores q·k (nh, T, T), and the model's own attention output (T, d), hooked."""
    cfg = model.config
    trace = model.trace(torch.tensor([ids], device=model.wte.weight.device), keep=("normed", "attention"), blocks=1)
    h = trace["normed"][0][0].double()
    T, nh, hs = len(ids), cfg.n_head, cfg.head_dim
    q, k, v = (h @ model.h[0].attn.qkv_weight().double().T).view(T, 3, nh, hs).permute(1, 2, 0, 3)
    if model.rope is not None:
        q, k = model.rope(q[None], 0)[0], model.rope(k[None], 0)[0]
    return {"q": q, "k": k, "v": v, "raw": q @ k.transpose(-1, -2), "own": trace["attention"][0][0].double()}


def causal(T: int) -> torch.Tensor:
    return torch.ones(T, T, dtype=torch.bool).tril()


def masked_softmax(scaled: torch.Tensor) -> torch.Tensor:
    return torch.softmax(scaled.masked_fill(~causal(scaled.shape[-1]), float("-inf")), dim=-1)


def key_spread(scores: torch.Tensor) -> np.ndarray:
    """Per head, the spread (standard deviation) of each query's scores over the keys it sees
    (0 .. i), averaged over queries that see at least two."""
    nh, T, _ = scores.shape
    out = np.zeros(nh)
    for i in range(1, T):
        out += scores[:, i, : i + 1].std(dim=-1, unbiased=False).numpy()
    return out / max(1, T - 1)


def prompt_ids(inp: Inputs) -> list[int]:
    """The prompt's ids, BOS first. Where the model's context is shorter than the prompt, its first
    T tokens, and `inp.prompt` becomes the text they stand for, so every step runs on what fits and
    its sentence quotes what it ran on."""
    ids = inp.tokenizer.encode(inp.prompt, bos=True)
    T = inp.model.config.block_size
    if len(ids) > T:
        ids = ids[:T]
        inp.prompt = inp.tokenizer.decode(ids[1:])
    return ids


def _prompt_block(inp: Inputs) -> tuple[list[int], dict]:
    """The prompt's ids and block 1 on them (`block_one`), computed on the first call only."""
    if inp.block is None:
        ids = prompt_ids(inp)
        inp.block = {"ids": ids, **block_one(inp.model, ids)}
    return inp.block["ids"], inp.block


def _pieces(inp: Inputs, ids) -> list[str]:
    return [inp.tokenizer.id_to_piece(i).replace(" ", "␣") for i in ids]


# ---------------------------------------------------------------- the steps


@torch.no_grad()
def step_scores(inp: Inputs) -> Step:
    claim = ("A query's dot product with a key scores each past token: block 1 computes q_i = ln_1(x_i)·W_q and "
             "k_j = ln_1(x_j)·W_k for every head, and the score q_i·k_j says how much token j matters at i.")
    ids, b = _prompt_block(inp)
    hs = inp.model.config.head_dim
    scaled = b["raw"] / math.sqrt(hs)
    spread = key_spread(scaled)
    pattern = masked_softmax(scaled)
    last = len(ids) - 1
    top = [int(pattern[h, last].argmax()) for h in range(len(spread))]
    pieces = _pieces(inp, ids)
    best = int(spread.argmax())
    numbers = {"prompt": inp.prompt, "tokens": pieces, "head_dim": hs, "spread": spread.tolist(),
               "last_query_top_key": top, "raw": b["raw"].tolist(), "scaled": scaled.tolist(),
               "masked": scaled.masked_fill(~causal(len(ids)), float("-inf")).tolist(), "pattern": pattern.tolist()}
    how = (f"on “{inp.prompt}” ({len(ids)} tokens), block 1's {len(spread)} heads of d_head {hs}: the scaled scores "
           f"q·k/√{hs} spread {spread.min():.2f} to {spread.max():.2f} over the keys a query sees; at the last token "
           f"{pieces[last]}, head {best + 1} (the widest) attends most to {pieces[top[best]]} (position {top[best]}, "
           f"weight {float(pattern[best, last, top[best]]):.2f})")
    if spread.max() >= SPREAD_PICKS:
        return Step("scores", claim, how, HOLDS, "", numbers)
    if spread.max() >= SPREAD_FLAT:
        return Step("scores", claim, how, CAVEAT, f"no head's scores spread {SPREAD_PICKS:g} or more: the softmax "
                    "weighs past tokens only mildly apart", numbers)
    return Step("scores", claim, how, FAILS, f"every head's scores spread under {SPREAD_FLAT:g}, so each head attends "
                "nearly evenly to every past token (as a model before training does)", numbers)


def random_dot_spread(dims=SCALE_DIMS, samples: int = SCALE_SAMPLES, seed: int = 0) -> dict[int, tuple[float, float]]:
    """d_head: (spread of q·k, spread of q·k/√d_head) for q, k of independent N(0, 1) components."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for d in dims:
        q, k = torch.randn(samples, d, generator=g, dtype=torch.float64), torch.randn(samples, d, generator=g, dtype=torch.float64)
        dots = (q * k).sum(-1)
        out[d] = (float(dots.std()), float((dots / math.sqrt(d)).std()))
    return out


@torch.no_grad()
def step_scale(inp: Inputs) -> Step:
    claim = ("Dividing by √d_head keeps the scores' spread near 1: a dot product of d_head unit-variance terms "
             "spreads √d_head, which would push the softmax to pick one token as heads grow.")
    hs = inp.model.config.head_dim
    rand = random_dot_spread(sorted({*SCALE_DIMS, hs}))
    _, b = _prompt_block(inp)
    raw = float(key_spread(b["raw"]).mean())
    scaled = raw / math.sqrt(hs)
    q_std, k_std = float(b["q"].std()), float(b["k"].std())
    numbers = {"random": {str(d): {"before": r[0], "after": r[1], "sqrt_d": math.sqrt(d)} for d, r in rand.items()},
               "head_dim": hs, "model_before": raw, "model_after": scaled, "q_std": q_std, "k_std": k_std}
    how = ("random q, k of unit components: q·k spreads " + ", ".join(f"{r[0]:.2f} at d_head {d}" for d, r in rand.items())
           + " before and " + ", ".join(f"{r[1]:.2f}" for r in rand.values()) + f" after dividing; this model's block 1 "
           f"(d_head {hs}, q and k components spread {q_std:.2f} and {k_std:.2f}): {raw:.2f} before, {scaled:.2f} after")
    if not all(0.9 < r[1] < 1.1 and abs(r[0] / math.sqrt(d) - 1) < 0.1 for d, r in rand.items()):
        return Step("scale", claim, how, FAILS, "random unit vectors' scaled dot products do not spread 1", numbers)
    if not 1 / 3 <= scaled <= 3:
        return Step("scale", claim, how, CAVEAT, f"this model's scaled scores spread {scaled:.2f}: the division removes the "
                    "growth with d_head, and the learned W_q and W_k set a scale of their own", numbers)
    return Step("scale", claim, how, HOLDS, "", numbers)


@torch.no_grad()
def _after_block_one(model, ids: list[int]) -> torch.Tensor:
    return model.trace(torch.tensor([ids], device=model.wte.weight.device), blocks=1)["output"][0][0].double()


@torch.no_grad()
def step_mask(inp: Inputs) -> Step:
    claim = ("The causal mask hides later tokens: after the softmax the weights above the diagonal are 0 and every row "
             "sums to 1, so a position's output does not change when a later token does.")
    ids, b = _prompt_block(inp)
    pattern = masked_softmax(b["raw"] / math.sqrt(inp.model.config.head_dim))
    T = len(ids)
    above = float(pattern.masked_select(~causal(T)).abs().max()) if T > 1 else 0.0
    rows = float((pattern.sum(-1) - 1).abs().max())
    other = next(i for i in (BOS + 1, 257, 1, 0) if 0 <= i < inp.model.config.vocab_size and i != ids[-1] and i != BOS)
    changed = ids[:-1] + [other]
    out = _after_block_one(inp.model, ids)
    moved = float((out[:-1] - _after_block_one(inp.model, changed)[:-1]).abs().max())
    scale = float(out.abs().max())
    numbers = {"tokens": T, "above_diagonal_max": above, "row_sum_error": rows, "earlier_positions_moved": moved,
               "output_scale": scale, "changed_token": _pieces(inp, [ids[-1], other])}
    how = (f"on the prompt's {T} tokens: the largest weight above the diagonal {above:.3g}, rows sum to 1 within "
           f"{rows:.2g}; with its last token {numbers['changed_token'][0]} replaced by {numbers['changed_token'][1]}, block 1's "
           f"output at the {T - 1} earlier positions moved by at most {moved:.3g} (the output's scale: {scale:.3g})")
    if above > 0 or rows > 1e-9:
        return Step("mask", claim, how, FAILS, "the softmax's weights are not a causal distribution", numbers)
    if moved > 1e-5 * max(1.0, scale):
        return Step("mask", claim, how, FAILS, "the model's block 1 sees later tokens: its earlier outputs moved", numbers)
    return Step("mask", claim, how, HOLDS, "", numbers)


@torch.no_grad()
def step_rebuild(inp: Inputs) -> Step:
    claim = ("Block 1's attention is softmax(q·k/√d_head)·v per head, the heads joined and multiplied by W_o: "
             "rebuilt that way it matches the model's own output.")
    ids, b = _prompt_block(inp)
    attn = inp.model.h[0].attn
    pattern = masked_softmax(b["raw"] / math.sqrt(attn.head_dim))
    joined = (pattern @ b["v"]).transpose(0, 1).reshape(len(ids), -1)
    rebuilt = joined @ attn.wo.weight.double().T
    gap = float((rebuilt - b["own"]).abs().max())
    scale = float(b["own"].abs().max())
    numbers = {"tokens": len(ids), "max_difference": gap, "output_scale": scale, "relative": gap / max(scale, 1e-30)}
    how = (f"on the prompt's {len(ids)} tokens, in float64 from the weights against the model's own output "
           f"(float32): largest difference {gap:.3g}, the output's largest value {scale:.3g}")
    if gap > 1e-4 * max(scale, 1e-3):
        return Step("rebuild", claim, how, FAILS, "the model's attention computes something else", numbers)
    return Step("rebuild", claim, how, HOLDS, "", numbers)


def step_heads(inp: Inputs) -> Step:
    claim = ("Heads specialise: each attends to particular past tokens (the one before, which forms first; the first "
             "token; the same token earlier; or the token that followed it last time, an induction head).")
    cfg = inp.model.config
    n = sequence_length(cfg.block_size)
    if n < 2:
        return Step("heads", claim, "patterns on a repeated random sequence", CANNOT,
                    f"a context of {cfg.block_size} tokens holds no repeated sequence")
    ids = random_repeats(cfg.vocab_size, n)
    p = patterns(inp.model, ids)
    scores, chance = head_scores(p, n)
    kinds = {}
    for kind in KINDS:
        s = scores[kind]
        layer, head = np.unravel_index(int(s.argmax()), s.shape)
        kinds[kind] = {"best": float(s.max()), "block": int(layer) + 1, "head": int(head) + 1, "chance": chance[kind],
                       "verdict": "present" if s.max() > PRESENT else "not yet"}
    numbers = {"n": n, "sequences": len(ids), "threshold": PRESENT, "kinds": kinds,
               "scores": {k: v.tolist() for k, v in scores.items()},
               "example": {"tokens": _pieces(inp, ids[0]), "patterns": p[:, 0].tolist()}}
    how = (f"on BOS + r + r for {len(ids)} random sequences r of {n} tokens (of the {COMMON:,} most used segments): "
           "the best head of each kind, its mean "
           "weight (even attention's in brackets): " + "; ".join(
               f"{k} {v['best']:.2f} (block {v['block']} head {v['head']}; {v['chance']:.2f}) {v['verdict']}"
               for k, v in kinds.items()))
    missing = [k for k, v in kinds.items() if v["verdict"] == "not yet"]
    if kinds["previous"]["verdict"] == "not yet":
        present = [k for k in KINDS if k not in missing]
        why = (f"no head puts more than {PRESENT:g} of its weight on the previous token"
               + (f" ({', '.join(present)} present)" if present else ": no head has a kind yet"))
        return Step("heads", claim, how, FAILS, why, numbers)
    if missing:
        return Step("heads", claim, how, CAVEAT, "not yet: " + ", ".join(missing), numbers)
    return Step("heads", claim, how, HOLDS, "", numbers)


def held_out(data: TokenData, seq_len: int, per_source: int = WINDOWS_PER_SOURCE) -> tuple[torch.Tensor, torch.Tensor]:
    xs, ys = zip(*(data.val_windows(s, seq_len, per_source) for s in data.names))
    return torch.cat(xs), torch.cat(ys)


@torch.no_grad()
def step_ablation(inp: Inputs, log=None) -> Step:
    claim = "The heads do work: removing one (its output zeroed) raises the loss on held-out text."
    if inp.data is None:
        return Step("ablation", claim, "held-out loss with each head removed", CANNOT, inp.data_note)
    cfg = inp.model.config
    x, y = held_out(inp.data, cfg.block_size)
    nbytes = float(token_byte_lengths(inp.tokenizer, cfg.vocab_size)[y].sum())

    def bpb() -> float:
        return bits_per_byte(position_nats(inp.model, x, y, MICRO, dtype=torch.float64).sum(), nbytes)

    base = bpb()
    costs = np.zeros((cfg.n_layer, cfg.n_head))
    for layer, head in np.ndindex(costs.shape):
        if log:
            log(f"removing block {layer + 1} head {head + 1} of {cfg.n_layer} × {cfg.n_head}")
        with inp.model.removed(heads=[(layer, head)]):
            costs[layer, head] = bpb() - base
    with inp.model.removed(heads=list(np.ndindex(costs.shape))):
        every = bpb() - base
    layer, head = np.unravel_index(int(costs.argmax()), costs.shape)
    working = int((costs >= MIN_COST).sum())
    numbers = {"windows": len(x), "tokens": int(y.numel()), "base_bpb": base, "costs": costs.tolist(),
               "largest": float(costs.max()), "largest_at": [int(layer) + 1, int(head) + 1], "working": working,
               "min_cost": MIN_COST, "all_heads": every}
    how = (f"{len(x)} held-out windows of {cfg.block_size} tokens ({base:.4f} bits per byte whole): removing block "
           f"{layer + 1} head {head + 1} costs the most, {costs.max():+.4f}; {working} of {costs.size} heads cost "
           f"{MIN_COST:g} or more; mean cost {costs.mean():+.4f}; every head at once {every:+.4f}")
    if costs.max() >= MIN_COST:
        return Step("ablation", claim, how, HOLDS, "", numbers)
    if every >= MIN_COST:
        return Step("ablation", claim, how, CAVEAT, f"no single head's removal costs {MIN_COST:g} bits per byte, but "
                    f"removing them all costs {every:.3f}: the heads share the work", numbers)
    return Step("ablation", claim, how, FAILS, f"no head's removal, nor all of them at once, costs {MIN_COST:g} bits per "
                "byte: the heads do not yet carry what the model predicts", numbers)


@torch.no_grad()
def step_later(inp: Inputs) -> Step:
    claim = "Later tokens are predicted better: with more context before it, a token's loss falls (in-context learning)."
    if inp.data is None:
        return Step("later", claim, "held-out loss early and late in a window", CANNOT, inp.data_note)
    T = inp.model.config.block_size
    early, late = min(EARLY, T // 4), min(LATE, T // 4)
    x, y = held_out(inp.data, T, LATER_WINDOWS_PER_SOURCE)
    nats = position_nats(inp.model, x, y, MICRO, dtype=torch.float64)
    diff = nats[:, :early].mean(1) - nats[:, T - late :].mean(1)
    score, se = float(diff.mean()), float(diff.std() / math.sqrt(len(diff))) if len(diff) > 1 else math.inf
    by_position = nats.mean(0).tolist()
    numbers = {"windows": len(x), "early": [0, early - 1], "late": [T - late, T - 1], "early_nats": float(nats[:, :early].mean()),
               "late_nats": float(nats[:, T - late :].mean()), "score": score, "standard_error": se,
               "by_position": by_position}
    how = (f"{len(x)} held-out windows of {T} tokens: loss at positions 0–{early - 1} {numbers['early_nats']:.3f}, at "
           f"{T - late}–{T - 1} {numbers['late_nats']:.3f} nats per token; early minus late {score:+.3f} ± {se:.3f}")
    if score > 2 * se and score > 0:
        return Step("later", claim, how, HOLDS, "", numbers)
    return Step("later", claim, how, FAILS, "late positions are not predicted better beyond twice the standard error: "
                "the model does not yet use the longer context", numbers)


STEPS = (step_scores, step_scale, step_mask, step_rebuild, step_heads, step_ablation, step_later)


def lesson(inp: Inputs, log=None) -> list[Step]:
    """Every step of the attention lesson on these inputs, in order."""
    return walk(inp, STEPS, "attention", log, logged=(step_ablation,))


def to_json(inp: Inputs, steps: list[Step]) -> dict:
    return report_json("attention", inp.name, inp.model, steps, [])


def to_text(inp: Inputs, steps: list[Step]) -> str:
    cfg = inp.model.config
    return report_text(f"The attention lesson on {inp.name} (d {cfg.n_embd}, {cfg.n_layer} blocks of {cfg.n_head} heads, "
                       f"d_head {cfg.head_dim}, context {cfg.block_size})", steps, [])
