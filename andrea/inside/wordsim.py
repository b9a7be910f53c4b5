"""Word similarity: the standard scores of a table of word vectors, and the count-based reference.

The sets. SimLex-999 (999 word pairs rated for similarity by people, 0-10) and WordSim-353 (353
pairs rated for relatedness) are scored by Spearman's ρ between the people's ratings and the cosine
of the two words' vectors; the Google analogy set (19,544 questions "a is to b as c is to d") by
3CosAdd accuracy. The three files come from one pinned package on PyPI, gensim 4.4.0's wheel for
CPython 3.11 on manylinux 2.28 (it ships them as test data; nothing of gensim is installed or run),
fetched once with pip into `~/.cache/andrea/wordsets` (or `$ANDREA_CACHE`), SHA-256 checked. Each
file's size and SHA-256 are pinned here, in the code (WORDSET_FILES_PINNED), and every read checks
both against them, so a file changed in place, even to the same size, is named and fetched again,
whatever the record kept beside them (meta.json, for people) says. Sets of your own in the same
formats (another language, a subset) are read from the folder `$ANDREA_WORDSETS` names, instead of
the fetched ones: checked by kind, size bound and format only, since nothing pins them.

A word's vector. Words are looked up in their word-initial form, " cat", as they occur inside
running text. A word that is one token has that token's row; any other word the mean of its
tokens' rows, which compares spellings as much as meanings, so every score is reported for the
pairs of single tokens and for the rest apart, and for all together.

The statistics. ρ over n pairs of a table that knows nothing (a random one) scatters around 0 with
standard deviation about 1/√(n − 1): that null spread is printed beside every ρ. Cosine in many
trained tables is dominated by one shared direction (anisotropy), so every score is given on the
raw table and on the table with its mean row subtracted (centred). The mean cosine over all pairs
of distinct rows is computed exactly in O(V·d): with unit rows ûᵢ and s = Σ ûᵢ, it is
(s·s − n) / (n(n − 1)). At initialisation, rows are random and their cosines scatter ±1/√d
around 0: the band in which "nearly orthogonal" means anything.

3CosAdd. For a question a : b :: c : d with all four words single tokens, the answer is the token
x maximising cos(x, b̂ − â + ĉ) over the whole-word tokens (a space and letters), a, b and c
excluded; accuracy is the share answered d.

The reference. `ppmi_vectors` turns the training tokens into the classic distributional vectors
(Levy & Goldberg 2014): co-occurrence counts in a ±window of tokens (BOS breaks windows),
positive pointwise mutual information with the context counts raised to 0.75, reduced by a
truncated SVD to d dimensions (U·√Σ). "Does the network learn more than counting does?" is the
model's score beside the reference's on the same text.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from andrea.cache import wordsets_dir
from andrea.config import BOS
from andrea.errors import AndreaError
from andrea.files import check_regular, utf8_text
from andrea.inside.vectors import cosine, table, unit_rows, whole_word_mask

WORDSETS_PIP = ["gensim==4.4.0", "--platform", "manylinux_2_28_x86_64", "--python-version", "3.11",
                "--implementation", "cp", "--abi", "cp311"]
WORDSETS_WHEEL = "gensim-4.4.0-cp311-cp311-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl"
WORDSETS_SHA256 = "91a7fa5e814e7b1bad4b2dffa8d62c1e55410d5cbdf930714c1997ffb4404db8"
WORDSETS_LICENCE = "LGPL-2.1 (gensim); SimLex-999 and WordSim-353 free for research, the analogy set Apache-2.0"
WORDSET_FILES = {"simlex999": "simlex999.txt", "wordsim353": "wordsim353.tsv", "analogies": "questions-words.txt"}
# (size, SHA-256) of each file as the pinned wheel holds it: what a read of the fetched sets checks
WORDSET_FILES_PINNED = {
    "simlex999.txt": (18_126, "d5e0501971478a511430ee880bd0121e94ac701ba86d90544d83e6d2ba3db05d"),
    "wordsim353.tsv": (7_186, "f92a022fc2537793a15bc3a8c162ebcd74990e033a228bb6388cb71e4c0b1e1d"),
    "questions-words.txt": (603_955, "8c29b3332afc46f3fb8be04cb5297bf96f39aa7131272dff57869b4485b22a36"),
}
OWN_WORDSETS = "ANDREA_WORDSETS"  # the environment variable naming a folder of sets of one's own
PAIR_SETS = ("simlex999", "wordsim353")
# The lesson's words, defined here once: the lab (its Compare and Growth views get them from the
# server), the lesson, the similarity report and the training log all read them from here.
LESSON_WORDS = ("cat", "dog", "pet", "Tuesday", "xylophone")
LESSON_RELATED = (("cat", "dog"), ("cat", "pet"))
LESSON_UNRELATED = (("cat", "Tuesday"), ("cat", "xylophone"))
LESSON_PAIRS = LESSON_RELATED + LESSON_UNRELATED


# ---------------------------------------------------------------- the sets: fetch and read


def fetch_wordsets(root: Path | None = None, log=print) -> Path:
    """Fetch the pinned wheel with pip, check it, and keep the three files; runs once."""
    import subprocess
    import sys

    out = Path(root) if root else wordsets_dir()
    if (out / "meta.json").exists():
        problem = wordsets_problem(out)
        if problem is None:
            return out
        log(f"fetching the word-similarity sets again: {problem}")
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:", *WORDSETS_PIP,
               "-d", tmp]
        done = subprocess.run(cmd, capture_output=True, text=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if done.returncode != 0 or len(wheels) != 1:
            why = (done.stderr or done.stdout).strip().splitlines()
            raise AndreaError(f"could not fetch the word-similarity sets ({WORDSETS_WHEEL}) with pip: "
                              f"{why[-1] if why else 'no wheel came back'}.")
        staging = out.with_name(out.name + ".partial")
        extract_wordsets(wheels[0], staging)
    shutil.rmtree(out, ignore_errors=True)
    staging.rename(out)
    log(f"fetched the word-similarity sets: SimLex-999, WordSim-353 and the Google analogies ({WORDSETS_WHEEL})")
    return out


def extract_wordsets(wheel: Path, staging: Path) -> None:
    """Check the wheel's SHA-256 and write the three files and meta.json into `staging`."""
    blob = Path(wheel).read_bytes()
    digest = hashlib.sha256(blob).hexdigest()
    if digest != WORDSETS_SHA256:
        raise AndreaError(f"{Path(wheel).name} has SHA-256 {digest}, expected {WORDSETS_SHA256}; refusing to use it.")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        with zipfile.ZipFile(Path(wheel)) as z:
            for name, file in WORDSET_FILES.items():
                (staging / file).write_bytes(z.read(f"gensim/test/test_data/{file}"))
    except (zipfile.BadZipFile, KeyError) as e:
        shutil.rmtree(staging, ignore_errors=True)
        raise AndreaError(f"{Path(wheel).name} is not the wheel expected ({e}).") from None
    sizes = {file: (staging / file).stat().st_size for file in WORDSET_FILES.values()}
    digests = {file: hashlib.sha256((staging / file).read_bytes()).hexdigest() for file in WORDSET_FILES.values()}
    wrong = [file for file in WORDSET_FILES.values() if (sizes[file], digests[file]) != WORDSET_FILES_PINNED[file]]
    if wrong:
        shutil.rmtree(staging, ignore_errors=True)
        raise AndreaError(f"{Path(wheel).name} holds a {wrong[0]} other than the pinned one; refusing to use it.")
    meta = {"package": WORDSETS_WHEEL, "sha256": digest, "licence": WORDSETS_LICENCE, "files": WORDSET_FILES,
            "sizes": sizes, "file_sha256": digests}
    (staging / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")


MAX_WORDSET_BYTES = 4 << 20  # the largest of the three files is about 600 KB


def _wordset_text(path: Path, size: int | None, digest: str | None = None) -> str:
    """One set's file as text: a regular file, at most MAX_WORDSET_BYTES, of the pinned size and
    SHA-256 where they are given (the fetched sets), UTF-8; else one sentence naming it."""
    check_regular(path, "the word-set file")
    actual = path.stat().st_size
    if actual > MAX_WORDSET_BYTES:
        raise AndreaError(f"{path} is {actual:,} bytes, more than the {MAX_WORDSET_BYTES:,} a word set takes; "
                          f"run `andrea data fetch wordsets` again.")
    if size is not None and actual != size:
        raise AndreaError(f"{path} is {actual:,} bytes, not the {size:,} it was fetched with: it is damaged; "
                          f"run `andrea data fetch wordsets` again.")
    with open(path, "rb") as f:
        raw = f.read(MAX_WORDSET_BYTES + 1)
    if digest is not None and hashlib.sha256(raw).hexdigest() != digest:
        raise AndreaError(f"{path} no longer holds the bytes it was fetched with (its SHA-256 differs): it is damaged; "
                          f"run `andrea data fetch wordsets` again.")
    return utf8_text(raw, str(path), "run `andrea data fetch wordsets` again")


def wordsets_problem(root: Path | None = None) -> str | None:
    """What is wrong with the fetched sets, in one sentence, or None when they are whole."""
    try:
        load_wordsets(root)
    except AndreaError as e:
        return str(e)
    return None


@dataclass
class WordSets:
    pairs: dict[str, list[tuple[str, str, float]]]  # set name -> (word, word, human rating)
    analogies: list[tuple[str, str, str, str]]


def parse_pairs(text: str, where: str) -> list[tuple[str, str, float]]:
    """Tab-separated `word<TAB>word<TAB>rating` lines; lines starting with # are headers."""
    pairs = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        parts = line.split("\t")
        try:
            rating = float(parts[2])
        except (IndexError, ValueError):
            raise AndreaError(f"{where} line {n} is not `word<TAB>word<TAB>rating`.") from None
        if not math.isfinite(rating) or not parts[0] or not parts[1]:
            raise AndreaError(f"{where} line {n} is not `word<TAB>word<TAB>rating`.")
        pairs.append((parts[0], parts[1], rating))
    return pairs


def parse_analogies(text: str, where: str) -> list[tuple[str, str, str, str]]:
    """Lines of four words; `: section` lines name the sections."""
    questions = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.startswith(":"):
            continue
        words = line.split()
        if len(words) != 4:
            raise AndreaError(f"{where} line {n} does not hold four words.")
        questions.append(tuple(words))
    return questions


def own_wordsets() -> Path | None:
    """The folder of sets of one's own that $ANDREA_WORDSETS names, or None."""
    import os

    named = os.environ.get(OWN_WORDSETS, "")
    return Path(named) if named else None


def load_wordsets(path: Path | None = None, own: bool = False) -> WordSets:
    """The three sets: the fetched ones in the cache (or in `path`, laid out the same way), each
    file checked against its pinned size and SHA-256; or sets of one's own, checked by format
    only: those in the folder $ANDREA_WORDSETS names, where no path is given, or in `path` with
    `own`."""
    own = (Path(path) if own else own_wordsets()) if path is None or own else None
    root = own or (Path(path) if path else wordsets_dir())
    if own is not None and not own.is_dir():
        raise AndreaError(f"${OWN_WORDSETS} names {own}, which is not a folder of word sets.")
    if own is None and not (root / "meta.json").exists() and path is None:
        raise AndreaError("the word-similarity sets are not fetched yet; run `andrea data fetch wordsets` first.")
    texts = {}
    for name, file in WORDSET_FILES.items():
        if not (root / file).exists() and not (root / file).is_symlink():
            raise AndreaError(f"{root / file} is missing; " + (f"put the three files in {root}." if own else
                                                                 "run `andrea data fetch wordsets` again."))
        size, digest = (None, None) if own else WORDSET_FILES_PINNED[file]
        texts[name] = _wordset_text(root / file, size, digest)
    pairs = {name: parse_pairs(texts[name], str(root / WORDSET_FILES[name])) for name in PAIR_SETS}
    return WordSets(pairs, parse_analogies(texts["analogies"], str(root / WORDSET_FILES["analogies"])))


def try_load_wordsets(log=None) -> WordSets | None:
    """The sets if they are fetched and whole, else None: the commands that only score with them
    (training, the lab, the lesson) go on without, with a note naming what is wrong when they are
    fetched but damaged."""
    try:
        return load_wordsets()
    except AndreaError as e:
        if log is not None and (own_wordsets() is not None or (wordsets_dir() / "meta.json").exists()):
            log(f"note: going on without the word-similarity scores: {str(e).rstrip('.')}")
        return None


# ---------------------------------------------------------------- words as token ids


@dataclass
class WordIndex:
    """Every word of the sets (and the lesson's) as the token ids of its word-initial form."""

    ids: dict[str, list[int]]
    pieces: dict[str, list[str]]
    whole_words: np.ndarray  # token ids of whole-word tokens: the analogy candidates
    vocab_size: int
    standalone: np.ndarray | None = None  # (V,) bool where the training data is known: tokens that mostly stand alone

    def stands_alone(self, word: str) -> bool:
        """A single-token word whose token stands alone in its uses (andrea.usage); False when unknown."""
        return self.standalone is not None and self.single(word) and bool(self.standalone[self.ids[word][0]])

    def single(self, word: str) -> bool:
        return len(self.ids[word]) == 1

    def rows(self) -> np.ndarray:
        """Every token id any word uses, sorted: the rows a snapshot must keep to score the sets."""
        return np.array(sorted({i for ids in self.ids.values() for i in ids}), dtype=np.int64)

    def counts(self, sets: WordSets) -> dict:
        out = {}
        for name, pairs in sets.pairs.items():
            words = {w for a, b, _ in pairs for w in (a, b)}
            out[name] = {"words": len(words), "single_token_words": sum(self.single(w) for w in words),
                         "pairs": len(pairs), "single_token_pairs": sum(self.single(a) and self.single(b)
                                                                       for a, b, _ in pairs)}
        return out


def word_index(tokenizer, vocab_size: int, sets: WordSets | None, extra=LESSON_WORDS) -> WordIndex:
    words = set(extra)
    if sets is not None:
        words |= {w for pairs in sets.pairs.values() for a, b, _ in pairs for w in (a, b)}
        words |= {w for q in sets.analogies for w in q}
    ids = {w: tokenizer.word_ids(w) for w in sorted(words)}
    pieces = {w: [tokenizer.id_to_piece(i) for i in t] for w, t in ids.items()}
    whole = np.flatnonzero(whole_word_mask(tokenizer, vocab_size)).astype(np.int64)
    return WordIndex(ids, pieces, whole, vocab_size)


# ---------------------------------------------------------------- the scores


def centred(matrix: np.ndarray) -> np.ndarray:
    """The table minus its mean row. Rows that are exactly zero hold no vector (a token the
    PPMI reference never counted): they are left out of the mean and stay zero."""
    live = np.any(matrix != 0, axis=1)
    if not live.any():
        return matrix.copy()
    out = matrix - matrix[live].mean(axis=0, keepdims=True)
    out[~live] = 0
    return out




def mean_pairwise_cosine(matrix: np.ndarray) -> float:
    """The mean cos θ over all pairs of distinct non-zero rows, exactly, in O(V·d)."""
    u = unit_rows(np.asarray(matrix, dtype=np.float64))
    u = u[np.linalg.norm(u, axis=1) > 0]
    n = len(u)
    if n < 2:
        return float("nan")
    s = u.sum(axis=0)
    return float((s @ s - n) / (n * (n - 1)))


def spearman(x, y) -> float:
    from scipy.stats import spearmanr

    if len(x) < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return float("nan")
    return float(spearmanr(x, y).statistic)


def null_spread(n: int) -> float:
    """The spread of ρ over n pairs under no relation, 1/√(n − 1) (NaN below two pairs): printed
    beside every ρ, as the module's text says."""
    return 1 / math.sqrt(n - 1) if n > 1 else float("nan")


def rho_with_null(cos, ratings) -> dict:
    """Spearman ρ of cos θ against the ratings, with n and the null spread: the one place it is
    computed for a set of pairs."""
    return {"rho": spearman(cos, ratings), "n": len(cos), "null": null_spread(len(cos))}


def _vector(matrix: np.ndarray, index: WordIndex, word: str) -> np.ndarray:
    return matrix[index.ids[word]].mean(axis=0)




def pair_scores(matrix: np.ndarray, index: WordIndex, pairs, points: bool = False) -> dict:
    """Spearman ρ of cosine against the ratings: for pairs of single tokens, for pairs with a
    mean-of-pieces word, and for all; where the index knows how tokens are used, also for pairs of
    words whose tokens stand alone ("standalone"); each with n and the null spread 1/√(n − 1), and
    with `points` the pairs themselves as [word, word, rating, cos]."""
    groups = {"single": [], "pieces": [], "all": []}
    if index.standalone is not None:
        groups["standalone"] = []
    for a, b, rating in pairs:
        c = cosine(_vector(matrix, index, a), _vector(matrix, index, b))
        names = ["single" if index.single(a) and index.single(b) else "pieces", "all"]
        if index.stands_alone(a) and index.stands_alone(b):
            names.append("standalone")
        for g in names:
            groups[g].append([a, b, float(rating), float(c)])
    out = {}
    for g, rows in groups.items():
        out[g] = rho_with_null([r[3] for r in rows], [r[2] for r in rows])
        if points:
            out[g]["points"] = rows
    return out


def analogy_accuracy(matrix: np.ndarray, index: WordIndex, questions, chunk: int = 1024) -> dict:
    """3CosAdd over the questions whose four words are single tokens (see the module docstring)."""
    qs = [q for q in questions if all(index.single(w) for w in q)]
    if not qs or len(index.whole_words) == 0:
        return {"accuracy": float("nan"), "n": len(qs), "candidates": int(len(index.whole_words))}
    unit = unit_rows(np.asarray(matrix, dtype=np.float32))
    ids = np.array([[index.ids[w][0] for w in q] for q in qs], dtype=np.int64)  # (n, 4): a b c d
    cand = index.whole_words
    position = np.full(index.vocab_size, -1, dtype=np.int64)
    position[cand] = np.arange(len(cand))
    correct = 0
    for s in range(0, len(ids), chunk):
        q = ids[s : s + chunk]
        target = unit[q[:, 1]] - unit[q[:, 0]] + unit[q[:, 2]]  # (n, d)
        sims = target @ unit[cand].T  # (n, candidates)
        for k in range(3):  # the query words are never the answer
            p = position[q[:, k]]
            hit = p >= 0
            sims[np.nonzero(hit)[0], p[hit]] = -np.inf
        correct += int((cand[sims.argmax(axis=1)] == q[:, 3]).sum())
    return {"accuracy": correct / len(qs), "n": len(qs), "candidates": int(len(cand))}


def lesson(matrix: np.ndarray, index: WordIndex) -> dict:
    """The lesson's exercise: cos and dot of cat·dog and cat·pet against cat·Tuesday and cat·xylophone."""
    out = {}
    for a, b in LESSON_PAIRS:
        u, v = _vector(matrix, index, a), _vector(matrix, index, b)
        out[f"{a}·{b}"] = {"cos": cosine(u, v), "dot": float(u @ v), "single": index.single(a) and index.single(b)}
    return out


def lesson_margin(cos: dict, single: dict) -> float:
    """How far each related pair of the lesson sits above each unrelated one: the least cos of
    LESSON_RELATED less the greatest of LESSON_UNRELATED, where `cos` maps "cat·dog" to cos θ and
    `single` says which pairs are one token each. An unrelated pair with a word of several tokens (a
    mean of its pieces' rows, not a word's row) is reported apart and left out; with none left, the
    related pairs are measured from 0."""
    unrelated = [cos[f"{a}·{b}"] for a, b in LESSON_UNRELATED if single[f"{a}·{b}"]]
    return min(cos[f"{a}·{b}"] for a, b in LESSON_RELATED) - max(unrelated, default=0.0)


def score_matrix(matrix: np.ndarray, index: WordIndex, sets: WordSets | None, analogies: bool = True) -> dict:
    """Every score of one table as it is (raw) and with its mean row subtracted (centred)."""
    matrix = np.asarray(matrix, dtype=np.float64)
    out = {}
    for name, m in (("raw", matrix), ("centred", centred(matrix))):
        part = {"mean_cos": mean_pairwise_cosine(m), "lesson": lesson(m, index)}
        if sets is not None:
            part.update({s: pair_scores(m, index, sets.pairs[s]) for s in PAIR_SETS})
            if analogies:
                part["analogies"] = analogy_accuracy(m, index, sets.analogies)
        out[name] = part
    return out


@dataclass
class Report:
    """The similarity scores of a model's two tables (and of any reference table)."""

    tables: dict[str, dict]
    d: int
    coverage: dict = field(default_factory=dict)
    forms: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"d": self.d, "init_band": 1 / math.sqrt(self.d), "coverage": self.coverage, "forms": self.forms,
                "tables": self.tables}


