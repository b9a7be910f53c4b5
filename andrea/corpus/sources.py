"""Sources in the formats people hold, read as a bounded stream of documents.

A source is one of
    a `.txt` file (also `.txt.gz`, `.txt.zst`)          plain UTF-8 text
    a `.jsonl` file (also `.jsonl.gz`, `.jsonl.zst`)    one JSON object per line; its text field
                                                        (`text` unless told otherwise) is a document
    a `.parquet` file                                   a string column (`text` unless told
                                                        otherwise), one document per row, read one
                                                        row group at a time
    a folder                                            every file of those kinds under it,
                                                        recursively, in sorted path order (other
                                                        files are left out)
    a fetched default source                            by name (`sotu`, ...) or by its cache folder:
                                                        its own train.jsonl and val.jsonl
A source is named by its file or folder name without the format suffixes (`wiki.jsonl.zst` is
`wiki`), or explicitly as `NAME=PATH`.

Documents of plain text. A document is a run of whole paragraphs (paragraphs are separated by a
blank line: a line holding only spaces or tabs): it ends at the first blank line that starts at
least 20,000 bytes after its own start, or at the end of the file, and its leading and trailing
white space is dropped. A document with no such blank line within 1 MiB (a single huge line, a
file without paragraphs) is read in pieces of at most 1 MiB, each cut just before a space that
follows a non-space character (so the pieces encode to exactly the tokens of the whole), or after
a line end, or, failing both, at a character boundary; only the first piece starts with BOS and
every piece goes to the split of the first.

Documents of JSONL. A line is one document, parsed whole up to CHUNK_BYTES; a longer line is read
from the stream (andrea.corpus.jsonline) and its text comes in pieces cut as above, so memory holds a few
megabytes of it however long it is, and the pieces encode to the tokens of the whole.

The validation split. Every document of a source is in validation when the first 8 bytes of the
BLAKE2b digest of its UTF-8 bytes (of its first piece, when it is read in pieces), read as a
big-endian integer, fall below `val_share` x 2^64. The choice depends on the document alone, so
adding files to a source, or reordering them, never moves a document from one split to the
other. A fetched default source keeps the split it was fetched with (`corpus.VAL_EVERY`).

The reader works in tasks of about CHUNK_BYTES of input, so memory stays bounded whatever the
size of a source; a task is turned into text (decoded, parsed) by whoever runs it, which lets
`andrea.prepare` run tasks on worker processes.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import re
import zlib
from dataclasses import dataclass
from pathlib import Path

from andrea.corpus.fetched import SPLIT_FILES, check_fetched, is_fetched_folder
from andrea.corpus.jsonline import LongLine
from andrea.corpus.registry import resolve_source
from andrea.errors import AndreaError
from andrea.files import check_regular, parse_json

VAL_SHARE = 0.05  # the share of documents held out for validation (a fetched source keeps its own)
DOC_BYTES = 20_000  # a plain-text document ends at the first blank line this far into it
PIECE_BYTES = 1 << 20  # longest piece of a document read at once
CHUNK_BYTES = 4 << 20  # input per task
READ_BYTES = 4 << 20  # one read from a file
PARQUET_BATCH = 2048  # rows per batch read from a row group

TEXT, JSONL, PARQUET = "text", "jsonl", "parquet"
PIECES = "pieces"  # the text of one long JSONL line, in pieces
SUFFIXES = {  # suffix -> (kind, compression)
    ".txt": (TEXT, None), ".txt.gz": (TEXT, "gz"), ".txt.zst": (TEXT, "zst"),
    ".jsonl": (JSONL, None), ".jsonl.gz": (JSONL, "gz"), ".jsonl.zst": (JSONL, "zst"),
    ".parquet": (PARQUET, None),
}
_PARAGRAPH_BREAK = re.compile(rb"\n[ \t\r]*\n")
_SPACE = frozenset(b" \t\n\r\f\v")
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


# ---------------------------------------------------------------- the split


def is_validation(doc: bytes, val_share: float) -> bool:
    """The split rule of the module docstring: BLAKE2b of the document's bytes below share x 2^64."""
    h = int.from_bytes(hashlib.blake2b(doc, digest_size=8).digest(), "big")
    return h < val_share * 2.0**64


