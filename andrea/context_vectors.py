"""Word vectors from the blocks: a word's hidden state after each block, averaged over its uses.

A token's row in the input table is fixed: `␣cat` enters block 1 the same in "my cat" and in a word
that goes on. The blocks see the context. For a word (its word-initial form, `tokenizer.word_ids`):

    uses      where its tokens occur in the run's training text, followed by a token that starts a
              new word (andrea.usage.starts_word), with CONTEXT − 1 tokens before them in the same
              shard; up to USES of them, drawn at random (seeded) from all such
    vector    the residual stream after block l at the word's last token, in a window of CONTEXT
              tokens that ends there, averaged over the uses: one (d,) vector per block
    centred   minus the mean over the scored words' vectors, block by block

A word of several tokens (xylophone) gets a vector the same way: the hidden state at its last
token, which has seen the others. `layer_scores` ranks WordSim-353 and SimLex-999 pairs by cos θ of
these vectors, block by block, beside the input table, the output head and PPMI counts (each a
word's token rows' mean, the table centred on its mean row first), on the same pairs: those whose
two words have at least MIN_USES uses. Each ρ comes with its n and null spread 1/√(n − 1).
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import numpy as np
import torch

from andrea.errors import AndreaError
from andrea.usage import starts_word
from andrea.wordsim import PAIR_SETS, centred, spearman

USES = 16  # uses of a word averaged (the held-out text is too small: cat occurs 15 times there)
CONTEXT = 32  # tokens in each window, ending at the word's last token
MIN_USES = 4  # a word with fewer uses in the training text is left out of the scores
BATCH = 128


@dataclass
class BlockVectors:
    """vectors[l, i]: word i's mean hidden state after block l + 1 (raw); uses[i]: how many uses."""

    words: list[str]
    vectors: np.ndarray  # (L, n_words, d) float64
    uses: np.ndarray  # (n_words,) int
    context: int
    max_uses: int

    def row(self, word: str) -> int:
        return self.words.index(word)


def _shards(data) -> list[np.ndarray]:
    return [shard for source in data.sources.values() for shard in source.train.shards]


def find_uses(shards: list[np.ndarray], words: dict[str, list[int]], ends: np.ndarray, context: int = CONTEXT,
              limit: int = USES, seed: int = 0) -> dict[str, list[tuple[int, int]]]:
    """word: up to `limit` (shard, position of its last token), drawn at random (seeded by seed and
    the word) from every use
    whose next token ends the word (`ends`, (V,) bool) and that has context − 1 tokens before it."""
    found: dict[str, list[tuple[int, int]]] = {w: [] for w in words}
    for k, shard in enumerate(shards):
        tokens = np.asarray(shard)
        order = np.argsort(tokens, kind="stable")
        sorted_tokens = tokens[order]
        for w, ids in words.items():
            lo, hi = np.searchsorted(sorted_tokens, [ids[0], ids[0] + 1])
            start = order[lo:hi]
            last = start + len(ids) - 1
            ok = (start >= context - len(ids)) & (last + 1 < len(tokens))
            start, last = start[ok], last[ok]
            for j, i in enumerate(ids[1:], 1):
                keep = tokens[start + j] == i
                start, last = start[keep], last[keep]
            last = last[ends[tokens[last + 1]]]
            found[w] += [(k, int(p)) for p in last]
    for w, uses in found.items():
        if len(uses) > limit:  # each word's own draw: the same whichever other words are asked for
            rng = np.random.default_rng([seed, zlib.crc32(w.encode("utf-8"))])
            found[w] = [uses[i] for i in sorted(rng.choice(len(uses), size=limit, replace=False))]
    return found


@torch.no_grad()
def last_states(model, windows: torch.Tensor) -> torch.Tensor:
    """(L, n, d): the residual stream after each block at each window's last position."""
    x = model.embed(windows.to(model.wte.weight.device))
    out = []
    for block in model.h:
        x = block(x, model.rope)
        out.append(x[:, -1].double().cpu())
    return torch.stack(out)


