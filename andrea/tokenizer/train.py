"""Training the Harris tokenizer: successor variety, candidate segments and pruning.

The encoding rule and the file format are andrea.tokenizer.harris's; this module finds the segments
that rule encodes with, and returns them as a HarrisTokenizer.

Training, in full (train_tokenizer):
    1. Count the words of the corpus; a document may carry a weight (how much it counts).
    2. Successor variety SV(p) of every prefix p of the lowercase letter words: how many distinct
       letters, or the end of the word, follow p. Predecessor variety PV(s) is the same count
       read right to left: how many distinct letters, or the start, precede the suffix s.
    3. A word has a boundary after position i where SV of its prefix, or PV of its suffix, peaks
       there (rises into i and does not rise after it: Hafer and Weiss's peak criterion) at a
       value of 3 or more. Its start and end are boundaries by definition.
    4. Candidates: each piece between two boundaries of a word (the first piece keeps the word's
       leading space), whole words included, counted over the corpus. A candidate is two bytes or
       more (one byte is already a token) and occurs at least `min_count` times.
       What one word may cost is capped: a word of more than MAX_WORD_CHARS (100) characters
       (no English word; a run of letters a text was never meant to hold) takes part in training
       only as text the chosen segments encode (step 5): it is not counted in SV or PV, and
       neither it nor its pieces are candidates. So fitting stays linear in the corpus, whatever
       one word holds.
    5. Keep the N candidates that save the most tokens. Start from the 3N with the most bytes to
       save (count x (bytes - 1)); then, until N remain, encode the corpus's words with the
       current set and drop the quarter whose removal would cost the fewest extra tokens. Do it
       again counting for a piece also half the uses of the chosen segments that would be
       spelled with it in their absence (so the pieces of words that whole words pre-empt are
       not dropped first), and keep whichever of the two sets spends fewer tokens on the
       corpus's words (select_segments). A segment's removal costs what its text would then
       be spelled with: a one-character segment of 2-4 bytes ("—", "’") costs its bytes, one
       token each (tokenizer version 4; version 3 counted it as one token, so such segments
       went first, and `train_tokenizer(..., version=3)` still selects so).
    Version 5 marks word ends (andrea.tokenizer.harris, "Word ends"): in step 4 a letter word's last piece,
    the whole word included, is the candidate " cat</w>" (its text ending a word), while the pieces
    before it stay plain, so " cat</w>" (the word) and " cat" (cats, category) are two candidates
    that save tokens apart. A segment's bytes exclude the mark. `reserve` names words whose word
    end is kept whatever its savings (the lesson's words, where the vocabulary is too small to
    choose them: a reserved word is said in the tokenizer's settings).
    Frequent whole words (" the", " government") survive because word starts and ends are
    boundaries; rarer words are spelled from the pieces between successor-variety peaks
    (" hope" + "less" + "ness", " re" + "ap" + "po" + "int" + "ment" with 2,048 segments on
    the earlier default corpus). The longest-match rule does not look at boundaries, so a word
    can still split off them (" pre" + "ord" + "ain" + "ed").
"""

from __future__ import annotations

import gc
import math
import numbers
import os
import re
from collections import Counter, defaultdict
from contextlib import contextmanager

from andrea import forkpool
from andrea.errors import AndreaError
from andrea.tokenizer.harris import (
    COMPILED,
    LETTER_WORD,
    MARK,
    PARALLEL_CHARS,
    HarrisTokenizer,
    Matcher,
    has_surrogate,
    is_word_end,
    split_words,
    utf8,
)

LETTER_WORD_RE = re.compile(r"( ?)([^\W\d_]+)")  # a word of letters, with its leading space apart

# Counting with the compiled splitter, workers (and merging their counts) pay from about here
PARALLEL_COUNT_CHARS = 6_000_000 if COMPILED else PARALLEL_CHARS

TRAINER_VERSION = 5  # how train selects segments (module docstring, step 5); recorded in the settings
TRAINER_VERSIONS = (3, 4, 5)
PARALLEL_WORDS = 20_000  # word types from which the two prunings of select_segments run side by side
MAX_WORD_CHARS = 100  # training: a longer word is only text to encode, never counted for segments


# ---------------------------------------------------------------- successor variety