def cut_point(buf: bytes, limit: int) -> int:
    """Where to end a piece of at most `limit` bytes of buf (len(buf) > limit): just before a
    space that follows a non-space, else just after a line end, else at a character boundary."""
    lo, i = limit // 2, limit
    while True:
        i = buf.rfind(b" ", lo, i)
        if i <= lo:
            break
        if buf[i - 1] not in _SPACE and buf[i + 1] not in _SPACE:
            return i
    i = buf.rfind(b"\n", lo, limit)
    if i > lo:
        return i + 1
    i = limit
    while i > 1 and (buf[i] & 0xC0) == 0x80:  # not in the middle of a UTF-8 character
        i -= 1
    return i


def first_piece(doc: bytes) -> bytes:
    """The bytes the split of a document is decided on: the document, or its first piece."""
    return doc if len(doc) <= PIECE_BYTES else doc[: cut_point(doc, PIECE_BYTES)]


# ---------------------------------------------------------------- files of a source


@dataclass(frozen=True)
class InputFile:
    path: Path
    kind: str  # TEXT, JSONL or PARQUET
    compression: str | None  # None, "gz" or "zst"
    split: str | None = None  # "train" or "val" for a fetched source's files, else None (by hash)

    @property
    def size(self) -> int:
        return self.path.stat().st_size


def format_of(path: Path):
    name = path.name.lower()
    for suffix in sorted(SUFFIXES, key=len, reverse=True):
        if name.endswith(suffix):
            return SUFFIXES[suffix]
    return None


def _strip_suffix(name: str) -> str:
    low = name.lower()
    for suffix in sorted(SUFFIXES, key=len, reverse=True):
        if low.endswith(suffix) and len(name) > len(suffix):
            return name[: -len(suffix)]
    return Path(name).stem or name


@dataclass
class SourceSpec:
    """A source to read: its name and its files, in reading order."""

    name: str
    path: Path
    files: list[InputFile]

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    def signature(self) -> list:
        """What the source's files are (name, size, modification time): equal signatures, same input."""
        out = []
        for f in self.files:
            st = f.path.stat()
            out.append([str(f.path), st.st_size, st.st_mtime_ns, f.split])
        return out


def resolve(spec) -> SourceSpec:
    """A source given by name (a fetched default source), by path, or as NAME=PATH."""
    text = str(spec)
    name = None
    if "=" in text and not Path(text).exists():
        name, text = text.split("=", 1)
        if not _NAME_RE.fullmatch(name):
            raise AndreaError(f"{name!r} is not a usable source name (letters, digits, '.', '_', '-').")
    path = resolve_source(text)
    if name is None:
        name = path.name if path.is_dir() else _strip_suffix(path.name)
    if is_fetched_folder(path):
        check_fetched(path)  # a missing split would otherwise leave the other one read as the whole source
        files = [InputFile(path / f, JSONL, None, f.split(".")[0]) for f in SPLIT_FILES]
    elif path.is_dir():
        found = []
        for root, dirs, names in os.walk(path):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            for n in names:
                p = Path(root) / n
                fmt = None if n.startswith(".") else format_of(p)
                if fmt is not None:
                    found.append(InputFile(p, *fmt))
        files = sorted(found, key=lambda f: f.path.relative_to(path).as_posix())
        if not files:
            raise AndreaError(f"{path} holds no .txt, .txt.gz, .txt.zst, .jsonl, .jsonl.gz, .jsonl.zst or .parquet files.")
    else:
        fmt = format_of(path) or (TEXT, None)  # a file named on its own is read as plain text
        files = [InputFile(path, *fmt)]
    for f in files:  # checked before any work starts
        check_regular(f.path, "the source file")  # a FIFO would block the reader, a device never end
        problem = zstd_truncation(f.path) if f.compression == "zst" else None
        if problem:
            raise AndreaError(f"{f.path} {problem}: it is truncated or damaged; copy or download it again.")
    return SourceSpec(name, path, files)


# ---------------------------------------------------------------- reading bytes


def _need(module: str, what: str):
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise AndreaError(f"reading {what} needs the Python package {module}; install it with "
                          f"`pip install {module}`.") from None


class _Counting:
    """A binary file that counts the bytes read from disk (for progress in on-disk bytes)."""

    def __init__(self, f):
        self.f = f
        self.n = 0

    def read(self, n=-1):
        b = self.f.read(n)
        self.n += len(b)
        return b

    def readinto(self, b):
        k = self.f.readinto(b)
        self.n += k or 0
        return k

    def readable(self):
        return True

    def close(self):
        self.f.close()


