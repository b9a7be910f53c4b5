"""The embedding lab: geometry against hand-computed values on hand-set rows, lookups, the
forward matrix, position similarity, PCA, the projector export, the pictures and the commands."""

from __future__ import annotations

import json
import math
from pathlib import Path

import matplotlib.image
import numpy as np
import pytest
import torch
from helpers import cli

from andrea.checkpoint import save_checkpoint
from andrea.cli import main
from andrea.config import ModelConfig, get_preset
from andrea.errors import AndreaError
from andrea.formats.projector import write_projector
from andrea.inside.blocks import logit_lens
from andrea.inside.embed import (
    ByteTokenizer,
    compare,
    forward_matrix,
    load_subject,
    lookup,
    map_points,
    neighbours,
    parameter_groups,
    plane_coords,
    positions,
    show_tokens,
    similarity_at_distances,
    similarity_by_distance,
)
from andrea.inside.vectors import cosine_matrix, nearest, pca_2d, tsne_2d
from andrea.model import ANDREA
from andrea.plots import plot_map, plot_parameter_groups, plot_position_similarity
from andrea.positions import sinusoidal_table
from andrea.tokenizer.harris import HarrisTokenizer

SEGMENTS = [" cat", " dog", " pet", "cat", " Tuesday", " the", "ing", " walk"]
CAT, DOG, PET, CAT_BARE, TUESDAY, THE, ING, WALK = range(257, 257 + len(SEGMENTS))
D = 8


def tiny_model(pos: str = "learned", seed: int = 0) -> ANDREA:
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=257 + len(SEGMENTS), n_embd=D, n_head=2, n_layer=1, block_size=16, pos=pos)
    return ANDREA(cfg).eval()


def set_row(weight: torch.nn.Parameter, i: int, values) -> None:
    with torch.no_grad():
        weight[i].zero_()
        weight[i, : len(values)] = torch.tensor(values, dtype=weight.dtype)


@pytest.fixture
def tok() -> HarrisTokenizer:
    return HarrisTokenizer(SEGMENTS)


@pytest.fixture
def model() -> ANDREA:
    """Hand-set rows: cat (3, 4), dog (4, 3), pet (1, 1), Tuesday (0, 0, 5) in the input table;
    in the head, cat and dog are orthogonal."""
    m = tiny_model()
    set_row(m.wte.weight, CAT, [3, 4])
    set_row(m.wte.weight, DOG, [4, 3])
    set_row(m.wte.weight, PET, [1, 1])
    set_row(m.wte.weight, TUESDAY, [0, 0, 5])
    set_row(m.lm_head.weight, CAT, [1, 0])
    set_row(m.lm_head.weight, DOG, [0, 2])
    return m


def assert_png(path, min_side: int = 200) -> None:
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    img = matplotlib.image.imread(path)
    assert img.shape[0] > min_side and img.shape[1] > min_side
    assert img[..., :3].std() > 0.01  # not a blank canvas


# ---------------------------------------------------------------- geometry


def test_compare_reads_the_input_table_and_the_head_separately(model, tok):
    r = compare(model, tok, " cat", " dog")
    assert r["a"]["ids"] == [CAT] and r["b"]["ids"] == [DOG]
    assert r["input"]["dot"] == pytest.approx(24.0) and r["input"]["cos"] == pytest.approx(0.96)
    assert r["input"]["angle_deg"] == pytest.approx(16.26, abs=0.005)
    assert r["output"]["dot"] == pytest.approx(0.0) and r["output"]["angle_deg"] == pytest.approx(90.0)
    assert r["output"]["norm_v"] == pytest.approx(2.0)
    # ids name the same rows
    assert compare(model, tok, f"#{CAT}", f"#{DOG}")["input"] == r["input"]


