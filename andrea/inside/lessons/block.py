"""The block lesson, claim by claim, on the learner's own model: `andrea lesson block`.

The attention lesson looked at one part of block 1; this one walks the whole block and the head
after the last: the layer norms, the MLP, the residual stream each block adds to, and the untied
head that turns the last state into next-token scores. Every look inside reads one traced pass
(`ANDREA.trace`), and parts are removed with `ANDREA.removed`. The steps, in order:

    block      a block is x + attn(ln_1(x)), then + mlp(ln_2(x)): every block rebuilt in float64
               from its weights, from the embedding up, matches the model's own outputs, and the
               rebuilt logits match the model's forward pass (holds within float error)
    norm       layer norm makes each row mean 0 and spread 1 before its gain and bias: every norm's
               output on the prompt, with the gain and bias taken off, against sqrt(var/(var+eps))
               (RMSNorm scales each row to root mean square 1 without centring: a caveat)
    mlp        the MLP widens each row to 4d, applies its activation and narrows it back, one
               position at a time: block 1's MLP with one position's input replaced leaves every
               other position's output alone; how many of the 4d hidden units fire per token
    stream     each block adds to x: the model's forward pass is the sum the trace reads (input +
               attention + MLP, block by block), and how far the stream moves and grows per block
    lens       the loss read through the final norm and the head at the embedding and after every
               block (the logit lens), on held-out text: holds when it falls at every block, a
               caveat when the last block ends lowest but some block raises it
    removal    removing a block's attention or its MLP (its output zeroed) costs bits per byte on
               held-out text, block by block: holds when every part costs ≥ 0.01, a caveat when
               some part does not
    head       logits = ln_f(x)·W_outᵀ (rebuilt in float64); cat's output row against its input row;
               the tokens whose output rows lie closest to cat's; the bits per byte lost if the
               head is replaced by the input table (tying): a caveat when tying costs nothing
    params     the blocks' share of the parameters, of andrea-120m and of this model, from the
               config's own count: holds when the blocks hold most of this model's parameters, a
               caveat when its two tables hold more (as in a small model with a large vocabulary)

`lens`, `removal` and the head's tying cost read the run's held-out text (the first 4 validation
windows of each source, as the attention lesson's ablation does); a bare model file gets the
other steps, and those say what they lack.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from andrea.config import get_preset, norm_params, param_rows
from andrea.errors import AndreaError
from andrea.evaluate import bits_per_byte, position_nats, summed_nats, token_byte_lengths
from andrea.inside.lessons.attention import (MICRO, MIN_COST, Inputs, held_out, inputs_for, load_inputs, masked_softmax,
                                      prompt_ids)
from andrea.inside.lessons.report import CANNOT, CAVEAT, FAILS, HOLDS, Step, report_json, report_text, walk
from andrea.inside.vectors import cosine, table, unit_rows

__all__ = ["Inputs", "inputs_for", "lesson", "load_inputs", "to_json", "to_text"]

REBUILD_TOL = 1e-4  # relative to the output's largest value: float32 against float64
NEIGHBOURS = 8  # output rows shown closest to cat's
SHOWN_UNITS = 48  # block 1's most active hidden units on the prompt, for the lab's picture
REFERENCE = "andrea-120m"
PART_NAMES = {"attention": "attention", "mlp": "MLP"}


# ---------------------------------------------------------------- the block in float64, from its weights


def norm64(norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A LayerNorm or RMSNorm module's function in float64, from its parameters."""
    if isinstance(norm, nn.LayerNorm):
        mu = x.mean(-1, keepdim=True)
        var = ((x - mu) ** 2).mean(-1, keepdim=True)
        return (x - mu) / torch.sqrt(var + norm.eps) * norm.weight.double() + norm.bias.double()
    if isinstance(norm, nn.RMSNorm):
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + norm.eps) * norm.weight.double()
    raise AndreaError(f"a block's norm is {type(norm).__name__}, neither LayerNorm nor RMSNorm.")


