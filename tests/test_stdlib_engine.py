"""The pure-Python engine against the torch model and HarrisTokenizer: ids, logits, greedy tokens."""

from __future__ import annotations

import math
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from andrea import stdlib_engine
from andrea.checkpoint import Checkpoint
from andrea.config import ModelConfig
from andrea.decoding.generate import TextGenerator, generate_ids
from andrea.formats import write_model
from andrea.model import ANDREA
from andrea.tokenizer.harris import HarrisTokenizer

ROOT = Path(__file__).resolve().parent.parent
SEGMENTS = [" the", "the", " cat", " sat", " on", " mat", "ing", " and", "er", " dog", "é", " été", "q", "ab", "abc", "  "]
TOKENIZER = HarrisTokenizer(SEGMENTS)


pytestmark = pytest.mark.usefixtures("one_thread")


def tiny_model(seed: int = 0, **changes) -> ANDREA:
    """A random model whose weights are large enough to use every activation's curved range."""
    torch.manual_seed(seed)
    cfg = ModelConfig(**{**dict(vocab_size=TOKENIZER.vocab_size, n_embd=32, n_head=2, n_layer=2, block_size=48), **changes})
    model = ANDREA(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * (0.2 if p.dim() == 2 else 0.1))
    return model


def to_json(model: ANDREA, path: Path) -> Path:
    ckpt = Checkpoint(model.config, model.state_dict(), None, {"step": 0, "tokenizer": TOKENIZER.to_dict()})
    write_model(ckpt, path, "json")
    return path


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40) | st.text(alphabet="ab céq'_1²\u0301 \n\t漢😀\ud800", max_size=40))
def test_engine_tokenizer_is_harris(text):
    tok = stdlib_engine.Tokenizer(SEGMENTS)
    ids = tok.encode(text)
    assert ids == TOKENIZER.encode(text)
    assert tok.encode(text, bos=False) == TOKENIZER.encode(text, bos=False)
    assert tok.decode(ids) == TOKENIZER.decode(ids) == text


def test_engine_decodes_bad_bytes_as_harris_does():
    ids = [0xE2, 0x82, 65, 0xFF, 0xED, 0xA0, 0x80]  # a cut-off character, a stray byte, a lone surrogate
    assert stdlib_engine.Tokenizer(SEGMENTS).decode(ids) == TOKENIZER.decode(ids)


@pytest.mark.parametrize("changes", [
    dict(),
    dict(act="gelu", norm="rmsnorm"),
    dict(act="relu", pos="rope"),
    dict(pos="sinusoidal", norm="rmsnorm"),
    dict(pos="none", act="gelu", n_head=4),
])
def test_engine_logits_match_the_torch_model(tmp_path, changes):
    model = tiny_model(**changes)
    m = stdlib_engine.Model.load(to_json(model, tmp_path / "m.json"))
    ids = TOKENIZER.encode("the cat sat on the mat; a dog q 12!")
    with torch.no_grad():
        want = model(torch.tensor([ids]))[0][0]
    got = torch.tensor(m.logits(ids), dtype=torch.float64)
    assert got.shape == want.shape
    assert (got - want.double()).abs().max().item() < 1e-4
    assert want.std().item() > 0.5  # logits far apart enough that a wrong layer would show


@pytest.mark.parametrize("block_size, n_new", [(48, 20), (12, 30)])
def test_engine_greedy_tokens_match_generate(tmp_path, block_size, n_new):
    # block_size 12: the window slides several times, as andrea.decoding.generate slides it
    model = tiny_model(1, block_size=block_size)
    m = stdlib_engine.Model.load(to_json(model, tmp_path / "m.json"))
    prompt = TOKENIZER.encode("the dog and the cat")
    want = generate_ids(model, prompt, n_new, greedy=True, stop_at_bos=False)
    got = m.generate(prompt, n_new, temperature=0, stop_at_bos=False)
    assert len(got) == n_new and got == want


