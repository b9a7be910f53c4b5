"""The sample audit: score a generated sample's coherence 0-100, and halt a run that has collapsed.

A collapsing model repeats itself ("region region region", "games, games, games,", a run of
quotes) long before its loss says so. `coherence_score` combines four components, each in [0, 1]:

    bigram_diversity   distinct word bigrams / word bigrams      (0 with fewer than 2 words)
    trigram_diversity  distinct word trigrams / word trigrams    (0 with fewer than 3 words)
    real_words         share of whitespace-separated tokens that are real words (below)
    char_diversity     Shannon entropy of the characters (whitespace runs count as one space)
                       in bits / 4.0, capped at 1; English prose carries a little over 4 bits

    score = 100 * bigram^0.3 * trigram^0.2 * real_words^0.3 * char^0.2

a weighted geometric mean, weights summing to 1. Geometric, not arithmetic, because a sample that
fails one test outright is incoherent however well it does on the others: "region region region"
has only real words and a fair spread of letters, and an arithmetic mean would still give it ~45;
here its near-zero n-gram diversity pulls it to ~10. Windows of 250 words of the default corpus
score above 70, median 95-98 (the lowest is a King James genealogy, "and begat" over and over).

Words are the tokens between whitespace with surrounding punctuation stripped, lowercased, with
curly apostrophes made straight and dashes ("--", em and en dashes) treated as spaces. A token is
a real word when it is a number (digits with , or . inside, optional st/nd/rd/th/s), or:
- with a lexicon (a set of lowercased words, e.g. `build_lexicon(training documents)`): the word
  or every part of a hyphenated word is in the lexicon;
- without one, when it looks English: ASCII letters with optional inner ' or -, one to 24
  letters, a vowel (y counts), no letter three times in a row, no more than five consonants in a
  row, one-letter words only "a", "i", "o", and each hyphen-separated part lower, Capitalised or
  UPPER case (not mIxed). This catches byte garbage, not word salad ("believtion" looks
  English), so pass a lexicon of the training corpus when there is one.
Tokens that strip to nothing (a run of quotes or dashes) count as tokens that are not words.

`AuditTracker` counts consecutive scores below a threshold and says halt after `patience` of them.
"""

from __future__ import annotations

import math
import re
from collections import Counter

from andrea.config import BOS
from andrea.errors import AndreaError

WEIGHTS = {"bigram_diversity": 0.3, "trigram_diversity": 0.2, "real_words": 0.3, "char_diversity": 0.2}
ENTROPY_REFERENCE_BITS = 4.0

_PUNCT = "\"'`.,;:!?()[]{}<>*_~#$%&@^|/\\+=«»“”‘’„…"
_DASHES = re.compile(r"--+|[\u2013\u2014]")
_NUMBER = re.compile(r"\d+(?:[.,]\d+)*(?:st|nd|rd|th|s)?")
_LOOKS_ENGLISH = re.compile(r"[a-z]+(?:['-][a-z]+)*")
_VOWEL = re.compile(r"[aeiouy]")
_TRIPLE = re.compile(r"(.)\1\1")
_CONSONANTS6 = re.compile(r"[b-df-hj-np-tv-xz]{6}")


def tokens(text: str) -> list[str]:
    """Whitespace-separated tokens, stripped of surrounding punctuation, case kept ('' for all-punctuation)."""
    text = _DASHES.sub(" ", text.replace("\u2019", "'"))
    return [t.strip(_PUNCT) for t in text.split()]


def words(text: str) -> list[str]:
    """The lowercased words of `text`, in order: what the n-gram and lexicon tests look at."""
    return [t.lower() for t in tokens(text) if t]


def build_lexicon(texts, min_count: int = 1) -> set[str]:
    """The words (lowercased) occurring at least `min_count` times in `texts`, e.g. a training corpus."""
    counts = Counter(w for text in texts for w in words(text))
    return {w for w, n in counts.items() if n >= min_count}


def looks_english(token: str) -> bool:
    """The lexicon-free test for a real word (see the module docstring)."""
    if not all(p.islower() or p.isupper() or (p[:1].isupper() and p[1:].islower()) for p in token.split("-")):
        return False
    w = token.lower()
    if not _LOOKS_ENGLISH.fullmatch(w):
        return False
    letters = w.replace("'", "").replace("-", "")
    if len(letters) > 24 or (len(letters) == 1 and letters not in "aio"):
        return False
    return bool(_VOWEL.search(w)) and not _TRIPLE.search(w) and not _CONSONANTS6.search(w)


