"""andrea.inside.context_vectors and `andrea embed similarity --layer`: word vectors from the blocks."""

from __future__ import annotations

import json
import zlib
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from helpers import WORDS, opts, tiny_config

from andrea.cli import main
from andrea.errors import AndreaError
from andrea.inside.blocks import residual_stream
from andrea.inside.context_vectors import (
    BlockVectors,
    begun_words,
    best_layer,
    block_vectors,
    find_uses,
    last_states,
    layer_scores,
    separation,
    split_states,
)
from andrea.inside.wordsim import WordSets
from andrea.model import ANDREA
from andrea.shards import TokenData
from andrea.train import train

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


def test_begun_words_names_each_use_by_the_word_it_began():
    # tokens: 1 "␣cat", 2 "s", 3 "egory", 4 "␣", 5 "the", 6 "."; 2 and 3 go on with the word before them
    pieces = {1: " cat", 2: "s", 3: "egory", 4: " ", 5: "the", 6: "."}
    starts = np.array([True, True, False, False, True, True, True])
    #                 0  1  2  3  4  5  6  7  8  9 10 11 12
    shard = np.array([5, 1, 4, 5, 1, 2, 4, 1, 3, 6, 5, 1, 2], dtype=np.uint16)
    found = begun_words([shard], 1, starts, lambda ids: "".join(pieces[i] for i in ids), context=2)
    # at 1: cat (then ␣); at 4: cats; at 7: category (then .); at 11: cut by the shard's end
    assert found == {"cat": [(0, 1)], "cats": [(0, 4)], "category": [(0, 7)]}
    assert begun_words([shard], 1, starts, lambda ids: "", context=3) == {"": [(0, 4), (0, 7)]}  # room for context


def test_separation_is_zero_for_one_vector_one_for_words_that_never_vary_and_chance_between():
    labels = np.repeat(np.arange(3), 4)
    same = np.ones((1, 12, 5))
    apart = np.eye(3, 5)[labels][None] * 2.0
    rng = np.random.default_rng(0)
    noise = rng.normal(size=(400, 12, 5))
    r = separation(np.concatenate([same, apart]), labels)
    assert r[0] == {"between": 0.0, "accuracy": pytest.approx(1 / 3)}
    assert r[1]["between"] == pytest.approx(1.0) and r[1]["accuracy"] == 1.0
    noisy = separation(noise, labels)
    # words given at random: (K − 1)/(n − 1) of the spread between them on average, and chance naming
    assert np.mean([x["between"] for x in noisy]) == pytest.approx(2 / 11, abs=0.02)
    assert np.mean([x["accuracy"] for x in noisy]) < 1 / 3 + 0.05
    # the left-out mean: one use far from its word's two others is nearer another word's mean
    x = np.array([[[0.0], [0.1], [1.0], [1.1], [0.9]]])
    assert separation(x, np.array([0, 0, 1, 1, 1]))[0]["accuracy"] == 1.0
    assert separation(x, np.array([0, 0, 0, 1, 1]))[0]["accuracy"] < 1.0


def busiest(tok, data) -> int:
    """The token beginning the most words with 4 uses each in the synthetic text."""
    from andrea.usage import starts_word

    shards = [s for src in data.sources.values() for s in src.train.shards]
    starts = starts_word(tok)
    return max((i for i in range(tok.vocab_size) if i != 256), key=lambda i: sum(
        len(u) >= 4 for u in begun_words(shards, i, starts, tok.decode, 8).values()))


def test_split_states_reads_the_token_itself_at_the_input_and_after_every_block(run, data_dir):
    from andrea.checkpoint import load_model
    from andrea.usage import starts_word

    model, tok, _ = load_model(run)
    data = TokenData(data_dir)
    shards = [s for src in data.sources.values() for s in src.train.shards]
    starts = starts_word(tok)
    best = busiest(tok, data)
    r = split_states(model.eval(), tok, data, tok.decode([best]), per_word=4, words=3, context=8)
    K = len(r["words"])
    assert r["id"] == best and K >= 2 and [x["layer"] for x in r["layers"]] == ["input", "block 1", "block 2"]
    assert r["layers"][0]["between"] == 0.0  # the same row and position in every use: no word told apart
    assert r["null"] == pytest.approx((K - 1) / (4 * K - 1)) and r["chance"] == pytest.approx(1 / K)
    # block 1's figure from the same uses read through the model's own residual stream
    found = begun_words(shards, best, starts, tok.decode, 8)
    states, labels = [], []
    for g, w in enumerate(r["words"]):
        rng = np.random.default_rng([0, zlib.crc32(w.encode("utf-8"))])
        for i in sorted(rng.choice(len(found[w]), size=4, replace=False)):
            k, p = found[w][i]
            stream = residual_stream(model, [int(t) for t in shards[k][p - 7 : p + 1]])
            states.append([s[0, -1].double().numpy() for s in stream])
            labels.append(g)
    expected = separation(np.stack(states, axis=1), np.array(labels))
    for got, want in zip(r["layers"][1:], expected[1:]):
        assert got["between"] == pytest.approx(want["between"], rel=1e-4) and got["accuracy"] == want["accuracy"]
    with pytest.raises(AndreaError, match="not one"):
        split_states(model, tok, data, " zzzqqq zzz", per_word=4)
    other = SimpleNamespace(vocab_size=tok.vocab_size + 1, dir="elsewhere")
    with pytest.raises(AndreaError, match="have V"):
        split_states(model, tok, other, tok.decode([best]), per_word=4)


def test_the_split_command_prints_each_layer_and_refuses_a_token_in_pieces(run, data_dir, capsys):
    from andrea.checkpoint import load_model

    _, tok, _ = load_model(run)
    text = tok.decode([busiest(tok, TokenData(data_dir))])
    bare = [] if text.startswith(" ") else ["--bare"]
    assert main(["embed", "split", text, *bare, "--checkpoint", str(run), "--uses", "4", "--words", "2",
                 "--context", "8", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert [x["layer"] for x in r["layers"]] == ["input", "block 1", "block 2"] and r["per_word"] == 4
    assert len(r["words"]) == 2 and r["token"] == text
    assert main(["embed", "split", text, *bare, "--checkpoint", str(run), "--uses", "4", "--context", "8"]) == 0
    out = capsys.readouterr().out
    assert "between words" in out and "block 2" in out and "named right" in out
    assert main(["embed", "split", "zzzqqq", "--checkpoint", str(run)]) == 2
    err = capsys.readouterr().err
    assert "not one" in err and "Traceback" not in err and err.count("\n") == 1
