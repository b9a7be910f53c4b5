"""How each token is used in the training text: counts, the share of uses that stand alone, and
what follows when it does not.

A row of the embedding table learns what its token does in use. `␣cat` is the word cat only when
the next token starts a new word; in "cats", "category" or "catholic" it is the first piece of a
longer word, and its row learns those continuations too. So a token is judged here by its uses
in a prepared data folder's training shards (every source, in shard order):

- `count[i]`: how often token i occurs;
- `alone[i]`: the uses where it stands alone, i.e. the next token starts a new word: BOS, the end
  of the source's text, or a token whose first character is not a letter or digit (a space,
  punctuation, an apostrophe, a line break); a next token that begins with a letter, a digit or a
  UTF-8 byte of a character under way continues the word;
- `continuations[i]`: the commonest next tokens of the uses that do not stand alone, with counts.

`standalone_words(min_share, min_count)` is the whole-word filter the embedding tools use where the
training data is known: tokens that mostly stand alone (STANDALONE, 80% of their uses) and were
seen often enough (MIN_USES, 20) for their rows to have learned something.

The figures are computed once per data folder (a few seconds per 10 million tokens) and kept
beside its manifest in `usage.npz`, tagged with the manifest's SHA-256 and the fingerprint of the
tokenizer that read its tokens, so a folder prepared again is counted again and a lookup
afterwards costs nothing.

What is read back is checked, not believed: the tag is no secret, so `usage.npz` is read through
`andrea.files.read_npz` (every array's dtype and shape, known from V, checked from its header
before its data is read) and its figures must be consistent (counts non-negative and below 2^53,
no more standalone uses or continuations than uses, continuation ids below V and in -1's place only
after the last one); a file that is not is counted again and rewritten. The counting itself reads
only shards `andrea.shards.verify_shards` passes (ids below V, SHA-256 as recorded), and only
with the tokenizer the folder was prepared with: a tokenizer of another fingerprint, even of the
same V, would judge words by other pieces, so it is refused in one sentence. A kill during the
write leaves a temporary file, removed by the next write.
"""

from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from andrea.errors import AndreaError
from andrea.files import atomic_write_bytes, check_regular, read_json, read_npz, remove_dead_temps
from andrea.shards import TokenData, open_token_data, verify_shards
from andrea.validate import Shape

USAGE_FILE = "usage.npz"
USAGE_VERSION = 2
TOP = 8  # continuations kept per token
STANDALONE = 0.8  # a token "stands alone" when it does in at least this share of its uses ...
MIN_USES = 20  # ... and was seen at least this often
STANDALONE_RULE = f"standing alone in at least {STANDALONE:.0%} of at least {MIN_USES} uses"
CHUNK = 4_000_000  # tokens read from a shard at a time


def starts_word(tokenizer) -> np.ndarray:
    """(V,) bool: whether a token, coming next, starts a new word (see the module docstring)."""
    out = np.ones(tokenizer.vocab_size, dtype=bool)
    for i in range(tokenizer.vocab_size):
        raw = tokenizer.token_bytes(i)
        if not raw:  # BOS
            continue
        if 0x80 <= raw[0] < 0xC0:  # a character under way
            out[i] = False
            continue
        text = raw.decode("utf-8", "ignore")
        # a lead byte whose character is cut off is a letter more often than not (é, ß, я)
        out[i] = not (text[0].isalnum() if text else raw[0] >= 0xC0)
    return out


