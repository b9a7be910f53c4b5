"""Embedding snapshots while training: when they are taken, what they hold, exact resume, the
similarity scores in metrics.jsonl, the timeline read back, and damaged state refused."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from helpers import SET_WORDS, opts, quiet, tiny_config

from andrea.checkpoint import load_checkpoint, save_checkpoint
from andrea.cli import main
from andrea.errors import AndreaError
from andrea.snapshots.store import choose_rows, is_log_step, read_snapshot, snapshot_path, snapshot_steps
from andrea.snapshots.timeline import Timeline, aligned_map, neighbours_at, pair_series, rho_series, row_updates
from andrea.train import train

pytestmark = pytest.mark.usefixtures("one_thread")



def snap(run, step):
    return read_snapshot(snapshot_path(run, step))


def test_snapshots_are_log_spaced_and_at_every_evaluation(data_dir, tmp_path, wordsets):
    run = tmp_path / "r"
    train(tiny_config(data_dir), opts(max_steps=12, eval_every=6), data_dir, run, log=quiet, progress=False)
    assert snapshot_steps(run) == [0, 1, 2, 4, 6, 8, 12]
    assert all(is_log_step(s) for s in (0, 1, 2, 4, 8, 1024)) and not is_log_step(6)
    first, later = snap(run, 0), snap(run, 12)
    assert first.meta["previous"] is None and later.meta["previous"] == 8
    assert int(first.seen.sum()) == 0 and float(first.moved["input"].abs().sum()) == 0
    V = tiny_config(data_dir).vocab_size
    assert first.rows.tolist() == list(range(V)) and first.tables["input"].dtype == torch.float32
    # ‖Δ‖ and the angle are those between the stored tables
    a, b = snap(run, 8).tables["input"], later.tables["input"]
    assert torch.allclose(later.moved["input"], (b - a).norm(dim=1), atol=1e-6)
    cos = torch.nn.functional.cosine_similarity(a, b, dim=1).clamp(-1, 1)
    assert torch.allclose(later.angle["input"], torch.rad2deg(torch.arccos(cos)), atol=1e-3)
    # seen: at most one count per step, and the tokens of 4 steps' batches in (8, 12]
    assert int(later.seen.max()) <= 4 and int((later.seen > 0).sum()) > 5
    # the similarity scores go into metrics.jsonl at every evaluation
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    sims = [r for r in rows if "similarity" in r]
    assert [r["step"] for r in sims] == [6, 12]
    assert set(sims[0]["similarity"]) == {"input_raw", "input_centred", "output_raw", "output_centred"}
    assert "simlex999" in sims[0]["similarity"]["input_centred"] and sims[-1]["growth_seconds"] > 0


def test_resume_writes_exactly_the_snapshots_of_an_uninterrupted_run(data_dir, tmp_path):
    cfg, o = tiny_config(data_dir), opts(max_steps=12, eval_every=6, checkpoint_every=3)
    train(cfg, o, data_dir, tmp_path / "a", log=quiet, progress=False)
    train(cfg, o, data_dir, tmp_path / "b", log=quiet, progress=False, on_step=lambda step, loss: step == 5)
    # a snapshot written after the checkpoint it resumes from belongs to a lost continuation
    assert 4 in snapshot_steps(tmp_path / "b")
    load = load_checkpoint(tmp_path / "b" / "latest.safetensors")
    assert load.step == 5 and load.meta["growth"]["last_step"] == 4
    train(cfg, o, data_dir, tmp_path / "b", resume=True, log=quiet, progress=False)
    assert snapshot_steps(tmp_path / "a") == snapshot_steps(tmp_path / "b")
    for step in snapshot_steps(tmp_path / "a"):
        x, y = snap(tmp_path / "a", step), snap(tmp_path / "b", step)
        assert torch.equal(x.seen, y.seen), step
        for t in ("input", "output"):
            assert torch.equal(x.tables[t], y.tables[t]) and torch.equal(x.moved[t], y.moved[t]), (step, t)


def test_under_adam_a_row_never_seen_stays_put_and_under_adamw_it_decays(data_dir, tmp_path):
    """v1 (Adam, no decay): a token that was in no batch so far has zero gradient and zero
    moments, so its row is exactly the initial one; v2 (AdamW, wte decayed) shrinks it."""
    cfg = tiny_config(data_dir)
    for recipe in ("v1", "v2"):
        run = tmp_path / recipe
        train(cfg, opts(recipe=recipe, max_steps=8, lr=1e-2), data_dir, run, log=quiet, progress=False)
        total = torch.zeros(cfg.vocab_size, dtype=torch.int64)
        start = snap(run, 0).tables["input"]
        for step in snapshot_steps(run)[1:]:
            s = snap(run, step)
            total += s.seen.long()
            never = total == 0
            assert never.sum() > 0
            moved_from_start = (s.tables["input"] - start).norm(dim=1)
            if recipe == "v1":
                assert float(moved_from_start[never].max()) == 0.0, step
            else:
                assert float(moved_from_start[never].min()) > 0.0, step
                assert torch.all(s.tables["input"][never].norm(dim=1) < start[never].norm(dim=1))
            assert float(moved_from_start[~never].min()) > 0.0
            assert float(s.moved["output"].min()) > 0.0  # every head row gets a gradient every step


def test_the_timeline_reads_the_run_back(data_dir, tmp_path, wordsets, capsys):
    run = tmp_path / "r"
    train(tiny_config(data_dir), opts(max_steps=8), data_dir, run, log=quiet, progress=False)
    tl = Timeline(run)
    ps = pair_series(tl, [("cat", "dog"), ("cat", "mat")])
    assert ps["steps"] == tl.steps == [0, 1, 2, 4, 8] and len(ps["series"]["cat·dog"]) == 5
    assert ps["band"] == pytest.approx(1 / math.sqrt(32))
    from andrea.inside.wordsim import load_wordsets

    rs = rho_series(tl, load_wordsets())
    assert rs["sets"]["simlex999"]["n"] == 28 and len(rs["sets"]["wordsim353"]["rho"]) == 5
    nb = neighbours_at(tl, 5, "cat", k=3, whole_words=False)
    assert nb["step"] == 4 and len(nb["neighbours"]) == 3
    mp = aligned_map(tl, SET_WORDS[:5])
    assert len(mp["frames"]) == 5 and np.array(mp["frames"]).shape == (5, 5, 2)
    upd = row_updates(tl, 4, 8)
    assert upd["start"] == 4 and upd["end"] == 8 and upd["groups"]["seen"]["tokens"] > 0
    assert "weight decay" in upd["why"] and len(upd["rows"]) == tiny_config(data_dir).vocab_size
    assert main(["embed", "timeline", "--checkpoint", str(run), "cat", "dog", "mat"]) == 0
    out = capsys.readouterr().out
    assert "cos cat·dog" in out and "ρ simlex999" in out and len(out.splitlines()) >= 8


@pytest.mark.hostile
def test_a_damaged_growth_state_is_one_sentence(data_dir, tmp_path):
    cfg, o = tiny_config(data_dir), opts(max_steps=4)
    run = tmp_path / "r"
    train(cfg, o, data_dir, run, log=quiet, progress=False)
    ck = load_checkpoint(run / "latest.safetensors")
    ck.meta = {k: v for k, v in ck.meta.items() if not isinstance(v, torch.Tensor)}
    # 2^61 kept evaluations would make the next one compute 2^(2^61 / K): refused, like more than the steps allow
    for damage in ({"last_step": 99}, {"seen_ids": [10**9], "seen_counts": [1]}, {"evals_seen": -1}, "x",
                   {"evals_seen": 2**61, "evals_kept": 2**61}, {"evals_seen": 6}, {"evals_seen": 2, "evals_kept": 3}):
        meta = dict(ck.meta)
        meta["growth"] = {**ck.meta["growth"], **damage} if isinstance(damage, dict) else damage
        save_checkpoint(run / "latest.safetensors", cfg, ck.model_state, ck.optim_state, meta)
        with pytest.raises(AndreaError, match="growth"):
            train(cfg, opts(max_steps=6), data_dir, run, resume=True, log=quiet, progress=False)
    meta = dict(ck.meta)
    save_checkpoint(run / "latest.safetensors", cfg, ck.model_state, ck.optim_state, meta)
    snapshot_path(run, 4).write_bytes(b"not a snapshot")  # (or a run folder copied without embeddings/)
    lines = []
    train(cfg, opts(max_steps=6), data_dir, run, resume=True, log=lines.append, progress=False)
    assert any("snapshot of step 4" in line and "missing or damaged" in line for line in lines)
    assert load_checkpoint(run / "latest.safetensors").step == 6 and 6 in snapshot_steps(run)
    assert float(snap(run, 6).moved["input"].abs().sum()) == 0  # no predecessor to measure against


def test_a_large_table_keeps_its_frequent_rows_and_the_word_sets_in_half_precision():
    counts = np.zeros(8449, dtype=np.int64)
    counts[[5, 900, 4000]] = [10, 30, 20]
    rows, dtype = choose_rows(8449, 768, counts, np.array([7000, 900, 9999]), n_frequent=2)
    assert dtype == torch.float16 and rows.tolist() == [900, 4000, 7000]
    rows, dtype = choose_rows(2305, 256, None, np.array([1]), n_frequent=2)
    assert dtype == torch.float32 and len(rows) == 2305


def test_embed_similarity_scores_a_run_beside_its_ppmi_reference(data_dir, tmp_path, wordsets, capsys):
    run = tmp_path / "r"
    train(tiny_config(data_dir), opts(max_steps=4), data_dir, run, log=quiet, progress=False)
    assert main(["embed", "similarity", "--checkpoint", str(run), "--ppmi"]) == 0
    out = capsys.readouterr().out
    assert "PPMI + SVD reference" in out and "simlex999" in out and "cat·Tuesday" in out
    assert main(["embed", "similarity", "--checkpoint", str(run), "--json", "--no-analogies"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert set(r["tables"]) == {"input", "output"} and r["coverage"]["simlex999"]["pairs"] == 28
    assert "analogies" not in r["tables"]["input"]["raw"]
    assert r["tables"]["input"]["raw"]["simlex999"]["all"]["null"] == pytest.approx(1 / math.sqrt(27))


def test_embed_similarity_scores_a_fresh_preset_and_timeline_takes_only_a_run(data_dir, wordsets, capsys):
    """A fresh preset's table is the baseline of the scores (what init alone gives); a timeline is read
    from a run, so its parser has no --preset."""
    tok = str(data_dir / "tokenizer")
    assert main(["embed", "similarity", "--preset", "andrea-tiny", "--tokenizer", tok, "--json", "--no-analogies"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert "andrea-tiny (fresh, seed 0" in r["model"] and set(r["tables"]) == {"input", "output"}
    assert main(["embed", "similarity", "--preset", "andrea-tiny", "--ppmi"]) == 2
    assert "give --data DIR beside --preset" in capsys.readouterr().err
    assert main(["embed", "timeline", "--preset", "andrea-tiny", "cat", "dog"]) == 2  # a usage error, one sentence
    assert "--checkpoint" in capsys.readouterr().err


def test_embed_similarity_without_the_sets_says_how_to_fetch_them(data_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ANDREA_CACHE", str(tmp_path / "empty"))
    run = tmp_path / "r"
    train(tiny_config(data_dir), opts(max_steps=2, snapshots=False), data_dir, run, log=quiet, progress=False)
    assert not (run / "embeddings").exists()
    assert main(["embed", "similarity", "--checkpoint", str(run)]) == 2
    assert "andrea data fetch wordsets" in capsys.readouterr().err
    assert main(["embed", "timeline", "--checkpoint", str(run), "cat", "dog"]) == 2
    assert "no embedding snapshots" in capsys.readouterr().err


@pytest.mark.hostile
@pytest.mark.parametrize("damage", ["other-d", "fewer-rows", "nan-mean", "huge-vocab", "row-id", "fifo"])
def test_a_damaged_later_snapshot_is_left_out_with_a_note(data_dir, tmp_path, damage):
    """Every snapshot is checked against the run and the first one; a damaged or foreign one is left
    out with a note, and the timeline reads the rest (a traceback, a 500 or a 7 TiB allocation before)."""
    import os

    from safetensors.torch import save_file

    run = tmp_path / "r"
    train(tiny_config(data_dir), opts(max_steps=4, eval_every=4), data_dir, run, log=quiet, progress=False)
    steps = snapshot_steps(run)
    bad = snapshot_path(run, steps[-1])
    snap = read_snapshot(bad)
    meta = dict(snap.meta)
    tensors = {"rows": snap.rows, "seen": snap.seen}
    for t in ("input", "output"):
        tensors.update({t: snap.tables[t], f"{t}_mean": snap.means[t], f"{t}_moved": snap.moved[t], f"{t}_angle": snap.angle[t]})
    if damage == "other-d":
        meta["d"] = 16
        for t in ("input", "output"):
            tensors[t], tensors[f"{t}_mean"] = tensors[t][:, :16].contiguous(), tensors[f"{t}_mean"][:16].contiguous()
    elif damage == "fewer-rows":
        tensors = {k: (v[:-10].contiguous() if k not in ("input_mean", "output_mean") else v) for k, v in tensors.items()}
    elif damage == "nan-mean":
        tensors["input_mean"] = torch.full_like(tensors["input_mean"], float("nan"))
    elif damage == "huge-vocab":
        meta["vocab_size"] = 10**12
    elif damage == "row-id":
        tensors["rows"] = tensors["rows"].clone()
        tensors["rows"][-1] = 10**6
    if damage == "fifo":
        bad.unlink()
        os.mkfifo(bad)
    else:
        save_file(tensors, str(bad), metadata={"andrea.growth": json.dumps(meta)})
    tl = Timeline(run)
    assert tl.steps == steps[:-1] and len(tl.notes) == 1 and f"step {steps[-1]}" in tl.notes[0]
    assert pair_series(tl, [("cat", "dog")])["steps"] == steps[:-1]


@pytest.mark.parametrize("kind", ["file", "fifo", "link"])
def test_snapshots_stop_with_a_note_when_embeddings_is_not_a_folder(data_dir, tmp_path, kind):
    """Snapshots are an observer: a file, a FIFO (never opened, so nothing hangs) or a link to a
    folder elsewhere in place of embeddings/ ends them with a note, and training goes on."""
    run = tmp_path / "r"
    run.mkdir()
    where = run / "embeddings"
    if kind == "file":
        where.write_text("a file where the folder would be")
    elif kind == "fifo":
        os.mkfifo(where)
    else:
        (tmp_path / "elsewhere").mkdir()
        where.symlink_to(tmp_path / "elsewhere")
    lines = []
    result = train(tiny_config(data_dir), opts(max_steps=4, eval_every=4), data_dir, run, log=lines.append, progress=False)
    assert result.step == 4 and any("embedding snapshots stop" in line for line in lines), lines
    if kind == "link":
        assert not any((tmp_path / "elsewhere").iterdir())  # nothing written through the link
    else:
        assert not where.is_dir()


def test_the_first_snapshot_removes_a_killed_writes_temporary_file(data_dir, tmp_path):
    """A snapshot write cut short by a kill leaves NAME.tmp-PID-HEX in embeddings/: the run's first
    snapshot removes it when its process is gone, and keeps a live process's."""
    run = tmp_path / "r"
    (run / "embeddings").mkdir(parents=True)
    dead = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    dead.kill()
    dead.wait()
    stale = run / "embeddings" / f"step-00000004.safetensors.tmp-{dead.pid}-0123abcd"
    stale.write_bytes(b"half a snapshot")
    live = run / "embeddings" / f"step-00000008.safetensors.tmp-{os.getpid()}-89abcdef"
    live.write_bytes(b"being written")
    train(tiny_config(data_dir), opts(max_steps=2), data_dir, run, log=quiet, progress=False)
    assert not stale.exists() and live.exists()
    assert snapshot_steps(run)[0] == 0


