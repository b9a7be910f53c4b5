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

One token, the words it begins: a token such as `␣cat` of a tokenizer that marks only where a word
begins (version 4 and earlier) is the first piece of cat, cats, category, catholic, … Its row is
the same in all of them, and a causal model cannot see at `␣cat` how the word goes on; the blocks
see the words before it. `split_states` takes the token's uses in the training text, names each by
the word it began (the text from the token to the next token that starts a word, at most
MAX_PIECES tokens), keeps the commonest SPLIT_WORDS words with at least SPLIT_USES uses and draws
SPLIT_USES uses of each (seeded), and reads the residual stream at the token itself (a window of
CONTEXT tokens ending there) at the input and after every block. Per layer:

    between   the share of the states' spread (sum of squared distances to their mean) that lies
              between the words' means: 0 where every use has the same vector (the input row),
              1 where the words' uses do not vary within a word; words given at random would
              score (K − 1)/(n − 1) on average for K words and n uses (`null`)
    accuracy  leave-one-out nearest mean (Euclidean): the share of uses whose own word's mean,
              left out, is the nearest; chance 1/K
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import numpy as np
import torch

from andrea.errors import AndreaError
from andrea.inside.vectors import cosine
from andrea.inside.wordsim import PAIR_SETS, centred, rho_with_null
from andrea.usage import starts_word

USES = 16  # uses of a word averaged (the held-out text is too small: cat occurs 15 times there)
CONTEXT = 32  # tokens in each window, ending at the word's last token
MIN_USES = 4  # a word with fewer uses in the training text is left out of the scores
BATCH = 128
SPLIT_USES = 32  # uses drawn per word when one token's uses are grouped by the word each began
SPLIT_WORDS = 6  # the commonest words kept
MAX_PIECES = 16  # a word running on longer than this many tokens is left out


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
def last_states(model, windows: torch.Tensor, inputs: bool = False) -> torch.Tensor:
    """(L, n, d): the residual stream after each block at each window's last position; with
    inputs, (L + 1, n, d), what enters block 1 first."""
    trace = model.trace(windows.to(model.wte.weight.device), at=-1)
    return torch.stack([s.double().cpu() for s in (trace.stream() if inputs else trace["output"])])


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


def begun_words(shards: list[np.ndarray], token: int, starts: np.ndarray, decode, context: int = CONTEXT
                ) -> dict[str, list[tuple[int, int]]]:
    """word: every use (shard, position) of `token` that begins it and has context − 1 tokens before
    it; the word is decode(the token and those after it up to the next that starts a word, `starts`
    (V,) bool), stripped of the space before it. A word cut by the shard's end is left out."""
    found: dict[str, list[tuple[int, int]]] = {}
    for k, shard in enumerate(shards):
        tokens = np.asarray(shard)
        for p in np.flatnonzero(tokens == token):
            p = int(p)
            if p < context - 1:
                continue
            q = p + 1
            while q < len(tokens) and q - p <= MAX_PIECES and not starts[tokens[q]]:
                q += 1
            if q >= len(tokens) or q - p > MAX_PIECES:
                continue
            word = decode([int(t) for t in tokens[p:q]]).strip()
            found.setdefault(word, []).append((k, p))
    return found


def separation(states: np.ndarray, labels: np.ndarray) -> list[dict]:
    """Per layer of states (layers, n, d): "between", the share of the spread between the labels'
    means, and "accuracy", leave-one-out nearest mean (module docstring); labels (n,) ints 0..K−1,
    each used at least twice."""
    labels = np.asarray(labels)
    K, n = int(labels.max()) + 1, len(labels)
    counts = np.bincount(labels, minlength=K).astype(np.float64)
    out = []
    for x in np.asarray(states, dtype=np.float64):
        means = np.stack([x[labels == g].mean(axis=0) for g in range(K)])
        total = float(((x - x.mean(axis=0)) ** 2).sum())
        between = float((counts[:, None] * (means - x.mean(axis=0)) ** 2).sum())
        scale = float((x ** 2).sum()) or 1.0
        if total <= 1e-12 * scale:  # one vector for every use: nothing tells the words apart
            out.append({"between": 0.0, "accuracy": 1.0 / K})
            continue
        dist = ((x[:, None, :] - means[None]) ** 2).sum(axis=2)  # (n, K)
        own = counts[labels]
        # the distance to one's own word's mean with oneself left out: the mean moves away by 1/(m − 1)
        dist[np.arange(n), labels] *= (own / (own - 1)) ** 2
        out.append({"between": between / total, "accuracy": float((dist.argmin(axis=1) == labels).mean())})
    return out


