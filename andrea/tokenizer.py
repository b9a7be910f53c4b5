"""The Harris tokenizer: a fixed alphabet of segments found by successor variety.

Zellig Harris (1955): count, over a corpus, how many distinct letters follow each prefix of a
word. Inside a morpheme few letters can follow (`believ` -> e, i, a); at a boundary many can
(`un` -> a, b, c, d, ...). The peaks of that count mark boundaries, and the segments between
boundaries that recur most are the vocabulary. No merges and no labels: this is not BPE.

Vocabulary (V = N + 257):
    0..255       raw bytes, the fallback that lets any text round-trip
    256          BOS: starts every document, and ends generation
    257..256+N   the segments, in the order of harris_segments.json

Encoding rule, in full:
    1. Split the text into words with WORD_PATTERN: a run of letters, of digits or of other
       symbols, each with at most one leading space; a run of whitespace (whose last space goes to
       the word after it, so " the" is one word); or an English contraction ('s 't 're 've 'm 'll
       'd). The words concatenate back to the text exactly.
    2. Encode each word left to right: at each position take the longest segment that starts
       there; where none does, take the UTF-8 bytes of one character (a lone surrogate as its
       three 'surrogatepass' bytes, so every Python string round-trips).
    Segments never span two words, and the ids depend only on the text and the segment list.
Decoding joins the tokens' bytes and reads them as UTF-8 with 'surrogatepass'. A byte sequence
that encode never produces (a model can emit one) decodes each invalid stretch to U+FFFD.

Training, in full (HarrisTokenizer.train):
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
       went first, and `train(..., version=3)` still selects so).
    Frequent whole words (" the", " government") survive because word starts and ends are
    boundaries; rarer words are spelled from the pieces between successor-variety peaks
    (" hope" + "less" + "ness", " re" + "ap" + "po" + "int" + "ment" with 2,048 segments on
    the earlier default corpus). The longest-match rule does not look at boundaries, so a word
    can still split off them (" pre" + "ord" + "ain" + "ed").
"""

from __future__ import annotations

import codecs
import gc
import gzip
import hashlib
import json
import multiprocessing
import numbers
import os
import re
import zlib
from array import array
from collections import Counter, defaultdict
from contextlib import contextmanager
from functools import partial
from itertools import chain
from pathlib import Path

from andrea.config import BOS
from andrea.errors import AndreaError
from andrea.files import atomic_write_bytes, read_json

# The word split, the longest-match rule and the word lookup, compiled (andrea/_harris.c, which
# setup builds where there is a C compiler). Without it (or with ANDREA_NO_COMPILED=1 set), the
# same steps run in Python: the same ids and segments, encoding about 3x slower.
try:
    if os.environ.get("ANDREA_NO_COMPILED", "") not in ("", "0"):
        raise ImportError
    from andrea import _harris as _compiled
except ImportError:
    _compiled = None

FIRST_SEGMENT = 257  # id of segment 0

WORD_PATTERN = r"'(?:[sdmt]|ll|ve|re)| ?[^\W\d_]+| ?\d+| ?[^\s\w]+|_+|\s+(?!\S)|\s+"
WORD_RE = re.compile(WORD_PATTERN)
LETTER_WORD_RE = re.compile(r"( ?)([^\W\d_]+)")  # a word of letters, with its leading space apart

SEGMENTS_FILE = "harris_segments.json"
META_FILE = "tokenizer.json"
WORDS_FILE = "harris_words.txt.gz"  # the word types the successor-variety statistics count
FORMAT = "andrea-harris-tokenizer"

PARALLEL_CHARS = 1_500_000  # below this, starting worker processes costs more than it saves
# Counting with the compiled splitter, workers (and merging their counts) pay from about here
PARALLEL_COUNT_CHARS = 6_000_000 if _compiled is not None else PARALLEL_CHARS
TRAINER_VERSION = 4  # how train selects segments (module docstring, step 5); recorded in the settings
TRAINER_VERSIONS = (3, 4)
PARALLEL_WORDS = 20_000  # word types from which the two prunings of select_segments run side by side
CACHE_LIMIT = 1_000_000  # words remembered by encode before the cache starts over
MAX_WORD_CHARS = 100  # training: a longer word is only text to encode, never counted for segments
MAX_WORDS_BYTES = 64 << 20  # the longest word list (harris_words.txt.gz, inflated) read; andrea writes a few MB