@pytest.mark.hostile
def test_a_run_resumed_with_other_snapshot_rows_keeps_its_own(data_dir, tmp_path, monkeypatch):
    """--resume with another --snapshot-rows would write snapshots of two row sets into one folder:
    the run goes on keeping the rows of its own snapshots, says so, and every snapshot reads back
    with the same rows."""
    import andrea.snapshots.store as snapshots

    monkeypatch.setattr(snapshots, "WHOLE_LIMIT", 16)  # a "large" table: rows are chosen
    cfg = tiny_config(data_dir)
    run = tmp_path / "r"
    train(cfg, opts(max_steps=4, snapshot_rows=5), data_dir, run, log=quiet, progress=False)
    first = read_snapshot(snapshot_path(run, 4)).rows
    lines = []
    train(cfg, opts(max_steps=8, snapshot_rows=40), data_dir, run, resume=True, log=lines.append, progress=False)
    assert any("go on keeping those" in line for line in lines), lines
    steps = snapshot_steps(run)
    assert steps[-1] == 8 and all(torch.equal(read_snapshot(snapshot_path(run, s)).rows, first) for s in steps)


def _rewrite(path, meta_changes=None, snapshot=None):
    """Write a snapshot file again with its metadata changed (or another snapshot's contents)."""
    from safetensors.torch import save_file

    s = snapshot or read_snapshot(path)
    tensors = {"rows": s.rows, "seen": s.seen}
    for t in ("input", "output"):
        tensors.update({t: s.tables[t], f"{t}_mean": s.means[t], f"{t}_moved": s.moved[t], f"{t}_angle": s.angle[t]})
    save_file(tensors, str(path), metadata={"andrea.growth": json.dumps({**s.meta, **(meta_changes or {})})})


