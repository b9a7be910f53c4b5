"""Training settings have one definition: the JSON config and `andrea train`'s flags accept the
same settings, with the same defaults and the same checks."""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import fields

import pytest
from helpers import cli, one_sentence, short_documents

from andrea.cli import build_parser
from andrea.errors import AndreaError
from andrea.trainconfig import AUDIT, CURRICULUM, SECTIONS, TrainConfig, add_arguments, apply_overrides, setting_flags


def train_parser() -> argparse.ArgumentParser:
    return build_parser()._subparsers._group_actions[0].choices["train"]


def setting_dests(parser) -> set[str]:
    return {a.dest for a in parser._actions} - {"help", "config", "resume", "no_progress", "func"}


def test_every_json_setting_has_a_flag_and_every_flag_a_json_setting():
    json_settings = {f.name for f in fields(TrainConfig) if f.name not in SECTIONS}
    json_settings |= {f"{s}_{k}" for s, keys in SECTIONS.items() for k in keys}
    assert setting_dests(train_parser()) == json_settings
    assert {"audit_enabled", "curriculum_C", "curriculum_reroll", "eval_windows", "compile", "fsdp"} <= json_settings


def test_flags_fill_the_same_config_as_json(tmp_path):
    p = argparse.ArgumentParser()
    add_arguments(p)
    args = p.parse_args(["--batch-size", "8", "--no-audit", "--audit-threshold", "12.5", "--curriculum-reroll", "2", "4",
                         "--sources", "a", '{"name": "b", "floor": 0.2}', "--compile", "--max-steps", "7"])
    from_flags = apply_overrides(TrainConfig(), **setting_flags(args))
    from_json = TrainConfig.from_dict({"batch_size": 8, "audit": {"enabled": False, "threshold": 12.5},
                                       "curriculum": {"reroll": [2, 4]}, "max_steps": 7, "compile": True,
                                       "sources": ["a", {"name": "b", "floor": 0.2}]})
    assert from_flags == from_json
    assert TrainConfig.from_dict(json.loads(json.dumps(from_json.to_dict()))) == from_json


def test_flags_left_out_keep_the_defaults():
    p = argparse.ArgumentParser()
    add_arguments(p)
    assert apply_overrides(TrainConfig(), **setting_flags(p.parse_args([]))) == TrainConfig()
    cfg = TrainConfig()
    assert cfg.audit == {k: s.default for k, s in AUDIT.items()}
    assert cfg.curriculum == {k: s.default for k, s in CURRICULUM.items()}


@pytest.mark.parametrize("argv, words", [
    (["--curriculum-reroll", "9", "3"], "curriculum.reroll"),
    (["--sources", "{bad json"], "not a source name or a JSON object"),
])
def test_bad_flags_fail_with_the_json_checks_wording(argv, words):
    p = argparse.ArgumentParser()
    add_arguments(p)
    with pytest.raises(AndreaError, match=words):
        apply_overrides(TrainConfig(), **setting_flags(p.parse_args(argv)))


@pytest.mark.parametrize("argv, key, value, flag_words, json_words", [
    (["--batch-size", "0"], "batch_size", 0, "an integer from 1 to 1,048,576", "batch_size must be an integer >= 1"),
    (["--lr", "nan"], "lr", float("nan"), "a number in (0, 1e+12]", "lr must be a positive number"),
    (["--audit-threshold", "120"], "audit", {"threshold": 120}, "a number in [0, 100]", "audit.threshold must be a number in 0..100"),
    (["--min-lr-ratio", "2"], "min_lr_ratio", 2, "a number in [0, 1]", "min_lr_ratio must be a number in 0..1"),
])
def test_a_numeric_settings_flag_reads_the_range_its_json_check_holds(argv, key, value, flag_words, json_words):
    """The flag is refused by the one parser of numbers within the setting's own range; the same
    value in a JSON config is refused by the setting's check."""
    p = argparse.ArgumentParser(exit_on_error=False)
    add_arguments(p)
    with pytest.raises(argparse.ArgumentError, match=re.escape(flag_words)):
        p.parse_args(argv)
    with pytest.raises(AndreaError, match=json_words):
        TrainConfig.from_dict({key: value})


@pytest.mark.parametrize("data, words", [
    ({"eval_windows": 0}, "eval_windows"),
    ({"compile": "yes"}, "compile must be true or false"),
    ({"preset": "andrea-9000"}, "preset must be one of"),
    ({"sources": "sotu"}, "sources must be a list"),
])
def test_bad_json_settings(data, words):
    with pytest.raises(AndreaError, match=words):
        TrainConfig.from_dict(data)


def test_a_run_needs_a_budget():
    with pytest.raises(AndreaError, match="max_steps or time_limit"):
        TrainConfig().for_model(256)
    assert TrainConfig(max_steps=1).for_model(128).seq_len == 128
    with pytest.raises(AndreaError, match="longer than the model's context"):
        TrainConfig(max_steps=1, seq_len=512).for_model(256)


# ---------------------------------------------------------------- hostile input


@pytest.mark.hostile
def test_audit_tokens_and_shard_tokens_are_bounded(two_source_data, two_source_model_json, small_tokenizer, tmp_path, capsys):
    """--audit-tokens 10^9 and prepare --shard-tokens 1 would run without end: refused at once."""
    line = one_sentence(*cli(capsys, "train", "--data", two_source_data, "--out", tmp_path / "o", "--model-config", two_source_model_json,
                             "--max-steps", "1", "--audit-tokens", str(10**9))[::2])
    assert "argument --audit-tokens: must be an integer from 1 to 10,000" in line
    src = tmp_path / "a.txt"
    src.write_text("\n\n".join(short_documents(4, 3)))
    line = one_sentence(*cli(capsys, "prepare", src, "--tokenizer", small_tokenizer, "--out", tmp_path / "d",
                             "--shard-tokens", "1", "--no-progress")[::2])
    assert "argument --shard-tokens: must be an integer from 1,000 to" in line
