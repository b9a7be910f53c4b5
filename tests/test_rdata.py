"""R's lazy-load data read without R: a small XDR writer here builds .rdx/.rdb pairs the way R
lays them out (format version 3, symbols written once and referred back to, zlib chunks behind a
4-byte length, a gzip'd index), the reader must give back what was written and refuse everything
else in one sentence; and janeaustenr's real data, where it has been fetched, holds the novels."""

from __future__ import annotations

import gzip
import random
import shutil
import struct
import subprocess
import zlib

import pytest

import andrea.corpus.readers as corpus_readers
import andrea.corpus.registry as corpus
import andrea.tokenizer.sample as samples
from andrea.corpus.rdata import read_lazyload, unserialize
from andrea.errors import AndreaError

ASCII, UTF8, LATIN1 = 1 << 6, 1 << 3, 1 << 2  # a string's encoding, in the levels of its flags


def xint(*values: int) -> bytes:
    return struct.pack(f">{len(values)}i", *values)


def string(s, level=ASCII) -> bytes:
    if s is None:
        return xint(9, -1)
    raw = s.encode("latin-1" if level == LATIN1 else "utf-8")
    return xint(9 | level << 12, len(raw)) + raw


def vector(kind: int, body: bytes, n: int, attrs: bytes = b"") -> bytes:
    return xint(kind | (1 << 9 if attrs else 0), n) + body + attrs


def character(values, level=ASCII, attrs=b"") -> bytes:
    return vector(16, b"".join(string(v, level) for v in values), len(values), attrs)


def integers(values, attrs=b"") -> bytes:
    return vector(13, xint(*values), len(values), attrs)


def listing(items, attrs=b"") -> bytes:
    return vector(19, b"".join(items), len(items), attrs)


def names(values, ref: int = 0) -> bytes:
    """attributes(x) = list(names = values): a tagged pairlist node, the symbol `names` written
    in full or (ref > 0) as a reference to the ref-th symbol written before."""
    tag = xint(ref << 8 | 255) if ref else xint(1) + string("names")
    return xint(2 | 1 << 10) + tag + character(values) + xint(254)


def serialized(item: bytes) -> bytes:
    return b"X\n" + xint(3, 0x040201, 0x030500, 5) + b"UTF-8" + item


def lazyload(objects: dict[str, bytes], compressed: bytes = vector(10, xint(1), 1), cut: int = 0) -> tuple[bytes, bytes]:
    """(rdx, rdb) for serialized objects by name, in R's layout (cut: bytes missing from the end
    of every zlib stream)."""
    rdb, places = b"", []
    for item in objects.values():
        data = serialized(item)
        stream = zlib.compress(data)
        chunk = struct.pack(">I", len(data)) + stream[: len(stream) - cut]
        places.append(integers([len(rdb), len(chunk)]))
        rdb += chunk
    index = listing([listing(places, names(list(objects))), listing([]), compressed],
                    names(["variables", "references", "compressed"], ref=1))
    return gzip.compress(serialized(index)), rdb


NOVEL = ["EMMA", "", "CHAPTER I", "", "Emma Woodhouse, handsome, clever,", "and rich.", "", "", "FINIS"]


def test_a_lazy_load_database_gives_back_its_character_vectors():
    rdx, rdb = lazyload({"emma": character(NOVEL), "naive": character(["naïve café", None], UTF8),
                         "latin": character(["Ã©t\xe9"], LATIN1), "pairs": integers([3, -7])})
    got = read_lazyload(rdx, rdb, "test data")
    assert list(got) == ["emma", "naive", "latin", "pairs"]
    assert got["emma"].type == "character" and got["emma"].values == NOVEL
    assert got["naive"].values == ["naïve café", None]  # NA_character_ is None
    assert got["latin"].values == ["Ã©t\xe9"]
    assert got["pairs"].type == "integer" and got["pairs"].values == [3, -7]
    assert read_lazyload(gzip.decompress(rdx), rdb, "test data")["emma"].values == NOVEL  # an index not gzip'd


def test_every_cut_of_a_serialization_is_refused_in_one_sentence():
    data = serialized(listing([character(NOVEL), integers([1, 2])], names(["a", "b"])))
    assert unserialize(data, "x").names() == ["a", "b"]
    for n in range(len(data)):
        with pytest.raises(AndreaError, match=r"^x .*\.$"):
            unserialize(data[:n], "x")
    with pytest.raises(AndreaError, match="not an R serialization in XDR"):
        unserialize(b"A\n3\n", "x")  # R's ASCII format


def test_damaged_bytes_give_an_object_or_one_sentence_never_another_error():
    data = bytearray(serialized(listing([character(NOVEL), integers([1, 2])], names(["a", "b"]))))
    rng = random.Random(0)
    for _ in range(2000):
        damaged = bytearray(data)
        for _ in range(rng.randint(1, 3)):
            damaged[rng.randrange(len(damaged))] = rng.randrange(256)
        try:
            unserialize(bytes(damaged), "x")
        except AndreaError:
            pass


@pytest.mark.parametrize("item, why", [
    (xint(3) + xint(254) * 3, "type 3"),  # a closure: code, not data
    (xint(16, 1 << 30), "longer than the data"),  # a vector far longer than the bytes left
    (xint(19, 1) * 40 + xint(254), "deeper than 32"),  # lists nested 40 deep
    (xint(255 | 9 << 8), "never defined"),  # a reference to a symbol never written
    (xint(2 | 1 << 10) + xint(16, 0) + xint(254) + xint(254), "other than a name"),  # a pairlist tagged by a vector
    (character(["\xff"], LATIN1).replace(xint(9 | LATIN1 << 12), xint(9 | UTF8 << 12)), "not valid UTF-8"),
])
def test_what_the_reader_does_not_know_is_refused(item, why):
    with pytest.raises(AndreaError, match=why):
        unserialize(serialized(item), "x")


