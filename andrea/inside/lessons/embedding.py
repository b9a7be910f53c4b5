"""The embedding lesson, claim by claim, on the learner's own model: how andrea checks it, the number, a verdict.

andrea grew from one lesson about the embedding layer. `andrea lesson --checkpoint RUN` and the
lab's Lesson view walk its claims in the lesson's order on a trained model. Each step gives the
claim in one sentence, how it was checked on this model, the numbers, and a verdict
(andrea.inside.lessons.report).

The steps, in order:

    lookup     a token's row is picked by its id: wte[id] equals one-hot(id) · wte, exactly
    tables     this model's two tables (V × d and T × d) and ANDREA-120M's, with their shares
    init       the rows start as N(0, 1/√d): the spread at the run's first snapshot against 1/√d
    sparse     a row gets a gradient only when its token is in the batch: rows seen and unseen
               between the first two snapshots, with what the optimizer does to unseen rows
    pairs      cat·dog and cat·pet against cat·Tuesday and cat·xylophone, cos on the input table and
               the head, raw and centred, against the ±1/√d band of random rows (holds: both related
               pairs beyond the band and above every unrelated one; cat·dog alone: a caveat; a word of
               several tokens, its pieces' mean row, is reported apart and left out of the verdict:
               andrea.inside.wordsim.lesson_margin), with how often each word's token stands alone in the
               training text (andrea.usage); where that text is known, the same pairs on the last
               block's word vectors too (andrea.inside.context_vectors), which see xylophone whole
    scores     Spearman ρ on WordSim-353 and SimLex-999 over all single-token pairs and over pairs
               of words whose tokens mostly stand alone, beside counting (PPMI) on the same pairs;
               apart, pairs with a word of several tokens: their pieces' mean rows and, where the
               training text is known, the last block's word vectors on the same pairs
    dot        u·v = ‖u‖‖v‖cos θ on the learner's rows
    positions  x_t = wte[id_t] + wpe[t] reproduced against the input of block 1 on a prompt, and
               word order changing x
    untied     the output head is a table of its own

A run folder gives every step: its snapshots (`andrea.snapshots.store`), its training data (named in
train.json) and, when fetched, the word sets. A bare model file, or a run without snapshots,
gets the steps it can; the others say which input they lack.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from andrea.checkpoint import load_model
from andrea.config import get_preset, param_rows
from andrea.errors import AndreaError
from andrea.inside.context_vectors import CONTEXT, block_vectors, layer_scores, mean_state
from andrea.inside.embed import forward_matrix
from andrea.inside.lessons.report import CANNOT, CAVEAT, FAILS, HOLDS, Step, report_json, report_text
from andrea.inside.vectors import table, vector_stats
from andrea.inside.wordsim import (
    LESSON_PAIRS,
    PAIR_SETS,
    WordIndex,
    WordSets,
    centred,
    lesson_margin,
    pair_scores,
    ppmi_vectors,
    train_token_chunks,
    try_load_wordsets,
    word_index,
)
from andrea.shards import TokenData
from andrea.snapshots.store import snapshot_steps
from andrea.snapshots.timeline import Timeline, row_updates
from andrea.usage import MIN_USES, STANDALONE, data_usage, run_data

PROMPT = "the dog chased the cat"
HISTOGRAM_BINS = 48  # the step-0 values drawn against N(0, 1/√d), over ±4/√d
REFERENCE = "andrea-120m"


@dataclass
class Inputs:
    """What the lesson is computed from: the model and tokenizer, and where known the run's
    snapshots, its training data's usage figures and the word sets."""

    model: torch.nn.Module
    tokenizer: object
    name: str
    timeline: Timeline | None = None
    timeline_note: str = ""
    usage: object = None
    usage_note: str = ""
    data: TokenData | None = None
    sets: object = None
    ppmi: bool = True
    score_tables: dict = field(default_factory=dict)  # name: (V, d) table scored by `scores`; the input table by default
    log: object = None  # where the slow steps say what they are doing (a function of one message), or None


def _words(tokenizer, words) -> dict[str, list[int]]:
    return {w: tokenizer.word_ids(w) for w in words}


