"""The `andrea` command's basics: params, presets, and the errors a user can cause."""

import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import DEEP, LONG_INT, cli, one_sentence, text_train_args

from andrea.cli import main
from andrea.config import PRESETS, ModelConfig, count_params

ROOT = Path(__file__).resolve().parent.parent


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def table_counts(out):
    """name -> count from the rows of `andrea params`."""
    counts = {}
    for line in out.splitlines():
        m = re.match(r"^(\S.*?)\s{2,}.*?([\d,]+)\s+[\d.]+%$", line)
        if m:
            counts[m.group(1)] = int(m.group(2).replace(",", ""))
    return counts


def assert_one_sentence_error(code, out, err):
    assert code == 2
    assert out == ""
    assert "Traceback" not in err
    assert err.count("\n") == 1 and err.startswith("andrea: error: ") and err.rstrip().endswith(".")


def test_params_andrea_120m_text(capsys):
    code, out, err = run(capsys, "params", "--preset", "andrea-120m")
    assert code == 0 and err == ""
    lines = {line.split("  ")[0]: line for line in out.splitlines()}
    assert "8,449 × 768" in lines["token embedding (wte)"] and "6,488,832" in lines["token embedding (wte)"]
    assert "1,024 × 768" in lines["position embedding (wpe)"] and "786,432" in lines["position embedding (wpe)"]
    counts = table_counts(out)
    assert counts["token embedding (wte)"] == 6_488_832
    assert counts["position embedding (wpe)"] == 786_432
    assert counts["embedding layer (wte + wpe)"] == 7_275_264
    assert counts["total"] == 98_737_152


def test_params_andrea_120m_json(capsys):
    code, out, _ = run(capsys, "params", "--preset", "andrea-120m", "--json")
    assert code == 0
    data = json.loads(out)
    counts = {r["name"]: r["count"] for r in data["rows"]}
    assert counts["token embedding (wte)"] == 6_488_832
    assert counts["position embedding (wpe)"] == 786_432
    assert counts["embedding layer (wte + wpe)"] == 7_275_264
    assert counts["total"] == 98_737_152
    assert data["config"] == PRESETS["andrea-120m"].to_dict()
    assert data["rows"][-1]["share"] == 1.0


@pytest.mark.parametrize("name, total", [("andrea-12m", 12_790_272), ("andrea-480m", 480_614_400)])
def test_params_family_totals(capsys, name, total):
    assert table_counts(run(capsys, "params", "--preset", name)[1])["total"] == total
    data = json.loads(run(capsys, "params", "--preset", name, "--json")[1])
    assert data["rows"][-1]["count"] == total


def test_params_defaults_to_andrea_12m(capsys):
    assert table_counts(run(capsys, "params")[1])["total"] == 12_790_272


def test_presets_lists_every_preset_with_its_total(capsys):
    code, out, _ = run(capsys, "presets")
    assert code == 0
    for name, cfg in PRESETS.items():
        (line,) = [line for line in out.splitlines() if line.split()[0] == name]
        assert line.endswith(f"{count_params(cfg):,}")
    data = json.loads(run(capsys, "presets", "--json")[1])
    assert {name: d["params"] for name, d in data.items()} == {n: count_params(c) for n, c in PRESETS.items()}


def test_params_reads_a_config_file(capsys, tmp_path):
    cfg = ModelConfig(vocab_size=300, n_embd=48, n_head=4, n_layer=3, block_size=64, pos="rope", norm="rmsnorm")
    path = tmp_path / "model.json"
    cfg.save(path)
    code, out, _ = run(capsys, "params", "--config", str(path))
    assert code == 0
    counts = table_counts(out)
    assert counts["total"] == count_params(cfg)
    assert counts["position embedding (wpe)"] == 0


def test_unknown_preset_lists_the_known_ones(capsys):
    code, out, err = run(capsys, "params", "--preset", "nope")
    assert_one_sentence_error(code, out, err)
    assert "nope" in err
    for name in PRESETS:
        assert name in err


@pytest.mark.parametrize("content, expected", [
    (None, "does not exist"),
    ("{not json", "not valid JSON"),
    ('{"n_embd": 64, "dropout": 0.1}', "dropout"),
    ('{"n_embd": 100, "n_head": 3}', "divisible"),
    ('[1, 2]', "JSON object"),
    ('{"pos": "alibi"}', "alibi"),
], ids=["missing", "invalid-json", "unknown-field", "indivisible", "not-an-object", "unknown-pos"])
def test_bad_config_file_is_one_sentence_and_exit_2(capsys, tmp_path, content, expected):
    path = tmp_path / "model.json"
    if content is not None:
        path.write_text(content)
    code, out, err = run(capsys, "params", "--config", str(path))
    assert_one_sentence_error(code, out, err)
    assert expected in err


def test_preset_and_config_together_are_refused(capsys, tmp_path):
    path = tmp_path / "model.json"
    PRESETS["andrea-tiny"].save(path)
    assert_one_sentence_error(*run(capsys, "params", "--preset", "andrea-tiny", "--config", str(path)))


