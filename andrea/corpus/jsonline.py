"""One JSONL line too long to hold whole, read as a stream: its text field comes out in pieces.

A line of a JSONL source is one JSON object. A line of some megabytes is parsed whole
(`andrea.files.parse_json`); a longer one (a whole book in one `text` field, or a hostile 300 MB
line) is read here from the stream of the file's bytes, so memory holds a few megabytes of it at a
time however long it is:

    { "key": value, ... }      keys are read whole (at most 1 MiB each); the value of the text
                               field must be a string, and it is decoded a chunk at a time (never
                               inside an escape, a UTF-8 character or a surrogate pair), so the
                               chunks join to exactly the string json.loads would return
                               other values are checked with parse_json when they are at most 1 MiB
                               long, and longer ones are skipped by their quotes and brackets
                               (nesting at most MAX_JSON_DEPTH deep)

The line ends at its first newline byte (JSON strings cannot hold a raw one). Anything that is not
such an object ends in the same sentences as a short line: naming the file and the line. Two
differences from a short line, where nothing can be held back: a text field given twice is refused
(json.loads would keep the last, which a stream cannot wait for), and a text of white space alone
is dropped only while it is at most 1 MiB (a longer one has gone out before it could be known).
"""

from __future__ import annotations

import re

from andrea.errors import AndreaError
from andrea.files import MAX_JSON_DEPTH, parse_json

CHUNK = 1 << 20  # raw bytes of the string decoded at once; also the longest key and checked value
_WS = b" \t\r"
_HIGH_SURROGATE = re.compile(rb"\\u[dD][89abAB][0-9a-fA-F]{2}")
_SCALAR_END = re.compile(rb"[,}\]\s]")