def act64(h: torch.Tensor, act: str) -> torch.Tensor:
    return F.relu(h) ** 2 if act == "relu2" else F.relu(h) if act == "relu" else F.gelu(h)


def block64(model, block, x: torch.Tensor) -> torch.Tensor:
    """One block on x (T, d) in float64: x + W_o·softmax(q·k/√d_head)·v of ln_1(x), then + fc2(act(fc1(ln_2(x))))."""
    T, d = x.shape
    attn, nh, hs = block.attn, model.config.n_head, model.config.head_dim
    h = norm64(block.ln_1, x)
    q, k, v = (h @ attn.qkv_weight().double().T).view(T, 3, nh, hs).permute(1, 2, 0, 3)
    if model.rope is not None:
        q, k = model.rope(q[None], 0)[0], model.rope(k[None], 0)[0]
    weights = masked_softmax(q @ k.transpose(-1, -2) / math.sqrt(hs))  # the attention lesson's float64 rebuild
    x = x + (weights @ v).transpose(0, 1).reshape(T, d) @ attn.wo.weight.double().T
    hidden = act64(norm64(block.ln_2, x) @ block.mlp.fc1.weight.double().T, model.config.act)
    return x + hidden @ block.mlp.fc2.weight.double().T


def _ids(model, ids: list[int]) -> torch.Tensor:
    return torch.tensor([ids], device=model.wte.weight.device)


def _share(x: float) -> str:
    """A ratio as a learner reads it: 21%, or 441× where it is ten times or more."""
    return f"{x:.0f}×" if x >= 10 else f"{x:.0%}"


def _mean_row_norm(x: torch.Tensor) -> float:
    return float(x.double().norm(dim=-1).mean())


@torch.no_grad()
def _bpb_through(inp: Inputs, tables: list[torch.Tensor]) -> list[float]:
    """Held-out bits per byte with the last state read through ln_f and each of `tables` (V, d) as
    the head, from one pass: the model's own head, or the input table for tying (the model's
    weights are left as they are)."""
    x, y, nbytes = _held_out(inp)
    nats = [0.0] * len(tables)
    for i in range(0, len(x), MICRO):
        h = inp.model.ln_f(inp.model.trace(x[i : i + MICRO]).stream()[-1])
        for k, table in enumerate(tables):
            nats[k] += summed_nats(F.linear(h, table), y[i : i + MICRO])
    return [bits_per_byte(n, nbytes) for n in nats]


def _held_out(inp: Inputs):
    """(x, y, bytes) of the held-out windows the data-reading steps share, made once."""
    if inp.windows is None:
        cfg = inp.model.config
        x, y = held_out(inp.data, cfg.block_size)
        inp.windows = (x, y, float(token_byte_lengths(inp.tokenizer, cfg.vocab_size)[y].sum()))
    return inp.windows


def _bpb(inp: Inputs) -> float:
    x, y, nbytes = _held_out(inp)
    return bits_per_byte(position_nats(inp.model, x, y, MICRO, dtype=torch.float64).sum(), nbytes)


# ---------------------------------------------------------------- the steps