@dataclass
class Usage:
    """The usage figures of one vocabulary: count, alone, and continuation ids and counts
    ((V, TOP), -1 and 0 where a token has fewer)."""

    count: np.ndarray
    alone: np.ndarray
    next_ids: np.ndarray
    next_counts: np.ndarray

    @property
    def vocab_size(self) -> int:
        return len(self.count)

    def share(self, i: int) -> float | None:
        """The share of token i's uses that stand alone; None when it was never seen."""
        n = int(self.count[i])
        return int(self.alone[i]) / n if n else None

    def shares(self) -> np.ndarray:
        """(V,) standalone shares, NaN for tokens never seen."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.count > 0, self.alone / np.maximum(self.count, 1), np.nan)

    def standalone_words(self, min_share: float = STANDALONE, min_count: int = MIN_USES) -> np.ndarray:
        """(V,) bool: tokens seen at least min_count times that stand alone in at least min_share
        of their uses."""
        return (self.count >= min_count) & (self.alone >= min_share * self.count)

    def continuations(self, i: int) -> list[tuple[int, int]]:
        """[(next id, count)] of token i's commonest continuations, commonest first."""
        return [(int(a), int(c)) for a, c in zip(self.next_ids[i], self.next_counts[i]) if a >= 0]

    def record(self, i: int, label=None, top: int = 5) -> dict:
        """What the lab and `andrea embed` show for token i; `label(id)` names the continuations."""
        n = int(self.count[i])
        cont = self.continuations(i)[:top]
        out = {"count": n, "alone": int(self.alone[i]), "standalone_share": self.share(i),
               "continuations": [{"id": a, "count": c, "share": c / n} for a, c in cont]}
        if label is not None:
            for c in out["continuations"]:
                c["piece"] = label(c["id"])
        return out

    def sentence(self, i: int, label) -> str:
        """One line: '␣cat stands alone in 35% of its 830 uses (its purity); it also begins ␣cat+s (16%), …';
        `label(id)` names a token."""
        piece = label(i)
        n = int(self.count[i])
        if not n:
            return f"{piece} does not occur in the training text."
        line = f"{piece} stands alone in {self.share(i):.0%} of its {n:,} uses (its purity)"
        cont = self.continuations(i)[:5]
        if cont:
            parts = ", ".join(f"{piece}+{label(a)} ({c / n:.0%})" for a, c in cont)
            line += f"; it also begins {parts}"
        return line + "."


def count_usage(chunks, vocab_size: int, starts: np.ndarray, top: int = TOP) -> Usage:
    """Usage of token streams: `chunks` yields lists of consecutive arrays of one text each (a
    source's shards in order); the last token of each text stands alone."""
    if len(starts) != vocab_size:
        raise AndreaError(f"the word-start table has {len(starts)} entries for a vocabulary of {vocab_size}.")
    count = np.zeros(vocab_size, dtype=np.int64)
    alone = np.zeros(vocab_size, dtype=np.int64)
    keys, weights = [], []
    for text in chunks:
        prev = None
        for part in text:
            part = np.asarray(part, dtype=np.int64)
            if not len(part):
                continue
            if prev is not None:
                part = np.concatenate(([prev], part))
            else:
                count += np.bincount(part[:1], minlength=vocab_size)
            count += np.bincount(part[1:], minlength=vocab_size)
            cur, nxt = part[:-1], part[1:]
            ends = starts[nxt]
            alone += np.bincount(cur[ends], minlength=vocab_size)
            k, c = np.unique(cur[~ends] * vocab_size + nxt[~ends], return_counts=True)
            keys.append(k)
            weights.append(c)
            prev = part[-1]
        if prev is not None:
            alone[prev] += 1
    next_ids = np.full((vocab_size, top), -1, dtype=np.int32)
    next_counts = np.zeros((vocab_size, top), dtype=np.int64)
    if keys:
        k, inverse = np.unique(np.concatenate(keys), return_inverse=True)
        c = np.bincount(inverse, weights=np.concatenate(weights)).astype(np.int64)
        cur, nxt = k // vocab_size, k % vocab_size
        order = np.lexsort((nxt, -c, cur))  # by token, commonest first, ties by id
        cur, nxt, c = cur[order], nxt[order], c[order]
        first = np.searchsorted(cur, cur)  # where each token's run begins
        rank = np.arange(len(cur)) - first
        keep = rank < top
        next_ids[cur[keep], rank[keep]] = nxt[keep]
        next_counts[cur[keep], rank[keep]] = c[keep]
    return Usage(count, alone, next_ids, next_counts)


def _texts(data):
    """Each source's training shards as one text, read in chunks."""
    for source in data.sources.values():
        yield (np.asarray(shard[s : s + CHUNK]) for shard in source.train.shards for s in range(0, len(shard), CHUNK))


def _manifest_tag(data_dir: Path) -> str:
    return hashlib.sha256(check_regular(data_dir / "manifest.json", "manifest").read_bytes()).hexdigest()


def _members(vocab_size: int) -> dict:
    return {"meta": ("str", (3,)), "count": ("int64", (vocab_size,)), "alone": ("int64", (vocab_size,)),
            "next_ids": ("int32", (vocab_size, TOP)), "next_counts": ("int64", (vocab_size, TOP))}


def _read(path: Path, tag: str, tokenizer_fp: str, vocab_size: int) -> Usage | None:
    """The kept figures, or None where there are none, or they are stale, damaged or inconsistent."""
    if not path.exists() and not path.is_symlink():
        return None
    try:
        arrays = read_npz(path, _members(vocab_size), "usage file")
    except AndreaError:
        return None
    meta = arrays.pop("meta")
    if [str(m) for m in meta] != [str(USAGE_VERSION), tag, tokenizer_fp]:
        return None
    usage = Usage(**arrays)
    return usage if _consistent(usage) else None


