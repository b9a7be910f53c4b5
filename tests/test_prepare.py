"""Streamed preparation (andrea.prepare): every input format, token counts against encoding the
same text directly, the fixed validation split, resume after a kill, bad input and a full disk.
Every input is built here, in a temporary folder."""

from __future__ import annotations

import gzip
import json
import random
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from helpers import (
    ENV,
    PREP_WORDS,
    cli,
    last_sentence,
    prep_doc,
    prep_docs,
    prep_tokenizer,
    split_tokens,
    temp_files,
)

import andrea.corpus.sources as sources
from andrea.cli import main
from andrea.corpus.sources import is_validation
from andrea.errors import AndreaError
from andrea.prepare import prepare
from andrea.shards import PROGRESS_FILE, TokenData
from andrea.tokenizer.harris import BOS


@pytest.fixture(scope="module")
def tok():
    return prep_tokenizer()


def big_paragraphs(seed: int, n: int) -> list[str]:
    """Paragraphs of more than 20,000 bytes: each is one plain-text document."""
    rng = random.Random(seed)
    return [prep_doc(rng, 4500) for _ in range(n)]


def write_formats(root: Path) -> dict[str, list[str]]:
    """One file of every format; returns each file's documents in order."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "sub").mkdir(exist_ok=True)
    docs = {}
    docs["a.txt"] = big_paragraphs(1, 4)
    (root / "a.txt").write_text("\n\n".join(docs["a.txt"]) + "\n")
    docs["b.txt.gz"] = big_paragraphs(2, 3)
    (root / "b.txt.gz").write_bytes(gzip.compress(("\n \n".join(docs["b.txt.gz"])).encode()))
    lines = lambda ds: "".join(json.dumps({"id": i, "text": d}) + "\n" for i, d in enumerate(ds)).encode()  # noqa: E731
    docs["c.jsonl"] = prep_docs(3, 40)
    (root / "c.jsonl").write_bytes(lines(docs["c.jsonl"]))
    docs["sub/d.jsonl.gz"] = prep_docs(4, 30)
    (root / "sub" / "d.jsonl.gz").write_bytes(gzip.compress(lines(docs["sub/d.jsonl.gz"])))
    docs["sub/e.jsonl.zst"] = prep_docs(5, 30)
    (root / "sub" / "e.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(lines(docs["sub/e.jsonl.zst"])))
    docs["f.parquet"] = prep_docs(6, 50)
    pq.write_table(pa.table({"n": list(range(50)), "text": docs["f.parquet"]}), root / "f.parquet", row_group_size=16)
    (root / "notes.md").write_text("not a source file")  # other files in a folder are left out
    return docs


def expected_tokens(tok, docs: list[str], val: bool, share: float = 0.05) -> list[int]:
    out = []
    for d in docs:
        if is_validation(d.encode(), share) == val:
            out += tok.encode(d, bos=True)
    return out


@pytest.mark.parametrize("workers", [1, 2])
def test_every_format_encodes_to_the_tokens_of_its_documents(tmp_path, tok, workers, monkeypatch):
    monkeypatch.setattr(sources, "CHUNK_BYTES", 8000)  # several tasks per file, so workers share them
    docs = write_formats(tmp_path / "corpus")
    order = sorted(docs)  # a folder is read in sorted path order
    assert order == ["a.txt", "b.txt.gz", "c.jsonl", "f.parquet", "sub/d.jsonl.gz", "sub/e.jsonl.zst"]
    all_docs = [d for f in order for d in docs[f]]
    manifest = prepare(tok, [str(tmp_path / "corpus")], tmp_path / "data", log=lambda *a: None, progress=False,
                       workers=workers)
    entry = manifest["sources"]["corpus"]
    for split, val in (("train", False), ("val", True)):
        got = split_tokens(tmp_path / "data", "corpus", split)
        assert got.tolist() == expected_tokens(tok, all_docs, val)
        assert entry[split]["documents"] == sum(is_validation(d.encode(), 0.05) == val for d in all_docs)
        assert entry[split]["bytes"] == sum(len(d.encode()) for d in all_docs if is_validation(d.encode(), 0.05) == val)
    assert 0 < entry["val"]["documents"] < entry["train"]["documents"]
    assert entry["files"] == 6
    # each file on its own is a source named after it
    for f in ("b.txt.gz", "sub/e.jsonl.zst", "f.parquet"):
        m = prepare(tok, [str(tmp_path / "corpus" / f)], tmp_path / f"one-{Path(f).name}", log=lambda *a: None,
                    progress=False, workers=workers, val_share=0.0)
        (name,) = m["sources"]
        assert name == Path(f).name.split(".")[0]
        assert m["sources"][name]["train"]["tokens"] == sum(len(tok.encode(d)) for d in docs[f])


def test_a_huge_line_is_read_in_pieces_that_encode_as_the_whole(tmp_path, tok, monkeypatch):
    monkeypatch.setattr(sources, "PIECE_BYTES", 3000)
    monkeypatch.setattr(sources, "CHUNK_BYTES", 7000)
    rng = random.Random(9)
    line = "  " + " ".join(rng.choice(PREP_WORDS) for _ in range(8000)) + "\n"  # about 45 KB, no blank line
    (tmp_path / "line.txt").write_text(line)
    pieces = [(t, bos) for task, _ in sources.tasks(sources.resolve(str(tmp_path / "line.txt")))
              for t, bos, _, _ in sources.documents(task)]
    assert len(pieces) > 10 and [bos for _, bos in pieces] == [True] + [False] * (len(pieces) - 1)
    assert "".join(t for t, _ in pieces) == line.strip()
    assert all(len(t.encode()) <= 3000 for t, _ in pieces)
    for share in (0.0, 0.999999):  # the whole line lands in one split, whichever it is
        m = prepare(tok, [str(tmp_path / "line.txt")], tmp_path / f"d{share}", log=lambda *a: None, progress=False,
                    val_share=share, workers=2)
        split = "train" if share == 0 else "val"
        got = split_tokens(tmp_path / f"d{share}", "line", split)
        assert got.tolist() == tok.encode(line.strip(), bos=True)
        assert m["sources"]["line"][split]["documents"] == 1


def test_the_validation_split_stays_when_files_are_added(tmp_path, tok):
    root = tmp_path / "src"
    root.mkdir()
    for name, seed in (("b.jsonl", 1), ("d.jsonl", 2)):
        (root / name).write_text("".join(json.dumps({"text": d}) + "\n" for d in prep_docs(seed, 200)))
    before = {d for d in (json.loads(x)["text"] for f in ("b.jsonl", "d.jsonl") for x in (root / f).read_text().splitlines())}
    val_before = set(sources_val(root))
    assert 0 < len(val_before) < len(before) / 5
    for name, seed in (("a.jsonl", 3), ("c.jsonl", 4), ("e.jsonl", 5)):
        (root / name).write_text("".join(json.dumps({"text": d}) + "\n" for d in prep_docs(seed, 200)))
    val_after = set(sources_val(root))
    assert val_after & before == val_before  # the old documents' split is untouched
    assert len(val_after) > len(val_before)
    # and prepare holds out exactly those documents
    prepare(tok, [str(root)], tmp_path / "data", log=lambda *a: None, progress=False)
    val = split_tokens(tmp_path / "data", "src", "val")
    assert sorted(_documents_of(tok, val)) == sorted(val_after)


def sources_val(root: Path) -> list[str]:
    return [t for t, _ in sources.read_documents(str(root), "val")]


def _documents_of(tok, tokens: np.ndarray) -> list[str]:
    starts = np.flatnonzero(tokens == BOS).tolist() + [len(tokens)]
    return [tok.decode(tokens[a + 1 : b].tolist()) for a, b in zip(starts, starts[1:])]


KILLER = textwrap.dedent("""
    import os, signal, sys
    import andrea.corpus.sources as sources
    from andrea.prepare import prepare
    from andrea.tokenizer.harris import HarrisTokenizer
    from andrea.tokenizer.train import train_tokenizer
    sources.CHUNK_BYTES = 5000
    written = []
    def log(line):
        if "written" in line:
            written.append(line)
            if len(written) == 2:
                os.kill(os.getpid(), signal.SIGKILL)
    prepare(HarrisTokenizer.load(sys.argv[1]), [sys.argv[2]], sys.argv[3], log=log, progress=False,
            shard_tokens=2000, workers=2)
