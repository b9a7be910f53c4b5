"""Token shards (andrea.shards): exact sizes and checksums, windows that stay inside one shard, and
the checks before a run's first step (the manifest, ids below V, the recorded SHA-256, the
record of shards already checked, the validation windows)."""

from __future__ import annotations

import hashlib
import json
import shutil

import numpy as np
import pytest
from helpers import (
    SECRET,
    cli,
    damaged_data,
    one_sentence,
    prep_docs,
    prep_tokenizer,
    root_train_args,
    shard_tokens,
    split_tokens,
    swap_two_ids,
    text_train_args,
)

import andrea.corpus.sources as sources
from andrea.prepare import prepare
from andrea.shards import HEADER, TokenData, open_shard, write_shard


@pytest.fixture(scope="module")
def tok():
    return prep_tokenizer()


def test_shards_have_exact_sizes_checksums_and_windows_stay_inside_one(tmp_path, tok, monkeypatch):
    monkeypatch.setattr(sources, "CHUNK_BYTES", 5000)
    (tmp_path / "s.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in prep_docs(7, 300)))
    m = prepare(tok, [str(tmp_path / "s.jsonl")], tmp_path / "data", log=lambda *a: None, progress=False,
                shard_tokens=3000, workers=2)
    shards = m["sources"]["s"]["train"]["shards"]
    assert len(shards) >= 4 and all(s["tokens"] == 3000 for s in shards[:-1]) and 0 < shards[-1]["tokens"] <= 3000
    for s in shards:
        raw = (tmp_path / "data" / s["file"]).read_bytes()
        assert hashlib.sha256(raw[32:]).hexdigest() == s["sha256"]
    # the same tokens as one shard would hold
    m1 = prepare(tok, [str(tmp_path / "s.jsonl")], tmp_path / "one", log=lambda *a: None, progress=False, workers=1)
    assert len(m1["sources"]["s"]["train"]["shards"]) == 1
    whole = split_tokens(tmp_path / "one", "s", "train")
    assert np.array_equal(split_tokens(tmp_path / "data", "s", "train"), whole)

    data, T = TokenData(tmp_path / "data"), 64
    train = data.sources["s"].train
    assert len(train.shards) == len(shards) and all(isinstance(s, np.memmap) for s in train.shards)
    counts = [s["tokens"] - T for s in shards]
    total = sum(counts)
    offsets = data.sample_offsets("s", 500, T, np.random.default_rng(0))
    assert offsets.min() >= 0 and offsets.max() < total
    # every start, mapped to its shard: the window is that shard's tokens, never the next shard's
    starts = np.arange(total)
    x, y = data.windows("s", starts, T)
    edges = np.cumsum([0] + counts)
    for k, s in enumerate(shards):
        own = open_shard(tmp_path / "data" / s["file"])
        first, last = edges[k], edges[k + 1] - 1
        assert np.array_equal(x[first].numpy(), own[:T]) and np.array_equal(y[last].numpy(), own[-T:])
    # one shard: the offsets are the positions themselves, as the single-shard format always drew them
    one = TokenData(tmp_path / "one")
    rng_a, rng_b = np.random.default_rng(5), np.random.default_rng(5)
    assert np.array_equal(one.sample_offsets("s", 50, T, rng_a), rng_b.integers(0, len(whole) - T, size=50))
    xo, yo = one.windows("s", [0, 17], T)
    assert np.array_equal(xo[1].numpy(), whole[17 : 17 + T]) and np.array_equal(yo[1].numpy(), whole[18 : 18 + T + 0])


@pytest.mark.hostile
def test_validation_shards_are_checked_before_the_first_step(text_data, text_model_json, tmp_path, capsys):
    from andrea.shards import write_shard

    # ids >= V in the validation shard (the file itself is a well-formed shard)
    data = damaged_data(text_data, tmp_path)
    val = data / "text.val.00000.tok"
    tokens = np.fromfile(val, dtype="<u2", offset=HEADER.size).copy()
    tokens[5] = TokenData(text_data).vocab_size + 3
    write_shard(val, tokens)
    code, _, err = cli(capsys, *text_train_args(data, text_model_json, tmp_path / "r1"))
    assert f"shard {val} holds token id {TokenData(text_data).vocab_size + 3:,}, but V" in one_sentence(code, err)
    assert not (tmp_path / "r1" / "metrics.jsonl").exists()  # refused before any step
    # too short for one window of seq_len + 1
    tokens[5] = 0
    write_shard(val, tokens[:10])
    manifest = json.loads((data / "manifest.json").read_text())
    manifest["sources"]["text"]["val"]["tokens"] = manifest["sources"]["text"]["val"]["shards"][0]["tokens"] = 10
    manifest["sources"]["text"]["val"]["shards"][0]["sha256"] = hashlib.sha256(tokens[:10].astype("<u2").tobytes()).hexdigest()
    (data / "manifest.json").write_text(json.dumps(manifest))
    code, _, err = cli(capsys, *text_train_args(data, text_model_json, tmp_path / "r2"))
    assert "no validation shard of one window of 17 tokens (10 tokens in all)" in one_sentence(code, err)
    assert not (tmp_path / "r2" / "metrics.jsonl").exists()


@pytest.mark.hostile
@pytest.mark.parametrize("damage, expected", [
    (lambda m: m["sources"].__setitem__("text", ["not", "an", "object"]), "is not an object"),
    (lambda m: m["sources"]["text"].pop("val"), "has no val split"),
    (lambda m: m["sources"]["text"]["train"].__setitem__("tokens", "many"), "train tokens"),
    (lambda m: m["sources"]["text"]["train"].__setitem__("tokens", 1.5), "train tokens"),
    (lambda m: m.__setitem__("sources", {}), "lists no sources"),
    (lambda m: m.__setitem__("sources", []), "lists no sources"),
    (lambda m: m.__setitem__("vocab_size", "big"), "vocab_size"),
    (lambda m: m.pop("tokenizer"), "fingerprint"),
    (lambda m: m["sources"]["text"]["train"]["shards"][0].__setitem__("file", "../outside.tok"), "inside the data folder"),
    (lambda m: m["sources"]["text"]["train"]["shards"][0].__setitem__("file", "OUTSIDE"), "inside the data folder"),
    (lambda m: m["sources"]["text"]["val"]["shards"][0].__setitem__("file", 7), "inside the data folder"),
    (lambda m: m["sources"]["text"]["val"].__setitem__("shards", []), "lists no shards"),
    (lambda m: m["sources"]["text"]["train"]["shards"][0].__setitem__("tokens", -1), "token count"),
])
def test_a_malformed_manifest_is_one_sentence(text_data, text_model_json, tmp_path, capsys, damage, expected):
    data = damaged_data(text_data, tmp_path)
    (tmp_path / "outside.tok").write_bytes(SECRET)
    manifest = json.loads((data / "manifest.json").read_text())
    damage(manifest)
    text = json.dumps(manifest).replace('"OUTSIDE"', json.dumps(str(tmp_path / "outside.tok")))
    (data / "manifest.json").write_text(text)
    code, _, err = cli(capsys, *text_train_args(data, text_model_json, tmp_path / "r"))
    line = one_sentence(code, err)
    assert expected in line and "secret" not in line and "root:x" not in line


@pytest.mark.hostile
def test_a_train_shard_with_ids_beyond_v_is_named_before_the_first_step(prepared_root, tmp_path, capsys):
    """The manifest's max_id says the shard is fine; its bytes say otherwise. The run names the
    shard and the id before any step (no metrics.jsonl)."""
    data = tmp_path / "data"
    shutil.copytree(prepared_root / "data", data)
    shard = data / "text.train.00000.tok"
    tokens = shard_tokens(shard)
    V = TokenData(data).vocab_size
    tokens[::10] = V + 7  # every window of 17 tokens meets one
    write_shard(shard, tokens)
    code, _, err = cli(capsys, *root_train_args(prepared_root, tmp_path / "r", data=data))
    assert f"shard {shard} holds token id {V + 7:,}, but V = {V:,}" in one_sentence(code, err)
    assert not (tmp_path / "r" / "metrics.jsonl").exists()


@pytest.mark.hostile
def test_a_shard_whose_bytes_changed_is_noticed_before_the_first_step(prepared_root, tmp_path, capsys):
    """Two ids swapped (every id still below V): the SHA-256 the manifest records no longer
    matches, and the run says so, naming the shard, before its first step."""
    data = tmp_path / "data"
    shutil.copytree(prepared_root / "data", data)
    for shard in (data / "text.train.00000.tok", data / "text.val.00000.tok"):
        swap_two_ids(shard)
        code, _, err = cli(capsys, *root_train_args(prepared_root, tmp_path / shard.name, data=data))
        line = one_sentence(code, err)
        assert f"shard {shard} no longer holds the tokens the manifest records" in line and "prepare the data again" in line
        assert not (tmp_path / shard.name / "metrics.jsonl").exists()
        shutil.copy(prepared_root / "data" / shard.name, shard)


@pytest.mark.hostile
def test_an_unchanged_shard_is_read_in_full_once(prepared_root, tmp_path, capsys):
    """Later starts find a checked shard in verified.json by size and modification time; a shard
    changed since (a new modification time) is read in full again, and caught."""
    data = tmp_path / "data"
    shutil.copytree(prepared_root / "data", data)
    (data / "verified.json").unlink(missing_ok=True)  # the copy keeps the modification times: start afresh
    total = sum(len(s.train) + len(s.val) for s in TokenData(data).sources.values())
    code, out, err = cli(capsys, *root_train_args(prepared_root, tmp_path / "r1", data=data))
    assert code == 0 and f"shards: 2 checked in full ({total:,} tokens: ids below V, SHA-256 as recorded)" in out, err
    code, out, err = cli(capsys, *root_train_args(prepared_root, tmp_path / "r2", data=data))
    assert code == 0 and "shards: all 2 unchanged since their last full check" in out, err
    swap_two_ids(data / "text.train.00000.tok")
    code, _, err = cli(capsys, *root_train_args(prepared_root, tmp_path / "r3", data=data))
    assert "no longer holds the tokens the manifest records" in one_sentence(code, err)


@pytest.mark.hostile
def test_a_record_that_cannot_be_written_means_a_full_check_at_every_start(prepared_root, tmp_path, capsys):
    """Where verified.json cannot be written (here a folder stands in its place; a read-only data
    folder is the same to the writer), every start checks every shard in full, and trains."""
    data = tmp_path / "data"
    shutil.copytree(prepared_root / "data", data)
    (data / "verified.json").unlink(missing_ok=True)
    (data / "verified.json").mkdir()
    for run in ("r1", "r2"):
        code, out, err = cli(capsys, *root_train_args(prepared_root, tmp_path / run, data=data))
        assert code == 0 and "shards: 2 checked in full" in out, err


# ---------------------------------------------------------------- the one gate: every reader, the same damage


def _ids_beyond_v(data):
    """A training shard holding id V + 3, its manifest entry (SHA-256, largest id) made to match:
    only the id check can tell."""
    shard = data / "text.train.00000.tok"
    tokens = np.fromfile(shard, dtype="<u2", offset=HEADER.size).copy()
    manifest = json.loads((data / "manifest.json").read_text())
    tokens[7] = manifest["vocab_size"] + 3
    write_shard(shard, tokens)
    entry = manifest["sources"]["text"]["train"]["shards"][0]
    entry["sha256"], entry["max_id"] = hashlib.sha256(tokens.astype("<u2").tobytes()).hexdigest(), int(tokens.max())
    (data / "manifest.json").write_text(json.dumps(manifest))


def _another_tokenizer(data):
    manifest = json.loads((data / "manifest.json").read_text())
    manifest["tokenizer"] = "0" * 64
    (data / "manifest.json").write_text(json.dumps(manifest))


DAMAGE = {  # damage -> what every reader's sentence says
    "an id beyond V": (_ids_beyond_v, "holds token id|holds ids >= V"),
    "a shard changed": (lambda data: swap_two_ids(data / "text.val.00000.tok"), "no longer holds the tokens"),
    "another tokenizer": (_another_tokenizer, "another tokenizer|not the tokenizer these shards were made with"),
}


def _lesson_cli(*walk):
    def drive(capsys, run, data, out, model_json):
        code, printed, err = cli(capsys, "lesson", *walk, "--checkpoint", run, "--json", *(["--no-ppmi"] if not walk else []))
        assert code == 0, err
        return " ".join(s.get("why") or "" for s in json.loads(printed)["steps"])
    return drive


def _cli_refusal(*args):
    def drive(capsys, run, data, out, model_json):
        return one_sentence(*cli(capsys, *[str(a).format(run=run, data=data, out=out) for a in args])[::2])
    return drive


def _lab(view):
    def drive(capsys, run, data, out, model_json):
        from andrea.inside.embed import load_subject
        from andrea.web.http import Fields, RequestError
        from andrea.web.lab import LabViews

        views = LabViews(load_subject(run))
        if view in ("usage", "words"):
            found, why = getattr(views, view)()
            assert found is None
            return why
        if view == "layers":
            with pytest.raises(RequestError) as e:
                views.layers(Fields({}, {"uses", "ppmi"}))
            return str(e.value)
        steps = getattr(views, view)(Fields({}, set()))["steps"]
        return " ".join(s.get("why") or "" for s in steps)
    return drive


READ_BY = {  # TOKEN_DATA_READERS, each driven as a user meets it
    "andrea train": lambda capsys, run, data, out, model_json: one_sentence(
        *cli(capsys, *text_train_args(data, model_json, out))[::2]),
    "andrea lesson": _lesson_cli(),
    "andrea lesson attention": _lesson_cli("attention"),
    "andrea lesson block": _lesson_cli("block"),
    "andrea embed similarity --ppmi": _cli_refusal("embed", "similarity", "--checkpoint", "{run}", "--ppmi", "--data", "{data}"),
    "andrea embed similarity --layer": _cli_refusal("embed", "similarity", "--checkpoint", "{run}", "--layer", "1"),
    "andrea embed split": _cli_refusal("embed", "split", "the", "--checkpoint", "{run}"),
    "lab usage": _lab("usage"),
    "lab words": _lab("words"),
    "lab layers": _lab("layers"),
    "lab lesson": _lab("lesson"),
    "lab lesson attention": _lab("lesson_attention"),
    "lab lesson block": _lab("lesson_block"),
    "andrea experiment positions": _cli_refusal("experiment", "positions", "--data", "{data}", "--out", "{out}",
                                                "--steps", "1", "--no-progress"),
    "andrea experiment sparse-updates": _cli_refusal("experiment", "sparse-updates", "--data", "{data}", "--out", "{out}",
                                                     "--steps", "1"),
}


def test_every_reader_of_token_data_is_driven_here_and_opens_it_only_through_the_gate():
    """The list kept beside the gate is the list this file drives; and no module of andrea or of
    the benchmarks opens a data folder any other way than `open_token_data`."""
    import re
    from pathlib import Path

    from andrea.shards import TOKEN_DATA_READERS

    assert set(READ_BY) == set(TOKEN_DATA_READERS)
    root = Path(__file__).resolve().parent.parent
    elsewhere = [f"{p.relative_to(root)}:{n}" for folder in ("andrea", "benchmarks") for p in sorted((root / folder).rglob("*.py"))
                 for n, line in enumerate(p.read_text().splitlines(), 1)
                 if re.search(r"\bTokenData\(", line) and not (p.name == "shards.py" and p.parent.name == "andrea")]
    assert elsewhere == []
    gate = (root / "andrea" / "shards.py").read_text()
    assert gate.count("TokenData(") == 1  # in open_token_data


@pytest.mark.hostile
@pytest.mark.parametrize("damage", list(DAMAGE))
def test_every_reader_of_token_data_refuses_the_same_damage_in_one_sentence(text_data, text_model_json, text_run,
                                                                           tmp_path, capsys, damage, wordsets):
    """One run whose train.json names a damaged copy of its data: every reader (training, the three
    lessons, the per-layer vectors, PPMI, split, the lab's views, the experiments) refuses it with
    the gate's sentence, or says the steps that need it cannot be checked, and why: no verdict,
    view or figure is computed from tokens the model was not trained on, and no traceback."""
    import re

    change, said = DAMAGE[damage]
    data = damaged_data(text_data, tmp_path)
    (data / "verified.json").unlink(missing_ok=True)
    change(data)
    run = tmp_path / "run"
    shutil.copytree(text_run, run)
    recorded = json.loads((run / "train.json").read_text())
    recorded["data"] = str(data)
    (run / "train.json").write_text(json.dumps(recorded))
    for reader, drive in READ_BY.items():
        line = drive(capsys, run, data, tmp_path / f"out-{len(reader)}-{reader.split()[-1]}", text_model_json)
        assert re.search(said, line), (reader, line)
