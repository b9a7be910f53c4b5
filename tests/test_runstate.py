"""andrea.runstate: its behaviour, and its promises under hostile input."""

import pytest
from helpers import (
    RUN_STATE_DAMAGE,
    audited_train_args,
    cli,
    copy_text_run,
    damaged_copy,
    one_sentence,
    read_meta,
    rewrite,
    snapshot,
    text_train_args,
)

# ---------------------------------------------------------------- hostile input


@pytest.mark.hostile
def test_damaged_optimizer_moments_are_refused_before_the_first_step(text_data, text_model_json, text_run, tmp_path, capsys):
    for what, damage in (("NaN", lambda t: t.fill_(float("nan"))), ("negative", lambda t: t.fill_(-1.0))):
        out = copy_text_run(text_run, tmp_path / what)
        rewrite(out / "latest.safetensors", tensors=lambda ts: damage(ts["optim.3.exp_avg_sq"]))
        before = snapshot(out)
        code, _, err = cli(capsys, *text_train_args(text_data, text_model_json, out, "--resume", steps=6))
        assert "exp_avg_sq" in one_sentence(code, err)
        assert snapshot(out) == before and "step\": 5" not in (out / "metrics.jsonl").read_text()

@pytest.mark.hostile
@pytest.mark.parametrize("case", list(RUN_STATE_DAMAGE))
def test_damaged_run_state_is_refused_before_work_starts(two_source_data, two_source_model_json, audited_run, tmp_path, capsys, case):
    """Each field of the curriculum's and the audit's saved state, damaged (wrong type, out of range,
    not finite, of the wrong length, against the run's sources): `train --resume` ends in one
    sentence that names the checkpoint and the field, exit 2, before a step, and the checkpoint is
    left as it was."""
    change, field = RUN_STATE_DAMAGE[case]
    out = damaged_copy(audited_run, tmp_path / "r", change)
    before = (out / "latest.safetensors").read_bytes()
    code, _, err = cli(capsys, *audited_train_args(two_source_data, two_source_model_json, out, "--resume", steps=8))
    line = one_sentence(code, err)
    assert str(out / "latest.safetensors") in line and repr(field) in line, line
    assert (out / "latest.safetensors").read_bytes() == before
    assert "step 5" not in (out / "metrics.jsonl").read_text()

@pytest.mark.hostile
def test_an_intact_run_state_resumes(two_source_data, two_source_model_json, audited_run, tmp_path, capsys):
    """The checks refuse no state a run wrote: the copy resumes to its end."""
    out = damaged_copy(audited_run, tmp_path / "r", lambda m: None)
    code, _, err = cli(capsys, *audited_train_args(two_source_data, two_source_model_json, out, "--resume", steps=8))
    assert code in (0, 3), err
    assert read_meta(out / "latest.safetensors")["step"] == 8