def test_engine_sampling_is_seeded_and_follows_the_distribution():
    rng = random.Random(0)
    logits = [0.0, math.log(2), math.log(3), math.log(4)]
    counts = Counter(stdlib_engine.sample(logits, 1.0, None, rng) for _ in range(4000))
    for i, p in enumerate([0.1, 0.2, 0.3, 0.4]):
        assert abs(counts[i] / 4000 - p) < 0.03
    top2 = Counter(stdlib_engine.sample(logits, 1.0, 2, rng) for _ in range(2000))
    assert set(top2) == {2, 3} and abs(top2[3] / 2000 - 4 / 7) < 0.04
    assert stdlib_engine.sample(logits, 0.0, None, rng) == 3
    hot = Counter(stdlib_engine.sample(logits, 100.0, None, rng) for _ in range(4000))
    assert all(abs(hot[i] / 4000 - 0.25) < 0.03 for i in range(4))


def test_engine_generation_with_a_seed_repeats(tmp_path):
    m = stdlib_engine.Model.load(to_json(tiny_model(2), tmp_path / "m.json"))
    prompt = TOKENIZER.encode("the")
    a = m.generate(prompt, 15, temperature=1.0, top_k=5, seed=3, stop_at_bos=False)
    assert a == m.generate(prompt, 15, temperature=1.0, top_k=5, seed=3, stop_at_bos=False)
    assert a != m.generate(prompt, 15, temperature=1.0, top_k=5, seed=4, stop_at_bos=False)


def test_engine_file_runs_alone_without_torch_or_numpy(tmp_path):
    model = tiny_model(3)
    to_json(model, tmp_path / "m.json")
    (tmp_path / "stdlib_engine.py").write_bytes((ROOT / "andrea" / "stdlib_engine.py").read_bytes())
    code = ("import sys, runpy\n"
            "sys.argv = ['stdlib_engine.py', 'm.json', '--prompt', 'the cat', '--greedy', '--max-new-tokens', '12']\n"
            "try:\n    runpy.run_path('stdlib_engine.py', run_name='__main__')\n"
            "finally:\n    assert 'torch' not in sys.modules and 'numpy' not in sys.modules and 'andrea' not in sys.modules\n")
    out = subprocess.run([sys.executable, "-I", "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    want = TextGenerator(model, TOKENIZER).generate("the cat", max_new_tokens=12, greedy=True)
    assert out.stdout == want + "\n"


def test_engine_module_command_and_its_errors(tmp_path):
    to_json(tiny_model(4), tmp_path / "m.json")
    ok = subprocess.run([sys.executable, "-m", "andrea.stdlib_engine", str(tmp_path / "m.json"), "--prompt", "the",
                         "--max-new-tokens", "5", "--seed", "1", "--top-k", "3"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0 and ok.stdout.endswith("\n"), ok.stderr


@pytest.mark.parametrize("content, words", [('{"format": "andrea-json", "config": {"vocab_size": 300}}', "must be a positive integer"),
                                            (None, "cannot read")], ids=["bad-config", "missing"])
def test_engine_load_errors(tmp_path, content, words):
    path = tmp_path / "m.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(stdlib_engine.EngineError, match=words):
        stdlib_engine.Model.load(path)


def test_engine_main_reports_one_sentence(tmp_path, capsys):
    (tmp_path / "bad.json").write_text("[1, 2")
    assert stdlib_engine.main([str(tmp_path / "bad.json"), "--prompt", "x"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("engine: error: ") and err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize("segments", [None, 257, [["the"]], ["the", 5], ["the", ""], ["the", "the"]],
                         ids=["null", "number", "nested", "mixed", "empty", "twice"])
def test_engine_refuses_a_tokenizer_whose_segments_are_not_distinct_strings(tmp_path, segments):
    import json

    to_json(tiny_model(4), tmp_path / "m.json")
    doc = json.loads((tmp_path / "m.json").read_text())
    doc["tokenizer"]["segments"] = segments
    (tmp_path / "m.json").write_text(json.dumps(doc))
    with pytest.raises(stdlib_engine.EngineError, match="segments are not a list of distinct, non-empty strings"):
        stdlib_engine.Model.load(tmp_path / "m.json")
