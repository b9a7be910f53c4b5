"""andrea.corpus.sources: its behaviour, and its promises under hostile input."""

import json
import random
import shutil
import subprocess

import pytest
from helpers import DEEP, LONG_INT, _text, cli, documents, last_sentence, one_sentence, run_andrea, short_documents

# ---------------------------------------------------------------- hostile input


@pytest.mark.hostile
@pytest.mark.parametrize("bad", ["long", "deep"])
def test_jsonl_sources_with_python_limits_end_in_one_sentence(small_tokenizer, tmp_path, capsys, bad):
    """A JSONL source whose line 3 holds a 5,000-digit number or nests 100,000 deep: `prepare` (its
    worker pool too) and `tokenizer train` end in one sentence naming the file and the line."""
    value = LONG_INT if bad == "long" else DEEP
    src = tmp_path / "src.jsonl"
    good = "".join(json.dumps({"text": d}) + "\n" for d in short_documents(5, 2))
    src.write_text(good + '{"text": "x", "n": ' + value + "}\n" + good)
    for args in (["prepare", src, "--tokenizer", small_tokenizer, "--out", tmp_path / "d", "--workers", "2", "--no-progress"],
                 ["prepare", src, "--tokenizer", small_tokenizer, "--out", tmp_path / "d1", "--workers", "1", "--no-progress"],
                 ["tokenizer", "train", src, "--segments", "5", "--out", tmp_path / "t"]):
        line = one_sentence(*cli(capsys, *args)[::2])
        assert f"{src} line 3 " in line, line

@pytest.mark.hostile
def test_a_device_that_never_ends_is_refused_as_a_source(prepared_root, tmp_path):
    """/dev/zero is read without end (in a process of its own, which the timeout would stop)."""
    line = last_sentence(run_andrea("prepare", "/dev/zero", "--tokenizer", prepared_root / "tok", "--out", tmp_path / "d", "--no-progress",
                                timeout=60))
    assert "/dev/zero is a character device, not a regular file" in line

@pytest.mark.hostile
def test_a_truncated_zstd_source_is_refused_not_read_in_part(prepared_root, tmp_path, capsys):
    """Cut at a third, a .txt.zst decodes to a third of its text without an error from the
    decoder; it must be refused, as must a .jsonl.zst cut short and an empty .zst."""
    import zstandard

    whole = zstandard.ZstdCompressor().compress(_text(400_000))
    cut = tmp_path / "cut.txt.zst"
    cut.write_bytes(whole[: len(whole) // 3])
    code, _, err = cli(capsys, "prepare", cut, "--tokenizer", prepared_root / "tok", "--out", tmp_path / "d", "--no-progress")
    assert f"{cut} ends inside the zstd frame that starts at byte 0" in one_sentence(code, err)
    assert not (tmp_path / "d" / "manifest.json").exists()
    lines = b"".join(json.dumps({"text": d}).encode() + b"\n" for d in documents(3, 40))
    blob = zstandard.ZstdCompressor().compress(lines)
    (tmp_path / "j.jsonl.zst").write_bytes(blob[:-3])  # only the checksum's last bytes are missing
    code, _, err = cli(capsys, "tokenizer", "train", tmp_path / "j.jsonl.zst", "--segments", "5", "--out", tmp_path / "t")
    assert "truncated or damaged" in one_sentence(code, err)
    (tmp_path / "empty.txt.zst").write_bytes(b"")
    code, _, err = cli(capsys, "prepare", tmp_path / "empty.txt.zst", "--tokenizer", prepared_root / "tok", "--out", tmp_path / "e",
                       "--no-progress")
    assert "is empty, so it holds no zstd frame" in one_sentence(code, err)
    # the whole file, and two frames one after the other, read as before
    (tmp_path / "two.txt.zst").write_bytes(whole + zstandard.ZstdCompressor().compress(b"\n\nthe end"))
    code, _, err = cli(capsys, "prepare", tmp_path / "two.txt.zst", "--tokenizer", prepared_root / "tok", "--out", tmp_path / "w",
                       "--no-progress")
    assert code == 0, err

@pytest.mark.hostile
@pytest.mark.skipif(shutil.which("zstd") is None, reason="the zstd command is not installed")
def test_the_zstd_frame_walk_agrees_with_the_zstd_command_at_every_cut(tmp_path):
    """Which cuts of a .zst file are whole, by the frame walk and by `zstd -t` (the reference
    decoder): the same answer for every length of a small file of two frames (with a skippable
    frame and a checksum) and for cuts all over larger files made with the command's options."""
    from andrea.corpus.sources import zstd_truncation

    def zstd(data: bytes, *flags: str) -> bytes:
        return subprocess.run(["zstd", "-q", "-c", *flags], input=data, capture_output=True, check=True).stdout

    skippable = (0x184D2A53).to_bytes(4, "little") + (5).to_bytes(4, "little") + b"12345"
    small = zstd(b"hello there\n") + skippable + zstd(b"\0" * 5000, "--no-check")
    rng = random.Random(0)
    big = _text(60_000)
    files = {"small": (small, range(len(small) + 1))}
    for flags in (("-1",), ("-19", "--no-content-size"), ("--no-check",)):
        blob = zstd(big, *flags) + zstd(b"tail")
        files[" ".join(flags)] = (blob, sorted({rng.randrange(len(blob)) for _ in range(150)} | {len(blob), len(blob) - 1}))
    path = tmp_path / "x.zst"
    for name, (blob, cuts) in files.items():
        for n in cuts:
            path.write_bytes(blob[:n])
            reference = subprocess.run(["zstd", "-q", "-t", str(path)], capture_output=True).returncode == 0
            assert (zstd_truncation(path) is None) == reference, (name, n)

@pytest.mark.hostile
def test_a_truncated_gzip_source_is_refused(prepared_root, tmp_path, capsys):
    import gzip

    blob = gzip.compress((prepared_root / "text.txt").read_bytes())
    (tmp_path / "cut.txt.gz").write_bytes(blob[: len(blob) // 2])
    code, _, err = cli(capsys, "prepare", tmp_path / "cut.txt.gz", "--tokenizer", prepared_root / "tok", "--out", tmp_path / "d",
                       "--no-progress")
    assert "ends before its gzip stream does: it is truncated" in one_sentence(code, err)