def block_vectors(model, tokenizer, data, words, uses: int = USES, context: int = CONTEXT, seed: int = 0,
                  log=None) -> BlockVectors:
    """Each word's mean hidden state after every block over up to `uses` uses in the training text."""
    if context > model.config.block_size:
        raise AndreaError(f"a window of {context} tokens does not fit the model's context of {model.config.block_size}.")
    words = sorted(set(words))
    ids = {w: tokenizer.word_ids(w) for w in words}
    ids = {w: t for w, t in ids.items() if 0 < len(t) <= context}
    shards = _shards(data)
    if log:
        log(f"finding up to {uses} uses of {len(ids):,} words in {sum(len(s) for s in shards):,} training tokens")
    found = find_uses(shards, ids, starts_word(tokenizer), context, uses, seed)
    jobs = [(i, k, p) for i, w in enumerate(words) for k, p in found.get(w, [])]
    L, d = model.config.n_layer, model.config.n_embd
    sums = np.zeros((L, len(words), d))
    counts = np.zeros(len(words), dtype=np.int64)
    for s in range(0, len(jobs), BATCH):
        part = jobs[s : s + BATCH]
        windows = torch.from_numpy(np.stack([np.asarray(shards[k][p - context + 1 : p + 1], dtype=np.int64)
                                             for _, k, p in part]))
        states = last_states(model, windows).numpy()
        for j, (i, _, _) in enumerate(part):
            sums[:, i] += states[:, j]
            counts[i] += 1
        if log and (s // BATCH) % 20 == 0:
            log(f"block vectors: {min(s + BATCH, len(jobs)):,} of {len(jobs):,} windows")
    vectors = sums / np.maximum(counts, 1)[None, :, None]
    return BlockVectors(words, vectors, counts, context, uses)


def mean_state(model, data, windows: int = 256, context: int = CONTEXT, seed: int = 0) -> np.ndarray:
    """(L, d): the mean hidden state after each block at the last position of `windows` random
    windows of the training text: what a few words' vectors are centred on, where there are too
    few of them to centre on their own mean."""
    shards = [s for s in _shards(data) if len(s) >= context]
    if not shards:
        raise AndreaError(f"no training shard holds a window of {context} tokens.")
    rng = np.random.default_rng(seed)
    picks = [(int(k), int(rng.integers(0, len(shards[k]) - context + 1))) for k in rng.integers(0, len(shards), windows)]
    states = []
    for s in range(0, len(picks), BATCH):
        batch = np.stack([np.asarray(shards[k][p : p + context], dtype=np.int64) for k, p in picks[s : s + BATCH]])
        states.append(last_states(model, torch.from_numpy(batch)).numpy())
    return np.concatenate(states, axis=1).mean(axis=1)


def _rows_mean(table: np.ndarray, ids: list[int]) -> np.ndarray:
    return table[ids].mean(axis=0)


def _rho(vectors: dict[str, np.ndarray], pairs) -> dict:
    cos, ratings = [], []
    for a, b, r in pairs:
        u, v = vectors[a], vectors[b]
        nu, nv = np.linalg.norm(u), np.linalg.norm(v)
        cos.append(float(u @ v / (nu * nv)) if nu and nv else float("nan"))
        ratings.append(r)
    n = len(cos)
    return {"rho": spearman(cos, ratings), "n": n, "null": 1 / math.sqrt(n - 1) if n > 1 else float("nan")}


def layer_scores(bv: BlockVectors, tokenizer, sets, tables: dict[str, np.ndarray], min_uses: int = MIN_USES) -> dict:
    """Per set: the pairs whose two words have ≥ min_uses uses, and ρ over them of every block's
    centred vectors and of each table in `tables` (name: (V, d), e.g. input, output, ppmi), a word
    being the mean of its token rows of the centred table."""
    live = [w for w, n in zip(bv.words, bv.uses) if n >= min_uses]
    rows = [bv.row(w) for w in live]
    out = {"words": len(live), "min_uses": min_uses, "uses": bv.max_uses, "context": bv.context, "sets": {}}
    layer_vecs = []
    for layer in range(bv.vectors.shape[0]):
        m = centred(bv.vectors[layer, rows])
        layer_vecs.append({w: m[j] for j, w in enumerate(live)})
    table_vecs = {}
    for name, table in tables.items():
        c = centred(np.asarray(table, dtype=np.float64))
        table_vecs[name] = {w: _rows_mean(c, tokenizer.word_ids(w)) for w in live}
    alive = set(live)
    for s in PAIR_SETS:
        pairs = [(a, b, r) for a, b, r in sets.pairs[s] if a in alive and b in alive]
        scores = {f"block {layer + 1}": _rho(v, pairs) for layer, v in enumerate(layer_vecs)}
        scores.update({name: _rho(v, pairs) for name, v in table_vecs.items()})
        several = sum(len(tokenizer.word_ids(a)) > 1 or len(tokenizer.word_ids(b)) > 1 for a, b, _ in pairs)
        out["sets"][s] = {"pairs": len(pairs), "of": len(sets.pairs[s]), "with_several_tokens": several, "scores": scores}
    return out


def score_layers(model, tokenizer, data, sets, uses: int = USES, context: int = CONTEXT, ppmi: bool = False,
                 log=None) -> dict:
    """`layer_scores` of every WordSim-353 and SimLex-999 word's block vectors (up to `uses` uses,
    windows of `context` tokens, at most the model's own) in `data`, beside the model's input table
    and head and, with ppmi, PPMI counts of the same training text; "blocks" says how many there are."""
    from andrea.wordsim import model_tables, ppmi_vectors, train_token_chunks

    V, d = model.config.vocab_size, model.config.n_embd
    if data.vocab_size != V:
        raise AndreaError(f"the shards in {data.dir} have V = {data.vocab_size:,}, the model {V:,}.")
    words = {w for pairs in sets.pairs.values() for a, b, _ in pairs for w in (a, b)}
    bv = block_vectors(model, tokenizer, data, words, uses, min(context, model.config.block_size), log=log)
    tables = model_tables(model)
    if ppmi:
        if log:
            log("counting the training text's co-occurrences for the PPMI reference")
        tables["ppmi"] = ppmi_vectors(train_token_chunks(data), V, d)
    return {**layer_scores(bv, tokenizer, sets, tables), "blocks": model.config.n_layer}


def best_layer(scores: dict, set_name: str) -> tuple[str, float]:
    """The block whose vectors rank the set's pairs best: (name, ρ)."""
    blocks = {k: v["rho"] for k, v in scores["sets"][set_name]["scores"].items() if k.startswith("block")}
    name = max(blocks, key=lambda k: -math.inf if not math.isfinite(blocks[k]) else blocks[k])
    return name, blocks[name]
