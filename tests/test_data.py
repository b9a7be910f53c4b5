"""Streamed preparation: every input format, token counts against encoding the same text
directly, the fixed validation split, several shards and the windows read from them, resume
after a kill, and bad input. Every input is built here, in a temporary folder."""

from __future__ import annotations

import gzip
import hashlib
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
    SECRET,
    cli,
    damaged_data,
    last_sentence,
    one_sentence,
    root_train_args,
    shard_tokens,
    swap_two_ids,
    temp_files,
    text_train_args,
)

import andrea.sources as sources
from andrea.cli import main
from andrea.errors import AndreaError
from andrea.prepare import prepare
from andrea.shards import HEADER, PROGRESS_FILE, TokenData, open_shard, write_shard
from andrea.sources import is_validation
from andrea.tokenizer import BOS
from andrea.tokenizer_sample import load_training_texts, sample_source
from andrea.tokenizer_train import train_tokenizer

WORDS = ("the king of old spoke to his people and they went up to the city while the sea rose over "
         "land where ships sailed far away in storms of night and day café naïve").split()


def doc(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n)).capitalize() + "."


@pytest.fixture(scope="module")
def tok():
    rng = random.Random(0)
    return train_tokenizer([doc(rng, 400) for _ in range(30)], 30)


def big_paragraphs(seed: int, n: int) -> list[str]:
    """Paragraphs of more than 20,000 bytes: each is one plain-text document."""
    rng = random.Random(seed)
    return [doc(rng, 4500) for _ in range(n)]


