"""Parameter accounting: the config arithmetic against the specification and the built model."""

import itertools

import pytest
import torch
from helpers import big_config, cli, one_sentence, peak_rss, process_sentence

from andrea.config import NORMS, POSITION_SCHEMES, PRESETS, ModelConfig, count_params, param_rows
from andrea.model import ANDREA

# presets whose model builds on the CPU in well under a second
SMALL_PRESETS = [name for name, cfg in PRESETS.items() if count_params(cfg) < 20_000_000]
LARGE_PRESETS = [name for name in PRESETS if name not in SMALL_PRESETS]

TINY = ModelConfig(vocab_size=300, n_embd=32, n_head=4, n_layer=2, block_size=16)


def rows_by_group(cfg):
    """The param_rows of cfg keyed by the short group name the model's parameters map to."""
    keys = {"token": "wte", "position": "wpe", "embedding layer": "embedding", "attention": "attention",
            "MLP": "mlp", "norms": "norms", "output head": "head", "total": "total"}
    out = {}
    for row in param_rows(cfg):
        (key,) = [v for k, v in keys.items() if row.name.startswith(k)]
        out[key] = row.count
    return out


def group_of(name):
    if name == "wte.weight":
        return "wte"
    if name == "wpe.weight":
        return "wpe"
    if name == "lm_head.weight":
        return "head"
    if ".attn.w" in name:
        return "attention"
    if ".mlp.fc" in name:
        return "mlp"
    if name.startswith("ln_f.") or ".ln_1." in name or ".ln_2." in name:
        return "norms"
    raise AssertionError(f"parameter {name} belongs to no group")


def counted_groups(model):
    counts = dict.fromkeys(["wte", "wpe", "attention", "mlp", "norms", "head"], 0)
    for name, p in model.named_parameters():
        counts[group_of(name)] += p.numel()
    return counts


def assert_rows_match_model(cfg, model):
    rows = rows_by_group(cfg)
    counts = counted_groups(model)
    for group, n in counts.items():
        assert rows[group] == n, f"{group}: param_rows says {rows[group]:,}, the model has {n:,}"
    assert rows["embedding"] == counts["wte"] + counts["wpe"]
    total = sum(p.numel() for p in model.parameters())
    assert rows["total"] == total == count_params(cfg) == model.num_params()


# ---------------------------------------------------------------- the specification's figures


def test_andrea_120m_embedding_layer_matches_the_specification():
    rows = rows_by_group(PRESETS["andrea-120m"])
    assert rows["wte"] == 8_449 * 768 == 6_488_832
    assert rows["wpe"] == 1_024 * 768 == 786_432
    assert rows["embedding"] == 7_275_264
    assert rows["total"] == 98_737_152


@pytest.mark.parametrize("name, total", [("andrea-12m", 12_790_272), ("andrea-120m", 98_737_152),
                                         ("andrea-480m", 480_614_400)])
def test_family_totals_match_the_specification(name, total):
    assert count_params(PRESETS[name]) == total


@pytest.mark.parametrize("name", list(PRESETS))
def test_count_params_matches_the_closed_form(name):
    cfg = PRESETS[name]
    d, V, T, L = cfg.n_embd, cfg.vocab_size, cfg.block_size, cfg.n_layer
    assert count_params(cfg) == L * (12 * d * d + 4 * d) + 2 * V * d + T * d + 2 * d


@pytest.mark.parametrize("cfg", [*PRESETS.values(), TINY.replace(pos="rope", norm="rmsnorm")],
                         ids=[*PRESETS, "tiny-rope-rmsnorm"])
def test_rows_sum_to_the_total(cfg):
    rows = rows_by_group(cfg)
    parts = rows["embedding"] + rows["attention"] + rows["mlp"] + rows["norms"] + rows["head"]
    assert parts == rows["total"]


# ---------------------------------------------------------------- the arithmetic against built models


@pytest.mark.parametrize("name", SMALL_PRESETS)
def test_small_presets_built_on_cpu(name):
    cfg = PRESETS[name]
    assert_rows_match_model(cfg, ANDREA(cfg))


