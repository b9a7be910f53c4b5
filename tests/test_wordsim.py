"""Word-similarity scores pinned to facts: the null spread of a random table, planted structure,
the exact mean cosine against brute force, 3CosAdd on planted analogies, PPMI by hand."""

from __future__ import annotations

import hashlib
import json
import math
import zipfile
from pathlib import Path

import numpy as np
import pytest
from helpers import DEEP, cli, one_sentence
from scipy import sparse

from andrea.config import BOS, N_SPECIAL
from andrea.errors import AndreaError
from andrea.inside import wordsim
from andrea.inside.wordsim import (
    WordIndex,
    WordSets,
    analogy_accuracy,
    cooccurrence,
    mean_pairwise_cosine,
    pair_scores,
    parse_analogies,
    parse_pairs,
    ppmi,
    ppmi_vectors,
    similarity,
)


def synthetic_index(n_words: int, pieces_every: int = 0) -> WordIndex:
    """Words w0, w1, … as single tokens (ids from N_SPECIAL), every `pieces_every`-th as two tokens."""
    ids, pieces = {}, {}
    V = N_SPECIAL + 2 * n_words
    for k in range(n_words):
        w = f"w{k}"
        ids[w] = [N_SPECIAL + k, N_SPECIAL + n_words + k] if pieces_every and k % pieces_every == 0 else [N_SPECIAL + k]
        pieces[w] = [f" {w}"] if len(ids[w]) == 1 else [f" {w[:1]}", w[1:]]
    for w in wordsim.LESSON_WORDS:
        ids[w], pieces[w] = [N_SPECIAL], [" x"]
    return WordIndex(ids, pieces, np.arange(N_SPECIAL, N_SPECIAL + n_words), V)


def random_pairs(rng, n_words: int, n_pairs: int):
    return [(f"w{a}", f"w{b}", float(rng.uniform(0, 10)))
            for a, b in (rng.choice(n_words, 2, replace=False) for _ in range(n_pairs))]


def test_pair_and_analogy_files_are_read_as_published(tmp_path):
    text = "# The SimLex-999 Test data\n# Word 1\tWord 2\tHuman (mean)\nold\tnew\t1.58\nsmart\tintelligent\t9.2\n"
    assert parse_pairs(text, "x") == [("old", "new", 1.58), ("smart", "intelligent", 9.2)]
    assert parse_analogies(": capital\nAthens Greece Baghdad Iraq\n\n", "y") == [("Athens", "Greece", "Baghdad", "Iraq")]
    with pytest.raises(AndreaError, match="line 2"):
        parse_pairs("a\tb\t1\na\tb\n", "f")
    with pytest.raises(AndreaError, match="four words"):
        parse_analogies("a b c\n", "f")


def test_a_random_table_scores_within_its_null_spread():
    """ρ of a table that knows nothing scatters as N(0, 1/(n − 1)): inside 3 null spreads, every
    time, and near 0 on average over many tables; a table with planted similarity scores far above."""
    rng = np.random.default_rng(0)
    index = synthetic_index(300, pieces_every=5)
    pairs = random_pairs(rng, 300, 999)
    rhos = []
    for seed in range(20):
        m = np.random.default_rng(seed + 1).normal(size=(index.vocab_size, 64))
        s = pair_scores(m, index, pairs)
        assert s["all"]["n"] == 999 and s["single"]["n"] + s["pieces"]["n"] == 999
        assert s["all"]["null"] == pytest.approx(1 / math.sqrt(998))
        for g in ("single", "pieces", "all"):
            assert abs(s[g]["rho"]) < 3 * s[g]["null"], (seed, g, s[g])
        rhos.append(s["all"]["rho"])
    assert abs(np.mean(rhos)) < 3 * np.std(rhos) / math.sqrt(len(rhos))
    assert np.std(rhos) == pytest.approx(1 / math.sqrt(998), rel=0.5)
    # planted: each word in one pair, the second word's row a blend of the first's and noise in
    # proportion to the rating, so cos θ rises with the rating
    m = np.random.default_rng(99).normal(size=(index.vocab_size, 64))
    planted = []
    for k in range(0, 300, 2):
        r = float(rng.uniform(0, 10))
        a, b = index.ids[f"w{k}"][-1], index.ids[f"w{k + 1}"][-1]
        m[b] = (r / 10) * m[a] + (1 - r / 10) * m[b]
        planted.append((f"w{k}", f"w{k + 1}", r))
    s = pair_scores(m, index, planted)
    assert s["all"]["n"] == 150 and s["all"]["rho"] > 0.8 and s["all"]["rho"] > 8 * s["all"]["null"]


