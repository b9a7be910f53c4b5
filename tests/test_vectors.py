"""andrea.inside.vectors: one cosine, one nearest, one whole-word rule, and the views that use them agree."""

import math

import numpy as np
import pytest
import torch

from andrea.config import ModelConfig
from andrea.inside.embed import neighbours
from andrea.inside.vectors import cosine, cosine_matrix, nearest, scores, unit_rows, vector_stats, whole_word_mask
from andrea.model import ANDREA
from andrea.snapshots.store import Growth
from andrea.snapshots.timeline import Timeline, neighbours_at
from andrea.tokenizer.harris import HarrisTokenizer


def test_vector_stats_match_hand_computed_values():
    u, v = np.array([3.0, 4, 0, 0]), np.array([4.0, 3, 0, 0])
    s = vector_stats(u, v)
    assert s["dot"] == pytest.approx(24.0)
    assert s["norm_u"] == pytest.approx(5.0) and s["norm_v"] == pytest.approx(5.0)
    assert s["cos"] == pytest.approx(0.96)
    assert s["angle_deg"] == pytest.approx(math.degrees(math.acos(0.96)))
    assert s["angle_deg"] == pytest.approx(16.26, abs=0.005)
    assert vector_stats(np.array([1.0, 0]), np.array([0.0, 2]))["angle_deg"] == pytest.approx(90.0)
    assert vector_stats(np.array([1.0, 1]), np.array([-2.0, -2]))["angle_deg"] == pytest.approx(180.0)


def test_a_zero_or_unkept_vector_has_cosine_0_everywhere():
    zero, one, nan = np.zeros(3), np.ones(3), np.full(3, np.nan)
    assert cosine(zero, one) == 0.0 and cosine(one, zero) == 0.0 and cosine(nan, one) == 0.0
    s = vector_stats(zero, one)
    assert s["cos"] == 0.0 and math.isnan(s["angle_deg"])
    m = np.array([[3.0, 4], [0, 0], [np.nan, np.nan]])
    assert np.array_equal(unit_rows(m), [[0.6, 0.8], [0, 0], [0, 0]])
    assert np.array_equal(scores(m, [1.0, 0]), [0.6, 0, 0]) and np.array_equal(scores(m, [0.0, 0]), [0, 0, 0])
    sim = cosine_matrix(m)
    assert sim[1].tolist() == [0, 0, 0] and sim[0, 0] == pytest.approx(1)


def test_nearest_breaks_ties_by_the_lower_id_and_keeps_only_what_it_is_told():
    m = np.array([[1.0, 0], [2.0, 0], [0, 1], [3.0, 0], [1.0, 1]])
    assert nearest(m, [1.0, 0], k=3) == [(0, 1.0), (1, 1.0), (3, 1.0)]
    assert nearest(m, [1.0, 0], k=2, exclude={0}) == [(1, 1.0), (3, 1.0)]
    only = np.array([False, False, True, True, True])
    assert [i for i, _ in nearest(m, [1.0, 0], k=5, only=only)] == [3, 4, 2]


WORDS = ["cat", "dog", "pet", "red", "blue", "mat"]
TOK = HarrisTokenizer([" " + w for w in WORDS] + ["ing", " 7"])


def test_whole_words_are_a_space_and_letters():
    mask = whole_word_mask(TOK, TOK.vocab_size)
    ids = {TOK.id_to_piece(int(i)) for i in np.flatnonzero(mask)}
    assert ids == {" " + w for w in WORDS}


@pytest.mark.parametrize("whole_words", [True, False])
def test_the_token_view_and_the_growth_view_give_the_same_neighbours(tmp_path, whole_words):
    """embed.neighbours (the Token view, `andrea embed neighbors`) and timeline.neighbours_at (the
    Growth view) on the same table: the same tokens, order and scores, ties included."""
    torch.manual_seed(0)
    model = ANDREA(ModelConfig(vocab_size=TOK.vocab_size, n_embd=8, n_head=2, n_layer=1, block_size=8))
    row = {w: TOK.encode(" " + w, bos=False)[0] for w in WORDS}
    with torch.no_grad():  # three rows point exactly where cat's does (scaled by powers of 2): a three-way tie
        for w, scale in (("mat", 2), ("red", 4), ("dog", 8)):
            model.wte.weight[row[w]] = scale * model.wte.weight[row["cat"]]
    Growth(tmp_path, TOK.vocab_size, 8, np.arange(TOK.vocab_size), torch.float32, "v2", log=lambda *a: None).take(0, model)
    token_view = neighbours(model, TOK, "cat", 6, "cos", "input", whole_words=whole_words)["neighbours"]
    growth_view = neighbours_at(Timeline(tmp_path, TOK), 0, "cat", 6, "input", whole_words)["neighbours"]
    assert [n["id"] for n in token_view] == [n["id"] for n in growth_view]
    assert [n["score"] for n in token_view] == pytest.approx([n["score"] for n in growth_view], abs=1e-6)
    assert [n["id"] for n in token_view[:3]] == sorted(row[w] for w in ("mat", "red", "dog"))  # the tie, by id
