"""andrea.usage: counts, standalone shares and continuations on texts whose figures are known."""

import numpy as np
import pytest

from andrea.prepare import prepare
from andrea.shards import TokenData
from andrea.tokenizer.harris import BOS, HarrisTokenizer
from andrea.usage import USAGE_FILE, count_usage, data_usage, starts_word

TOK = HarrisTokenizer([" cat", "s", " dog", "ég", "egory"])
CAT, S, DOG = (TOK.encode(w, bos=False)[0] for w in (" cat", "s", " dog"))


def usage_of(*texts):
    return count_usage(([np.array(TOK.encode(t), dtype=np.uint16)] for t in texts), TOK.vocab_size,
                       starts_word(TOK))


def test_a_next_token_starts_a_word_unless_it_begins_with_a_letter_digit_or_a_character_under_way():
    starts = starts_word(TOK)
    for piece, expected in ((" ", True), (".", True), ("'", True), ("\n", True), ("s", False), ("7", False),
                            ("ég", False), (" cat", True)):
        (i,) = TOK.encode(piece, bos=False)
        assert starts[i] == expected, piece
    assert starts[BOS] and not starts[0xA9] and not starts[0xC3] and starts[ord("-")]


def test_shares_and_continuations_on_a_text_built_to_know_them():
    # ␣cat, 8 uses: alone before ␣ twice, before "'" and at the end of the text; continued by s twice,
    # by ég and by egory
    usage = usage_of(" cat cats, cat's cats cat cat\u00e9g category cat")
    assert usage.count[CAT] == 8
    assert usage.alone[CAT] == 4
    assert usage.share(CAT) == pytest.approx(4 / 8)
    cont = usage.continuations(CAT)
    assert cont[0] == (S, 2)
    assert sorted(c for _, c in cont) == [1, 1, 2]
    assert usage.count[DOG] == 0 and usage.share(DOG) is None and usage.continuations(DOG) == []
    assert usage.count.sum() == len(TOK.encode(" cat cats, cat's cats cat cat\u00e9g category cat"))


def test_a_text_split_over_shards_is_counted_as_one_and_texts_do_not_run_into_each_other():
    ids = np.array(TOK.encode(" cats cat dog cats"), dtype=np.uint16)
    whole = count_usage([[ids]], TOK.vocab_size, starts_word(TOK))
    cut = 2  # between ␣cat and s
    assert ids[cut - 1] == CAT and ids[cut] == S
    split = count_usage([[ids[:cut], ids[cut:]]], TOK.vocab_size, starts_word(TOK))
    for a, b in ((whole.count, split.count), (whole.alone, split.alone), (whole.next_counts, split.next_counts)):
        assert np.array_equal(a, b)
    apart = count_usage([[ids[:cut]], [ids[cut:]]], TOK.vocab_size, starts_word(TOK))
    assert apart.alone[CAT] == whole.alone[CAT] + 1  # the first text ends after ␣cat


def test_the_whole_word_filter_keeps_tokens_that_mostly_stand_alone_and_were_seen_enough():
    usage = usage_of(" dog" * 30 + " cats" * 30 + " cat" * 5)
    words = usage.standalone_words(min_share=0.8, min_count=20)
    assert words[DOG] and not words[CAT]
    assert not usage.standalone_words(min_share=0.8, min_count=31)[DOG]


def test_the_sentence_names_the_share_and_the_continuations():
    usage = usage_of(" cats cats cat")
    line = usage.sentence(CAT, lambda i: TOK.id_to_piece(i).replace(" ", "␣"))
    assert line == "␣cat stands alone in 33% of its 3 uses (its purity); it also begins ␣cat+s (67%)."


