"""Embedding snapshots while training: when they are taken, what they hold, exact resume, the
similarity scores in metrics.jsonl, the timeline read back, and damaged state refused."""

from __future__ import annotations

import json
import math
import os
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
    from andrea.wordsim import load_wordsets

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
