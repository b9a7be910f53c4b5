"""`andrea prepare`: sources streamed, encoded on every core and written as token shards.

Each source's documents (andrea.corpus.sources: .txt, .jsonl, .parquet, plain or compressed, folders of
them) are read as a stream, encoded by forked worker processes, and written as parts of about
`shard_tokens` training tokens in the format of andrea.shards. A shard is written as
`<file>.partial` and renamed when whole; `manifest.json` is removed at the start and written last.
While a preparation runs, `prepare-progress.json` records the finished parts: run again with the
same settings, preparation resumes after the last of them, and a finished folder prepared again
reuses every source whose files have not changed.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from array import array
from collections import deque
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from andrea import forkpool
from andrea.config import BOS
from andrea.corpus.sources import CHUNK_BYTES, DOC_BYTES, PIECE_BYTES, VAL_SHARE, documents, resolve, tasks
from andrea.errors import AndreaError
from andrea.files import (
    FolderLock,
    atomic_write_bytes,
    check_writable,
    read_json,
    remove_dead_temps,
    replace_durably,
    write_error_reason,
)
from andrea.shards import (
    HEADER,
    MAGIC,
    MANIFEST_VERSION,
    MAX_VOCAB,
    PROGRESS_FILE,
    VERSION,
    ShardedTokens,
    open_shard,
    write_shard,
)
from andrea.validate import Shape, is_int, same_json

SHARD_TOKENS = 100_000_000  # training tokens per shard (a 200 MB file), by default
MIN_SHARD_TOKENS, MAX_SHARD_TOKENS = 1_000, 2**40  # the shard size prepare accepts


def encode_documents(tokenizer, docs: list[str]) -> np.ndarray:
    """All documents, each as [BOS] tokens..., concatenated into one uint16 array."""
    if tokenizer.vocab_size > MAX_VOCAB:
        raise AndreaError(f"the tokenizer has V = {tokenizer.vocab_size}; uint16 shards hold at most {MAX_VOCAB:,}.")
    pieces = tokenizer.encode_batch(docs, bos=True)
    if not pieces:
        return np.zeros(0, dtype=np.uint16)
    return np.concatenate([np.asarray(p, dtype=np.uint16) for p in pieces])


def run_task(task):
    """Encode one reader task (andrea.corpus.sources) with the tokenizer the pool shares (forkpool.shared()):
    (train tokens, val tokens, [train documents, val documents, train bytes, val bytes]), the tokens
    as arrays of uint16."""
    train, val = array("H"), array("H")
    stats = [0, 0, 0, 0]
    encode = forkpool.shared().encode
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
    return {"version": MANIFEST_VERSION, "tokenizer": tokenizer.fingerprint(), "text_field": text_field,
            "val_share": val_share, "shard_tokens": shard_tokens, "reader": [CHUNK_BYTES, DOC_BYTES, PIECE_BYTES]}


def _progress_shape():
    """prepare-progress.json's declared shape: each source's parts, every count an integer."""
    count = Shape.integer(0)
    shard = Shape.record(file=Shape.name(), tokens=count, sha256=Shape.text(64), max_id=Shape.integer(-1, MAX_VOCAB))
    split = Shape.record(documents=count, bytes=count)
    part = Shape.record(train=shard, val=shard, resume=Shape.fixed(count, count, count),
                        stats=Shape.record(train=split, val=split))
    source = Shape.record(signature=Shape.anything(), parts=Shape.items(part), done=Shape.flag(), entry_=Shape.anything())
    return Shape.record(settings=Shape.anything(), sources=Shape.mapping(source))


def _load_state(out: Path, settings: dict) -> dict:
    """What an earlier, unfinished (or finished) preparation into `out` with the same settings
    completed: {source name: {"signature", "parts", "done", "entry"}}. A progress record that does
    not read back in its declared shape is none: that work is done again."""
    for file, shape in ((out / PROGRESS_FILE, _progress_shape()), (out / "manifest.json", None)):
        try:
            saved = read_json(file, "preparation record", shape=shape)
        except AndreaError:  # absent or damaged: that work is done again
            continue
        if not isinstance(saved, dict) or not same_json(saved.get("settings"), settings):
            continue
        if file.name == PROGRESS_FILE:
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
    """Tokenize every source (andrea.corpus.sources) into train and val shards; write the manifest.

    Documents are streamed and encoded on `workers` processes (default: every core), and each
    source is written as parts of about `shard_tokens` training tokens: a train shard and a val
    shard per part, each renamed into place when whole. After each part the progress is saved,
    so a preparation that is stopped (killed, out of disk) resumes after its last whole part when
    run again with the same settings. `manifest.json` is removed at the start and written, listing
    every shard with its token count and SHA-256, only when every source is done. The folder is
    locked while a preparation runs: a second one in it is refused in one sentence.
    """
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
    # one preparation per folder: a second one (another andrea main on the same cache) would write
    # the same shards under the first
    lock = FolderLock(out, "the data folder", "; wait for that preparation to end")
    try:
        return _prepare_locked(tokenizer, specs, out, log, progress, text_field, val_share, shard_tokens, workers)
    finally:
        lock.release()


def _prepare_locked(tokenizer, specs, out: Path, log, progress: bool, text_field, val_share, shard_tokens, workers) -> dict:
    from tqdm import tqdm  # loaded when a preparation starts, not when andrea.prepare is imported

    remove_dead_temps(out)  # the manifest's or the progress record's, from a preparation that was killed
    settings = _settings(tokenizer, text_field, val_share, int(shard_tokens))
    state = _load_state(out, settings)
    state = {s.name: state[s.name] for s in specs if s.name in state and same_json(state[s.name].get("signature"), s.signature())}
    _save_state(out, settings, state)
    (out / "manifest.json").unlink(missing_ok=True)  # written again once every source is whole

    say = log
    bar = tqdm(total=sum(s.size for s in specs), unit="B", unit_scale=True, unit_divisor=1024, desc="preparing",
               disable=not progress, leave=False, smoothing=0.05)
    if progress and log is print:
        say = bar.write
    # forked once with the tokenizer, so the workers' word caches stay warm across every source
    pool = forkpool.ForkPool(run_task, tokenizer, workers or os.cpu_count() or 1)
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


class _SourceParts:
    """One source's parts while they are written: the part open now, the tasks handed to the
    workers and not yet taken, and where a resumed preparation picks up."""

    def __init__(self, spec, state: dict, settings: dict, out: Path, bar, say):
        self.spec, self.state, self.settings, self.out, self.bar, self.say = spec, state, settings, out, bar, say
        self.parts = state[spec.name]["parts"]
        # where the parts written so far end: at task `resume[0]`, after its first resume[1] train and
        # resume[2] val tokens (a part can end inside a task's output, so shards have exact sizes)
        self.resume = self.parts[-1]["resume"] if self.parts else [0, 0, 0]
        self.current = {}  # the part being written: its writers and document counts
        self.pending = deque()

    def open_part(self) -> None:
        k, name = len(self.parts), self.spec.name
        self.current.update(train=_ShardWriter(self.out / _shard_name(name, "train", k)),
                            val=_ShardWriter(self.out / _shard_name(name, "val", k)), stats=[0, 0, 0, 0])

    def close_part(self, resume_at: list[int], full: bool = True) -> None:
        stats = self.current["stats"]
        part = {"train": self.current["train"].close(), "val": self.current["val"].close(), "resume": resume_at,
                "stats": {"train": {"documents": stats[0], "bytes": stats[2]}, "val": {"documents": stats[1], "bytes": stats[3]}}}
        self.parts.append(part)
        self.current.clear()
        _save_state(self.out, self.settings, self.state)
        if full:
            self.say(f"{self.spec.name}: part {len(self.parts) - 1} written ({part['train']['tokens']:,} train, "
                     f"{part['val']['tokens']:,} val tokens)")

    def take(self) -> None:
        """Write the oldest pending task's tokens, closing a part whenever it holds shard_tokens."""
        result, disk, index = self.pending.popleft()
        train, val, stats = result.get()
        done_train = done_val = 0
        if index == self.resume[0] and (self.resume[1] or self.resume[2]):  # the rest of a task a closed part ends inside
            done_train, done_val = self.resume[1], self.resume[2]
            train, val, stats = train[done_train:], val[done_val:], [0, 0, 0, 0]
        if not self.current:
            self.open_part()
        self.current["stats"] = [a + b for a, b in zip(self.current["stats"], stats)]
        self.current["val"].write(val)
        done_val += len(val)
        pos, limit = 0, self.settings["shard_tokens"]
        while pos < len(train):
            n = min(limit - self.current["train"].count, len(train) - pos)
            self.current["train"].write(train[pos : pos + n])
            pos += n
            if self.current["train"].count >= limit:
                self.close_part([index, done_train + pos, done_val] if pos < len(train) else [index + 1, 0, 0])
                if pos < len(train):
                    self.open_part()
        self.bar.update(disk)

    def write_all(self, pool: forkpool.ForkPool) -> None:
        """Every task of the source through the workers, in order, at most 2·workers + 2 ahead."""
        index = -1
        for index, (task, disk) in enumerate(tasks(self.spec, self.settings["text_field"], self.settings["val_share"])):
            if index < self.resume[0]:
                self.bar.update(disk)
                continue
            self.pending.append((pool.submit(task), disk, index))
            if len(self.pending) >= 2 * pool.n + 2:
                self.take()
        while self.pending:
            self.take()
        if not self.parts and (not self.current or not (self.current["stats"][0] or self.current["stats"][1])):
            raise AndreaError(f"source {self.spec.name} ({self.spec.path}) holds no text.")
        if self.current or not self.parts:
            if not self.current:
                self.open_part()
            self.close_part([index + 1, 0, 0], full=False)

    def abort(self) -> None:
        for key in ("train", "val"):
            if key in self.current:
                self.current[key].abort()


def _prepare_source(spec, state: dict, settings: dict, out: Path, pool: forkpool.ForkPool, bar, say) -> dict:
    """Write one source's parts (resuming after those already written) and return its manifest entry."""
    st = state.get(spec.name)
    if st is None:
        st = state[spec.name] = {"signature": spec.signature(), "path": str(spec.path), "parts": [], "done": False}
    if st["done"] and isinstance(st.get("entry"), dict):
        bar.update(spec.size)
        return st["entry"]
    parts = st["parts"]
    keep = {p[split]["file"] for p in parts for split in ("train", "val")}
    for f in _own_files(out, spec.name):
        if f.name not in keep:
            f.unlink()
    writer = _SourceParts(spec, state, settings, out, bar, say)
    try:
        writer.write_all(pool)
    except BaseException:
        writer.abort()
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