def _surrogatepass_or_replace(err: UnicodeDecodeError):
    """Decode error handler: lone surrogates come back (encode writes them with 'surrogatepass');
    any other invalid stretch, which only a model's output can hold, becomes U+FFFD."""
    if not isinstance(err, UnicodeDecodeError):
        raise err
    b = err.object[err.start : err.start + 3]
    if len(b) == 3 and b[0] == 0xED and 0xA0 <= b[1] <= 0xBF and 0x80 <= b[2] <= 0xBF:
        return chr(0xD000 | (b[1] & 0x3F) << 6 | (b[2] & 0x3F)), err.start + 3
    return "\ufffd", err.end


codecs.register_error("andrea.harris", _surrogatepass_or_replace)


def _utf8(s: str) -> bytes:
    return s.encode("utf-8", "surrogatepass")


def _has_surrogate(s: str) -> bool:
    try:
        s.encode("utf-8")
        return False
    except UnicodeEncodeError:
        return True


def label_bytes(b: bytes) -> str:
    """Bytes as a readable label: each printable character as itself (a space too), every other
    byte, a control character's or one that is not whole UTF-8 on its own, as <0xNN>."""
    out, i, n = [], 0, len(b)
    while i < n:
        lead = b[i]
        size = 1 if lead < 0x80 else 2 if 0xC2 <= lead < 0xE0 else 3 if 0xE0 <= lead < 0xF0 else 4 if 0xF0 <= lead < 0xF5 else 0
        if size:
            try:
                ch = b[i : i + size].decode("utf-8")
            except UnicodeDecodeError:
                ch = ""
            if len(ch) == 1 and ch.isprintable():
                out.append(ch)
                i += size
                continue
        out.append(f"<0x{lead:02X}>")
        i += 1
    return "".join(out)


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


def split_words(text: str) -> list[str]:
    """Step 1 of the encoding rule: the words of text, which concatenate back to it."""
    return _compiled.split(text) if _compiled is not None else WORD_RE.findall(text)


def _count_texts(texts) -> Counter:
    counts = Counter()
    for t in texts:
        counts.update(split_words(t))
    return counts


def _chunks(items, n_chunks, key=len):
    """Consecutive runs of items of about equal total key (documents keep their order)."""
    total = sum(map(key, items)) or 1
    out, cur, size = [], [], 0
    for it in items:
        cur.append(it)
        size += key(it)
        if size >= total / n_chunks:
            out.append(cur)
            cur, size = [], 0
    if cur:
        out.append(cur)
    return out


def _can_fork() -> bool:
    # a daemon process (a data loader's worker, say) may not start processes of its own
    return "fork" in multiprocessing.get_all_start_methods() and not multiprocessing.current_process().daemon


# What forked workers read from the parent's memory (the texts, the tokenizer with its warm
# cache), so that only slice bounds and results cross between processes.
_shared = None


def _map_forked(fn, shared, jobs, workers):
    """fn(job) for every job on `workers` forked processes, in order; fn reads `_shared`."""
    global _shared
    _shared = shared
    try:
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            yield from pool.imap(fn, jobs)
    finally:
        _shared = None


def _count_slice(bounds) -> Counter:
    return _count_texts(_shared[bounds[0] : bounds[1]])


def _slices(texts, n) -> list[tuple[int, int]]:
    """n or fewer consecutive (start, end) slices of texts of about equal length."""
    return [(c[0], c[-1] + 1) for c in _chunks(list(range(len(texts))), n, key=lambda i: len(texts[i]))]


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
        if workers > 1 and sum(map(len, group)) >= PARALLEL_COUNT_CHARS and len(group) > 1 and _can_fork():
            counts = Counter()
            slices = _slices(group, 4 * workers)
            for (a, b), c in zip(slices, _map_forked(_count_slice, group, slices, workers)):
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


def candidate_counts(word_counts, stats: SuccessorVariety) -> Counter:
    """Every piece between two boundaries of every word, counted (whole words included, but
    none longer than MAX_WORD_CHARS: their pieces and their statistics are never counted)."""
    cands = defaultdict(int, {w: k for w, k in word_counts.items() if len(w) - w.startswith(" ") <= MAX_WORD_CHARS})
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
            cands[space + core[:j] if i == 0 else core[i:j]] += k  # the first piece keeps the space
    return Counter(cands)