def _open(f: InputFile):
    """(stream of decompressed bytes, the _Counting of on-disk bytes read)."""
    try:
        raw = _Counting(open(f.path, "rb"))
    except IsADirectoryError:
        raise AndreaError(f"{f.path} is a folder, not a file.") from None
    except OSError as e:
        raise AndreaError(f"cannot read {f.path} ({e.strerror}).") from None
    if f.compression == "gz":
        return gzip.GzipFile(fileobj=raw, mode="rb"), raw
    if f.compression == "zst":
        zstd = _need("zstandard", f"{f.path} (zstd)")
        return zstd.ZstdDecompressor().stream_reader(raw, read_across_frames=True, closefd=True), raw
    return raw, raw


ZSTD_MAGIC, SKIPPABLE_MAGIC = 0xFD2FB528, 0x184D2A50  # a skippable frame's magic is 0x184D2A5?


def zstd_truncation(path) -> str | None:
    """Where a .zst file ends too early (or holds nothing), or None when its last frame is whole.

    A zstd decoder reading a stream gives back what the file holds and stops at its end, so a
    file cut short reads as if it were whole, less its tail. This walks the frames' headers and
    block headers (RFC 8878: a frame is its magic number, a header whose size its first byte
    sets, blocks of a 3-byte header each, the last one flagged, then an optional 4-byte
    checksum) without decompressing, and says whether every frame ends inside the file. Bytes
    that are not a frame are left to the decoder, which names them."""
    size = os.path.getsize(path)
    if size == 0:
        return "is empty, so it holds no zstd frame"
    with open(path, "rb") as f:
        pos = 0

        def take(n: int) -> bytes:
            nonlocal pos
            f.seek(pos)
            pos += n
            return f.read(n)

        while pos < size:
            start = pos
            magic = take(4)
            if len(magic) < 4:
                return f"ends inside the header of a zstd frame at byte {start:,}"
            kind = int.from_bytes(magic, "little")
            if kind & 0xFFFFFFF0 == SKIPPABLE_MAGIC:
                length = take(4)
                pos += int.from_bytes(length, "little")
            elif kind == ZSTD_MAGIC:
                head = take(1)
                if not head:
                    return f"ends inside the header of the zstd frame at byte {start:,}"
                fhd = head[0]
                single = fhd >> 5 & 1
                pos += (1 - single) + (0, 1, 2, 4)[fhd & 3] + (single, 2, 4, 8)[fhd >> 6]
                last = 0
                while not last:
                    block = take(3)
                    if len(block) < 3:
                        return f"ends inside the zstd frame that starts at byte {start:,}"
                    header = int.from_bytes(block, "little")
                    last, kind_of_block, length = header & 1, header >> 1 & 3, header >> 3
                    if kind_of_block == 3:
                        return None  # a reserved block type: damaged, and the decoder says so
                    pos += 1 if kind_of_block == 1 else length  # an RLE block stores one byte
                pos += 4 if fhd & 4 else 0  # the content checksum
            else:
                return None  # not a frame: the decoder says what it found
            if pos > size:
                return f"ends inside the zstd frame that starts at byte {start:,} (of {size:,} bytes)"
    return None


def _blocks(f: InputFile):
    """(block of decompressed bytes, on-disk bytes it took) until the end of the file."""
    stream, raw = _open(f)
    try:
        before = 0
        while True:
            try:
                block = stream.read(READ_BYTES)
            except EOFError:  # gzip: the stream stops before its end marker
                raise AndreaError(f"{f.path} ends before its gzip stream does: it is truncated; "
                                  f"copy or download it again.") from None
            except (OSError, zlib.error) as e:  # gzip.BadGzipFile is an OSError
                raise AndreaError(f"{f.path} is not a readable {f.compression or 'text'} file ({e}).") from None
            except Exception as e:  # zstandard.ZstdError
                if type(e).__module__.startswith("zstandard"):
                    raise AndreaError(f"{f.path} is not a readable zstd file ({e}).") from None
                raise
            if not block:
                return
            yield block, raw.n - before
            before = raw.n
    finally:
        stream.close()


# ---------------------------------------------------------------- tasks
#
# A task is a tuple a worker can run (run_task): ("text", path, pieces) with pieces a list of
# (bytes, bos, is_val, byte offset, line); ("jsonl", path, first line, block, field, split,
# val_share); ("parquet", path, row group, column, split, val_share). The reader yields
# (task, on-disk bytes it covers).


def _text_tasks(f: InputFile, val_share: float):
    pieces, size, disk = [], 0, 0
    for piece in _text_pieces(f, val_share):
        pieces.append(piece[:5])
        size += len(piece[0])
        disk += piece[5]
        if size >= CHUNK_BYTES:
            yield (TEXT, str(f.path), pieces), disk
            pieces, size, disk = [], 0, 0
    if pieces or disk:
        yield (TEXT, str(f.path), pieces), disk


