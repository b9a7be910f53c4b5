"""The lab's Growth view on a real run's embedding snapshots: each endpoint returns what
`andrea.snapshots.timeline` computes, the sparse-update panel tells seen rows from unseen ones as training
really left them, a lab without snapshots says how to get them, and bad requests get one sentence."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from starlette.testclient import TestClient

from andrea.inside import embed
from andrea.inside.wordsim import LESSON_PAIRS, load_wordsets
from andrea.shards import TokenData
from andrea.snapshots.store import snapshot_steps
from andrea.snapshots.timeline import WHY_UNSEEN, Timeline, aligned_map, neighbours_at, pair_series, rho_series, row_updates
from andrea.web import lab_growth as web_growth
from andrea.web.lab import create_app

pytestmark = pytest.mark.usefixtures("one_thread")


def jsonish(x):
    """What a library result looks like after a trip through JSON (non-finite floats as null)."""
    return json.loads(json.dumps(x, allow_nan=True).replace("NaN", "null"))


@pytest.fixture(scope="module")
def run(growth_run):
    return growth_run[0]


@pytest.fixture(scope="module")
def subject(run):
    return embed.load_subject(run)


@pytest.fixture(scope="module")
def timeline(run, subject):
    return Timeline(run, subject.tokenizer)


@pytest.fixture(scope="module")
def client(growth_run, subject):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ANDREA_CACHE", str(growth_run[1]))
        mp.setenv("ANDREA_WORDSETS", str(growth_run[1] / "wordsets"))
        app = create_app(subject)
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


def post(client, path, body):
    r = client.post(path, json=body)
    return r.status_code, r.json()


def test_the_view_describes_the_run(client, run, timeline):
    info = client.get("/api/growth").json()
    assert info["live"] is True and info["run"] == str(run)
    assert info["steps"] == snapshot_steps(run) == [0, 1, 2, 4, 8, 16]
    assert info["d"] == 32 and info["band"] == pytest.approx(1 / math.sqrt(32))
    assert info["V"] == info["rows"] == timeline.V and info["recipe"] == "v2"
    assert info["lesson_pairs"] == [list(p) for p in LESSON_PAIRS] and info["lesson_related"] == 2
    assert info["wordsets"] == {"fetched": True, "note": None}
    assert {"cat", "dog", "kings"} <= set(info["map_words"]) and len(info["map_words"]) == len(set(info["map_words"]))


def test_endpoints_return_what_the_timeline_computes(client, growth_run, timeline):
    code, r = post(client, "/api/growth/neighbours", {"word": "cat", "step": 5, "k": 4})
    assert code == 200 and r == jsonish(neighbours_at(timeline, 5, "cat", 4)) and r["step"] == 4
    code, r = post(client, "/api/growth/neighbours", {"word": "dog", "step": 16, "table": "output", "whole_words": False})
    assert code == 200 and r == jsonish(neighbours_at(timeline, 16, "dog", 10, "output", False))
    code, r = post(client, "/api/growth/pairs", {})
    assert code == 200 and r == jsonish(pair_series(timeline, LESSON_PAIRS))
    code, r = post(client, "/api/growth/pairs", {"pairs": [["kings", "queens"]], "table": "output", "centred": False})
    raw = pair_series(timeline, [("kings", "queens")], "output", centre=False)
    assert code == 200 and r == jsonish(raw) and all(v is not None for v in r["mean_cos"])
    code, r = post(client, "/api/growth/rho", {"centred": False})
    sets = load_wordsets(growth_run[1] / "wordsets", own=True)
    assert code == 200 and r == {"fetched": True, **jsonish(rho_series(timeline, sets, "input", centre=False))}
    assert r["sets"]["simlex999"]["n"] == 8 and r["sets"]["wordsim353"]["n"] == 6
    words = ["cat", "dog", "mat", "kings", "queens", "Tuesday"]
    code, r = post(client, "/api/growth/map", {"words": words})
    assert code == 200 and r == jsonish(aligned_map(timeline, words))
    code, r = post(client, "/api/growth/updates", {"start": 3, "end": 12, "table": "output"})
    assert code == 200 and r == jsonish(row_updates(timeline, 3, 12, "output")) and (r["start"], r["end"]) == (2, 8)


def test_rho_series_is_the_cosine_of_each_pairs_mean_rows(growth_run, timeline):
    """rho_series (vectorised) against ρ computed pair by pair from the full snapshot matrices."""
    from andrea.inside.wordsim import PAIR_SETS, spearman

    sets = load_wordsets(growth_run[1] / "wordsets", own=True)
    index = timeline.index((), sets)
    for centre in (True, False):
        got = rho_series(timeline, sets, "output", centre)
        for k, step in enumerate(timeline.steps):
            m = timeline.matrix(step, "output", centre)
            for name in PAIR_SETS:
                cos = []
                for a, b, _ in sets.pairs[name]:
                    u, v = m[index.ids[a]].mean(axis=0), m[index.ids[b]].mean(axis=0)
                    cos.append(float(u @ v / (np.linalg.norm(u) * np.linalg.norm(v))))
                expected = spearman(cos, [r for _, _, r in sets.pairs[name]])
                assert got["sets"][name]["rho"][k] == pytest.approx(expected, abs=1e-12)


def test_the_map_moves_from_step_to_step_and_ends_on_the_last_snapshot(client, timeline):
    words = ["cat", "dog", "mat", "kings", "queens"]
    r = post(client, "/api/growth/map", {"words": words})[1]
    frames = np.array(r["frames"])
    assert frames.shape == (len(timeline.steps), len(words), 2)
    # the last frame is the last snapshot, centred, on its own two principal axes
    x = np.stack([timeline.matrix(16, centre=True)[timeline.index(words).ids[w]].mean(axis=0) for w in words])
    x -= x.mean(axis=0)
    axes = np.linalg.svd(x, full_matrices=False)[2][:2].T
    np.testing.assert_allclose(np.abs(frames[-1]), np.abs(x @ axes), atol=1e-9)
    assert np.abs(frames[0] - frames[-1]).max() > 1e-3  # the table learned: the points moved


def test_seen_and_unseen_rows_as_training_left_them(client, run, timeline):
    """The sparse-update panel's counts are the batches': a token absent from the training data is
    never seen; under AdamW (v2) every unseen row still moved, as the sentence says."""
    data = TokenData(run.parent / "data")
    in_data = set(np.unique(np.concatenate([np.asarray(s.train) for s in data.sources.values()])).tolist())
    for start, end in ((0, 1), (4, 8), (0, 16)):
        r = post(client, "/api/growth/updates", {"start": start, "end": end})[1]
        seen = {row["id"] for row in r["rows"] if row["seen"] > 0}
        assert seen <= in_data and all(row["seen"] <= end - start for row in r["rows"])
        assert r["groups"]["seen"]["tokens"] == len(seen) and r["groups"]["unseen"]["tokens"] == timeline.V - len(seen)
        assert r["groups"]["unseen"]["share_moved"] == 1.0 and r["why"] == WHY_UNSEEN["v2"]
    r = post(client, "/api/growth/updates", {"start": 0, "end": 16, "table": "output"})[1]
    assert r["why"] == WHY_UNSEEN["output"]


def test_without_momentum_left_a_never_seen_row_stays_put(make_tiny_run, tmp_path):
    """Recipe v1 (Adam, no weight decay): over the whole run a row whose token was in no batch has
    not moved at all, and every row that was seen has; the panel says why."""
    run = make_tiny_run(tmp_path, recipe="v1", max_steps=6, eval_every=6)
    with TestClient(create_app(embed.load_subject(run / "latest.safetensors"))) as c:
        r = c.post("/api/growth/updates", json={"start": 0, "end": 6}).json()
    unseen = [row for row in r["rows"] if row["seen"] == 0]
    seen = [row for row in r["rows"] if row["seen"] > 0]
    assert unseen and seen and r["why"] == WHY_UNSEEN["v1"]
    assert all(row["moved"] == 0.0 for row in unseen) and all(row["moved"] > 0 for row in seen)
    assert r["groups"]["unseen"]["share_moved"] == 0.0 and r["groups"]["seen"]["share_moved"] == 1.0


def test_a_checkpoint_inside_the_run_folder_finds_its_snapshots(run):
    app = create_app(embed.load_subject(run / "best.safetensors"))
    with TestClient(app) as c:
        assert c.get("/api/growth").json()["steps"] == snapshot_steps(run)
    assert app.state.growth.summary() == "growth view: 6 embedding snapshots, steps 0 to 16"


def test_the_layers_view_scores_what_the_library_scores(client, growth_run, subject):
    from andrea.inside.context_vectors import score_layers
    from andrea.usage import run_data

    code, r = post(client, "/api/layers", {"uses": 4})
    assert code == 200
    data, _ = run_data(growth_run[0], subject.tokenizer)
    want = score_layers(subject.model, subject.tokenizer, data, load_wordsets(growth_run[1] / "wordsets", own=True), 4)
    assert r == jsonish(want) and r["uses"] == 4 and r["blocks"] == subject.model.config.n_layer
    for part in r["sets"].values():
        blocks = [k for k in part["scores"] if k.startswith("block")]
        assert blocks == [f"block {i}" for i in range(1, r["blocks"] + 1)] and {"input", "output"} <= set(part["scores"])
        assert part["pairs"] >= 3 and all(math.isfinite(v["rho"]) and v["n"] == part["pairs"] for v in part["scores"].values())
    assert post(client, "/api/layers", {"uses": 4})[1] == r  # computed once
    code, r = post(client, "/api/layers", {"uses": 0})
    assert code == 400 and "uses" in r["error"]
    assert post(client, "/api/layers", {"uses": 4, "words": ["cat"]})[0] == 400  # a field it does not take


def test_without_the_word_sets_the_view_says_how_to_fetch_them(subject, tmp_path, monkeypatch):
    monkeypatch.setenv("ANDREA_CACHE", str(tmp_path / "empty"))
    with TestClient(create_app(subject)) as c:
        assert c.get("/api/growth").json()["wordsets"] == {"fetched": False, "note": web_growth.HOW_TO_FETCH}
        r = c.post("/api/growth/rho", json={})
        assert r.status_code == 200 and r.json() == {"fetched": False, "note": web_growth.HOW_TO_FETCH}
        assert c.post("/api/growth/pairs", json={}).status_code == 200
        r = c.post("/api/layers", json={})
        assert r.status_code == 400 and r.json() == {"error": web_growth.HOW_TO_FETCH}
    assert "andrea data fetch wordsets" in web_growth.HOW_TO_FETCH


def test_a_checkpoint_without_snapshots_says_how_to_get_them(lab_checkpoint, capfd):
    with TestClient(create_app(embed.load_subject(lab_checkpoint)), raise_server_exceptions=False) as c:
        info = c.get("/api/growth").json()
        assert info["live"] is False and set(info) == {"live", "note"}
        assert info["note"].startswith(f"the checkpoint {lab_checkpoint} has no embedding snapshots")
        assert "andrea lab --checkpoint RUN" in info["note"] and "--no-snapshots" in info["note"]
        for path in ("neighbours", "pairs", "rho", "map", "updates"):
            r = c.post(f"/api/growth/{path}", json={})
            assert r.status_code == 400 and r.json() == {"error": info["note"]}
    with TestClient(create_app(embed.load_subject(preset="andrea-tiny"))) as c:
        note = c.get("/api/growth").json()["note"]
        assert note.startswith("andrea-tiny (fresh, seed 0) has no training history to show.")
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err


BAD = [
    ("/api/growth/neighbours", {"word": "cat", "step": -1}, "step must be an integer from 0 to 16"),
    ("/api/growth/neighbours", {"word": "cat", "step": 17}, "step must be an integer from 0 to 16"),
    ("/api/growth/neighbours", {"word": "cat", "step": 2.5}, "step must be an integer"),
    ("/api/growth/neighbours", {"word": "cat", "k": 201}, "k must be an integer from 1 to 200"),
    ("/api/growth/neighbours", {"word": "x" * 101}, "at most 100"),
    ("/api/growth/neighbours", {"word": ""}, "word must be a non-empty string"),
    ("/api/growth/neighbours", {"word": "cat", "table": "wpe"}, "table must be one of input, output"),
    ("/api/growth/neighbours", {"word": "cat", "path": "/etc/passwd"}, "unknown field 'path'"),
    ("/api/growth/pairs", {"pairs": "cat dog"}, "pairs must be a list of [word, word] pairs"),
    ("/api/growth/pairs", {"pairs": [["cat", "dog", "pet"]]}, "pairs must be a list of [word, word] pairs"),
    ("/api/growth/pairs", {"pairs": []}, "the view draws 1 to 8 pairs, got 0"),
    ("/api/growth/pairs", {"pairs": [["cat", "dog"]] * 9}, "the view draws 1 to 8 pairs, got 9"),
    ("/api/growth/pairs", {"pairs": [["cat", 3]]}, "words must be a list of non-empty strings"),
    ("/api/growth/pairs", {"pairs": [["cat", "dog"]], "centred": "yes"}, "centred must be true or false"),
    ("/api/growth/rho", {"table": "both"}, "table must be one of"),
    ("/api/growth/map", {"words": ["cat", "dog"]}, "a map takes 3 to 100 words, got 2"),
    ("/api/growth/map", {"words": ["cat"] * 101}, "a map takes 3 to 100 words, got 101"),
    ("/api/growth/map", {"words": ["cat", "dog", "cat"]}, "each word may stand on the map once"),
    ("/api/growth/map", {}, "words must be a list"),
    ("/api/growth/updates", {"start": 8, "end": 8}, "the interval must start before it ends, got steps 8 to 8"),
    ("/api/growth/updates", {"start": 8, "end": 4}, "the interval must start before it ends"),
    ("/api/growth/updates", {"start": 0, "end": 10**12}, "end must be an integer from 0 to 16"),
    ("/api/growth/updates", {"start": "0"}, "start must be an integer"),
    # a lone surrogate is valid JSON but not valid Unicode
    ("/api/growth/neighbours", {"word": "\ud800"}, "not valid Unicode"),
    ("/api/growth/pairs", {"pairs": [["cat", "\udfff"]]}, "not valid Unicode"),
    ("/api/growth/map", {"words": ["cat", "dog", "pet\ud800"]}, "not valid Unicode"),
]


@pytest.mark.parametrize("path,body,message", BAD, ids=[f"{p}:{m}" for p, _, m in BAD])
def test_bad_values_get_one_json_sentence(client, capfd, path, body, message):
    r = client.post(path, content=json.dumps(body), headers={"content-type": "application/json"})
    assert r.status_code == 400 and set(r.json()) == {"error"}
    assert message in r.json()["error"]
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err


def test_null_steps_read_as_their_defaults(client):
    r = client.post("/api/growth/updates", json={"start": None, "end": None})
    assert r.status_code == 200 and r.json() == client.post("/api/growth/updates", json={}).json()


def test_bodies_methods_and_queries(client, capfd):
    from andrea.web.lab import MAX_BODY

    r = client.post("/api/growth/map", content=b"{" + b" " * (MAX_BODY + 10) + b"}", headers={"content-type": "application/json"})
    assert r.status_code == 413 and "larger than" in r.json()["error"]
    assert client.post("/api/growth").status_code == 405
    assert client.get("/api/growth/updates").status_code == 405
    assert client.get("/api/growth?run=/etc").status_code == 400
    assert client.post("/api/growth/pairs", content=b"[1]", headers={"content-type": "application/json"}).json() == {"error": "the request body must be a JSON object."}
    assert client.get("/api/growth/nothing").status_code == 404
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err


def test_the_heads_scores_kept_with_each_snapshot_come_with_the_loss(client, run, timeline):
    from andrea.inside.heads import KINDS
    from andrea.metrics import read_metrics

    status, r = post(client, "/api/growth/heads", {})
    assert status == 200 and r["steps"] == timeline.steps and r["kinds"] == list(KINDS) and r["threshold"] == 0.3
    assert r["note"] is None  # every row the run wrote passes andrea.metrics' gate
    rows = [row for row in read_metrics(run / "metrics.jsonl") if "heads" in row]
    for kind in KINDS:
        assert r["scores"][kind] == [row["heads"]["scores"][kind] for row in rows]
        assert np.array(r["scores"][kind]).shape == (len(timeline.steps), 2, 2)  # steps × blocks × heads
    assert r["loss"]["steps"] == list(range(1, timeline.steps[-1] + 1)) and len(r["loss"]["smoothed"]) == len(r["loss"]["steps"])