def small_docs(seed: int, n: int) -> list[str]:
    rng = random.Random(seed)
    return [doc(rng, rng.randint(5, 300)) for _ in range(n)]


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
    docs["c.jsonl"] = small_docs(3, 40)
    (root / "c.jsonl").write_bytes(lines(docs["c.jsonl"]))
    docs["sub/d.jsonl.gz"] = small_docs(4, 30)
    (root / "sub" / "d.jsonl.gz").write_bytes(gzip.compress(lines(docs["sub/d.jsonl.gz"])))
    docs["sub/e.jsonl.zst"] = small_docs(5, 30)
    (root / "sub" / "e.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(lines(docs["sub/e.jsonl.zst"])))
    docs["f.parquet"] = small_docs(6, 50)
    pq.write_table(pa.table({"n": list(range(50)), "text": docs["f.parquet"]}), root / "f.parquet", row_group_size=16)
    (root / "notes.md").write_text("not a source file")  # other files in a folder are left out
    return docs


def expected_tokens(tok, docs: list[str], val: bool, share: float = 0.05) -> list[int]:
    out = []
    for d in docs:
        if is_validation(d.encode(), share) == val:
            out += tok.encode(d, bos=True)
    return out


def split_tokens(data: Path, name: str, split: str) -> np.ndarray:
    return np.asarray(getattr(TokenData(data).sources[name], split)[:])


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
    line = "  " + " ".join(rng.choice(WORDS) for _ in range(8000)) + "\n"  # about 45 KB, no blank line
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
        (root / name).write_text("".join(json.dumps({"text": d}) + "\n" for d in small_docs(seed, 200)))
    before = {d for d in (json.loads(x)["text"] for f in ("b.jsonl", "d.jsonl") for x in (root / f).read_text().splitlines())}
    val_before = set(sources_val(root))
    assert 0 < len(val_before) < len(before) / 5
    for name, seed in (("a.jsonl", 3), ("c.jsonl", 4), ("e.jsonl", 5)):
        (root / name).write_text("".join(json.dumps({"text": d}) + "\n" for d in small_docs(seed, 200)))
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


def test_shards_have_exact_sizes_checksums_and_windows_stay_inside_one(tmp_path, tok, monkeypatch):
    monkeypatch.setattr(sources, "CHUNK_BYTES", 5000)
    (tmp_path / "s.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in small_docs(7, 300)))
    m = prepare(tok, [str(tmp_path / "s.jsonl")], tmp_path / "data", log=lambda *a: None, progress=False,
                shard_tokens=3000, workers=2)
    shards = m["sources"]["s"]["train"]["shards"]
    assert len(shards) >= 4 and all(s["tokens"] == 3000 for s in shards[:-1]) and 0 < shards[-1]["tokens"] <= 3000
    for s in shards:
        raw = (tmp_path / "data" / s["file"]).read_bytes()
        assert hashlib.sha256(raw[32:]).hexdigest() == s["sha256"]
    # the same tokens as one shard would hold
    m1 = prepare(tok, [str(tmp_path / "s.jsonl")], tmp_path / "one", log=lambda *a: None, progress=False, workers=1)
    assert len(m1["sources"]["s"]["train"]["shards"]) == 1
    whole = split_tokens(tmp_path / "one", "s", "train")
    assert np.array_equal(split_tokens(tmp_path / "data", "s", "train"), whole)

    data, T = TokenData(tmp_path / "data"), 64
    train = data.sources["s"].train
    assert len(train.shards) == len(shards) and all(isinstance(s, np.memmap) for s in train.shards)
    counts = [s["tokens"] - T for s in shards]
    total = sum(counts)
    offsets = data.sample_offsets("s", 500, T, np.random.default_rng(0))
    assert offsets.min() >= 0 and offsets.max() < total
    # every start, mapped to its shard: the window is that shard's tokens, never the next shard's
    starts = np.arange(total)
    x, y = data.windows("s", starts, T)
    edges = np.cumsum([0] + counts)
    for k, s in enumerate(shards):
        own = open_shard(tmp_path / "data" / s["file"])
        first, last = edges[k], edges[k + 1] - 1
        assert np.array_equal(x[first].numpy(), own[:T]) and np.array_equal(y[last].numpy(), own[-T:])
    # one shard: the offsets are the positions themselves, as the single-shard format always drew them
    one = TokenData(tmp_path / "one")
    rng_a, rng_b = np.random.default_rng(5), np.random.default_rng(5)
    assert np.array_equal(one.sample_offsets("s", 50, T, rng_a), rng_b.integers(0, len(whole) - T, size=50))
    xo, yo = one.windows("s", [0, 17], T)
    assert np.array_equal(xo[1].numpy(), whole[17 : 17 + T]) and np.array_equal(yo[1].numpy(), whole[18 : 18 + T + 0])


KILLER = textwrap.dedent("""
    import os, signal, sys
    import andrea.sources as sources
    from andrea.prepare import prepare
    from andrea.tokenizer import HarrisTokenizer
    from andrea.tokenizer_train import train_tokenizer
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
    src.write_text("".join(json.dumps({"text": d}) + "\n" for d in small_docs(8, 300)))
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
    good.write_text("".join(json.dumps({"text": d}) + "\n" for d in small_docs(1, 20)))
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


def test_the_tokenizer_fits_on_an_even_sample_across_files(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sources, "CHUNK_BYTES", 20_000)
    root = tmp_path / "big"
    root.mkdir()
    for i in range(6):
        rng = random.Random(i)
        lines = "".join(json.dumps({"text": f"file{i} " + doc(rng, 60)}) + "\n" for _ in range(400))
        (root / f"part{i}.jsonl.gz").write_bytes(gzip.compress(lines.encode()))
    whole = sample_source(str(root), None)
    assert whole.everything and whole.bytes > 500_000 and whole.tasks_total > 30
    budget = whole.bytes // 5
    s = sample_source(str(root), budget)
    assert not s.everything and budget * 0.9 <= s.bytes <= budget + 2000
    assert {t.split()[0] for t in s.texts} == {f"file{i}" for i in range(6)}  # drawn from every file
    assert s.texts == sample_source(str(root), budget).texts  # deterministic
    assert set(s.texts) <= set(whole.texts)  # training documents only
    code = main(["tokenizer", "train", str(root), "--segments", "20", "--sample-bytes", str(budget), "--out", str(tmp_path / "t")])
    out = capsys.readouterr().out
    assert code == 0 and f"sampling at most {budget:,} bytes" in out and "drawn evenly from" in out and "across 6 files" in out
    texts, _ = load_training_texts([str(root)], sample_bytes=budget)
    assert texts == s.texts


# ---------------------------------------------------------------- hostile input


@pytest.mark.hostile
def test_validation_shards_are_checked_before_the_first_step(text_data, text_model_json, tmp_path, capsys):
    from andrea.shards import write_shard

    # ids >= V in the validation shard (the file itself is a well-formed shard)
    data = damaged_data(text_data, tmp_path)
    val = data / "text.val.00000.tok"
    tokens = np.fromfile(val, dtype="<u2", offset=HEADER.size).copy()
    tokens[5] = TokenData(text_data).vocab_size + 3
    write_shard(val, tokens)
    code, _, err = cli(capsys, *text_train_args(data, text_model_json, tmp_path / "r1"))
    assert "validation shard of text holds ids >= V" in one_sentence(code, err)
    assert not (tmp_path / "r1" / "metrics.jsonl").exists()  # refused before any step
    # too short for one window of seq_len + 1
    write_shard(val, tokens[:10])
    manifest = json.loads((data / "manifest.json").read_text())
    manifest["sources"]["text"]["val"]["tokens"] = manifest["sources"]["text"]["val"]["shards"][0]["tokens"] = 10
    (data / "manifest.json").write_text(json.dumps(manifest))
    code, _, err = cli(capsys, *text_train_args(data, text_model_json, tmp_path / "r2"))
    assert "no validation shard of one window of 17 tokens (10 tokens in all)" in one_sentence(code, err)
    assert not (tmp_path / "r2" / "metrics.jsonl").exists()

@pytest.mark.hostile
@pytest.mark.parametrize("damage, expected", [
    (lambda m: m["sources"].__setitem__("text", ["not", "an", "object"]), "is not an object"),
    (lambda m: m["sources"]["text"].pop("val"), "has no val split"),
    (lambda m: m["sources"]["text"]["train"].__setitem__("tokens", "many"), "train tokens"),
    (lambda m: m["sources"]["text"]["train"].__setitem__("tokens", 1.5), "train tokens"),
    (lambda m: m.__setitem__("sources", {}), "lists no sources"),
    (lambda m: m.__setitem__("sources", []), "lists no sources"),
    (lambda m: m.__setitem__("vocab_size", "big"), "vocab_size"),
    (lambda m: m.pop("tokenizer"), "fingerprint"),
    (lambda m: m["sources"]["text"]["train"]["shards"][0].__setitem__("file", "../outside.tok"), "inside the data folder"),
    (lambda m: m["sources"]["text"]["train"]["shards"][0].__setitem__("file", "OUTSIDE"), "inside the data folder"),
    (lambda m: m["sources"]["text"]["val"]["shards"][0].__setitem__("file", 7), "inside the data folder"),
    (lambda m: m["sources"]["text"]["val"].__setitem__("shards", []), "lists no shards"),
    (lambda m: m["sources"]["text"]["train"]["shards"][0].__setitem__("tokens", -1), "token count"),
])
def test_a_malformed_manifest_is_one_sentence(text_data, text_model_json, tmp_path, capsys, damage, expected):
    data = damaged_data(text_data, tmp_path)
    (tmp_path / "outside.tok").write_bytes(SECRET)
    manifest = json.loads((data / "manifest.json").read_text())
    damage(manifest)
    text = json.dumps(manifest).replace('"OUTSIDE"', json.dumps(str(tmp_path / "outside.tok")))
    (data / "manifest.json").write_text(text)
    code, _, err = cli(capsys, *text_train_args(data, text_model_json, tmp_path / "r"))
    line = one_sentence(code, err)
    assert expected in line and "secret" not in line and "root:x" not in line

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
def test_a_train_shard_with_ids_beyond_v_is_named_before_the_first_step(prepared_root, tmp_path, capsys):
    """The manifest's max_id says the shard is fine; its bytes say otherwise. The run names the
    shard and the id before any step (no metrics.jsonl)."""
    data = tmp_path / "data"
    shutil.copytree(prepared_root / "data", data)
    shard = data / "text.train.00000.tok"
    tokens = shard_tokens(shard)
    V = TokenData(data).vocab_size
    tokens[::10] = V + 7  # every window of 17 tokens meets one
    write_shard(shard, tokens)
    code, _, err = cli(capsys, *root_train_args(prepared_root, tmp_path / "r", data=data))
    assert f"shard {shard} holds token id {V + 7:,}, but V = {V:,}" in one_sentence(code, err)
    assert not (tmp_path / "r" / "metrics.jsonl").exists()

@pytest.mark.hostile
def test_a_shard_whose_bytes_changed_is_noticed_before_the_first_step(prepared_root, tmp_path, capsys):
    """Two ids swapped (every id still below V): the SHA-256 the manifest records no longer
    matches, and the run says so, naming the shard, before its first step."""
    data = tmp_path / "data"
    shutil.copytree(prepared_root / "data", data)
    for shard in (data / "text.train.00000.tok", data / "text.val.00000.tok"):
        swap_two_ids(shard)
        code, _, err = cli(capsys, *root_train_args(prepared_root, tmp_path / shard.name, data=data))
        line = one_sentence(code, err)
        assert f"shard {shard} no longer holds the tokens the manifest records" in line and "prepare the data again" in line
        assert not (tmp_path / shard.name / "metrics.jsonl").exists()
        shutil.copy(prepared_root / "data" / shard.name, shard)

@pytest.mark.hostile
def test_an_unchanged_shard_is_read_in_full_once(prepared_root, tmp_path, capsys):
    """Later starts find a checked shard in verified.json by size and modification time; a shard
    changed since (a new modification time) is read in full again, and caught."""
    data = tmp_path / "data"
    shutil.copytree(prepared_root / "data", data)
    (data / "verified.json").unlink(missing_ok=True)  # the copy keeps the modification times: start afresh
    total = sum(len(s.train) + len(s.val) for s in TokenData(data).sources.values())
    code, out, err = cli(capsys, *root_train_args(prepared_root, tmp_path / "r1", data=data))
    assert code == 0 and f"shards: 2 checked in full ({total:,} tokens: ids below V, SHA-256 as recorded)" in out, err
    code, out, err = cli(capsys, *root_train_args(prepared_root, tmp_path / "r2", data=data))
    assert code == 0 and "shards: all 2 unchanged since their last full check" in out, err
    swap_two_ids(data / "text.train.00000.tok")
    code, _, err = cli(capsys, *root_train_args(prepared_root, tmp_path / "r3", data=data))
    assert "no longer holds the tokens the manifest records" in one_sentence(code, err)

@pytest.mark.hostile
def test_a_record_that_cannot_be_written_means_a_full_check_at_every_start(prepared_root, tmp_path, capsys):
    """Where verified.json cannot be written (here a folder stands in its place; a read-only data
    folder is the same to the writer), every start checks every shard in full, and trains."""
    data = tmp_path / "data"
    shutil.copytree(prepared_root / "data", data)
    (data / "verified.json").unlink(missing_ok=True)
    (data / "verified.json").mkdir()
    for run in ("r1", "r2"):
        code, out, err = cli(capsys, *root_train_args(prepared_root, tmp_path / run, data=data))
        assert code == 0 and "shards: 2 checked in full" in out, err

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