def test_neighbours_are_ordered_by_the_chosen_metric(model, tok):
    m = model.wte.weight.detach().double().numpy()
    # from cat (3, 4): cos ranks pet (1, 1), cos 7/(5√2) = 0.9899, above dog (4, 3), cos 0.96
    by_cos = nearest(m, m[CAT], k=3, metric="cos", exclude={CAT})
    assert [i for i, _ in by_cos[:2]] == [PET, DOG]
    assert by_cos[0][1] == pytest.approx(7 / (5 * math.sqrt(2)))
    assert by_cos[1][1] == pytest.approx(0.96)
    # the dot product prefers the long dog row (24) to the short pet row (7)
    by_dot = nearest(m, m[CAT], k=2, metric="dot", exclude={CAT})
    assert [i for i, _ in by_dot] == [DOG, PET] and by_dot[0][1] == pytest.approx(24.0)
    scores = [s for _, s in nearest(m, m[CAT], k=20, metric="cos")]
    assert scores == sorted(scores, reverse=True)
    r = neighbours(model, tok, " cat", k=3)
    assert CAT not in [n["id"] for n in r["neighbours"]]
    assert r["neighbours"][0]["piece"] == " pet"
    with pytest.raises(AndreaError, match="k must be an integer of at least 1"):
        nearest(m, m[CAT], k=0)


def test_neighbours_of_the_output_head(model, tok):
    set_row(model.lm_head.weight, PET, [0, 3, 0.1])
    out = neighbours(model, tok, " dog", k=model.config.vocab_size, which="output")["neighbours"]
    assert out[0]["id"] == PET and out[0]["score"] == pytest.approx(3 / math.sqrt(9.01))
    assert next(n["score"] for n in out if n["id"] == CAT) == pytest.approx(0.0)  # (1, 0) ⟂ (0, 2) in the head
    inp = neighbours(model, tok, " dog", k=model.config.vocab_size, which="input")["neighbours"]
    assert next(n["score"] for n in inp if n["id"] == CAT) == pytest.approx(0.96)  # but not in the input table


def test_plane_coordinates_keep_lengths_and_the_angle():
    u, v = np.array([3.0, 4, 0, 0]), np.array([4.0, 3, 0, 0])
    r = plane_coords(u, v)  # v·e1 = 24/5 = 4.8, and 4.8² + 1.4² = 25 = ‖v‖²
    assert r["u"] == pytest.approx([5.0, 0.0]) and r["v"] == pytest.approx([4.8, 1.4])
    rng = np.random.default_rng(1)
    a, b = rng.normal(size=16), rng.normal(size=16)
    pa, pb = (np.array(x) for x in plane_coords(a, b).values())
    assert np.linalg.norm(pb) == pytest.approx(np.linalg.norm(b))
    assert pa @ pb == pytest.approx(a @ b)


def test_neighbours_limited_to_whole_words(model, tok):
    set_row(model.wte.weight, CAT_BARE, [3, 4.1])  # the bare piece "cat" would be the nearest of all
    set_row(model.wte.weight, ING, [3, 3.9])
    every = neighbours(model, tok, "cat", k=3)["neighbours"]
    assert every[0]["id"] in (CAT_BARE, ING)
    whole = neighbours(model, tok, "cat", k=model.config.vocab_size, whole_words=True)
    pieces = [n["piece"] for n in whole["neighbours"]]
    assert sorted(pieces) == sorted([" dog", " pet", " Tuesday", " the", " walk"])  # not "cat", "ing" or bytes
    assert whole["whole_words"] and whole["neighbours"][0]["piece"] == " pet"
    assert whole["norm"] == pytest.approx(5.0)


# ---------------------------------------------------------------- lookups


def test_a_typed_word_is_looked_up_in_its_word_initial_form(model, tok):
    V = model.config.vocab_size
    cat = lookup(tok, "cat", V)  # the word, as in running text: " cat", not the bare piece "cat"
    assert cat.ids == [CAT] and cat.form == "word-initial" and cat.text == " cat" and cat.note is None
    bare = lookup(tok, "cat", V, bare=True)  # asked for: the bare piece
    assert bare.ids == [CAT_BARE] and bare.form == "bare" and bare.text == "cat"
    typed = lookup(tok, " cat", V, bare=True)  # a leading space typed is kept whatever the option
    assert typed.ids == [CAT] and typed.form == "as typed"
    dog = lookup(tok, "dog", V)
    assert dog.ids == [DOG] and dog.form == "word-initial"
    # "dog" has no bare token: asked for bare, it splits into its bytes
    assert lookup(tok, "dog", V, bare=True).ids == list(b"dog")
    walking = lookup(tok, "walking", V)
    assert walking.ids == [WALK, ING] and not walking.single and walking.form == "word-initial"
    assert "not a single token" in walking.note and "␣walk + ing" in walking.note
    assert walking.label == "␣walking (mean of 2)"
    ing = lookup(tok, "ing", V)  # " ing" splits; the note points at the bare piece, which is one token
    assert ing.ids == [32, ING] and f"id {ING}" in ing.note and "bare" in ing.note
    assert lookup(tok, "ing", V, bare=True).ids == [ING]
    hash3 = lookup(tok, "#3", V)
    assert hash3.pieces == ["<0x03>"] and hash3.form == "id"
    with pytest.raises(AndreaError, match="out of range"):
        lookup(tok, f"#{V}", V)
    with pytest.raises(AndreaError, match="empty"):
        lookup(tok, "", V)