def _longest_match(word: str, get) -> tuple[int, ...]:
    """Step 2 of the encoding rule on one word, where get(prefix) is None for a text that begins
    no segment, -1 for one that begins a segment but is none, else the segment's id."""
    ids, i, n = [], 0, len(word)
    while i < n:
        best, end, j = -1, i + 1, i + 1
        while j <= n:
            t = get(word[i:j])
            if t is None:
                break
            if t >= 0:
                best, end = t, j
            j += 1
        if best >= 0:
            ids.append(best)
        else:
            ids.extend(_utf8(word[i]))
        i = end
    return tuple(ids)


class _Matcher:
    """The longest-match rule over a list of segments, with ids first + index, that segments can
    leave and rejoin (prune_segments): on the compiled trie where andrea._harris was built (`trie`),
    else on a dict of every prefix of every segment (`trie` is None). encode(word) -> its ids."""

    def __init__(self, segments: list[str], first: int):
        self.segments, self.first = segments, first
        if _compiled is not None:
            self.trie = _compiled.trie(segments, first)
            self.encode = partial(_compiled.encode_word, self.trie)
        else:
            # every prefix of every segment -> the segment's id when the prefix is one, else -1:
            # the longest match at a position is found by extending it while the text is a prefix
            self.trie = None
            self._table = {s[:j]: -1 for s in segments for j in range(1, len(s))}
            self._table.update((s, first + i) for i, s in enumerate(segments))
            self.encode = partial(_longest_match, get=self._table.get)

    def set(self, index: int, present: bool):
        """Put segment `index` in (present) or take it out of the rule."""
        s, i = self.segments[index], self.first + index if present else -1
        if self.trie is not None:
            _compiled.set_id(self.trie, s, i)
        else:
            self._table[s] = i


def select_segments(cands: Counter, word_counts, n: int, keep: float = 0.75, workers: int | None = None,
                    progress=False, version: int = TRAINER_VERSION) -> list[str]:
    """The n candidates that save the most tokens on the corpus's words, most used first.

    Two prunings (prune_segments) from the 3n candidates with the most bytes to save: one weighs
    each segment by its uses, the other also by half the uses it stands by for, which keeps the
    pieces of words that whole words pre-empt (as in a small corpus, where that matters most).
    The one whose segments encode the corpus's words in fewer tokens is kept. With two workers or
    more and many words, the two run side by side on forked processes.
    """
    potentials = (0.0, 0.5)
    workers = workers or os.cpu_count() or 1
    if workers > 1 and len(word_counts) >= PARALLEL_WORDS and _can_fork():
        shared = (cands, word_counts, n, keep, version)
        results = list(_map_forked(_prune_job, shared, potentials, min(workers, len(potentials))))
    else:
        results = [prune_segments(cands, word_counts, n, keep=keep, potential=p, progress=progress, version=version)
                   for p in potentials]
    return min(results, key=lambda r: r[1])[0]


def _prune_job(potential):
    cands, word_counts, n, keep, version = _shared
    return prune_segments(cands, word_counts, n, keep=keep, potential=potential, version=version)


