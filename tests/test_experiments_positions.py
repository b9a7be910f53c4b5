"""The positions experiment: end to end on a tiny budget, its measurements, and its errors."""

from __future__ import annotations

import json
import random
from pathlib import Path

import matplotlib.image
import pytest
import torch

from andrea.cli import main
from andrea.config import ModelConfig
from andrea.errors import AndreaError
from andrea.evaluate import token_byte_lengths
from andrea.experiments.positions import (
    SCHEMES,
    PositionsExperiment,
    default_data_dir,
    eval_windows,
    measure,
    run_positions_experiment,
)
from andrea.model import ANDREA
from andrea.prepare import prepare
from andrea.shards import TokenData
from andrea.tokenizer.train import train_tokenizer

WORDS = "the cat sat on a mat and the dog ran to its pet while kings and queens talked of old things".split()


def text(seed: int, n_docs: int, words_per_doc: int = 300) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(words_per_doc)).capitalize() + "." for _ in range(n_docs)]


@pytest.fixture(scope="module")
def positions_data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("positions")
    (root / "alpha.txt").write_text("\n\n".join(text(1, 60)))
    tok = train_tokenizer(text(2, 20), 20)
    prepare(tok, [str(root / "alpha.txt")], root / "data", log=lambda *a: None)
    return root / "data"


def tiny(positions_data: Path) -> PositionsExperiment:
    V = TokenData(positions_data).vocab_size
    return PositionsExperiment(data_dir=positions_data, out_dir=positions_data.parent / "out", steps=3, seq_len=8, batch_size=4,
                               eval_windows=4, base=ModelConfig(vocab_size=V, n_embd=16, n_head=2, n_layer=1))


def test_runs_end_to_end_on_a_tiny_budget(positions_data, tmp_path):
    exp = tiny(positions_data)
    exp.out_dir = tmp_path / "out"
    result = run_positions_experiment(exp, log=lambda *a: None, progress=False)
    rows = result["summary"]["rows"]
    assert [r["scheme"] for r in rows] == list(SCHEMES)
    for r in rows:
        for key in ("val_bpb", "shuffled_bpb", "beyond_bpb"):
            assert 0 < r[key] < 20
        assert len(r["loss_by_position"]) == 16  # windows of 2S
        assert Path(r["checkpoint"]).exists()
    # only learned carries a position table: 2S × d more parameters than the others
    params = {r["scheme"]: r["params"] for r in rows}
    assert params["learned"] - params["rope"] == 16 * 16
    assert params["sinusoidal"] == params["rope"] == params["none"]
    md = (tmp_path / "out" / "positions.md").read_text()
    for s in SCHEMES:
        assert f"| {s} |" in md
    assert "†" in md and "no training step reached" in md
    assert json.loads((tmp_path / "out" / "positions.json").read_text())["settings"]["seq_len"] == 8
    png = tmp_path / "out" / "positions.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    img = matplotlib.image.imread(png)
    assert img.shape[0] > 200 and img.shape[1] > 200
    # a second run into the same folder is refused rather than mixed with the first
    with pytest.raises(AndreaError, match="already holds a run"):
        run_positions_experiment(exp, log=lambda *a: None, progress=False)


def test_within_length_positions_of_a_long_window_equal_a_short_window(positions_data):
    """The model is causal: positions 0..S-1 of a 2S window see exactly what an S window sees."""
    exp = tiny(positions_data)
    data = TokenData(positions_data)
    w = eval_windows(data, exp.seq_len, 4, seed=0)
    torch.manual_seed(0)
    model = ANDREA(exp.config(data.vocab_size, "rope")).eval()
    byte_len = token_byte_lengths(data.load_tokenizer(), data.vocab_size)
    m = measure(model, w, exp.seq_len, byte_len)
    S = exp.seq_len
    with torch.no_grad():
        logits, _ = model(w["x"][:, :S])
    nats = torch.nn.functional.cross_entropy(logits.flatten(0, 1), w["y"][:, :S].flatten(), reduction="sum").item()
    nbytes = byte_len[w["y"][:, :S]].sum().item()
    assert m["val_bpb"] == pytest.approx(nats / (nbytes * 0.6931471805599453), rel=1e-5)


def test_shuffled_windows_are_permutations_of_the_same_text(positions_data):
    data = TokenData(positions_data)
    w = eval_windows(data, 8, 4, seed=5)
    original = torch.cat([w["x"][:, :1], w["y"]], dim=1)[:, :9]
    shuffled = torch.cat([w["shuffled_x"][:, :1], w["shuffled_y"]], dim=1)
    assert torch.equal(original.sort(dim=1).values, shuffled.sort(dim=1).values)
    assert not torch.equal(original, shuffled)
    again = eval_windows(data, 8, 4, seed=5)
    assert torch.equal(again["shuffled_x"], w["shuffled_x"])  # one fixed order, the same for every model


def test_the_default_data_is_the_newest_prepared_folder(positions_data, tmp_path, monkeypatch):
    monkeypatch.setenv("ANDREA_CACHE", str(tmp_path / "cache"))
    with pytest.raises(AndreaError, match="andrea main"):
        default_data_dir()
    target = tmp_path / "cache" / "shards" / "abc"
    target.mkdir(parents=True)
    (target / "manifest.json").write_text("{}")
    assert default_data_dir() == target


def test_bad_settings_are_one_sentence(positions_data, tmp_path, capsys):
    code = main(["experiment", "positions", "--data", str(positions_data), "--out", str(tmp_path / "o"), "--steps", "0"])
    err = capsys.readouterr().err
    assert code == 2 and "argument --steps: must be an integer from 1 to" in err
    code = main(["experiment", "positions", "--data", str(tmp_path / "missing"), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and "andrea prepare" in err and "Traceback" not in err


def test_cli_runs_on_a_tiny_budget(positions_data, tmp_path, capsys):
    code = main(["experiment", "positions", "--data", str(positions_data), "--out", str(tmp_path / "o"), "--steps", "2",
                 "--seq-len", "8", "--batch-size", "2", "--no-progress"])
    out = capsys.readouterr().out
    assert code == 0
    assert "| learned |" in out and "| none |" in out and "picture:" in out
    assert (tmp_path / "o" / "positions.png").exists()