def test_a_word_of_several_tokens_is_the_mean_of_their_rows(model, tok):
    r = compare(model, tok, " catdog", " cat")  # " cat" + "dog" bytes: not one token
    ids = r["a"]["ids"]
    assert len(ids) > 1 and "mean of their rows" in r["a"]["note"]
    wte = model.wte.weight.detach().double().numpy()
    u = wte[ids].mean(axis=0)
    assert r["input"]["dot"] == pytest.approx(float(u @ wte[CAT]))


def test_show_marks_byte_fallback(model, tok):
    rows = show_tokens(model, tok, " cat é")
    assert [r["kind"] for r in rows] == ["segment", "byte", "byte", "byte"]  # " é" is 3 bytes
    assert rows[0]["norm"] == pytest.approx(5.0)
    assert rows[0]["values"][:3] == pytest.approx([3.0, 4.0, 0.0])


def test_byte_stand_in_tokenizer():
    t = ByteTokenizer(300)
    assert t.encode("hé", bos=True) == [256, 104, 0xC3, 0xA9]
    assert t.id_to_piece(104) == "h" and t.id_to_piece(0xC3) == "<0xC3>" and t.id_to_piece(256) == "<BOS>" and t.id_to_piece(299) == "<#299>"
    assert lookup(t, "#299", 300).single


# ---------------------------------------------------------------- the matrix that enters block 1


