"""Token shards: the file format, the manifest, the checks before training, and batch loading.

`andrea prepare` (andrea.prepare) writes, per source, parts of training and validation tokens:
`<source>.train.<part>.tok` and `<source>.val.<part>.tok` (part 00000, 00001, ...). A shard is a
32-byte header, then the tokens as little-endian uint16; every document starts with BOS (a
document can run on from one shard into the next). The header is

    bytes 0-7   magic  b"ANDREATK"
    bytes 8-11  format version (uint32, 1)
    bytes 12-15 bytes per token (uint32, 2)
    bytes 16-23 token count (uint64)
    bytes 24-31 reserved (zero)

and the file must be exactly 32 + 2·count bytes, so a truncated or foreign shard is caught when
it is opened. `manifest.json` (version 2) lists per source and split the token, document and byte
counts and every shard with its token count, largest id and the SHA-256 of its tokens (the file
after its header); it also holds the settings, the tokenizer's fingerprint and each source's file
signature (paths, sizes, modification times), and is written last, atomically, so it never names
a partial shard. The tokenizer is saved beside it in `tokenizer/`. A version 1 manifest (one
`file` per split) is still read.

Every reader opens a data folder one way, `open_token_data` (the readers are listed beside it in
TOKEN_DATA_READERS): the manifest, the shards' headers and sizes, the tokenizer by fingerprint (the
model's, or the folder's own) and every shard against the manifest (ids below V, the recorded
SHA-256: `verify_shards`), before a training step, a lesson's verdict or a lab view is computed
from it. `verified.json` notes the shards so checked, by size and modification time, so an
unchanged shard is read only once.

Batches are windows of `T + 1` tokens at random offsets, read straight from numpy memmaps of
every shard; a window never spans two shards. The offsets for a whole global batch come from one
seeded generator, and each process takes its own slice, so one process and several see exactly
the same data.
"""

from __future__ import annotations

import hashlib
import json
import struct
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from andrea.errors import AndreaError
from andrea.files import (
    atomic_write_bytes,
    check_regular,
    read_json,
)
from andrea.tokenizer.harris import HarrisTokenizer
from andrea.validate import Shape, is_int

MAGIC = b"ANDREATK"
VERSION = 1
HEADER = struct.Struct("<8sIIQQ")  # 32 bytes
assert HEADER.size == 32
MANIFEST_VERSION = 2
PROGRESS_FILE = "prepare-progress.json"


def write_shard(path: Path, tokens: np.ndarray) -> None:
    tokens = np.ascontiguousarray(tokens, dtype="<u2")
    atomic_write_bytes(path, HEADER.pack(MAGIC, VERSION, 2, len(tokens), 0) + tokens.tobytes())


def open_shard(path: Path) -> np.memmap:
    """Memory-map a shard after checking its header and size."""
    path = check_regular(path, "shard")
    with open(path, "rb") as f:
        head = f.read(HEADER.size)
    if len(head) < HEADER.size:
        raise AndreaError(f"shard {path} is too short to hold a header ({len(head)} bytes); it is truncated or not a shard.")
    magic, version, width, count, _ = HEADER.unpack(head)
    if magic != MAGIC:
        raise AndreaError(f"{path} is not an andrea token shard (it does not start with {MAGIC.decode()}).")
    if version != VERSION or width != 2:
        raise AndreaError(f"shard {path} has format version {version} with {width}-byte tokens; expected version {VERSION}, 2 bytes.")
    expected = HEADER.size + 2 * count
    actual = path.stat().st_size
    if actual != expected:
        raise AndreaError(f"shard {path} should be {expected:,} bytes for {count:,} tokens but is {actual:,}; it is truncated or damaged.")
    if count == 0:
        return np.zeros(0, dtype=np.uint16)
    return np.memmap(path, dtype="<u2", mode="r", offset=HEADER.size, shape=(count,))


MAX_VOCAB = 65536  # token ids are uint16 in the shards


