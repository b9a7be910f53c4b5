"""Whether a tokenizer's word tokens mean one word: purity and coverage, measured on a text.

A token stands for a word when its text is a space and letters (" cat") and it is the whole word
in at least MIN_USES (20) of its uses (so " bo", the word "bo" once and the start of " bo" + "ok"
hundreds of times, is a piece, not a word). Its row in a model learns what the token does in use, so:

- purity of a word token: the share of its uses in which it is the whole word (" cat" in "my cat
  sat"), not the first piece of a longer one (" cat" + "s", " cat" + "egory");
- coverage of a word: the share of its occurrences, after a space or not (" cat", "cat"), encoded
  as one token; punctuation after a word is a word of its own (andrea.tokenizer.harris, step 1), so "cat,"
  counts as cat.

Both are exact over a text's words: segments never span two words, so each word type is encoded
once and weighed by its count. The word-end tokens of tokenizer version 5 (" cat</w>") are pure by
construction (a plain segment never ends a letter word there); the plain " cat" of earlier
versions is as pure as the text makes it (34% on the default corpus, where it also begins cats,
category and catholic). `andrea tokenizer words` prints
this report; the lab's Token view shows the figures of the word it looks up, counted on the run's
training text as `data_word_counts` decodes it from the token shards.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from andrea.config import BOS
from andrea.tokenizer.harris import LETTER_WORD

PURE = 0.9  # a word token is pure, and a word covered, at this share or more
MIN_USES = 20  # below this a token's share is too noisy to count in the summary


@dataclass
class WordTokens:
    """uses[id] and whole[id] (uses that are the whole word) over a text, and its word counts."""

    uses: Counter
    whole: Counter
    word_counts: Counter

    def purity(self, i: int) -> float | None:
        n = self.uses[i]
        return self.whole[i] / n if n else None

    def word(self, tokenizer, word: str) -> dict:
        """One word's figures: its tokens after a space, purity of that token when it is one, and
        its coverage over both forms (" cat" and "cat")."""
        word = word.strip()
        spaced = tokenizer.encode(" " + word, bos=False)
        occ = {form: self.word_counts[form] for form in (" " + word, word)}
        single = sum(k for form, k in occ.items() if k and len(tokenizer.encode(form, bos=False)) == 1)
        total = sum(occ.values())
        out = {"word": word, "tokens": [tokenizer.segment_label(i) for i in spaced], "ids": spaced,
               "occurrences": total, "coverage": single / total if total else None, "uses": None, "purity": None}
        if len(spaced) == 1:
            out.update(uses=int(self.uses[spaced[0]]), purity=self.purity(spaced[0]))
        return out

    def sentence(self, tokenizer, word: str) -> str:
        """One word's figures in words: its coverage, then its token's purity (or its pieces)."""
        r = self.word(tokenizer, word)
        label = "+".join(r["tokens"]).replace(" ", "␣")
        if not r["occurrences"]:
            return f"{r['word']} does not occur in the training text as a word of its own ({label})"
        line = (f"{r['word']} occurs {r['occurrences']:,} times in the training text, {r['coverage']:.0%} of them as one "
                f"token (its coverage)")
        if r["purity"] is None:
            return line + f"; after a space it is {len(r['ids'])} tokens: {label}"
        return line + f"; {label} is the whole word in {r['purity']:.0%} of its {r['uses']:,} uses (its purity)"

    def summary(self, tokenizer, min_uses: int = MIN_USES) -> dict:
        """The word tokens (whole words in at least min_uses uses): how many, how many pure, the least pure."""
        rows = [(i, self.uses[i], self.purity(i)) for i in self.whole if self.whole[i] >= min_uses
                and LETTER_WORD.fullmatch(tokenizer.id_to_piece(i)) and tokenizer.id_to_piece(i).startswith(" ")]
        pure = [r for r in rows if r[2] >= PURE]
        uses = sum(r[1] for r in rows)
        worst = sorted(rows, key=lambda r: (r[2], -r[1]))[:8]
        return {"word_tokens": len(rows), "pure": len(pure), "pure_share": len(pure) / len(rows) if rows else None,
                "uses_pure_share": sum(r[1] for r in pure) / uses if uses else None, "min_uses": min_uses,
                "least_pure": [{"id": i, "token": tokenizer.segment_label(i), "uses": int(n), "purity": p}
                               for i, n, p in worst]}


def word_tokens(tokenizer, word_counts) -> WordTokens:
    """Purity counts of every token over a text's word counts (andrea.tokenizer.train.count_words)."""
    uses, whole = Counter(), Counter()
    for w, k in word_counts.items():
        ids = tokenizer.encode(w, bos=False)
        for i in ids:
            uses[i] += k
        if len(ids) == 1:
            whole[ids[0]] += k
    return WordTokens(uses, whole, Counter(word_counts))


def data_word_counts(data, tokenizer, chunk_tokens: int = 4_000_000) -> Counter:
    """The word counts of a prepared data folder's training text (`andrea.shards.TokenData`), its
    documents decoded from the shards: each is cut at its BOS and decoded whole, so no word is split
    where a chunk or a shard ends. Decoding is exact, so these are the counts of the text itself."""
    from andrea.tokenizer.train import count_words

    counts = Counter()
    for source in data.sources.values():
        carry = np.zeros(0, dtype=np.int64)
        for shard in source.train.shards:
            for s in range(0, len(shard), chunk_tokens):
                ids = np.concatenate([carry, np.asarray(shard[s : s + chunk_tokens], dtype=np.int64)])
                starts = np.flatnonzero(ids == BOS)
                cut = int(starts[-1]) if len(starts) else 0
                docs = np.split(ids[:cut], starts[starts < cut])
                counts.update(count_words([tokenizer.decode(d.tolist()) for d in docs if len(d)], workers=1))
                carry = ids[cut:]
        if len(carry):
            counts.update(count_words([tokenizer.decode(carry.tolist())], workers=1))
    return counts