def test_forward_matrix_is_the_sum_of_table_rows(model, tok):
    with torch.no_grad():
        model.wpe.weight.copy_(torch.arange(16 * D, dtype=torch.float32).view(16, D) / 100)
    ids = tok.encode(" cat dog", bos=True)
    r = forward_matrix(model, ids)
    wte = model.wte.weight.detach().double().numpy()
    wpe = model.wpe.weight.detach().double().numpy()
    expected = wte[ids] + wpe[: len(ids)]
    np.testing.assert_allclose(r["x"], expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(r["token_part"], wte[ids])
    np.testing.assert_allclose(r["position_part"], wpe[: len(ids)])
    assert r["x"][1, :2] == pytest.approx([3 + 0.08, 4 + 0.09], abs=1e-6)  # cat at position 1


def test_forward_matrix_of_the_other_schemes():
    ids = [256, 257, 258]
    sin = tiny_model("sinusoidal")
    r = forward_matrix(sin, ids)
    expected = sin.wte.weight.detach().double().numpy()[ids] + sinusoidal_table(16, D).double().numpy()[:3]
    np.testing.assert_allclose(r["x"], expected, atol=1e-6)
    for pos in ("rope", "none"):
        m = tiny_model(pos)
        r = forward_matrix(m, ids)
        np.testing.assert_allclose(r["x"], m.wte.weight.detach().double().numpy()[ids], atol=1e-7)
        assert not r["position_part"].any()


def test_forward_matrix_refuses_text_longer_than_the_context(model):
    with pytest.raises(AndreaError, match="context of 16 tokens"):
        forward_matrix(model, [97] * 17)


# ---------------------------------------------------------------- positions


def test_position_similarity_of_a_hand_set_table(model):
    with torch.no_grad():
        model.wpe.weight.zero_()
        model.wpe.weight[:, 0] = 1.0
        model.wpe.weight[1::2, 1] = 1.0  # odd rows (1, 1), even rows (1, 0)
    r = positions(model, distances=(1, 2, 8, 64))
    assert r["table"] == "learned" and r["positions"] == 16
    assert r["similarity_at"][1] == pytest.approx(1 / math.sqrt(2))
    assert r["similarity_at"][2] == pytest.approx(1.0)
    assert 64 not in r["similarity_at"]  # longer than the table


def test_sinusoidal_similarity_depends_only_on_distance():
    sim = cosine_matrix(sinusoidal_table(64, 16).double().numpy())
    for k in (1, 5, 20):
        diag = np.diagonal(sim, k)
        assert diag.std() < 1e-6  # the table is stored as float32
    assert similarity_at_distances(sim, (1,))[1] == pytest.approx(np.diagonal(sim, 1)[0])


def test_rope_and_none_have_no_table():
    for pos in ("rope", "none"):
        r = positions(tiny_model(pos))
        assert r["table"] is None and "no" in r["note"]
    assert positions(tiny_model("sinusoidal"))["table"] == "fixed (not learned)"


# ---------------------------------------------------------------- maps, parameters, export


def test_pca_recovers_a_planar_spread():
    rng = np.random.default_rng(0)
    plane = rng.normal(size=(40, 2)) * [3.0, 1.0]
    basis = np.linalg.qr(rng.normal(size=(6, 6)))[0][:, :2]  # an orthonormal plane in 6-d
    coords, share = pca_2d(plane @ basis.T + 7.0)
    assert share.sum() == pytest.approx(1.0)
    assert share[0] > share[1] > 0.05
    # distances between points survive the projection exactly
    d_in = np.linalg.norm(plane[:, None] - plane[None], axis=-1)
    d_out = np.linalg.norm(coords[:, None] - coords[None], axis=-1)
    np.testing.assert_allclose(d_out, d_in, atol=1e-9)
    with pytest.raises(AndreaError, match="at least two"):
        pca_2d(np.ones((1, 4)))


def test_map_of_words_and_of_the_top_segments(model, tok):
    r = map_points(model, tok, [" cat", " dog", " walking"])
    assert [p["label"] for p in r["points"]] == ["␣cat", "␣dog", "␣walking (mean of 2)"]
    assert len(map_points(model, tok, top=5)["points"]) == 5
    with pytest.raises(AndreaError, match="words to map"):
        map_points(model, tok)
    with pytest.raises(AndreaError, match="method"):
        map_points(model, tok, top=5, method="umap")


def test_tsne_keeps_clusters_together():
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(3, 8)) * 10
    points = np.concatenate([c + rng.normal(size=(10, 8)) * 0.1 for c in centres])
    coords = tsne_2d(points)
    assert coords.shape == (30, 2)
    dist = np.linalg.norm(coords[:, None] - coords[None], axis=-1) + np.eye(30) * 1e9
    assert (dist.argmin(axis=1) // 10 == np.arange(30) // 10).all()  # each point's nearest is in its cluster
    np.testing.assert_allclose(tsne_2d(points), coords)  # seeded
    with pytest.raises(AndreaError, match="three"):
        tsne_2d(points[:2])


def test_similarity_by_distance_is_the_mean_of_each_diagonal():
    sim = np.array([[1.0, 0.5, 0.1], [0.5, 1.0, 0.3], [0.1, 0.3, 1.0]])
    assert similarity_by_distance(sim) == pytest.approx([0.4, 0.1])


def test_parameter_groups_reproduce_the_specification():
    with torch.device("meta"):
        m = ANDREA(get_preset("andrea-120m"))
    g = {r.name: r.count for r in parameter_groups(m)}
    assert g["token embedding (wte)"] == 6_488_832
    assert g["position embedding (wpe)"] == 786_432
    assert g["embedding total"] == 7_275_264
    assert g["total"] == 98_737_152 == m.num_params()
    assert g["output head (lm_head)"] == 6_488_832
    rope = {r.name: r.count for r in parameter_groups(tiny_model("rope"))}
    assert rope["position embedding (wpe)"] == 0


@pytest.mark.parametrize("changes", [{}, {"pos": "rope"}, {"norm": "layernorm"}, {"n_layer": 3}])
def test_parameter_groups_agree_with_the_models_own_parameters(changes):
    """The groups come from the config (andrea.config.param_rows); counted here from the model's
    named parameters instead, they must be the same."""
    cfg = get_preset("andrea-cpu").replace(**changes)
    with torch.device("meta"):
        m = ANDREA(cfg)
    by_head = {}
    for name, p in m.named_parameters():
        by_head[name.split(".")[0]] = by_head.get(name.split(".")[0], 0) + p.numel()
    g = {r.name: r.count for r in parameter_groups(m)}
    assert g["token embedding (wte)"] == by_head["wte"] and g["position embedding (wpe)"] == by_head.get("wpe", 0)
    assert g["transformer blocks"] == by_head["h"] and g["final norm (ln_f)"] == by_head["ln_f"]
    assert g["output head (lm_head)"] == by_head["lm_head"] and g["total"] == sum(by_head.values())


def test_projector_export(model, tok, tmp_path):
    vectors, meta = write_projector(tmp_path / "proj", model, tok)
    rows = np.loadtxt(vectors, delimiter="\t")
    assert rows.shape == (model.config.vocab_size, D)
    np.testing.assert_allclose(rows[CAT, :2], [3, 4])
    lines = meta.read_text(encoding="utf-8").splitlines()
    assert lines[0] == "piece\tid\tkind" and len(lines) == model.config.vocab_size + 1
    assert lines[1 + CAT] == f"␣cat\t{CAT}\tsegment"
    assert lines[1 + 10] == "<0x0A>\t10\tbyte"


def test_pictures_are_png_files_of_sensible_size(model, tok, tmp_path):
    p1 = plot_parameter_groups(parameter_groups(model), tmp_path / "table.png", "tiny")
    r = positions(model)
    p2 = plot_position_similarity(r["similarity"], r["similarity_at"], tmp_path / "pos.png", "tiny")
    m = map_points(model, tok, top=8)
    p3 = plot_map(m["points"], m["explained"], tmp_path / "map.png", "tiny")
    for p in (p1, p2, p3):
        assert_png(p)


# ---------------------------------------------------------------- the commands


@pytest.fixture
def checkpoint(model, tok, tmp_path):
    return save_checkpoint(tmp_path / "ckpt.safetensors", model.config, model.state_dict(),
                           meta={"step": 1, "tokenizer": tok.to_dict()})


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_compare_and_neighbours(checkpoint, capsys):
    code, out, _ = run(capsys, "embed", "compare", " cat", "dog", "--checkpoint", str(checkpoint))
    assert code == 0
    assert "24.0000" in out and "+0.9600" in out and "16.26" in out and "90.00" in out
    assert "leading space" in out  # "dog" was found as " dog"
    code, out, _ = run(capsys, "embed", "compare", " cat", " dog", "--checkpoint", str(checkpoint), "--json")
    r = json.loads(out)
    assert r["input"]["cos"] == pytest.approx(0.96) and r["output"]["cos"] == pytest.approx(0.0, abs=1e-12)
    code, out, _ = run(capsys, "embed", "neighbors", " cat", "-k", "2", "--checkpoint", str(checkpoint))
    lines = [line for line in out.splitlines() if line.strip().startswith(("1 ", "2 "))]
    assert "␣pet" in lines[0] and "␣dog" in lines[1]
    code, out, _ = run(capsys, "embed", "neighbors", " walking", "--checkpoint", str(checkpoint))
    assert code == 0 and "not a single token" in out and "mean of 2 tokens" in out


def test_cli_show_forward_and_export(checkpoint, capsys, tmp_path):
    code, out, _ = run(capsys, "embed", "show", " cat é", "--checkpoint", str(checkpoint))
    assert code == 0 and "byte*" in out and "byte fallback" in out and "5.0000" in out
    npy = tmp_path / "x.npy"
    code, out, _ = run(capsys, "embed", "forward", " cat dog", "--checkpoint", str(checkpoint), "--save", str(npy))
    assert code == 0 and "3 × 8 matrix enters block 1" in out
    assert np.load(npy).shape == (3, D)
    code, _, err = run(capsys, "embed", "forward", "x" * 40, "--checkpoint", str(checkpoint))
    assert code == 2 and "context of 16 tokens" in err and "Traceback" not in err
    code, out, _ = run(capsys, "embed", "export", "--projector", str(tmp_path / "p"), "--checkpoint", str(checkpoint))
    assert code == 0 and (tmp_path / "p" / "vectors.tsv").exists() and (tmp_path / "p" / "metadata.tsv").exists()


def test_cli_pictures(checkpoint, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, _ = run(capsys, "embed", "table", "--preset", "andrea-120m")
    assert code == 0 and "7,275,264" in out and "98,737,152" in out
    assert_png(tmp_path / "embed-table-andrea-120m-seed0.png")
    code, out, _ = run(capsys, "embed", "positions", "--checkpoint", str(checkpoint), "--png", "pos.png")
    assert code == 0 and "k =    1" in out and "k =    8" in out and "k =   64" not in out  # T = 16
    assert_png(tmp_path / "pos.png")
    code, out, _ = run(capsys, "embed", "map", " cat", " dog", " pet", " walking", "--checkpoint", str(checkpoint))
    assert code == 0 and "walking (mean of 2)" in out
    pngs = list(tmp_path.glob("embed-map-*.png"))
    assert len(pngs) == 1
    assert_png(pngs[0])


def test_cli_words_in_their_word_initial_form(checkpoint, capsys):
    code, out, _ = run(capsys, "embed", "neighbors", "cat", "-k", "2", "--checkpoint", str(checkpoint))
    assert code == 0 and f"token {CAT} ␣cat (the word-initial form" in out
    code, out, _ = run(capsys, "embed", "neighbors", "cat", "--bare", "--checkpoint", str(checkpoint), "--json")
    r = json.loads(out)
    assert r["word"]["form"] == "bare" and r["word"]["ids"] == [CAT_BARE]
    code, out, _ = run(capsys, "embed", "neighbors", "cat", "--whole-words", "-k", "50", "--checkpoint", str(checkpoint), "--json")
    r = json.loads(out)
    assert r["whole_words"] and len(r["neighbours"]) == 5 and all(n["piece"].startswith(" ") for n in r["neighbours"])
    code, out, _ = run(capsys, "embed", "compare", "cat", "Tuesday", "--checkpoint", str(checkpoint), "--json")
    r = json.loads(out)
    assert r["a"]["form"] == r["b"]["form"] == "word-initial" and r["b"]["ids"] == [TUESDAY]
    assert r["input"]["dot"] == pytest.approx(0.0) and r["input"]["plane"]["u"] == pytest.approx([5.0, 0.0])


def test_library_errors_name_arguments_not_flags(model, tok):
    for call in (lambda: load_subject(), lambda: load_subject(checkpoint="x", preset="y"),
                 lambda: map_points(model, tok), lambda: map_points(model, tok, top=1),
                 lambda: neighbours(model, tok, " cat", k=0), lambda: logit_lens(model, tok, " cat", k=0)):
        with pytest.raises(AndreaError) as e:
            call()
        assert "--" not in str(e.value) and not str(e.value).startswith("-")


def test_cli_positions_explains_schemes_without_a_table(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, _ = run(capsys, "embed", "positions", "--preset", "andrea-tiny")
    assert code == 0 and "learned" in out and list(tmp_path.glob("*.png"))
    for pos in ("rope", "sinusoidal"):
        m = tiny_model(pos)
        path = save_checkpoint(tmp_path / f"{pos}.safetensors", m.config, m.state_dict(), meta={})
        code, out, _ = run(capsys, "embed", "positions", "--checkpoint", str(path))
        assert code == 0
        if pos == "rope":
            assert "no position table" in out and "no picture" in out
        else:
            assert "fixed (not learned) table" in out and "picture:" in out


def test_cli_errors_are_one_sentence(capsys, tmp_path):
    code, _, err = run(capsys, "embed", "compare", "a", "b")
    assert code == 2 and "--checkpoint" in err and len(err.strip().splitlines()) == 1
    code, _, err = run(capsys, "embed", "show", "a", "--checkpoint", str(tmp_path / "nope.safetensors"))
    assert code == 2 and "does not exist" in err
    code, _, err = run(capsys, "embed", "neighbors", "#99999", "--preset", "andrea-tiny")
    assert code == 2 and "out of range" in err
    code, _, err = run(capsys, "embed", "table", "--preset", "andrea-tiny", "--checkpoint", "x")
    assert code == 2 and "not both" in err


def test_fresh_preset_with_a_tokenizer_fits_its_vocabulary(tok, tmp_path):
    tok.save(tmp_path / "tok")
    s = load_subject(preset="andrea-tiny", seed=3, tokenizer_dir=tmp_path / "tok")
    assert s.model.config.vocab_size == tok.vocab_size and "to fit the tokenizer" in s.name
    assert s.tokenizer_note is None
    again = load_subject(preset="andrea-tiny", seed=3, tokenizer_dir=tmp_path / "tok")
    assert torch.equal(s.model.wte.weight, again.model.wte.weight)  # the seed fixes the rows
    bare = load_subject(preset="andrea-tiny")
    assert isinstance(bare.tokenizer, ByteTokenizer) and "bytes" in bare.tokenizer_note


# ---------------------------------------------------------------- benchmarks/embedding_pairs.py


def _pairs_module():
    import importlib.util

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "embedding_pairs.py"
    spec = importlib.util.spec_from_file_location("embedding_pairs", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_embedding_pairs_benchmark_reports_what_the_rows_hold(tmp_path, capsys):
    pairs = _pairs_module()
    words = [" cat", " dog", " pet", " king", " queen", " man", " woman", " Tuesday", " the"]  # no " xylophone"
    t = HarrisTokenizer(words)
    torch.manual_seed(0)
    m = ANDREA(ModelConfig(vocab_size=t.vocab_size, n_embd=D, n_head=2, n_layer=1, block_size=16)).eval()
    ids = {w.strip(): 257 + i for i, w in enumerate(words)}
    # input table: animals along axis 0, royals along 1, people along 2, the rest on their own axes
    for w, row in (("cat", [1, 0, 0]), ("dog", [1, 0.1, 0]), ("pet", [1, 0, 0.1]), ("king", [0, 1, 0]),
                   ("queen", [0, 1, 0.1]), ("man", [0, 0, 1]), ("woman", [0.1, 0, 1]),
                   ("Tuesday", [0, 0, 0, 1]), ("the", [0, 0, 0, 0, 1])):
        set_row(m.wte.weight, ids[w], row)
        set_row(m.lm_head.weight, ids[w], [-v for v in row[:3]] if w in ("cat", "king") else row)
    rows = pairs.measure_pairs(m, t)
    by = {(r["a"], r["b"]): r for r in rows}
    assert by[("cat", "dog")]["input"] == pytest.approx(1 / math.sqrt(1.01))
    assert by[("cat", "Tuesday")]["input"] == pytest.approx(0.0)
    assert by[("cat", "xylophone")]["b_tokens"][0] == "␣" and len(by[("cat", "xylophone")]["b_tokens"]) == 10
    v_in = pairs.verdict(rows, "input")
    assert v_in["pairwise_wins"] == v_in["pairwise_total"] == 12
    assert "yes" in pairs.sentence("input", v_in)
    # in the head, cat and king point the other way: their related pairs fall below the unrelated ones
    v_out = pairs.verdict(rows, "output")
    assert v_out["related_above_every_unrelated"] == 1  # only man / woman
    assert "yes" not in pairs.sentence("output", v_out)
    path = save_checkpoint(tmp_path / "pairs.safetensors", m.config, m.state_dict(), meta={"tokenizer": t.to_dict()})
    assert pairs.main(["--checkpoint", str(path)]) == 0
    out = capsys.readouterr().out
    assert "| cat / dog | related | ␣cat | ␣dog | +0.995 |" in out and "mean of 10" in out and "single-token pairs" in out


# ---------------------------------------------------------------- hostile input


@pytest.mark.hostile
def test_embed_forward_saves_to_exactly_the_path_it_reports(text_run, tmp_path, capsys):
    target = tmp_path / "x"
    code, out, err = cli(capsys, "embed", "forward", "--checkpoint", text_run, "the king", "--save", target)
    assert code == 0, err
    assert f"to {target}\n" in out and not (tmp_path / "x.npy").exists()
    x = np.load(target)
    assert x.dtype == np.float32 and x.shape[1] == 32