def _text_pieces(f: InputFile, val_share: float):
    """Pieces (bytes, bos, is_val, offset, line, disk bytes) of the plain-text file, as the module
    docstring defines documents and pieces."""
    buf, pos = b"", 0  # buf[pos:] is not read yet
    offset, line = 0, 1  # of buf[pos] in the decompressed file
    started, in_val, doc_len = False, False, 0  # the current document: BOS written, its split, bytes so far
    pending_disk = 0
    blocks = _blocks(f)
    eof = False

    def emit(end: int, drop: int, last: bool):
        """The piece buf[pos:end] of the current document, then skip `drop` more bytes."""
        nonlocal pos, offset, line, started, in_val, doc_len, pending_disk
        piece = buf[pos:end]
        start_off, start_line = offset, line
        if not started:
            stripped = piece.lstrip()
            start_off += len(piece) - len(stripped)
            start_line += piece.count(b"\n", 0, len(piece) - len(stripped))
            piece = stripped
        if last:
            piece = piece.rstrip()
        line += buf.count(b"\n", pos, end + drop)
        offset += end + drop - pos
        pos = end + drop
        out = None
        if piece:
            if not started:
                in_val = f.split == "val" if f.split else is_validation(piece, val_share)
            out = (piece, not started, in_val, start_off, start_line, pending_disk)
            started, pending_disk = True, 0
            doc_len += len(piece)
        if last:
            started, doc_len = False, 0
        return out

    while True:
        start = pos + max(0, DOC_BYTES - doc_len)
        limit = pos + PIECE_BYTES
        m = _PARAGRAPH_BREAK.search(buf, start, limit + 1) if len(buf) > start else None
        if m is not None:
            piece = emit(m.start(), m.end() - m.start(), last=True)
        elif len(buf) > limit:
            piece = emit(pos + cut_point(buf[pos : limit + 1], PIECE_BYTES), 0, last=False)
        elif eof:
            if len(buf) > pos or started:
                piece = emit(len(buf), 0, last=True)
                if piece is not None:
                    yield piece
            if pending_disk:
                yield (b"", False, False, offset, line, pending_disk)
            return
        else:
            try:
                block, disk = next(blocks)
                buf, pos = buf[pos:] + block, 0
                pending_disk += disk
            except StopIteration:
                eof = True
            continue
        if piece is not None:
            yield piece


def _jsonl_tasks(f: InputFile, field: str, val_share: float):
    buf, line, disk = b"", 1, 0
    blocks = _blocks(f)
    for block, d in blocks:
        buf += block
        disk += d
        while len(buf) >= CHUNK_BYTES:
            end = buf.rfind(b"\n", 0, CHUNK_BYTES) + 1
            if end == 0:  # one line longer than a chunk: read in pieces, never whole
                reader = LongLine(buf, blocks, f.path, line)
                yield from _long_line_tasks(reader, f, field, val_share, disk)
                buf, disk, line = reader.rest or b"", 0, line + 1
                if reader.rest is None:
                    return
                continue
            yield (JSONL, str(f.path), line, buf[:end], field, f.split, val_share), disk
            line += buf.count(b"\n", 0, end)
            buf, disk = buf[end:], 0
    if buf or disk:
        yield (JSONL, str(f.path), line, buf, field, f.split, val_share), disk


def _long_line_tasks(reader, f: InputFile, field: str, val_share: float, disk: int):
    """Tasks of pieces of the text of one long JSONL line (andrea.corpus.jsonline), cut as the pieces of
    a long plain-text document are (so they encode to exactly the tokens of the whole, and the
    split is decided on the same first piece). A text of white space alone is dropped as a short
    line's is, unless it runs past PIECE_BYTES before its first other character."""
    pending, pieces, size, first, in_val = b"", [], 0, True, False

    def take(raw: bytes) -> None:
        nonlocal first, in_val, size
        if first:
            in_val = f.split == "val" if f.split else is_validation(raw, val_share)
        pieces.append((raw, first, in_val))
        first, size = False, size + len(raw)

    for text in reader.text_chunks(field):
        pending += text.encode("utf-8", "surrogatepass")
        while len(pending) > PIECE_BYTES:
            cut = cut_point(pending, PIECE_BYTES)
            take(pending[:cut])
            pending = pending[cut:]
        if size >= CHUNK_BYTES:
            yield (PIECES, str(f.path), pieces), disk + reader.disk
            pieces, size, disk, reader.disk = [], 0, 0, 0
    if pending and (not first or pending.decode("utf-8", "surrogatepass").strip()):
        take(pending)
    yield (PIECES, str(f.path), pieces), disk + reader.disk
    reader.disk = 0