""")


def test_a_killed_preparation_resumes_after_its_last_whole_shard(tmp_path, tok, monkeypatch):
    monkeypatch.setattr(sources, "CHUNK_BYTES", 5000)
    tok.save(tmp_path / "tok")
    src = tmp_path / "s.jsonl"
    src.write_text("".join(json.dumps({"text": d}) + "\n" for d in prep_docs(8, 300)))
    out = tmp_path / "data"
    done = subprocess.run([sys.executable, "-c", KILLER, str(tmp_path / "tok"), str(src), str(out)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == -9, done.stderr
    assert not (out / "manifest.json").exists() and (out / PROGRESS_FILE).exists()
    with pytest.raises(AndreaError, match="did not finish"):
        TokenData(out)
    whole = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in out.glob("*.tok")}
    assert {"s.train.00000.tok", "s.train.00001.tok"} <= set(whole)
    said = []
    m = prepare(tok, [str(src)], out, log=said.append, progress=False, shard_tokens=2000, workers=2)
    assert not any(line.startswith("s: part 0 ") or line.startswith("s: part 1 ") for line in said)  # not redone
    for name, stamp in whole.items():  # the finished shards are the same files, untouched
        p = out / name
        assert (p.stat().st_ino, p.stat().st_mtime_ns) == stamp
    assert not list(out.glob("*.partial")) and not (out / PROGRESS_FILE).exists()
    fresh = prepare(tok, [str(src)], tmp_path / "fresh", log=lambda *a: None, progress=False, shard_tokens=2000, workers=1)
    assert m["sources"] == fresh["sources"]
    assert [s["sha256"] for s in m["sources"]["s"]["train"]["shards"]] == \
        [s["sha256"] for s in fresh["sources"]["s"]["train"]["shards"]]
    # a finished folder prepared again with the same settings reuses every shard
    again = prepare(tok, [str(src)], out, log=lambda *a: None, progress=False, shard_tokens=2000)
    assert again["sources"] == m["sources"]


def run_cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("name, content, expect", [
    ("bad.jsonl", b'{"text": "fine"}\n{"text": "also fine"}\n{"body": "no text field"}\n', r"bad\.jsonl line 3 has no 'text' field"),
    ("bad2.jsonl", b'{"text": "fine"}\nnot json at all\n', r"bad2\.jsonl line 2 is not valid JSON"),
    ("bad.txt", b"good text\n\nmore good text \xff\xfe here\n", r"bad\.txt is not UTF-8 text: invalid bytes at line 3"),
    ("bad.txt.gz", b"\x1f\x8b\x08\x00garbage that is not deflate", r"bad\.txt\.gz is not a readable gz file"),
    ("bad.jsonl.zst", b"(\xb5/\xfd not a zstd frame", r"bad\.jsonl\.zst is not a readable zstd file"),
    ("bad.parquet", b"PAR1 not really parquet PAR1", r"bad\.parquet is not a readable parquet file"),
    ("empty.txt", b"\n  \n\n", r"source empty \(.*empty\.txt\) holds no text"),
])
def test_bad_input_is_one_sentence_and_leaves_nothing_complete(tmp_path, tok, capsys, name, content, expect):
    import re

    tok.save(tmp_path / "tok")
    good = tmp_path / "good.jsonl"
    good.write_text("".join(json.dumps({"text": d}) + "\n" for d in prep_docs(1, 20)))
    (tmp_path / name).write_bytes(content)
    out = tmp_path / "data"
    code, _, err = run_cli(capsys, "prepare", "--tokenizer", tmp_path / "tok", "--out", out, "--no-progress",
                           good, tmp_path / name)
    assert code == 2 and "Traceback" not in err and re.search(expect, err), err
    assert err.count("\n") == 1
    assert not (out / "manifest.json").exists() and not list(out.glob("*.partial"))
    assert not [p for p in out.glob("*.tok") if not p.name.startswith("good.")]


def test_a_parquet_file_without_the_column_names_it(tmp_path, tok, capsys):
    tok.save(tmp_path / "tok")
    pq.write_table(pa.table({"body": ["some text"] * 3}), tmp_path / "p.parquet")
    code, _, err = run_cli(capsys, "prepare", "--tokenizer", tmp_path / "tok", "--out", tmp_path / "d", tmp_path / "p.parquet")
    assert code == 2 and "p.parquet has no column 'text' (its columns: body)" in err
    code, _, err = run_cli(capsys, "prepare", "--tokenizer", tmp_path / "tok", "--out", tmp_path / "d", "--no-progress",
                           "--text-field", "body", tmp_path / "p.parquet")
    assert code == 0, err
    pq.write_table(pa.table({"text": [1, 2, 3]}), tmp_path / "n.parquet")
    code, _, err = run_cli(capsys, "prepare", "--tokenizer", tmp_path / "tok", "--out", tmp_path / "d", tmp_path / "n.parquet")
    assert code == 2 and "column 'text' of" in err and "not text" in err


@pytest.mark.hostile
def test_prepare_removes_the_temporary_files_of_a_killed_preparation(prepared_root, tmp_path, capsys):
    out = tmp_path / "d"
    shutil.copytree(prepared_root / "data", out)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = out / f"manifest.json.tmp-{dead.pid}-0badcafe"
    stale.write_text("{")
    code, _, err = cli(capsys, "prepare", prepared_root / "text.txt", "--tokenizer", prepared_root / "tok", "--out", out, "--no-progress")
    assert code == 0 and not stale.exists(), err


@pytest.mark.hostile
def test_a_full_disk_during_prepare_names_the_file(prepared_root, tmp_path):
    """A fresh process whose files may not grow past 16 KiB (the kernel fails the write with
    EFBIG, as a full disk fails it with ENOSPC): the sentence names the shard being written and
    says how to go on; run again with room, the preparation finishes."""
    out = tmp_path / "d"
    args = ["prepare", str(prepared_root / "text.txt"), "--tokenizer", str(prepared_root / "tok"), "--out", str(out), "--no-progress"]
    code = ("import resource, signal, sys\nsignal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
            "resource.setrlimit(resource.RLIMIT_FSIZE, (16384, 16384))\nfrom andrea.cli import main\n"
            f"sys.exit(main({args!r}))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=ENV)
    line = last_sentence(done)
    assert f"could not write {out / 'text.train.00000.tok'} (File too large)" in line and "prepare` again" in line
    assert not temp_files(out)
    assert subprocess.run([sys.executable, "-m", "andrea", *args], capture_output=True, env=ENV, timeout=120).returncode == 0
    assert TokenData(out).names == ["text"]
