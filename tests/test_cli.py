"""The `andrea` command's basics: params, presets, and the errors a user can cause."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

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
