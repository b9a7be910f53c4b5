"""Nothing lost, nothing half-checked: a bad state is never saved over a good one; everything a
command reads is checked before work starts; failures of the environment, damaged files and a
second run in the same folder all end in one sentence and exit 2, with every earlier file whole."""

from __future__ import annotations

import errno
import io
import json
import math
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import cli, one_sentence
from safetensors import safe_open
from safetensors.torch import save_file

from andrea.checkpoint import load_checkpoint
from andrea.cli import main
from andrea.config import ModelConfig, count_params
from andrea.data import HEADER, TokenData, prepare
from andrea.errors import AndreaError
from andrea.tokenizer import HarrisTokenizer

pytestmark = pytest.mark.usefixtures("one_thread")

WORDS = "the king and queen sat on a mat while dogs ran to their owners talking of old things".split()


def documents(seed: int, n: int, words: int = 300) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(words)).capitalize() + "." for _ in range(n)]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("reliability")
    (root / "text.txt").write_text("\n\n".join(documents(1, 60)))
    tok = HarrisTokenizer.train(documents(2, 30), 20)
    prepare(tok, [str(root / "text.txt")], root / "data", log=lambda *a: None, progress=False)
    return root / "data"


@pytest.fixture(scope="module")
def model_json(data_dir) -> Path:
    path = data_dir.parent / "model.json"
    ModelConfig(vocab_size=TokenData(data_dir).vocab_size, n_embd=32, n_head=2, n_layer=1, block_size=32).save(path)
    return path


