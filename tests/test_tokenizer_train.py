"""Training the Harris tokenizer: Harris's statistics, candidate pieces, pruning, weights, the
two trainer versions, and (when the default corpus is fetched) segments and compression on real
English against a byte-level BPE."""

from __future__ import annotations

import gzip
import json
import os
import random
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from helpers import N_SMALL, STEMS, WORDS, dash_docs, morphology_text, prep_doc

import andrea.corpus.sources as sources
import andrea.tokenizer.train as trainer
from andrea.cache import corpus_dir
from andrea.cli import main
from andrea.corpus.registry import DEFAULT_SOURCE_NAMES
from andrea.errors import AndreaError
from andrea.tokenizer.harris import WORD_RE, HarrisTokenizer
from andrea.tokenizer.sample import load_training_texts, sample_source
from andrea.tokenizer.train import SuccessorVariety, successor_variety, train_tokenizer


@pytest.fixture(scope="module")
def text():
    return morphology_text()


@pytest.fixture(scope="module")
def tok(text):
    return train_tokenizer([text], N_SMALL)


# ---------------------------------------------------------------- Harris's statistics and training


def test_successor_variety_counts_by_hand():
    sv = SuccessorVariety(["cat", "car", "cart", "dog"])
    # after "": c, d; after "ca": t, r; after "car": end, t; after "cat": end
    assert [sv.sv[p] for p in ["", "c", "ca", "car", "cat", "cart", "do"]] == [2, 1, 2, 2, 1, 1, 1]
    # before "t": a (cat), r (cart); before "": t, r, g; before "cat": start
    assert [sv.pv[s] for s in ["t", "", "rt", "cat", "g"]] == [2, 3, 1, 1, 1]
    # (prefix, SV(prefix), PV(rest)): PV("r") counts only the "a" of "car"; PV("") the last letters t, r, g
    assert sv.profile("car") == [("", 2, 1), ("c", 1, 1), ("ca", 2, 1), ("car", 2, 3)]


def test_boundaries_fall_between_the_morphemes(tok):
    stats = successor_variety(tok)
    assert stats.boundaries("unworkable") == [2, 6]  # un|work|able
    assert stats.boundaries("kindness") == [4]  # kind|ness
    assert 3 in stats.boundaries("dislocked") and 7 in stats.boundaries("dislocked")  # dis|lock|ed


