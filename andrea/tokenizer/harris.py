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

Word ends (format version 2, trained by andrea.tokenizer.train version 5). A segment written with
the mark `</w>` after its text (" cat</w>") is a word end. In a tokenizer that has word ends, a
letter word (an optional space, then letters) is read as if followed by the mark: a word end
matches only where its text is the rest of such a word, and a plain segment never ends one (its
last piece is a word end or the bytes of one character). So " cat</w>" is the word cat and
nothing else, and the plain " cat" only ever begins longer words (cats, category): every token
that is a whole word is a word end. A word end's text is a letter word, and the mark stands for no
bytes: it is never typed, so no text can hold it (letters and "<" are never one word). Files
without a marked segment encode exactly as before.
Decoding joins the tokens' bytes and reads them as UTF-8 with 'surrogatepass'. A byte sequence
that encode never produces (a model can emit one) decodes each invalid stretch to U+FFFD.

The segments are found by andrea.tokenizer.train (successor variety, then pruning); this module
holds the rule that encodes with them and the files that keep them.
"""

from __future__ import annotations

import codecs
import gzip
import hashlib
import json
import os
import re
import zlib
from array import array
from itertools import chain
from pathlib import Path

from andrea import forkpool
from andrea.config import BOS
from andrea.errors import AndreaError
from andrea.files import atomic_write_bytes, read_json

# The word split, the longest-match rule and the word lookup, compiled (andrea/tokenizer/_harris.c, which
# setup builds where there is a C compiler). Without it (or with ANDREA_NO_COMPILED=1 set), the
# same steps run in Python: the same ids and segments, encoding about 3x slower.
try:
    if os.environ.get("ANDREA_NO_COMPILED", "") not in ("", "0"):
        raise ImportError
    from andrea.tokenizer import _harris as _compiled
except ImportError:
    _compiled = None
COMPILED = _compiled is not None

FIRST_SEGMENT = 257  # id of segment 0
MARK = "</w>"  # written after a word end's text in the segment list (module docstring, "Word ends")
END = "\0"  # what the mark is to the longest-match rule: a character after the word's last letter
LETTER_WORD = re.compile(r" ?[^\W\d_]+")

WORD_PATTERN = r"'(?:[sdmt]|ll|ve|re)| ?[^\W\d_]+| ?\d+| ?[^\s\w]+|_+|\s+(?!\S)|\s+"
WORD_RE = re.compile(WORD_PATTERN)

SEGMENTS_FILE = "harris_segments.json"
META_FILE = "tokenizer.json"
WORDS_FILE = "harris_words.txt.gz"  # the word types the successor-variety statistics count
FORMAT = "andrea-harris-tokenizer"

PARALLEL_CHARS = 1_500_000  # below this, starting worker processes costs more than it saves
CACHE_LIMIT = 1_000_000  # words remembered by encode before the cache starts over
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


def utf8(s: str) -> bytes:
    """The UTF-8 bytes of s, a lone surrogate as its three 'surrogatepass' bytes."""
    return s.encode("utf-8", "surrogatepass")


def has_surrogate(s: str) -> bool:
    """Whether s holds a lone surrogate (text that is not valid Unicode)."""
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


# ---------------------------------------------------------------- the encoding rule


def split_words(text: str) -> list[str]:
    """Step 1 of the encoding rule: the words of text, which concatenate back to it."""
    return _compiled.split(text) if _compiled is not None else WORD_RE.findall(text)


def ends_in_letter(word: str) -> bool:
    """Whether a word of WORD_PATTERN is a letter word (its last character a letter, [^\\W\\d_], and
    not a contraction such as 's): a word that word ends read as marked."""
    c = word[-1:]
    return c.isalnum() and not c.isdecimal() and not word.startswith("'")


def _longest_match(word: str, get, marked: bool = False) -> tuple[int, ...]:
    """Step 2 of the encoding rule on one word, where get(prefix) is None for a text that begins
    no segment, -1 for one that begins a segment but is none, else the segment's id; a word end is
    looked up as its text + END, and only when `marked` (a letter word, in a tokenizer that has
    word ends), where no plain segment may end the word."""
    ids, i, n = [], 0, len(word)
    while i < n:
        best, end, j = -1, i + 1, i + 1
        while j <= n:
            t = get(word[i:j])
            if t is None:
                break
            if t >= 0 and not (marked and j == n):
                best, end = t, j
            j += 1
        if j > n and marked:  # every character to the end matched a prefix: is the rest a word end?
            t = get(word[i:] + END)
            if t is not None and t >= 0:
                best, end = t, n
        if best >= 0:
            ids.append(best)
        else:
            ids.extend(utf8(word[i]))
        i = end
    return tuple(ids)


def is_word_end(segment: str) -> bool:
    """Whether a segment, as the segment list writes it, is a word end (" cat</w>")."""
    return segment.endswith(MARK)


def rule_key(segment: str) -> str:
    """The text the longest-match rule looks a segment up by: a word end's text + END."""
    return segment[: -len(MARK)] + END if segment.endswith(MARK) else segment


class Matcher:
    """The longest-match rule over a list of segments, with ids first + index, that segments can
    leave and rejoin (andrea.tokenizer.train.prune_segments): on the compiled trie where andrea.tokenizer._harris was built (`trie`),
    else on a dict of every prefix of every segment (`trie` is None). encode(word, end=True) -> its
    ids; with end false, the word is read as a piece that does not end its word (no word end matches)."""

    def __init__(self, segments: list[str], first: int):
        self.segments, self.first = segments, first
        self.marks = any(map(is_word_end, segments))
        keys = [rule_key(s) for s in segments]
        if _compiled is not None:
            self.trie = _compiled.trie(keys, first)
        else:
            # every prefix of every segment -> the segment's id when the prefix is one, else -1:
            # the longest match at a position is found by extending it while the text is a prefix
            self.trie = None
            self._table = {s[:j]: -1 for s in keys for j in range(1, len(s))}
            self._table.update((s, first + i) for i, s in enumerate(keys))

    def encode(self, word: str, end: bool = True) -> tuple[int, ...]:
        marked = end and self.marks and ends_in_letter(word)
        if self.trie is not None:
            return _compiled.encode_word(self.trie, word, marked)
        return _longest_match(word, self._table.get, marked)

    def set(self, index: int, present: bool):
        """Put segment `index` in (present) or take it out of the rule."""
        s, i = rule_key(self.segments[index]), self.first + index if present else -1
        if self.trie is not None:
            _compiled.set_id(self.trie, s, i)
        else:
            self._table[s] = i


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
        if not s or s == MARK:
            raise AndreaError(f"{where} has an empty segment at index {i}.")
        if s.endswith(MARK) and not LETTER_WORD.fullmatch(s[: -len(MARK)]):
            raise AndreaError(f"{where} has the word end {s[:40]!r} at index {i}, whose text is not a word of letters.")
        if END in s and re.search(r"[^\W\d_]\0", s):
            raise AndreaError(f"{where} has a segment with a letter before the character 0 at index {i}; "
                              f"no word holds one.")
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
        self._ids = {s: FIRST_SEGMENT + i for i, s in enumerate(self.segments)}
        self._bytes = [bytes([b]) for b in range(256)] + [b""] + [utf8(s.removesuffix(MARK)) for s in self.segments]
        self.word_ends = frozenset(FIRST_SEGMENT + i for i, s in enumerate(self.segments) if is_word_end(s))
        self._rule = Matcher(self.segments, FIRST_SEGMENT)  # step 2, compiled where it was built
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

    def segment_label(self, i) -> str:
        """id_to_piece, with the mark after a word end (" cat</w>"), so the two tokens of " cat" differ."""
        return self.id_to_piece(i) + (MARK if i in self.word_ends else "")

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

    def word_ids(self, word: str) -> list[int]:
        """The ids of a word as running text has it: its word-initial form, after a space (the
        one home of "a word's tokens" for the lesson, `andrea embed` and the word sets)."""
        return self.encode(" " + word, bos=False)

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
                or not forkpool.can_fork()):
            return [self.encode(t, bos) for t in texts]
        slices = forkpool.slices(texts, 4 * workers)
        out = []
        for flat, lengths in forkpool.map_forked(_encode_slice, (self, texts, bos), slices, workers):
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

    # ---- what training knew

    @property
    def words(self) -> list[str] | None:
        """The word types behind the successor-variety statistics (None if they were not kept),
        read from harris_words.txt.gz when first asked for."""
        if self._words is None and self._words_file is not None:
            self._words, self._words_file = read_word_list(self._words_file), None
        return self._words

    # ---- saving and loading

    def to_dict(self) -> dict:
        """Everything encoding and decoding need, JSON-able (a checkpoint can embed it)."""
        return {"format": FORMAT, "version": 2 if self.word_ends else 1, "word_pattern": WORD_PATTERN, "n_segments": self.n_segments,
                "vocab_size": self.vocab_size, "fingerprint": self.fingerprint(), **self.meta,
                "segments": list(self.segments)}

    @classmethod
    def from_dict(cls, d, where: str = "the tokenizer dict") -> "HarrisTokenizer":
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise AndreaError(f"{where} is not an ANDREA Harris tokenizer (no \"format\": \"{FORMAT}\").")
        if d.get("version", 1) not in (1, 2):
            raise AndreaError(f"{where} is tokenizer format version {str(d.get('version'))[:20]}; this release reads 1 and 2.")
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
        if any(map(has_surrogate, self.segments)):  # not UTF-8; \u escapes keep the file valid
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
                                  f"says {str(d['n_segments'])[:40]}; the two files do not belong together.")
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
    tok, texts, bos = forkpool.shared()
    flat, lengths = array("i"), []  # an array crosses back to the parent as one block of bytes
    for t in texts[bounds[0] : bounds[1]]:
        ids = tok.encode(t, bos)
        flat.extend(ids)
        lengths.append(len(ids))
    return flat, lengths