def _strict_json(text):
    def refuse(name):
        raise ValueError(f"{name} is not JSON")
    return json.loads(text, parse_constant=refuse)


@pytest.mark.hostile
def test_a_first_snapshot_of_another_run_is_left_out_and_the_lesson_says_so(data_dir, tmp_path, capsys):
    """Another run's snapshot of the same table in place of this run's first: this run's step 1
    did not move from its values, so it is left out with a note; the lesson judges the start on the
    run's own snapshots and names what it left out."""
    cfg = tiny_config(data_dir)
    train(cfg, opts(max_steps=4, eval_every=4), data_dir, tmp_path / "a", log=quiet, progress=False)
    train(cfg, opts(max_steps=4, eval_every=4, seed=8), data_dir, tmp_path / "b", log=quiet, progress=False)
    steps = snapshot_steps(tmp_path / "a")
    assert Timeline(tmp_path / "a").steps == steps and steps[0] == 0  # this run's own snapshots all kept
    foreign = snap(tmp_path / "b", 0)
    assert torch.equal(foreign.rows, snap(tmp_path / "a", 0).rows)
    _rewrite(snapshot_path(tmp_path / "a", 0), snapshot=foreign)
    tl = Timeline(tmp_path / "a")
    assert tl.steps == steps[1:] and len(tl.notes) == 1 and "step 0 is left out" in tl.notes[0]
    assert main(["lesson", "--checkpoint", str(tmp_path / "a"), "--json", "--no-ppmi"]) == 0
    report = _strict_json(capsys.readouterr().out)
    init = next(s for s in report["steps"] if s["key"] == "init")
    assert init["numbers"]["step"] == steps[1] and report["left_out"] == tl.notes
    assert main(["lesson", "--checkpoint", str(tmp_path / "a"), "--no-ppmi"]) == 0
    assert "Note: the snapshot of step 0 is left out" in capsys.readouterr().out