@pytest.mark.parametrize("name", LARGE_PRESETS)
def test_large_presets_built_on_meta(name):
    assert "andrea-120m" in LARGE_PRESETS and "andrea-480m" in LARGE_PRESETS
    cfg = PRESETS[name]
    with torch.device("meta"):
        model = ANDREA(cfg)
    assert next(model.parameters()).device.type == "meta"
    assert_rows_match_model(cfg, model)


@pytest.mark.parametrize("pos, norm", list(itertools.product(POSITION_SCHEMES, NORMS)))
def test_every_position_scheme_and_norm(pos, norm):
    cfg = TINY.replace(pos=pos, norm=norm)
    model = ANDREA(cfg)
    assert_rows_match_model(cfg, model)
    names = {n for n, _ in model.named_parameters()}
    assert ("wpe.weight" in names) == (pos == "learned")
    assert ("ln_f.bias" in names) == (norm == "layernorm")


@pytest.mark.parametrize("pos", ["sinusoidal", "rope", "none"])
def test_only_learned_positions_cost_parameters(pos):
    assert count_params(TINY) - count_params(TINY.replace(pos=pos)) == TINY.block_size * TINY.n_embd


def test_parameter_order_follows_the_bin_layout():
    model = ANDREA(TINY)
    expected = ["wte.weight", "wpe.weight"]
    for i in range(TINY.n_layer):
        expected += [f"h.{i}.{n}" for n in ("ln_1.weight", "ln_1.bias", "attn.wq.weight", "attn.wk.weight",
                                            "attn.wv.weight", "attn.wo.weight", "ln_2.weight", "ln_2.bias",
                                            "mlp.fc1.weight", "mlp.fc2.weight")]
    expected += ["ln_f.weight", "ln_f.bias", "lm_head.weight"]
    assert [n for n, _ in model.named_parameters()] == expected
    d, V, T = TINY.n_embd, TINY.vocab_size, TINY.block_size
    shapes = dict(model.named_parameters())
    assert shapes["wte.weight"].shape == (V, d)
    assert shapes["wpe.weight"].shape == (T, d)
    assert shapes["h.0.mlp.fc1.weight"].shape == (4 * d, d)
    assert shapes["h.0.mlp.fc2.weight"].shape == (d, 4 * d)
    assert shapes["lm_head.weight"].shape == (V, d)


# ---------------------------------------------------------------- hostile input


@pytest.mark.hostile
@pytest.mark.parametrize("changes", [{"n_embd": 100_000}, {"block_size": 10**9}, {"n_layer": 10**6},
                                     {"block_size": 10**9, "pos": "rope"}])
def test_a_model_too_big_for_memory_is_refused_by_arithmetic(two_source_data, tmp_path, capsys, changes):
    """Width 10^5, context 10^9 (learned or rope) and 10^6 layers: `train` ends in one sentence that
    says the memory the model would need, before anything is built; `params` still counts it."""
    cfg = big_config(two_source_data, tmp_path / "big.json", **changes)
    line = one_sentence(*cli(capsys, "train", "--data", two_source_data, "--out", tmp_path / "o", "--model-config", cfg,
                             "--max-steps", "1", "--seq-len", "16", "--no-progress")[::2])
    assert "needs at least" in line and " GB of memory" in line and "available" in line, line
    code, out, _ = cli(capsys, "params", "--config", cfg)
    assert code == 0 and "total" in out

@pytest.mark.hostile
def test_a_huge_model_is_refused_in_a_bounded_process(two_source_data, tmp_path):
    """10^6 layers in a real process, under /usr/bin/time: one sentence, little memory."""
    cfg = big_config(two_source_data, tmp_path / "big.json", n_layer=10**6)
    done, peak = peak_rss(["train", "--data", two_source_data, "--out", tmp_path / "o", "--model-config", cfg,
                           "--max-steps", "1", "--seq-len", "16", "--no-progress"])
    assert "needs at least" in process_sentence(done)
    assert peak < 1_000_000_000, f"peak {peak:,} bytes"