class LongLine:
    """The rest of one line of a file, read from `blocks` (an iterator of (bytes, on-disk bytes))
    after `head`, its first bytes. `text_chunks(field)` yields the field's text; afterwards `rest`
    holds the bytes after the line's newline (None at the end of the file) and `disk` the on-disk
    bytes of every block read (the caller takes them as it goes)."""

    def __init__(self, head: bytes, blocks, path, line: int):
        self.buf, self.pos, self.blocks = head, 0, blocks
        self.path, self.line, self.where = str(path), line, f"{path} line {line:,}"
        self.base = 0  # the offset in the line of buf[0]
        self.end = head.find(b"\n")  # the line's newline in buf (-1: not read yet)
        self.eof, self.disk, self.rest = False, 0, None

    # ---- bytes

    def _more(self) -> bool:
        """Read one more block of the line; False when the line or the file has ended."""
        if self.end >= 0 or self.eof:
            return False
        if self.pos > CHUNK:
            self.buf, self.base, self.pos = self.buf[self.pos:], self.base + self.pos, 0
        try:
            block, disk = next(self.blocks)
        except StopIteration:
            self.eof = True
            return False
        start = len(self.buf)
        self.buf += block
        self.disk += disk
        at = self.buf.find(b"\n", start)
        self.end = at
        return True

    def _limit(self) -> int:
        return self.end if self.end >= 0 else len(self.buf)

    def _have(self, n: int) -> int:
        """Bytes of the line available from pos, reading until there are n (or the line ends)."""
        while self._limit() - self.pos < n and self._more():
            pass
        return self._limit() - self.pos

    def _peek(self) -> bytes:
        """The next byte of the line that is not white space (b"" at the line's end)."""
        while True:
            if not self._have(1):
                return b""
            c = self.buf[self.pos : self.pos + 1]
            if c not in _WS:
                return c
            self.pos += 1

    def bad(self, what: str):
        raise AndreaError(f"{self.where} is not valid JSON ({what}).")

    def _expect(self, c: bytes) -> None:
        got = self._peek()
        if got != c:
            self.bad(f"expected {c.decode()!r} but found {got.decode('latin-1')!r}" if got else f"expected {c.decode()!r}")
        self.pos += 1

    # ---- strings

    def _string_end(self, start: int, limit: int) -> int:
        """Index in buf of the quote that closes the string whose content begins at start,
        looking at most `limit` bytes ahead (-1: not within them)."""
        i = start
        while True:
            stop = min(self._limit(), start + limit)
            q = self.buf.find(b'"', i, stop)
            if q < 0:
                return -1
            k = q
            while k > start and self.buf[k - 1] == 0x5C:  # the backslashes right before it
                k -= 1
            if (q - k) % 2 == 0:
                return q
            i = q + 1

    def _safe_cut(self, start: int, e: int) -> int:
        """The largest cut <= e in the string content buf[start:e + ...] that splits no UTF-8
        character, no escape and no surrogate pair."""
        buf = self.buf
        while e > start and buf[e] & 0xC0 == 0x80:
            e -= 1
        for j in range(e - 1, max(start, e - 6) - 1, -1):
            if buf[j] == 0x5C:
                k = j
                while k > start and buf[k - 1] == 0x5C:
                    k -= 1
                if (j - k) % 2 == 0:  # buf[j] starts an escape
                    if j + (6 if buf[j + 1 : j + 2] == b"u" else 2) > e:
                        e = j
                    break
        if e - 6 >= start and _HIGH_SURROGATE.fullmatch(buf, e - 6, e) and self._starts_escape(start, e - 6):
            e -= 6  # its low half follows: decode them together
        return e

    def _starts_escape(self, start: int, j: int) -> bool:
        k = j
        while k > start and self.buf[k - 1] == 0x5C:
            k -= 1
        return (j - k) % 2 == 0

    def _decode(self, raw: bytes) -> str:
        return parse_json(b'"' + raw + b'"', self.path, self.line)

    def string_chunks(self):
        """The string at pos (its opening quote next), decoded a chunk at a time."""
        self._expect(b'"')
        while True:
            self._have(CHUNK + 8)
            q = self._string_end(self.pos, CHUNK)
            if q >= 0:
                text = self._decode(self.buf[self.pos : q])
                self.pos = q + 1
                yield text
                return
            if self._limit() - self.pos <= CHUNK:  # the line ended inside the string
                self.bad("unterminated string")
            cut = self._safe_cut(self.pos, self.pos + CHUNK)
            if cut <= self.pos:
                self.bad("a broken escape in a string")
            yield self._decode(self.buf[self.pos : cut])
            self.pos = cut

    def _short_string(self, what: str) -> str:
        """A string of at most CHUNK bytes (a key), decoded whole."""
        self._expect(b'"')
        self._have(CHUNK + 1)
        q = self._string_end(self.pos, CHUNK + 1)
        if q < 0:
            self.bad(f"a {what} longer than {CHUNK:,} bytes" if self._limit() - self.pos > CHUNK else "unterminated string")
        text = self._decode(self.buf[self.pos : q])
        self.pos = q + 1
        return text

    # ---- other values

    def skip_value(self) -> None:
        """Step over one value: checked whole by parse_json when it is short, else by its quotes
        and brackets."""
        c = self._peek()
        start = self.base + self.pos
        if c == b'"':
            for _ in self.string_chunks():
                pass
        elif c in (b"[", b"{"):
            self._skip_nested()
        elif c:
            self._have(CHUNK)
            m = _SCALAR_END.search(self.buf, self.pos, self._limit())
            end = m.start() if m else self._limit()
            if end - self.pos > CHUNK:
                self.bad(f"a value longer than {CHUNK:,} bytes")
            parse_json(self.buf[self.pos : end], self.path, self.line)
            self.pos = end
            return
        else:
            self.bad("expected a value")
        if self.base + self.pos - start <= CHUNK and start >= self.base:  # still in memory: check it whole
            parse_json(self.buf[start - self.base : self.pos], self.path, self.line)

    def _skip_nested(self) -> None:
        depth = 0
        while True:
            c = self._peek()
            if not c:
                self.bad("unterminated array or object")
            if c == b'"':
                for _ in self.string_chunks():
                    pass
                continue
            self.pos += 1
            if c in (b"[", b"{"):
                depth += 1
                if depth > MAX_JSON_DEPTH:
                    raise AndreaError(f"{self.where} nests its JSON more than {MAX_JSON_DEPTH} levels deep; andrea reads "
                                      f"no JSON nested that deep.")
            elif c in (b"]", b"}"):
                depth -= 1
                if depth == 0:
                    return

    # ---- the object

    def text_chunks(self, field: str):
        """The text of `field`, in chunks; then the rest of the line is checked and skipped."""
        if self._peek() != b"{":
            raise AndreaError(f"{self.where} has no {field!r} field (it is no JSON object); name the text field with "
                              f"--text-field.")
        self.pos += 1
        found = False
        if self._peek() == b"}":
            self.pos += 1
        else:
            while True:
                key = self._short_string("key")
                self._expect(b":")
                if key == field:
                    if found:
                        self.bad(f"the field {field!r} is given twice")
                    if self._peek() != b'"':
                        raise AndreaError(f"{self.where} has a non-text {field!r} field; name the text field with --text-field.")
                    found = True
                    yield from self.string_chunks()
                else:
                    self.skip_value()
                c = self._peek()
                if c == b"}":
                    self.pos += 1
                    break
                if c != b",":
                    self.bad("expected ',' or '}' after a value")
                self.pos += 1
        if self._peek():
            self.bad("extra data after the object")
        if not found:
            raise AndreaError(f"{self.where} has no {field!r} field; name the text field with --text-field.")
        self.rest = self.buf[self.end + 1 :] if self.end >= 0 else None
        self.buf = b""
