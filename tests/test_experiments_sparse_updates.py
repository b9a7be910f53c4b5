"""Sparse updates pinned to facts: under plain SGD an absent token's row of wte stays
bit-identical; under Adam it moves only through momentum from earlier steps; decoupled weight
decay moves every decayed row; every row of the untied head gets a gradient at every step. Then
the repo's own optimizers as the trainer builds them (v1, v2, v3), and `andrea experiment
sparse-updates`, whose numbers must agree with the same facts."""

from __future__ import annotations

import json
import random

import matplotlib.image
import pytest
import torch

from andrea.cli import main
from andrea.config import ModelConfig
from andrea.experiments.sparse_updates import (
    OPTIMIZERS,
    SparseUpdatesExperiment,
    explanation,
    make_batches,
    sparse_updates,
    write_results,
)
from andrea.model import ANDREA
from andrea.optim import MUON, is_block_matrix, make_optimizer, param_groups
from andrea.prepare import prepare
from andrea.shards import TokenData
from andrea.tokenizer.train import train_tokenizer
from andrea.trainconfig import DEFAULT_LR

TINY = ModelConfig(vocab_size=300, n_embd=32, n_head=4, n_layer=2, block_size=16)
EARLY = torch.arange(10, 40)  # the tokens of the first batches
LAST = torch.arange(40, 60)  # the tokens of the last batch, absent from every batch before


def build(seed: int = 0) -> ANDREA:
    torch.manual_seed(seed)
    return ANDREA(TINY).train()


def batch(pool: torch.Tensor, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """4 × 16 input ids drawn from pool (every id of the pool appears), targets from the whole vocabulary."""
    g = torch.Generator().manual_seed(seed)
    x = pool[torch.randint(0, len(pool), (4, 16), generator=g)]
    x.view(-1)[: len(pool)] = pool
    return x, torch.randint(0, TINY.vocab_size, (4, 16), generator=g)


def step(model, opt, x, y) -> None:
    opt.zero_grad(set_to_none=True)
    _, loss = model(x, targets=y)
    loss.backward()
    opt.step()


def masks() -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of the last batch's tokens, and rows of tokens in no batch at all."""
    last = torch.zeros(TINY.vocab_size, dtype=torch.bool)
    last[LAST] = True
    never = ~last
    never[EARLY] = False
    return last, never


def run_early_then_last(model, opt) -> torch.Tensor:
    """Three steps on EARLY, then one on LAST; wte as it was before the last step."""
    for s in range(3):
        step(model, opt, *batch(EARLY, s))
    before = model.wte.weight.detach().clone()
    step(model, opt, *batch(LAST, 3))
    return before


def rows_moved(before: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
    return (before != after).any(dim=1)


# ---------------------------------------------------------------- plain torch optimizers


def test_one_sgd_step_moves_exactly_the_rows_of_tokens_in_the_batch():
    model = build()
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.0, weight_decay=0.0)
    before = model.wte.weight.detach().clone()
    head_before = model.lm_head.weight.detach().clone()
    step(model, opt, *batch(EARLY, 0))
    moved = rows_moved(before, model.wte.weight.detach())
    present = torch.zeros(TINY.vocab_size, dtype=torch.bool)
    present[EARLY] = True
    assert moved[present].all()
    assert torch.equal(model.wte.weight.detach()[~present], before[~present])  # bit-identical
    # the head is dense: every one of its rows moved
    assert rows_moved(head_before, model.lm_head.weight.detach()).all()


def test_adam_moves_an_absent_row_only_through_its_momentum():
    """No weight decay: rows of EARLY (absent from the last batch) move on their first moment;
    rows never seen have m = v = 0, so m̂/(√v̂ + ε) is exactly 0 and they stay bit-identical."""
    model = build()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    before = run_early_then_last(model, opt)
    after = model.wte.weight.detach()
    last, never = masks()
    m = opt.state[model.wte.weight]["exp_avg"]
    assert (m[EARLY] != 0).any(dim=1).all() and torch.count_nonzero(m[never]) == 0
    assert model.wte.weight.grad[EARLY].abs().sum() == 0  # the last step gave EARLY no gradient
    assert rows_moved(before, after)[EARLY].all()
    assert rows_moved(before, after)[last].all()
    assert torch.equal(after[never], before[never])


def test_decoupled_weight_decay_moves_every_absent_row():
    """AdamW with weight decay: a row never seen (m = 0) is multiplied by 1 − lr·wd; a row seen
    earlier moves by more than that (momentum on top)."""
    lr, wd = 1e-3, 0.1
    model = build()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=wd)
    before = run_early_then_last(model, opt)
    after = model.wte.weight.detach()
    _, never = masks()
    assert rows_moved(before, after).all()
    torch.testing.assert_close(after[never], before[never] * (1 - lr * wd), rtol=2e-7, atol=0)
    assert (after[never].norm(dim=1) < before[never].norm(dim=1)).all()
    beyond_decay = (after[EARLY] - before[EARLY] * (1 - lr * wd)).norm(dim=1)
    assert (beyond_decay > 1e-6).all()


