"""Recipes' optimizers and schedules: v3's parameter split, one state dict for two optimizers, and
the warm-up/stable/decay schedule at given budgets, checked against hand-computed values."""

from __future__ import annotations

import copy

import pytest
import torch

from andrea.config import ModelConfig
from andrea.model import ANDREA
from andrea.optim import lr_at, make_optimizer, param_groups, param_names_in_order


def tiny() -> ANDREA:
    torch.manual_seed(0)
    return ANDREA(ModelConfig(vocab_size=300, n_embd=32, n_head=2, n_layer=2, block_size=16))


def test_v3_trains_block_matrices_with_muon_and_the_rest_with_adamw():
    model = tiny()
    groups = param_groups(model, "v3")
    assert [g["optimizer"] for g in groups] == ["muon", "adamw", "adamw"]
    assert groups[0]["names"] == [f"h.{i}.{m}.weight" for i in range(2)
                                  for m in ("attn.wq", "attn.wk", "attn.wv", "attn.wo", "mlp.fc1", "mlp.fc2")]
    assert groups[1]["names"] == ["wte.weight", "wpe.weight", "lm_head.weight"]
    assert all(".ln_" in n or n.startswith("ln_f.") for n in groups[2]["names"])
    assert sorted(param_names_in_order(model, "v3")) == sorted(n for n, _ in model.named_parameters())
    opt = make_optimizer(model, "v3")
    kinds = [type(o).__name__ for o in opt.optimizers]
    assert kinds == ["Muon", "AdamW"]
    # the groups the trainer sets learning rates on are the parts' own groups
    assert opt.param_groups[0] is opt.optimizers[0].param_groups[0]
    assert opt.param_groups[2] is opt.optimizers[1].param_groups[1]


def test_muon_lr_scales_only_the_muon_group():
    opt = make_optimizer(tiny(), "v3", lr=1e-3, muon_lr=4e-3)
    assert [g["lr_scale"] for g in opt.param_groups] == [4.0, 1.0, 1.0]
    assert opt.param_groups[0]["lr"] == pytest.approx(4e-3)


def test_v3_state_dict_round_trips_and_continues_identically():
    """The combined state dict numbers every parameter once, in param_names_in_order's order, and
    loading it into a fresh optimizer continues exactly as the original does."""
    a = tiny()
    opt_a = make_optimizer(a, "v3", lr=1e-2)
    x = torch.randint(0, 300, (4, 16))
    for _ in range(3):
        a(x, x)[1].backward()
        opt_a.step()
        opt_a.zero_grad()
    sd = copy.deepcopy(opt_a.state_dict())
    assert sorted(sd["state"]) == list(range(len(param_names_in_order(a, "v3"))))
    assert "momentum_buffer" in sd["state"][0] and "exp_avg" in sd["state"][len(sd["param_groups"][0]["params"])]
    b = copy.deepcopy(a)
    opt_b = make_optimizer(b, "v3", lr=1e-2)
    opt_b.load_state_dict(sd)
    assert opt_b.optimizers[0].state is opt_b.state and opt_b.optimizers[1].param_groups[0] is opt_b.param_groups[1]
    for _ in range(3):
        for m, o in ((a, opt_a), (b, opt_b)):
            m(x, x)[1].backward()
            o.step()
            o.zero_grad()
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


def test_v3_schedule_warms_up_holds_and_decays_to_zero_at_a_step_budget():
    """1,000 steps, 100 of warm-up, the last 30 % decaying: hand-computed values."""
    lr, n = 1e-2, 1000
    at = {s: lr_at("v3", lr, s, s / n, 100, 0.1, 0.3) for s in (0, 49, 99, 100, 500, 700, 850, 999, 1000)}
    assert at[0] == pytest.approx(lr * 1 / 100) and at[49] == pytest.approx(lr * 50 / 100)
    assert at[99] == pytest.approx(lr) and at[100] == at[500] == at[700] == pytest.approx(lr)
    assert at[850] == pytest.approx(lr * 0.15 / 0.3)
    assert at[999] == pytest.approx(lr * 0.001 / 0.3) and at[1000] == 0.0


def test_v3_schedule_follows_seconds_at_a_time_budget():
    """A 600 s budget: the step count is unknown, the decay starts at 420 s and ends at 0 at 600 s."""
    lr = 3e-3
    assert lr_at("v3", lr, 5000, 300 / 600, 50, 0.1, 0.3) == pytest.approx(lr)
    assert lr_at("v3", lr, 5000, 420 / 600, 50, 0.1, 0.3) == pytest.approx(lr)
    assert lr_at("v3", lr, 5000, 510 / 600, 50, 0.1, 0.3) == pytest.approx(lr / 2)
    assert lr_at("v3", lr, 5000, 600 / 600, 50, 0.1, 0.3) == 0.0
    assert lr_at("v3", lr, 5000, 1.2, 50, 0.1, 0.3) == 0.0  # past the budget: still zero, never negative
    # warm-up still counts steps
    assert lr_at("v3", lr, 9, 0.001, 50, 0.1, 0.3) == pytest.approx(lr * 10 / 50)


def test_v2_schedule_is_unchanged():
    """v2 stays ANDREA's: warm-up, then cosine from lr to min_lr_ratio × lr."""
    lr = 1e-3
    assert lr_at("v2", lr, 0, 0.0, 10, 0.1, 0.3) == pytest.approx(1e-4)
    assert lr_at("v2", lr, 500, 0.5, 10, 0.1, 0.3) == pytest.approx(lr * (0.1 + 0.9 * 0.5))
    assert lr_at("v2", lr, 1000, 1.0, 10, 0.1, 0.3) == pytest.approx(lr * 0.1)
    assert lr_at("v1", lr, 1000, 1.0, 10, 0.1, 0.3) == lr