def _label(tokenizer, ids) -> str:
    """Tokens as they read, spaces as ␣, word ends marked, several joined by +: ␣xyl+oph+one</w>."""
    piece = getattr(tokenizer, "segment_label", tokenizer.id_to_piece)
    return "+".join(piece(i).replace(" ", "␣") for i in ids)


# ---------------------------------------------------------------- the steps


def step_lookup(inp: Inputs) -> Step:
    model = inp.model
    ids = sorted({i for ids in _words(inp.tokenizer, ("cat", "dog", "Tuesday")).values() for i in ids})
    t = torch.tensor(ids)
    with torch.no_grad():
        looked_up = model.wte(t)
        one_hot = torch.nn.functional.one_hot(t, model.config.vocab_size).to(model.wte.weight.dtype) @ model.wte.weight
    same = torch.equal(looked_up, one_hot)
    gap = float((looked_up - one_hot).abs().max())
    return Step("lookup", "A token's embedding is the row of the table its id picks: a lookup, not a computation.",
                f"wte[id] against one-hot(id) · wte for the {len(ids)} tokens of cat, dog and Tuesday",
                HOLDS if same else FAILS,
                "" if same else f"the model's lookup differs from the one-hot product by up to {gap:.3g}",
                {"tokens": len(ids), "equal": same, "max_difference": gap})


def step_tables(inp: Inputs) -> Step:
    cfg = inp.model.config
    total = sum(p.numel() for p in inp.model.parameters())
    wte = inp.model.wte.weight.numel()
    wpe = inp.model.wpe.weight.numel() if cfg.pos == "learned" else 0
    ref = {r.name: r.count for r in param_rows(get_preset(REFERENCE))}
    ref_wte, ref_wpe = ref["token embedding (wte)"], ref["position embedding (wpe)"]
    numbers = {"V": cfg.vocab_size, "d": cfg.n_embd, "T": cfg.block_size, "wte": wte, "wpe": wpe, "total": total,
               "embedding_share": (wte + wpe) / total, "reference": REFERENCE, "reference_wte": ref_wte,
               "reference_wpe": ref_wpe, "reference_embedding": ref_wte + ref_wpe, "reference_total": ref["total"],
               "reference_share": (ref_wte + ref_wpe) / ref["total"]}
    how = (f"this model: wte {cfg.vocab_size:,} × {cfg.n_embd} = {wte:,}, wpe "
           + (f"{cfg.block_size:,} × {cfg.n_embd} = {wpe:,}" if wpe else f"none ({cfg.pos})")
           + f", {(wte + wpe) / total:.1%} of {total:,}; {REFERENCE}: {ref_wte:,} + {ref_wpe:,} = {ref_wte + ref_wpe:,}, "
           f"{numbers['reference_share']:.1%} of {ref['total']:,}")
    if wte != cfg.vocab_size * cfg.n_embd:
        return Step("tables", _TABLES, how, FAILS, f"wte holds {wte:,} values, not V × d", numbers)
    if not wpe:
        return Step("tables", _TABLES, how, FAILS,
                    f"this model has no learned position table: its positions are {cfg.pos}", numbers)
    return Step("tables", _TABLES, how, HOLDS, "", numbers)


_TABLES = "The embedding layer is two learned tables: tokens (V × d) and positions (T × d)."


def step_init(inp: Inputs) -> Step:
    claim = "The table starts as small random numbers, N(0, 1/√d)."
    d = inp.model.config.n_embd
    band = 1 / math.sqrt(d)
    if inp.timeline is None:
        return Step("init", claim, "the spread of the rows at the run's first snapshot", CANNOT, inp.timeline_note)
    tl = inp.timeline
    first = tl.steps[0]
    rows = tl.snapshot(first).tables["input"].double().numpy()
    std, mean = float(rows.std()), float(rows.mean())
    counts, edges = np.histogram(rows, bins=HISTOGRAM_BINS, range=(-4 * band, 4 * band))
    numbers = {"step": first, "rows": len(rows), "std": std, "mean": mean, "expected_std": band, "ratio": std / band,
               "histogram": {"edges": edges.tolist(), "counts": counts.tolist(), "values": int(rows.size)}}
    how = f"the standard deviation of the {len(rows):,} kept rows of wte at step {first}: {std:.5f} against 1/√{d} = {band:.5f}"
    close = abs(std / band - 1) < 0.05 and abs(mean) < 0.05 * band
    if not close:
        return Step("init", claim, how, FAILS, f"the spread is {std / band:.2f} × 1/√d", numbers)
    if first > 0:
        return Step("init", claim, how, CAVEAT, f"the first snapshot is at step {first}, after training began", numbers)
    return Step("init", claim, how, HOLDS, "", numbers)


