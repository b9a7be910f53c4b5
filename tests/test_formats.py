"""Model formats: .bin, JSON and Hugging Face round trips, release layouts, malformed files."""

from __future__ import annotations

import functools
import json
import math
import os
import random
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import ROOT, cli, one_sentence
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file

from andrea.checkpoint import load_checkpoint, save_checkpoint
from andrea.cli import main
from andrea.config import ModelConfig
from andrea.errors import AndreaError
from andrea.formats import adam_moments, convert, detect_format, read_model
from andrea.formats.bin import read_bin
from andrea.formats.hf import read_hf, tokenizers_json
from andrea.formats.portable import read_json
from andrea.model import ANDREA
from andrea.optim import make_optimizer
from andrea.prepare import prepare
from andrea.tokenizer.harris import HarrisTokenizer
from andrea.tokenizer.train import train_tokenizer
from andrea.trainconfig import TrainConfig

SEGMENTS = [" the", "the", " cat", " sat", " on", " mat", "ing", " and", "er", " dog", "é", " été", "q"]
# the .bin order of the specification, written out here rather than taken from the model
SPEC_LAYER = ["ln_1.weight", "ln_1.bias", "attn.wq.weight", "attn.wk.weight", "attn.wv.weight", "attn.wo.weight",
              "ln_2.weight", "ln_2.bias", "mlp.fc1.weight", "mlp.fc2.weight"]


pytestmark = pytest.mark.usefixtures("one_thread")


def spec_order(cfg: ModelConfig) -> list[str]:
    names = ["wte.weight"] + (["wpe.weight"] if cfg.pos == "learned" else [])
    for i in range(cfg.n_layer):
        names += [f"h.{i}.{n}" for n in SPEC_LAYER if cfg.norm == "layernorm" or not n.endswith("bias")]
    return names + ["ln_f.weight"] + (["ln_f.bias"] if cfg.norm == "layernorm" else []) + ["lm_head.weight"]


def tokenizer() -> HarrisTokenizer:
    return HarrisTokenizer(SEGMENTS)


def tiny_config(**changes) -> ModelConfig:
    return ModelConfig(**{**dict(vocab_size=257 + len(SEGMENTS), n_embd=32, n_head=2, n_layer=2, block_size=48), **changes})


