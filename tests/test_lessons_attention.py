"""andrea.inside.lessons.attention and `andrea lesson attention`: each verdict on a model built to hold and on one built not to."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import kind_patterns, tiny_config

from andrea.checkpoint import save_checkpoint
from andrea.cli import main
from andrea.config import ModelConfig
from andrea.inside import heads
from andrea.inside.lessons import attention as lesson
from andrea.inside.lessons.report import CANNOT, CAVEAT, FAILS, HOLDS
from andrea.model import ANDREA
from andrea.shards import TokenData
from andrea.tokenizer.harris import HarrisTokenizer

pytestmark = pytest.mark.usefixtures("one_thread")

TOK = HarrisTokenizer([" " + w for w in ("the", "cat", "sat", "on", "mat", "and", "slept", "dog", "ran")])


def fresh(n_embd: int = 32, n_head: int = 2, n_layer: int = 2, block_size: int = 32, seed: int = 0) -> ANDREA:
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=TOK.vocab_size, n_embd=n_embd, n_head=n_head, n_layer=n_layer, block_size=block_size)
    return ANDREA(cfg).eval()


def inputs(model, data=None) -> lesson.Inputs:
    return lesson.Inputs(model, TOK, "m", data, "no data here" if data is None else "")


def with_qk(scale: float, seed: int = 1) -> ANDREA:
    """A fresh model whose block 1 W_q and W_k are independent N(0, 1/d) times scale: q and k of
    about unit components times scale, so the scaled scores spread about scale²."""
    m = fresh()
    g = torch.Generator().manual_seed(seed)
    d = m.config.n_embd
    with torch.no_grad():
        for w in (m.h[0].attn.wq.weight, m.h[0].attn.wk.weight):
            w.copy_(torch.randn(d, d, generator=g) / math.sqrt(d) * scale)
    return m


def previous_token_model() -> ANDREA:
    """Block 1's head 1 attends to the previous token: positions are one-hot in the first 32 of
    d = 64 dimensions (wte all zero), q_i = e_i and k_j = e_(j+1), so q_i·k_j is large only at j = i − 1."""
    cfg = ModelConfig(vocab_size=TOK.vocab_size, n_embd=64, n_head=2, n_layer=1, block_size=32)
    torch.manual_seed(0)
    m = ANDREA(cfg).eval()
    with torch.no_grad():
        m.wte.weight.zero_()
        m.wpe.weight.copy_(torch.eye(32, 64))
        a = m.h[0].attn
        a.wq.weight.zero_()
        a.wk.weight.zero_()
        a.wq.weight[:32, :32] = torch.eye(32)
        a.wk.weight[1:32, 0:31] = torch.eye(31)
    return m


# ---------------------------------------------------------------- scores, scale


def test_scores_hold_where_a_head_picks_tokens_and_fail_for_even_attention():
    assert lesson.step_scores(inputs(with_qk(2.0))).verdict == HOLDS
    assert lesson.step_scores(inputs(with_qk(0.7))).verdict == CAVEAT
    s = lesson.step_scores(inputs(fresh()))
    assert s.verdict == FAILS and max(s.numbers["spread"]) < lesson.SPREAD_FLAT
    n = len(s.numbers["tokens"])
    assert np.array(s.numbers["pattern"]).shape == (2, n, n) and np.array(s.numbers["scaled"]).shape == (2, n, n)


def test_the_previous_token_head_is_found_at_the_last_query():
    s = lesson.step_scores(inputs(previous_token_model()))
    n = len(s.numbers["tokens"])
    assert s.verdict == HOLDS and s.numbers["last_query_top_key"][0] == n - 2


def test_scale_measures_root_d_before_and_one_after_and_flags_a_model_of_its_own_scale():
    rand = lesson.random_dot_spread((8, 32, 128))
    for d, (before, after) in rand.items():
        assert before == pytest.approx(math.sqrt(d), rel=0.06) and after == pytest.approx(1.0, rel=0.06)
    s = lesson.step_scale(inputs(with_qk(1.0)))
    assert s.verdict == HOLDS and 1 / 3 <= s.numbers["model_after"] <= 3
    assert s.numbers["model_before"] == pytest.approx(s.numbers["model_after"] * math.sqrt(16))
    assert lesson.step_scale(inputs(fresh())).verdict == CAVEAT  # a fresh model's scores spread far under 1


# ---------------------------------------------------------------- mask and rebuild


def non_causal(q, k, v, keys=None, values=None, at=0, mask=None):
    return F.scaled_dot_product_attention(q, k, v)


def flat_scale(q, k, v, keys=None, values=None, at=0, mask=None):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1.0)


def test_mask_holds_for_causal_attention_and_fails_when_block_one_sees_later_tokens(monkeypatch):
    s = lesson.step_mask(inputs(with_qk(2.0)))
    assert s.verdict == HOLDS and s.numbers["above_diagonal_max"] == 0 and s.numbers["earlier_positions_moved"] < 1e-6
    monkeypatch.setattr("andrea.model.attend", non_causal)
    s = lesson.step_mask(inputs(with_qk(2.0)))
    assert s.verdict == FAILS and "sees later tokens" in s.why


def test_rebuild_matches_the_models_output_and_fails_for_attention_of_another_scale(monkeypatch):
    s = lesson.step_rebuild(inputs(with_qk(2.0)))
    assert s.verdict == HOLDS and s.numbers["relative"] < 1e-5
    monkeypatch.setattr("andrea.model.attend", flat_scale)
    assert lesson.step_rebuild(inputs(with_qk(2.0))).verdict == FAILS


# ---------------------------------------------------------------- heads


def test_heads_find_a_previous_token_head_and_fail_where_none_formed(monkeypatch):
    s = lesson.step_heads(inputs(previous_token_model()))
    kinds = s.numbers["kinds"]
    assert kinds["previous"]["verdict"] == "present" and kinds["previous"]["best"] > 0.9
    assert (kinds["previous"]["block"], kinds["previous"]["head"]) == (1, 1)
    assert kinds["induction"]["verdict"] == "not yet" and s.verdict == CAVEAT and "induction" in s.why
    s = lesson.step_heads(inputs(fresh()))
    assert s.verdict == FAILS and all(v["verdict"] == "not yet" for v in s.numbers["kinds"].values())
    monkeypatch.setattr(lesson, "patterns", lambda model, ids: kind_patterns((ids.shape[1] - 1) // 2))
    assert lesson.step_heads(inputs(fresh())).verdict == HOLDS  # every kind present: the verdict says so


# ---------------------------------------------------------------- ablation and later: a trained model on data


def test_ablation_and_later_hold_on_a_trained_model_and_fail_on_one_that_cannot_look_back(trained, copy_data):
    inp = lesson.load_inputs(trained)
    assert inp.data is not None
    s = lesson.step_ablation(inp)
    assert s.verdict == HOLDS and s.numbers["largest"] >= lesson.MIN_COST
    assert np.array(s.numbers["costs"]).shape == (2, 2)
    assert s.numbers["all_heads"] > s.numbers["largest"]
    s = lesson.step_later(inp)
    assert s.verdict == HOLDS and s.numbers["score"] > 2 * s.numbers["standard_error"]
    data = TokenData(copy_data)
    blank = ANDREA(tiny_config(copy_data)).eval()
    with torch.no_grad():
        blank.wpe.weight.zero_()  # the prediction depends on the current token alone
        for block in blank.h:
            block.attn.wo.weight.zero_()
    inp = lesson.Inputs(blank, data.load_tokenizer(), "blank", data, "")
    assert lesson.step_ablation(inp).verdict == FAILS
    assert lesson.step_later(inp).verdict == FAILS


def test_ablation_says_the_heads_share_the_work_when_only_all_of_them_together_pass(trained, monkeypatch):
    inp = lesson.load_inputs(trained)
    s = lesson.step_ablation(inp)
    monkeypatch.setattr(lesson, "MIN_COST", (s.numbers["largest"] + s.numbers["all_heads"]) / 2)
    s = lesson.step_ablation(inp)
    assert s.verdict == CAVEAT and "share the work" in s.why


def test_ablation_and_later_cannot_be_checked_without_the_runs_data():
    for step in (lesson.step_ablation, lesson.step_later):
        s = step(inputs(fresh()))
        assert s.verdict == CANNOT and s.why == "no data here"


# ---------------------------------------------------------------- the command


def test_the_command_walks_every_step_on_a_run_and_says_what_a_bare_file_lacks(trained, tmp_path, capsys):
    assert main(["lesson", "attention", "--checkpoint", str(trained), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["walk"] == "attention" and [s["key"] for s in out["steps"]] == [
        "scores", "scale", "mask", "rebuild", "heads", "ablation", "later"]
    assert all(s["verdict"] != CANNOT for s in out["steps"])
    bare = tmp_path / "bare.safetensors"
    bare.write_bytes((trained / "latest.safetensors").read_bytes())
    assert main(["lesson", "attention", "--checkpoint", str(bare)]) == 0
    text = capsys.readouterr().out
    assert text.count("   cannot check: ") == 2 and "7. Later tokens" in text and text.endswith("2 cannot check\n")


def test_the_embedding_walk_stays_the_default_and_its_json_gives_the_reference_tables_as_numbers(capsys, tmp_path):
    m = fresh()
    path = save_checkpoint(tmp_path / "m.safetensors", m.config, m.state_dict(), meta={"tokenizer": TOK.to_dict()})
    assert main(["lesson", "--checkpoint", str(path), "--json", "--no-ppmi"]) == 0
    out = json.loads(capsys.readouterr().out)
    tables = next(s for s in out["steps"] if s["key"] == "tables")["numbers"]
    assert out["walk"] == "embedding" and tables["reference_embedding"] == 7_275_264


def test_a_model_whose_context_is_shorter_than_the_prompt_walks_every_step_on_what_fits():
    m = fresh(block_size=6)
    steps = lesson.lesson(inputs(m))
    assert [s.key for s in steps] == ["scores", "scale", "mask", "rebuild", "heads", "ablation", "later"]
    scores = steps[0]
    assert len(scores.numbers["tokens"]) == 6 and scores.numbers["prompt"] == "the cat sat"  # BOS, t, h, e, ␣cat, ␣sat
    assert "(6 tokens)" in scores.how and steps[3].verdict == HOLDS