def test_a_data_folder_is_counted_once_and_counted_again_when_prepared_again(tmp_path):
    (tmp_path / "a.txt").write_text(" cats cat dog.\n\n" * 8000)
    out = tmp_path / "data"
    prepare(TOK, [str(tmp_path / "a.txt")], out, log=lambda *a: None, progress=False, val_share=0.1)
    data = TokenData(out)
    first = data_usage(data, TOK)
    assert (out / USAGE_FILE).is_file()
    train_tokens = sum(len(s.train) for s in data.sources.values())
    assert first.count.sum() == train_tokens and first.count[CAT] > 0
    again = data_usage(TokenData(out))
    assert np.array_equal(first.alone, again.alone)
    (out / USAGE_FILE).write_bytes(b"not an npz")  # damaged: counted again and rewritten
    assert np.array_equal(data_usage(TokenData(out), TOK).count, first.count)
    (tmp_path / "a.txt").write_text(" dog dog.\n\n" * 8000)
    prepare(TOK, [str(tmp_path / "a.txt")], out, log=lambda *a: None, progress=False, val_share=0.1)
    assert data_usage(TokenData(out), TOK).count[CAT] == 0


def test_neighbours_say_how_the_word_is_used_and_whole_words_mean_standalone_ones(tmp_path, capsys):
    """With the training data's usage, `embed neighbors` prints how the word is used, and
    --whole-words keeps only tokens that mostly stand alone: ␣cat (which mostly begins cats) is
    no whole word there, ␣dog is."""
    import json

    import torch

    from andrea.checkpoint import save_checkpoint
    from andrea.cli import main
    from andrea.config import ModelConfig
    from andrea.inside.embed import neighbours
    from andrea.model import ANDREA

    (tmp_path / "a.txt").write_text((" cats cats cats cat dog dog pet.\n\n") * 4000)
    out = tmp_path / "data"
    prepare(TOK, [str(tmp_path / "a.txt")], out, log=lambda *a: None, progress=False, val_share=0.1)
    usage = data_usage(TokenData(out), TOK)
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=TOK.vocab_size, n_embd=8, n_head=2, n_layer=1, block_size=8)
    model = ANDREA(cfg)
    r = neighbours(model, TOK, "dog", k=TOK.vocab_size, whole_words=True, usage=usage)
    ids = [n["id"] for n in r["neighbours"]]
    assert CAT not in ids and r["usage"]["standalone_share"] == 1.0 and "standing alone" in r["whole_words_rule"]
    assert CAT in [n["id"] for n in neighbours(model, TOK, "dog", k=TOK.vocab_size, whole_words=True)["neighbours"]]
    run = tmp_path / "run"
    run.mkdir()
    save_checkpoint(run / "latest.safetensors", cfg, model.state_dict(), meta={"step": 1, "tokenizer": TOK.to_dict()})
    (run / "train.json").write_text(json.dumps({"data": str(out)}))
    assert main(["embed", "neighbors", "--checkpoint", str(run), "cat", "--whole-words"]) == 0
    text = capsys.readouterr().out
    assert "␣cat stands alone in 25% of its" in text and "␣cat+s (75%)" in text and "standing alone" in text


# ---------------------------------------------------------------- usage.npz read back, checked before believed

def _folder(tmp_path, text=" cats cat dog.\n\n" * 8000, tok=TOK):
    (tmp_path / "a.txt").write_text(text)
    out = tmp_path / "data"
    prepare(tok, [str(tmp_path / "a.txt")], out, log=lambda *a: None, progress=False, val_share=0.1)
    return out


def _forged(path, **changes):
    """usage.npz as andrea wrote it (its own tag kept: anyone can compute it) with members changed."""
    with np.load(path, allow_pickle=False) as z:
        members = {k: z[k] for k in z.files}
    members.update(changes)
    np.savez(path, **{k: v for k, v in members.items() if v is not None})


@pytest.mark.hostile
@pytest.mark.parametrize("case", ["1-d continuations", "3-d continuations", "float counts", "string counts",
                                  "NaN", "negative", "alone above count", "ids past V", "member missing",
                                  "continuations beyond the uses", "object array",
                                  "continuations whose sum overflows int64", "counts past 2^53"])