def similarity(tables: dict[str, np.ndarray], index: WordIndex, sets: WordSets | None, analogies: bool = True) -> Report:
    """The scores of each named (V, d) table, e.g. {"input": wte, "output": lm_head, "ppmi": ...}."""
    d = next(iter(tables.values())).shape[1]
    forms = {w: index.pieces[w] for w in LESSON_WORDS}
    coverage = index.counts(sets) if sets is not None else {}
    return Report({name: score_matrix(m, index, sets, analogies) for name, m in tables.items()}, d, coverage, forms)


def model_tables(model) -> dict[str, np.ndarray]:
    """The input table (wte) and the untied head (lm_head) as float32 numpy arrays."""

    return {"input": table(model, "input"), "output": table(model, "output")}


def brief(report: Report) -> dict:
    """The few numbers a metrics line keeps per evaluation: ρ (all pairs and single tokens) on
    both sets, the lesson's two cosines and the mean cosine, per table, raw and centred."""
    out = {}
    for table_name, parts in report.tables.items():
        for how, s in parts.items():
            row = {"mean_cos": round(s["mean_cos"], 5),
                   "cat_dog": round(s["lesson"]["cat·dog"]["cos"], 5),
                   "cat_tuesday": round(s["lesson"]["cat·Tuesday"]["cos"], 5)}
            for name in PAIR_SETS:
                if name in s:
                    row[name] = _round(s[name]["all"]["rho"])
                    row[name + "_single"] = _round(s[name]["single"]["rho"])
            if "analogies" in s:
                row["analogies"] = _round(s["analogies"]["accuracy"])
            out[f"{table_name}_{how}"] = row
    return out


