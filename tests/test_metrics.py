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
    append_row(plain, {"step": 1})
    append_row(plain, {"step": 2})
    assert read_metrics(plain) == [{"step": 1}, {"step": 2}] and read_metrics(tmp_path / "none.jsonl") == []


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
