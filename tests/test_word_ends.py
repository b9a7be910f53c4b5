"""Word ends (tokenizer format 2, trainer version 5): a whole word's token is that word alone. The
rule on hand-built segment lists, the compiled path against the Python one, files, training with
reserved words, the peers that encode by the same rule (the standalone engine, the Hugging Face
folder's README), and purity and coverage (andrea.tokenizer.words) counted by hand."""

import json
import re
import sys

import numpy as np
import pytest
from helpers import N_SMALL, morphology_text, python_only
from hypothesis import given, settings
from hypothesis import strategies as st

import andrea.tokenizer.harris as harris
from andrea.cli import main
from andrea.errors import AndreaError
from andrea.inside.vectors import whole_word_mask
from andrea.stdlib_engine import Tokenizer as EngineTokenizer
from andrea.tokenizer.harris import WORD_RE, HarrisTokenizer
from andrea.tokenizer.train import count_words, train_tokenizer
from andrea.tokenizer.words import data_word_counts, word_tokens

SEGMENTS = [" cat", " cat</w>", "s</w>", "egory</w>", " the</w>", " do", "og</w>", "'s", "ing", "ing</w>", " sing</w>"]


TOKENIZERS = [HarrisTokenizer, python_only]


def labels(tok, text):
    return [tok.segment_label(i) for i in tok.encode(text, bos=False)]


@pytest.mark.parametrize("make", TOKENIZERS)
def test_the_word_and_its_longer_words_get_different_tokens(make):
    tok = make(SEGMENTS)
    assert labels(tok, " cat") == [" cat</w>"]
    assert labels(tok, " cats") == [" cat", "s</w>"]
    assert labels(tok, " category") == [" cat", "egory</w>"]
    assert labels(tok, " cat, the cat.") == [" cat</w>", ",", " the</w>", " cat</w>", "."]  # punctuation is a word apart
    assert labels(tok, " dog") == [" do", "g"]  # a plain segment never ends a letter word: " do" + "og</w>" is no match
    assert labels(tok, " doog") == [" do", "og</w>"]
    assert labels(tok, "'s") == ["'s"]  # a contraction is no letter word: its plain segment ends it
    assert labels(tok, " singing") == [" ", "s", "ing", "ing</w>"]  # " sing</w>" is no match inside a word
    assert tok.word_ends == {257 + i for i, s in enumerate(SEGMENTS) if s.endswith("</w>")}


@pytest.mark.parametrize("make", TOKENIZERS)
def test_without_word_ends_the_rule_is_as_before(make):
    tok = make([" cat", "s", " do"])
    assert labels(tok, " cat") == [" cat"] and labels(tok, " cats") == [" cat", "s"] and labels(tok, " do") == [" do"]
    assert tok.to_dict()["version"] == 1 and HarrisTokenizer(SEGMENTS).to_dict()["version"] == 2


TEXT = st.text(alphabet=st.sampled_from(list("catsdogeryinh '’,.\n") + ["é", "😀", "\ud800", "\0"]), max_size=80)


@pytest.fixture(scope="module")
def trained():
    return train_tokenizer([morphology_text()], N_SMALL, reserve=[" zebra"])


@settings(max_examples=150, deadline=None)
@given(TEXT)
def test_compiled_python_and_engine_agree_and_round_trip(s):
    for segments in (SEGMENTS, [" cat</w>", "a</w>", " c", "at"]):
        fast, slow, engine = HarrisTokenizer(segments), python_only(segments), EngineTokenizer(segments)
        ids = fast.encode(s)
        assert ids == slow.encode(s) == engine.encode(s)
        assert fast.decode(ids) == s == engine.decode(ids[1:])


def test_trained_tokenizer_agrees_on_its_text(trained):
    text = morphology_text(40, seed=3) + " zebra zebras"
    slow, engine = python_only(trained.segments), EngineTokenizer(trained.segments)
    ids = trained.encode(text)
    assert ids == slow.encode(text) == engine.encode(text) and trained.decode(ids) == text
    if harris._compiled is not None:
        for w in set(WORD_RE.findall(text)):
            marked = harris.ends_in_letter(w)
            assert harris._compiled.encode_word(trained._trie, w, marked) == slow._rule.encode(w)


