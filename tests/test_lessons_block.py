"""andrea.inside.lessons.block and `andrea lesson block`: each verdict on a model built to hold and on one built not to."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn as nn
from helpers import opts, tiny_config

from andrea.cli import main
from andrea.config import ModelConfig, count_params, get_preset
from andrea.errors import AndreaError
from andrea.evaluate import bits_per_byte, position_nats
from andrea.inside.lessons import block as lesson
from andrea.inside.lessons.report import CANNOT, CAVEAT, FAILS, HOLDS
from andrea.model import ANDREA, activate
from andrea.shards import TokenData
from andrea.tokenizer.harris import HarrisTokenizer
from andrea.train import train

pytestmark = pytest.mark.usefixtures("one_thread")

TOK = HarrisTokenizer([" " + w for w in ("the", "cat", "sat", "on", "mat", "and", "slept", "dog", "ran")])


def fresh(seed: int = 0, **changes) -> ANDREA:
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=TOK.vocab_size, n_embd=32, n_head=2, n_layer=2, block_size=32).replace(**changes)
    return ANDREA(cfg).eval()


def inputs(model, data=None, tok=TOK) -> lesson.Inputs:
    return lesson.Inputs(model, tok, "m", data, "no data here" if data is None else "")


def on_run(run) -> lesson.Inputs:
    return lesson.load_inputs(run)


# ---------------------------------------------------------------- the block, the norm, the MLP, the stream


def post_norm(block):
    """Block.forward as a post-norm block computes it: ln(x + attn(x)), then ln(x + mlp(x))."""
    def forward(x, rope=None, *args, **kwargs):
        x = block.ln_1(x + block.attn(x, rope))
        return block.ln_2(x + block.mlp(x))
    return forward


@pytest.mark.parametrize("changes", [{}, {"pos": "rope"}, {"norm": "rmsnorm", "act": "gelu"}])
def test_the_block_rebuilt_from_its_weights_is_the_models_and_a_post_norm_block_is_not(changes):
    s = lesson.step_block(inputs(fresh(**changes)))
    assert s.verdict == HOLDS and len(s.numbers["block_gaps"]) == 2 and max(s.numbers["block_gaps"]) < 1e-5
    model = fresh(**changes)
    model.h[1].forward = post_norm(model.h[1])
    s = lesson.step_block(inputs(model))
    assert s.verdict == FAILS and s.numbers["logit_gap"] > 1e-3


class Uncentred(nn.LayerNorm):
    """Scales each row by its spread but does not take its mean away."""

    def forward(self, x):
        return x / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + self.eps) * self.weight + self.bias


def test_layer_norm_gives_rows_of_mean_0_and_spread_1_and_a_norm_that_does_not_centre_fails():
    model = fresh()
    with torch.no_grad():  # gains and biases of their own, so taking them off is checked
        for name, p in model.named_parameters():
            if "ln_" in name:
                p.add_(0.2 * torch.randn(p.shape))
    s = lesson.step_norm(inputs(model))
    assert s.verdict == HOLDS and len(s.numbers["norms"]) == 2 * 2 + 1
    assert s.numbers["largest_mean"] < 1e-5 and s.numbers["largest_spread_error"] < 1e-5
    assert all(0.9 < r["out_spread"][0] <= 1 for r in s.numbers["norms"])
    uncentred = Uncentred(32)
    uncentred.load_state_dict(model.h[0].ln_2.state_dict())
    model.h[0].ln_2 = uncentred
    s = lesson.step_norm(inputs(model))
    assert s.verdict == FAILS and s.numbers["largest_mean"] > 1e-3
    s = lesson.step_norm(inputs(fresh(norm="rmsnorm")))
    assert s.verdict == CAVEAT and "RMSNorm" in s.why


def test_the_mlp_works_one_position_at_a_time_and_one_that_mixes_positions_fails():
    s = lesson.step_mlp(inputs(fresh()))
    assert s.verdict == HOLDS and s.numbers["others_moved"] == 0 and s.numbers["own_moved"] > 0
    assert s.numbers["hidden_width"] == 4 * 32 and 0 < s.numbers["firing"]["mean"][0] < 128
    h = s.numbers["prompt_hidden"]
    assert len(h["values"]) == s.numbers["tokens"] and len(h["values"][0]) == len(h["units"]) == lesson.SHOWN_UNITS
    model = fresh()
    mlp = model.h[0].mlp
    mlp.forward = lambda x, *a: mlp.fc2(activate(mlp.fc1(x.cumsum(1)), mlp.act))  # each position sees the earlier ones
    s = lesson.step_mlp(inputs(model))
    assert s.verdict == FAILS and s.numbers["others_moved"] > 0


def test_the_stream_is_the_sum_of_what_the_blocks_add_and_a_block_that_replaces_it_fails():
    s = lesson.step_stream(inputs(fresh()))
    assert s.verdict == HOLDS and s.numbers["forward_gap"] == 0 and s.numbers["sum_gap"] < 1e-5
    assert len(s.numbers["norms"]) == 3 and len(s.numbers["blocks"]) == 2
    model = fresh()
    block = model.h[1]
    block.forward = lambda x, rope=None, *a, **k: block.attn(block.ln_1(x), rope) + block.mlp(block.ln_2(x))
    s = lesson.step_stream(inputs(model))
    assert s.verdict == FAILS and s.numbers["forward_gap"] > 0


# ---------------------------------------------------------------- on held-out text: the lens, removal, the head


@pytest.fixture(scope="module")
def one_block(copy_data, tmp_path_factory):
    """A 1-block model trained 300 steps on the copy documents (a few seconds)."""
    run = tmp_path_factory.mktemp("one-block") / "run"
    train(tiny_config(copy_data, n_layer=1), opts(max_steps=300, eval_every=300, checkpoint_every=300, warmup_steps=10,
                                                  batch_size=8, micro_batch=8, snapshots=False, lr=1e-2),
          copy_data, run, log=lambda *a: None, progress=False)
    return run


def test_the_lens_reads_the_model_itself_last_and_judges_each_block_by_what_it_adds(trained, one_block):
    s = lesson.step_lens(on_run(one_block))
    assert s.verdict == HOLDS and s.numbers["bpb"][1] < s.numbers["bpb"][0]
    inp = on_run(trained)
    s = lesson.step_lens(inp)
    x, y, nbytes = inp.windows
    own = bits_per_byte(position_nats(inp.model, x, y, lesson.MICRO, dtype=torch.float64).sum(), nbytes)
    assert s.numbers["stages"] == ["embedding", "block 1", "block 2"]
    assert s.numbers["bpb"][-1] == pytest.approx(own, rel=1e-9)  # the last stage is the model itself
    b = s.numbers["bpb"]
    rule = HOLDS if b[0] > b[1] > b[2] else CAVEAT if b[2] < b[0] and b[2] == min(b) else FAILS
    assert s.verdict == rule  # 2 blocks on 240 short documents: block 2 may fit the training text alone
    with inp.model.removed(attention=[1], mlp=[1]):  # block 2 adds nothing: its stage is block 1's
        s = lesson.step_lens(inp)
    assert s.numbers["bpb"][2] == s.numbers["bpb"][1] and "block 2" in s.numbers["rises"]
    assert s.verdict == (CAVEAT if s.numbers["bpb"][1] < s.numbers["bpb"][0] else FAILS)
    with torch.no_grad():
        inp.model.h[1].mlp.fc2.weight.mul_(40.0)
    try:
        s = lesson.step_lens(inp)
        assert s.verdict == FAILS and s.numbers["bpb"][-1] > min(s.numbers["bpb"])
    finally:
        with torch.no_grad():
            inp.model.h[1].mlp.fc2.weight.div_(40.0)


def test_removing_each_part_costs_bits_on_a_trained_model_and_nothing_where_the_parts_are_zero(trained, copy_data, monkeypatch):
    inp = on_run(trained)
    s = lesson.step_removal(inp)
    costs = s.numbers["costs"]
    assert len(costs["attention"]) == len(costs["mlp"]) == 2 and s.verdict in (HOLDS, CAVEAT)
    assert max(costs["attention"]) >= lesson.MIN_COST  # the copy documents need attention
    monkeypatch.setattr(lesson, "MIN_COST", sorted(costs["attention"] + costs["mlp"])[1] + 1e-9)
    s = lesson.step_removal(inp)
    assert s.verdict == CAVEAT and len(s.numbers["weak"]) == 2
    monkeypatch.undo()
    data = TokenData(copy_data)
    dead = ANDREA(tiny_config(copy_data)).eval()
    with torch.no_grad():
        for block in dead.h:
            block.attn.wo.weight.zero_()
            block.mlp.fc2.weight.zero_()
    s = lesson.step_removal(lesson.Inputs(dead, data.load_tokenizer(), "dead", data, ""))
    assert s.verdict == FAILS and all(c == 0 for part in s.numbers["costs"].values() for c in part)


def test_the_head_is_its_own_table_on_a_trained_model_and_a_tied_or_copied_head_is_not(trained):
    inp = on_run(trained)
    s = lesson.step_head(inp)
    assert s.verdict == HOLDS and s.numbers["tying_cost"] > 0 and s.numbers["logit_gap"] < 1e-4
    model = fresh()
    s = lesson.step_head(inputs(model))
    near = s.numbers["cat"]["neighbours"]
    assert len(near) == lesson.NEIGHBOURS and s.numbers["cat"]["id"] not in [n["id"] for n in near]
    assert [n["cos"] for n in near] == sorted((n["cos"] for n in near), reverse=True)
    model.lm_head.weight = model.wte.weight  # tied: one tensor
    assert lesson.step_head(inputs(model)).verdict == FAILS
    copied = inp.model
    kept = copied.lm_head.weight.detach().clone()
    with torch.no_grad():
        copied.lm_head.weight.copy_(copied.wte.weight)  # the input table's values in a head of its own
    try:
        s = lesson.step_head(inp)
        assert s.verdict == CAVEAT and s.numbers["tying_cost"] == 0
    finally:
        with torch.no_grad():
            copied.lm_head.weight.copy_(kept)


def test_the_steps_that_read_held_out_text_say_what_they_lack_without_it():
    for step in (lesson.step_lens, lesson.step_removal):
        s = step(inputs(fresh()))
        assert s.verdict == CANNOT and s.why == "no data here"
    s = lesson.step_head(inputs(fresh()))
    assert s.verdict == HOLDS and "tying_cost" not in s.numbers


# ---------------------------------------------------------------- the parameters


def test_the_blocks_share_comes_from_the_presets_and_a_large_vocabulary_gets_a_caveat():
    ref = lesson.block_share(get_preset("andrea-120m"))
    # the specification's formula, L·(12d² + 4d) of L·(12d² + 4d) + 2·V·d + T·d + 2d = 98,737,152
    assert ref["blocks"] == 12 * (12 * 768**2 + 4 * 768) == 84_971_520 and ref["total"] == 98_737_152
    assert ref["embedding"] == 7_275_264
    s = lesson.step_params(inputs(fresh()))
    assert s.verdict == HOLDS and s.numbers["model"]["total"] == count_params(fresh().config)
    cpu = get_preset("andrea-cpu")
    assert lesson.block_share(cpu)["blocks"] == 4 * (12 * 128**2 + 4 * 128)
    s = lesson.step_params(inputs(fresh(vocab_size=2000, n_embd=16)))
    assert s.verdict == CAVEAT and "tables hold more" in s.why
    model = fresh()
    model.extra = nn.Parameter(torch.zeros(3))
    assert lesson.step_params(inputs(model)).verdict == FAILS


# ---------------------------------------------------------------- the command


def test_the_command_walks_every_step_on_a_run_and_says_what_a_bare_file_lacks(trained, tmp_path, capsys):
    assert main(["lesson", "block", "--checkpoint", str(trained), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["walk"] == "block" and [s["key"] for s in out["steps"]] == [
        "block", "norm", "mlp", "stream", "lens", "removal", "head", "params"]
    assert all(s["verdict"] != CANNOT for s in out["steps"])
    bare = tmp_path / "bare.safetensors"
    bare.write_bytes((trained / "latest.safetensors").read_bytes())
    assert main(["lesson", "block", "--checkpoint", str(bare)]) == 0
    text = capsys.readouterr().out
    assert text.count("   cannot check: ") == 2 and "8. The blocks hold" in text and text.endswith("2 cannot check\n")


def test_a_model_without_blocks_is_refused_in_a_sentence():
    model = fresh()
    model.h = nn.ModuleList()
    with pytest.raises(AndreaError, match="no blocks"):
        lesson.lesson(inputs(model))


def test_the_trace_is_the_only_walk_over_the_blocks_outside_the_model():
    """The looking-inside code reads ANDREA.trace: no module of andrea but the model, the decode
    plan's weight gathering and the distributed wrapper loops over model.h."""
    import pathlib
    import re

    import andrea

    root = pathlib.Path(andrea.__file__).parent
    walks = {str(p.relative_to(root)) for p in root.rglob("*.py")
             if re.search(r"for [\w, ()]+ in (enumerate\()?[\w.]*\bh\b\)?:", p.read_text()) and "model.h" in p.read_text()}
    assert walks <= {"model.py", "decoding/plan.py", "distributed.py"}, walks