@pytest.mark.hostile
@pytest.mark.parametrize("changes", [{"recipe": 5}, {"recipe": ["v2"]}, {"recipe": ""}, {"mean_cos": "high"},
                                     {"mean_cos": {"input": "0.1"}}, {"mean_cos": {"input": 7.5}},
                                     {"mean_cos": [0.1, 0.2]}, {"previous": "3"}, {"previous": 10**9},
                                     {"evaluation": "yes"}, {"whole": 1}])
def test_snapshot_metadata_of_the_wrong_type_is_left_out_with_a_note(data_dir, tmp_path, capsys, changes):
    run = tmp_path / "r"
    train(tiny_config(data_dir), opts(max_steps=4, eval_every=4), data_dir, run, log=quiet, progress=False)
    steps = snapshot_steps(run)
    _rewrite(snapshot_path(run, steps[-1]), changes)
    with pytest.raises(AndreaError):
        snap(run, steps[-1])
    tl = Timeline(run)
    assert tl.steps == steps[:-1] and len(tl.notes) == 1 and f"step {steps[-1]}" in tl.notes[0]
    assert main(["embed", "timeline", "--checkpoint", str(run), "cat", "dog"]) == 0
    out, err = capsys.readouterr()
    assert "Traceback" not in err and f"step {steps[-1]}" in out + err
    assert main(["lesson", "--checkpoint", str(run), "--json", "--no-ppmi"]) == 0
    assert _strict_json(capsys.readouterr().out)["left_out"] == tl.notes