class SuccessorVariety:
    """Harris's statistics over a list of word types (lowercase letter words).

    SV(p): distinct letters, or end of word, that follow the prefix p among the types.
    PV(s): distinct letters, or start of word, that precede the suffix s.
    """

    END = "\0"  # marks the end (in SV) or the start (in PV) of a word
    MIN_PEAK = 3  # a peak of 2 is noise: any two words that differ in one letter make one
    WIDTH = 32  # all_boundaries counts the first WIDTH - 1 letters of every word at once

    def __init__(self, words):
        self.words = sorted(set(words))
        self._sv = self._pv = None

    @property
    def sv(self) -> Counter:
        """SV of every prefix of every word type (built on first use)."""
        if self._sv is None:
            # every prefix of every word+END, each once; SV(p) is how many of them extend p by one
            prefixes = {x[:i] for x in (w + self.END for w in self.words) for i in range(1, len(x) + 1)}
            self._sv = Counter(p[:-1] for p in prefixes)
        return self._sv

    @property
    def pv(self) -> Counter:
        """PV of every suffix of every word type (built on first use)."""
        if self._pv is None:
            suffixes = {x[i:] for x in (self.END + w for w in self.words) for i in range(len(x))}
            self._pv = Counter(s[1:] for s in suffixes)
        return self._pv

    def all_boundaries(self) -> dict[str, list[int]]:
        """boundaries(w) of every word type w that has any, found for all of them at once: SV
        peaks on the words, PV peaks as SV peaks on the words read backwards (_sv_peaks)."""
        import numpy as np

        words = self.words
        if not words:
            return {}
        backwards = sorted(range(len(words)), key=lambda r: words[r][::-1])
        fwd_rows, fwd_cols = _sv_peaks(words, self.WIDTH, self.MIN_PEAK)
        rev_rows, rev_cols = _sv_peaks([words[r][::-1] for r in backwards], self.WIDTH, self.MIN_PEAK)
        rev_rows = np.asarray(backwards, dtype=np.int64)[rev_rows]  # as rows of `words`
        lens = np.fromiter(map(len, words), dtype=np.int64, count=len(words))
        rows = np.concatenate([fwd_rows, rev_rows])
        cols = np.concatenate([fwd_cols, lens[rev_rows] - rev_cols])  # a PV peak m letters from the end
        stride = int(lens.max()) + 1
        key = np.unique(rows * stride + cols)  # sorted by word, then position
        if not len(key):
            return {}
        rows, cols = np.divmod(key, stride)
        starts = np.flatnonzero(np.r_[True, rows[1:] != rows[:-1]])
        cols, ends = cols.tolist(), starts[1:].tolist() + [len(cols)]
        return {words[r]: cols[a:b] for r, a, b in zip(rows[starts].tolist(), starts.tolist(), ends)}

    def peaks(self, word: str) -> tuple[list[int], list[int]]:
        """Inner positions i (0 < i < len) where SV(word[:i]) peaks, and where PV(word[i:]) does."""
        n, low, sv_of, pv_of = len(word), self.MIN_PEAK, self.sv, self.pv
        sv = [sv_of[word[:i]] for i in range(n + 1)]
        pv = [pv_of[word[i:]] for i in range(n + 1)]
        return ([i for i in range(1, n) if sv[i] >= low and sv[i - 1] < sv[i] >= sv[i + 1]],
                [i for i in range(1, n) if pv[i] >= low and pv[i + 1] < pv[i] >= pv[i - 1]])

    def boundaries(self, word: str) -> list[int]:
        """Inner positions where either variety peaks: the cuts inside the word."""
        s, p = self.peaks(word)
        return sorted(set(s).union(p))

    def profile(self, word: str) -> list[tuple[str, int, int]]:
        """(prefix, SV of the prefix, PV of the rest) for every split point 0..len(word)."""
        return [(word[:i], self.sv[word[:i]], self.pv[word[i:]]) for i in range(len(word) + 1)]