def _consistent(u: Usage) -> bool:
    """Whether figures could have come from counting: see the module docstring. Every figure is
    first bounded below 2^53 (more uses than any data folder holds), so a row's TOP continuations
    sum to less than 2^56 and the int64 arithmetic after cannot overflow."""
    limit = 1 << 53
    if (u.count < 0).any() or (u.count >= limit).any() or (u.alone < 0).any() or (u.alone > u.count).any():
        return False
    ids, counts = u.next_ids, u.next_counts
    if (ids < -1).any() or (ids >= u.vocab_size).any() or (counts < 0).any() or (counts >= limit).any() \
            or ((ids < 0) != (counts == 0)).any():
        return False
    if (ids[:, 1:] >= 0).any() and ((ids[:, 1:] >= 0) & (ids[:, :-1] < 0)).any():
        return False  # a continuation after an empty place
    return bool((counts.sum(axis=1) <= u.count - u.alone).all())


def run_data(checkpoint, tokenizer=None) -> tuple[TokenData | None, str]:
    """The prepared data folder a run trained on (its train.json names it), opened through the one
    gate (`andrea.shards.open_token_data`: the model's tokenizer by fingerprint, ids below V), or
    None and the reason it is not known: a fresh model, a bare model file, data that is gone,
    damaged or prepared with another tokenizer."""
    if checkpoint is None:
        return None, "a fresh model has no training data"
    path = Path(checkpoint)
    run = path if path.is_dir() else path.parent
    cfg = run / "train.json"
    if not cfg.is_file():
        return None, f"{run} has no train.json naming the training data"
    try:
        data_dir = read_json(cfg, "train.json", shape=Shape.record(data=Shape.text()))["data"]
        if not Path(data_dir).is_dir():
            return None, f"the training data named in {cfg} ({str(data_dir)[:200]!r}) is not here"
        return open_token_data(data_dir, tokenizer), ""
    except AndreaError as e:
        return None, str(e).rstrip(".")


def run_usage(checkpoint, tokenizer=None, log=None) -> tuple[Usage | None, str]:
    """The usage figures of the data a run trained on (`run_data`), or None and why not."""
    data, why = run_data(checkpoint, tokenizer)
    if data is None:
        return None, why
    try:
        return data_usage(data, tokenizer, log=log), ""
    except AndreaError as e:
        return None, str(e).rstrip(".")


def data_usage(data, tokenizer=None, log=None) -> Usage:
    """The usage figures of a prepared data folder (`andrea.shards.TokenData`): read from its
    usage.npz when that matches the manifest and passes every check, else counted and kept there
    (written atomically; a folder that cannot be written to still gets its figures). A tokenizer
    other than the folder's own is refused (see the module docstring)."""
    fp = data.manifest["tokenizer"]
    if tokenizer is not None and hasattr(tokenizer, "fingerprint") and tokenizer.fingerprint() != fp:
        raise AndreaError(f"{data.dir} was prepared with another tokenizer than this one (fingerprint {str(fp)[:16]}..., "
                          f"this one {tokenizer.fingerprint()[:16]}...), so how its tokens are used says nothing "
                          f"about this tokenizer's; use the tokenizer it was prepared with")
    path = data.dir / USAGE_FILE
    tag = _manifest_tag(data.dir)
    kept = _read(path, tag, fp, data.vocab_size)
    if kept is not None:
        return kept
    tokenizer = tokenizer or data.load_tokenizer()
    verify_shards(data, log=log)
    if log:
        log(f"counting how each token is used in {data.dir} (once; kept in {USAGE_FILE})")
    usage = count_usage(_texts(data), data.vocab_size, starts_word(tokenizer))
    buf = io.BytesIO()
    np.savez(buf, meta=np.array([str(USAGE_VERSION), tag, fp]), count=usage.count, alone=usage.alone,
             next_ids=usage.next_ids, next_counts=usage.next_counts)
    remove_dead_temps(data.dir)  # a usage write a kill cut short (a live writer's file is kept)
    try:
        atomic_write_bytes(path, buf.getvalue())
    except (OSError, AndreaError) as e:
        if log:
            log(f"note: could not keep the usage figures in {path} ({e}); they are counted again next time")
    return usage