def test_mean_pairwise_cosine_is_exact():
    rng = np.random.default_rng(1)
    m = rng.normal(size=(50, 8)) + 0.5
    m[3] = 0  # a zero row holds no direction and is left out
    u = np.array([r / np.linalg.norm(r) for r in m if np.linalg.norm(r) > 0])
    brute = np.mean([u[i] @ u[j] for i in range(len(u)) for j in range(len(u)) if i != j])
    assert mean_pairwise_cosine(m) == pytest.approx(brute, abs=1e-12)
    # random rows at init: mean cos ≈ 0, each cos spread ≈ 1/√d
    r = rng.normal(size=(2000, 256))
    assert abs(mean_pairwise_cosine(r)) < 0.005
    c = (r[:500] / np.linalg.norm(r[:500], axis=1, keepdims=True)) @ (r[500:1000] / np.linalg.norm(r[500:1000], axis=1, keepdims=True)).T
    assert c.std() == pytest.approx(1 / 16, rel=0.05)


def test_3cosadd_answers_planted_analogies_and_excludes_the_query_words():
    """Words are sums of a 'country' and a 'kind' direction: a:b :: c:d holds exactly, so 3CosAdd
    gets every question right; with the query words allowed, b would often win instead."""
    rng = np.random.default_rng(2)
    n, d = 20, 64
    base = rng.normal(size=(n, d))
    kind = rng.normal(size=(2, d)) * 3
    index = synthetic_index(2 * n)
    m = rng.normal(size=(index.vocab_size, d)) * 0.01
    for k in range(n):
        m[N_SPECIAL + k] = base[k] + kind[0]  # w_k: capital of k
        m[N_SPECIAL + n + k] = base[k] + kind[1]  # w_{n+k}: country k
    qs = [(f"w{a}", f"w{n + a}", f"w{c}", f"w{n + c}") for a in range(n) for c in range(n) if a != c]
    res = analogy_accuracy(m, index, qs)
    assert res["n"] == len(qs) and res["accuracy"] == 1.0
    noise = np.random.default_rng(3).normal(size=m.shape)
    assert analogy_accuracy(noise, index, qs)["accuracy"] < 0.05


def test_cooccurrence_counts_pairs_within_the_window_and_never_across_bos():
    ids = np.array([BOS, 300, 301, 302, BOS, 302, 300], dtype=np.uint16)
    c = cooccurrence([ids], 310, window=2).toarray()
    want = np.zeros((310, 310))
    for a, b in ((300, 301), (300, 302), (301, 302), (302, 300)):  # doc 1: 300 301 302; doc 2: 302 300
        want[a, b] += 1
        want[b, a] += 1
    assert np.array_equal(c, want)


def test_ppmi_is_positive_pmi_with_smoothed_contexts():
    counts = np.array([[0, 4, 1], [4, 0, 2], [1, 2, 6]], dtype=float)
    got = ppmi(sparse.csr_matrix(counts), cds=0.75).toarray()
    total, row, col = counts.sum(), counts.sum(1), counts.sum(0) ** 0.75
    for i in range(3):
        for j in range(3):
            if counts[i, j] == 0:
                assert got[i, j] == 0
                continue
            pmi = math.log((counts[i, j] / total) / ((row[i] / total) * (col[j] / col.sum())))
            assert got[i, j] == pytest.approx(max(pmi, 0.0))


