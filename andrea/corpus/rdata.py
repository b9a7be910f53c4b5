"""Character vectors from R's lazy-load data files (`.rdx` and `.rdb`), read without R.

An R package whose data loads lazily keeps it in two files. `Rdata.rdx` is a gzip-compressed
serialization of a named list: `variables`, a named list of integer pairs (offset, length) into
`Rdata.rdb`; `references` (environments, which plain data never needs); and `compressed`, how the
chunks are compressed (TRUE or 1: zlib). A chunk of the .rdb is the object's serialized length as
a 4-byte big-endian integer, then a zlib stream of the serialized object.

Serializations here are R's XDR format (`X\\n`, versions 2 and 3): big-endian 32-bit integers,
every item opening with a flags word whose low byte is its type; bit 9 says attributes follow the
item, bit 10 that a tag comes before a pairlist node's value. The reader knows exactly the types
such data holds (NULL, symbols and references back to them, pairlists for attributes, logical,
integer, double and character vectors, and lists); any other type, a length past the end of the
data, nesting deeper than MAX_DEPTH or more than MAX_VALUES values in one object (elements,
strings, list items and pairlist nodes together: a few bytes of data each, but a Python object
each, so the bound is on them and not only on the bytes) is refused with one sentence. Nothing is
evaluated.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field

from andrea.errors import AndreaError

SYMSXP, LISTSXP, CHARSXP, LGLSXP, INTSXP, REALSXP, STRSXP, VECSXP = 1, 2, 9, 10, 13, 14, 16, 19
NILVALUE_SXP, REFSXP = 254, 255
HAS_ATTR, HAS_TAG = 1 << 9, 1 << 10
LATIN1_MASK = 1 << 2  # in a CHARSXP's levels (flags >> 12): the string's bytes are Latin-1
NA_INTEGER = -(1 << 31)
MAX_DEPTH = 32
MAX_CHUNK = 1 << 28  # 256 MB: the most one object may decompress to
MAX_INDEX = 1 << 24  # 16 MB: the most an index may decompress to
MAX_VALUES = 1 << 20  # values in one object (janeaustenr's largest novel holds about 16,000 lines)
VECTOR_TYPES = {LGLSXP: "logical", INTSXP: "integer", REALSXP: "double", STRSXP: "character", VECSXP: "list"}


@dataclass
class RValue:
    """One R object: its type ("character", "list", "pairlist", ...), elements and attributes."""

    type: str
    values: list
    attrs: dict = field(default_factory=dict)

    def names(self) -> list:
        names = self.attrs.get("names")
        return names.values if names is not None and names.type == "character" else []


class _Unserializer:
    def __init__(self, data: bytes, what: str):
        self.data, self.pos, self.what, self.refs = data, 0, what, []
        self.values_left = MAX_VALUES

    def count(self, n: int) -> None:
        """Spend n values of the object's budget (before they are made)."""
        self.values_left -= n
        if self.values_left < 0:
            raise self.fail(f"holds more than {MAX_VALUES:,} R values, more than this reader takes")

    def fail(self, why: str) -> AndreaError:
        return AndreaError(f"{self.what} {why}.")

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise self.fail("ends in the middle of an R object")
        self.pos += n
        return self.data[self.pos - n : self.pos]

    def int(self) -> int:
        return struct.unpack(">i", self.take(4))[0]

    def header(self) -> None:
        if self.take(2) != b"X\n":
            raise self.fail("is not an R serialization in XDR format")
        version = self.int()
        self.take(8)  # the R versions that wrote it and that can read it
        if version == 3:
            self.take(self.int())  # the writer's native encoding
        elif version != 2:
            raise self.fail(f"is R serialization version {version}; only versions 2 and 3 are read")

    def length(self, least_bytes: int) -> int:
        """A vector's length, checked against the bytes left (each element needs least_bytes)."""
        n = self.int()
        if n == -1:  # a long vector: the length follows as two 32-bit halves
            n = (self.int() << 32) | (self.int() & 0xFFFFFFFF)
        if n < 0 or n * least_bytes > len(self.data) - self.pos:
            raise self.fail("holds a vector longer than the data around it")
        self.count(n)
        return n

    def string(self):
        flags = self.int()
        if flags & 0xFF != CHARSXP:
            raise self.fail(f"holds an R object of type {flags & 0xFF} where a string belongs")
        n = self.int()
        if n == -1:
            return None  # NA_character_
        raw = self.take(n)
        if (flags >> 12) & LATIN1_MASK:
            return raw.decode("latin-1")
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail("holds a string that is not valid UTF-8") from None

    def item(self, depth: int = 0) -> RValue:
        if depth > MAX_DEPTH:
            raise self.fail(f"nests R objects deeper than {MAX_DEPTH} levels")
        flags = self.int()
        kind = flags & 0xFF
        self.count(1)
        if kind == NILVALUE_SXP:
            return RValue("NULL", [])
        if kind == REFSXP:
            i = (flags >> 8) or self.int()
            if not 1 <= i <= len(self.refs):
                raise self.fail("refers back to an R object it never defined")
            return self.refs[i - 1]
        if kind == SYMSXP:
            symbol = RValue("symbol", [self.string()])
            self.refs.append(symbol)
            return symbol
        if kind == LISTSXP:
            return self.pairlist(flags, depth)
        if kind not in VECTOR_TYPES:
            raise self.fail(f"holds an R object of type {kind}, which this reader does not read")
        if kind in (LGLSXP, INTSXP):
            n = self.length(4)
            values = [None if v == NA_INTEGER else v for v in struct.unpack(f">{n}i", self.take(4 * n))]
            if kind == LGLSXP:
                values = [None if v is None else bool(v) for v in values]
        elif kind == REALSXP:
            n = self.length(8)
            values = list(struct.unpack(f">{n}d", self.take(8 * n)))
        elif kind == STRSXP:
            values = [self.string() for _ in range(self.length(8))]
        else:
            values = [self.item(depth + 1) for _ in range(self.length(4))]
        value = RValue(VECTOR_TYPES[kind], values)
        if flags & HAS_ATTR:
            value.attrs = self.attributes(depth)
        return value

    def pairlist(self, flags: int, depth: int) -> RValue:
        """A pairlist, read node by node (not recursing down its tail): values and their tags."""
        values, tags = [], []
        while True:
            self.count(1)
            if flags & HAS_ATTR:
                self.attributes(depth)  # a node's own attributes: never needed here
            tag = self.item(depth + 1) if flags & HAS_TAG else None
            if tag is not None and tag.type != "symbol":
                raise self.fail("tags a pairlist node with something other than a name")
            tags.append(tag.values[0] if tag is not None else "")
            values.append(self.item(depth + 1))
            flags = self.int()
            if flags & 0xFF == NILVALUE_SXP:
                return RValue("pairlist", values, {"names": RValue("character", tags)})
            if flags & 0xFF != LISTSXP:
                raise self.fail("ends a pairlist with something other than NULL")

    def attributes(self, depth: int) -> dict:
        attrs = self.item(depth + 1)
        if attrs.type != "pairlist":
            raise self.fail("gives an R object attributes that are not a pairlist")
        return dict(zip(attrs.names(), attrs.values))