@pytest.mark.hostile
def test_a_resumed_run_removes_a_killed_snapshot_writes_temporary_file(data_dir, tmp_path):
    cfg, o = tiny_config(data_dir), opts(max_steps=8, eval_every=4, checkpoint_every=3)
    run = tmp_path / "r"
    train(cfg, o, data_dir, run, log=quiet, progress=False, on_step=lambda step, loss: step == 5)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = run / "embeddings" / f"step-00000008.safetensors.tmp-{int(dead.stdout)}-0123abcd"
    stale.write_bytes(b"half a snapshot of a resumed run")
    train(cfg, o, data_dir, run, resume=True, log=quiet, progress=False)
    assert not stale.exists() and 8 in snapshot_steps(run)


# ---------------------------------------------------------------- one gate for every reader of snapshots


def _zero_rows(run, step):
    s = read_snapshot(snapshot_path(run, step))
    tensors = {"rows": s.rows[:0], "seen": s.seen[:0]}
    for t in ("input", "output"):
        tensors.update({t: s.tables[t][:0], f"{t}_mean": s.means[t], f"{t}_moved": s.moved[t][:0],
                        f"{t}_angle": s.angle[t][:0]})
    _save(snapshot_path(run, step), tensors, {**s.meta, "whole": False})


def _save(path, tensors, meta):
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path), metadata={"andrea.growth": json.dumps(meta)})


