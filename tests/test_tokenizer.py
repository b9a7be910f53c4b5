"""The Harris tokenizer: the vocabulary layout, the encoding rule, exact round trips, the compiled
path against the Python one, saving and loading, the CLI and its errors. Training is in
test_tokenizer_train.py."""

import hashlib
import io
import json
import os
import pickle
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from helpers import (
    N_SMALL,
    SMALL_WORDS,
    cli,
    dash_docs,
    morphology_text,
    need_time,
    peak_rss,
    process_sentence,
    python_only,
    short_documents,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import andrea.tokenizer.harris as harris
from andrea.cli import main
from andrea.errors import AndreaError
from andrea.tokenizer.harris import BOS, WORD_RE, HarrisTokenizer
from andrea.tokenizer.train import train_tokenizer


@pytest.fixture(scope="module")
def text():
    return morphology_text()


@pytest.fixture(scope="module")
def tok(text):
    return train_tokenizer([text], N_SMALL)


@pytest.fixture(scope="module")
def tok_dir(tok, tmp_path_factory):
    return tok.save(tmp_path_factory.mktemp("tok"))


def reference_encode(tok, text, bos=True):
    """The encoding rule written out the slow, obvious way: longest segment at each position of
    each word, else the UTF-8 bytes of one character; where there are word ends, a letter word
    takes one (" cat</w>") where the rest of it is its text, and no plain segment ends it."""
    ids = [BOS] if bos else []
    ends = {s[:-4]: 257 + k for k, s in enumerate(tok.segments) if s.endswith("</w>")}
    for word in WORD_RE.findall(text):
        i = 0
        letter_word = bool(ends) and re.fullmatch(r" ?[^\W\d_]+", word) is not None
        while i < len(word):
            if letter_word and word[i:] in ends:
                ids.append(ends[word[i:]])
                break
            matches = [s for s in tok.segments if word.startswith(s, i) and not s.endswith("</w>")
                       and not (letter_word and i + len(s) == len(word))]
            if matches:
                s = max(matches, key=len)
                ids.append(257 + tok.segments.index(s))
                i += len(s)
            else:
                ids.extend(word[i].encode("utf-8", "surrogatepass"))
                i += 1
    return ids


# ---------------------------------------------------------------- layout and labels


def test_vocabulary_layout(tok):
    assert tok.BOS == HarrisTokenizer.BOS == 256
    assert tok.n_segments == len(tok.segments) == N_SMALL
    assert tok.vocab_size == N_SMALL + 257
    for b, piece in ((0, "<0x00>"), (10, "<0x0A>"), (32, " "), (65, "A"), (126, "~"), (127, "<0x7F>"), (0xC3, "<0xC3>"), (255, "<0xFF>")):
        assert tok.token_bytes(b) == bytes([b])
        assert tok.id_to_piece(b) == piece
    assert tok.token_bytes(256) == b"" and tok.id_to_piece(256) == "<BOS>"
    for k in (0, 1, N_SMALL - 1):
        assert tok.token_bytes(257 + k) == tok.segments[k].removesuffix("</w>").encode()
        text = tok.segments[k].removesuffix("</w>")
        assert tok.id_to_piece(257 + k) == text and tok.segment_label(257 + k) == tok.segments[k]
        # a segment encodes to itself, as a word: all but a plain piece of letters, which never ends a word
        if 257 + k in tok.word_ends or not re.fullmatch(r" ?[^\W\d_]+", text):
            assert tok.encode(text, bos=False) == [257 + k]
        else:
            assert tok.encode(text, bos=False) != [257 + k]


def test_segments_are_distinct_multibyte_and_most_used_first(tok, text):
    assert len(set(tok.segments)) == len(tok.segments)
    assert all(len(s.encode()) >= 2 for s in tok.segments)
    use = Counter(i for i in tok.encode(text, bos=False) if i > 256)
    counts = [use[257 + k] for k in range(tok.n_segments)]
    assert counts == sorted(counts, reverse=True)


def test_labels_show_printable_characters_and_escape_the_rest():
    label = harris.label_bytes
    assert label(b" walk") == " walk" and label("né".encode()) == "né" and label("日本".encode()) == "日本"
    assert label(b"\n    ") == "<0x0A>    " and label(b"a\tb\x00") == "a<0x09>b<0x00>"
    assert label("é".encode()[:1]) == "<0xC3>" and label(b"\xff\xfe") == "<0xFF><0xFE>"
    assert label("\ud800".encode("utf-8", "surrogatepass")) == "<0xED><0xA0><0x80>"
    assert label("\u200b".encode()) == "<0xE2><0x80><0x8B>"  # a zero-width space is not printable
    tok = HarrisTokenizer(["\n\n", " the"])
    assert [tok.id_to_piece(i) for i in tok.encode("\n\n the!", bos=False)] == ["<0x0A><0x0A>", " the", "!"]


def test_fingerprint_is_sha256_of_the_segment_list():
    t = HarrisTokenizer(["ab", " the", "é"])
    assert t.fingerprint() == hashlib.sha256(b'["ab"," the","\\u00e9"]').hexdigest()
    assert HarrisTokenizer(["ab", "cd"]).fingerprint() != HarrisTokenizer(["cd", "ab"]).fingerprint()


# ---------------------------------------------------------------- the encoding rule and round trips

# text() and characters() never produce lone surrogates, so code points are also drawn as integers
SURROGATES = st.integers(0xD800, 0xDFFF).map(chr)
ANY_CHAR = st.one_of(st.characters(), SURROGATES, st.integers(0, 0x10FFFF).map(chr))
HARD_CHARS = st.one_of(
    SURROGATES,
    st.characters(min_codepoint=0x1F300, max_codepoint=0x1FAFF),  # emoji
    st.characters(min_codepoint=0x300, max_codepoint=0x36F),  # combining marks
    st.characters(min_codepoint=0x4E00, max_codepoint=0x9FFF),  # CJK
    st.characters(min_codepoint=0, max_codepoint=0x1F),  # control characters
    st.characters(min_codepoint=0x7F, max_codepoint=0x9F),
    st.sampled_from(["\u200d", "\ufe0f", "\ufeff", "\u2028", "\xa0", "_", "'", " ", "\n"]),
    st.characters(min_codepoint=ord("a"), max_codepoint=ord("z")),
)
FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def english_like(tok):
    return st.lists(st.sampled_from(tok.segments + SMALL_WORDS + [" ", "\n", ", ", "'s", "Un", "X"]),
                    max_size=60).map("".join)


def check_round_trip(tok, s):
    ids = tok.encode(s, bos=False)
    assert tok.decode(ids) == s
    assert all(0 <= i < tok.vocab_size and i != BOS for i in ids)
    with_bos = tok.encode(s)
    assert with_bos == [BOS] + ids and tok.decode(with_bos) == s
    assert tok.decode_bytes(ids) == s.encode("utf-8", "surrogatepass")


@FAST
@given(s=st.lists(ANY_CHAR, max_size=200).map("".join))
def test_round_trip_any_string(tok, s):
    check_round_trip(tok, s)


@FAST
@given(s=st.lists(HARD_CHARS, max_size=200).map("".join))
def test_round_trip_emoji_combining_cjk_control_surrogates(tok, s):
    check_round_trip(tok, s)


@FAST
@given(data=st.data())
def test_round_trip_and_rule_on_english_like_text(tok, data):
    s = data.draw(english_like(tok))
    check_round_trip(tok, s)
    assert tok.encode(s) == reference_encode(tok, s)


@settings(max_examples=20, deadline=None)
@given(word=st.text(st.sampled_from("abcdefghijklmnopqrstuvwxyzé"), min_size=1000, max_size=4000))
def test_round_trip_very_long_words(tok, word):
    check_round_trip(tok, word)
    check_round_trip(tok, " " + word + " " + word.upper())


def test_round_trip_fixed_hard_cases(tok):
    for s in ["", " ", "\n\n\n", "a" * 20_000, "e\u0301" * 50, "👩\u200d👩\u200d👧", "🇺🇳", "日本語のテキスト",
              "\x00\x01\x7f", "\ud83d\ude00", "\udc80abc", "it's 'tis", "__init__", " " * 9 + "x", "\r\n"]:
        check_round_trip(tok, s)


@FAST
@given(s=st.lists(ANY_CHAR, max_size=200).map("".join))
def test_words_cover_the_text_exactly(s):
    assert "".join(WORD_RE.findall(s)) == s


def test_encode_matches_the_rule_on_the_training_text(tok, text):
    sample = text[:5000]
    assert tok.encode(sample) == reference_encode(tok, sample)
    assert tok.encode(sample) == HarrisTokenizer(tok.segments).encode(sample)  # no cache, same ids


def test_longest_segment_wins_and_bytes_fill_gaps():
    t = HarrisTokenizer(["ab", "abc", " x", "é"])
    a, abc, sx, e = 257, 258, 259, 260
    assert t.encode("abcab", bos=False) == [abc, a]
    assert t.encode(" xabc", bos=False) == [sx, abc]
    assert t.encode("xab", bos=False) == [ord("x"), a]
    assert t.encode("é€", bos=False) == [e, 0xE2, 0x82, 0xAC]
    assert t.encode("a, b", bos=False) == list(b"a, b")
    assert t.encode("ab") == [BOS, a]


def test_segments_never_span_two_words():
    t = HarrisTokenizer(["of the", "ab"])
    assert t.encode(" of the", bos=False) == list(b" of the")  # " of" and " the" are separate words


def test_decode_of_byte_sequences_encode_never_makes(tok):
    assert tok.decode([0xFF]) == "\ufffd"
    assert tok.decode([0xE2, 0x82]) == "\ufffd"  # a character cut short
    assert tok.decode([0xED, 0xA0, 0x80]) == "\ud800"  # a lone surrogate, as encode writes it
    assert tok.decode([0x61, 0xFF, 0x62]) == "a\ufffdb"


def test_decode_takes_arrays(tok, text):

    ids = tok.encode(text[:500])
    assert tok.decode(np.array(ids)) == text[:500]
    assert tok.decode([np.int64(i) for i in ids]) == text[:500]
    assert tok.token_bytes(np.int32(65)) == b"A"


def test_wrong_argument_types(tok, tmp_path):
    with pytest.raises(AndreaError, match="takes a str"):
        tok.encode(b"bytes")
    with pytest.raises(AndreaError, match="list of strings"):
        tok.encode_batch("one string")
    (tmp_path / "file").write_text("x")
    with pytest.raises(AndreaError, match="is a file"):
        tok.save(tmp_path / "file")


def test_encode_batch_equals_encode(tok, text, monkeypatch):
    docs = [text[i : i + 3000] for i in range(0, 60_000, 3000)] + ["", "😀"]
    want = [tok.encode(d) for d in docs]
    assert tok.encode_batch(docs) == want
    assert tok.encode_batch(docs, bos=False) == [w[1:] for w in want]
    python = python_only(tok.segments)  # the forked workers serve the tokenizer written in Python
    monkeypatch.setattr(harris, "PARALLEL_CHARS", 1)  # take the multi-process path on a small batch
    assert python.encode_batch(docs, workers=2) == want


# ---------------------------------------------------------------- the compiled module

needs_compiled = pytest.mark.skipif(harris._compiled is None, reason="andrea.tokenizer._harris was not built (no C compiler)")


def test_the_compiled_module_is_built_where_there_is_a_c_compiler():
    if not (shutil.which("cc") or shutil.which("gcc")):
        pytest.skip("no C compiler here, so setup builds no andrea.tokenizer._harris")
    assert harris._compiled is not None and HarrisTokenizer(["ab"])._trie is not None


@needs_compiled
@FAST
@given(s=st.lists(st.one_of(ANY_CHAR, HARD_CHARS, st.sampled_from(["'s", "'ll", "'ve", "'r", "'", " _", "  ", " 1", " ."])),
                  max_size=200).map("".join))
def test_compiled_split_is_the_word_pattern(s):
    assert harris._compiled.split(s) == WORD_RE.findall(s)


@needs_compiled
def test_compiled_split_classes_every_code_point_as_re_does():
    every = [chr(c) for c in range(0x110000)]
    for sep in ["", " ", "a", "1", "_", "  ", " \n", "'"]:  # each code point after each kind of neighbour
        s = sep.join(every)
        assert harris._compiled.split(s) == WORD_RE.findall(s), repr(sep)


@needs_compiled
@FAST
@given(data=st.data())
def test_compiled_encode_is_the_python_encode(tok, data):
    s = data.draw(st.one_of(english_like(tok), st.lists(ANY_CHAR, max_size=100).map("".join)))
    python = python_only(tok.segments)
    assert tok.encode(s) == python.encode(s)
    for w in WORD_RE.findall(s):
        marked = tok._rule.marks and harris.ends_in_letter(w)
        assert harris._compiled.encode_word(tok._trie, w, marked) == python._rule.encode(w)


@needs_compiled
def test_compiled_word_cache_starts_over_at_its_limit(tok, text, monkeypatch):
    monkeypatch.setattr(harris, "CACHE_LIMIT", 5)
    fresh = HarrisTokenizer(tok.segments)
    assert fresh.encode(text[:20_000]) == tok.encode(text[:20_000])
    assert 0 < len(fresh._cache) <= 5


def test_without_the_compiled_module_training_and_encoding_are_the_same(tok, text):
    """ANDREA_NO_COMPILED=1 runs the Python steps, as an install without a C compiler does."""
    code = ("import sys, json; sys.path.insert(0, 'tests'); import helpers as t; import andrea.tokenizer.harris as h; "
            "from andrea.tokenizer.train import train_tokenizer; "
            "text = t.morphology_text(); tok = train_tokenizer([text], t.N_SMALL); "
            "print(json.dumps([h._compiled is None, tok.segments, tok.encode(text[:20000]), tok.encode('naïve 😀 \\ud800')]))")
    env = {**os.environ, "ANDREA_NO_COMPILED": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True,
                         cwd=Path(__file__).parent.parent).stdout
    python, segments, ids, hard = json.loads(out)
    assert python and segments == tok.segments
    assert ids == tok.encode(text[:20000]) and hard == tok.encode("naïve 😀 \ud800")


def test_a_tokenizer_pickles(tok, text):
    back = pickle.loads(pickle.dumps(tok))
    assert back.segments == tok.segments and back.encode(text[:3000]) == tok.encode(text[:3000])


# ---------------------------------------------------------------- saving and loading


def test_save_load_round_trip(tok, tok_dir, text):
    segs = json.loads((tok_dir / "harris_segments.json").read_text(encoding="utf-8"))
    assert segs == tok.segments  # a JSON list of strings, in id order
    meta = json.loads((tok_dir / "tokenizer.json").read_text())
    assert meta["n_segments"] == N_SMALL and meta["vocab_size"] == N_SMALL + 257
    assert meta["fingerprint"] == tok.fingerprint()
    assert meta["found"] >= N_SMALL and meta["corpus"]["bytes"] == len(text.encode())
    back = HarrisTokenizer.load(tok_dir)
    assert back.segments == tok.segments and back.fingerprint() == tok.fingerprint()
    assert back.encode(text[:3000]) == tok.encode(text[:3000])
    assert back.words is not None and back.words == tok.words  # what inspect reads its statistics from


def test_load_a_bare_segments_file(tmp_path):
    path = tmp_path / "harris_segments.json"
    path.write_text(json.dumps(["un", "believ", "able"]))
    t = HarrisTokenizer.load(path)
    assert t.vocab_size == 260 and t.words is None
    assert t.encode("unbelievable", bos=False) == [257, 258, 259]


def test_to_dict_from_dict(tok):
    d = json.loads(json.dumps(tok.to_dict()))
    back = HarrisTokenizer.from_dict(d)
    assert back.segments == tok.segments and back.fingerprint() == tok.fingerprint()
    with pytest.raises(AndreaError, match="not an ANDREA Harris tokenizer"):
        HarrisTokenizer.from_dict({"segments": tok.segments})
    with pytest.raises(AndreaError, match="fingerprint"):
        HarrisTokenizer.from_dict({**d, "segments": d["segments"][::-1]})


def test_segments_with_surrogates_save_as_valid_json(tmp_path):
    t = HarrisTokenizer(["\ud800x", "ab"])
    t.save(tmp_path)
    (tmp_path / "harris_segments.json").read_bytes().decode("utf-8")  # strict UTF-8
    assert HarrisTokenizer.load(tmp_path).segments == t.segments


@pytest.mark.parametrize("content, message", [
    (b"[\"un\", \"re\"", "not valid JSON"),
    (b"\xff\xfe\x00binary", "not UTF-8"),
    (b'{"model": {"type": "BPE"}}', "not a JSON list of segment strings"),
    (b"[1, 2, 3]", "not a JSON list of segment strings"),
    (b'["un", "re", "un"]', "twice"),
    (b'["un", ""]', "empty segment"),
])
def test_corrupt_or_foreign_segments_file(tmp_path, content, message):
    (tmp_path / "harris_segments.json").write_bytes(content)
    with pytest.raises(AndreaError, match=message):
        HarrisTokenizer.load(tmp_path)


def test_segments_and_metadata_that_do_not_belong_together(tok_dir, tmp_path):
    for name in ("harris_segments.json", "tokenizer.json"):
        (tmp_path / name).write_bytes((tok_dir / name).read_bytes())
    (tmp_path / "harris_segments.json").write_text(json.dumps(["only", "three", "here"]))
    with pytest.raises(AndreaError, match="fingerprint|do not belong"):
        HarrisTokenizer.load(tmp_path)


def test_load_missing(tmp_path):
    with pytest.raises(AndreaError, match="does not exist"):
        HarrisTokenizer.load(tmp_path / "nope")
    with pytest.raises(AndreaError, match="has no harris_segments.json"):
        HarrisTokenizer.load(tmp_path)


@pytest.mark.parametrize("ids, message", [([N_SMALL + 257], f"out of range: this tokenizer has ids 0 to {N_SMALL + 256}"),
                                         ([10**9], "out of range"), ([-1], "out of range"),
                                         ([65, "x"], "not a whole number"), ([1.0], "not a whole number")])
def test_decode_bad_ids(tok, ids, message):
    with pytest.raises(AndreaError, match=message):
        tok.decode(ids)


def test_token_bytes_out_of_range(tok):
    with pytest.raises(AndreaError, match="out of range"):
        tok.token_bytes(tok.vocab_size)
    with pytest.raises(AndreaError, match="out of range"):
        tok.id_to_piece(-1)


# ---------------------------------------------------------------- the command line


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_train_encode_decode_inspect(tmp_path, text, capsys, monkeypatch):
    src = tmp_path / "corpus.txt"
    src.write_text(text, encoding="utf-8")
    out_dir = tmp_path / "tok"
    code, out, err = run_cli(capsys, "tokenizer", "train", str(src), "--segments", "200", "--out", str(out_dir))
    assert code == 0, err
    assert "requested 200 segments -> found" in out and "V = 457" in out
    assert {p.name for p in out_dir.iterdir()} >= {"harris_segments.json", "tokenizer.json", "harris_words.txt.gz"}
    tok = HarrisTokenizer.load(out_dir)

    code, out, _ = run_cli(capsys, "tokenizer", "encode", "--tokenizer", str(out_dir), "Unworkable kindness.")
    assert code == 0 and [int(x) for x in out.split()] == tok.encode("Unworkable kindness.")

    monkeypatch.setattr(sys, "stdin", _stdin("the café\n"))
    code, out, _ = run_cli(capsys, "tokenizer", "encode", "--tokenizer", str(out_dir), "--no-bos")
    ids = [int(x) for x in out.split()]
    assert code == 0 and ids == tok.encode("the café\n", bos=False)

    code, out, _ = run_cli(capsys, "tokenizer", "decode", "--tokenizer", str(out_dir), *map(str, ids))
    assert code == 0 and out == "the café\n"
    monkeypatch.setattr(sys, "stdin", _stdin(" ".join(map(str, [256] + ids))))
    code, out, _ = run_cli(capsys, "tokenizer", "decode", "--tokenizer", str(out_dir))
    assert code == 0 and out == "the café\n"

    code, out, _ = run_cli(capsys, "tokenizer", "inspect", "--tokenizer", str(out_dir), "unworkable")
    assert code == 0
    assert "boundaries: un|work|able" in out
    assert re.search(r"\bun \| workable\s+\d+\s+\d+\s+<- boundary", out)
    assert "' unworkable'" in out


def _stdin(text):

    return io.TextIOWrapper(io.BytesIO(text.encode("utf-8")), encoding="utf-8")


def test_cli_inspect_without_statistics(tmp_path, capsys):
    (tmp_path / "harris_segments.json").write_text(json.dumps(["un", "able"]))
    code, out, _ = run_cli(capsys, "tokenizer", "inspect", "--tokenizer", str(tmp_path), "unable")
    assert code == 0 and "no successor-variety statistics" in out and "'un' 'able'" in out


@pytest.mark.parametrize("case", ["missing", "empty", "binary", "nul", "zero", "too many"])
def test_cli_train_bad_input(tmp_path, capsys, case):
    path = tmp_path / "in.txt"
    n = "50"
    if case == "empty":
        path.write_text("  \n\n ")
    elif case == "binary":
        path.write_bytes(bytes(range(256)) * 4)
    elif case == "nul":
        path.write_bytes(b"hello\x00world\x00" * 100)
    elif case == "zero":
        path.write_text("some words, some more words")
        n = "0"
    elif case == "too many":
        path.write_text("some words, some more words")
    code, out, err = run_cli(capsys, "tokenizer", "train", str(path), "--segments", n, "--out", str(tmp_path / "o"))
    assert code == 2
    assert err.startswith("andrea: error: ") and err.count("\n") == 1 and "Traceback" not in err
    expect = {"missing": "neither a file", "empty": "no text", "binary": "not UTF-8", "nul": "binary",
              "zero": "argument --segments: must be an integer from 1 to", "too many": "requested 50 segments but the corpus supplies only"}[case]
    assert expect in err


@pytest.mark.parametrize("argv, expect", [
    (["decode", "--tokenizer", "{dir}", "5", "100000"], "out of range"),
    (["decode", "--tokenizer", "{dir}", "5", "abc"], "not a token id"),
    (["encode", "--tokenizer", "{dir}/nope", "hi"], "does not exist"),
    (["encode", "--tokenizer", "{bad}", "hi"], "not valid JSON"),
])
def test_cli_use_bad_input(tok_dir, tmp_path, capsys, argv, expect):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "harris_segments.json").write_text("[oops")
    argv = [a.format(dir=tok_dir, bad=bad) for a in argv]
    code, _, err = run_cli(capsys, "tokenizer", *argv)
    assert code == 2 and expect in err and err.count("\n") == 1