class ShardedTokens:
    """The tokens of one split of a source: its shards, memory-mapped, read as one sequence.

    len() is the total; a slice reads across shards (nothing else is loaded). Training windows
    never span two shards: see `start_counts` and `TokenData.windows`."""

    def __init__(self, shards: list[np.ndarray]):
        self.shards = list(shards)
        self.lengths = np.array([len(s) for s in self.shards], dtype=np.int64)
        self.ends = np.cumsum(self.lengths)

    def __len__(self) -> int:
        return int(self.ends[-1]) if len(self.ends) else 0

    def __getitem__(self, key):
        if isinstance(key, slice):
            start, stop, step = key.indices(len(self))
            if step != 1:
                raise ValueError("ShardedTokens slices take a step of 1.")
            pieces, first = [], 0
            for shard, end in zip(self.shards, self.ends):
                a, b = max(start, first), min(stop, int(end))
                if a < b:
                    pieces.append(np.asarray(shard[a - first : b - first]))
                first = int(end)
            return np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.uint16)
        i = int(key)
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"token {key} is out of range ({len(self):,} tokens).")
        k = int(np.searchsorted(self.ends, i, side="right"))
        return self.shards[k][i - (int(self.ends[k - 1]) if k else 0)]

    def start_counts(self, seq_len: int) -> np.ndarray:
        """How many windows of seq_len + 1 tokens start in each shard (windows stay in their shard)."""
        return np.maximum(self.lengths - seq_len, 0)


@dataclass
class SourceShards:
    name: str
    train: ShardedTokens
    val: ShardedTokens


def _split_shards(data_dir: Path, name: str, split: str, entry: dict, vocab_size: int) -> ShardedTokens:
    """Open the shards the manifest lists for one split (a version 1 manifest lists one file)."""
    listed = entry["shards"] if "shards" in entry else [{"file": entry["file"], "tokens": entry["tokens"]}]
    shards = []
    for s in listed:
        tokens = open_shard(data_dir / s["file"])
        if len(tokens) != s["tokens"]:
            raise AndreaError(f"shard {s['file']} of {name} holds {len(tokens):,} tokens; the manifest lists {s['tokens']:,}.")
        top = s.get("max_id")
        if top is None and split == "train" and len(tokens):
            top = int(tokens.max())  # a version 1 manifest does not record it
        if top is not None and top >= vocab_size:
            raise AndreaError(f"shard {s['file']} holds ids >= V = {vocab_size}.")
        shards.append(tokens)
    if sum(len(t) for t in shards) != entry["tokens"]:
        raise AndreaError(f"the {split} shards of {name} do not hold the token count the manifest lists.")
    return ShardedTokens(shards)