def _round(x: float):
    return None if x is None or not math.isfinite(x) else round(x, 5)


# ---------------------------------------------------------------- the count-based reference


def cooccurrence(chunks, vocab_size: int, window: int = 2):
    """Symmetric co-occurrence counts (V, V) of tokens at most `window` apart, as a sparse matrix.
    `chunks` yields arrays of token ids (each read whole; a pair never spans two chunks); BOS
    ends a document, so no pair includes it."""
    from scipy import sparse

    total = sparse.csr_matrix((vocab_size, vocab_size), dtype=np.float64)
    for ids in chunks:
        ids = np.asarray(ids, dtype=np.int64)
        doc = np.cumsum(ids == BOS)  # pairs stay inside one document
        keys = []
        for k in range(1, window + 1):
            a, b = ids[:-k], ids[k:]
            ok = (doc[:-k] == doc[k:]) & (a != BOS) & (b != BOS)
            keys.append(a[ok] * vocab_size + b[ok])
        keys = np.concatenate(keys) if keys else np.zeros(0, dtype=np.int64)
        uniq, n = np.unique(keys, return_counts=True)
        part = sparse.csr_matrix((n.astype(np.float64), (uniq // vocab_size, uniq % vocab_size)),
                                 shape=(vocab_size, vocab_size))
        total = total + part + part.T
    return total


def ppmi(counts, cds: float = 0.75):
    """Positive PMI of a sparse count matrix, context counts smoothed by the power `cds`."""
    from scipy import sparse

    counts = sparse.csr_matrix(counts, dtype=np.float64)
    total = counts.sum()
    if total == 0:
        raise AndreaError("the text holds no co-occurring tokens to count.")
    row = np.asarray(counts.sum(axis=1)).ravel()
    col = np.asarray(counts.sum(axis=0)).ravel() ** cds
    coo = counts.tocoo()
    # log P(w, c) / (P(w) P_cds(c)), with P_cds(c) = count(c)^cds / Σ count^cds
    pmi = np.log(coo.data) - np.log(row[coo.row]) - np.log(col[coo.col]) + np.log(col.sum())
    keep = pmi > 0
    return sparse.csr_matrix((pmi[keep], (coo.row[keep], coo.col[keep])), shape=counts.shape)


def ppmi_vectors(chunks, vocab_size: int, dim: int, window: int = 2, seed: int = 0) -> np.ndarray:
    """(V, dim) vectors U·√Σ of the truncated SVD of the PPMI matrix of the tokens in `chunks`."""
    from sklearn.utils.extmath import randomized_svd

    m = ppmi(cooccurrence(chunks, vocab_size, window))
    k = min(dim, vocab_size - 1)
    u, s, _ = randomized_svd(m, n_components=k, n_iter=5, random_state=seed)
    vectors = np.zeros((vocab_size, dim), dtype=np.float32)
    vectors[:, :k] = u * np.sqrt(s)
    return vectors


def train_token_chunks(data, chunk_tokens: int = 4_000_000):
    """The training tokens of every source of a prepared data folder (`andrea.shards.TokenData`),
    in chunks, read from the memory-mapped shards."""
    for source in data.sources.values():
        for shard in source.train.shards:
            for s in range(0, len(shard), chunk_tokens):
                yield np.asarray(shard[s : s + chunk_tokens])
