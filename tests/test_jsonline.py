"""andrea.corpus.jsonline: its behaviour, and its promises under hostile input."""

import json

import pytest
from helpers import need_time, peak_rss, prose

from andrea.errors import AndreaError
from andrea.tokenizer.train import train_tokenizer

# ---------------------------------------------------------------- hostile input


@pytest.mark.hostile
def test_a_long_jsonl_line_is_read_in_pieces_that_make_the_same_text_and_tokens(tmp_path):
    """A 5 MB line (longer than a reading chunk) between short ones, its text field after and
    before other fields, written with and without ASCII escapes: read in pieces of at most 1 MiB
    that join to json.loads's text, that encode to exactly the tokens of the whole, and that
    fall in the split of the whole document."""
    from andrea.corpus.sources import PIECE_BYTES, documents, first_piece, is_validation, resolve, tasks

    texts = [prose(1, 200), prose(2, 5_000_000), prose(3, 300), prose(4, 4_500_000)]
    path = tmp_path / "long.jsonl"
    with open(path, "w", encoding="utf-8") as f:
        f.write(json.dumps({"text": texts[0]}) + "\n")
        f.write(json.dumps({"id": 7, "meta": {"a": [1, {"b": "x" * 2_000_000}]}, "text": texts[1], "z": [None, 1.5]}) + "\n")
        f.write(json.dumps({"text": texts[2]}, ensure_ascii=False) + "\n")
        f.write(json.dumps({"text": texts[3], "after": "yes"}, ensure_ascii=False) + "\n")
    got = []
    for task, _ in tasks(resolve(str(path))):
        for text, bos, in_val, n in documents(task):
            assert n <= PIECE_BYTES
            if bos:
                got.append(([text], in_val))
            else:
                got[-1][0].append(text)
    assert [("".join(parts), val) for parts, val in got] == [
        (t, is_validation(first_piece(t.encode("utf-8", "surrogatepass")), 0.05)) for t in texts]
    tok = train_tokenizer([prose(5, 20_000)], 40)
    for parts, _ in got[1::2]:
        assert len(parts) >= 4
        assert [i for k, p in enumerate(parts) for i in tok.encode(p, bos=k == 0)] == tok.encode("".join(parts))

@pytest.mark.hostile
@pytest.mark.parametrize("line, words", [
    ('{"text": "' + "x" * 5_000_000, "is not valid JSON (unterminated string)"),
    ('{"other": "' + "x" * 5_000_000 + '"}', "has no 'text' field"),
    ('{"m": "' + "x" * 5_000_000 + '", "text": 5}', "has a non-text 'text' field"),
    ('{"text": "' + "x" * 5_000_000 + '"} junk', "is not valid JSON (extra data after the object)"),
    ('{"text": "' + "x" * 5_000_000 + '", "m": ' + "[" * 5000 + "]" * 5000 + "}", "nests its JSON"),
    ('{"text": "' + "x" * 5_000_000 + '", "m": ' + "9" * 5000 + "}", "more than 4,300 digits"),
    ('{"text": "' + "x" * 5_000_000 + '\\q"}', "is not valid JSON (Invalid \\escape)"),
])
def test_a_damaged_long_jsonl_line_ends_in_the_sentence_of_a_short_one(tmp_path, line, words):
    from andrea.corpus.sources import documents, resolve, tasks

    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "fine"}\n' + line + "\n")
    with pytest.raises(AndreaError) as e:
        for task, _ in tasks(resolve(str(path))):
            list(documents(task))
    assert str(e.value).startswith(f"{path} line 2 ") and words in str(e.value), e.value

@pytest.mark.hostile
@pytest.mark.slow
def test_one_huge_jsonl_line_costs_its_pieces_not_its_size(tmp_path):
    """A 64 MB one-line JSONL: `tokenizer train --sample-bytes 5M` takes about its budget and
    `prepare` streams it; both peak far below the size of the line (measured with /usr/bin/time;
    reading the line whole peaked at 1.2 GB and 0.5 GB on a 60 MB line)."""
    need_time()
    src = tmp_path / "one.jsonl"
    with open(src, "w", encoding="utf-8") as f:
        f.write('{"text": ')
        f.write(json.dumps("".join(prose(k, 2_000_000) for k in range(32))))
        f.write("}\n")
    done, peak = peak_rss(["tokenizer", "train", src, "--sample-bytes", "5M", "--segments", "30", "--out", tmp_path / "t"])
    assert done.returncode == 0, done.stderr[-2000:]
    taken = int(done.stdout.split(" documents, ")[1].split(" bytes")[0].replace(",", ""))
    assert taken <= 1.5 * 5_000_000 + (1 << 20), done.stdout
    assert peak < 500_000_000, f"tokenizer train peaked at {peak:,} bytes"
    done, peak = peak_rss(["prepare", src, "--tokenizer", tmp_path / "t", "--out", tmp_path / "d", "--no-progress",
                           "--workers", "1"])
    assert done.returncode == 0, done.stderr[-2000:]
    assert peak < 420_000_000, f"prepare peaked at {peak:,} bytes"
