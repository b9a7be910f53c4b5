"""What each attention head attends to (andrea.inside.heads): each kind's score on patterns built to
hold it and on even attention, the probe's repeated random sequences, and the scores a run keeps
at every snapshot."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import kind_patterns, opts, tiny_config
from test_lessons_attention import TOK, previous_token_model

from andrea.config import BOS, N_SPECIAL
from andrea.errors import AndreaError
from andrea.inside import heads
from andrea.train import train

pytestmark = pytest.mark.usefixtures("one_thread")


def test_head_scores_give_each_kind_to_its_head_and_chance_for_even_attention():
    n = 10
    scores, chance = heads.head_scores(kind_patterns(n), n)
    for head, kind in enumerate(heads.KINDS):
        assert scores[kind][0, head] == pytest.approx(1.0)
        assert all(scores[kind][0, h] < 0.6 for h in range(4) if h != head and not (kind == "first" and h != 0))
    T = 2 * n + 1
    even = np.tril(np.ones((T, T))) / np.arange(1, T + 1)[:, None]
    scores, _ = heads.head_scores(even[None, None, None], n)
    for kind in heads.KINDS:
        assert scores[kind][0, 0] == pytest.approx(chance[kind])


def test_random_repeats_are_bos_then_a_sequence_twice_of_distinct_tokens():
    ids = heads.random_repeats(TOK.vocab_size, 8, seqs=3)
    assert ids.shape == (3, 17) and (ids[:, 0] == BOS).all() and (ids[:, 1:9] == ids[:, 9:]).all()
    assert all(len(set(r[1:9])) == 8 for r in ids) and not (ids[:, 1:] == BOS).any()


def test_random_repeats_draw_from_the_most_used_segments_unless_told_otherwise():
    common = heads.random_repeats(5_000, 64, seqs=8, common=100)
    assert common.shape == (8, 129) and ((common[:, 1:] >= N_SPECIAL) & (common[:, 1:] < N_SPECIAL + 100)).all()
    every = heads.random_repeats(5_000, 64, seqs=8, common=None)
    assert (every[:, 1:] >= N_SPECIAL + 100).any() and ((every[:, 1:] >= N_SPECIAL) & (every[:, 1:] < 5_000)).all()
    assert (heads.random_repeats(5_000, 64) < N_SPECIAL + heads.COMMON).all()  # the default: the COMMON most used


def test_a_run_keeps_its_heads_scores_at_every_snapshot(data_dir, tmp_path):
    from andrea.checkpoint import load_model
    from andrea.metrics import read_metrics
    from andrea.snapshots.store import snapshot_steps

    run = tmp_path / "run"
    train(tiny_config(data_dir), opts(max_steps=8), data_dir, run, log=lambda *a: None, progress=False)
    rows = [r for r in read_metrics(run / "metrics.jsonl") if "heads" in r]
    assert [r["step"] for r in rows] == snapshot_steps(run) and rows[-1]["step"] == 8
    model, _, _ = load_model(run / "latest.safetensors")
    now = heads.score_heads(model.eval())
    assert rows[-1]["heads"]["n"] == now["n"] == 15  # BOS + r + r in a context of 32
    for kind in heads.KINDS:
        np.testing.assert_allclose(rows[-1]["heads"]["scores"][kind], now["scores"][kind], atol=2e-4)
        assert np.array(now["scores"][kind]).shape == (2, 2)


def test_score_heads_at_a_length_of_r_the_context_holds():
    model = previous_token_model().eval()  # a context of 32: r of 2 to 15 tokens fit BOS + r + r
    short = heads.score_heads(model, n=4)
    assert short["n"] == 4 and short["best"]["previous"] > 0.9
    assert heads.score_heads(model)["n"] == heads.score_heads(model, n=15)["n"] == 15
    for n in (1, 16):
        with pytest.raises(AndreaError, match=f"r of {n} tokens twice after BOS does not fit a context of 32"):
            heads.score_heads(model, n=n)