def test_a_usage_file_with_the_right_tag_but_wrong_arrays_is_counted_again(tmp_path, case):
    out = _folder(tmp_path)
    truth = data_usage(TokenData(out), TOK)
    path = out / USAGE_FILE
    V = TOK.vocab_size
    # four continuations of 2^62 uses each sum to 2^64, which int64 wraps to 0: "no more than the uses"
    # held, and shares of 10^17 were shown
    wrap_ids = np.where(np.arange(8) < 4, np.arange(8), -1).astype(np.int32)[None].repeat(V, 0)
    wrap_counts = np.where(wrap_ids >= 0, 2**62, 0).astype(np.int64)
    forged = {"1-d continuations": {"next_ids": np.zeros(V, np.int32)},
              "3-d continuations": {"next_counts": np.zeros((V, 8, 2), np.int64)},
              "float counts": {"count": truth.count.astype(np.float64)},
              "string counts": {"count": truth.count.astype(str)},
              "NaN": {"alone": np.full(V, np.nan)},
              "negative": {"count": -truth.count},
              "alone above count": {"alone": truth.count + 1},
              "ids past V": {"next_ids": np.where(truth.next_ids >= 0, V + 7, -1).astype(np.int32)},
              "member missing": {"alone": None},
              "continuations beyond the uses": {"next_counts": truth.next_counts * 1000},
              "object array": {"count": np.array([None] * V, dtype=object)},
              "continuations whose sum overflows int64": {"next_ids": wrap_ids, "next_counts": wrap_counts},
              "counts past 2^53": {"count": truth.count + 2**60, "alone": truth.alone + 2**60}}[case]
    _forged(path, **forged)
    again = data_usage(TokenData(out), TOK)  # neither a traceback nor the forged figures
    for a, b in ((again.count, truth.count), (again.alone, truth.alone), (again.next_ids, truth.next_ids),
                 (again.next_counts, truth.next_counts)):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    assert data_usage(TokenData(out), TOK).count.sum() == truth.count.sum()  # rewritten: read back as counted


@pytest.mark.hostile
def test_a_usage_file_whose_headers_claim_more_than_v_or_inflate_costs_nothing_before_it_is_refused(tmp_path):
    import resource
    import zipfile

    out = _folder(tmp_path)
    truth = data_usage(TokenData(out), TOK)
    path = out / USAGE_FILE
    with np.load(path) as z:
        meta = z["meta"]
    # a header that claims 10^11 values, then 600 MB of compressed zeros in a member of the right header
    header = np.lib.format.header_data_from_array_1_0(np.zeros(1, np.int64))
    for shape, zeros in (((10**11,), 16), ((TOK.vocab_size,), 6 * 10**8)):
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr("meta.npy", _npy(meta))
            with z.open("count.npy", "w", force_zip64=True) as f:
                np.lib.format.write_array_header_1_0(f, {**header, "shape": shape})
                block = bytes(1 << 24)
                for _ in range(zeros // len(block) + 1):
                    f.write(block)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        again = data_usage(TokenData(out), TOK)
        grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
        assert np.array_equal(again.count, truth.count) and grown_mb < 200


def _npy(a):
    import io

    buf = io.BytesIO()
    np.save(buf, a)
    return buf.getvalue()


@pytest.mark.hostile
def test_a_folder_prepared_with_another_tokenizer_of_the_same_v_is_not_counted_with_this_one(tmp_path):
    from andrea.errors import AndreaError

    other = HarrisTokenizer([" cot", "z", " dig", "úx", "ohgery"])
    assert other.vocab_size == TOK.vocab_size and other.fingerprint() != TOK.fingerprint()
    out = _folder(tmp_path)
    with pytest.raises(AndreaError, match="prepared with another tokenizer"):
        data_usage(TokenData(out), other)
    assert not (out / USAGE_FILE).exists()  # nothing wrong kept for later lessons to trust
    first = data_usage(TokenData(out), TOK)
    with pytest.raises(AndreaError, match="prepared with another tokenizer"):
        data_usage(TokenData(out), other)  # a kept file changes nothing
    # a kept file that records another tokenizer than the manifest's is counted again
    with np.load(out / USAGE_FILE) as z:
        meta = z["meta"]
    _forged(out / USAGE_FILE, meta=np.array([meta[0], meta[1], other.fingerprint()]),
            count=first.count * 2, alone=first.alone * 2)
    assert np.array_equal(data_usage(TokenData(out), TOK).count, first.count)


@pytest.mark.hostile
def test_a_shard_id_past_v_ends_usage_counting_in_one_sentence_and_a_killed_write_leaves_nothing(tmp_path):
    import subprocess
    import sys

    from andrea.errors import AndreaError

    out = _folder(tmp_path)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    leftover = out / f"{USAGE_FILE}.tmp-{int(dead.stdout)}-0123abcd"
    leftover.write_bytes(b"half a usage file")
    data_usage(TokenData(out), TOK)
    assert not leftover.exists()
    (out / USAGE_FILE).unlink()
    (out / "verified.json").unlink()
    shard = next(out.glob("*.train.*.tok"))
    raw = bytearray(shard.read_bytes())
    raw[-2:] = np.array([TOK.vocab_size + 3], dtype=np.uint16).tobytes()
    shard.write_bytes(bytes(raw))
    with pytest.raises(AndreaError, match="holds token id"):
        data_usage(TokenData(out), TOK)


def _run_on(tmp_path, data_dir, tok):
    """A run folder of a tiny model with `tok`, whose train.json names data_dir."""
    import json

    import torch

    from andrea.checkpoint import save_checkpoint
    from andrea.config import ModelConfig
    from andrea.model import ANDREA

    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=tok.vocab_size, n_embd=8, n_head=2, n_layer=1, block_size=8)
    run = tmp_path / "run"
    run.mkdir()
    save_checkpoint(run / "latest.safetensors", cfg, ANDREA(cfg).state_dict(), meta={"step": 1, "tokenizer": tok.to_dict()})
    (run / "train.json").write_text(json.dumps({"data": str(data_dir)}))
    return run