def _parquet_file(path: Path):
    _need("pyarrow", f"{path} (parquet)")
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(path)
    except (FileNotFoundError, PermissionError, IsADirectoryError) as e:
        raise AndreaError(f"cannot read {path} ({e.strerror or e}).") from None
    except Exception as e:  # pyarrow.ArrowInvalid and the like
        raise AndreaError(f"{path} is not a readable parquet file ({e}).") from None


def _parquet_tasks(f: InputFile, column: str, val_share: float):
    import pyarrow as pa

    pf = _parquet_file(f.path)
    schema = pf.schema_arrow
    if schema.get_field_index(column) < 0:
        raise AndreaError(f"{f.path} has no column {column!r} (its columns: {', '.join(schema.names) or 'none'}); "
                          f"name the text column with --text-field.")
    kind = schema.field(column).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)
            or getattr(pa.types, "is_string_view", lambda t: False)(kind)):
        raise AndreaError(f"column {column!r} of {f.path} holds {kind}, not text.")
    n = pf.metadata.num_row_groups
    size = f.size
    for rg in range(n):
        disk = size * (rg + 1) // n - size * rg // n
        yield (PARQUET, str(f.path), rg, column, f.split, val_share), disk
    if n == 0:
        yield (PARQUET, str(f.path), -1, column, f.split, val_share), size


def tasks(src: SourceSpec, text_field: str = "text", val_share: float = VAL_SHARE):
    """(task, on-disk bytes) for every file of the source, in order."""
    for f in src.files:
        if f.kind == TEXT:
            yield from _text_tasks(f, val_share)
        elif f.kind == JSONL:
            yield from _jsonl_tasks(f, text_field, val_share)
        else:
            yield from _parquet_tasks(f, text_field, val_share)


# ---------------------------------------------------------------- running a task


def documents(task):
    """The task's text: (text, bos, is_val, n_bytes) for every document or piece, in order."""
    kind, path = task[0], task[1]
    if kind == TEXT:
        for piece, bos, in_val, offset, line in task[2]:
            if not piece:
                continue
            try:
                text = piece.decode("utf-8")
            except UnicodeDecodeError as e:
                at = offset + e.start
                where = line + piece.count(b"\n", 0, e.start)
                raise AndreaError(f"{path} is not UTF-8 text: invalid bytes at line {where:,} (byte {at:,}).") from None
            yield text, bos, in_val, len(piece)
    elif kind == PIECES:
        for piece, bos, in_val in task[2]:
            yield piece.decode("utf-8", "surrogatepass"), bos, in_val, len(piece)
    elif kind == JSONL:
        _, _, first, block, field, split, val_share = task
        for k, raw in enumerate(block.split(b"\n")):
            if not raw.strip():
                continue
            n = first + k
            obj = parse_json(raw, path, line=n)
            text = obj.get(field) if isinstance(obj, dict) else None
            if not isinstance(text, str):
                what = "has no" if not isinstance(obj, dict) or field not in obj else "has a non-text"
                raise AndreaError(f"{path} line {n:,} {what} {field!r} field; name the text field with --text-field.")
            yield from _one_document(text, split, val_share)
    else:
        _, _, rg, column, split, val_share = task
        if rg < 0:
            return
        pf = _parquet_file(Path(path))
        try:
            batches = pf.iter_batches(batch_size=PARQUET_BATCH, row_groups=[rg], columns=[column])
            for batch in batches:
                for text in batch.column(0).to_pylist():
                    if text:
                        yield from _one_document(text, split, val_share)
        except AndreaError:
            raise
        except Exception as e:
            raise AndreaError(f"row group {rg} of {path} could not be read ({e}).") from None


def _one_document(text: str, split, val_share):
    if not text.strip():
        return
    raw = text.encode("utf-8", "surrogatepass")
    in_val = split == "val" if split else is_validation(first_piece(raw), val_share)
    yield text, True, in_val, len(raw)


def read_documents(spec, split: str = "train", text_field: str = "text", val_share: float = VAL_SHARE):
    """Every document of one split of a source, as strings, streamed (a document read in pieces
    comes as its pieces, the first of them starting the document)."""
    src = resolve(spec) if not isinstance(spec, SourceSpec) else spec
    want_val = split == "val"
    for task, _ in tasks(src, text_field, val_share):
        for text, bos, in_val, _ in documents(task):
            if in_val == want_val:
                yield text, bos