def trained_checkpoint(path: Path, recipe: str = "v2", steps: int = 3, **changes) -> Path:
    """A native checkpoint after a few optimizer steps, so Adam's m and v are not zero."""
    torch.manual_seed(0)
    cfg = tiny_config(**changes)
    model = ANDREA(cfg)
    opt = make_optimizer(model, recipe)
    x = torch.randint(0, cfg.vocab_size, (2, 17))
    for _ in range(steps):
        _, loss = model(x[:, :-1], x[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad()
    return save_checkpoint(path, cfg, model.state_dict(), opt.state_dict(),
                           {"step": steps, "tokenizer": tokenizer().to_dict()})


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_sentence_error(code, out, err):
    assert code == 2, (out, err)
    assert "Traceback" not in out + err
    assert err.count("\n") == 1 and err.startswith("andrea: error: ") and err.rstrip().endswith("."), err


def assert_same_weights(a: dict, b: dict):
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k


def write_release_bin(path: Path, step: int, tensors: list[torch.Tensor], moments: bool = True) -> np.ndarray:
    """A .bin written by hand: header, then the given tensors flattened, then m and v."""
    w = np.concatenate([t.detach().reshape(-1).numpy() for t in tensors]).astype("<f4")
    m = np.linspace(-1, 1, w.size, dtype="<f4") if moments else np.zeros_like(w)
    v = np.linspace(0, 2, w.size, dtype="<f4") if moments else np.zeros_like(w)
    path.write_bytes(struct.pack("<ii", step, w.size) + w.tobytes() + m.tobytes() + v.tobytes())
    return w


# ---------------------------------------------------------------- .bin


@pytest.mark.parametrize("recipe", ["v1", "v2"])
def test_native_bin_native_is_bitwise_with_optimizer_state(tmp_path, recipe):
    src = trained_checkpoint(tmp_path / "a.safetensors", recipe)
    convert(src, tmp_path / "a.bin", "bin")
    tokenizer().save(tmp_path / "tok")  # a lone .bin holds no tokenizer: its segments come alongside
    convert(tmp_path / "a.bin", tmp_path / "b.safetensors", "native", config=tiny_config(),
            segments=tmp_path / "tok" / "harris_segments.json", recipe=recipe)
    a, b = load_checkpoint(src), load_checkpoint(tmp_path / "b.safetensors")
    assert b.config == a.config and b.step == a.step == 3
    assert_same_weights(a.model_state, b.model_state)
    ma, mb = adam_moments(a.config, a.optim_state), adam_moments(b.config, b.optim_state)
    assert any(bool(m.abs().sum() > 0) for m, _ in ma.values())
    for name in ma:
        assert torch.equal(ma[name][0], mb[name][0]) and torch.equal(ma[name][1], mb[name][1]), name
    # the optimizer state is the trainer's own: same groups, same index per parameter, same step
    assert [g["params"] for g in a.optim_state["param_groups"]] == [g["params"] for g in b.optim_state["param_groups"]]
    for idx, per in a.optim_state["state"].items():
        assert torch.equal(per["exp_avg"], b.optim_state["state"][idx]["exp_avg"])
        assert torch.equal(per["step"], b.optim_state["state"][idx]["step"])
    assert b.tokenizer_dict["segments"] == SEGMENTS
    # and back again: the bytes of the .bin are the same
    convert(tmp_path / "b.safetensors", tmp_path / "b.bin", "bin")
    assert (tmp_path / "a.bin").read_bytes() == (tmp_path / "b.bin").read_bytes()


def test_bin_follows_the_specification_byte_for_byte(tmp_path):
    src = trained_checkpoint(tmp_path / "a.safetensors", "v1")
    ckpt = load_checkpoint(src)
    convert(src, tmp_path / "a.bin", "bin")
    data = (tmp_path / "a.bin").read_bytes()
    step, n = struct.unpack("<ii", data[:8])
    names = spec_order(ckpt.config)
    assert step == 3 and n == sum(ckpt.model_state[k].numel() for k in names)
    assert len(data) == 8 + 12 * n
    body = np.frombuffer(data[8:], dtype="<f4")
    want_w = np.concatenate([ckpt.model_state[k].reshape(-1).numpy() for k in names])
    moments = adam_moments(ckpt.config, ckpt.optim_state)
    want_m = np.concatenate([moments[k][0].reshape(-1).numpy() for k in names])
    want_v = np.concatenate([moments[k][1].reshape(-1).numpy() for k in names])
    assert np.array_equal(body[:n], want_w) and np.array_equal(body[n : 2 * n], want_m) and np.array_equal(body[2 * n :], want_v)
    # Adam's exp_avg of recipe v1 (one group, model order) is what sits in the m block
    assert torch.equal(ckpt.optim_state["state"][0]["exp_avg"].reshape(-1), torch.from_numpy(body[n : n + ckpt.model_state["wte.weight"].numel()].copy()))


def test_bin_without_optimizer_state_gets_zero_moments(tmp_path):
    cfg = tiny_config(norm="rmsnorm", pos="rope")
    torch.manual_seed(1)
    path = save_checkpoint(tmp_path / "a.safetensors", cfg, ANDREA(cfg).state_dict(), None, {"step": 7})
    fmt, notes = convert(path, tmp_path / "a.bin", "bin")
    assert fmt == "native" and any("zeros" in n for n in notes)
    data = (tmp_path / "a.bin").read_bytes()
    step, n = struct.unpack("<ii", data[:8])
    assert step == 7 and n == sum(t.numel() for t in load_checkpoint(path).model_state.values())
    assert not np.frombuffer(data[8 + 4 * n :], dtype="<f4").any()


def test_converted_bin_resumes_training(tmp_path, capsys):
    from andrea.train import train

    rng = random.Random(0)
    words = "the cat sat on a mat and the dog ran to its pet while kings talked of old things".split()
    text = "\n\n".join(" ".join(rng.choice(words) for _ in range(300)) for _ in range(20))
    (tmp_path / "a.txt").write_text(text)
    tok = train_tokenizer([text], 20)
    tok.save(tmp_path / "tok")
    prepare(tok, [str(tmp_path / "a.txt")], tmp_path / "data", log=lambda *a: None)
    cfg = tiny_config(vocab_size=tok.vocab_size, n_layer=1, block_size=32)
    cfg.save(tmp_path / "cfg.json")
    opts = dict(recipe="v1", batch_size=4, micro_batch=4, seq_len=32, eval_every=100, checkpoint_every=100,
                eval_windows=1, seed=7)
    train(cfg, TrainConfig(**opts, max_steps=3), tmp_path / "data", tmp_path / "a", log=lambda *a: None, progress=False)
    assert run(capsys, "convert", tmp_path / "a" / "latest.safetensors", tmp_path / "rel", "--to", "bin")[0] == 0
    code, out, err = run(capsys, "convert", tmp_path / "rel", tmp_path / "b" / "latest.safetensors")
    assert code == 0 and "andrea train --resume" in out, err
    before = load_checkpoint(tmp_path / "b" / "latest.safetensors")
    assert_same_weights(load_checkpoint(tmp_path / "a" / "latest.safetensors").model_state, before.model_state)
    result = train(cfg, TrainConfig(**opts, max_steps=5), tmp_path / "data", tmp_path / "b", resume=True,
                   log=lambda *a: None, progress=False)
    assert result.step == 5
    rows = [json.loads(line) for line in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r and "eval" not in r] == [4, 5]
    after = load_checkpoint(tmp_path / "b" / "latest.safetensors")
    assert after.optim_state["state"][0]["step"].item() == 5.0


# ---------------------------------------------------------------- releases that differ from our layout


def test_release_with_weight_only_norms_reads_as_rmsnorm(tmp_path):
    torch.manual_seed(2)
    rms = ANDREA(tiny_config(norm="rmsnorm"))
    for p in rms.parameters():  # norm weights other than 1, so a misplaced one would show
        p.data.add_(torch.randn_like(p) * 0.1)
    state = rms.state_dict()
    write_release_bin(tmp_path / "r.bin", 11, [state[k] for k in spec_order(rms.config)])
    ckpt, notes = read_bin(tmp_path / "r.bin", tiny_config(norm="layernorm"))
    assert ckpt.config.norm == "rmsnorm" and ckpt.step == 11
    assert "weight only" in notes[0] and "read as rmsnorm" in notes[0]
    assert_same_weights(state, ckpt.model_state)


def test_release_without_norm_parameters_gets_unit_norms(tmp_path, capsys):
    torch.manual_seed(3)
    cfg = tiny_config()
    model = ANDREA(cfg)
    state = model.state_dict()
    kept = [k for k in spec_order(cfg) if ".ln_" not in k and not k.startswith("ln_f")]
    write_release_bin(tmp_path / "r.bin", 5, [state[k] for k in kept])
    cfg.save(tmp_path / "cfg.json")
    code, out, err = run(capsys, "convert", tmp_path / "r.bin", tmp_path / "r.safetensors", "--config", tmp_path / "cfg.json")
    assert code == 0, err
    assert "holds none" in out and "unit weights and zero biases" in out
    ckpt = load_checkpoint(tmp_path / "r.safetensors")
    for k, t in ckpt.model_state.items():
        if ".ln_" in k or k.startswith("ln_f"):
            assert torch.equal(t, torch.ones_like(t) if k.endswith("weight") else torch.zeros_like(t)), k
        else:
            assert torch.equal(t, state[k]), k


def train_bytes_model(cfg: ModelConfig, steps: int = 60) -> ANDREA:
    """A model that has learned a little English, byte by byte."""
    torch.manual_seed(4)
    text = ("A small model learns which letters follow which: after a space comes a new word, after q comes u, and "
            "the most common words in English are short ones like the, and, of, to, in and is. ") * 4
    data = torch.tensor(list(text.encode()))
    model = ANDREA(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    T = cfg.block_size
    for _ in range(steps):
        starts = torch.randint(0, len(data) - T - 1, (8,))
        x = torch.stack([data[s : s + T + 1] for s in starts])
        _, loss = model(x[:, :-1], x[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad()
    return model.eval()


@pytest.mark.parametrize("linear_in_out, tables_by_column", [(False, False), (True, False), (True, True)])
def test_release_orientation_is_found_from_a_trained_model(tmp_path, linear_in_out, tables_by_column):
    cfg = ModelConfig(vocab_size=257, n_embd=32, n_head=2, n_layer=1, block_size=64)
    state = train_bytes_model(cfg).state_dict()
    stored = []
    for k in spec_order(cfg):
        t = state[k]
        table = k in ("wte.weight", "wpe.weight")
        if t.dim() == 2 and (tables_by_column if table else linear_in_out):
            t = t.T
        stored.append(t)
    write_release_bin(tmp_path / "r.bin", 60, stored)
    ckpt, notes = read_bin(tmp_path / "r.bin", cfg)
    assert_same_weights(state, ckpt.model_state)
    note = notes[1]
    assert note.startswith("layout found:")
    assert ("[in][out]" in note) == linear_in_out and ("one column per token" in note) == tables_by_column
    assert "square matrices" in note


def test_untrained_release_orientation_is_assumed_and_said(tmp_path):
    cfg = tiny_config()
    torch.manual_seed(5)
    state = ANDREA(cfg).state_dict()
    write_release_bin(tmp_path / "r.bin", 0, [state[k] for k in spec_order(cfg)])
    ckpt, notes = read_bin(tmp_path / "r.bin", cfg, tokenizer=tokenizer().to_dict())
    assert notes[1].startswith("layout assumed:") and "--orientation in-out" in notes[1]
    assert_same_weights(state, ckpt.model_state)
    # told explicitly, the matrices are read transposed
    ckpt, notes = read_bin(tmp_path / "r.bin", cfg, orientation="in-out")
    assert torch.equal(ckpt.model_state["h.0.attn.wq.weight"], state["h.0.attn.wq.weight"].T)
    assert "[in][out]" in notes[1]


def test_release_folder_is_read_with_its_config_and_segments(tmp_path, capsys):
    src = trained_checkpoint(tmp_path / "a.safetensors")
    code, out, _ = run(capsys, "convert", src, tmp_path / "release", "--to", "bin")
    assert code == 0
    assert sorted(p.name for p in (tmp_path / "release").iterdir()) == ["config.json", "harris_segments.json", "model.bin", "tokenizer.json"]
    assert json.loads((tmp_path / "release" / "harris_segments.json").read_text()) == SEGMENTS
    code, out, err = run(capsys, "convert", tmp_path / "release", tmp_path / "b.safetensors", "--recipe", "v2")
    assert code == 0, err
    assert "ANDREA .bin" in out and "layernorm with weight and bias" in out
    b = load_checkpoint(tmp_path / "b.safetensors")
    assert_same_weights(load_checkpoint(src).model_state, b.model_state)
    assert b.tokenizer_dict["segments"] == SEGMENTS


# ---------------------------------------------------------------- JSON


def test_native_json_native_is_bitwise(tmp_path):
    src = trained_checkpoint(tmp_path / "a.safetensors", act="gelu", norm="rmsnorm", pos="sinusoidal")
    fmt, notes = convert(src, tmp_path / "m.json", "json")
    assert any("no optimizer state" in n for n in notes)
    convert(tmp_path / "m.json", tmp_path / "b.safetensors", "native")
    a, b = load_checkpoint(src), load_checkpoint(tmp_path / "b.safetensors")
    assert b.config == a.config and b.step == a.step
    assert_same_weights(a.model_state, b.model_state)
    assert b.tokenizer_dict == a.tokenizer_dict


def test_json_nested_lists_and_transposed_matrices_are_read(tmp_path):
    src = trained_checkpoint(tmp_path / "a.safetensors")
    a = load_checkpoint(src)
    convert(src, tmp_path / "m.json", "json")
    doc = json.loads((tmp_path / "m.json").read_text())
    for name, t in a.model_state.items():
        if t.dim() == 2 and name not in ("wte.weight", "wpe.weight"):
            doc["tensors"][name] = t.T.tolist()  # nested, [in][out]
    (tmp_path / "t.json").write_text(json.dumps(doc))
    ckpt, notes = read_json(tmp_path / "t.json")
    assert_same_weights(a.model_state, ckpt.model_state)
    assert len(notes) == 1 and "[in][out]" in notes[0] and "square matrices" in notes[0]


# ---------------------------------------------------------------- Hugging Face


def test_native_hf_native_is_bitwise(tmp_path):
    src = trained_checkpoint(tmp_path / "a.safetensors", act="relu")
    convert(src, tmp_path / "hf", "hf")
    assert detect_format(tmp_path / "hf") == "hf"
    hf_cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert hf_cfg["tie_word_embeddings"] is False and hf_cfg["activation_function"] == "relu"
    assert (tmp_path / "hf" / "README.md").exists() and (tmp_path / "hf" / "tokenizer.json").exists()
    # every file of the folder is readable like the rest under the usual umask (safetensors writes 0600)
    mask = os.umask(0o022)
    os.umask(mask)
    assert {f.name: f.stat().st_mode & 0o777 for f in (tmp_path / "hf").iterdir()} == \
        {f.name: 0o666 & ~mask for f in (tmp_path / "hf").iterdir()}
    fmt, notes = convert(tmp_path / "hf", tmp_path / "b.safetensors", "native")
    a, b = load_checkpoint(src), load_checkpoint(tmp_path / "b.safetensors")
    assert fmt == "hf" and b.config == a.config
    assert_same_weights(a.model_state, b.model_state)
    assert b.tokenizer_dict["segments"] == SEGMENTS


@pytest.mark.parametrize("act", ["relu", "gelu", "relu2"])
def test_hf_export_matches_transformers(tmp_path, act):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(6)
    cfg = tiny_config(act=act, block_size=64)
    model = ANDREA(cfg).eval()
    with torch.no_grad():  # weights large enough that the activations work in their curved range
        for name, p in model.named_parameters():
            p.add_(torch.randn_like(p) * (0.25 if p.dim() == 2 else 0.2))
    path = save_checkpoint(tmp_path / "a.safetensors", cfg, model.state_dict(), None, {"tokenizer": tokenizer().to_dict()})
    convert(path, tmp_path / "hf", "hf")
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
    ids = tokenizer().encode("the cat sat on the mat and the dog ran")
    x = torch.tensor([ids])
    with torch.no_grad():
        ours, theirs = model(x)[0], hf(x).logits
    assert (ours - theirs).abs().max().item() < 1e-4

    def greedy(forward, n=32):
        seq = list(ids)
        for _ in range(n):
            with torch.no_grad():
                seq.append(int(forward(torch.tensor([seq]))[0, -1].argmax()))
        return seq[len(ids):]

    assert greedy(lambda t: model(t)[0]) == greedy(lambda t: hf(t).logits)
    if act == "gelu":
        # the tanh approximation is measurably different on these weights: the test above can fail
        hf.config.activation_function = "gelu_new"
        approx = transformers.GPT2LMHeadModel(hf.config).eval()
        approx.load_state_dict(hf.state_dict())
        with torch.no_grad():
            assert (ours - approx(x).logits).abs().max().item() > 1e-4


@pytest.mark.parametrize("changes, words", [(dict(pos="rope"), "learned positions"), (dict(norm="rmsnorm"), "LayerNorm")])
def test_hf_export_refuses_what_gpt2_cannot_hold(tmp_path, capsys, changes, words):
    src = trained_checkpoint(tmp_path / "a.safetensors", **changes)
    code, out, err = run(capsys, "convert", src, tmp_path / "hf", "--to", "hf")
    assert_one_sentence_error(code, out, err)
    assert words in err and not (tmp_path / "hf").exists()


def test_hf_import_refuses_nonzero_biases(tmp_path, capsys):
    from safetensors.torch import load_file

    convert(trained_checkpoint(tmp_path / "a.safetensors"), tmp_path / "hf", "hf")
    tensors = load_file(tmp_path / "hf" / "model.safetensors")
    tensors["transformer.h.1.mlp.c_fc.bias"][3] = 0.5
    save_file(tensors, tmp_path / "hf" / "model.safetensors")
    code, out, err = run(capsys, "convert", tmp_path / "hf", tmp_path / "b.safetensors")
    assert_one_sentence_error(code, out, err)
    assert "h.1.mlp.c_fc.bias is not zero" in err


@functools.lru_cache(maxsize=1)
def harris_and_fast():
    tokenizers = pytest.importorskip("tokenizers")
    # one-character segments ("a", "é") and a run of spaces test the corners of the mapping
    tok = HarrisTokenizer(SEGMENTS + ["ab", "abc", "cd", " 12", "''", "a", "  "])
    return tok, tokenizers.Tokenizer.from_str(json.dumps(tokenizers_json(tok.segments)))


@settings(max_examples=150, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40)
       | st.text(alphabet="ab étq'_1²½\u0301\x1c\u00a0 \n\t\u3000漢😀<>", max_size=40))
def test_tokenizer_json_encodes_exactly_as_harris(text):
    tok, fast = harris_and_fast()
    assert fast.encode(text).ids == tok.encode(text)
    assert fast.encode(text, add_special_tokens=False).ids == tok.encode(text, bos=False)


# ---------------------------------------------------------------- detection and malformed files


def test_format_is_found_by_content_not_name(tmp_path):
    src = trained_checkpoint(tmp_path / "a.safetensors")
    convert(src, tmp_path / "looks.json", "bin")  # a .bin under a .json name
    convert(src, tmp_path / "looks.bin", "json")
    assert detect_format(tmp_path / "looks.json") == "bin" and detect_format(tmp_path / "looks.bin") == "json"
    assert detect_format(src) == "native"
    ckpt, fmt, _ = read_model(tmp_path / "looks.bin")
    assert fmt == "json" and ckpt.config == tiny_config()


def test_a_bin_with_step_123_is_not_taken_for_json(tmp_path):
    cfg = tiny_config()
    state = ANDREA(cfg).state_dict()
    write_release_bin(tmp_path / "m", 123, [state[k] for k in spec_order(cfg)])  # starts with the byte "{"
    assert (tmp_path / "m").read_bytes()[:1] == b"{"
    assert detect_format(tmp_path / "m") == "bin"


def _malformed(tmp_path: Path, kind: str) -> tuple[list, str]:
    """(convert arguments, words the error must contain) for one kind of broken input."""
    cfg = tiny_config()
    cfg.save(tmp_path / "cfg.json")
    src = trained_checkpoint(tmp_path / "a.safetensors")
    bin_args = ["--config", tmp_path / "cfg.json"]
    if kind.startswith("bin"):
        convert(src, tmp_path / "m.bin", "bin")
        data = bytearray((tmp_path / "m.bin").read_bytes())
        if kind == "bin-truncated":
            (tmp_path / "m.bin").write_bytes(data[:-4])
            return [tmp_path / "m.bin", tmp_path / "o.safetensors", *bin_args], "not a model file"
        if kind == "bin-wrong-n":
            n = struct.unpack("<i", data[4:8])[0] - 1
            (tmp_path / "m.bin").write_bytes(struct.pack("<ii", 0, n) + bytes(12 * n))
            return [tmp_path / "m.bin", tmp_path / "o.safetensors", *bin_args], f"holds {n:,} parameters"
        if kind == "bin-nan":
            data[8 + 4 * 100 : 8 + 4 * 101] = struct.pack("<f", math.nan)
            (tmp_path / "m.bin").write_bytes(bytes(data))
            return [tmp_path / "m.bin", tmp_path / "o.safetensors", *bin_args], "wte.weight holds NaN"
        if kind == "bin-no-config":
            return [tmp_path / "m.bin", tmp_path / "o.safetensors"], "holds no config"
    if kind == "wrong-magic":
        (tmp_path / "x").write_bytes(b"GGUF\x03\x00\x00\x00" + bytes(100))
        return [tmp_path / "x", tmp_path / "o.safetensors"], "not a model file"
    if kind == "json-truncated":
        convert(src, tmp_path / "m.json", "json")
        data = (tmp_path / "m.json").read_bytes()
        (tmp_path / "m.json").write_bytes(data[: len(data) // 2])
        return [tmp_path / "m.json", tmp_path / "o.safetensors"], "is not valid JSON"
    if kind.startswith("json"):
        convert(src, tmp_path / "m.json", "json")
        doc = json.loads((tmp_path / "m.json").read_text())
        if kind == "json-wrong-shape":
            doc["tensors"]["h.1.mlp.fc1.weight"]["shape"] = [7, 7]
            words = "h.1.mlp.fc1.weight has shape [7, 7]"
        elif kind == "json-nan":
            doc["tensors"]["ln_f.bias"]["data"][0] = math.nan
            words = "ln_f.bias holds NaN"
        elif kind == "json-not-a-model":
            doc = {"hello": [1, 2, 3]}
            words = "not an ANDREA JSON model"
        else:
            doc["tensors"]["lm_head.weight"]["data"][5] = "x"
            words = "not a number"
        (tmp_path / "m.json").write_text(json.dumps(doc))
        return [tmp_path / "m.json", tmp_path / "o.safetensors"], words
    if kind == "hf-missing-weights":
        convert(src, tmp_path / "hf", "hf")
        (tmp_path / "hf" / "model.safetensors").unlink()
        return [tmp_path / "hf", tmp_path / "o.safetensors"], "no model.safetensors"
    if kind == "hf-pickle":
        convert(src, tmp_path / "hf", "hf")
        (tmp_path / "hf" / "model.safetensors").rename(tmp_path / "hf" / "pytorch_model.bin")
        return [tmp_path / "hf", tmp_path / "o.safetensors"], "a pickle"
    if kind == "release-missing-config":
        convert(src, tmp_path / "rel", "bin")
        (tmp_path / "rel" / "config.json").unlink()
        return [tmp_path / "rel", tmp_path / "o.safetensors"], "no config JSON"
    if kind == "native-not-andrea":
        from safetensors.torch import save_file

        save_file({"w": torch.zeros(3)}, str(tmp_path / "w.safetensors"))
        return [tmp_path / "w.safetensors", tmp_path / "o.bin"], "not an andrea checkpoint"
    if kind == "native-nan":
        a = load_checkpoint(src)
        a.model_state["h.0.attn.wk.weight"][0, 0] = math.inf
        save_checkpoint(tmp_path / "n.safetensors", a.config, a.model_state)
        return [tmp_path / "n.safetensors", tmp_path / "o.bin"], "h.0.attn.wk.weight holds NaN or infinite"
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["bin-truncated", "bin-wrong-n", "bin-nan", "bin-no-config", "wrong-magic",
                                  "json-truncated", "json-wrong-shape", "json-nan", "json-not-a-model", "json-not-a-number",
                                  "hf-missing-weights", "hf-pickle", "release-missing-config", "native-not-andrea",
                                  "native-nan"])
def test_malformed_input_ends_in_one_sentence(tmp_path, capsys, kind):
    args, words = _malformed(tmp_path, kind)
    capsys.readouterr()
    code, out, err = run(capsys, "convert", *args)
    assert_one_sentence_error(code, out, err)
    assert words in err, err
    assert not Path(args[1]).exists()


def test_truncated_bin_with_a_given_config_says_what_size_was_expected(tmp_path):
    cfg = tiny_config()
    state = ANDREA(cfg).state_dict()
    write_release_bin(tmp_path / "m.bin", 1, [state[k] for k in spec_order(cfg)])
    data = (tmp_path / "m.bin").read_bytes()
    (tmp_path / "m.bin").write_bytes(data[:-12])
    n = struct.unpack("<i", data[4:8])[0]
    with pytest.raises(AndreaError, match=rf"should be 8 \+ 12·{n:,} = {8 + 12 * n:,} bytes, but it is {len(data) - 12:,}"):
        read_bin(tmp_path / "m.bin", cfg)


FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@FUZZ
@given(data=st.binary(max_size=600), header=st.booleans())
def test_fuzz_bin(tmp_path_factory, data, header):
    path = tmp_path_factory.mktemp("fuzz") / "m.bin"
    if header:  # a consistent header, so the reader gets past the size check
        n = max(1, len(data) // 12)
        data = struct.pack("<ii", 1, n) + (data * (12 * n // max(1, len(data)) + 1))[: 12 * n]
    path.write_bytes(data)
    with pytest.raises(AndreaError):
        read_bin(path, tiny_config())


@FUZZ
@given(data=st.one_of(st.binary(max_size=600),
                      st.recursive(st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=8),
                                   lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
                                   max_leaves=20).map(lambda d: json.dumps(d).encode())))
def test_fuzz_json(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("fuzz") / "m.json"
    path.write_bytes(data)
    with pytest.raises(AndreaError):
        read_json(path)


@FUZZ
@given(data=st.binary(max_size=600), prefix=st.booleans())
def test_fuzz_native(tmp_path_factory, data, prefix):
    path = tmp_path_factory.mktemp("fuzz") / "m.safetensors"
    if prefix:  # a plausible safetensors header length and an opening brace
        data = struct.pack("<Q", len(data) + 1) + b"{" + data
    path.write_bytes(data)
    with pytest.raises(AndreaError):
        read_model(path, "native")


@FUZZ
@given(config=st.binary(max_size=300), weights=st.binary(max_size=300), good_config=st.booleans())
def test_fuzz_hf_folder(tmp_path_factory, config, weights, good_config):
    folder = tmp_path_factory.mktemp("fuzz")
    if good_config:
        from andrea.formats.hf import hf_config

        config = json.dumps(hf_config(tiny_config())).encode()
    (folder / "config.json").write_bytes(config)
    (folder / "model.safetensors").write_bytes(weights)
    with pytest.raises(AndreaError):
        read_hf(folder)


@FUZZ
@given(data=st.binary(max_size=600))
def test_fuzz_any_file_through_detection(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("fuzz") / "m"
    path.write_bytes(data)
    with pytest.raises(AndreaError):
        read_model(path, config=tiny_config())


def test_v3_bin_keeps_adamw_moments_and_zeros_for_muon_matrices(tmp_path, capsys):
    """A v3 checkpoint's .bin: AdamW's moments of the tables, head and norms as they are; zeros
    for the Muon-trained block matrices (a note says so); read back for v3, the AdamW parameters
    get their moments again and the Muon matrices no state (momentum from zero)."""
    from andrea.formats import muon_trained

    src = trained_checkpoint(tmp_path / "a.safetensors", "v3")
    a = load_checkpoint(src)
    muon = muon_trained(a.config, a.optim_state)
    assert muon and all(".attn." in n or ".mlp." in n for n in muon)
    fmt, notes = convert(src, tmp_path / "a.bin", "bin")
    assert any("Muon" in n and "zeros" in n for n in notes)
    ma = adam_moments(a.config, a.optim_state)
    assert all(not ma[n][0].any() and not ma[n][1].any() for n in muon)
    assert ma["wte.weight"][1].abs().sum() > 0 and ma["lm_head.weight"][0].abs().sum() > 0
    tokenizer().save(tmp_path / "tok")
    convert(tmp_path / "a.bin", tmp_path / "b.safetensors", "native", config=tiny_config(),
            segments=tmp_path / "tok" / "harris_segments.json", recipe="v3")
    b = load_checkpoint(tmp_path / "b.safetensors")
    assert_same_weights(a.model_state, b.model_state)
    mb = adam_moments(b.config, b.optim_state)
    for name in ma:
        assert torch.equal(ma[name][0], mb[name][0]) and torch.equal(ma[name][1], mb[name][1]), name
    assert muon_trained(b.config, b.optim_state) == []
    # and the trainer's v3 optimizer loads it
    model = ANDREA(b.config)
    opt = make_optimizer(model, "v3")
    opt.load_state_dict(b.optim_state)
    assert len(opt.state) == sum(1 for n, _ in model.named_parameters() if n not in muon)


def test_the_projector_files_are_written_whole_or_not_at_all(tmp_path, monkeypatch):
    """A full disk while vectors.tsv is written: one sentence naming the file; the earlier export
    stays as it was and no partial file or temporary is left."""
    import andrea.files
    from andrea.formats.projector import write_projector
    from andrea.model import ANDREA
    from andrea.tokenizer.harris import HarrisTokenizer

    tok = HarrisTokenizer([" cat", " dog"])
    torch.manual_seed(0)
    model = ANDREA(ModelConfig(vocab_size=tok.vocab_size, n_embd=8, n_head=2, n_layer=1, block_size=8))
    vectors, meta = write_projector(tmp_path, model, tok)
    before = vectors.read_bytes(), meta.read_bytes()
    with torch.no_grad():
        model.wte.weight.mul_(2)
    real = andrea.files.replace_durably

    def full(tmp, path):
        if Path(path).name == "vectors.tsv":
            raise OSError(28, "No space left on device")
        return real(tmp, path)

    monkeypatch.setattr(andrea.files, "replace_durably", full)
    with pytest.raises(AndreaError, match=r"could not write .*vectors\.tsv \(No space left on device\)"):
        write_projector(tmp_path, model, tok)
    assert (vectors.read_bytes(), meta.read_bytes()) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metadata.tsv", "vectors.tsv"]


# ---------------------------------------------------------------- hostile input


@pytest.mark.hostile
def test_release_folders_and_json_models_claiming_a_million_layers_are_refused_at_once(audited_run, tmp_path, capsys):
    """A .bin release folder and a JSON model whose config claims 10^6 layers: `convert` (and the
    engine) end in one sentence within seconds, building no model of a million blocks."""

    release, model = tmp_path / "release", tmp_path / "m.json"
    assert cli(capsys, "convert", audited_run / "latest.safetensors", release, "--to", "bin")[0] == 0
    assert cli(capsys, "convert", audited_run / "latest.safetensors", model, "--to", "json")[0] == 0
    cfg = json.loads((release / "config.json").read_text())
    (release / "config.json").write_text(json.dumps({**cfg, "n_layer": 10**6}))
    doc = json.loads(model.read_text())
    doc["config"]["n_layer"] = 10**6
    model.write_text(json.dumps(doc))
    for src in (release, model):
        start = time.time()
        line = one_sentence(*cli(capsys, "convert", src, tmp_path / "out.safetensors")[::2])
        assert time.time() - start < 10 and "1,000,000" in line, line
    engine = subprocess.run([sys.executable, str(ROOT / "andrea" / "stdlib_engine.py"), str(model)], capture_output=True,
                            text=True, timeout=60)
    assert engine.returncode == 2 and "1,000,000 layers" in engine.stderr and "Traceback" not in engine.stderr