def step_sparse(inp: Inputs) -> Step:
    claim = "Backpropagation updates a row only when its token is in the batch."
    how = "how far each kept row of wte moved between the run's first two snapshots, tokens in the batches apart"
    if inp.timeline is None or len(inp.timeline.steps) < 2:
        why = inp.timeline_note or "the run has only one snapshot"
        return Step("sparse", claim, how, CANNOT, why)
    r = row_updates(inp.timeline, inp.timeline.steps[0], inp.timeline.steps[1])
    seen, unseen = r["groups"]["seen"], r["groups"]["unseen"]
    numbers = {"start": r["start"], "end": r["end"], "seen": seen, "unseen": unseen, "recipe": r["recipe"]}
    how = (f"steps {r['start']} to {r['end']}: {seen['tokens']:,} rows whose token was in a batch moved "
           f"{_num(seen['mean_moved'])} on average; {unseen['tokens']:,} rows that were not moved {_num(unseen['mean_moved'])}")
    if not seen["tokens"] or not unseen["tokens"]:
        return Step("sparse", claim, how, CANNOT, "every kept token was in a batch, or none was", numbers)
    if not unseen["mean_moved"]:
        return Step("sparse", claim, how, HOLDS, "", numbers)
    if unseen["mean_moved"] < 0.1 * seen["mean_moved"]:
        return Step("sparse", claim, how, CAVEAT, r["why"], numbers)
    return Step("sparse", claim, how, FAILS, r["why"], numbers)


def _num(x) -> str:
    return "—" if x is None else f"{x:.3g}"


def _usage_of(inp: Inputs, ids: list[int]) -> dict | None:
    if inp.usage is None or len(ids) != 1:
        return None
    return {"count": int(inp.usage.count[ids[0]]), "standalone_share": inp.usage.share(ids[0])}


def step_pairs(inp: Inputs) -> Step:
    claim = "After training, related tokens (cat, dog, pet) have similar vectors; unrelated ones (cat, Tuesday, xylophone) do not."
    words = _words(inp.tokenizer, sorted({w for p in LESSON_PAIRS for w in p}))
    band = 1 / math.sqrt(inp.model.config.n_embd)
    cos = {}
    for name in ("input", "output"):
        m = table(inp.model, name)
        for how, mat in (("raw", m), ("centred", centred(m))):
            vec = {w: mat[ids].mean(axis=0) for w, ids in words.items()}
            cos[f"{name}_{how}"] = {f"{a}·{b}": vector_stats(vec[a], vec[b])["cos"] for a, b in LESSON_PAIRS}
    usage = {w: _usage_of(inp, ids) for w, ids in words.items()}
    single = {f"{a}·{b}": len(words[a]) == 1 and len(words[b]) == 1 for a, b in LESSON_PAIRS}
    numbers = {"band": band, "cos": cos, "tokens": {w: _label(inp.tokenizer, ids) for w, ids in words.items()},
               "usage": usage, "single": single}
    c = cos["input_centred"]
    how = (f"cos θ on the centred input table: cat·dog {c['cat·dog']:+.3f}, cat·pet {c['cat·pet']:+.3f}, "
           f"cat·Tuesday {c['cat·Tuesday']:+.3f}, cat·xylophone {c['cat·xylophone']:+.3f}; random rows: ±{band:.3f}")
    apart = [w for w, ids in words.items() if len(ids) > 1]
    if apart:
        how += "; " + ", ".join(f"{w} is {len(words[w])} tokens ({_label(inp.tokenizer, words[w])})" for w in apart)
        how += ": a mean of pieces' rows, reported apart and left out of the verdict"
    numbers["margin"] = lesson_margin(c, single)  # each related pair above each unrelated one of single tokens
    blocks = _from_blocks(inp, list(words))
    if blocks is not None:
        numbers["blocks"] = blocks
        how += (f"; from block {blocks['block']}'s hidden states (each word's mean over up to {blocks['max_uses']} uses in "
                "the training text, centred on the mean state), which see a word of several tokens whole: "
                + ", ".join(f"{p} {v:+.3f}" for p, v in blocks["cos"].items()))
    notes = _word_notes(inp, words, usage)
    unrelated = min(c["cat·dog"], c["cat·pet"]) - numbers["margin"]  # the greatest unrelated pair of single tokens
    above = {p: c[p] > band and c[p] > unrelated for p in ("cat·dog", "cat·pet")}
    if above["cat·dog"] and not above["cat·pet"]:
        notes.insert(0, "cat·dog holds, but cat·pet is not beyond the band of random rows and above every unrelated pair "
                        "of single tokens")
    if above["cat·dog"]:
        return Step("pairs", claim, how, CAVEAT if notes else HOLDS, "; ".join(notes), numbers)
    why = "; ".join(notes) or "cat·dog is not beyond the band of random rows or not above every unrelated pair of single tokens"
    return Step("pairs", claim, how, FAILS, why, numbers)


