"""Token shards, streamed preparation and batch loading.

`andrea prepare` streams each source's documents (andrea.sources: .txt, .jsonl, .parquet, plain or
compressed, folders of them), encodes them on every core and writes, per source, parts of about
`shard_tokens` training tokens: `<source>.train.<part>.tok` and `<source>.val.<part>.tok` (part
00000, 00001, ...). A shard is a 32-byte header, then the tokens as little-endian uint16; every
document starts with BOS (a document can run on from one shard into the next). The header is

    bytes 0-7   magic  b"ANDREATK"
    bytes 8-11  format version (uint32, 1)
    bytes 12-15 bytes per token (uint32, 2)
    bytes 16-23 token count (uint64)
    bytes 24-31 reserved (zero)

and the file must be exactly 32 + 2·count bytes, so a truncated or foreign shard is caught when
it is opened. A shard is written as `<file>.partial` and renamed when whole. `manifest.json`
(version 2) lists per source and split the token, document and byte counts and every shard with
its token count, largest id and the SHA-256 of its tokens (the file after its header); it also
holds the settings, the tokenizer's fingerprint and each source's file signature (paths, sizes,
modification times), and is written last, atomically, so it never names a partial shard. The
tokenizer is saved beside it in `tokenizer/`. Before a run's first step every shard is checked
against the manifest (ids below V, the recorded SHA-256: `verify_shards`); `verified.json` notes
the shards so checked, by size and modification time, so an unchanged shard is read only once. While a preparation runs, `prepare-progress.json`
records the finished parts; run again with the same settings, preparation resumes after the last
of them (and a finished folder prepared again reuses every source whose files have not changed).
A version 1 manifest (one `file` per split) is still read.

Batches are windows of `T + 1` tokens at random offsets, read straight from numpy memmaps of
every shard; a window never spans two shards. The offsets for a whole global batch come from one
seeded generator, and each process takes its own slice, so one process and several see exactly
the same data.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import re
import struct
import sys
import time
from array import array
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from andrea.config import is_int
from andrea.errors import AndreaError
from andrea.files import (
    atomic_write_bytes,
    check_regular,
    check_writable,
    read_json,
    remove_dead_temps,
    replace_durably,
    write_error_reason,
)

MAGIC = b"ANDREATK"
VERSION = 1
HEADER = struct.Struct("<8sIIQQ")  # 32 bytes
assert HEADER.size == 32
MANIFEST_VERSION = 2
SHARD_TOKENS = 100_000_000  # training tokens per shard (a 200 MB file), by default
MIN_SHARD_TOKENS, MAX_SHARD_TOKENS = 1_000, 2**40  # the shard size prepare accepts
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


# ---------------------------------------------------------------- preparing shards

MAX_VOCAB = 65536  # token ids are uint16 in the shards


def encode_documents(tokenizer, docs: list[str]) -> np.ndarray:
    """All documents, each as [BOS] tokens..., concatenated into one uint16 array."""
    if tokenizer.vocab_size > MAX_VOCAB:
        raise AndreaError(f"the tokenizer has V = {tokenizer.vocab_size}; uint16 shards hold at most {MAX_VOCAB:,}.")
    pieces = tokenizer.encode_batch(docs, bos=True)
    if not pieces:
        return np.zeros(0, dtype=np.uint16)
    return np.concatenate([np.asarray(p, dtype=np.uint16) for p in pieces])


_tok = None  # the tokenizer that run_task encodes with; worker processes inherit it when they fork


def run_task(task):
    """Encode one reader task (andrea.sources): (train tokens, val tokens, [train documents, val
    documents, train bytes, val bytes]), the tokens as arrays of uint16."""
    from andrea.sources import documents

    train, val = array("H"), array("H")
    stats = [0, 0, 0, 0]
    encode = _tok.encode
    for text, bos, in_val, n in documents(task):
        ids = encode(text, bos)
        if in_val:
            val.extend(ids)
            stats[1] += bos
            stats[3] += n
        else:
            train.extend(ids)
            stats[0] += bos
            stats[2] += n
    return train, val, stats


class _Ready:
    """A task run in this process, when it is asked for (keeps the order of a pool's results)."""

    def __init__(self, task):
        self.task = task

    def get(self):
        return run_task(self.task)


class _Workers:
    """Worker processes, forked once with the tokenizer (so their word caches stay warm)."""

    def __init__(self, tokenizer, workers: int):
        global _tok
        from andrea.tokenizer import _can_fork

        _tok = tokenizer
        self.n = max(1, workers)
        self.pool = None
        if self.n > 1 and _can_fork():
            self.pool = multiprocessing.get_context("fork").Pool(self.n)

    def submit(self, task):
        return self.pool.apply_async(run_task, (task,)) if self.pool is not None else _Ready(task)

    def close(self):
        if self.pool is not None:
            self.pool.terminate()
            self.pool.join()
            self.pool = None


class _ShardWriter:
    """One shard written as it grows: into `<file>.partial`, header filled in and renamed to
    `<file>` only when it is closed, so a shard under its real name is always whole."""

    def __init__(self, path: Path):
        self.path = path
        self.tmp = path.with_name(path.name + ".partial")
        self.f = None
        self.sha = hashlib.sha256()
        self.count = 0
        self.max_id = -1
        with self._refused():
            self.f = open(self.tmp, "wb")
            self.f.write(bytes(HEADER.size))

    @contextmanager
    def _refused(self):
        """A write the system refuses (a full disk) ends in one sentence that names the shard."""
        try:
            yield
        except OSError as e:
            self.abort()
            raise AndreaError(f"could not write {self.path} ({write_error_reason(e)}); the parts before it are whole: "
                              f"make room and run the same `andrea prepare` again to resume after them.") from None

    def write(self, tokens: array) -> None:
        if not tokens:
            return
        if sys.byteorder == "big":
            tokens = array("H", tokens)
            tokens.byteswap()
        data = tokens.tobytes()
        with self._refused():
            self.f.write(data)
        self.sha.update(data)
        self.count += len(tokens)
        self.max_id = max(self.max_id, int(np.frombuffer(data, dtype="<u2").max()))

    def close(self) -> dict:
        with self._refused():
            self.f.seek(0)
            self.f.write(HEADER.pack(MAGIC, VERSION, 2, self.count, 0))
            self.f.close()
            replace_durably(self.tmp, self.path)
        return {"file": self.path.name, "tokens": self.count, "sha256": self.sha.hexdigest(), "max_id": self.max_id}

    def abort(self) -> None:
        if self.f is not None:
            try:
                self.f.close()
            except OSError:
                pass  # the buffered tail cannot be written either; the file goes
        self.tmp.unlink(missing_ok=True)


def _shard_name(name: str, split: str, part: int) -> str:
    return f"{name}.{split}.{part:05d}.tok"


def _own_files(out: Path, name: str) -> list[Path]:
    """The shard files (whole or partial) prepare writes for a source, whatever their part."""
    pattern = re.compile(re.escape(name) + r"\.(train|val)\.\d{5}\.tok(\.partial)?")
    return [p for p in out.iterdir() if pattern.fullmatch(p.name)]


def _settings(tokenizer, text_field, val_share, shard_tokens) -> dict:
    from andrea import sources

    return {"version": MANIFEST_VERSION, "tokenizer": tokenizer.fingerprint(), "text_field": text_field,
            "val_share": val_share, "shard_tokens": shard_tokens,
            "reader": [sources.CHUNK_BYTES, sources.DOC_BYTES, sources.PIECE_BYTES]}


def _load_state(out: Path, settings: dict) -> dict:
    """What an earlier, unfinished (or finished) preparation into `out` with the same settings
    completed: {source name: {"signature", "parts", "done", "entry"}}."""
    for file in (out / PROGRESS_FILE, out / "manifest.json"):
        try:
            saved = read_json(file, "preparation record")
        except AndreaError:  # absent or damaged: that work is done again
            continue
        if not isinstance(saved, dict) or saved.get("settings") != settings:
            continue
        if file.name == PROGRESS_FILE and isinstance(saved.get("sources"), dict):
            return saved["sources"]
        if isinstance(saved.get("sources"), dict):  # a finished preparation: every source is done
            return {name: {"signature": e.get("signature"), "parts": [], "done": True, "entry": e}
                    for name, e in saved["sources"].items() if isinstance(e, dict)}
    return {}


def _save_state(out: Path, settings: dict, state: dict) -> None:
    atomic_write_bytes(out / PROGRESS_FILE, (json.dumps({"settings": settings, "sources": state}, indent=1) + "\n").encode())


def _split_entry(parts: list[dict], split: str) -> dict:
    shards = [p[split] for p in parts]
    return {"tokens": sum(s["tokens"] for s in shards), "documents": sum(p["stats"][split]["documents"] for p in parts),
            "bytes": sum(p["stats"][split]["bytes"] for p in parts), "shards": shards}


def prepare(tokenizer, sources: list[str], out_dir, log=print, progress: bool = True, *, text_field: str = "text",
            val_share: float | None = None, shard_tokens: int = SHARD_TOKENS, workers: int | None = None) -> dict:
    """Tokenize every source (andrea.sources) into train and val shards; write the manifest.

    Documents are streamed and encoded on `workers` processes (default: every core), and each
    source is written as parts of about `shard_tokens` training tokens: a train shard and a val
    shard per part, each renamed into place when whole. After each part the progress is saved,
    so a preparation that is stopped (killed, out of disk) resumes after its last whole part when
    run again with the same settings. `manifest.json` is removed at the start and written, listing
    every shard with its token count and SHA-256, only when every source is done.
    """
    from tqdm import tqdm

    from andrea.sources import VAL_SHARE, resolve

    out = Path(out_dir)
    if not sources:
        raise AndreaError("give at least one source to prepare.")
    val_share = VAL_SHARE if val_share is None else float(val_share)
    if not 0 <= val_share < 1:
        raise AndreaError(f"the validation share must be at least 0 and below 1, not {val_share}.")
    if not is_int(shard_tokens) or not MIN_SHARD_TOKENS <= shard_tokens <= MAX_SHARD_TOKENS:
        raise AndreaError(f"shard_tokens must be a whole number of tokens from {MIN_SHARD_TOKENS:,} to "
                          f"{MAX_SHARD_TOKENS:,} (a file per few tokens would make millions of files), "
                          f"not {str(shard_tokens)[:40]}.")
    if tokenizer.vocab_size > MAX_VOCAB:
        raise AndreaError(f"the tokenizer has V = {tokenizer.vocab_size}; uint16 shards hold at most {MAX_VOCAB:,}.")
    specs = [resolve(s) for s in sources]
    seen = {}
    for spec, given in zip(specs, sources):
        if spec.name in seen:
            raise AndreaError(f"{seen[spec.name]} and {given} are both named {spec.name}; name one with NAME=PATH.")
        seen[spec.name] = given
    check_writable(out, "the data folder")
    remove_dead_temps(out)  # the manifest's or the progress record's, from a preparation that was killed
    settings = _settings(tokenizer, text_field, val_share, int(shard_tokens))
    state = _load_state(out, settings)
    state = {s.name: state[s.name] for s in specs if s.name in state and state[s.name].get("signature") == s.signature()}
    _save_state(out, settings, state)
    (out / "manifest.json").unlink(missing_ok=True)  # written again once every source is whole

    say = log
    bar = tqdm(total=sum(s.size for s in specs), unit="B", unit_scale=True, unit_divisor=1024, desc="preparing",
               disable=not progress, leave=False, smoothing=0.05)
    if progress and log is print:
        say = bar.write
    pool = _Workers(tokenizer, workers or os.cpu_count() or 1)
    manifest = {"format": "andrea-shards", "version": MANIFEST_VERSION, "tokenizer": tokenizer.fingerprint(),
                "vocab_size": tokenizer.vocab_size, "sources": {}}
    try:
        for spec in specs:
            entry = _prepare_source(spec, state, settings, out, pool, bar, say)
            manifest["sources"][spec.name] = entry
            tr, va = entry["train"], entry["val"]
            say(f"{spec.name:<12} train {tr['tokens']:>11,} tokens ({tr['bytes'] / max(1, tr['tokens']):.2f} bytes/token, "
                f"{len(tr['shards'])} shard{'s' if len(tr['shards']) != 1 else ''})  val {va['tokens']:>9,} tokens")
    finally:
        pool.close()
        bar.close()
    tokenizer.save(out / "tokenizer")
    manifest["settings"] = settings
    atomic_write_bytes(out / "manifest.json", (json.dumps(manifest, indent=2) + "\n").encode())
    (out / PROGRESS_FILE).unlink(missing_ok=True)
    return manifest


def _prepare_source(spec, state: dict, settings: dict, out: Path, pool: _Workers, bar, say) -> dict:
    from andrea.sources import tasks

    st = state.get(spec.name)
    if st is None:
        st = state[spec.name] = {"signature": spec.signature(), "path": str(spec.path), "parts": [], "done": False}
    if st["done"]:
        bar.update(spec.size)
        return st["entry"]
    parts = st["parts"]
    keep = {p[split]["file"] for p in parts for split in ("train", "val")}
    for f in _own_files(out, spec.name):
        if f.name not in keep:
            f.unlink()
    # where the parts written so far end: at task `resume[0]`, after its first resume[1] train and
    # resume[2] val tokens (a part can end inside a task's output, so shards have exact sizes)
    resume = parts[-1]["resume"] if parts else [0, 0, 0]
    shard_tokens = settings["shard_tokens"]
    current = {}  # the part being written: its writers and document counts
    pending = deque()

    def open_part():
        k = len(parts)
        current.update(train=_ShardWriter(out / _shard_name(spec.name, "train", k)),
                       val=_ShardWriter(out / _shard_name(spec.name, "val", k)), stats=[0, 0, 0, 0])

    def close_part(resume_at: list[int], full: bool = True):
        stats = current["stats"]
        part = {"train": current["train"].close(), "val": current["val"].close(), "resume": resume_at,
                "stats": {"train": {"documents": stats[0], "bytes": stats[2]}, "val": {"documents": stats[1], "bytes": stats[3]}}}
        parts.append(part)
        current.clear()
        _save_state(out, settings, state)
        if full:
            say(f"{spec.name}: part {len(parts) - 1} written ({part['train']['tokens']:,} train, {part['val']['tokens']:,} val tokens)")

    def take():
        result, disk, index = pending.popleft()
        train, val, stats = result.get()
        done_train = done_val = 0
        if index == resume[0] and (resume[1] or resume[2]):  # the rest of a task a closed part ends inside
            done_train, done_val = resume[1], resume[2]
            train, val, stats = train[done_train:], val[done_val:], [0, 0, 0, 0]
        if not current:
            open_part()
        current["stats"] = [a + b for a, b in zip(current["stats"], stats)]
        current["val"].write(val)
        done_val += len(val)
        pos = 0
        while pos < len(train):
            n = min(shard_tokens - current["train"].count, len(train) - pos)
            current["train"].write(train[pos : pos + n])
            pos += n
            if current["train"].count >= shard_tokens:
                close_part([index, done_train + pos, done_val] if pos < len(train) else [index + 1, 0, 0])
                if pos < len(train):
                    open_part()
        bar.update(disk)

    try:
        index = -1
        for index, (task, disk) in enumerate(tasks(spec, settings["text_field"], settings["val_share"])):
            if index < resume[0]:
                bar.update(disk)
                continue
            pending.append((pool.submit(task), disk, index))
            if len(pending) >= 2 * pool.n + 2:
                take()
        while pending:
            take()
        if not parts and (not current or not (current["stats"][0] or current["stats"][1])):
            raise AndreaError(f"source {spec.name} ({spec.path}) holds no text.")
        if current or not parts:
            if not current:
                open_part()
            close_part([index + 1, 0, 0], full=False)
    except BaseException:
        for key in ("train", "val"):
            if key in current:
                current[key].abort()
        raise
    if parts[-1]["train"]["tokens"] == 0 and parts[-1]["val"]["tokens"] == 0 and len(parts) > 1:
        for split in ("train", "val"):
            (out / parts[-1][split]["file"]).unlink(missing_ok=True)
        parts.pop()
    entry = {"path": str(spec.path), "files": len(spec.files), "train": _split_entry(parts, "train"),
             "val": _split_entry(parts, "val"), "val_from_train": False, "signature": st["signature"]}
    if entry["val"]["tokens"] == 0 and entry["train"]["tokens"] > 0:
        _val_from_last_document(out, spec.name, parts, entry)
        say(f"note: {spec.name} has too few documents for one to fall in validation by hash; "
            f"its last document ({entry['val']['tokens']:,} tokens) is used for validation too")
    st["done"], st["entry"] = True, entry
    _save_state(out, settings, state)
    return entry


VAL_FALLBACK_TOKENS = 1_000_000


def _val_from_last_document(out: Path, name: str, parts: list[dict], entry: dict) -> None:
    """A source with no validation document: copy (the start of) its last training document into
    the last part's val shard, so that it can still be evaluated."""
    from andrea.tokenizer import BOS

    tokens = ShardedTokens([open_shard(out / p["train"]["file"]) for p in parts])
    n = len(tokens)
    tail = tokens[max(0, n - VAL_FALLBACK_TOKENS) :]
    starts = np.flatnonzero(tail == BOS)
    start = n - len(tail) + (int(starts[-1]) if len(starts) else 0)
    doc = tokens[start : start + VAL_FALLBACK_TOKENS]
    del tokens
    file = out / parts[-1]["val"]["file"]
    write_shard(file, doc)
    data = doc.astype("<u2").tobytes()
    parts[-1]["val"] = {"file": file.name, "tokens": len(doc), "sha256": hashlib.sha256(data).hexdigest(),
                        "max_id": int(doc.max()) if len(doc) else -1}
    entry["val"] = _split_entry(parts, "val")
    entry["val_from_train"] = True


# ---------------------------------------------------------------- loading


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
        from andrea.tokenizer import HarrisTokenizer

        tok = HarrisTokenizer.load(self.dir / "tokenizer")
        if tok.fingerprint() != self.manifest["tokenizer"]:
            raise AndreaError(f"{self.dir}/tokenizer is not the tokenizer these shards were made with.")
        return tok

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


# ---------------------------------------------------------------- checks before a run reads anything


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
    try:
        record = read_json(record_path, "the record of checked shards")
    except AndreaError:
        record = {}
    record = record if isinstance(record, dict) else {}
    V, start, new, read, tokens_read = data.vocab_size, time.perf_counter(), {}, 0, 0
    for name, entry in data.manifest["sources"].items():
        for split in ("train", "val"):
            listed = entry[split].get("shards", [entry[split]])
            for s, tokens in zip(listed, getattr(data.sources[name], split).shards):
                path = data.dir / s["file"]
                st = path.stat()
                key = [st.st_size, st.st_mtime_ns, s.get("sha256")]
                old = record.get(s["file"])
                if isinstance(old, list) and len(old) == 4 and old[:3] == key and is_int(old[3]) and old[3] < V:
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


def check_validation(data: "TokenData", names, seq_len: int) -> None:
    """Every validation shard a run will evaluate holds at least one window of seq_len + 1 tokens
    and only ids below V: checked before the first step, not found at the first evaluation."""
    V = data.vocab_size
    for name in names:
        shards = data.sources[name].val.shards
        if not any(len(shard) >= seq_len + 1 for shard in shards):  # a window never spans two shards
            raise AndreaError(f"source {name} has no validation shard of one window of {seq_len + 1} tokens "
                              f"({sum(map(len, shards)):,} tokens in all); prepare more text or use a shorter --seq-len.")
        if any(len(shard) and int(shard.max()) >= V for shard in shards):
            raise AndreaError(f"a validation shard of {name} holds ids >= V = {V:,}; it is damaged.")