@torch.no_grad()
def step_block(inp: Inputs) -> Step:
    claim = ("A block is x + attn(ln_1(x)), then + mlp(ln_2(x)): each block adds what attention and the MLP read "
             "from the normed stream; rebuilt that way from the weights, every block matches the model's own.")
    model, ids = inp.model, prompt_ids(inp)
    trace = model.trace(_ids(model, ids))
    x = trace.embedded[0].double()
    gaps, scale = [], 0.0
    for block, out in zip(model.h, trace["output"]):
        x = block64(model, block, x)
        gaps.append(float((x - out[0].double()).abs().max()))
        scale = max(scale, float(out.abs().max()))
    logits64 = norm64(model.ln_f, x) @ model.lm_head.weight.double().T
    own = model(_ids(model, ids))[0][0].double()
    logit_gap, logit_scale = float((logits64 - own).abs().max()), float(own.abs().max())
    numbers = {"tokens": len(ids), "block_gaps": gaps, "output_scale": scale, "logit_gap": logit_gap,
               "logit_scale": logit_scale}
    how = (f"on “{inp.prompt}” ({len(ids)} tokens), every block rebuilt in float64 from the embedding up: largest "
           f"difference from the model's output " + ", ".join(f"block {i + 1} {g:.2g}" for i, g in enumerate(gaps))
           + f" (outputs up to {scale:.3g}); the logits rebuilt through ln_f and the head differ from the model's "
           f"forward pass by {logit_gap:.2g} (logits up to {logit_scale:.3g})")
    if max(gaps) > REBUILD_TOL * max(scale, 1e-3) or logit_gap > REBUILD_TOL * max(logit_scale, 1e-3):
        return Step("block", claim, how, FAILS, "the model's blocks compute something else than the pre-norm sum", numbers)
    return Step("block", claim, how, HOLDS, "", numbers)


@torch.no_grad()
def step_norm(inp: Inputs) -> Step:
    claim = ("Layer norm makes each row mean 0 and spread 1 before its gain and bias, whatever the size of the stream "
             "it reads: attention and the MLP see rows of one scale.")
    model, ids = inp.model, prompt_ids(inp)
    trace = model.trace(_ids(model, ids), keep=("input", "middle", "output"))
    reads = []  # (name, norm, its input (T, d))
    for i, (block, b) in enumerate(zip(model.h, trace.blocks)):
        reads += [(f"ln_1 of block {i + 1}", block.ln_1, b["input"][0]), (f"ln_2 of block {i + 1}", block.ln_2, b["middle"][0])]
    reads.append(("ln_f", model.ln_f, (trace["output"][-1] if trace.blocks else trace.embedded)[0]))
    rms_norm = isinstance(model.ln_f, nn.RMSNorm)
    rows, worst_mean, worst_spread = [], 0.0, 0.0
    for name, norm, x in reads:
        if not isinstance(norm, (nn.LayerNorm, nn.RMSNorm)):
            return Step("norm", claim, f"{name} is {type(norm).__name__}", FAILS, "the block's norm is not a layer norm", {})
        out, x = norm(x).double(), x.double()
        gain = norm.weight.double()
        var = x.var(-1, unbiased=False) if not rms_norm else (x * x).mean(-1)
        # the rows with gain and bias taken off; a coordinate whose gain is 0 carries nothing back, and
        # counts as the rule gives it, so that it neither fails nor passes a row by itself
        z = (x - (0 if rms_norm else x.mean(-1, keepdim=True))) / torch.sqrt(var + norm.eps)[:, None]
        keep = gain.abs() > 1e-6
        z[:, keep] = (out - (norm.bias.double() if getattr(norm, "bias", None) is not None else 0))[:, keep] / gain[keep]
        expected = torch.sqrt(var / (var + norm.eps))  # eps keeps a row's spread just under 1
        spread = z.std(-1, unbiased=False) if not rms_norm else z.pow(2).mean(-1).sqrt()
        mean = z.mean(-1)
        worst_mean = max(worst_mean, float(mean.abs().max())) if not rms_norm else worst_mean
        worst_spread = max(worst_spread, float((spread - expected).abs().max()))
        rows.append({"norm": name, "in_mean": [float(x.mean(-1).min()), float(x.mean(-1).max())],
                     "in_spread": [float(x.std(-1, unbiased=False).min()), float(x.std(-1, unbiased=False).max())],
                     "out_mean_max": float(mean.abs().max()), "out_spread": [float(spread.min()), float(spread.max())],
                     "gain": [float(gain.min()), float(gain.max())]})
    first, last = rows[0], rows[-1]
    numbers = {"tokens": len(ids), "norm": "rmsnorm" if rms_norm else "layernorm", "norms": rows,
               "largest_mean": worst_mean, "largest_spread_error": worst_spread}
    how = (f"on the prompt's {len(ids)} tokens, {len(rows)} norms: rows enter {first['norm']} with spreads "
           f"{first['in_spread'][0]:.3g} to {first['in_spread'][1]:.3g} and {last['norm']} with {last['in_spread'][0]:.3g} "
           f"to {last['in_spread'][1]:.3g}; with gain and bias taken off, every row leaves with mean within "
           f"{worst_mean:.2g} of 0 and spread within {worst_spread:.2g} of √(var/(var + ε)) (ε 1e-5: "
           f"{min(r['out_spread'][0] for r in rows):.4f} at the smallest)")
    if worst_mean > 1e-4 or worst_spread > 1e-4:
        return Step("norm", claim, how, FAILS, "a norm's rows are not centred and scaled as layer norm's", numbers)
    if rms_norm:
        return Step("norm", claim, how, CAVEAT, "this model's norm is RMSNorm: rows are scaled to root mean square 1 "
                    "and not centred", numbers)
    return Step("norm", claim, how, HOLDS, "", numbers)


