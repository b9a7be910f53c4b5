"""andrea.files: its behaviour, and its promises under hostile input."""

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from helpers import (
    DEEP,
    LONG_INT,
    cli,
    copy_root_run,
    copy_text_run,
    one_sentence,
    released_after,
    root_train_args,
    text_train_args,
)

from andrea.checkpoint import load_checkpoint
from andrea.errors import AndreaError

# ---------------------------------------------------------------- hostile input


@pytest.mark.hostile
def test_a_second_run_in_a_running_folder_exits_2_naming_the_process(text_data, text_model_json, tmp_path, capsys):
    out = tmp_path / "r"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    first = subprocess.Popen([sys.executable, "-m", "andrea", *text_train_args(text_data, text_model_json, out, steps=100000)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    try:
        deadline = time.time() + 90
        while not (out / "latest.safetensors").exists():  # it holds the folder and has saved once
            assert first.poll() is None and time.time() < deadline, first.stderr.read().decode()
            time.sleep(0.1)
        second = subprocess.run([sys.executable, "-m", "andrea", *text_train_args(text_data, text_model_json, out, "--resume")],
                                capture_output=True, text=True, env=env, timeout=120)
        assert second.returncode == 2 and "Traceback" not in second.stderr
        assert f"is in use by process {first.pid}" in second.stderr.strip().splitlines()[-1]
        code, _, err = cli(capsys, *text_train_args(text_data, text_model_json, out))  # a fresh run there too
        assert f"is in use by process {first.pid}" in one_sentence(code, err)
        assert first.poll() is None  # the first run goes on undisturbed
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    # the lock of a killed process is gone with it: the folder resumes at once
    step = load_checkpoint(out / "latest.safetensors").step
    code, _, err = cli(capsys, *text_train_args(text_data, text_model_json, out, "--resume", steps=step + 1))
    assert code == 0, err

@pytest.mark.hostile
def test_the_lock_is_released_when_a_run_ends(text_data, text_model_json, text_run, tmp_path):
    from andrea.files import FolderLock

    out = copy_text_run(text_run, tmp_path / "r")
    with FolderLock(out, "the run folder"):
        with pytest.raises(AndreaError, match=f"in use by process {os.getpid()}"):
            FolderLock(out, "the run folder")
    FolderLock(out, "the run folder").release()  # free again

@pytest.mark.hostile
def test_a_lock_that_is_a_link_or_no_file_of_its_own_is_refused_and_what_it_names_is_untouched(
        text_data, text_model_json, tmp_path, capsys):
    precious = tmp_path / "precious.txt"
    for kind in ("symlink", "hardlink", "fifo", "dangling"):
        precious.write_text("kept\n")
        for command, folder in (("train", tmp_path / f"run-{kind}"), ("prepare", tmp_path / f"data-{kind}")):
            folder.mkdir()
            lock = folder / ".lock"
            {"symlink": lambda: lock.symlink_to(precious), "hardlink": lambda: os.link(precious, lock),
             "fifo": lambda: os.mkfifo(lock), "dangling": lambda: lock.symlink_to(tmp_path / "nowhere")}[kind]()
            if command == "train":
                code, _, err = cli(capsys, *text_train_args(text_data, text_model_json, folder))
            else:
                (tmp_path / "a.txt").write_text("a cat sat.\n" * 50)
                code, _, err = cli(capsys, "prepare", str(tmp_path / "a.txt"), "--out", str(folder), "--tokenizer",
                                   str(text_data / "tokenizer"), "--no-progress")
            assert ".lock" in one_sentence(code, err), (kind, command)
            assert precious.read_text() == "kept\n" and not (tmp_path / "nowhere").exists()
            assert not (folder / "latest.safetensors").exists() and not (folder / "manifest.json").exists()


@pytest.mark.hostile
def test_one_json_reader_turns_python_limits_into_one_sentence(tmp_path):
    from andrea.files import MAX_JSON_DEPTH, parse_json, read_json

    cases = {"long.json": '{"a": 1,\n "b": ' + LONG_INT + "}", "deep.json": '{"a":\n\n' + DEEP + "}",
             "deep990.json": "[" * 990 + "]" * 990}
    for name, text in cases.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(AndreaError, match=r"long\.json holds a number of more than 4,300 digits at line 2"):
        read_json(tmp_path / "long.json", "config file")
    with pytest.raises(AndreaError, match=rf"deep\.json nests its JSON more than {MAX_JSON_DEPTH} levels deep at line 3"):
        read_json(tmp_path / "deep.json", "config file")
    with pytest.raises(AndreaError, match="nests its JSON"):  # parses in Python, but nothing may recurse over it
        read_json(tmp_path / "deep990.json")
    assert parse_json('{"s": "[[[[\\"[[[[", "t": [[1], {"u": [2]}]}', "x") == {"s": '[[[["[[[[', "t": [[1], {"u": [2]}]}
    assert parse_json("[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH, "x") is not None
    with open(tmp_path / "sparse.json", "wb") as f:  # 7 GB of nothing: refused by its size, nothing read
        f.truncate(7 << 30)
    with pytest.raises(AndreaError, match=r"sparse\.json holds 7,516,192,768 bytes, more than the 67,108,864"):
        read_json(tmp_path / "sparse.json", "training config")

@pytest.mark.hostile
def test_a_fifo_is_refused_where_a_file_is_read(prepared_root, root_run, tmp_path, capsys):
    """A FIFO blocks whoever opens it until something writes to it: as a source (alone or inside
    a source folder), a shard or a checkpoint (named, or the latest of a run folder) each is
    refused by its kind, in one sentence, before it is opened."""
    fifo = tmp_path / "pipe.txt"
    folder = tmp_path / "folder"
    folder.mkdir()
    shutil.copy(prepared_root / "text.txt", folder / "a.txt")
    data = tmp_path / "data"
    shutil.copytree(prepared_root / "data", data)
    (data / "text.val.00000.tok").unlink()
    run = tmp_path / "run"
    shutil.copytree(root_run, run)
    (run / "latest.safetensors").unlink()
    fifos = [fifo, folder / "b.txt", data / "text.val.00000.tok", run / "latest.safetensors"]
    for f in fifos:
        os.mkfifo(f)
    cases = [
        (["prepare", fifo, "--tokenizer", prepared_root / "tok", "--out", tmp_path / "d1", "--no-progress"], f"{fifo} is a FIFO"),
        (["tokenizer", "train", folder, "--segments", "5", "--out", tmp_path / "t1"], f"{folder / 'b.txt'} is a FIFO"),
        (root_train_args(prepared_root, tmp_path / "r1", data=data), f"shard {data / 'text.val.00000.tok'} is a FIFO"),
        (["generate", "--checkpoint", run / "latest.safetensors", "--prompt", "the"], "checkpoint"),
        (root_train_args(prepared_root, run, "--resume", steps=6), f"checkpoint {run / 'latest.safetensors'} is a FIFO"),
    ]
    with released_after(fifos):
        for args, words in cases:
            line = one_sentence(*cli(capsys, *args)[::2])
            assert words in line and "not a regular file" in line, (args, line)

@pytest.mark.hostile
def test_the_next_run_removes_the_temporary_files_of_killed_writes(prepared_root, root_run, tmp_path, capsys):
    """A write killed by SIGKILL leaves `NAME.tmp-PID-HEX` at full size. The next run in the
    folder, holding its lock, removes those whose process is gone and keeps a live one's."""
    out = copy_root_run(root_run, tmp_path / "r")
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
        code, stdout, err = cli(capsys, *root_train_args(prepared_root, out, "--resume", steps=6))
        assert code == 0, err
        assert not stale.exists() and live.exists() and other.exists()
        assert f"removed {stale.name}, the temporary file of a write whose process is gone" in stdout
    finally:
        alive.kill()
        alive.wait()


@pytest.mark.parametrize("mask,mode", [(0o022, 0o644), (0o027, 0o640)])
def test_a_finished_file_has_a_new_files_mode_whatever_its_writer_chose(tmp_path, mask, mode):
    """safetensors creates its file 0600; the file atomic_output leaves is readable as any new file."""
    import torch
    from safetensors.torch import save_file

    from andrea.files import atomic_output

    old = os.umask(mask)
    try:
        with atomic_output(tmp_path / "w.safetensors") as tmp:
            save_file({"a": torch.zeros(2)}, str(tmp))
            assert tmp.stat().st_mode & 0o777 == 0o600  # what the writer chose
    finally:
        os.umask(old)
    assert (tmp_path / "w.safetensors").stat().st_mode & 0o777 == mode


@pytest.mark.hostile
def test_the_next_write_of_a_file_removes_the_temporary_files_its_killed_writes_left(tmp_path):
    """processor.json, verified.json, a tokenizer's files: written outside a run's lock, each
    write of NAME takes away NAME.tmp-PID-HEX whose process is gone, and nothing else."""
    from andrea.files import atomic_write_bytes

    dead = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    dead.send_signal(signal.SIGKILL)
    dead.wait()
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        target = tmp_path / "processor.json"
        stale = tmp_path / f"processor.json.tmp-{dead.pid}-0123abcd"
        live = tmp_path / f"processor.json.tmp-{alive.pid}-89abcdef"
        another = tmp_path / f"verified.json.tmp-{dead.pid}-00ff00ff"  # another file's: its own next write
        for p in (stale, live, another):
            p.write_bytes(b"{half")
        atomic_write_bytes(target, b"{}")
        assert target.read_bytes() == b"{}" and not stale.exists() and live.exists() and another.exists()
        atomic_write_bytes(tmp_path / "verified.json", b"{}")
        assert not another.exists() and live.exists()
    finally:
        alive.kill()
        alive.wait()


# ---------------------------------------------------------------- declared shapes: every shaped reader, the same damage


def _leaves(value, path=()):
    """Every leaf of a JSON value, by its path of keys and indices."""
    if isinstance(value, dict):
        return [leaf for k, v in value.items() for leaf in _leaves(v, path + (k,))]
    if isinstance(value, list):
        return [leaf for i, v in enumerate(value) for leaf in _leaves(v, path + (i,))]
    return [path]


def _at(value, path):
    for k in path:
        value = value[k]
    return value


def _with(value, path, new):
    import copy

    value = copy.deepcopy(value)
    inner = value
    for k in path[:-1]:
        inner = inner[k]
    inner[path[-1]] = new
    return value


LEAF_DAMAGE = [True, "x", None, 10**400, float("nan"), float("inf"), [], {}]


def _damage_of_kind(old, new) -> bool:
    """Whether new is not a value of old's kind: another JSON type, or a number no field holds."""
    if isinstance(new, float) or isinstance(new, int) and not isinstance(new, bool) and abs(new) > 2**63:
        return True
    return type(new) is not type(old)


def _shaped_readers(tmp_path, monkeypatch):
    """{file: (path of a real, whole file, reader)}: each reader returns what it believed of the
    file (None where it believed nothing and did the work again)."""
    import json

    from helpers import prep_docs, prep_tokenizer

    import andrea.processor as processor
    from andrea.prepare import PROGRESS_FILE, prepare
    from andrea.shards import TokenData, verify_shards
    from andrea.usage import run_data
    from andrea.validate import same_json

    monkeypatch.setenv("ANDREA_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(processor, "product_rates", lambda: (100.0, 300.0))
    monkeypatch.setattr(processor, "_memo", {})
    processor.bf16_verdict()

    def believed_verdict():
        v = processor._read_cached(processor.identity())
        return None if v is None else (v.f32_gflops, v.bf16_gflops, v.threads)

    (tmp_path / "s.txt").write_text("\n\n".join(prep_docs(3, 40)))
    tok = prep_tokenizer()
    data = tmp_path / "data"
    prepare(tok, [str(tmp_path / "s.txt")], data, log=lambda *a: None, progress=False, workers=1)
    verify_shards(TokenData(data))  # writes verified.json

    def believed_shards():
        said = []
        verify_shards(TokenData(data), said.append, save=False)
        return None if "checked in full" in said[0] else said[0]

    progress = data / PROGRESS_FILE
    settings = json.loads((data / "manifest.json").read_text())["settings"]
    entry = json.loads((data / "manifest.json").read_text())["sources"]["s"]

    def believed_progress():
        from andrea.prepare import _load_state

        state = _load_state(data, settings).get("s")  # what prepare resumes from, as it checks the signature
        return (state["parts"] or None) if state is not None and same_json(state.get("signature"), entry["signature"]) else None

    run = tmp_path / "run"
    run.mkdir()
    (run / "train.json").write_text(json.dumps({"data": str(data), "seq_len": 64}))

    def believed_run():
        found, why = run_data(run / "latest.safetensors", tok)
        return None if found is None else str(found.dir)

    # a progress record as a preparation stopped after its first part leaves it
    part = {"train": entry["train"]["shards"][0], "val": entry["val"]["shards"][0], "resume": [3, 0, 0],
            "stats": {"train": {"documents": 30, "bytes": 9000}, "val": {"documents": 2, "bytes": 600}}}
    progress.write_text(json.dumps({"settings": settings, "sources": {"s": {"signature": entry["signature"], "parts": [part],
                                                                            "done": False}}}))
    return {"processor.json (andrea.processor)": (processor.cache_file(), believed_verdict),
            "verified.json (andrea.shards)": (data / "verified.json", believed_shards),
            "prepare-progress.json (andrea.prepare)": (progress, believed_progress),
            "train.json (andrea.usage.run_data)": (run / "train.json", believed_run)}


@pytest.mark.hostile
def test_every_shaped_file_is_believed_whole_or_not_at_all(tmp_path, monkeypatch):
    """Each file whose shape is declared beside its reader (andrea.files.SHAPED_FILES), damaged one
    leaf at a time with a value of another type, out of range or not finite, as a list, as an
    object, 7 GB sparse: its reader believes nothing of it (measures, checks, prepares again, or
    says the data is unknown), never a traceback, never a field of the wrong kind."""
    import json

    from andrea.files import SHAPED_FILES

    readers = _shaped_readers(tmp_path, monkeypatch)
    assert set(readers) == set(SHAPED_FILES)
    for name, (path, believed) in readers.items():
        whole = json.loads(path.read_text())
        assert believed() is not None, name  # the whole file is believed
        cases = [json.dumps(_with(whole, leaf, bad)) for leaf in _leaves(whole)[:40] for bad in LEAF_DAMAGE
                 if _damage_of_kind(_at(whole, leaf), bad)]
        cases += ["[]", "{}", "7 GB"]
        for case in cases:
            if case == "7 GB":
                with open(path, "wb") as f:
                    f.truncate(7 << 30)
            else:
                path.write_text(case)
            got = believed()
            if got is not None:  # believed: then only where the damaged leaf is one no reader uses
                assert case != "7 GB" and case not in ("[]", "{}"), (name, case)
                assert name == "train.json (andrea.usage.run_data)" and json.loads(case)["data"] == whole["data"], (name, case)
        path.write_text(json.dumps(whole))
