"""Training: exact resume, crash safety under SIGKILL, DDP equivalence, NaN stops, bad input."""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import cli, copy_text_run, one_sentence, opts, quiet, snapshot, text_train_args, tiny_config

from andrea.checkpoint import load_checkpoint
from andrea.cli import main
from andrea.config import ModelConfig
from andrea.errors import AndreaError
from andrea.processor import compute_dtype
from andrea.shards import HEADER, open_shard, write_shard
from andrea.train import train


def step_losses(run: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if "loss" in r and "eval" not in r}


def test_lines_written_beside_the_progress_bar_go_to_the_log_not_stdout(data_dir, tmp_path, capsys):
    """With a progress bar, evaluation lines still go through `log` (tqdm.write alone would print
    them on stdout, mixing them into what a caller reads there)."""
    lines = []
    train(tiny_config(data_dir), opts(max_steps=4), data_dir, tmp_path / "a", log=lines.append, progress=True)
    assert any("val loss" in line for line in lines)
    assert "val loss" not in capsys.readouterr().out


def test_resume_is_exact(data_dir, tmp_path):
    cfg = tiny_config(data_dir)
    train(cfg, opts(max_steps=12), data_dir, tmp_path / "a", log=quiet, progress=False)
    # the same run, interrupted after step 6 and resumed
    result = train(cfg, opts(max_steps=12), data_dir, tmp_path / "b", log=quiet, progress=False,
                   on_step=lambda step, loss: step == 6)
    assert result.stopped == "signal" and result.step == 6
    assert load_checkpoint(tmp_path / "b" / "latest.safetensors").step == 6
    train(cfg, opts(max_steps=12), data_dir, tmp_path / "b", resume=True, log=quiet, progress=False)
    a, b = step_losses(tmp_path / "a"), step_losses(tmp_path / "b")
    assert sorted(a) == sorted(b) == list(range(1, 13))
    for step in a:
        assert abs(a[step] - b[step]) <= 1e-6, (step, a[step], b[step])
    wa = load_checkpoint(tmp_path / "a" / "latest.safetensors").model_state
    wb = load_checkpoint(tmp_path / "b" / "latest.safetensors").model_state
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                    reason="torch.compile on a CPU generates C++: no C++ compiler here (apt-get install g++)")
def test_a_compiled_run_learns_what_an_eager_one_does_and_resumes_exactly(data_dir, tmp_path):
    """`andrea train --compile` (and `andrea main --compile`) on the CPU: the same losses as the
    eager path to float rounding, and a compiled run stopped and resumed is the uninterrupted one."""
    cfg = tiny_config(data_dir)
    train(cfg, opts(max_steps=6), data_dir, tmp_path / "eager", log=quiet, progress=False)
    train(cfg, opts(max_steps=6, compile=True), data_dir, tmp_path / "c", log=quiet, progress=False)
    eager, compiled = step_losses(tmp_path / "eager"), step_losses(tmp_path / "c")
    assert sorted(eager) == sorted(compiled) == list(range(1, 7))
    assert all(abs(eager[k] - compiled[k]) <= 1e-3 * abs(eager[k]) for k in eager), (eager, compiled)
    result = train(cfg, opts(max_steps=6, compile=True), data_dir, tmp_path / "r", log=quiet, progress=False,
                   on_step=lambda step, loss: step == 3)
    assert result.stopped == "signal"
    train(cfg, opts(max_steps=6, compile=True), data_dir, tmp_path / "r", resume=True, log=quiet, progress=False)
    resumed = step_losses(tmp_path / "r")
    assert all(abs(resumed[k] - compiled[k]) <= 1e-6 for k in compiled), (compiled, resumed)


def test_resume_is_exact_with_curriculum(data_dir, tmp_path):
    cfg = tiny_config(data_dir)
    o = dict(max_steps=10, sampling="ucb", curriculum={"reroll": (2, 4)})
    train(cfg, opts(**o), data_dir, tmp_path / "a", log=quiet, progress=False)
    train(cfg, opts(**o), data_dir, tmp_path / "b", log=quiet, progress=False, on_step=lambda step, loss: step == 5)
    train(cfg, opts(**o), data_dir, tmp_path / "b", resume=True, log=quiet, progress=False)
    def rows(run):
        return [(r["step"], r["source"], r["loss"]) for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
                if "source" in r]

    assert rows(tmp_path / "a") == rows(tmp_path / "b")