def _tensors_changed(run, step, **changes):
    s = read_snapshot(snapshot_path(run, step))
    tensors = {"rows": s.rows, "seen": s.seen}
    for t in ("input", "output"):
        tensors.update({t: s.tables[t], f"{t}_mean": s.means[t], f"{t}_moved": s.moved[t], f"{t}_angle": s.angle[t]})
    _save(snapshot_path(run, step), {**tensors, **{k: f(tensors[k]) for k, f in changes.items()}}, s.meta)


def _put(other, step):
    """Another run's snapshot of `step` put in the run's folder at that step."""
    return lambda run: shutil.copyfile(snapshot_path(other, step), snapshot_path(run, step))


def _damages(other):
    """{case: (damage of a copy of the run, its snapshots that must be left out)}: the run's snapshots
    are at steps 0, 1, 2, 4 and its checkpoint at step 4; `other` is another run of the same table
    (snapshots at 0, 1, 2, 4, 8)."""
    return {
        "seen NaN": (lambda run: _tensors_changed(run, 4, seen=lambda t: torch.full(t.shape, float("nan"))), [4]),
        "seen inf": (lambda run: _tensors_changed(run, 2, seen=lambda t: torch.full(t.shape, float("inf"))), [2]),
        "seen below 0": (lambda run: _tensors_changed(run, 4, seen=lambda t: t - 5), [4]),
        "angle past 180": (lambda run: _tensors_changed(run, 4, input_angle=lambda t: t + 200), [4]),
        "mean cosine NaN": (lambda run: _rewrite(snapshot_path(run, 4), {"mean_cos": {"input": float("nan")}}), [4]),
        "step not its name's": (lambda run: shutil.copyfile(snapshot_path(run, 2), snapshot_path(run, 4)), [4]),
        "zero rows, every one": (lambda run: [_zero_rows(run, s) for s in (0, 1, 2, 4)], [0, 1, 2, 4]),
        "another run's last in place of the last": (_put(other, 4), [4]),
        "another run's last after the last": (_put(other, 8), [8]),
        "another run's first in place of the first": (_put(other, 0), [0]),
    }


