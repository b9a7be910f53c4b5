"""Token shards and batch loading.

`andrea prepare` turns each source's documents into two shard files, `<source>.train.tok` and
`<source>.val.tok`: a 32-byte header, then the tokens as little-endian uint16. Every document
starts with BOS. The header is

    bytes 0-7   magic  b"ANDREATK"
    bytes 8-11  format version (uint32, 1)
    bytes 12-15 bytes per token (uint32, 2)
    bytes 16-23 token count (uint64)
    bytes 24-31 reserved (zero)

and the file must be exactly 32 + 2·count bytes, so a truncated or foreign shard is caught when
it is opened. `manifest.json` names the sources with their token and byte counts and the
tokenizer's fingerprint; the tokenizer itself is saved beside it in `tokenizer/`.

Batches are windows of `T + 1` tokens at random offsets, read straight from numpy memmaps.
The offsets for a whole global batch come from one seeded generator, and each process takes its
own slice, so one process and several see exactly the same data.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from andrea.errors import AndreaError
from andrea.files import atomic_write_bytes, check_writable, read_json

MAGIC = b"ANDREATK"
VERSION = 1
HEADER = struct.Struct("<8sIIQQ")  # 32 bytes
assert HEADER.size == 32


def write_shard(path: Path, tokens: np.ndarray) -> None:
    tokens = np.ascontiguousarray(tokens, dtype="<u2")
    atomic_write_bytes(path, HEADER.pack(MAGIC, VERSION, 2, len(tokens), 0) + tokens.tobytes())


def open_shard(path: Path) -> np.memmap:
    """Memory-map a shard after checking its header and size."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            head = f.read(HEADER.size)
    except FileNotFoundError:
        raise AndreaError(f"shard {path} does not exist.") from None
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


def encode_documents(tokenizer, docs: list[str]) -> np.ndarray:
    """All documents, each as [BOS] tokens..., concatenated into one uint16 array."""
    if tokenizer.vocab_size > 65536:
        raise AndreaError(f"the tokenizer has V = {tokenizer.vocab_size}; uint16 shards hold at most 65,536.")
    pieces = tokenizer.encode_batch(docs, bos=True)
    if not pieces:
        return np.zeros(0, dtype=np.uint16)
    return np.concatenate([np.asarray(p, dtype=np.uint16) for p in pieces])


def prepare(tokenizer, sources: list[str], out_dir, log=print, progress: bool = True) -> dict:
    """Tokenize each source's train and val documents into shards; write the manifest.

    Large inputs are encoded on every core (`HarrisTokenizer.encode_batch` forks workers); the
    progress bar counts bytes.
    """
    from tqdm import tqdm

    from andrea.corpus import load_documents, source_name

    out = Path(out_dir)
    check_writable(out, "the data folder")
    if not sources:
        raise AndreaError("give at least one source to prepare.")
    manifest = {"format": "andrea-shards", "version": VERSION, "tokenizer": tokenizer.fingerprint(),
                "vocab_size": tokenizer.vocab_size, "sources": {}}
    loaded = {spec: {split: load_documents(spec, split) for split in ("train", "val")} for spec in sources}
    sizes = {spec: {split: sum(len(d.encode("utf-8", "surrogatepass")) for d in docs) for split, docs in splits.items()}
             for spec, splits in loaded.items()}
    bar = tqdm(total=sum(n for s in sizes.values() for n in s.values()), unit="B", unit_scale=True,
               desc="tokenizing", disable=not progress, leave=False)
    for spec in sources:
        name = source_name(spec)
        entry = {}
        for split in ("train", "val"):
            docs = loaded[spec][split]
            tokens = encode_documents(tokenizer, docs)
            file = f"{name}.{split}.tok"
            write_shard(out / file, tokens)
            entry[split] = {"file": file, "tokens": int(len(tokens)), "documents": len(docs), "bytes": sizes[spec][split]}
            bar.update(sizes[spec][split])
        manifest["sources"][name] = entry
        (bar.write if progress and log is print else log)(f"{name:<12} train {entry['train']['tokens']:>11,} tokens ({entry['train']['bytes'] / max(1, entry['train']['tokens']):.2f} bytes/token)"
            f"  val {entry['val']['tokens']:>9,} tokens")
    bar.close()
    tokenizer.save(out / "tokenizer")
    atomic_write_bytes(out / "manifest.json", (json.dumps(manifest, indent=2) + "\n").encode())
    return manifest


# ---------------------------------------------------------------- loading