def _from_blocks(inp: Inputs, words: list[str]) -> dict | None:
    """The lesson's pairs on the last block's word vectors (andrea.inside.context_vectors), where the run's
    training text is known and every word has a use there; None otherwise."""
    if inp.data is None or not len(inp.model.h):
        return None
    context = min(CONTEXT, inp.model.config.block_size)
    bv = block_vectors(inp.model, inp.tokenizer, inp.data, words, context=context, log=inp.log)
    if not bv.uses.all():
        return None
    last = bv.vectors[-1] - mean_state(inp.model, inp.data, context=context)[-1]
    vec = {w: last[bv.row(w)] for w in words}
    return {"block": inp.model.config.n_layer, "max_uses": bv.max_uses, "context": context,
            "uses": {w: int(bv.uses[bv.row(w)]) for w in words},
            "cos": {f"{a}·{b}": vector_stats(vec[a], vec[b])["cos"] for a, b in LESSON_PAIRS}}


def _word_notes(inp: Inputs, words: dict, usage: dict) -> list[str]:
    """What the learner should know about the lesson's single-token words: those whose token mostly
    begins longer words (its row learns those words too), or that the usage is unknown."""
    notes = []
    for w, ids in words.items():
        if len(ids) == 1 and usage[w] is not None and usage[w]["count"] and usage[w]["standalone_share"] < STANDALONE:
            label = _label(inp.tokenizer, ids)
            share = usage[w]["standalone_share"]
            notes.append(f"{label} stands alone in only {share:.0%} of its {usage[w]['count']:,} uses; "
                         f"{inp.usage.sentence(ids[0], lambda i: _label(inp.tokenizer, [i])).split('; ', 1)[-1]} "
                         f"Its row learns those words too")
    if inp.usage is None:
        notes.append(f"how often each word's token stands alone is unknown: {inp.usage_note}")
    return notes


def _scores(tables: dict, index: WordIndex, pairs) -> dict:
    """ρ of the centred input table (and PPMI) over single-token pairs, over pairs of words that
    stand alone (all single-token pairs where usage is unknown) and, apart, over pairs with a word of
    several tokens (its pieces' mean row); each with n and the null spread (andrea.inside.wordsim.pair_scores)."""
    out = {}
    for name, mat in tables.items():
        r = pair_scores(mat, index, pairs, points=name == "input")  # the lab draws the input table's pairs
        out[name] = {"single": r["single"], "standalone": r.get("standalone", r["single"]), "pieces": r["pieces"]}
    return out


def _pieces_from_blocks(inp: Inputs, index: WordIndex) -> dict | None:
    """The pairs with a word of several tokens on the last block's word vectors (andrea.inside.context_vectors),
    beside the input table's mean rows of the pieces on the same pairs (those whose two words have
    context_vectors.MIN_USES uses in the training text); None where that text is unknown, the model
    has no blocks or every pair is of single tokens."""
    if inp.data is None or not len(inp.model.h):
        return None
    pairs = {s: [p for p in inp.sets.pairs[s] if not (index.single(p[0]) and index.single(p[1]))] for s in PAIR_SETS}
    words = sorted({w for ps in pairs.values() for a, b, _ in ps for w in (a, b)})
    if not words:
        return None
    context = min(CONTEXT, inp.model.config.block_size)
    bv = block_vectors(inp.model, inp.tokenizer, inp.data, words, context=context, log=inp.log)
    scores = layer_scores(bv, inp.tokenizer, WordSets(pairs, []), {"input": table(inp.model, "input")})
    last = inp.model.config.n_layer
    return {"block": last, "max_uses": bv.max_uses, "min_uses": scores["min_uses"], "context": context,
            "sets": {s: {"pairs": v["pairs"], "of": v["of"], "blocks": v["scores"][f"block {last}"],
                         "input": v["scores"]["input"]} for s, v in scores["sets"].items()}}