def _steps_in(report) -> set:
    """The snapshot steps a lesson report's init and sparse steps were computed from."""
    used = set()
    for s in report["steps"]:
        numbers = s.get("numbers") or {}
        if s["key"] == "init" and "step" in numbers:
            used.add(numbers["step"])
        if s["key"] == "sparse" and "start" in numbers:
            used |= {numbers["start"], numbers["end"]}
    return used


def _embed_timeline(run, capsys, data_dir):
    code = main(["embed", "timeline", "--checkpoint", str(run), "cat", "dog", "--json"])
    out, err = capsys.readouterr()
    return (json.loads(out)["steps"] if code == 0 else []), err, None


def _lesson(run, capsys, data_dir):
    code = main(["lesson", "--checkpoint", str(run), "--json", "--no-ppmi"])
    out, err = capsys.readouterr()
    if code != 0:
        return [], err, None
    report = _strict_json(out)
    return _steps_in(report), json.dumps(report["left_out"]) + json.dumps(report["steps"]), None


def _lab(path):
    def drive(run, capsys, data_dir):
        from starlette.testclient import TestClient

        from andrea.inside.embed import load_subject
        from andrea.web.lab import create_app

        with TestClient(create_app(load_subject(run)), raise_server_exceptions=False) as c:
            if path == "growth":
                info = c.get("/api/growth").json()
                if not info["live"]:
                    return [], info["note"], None
                assert c.post("/api/growth/updates", json={}).status_code == 200
                return info["steps"], " ".join(info["notes"]), None
            r = c.get("/api/lesson")
        if r.status_code != 200:
            return [], r.json()["error"], None
        return _steps_in(r.json()), json.dumps(r.json()["left_out"]) + json.dumps(r.json()["steps"]), None
    return drive


def _resume(run, capsys, data_dir):
    """A resumed run reads its checkpoint's last snapshot (step 4) back as the base of the next ‖Δ‖."""
    lines = []
    train(tiny_config(data_dir), opts(max_steps=6, eval_every=4), data_dir, run, resume=True, log=lines.append,
          progress=False)
    noted = [line for line in lines if "snapshot of step 4" in line]
    return ([] if noted else [4]), " ".join(noted), {4}


def _bench_similarity(run, capsys, data_dir):
    import importlib
    from pathlib import Path

    from andrea.inside.wordsim import try_load_wordsets

    bench = Path(__file__).resolve().parent.parent / "benchmarks"
    sys.path.insert(0, str(bench))
    try:
        module = importlib.import_module("bench_similarity")
    finally:
        sys.path.remove(str(bench))
    try:
        _, rows = module.timeline_rows(run, try_load_wordsets())
    except AndreaError as e:
        return [], str(e), None
    return [int(row[0].replace(",", "")) for row in rows], None, None  # it prints no notes of what it left out