def unserialize(data: bytes, what: str) -> RValue:
    """The R object that an XDR serialization holds; `what` names it in errors."""
    reader = _Unserializer(data, what)
    reader.header()
    return reader.item()


def _inflate(data: bytes, wbits: int, limit: int, what: str) -> bytes:
    """A whole zlib (wbits 15) or gzip (wbits 31) stream, refused past `limit` bytes."""
    d = zlib.decompressobj(wbits)
    try:
        out = d.decompress(data, limit + 1)
    except zlib.error as e:
        raise AndreaError(f"{what} is damaged ({e}).") from None
    if len(out) > limit:
        raise AndreaError(f"{what} decompresses to more than {limit:,} bytes.")
    if not d.eof:
        raise AndreaError(f"{what} is cut short: its compressed stream does not end.")
    return out


def _index_entry(index: RValue, name: str, what: str) -> RValue:
    if index.type != "list" or name not in index.names():
        raise AndreaError(f"{what} is not a lazy-load index: it has no {name} entry.")
    return index.values[index.names().index(name)]


def read_lazyload(rdx: bytes, rdb: bytes, what: str) -> dict[str, RValue]:
    """Every object of a lazy-load database, by name, in the index's order."""
    raw = _inflate(rdx, 31, MAX_INDEX, f"{what}'s index") if rdx[:2] == b"\x1f\x8b" else rdx
    index = unserialize(raw, f"{what}'s index")
    compressed = _index_entry(index, "compressed", what)
    if compressed.type not in ("logical", "integer") or compressed.values[:1] not in ([True], [1]):
        raise AndreaError(f"{what} compresses its objects in a way other than zlib ({compressed.values[:1]}), "
                          "which this reader does not read.")
    variables = _index_entry(index, "variables", what)
    if variables.type != "list" or len(variables.names()) != len(variables.values):
        raise AndreaError(f"{what}'s index does not name every object it holds.")
    out = {}
    for name, where in zip(variables.names(), variables.values):
        if where.type != "integer" or len(where.values) != 2 or None in where.values:
            raise AndreaError(f"{what}'s index gives {name} no (offset, length) pair.")
        offset, n = where.values
        if offset < 0 or n < 4 or offset + n > len(rdb):
            raise AndreaError(f"{what}'s index places {name} outside its {len(rdb):,}-byte database.")
        chunk = rdb[offset : offset + n]
        size = int.from_bytes(chunk[:4], "big")
        if size > MAX_CHUNK:
            raise AndreaError(f"{what} says {name} is {size:,} bytes, more than {MAX_CHUNK:,}.")
        data = _inflate(chunk[4:], 15, size, f"{what}'s {name}")
        if len(data) != size:
            raise AndreaError(f"{what}'s {name} is {len(data):,} bytes, not the {size:,} its header says.")
        out[name] = unserialize(data, f"{what}'s {name}")
    return out