def test_every_head_row_gets_a_gradient_at_every_step():
    model = build()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for s in range(4):
        x, y = batch(EARLY if s < 3 else LAST, s)
        opt.zero_grad(set_to_none=True)
        _, loss = model(x, targets=y)
        loss.backward()
        assert (model.lm_head.weight.grad != 0).any(dim=1).all()  # the softmax covers the whole vocabulary
        present = torch.zeros(TINY.vocab_size, dtype=torch.bool)
        present[x.unique()] = True
        assert torch.count_nonzero(model.wte.weight.grad[~present]) == 0  # the input table is indexed
        opt.step()


# ---------------------------------------------------------------- the recipes, as the trainer builds them


def _wte_group(model, recipe):
    (group,) = [g for g in param_groups(model, recipe) if "wte.weight" in g["names"]]
    return group


def test_which_optimizer_and_weight_decay_each_recipe_gives_the_tables():
    model = build()
    # v1: one Adam group of everything, no weight decay
    opt = make_optimizer(model, "v1")
    assert isinstance(opt, torch.optim.Adam) and opt.param_groups[0]["weight_decay"] == 0
    # v2: wte, wpe and lm_head are matrices, so they are in the decayed group
    g = _wte_group(model, "v2")
    assert g["weight_decay"] == 0.1 and {"wpe.weight", "lm_head.weight"} <= set(g["names"])
    # v3: Muon has the blocks' matrices only; the tables and the head are in AdamW's decayed group
    groups = param_groups(model, "v3")
    muon = [g for g in groups if g["optimizer"] == MUON]
    assert len(muon) == 1 and all(is_block_matrix(n, p) for n, p in zip(muon[0]["names"], muon[0]["params"]))
    g = _wte_group(model, "v3")
    assert g["optimizer"] == "adamw" and g["weight_decay"] == 0.1 and "lm_head.weight" in g["names"]


@pytest.mark.parametrize("recipe", ["v1", "v2", "v3"])
def test_the_recipes_move_absent_rows_as_their_optimizer_says(recipe):
    model = build()
    opt = make_optimizer(model, recipe)
    before = run_early_then_last(model, opt)
    after = model.wte.weight.detach()
    last, never = masks()
    moved = rows_moved(before, after)
    assert moved[last].all() and moved[EARLY].all()  # present, and absent with momentum
    assert torch.count_nonzero(opt.state[model.wte.weight]["exp_avg"][never]) == 0
    if recipe == "v1":  # Adam, no weight decay: a row with m = 0 does not move
        assert torch.equal(after[never], before[never])
    else:  # decoupled weight decay 0.1 at the recipe's lr
        shrink = 1 - DEFAULT_LR[recipe] * 0.1
        torch.testing.assert_close(after[never], before[never] * shrink, rtol=2e-7, atol=0)
        assert moved[never].all()


# ---------------------------------------------------------------- the experiment


def tiny(**changes) -> SparseUpdatesExperiment:
    return SparseUpdatesExperiment(**{"steps": 4, "batch_size": 2, "seq_len": 16, "n_embd": 16, "n_head": 2,
                                      "n_layer": 1, **changes})


def check_facts(summary: dict) -> None:
    rows = {r["optimizer"]: r for r in summary["rows"]}
    assert list(rows) == list(OPTIMIZERS)
    # the same batches and initial weights: the first step's loss is the same for every optimizer
    assert len({r["steps"][0]["loss"] for r in rows.values()}) == 1
    for r in rows.values():
        for s in r["steps"]:
            assert s["present_moved"] == 1.0 and s["head_grad"] == 1.0
            assert s["present"] + s["absent"] == summary["settings"]["model"]["vocab_size"]
    for s in rows["sgd"]["steps"]:
        assert s["absent_delta"] == 0.0 and s["absent_moved"] == 0.0
    for s in rows["adam"]["steps"]:
        assert s["absent_never_moved"] == 0.0
    for s in rows["adam"]["steps"][1:]:
        if s["absent_seen"]:
            assert s["absent_seen_moved"] > 0 and s["absent_delta"] > 0
    for name in ("adamw", "v3"):
        for s in rows[name]["steps"]:
            assert s["absent_moved"] == 1.0 and s["absent_delta"] > 0