def test_the_module_entry_point_prints_no_traceback():
    proc = subprocess.run([sys.executable, "-m", "andrea", "params", "--preset", "nope"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "andrea-12m" in proc.stderr and proc.stdout == ""


# ---------------------------------------------------------------- hostile input


@pytest.mark.hostile
@pytest.mark.parametrize("args, words", [
    (["generate", "--seed", str(2**70), "--prompt", "x"], "--seed: must be an integer from 0 to 18,446,744,073,709,551,615"),
    (["generate", "--seed", "-1", "--prompt", "x"], "--seed: must be an integer from 0 to 18,446,744,073,709,551,615"),
    (["train", "--seed", str(10**30)], "--seed: must be an integer from 0 to 18,446,744,073,709,551,615"),
    (["train", "--batch-size", str(10**30)], "--batch-size: must be an integer from 1 to 1,048,576"),
    (["train", "--micro-batch", str(2**64)], "--micro-batch: must be an integer from 1 to"),
    (["experiment", "positions", "--lr", "nan"], "--lr: must be a number in (0, 10]"),
    (["experiment", "positions", "--lr", "inf"], "--lr: must be a number in (0, 10]"),
    (["experiment", "positions", "--seed", str(2**64)], "--seed: must be an integer from 0 to"),
    (["experiment", "positions", "--batch-size", str(10**20)], "--batch-size: must be an integer from 1 to 65,536"),
])
def test_numbers_out_of_range_are_one_sentence(text_data, text_model_json, text_run, tmp_path, capsys, args, words):
    """Each is refused by its flag's own range (andrea.validate.flag_number), before any work
    (tests/test_cli_flags.py drives every flag)."""
    if args[0] == "generate":
        args = [*args, "--checkpoint", str(text_run)]
    elif args[0] == "train":
        args = [*text_train_args(text_data, text_model_json, tmp_path / "r"), *args[1:]]
    else:
        args = [*args, "--data", str(text_data), "--out", str(tmp_path / "x")]
    code, _, err = cli(capsys, *args)
    assert f"argument {words}" in one_sentence(code, err)


@pytest.mark.hostile
@pytest.mark.parametrize("bad", ["long", "deep"])
def test_configs_models_and_manifests_with_python_limits_end_in_one_sentence(two_source_data, audited_run, tmp_path, capsys, bad):
    """A model config, a training config, a data manifest, a JSON model (andrea and the pure-Python
    engine) and a --sources item holding a 5,000-digit number or nesting 100,000 deep."""
    value = LONG_INT if bad == "long" else DEEP
    model_cfg = tmp_path / "model.json"
    model_cfg.write_text('{"n_layer":\n' + value + "}")
    train_cfg = tmp_path / "train.json"
    train_cfg.write_text('{"max_steps":\n' + value + "}")
    data = tmp_path / "data"
    data.mkdir()
    (data / "manifest.json").write_text('{"format": "andrea-shards",\n "version": ' + value + "}")
    model = tmp_path / "m.json"
    model.write_text('{"format": "andrea-json", "version": 1,\n "step": ' + value + "}")
    for args, name in ((["params", "--config", model_cfg], "model.json"),
                       (["train", "--config", train_cfg, "--out", tmp_path / "o"], "train.json"),
                       (["train", "--data", data, "--out", tmp_path / "o2", "--max-steps", "1"], "manifest.json"),
                       (["convert", model, tmp_path / "c.safetensors"], "m.json"),
                       (["train", "--data", two_source_data, "--out", tmp_path / "o3", "--max-steps", "1",
                         "--sources", '{"name": "north", "floor": ' + value + "}"], "--sources item")):
        line = one_sentence(*cli(capsys, *args)[::2])
        assert name in line and ("line 2" in line or name == "--sources item"), line
    engine = subprocess.run([sys.executable, str(ROOT / "andrea" / "stdlib_engine.py"), str(model)], capture_output=True,
                            text=True, timeout=60)
    assert engine.returncode == 2 and "Traceback" not in engine.stderr, engine.stderr[-2000:]
    assert engine.stderr.count("\n") == 1 and "m.json" in engine.stderr and "line 2" in engine.stderr

@pytest.mark.hostile
def test_names_and_words_that_are_not_utf8_print_under_a_strict_utf8_stdout(prepared_root, tmp_path, monkeypatch):
    """A file name with the byte 0xE9 (Latin-1) reaches Python as a lone surrogate, which a strict
    UTF-8 stdout (PYTHONIOENCODING=utf-8:strict) refuses: the output escapes it instead of ending
    in a traceback; so does a word given on the command line with such a byte."""

    name = os.fsdecode(b"caf\xe9.txt")
    shutil.copy(prepared_root / "text.txt", tmp_path / name)
    for args, shown in ((["prepare", tmp_path / name, "--tokenizer", prepared_root / "tok", "--out", tmp_path / "d", "--no-progress"],
                         b"caf\\udce9"),
                        (["embed", "neighbors", "--preset", "andrea-tiny", "--tokenizer", prepared_root / "tok", os.fsdecode(b"caf\xe9")],
                         b"caf\\udce9")):
        raw = io.BytesIO()
        stdout = io.TextIOWrapper(raw, encoding="utf-8", errors="strict", write_through=True)
        monkeypatch.setattr(sys, "stdout", stdout)
        assert main([str(a) for a in args]) == 0
        stdout.flush()
        assert shown in raw.getvalue(), raw.getvalue()[-300:]
        raw.getvalue().decode("utf-8")  # what was written is UTF-8