def is_real_word(token: str, lexicon: set[str] | None = None) -> bool:
    if not token:
        return False
    if _NUMBER.fullmatch(token):
        return True
    if lexicon is None:
        return looks_english(token)
    w = token.lower()
    return w in lexicon or ("-" in w and all(part in lexicon for part in w.split("-") if part))


def ngram_diversity(seq: list[str], n: int) -> float:
    """Distinct n-grams / n-grams of `seq`; 0 when it has none."""
    grams = [tuple(seq[i:i + n]) for i in range(len(seq) - n + 1)]
    return len(set(grams)) / len(grams) if grams else 0.0


def char_entropy(text: str) -> float:
    """Shannon entropy in bits per character, whitespace runs counted as one space."""
    text = " ".join(text.split())
    if not text:
        return 0.0
    counts = Counter(text)
    n = len(text)
    return -sum(c / n * math.log2(c / n) for c in counts.values())


def coherence_score(text: str, lexicon: set[str] | None = None) -> tuple[float, dict[str, float]]:
    """(score 0-100, components in [0, 1]) for a generated sample; see the module docstring."""
    toks = tokens(text)
    ws = [t.lower() for t in toks if t]
    components = {
        "bigram_diversity": ngram_diversity(ws, 2),
        "trigram_diversity": ngram_diversity(ws, 3),
        "real_words": sum(is_real_word(t, lexicon) for t in toks) / len(toks) if toks else 0.0,
        "char_diversity": min(1.0, max(0.0, char_entropy(text)) / ENTROPY_REFERENCE_BITS),
    }
    if min(components.values()) <= 0.0:
        return 0.0, components
    score = 100.0 * math.exp(sum(WEIGHTS[k] * math.log(v) for k, v in components.items()))
    return score, components


class AuditTracker:
    """Says halt once `patience` scores in a row fall below `threshold`."""

    def __init__(self, threshold: float = 30.0, patience: int = 5):
        if not 0.0 <= threshold <= 100.0:
            raise AndreaError(f"the audit threshold must lie in 0..100, got {threshold!r}.")
        if not isinstance(patience, int) or isinstance(patience, bool) or patience < 1:
            raise AndreaError(f"the audit patience must be a positive integer, got {patience!r}.")
        self.threshold = float(threshold)
        self.patience = patience
        self.streak = 0  # consecutive scores below threshold, ending with the latest
        self.scores: list[float] = []

    def add(self, score: float) -> bool:
        """Record one audit score; True when the run should halt."""
        self.scores.append(float(score))
        self.streak = self.streak + 1 if score < self.threshold else 0
        return self.halt

    @property
    def halt(self) -> bool:
        return self.streak >= self.patience

    def state_dict(self) -> dict:
        return {"threshold": self.threshold, "patience": self.patience, "streak": self.streak, "scores": list(self.scores)}

    def load_state_dict(self, d: dict) -> None:
        self.streak, self.scores = self.check_state(d)

    @staticmethod
    def check_state(d) -> tuple[int, list[float]]:
        """(streak, scores) of a saved state: scores a list of numbers in 0..100, the streak a
        count of the latest of them; an AndreaError names the field that is damaged."""
        if not isinstance(d, dict):
            raise AndreaError(f"its audit state is not an object (found {type(d).__name__}).")
        scores, streak = d.get("scores"), d.get("streak")
        if (not isinstance(scores, list)
                or not all(isinstance(s, (int, float)) and not isinstance(s, bool) and 0.0 <= s <= 100.0 for s in scores)):
            what = f"a list of {len(scores):,} items" if isinstance(scores, list) else repr(scores)[:60]
            raise AndreaError(f"its audit state field 'scores' is damaged (found {what}).")
        if not isinstance(streak, int) or isinstance(streak, bool) or not 0 <= streak <= len(scores):
            shown = "an integer of more than 30 digits" if isinstance(streak, int) and abs(streak) > 10**30 else repr(streak)[:60]
            raise AndreaError(f"its audit state field 'streak' is damaged (found {shown}).")
        return streak, [float(s) for s in scores]


def make_auditor(cfg, data, tokenizer) -> AuditTracker | None:
    """The audit of a run (`cfg`: its TrainConfig), its lexicon read from the data's training
    text, or None when the audit is off."""
    if not cfg.audit["enabled"]:
        return None
    tracker = AuditTracker(threshold=cfg.audit["threshold"], patience=cfg.audit["patience"])
    # "real words" are the words of the training text (its first 200k tokens per source)
    tracker.lexicon = build_lexicon(tokenizer.decode([int(t) for t in s.train[:200_000] if t != BOS])
                                    for s in data.sources.values())
    return tracker