def test_the_experiment_agrees_with_the_facts():
    exp = tiny()
    summary = sparse_updates(exp, log=lambda *a: None)
    check_facts(summary)
    # at step 1 no token has been seen, so an absent row of AdamW moves by exactly lr·wd·‖row‖
    batches, V, _ = make_batches(exp)
    cfg = ModelConfig(**summary["settings"]["model"])
    torch.manual_seed(exp.seed)
    wte = ANDREA(cfg).wte.weight.detach().double()
    absent = torch.ones(V, dtype=torch.bool)
    absent[batches[0][0].unique()] = False
    adamw = next(r for r in summary["rows"] if r["optimizer"] == "adamw")
    expected = 1e-3 * 0.1 * wte[absent].norm(dim=1).mean().item()
    assert adamw["steps"][0]["absent_delta"] == pytest.approx(expected, rel=1e-3)
    sentences = {r["optimizer"]: explanation(r) for r in summary["rows"]}
    assert "bit-identical" in sentences["sgd"] and "decoupled" not in sentences["sgd"]
    assert "momentum" in sentences["adam"] and "m = 0" in sentences["adam"]
    assert "weight decay" in sentences["adamw"] and "weight decay" in sentences["v3"]


def test_the_experiment_reads_a_prepared_folder(tmp_path):
    rng = random.Random(3)
    words = "the cat sat on a mat and the dog ran to its pet while kings and queens talked".split()
    docs = [" ".join(rng.choice(words) for _ in range(200)) + "." for _ in range(30)]
    (tmp_path / "alpha.txt").write_text("\n\n".join(docs))
    prepare(train_tokenizer(docs[:10], 20), [str(tmp_path / "alpha.txt")], tmp_path / "data",
            log=lambda *a: None, progress=False)
    summary = sparse_updates(tiny(data_dir=tmp_path / "data", steps=3), log=lambda *a: None)
    assert summary["settings"]["model"]["vocab_size"] == TokenData(tmp_path / "data").vocab_size
    check_facts(summary)


def test_results_are_written_as_a_table_json_and_a_picture(tmp_path):
    summary = sparse_updates(tiny(steps=2), log=lambda *a: None)
    result = write_results(summary, tmp_path / "out")
    assert "| SGD |" in result["markdown"] and "| Muon + AdamW (v3) |" in result["markdown"]
    assert json.loads(result["json_path"].read_text())["settings"]["steps"] == 2
    img = matplotlib.image.imread(result["png"])
    assert img.shape[0] > 200 and img.shape[1] > 200


def test_cli_prints_the_table_and_its_numbers_follow_the_facts(tmp_path, capsys):
    assert main(["experiment", "sparse-updates", "--out", str(tmp_path / "o"), "--steps", "3"]) == 0
    out = capsys.readouterr().out
    assert "| SGD |" in out and "| AdamW (v2) |" in out and "picture:" in out
    assert (tmp_path / "o" / "sparse_updates.png").exists()
    assert main(["experiment", "sparse-updates", "--out", str(tmp_path / "o"), "--steps", "3", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    check_facts(summary)
    rows = {r["optimizer"]: r["summary"] for r in summary["rows"]}
    assert rows["sgd"]["absent_delta"] == 0.0 and rows["sgd"]["absent_moved"] == 0.0
    assert rows["adamw"]["absent_delta"] > 0 and rows["adamw"]["absent_moved"] == 1.0


def test_bad_settings_are_one_sentence(tmp_path, capsys):
    assert main(["experiment", "sparse-updates", "--out", str(tmp_path / "o"), "--steps", "0"]) == 2
    err = capsys.readouterr().err
    assert "argument --steps: must be an integer from 1 to" in err and "Traceback" not in err
    assert main(["experiment", "sparse-updates", "--out", str(tmp_path / "o"), "--data", str(tmp_path / "no")]) == 2
    err = capsys.readouterr().err
    assert "andrea prepare" in err and "Traceback" not in err