def step_scores(inp: Inputs) -> Step:
    claim = "Closeness in the table ranks word pairs as people do: Spearman ρ on WordSim-353 and SimLex-999."
    if inp.sets is None:
        return Step("scores", claim, "Spearman ρ of cos θ against people's ratings", CANNOT,
                    "the word sets are not fetched; `andrea data fetch wordsets` fetches them")
    index = word_index(inp.tokenizer, inp.model.config.vocab_size, inp.sets)
    standalone = inp.usage.standalone_words(STANDALONE, MIN_USES) if inp.usage is not None else None
    index.standalone = standalone
    tables = inp.score_tables or {"input": centred(table(inp.model, "input"))}
    numbers = {"standalone_rule": {"min_share": STANDALONE, "min_uses": MIN_USES},
               "sets": {s: _scores(tables, index, inp.sets.pairs[s]) for s in PAIR_SETS}}
    ws = numbers["sets"]["wordsim353"]["input"]
    head, alone = ws["single"], ws["standalone"]
    ppmi = numbers["sets"]["wordsim353"].get("ppmi")
    if standalone is None:
        how = (f"WordSim-353 on the centred input table: ρ {head['rho']:+.2f} over all {head['n']} single-token pairs "
               f"(null spread ±{head['null']:.2f})")
    else:
        how = (f"WordSim-353 on the centred input table: ρ {alone['rho']:+.2f} over {alone['n']} pairs of words that "
               f"stand alone (null spread ±{alone['null']:.2f}), {head['rho']:+.2f} over all {head['n']} single-token pairs")
    if ppmi:
        how += (f"; counting (PPMI) on the same pairs: {ppmi['standalone']['rho']:+.2f}"
                + ("" if standalone is None else f" and {ppmi['single']['rho']:+.2f}"))
    sl = numbers["sets"]["simlex999"]["input"]["standalone"]
    how += f"; SimLex-999: ρ {sl['rho']:+.2f} over {sl['n']} pairs (null spread ±{sl['null']:.2f})"
    apart = {s: numbers["sets"][s]["input"]["pieces"] for s in PAIR_SETS}
    how += "; apart, pairs with a word of several tokens: " + ", ".join(
        f"{name} ρ {apart[s]['rho']:+.2f} over {apart[s]['n']}" if apart[s]["n"] > 2 else f"{name} {apart[s]['n']}"
        for s, name in (("wordsim353", "WordSim"), ("simlex999", "SimLex")))
    blocks = _pieces_from_blocks(inp, index)
    if blocks is not None:
        numbers["blocks"] = blocks
        how += (f"; the same kind of pairs on block {blocks['block']}'s word vectors, which see such a word whole "
                f"(each word's mean over up to {blocks['max_uses']} uses in the training text; pairs whose words both "
                f"have at least {blocks['min_uses']} uses): " + ", ".join(
                    f"{name} ρ {blocks['sets'][s]['blocks']['rho']:+.2f} against the pieces' mean rows "
                    f"{blocks['sets'][s]['input']['rho']:+.2f} over {blocks['sets'][s]['blocks']['n']}"
                    for s, name in (("wordsim353", "WordSim"), ("simlex999", "SimLex"))))
    if not alone["n"] > 2 or not math.isfinite(alone["rho"]):
        return Step("scores", claim, how, CANNOT, "too few pairs of single-token words to rank", numbers)
    if alone["rho"] <= 2 * alone["null"]:
        return Step("scores", claim, how, FAILS, "ρ is inside twice the spread of a table that knows nothing", numbers)
    notes = []
    if standalone is None:
        notes.append(f"usage unknown ({inp.usage_note}): every single-token pair counts")
    elif head["rho"] <= 2 * head["null"]:
        notes.append("over all single-token pairs ρ is inside the null spread: tokens that mostly begin longer words "
                     "(␣cat in cats, category) learn those words")
    if ppmi and ppmi["standalone"]["rho"] > alone["rho"]:
        notes.append("counting co-occurrences ranks the same pairs better")
    return Step("scores", claim, how, CAVEAT if notes else HOLDS, "; ".join(notes), numbers)