def test_ppmi_vectors_put_words_of_one_context_together():
    """Two groups of tokens that only ever occur among themselves: the PPMI vectors of one group
    are closer to each other than to the other group's."""
    rng = np.random.default_rng(4)
    g1, g2 = np.arange(300, 310), np.arange(310, 320)
    docs = [np.concatenate([[BOS], rng.choice(g1 if k % 2 else g2, 200)]) for k in range(40)]
    v = ppmi_vectors([np.concatenate(docs)], 330, 8)
    u = v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-30)
    within = np.mean([u[a] @ u[b] for a in g1 for b in g1 if a != b])
    across = np.mean([u[a] @ u[b] for a in g1 for b in g2])
    assert within > across + 0.5
    assert not v[320:].any()  # tokens never seen have no vector


def test_the_report_scores_each_table_raw_and_centred():
    index = synthetic_index(50)
    rng = np.random.default_rng(5)
    sets = WordSets({"simlex999": random_pairs(rng, 50, 100), "wordsim353": random_pairs(rng, 50, 60)},
                    [("w1", "w2", "w3", "w4")])
    tables = {"input": rng.normal(size=(index.vocab_size, 16)), "output": rng.normal(size=(index.vocab_size, 16)) + 3}
    r = similarity(tables, index, sets).to_dict()
    assert r["init_band"] == pytest.approx(0.25)
    assert set(r["tables"]) == {"input", "output"} and set(r["tables"]["input"]) == {"raw", "centred"}
    out = r["tables"]["output"]
    assert out["raw"]["mean_cos"] > 0.8 and abs(out["centred"]["mean_cos"]) < 0.05  # a shared direction, removed
    assert out["raw"]["simlex999"]["all"]["n"] == 100 and out["raw"]["analogies"]["n"] == 1
    assert set(out["raw"]["lesson"]) == {"cat·dog", "cat·pet", "cat·Tuesday", "cat·xylophone"}
    brief = wordsim.brief(similarity(tables, index, sets))
    assert set(brief) == {"input_raw", "input_centred", "output_raw", "output_centred"}


def fake_wheel(path, files: dict[str, str]):
    with zipfile.ZipFile(path, "w") as z:
        for name, text in files.items():
            z.writestr(f"gensim/test/test_data/{name}", text)
    return hashlib.sha256(path.read_bytes()).hexdigest()


def pin(monkeypatch, files: dict[str, str]) -> None:
    """Pin these texts as the fetched sets' files (what WORDSET_FILES_PINNED holds for the real wheel)."""
    monkeypatch.setattr(wordsim, "WORDSET_FILES_PINNED", {name: (len(text.encode()), hashlib.sha256(text.encode()).hexdigest())
                                                          for name, text in files.items()})


def test_the_wheel_is_checked_and_nothing_half_written_is_left(tmp_path, monkeypatch):
    files = {"simlex999.txt": "a\tb\t1\nc\td\t2\n", "wordsim353.tsv": "a\tc\t3\n", "questions-words.txt": ": s\na b c d\n"}
    digest = fake_wheel(tmp_path / "g.whl", files)
    with pytest.raises(AndreaError, match="SHA-256"):
        wordsim.extract_wordsets(tmp_path / "g.whl", tmp_path / "staging")
    assert not (tmp_path / "staging").exists()
    monkeypatch.setattr(wordsim, "WORDSETS_SHA256", digest)
    with pytest.raises(AndreaError, match="other than the pinned one"):  # its files are not the pinned ones
        wordsim.extract_wordsets(tmp_path / "g.whl", tmp_path / "sets")
    assert not (tmp_path / "sets").exists()
    pin(monkeypatch, files)
    wordsim.extract_wordsets(tmp_path / "g.whl", tmp_path / "sets")
    sets = wordsim.load_wordsets(tmp_path / "sets")
    assert sets.pairs["simlex999"] == [("a", "b", 1.0), ("c", "d", 2.0)] and sets.analogies == [("a", "b", "c", "d")]
    # a wheel without the files is refused whole
    digest = fake_wheel(tmp_path / "h.whl", {"simlex999.txt": "a\tb\t1\n"})
    monkeypatch.setattr(wordsim, "WORDSETS_SHA256", digest)
    with pytest.raises(AndreaError, match="not the wheel expected"):
        wordsim.extract_wordsets(tmp_path / "h.whl", tmp_path / "staging2")
    assert not (tmp_path / "staging2").exists()


