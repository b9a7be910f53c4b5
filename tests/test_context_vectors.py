"""andrea.context_vectors and `andrea embed similarity --layer`: word vectors from the blocks."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from helpers import WORDS, opts, tiny_config

from andrea.cli import main
from andrea.context_vectors import BlockVectors, best_layer, block_vectors, find_uses, last_states, layer_scores
from andrea.embed import residual_stream
from andrea.model import ANDREA
from andrea.shards import TokenData
from andrea.train import train
from andrea.wordsim import WordSets

pytestmark = pytest.mark.usefixtures("one_thread")


def test_find_uses_takes_whole_words_with_room_for_their_context():
    #          0  1  2  3  4  5  6  7  8  9 10 11 12
    shard = np.array([5, 1, 7, 8, 2, 5, 9, 7, 8, 9, 5, 7, 8], dtype=np.uint16)
    ends = np.ones(10, dtype=bool)
    ends[9] = False  # token 9 goes on with the word before it
    found = find_uses([shard], {"a": [5], "b": [7, 8]}, ends, context=3, limit=10)
    # a at 0: no room for 2 tokens before it; at 5: followed by 9, which continues it; at 10: ends at 11
    assert found["a"] == [(0, 10)]
    # b ends at 3 (then 2), at 8 (then 9: goes on) and at 12 (the shard's last token: what follows is unknown)
    assert found["b"] == [(0, 3)]
    many = np.tile(np.array([1, 1, 5, 2], dtype=np.uint16), 50)
    picked = find_uses([many], {"a": [5]}, ends, context=2, limit=7, seed=3)["a"]
    assert len(picked) == 7 and picked == sorted(picked) and all(many[p] == 5 for _, p in picked)
    assert picked == find_uses([many], {"a": [5]}, ends, context=2, limit=7, seed=3)["a"]  # seeded


@pytest.fixture(scope="module")
def run(data_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("cv") / "run"
    train(tiny_config(data_dir), opts(max_steps=8, snapshots=False), data_dir, out, log=lambda *a: None, progress=False)
    return out


def test_a_words_vector_is_the_mean_of_the_blocks_states_at_its_last_token(run, data_dir):
    from andrea.checkpoint import load_model

    model, tok, _ = load_model(run)
    data = TokenData(data_dir)
    several = next(w.capitalize() for w in WORDS if len(tok.word_ids(w.capitalize())) > 1)  # begins a sentence
    bv = block_vectors(model.eval(), tok, data, ["cat", several, "zzzq"], uses=5, context=12)
    shards = [s for src in data.sources.values() for s in src.train.shards]
    from andrea.usage import starts_word

    found = find_uses(shards, {w: tok.word_ids(w) for w in ("cat", several)}, starts_word(tok), 12, 5)
    for w in ("cat", several):
        assert bv.uses[bv.row(w)] == len(found[w]) > 0
        states = [residual_stream(model, [int(t) for t in shards[k][p - 11 : p + 1]]) for k, p in found[w]]
        expected = np.stack([[s[0, -1].double().numpy() for s in st[1:]] for st in states]).mean(axis=0)
        np.testing.assert_allclose(bv.vectors[:, bv.row(w)], expected, rtol=1e-5, atol=1e-6)
    assert bv.uses[bv.row("zzzq")] == 0  # never in the text


def test_a_blocks_state_at_the_last_token_depends_on_the_context_before_it():
    torch.manual_seed(0)
    from andrea.config import ModelConfig

    m = ANDREA(ModelConfig(vocab_size=300, n_embd=32, n_head=2, n_layer=2, block_size=16)).eval()
    a = last_states(m, torch.tensor([[1, 2, 3, 9], [4, 5, 6, 9]]))
    assert a.shape == (2, 2, 32) and not torch.allclose(a[:, 0], a[:, 1])  # same token, other context
    b = last_states(m, torch.tensor([[1, 2, 3, 9]]))
    torch.testing.assert_close(a[:, :1], b)


def planted(n_layer: int = 2) -> tuple[BlockVectors, WordSets, object]:
    """Words w0..w5 with ratings r(i, j) = −|i − j|; block 2's vectors on a half circle (closer
    angle: higher rating), block 1's the same points with the words shuffled; w5 has too few uses."""
    words = [f"w{i}" for i in range(6)]
    angles = np.linspace(0, np.pi / 2, 6)
    circle = np.stack([np.cos(angles), np.sin(angles), np.zeros(6)], 1) * 3 + np.array([0, 0, 1.0])
    vectors = np.zeros((n_layer, 6, 3))
    vectors[1] = circle
    vectors[0] = circle[[2, 4, 0, 3, 1, 5]]  # the same points, the words shuffled among them
    pairs = [(words[i], words[j], float(-abs(i - j))) for i in range(6) for j in range(i + 1, 6)]
    sets = WordSets({"simlex999": pairs, "wordsim353": pairs[:6]}, [])

    class Tok:
        def word_ids(self, w):
            return [int(w[1:])]

    return BlockVectors(words, vectors, np.array([8, 8, 8, 8, 8, 1]), context=8, max_uses=8), sets, Tok()


def test_layer_scores_rank_each_block_on_the_same_pairs_beside_the_tables():
    bv, sets, tok = planted()
    table = np.eye(6, 3) + 0.01
    r = layer_scores(bv, tok, sets, {"input": table}, min_uses=4)
    part = r["sets"]["simlex999"]
    assert r["words"] == 5 and part["pairs"] == 10 and part["of"] == 15  # w5's pairs left out
    assert set(part["scores"]) == {"block 1", "block 2", "input"}
    assert all(s["n"] == 10 for s in part["scores"].values())
    two, one = part["scores"]["block 2"], part["scores"]["block 1"]
    assert two["rho"] > 0.8 and two["rho"] > one["rho"] + 0.5 and two["null"] == pytest.approx(1 / 3)
    assert best_layer(r, "simlex999")[0] == "block 2"


def test_the_command_prints_every_block_or_one_and_refuses_a_block_out_of_range(run, wordsets, capsys):
    assert main(["embed", "similarity", "--checkpoint", str(run), "--layer", "all", "--json", "--uses", "4",
                 "--context", "16"]) == 0
    r = json.loads(capsys.readouterr().out)
    scores = r["sets"]["simlex999"]["scores"]
    assert set(scores) == {"block 1", "block 2", "input", "output"} and r["uses"] == 4 and r["context"] == 16
    assert main(["embed", "similarity", "--checkpoint", str(run), "--layer", "2", "--ppmi"]) == 0
    out = capsys.readouterr().out
    assert "block 2" in out and "block 1 " not in out and "PPMI + SVD reference" in out
    assert main(["embed", "similarity", "--checkpoint", str(run), "--layer", "3"]) == 2
    err = capsys.readouterr().err
    assert "from 1 to 2" in err and "Traceback" not in err and err.count("\n") == 1