class TokenData:
    """The shards of a prepared data folder, with batch sampling and evaluation windows.

    Every shard is memory-mapped; nothing is read until a window is asked for."""

    def __init__(self, data_dir):
        self.dir = Path(data_dir)
        manifest_path = self.dir / "manifest.json"
        if not self.dir.is_dir():
            raise AndreaError(f"data folder {self.dir} does not exist; make one with `andrea prepare`.")
        if not manifest_path.exists():
            unfinished = " (its preparation did not finish; run the same `andrea prepare` again to resume it)" \
                if (self.dir / PROGRESS_FILE).exists() else ""
            raise AndreaError(f"{self.dir} has no manifest.json{unfinished}; make the folder with `andrea prepare`.")
        self.manifest = check_manifest(read_json(manifest_path, "manifest"), manifest_path)
        self._tokenizer = None
        self.sources: dict[str, SourceShards] = {}
        for name, entry in self.manifest["sources"].items():
            train = _split_shards(self.dir, name, "train", entry["train"], self.vocab_size)
            val = _split_shards(self.dir, name, "val", entry["val"], self.vocab_size)
            self.sources[name] = SourceShards(name, train, val)

    @property
    def vocab_size(self) -> int:
        return int(self.manifest["vocab_size"])

    @property
    def names(self) -> list[str]:
        return list(self.sources)

    def load_tokenizer(self):
        """The tokenizer saved beside the shards, once it matches the manifest's fingerprint; read
        once per opening (the gate reads it, and so does the run that opened the folder)."""
        if self._tokenizer is None:
            tok = HarrisTokenizer.load(self.dir / "tokenizer")
            if tok.fingerprint() != self.manifest["tokenizer"]:
                raise AndreaError(f"{self.dir}/tokenizer is not the tokenizer these shards were made with.")
            self._tokenizer = tok
        return self._tokenizer

    def check_context(self, seq_len: int) -> None:
        for s in self.sources.values():
            if not s.train.start_counts(seq_len).sum():
                raise AndreaError(f"source {s.name} has no training shard of more than {seq_len:,} tokens "
                                  f"(it has {len(s.train):,} tokens), too few for one window of {seq_len + 1}.")

    def token_share(self) -> dict[str, float]:
        total = sum(len(s.train) for s in self.sources.values())
        return {n: len(s.train) / total for n, s in self.sources.items()}

    def sample_offsets(self, source: str, n: int, seq_len: int, rng: np.random.Generator) -> np.ndarray:
        """n window starts, uniform over every start whose window of seq_len + 1 tokens lies within
        one shard. A start is numbered over the shards in order (shard 0's starts, then shard 1's):
        with one shard it is the offset itself."""
        total = int(self.sources[source].train.start_counts(seq_len).sum())
        return rng.integers(0, total, size=n)

    def windows(self, source: str, offsets, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = self.sources[source].train
        counts = tokens.start_counts(seq_len)
        ends = np.cumsum(counts)
        rows = []
        for o in np.asarray(offsets, dtype=np.int64):
            k = int(np.searchsorted(ends, o, side="right"))
            local = int(o) - (int(ends[k - 1]) if k else 0)
            rows.append(tokens.shards[k][local : local + seq_len + 1])
        batch = torch.from_numpy(np.stack(rows).astype(np.int64))
        return batch[:, :-1], batch[:, 1:]

    def val_windows(self, source: str, seq_len: int, max_windows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Fixed evaluation windows: consecutive, non-overlapping, from the start of each val shard
        in order, none spanning two shards."""
        rows = []
        for shard in self.sources[source].val.shards:
            n = min(max_windows - len(rows), max(0, (len(shard) - 1) // seq_len))
            rows += [shard[i * seq_len : i * seq_len + seq_len + 1] for i in range(n)]
            if len(rows) >= max_windows:
                break
        if not rows:
            tokens = self.sources[source].val
            raise AndreaError(f"source {source} has {len(tokens):,} validation tokens, fewer than one window of {seq_len + 1}.")
        batch = torch.from_numpy(np.stack(rows).astype(np.int64))
        return batch[:, :-1], batch[:, 1:]


def check_manifest(manifest, where) -> dict:
    """The manifest, once every field a reader uses is known to be there and of its kind; shard
    files must be plain names inside the data folder (nothing of another file is ever opened)."""
    def bad(what):
        raise AndreaError(f"{where} is not a valid andrea shard manifest: {what}.")

    if not isinstance(manifest, dict) or manifest.get("format") != "andrea-shards":
        bad('it has no "format": "andrea-shards"')
    if manifest.get("version", 1) not in (1, MANIFEST_VERSION):
        bad(f"its version is {str(manifest.get('version'))[:20]!r}, not 1 or {MANIFEST_VERSION}")
    if not isinstance(manifest.get("tokenizer"), str):
        bad("its tokenizer fingerprint is missing")
    V = manifest.get("vocab_size")
    if not _count(V) or not 257 <= V <= 65536:
        bad(f"vocab_size must be an integer in 257..65536, got {str(V)[:20]!r}")
    sources = manifest.get("sources")
    if not isinstance(sources, dict) or not sources:
        bad("it lists no sources")
    for name, entry in sources.items():
        if not isinstance(entry, dict):
            bad(f"source {name!r} is not an object")
        for split in ("train", "val"):
            part = entry.get(split)
            if not isinstance(part, dict):
                bad(f"source {name!r} has no {split} split")
            shards = part.get("shards", [part])  # a version 1 manifest names one file per split
            if not isinstance(shards, list) or not shards or not all(isinstance(x, dict) for x in shards):
                bad(f"the {split} split of {name!r} lists no shards")
            for shard in shards:
                file = shard.get("file")
                if not isinstance(file, str) or not file or Path(file).name != file or file in (".", ".."):
                    bad(f"the {split} shards of {name!r} must be file names inside the data folder")
                if not _count(shard.get("tokens")) or "max_id" in shard and not isinstance(shard["max_id"], int):
                    bad(f"a {split} shard of {name!r} needs a non-negative integer token count")
            for key in ("tokens", "documents", "bytes"):
                if key in part and not _count(part[key]) or key == "tokens" and key not in part:
                    bad(f"{split} {key} of {name!r} must be a non-negative integer")
    return manifest


def _count(value) -> bool:
    return is_int(value) and value >= 0


VERIFIED_FILE = "verified.json"  # shards already checked: file -> [size, mtime_ns, sha256, largest id]
VERIFIED_SHAPE = Shape.mapping(Shape.fixed(Shape.integer(0), Shape.integer(), Shape.optional(Shape.text(64)),
                                           Shape.integer(-1, 65535)))
SCAN_TOKENS = 1 << 23  # tokens read at once while a shard is checked (16 MiB)


def scan_shard(tokens: np.ndarray) -> tuple[int, str]:
    """(largest id, SHA-256 of the token bytes) of a shard's tokens, read in blocks."""
    sha, top = hashlib.sha256(), -1
    for i in range(0, len(tokens), SCAN_TOKENS):
        block = np.ascontiguousarray(tokens[i : i + SCAN_TOKENS])
        top = max(top, int(block.max()))
        sha.update(block)
    return top, sha.hexdigest()


def verify_shards(data: "TokenData", log=None, save: bool = True) -> None:
    """Every shard of the data folder holds ids below V only and the bytes whose SHA-256 the
    manifest records; else one sentence naming the shard, before the first step.

    A full check reads every shard once (numpy's max and hashlib's SHA-256, block by block). A
    shard whose size and modification time are those recorded in `verified.json` by an earlier
    full check is not read again: resuming a large corpus costs a stat per shard, not a pass over
    it. A shard changed in place without a new size or modification time is not noticed."""
    record_path = data.dir / VERIFIED_FILE
    try:  # a record that does not read back in its declared shape is no record: every shard is read
        record = read_json(record_path, "the record of checked shards", shape=VERIFIED_SHAPE)
    except AndreaError:
        record = {}
    V, start, new, read, tokens_read = data.vocab_size, time.perf_counter(), {}, 0, 0
    for name, entry in data.manifest["sources"].items():
        for split in ("train", "val"):
            listed = entry[split].get("shards", [entry[split]])
            for s, tokens in zip(listed, getattr(data.sources[name], split).shards):
                path = data.dir / s["file"]
                st = path.stat()
                key = [st.st_size, st.st_mtime_ns, s.get("sha256")]
                old = record.get(s["file"])
                if old is not None and old[:3] == key and old[3] < V:
                    new[s["file"]] = old
                    continue
                top, digest = scan_shard(tokens)
                read, tokens_read = read + 1, tokens_read + len(tokens)
                if top >= V:
                    raise AndreaError(f"shard {path} holds token id {top:,}, but V = {V:,}: it is damaged or was made with "
                                      f"another tokenizer; prepare the data again.")
                if s.get("sha256") is not None and digest != s["sha256"]:
                    raise AndreaError(f"shard {path} no longer holds the tokens the manifest records (SHA-256 {digest[:16]}..., "
                                      f"recorded {str(s['sha256'])[:16]}...): it changed after `andrea prepare`; prepare the data again.")
                new[s["file"]] = key + [top]
    if save and new != record:
        try:
            atomic_write_bytes(record_path, (json.dumps(new, indent=0) + "\n").encode())
        except AndreaError:
            pass  # a read-only data folder: every start checks its shards in full
    if log is not None:
        kept, what = len(new) - read, "ids below V, SHA-256 as recorded"
        if read:
            log(f"shards: {read:,} checked in full ({tokens_read:,} tokens: {what}) in {time.perf_counter() - start:.2f} s"
                + (f"; {kept:,} unchanged since their last check" if kept else ""))
        else:
            log(f"shards: all {kept:,} unchanged since their last full check ({what})")


# ---------------------------------------------------------------- the one opening of token data

# Every reader of token data, by what a user runs; each opens its data with `open_token_data` and
# with nothing else. tests/test_shards.py drives each of these through the same damaged folders,
# and fails where `TokenData` is called anywhere in andrea/ or benchmarks/ but here. The main job's
# cache check goes through the gate too, and prepares the shards again where it refuses
# (tests/test_mainjob.py).
TOKEN_DATA_READERS = (
    "andrea train", "andrea lesson", "andrea lesson attention", "andrea lesson block",
    "andrea embed similarity --ppmi", "andrea embed similarity --layer", "andrea embed split",
    "lab usage", "lab words", "lab layers", "lab lesson", "lab lesson attention", "lab lesson block",
    "andrea experiment positions", "andrea experiment sparse-updates",
)


def open_token_data(folder, tokenizer=None, *, vocab_size: int | None = None, log=None, save: bool = True) -> TokenData:
    """A prepared data folder, opened the one way every reader opens one: the manifest read and
    checked, every shard's header and size checked, the tokenizer it was prepared with compared by
    fingerprint with `tokenizer` (the model's; a tokenizer of the same V is not enough), V compared
    with `vocab_size`, and every id checked below V with its SHA-256 as recorded (`verify_shards`,
    once per shard while it is unchanged). Else one sentence naming the folder and the problem."""
    data = TokenData(folder)
    if tokenizer is None and (data.dir / "tokenizer").exists():
        tokenizer = data.load_tokenizer()  # the folder's own, which must be the one its manifest names
    if tokenizer is not None:
        vocab_size = tokenizer.vocab_size if vocab_size is None else vocab_size
        fingerprint = getattr(tokenizer, "fingerprint", None)
        if fingerprint is not None and fingerprint() != data.manifest["tokenizer"]:
            raise AndreaError(f"{data.dir} was prepared with another tokenizer than this model's (fingerprint "
                              f"{str(data.manifest['tokenizer'])[:16]}..., the model's {fingerprint()[:16]}...): what it "
                              f"holds is not the model's tokens.")
    if vocab_size is not None and data.vocab_size != vocab_size:
        raise AndreaError(f"{data.dir} holds tokens of V = {data.vocab_size:,}, the model V = {vocab_size:,}: it was "
                          f"prepared with another tokenizer.")
    verify_shards(data, log, save=save)
    return data


def check_validation(data: "TokenData", names, seq_len: int) -> None:
    """Every validation shard a run will evaluate holds at least one window of seq_len + 1 tokens:
    checked before the first step, not found at the first evaluation (its ids are the gate's)."""
    for name in names:
        shards = data.sources[name].val.shards
        if not any(len(shard) >= seq_len + 1 for shard in shards):  # a window never spans two shards
            raise AndreaError(f"source {name} has no validation shard of one window of {seq_len + 1} tokens "
                              f"({sum(map(len, shards)):,} tokens in all); prepare more text or use a shorter --seq-len.")

