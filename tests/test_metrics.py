"""andrea.metrics: its behaviour, and its promises under hostile input."""

import pytest
from helpers import audited_train_args, cli, damaged_copy

from andrea.metrics import read_metrics

# ---------------------------------------------------------------- hostile input


@pytest.mark.hostile
@pytest.mark.parametrize("damage", ["missing key", "null", "garbage", "wrong types", "cut off"])
def test_a_damaged_metrics_file_costs_at_most_the_picture(two_source_data, two_source_model_json, audited_run, tmp_path, capsys, damage):
    """metrics.jsonl with a row missing a key, a `null` line, a garbage line, numbers of the wrong
    type or a line cut off by a crash: the resumed run trains to its end and draws loss.png."""
    out = damaged_copy(audited_run, tmp_path / "r", lambda m: None)
    metrics = out / "metrics.jsonl"
    extra = {"missing key": '{"step": 3, "loss": 2.0}\n{"step": 4, "eval": {"all": {}}}\n',
             "null": "null\n", "garbage": "\x00\x01 not json {\n",
             "wrong types": '{"step": "x", "loss": [1], "smma": null}\n{"step": 2, "eval": [1, 2]}\n'
                            '{"step": 2, "eval": {"all": {"loss": "x"}}}\n',
             "cut off": '{"step": 4, "loss": 2.0, "sm'}[damage]
    metrics.write_text(metrics.read_text() + extra)
    (out / "loss.png").unlink(missing_ok=True)
    code, stdout, err = cli(capsys, *audited_train_args(two_source_data, two_source_model_json, out, "--resume", steps=6))
    assert code in (0, 3), err
    assert "could not draw" not in stdout + err
    assert (out / "loss.png").stat().st_size > 1000


@pytest.mark.hostile
def test_a_fifo_in_place_of_the_metrics_file_is_refused_not_waited_on(tmp_path):
    """Opening a FIFO blocks until its other end opens: the reader draws nothing from it, and the
    writer refuses it in one sentence, both at once."""
    import os

    from andrea.errors import AndreaError
    from andrea.metrics import append_row, read_metrics

    fifo = tmp_path / "metrics.jsonl"
    os.mkfifo(fifo)
    assert read_metrics(fifo) == []
    with pytest.raises(AndreaError, match=r"metrics.jsonl is a FIFO.*not a regular file"):
        append_row(fifo, {"step": 1})
    plain = tmp_path / "plain.jsonl"
    rows = [{"step": 1, "loss": 2.5, "smma": 2.5}, {"step": 2, "loss": 2.0, "smma": 2.4}]
    for row in rows:
        append_row(plain, row)
    assert read_metrics(plain) == rows and read_metrics(tmp_path / "none.jsonl") == []


@pytest.mark.hostile
def test_a_resumed_run_with_fifos_for_its_records_ends_in_one_sentence_not_a_hang(two_source_data, two_source_model_json,
                                                                                  audited_run, tmp_path, capsys):
    """A FIFO in place of train.json is replaced whole (the settings are written by a rename); one in
    place of metrics.jsonl stops the resumed run in one sentence naming it, its checkpoint kept."""
    import os

    from helpers import one_sentence

    out = damaged_copy(audited_run, tmp_path / "r", lambda m: None)
    (out / "metrics.jsonl").unlink()
    os.mkfifo(out / "metrics.jsonl")
    os.mkfifo(out / "train.json")
    before = (out / "latest.safetensors").read_bytes()
    code, _, err = cli(capsys, *audited_train_args(two_source_data, two_source_model_json, out, "--resume", steps=6))
    assert "metrics.jsonl is a FIFO" in one_sentence(code, err)
    assert (out / "train.json").is_file() and (out / "latest.safetensors").read_bytes() == before