@torch.no_grad()
def step_mlp(inp: Inputs) -> Step:
    claim = ("The MLP widens each row to 4d, applies its activation and narrows it back, one position at a time: "
             "changing one position's input leaves every other position's output alone.")
    model, ids, d = inp.model, prompt_ids(inp), inp.model.config.n_embd
    block = model.h[0]
    trace = model.trace(_ids(model, ids), keep=("middle", "hidden", "mlp"), blocks=1)
    mid, hidden, out = trace["middle"][0], trace["hidden"][0], trace["mlp"][0]
    j = len(ids) // 2
    changed = mid.clone()
    changed[0, j] = mid[0, j].flip(-1)
    other = block.mlp(block.ln_2(changed))
    rest = torch.ones(len(ids), dtype=torch.bool)
    rest[j] = False
    moved = float((other[0, rest] - out[0, rest]).abs().max()) if len(ids) > 1 else 0.0
    own_moved = float((other[0, j] - out[0, j]).abs().max())
    firing = _firing(inp, hidden)
    units = hidden[0].double().mean(0).argsort(descending=True)[:SHOWN_UNITS].sort().values
    numbers = {"tokens": len(ids), "width": d, "hidden_width": int(hidden.shape[-1]), "activation": model.config.act,
               "changed_position": j, "others_moved": moved, "own_moved": own_moved, "firing": firing,
               "prompt_hidden": {"tokens": [inp.tokenizer.id_to_piece(i).replace(" ", "␣") for i in ids],
                                 "units": units.tolist(), "values": hidden[0][:, units].double().tolist()}}
    how = (f"block 1's MLP on the prompt: each row of {d} widens to {hidden.shape[-1]} ({model.config.act}) and back; "
           f"with position {j}'s input reversed, its own output moved by {own_moved:.3g} and the {len(ids) - 1} others "
           f"by {moved:.3g}; hidden units firing (above 0) per token, block by block"
           f" ({firing['where']}): " + ", ".join(f"{f:.0f} of {hidden.shape[-1]}" for f in firing["mean"]))
    if hidden.shape[-1] != 4 * d:
        return Step("mlp", claim, how, FAILS, f"the hidden layer is {hidden.shape[-1]} wide, not 4d = {4 * d}", numbers)
    if moved > 1e-6 * max(1.0, float(out.abs().max())):
        return Step("mlp", claim, how, FAILS, "other positions' outputs moved: this MLP mixes positions", numbers)
    return Step("mlp", claim, how, HOLDS, "", numbers)


def _firing(inp: Inputs, prompt_hidden: torch.Tensor) -> dict:
    """Mean count of hidden units above 0 per token, block by block: on the held-out windows where
    the run's data is known, else on the prompt (block 1 only)."""
    if inp.data is None:
        return {"where": "the prompt, block 1", "mean": [float((prompt_hidden > 0).sum(-1).double().mean())]}
    x, _, _ = _held_out(inp)
    counts = None
    for i in range(0, len(x), MICRO):
        per = torch.stack([(h > 0).sum(-1).double().sum() for h in inp.model.trace(x[i : i + MICRO], keep=("hidden",))["hidden"]])
        counts = per if counts is None else counts + per
    return {"where": f"{x.numel():,} held-out tokens", "mean": (counts / x.numel()).tolist()}