def _sv_peaks(words: list[str], width: int, low: int):
    """(row, position) of every SV peak of the sorted, distinct, non-empty words at positions 0 <
    i < len (the rule of SuccessorVariety.peaks), SV counted over these words.

    In sorted order the words that share a prefix of length k form a run, and the distinct letters
    (or END) that follow that prefix are one more than the words in the run whose common prefix
    with the word before is exactly k long. So SV at depth k is a count per run, made for all words
    at once on a (words x width) array of their first letters. Depths from width - 1 on (long
    words only) are counted word by word on the sorted list.
    """
    import bisect

    import numpy as np

    n = len(words)
    lens = np.fromiter(map(len, words), dtype=np.int64, count=n)
    flat = "".join(w[: width - 1].ljust(width, "\0") for w in words)
    grid = np.frombuffer(flat.encode("utf-32-le", "surrogatepass"), dtype=np.uint32).reshape(n, width)
    differ = grid[1:] != grid[:-1]
    lcp = np.full(n, -1, dtype=np.int64)  # the common prefix with the word before (-1: none before)
    lcp[1:] = np.where(differ.any(axis=1), differ.argmax(axis=1), width)  # exact below width - 1
    depth = min(width - 1, int(lens.max()) + 1)  # depths 0 .. depth - 1 are counted on the array
    sv = np.zeros((n, depth + 1), dtype=np.int32)
    for k in range(depth):
        run = np.cumsum(lcp < k) - 1
        sv[:, k] = 1 + np.bincount(run, weights=lcp == k).astype(np.int32)[run]
    short = lens < depth  # SV of all its prefixes, 0 .. len, is in the array
    k = np.arange(1, depth)[None, :]
    here, before, after = sv[:, 1:depth], sv[:, : depth - 1], sv[:, 2 : depth + 1]
    peak = short[:, None] & (k < lens[:, None]) & (here >= low) & (before < here) & (here >= after)
    rows, cols = np.nonzero(peak)
    rows_out, cols_out = [rows], [cols + 1]
    for r in np.flatnonzero(~short).tolist():
        w = words[r]
        vals = sv[r, :depth].tolist()
        for d in range(depth, len(w) + 1):
            a = bisect.bisect_left(words, w[:d])
            b = bisect.bisect_left(words, w[:d] + "\U0010ffff")
            vals.append(len({v[d] if len(v) > d else "" for v in words[a:b]}))
        at = [i for i in range(1, len(w)) if vals[i] >= low and vals[i - 1] < vals[i] >= vals[i + 1]]
        rows_out.append(np.full(len(at), r, dtype=np.int64))
        cols_out.append(np.array(at, dtype=np.int64))
    return np.concatenate(rows_out), np.concatenate(cols_out)


def letter_word_counts(word_counts) -> Counter:
    """Lowercase letter words (the leading space dropped) with their counts; words longer than
    MAX_WORD_CHARS are left out (see "Training": one word's cost is capped)."""
    out = Counter()
    for w, k in word_counts.items():
        m = LETTER_WORD_RE.fullmatch(w) if len(w) <= MAX_WORD_CHARS + 1 else None
        if m and len(m.group(2)) <= MAX_WORD_CHARS:
            out[m.group(2).lower()] += k
    return out




# ---------------------------------------------------------------- counting words


def _count_texts(texts) -> Counter:
    counts = Counter()
    for t in texts:
        counts.update(split_words(t))
    return counts



def _count_slice(bounds) -> Counter:
    return _count_texts(forkpool.shared()[bounds[0] : bounds[1]])



def count_words(texts, weights=None, workers=None, progress=False) -> Counter:
    """How often each word (in the sense of WORD_PATTERN) occurs; with weights, document i counts
    weights[i] times. Large inputs are counted on several processes."""
    from tqdm import tqdm

    texts = list(texts)
    if weights is None:
        groups = {1: texts}
    else:
        weights = list(weights)
        if len(weights) != len(texts):
            raise AndreaError(f"got {len(weights)} weights for {len(texts)} documents; give one weight per document.")
        groups = {}
        for t, w in zip(texts, weights):
            if not isinstance(w, numbers.Real) or not w >= 0:
                raise AndreaError(f"document weights must be non-negative numbers, got {w!r}.")
            groups.setdefault(w, []).append(t)
    workers = workers or os.cpu_count() or 1
    total = Counter()
    bar = tqdm(total=sum(map(len, texts)), unit="B", unit_scale=True, desc="counting words", disable=not progress)
    for weight, group in groups.items():
        if weight == 0:
            continue
        if workers > 1 and sum(map(len, group)) >= PARALLEL_COUNT_CHARS and len(group) > 1 and forkpool.can_fork():
            counts = Counter()
            slices = forkpool.slices(group, 4 * workers)
            for (a, b), c in zip(slices, forkpool.map_forked(_count_slice, group, slices, workers)):
                counts.update(c)
                bar.update(sum(map(len, group[a:b])))
        else:
            counts = _count_texts(group)
            bar.update(sum(map(len, group)))
        if weight == 1:
            total.update(counts)
        else:
            for w, k in counts.items():
                total[w] += k * weight
    bar.close()
    return total