def test_every_whole_word_token_is_a_word_end(trained):
    counts = count_words([morphology_text()])
    for w in counts:
        ids = trained.encode(w, bos=False)
        if len(ids) == 1 and ids[0] > 256 and re.fullmatch(r" ?[^\W\d_]+", w):
            assert ids[0] in trained.word_ends, w


def test_reserved_words_are_kept_and_recorded(trained):
    assert " zebra</w>" in trained.segments and trained.n_segments == N_SMALL
    assert trained.meta["settings"] == {"min_count": 2, "version": 5, "reserved": [" zebra"]}
    assert " zebra</w>" not in train_tokenizer([morphology_text()], N_SMALL).segments
    with pytest.raises(AndreaError, match="needs tokenizer version 5"):
        train_tokenizer("a cat a cat", 2, version=4, reserve=[" cat"])
    with pytest.raises(AndreaError, match="letters after an optional space"):
        train_tokenizer("a cat a cat", 2, reserve=["c t"])


def test_files_keep_word_ends_and_refuse_what_no_text_holds(trained, tmp_path):
    back = HarrisTokenizer.load(trained.save(tmp_path / "tok"))
    assert back.segments == trained.segments and back.word_ends == trained.word_ends
    assert json.loads((tmp_path / "tok" / "tokenizer.json").read_text())["version"] == 2
    assert HarrisTokenizer.from_dict(trained.to_dict()).fingerprint() == trained.fingerprint()
    for bad, message in (([" c t</w>"], "not a word of letters"), (["1</w>"], "not a word of letters"),
                         (["</w>"], "empty segment"), (["ab\0"], "letter before the character 0")):
        (tmp_path / "bad.json").write_text(json.dumps(bad))
        with pytest.raises(AndreaError, match=message):
            HarrisTokenizer.load(tmp_path / "bad.json")
    with pytest.raises(AndreaError, match="format version 3"):
        HarrisTokenizer.from_dict({**trained.to_dict(), "version": 3})
    assert HarrisTokenizer(["%\0"]).encode("%\0", bos=False) == [257]  # a symbol may hold it


def test_hugging_face_folder_says_the_rule_and_its_python_encodes_alike(tmp_path):
    import torch

    from andrea.checkpoint import save_checkpoint
    from andrea.config import ModelConfig
    from andrea.formats import convert
    from andrea.model import ANDREA

    tok = HarrisTokenizer(SEGMENTS)
    cfg = ModelConfig(vocab_size=tok.vocab_size, block_size=16, n_layer=1, n_head=2, n_embd=32)
    torch.manual_seed(0)
    save_checkpoint(tmp_path / "m.safetensors", cfg, ANDREA(cfg).state_dict(), meta={"tokenizer": tok.to_dict()})
    _, notes = convert(tmp_path / "m.safetensors", tmp_path / "hf", "hf")
    assert any("word ends" in n for n in notes) and not (tmp_path / "hf" / "tokenizer.json").exists()
    readme = (tmp_path / "hf" / "README.md").read_text()
    code = "\n".join(line[4:] for line in readme.split("in plain Python:", 1)[1].splitlines() if line.startswith("    "))
    scope = {}
    cwd = tmp_path / "hf"
    exec(code.replace('"harris_segments.json"', repr(str(cwd / "harris_segments.json"))), scope)
    for s in (" cat cats category the doog dog's singing", "Cat's 😀 cat,cat"):
        assert scope["encode"](s) == tok.encode(s)


def test_purity_and_coverage_counted_by_hand():
    text = " cat cat cats category the cat,cat"  # " cat" x3, "cat" x1, " cats", " category"
    counts = count_words([text])
    plain = HarrisTokenizer([" cat", "s", "egory"])  # today's kind: " cat" also begins longer words
    r = word_tokens(plain, counts).word(plain, "cat")
    assert r["uses"] == 5 and r["purity"] == pytest.approx(3 / 5) and r["coverage"] == pytest.approx(3 / 4)
    marked = HarrisTokenizer(SEGMENTS + ["cat</w>"])
    r = word_tokens(marked, counts).word(marked, "cat")
    assert r["tokens"] == [" cat</w>"] and r["uses"] == 3 and r["purity"] == 1 and r["coverage"] == 1
    s = word_tokens(marked, counts).summary(marked, min_uses=1)
    assert s["word_tokens"] == 2 and s["pure"] == 2  # " cat</w>" and " the</w>"