@torch.no_grad()
def step_stream(inp: Inputs) -> Step:
    claim = ("The residual stream: each block adds to x rather than replacing it, so the last state is the embedding "
             "plus every block's attention and MLP outputs.")
    model, ids = inp.model, prompt_ids(inp)
    t = _ids(model, ids)
    trace = model.trace(t, keep=("input", "attention", "mlp", "output"))
    summed = trace.embedded + sum(b["attention"] + b["mlp"] for b in trace.blocks) if trace.blocks else trace.embedded
    last = trace["output"][-1] if trace.blocks else trace.embedded
    own = model(t)[0]
    via_trace = model.head(model.ln_f(last))
    gap = float((own - via_trace).abs().max())
    sum_gap = float((summed - last).abs().max())
    norms = [_mean_row_norm(s) for s in trace.stream()]
    per_block = [{"attention": _mean_row_norm(b["attention"]), "mlp": _mean_row_norm(b["mlp"]),
                  "moved": float(((b["output"] - b["input"]).double().norm(dim=-1) / b["input"].double().norm(dim=-1)).mean()),
                  "cos": float(F.cosine_similarity(b["input"].double(), b["output"].double(), dim=-1).mean())}
                 for b in trace.blocks]
    numbers = {"tokens": len(ids), "norms": norms, "blocks": per_block, "forward_gap": gap, "sum_gap": sum_gap,
               "stages": ["embedding"] + [f"block {i + 1}" for i in range(len(trace.blocks))]}
    how = (f"on the prompt's {len(ids)} tokens: the model's logits and those read from the traced stream differ by "
           f"{gap:.2g}; the embedding plus every attention and MLP output is the last state within {sum_gap:.2g}; the "
           "stream's mean row norm " + " → ".join(f"{n:.3g}" for n in norms) + "; each block moves it by "
           + ", ".join(_share(b["moved"]) for b in per_block) + " of its length (cos in to out "
           + ", ".join(f"{b['cos']:+.2f}" for b in per_block) + ")")
    if gap > REBUILD_TOL * max(1.0, float(own.abs().max())) or sum_gap > REBUILD_TOL * max(1.0, norms[-1]):
        return Step("stream", claim, how, FAILS, "the model's forward pass is not the stream's sum", numbers)
    return Step("stream", claim, how, HOLDS, "", numbers)


@torch.no_grad()
def step_lens(inp: Inputs) -> Step:
    claim = ("Each block adds to the prediction: read through the final norm and the head at every stage (the logit "
             "lens), the loss on held-out text falls from block to block.")
    if inp.data is None:
        return Step("lens", claim, "the lens loss on held-out text", CANNOT, inp.data_note)
    model = inp.model
    x, y, nbytes = _held_out(inp)
    nats = np.zeros(model.config.n_layer + 1)
    for i in range(0, len(x), MICRO):
        for s, state in enumerate(model.trace(x[i : i + MICRO]).stream()):
            nats[s] += summed_nats(model.head(model.ln_f(state)), y[i : i + MICRO])
    bpb = [bits_per_byte(n, nbytes) for n in nats]
    stages = ["embedding"] + [f"block {i + 1}" for i in range(model.config.n_layer)]
    rises = [stages[s] for s in range(1, len(bpb)) if bpb[s] >= bpb[s - 1]]
    numbers = {"windows": len(x), "tokens": int(y.numel()), "stages": stages, "bpb": bpb,
               "nats_per_token": (nats / y.numel()).tolist(), "rises": rises}
    how = (f"{len(x)} held-out windows ({y.numel():,} tokens), bits per byte read at each stage: "
           + ", ".join(f"{s} {b:.3f}" for s, b in zip(stages, bpb)))
    if not rises:
        return Step("lens", claim, how, HOLDS, "", numbers)
    if bpb[-1] < bpb[0] and bpb[-1] == min(bpb):
        return Step("lens", claim, how, CAVEAT, "the loss rises after " + ", ".join(rises) + ": such a block's output is "
                    "not yet a prediction of its own, and the later blocks make it one", numbers)
    return Step("lens", claim, how, FAILS, "the last block does not end with the lowest loss", numbers)