def test_unfetched_sets_say_how_to_fetch_them(tmp_path, monkeypatch):
    monkeypatch.setenv("ANDREA_CACHE", str(tmp_path))
    with pytest.raises(AndreaError, match="andrea data fetch wordsets"):
        wordsim.load_wordsets()
    assert wordsim.try_load_wordsets() is None


# ---------------------------------------------------------------- hostile input


@pytest.mark.hostile
@pytest.mark.parametrize("bad", ["deep", "list"])
def test_a_runs_train_json_that_is_not_a_record_ends_embed_similarity_in_one_sentence(audited_run, tmp_path, capsys, bad):
    run = tmp_path / "run"
    run.mkdir()
    (run / "latest.safetensors").write_bytes((audited_run / "latest.safetensors").read_bytes())
    (run / "train.json").write_text('{"data":\n' + DEEP + "}" if bad == "deep" else '["data"]')
    line = one_sentence(*cli(capsys, "embed", "similarity", "--checkpoint", run, "--ppmi")[::2])
    assert "train.json" in line, line


def test_pairs_of_words_that_stand_alone_are_scored_apart_when_usage_is_known():
    """With the training data's usage (andrea.usage), pair_scores adds the pairs whose two words are
    single tokens standing alone; without it, that group is absent."""
    from andrea.inside.wordsim import pair_scores, word_index
    from andrea.tokenizer.harris import HarrisTokenizer

    words = ["cat", "dog", "pet", "red", "blue"]
    tok = HarrisTokenizer([" " + w for w in words])
    pairs = [(a, b, float(i)) for i, (a, b) in enumerate((a, b) for a in words for b in words if a < b)]
    sets = WordSets({"simlex999": pairs, "wordsim353": pairs}, [])
    index = word_index(tok, tok.vocab_size, sets)
    rng = np.random.default_rng(0)
    m = rng.normal(size=(tok.vocab_size, 8))
    assert "standalone" not in pair_scores(m, index, pairs)
    index.standalone = np.ones(tok.vocab_size, dtype=bool)
    index.standalone[tok.encode(" cat", bos=False)[0]] = False  # ␣cat mostly begins longer words
    r = pair_scores(m, index, pairs)
    assert r["single"]["n"] == 10 and r["standalone"]["n"] == 6  # the pairs among dog, pet, red, blue