# ---------------------------------------------------------------- choosing the segments


@contextmanager
def _gc_paused():
    """Training makes some million small objects and no reference cycles; the cycle collector,
    which would walk all of them again and again as they pile up, waits until it is done."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def candidate_counts(word_counts, stats: SuccessorVariety, marks: bool = False) -> Counter:
    """Every piece between two boundaries of every word, counted (whole words included, but
    none longer than MAX_WORD_CHARS: their pieces and their statistics are never counted); with
    `marks` (version 5), a letter word's last piece and the whole word as word ends."""
    def whole(w):
        return w + MARK if marks and LETTER_WORD.fullmatch(w) else w

    cands = defaultdict(int)
    for w, k in word_counts.items():
        if len(w) - w.startswith(" ") <= MAX_WORD_CHARS:
            cands[whole(w)] += k
    cuts_of = stats.all_boundaries()  # lowercase word -> its boundaries, where it has any
    spans_of = {}  # lowercase word -> the (start, end) of its pieces, found once
    fullmatch = LETTER_WORD_RE.fullmatch
    for w, k in word_counts.items():
        m = fullmatch(w)
        if not m:
            continue  # digits, symbols and whitespace: only whole words
        space, core = m.groups()
        low = core.lower()
        if len(low) != len(core):
            continue  # lowercasing changed the length (rare letters): positions would not line up
        spans = spans_of.get(low)
        if spans is None:
            inner = cuts_of.get(low)
            if not inner:
                continue  # no boundary inside: only the whole word
            cuts = [0, *inner, len(low)]
            spans = spans_of[low] = [(i, j) for a, i in enumerate(cuts) for j in cuts[a + 1 :]
                                     if j - i < len(low)]  # the whole word is counted above
        for i, j in spans:
            piece = space + core[:j] if i == 0 else core[i:j]  # the first piece keeps the space
            cands[piece + MARK if marks and j == len(core) else piece] += k
    return Counter(cands)




def text_bytes(segment: str) -> int:
    """The bytes a segment stands for (a word end's mark stands for none)."""
    return len(utf8(segment.removesuffix(MARK)))


def select_segments(cands: Counter, word_counts, n: int, keep: float = 0.75, workers: int | None = None,
                    progress=False, version: int = TRAINER_VERSION, reserve=()) -> list[str]:
    """The n candidates that save the most tokens on the corpus's words, most used first.

    Two prunings (prune_segments) from the 3n candidates with the most bytes to save: one weighs
    each segment by its uses, the other also by half the uses it stands by for, which keeps the
    pieces of words that whole words pre-empt (as in a small corpus, where that matters most).
    The one whose segments encode the corpus's words in fewer tokens is kept. With two workers or
    more and many words, the two run side by side on forked processes.
    """
    potentials = (0.0, 0.5)
    workers = workers or os.cpu_count() or 1
    if workers > 1 and len(word_counts) >= PARALLEL_WORDS and forkpool.can_fork():
        shared = (cands, word_counts, n, keep, version, reserve)
        results = list(forkpool.map_forked(_prune_job, shared, potentials, min(workers, len(potentials))))
    else:
        results = [prune_segments(cands, word_counts, n, keep=keep, potential=p, progress=progress, version=version,
                                  reserve=reserve) for p in potentials]
    return min(results, key=lambda r: r[1])[0]


def _prune_job(potential):
    cands, word_counts, n, keep, version, reserve = forkpool.shared()
    return prune_segments(cands, word_counts, n, keep=keep, potential=potential, version=version, reserve=reserve)