@torch.no_grad()
def step_removal(inp: Inputs, log=None) -> Step:
    claim = ("Both parts of every block do work: removing a block's attention or its MLP (its output zeroed) raises "
             "the loss on held-out text.")
    if inp.data is None:
        return Step("removal", claim, "held-out loss with each part removed", CANNOT, inp.data_note)
    model, L = inp.model, inp.model.config.n_layer
    base = _bpb(inp)
    costs = {"attention": [], "mlp": []}
    for i in range(L):
        for part in costs:
            if log:
                log(f"removing block {i + 1}'s {PART_NAMES[part]} of {L}")
            with model.removed(**{part: [i]}):
                costs[part].append(_bpb(inp) - base)
    x, y, _ = _held_out(inp)
    weak = [f"block {i + 1}'s {PART_NAMES[part]}" for part in costs for i, c in enumerate(costs[part]) if c < MIN_COST]
    numbers = {"windows": len(x), "tokens": int(y.numel()), "base_bpb": base, "costs": costs, "min_cost": MIN_COST,
               "weak": weak}
    how = (f"{len(x)} held-out windows ({base:.4f} bits per byte whole): removing attention costs "
           + ", ".join(f"{c:+.3f}" for c in costs["attention"]) + "; removing the MLP costs "
           + ", ".join(f"{c:+.3f}" for c in costs["mlp"]) + " (block 1 first)")
    if not weak:
        return Step("removal", claim, how, HOLDS, "", numbers)
    if len(weak) < 2 * L:
        return Step("removal", claim, how, CAVEAT, ", ".join(weak) + f" cost{'s' if len(weak) == 1 else ''} under "
                    f"{MIN_COST:g} bits per byte: the model does not yet lean on {'it' if len(weak) == 1 else 'them'}", numbers)
    return Step("removal", claim, how, FAILS, f"no part's removal costs {MIN_COST:g} bits per byte", numbers)


@torch.no_grad()
def step_head(inp: Inputs) -> Step:
    claim = ("The head is its own table: logits = ln_f(x)·W_outᵀ scores every token by its output row, and the output "
             "rows group tokens by what precedes them, not by what they mean alone.")
    model, tok, ids = inp.model, inp.tokenizer, prompt_ids(inp)
    t = _ids(model, ids)
    last = model.trace(t).stream()[-1]
    rebuilt = norm64(model.ln_f, last[0].double()) @ model.lm_head.weight.double().T
    own = model(t)[0][0].double()
    gap = float((rebuilt - own).abs().max())
    cat = tok.word_ids("cat")
    out_table, in_table = table(model, "output"), table(model, "input")
    numbers = {"tokens": len(ids), "logit_gap": gap, "logit_scale": float(own.abs().max()),
               "shared_storage": model.wte.weight.data_ptr() == model.lm_head.weight.data_ptr()}
    how = f"on the prompt, ln_f(x)·W_outᵀ in float64 against the model's logits: largest difference {gap:.2g}"
    if len(cat) == 1:
        c = cat[0]
        scores = unit_rows(out_table) @ unit_rows(out_table[c : c + 1])[0]
        scores[c] = -np.inf
        near = np.argsort(-scores)[:NEIGHBOURS]
        numbers["cat"] = {"id": c, "in_out_cos": cosine(in_table[c], out_table[c]),
                          "neighbours": [{"id": int(i), "piece": tok.id_to_piece(int(i)), "cos": float(scores[i])} for i in near]}
        how += (f"; cat's output row against its input row: cos {numbers['cat']['in_out_cos']:+.3f}; closest output rows: "
                + ", ".join(f"{n['piece'].replace(' ', '␣')} {n['cos']:+.2f}" for n in numbers["cat"]["neighbours"]))
    if inp.data is not None:
        base, tied = _bpb_through(inp, [model.lm_head.weight, model.wte.weight])
        numbers.update(base_bpb=base, tied_bpb=tied, tying_cost=tied - base)
        how += f"; with the input table as the head, held-out bits per byte {base:.4f} → {tied:.4f} ({tied - base:+.3f})"
    if numbers["shared_storage"]:
        return Step("head", claim, how, FAILS, "the head is the input table (tied)", numbers)
    if gap > REBUILD_TOL * max(1.0, numbers["logit_scale"]):
        return Step("head", claim, how, FAILS, "the model's logits are not ln_f(x)·W_outᵀ", numbers)
    if inp.data is not None and numbers["tying_cost"] <= 0:
        return Step("head", claim, how, CAVEAT, "the input table predicts as well as the head here: the two tables have "
                    "not yet learned apart", numbers)
    return Step("head", claim, how, HOLDS, "", numbers)