@pytest.mark.parametrize("shape", ["nulls", "pairlist", "strings", "integers"])
def test_an_object_of_more_values_than_the_bound_is_refused_before_it_is_built(shape):
    """A few bytes of data per value, but a Python object per value: 2 million of them (8-16 MB of
    data) are refused, as 2 GB of objects would be, while a million fit."""
    n = (1 << 20) + 1
    if shape == "nulls":
        item = listing([xint(254)] * n)
    elif shape == "pairlist":
        item = b"".join(xint(2) + xint(254) for _ in range(n)) + xint(254)
    elif shape == "strings":
        item = character([""] * n)
    else:
        item = integers([1] * n)
    with pytest.raises(AndreaError, match="more than 1,048,576 R values"):
        unserialize(serialized(item), "the test object")
    assert len(unserialize(serialized(integers([7] * (n - 2))), "the test object").values) == n - 2


def test_a_damaged_database_is_refused_in_one_sentence():
    rdx, rdb = lazyload({"emma": character(NOVEL)})
    with pytest.raises(AndreaError, match="cut short"):
        read_lazyload(*lazyload({"emma": character(NOVEL)}, cut=5), "x")
    with pytest.raises(AndreaError, match="outside its"):
        read_lazyload(rdx, rdb[:-5], "x")
    with pytest.raises(AndreaError, match="damaged"):
        read_lazyload(rdx, rdb[:4] + b"not zlib" + rdb[12:], "x")
    with pytest.raises(AndreaError, match="index"):
        read_lazyload(rdx[:-9], rdb, "x")
    with pytest.raises(AndreaError, match="other than zlib"):
        read_lazyload(lazyload({"emma": character(NOVEL)}, integers([3]))[0], rdb, "x")  # xz
    wrong_size = struct.pack(">I", 5) + rdb[4:]
    with pytest.raises(AndreaError, match="decompresses to more"):
        read_lazyload(rdx, wrong_size, "x")
    no_index = gzip.compress(serialized(listing([listing([])], names(["variables"]))))
    with pytest.raises(AndreaError, match="no compressed entry"):
        read_lazyload(no_index, rdb, "x")


def deb(tmp_path, files: dict[str, bytes]) -> bytes:
    root = tmp_path / "pkg"
    (root / "DEBIAN").mkdir(parents=True)
    (root / "DEBIAN" / "control").write_text("Package: r-cran-janeaustenr\nVersion: 1\nArchitecture: all\n"
                                             "Maintainer: x <x@example.org>\nDescription: x\n")
    for path, data in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(data)
    subprocess.run(["dpkg-deb", "--build", "--root-owner-group", str(root), str(tmp_path / "pkg.deb")],
                   check=True, capture_output=True)
    return (tmp_path / "pkg.deb").read_bytes()


DATA = "usr/lib/R/site-library/janeaustenr/data/Rdata"


@pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="dpkg-deb is not installed")
def test_austen_reader_takes_the_novels_from_the_packages_data(tmp_path):
    long_novel = ["PERSUASION", ""] + [f"Paragraph {i}" + " word" * 400 if j == 0 else "" for i in range(30) for j in (0, 1)]
    rdx, rdb = lazyload({"emma": character(NOVEL), "persuasion": character(long_novel)})
    docs = corpus_readers.read_austen(deb(tmp_path, {f"{DATA}.rdx": rdx, f"{DATA}.rdb": rdb, f"{DATA}.rds": b"x"}))
    assert docs[0] == "EMMA\n\nCHAPTER I\n\nEmma Woodhouse, handsome, clever,\nand rich.\n\nFINIS"
    rest = docs[1:]
    assert [d.split(" ", 1)[0] for d in rest] == ["PERSUASION\n\nParagraph", "Paragraph", "Paragraph"]
    assert [d.split("\n\n")[-1].split(" word")[0] for d in rest] == ["Paragraph 9", "Paragraph 19", "Paragraph 29"]
    assert "\n\n".join(rest) == "\n\n".join(["PERSUASION"] + long_novel[2::2])
    assert all(len(d) < 20_000 + 2100 for d in rest)
    rdx, rdb = lazyload({"emma": integers([1])})
    with pytest.raises(AndreaError, match="emma is an R integer"):
        corpus_readers.read_austen(deb(tmp_path / "b", {f"{DATA}.rdx": rdx, f"{DATA}.rdb": rdb}))
    with pytest.raises(AndreaError, match="no data/Rdata.rdx"):
        corpus_readers.read_austen(deb(tmp_path / "c", {"usr/share/doc/x": b"x"}))


def test_the_fetched_austen_source_holds_the_six_novels():
    """Where janeaustenr 1.0.0-1 has been fetched (`andrea data fetch austen`), its documents begin
    each novel as the novels begin."""
    path = corpus.corpus_dir() / "austen"
    if not (path / "meta.json").exists():
        pytest.skip("austen is not fetched")
    meta = corpus.source_meta(path)
    assert meta["sha256"] == corpus.EVERYDAY_SOURCES["austen"].sha256
    text = "\n\n".join(samples.load_documents(path) + samples.load_documents(path, "val"))
    for opening in ("Emma Woodhouse, handsome, clever, and rich", "It is a truth universally acknowledged",
                    "Sir Walter Elliot, of Kellynch Hall", "No one who had ever seen Catherine Morland",
                    "The family of Dashwood had long been settled in Sussex", "About thirty years ago Miss Maria Ward"):
        assert opening in text.replace("\n", " ")
    assert meta["documents"] == 198 and meta["train_bytes"] + meta["val_bytes"] == 4_023_788