@dataclass
class SourceShards:
    name: str
    train: np.ndarray
    val: np.ndarray


class TokenData:
    """The shards of a prepared data folder, with batch sampling and evaluation windows."""

    def __init__(self, data_dir):
        self.dir = Path(data_dir)
        manifest_path = self.dir / "manifest.json"
        if not self.dir.is_dir():
            raise AndreaError(f"data folder {self.dir} does not exist; make one with `andrea prepare`.")
        if not manifest_path.exists():
            raise AndreaError(f"{self.dir} has no manifest.json; make the folder with `andrea prepare`.")
        self.manifest = check_manifest(read_json(manifest_path, "manifest"), manifest_path)
        sources = self.manifest["sources"]
        self.sources: dict[str, SourceShards] = {}
        for name, entry in sources.items():
            train = open_shard(self.dir / entry["train"]["file"])
            val = open_shard(self.dir / entry["val"]["file"])
            if len(train) != entry["train"]["tokens"] or len(val) != entry["val"]["tokens"]:
                raise AndreaError(f"the shards of {name} do not hold the token counts the manifest lists.")
            if len(train) and int(train.max()) >= self.vocab_size:
                raise AndreaError(f"shard {self.dir / entry['train']['file']} holds ids >= V = {self.vocab_size:,}.")
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
            if len(s.train) < seq_len + 1:
                raise AndreaError(f"source {s.name} has {len(s.train):,} training tokens, fewer than one window of {seq_len + 1}.")

    def token_share(self) -> dict[str, float]:
        total = sum(len(s.train) for s in self.sources.values())
        return {n: len(s.train) / total for n, s in self.sources.items()}

    def sample_offsets(self, source: str, n: int, seq_len: int, rng: np.random.Generator) -> np.ndarray:
        return rng.integers(0, len(self.sources[source].train) - seq_len, size=n)

    def windows(self, source: str, offsets, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = self.sources[source].train
        batch = np.stack([tokens[o : o + seq_len + 1] for o in offsets]).astype(np.int64)
        batch = torch.from_numpy(batch)
        return batch[:, :-1], batch[:, 1:]

    def val_windows(self, source: str, seq_len: int, max_windows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Fixed evaluation windows: consecutive, non-overlapping, from the start of val."""
        tokens = self.sources[source].val
        n = min(max_windows, (len(tokens) - 1) // seq_len)
        if n < 1:
            raise AndreaError(f"source {source} has {len(tokens):,} validation tokens, fewer than one window of {seq_len + 1}.")
        batch = np.stack([tokens[i * seq_len : i * seq_len + seq_len + 1] for i in range(n)]).astype(np.int64)
        batch = torch.from_numpy(batch)
        return batch[:, :-1], batch[:, 1:]


# ---------------------------------------------------------------- checks before a run reads anything


def check_manifest(manifest, where) -> dict:
    """The manifest, once every field a reader uses is known to be there and of its kind; shard
    files must be plain names inside the data folder (nothing of another file is ever opened)."""
    def bad(what):
        raise AndreaError(f"{where} is not a valid andrea shard manifest: {what}.")

    if not isinstance(manifest, dict) or manifest.get("format") != "andrea-shards":
        bad('it has no "format": "andrea-shards"')
    if manifest.get("version", VERSION) != VERSION:
        bad(f"its version is {str(manifest.get('version'))[:20]!r}, not {VERSION}")
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
            file = part.get("file")
            if not isinstance(file, str) or not file or Path(file).name != file or file in (".", ".."):
                bad(f"the {split} shard of {name!r} must be a file name inside the data folder")
            for key in ("tokens", "documents", "bytes"):
                if key in part and not _count(part[key]) or key == "tokens" and key not in part:
                    bad(f"{split} {key} of {name!r} must be a non-negative integer")
    return manifest


def _count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def check_validation(data: "TokenData", names, seq_len: int) -> None:
    """Every validation shard a run will evaluate holds at least one window of seq_len + 1 tokens
    and only ids below V: checked before the first step, not found at the first evaluation."""
    V = data.vocab_size
    for name in names:
        val = data.sources[name].val
        if len(val) < seq_len + 1:
            raise AndreaError(f"source {name} has {len(val):,} validation tokens, fewer than one window of "
                              f"{seq_len + 1}; prepare more text or use a shorter --seq-len.")
        if int(val.max()) >= V:
            raise AndreaError(f"the validation shard of {name} holds ids >= V = {V:,}; it is damaged.")