def prune_segments(cands: Counter, word_counts, n: int, start: float = 3.0, keep: float = 0.75,
                   potential: float = 0.0, progress=False, version: int = TRAINER_VERSION) -> tuple[list[str], int]:
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
    spells it with: for a one-character segment of k bytes, k byte tokens (version 4); version 3
    counted one token for any one-character segment, so its score was 0 and it went first.
    """
    from tqdm import tqdm

    saving = {s: k * (len(_utf8(s)) - 1) for s, k in cands.items()}
    texts = sorted(saving, key=lambda s: (-saving[s], s))[: max(n, int(start * n))]
    first = 256  # segment i (of texts) has id 256 + i here, above every byte
    rule = _Matcher(texts, first)
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
            ids = rule.encode(texts[s])
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


# ---------------------------------------------------------------- the tokenizer


class _WordCache(dict):
    """word -> its ids; a miss encodes the word once (so a repeated word costs one lookup)."""

    def __init__(self, encode_word):
        super().__init__()
        self.encode_word = encode_word

    def __missing__(self, word):
        if len(self) >= CACHE_LIMIT:
            self.clear()
        ids = self[word] = self.encode_word(word)
        return ids


def _check_segments(segments, where: str) -> list[str]:
    if not isinstance(segments, list) or not all(isinstance(s, str) for s in segments):
        raise AndreaError(f"{where} is not a JSON list of segment strings.")
    seen = {}
    for i, s in enumerate(segments):
        if not s:
            raise AndreaError(f"{where} has an empty segment at index {i}.")
        if s in seen:
            raise AndreaError(f"{where} lists the segment {s!r} twice (indexes {seen[s]} and {i}).")
        seen[s] = i
    return segments


class HarrisTokenizer:
    """Segments in id order (ids 257..), plus what training knew: `meta` (corpus size, settings)
    and, for `inspect`, the word types behind the successor-variety statistics. Treat
    `segments` as read-only: the id tables are built from it once."""

    BOS = BOS

    def __init__(self, segments, meta: dict | None = None, words=None, words_file=None):
        self.segments = _check_segments(list(segments), "the segment list")
        self.meta = dict(meta or {})
        self._words = words  # the word types behind the SV statistics, when known
        self._words_file = None if words is not None or words_file is None else Path(words_file)  # read on first use
        self._stats = None
        self._ids = {s: FIRST_SEGMENT + i for i, s in enumerate(self.segments)}
        self._bytes = [bytes([b]) for b in range(256)] + [b""] + [_utf8(s) for s in self.segments]
        self._rule = _Matcher(self.segments, FIRST_SEGMENT)  # step 2, compiled where it was built
        self._trie = self._rule.trie
        self._cache = _WordCache(self._rule.encode)

    def __getstate__(self):  # the compiled trie does not pickle: it is rebuilt from the segments
        return {"segments": self.segments, "meta": self.meta, "words": self._words, "words_file": self._words_file}

    def __setstate__(self, state):
        self.__init__(state["segments"], state["meta"], state["words"], state.get("words_file"))

    # ---- sizes and labels

    @property
    def n_segments(self) -> int:
        return len(self.segments)

    @property
    def vocab_size(self) -> int:
        return FIRST_SEGMENT + len(self.segments)

    def _check_id(self, i) -> int:
        if isinstance(i, bool) or not hasattr(i, "__index__"):
            raise AndreaError(f"token id {i!r} is not a whole number.")
        if not 0 <= i.__index__() < self.vocab_size:
            raise AndreaError(f"token id {i!r} is out of range: this tokenizer has ids 0 to {self.vocab_size - 1}.")
        return i.__index__()

    def token_bytes(self, i) -> bytes:
        """The raw bytes token i stands for (b'' for BOS)."""
        return self._bytes[self._check_id(i)]

    def id_to_piece(self, i) -> str:
        """A readable label (label_bytes): a byte or segment as its printable characters, with
        <0xNN> for each byte that is not one; <BOS> for BOS."""
        i = self._check_id(i)
        if i == BOS:
            return "<BOS>"
        return label_bytes(self._bytes[i])

    def fingerprint(self) -> str:
        """sha256 of the segment list: equal fingerprints, equal encodings."""
        return hashlib.sha256(json.dumps(self.segments, ensure_ascii=True, separators=(",", ":")).encode()).hexdigest()

    # ---- encoding

    def encode(self, text: str, bos: bool = True) -> list[int]:
        """Ids of text under the encoding rule (module docstring), after BOS when bos is true."""
        if not isinstance(text, str):
            raise AndreaError(f"encode takes a str, not {type(text).__name__}.")
        ids = [BOS] if bos else []
        if self._trie is not None:
            _compiled.encode(text, self._cache, ids, self._trie, CACHE_LIMIT)
        else:
            ids.extend(chain.from_iterable(map(self._cache.__getitem__, WORD_RE.findall(text))))
        return ids

    def encode_batch(self, texts, bos: bool = True, workers: int | None = None) -> list[list[int]]:
        """encode of every text, in order; without the compiled module, large batches are split
        over worker processes."""
        if isinstance(texts, str):
            raise AndreaError("encode_batch takes a list of strings; use encode for a single string.")
        texts = list(texts)
        for t in texts:
            if not isinstance(t, str):
                raise AndreaError(f"encode_batch takes strings, not {type(t).__name__}.")
        workers = workers or os.cpu_count() or 1
        # Compiled, encoding is about as fast as the parent could rebuild the workers' lists: on
        # 2 cores forked workers lost at every size tried (to 50 MB), so they serve only Python.
        if (self._trie is not None or workers < 2 or len(texts) < 2 or sum(map(len, texts)) < PARALLEL_CHARS
                or not _can_fork()):
            return [self.encode(t, bos) for t in texts]
        slices = _slices(texts, 4 * workers)
        out = []
        for flat, lengths in _map_forked(_encode_slice, (self, texts, bos), slices, workers):
            flat, pos = flat.tolist(), 0
            for n in lengths:
                out.append(flat[pos : pos + n])
                pos += n
        return out

    # ---- decoding

    def decode_bytes(self, ids) -> bytes:
        """The bytes the ids stand for, joined (BOS stands for none)."""
        ids = ids.tolist() if hasattr(ids, "tolist") else list(ids)  # numpy arrays and tensors too
        table = self._bytes
        try:
            if ids and min(ids) < 0:
                raise IndexError
            return b"".join(map(table.__getitem__, ids))
        except (IndexError, TypeError):
            for i in ids:
                self._check_id(i)
            raise

    def decode(self, ids) -> str:
        """Text of the ids: exact for anything encode produced (see the module docstring)."""
        return self.decode_bytes(ids).decode("utf-8", "andrea.harris")

    # ---- training

    @classmethod
    def train(cls, texts, n_segments: int, weights=None, min_count: int = 2,
              workers: int | None = None, progress: bool = False, version: int = TRAINER_VERSION) -> "HarrisTokenizer":
        """Find n_segments segments in texts, a list of documents or one string (module docstring,
        "Training"). weights, one number per document, says how much each counts (a curriculum's
        source weights); None counts each once. version is how segments are selected: 4 (the
        default) scores each by what its absence really costs; 3 selects as earlier releases did,
        to reproduce their tokenizers. Either way the result encodes by the same rule."""
        if version not in TRAINER_VERSIONS:
            raise AndreaError(f"tokenizer version {version!r} is not one this release trains "
                              f"({', '.join(map(str, TRAINER_VERSIONS))}).")
        if isinstance(n_segments, bool) or not isinstance(n_segments, int) or n_segments < 1:
            raise AndreaError(f"the number of segments must be a whole number of at least 1, got {n_segments!r}.")
        texts = [texts] if isinstance(texts, str) else list(texts)
        for t in texts:
            if not isinstance(t, str):
                raise AndreaError(f"train takes strings, not {type(t).__name__}.")
        with _gc_paused():
            return cls._train(texts, n_segments, weights, min_count, workers, progress, version)

    @classmethod
    def _train(cls, texts, n_segments, weights, min_count, workers, progress, version) -> "HarrisTokenizer":
        word_counts = count_words(texts, weights, workers, progress)
        if not word_counts:
            raise AndreaError("the training text is empty; the tokenizer needs text to learn segments from.")
        letter_counts = letter_word_counts(word_counts)
        stats = SuccessorVariety(letter_counts)
        cands = candidate_counts(word_counts, stats)
        cands = Counter({s: k for s, k in cands.items()
                         if k >= min_count and len(_utf8(s)) > 1 and not _has_surrogate(s)})
        if len(cands) < n_segments:
            raise AndreaError(f"requested {n_segments:,} segments but the corpus supplies only {len(cands):,} "
                              f"(pieces of two bytes or more that occur at least {min_count} times); "
                              f"give more text or ask for fewer segments.")
        segments = select_segments(cands, word_counts, n_segments, workers=workers, progress=progress, version=version)
        size = sum(len(_utf8(t)) for t in texts)
        meta = {
            "corpus": {"documents": len(texts), "bytes": size, "words": int(sum(word_counts.values())),
                       "distinct_words": len(word_counts), "weighted": weights is not None},
            "found": len(cands),
            "settings": {"min_count": min_count, "version": version},
        }
        tok = cls(segments, meta, words=stats.words)
        tok._stats = stats
        return tok

    @property
    def words(self) -> list[str] | None:
        """The word types behind the successor-variety statistics (None if they were not kept),
        read from harris_words.txt.gz when first asked for."""
        if self._words is None and self._words_file is not None:
            self._words, self._words_file = read_word_list(self._words_file), None
        return self._words

    @property
    def stats(self) -> SuccessorVariety | None:
        """The successor-variety statistics of the training corpus (None if they were not kept)."""
        if self._stats is None and self.words is not None:
            self._stats = SuccessorVariety(self._words)
        return self._stats

    # ---- saving and loading

    def to_dict(self) -> dict:
        """Everything encoding and decoding need, JSON-able (a checkpoint can embed it)."""
        return {"format": FORMAT, "version": 1, "word_pattern": WORD_PATTERN, "n_segments": self.n_segments,
                "vocab_size": self.vocab_size, "fingerprint": self.fingerprint(), **self.meta,
                "segments": list(self.segments)}

    @classmethod
    def from_dict(cls, d, where: str = "the tokenizer dict") -> "HarrisTokenizer":
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise AndreaError(f"{where} is not an ANDREA Harris tokenizer (no \"format\": \"{FORMAT}\").")
        if d.get("word_pattern", WORD_PATTERN) != WORD_PATTERN:
            raise AndreaError(f"{where} splits words with a pattern this version does not use.")
        segments = _check_segments(d.get("segments"), where)
        if d.get("fingerprint", None) not in (None, cls(segments).fingerprint()):
            raise AndreaError(f"{where} has a fingerprint that does not match its segments.")
        meta = {k: v for k, v in d.items() if k in ("corpus", "found", "settings")}
        return cls(segments, meta)

    def save(self, directory) -> Path:
        """Write harris_segments.json (the segments in id order), tokenizer.json (sizes, corpus,
        settings) and, when known, the word types behind the SV statistics."""
        directory = Path(directory)
        if directory.exists() and not directory.is_dir():
            raise AndreaError(f"{directory} is a file; the tokenizer is saved into a folder.")
        directory.mkdir(parents=True, exist_ok=True)
        text = json.dumps(self.segments, ensure_ascii=False, indent=0)
        if any(map(_has_surrogate, self.segments)):  # not UTF-8; \u escapes keep the file valid
            text = json.dumps(self.segments, ensure_ascii=True, indent=0)
        atomic_write_bytes(directory / SEGMENTS_FILE, (text + "\n").encode())
        meta = self.to_dict()
        del meta["segments"]
        atomic_write_bytes(directory / META_FILE, (json.dumps(meta, indent=2, ensure_ascii=False) + "\n").encode())
        if self._words is not None:
            atomic_write_bytes(directory / WORDS_FILE, gzip.compress(("\n".join(self._words) + "\n").encode(), mtime=0))
        elif self._words_file is not None and self._words_file.resolve() != (directory / WORDS_FILE).resolve():
            atomic_write_bytes(directory / WORDS_FILE, self._words_file.read_bytes())  # as it was: never inflated here
        return directory

    @classmethod
    def load(cls, path) -> "HarrisTokenizer":
        """From a folder written by save, or from a bare harris_segments.json (such as ANDREA's
        released file), whose segments get ids 257.. in the file's order."""
        path = Path(path)
        if not path.exists():
            raise AndreaError(f"{path} does not exist; expected a tokenizer folder with {SEGMENTS_FILE}.")
        seg_file = path / SEGMENTS_FILE if path.is_dir() else path
        if not seg_file.is_file():
            raise AndreaError(f"{path} has no {SEGMENTS_FILE}; is it a folder written by `andrea tokenizer train`?")
        segments = _check_segments(read_json(seg_file, "tokenizer file"), str(seg_file))
        meta, words = {}, None
        meta_file = seg_file.with_name(META_FILE)
        if path.is_dir() and meta_file.is_file():
            d = read_json(meta_file, "tokenizer file")
            d = {**d, "segments": segments} if isinstance(d, dict) else d
            tok = cls.from_dict(d, str(meta_file))
            if d.get("n_segments", len(segments)) != len(segments):
                raise AndreaError(f"{seg_file} holds {len(segments):,} segments but {meta_file.name} "
                                  f"says {d['n_segments']:,}; the two files do not belong together.")
            meta = tok.meta
        words_file = seg_file.with_name(WORDS_FILE)
        return cls(segments, meta, words, words_file if path.is_dir() and words_file.is_file() else None)


def read_word_list(path: Path, limit: int = MAX_WORDS_BYTES) -> list[str]:
    """The words of a harris_words.txt.gz, inflated a block at a time and at most `limit` bytes of
    them, so a small file that inflates to gigabytes (a gzip bomb) is refused, not read."""
    chunks, size = [], 0
    try:
        with gzip.open(path, "rb") as f:
            while block := f.read(1 << 20):
                size += len(block)
                if size > limit:
                    raise AndreaError(f"{path} inflates to more than {limit >> 20:,} MiB, more than any word list andrea "
                                      f"writes; delete it (the tokenizer works without it) or train the tokenizer again.")
                chunks.append(block)
        return b"".join(chunks).decode("utf-8").split()
    except (OSError, EOFError, UnicodeDecodeError, zlib.error):
        raise AndreaError(f"{path} is damaged (not gzip-compressed UTF-8 text).") from None


def _encode_slice(bounds):
    tok, texts, bos = _shared
    flat, lengths = array("i"), []  # an array crosses back to the parent as one block of bytes
    for t in texts[bounds[0] : bounds[1]]:
        ids = tok.encode(t, bos)
        flat.extend(ids)
        lengths.append(len(ids))
    return flat, lengths