SNAPSHOTS_READ_BY = {  # SNAPSHOT_READERS: (the module that reads snapshots, a drive of it: (the steps it computed
    # from, its notes or None where it shows none, the steps it reads or None for all))
    "andrea embed timeline": ("andrea/cli/similarity.py", _embed_timeline),
    "andrea lesson": ("andrea/inside/lessons/embedding.py", _lesson),
    "lab growth": ("andrea/web/lab_growth.py", _lab("growth")),
    "lab lesson": ("andrea/inside/lessons/embedding.py", _lab("lesson")),
    "andrea train --resume": ("andrea/snapshots/store.py", _resume),
    "bench_similarity": ("benchmarks/bench_similarity.py", _bench_similarity),
}


@pytest.mark.hostile
def test_every_reader_of_snapshots_leaves_out_the_same_damaged_ones(data_dir, tmp_path, wordsets, capsys):
    """A real run's snapshots damaged one way at a time (`seen` NaN, infinite or below 0, an angle
    past 180°, a mean cosine NaN, a file under another step's name, zero rows in every one, another
    run's snapshot in place of the run's last, after it or in place of its first): every reader
    listed beside the gate (the timeline, both lessons, the lab's Growth view, a resumed run, the
    benchmark) leaves the damaged ones out, computes nothing from them, says which where it shows
    notes, and never prints a traceback or a verdict of NaN. Before: a traceback for `seen` NaN or
    inf, "does not hold: the spread is nan" for zero rows, and another run's last snapshot kept while
    the run's own before it was blamed, or silently taken as a resumed run's base. The list beside
    the gate is the list driven here, and no other module reads snapshots."""
    import re
    from pathlib import Path

    from andrea.snapshots.store import SNAPSHOT_READERS

    assert set(SNAPSHOTS_READ_BY) == set(SNAPSHOT_READERS)
    root = Path(__file__).resolve().parent.parent
    callers = {f"{p.relative_to(root)}" for folder in ("andrea", "benchmarks") for p in sorted((root / folder).rglob("*.py"))
               if re.search(r"\b(read_snapshot|Timeline)\(", p.read_text()) and p.name != "timeline.py"}
    assert callers == {module for module, _ in SNAPSHOTS_READ_BY.values()}

    cfg = tiny_config(data_dir)
    train(cfg, opts(max_steps=4, eval_every=4), data_dir, tmp_path / "a", log=quiet, progress=False)
    train(cfg, opts(max_steps=8, eval_every=4, seed=8), data_dir, tmp_path / "b", log=quiet, progress=False)
    assert snapshot_steps(tmp_path / "a") == [0, 1, 2, 4] and snapshot_steps(tmp_path / "b") == [0, 1, 2, 4, 8]
    assert Timeline(tmp_path / "a").notes == []
    for case, (damage, bad) in _damages(tmp_path / "b").items():
        for reader, (_, drive) in SNAPSHOTS_READ_BY.items():
            run = tmp_path / f"{len(reader)}-{case.split()[0]}-{len(case)}"
            shutil.rmtree(run, ignore_errors=True)
            shutil.copytree(tmp_path / "a", run)
            damage(run)
            used, notes, reads = drive(run, capsys, data_dir)
            assert not set(bad) & set(used), (case, reader, used)
            if notes is not None:
                named = [s for s in bad if re.search(rf"\bsteps? (\d+, )*{s}\b", notes)]  # "step 4", "steps 0, 1, 2, 4"
                assert named == [s for s in bad if reads is None or s in reads], (case, reader, notes)
                assert not re.search(r"\bnan\b", notes, re.IGNORECASE), (case, reader, notes)
            assert "Traceback" not in "".join(capsys.readouterr()), (case, reader)
            if reader in ("andrea lesson", "lab lesson") and case.startswith("zero rows"):  # walked, the steps saying why
                assert '"verdict": "cannot check"' in notes and "0, 1, 2" in notes, (reader, notes)
            if reader == "andrea embed timeline" and len(bad) < 4:
                assert used == [s for s in (0, 1, 2, 4, 8) if s in snapshot_steps(run) and s not in bad], (case, used)