@pytest.mark.parametrize("width", [3, 6, 32])
def test_boundaries_of_all_words_at_once_are_each_words_boundaries(text, width, monkeypatch):
    """all_boundaries (arrays, with long words finished one by one) against boundaries (one word
    at a time on the SV and PV counts), on the corpus and on random words up to 40 letters."""
    monkeypatch.setattr(SuccessorVariety, "WIDTH", width)
    rng = random.Random(width)
    corpora = [list(trainer.letter_word_counts(trainer.count_words([text]))), ["a"], ["ab", "abc", "abcd"]]
    corpora += [["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 40))) for _ in range(300)]
                for alphabet in ["abc", "abcdefghijklmnopqrstuvwxyzéß"]]
    for words in corpora:
        stats = SuccessorVariety(words)
        found = stats.all_boundaries()
        assert set(found) <= set(stats.words)
        assert all(found.get(w, []) == stats.boundaries(w) for w in stats.words)
        assert all(found.values())  # words without a boundary are left out
    assert SuccessorVariety([]).all_boundaries() == {}


def test_candidates_are_the_pieces_between_boundaries_counted_by_hand():
    """Pieces between any two cuts of the lowercase word (its start, its boundaries, its end), cut
    from the word as written; the first keeps the leading space; whole words count once; words
    that are not letters are only whole words."""
    class Cuts:
        def all_boundaries(self):
            return {"walking": [4], "unwalked": [2, 6]}

    counts = Counter({" Walking": 3, "walking": 2, " unwalked": 1, "42": 5, " x": 1})
    assert trainer.candidate_counts(counts, Cuts()) == Counter({
        " Walking": 3, "walking": 2, " unwalked": 1, "42": 5, " x": 1,  # the words themselves
        " Walk": 3, "walk": 2 + 1, "ing": 3 + 2,  # walk|ing, twice
        " un": 1, " unwalk": 1, "walked": 1, "ed": 1,  # un|walk|ed: every run of pieces but the whole
    })


def test_trained_segments_are_harris_pieces(tok, text):
    """Every segment lies between two successor-variety boundaries of a corpus word (a word's start
    and end included), and the morphemes the corpus was made from are found."""
    counts = trainer.count_words([text])
    stats = SuccessorVariety(trainer.letter_word_counts(counts))
    assert set(tok.segments) <= set(trainer.candidate_counts(counts, stats, marks=True))
    for suffix in ["ing", "ed", "able", "ness", "ment", "ly", "est", "er"]:
        assert suffix + "</w>" in tok.segments, suffix  # a suffix ends its word: a word end
    # a prefix is used at a word's start, so with its space, and here mostly capitalised
    starts = {s.removesuffix("</w>").strip().lower() for s in tok.segments if s.startswith(" ")}
    assert {"un", "re", "pre", "dis", "over"} | set(STEMS) <= starts


def test_morphemes_are_found_where_whole_words_would_pre_empt_them():
    """16 words, each stem x suffix, each 5 times; 8 segments. Each word costs at least 2 tokens
    unless it is a segment itself, and j whole words leave 8 - j segments, whose stems x suffixes
    cover at most ((8 - j) / 2)^2 of the other words in 2 tokens: so the 4 stems (with their
    space) and the 4 suffixes, 2 tokens a word, are the one best choice (j >= 1 costs more)."""
    stems, suffixes = ["walk", "jump", "play", "call"], ["ing", "ful", "ed", "er"]
    words = [" " + a + b for a in stems for b in suffixes]
    text = "".join(words * 5)
    tok = train_tokenizer(text, 8, version=4)
    assert sorted(tok.segments) == sorted([" " + a for a in stems] + suffixes)
    marked = train_tokenizer(text, 8)  # version 5: the same cuts, each suffix as the end of its word
    assert sorted(marked.segments) == sorted([" " + a for a in stems] + [x + "</w>" for x in suffixes])
    assert [marked.segment_label(i) for i in marked.encode(" walking", bos=False)] == [" walk", "ing</w>"]
    assert len(tok.encode(text, bos=False)) == 2 * len(words) * 5
    assert tok.decode(tok.encode(" walking", bos=False)) == " walking"
    assert [tok.id_to_piece(i) for i in tok.encode(" walking", bos=False)] == [" walk", "ing"]
    assert successor_variety(tok).boundaries("walking") == [4]  # the cut inspect shows


def test_the_best_segment_set_is_found_as_exhaustive_search_finds_it():
    """Words of 4 stems x 4 suffixes with uneven counts: every choice of n candidates is tried,
    and training reaches the fewest tokens any of them spends."""
    from itertools import combinations

    rng = random.Random(3)
    counts = {" " + a + b: rng.choice([1, 2, 3, 5, 8]) for a in ["walk", "jump", "play", "call"]
              for b in ["ing", "ful", "ed", "s"]}
    text = "".join(w * k for w, k in counts.items())
    word_counts = trainer.count_words([text])
    cands = [s for s, k in trainer.candidate_counts(word_counts, SuccessorVariety(trainer.letter_word_counts(word_counts))).items()
             if k >= 2 and len(s.encode()) > 1]

    def tokens(segments):
        t = HarrisTokenizer(list(segments))
        return sum(len(t.encode(w, bos=False)) * k for w, k in counts.items())

    for n in (3, 5):
        best = min(tokens(c) for c in combinations(sorted(cands), n))
        assert tokens(train_tokenizer(text, n).segments) == best, n


def test_training_is_deterministic(tok, text):
    again = train_tokenizer(text, N_SMALL)  # one string is one document
    assert again.segments == tok.segments and again.fingerprint() == tok.fingerprint()


@pytest.mark.slow
def test_training_does_not_depend_on_the_hash_seed(tok):
    """Sets and dicts iterate in an order that varies with PYTHONHASHSEED; the segments must not."""
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from helpers import morphology_text, N_SMALL; "
            "from andrea.tokenizer.train import train_tokenizer; print(train_tokenizer(morphology_text(), N_SMALL).fingerprint())")
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    done = subprocess.run([sys.executable, "-c", code, str(Path(__file__).parent)], capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == tok.fingerprint()


def test_weights_scale_the_counts():
    counts = trainer.count_words(["a b b", "c"], weights=[2, 0.5])
    assert counts == Counter({"a": 2, " b": 4, "c": 0.5})
    with pytest.raises(AndreaError, match="one weight per document"):
        trainer.count_words(["a", "b"], weights=[1])
    with pytest.raises(AndreaError, match="non-negative"):
        trainer.count_words(["a"], weights=[-1])
    with pytest.raises(AndreaError, match="non-negative"):
        trainer.count_words(["a"], weights=["2"])


def test_counting_on_several_processes_counts_the_same(text, monkeypatch):
    docs = [text[i : i + 2000] for i in range(0, len(text), 2000)]
    serial = trainer.count_words(docs, workers=1)
    monkeypatch.setattr(trainer, "PARALLEL_COUNT_CHARS", 1)
    assert trainer.count_words(docs, workers=2) == serial
    assert serial == Counter(w for d in docs for w in WORD_RE.findall(d))


def test_the_two_prunings_on_two_processes_choose_the_same(text, monkeypatch):
    one = train_tokenizer([text], 120, workers=1)
    monkeypatch.setattr(trainer, "PARALLEL_WORDS", 1)
    assert train_tokenizer([text], 120, workers=2).segments == one.segments


def test_source_shares_become_document_weights(tmp_path):
    big, small = tmp_path / "big.txt", tmp_path / "small.txt"
    big.write_text("word " * 300)
    small.write_text("other " * 100)
    texts, weights = load_training_texts([str(big), str(small)])
    assert weights is None and len(texts) == 2
    texts, weights = load_training_texts([str(big), str(small)], shares={str(big): 1, str(small): 1})
    # equal shares: each source's documents weigh in with the same number of bytes in all
    sizes = [len(t.encode()) for t in texts]
    assert weights[0] * sizes[0] == pytest.approx(weights[1] * sizes[1])
    with pytest.raises(AndreaError, match="share"):
        load_training_texts([str(big)], shares={})


def test_too_few_segments_in_the_corpus():
    with pytest.raises(AndreaError, match=r"requested 5,000 segments but the corpus supplies only \d+"):
        train_tokenizer(["the cat sat on the mat. the cat ran."], 5000)


@pytest.mark.parametrize("n", [0, -3, 1.5, True, "8"])
def test_number_of_segments_must_be_a_positive_whole_number(n):
    with pytest.raises(AndreaError, match="at least 1"):
        train_tokenizer(["some text here, some text there"], n)


def test_empty_training_text():
    with pytest.raises(AndreaError, match="empty"):
        train_tokenizer([""], 10)


# ---------------------------------------------------------------- real English (the default corpus)


SOURCES = list(DEFAULT_SOURCE_NAMES)


MORPHEMES = ["un", "re", "pre", "ing", "able", "ly", "tion", "ed", "ness", "ment", "er", "est"]


needs_corpus = pytest.mark.skipif(not all((corpus_dir() / s / "meta.json").exists() for s in SOURCES),
                                  reason="the default corpus is not fetched (run `andrea data fetch`)")


@pytest.fixture(scope="module")
def english():
    from andrea.tokenizer.sample import load_documents

    train = [d for s in SOURCES for d in load_documents(s, "train")][::16]  # every 16th document: about 2.4 MB
    val = [d for s in SOURCES for d in load_documents(s, "val")]
    return train, val, train_tokenizer(train, 8192)


@needs_corpus
@pytest.mark.slow
def test_english_segments_include_the_common_affixes(english):
    _, _, tok = english
    found = [m for m in MORPHEMES if m in tok.segments]
    assert len(found) >= 8, found


@needs_corpus
@pytest.mark.slow
def test_english_compression_against_byte_level_bpe(english):
    """Bytes per token on held-out text at least 0.9x a byte-level BPE of the same vocabulary size
    (8,449) trained on the same text."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    train, val, tok = english
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=tok.vocab_size, special_tokens=["<BOS>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(train, trainer)
    assert bpe.get_vocab_size() == tok.vocab_size == 8449
    size = sum(len(d.encode()) for d in val)
    harris_bpt = size / sum(map(len, tok.encode_batch(val, bos=False)))
    bpe_bpt = size / sum(len(e.ids) for e in bpe.encode_batch(val))
    assert harris_bpt >= 0.9 * bpe_bpt, (harris_bpt, bpe_bpt)


def test_tokenizer_train_with_a_training_config_uses_the_curriculum_weights(tmp_path, capsys):
    """`tokenizer train --config` weighs each source as the curriculum opens: equal shares, then
    floors and caps; the result equals training on those shares directly."""
    rng = random.Random(5)
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text(" ".join(rng.choice(["undo", "redo", "kindness", "darkness"]) for _ in range(3000)))
    b.write_text(" ".join(rng.choice(["playing", "played", "player", "replay"]) for _ in range(600)))
    config = {"sources": [{"name": "a", "path": str(a), "cap": 0.25}, {"name": "b", "path": str(b)}]}
    (tmp_path / "train.json").write_text(json.dumps(config))
    assert main(["tokenizer", "train", "--config", str(tmp_path / "train.json"), "--segments", "8", "--out", str(tmp_path / "t")]) == 0
    assert f"{a} 0.25, {b} 0.75" in capsys.readouterr().out
    texts, weights = load_training_texts([str(a), str(b)], {str(a): 0.25, str(b): 0.75})
    direct = train_tokenizer(texts, 8, weights=weights)
    assert HarrisTokenizer.load(tmp_path / "t").fingerprint() == direct.fingerprint()
    unweighted = train_tokenizer(texts, 8)
    assert unweighted.fingerprint() != direct.fingerprint()


# ---------------------------------------------------------------- version 4: a character's real cost


def test_version_4_scores_a_multibyte_character_at_its_bytes():
    docs = dash_docs()
    train, held = docs[:250], docs[250:]
    v3 = train_tokenizer(train, 60, version=3)
    v4 = train_tokenizer(train, 60, version=4)
    assert v4.meta["settings"]["version"] == 4 and v3.meta["settings"]["version"] == 3
    # "’" is used thousands of times and costs 3 byte tokens without its segment: v4 keeps it,
    # v3 scored its absence as one token (no loss) and dropped it first
    assert "\u2019" in v4.segments and "\u2019" not in v3.segments
    spent3 = sum(len(v3.encode(d, bos=False)) for d in held)
    spent4 = sum(len(v4.encode(d, bos=False)) for d in held)
    assert spent4 < 0.95 * spent3
    for tok in (v3, v4):
        assert all(tok.decode(tok.encode(d)) == d for d in held)


def test_version_3_reproduces_the_earlier_release():
    # the fingerprint the release before version 4 trained on this text (its code, run once)
    tok = train_tokenizer(dash_docs()[:250], 60, version=3)
    assert tok.fingerprint()[:16] == "a8c73fa517f8adc0"


def test_unknown_trainer_version_is_refused():
    with pytest.raises(AndreaError, match="version 6 is not one this release trains"):
        train_tokenizer("some text some text", 1, version=6)


def test_cli_trainer_version(tmp_path, capsys):
    src = tmp_path / "dash.txt"
    src.write_text("\n\n".join(dash_docs()[:250]), encoding="utf-8")
    for v in (3, 4):
        assert main(["tokenizer", "train", str(src), "--segments", "60", "--trainer-version", str(v),
                     "--out", str(tmp_path / f"v{v}")]) == 0
        assert json.loads((tmp_path / f"v{v}" / "tokenizer.json").read_text())["settings"]["version"] == v
    assert "\u2019" in HarrisTokenizer.load(tmp_path / "v4").segments
    assert "\u2019" not in HarrisTokenizer.load(tmp_path / "v3").segments


# ---------------------------------------------------------------- hostile input


@pytest.mark.hostile
def test_one_very_long_word_costs_training_its_length_not_its_square():
    """A 200,000-letter word (twice, so it could be a candidate) among ordinary text: fitting ends
    in seconds (it grew with the square of the word: 2.3 s at 40,000 letters, over a minute at
    200,000), and no segment is longer than the cap."""
    rng = random.Random(0)
    word = "".join(rng.choice("abcdefghij") for _ in range(200_000))
    hostile = " ".join("".join(rng.choice("ab") for _ in range(300)) for _ in range(2000))  # peaks everywhere
    texts = [" ".join(rng.choice(WORDS) for _ in range(2000)) for _ in range(20)] + [word + " " + word, hostile]
    start = time.time()
    tok = train_tokenizer(texts, 15)
    assert time.time() - start < 20
    assert max(len(s) for s in tok.segments) <= trainer.MAX_WORD_CHARS + 1
    assert tok.decode(tok.encode(word, bos=False)) == word


def test_the_tokenizer_fits_on_an_even_sample_across_files(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sources, "CHUNK_BYTES", 20_000)
    root = tmp_path / "big"
    root.mkdir()
    for i in range(6):
        rng = random.Random(i)
        lines = "".join(json.dumps({"text": f"file{i} " + prep_doc(rng, 60)}) + "\n" for _ in range(400))
        (root / f"part{i}.jsonl.gz").write_bytes(gzip.compress(lines.encode()))
    whole = sample_source(str(root), None)
    assert whole.everything and whole.bytes > 500_000 and whole.tasks_total > 30
    budget = whole.bytes // 5
    s = sample_source(str(root), budget)
    assert not s.everything and budget * 0.9 <= s.bytes <= budget + 2000
    assert {t.split()[0] for t in s.texts} == {f"file{i}" for i in range(6)}  # drawn from every file
    assert s.texts == sample_source(str(root), budget).texts  # deterministic
    assert set(s.texts) <= set(whole.texts)  # training documents only
    code = main(["tokenizer", "train", str(root), "--segments", "20", "--sample-bytes", str(budget), "--out", str(tmp_path / "t")])
    out = capsys.readouterr().out
    assert code == 0 and f"sampling at most {budget:,} bytes" in out and "drawn evenly from" in out and "across 6 files" in out
    texts, _ = load_training_texts([str(root)], sample_bytes=budget)
    assert texts == s.texts