def test_cli_error_in_a_subprocess(tok_dir):
    done = subprocess.run([sys.executable, "-m", "andrea", "tokenizer", "decode", "--tokenizer", str(tok_dir), "99999"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip() == f"andrea: error: token id 99999 is out of range: this tokenizer has ids 0 to {N_SMALL + 256}."


# ---------------------------------------------------------------- real English (the default corpus)


# ---------------------------------------------------------------- version 4: a character's real cost


def test_tokenizer_files_without_a_version_load_and_encode_as_before(tmp_path):
    docs = dash_docs(60)
    tok = train_tokenizer(docs, 40, version=3)
    tok.save(tmp_path)
    meta = json.loads((tmp_path / "tokenizer.json").read_text())
    meta["settings"] = {"min_count": 2}  # what releases before version 4 wrote
    (tmp_path / "tokenizer.json").write_text(json.dumps(meta))
    old = HarrisTokenizer.load(tmp_path)
    assert old.meta["settings"] == {"min_count": 2}  # nothing invented: such a file says no version
    assert old.segments == tok.segments and old.fingerprint() == tok.fingerprint()
    old.save(tmp_path / "again")  # and saving it again keeps what it said
    assert json.loads((tmp_path / "again" / "tokenizer.json").read_text())["settings"] == {"min_count": 2}
    assert [old.encode(d) for d in docs[:5]] == [tok.encode(d) for d in docs[:5]]


# ---------------------------------------------------------------- hostile input


@pytest.mark.hostile
def test_text_without_end_is_refused_by_the_tokenizer_commands(tmp_path):
    """`andrea tokenizer encode` and `decode` reading /dev/zero: one sentence at 64 MiB, not MemoryError."""
    HarrisTokenizer([" cat"]).save(tmp_path / "tok")
    for command in ("encode", "decode"):
        with open("/dev/zero", "rb") as zero:
            done, peak = peak_rss(["tokenizer", command, "--tokenizer", tmp_path / "tok"], stdin=zero, timeout=120)
        assert "standard input is longer than 64 MiB" in process_sentence(done)
        assert peak < 800_000_000, f"tokenizer {command} peaked at {peak:,} bytes"


@pytest.mark.hostile
@pytest.mark.slow
def test_a_word_list_that_inflates_to_gigabytes_is_never_read_on_load(tmp_path, capsys):
    """harris_words.txt.gz replaced by 1 MB of gzip that inflates to 1 GB: loading the tokenizer
    (encode, prepare) does not inflate it; `inspect`, which needs it, reads at most its cap and
    ends in one sentence; peak memory stays far below the inflated size."""
    import gzip

    need_time()
    folder = train_tokenizer(short_documents(2, 30), 20).save(tmp_path / "tok")
    with gzip.open(folder / "harris_words.txt.gz", "wb", compresslevel=1) as f:
        block = b"a" * (64 << 20)
        for _ in range(16):
            f.write(block)
    assert (folder / "harris_words.txt.gz").stat().st_size < 20_000_000
    done, peak = peak_rss(["tokenizer", "encode", "--tokenizer", folder, "the king"])
    assert done.returncode == 0 and done.stdout.strip(), done.stderr[-2000:]
    assert peak < 400_000_000, f"encode peaked at {peak:,} bytes"
    done, peak = peak_rss(["tokenizer", "inspect", "--tokenizer", folder, "king"])
    assert "inflates to more than 64 MiB" in process_sentence(done)
    assert peak < 600_000_000, f"inspect peaked at {peak:,} bytes"
    src = tmp_path / "a.txt"
    src.write_text("\n\n".join(short_documents(4, 3)))
    code, _, err = cli(capsys, "prepare", src, "--tokenizer", folder, "--out", tmp_path / "d", "--no-progress")
    assert code == 0, err


@pytest.mark.hostile
@pytest.mark.parametrize("value", ['"257"', "null", "[3]", "2.5"])
def test_a_tokenizer_json_whose_segment_count_is_not_a_number_is_one_sentence(tmp_path, capsys, value):
    """tokenizer.json saying "n_segments": "257" (or null, a list, a fraction): `andrea tokenizer
    encode` ends in one sentence naming the two files, not a ValueError traceback."""
    import json

    from andrea.cli import main

    tok = HarrisTokenizer([" cat", " dog"])
    tok.save(tmp_path / "tok")
    meta = tmp_path / "tok" / "tokenizer.json"
    d = json.loads(meta.read_text())
    meta.write_text(json.dumps(d).replace(f'"n_segments": {d["n_segments"]}', f'"n_segments": {value}'))
    code = main(["tokenizer", "encode", "--tokenizer", str(tmp_path / "tok"), "the cat"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and err.count("\n") == 1, err