def train_args(data_dir, model_json, out, *extra, steps=4):
    return ["train", "--data", str(data_dir), "--out", str(out), "--model-config", str(model_json),
            "--max-steps", str(steps), "--batch-size", "2", "--seq-len", "16", "--warmup-steps", "2",
            "--checkpoint-every", "2", "--eval-every", "2", "--eval-windows", "1", "--no-audit", "--no-progress", *extra]


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every checkpoint of a folder, byte for byte."""
    return {p.name: p.read_bytes() for p in sorted(folder.glob("*.safetensors"))}


@pytest.fixture(scope="module")
def run_dir(data_dir, model_json, tmp_path_factory) -> Path:
    """A real, healthy run of 4 steps: latest and best at step 4."""
    out = tmp_path_factory.mktemp("run") / "r"
    assert main(train_args(data_dir, model_json, out)) == 0
    return out


def copy_run(run_dir: Path, dst: Path) -> Path:
    dst.mkdir(parents=True)
    for name in ("latest.safetensors", "best.safetensors", "metrics.jsonl"):
        (dst / name).write_bytes((run_dir / name).read_bytes())
    return dst


# ---------------------------------------------------------------- 1. a bad state is never saved


@pytest.mark.parametrize("more_steps", [1, 4])
def test_an_exploding_update_saves_nothing_and_the_named_checkpoint_trains_on(data_dir, model_json, run_dir, tmp_path,
                                                                               capsys, more_steps):
    """Resumed at lr 1e9, the update blows the weights up. Nothing of that state is written (latest
    and best stay byte-identical), the run exits 2 naming latest.safetensors at step 4 as the last
    good checkpoint, and that checkpoint resumes at a normal learning rate and trains to the end."""
    out = copy_run(run_dir, tmp_path / "r")
    before = snapshot(out)
    code, _, err = cli(capsys, *train_args(data_dir, model_json, out, "--resume", "--lr", "1e9", steps=4 + more_steps))
    line = one_sentence(code, err)
    assert f"the last good checkpoint is {out / 'latest.safetensors'} (step 4)" in line
    assert snapshot(out) == before
    assert not [p for p in out.iterdir() if ".tmp-" in p.name]
    # the promise: that checkpoint, at a normal learning rate, trains on without failing again
    code, stdout, err = cli(capsys, *train_args(data_dir, model_json, out, "--resume", steps=12))
    assert code == 0, err
    ckpt = load_checkpoint(out / "latest.safetensors")
    assert ckpt.step == 12 and all(torch.isfinite(t).all() for t in ckpt.model_state.values())
    assert math.isfinite(float(stdout.split("validation: ")[1].split()[0]))


def test_damaged_optimizer_moments_are_refused_before_the_first_step(data_dir, model_json, run_dir, tmp_path, capsys):
    for what, damage in (("NaN", lambda t: t.fill_(float("nan"))), ("negative", lambda t: t.fill_(-1.0))):
        out = copy_run(run_dir, tmp_path / what)
        rewrite(out / "latest.safetensors", tensors=lambda ts: damage(ts["optim.3.exp_avg_sq"]))
        before = snapshot(out)
        code, _, err = cli(capsys, *train_args(data_dir, model_json, out, "--resume", steps=6))
        assert "exp_avg_sq" in one_sentence(code, err)
        assert snapshot(out) == before and "step\": 5" not in (out / "metrics.jsonl").read_text()


def test_a_non_finite_smoothed_loss_never_replaces_a_finite_best(data_dir, model_json, run_dir, tmp_path):
    from andrea.train import Run
    from andrea.trainconfig import TrainConfig

    out = copy_run(run_dir, tmp_path / "r")
    cfg = TrainConfig(max_steps=6, batch_size=2, seq_len=16, eval_windows=1, audit={"enabled": False})
    run = Run(ModelConfig.load(model_json), cfg, data_dir, out, True, lambda *a: None)
    try:
        best_before = (out / "best.safetensors").read_bytes()
        run.state.smma.value = float("nan")
        run.checkpoint()
        assert (out / "best.safetensors").read_bytes() == best_before
        assert load_checkpoint(out / "latest.safetensors").step == 4
    finally:
        run.close()


# ---------------------------------------------------------------- damaged checkpoints: rewriting one


def rewrite(path: Path, tensors=None, meta=None, dst: Path | None = None) -> Path:
    """Write path's checkpoint again (to dst, or in place) after tensors(dict) and meta(dict)
    have changed what they like."""
    with safe_open(str(path), framework="pt") as f:
        ts = {k: f.get_tensor(k) for k in f.keys()}
        m = json.loads(f.metadata()["andrea"])
    if tensors is not None:
        tensors(ts)
    if meta is not None:
        meta(m)
    dst = dst or path
    save_file(ts, str(dst), metadata={"andrea": json.dumps(m)})
    return dst


# ---------------------------------------------------------------- 2. fault injection over a real checkpoint


def _shape(t: torch.Tensor) -> torch.Tensor:
    return t.flatten()[:-1].clone() if t.numel() > 1 else torch.zeros(2, dtype=t.dtype)


def _dtype(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.int32) if t.is_floating_point() else t.to(torch.float32)


def _nan(t: torch.Tensor) -> torch.Tensor:
    if not t.is_floating_point():  # the generator state: bytes torch's generator does not accept
        return torch.full_like(t, 255)
    t = t.clone()
    t.view(-1)[t.numel() // 2] = float("nan")
    return t


TENSOR_DAMAGE = {"shape": _shape, "dtype": _dtype, "nan": _nan, "missing": None}
ABSURD = ["x", [], None, -1, 10**30, float("nan")]


def tensor_cases(path: Path) -> list:
    with safe_open(str(path), framework="pt") as f:
        names = list(f.keys())
    cases = []
    for name in names:
        for kind, damage in TENSOR_DAMAGE.items():
            def change(ts, name=name, damage=damage):
                if damage is None:
                    del ts[name]
                else:
                    ts[name] = damage(ts[name])
            cases.append((f"{name} {kind}", change, None))
    for extra in ("model.h.9.mlp.fc1.weight", "optim.99.exp_avg", "junk"):
        cases.append((f"extra {extra}", lambda ts, extra=extra: ts.__setitem__(extra, torch.zeros(3)), None))
    return cases


def meta_cases(path: Path) -> list:
    with safe_open(str(path), framework="pt") as f:
        meta = json.loads(f.metadata()["andrea"])
    cases = []
    for key in meta:
        cases.append((f"meta {key} missing", None, lambda m, key=key: m.pop(key)))
        for value in ABSURD:
            cases.append((f"meta {key} = {value!r}", None, lambda m, key=key, value=value: m.__setitem__(key, value)))
    for key in meta["config"]:
        for value in (10**9, 10**6, 0, -1, "x", 2.5):
            cases.append((f"config {key} = {value!r}", None, lambda m, key=key, value=value: m["config"].__setitem__(key, value)))
    cases.append(("config vocab 10^9 and 10^6 layers", None, lambda m: m["config"].update(vocab_size=10**9, n_layer=10**6)))
    cases.append(("config rope at 10^9 positions", None, lambda m: m["config"].update(pos="rope", block_size=10**9)))
    for key, value in (("param_groups", "x"), ("param_groups", [{"params": ["a"]}]), ("param_groups", []),
                       ("param_groups", [{"params": list(range(15))}]), ("scalars", {"0.step": "x"})):
        cases.append((f"optimizer {key} = {value!r}", None,
                      lambda m, key=key, value=value: m["optimizer"].__setitem__(key, value)))
    cases.append(("optimizer groups swapped", None, lambda m: m["optimizer"]["param_groups"].reverse()))
    for key, value in (("smma", {"window": 0, "n": 1, "value": 1.0}), ("data_rng", {"state": "x"}),
                       ("train", {"recipe": "v1"}), ("tokenizer", {"format": "x"})):
        cases.append((f"meta {key} = {value!r}", None, lambda m, key=key, value=value: m.__setitem__(key, value)))
    return cases


@pytest.fixture(scope="module")
def built_models():
    """Parameter counts of every model built on a real device (not the meta device)."""
    from andrea.model import ANDREA

    built = []
    real_init = ANDREA.__init__

    def recording_init(self, cfg):
        if torch.get_default_device().type != "meta":
            built.append(count_params(cfg))
        real_init(self, cfg)

    ANDREA.__init__ = recording_init
    yield built
    ANDREA.__init__ = real_init


def file_values(path: Path) -> int:
    """Model values the file really holds: the bound on any model a command may build from it."""
    with safe_open(str(path), framework="pt") as f:
        return sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys() if k.startswith("model."))


@pytest.mark.parametrize("family", ["tensors", "metadata"])
def test_every_damaged_field_ends_cleanly_in_every_reader(data_dir, model_json, run_dir, tmp_path, capsys, built_models,
                                                          family):
    """Each tensor (wrong shape, wrong dtype, NaN, missing, extra) and each metadata field (missing,
    of the wrong type, absurd values, absurd configs) of a real checkpoint, damaged in turn, given
    to andrea.load, generate, convert and train --resume: each either works or ends in one
    sentence with exit 2; none builds a model larger than the file truthfully holds."""
    import andrea

    source = run_dir / "latest.safetensors"
    truthful = count_params(ModelConfig.load(model_json))
    cases = tensor_cases(source) if family == "tensors" else meta_cases(source)
    assert len(cases) > 50
    refused, accepted = 0, []
    for i, (label, tensors, meta) in enumerate(cases):
        folder = tmp_path / f"c{i}"
        folder.mkdir()
        bad = rewrite(source, tensors, meta, dst=folder / "latest.safetensors")
        bound = max(truthful, file_values(bad))
        built_models.clear()
        try:
            andrea.load(bad)
        except AndreaError:
            refused += 1
        code, _, err = cli(capsys, "generate", "--checkpoint", bad, "--prompt", "the", "--max-new-tokens", "3", "--seed", "1")
        assert code == 0 or one_sentence(code, err), label
        code, _, err = cli(capsys, "convert", bad, folder / "model.json")
        assert code == 0 or one_sentence(code, err), label
        code, _, err = cli(capsys, *train_args(data_dir, model_json, folder, "--resume", steps=5))
        assert code == 0 or one_sentence(code, err), label
        if code == 0:
            accepted.append(label)
        assert all(n <= bound for n in built_models), (label, built_models, bound)
    print(len(cases), "cases", refused, "refused by andrea.load; train --resume accepted:", accepted)


def test_a_config_claiming_a_huge_model_is_refused_without_allocating(run_dir, tmp_path):
    """vocab 10^9 and 10^6 layers in a small file: refused by arithmetic, in a fresh process whose
    peak memory is measured (the model that config claims would need terabytes)."""
    bad = rewrite(run_dir / "latest.safetensors", meta=lambda m: m["config"].update(vocab_size=10**9, n_layer=10**6),
                  dst=tmp_path / "huge.safetensors")
    # the peak is the process's own high-water mark (VmHWM): ru_maxrss would also count the pages of
    # the forked test process it was started from
    code = ("import sys\nfrom andrea.cli import main\n"
            f"status = main(['generate', '--checkpoint', {str(bad)!r}, '--prompt', 'the'])\n"
            "hwm = open('/proc/self/status').read().split('VmHWM:')[1].split()[0]\n"
            "print('peak', int(hwm) * 1024, file=sys.stderr)\n"
            "sys.exit(status)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    err = done.stderr.splitlines()
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert err[0].startswith("andrea: error: ") and "describes a model of" in err[0]
    peak = int(err[1].split()[1])
    assert peak < 1_000_000_000, f"peak {peak:,} bytes"  # the interpreter with torch loaded is most of it


# ---------------------------------------------------------------- 2. inputs checked before the first step


def damaged_data(data_dir: Path, tmp_path: Path) -> Path:
    import shutil

    dst = tmp_path / "data"
    shutil.copytree(data_dir, dst)
    return dst


def test_validation_shards_are_checked_before_the_first_step(data_dir, model_json, tmp_path, capsys):
    from andrea.data import write_shard

    # ids >= V in the validation shard (the file itself is a well-formed shard)
    data = damaged_data(data_dir, tmp_path)
    val = data / "text.val.00000.tok"
    tokens = np.fromfile(val, dtype="<u2", offset=HEADER.size).copy()
    tokens[5] = TokenData(data_dir).vocab_size + 3
    write_shard(val, tokens)
    code, _, err = cli(capsys, *train_args(data, model_json, tmp_path / "r1"))
    assert "validation shard of text holds ids >= V" in one_sentence(code, err)
    assert not (tmp_path / "r1" / "metrics.jsonl").exists()  # refused before any step
    # too short for one window of seq_len + 1
    write_shard(val, tokens[:10])
    manifest = json.loads((data / "manifest.json").read_text())
    manifest["sources"]["text"]["val"]["tokens"] = manifest["sources"]["text"]["val"]["shards"][0]["tokens"] = 10
    (data / "manifest.json").write_text(json.dumps(manifest))
    code, _, err = cli(capsys, *train_args(data, model_json, tmp_path / "r2"))
    assert "no validation shard of one window of 17 tokens (10 tokens in all)" in one_sentence(code, err)
    assert not (tmp_path / "r2" / "metrics.jsonl").exists()


SECRET = b"root:x:0:0:secret-bytes"


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
def test_a_malformed_manifest_is_one_sentence(data_dir, model_json, tmp_path, capsys, damage, expected):
    data = damaged_data(data_dir, tmp_path)
    (tmp_path / "outside.tok").write_bytes(SECRET)
    manifest = json.loads((data / "manifest.json").read_text())
    damage(manifest)
    text = json.dumps(manifest).replace('"OUTSIDE"', json.dumps(str(tmp_path / "outside.tok")))
    (data / "manifest.json").write_text(text)
    code, _, err = cli(capsys, *train_args(data, model_json, tmp_path / "r"))
    line = one_sentence(code, err)
    assert expected in line and "secret" not in line and "root:x" not in line


# ---------------------------------------------------------------- 3. the environment fails


@pytest.mark.parametrize("code_, words", [(errno.ENOSPC, "No space left on device"), (errno.EROFS, "Read-only file system"),
                                          (errno.EACCES, "Permission denied")])
def test_a_failing_write_keeps_the_last_checkpoint_whole(data_dir, model_json, run_dir, tmp_path, capsys, monkeypatch,
                                                         code_, words):
    """The disk fills (or turns read-only, or refuses) while a checkpoint is written: the write
    stops half-way, the run ends in one sentence, and the checkpoints before it are byte-identical."""
    import andrea.checkpoint

    out = copy_run(run_dir, tmp_path / "r")
    before = snapshot(out)

    def failing_save(tensors, filename, metadata=None):
        Path(filename).write_bytes(b"half a checkpoint")
        raise OSError(code_, os.strerror(code_), filename)

    monkeypatch.setattr(andrea.checkpoint, "save_file", failing_save)
    code, _, err = cli(capsys, *train_args(data_dir, model_json, out, "--resume", steps=6))
    line = one_sentence(code, err)
    # the first file the resumed run writes: best.safetensors after an evaluation, or latest
    assert any(f"could not write {out / name} ({words}); it is as it was" in line
               for name in ("latest.safetensors", "best.safetensors")), line
    assert snapshot(out) == before
    assert not [p for p in out.iterdir() if ".tmp-" in p.name]
    monkeypatch.undo()
    assert cli(capsys, *train_args(data_dir, model_json, out, "--resume", steps=6))[0] == 0


def test_a_real_write_failure_from_the_kernel(data_dir, model_json, run_dir, tmp_path):
    """The same through the real writer: a fresh process whose files may not grow past 64 KiB
    (RLIMIT_FSIZE makes the kernel fail the write with EFBIG, as a full disk fails it)."""
    out = copy_run(run_dir, tmp_path / "r")
    before = snapshot(out)
    code = ("import resource, signal, sys\nsignal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
            "resource.setrlimit(resource.RLIMIT_FSIZE, (65536, 65536))\nfrom andrea.cli import main\n"
            f"sys.exit(main({[str(a) for a in train_args(data_dir, model_json, out, '--resume', steps=6)]!r}))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    last = done.stderr.splitlines()[-1]
    assert any(f"could not write {out / name} (File too large)" in last for name in ("latest.safetensors", "best.safetensors")), last
    assert snapshot(out) == before and not [p for p in out.iterdir() if ".tmp-" in p.name]


@pytest.mark.parametrize("command", ["generate", "chat"])
def test_input_that_is_not_utf8_is_one_sentence(run_dir, capsys, monkeypatch, command):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"caf\xe9 au lait\n"), encoding="utf-8"))
    code, _, err = cli(capsys, command, "--checkpoint", run_dir, "--max-new-tokens", "3")
    assert "not UTF-8 text (byte 0xe9 at offset 3" in one_sentence(code, err)


def test_a_prompt_argument_that_is_not_utf8_is_one_sentence(run_dir, capsys):
    bad = b"caf\xe9".decode("utf-8", "surrogateescape")  # how Python hands over such an argument
    code, _, err = cli(capsys, "generate", "--checkpoint", run_dir, "--prompt", bad)
    assert "not UTF-8" in one_sentence(code, err)


@pytest.mark.parametrize("args, words", [
    (["generate", "--seed", str(2**70), "--prompt", "x"], "seed must be an integer in 0..2^64-1"),
    (["generate", "--seed", "-1", "--prompt", "x"], "seed must be an integer in 0..2^64-1"),
    (["train", "--seed", str(10**30)], "seed must be at most"),
    (["train", "--batch-size", str(10**30)], "batch_size must be at most 1,048,576"),
    (["train", "--micro-batch", str(2**64)], "micro_batch must be at most"),
    (["experiment", "positions", "--lr", "nan"], "lr must be a positive finite number"),
    (["experiment", "positions", "--lr", "inf"], "lr must be a positive finite number"),
    (["experiment", "positions", "--seed", str(2**64)], "seed must be an integer in 0..2^64-1"),
    (["experiment", "positions", "--batch-size", str(10**20)], "batch-size must be at most 1,048,576"),
])
def test_numbers_out_of_range_are_one_sentence(data_dir, model_json, run_dir, tmp_path, capsys, args, words):
    if args[0] == "generate":
        args = [*args, "--checkpoint", str(run_dir)]
    elif args[0] == "train":
        args = [*train_args(data_dir, model_json, tmp_path / "r"), *args[1:]]
    else:
        args = [*args, "--data", str(data_dir), "--out", str(tmp_path / "x")]
    code, _, err = cli(capsys, *args)
    assert words in one_sentence(code, err)


# ---------------------------------------------------------------- 4. one run per folder


def test_a_second_run_in_a_running_folder_exits_2_naming_the_process(data_dir, model_json, tmp_path, capsys):
    out = tmp_path / "r"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    first = subprocess.Popen([sys.executable, "-m", "andrea", *train_args(data_dir, model_json, out, steps=100000)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    try:
        deadline = time.time() + 90
        while not (out / "latest.safetensors").exists():  # it holds the folder and has saved once
            assert first.poll() is None and time.time() < deadline, first.stderr.read().decode()
            time.sleep(0.1)
        second = subprocess.run([sys.executable, "-m", "andrea", *train_args(data_dir, model_json, out, "--resume")],
                                capture_output=True, text=True, env=env, timeout=120)
        assert second.returncode == 2 and "Traceback" not in second.stderr
        assert f"is in use by process {first.pid}" in second.stderr.strip().splitlines()[-1]
        code, _, err = cli(capsys, *train_args(data_dir, model_json, out))  # a fresh run there too
        assert f"is in use by process {first.pid}" in one_sentence(code, err)
        assert first.poll() is None  # the first run goes on undisturbed
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    # the lock of a killed process is gone with it: the folder resumes at once
    step = load_checkpoint(out / "latest.safetensors").step
    code, _, err = cli(capsys, *train_args(data_dir, model_json, out, "--resume", steps=step + 1))
    assert code == 0, err


def test_the_lock_is_released_when_a_run_ends(data_dir, model_json, run_dir, tmp_path):
    from andrea.files import FolderLock

    out = copy_run(run_dir, tmp_path / "r")
    with FolderLock(out, "the run folder"):
        with pytest.raises(AndreaError, match=f"in use by process {os.getpid()}"):
            FolderLock(out, "the run folder")
    FolderLock(out, "the run folder").release()  # free again


# ---------------------------------------------------------------- 5. smaller things


def test_embed_forward_saves_to_exactly_the_path_it_reports(run_dir, tmp_path, capsys):
    target = tmp_path / "x"
    code, out, err = cli(capsys, "embed", "forward", "--checkpoint", run_dir, "the king", "--save", target)
    assert code == 0, err
    assert f"to {target}\n" in out and not (tmp_path / "x.npy").exists()
    x = np.load(target)
    assert x.dtype == np.float32 and x.shape[1] == 32