@pytest.mark.hostile
def test_the_commands_and_the_lab_count_again_over_a_forged_usage_file_and_refuse_another_tokenizers_data(
        tmp_path, capsys):
    import json

    from starlette.testclient import TestClient

    from andrea.cli import main
    from andrea.inside.embed import load_subject
    from andrea.web.lab import create_app

    out = _folder(tmp_path, (" cats cats cats cat dog dog pet.\n\n") * 4000)
    run = _run_on(tmp_path, out, TOK)
    truth = data_usage(TokenData(out), TOK)
    _forged(out / USAGE_FILE, next_counts=np.zeros((TOK.vocab_size, 8, 2), np.int64), count=truth.count * 0.5)
    assert main(["embed", "neighbors", "--checkpoint", str(run), "cat", "--whole-words"]) == 0
    assert "␣cat stands alone in 25% of its" in capsys.readouterr().out
    _forged(out / USAGE_FILE, alone=np.full(TOK.vocab_size, np.nan))
    with TestClient(create_app(load_subject(run)), raise_server_exceptions=False) as c:
        r = c.post("/api/token", json={"word": "cat", "k": 3})
        assert r.status_code == 200 and r.json()["usage"]["standalone_share"] == pytest.approx(truth.share(CAT))
    # the same folder under a model of another tokenizer of the same V: no figures, and why
    other = HarrisTokenizer([" cot", "z", " dig", "úx", "ohgery"])
    assert other.vocab_size == TOK.vocab_size
    (tmp_path / "b").mkdir()
    run2 = _run_on(tmp_path / "b", out, other)
    assert main(["embed", "neighbors", "--checkpoint", str(run2), "cot", "--json"]) == 0
    reply = json.loads(capsys.readouterr().out)
    assert "prepared with another tokenizer" in reply["usage_unknown"] and "stands alone" not in json.dumps(reply)
    assert np.array_equal(data_usage(TokenData(out), TOK).count, truth.count)  # nothing wrong was kept