@pytest.mark.hostile
def test_a_line_of_hundreds_of_megabytes_is_skipped_without_being_held(tmp_path):
    """JSON Lines are read with a per-line cap (andrea.files.json_lines): a huge line costs at most
    the cap in memory, and the rows around it are read."""
    import tracemalloc

    path = tmp_path / "metrics.jsonl"
    with open(path, "wb") as f:
        f.write(b'{"step": 1, "loss": 2.0, "smma": 2.0}\n')
        f.seek(300 << 20)  # 300 MB of NUL bytes on one line, then a newline and a row
        f.write(b'\n{"step": 2, "loss": 1.5, "smma": 1.9}\n')
    tracemalloc.start()
    try:
        rows = read_metrics(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert [r["step"] for r in rows] == [1, 2]
    assert peak < 8 << 20, peak


# ---------------------------------------------------------------- one gate for every reader of the rows

_KINDS = ("previous", "first", "same", "induction")


def _heads(blocks=2, heads=2, weight=0.25, **changes) -> str:
    """A heads row of the growth run's model (2 blocks × 2 heads), with fields changed."""
    import json

    value = {"n": 15, "scores": {k: [[weight] * heads for _ in range(blocks)] for k in _KINDS},
             "best": {k: 0.25 for k in _KINDS}, **changes}
    return json.dumps({"step": 2000, "heads": value})


# metrics.jsonl lines each of which fails its row's declared shape (andrea.metrics.valid_row)
DAMAGED_ROWS = [
    '{"step": 2000, "heads": {}}',  # the audit's row: the Growth view's heads panel answered 500 while it was there
    _heads(scores={"previous": 1}),
    _heads(blocks=3),  # another model's blocks × heads
    _heads(heads=1),
    _heads(weight=float("nan")),
    _heads(weight="0.5"),
    _heads(weight=1.5),
    _heads(scores={k: [[0.1, 0.2], [0.3]] for k in _KINDS}),  # ragged
    _heads(n=True),
    _heads(best={"previous": 0.2}),
    '{"step": 3, "loss": NaN, "smma": 2.0}',
    '{"step": 3, "loss": 2.0, "smma": Infinity}',
    '{"step": 3, "loss": 1e300, "smma": 2.0}',
    '{"step": -1, "loss": 2.0, "smma": 2.0}',
    '{"step": 2.5, "loss": 2.0, "smma": 2.0}',
    '{"step": true, "loss": 2.0, "smma": 2.0}',
    '{"step": 3, "loss": 2.0, "smma": 2.0, "mfu": -1}',
    _heads()[:-1] + ', "loss": 2.0, "smma": 2.0}',  # two kinds in one row
    '{"step": 16, "eval": {"all": {"loss": "x"}}}',
    '{"step": 16, "eval": {"all": {"loss": 2.0, "bpb": Infinity}}}',
    '{"step": 16, "eval": {"alpha": {"loss": 2.0, "bpb": 1.0}}}',
    '{"step": 16, "eval": []}',
    '{"step": 16, "audit": {"score": 500, "components": {}, "text": ""}}',
    '{"step": 16, "similarity": {"input_raw": {"cat_dog": 7}}, "growth_seconds": 1.0}',
    '{"step": 16}',
    'null',
    '[1, 2]',
    '{"step": 4, "loss": 2.0, "sm',
]


def _lab_heads(run, cache):
    """POST /api/growth/heads of a lab on the run: (its answer without the note, the note)."""
    from starlette.testclient import TestClient

    from andrea.inside import embed
    from andrea.web.lab import create_app

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ANDREA_CACHE", str(cache))
        mp.setenv("ANDREA_WORDSETS", str(cache / "wordsets"))
        app = create_app(embed.load_subject(run))
    with TestClient(app, raise_server_exceptions=False) as c:
        r = c.post("/api/growth/heads", json={})
    assert r.status_code == 200, r.text
    answer = r.json()
    return {k: v for k, v in answer.items() if k != "note"}, answer.get("note")


def _bench(name):
    import importlib
    import sys
    from pathlib import Path

    bench = Path(__file__).resolve().parent.parent / "benchmarks"
    sys.path.insert(0, str(bench))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(bench))