@pytest.mark.hostile
@pytest.mark.parametrize("damage", ["fifo", "dev-zero", "not-utf8", "resized", "huge", "same-size", "same-size, record emptied", "same-size, record forged"])
def test_a_damaged_word_set_cache_is_named_listed_and_fetched_again(tmp_path, monkeypatch, capsys, damage):
    """Each file of the fetched sets is checked as a fetched source is: a regular file, of the size
    and SHA-256 recorded at fetch, bounded, UTF-8. A damaged one is one sentence naming it; `andrea data list`
    shows it damaged; the commands that only score go on without the sets, saying why; and
    `andrea data fetch wordsets` fetches it again instead of trusting the record."""
    import os

    from andrea.cli import main
    from andrea.inside.wordsim import MAX_WORDSET_BYTES, extract_wordsets, fetch_wordsets, try_load_wordsets

    cache = tmp_path / "cache"
    monkeypatch.setenv("ANDREA_CACHE", str(cache))
    monkeypatch.delenv("ANDREA_WORDSETS", raising=False)
    wheel = tmp_path / "w.whl"
    files = {"simlex999.txt": "# h\ncat\tdog\t8\ncat\tmat\t2\nking\tqueen\t7\n",
             "wordsim353.tsv": "# h\ncat\tdog\t8\ncat\tmat\t2\nking\tqueen\t9\n", "questions-words.txt": ": s\nking queen cat dog\n"}
    monkeypatch.setattr("andrea.inside.wordsim.WORDSETS_SHA256", fake_wheel(wheel, files))
    pin(monkeypatch, files)
    root = cache / "wordsets"
    extract_wordsets(wheel, root)
    target = root / "simlex999.txt"
    if damage == "fifo":
        target.unlink()
        os.mkfifo(target)
    elif damage == "dev-zero":
        target.unlink()
        target.symlink_to("/dev/zero")
    elif damage == "not-utf8":
        target.write_bytes(b"# h\ncaf\xe9\tdog\t8\nking\tqueen\t7\n")
    elif damage == "resized":
        target.write_text("# h\ncat\tdog\t8\n")
    elif damage.startswith("same-size"):  # other ratings in as many bytes: only the pinned SHA-256 tells
        before = target.read_bytes()
        target.write_bytes(before.replace(b"dog\t8", b"dog\t1"))
        assert target.stat().st_size == len(before) and target.read_bytes() != before
        meta = json.loads((root / "meta.json").read_text())  # the record is for people: it turns no check off
        if damage.endswith("emptied"):
            meta = {}
        elif damage.endswith("forged"):
            meta["file_sha256"]["simlex999.txt"] = hashlib.sha256(target.read_bytes()).hexdigest()
        (root / "meta.json").write_text(json.dumps(meta))
    else:
        with open(target, "wb") as f:
            f.truncate(MAX_WORDSET_BYTES + 1)
    notes = []
    assert try_load_wordsets(notes.append) is None
    assert len(notes) == 1 and "simlex999.txt" in notes[0] and notes[0].startswith("note: going on without"), notes
    assert main(["data", "list"]) == 0
    assert "wordsets" in (row := next(line for line in capsys.readouterr().out.splitlines() if line.startswith("wordsets")))
    assert "damaged" in row and "simlex999.txt" in row
    import shutil
    import subprocess

    def pip_download(cmd, **kwargs):  # what `pip download -d DIR` leaves: the pinned wheel in DIR
        shutil.copy(wheel, Path(cmd[cmd.index("-d") + 1]) / "gensim.whl")
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(subprocess, "run", pip_download)
    said = []
    fetch_wordsets(log=said.append)
    assert said[0].startswith("fetching the word-similarity sets again") and "simlex999.txt" in said[0]
    assert try_load_wordsets() is not None


@pytest.mark.hostile
def test_ppmi_from_shards_of_another_tokenizer_is_refused(data_dir, tmp_path, capsys, monkeypatch):
    """embed similarity --ppmi --data DIR with shards a different tokenizer made: one sentence (a
    ValueError traceback when their V was larger, a PPMI of another tokenization when smaller)."""
    from andrea.cli import main
    from andrea.prepare import prepare
    from andrea.tokenizer.harris import HarrisTokenizer

    root = tmp_path / "cache" / "wordsets"
    root.mkdir(parents=True)
    (root / "meta.json").write_text("{}")
    (root / "simlex999.txt").write_text("# h\ncat\tdog\t8\ncat\tmat\t2\nking\tqueen\t7\n")
    (root / "wordsim353.tsv").write_text("# h\ncat\tdog\t8\ncat\tmat\t2\nking\tqueen\t9\n")
    (root / "questions-words.txt").write_text(": s\nking queen cat dog\n")
    monkeypatch.setenv("ANDREA_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("ANDREA_WORDSETS", str(root))
    (tmp_path / "a.txt").write_text(" the cat sat.\n\n" * 3000)
    prepare(HarrisTokenizer([" the", " cat"]), [str(tmp_path / "a.txt")], tmp_path / "other", log=lambda *a: None,
            progress=False)
    tok = str(data_dir / "tokenizer")
    code = main(["embed", "similarity", "--preset", "andrea-tiny", "--tokenizer", tok, "--ppmi", "--data", str(tmp_path / "other")])
    err = capsys.readouterr().err
    assert code == 2 and "prepared with another tokenizer" in err and "Traceback" not in err
