"""What a tokenizer is fitted on: documents of sources, sampled evenly within a byte budget.

`load_training_texts` draws an even, deterministic sample of at most `sample_bytes` (an equal part
per source, or the shares given) across all of each source's files; `sample_source` is one source's
part; `load_documents` reads a small source whole, for inspection and tests.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from andrea.corpus.sources import SourceSpec, _parquet_file, documents, read_documents, resolve, tasks
from andrea.errors import AndreaError


def load_documents(spec: str | Path, split: str = "train", text_field: str = "text") -> list[str]:
    """Every document of one split of a source (any format of `andrea.corpus.sources`), in memory: for
    small sources and inspection. A fetched source gives its own split; any other source the
    documents its stable hash puts there (a document read in pieces comes back whole)."""
    docs: list[str] = []
    for text, bos in read_documents(spec, split, text_field):
        if bos or not docs:
            docs.append(text)
        else:
            docs[-1] += text
    return docs


def source_name(spec: str | Path) -> str:
    return resolve(spec).name


DEFAULT_SAMPLE_BYTES = 200_000_000  # text a tokenizer is fitted on, at most, over all its sources


def estimate_text_bytes(file) -> int:
    """About how many bytes of text a file holds once decompressed (for sampling; never exact for
    zstd frames that do not record their size, nor for parquet)."""
    size = file.size
    try:
        if file.compression == "gz" and size >= 18:
            with open(file.path, "rb") as f:
                f.seek(-4, os.SEEK_END)
                isize = int.from_bytes(f.read(4), "little")  # the size modulo 2^32
            while isize < size:
                isize += 1 << 32
            return isize
        if file.compression == "zst":
            import zstandard

            with open(file.path, "rb") as f:
                n = zstandard.frame_content_size(f.read(18))
            return n if n > 0 else 4 * size
        if file.kind == "parquet":
            md = _parquet_file(file.path).metadata
            return sum(md.row_group(i).total_byte_size for i in range(md.num_row_groups)) or size
    except (OSError, ImportError, ValueError):
        pass
    except Exception:  # zstandard.ZstdError
        pass
    return size


@dataclass
class Sample:
    """What one source gave a tokenizer: its documents and how they were drawn."""

    name: str
    texts: list
    bytes: int
    estimate: int  # about how many bytes of text the source holds
    files: int
    tasks_read: int
    tasks_total: int
    everything: bool
    from_val: bool = False

    def describe(self) -> str:
        docs = f"{len(self.texts):,} documents, {self.bytes:,} bytes"
        files = f"{self.files:,} file{'s' if self.files != 1 else ''}"
        if self.everything:
            how = f"all of its training text ({docs}, {files})"
        else:
            how = (f"{docs} of about {self.estimate:,} bytes ({self.bytes / max(1, self.estimate):.1%}), drawn evenly from "
                   f"{self.tasks_read:,} of its {self.tasks_total:,} chunks of about 4 MB across {files}")
        return f"{self.name}: {how}" + ("; it has no training documents, so its validation documents" if self.from_val else "")


def sample_source(spec, budget: int | None, text_field: str = "text") -> Sample:
    """The training documents of a source, or an even, deterministic sample of about `budget`
    bytes of them: every chunk of the source (about 4 MB of input, in reading order, across all
    its files) adds budget x its size / the source's size to an allowance, and documents are taken
    from the start of each chunk while the allowance is positive. Memory holds the sample only."""
    src = spec if isinstance(spec, SourceSpec) else resolve(spec)
    estimate = sum(estimate_text_bytes(f) for f in src.files)
    disk_total = max(1, src.size)
    everything = budget is None or estimate <= budget
    texts, val_texts, taken, allowance, read, total = [], [], 0, 0.0, 0, 0
    for task, disk in tasks(src, text_field):
        total += 1
        if not everything:
            allowance += budget * disk / disk_total
            if allowance <= 0 or taken >= 1.5 * budget:
                continue
        read += 1
        for text, bos, in_val, n in documents(task):
            if "\0" in text:
                raise AndreaError(f"{task[1]} looks like a binary file (it holds NUL bytes), not text.")
            if in_val:
                if not texts and taken < (budget or 1 << 62):
                    val_texts.append(text)
                continue
            texts.append(text)
            taken += n
            if not everything:
                allowance -= n
                if allowance <= 0:
                    break
    from_val = False
    if not texts and val_texts:
        texts, from_val = val_texts, True
        taken = sum(len(t.encode("utf-8", "surrogatepass")) for t in texts)
    if not texts:
        raise AndreaError(f"{src.path} holds no text.")
    return Sample(src.name, texts, taken, estimate, len(src.files), read, total, everything, from_val)


def load_training_texts(specs, shares=None, sample_bytes: int | None = None, text_field: str = "text", log=None):
    """Training documents of every FILE (a file or folder in any format of `andrea.corpus.sources`, or a
    fetched source's name), and a weight per document, or None when every document counts once.

    With sample_bytes, each source gives an even sample of at most its equal part of sample_bytes
    (`sample_source`); `log` is told what was drawn. shares maps a spec to the share of the
    training text its source should make up (a curriculum's source weights); the shares are
    normalised, and a document of a source with share s counts s x (total bytes / source bytes)
    times.
    """
    budget = None if sample_bytes is None else max(1, int(sample_bytes) // max(1, len(specs)))
    sources = []
    for spec in specs:
        sample = sample_source(spec, budget, text_field)
        if log is not None:
            log(sample.describe())
        sources.append((spec, sample.texts, sample.bytes))
    texts = [d for _, docs, _ in sources for d in docs]
    if shares is None:
        return texts, None
    missing = [spec for spec, _, _ in sources if spec not in shares]
    if missing:
        raise AndreaError(f"no share is given for {missing[0]}; give every training source a share.")
    total_share = sum(shares[spec] for spec, _, _ in sources)
    if not total_share > 0:
        raise AndreaError("the source shares add up to zero; give at least one source a positive share.")
    total = sum(size for _, _, size in sources)
    weights = []
    for spec, docs, size in sources:
        weights += [shares[spec] / total_share * total / size] * len(docs)
    return texts, weights
