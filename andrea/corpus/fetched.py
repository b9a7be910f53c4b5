"""A fetched source's cache folder: its record (meta.json) and its two split files, checked.

`andrea data fetch` leaves each source in `~/.cache/andrea/corpus/<name>/` as meta.json (what was
fetched, and how many documents and bytes each split holds) beside train.jsonl and val.jsonl (one
document per line). Before a folder is read or listed, `fetched_problem` checks that the record
is whole and that each split file holds as many whole lines as the record counts, so a damaged or
half-removed cache is refetched instead of being read as if it were whole.
"""

from __future__ import annotations

from pathlib import Path

from andrea.errors import AndreaError
from andrea.files import check_regular, read_json

READ_BYTES = 4 << 20  # one read from a file

SPLIT_FILES = ("train.jsonl", "val.jsonl")  # a fetched source's documents, beside its record meta.json
RECORD_COUNTS = ("documents", "train_documents", "val_documents", "train_bytes", "val_bytes")


def is_fetched_folder(path: Path) -> bool:
    """A fetched source's cache folder: its record, meta.json, beside one of its split files."""
    return path.is_dir() and (path / "meta.json").exists() and any((path / f).exists() for f in SPLIT_FILES)


def fetched_problem(path: Path) -> str | None:
    """What is wrong with a fetched source's cache folder (its record, both split files, each
    holding as many whole lines as the record counts documents), or None."""
    try:
        meta = read_json(path / "meta.json", "the record")
    except AndreaError as e:
        return str(e).rstrip(".")
    if not isinstance(meta, dict):
        return "its record meta.json is not a JSON object"
    bad = [k for k in RECORD_COUNTS if not (type(meta.get(k)) is int and meta[k] >= 0)]
    if bad:
        return f"its record meta.json has no count {bad[0]!r}"
    if meta["train_documents"] + meta["val_documents"] != meta["documents"]:
        return "its record meta.json counts documents that do not add up"
    for name in SPLIT_FILES:
        try:
            lines, ends_whole = _count_lines(check_regular(path / name, "its split file"))
        except AndreaError as e:
            return str(e).rstrip(".")
        expected = meta[f"{name.split('.')[0]}_documents"]
        if lines != expected or not ends_whole:
            return f"{name} holds {lines:,} whole lines but the record counts {expected:,} documents"
    return None


def check_fetched(path: Path) -> dict:
    """The record of a fetched source's cache folder, once `fetched_problem` finds nothing wrong."""
    problem = fetched_problem(path)
    if problem:
        raise AndreaError(f"the fetched source {path.name} in {path} is damaged ({problem}); "
                          f"`andrea data fetch {path.name}` fetches it again.")
    return read_json(path / "meta.json", "the record")


def _count_lines(path: Path) -> tuple[int, bool]:
    """(newlines in the file, whether it ends with one or is empty), read in blocks."""
    n, last = 0, b"\n"
    with open(path, "rb") as f:
        while block := f.read(READ_BYTES):
            n += block.count(b"\n")
            last = block[-1:]
    return n, last == b"\n"