def _bench_induction(run, cache):
    module = _bench("bench_induction")
    rows = read_metrics(run / "metrics.jsonl")
    first, best, step = module.crossing(rows)
    return (first, best, step, module.loss_fall(rows, step, window=4)), None


def _loss_png(run, cache):
    from andrea.metrics import loss_curves
    from andrea.plots import plot_losses

    plot_losses(run / "metrics.jsonl", run / "loss.png")
    assert (run / "loss.png").stat().st_size > 1000
    return loss_curves(read_metrics(run / "metrics.jsonl")), None


def _best_evaluation(run, cache):
    from andrea.mainjob import _eval_at

    return [_eval_at(run / "metrics.jsonl", step) for step in (8, 16)], None


def _bench_similarity(run, cache):
    import re

    return re.sub(r"took [0-9.]+ s of the run's", "took s of the run's", _bench("bench_similarity").cost(run)), None


READ_BY = {  # METRICS_READERS: (the module that reads the rows, a drive of it: (what it computed, its note))
    "loss.png": ("andrea/plots.py", _loss_png),
    "andrea main's best evaluation": ("andrea/mainjob.py", _best_evaluation),
    "lab growth heads": ("andrea/web/lab_growth.py", _lab_heads),
    "bench_induction": ("benchmarks/bench_induction.py", _bench_induction),
    "bench_similarity": ("benchmarks/bench_similarity.py", _bench_similarity),
    "bench_curriculum": ("benchmarks/bench_curriculum.py", lambda run, cache: (_bench("bench_curriculum").step_losses(run), None)),
    "gpu_bench": ("benchmarks/gpu_bench.py", lambda run, cache: (_bench("gpu_bench").last_step_and_bpb(run), None)),
}


@pytest.mark.hostile
def test_every_reader_of_metrics_rows_leaves_out_the_same_damaged_rows(growth_run, tmp_path):
    """A real run's metrics.jsonl with rows appended that fail their declared shape (heads' scores
    empty, of another model's blocks × heads, NaN, ragged or out of [0, 1]; losses NaN or huge;
    steps negative, fractional or true; evaluations without numbers; two kinds in one row; null,
    a list, a line cut off): every reader listed beside the gate computes what it computes without
    them (the lab's heads panel answered 500 before, bench_induction raised KeyError, loss.png drew
    step -1 and andrea main took a damaged evaluation for the best one), and the lab's note names
    each line left out. The list beside the gate is the list driven here, and no other module reads
    the rows."""
    import json
    import re
    import shutil
    from pathlib import Path

    from andrea.metrics import METRICS_READERS, valid_row

    assert set(READ_BY) == set(METRICS_READERS)
    root = Path(__file__).resolve().parent.parent
    callers = {f"{p.relative_to(root)}" for folder in ("andrea", "benchmarks") for p in (root / folder).rglob("*.py")
               if re.search(r"\bread_metrics\(", p.read_text()) and p.name != "metrics.py"}
    assert callers == {module for module, _ in READ_BY.values()}
    assert {p.name for p in (root / "andrea").rglob("*.py") if "json_lines(" in p.read_text()} == {"files.py", "metrics.py"}

    run, cache = growth_run
    clean, damaged = tmp_path / "clean", tmp_path / "damaged"
    for folder in (clean, damaged):
        shutil.copytree(run, folder)
    lines = (clean / "metrics.jsonl").read_text().splitlines()
    assert all(valid_row(json.loads(line), (2, 2)) is None for line in lines)  # every row andrea wrote passes
    with open(damaged / "metrics.jsonl", "a") as f:
        f.write("\n".join(DAMAGED_ROWS) + "\n")
    for reader, (_, drive) in READ_BY.items():
        want, _ = drive(clean, cache)
        got, note = drive(damaged, cache)
        assert got == want, reader
        if reader == "lab growth heads":
            for number in range(len(lines) + 1, len(lines) + len(DAMAGED_ROWS) + 1)[:3]:
                assert f"line {number}:" in note, note
            assert f"{len(DAMAGED_ROWS)} rows of" in note