def step_dot(inp: Inputs) -> Step:
    claim = "The dot product measures closeness: u·v = ‖u‖‖v‖cos θ."
    m = table(inp.model, "input")
    words = _words(inp.tokenizer, ("cat", "dog"))
    u, v = m[words["cat"]].mean(axis=0), m[words["dog"]].mean(axis=0)
    nu, nv = float(np.linalg.norm(u)), float(np.linalg.norm(v))
    if not nu or not nv:
        return Step("dot", claim, "u·v against ‖u‖‖v‖cos θ for cat and dog", CANNOT, "a row is zero: it has no angle")
    uu, vv = u / nu, v / nv
    theta = 2 * math.atan2(float(np.linalg.norm(uu - vv)), float(np.linalg.norm(uu + vv)))  # no dot product in it
    dot, product = float(u @ v), nu * nv * math.cos(theta)
    numbers = {"dot": dot, "norm_u": nu, "norm_v": nv, "theta_deg": math.degrees(theta), "product": product,
               "difference": abs(dot - product)}
    how = (f"cat and dog on the input table: u·v = {dot:+.6f}; ‖u‖ {nu:.4f} × ‖v‖ {nv:.4f} × cos {math.degrees(theta):.2f}° "
           f"= {product:+.6f} (θ from the unit vectors' chord, not from the dot product)")
    ok = abs(dot - product) <= 1e-9 * max(1.0, nu * nv)
    return Step("dot", claim, how, HOLDS if ok else FAILS, "" if ok else "the two differ beyond rounding", numbers)


def _block_input(model, ids: list[int]) -> torch.Tensor:
    return model.trace(torch.tensor([ids]), keep=("input",), blocks=1)["input"][0][0].double()


def step_positions(inp: Inputs) -> Step:
    claim = "A second learned table adds each position: x_t = wte[id_t] + wpe[t] enters block 1, so word order changes x."
    model, tok = inp.model, inp.tokenizer
    if not len(model.h):
        return Step("positions", claim, "the input of block 1", CANNOT, "the model has no blocks")
    a, b = PROMPT, "the cat chased the dog"
    ids_a, ids_b = tok.encode(a), tok.encode(b)
    x = _block_input(model, ids_a)
    parts = forward_matrix(model, ids_a)
    expected = torch.from_numpy(parts["token_part"] + parts["position_part"])
    gap = float((x - expected).abs().max())
    xb = _block_input(model, ids_b)
    dog = tok.encode(" dog", bos=False)[-1]
    pa, pb = ids_a.index(dog), ids_b.index(dog)
    moved = float((x[pa] - xb[pb]).norm())
    numbers = {"prompt": a, "tokens": len(ids_a), "max_difference": gap, "order": {"other": b, "token": _label(tok, [dog]),
               "positions": [pa, pb], "x_difference": moved}, "pos": model.config.pos}
    how = (f"the input of block 1 on “{a}” ({len(ids_a)} tokens) against wte[ids] + wpe[0:{len(ids_a)}]: largest "
           f"difference {gap:.2g}; {_label(tok, [dog])} at position {pa} and, in “{b}”, at {pb}: x differs by {moved:.4f}")
    if gap > 1e-5:
        return Step("positions", claim, how, FAILS, "the input of block 1 is not the sum of the two rows", numbers)
    pos = model.config.pos
    if pos in ("rope", "none"):
        where = "inside attention, by rotating queries and keys" if pos == "rope" else "nowhere but in the causal mask"
        return Step("positions", claim, how, FAILS, f"this model has no position table: x_t = wte[id_t], and order enters {where}",
                    numbers)
    if moved == 0:
        return Step("positions", claim, how, FAILS, "the same token at two positions enters block 1 the same", numbers)
    if pos == "sinusoidal":
        return Step("positions", claim, how, CAVEAT, "this model's position table is fixed sinusoids, not learned", numbers)
    return Step("positions", claim, how, HOLDS, "", numbers)