def _starting_set(cands: Counter, size: int, reserve) -> tuple[list[str], set[int]]:
    """The `size` candidates with the most bytes to save, then the reserved ones not among them;
    and the indexes of the reserved."""
    saving = {s: k * (text_bytes(s) - 1) for s, k in cands.items()}
    texts = sorted(saving, key=lambda s: (-saving[s], s))[:size]
    reserve = set(reserve)
    texts += sorted(reserve - set(texts))
    return texts, {i for i, s in enumerate(texts) if s in reserve}


def prune_segments(cands: Counter, word_counts, n: int, start: float = 3.0, keep: float = 0.75,
                   potential: float = 0.0, progress=False, version: int = TRAINER_VERSION,
                   reserve=()) -> tuple[list[str], int]:
    """n of the candidates, most used first, and the tokens they spend on the corpus's words.

    Start from the start*n candidates with the most bytes to save (count x (bytes - 1)), then
    prune: encode the corpus's words with the current set, score each segment by the tokens the
    corpus would spend without it, and keep the best `keep` share, until n remain. The score of
    segment s is (uses of s + potential x standby uses of s) x (tokens of the text of s without
    s - 1). Its standby uses are the uses of the chosen segments whose text, without them, would
    be spelled with s: while " walking" pre-empts " walk" + "ing", those two stand by for it, so
    they are not pruned as useless before the whole words that need them are weighed. Scores
    are exact for one removal at a time, hence the gentle steps; a candidate that is neither used
    nor standing by goes at once (as long as n remain). Removing segments changes only the
    encodings that used them (the longest match elsewhere is still the longest), so after each
    step only those words are encoded again. The tokens of a text without s are what the rule
    spells it with (a word end's as a word's end; version 3 as in the module docstring, step 5);
    the `reserve`d segments are never pruned (they count among the n)."""
    from tqdm import tqdm

    texts, kept = _starting_set(cands, max(n, int(start * n)), reserve)
    first = 256  # segment i (of texts) has id 256 + i here, above every byte
    rule = Matcher(texts, first)
    chosen = set(range(len(texts)))
    parse: dict[str, tuple[int, ...]] = {}  # word -> its ids under the chosen segments
    users: dict[int, set] = {}  # segment -> the words whose encoding uses it
    use = Counter()  # segment -> its uses over the corpus

    def encode_words(words):
        for w in words:
            k = word_counts[w]
            for i in parse.get(w, ()):
                if i >= first:
                    use[i - first] -= k
                    users[i - first].discard(w)
            parse[w] = ids = rule.encode(w)
            for i in ids:
                if i >= first:
                    use[i - first] += k
                    users.setdefault(i - first, set()).add(w)

    encode_words(word_counts)
    spelled: dict[int, tuple[int, list[int]]] = {}  # segment -> tokens and segments of its text without it
    bar = tqdm(total=len(chosen) - n, desc="pruning segments", disable=not progress)

    def spell(s):
        if s not in spelled:
            rule.set(s, False)
            ids = rule.encode(texts[s].removesuffix(MARK), end=is_word_end(texts[s]))
            rule.set(s, True)
            cost = 1 if version == 3 and len(texts[s]) == 1 else len(ids)  # v3: "—" as if one token
            spelled[s] = (cost, [i - first for i in ids if i >= first])
        return spelled[s]

    while len(chosen) > n:
        standby = Counter()
        for s in chosen:
            if use[s] > 0:
                for p in spell(s)[1]:
                    standby[p] += use[s]
        loss = {s: (use[s] + potential * standby[s]) * (spell(s)[0] - 1)
                for s in chosen if use[s] > 0 or standby[s] > 0}
        loss.update((s, math.inf) for s in kept)
        size = max(n, int(len(chosen) * keep))
        ranked = sorted(chosen, key=lambda s: (-loss.get(s, 0), texts[s]))
        unused = sum(1 for s in ranked[n:] if s not in loss)  # at the end, as their loss is 0
        dropped = set(ranked[min(size, len(ranked) - unused):])
        chosen.difference_update(dropped)
        affected = set()
        for s in dropped:
            rule.set(s, False)
            affected.update(users.get(s, ()))
        encode_words(affected)
        for s in [s for s, (_, pieces) in spelled.items() if s in dropped or not dropped.isdisjoint(pieces)]:
            del spelled[s]
        bar.update(len(dropped))
    bar.close()
    tokens = sum(word_counts[w] * len(ids) for w, ids in parse.items())
    # ids in order of use, most used first (ties by text), so the list reads like a frequency list
    return [texts[s] for s in sorted(chosen, key=lambda s: (-use[s], texts[s]))], tokens




