"""andrea.inside.lessons.embedding and `andrea lesson`: every verdict on a case built to hold and on one built not to."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from andrea.cli import main
from andrea.config import ModelConfig
from andrea.inside.lessons.embedding import (
    Inputs,
    load_inputs,
    step_dot,
    step_init,
    step_lookup,
    step_pairs,
    step_positions,
    step_scores,
    step_sparse,
    step_tables,
    step_untied,
)
from andrea.inside.lessons.report import CANNOT, CAVEAT, FAILS, HOLDS
from andrea.inside.wordsim import LESSON_PAIRS, WordSets, lesson_margin
from andrea.model import ANDREA
from andrea.snapshots.store import Growth
from andrea.snapshots.timeline import Timeline
from andrea.tokenizer.harris import HarrisTokenizer
from andrea.train import train
from andrea.trainconfig import TrainConfig
from andrea.usage import count_usage, starts_word

pytestmark = pytest.mark.usefixtures("one_thread")

CIRCLE = ["red", "blue", "green", "king", "queen", "river", "stone", "bread", "horse", "cloud", "glass", "paper"]
WORDS = ["cat", "dog", "pet", "Tuesday", "xylophone", "the", "chased"] + CIRCLE
TOK = HarrisTokenizer([" " + w for w in WORDS])
ID = {w: TOK.encode(" " + w, bos=False)[0] for w in WORDS}


def model(pos: str = "learned", seed: int = 0) -> ANDREA:
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=TOK.vocab_size, n_embd=32, n_head=2, n_layer=1, block_size=16, pos=pos)
    return ANDREA(cfg).eval()


def usage_of(tok, text: str):
    return count_usage([[np.array(tok.encode(text), dtype=np.uint16)]], tok.vocab_size, starts_word(tok))


def usage(text: str):
    return usage_of(TOK, text)


ALONE = usage(" " + " ".join(WORDS * 30))  # every word stands alone in all of its 30 uses


def set_rows(m: ANDREA, rows: dict[str, np.ndarray]) -> None:
    with torch.no_grad():
        for w, v in rows.items():
            m.wte.weight[ID[w]] = torch.tensor(v, dtype=torch.float32)


# ---------------------------------------------------------------- lookup, tables, dot, untied


def test_lookup_holds_for_an_embedding_and_not_for_a_table_that_computes():
    assert step_lookup(Inputs(model(), TOK, "m")).verdict == HOLDS

    class Doubled(torch.nn.Embedding):
        def forward(self, ids):
            return 2 * super().forward(ids)

    m = model()
    doubled = Doubled(m.config.vocab_size, m.config.n_embd)
    doubled.weight = m.wte.weight
    m.wte = doubled
    assert step_lookup(Inputs(m, TOK, "m")).verdict == FAILS


def test_tables_count_this_model_and_andrea_120m_and_fail_without_a_position_table():
    s = step_tables(Inputs(model(), TOK, "m"))
    assert s.verdict == HOLDS
    assert s.numbers["wte"] == TOK.vocab_size * 32 and s.numbers["wpe"] == 16 * 32
    assert (s.numbers["reference_wte"], s.numbers["reference_wpe"]) == (6_488_832, 786_432)
    assert "7,275,264" in s.how
    rope = step_tables(Inputs(model("rope"), TOK, "m"))
    assert rope.verdict == FAILS and rope.numbers["wpe"] == 0 and "rope" in rope.why


def test_dot_product_identity_holds_and_a_zero_row_cannot_be_checked():
    s = step_dot(Inputs(model(), TOK, "m"))
    assert s.verdict == HOLDS and s.numbers["difference"] < 1e-12
    m = model()
    set_rows(m, {"cat": np.zeros(32)})
    assert step_dot(Inputs(m, TOK, "m")).verdict == CANNOT


def test_untied_holds_for_two_tables_and_fails_for_one():
    assert step_untied(Inputs(model(), TOK, "m")).verdict == HOLDS
    m = model()
    m.lm_head.weight = m.wte.weight
    s = step_untied(Inputs(m, TOK, "m"))
    assert s.verdict == FAILS and s.numbers["shared_storage"]


# ---------------------------------------------------------------- positions


def test_positions_hold_for_a_learned_table_and_not_without_one():
    s = step_positions(Inputs(model(), TOK, "m"))
    assert s.verdict == HOLDS and s.numbers["max_difference"] < 1e-6 and s.numbers["order"]["x_difference"] > 0
    assert step_positions(Inputs(model("sinusoidal"), TOK, "m")).verdict == CAVEAT
    rope = step_positions(Inputs(model("rope"), TOK, "m"))
    assert rope.verdict == FAILS and rope.numbers["order"]["x_difference"] == 0 and "attention" in rope.why


def test_positions_fail_when_block_one_gets_something_else_than_the_sum():
    m = model()
    plain = m.embed
    m.embed = lambda ids, start=0: plain(ids, start) + 1
    s = step_positions(Inputs(m, TOK, "m"))
    assert s.verdict == FAILS and s.numbers["max_difference"] == pytest.approx(1, abs=1e-5)


# ---------------------------------------------------------------- init and sparse, from snapshots


def timeline(tmp_path, m, moves, first_step=0, recipe="v1") -> Timeline:
    """Two snapshots of m: at first_step, then after `moves` changed the table; cat and dog seen."""
    g = Growth(tmp_path, m.config.vocab_size, m.config.n_embd, np.arange(m.config.vocab_size), torch.float32, recipe,
               log=lambda *a: None)
    g.take(first_step, m, evaluation=True)
    seen = torch.zeros(m.config.vocab_size, dtype=torch.int64)
    seen[[ID["cat"], ID["dog"]]] = 1
    with torch.no_grad():
        moves(m.wte.weight, seen.bool())
    g.take(first_step + 1, m, evaluation=True, seen=seen)
    return Timeline(tmp_path, TOK)


def seen_only(w, seen):
    w[seen] += 0.1


def test_init_spread_holds_at_step_0_and_fails_for_a_table_three_times_as_wide(tmp_path):
    s = step_init(Inputs(model(), TOK, "m", timeline=timeline(tmp_path / "a", model(), seen_only)))
    assert s.verdict == HOLDS and s.numbers["expected_std"] == pytest.approx(1 / math.sqrt(32))
    wide = model()
    with torch.no_grad():
        wide.wte.weight *= 3
    s = step_init(Inputs(wide, TOK, "m", timeline=timeline(tmp_path / "b", wide, seen_only)))
    assert s.verdict == FAILS and s.numbers["ratio"] == pytest.approx(3, rel=0.05)
    later = step_init(Inputs(model(), TOK, "m", timeline=timeline(tmp_path / "c", model(), seen_only, first_step=5)))
    assert later.verdict == CAVEAT and "step 5" in later.why
    assert step_init(Inputs(model(), TOK, "m", timeline_note="no snapshots")).verdict == CANNOT


def test_sparse_updates_hold_when_only_seen_rows_move(tmp_path):
    s = step_sparse(Inputs(model(), TOK, "m", timeline=timeline(tmp_path / "a", model(), seen_only)))
    assert s.verdict == HOLDS and s.numbers["unseen"]["mean_moved"] == 0 and s.numbers["seen"]["tokens"] == 2


def test_sparse_updates_carry_the_optimizer_caveat_or_fail_when_every_row_moves(tmp_path):
    def decay(w, seen):
        w[seen] += 0.1
        w[~seen] *= 0.999

    s = step_sparse(Inputs(model(), TOK, "m", timeline=timeline(tmp_path / "a", model(), decay, recipe="v3")))
    assert s.verdict == CAVEAT and "weight decay" in s.why
    s = step_sparse(Inputs(model(), TOK, "m", timeline=timeline(tmp_path / "b", model(), lambda w, seen: w.add_(0.1))))
    assert s.verdict == FAILS
    assert step_sparse(Inputs(model(), TOK, "m", timeline_note="no snapshots")).verdict == CANNOT


# ---------------------------------------------------------------- pairs and scores


def lesson_rows(*related: str) -> dict[str, np.ndarray]:
    """cat close to each of `related`; the other lesson words on axes of their own."""
    rows = {w: np.eye(32)[k] for k, w in enumerate(["cat", "dog", "pet", "Tuesday", "xylophone"])}
    for k, w in enumerate(related):
        rows[w] = rows["cat"] + 0.05 * np.eye(32)[10 + k]
    return rows


def test_pairs_hold_when_cat_is_near_dog_and_pet_and_fail_when_it_is_near_tuesday():
    m = model()
    set_rows(m, lesson_rows("dog", "pet"))
    s = step_pairs(Inputs(m, TOK, "m", usage=ALONE))
    assert s.verdict == HOLDS, s.why
    assert s.numbers["cos"]["input_raw"]["cat·dog"] > 0.99 and s.numbers["usage"]["cat"]["standalone_share"] == 1
    assert s.numbers["margin"] > 0.9
    set_rows(m, lesson_rows("dog"))  # cat·pet no nearer than cat·Tuesday: the claim holds for dog alone
    s = step_pairs(Inputs(m, TOK, "m", usage=ALONE))
    assert s.verdict == CAVEAT and "cat·pet is not beyond" in s.why and s.numbers["margin"] < 0.1
    set_rows(m, lesson_rows("Tuesday"))
    assert step_pairs(Inputs(m, TOK, "m", usage=ALONE)).verdict == FAILS


def test_a_word_of_several_tokens_is_reported_apart_from_the_pairs_verdict():
    tok = HarrisTokenizer([" " + w for w in WORDS if w != "xylophone"])  # xylophone: ten byte tokens
    m = ANDREA(ModelConfig(vocab_size=tok.vocab_size, n_embd=32, n_head=2, n_layer=1, block_size=16)).eval()
    rows = lesson_rows("dog", "pet")
    with torch.no_grad():
        for w in ("cat", "dog", "pet", "Tuesday"):
            m.wte.weight[tok.word_ids(w)[0]] = torch.tensor(rows[w], dtype=torch.float32)
        for i in tok.word_ids("xylophone"):  # the pieces' mean row is cat's own
            m.wte.weight[i] = torch.tensor(rows["cat"], dtype=torch.float32)
    s = step_pairs(Inputs(m, tok, "m", usage=usage_of(tok, " " + " ".join(WORDS * 30))))
    assert len(tok.word_ids("xylophone")) == 10 and s.numbers["single"]["cat·xylophone"] is False
    assert s.numbers["cos"]["input_raw"]["cat·xylophone"] > 0.99  # it would fail the claim, were it counted
    assert s.verdict == HOLDS, s.why
    assert s.numbers["margin"] > 0.9 and "xylophone is 10 tokens" in s.how and "left out of the verdict" in s.how
    assert lesson_margin({"cat·dog": 0.5, "cat·pet": 0.4, "cat·Tuesday": 0.1, "cat·xylophone": 0.3},
                         {"cat·dog": True, "cat·pet": True, "cat·Tuesday": True, "cat·xylophone": True}) == pytest.approx(0.1)


def test_pairs_name_a_token_that_mostly_begins_longer_words():
    m = model()
    set_rows(m, lesson_rows("dog", "pet"))
    prefix = usage(" " + " ".join(WORDS * 30) + " cats" * 90)  # ␣cat stands alone in 30 of its 120 uses
    s = step_pairs(Inputs(m, TOK, "m", usage=prefix))
    assert s.verdict == CAVEAT and "␣cat stands alone in only 25% of its 120 uses" in s.why and "␣cat+s" in s.why
    unknown = step_pairs(Inputs(m, TOK, "m", usage_note="no training data"))
    assert unknown.verdict == CAVEAT and "no training data" in unknown.why


def circle_sets(agree: bool) -> tuple[WordSets, dict[str, np.ndarray]]:
    """Twelve words at 30° steps on a circle (mean row 0): ratings fall with the angle between
    them when agree, rise when not."""
    angle = {w: k * math.pi / 6 for k, w in enumerate(CIRCLE)}
    rows = {w: np.r_[math.cos(a), math.sin(a), np.zeros(30)] for w, a in angle.items()}
    pairs = []
    for i, a in enumerate(CIRCLE):
        for b in CIRCLE[i + 1:]:
            gap = min(abs(angle[a] - angle[b]), 2 * math.pi - abs(angle[a] - angle[b]))
            pairs.append((a, b, 10 - gap if agree else gap))
    return WordSets({"simlex999": pairs, "wordsim353": pairs}, []), rows


def scored(agree: bool, **kw):
    sets, rows = circle_sets(agree)
    m = model()
    with torch.no_grad():
        m.wte.weight.zero_()
    set_rows(m, rows)
    return step_scores(Inputs(m, TOK, "m", sets=sets, **kw))


def test_scores_hold_when_closeness_ranks_pairs_as_the_ratings_do():
    s = scored(True, usage=ALONE)
    assert s.verdict == HOLDS, s.why
    ws = s.numbers["sets"]["wordsim353"]["input"]
    assert ws["standalone"]["rho"] > 0.95 and ws["standalone"]["n"] == 66 == ws["single"]["n"]
    assert scored(True, usage_note="no data").verdict == CAVEAT


def test_scores_fail_when_the_ranking_is_reversed_and_cannot_be_checked_without_the_sets():
    s = scored(False, usage=ALONE)
    assert s.verdict == FAILS and s.numbers["sets"]["wordsim353"]["input"]["standalone"]["rho"] < -0.95
    assert step_scores(Inputs(model(), TOK, "m")).verdict == CANNOT


def test_scores_count_only_pairs_of_words_that_stand_alone():
    few = usage(" " + " ".join(WORDS * 30) + " reds blues greens" + " reds blues greens" * 200)
    s = scored(True, usage=few)
    ws = s.numbers["sets"]["wordsim353"]["input"]
    assert ws["single"]["n"] == 66 and ws["standalone"]["n"] == 36  # pairs among the 9 words that stand alone


# ---------------------------------------------------------------- a run folder and the command


def test_the_command_walks_every_step_on_a_run_and_what_it_can_on_a_bare_file(data_dir, tmp_path, capsys):
    cfg = ModelConfig(vocab_size=json.loads((data_dir / "manifest.json").read_text())["vocab_size"], n_embd=32,
                      n_head=2, n_layer=1, block_size=32)
    run = tmp_path / "run"
    train(cfg, TrainConfig(batch_size=4, micro_batch=2, seq_len=32, max_steps=4, eval_every=4, checkpoint_every=4,
                           warmup_steps=1, eval_windows=2, seed=7), data_dir, run, log=lambda *a: None, progress=False)
    assert main(["lesson", "--checkpoint", str(run), "--json", "--no-ppmi"]) == 0
    out = json.loads(capsys.readouterr().out)
    steps = {s["key"]: s for s in out["steps"]}
    assert list(steps) == ["lookup", "tables", "init", "sparse", "pairs", "scores", "dot", "positions", "untied"]
    assert steps["init"]["verdict"] in (HOLDS, CAVEAT) and steps["sparse"]["verdict"] != CANNOT
    assert steps["pairs"]["numbers"]["usage"]["cat"] is None or "count" in steps["pairs"]["numbers"]["usage"]["cat"]
    assert (data_dir / "usage.npz").is_file()
    bare = tmp_path / "bare.safetensors"
    bare.write_bytes((run / "latest.safetensors").read_bytes())
    assert main(["lesson", "--checkpoint", str(bare), "--no-ppmi"]) == 0
    text = capsys.readouterr().out
    assert text.count("cannot check") >= 2 and "no embedding snapshots" in text and "9. " in text


def test_the_command_refuses_a_missing_checkpoint_in_one_sentence(tmp_path, capsys):
    assert main(["lesson", "--checkpoint", str(tmp_path / "none")]) != 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_load_inputs_reads_the_runs_data_usage(data_dir, tmp_path):
    cfg = ModelConfig(vocab_size=json.loads((data_dir / "manifest.json").read_text())["vocab_size"], n_embd=32,
                      n_head=2, n_layer=1, block_size=32)
    run = tmp_path / "run"
    train(cfg, TrainConfig(batch_size=4, micro_batch=2, seq_len=32, max_steps=2, eval_every=2, checkpoint_every=2,
                           warmup_steps=1, eval_windows=2, seed=7), data_dir, run, log=lambda *a: None, progress=False)
    inp = load_inputs(run, ppmi=False)
    assert inp.usage is not None and inp.usage.count.sum() > 0 and inp.timeline is not None


@pytest.mark.hostile
def test_the_json_report_writes_null_for_a_number_that_is_not_finite(capsys):
    """NaN and ±inf are no JSON: a step whose numbers hold them is printed with null in their place,
    which every JSON reader takes (json.loads with NaN refused)."""
    from andrea.cli.common import print_json
    from andrea.inside.lessons.embedding import Inputs, to_json
    from andrea.inside.lessons.report import Step

    tok = HarrisTokenizer([" cat", " dog"])
    model = ANDREA(ModelConfig(vocab_size=tok.vocab_size, n_embd=8, n_head=2, n_layer=1, block_size=8))
    steps = [Step("sparse", "claim", "how", "holds", "", {"unseen": {"mean_moved": math.nan, "top": [math.inf, 1.5]},
                                                          "ratio": -math.inf})]
    print_json(to_json(Inputs(model, tok, "m"), steps))

    def refuse(name):
        raise ValueError(name)

    out = json.loads(capsys.readouterr().out, parse_constant=refuse)
    assert out["steps"][0]["numbers"] == {"unseen": {"mean_moved": None, "top": [None, 1.5]}, "ratio": None}
    assert out["left_out"] == []


def test_where_the_text_is_known_the_pairs_are_scored_on_the_last_blocks_word_vectors_too(tmp_path):
    """xylophone is several tokens: its pieces' mean row is no row the model learned, but the last
    block's state at its last token has seen the whole word."""
    import random

    from andrea.prepare import prepare
    from andrea.shards import TokenData
    from andrea.tokenizer.train import train_tokenizer

    rng = random.Random(0)
    words = ["cat", "dog", "pet", "Tuesday", "xylophone", "the", "on", "a", "sat", "ran"]
    docs = [" ".join(rng.choice(words) for _ in range(200)) for _ in range(30)]
    (tmp_path / "a.txt").write_text("\n\n".join(docs))
    tok = train_tokenizer([d.replace("xylophone", "dog") for d in docs[:10]], 8)  # xylophone stays in pieces
    prepare(tok, [str(tmp_path / "a.txt")], tmp_path / "data", log=lambda *a: None, progress=False)
    data = TokenData(tmp_path / "data")
    torch.manual_seed(0)
    m = ANDREA(ModelConfig(vocab_size=tok.vocab_size, n_embd=32, n_head=2, n_layer=2, block_size=32)).eval()
    s = step_pairs(Inputs(m, tok, "m", data=data))
    blocks = s.numbers["blocks"]
    assert blocks["block"] == 2 and set(blocks["cos"]) == {f"{a}·{b}" for a, b in LESSON_PAIRS}
    assert all(n >= 1 for n in blocks["uses"].values()) and "from block 2's hidden states" in s.how
    assert len(tok.word_ids("xylophone")) > 1 and all(-1 <= v <= 1 for v in blocks["cos"].values())
    assert "blocks" not in step_pairs(Inputs(m, tok, "m")).numbers  # no text, no block vectors
    # the scores step: pairs with a word of several tokens also on those vectors, beside the pieces' rows
    pairs = [("cat", "xylophone", 1.0), ("dog", "xylophone", 2.0), ("pet", "xylophone", 3.0), ("cat", "dog", 9.0),
             ("the", "xylophone", 4.0), ("sat", "xylophone", 5.0)]
    sets = WordSets({"simlex999": pairs, "wordsim353": pairs}, [])
    said = []
    s = step_scores(Inputs(m, tok, "m", data=data, sets=sets, log=said.append))
    blocks = s.numbers["blocks"]
    assert any("uses of 6 words" in m for m in said) and any("windows" in m for m in said)  # the slow part says so
    ws = blocks["sets"]["wordsim353"]
    assert blocks["block"] == 2 and ws["of"] == 5 and ws["blocks"]["n"] == ws["input"]["n"] == ws["pairs"] == 5
    assert all(-1 <= ws[k]["rho"] <= 1 for k in ("blocks", "input")) and "block 2's word vectors" in s.how
    assert "blocks" not in step_scores(Inputs(m, tok, "m", sets=sets)).numbers