def step_untied(inp: Inputs) -> Step:
    claim = "The output head is its own table: input and output embeddings are untied."
    model = inp.model
    w, h = model.wte.weight, model.lm_head.weight
    shared = w.data_ptr() == h.data_ptr()
    words = _words(inp.tokenizer, ("cat",))["cat"]
    cos = vector_stats(table(model, "input")[words].mean(axis=0), table(model, "output")[words].mean(axis=0))["cos"]
    numbers = {"shared_storage": shared, "equal": bool(torch.equal(w, h)) if w.shape == h.shape else False, "cat_cos": cos}
    how = f"wte and lm_head are {'one tensor' if shared else 'two tensors'}; cat's input row and output row: cos {cos:+.3f}"
    if shared or numbers["equal"]:
        return Step("untied", claim, how, FAILS, "the head reuses the input table", numbers)
    return Step("untied", claim, how, HOLDS, "", numbers)


STEPS = (step_lookup, step_tables, step_init, step_sparse, step_pairs, step_scores, step_dot, step_positions, step_untied)


# ---------------------------------------------------------------- the inputs and the report


def load_inputs(checkpoint, ppmi: bool = True, sets=None, log=None) -> Inputs:
    """The model of a checkpoint file or run folder, with what its run folder knows."""

    model, tokenizer, _ = load_model(checkpoint)
    if tokenizer is None:
        raise AndreaError(f"{checkpoint} holds no tokenizer: the lesson looks words up with the run's own.")
    return inputs_for(model.eval(), tokenizer, str(checkpoint), checkpoint, ppmi, sets, log)


def inputs_for(model, tokenizer, name: str, checkpoint, ppmi: bool = True, sets=None, log=None) -> Inputs:
    """A loaded model's inputs to the lesson; `checkpoint` (a file or run folder, or None for a
    fresh model) says where its snapshots and training data are."""
    inp = Inputs(model, tokenizer, name, sets=sets if sets is not None else try_load_wordsets(log), ppmi=ppmi, log=log)
    if checkpoint is None:
        inp.timeline_note = inp.usage_note = "a fresh model has no run"
        return inp
    path = Path(checkpoint)
    run = path if path.is_dir() else path.parent
    if snapshot_steps(run):
        try:
            inp.timeline = Timeline(run, tokenizer)
        except AndreaError as e:  # snapshots, but none the timeline can use: the steps that need them say why
            inp.timeline_note = str(e).rstrip(".")
    else:
        inp.timeline_note = f"{run} holds no embedding snapshots (train with snapshots on, the default, to keep them)"
    _attach_data(inp, checkpoint, log)
    inp.score_tables = {"input": centred(table(model, "input"))}
    if inp.ppmi and inp.data is not None and inp.sets is not None:
        if log:
            log("counting co-occurrences in the training text for the PPMI reference")
        vectors = ppmi_vectors(train_token_chunks(inp.data), model.config.vocab_size, model.config.n_embd)
        inp.score_tables["ppmi"] = centred(vectors)
    return inp


def _attach_data(inp: Inputs, checkpoint, log) -> None:
    """The run's training data and how its tokens are used (andrea.usage), or the note saying why not."""
    inp.data, inp.usage_note = run_data(checkpoint, inp.tokenizer)
    if inp.data is None:
        return
    try:
        inp.usage = data_usage(inp.data, inp.tokenizer, log=log)
    except AndreaError as e:
        inp.data, inp.usage_note = None, str(e).rstrip(".")


def lesson(inp: Inputs) -> list[Step]:
    """Every step of the lesson on these inputs, in order."""
    return [step(inp) for step in STEPS]


def to_json(inp: Inputs, steps: list[Step]) -> dict:
    return report_json("embedding", inp.name, inp.model, steps, left_out(inp))


def left_out(inp: Inputs) -> list[str]:
    """The run's snapshots the lesson left out, each with why (`andrea.snapshots.timeline.Timeline`)."""
    return list(inp.timeline.notes) if inp.timeline is not None else []


def to_text(inp: Inputs, steps: list[Step]) -> str:
    cfg = inp.model.config
    return report_text(f"The lesson on {inp.name} (V {cfg.vocab_size:,}, d {cfg.n_embd}, {cfg.n_layer} layers)", steps,
                       left_out(inp))