def block_share(cfg) -> dict:
    """Where a config's parameters live: the blocks (attention, MLP, their norms), the two tables and the rest."""
    rows = {r.key: r.count for r in param_rows(cfg)}
    blocks = rows["attention"] + rows["mlp"] + 2 * cfg.n_layer * norm_params(cfg)
    total = rows["total"]
    return {"total": total, "blocks": blocks, "tables": rows["wte"] + rows["wpe"] + rows["lm_head"],
            "embedding": rows["embedding"], "blocks_share": blocks / total,
            "outside_embedding_share": 1 - rows["embedding"] / total}


def step_params(inp: Inputs) -> Step:
    claim = ("The blocks hold most of a model's parameters; the token table, the position table, the head and the "
             "final norm hold the rest.")
    model = inp.model
    ref, own = block_share(get_preset(REFERENCE)), block_share(model.config)
    counted = sum(p.numel() for p in model.parameters())
    numbers = {"reference": REFERENCE, REFERENCE: ref, "model": own, "counted": counted}
    how = (f"{REFERENCE}: the blocks hold {ref['blocks']:,} of {ref['total']:,} parameters ({ref['blocks_share']:.1%}; "
           f"everything outside the embedding layer {ref['outside_embedding_share']:.1%}); this model: "
           f"{own['blocks']:,} of {own['total']:,} ({own['blocks_share']:.1%}), the input table, the position table "
           f"and the head {own['tables']:,} ({own['tables'] / own['total']:.1%})")
    if counted != own["total"]:
        return Step("params", claim, how, FAILS, f"the model has {counted:,} parameters, not its config's "
                    f"{own['total']:,}", numbers)
    if own["blocks_share"] <= 0.5:
        return Step("params", claim, how, CAVEAT, f"in this model the tables hold more: {model.config.vocab_size:,} "
                    f"rows twice at width {model.config.n_embd} outweigh {model.config.n_layer} blocks of "
                    f"12·{model.config.n_embd}²", numbers)
    return Step("params", claim, how, HOLDS, "", numbers)


STEPS = (step_block, step_norm, step_mlp, step_stream, step_lens, step_removal, step_head, step_params)


def lesson(inp: Inputs, log=None) -> list[Step]:
    """Every step of the block lesson on these inputs, in order."""
    return walk(inp, STEPS, "block", log, logged=(step_removal,))


def to_json(inp: Inputs, steps: list[Step]) -> dict:
    return report_json("block", inp.name, inp.model, steps, [])


def to_text(inp: Inputs, steps: list[Step]) -> str:
    cfg = inp.model.config
    return report_text(f"The block lesson on {inp.name} (d {cfg.n_embd}, {cfg.n_layer} blocks, MLP width "
                       f"{4 * cfg.n_embd}, {cfg.norm}, {cfg.act}, V {cfg.vocab_size:,})", steps, [])