def test_the_curriculum_plot_is_drawn_once_per_evaluation_and_on_a_signal(data_dir, tmp_path, monkeypatch):
    """curriculum.png is drawn at each evaluation and by the final checkpoint, but not twice at the
    step where both fall (the final evaluation is at the last step); a run stopped by a signal has
    no final evaluation, so its checkpoint draws it."""
    import andrea.train

    drawn = []
    real = andrea.train.plot_curriculum
    monkeypatch.setattr(andrea.train, "plot_curriculum", lambda history, path: (drawn.append(len(history)),
                                                                                        real(history, path)))
    cfg = tiny_config(data_dir)
    o = dict(max_steps=8, eval_every=4, checkpoint_every=100, sampling="ucb", curriculum={"reroll": (2, 4)})
    train(cfg, opts(**o), data_dir, tmp_path / "a", log=quiet, progress=False)
    assert drawn == [4, 8] and (tmp_path / "a" / "curriculum.png").read_bytes()[:4] == b"\x89PNG"
    drawn.clear()
    train(cfg, opts(**o), data_dir, tmp_path / "b", log=quiet, progress=False, on_step=lambda step, loss: step == 6)
    assert drawn == [4, 6]


def test_loss_goes_down_and_checkpoints_appear(data_dir, tmp_path):
    cfg = tiny_config(data_dir)
    result = train(cfg, opts(max_steps=30, lr=3e-3, eval_every=10, checkpoint_every=10), data_dir, tmp_path / "r",
                   log=quiet, progress=False)
    losses = step_losses(tmp_path / "r")
    assert np.mean([losses[s] for s in range(26, 31)]) < np.mean([losses[s] for s in range(1, 6)]) - 0.5
    assert result.eval["all"]["bpb"] > 0 and set(result.eval) == {"alpha", "beta", "all"}
    for name in ("latest.safetensors", "best.safetensors", "metrics.jsonl", "loss.png", "train.json"):
        assert (tmp_path / "r" / name).exists(), name
    assert (tmp_path / "r" / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_best_checkpoint_holds_the_weights_of_the_lowest_validation_loss(data_dir, tmp_path):
    """best.safetensors is the checkpoint of the evaluation whose validation loss was lowest: its
    step is that one, and its weights are exactly those of a run stopped at that step (recipe v1:
    a constant learning rate, so a shorter run takes the same steps). The run must be one where the
    validation loss rises again and the lowest smoothed training loss falls on another step, so
    the test tells the two rules apart: the first learning rate that gives such a run is used."""
    cfg = tiny_config(data_dir)
    for lr in (0.15, 0.1, 0.25, 0.06, 0.3):
        o = dict(recipe="v1", max_steps=10, lr=lr, eval_every=1, checkpoint_every=100, smma_window=2)
        run = tmp_path / f"r-{lr}"
        train(cfg, opts(**o), data_dir, run, log=quiet, progress=False)
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        val = {r["step"]: r["eval"]["all"]["loss"] for r in rows if "eval" in r}
        smma = {r["step"]: r["smma"] for r in rows if "smma" in r}
        assert sorted(val) == list(range(1, 11))
        best_step = min(val, key=val.get)
        if best_step < 10 and min(smma, key=smma.get) != best_step:
            break
    else:
        pytest.fail("no learning rate made the validation loss rise again away from the smoothed loss's minimum")
    best = load_checkpoint(run / "best.safetensors")
    assert best.step == best_step and best.meta["best_val_loss"] == val[best_step]
    train(cfg, opts(**{**o, "max_steps": best_step}), data_dir, tmp_path / "s", log=quiet, progress=False)
    again = load_checkpoint(tmp_path / "s" / "latest.safetensors").model_state
    assert all(torch.equal(best.model_state[k], again[k]) for k in again)
    latest = load_checkpoint(run / "latest.safetensors").model_state
    assert not all(torch.equal(best.model_state[k], latest[k]) for k in latest)


def test_patience_stops_when_validation_stops_improving_and_resumes_counting(data_dir, tmp_path):
    """With patience P the run stops at the first evaluation that ends P evaluations in a row
    without a lower validation loss; the count is part of the run state, so a resumed run stops
    where an uninterrupted one does."""
    cfg = tiny_config(data_dir)
    o = dict(recipe="v1", max_steps=40, lr=0.3, eval_every=1, checkpoint_every=100, patience=2)
    result = train(cfg, opts(**o), data_dir, tmp_path / "a", log=quiet, progress=False)
    rows = [json.loads(line) for line in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    val = [r["eval"]["all"]["loss"] for r in rows if "eval" in r]
    # by hand: the first step whose loss and the one before it are both above the best before them
    expected = next(i + 1 for i in range(2, len(val)) if min(val[i - 1 : i + 1]) >= min(val[: i - 1]))
    assert result.stopped == "patience" and result.step == expected < 40
    train(cfg, opts(**o), data_dir, tmp_path / "b", log=quiet, progress=False, on_step=lambda step, loss: step == expected - 1)
    again = train(cfg, opts(**o), data_dir, tmp_path / "b", resume=True, log=quiet, progress=False)
    assert again.stopped == "patience" and again.step == expected


def test_v3_learns_and_resumes_exactly(data_dir, tmp_path):
    """Recipe v3 (Muon + AdamW under one state dict): the loss falls, and a run interrupted at
    step 6 and resumed from its checkpoint continues bit for bit, weights and optimizer state."""
    cfg = tiny_config(data_dir)
    o = dict(recipe="v3", max_steps=12, lr=1e-2, warmup_steps=2, decay_fraction=0.5)
    train(cfg, opts(**o), data_dir, tmp_path / "a", log=quiet, progress=False)
    a = step_losses(tmp_path / "a")
    assert sum(a[s] for s in (10, 11, 12)) < sum(a[s] for s in (1, 2, 3)) - 0.3, a
    train(cfg, opts(**o), data_dir, tmp_path / "b", log=quiet, progress=False, on_step=lambda step, loss: step == 6)
    train(cfg, opts(**o), data_dir, tmp_path / "b", resume=True, log=quiet, progress=False)
    b = step_losses(tmp_path / "b")
    assert a == b
    ca, cb = load_checkpoint(tmp_path / "a" / "latest.safetensors"), load_checkpoint(tmp_path / "b" / "latest.safetensors")
    assert all(torch.equal(ca.model_state[k], cb.model_state[k]) for k in ca.model_state)
    assert ca.optim_state["state"].keys() == cb.optim_state["state"].keys()
    kinds = set()
    for idx, per in ca.optim_state["state"].items():
        kinds.update(per)
        assert all(torch.equal(per[k], cb.optim_state["state"][idx][k]) for k in per)
    assert {"momentum_buffer", "exp_avg", "exp_avg_sq"} <= kinds  # both optimizers' state is in the file
    # the lr of the Muon group and of the AdamW groups followed the same schedule (muon_lr unset)
    rows = [json.loads(line) for line in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    lrs = [r["lr"] for r in rows if "lr" in r]
    assert lrs[0] == pytest.approx(0.5e-2) and lrs[-1] == pytest.approx(1e-2 * (1 / 12) / 0.5)


def test_nan_loss_stops_and_keeps_last_good_checkpoint(data_dir, tmp_path, monkeypatch):
    from andrea import model as model_module

    cfg = tiny_config(data_dir)
    real_forward = model_module.ANDREA.forward
    calls = {"n": 0}

    def poisoned(self, ids, targets=None, cache=None):
        logits, loss = real_forward(self, ids, targets, cache)
        if targets is not None and self.training:
            calls["n"] += 1
            if calls["n"] > 10:  # step 6 with two micro-batches a step
                loss = loss * float("nan")
        return logits, loss

    monkeypatch.setattr(model_module.ANDREA, "forward", poisoned)
    with pytest.raises(AndreaError, match="nan at step 6"):
        train(cfg, opts(max_steps=10, checkpoint_every=4), data_dir, tmp_path / "r", log=quiet, progress=False)
    ckpt = load_checkpoint(tmp_path / "r" / "latest.safetensors")
    assert ckpt.step == 4
    assert all(torch.isfinite(t).all() for t in ckpt.model_state.values())


# ---------------------------------------------------------------- bad input, before any work is lost


def run_cli(args, capsys) -> tuple[int, str]:
    code = main(args)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err


def train_args(data, out, *extra, model_json=None):
    model_json = model_json or out.parent / "model.json"
    return ["train", "--data", str(data), "--out", str(out), "--model-config", str(model_json),
            "--max-steps", "2", "--batch-size", "2", "--seq-len", "16", "--no-progress", *extra]


def test_bad_input_is_one_sentence(data_dir, tmp_path, capsys):
    tiny_config(data_dir).save(tmp_path / "model.json")
    # no data
    code, err = run_cli(train_args(tmp_path / "nope", tmp_path / "r"), capsys)
    assert code == 2 and "does not exist" in err
    # a corrupt (truncated) shard
    broken = tmp_path / "broken"
    shutil.copytree(data_dir, broken)
    shard = broken / "alpha.train.00000.tok"
    shard.write_bytes(shard.read_bytes()[:-7])
    code, err = run_cli(train_args(broken, tmp_path / "r"), capsys)
    assert code == 2 and "truncated" in err
    # a foreign file in place of a shard
    shard.write_bytes(b"hello, this is not a shard at all" * 10)
    code, err = run_cli(train_args(broken, tmp_path / "r"), capsys)
    assert code == 2 and "not an andrea token shard" in err
    # a tokenizer whose vocabulary differs from the model's
    ModelConfig(vocab_size=400, n_embd=32, n_head=2, n_layer=1, block_size=32).save(tmp_path / "model.json")
    code, err = run_cli(train_args(data_dir, tmp_path / "r"), capsys)
    assert code == 2 and "V = 400" in err
    tiny_config(data_dir).save(tmp_path / "model.json")
    # an unwritable output folder (a path below a file)
    (tmp_path / "afile").write_text("x")
    code, err = run_cli(train_args(data_dir, tmp_path / "afile" / "run", model_json=tmp_path / "model.json"), capsys)
    assert code == 2 and "cannot write" in err
    # resume with nothing to resume
    code, err = run_cli(train_args(data_dir, tmp_path / "empty", "--resume"), capsys)
    assert code == 2 and "no checkpoint to resume" in err


def test_training_config_file_with_curriculum_warmup_and_audit(data_dir, tmp_path, capsys):
    tiny_config(data_dir).save(tmp_path / "model.json")
    config = {"model_config": str(tmp_path / "model.json"), "data": str(data_dir), "out": str(tmp_path / "r"),
              "sources": [{"name": "alpha", "floor": 0.3}, {"name": "beta", "cap": 0.6}],
              "curriculum": {"warmup_sources": ["alpha"], "warmup_steps": 3, "reroll": [2, 3]},
              "audit": {"every": 4, "tokens": 24}, "max_steps": 8, "batch_size": 4, "seq_len": 32, "warmup_steps": 2}
    (tmp_path / "train.json").write_text(json.dumps(config))
    code, _ = run_cli(["train", "--config", str(tmp_path / "train.json"), "--eval-every", "4", "--no-progress"], capsys)
    assert code == 0
    rows = [json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "source" in r]
    assert [r["source"] for r in steps[:3]] == ["alpha"] * 3  # warm-up opens only alpha
    assert "beta" in {r["source"] for r in steps[3:]}
    for r in steps[3:]:
        assert r["weights"]["alpha"] >= 0.3 - 1e-9 and r["weights"]["beta"] <= 0.6 + 1e-9
    audits = [r for r in rows if "audit" in r]
    assert [r["step"] for r in audits] == [4, 8] and all(0 <= r["audit"]["score"] <= 100 for r in audits)
    assert (tmp_path / "r" / "curriculum.png").read_bytes()[:4] == b"\x89PNG"
    # the flag overrides the file
    config["out"] = str(tmp_path / "r2")
    (tmp_path / "train.json").write_text(json.dumps(config))
    assert run_cli(["train", "--config", str(tmp_path / "train.json"), "--max-steps", "2", "--no-progress"], capsys)[0] == 0
    assert max(step_losses(tmp_path / "r2")) == 2


def test_audit_halts_a_collapsed_run(data_dir, tmp_path, capsys):
    """With a threshold no sample can reach, the run halts after `patience` audits, with a checkpoint."""
    tiny_config(data_dir).save(tmp_path / "model.json")
    config = {"audit": {"every": 2, "tokens": 16, "threshold": 100, "patience": 3}, "max_steps": 50}
    (tmp_path / "train.json").write_text(json.dumps(config))
    code, err = run_cli(train_args(data_dir, tmp_path / "r", "--config", str(tmp_path / "train.json"), "--max-steps", "50"), capsys)
    assert code == 3
    ckpt = load_checkpoint(tmp_path / "r" / "latest.safetensors")
    assert ckpt.step == 6 and ckpt.meta["audit"]["streak"] == 3


def test_resume_with_another_config_is_refused(data_dir, tmp_path, capsys):
    tiny_config(data_dir).save(tmp_path / "model.json")
    assert run_cli(train_args(data_dir, tmp_path / "r"), capsys)[0] == 0
    before = (tmp_path / "r" / "latest.safetensors").read_bytes()
    tiny_config(data_dir, n_layer=1).save(tmp_path / "model.json")
    code, err = run_cli(train_args(data_dir, tmp_path / "r", "--resume"), capsys)
    assert code == 2 and "another model config" in err
    tiny_config(data_dir).save(tmp_path / "model.json")
    code, err = run_cli(train_args(data_dir, tmp_path / "r", "--resume", "--recipe", "v1"), capsys)
    assert code == 2 and "recipe" in err
    # starting over in a folder that holds a run is refused too, and the run is untouched
    code, err = run_cli(train_args(data_dir, tmp_path / "r"), capsys)
    assert code == 2 and "--resume" in err
    assert (tmp_path / "r" / "latest.safetensors").read_bytes() == before


def test_shard_header_and_size_are_checked(tmp_path):

    tokens = np.arange(1000, dtype=np.uint16)
    write_shard(tmp_path / "s.tok", tokens)
    raw = (tmp_path / "s.tok").read_bytes()
    assert len(raw) == HEADER.size + 2000 and raw[:8] == b"ANDREATK"
    assert np.array_equal(open_shard(tmp_path / "s.tok"), tokens)
    (tmp_path / "short.tok").write_bytes(raw[:10])
    with pytest.raises(AndreaError, match="too short"):
        open_shard(tmp_path / "short.tok")


# ---------------------------------------------------------------- processes: SIGKILL, torchrun


def cli_cmd(*args) -> list[str]:
    return [sys.executable, "-m", "andrea", *args]


def test_sigkill_never_leaves_a_broken_checkpoint(data_dir, tmp_path):
    """Kill training with SIGKILL at random moments; every time, the latest checkpoint loads and
    training resumes from it. A half-written file is never taken for a checkpoint."""
    cfg = tiny_config(data_dir)
    cfg.save(tmp_path / "model.json")
    run = tmp_path / "run"
    base = ["train", "--data", str(data_dir), "--out", str(run), "--model-config", str(tmp_path / "model.json"),
            "--max-steps", "100000", "--batch-size", "4", "--seq-len", "32", "--checkpoint-every", "1",
            "--eval-every", "1000", "--no-progress"]
    rng = random.Random(0)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    last_step, kills = -1, 0
    while kills < 10:
        args = base + (["--resume"] if (run / "latest.safetensors").exists() else [])
        proc = subprocess.Popen(cli_cmd(*args), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
        deadline = time.time() + 60
        # wait until this process has written at least one checkpoint of its own, then a random moment more
        while time.time() < deadline and proc.poll() is None:
            if (run / "latest.safetensors").exists():
                try:
                    if load_checkpoint(run / "latest.safetensors").step > last_step:
                        break
                except AndreaError:
                    pass  # the reader raced a rename; the file itself is always whole
            time.sleep(0.05)
        time.sleep(rng.uniform(0.0, 0.6))
        assert proc.poll() is None, proc.stderr.read().decode()
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        kills += 1
        ckpt = load_checkpoint(run / "latest.safetensors")
        assert ckpt.step > last_step
        last_step = ckpt.step
        assert all(torch.isfinite(t).all() for t in ckpt.model_state.values())
    # and a final resume finishes cleanly
    final = subprocess.run(cli_cmd(*(base[:8] + [str(last_step + 3)] + base[9:] + ["--resume"])), capture_output=True, env=env)
    assert final.returncode == 0, final.stderr.decode()
    assert load_checkpoint(run / "latest.safetensors").step == last_step + 3


def torchrun_available() -> bool:
    return shutil.which("torchrun") is not None or Path(sys.executable).with_name("torchrun").exists()


@pytest.mark.skipif(not torchrun_available(), reason="torchrun is not installed beside this Python")
@pytest.mark.parametrize("mode,recipe", [("ddp", "v2"), ("fsdp", "v2"), ("ddp", "v3"), ("fsdp", "v3")])
def test_two_processes_match_one(data_dir, tmp_path, mode, recipe):
    """Two processes (gloo) with the same global batch give the same loss curve as one process."""
    cfg = tiny_config(data_dir)
    cfg.save(tmp_path / "model.json")
    common = ["train", "--data", str(data_dir), "--model-config", str(tmp_path / "model.json"), "--max-steps", "6",
              "--batch-size", "4", "--micro-batch", "2", "--seq-len", "32", "--eval-every", "100", "--no-progress",
              "--warmup-steps", "2", "--recipe", recipe]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    one = subprocess.run(cli_cmd(*common, "--out", str(tmp_path / "one")), capture_output=True, env=env)
    assert one.returncode == 0, one.stderr.decode()
    torchrun = [str(Path(sys.executable).with_name("torchrun")), "--nproc_per_node=2", "--master_port", str(29500 + os.getpid() % 1000), "-m", "andrea"]
    extra = ["--fsdp"] if mode == "fsdp" else []
    two = subprocess.run(torchrun + common + extra + ["--out", str(tmp_path / "two")], capture_output=True, env=env, timeout=300)
    assert two.returncode == 0, two.stderr.decode()[-3000:]
    a, b = step_losses(tmp_path / "one"), step_losses(tmp_path / "two")
    assert sorted(a) == sorted(b) == list(range(1, 7))
    # in float32 the two runs differ only in the order a gradient is summed; where the products run in
    # bfloat16 (8 bits of mantissa) that order can flip a rounding, so the losses agree to 1e-4 there
    tol = 1e-5 if compute_dtype("cpu") == torch.float32 else 1e-4
    for s in a:
        assert abs(a[s] - b[s]) <= tol, (s, a[s], b[s])
    # the checkpoint of the two-process run is in our format and loads in one process
    ckpt = load_checkpoint(tmp_path / "two" / "latest.safetensors")
    assert ckpt.step == 6 and set(ckpt.model_state) == set(load_checkpoint(tmp_path / "one" / "latest.safetensors").model_state)


@pytest.mark.parametrize("multiple,chunk", [(64, 0), (16, 0), (16, 7), (64, 5)])
def test_vocabulary_padding_changes_nothing_but_the_matmul_shape(multiple, chunk):
    """Training pads the head's matmul to a multiple of 64 on a GPU and of 16 on a CPU, with the
    loss whole or in blocks of rows; logits, loss, gradients and the parameters are those of the
    unpadded model with the whole loss."""
    from andrea.model import ANDREA

    cfg = ModelConfig(vocab_size=300, n_embd=32, n_head=2, n_layer=1, block_size=16)
    torch.manual_seed(0)
    plain = ANDREA(cfg)
    plain.loss_chunk = 0
    padded = ANDREA(cfg)
    padded.load_state_dict(plain.state_dict())
    padded.vocab_multiple, padded.loss_chunk = multiple, chunk
    ids = torch.randint(0, 300, (2, 16))
    lp, loss_p = plain(ids, ids)
    lq, loss_q = padded(ids, ids)
    if chunk:
        assert lq is None
        lq = padded(ids)[0]
    assert lq.shape == (2, 16, 300)
    torch.testing.assert_close(lq, lp, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(loss_q, loss_p, atol=1e-6, rtol=1e-6)
    loss_p.backward(), loss_q.backward()
    torch.testing.assert_close(padded.lm_head.weight.grad, plain.lm_head.weight.grad, atol=1e-6, rtol=1e-6)
    assert padded.lm_head.weight.shape == (300, 32) and set(padded.state_dict()) == set(plain.state_dict())
    assert sum(p.numel() for p in padded.parameters()) == sum(p.numel() for p in plain.parameters())


# ---------------------------------------------------------------- hostile input


@pytest.mark.hostile
@pytest.mark.parametrize("more_steps", [1, 4])
def test_an_exploding_update_saves_nothing_and_the_named_checkpoint_trains_on(text_data, text_model_json, text_run, tmp_path,
                                                                               capsys, more_steps):
    """Resumed at lr 1e9, the update blows the weights up. Nothing of that state is written (latest
    and best stay byte-identical), the run exits 2 naming latest.safetensors at step 4 as the last
    good checkpoint, and that checkpoint resumes at a normal learning rate and trains to the end."""
    out = copy_text_run(text_run, tmp_path / "r")
    before = snapshot(out)
    code, _, err = cli(capsys, *text_train_args(text_data, text_model_json, out, "--resume", "--lr", "1e9", steps=4 + more_steps))
    line = one_sentence(code, err)
    assert f"the last good checkpoint is {out / 'latest.safetensors'} (step 4)" in line
    assert snapshot(out) == before
    assert not [p for p in out.iterdir() if ".tmp-" in p.name]
    # the promise: that checkpoint, at a normal learning rate, trains on without failing again
    code, stdout, err = cli(capsys, *text_train_args(text_data, text_model_json, out, "--resume", steps=12))
    assert code == 0, err
    ckpt = load_checkpoint(out / "latest.safetensors")
    assert ckpt.step == 12 and all(torch.isfinite(t).all() for t in ckpt.model_state.values())
    assert math.isfinite(float(stdout.split("validation: ")[1].split()[0]))

@pytest.mark.hostile
def test_a_non_finite_smoothed_loss_never_replaces_a_finite_best(text_data, text_model_json, text_run, tmp_path):
    from andrea.train import Run
    from andrea.trainconfig import TrainConfig

    out = copy_text_run(text_run, tmp_path / "r")
    cfg = TrainConfig(max_steps=6, batch_size=2, seq_len=16, eval_windows=1, audit={"enabled": False})
    run = Run(ModelConfig.load(text_model_json), cfg, text_data, out, True, lambda *a: None)
    try:
        best_before = (out / "best.safetensors").read_bytes()
        run.state.smma.value = float("nan")
        run.checkpoint()
        assert (out / "best.safetensors").read_bytes() == best_before
        assert load_checkpoint(out / "latest.safetensors").step == 4
    finally:
        run.close()

@pytest.mark.hostile
def test_a_batch_too_big_for_memory_is_refused_before_the_first_step(two_source_data, two_source_model_json, tmp_path, capsys):
    """--batch-size 1048576 (inside the limit of 2^20): refused with the memory it would need, naming
    --micro-batch; with --micro-batch the same batch is within memory and passes the check."""
    args = ["train", "--data", two_source_data, "--out", tmp_path / "o", "--model-config", two_source_model_json, "--max-steps", "1",
            "--seq-len", "16", "--no-progress", "--batch-size", "1048576"]
    line = one_sentence(*cli(capsys, *args)[::2])
    assert "micro-batches of 1,048,576 × 16 tokens" in line and "--micro-batch" in line and " GB of memory" in line