def test_word_counts_decoded_from_shards_are_the_texts_and_the_lab_shows_purity_and_coverage(tmp_path):
    import torch
    from starlette.testclient import TestClient

    from andrea.checkpoint import save_checkpoint
    from andrea.config import ModelConfig
    from andrea.inside.embed import load_subject
    from andrea.model import ANDREA
    from andrea.prepare import prepare
    from andrea.shards import TokenData
    from andrea.web.lab import create_app

    tok = HarrisTokenizer(SEGMENTS)
    docs = [f"The cat{k % 3 * 's'} and the dog's category.\n" for k in range(300)]
    (tmp_path / "a.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    data = tmp_path / "data"
    prepare(tok, [str(tmp_path / "a.jsonl")], data, log=lambda *a: None, progress=False, val_share=0.1)
    folder = TokenData(data)
    train = []  # the training documents as the shards hold them, each decoded in one piece
    for source in folder.sources.values():
        doc = []
        for i in np.concatenate([np.asarray(sh) for sh in source.train.shards]).tolist() + [harris.BOS]:
            if i == harris.BOS:
                train.append(tok.decode(doc))
                doc = []
            else:
                doc.append(i)
    expected = count_words(train)
    counts = data_word_counts(folder, tok)
    assert counts == expected and counts == data_word_counts(folder, tok, chunk_tokens=7)  # cut anywhere: the same
    assert counts[" cat"] + counts[" cats"] + counts[" catss"] == counts[" and"] > 200
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=tok.vocab_size, n_embd=8, n_head=2, n_layer=1, block_size=8)
    run = tmp_path / "run"
    run.mkdir()
    save_checkpoint(run / "latest.safetensors", cfg, ANDREA(cfg).state_dict(), meta={"step": 1, "tokenizer": tok.to_dict()})
    (run / "train.json").write_text(json.dumps({"data": str(data)}))
    with TestClient(create_app(load_subject(run))) as c:
        r = c.post("/api/token", json={"word": "cat", "k": 3}).json()
        assert r["word_tokens"]["tokens"] == [" cat</w>"] and r["word_tokens"]["purity"] == 1
        assert r["word_tokens"]["coverage"] == pytest.approx(counts[" cat"] / (counts[" cat"] + counts["cat"]))
        assert f"cat occurs {counts[' cat']:,} times in the training text, 100% of them as one token" in r["word_line"]
        assert c.post("/api/token", json={"word": "#257", "k": 3}).json()["word_line"] is None


def test_whole_words_are_the_word_ends_where_there_are_any():
    tok = HarrisTokenizer(SEGMENTS)
    mask = whole_word_mask(tok, tok.vocab_size)
    assert {tok.segment_label(int(i)) for i in np.flatnonzero(mask)} == {" cat</w>", " the</w>", " sing</w>"}
    old = HarrisTokenizer([" cat", "s"])
    assert np.flatnonzero(whole_word_mask(old, old.vocab_size)).tolist() == [257]


def test_cli_words_and_train_reserve(tmp_path, capsys):
    src = tmp_path / "text.txt"
    src.write_text(morphology_text() + " my cat and the cats" * 30)
    assert main(["tokenizer", "train", str(src), "--segments", "120", "--reserve", "cat", "--out", str(tmp_path / "t")]) == 0
    capsys.readouterr()
    assert main(["tokenizer", "words", "--tokenizer", str(tmp_path / "t"), "cat", "--text", str(src), "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["words"][0]["tokens"] == [" cat</w>"] and r["words"][0]["purity"] == 1 and r["summary"]["pure_share"] == 1
    assert main(["tokenizer", "words", "--tokenizer", str(tmp_path / "t"), "cat", "zzz", "--text", str(src)]) == 0
    out = capsys.readouterr().out
    assert "cat: ' cat</w>', purity 100% of 30 uses; coverage 100% of 30" in out and "zzz: 4 tokens" in out
    assert main(["tokenizer", "encode", "--tokenizer", str(tmp_path / "t"), " cat cats", "--pieces", "--no-bos"]) == 0
    assert capsys.readouterr().out.startswith("' cat</w>' ")


if __name__ == "__main__":
    sys.exit(pytest.main([__file__]))