# ---------------------------------------------------------------- training


def train_tokenizer(texts, n_segments: int, weights=None, min_count: int = 2, workers: int | None = None,
                    progress: bool = False, version: int = TRAINER_VERSION, reserve=()) -> HarrisTokenizer:
    """Find n_segments segments in texts, a list of documents or one string (module docstring,
    "Training"). weights, one number per document, says how much each counts (a curriculum's
    source weights); None counts each once. version is how segments are selected: 5 (the
    default) also marks word ends, so a word's token is that word alone; 4 scores each segment by
    what its absence really costs; 3 selects as earlier releases did. 3 and 4 reproduce their
    tokenizers, and every version's result encodes by the one rule. `reserve` (version 5) lists
    words, such as " cat", whose word ends are kept whatever they save."""
    if version not in TRAINER_VERSIONS:
        raise AndreaError(f"tokenizer version {version!r} is not one this release trains "
                          f"({', '.join(map(str, TRAINER_VERSIONS))}).")
    if isinstance(n_segments, bool) or not isinstance(n_segments, int) or n_segments < 1:
        raise AndreaError(f"the number of segments must be a whole number of at least 1, got {n_segments!r}.")
    texts = [texts] if isinstance(texts, str) else list(texts)
    for t in texts:
        if not isinstance(t, str):
            raise AndreaError(f"train takes strings, not {type(t).__name__}.")
    reserve = list(reserve)
    if reserve and version < 5:
        raise AndreaError(f"reserving words needs tokenizer version 5 (word ends), not {version}.")
    for w in reserve:
        if not isinstance(w, str) or not LETTER_WORD.fullmatch(w):
            raise AndreaError(f"a reserved word is letters after an optional space, such as \" cat\"; got {str(w)[:40]!r}.")
    if len(set(reserve)) > n_segments:
        raise AndreaError(f"{len(set(reserve))} words are reserved but only {n_segments} segments requested.")
    with _gc_paused():
        return _train(texts, n_segments, weights, min_count, workers, progress, version, reserve)


def _train(texts, n_segments, weights, min_count, workers, progress, version, reserve=()) -> HarrisTokenizer:
    word_counts = count_words(texts, weights, workers, progress)
    if not word_counts:
        raise AndreaError("the training text is empty; the tokenizer needs text to learn segments from.")
    stats = SuccessorVariety(letter_word_counts(word_counts))
    cands = candidate_counts(word_counts, stats, marks=version >= 5)
    cands = Counter({s: k for s, k in cands.items()
                     if k >= min_count and text_bytes(s) > 1 and not has_surrogate(s)})
    reserved = [w + MARK for w in dict.fromkeys(reserve)]
    if len(cands) < n_segments:
        raise AndreaError(f"requested {n_segments:,} segments but the corpus supplies only {len(cands):,} "
                          f"(pieces of two bytes or more that occur at least {min_count} times); "
                          f"give more text or ask for fewer segments.")
    segments = select_segments(cands, word_counts, n_segments, workers=workers, progress=progress, version=version,
                               reserve=reserved)
    size = sum(len(utf8(t)) for t in texts)
    meta = {
        "corpus": {"documents": len(texts), "bytes": size, "words": int(sum(word_counts.values())),
                   "distinct_words": len(word_counts), "weighted": weights is not None},
        "found": len(cands),
        "settings": {"min_count": min_count, "version": version, **({"reserved": list(dict.fromkeys(reserve))} if reserve else {})},
    }
    return HarrisTokenizer(segments, meta, words=stats.words)


def successor_variety(tok: HarrisTokenizer) -> SuccessorVariety | None:
    """The successor-variety statistics of a tokenizer's training corpus, from the word types it
    kept (None where it kept none, as a bare segment list or a checkpoint's tokenizer)."""
    words = tok.words
    return SuccessorVariety(words) if words is not None else None