@torch.no_grad()
def split_states(model, tokenizer, data, token: str, per_word: int = SPLIT_USES, words: int = SPLIT_WORDS,
                 context: int = CONTEXT, seed: int = 0, log=None) -> dict:
    """One token's uses in `data`'s training text grouped by the word each began, and how far the
    input row and each block's output at the token tell the words apart (module docstring)."""
    from andrea.usage import starts_word

    ids = tokenizer.encode(token, bos=False)
    if len(ids) != 1:
        raise AndreaError(f"{token!r} is {len(ids)} tokens of this tokenizer, not one.")
    if per_word < 2 or words < 2:
        raise AndreaError(f"grouping needs at least 2 uses of at least 2 words; got {per_word} and {words}.")
    if data.vocab_size != model.config.vocab_size:
        raise AndreaError(f"the shards in {data.dir} have V = {data.vocab_size:,}, the model {model.config.vocab_size:,}.")
    context = min(context, model.config.block_size)
    shards = _shards(data)
    found = begun_words(shards, ids[0], starts_word(tokenizer), tokenizer.decode, context)
    ranked = sorted(found.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    kept = [(w, uses) for w, uses in ranked if len(uses) >= per_word][:words]
    out = {"token": token, "id": ids[0], "uses": sum(len(u) for u in found.values()), "context": context,
           "per_word": per_word, "found": [{"word": w, "uses": len(u)} for w, u in ranked[:12]],
           "words": [w for w, _ in kept]}
    if len(kept) < 2:
        raise AndreaError(f"{token!r} begins {len(kept)} word(s) with at least {per_word} uses in the training text "
                          f"({len(found)} words in all): nothing to tell apart.")
    picks, labels = [], []
    for g, (w, uses) in enumerate(kept):
        rng = np.random.default_rng([seed, zlib.crc32(w.encode("utf-8"))])
        picks += [uses[i] for i in sorted(rng.choice(len(uses), size=per_word, replace=False))]
        labels += [g] * per_word
    if log:
        log(f"{token!r}: {out['uses']:,} uses beginning {len(found):,} words; {per_word} uses each of {len(kept)}")
    layers = []
    for s in range(0, len(picks), BATCH):
        windows = torch.from_numpy(np.stack([np.asarray(shards[k][p - context + 1 : p + 1], dtype=np.int64)
                                             for k, p in picks[s : s + BATCH]]))
        layers.append(last_states(model, windows, inputs=True).numpy())
    states = np.concatenate(layers, axis=1)
    names = ["input"] + [f"block {i + 1}" for i in range(model.config.n_layer)]
    n, K = len(labels), len(kept)
    out["layers"] = [{"layer": name, **r} for name, r in zip(names, separation(states, np.array(labels)))]
    out["null"] = (K - 1) / (n - 1)
    out["chance"] = 1 / K
    return out


def _rows_mean(table: np.ndarray, ids: list[int]) -> np.ndarray:
    return table[ids].mean(axis=0)


def _rho(vectors: dict[str, np.ndarray], pairs) -> dict:
    return rho_with_null([cosine(vectors[a], vectors[b]) for a, b, _ in pairs], [r for _, _, r in pairs])


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
    from andrea.inside.wordsim import model_tables, ppmi_vectors, train_token_chunks

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
