"""andrea.usage: counts, standalone shares and continuations on texts whose figures are known."""

import numpy as np
import pytest

from andrea.prepare import prepare
from andrea.shards import TokenData
from andrea.tokenizer import BOS, HarrisTokenizer
from andrea.usage import USAGE_FILE, count_usage, data_usage, starts_word

TOK = HarrisTokenizer([" cat", "s", " dog", "ég", "egory"])
CAT, S, DOG = (TOK.encode(w, bos=False)[0] for w in (" cat", "s", " dog"))


def usage_of(*texts):
    return count_usage(([np.array(TOK.encode(t), dtype=np.uint16)] for t in texts), TOK.vocab_size,
                       starts_word(TOK))


def test_a_next_token_starts_a_word_unless_it_begins_with_a_letter_digit_or_a_character_under_way():
    starts = starts_word(TOK)
    for piece, expected in ((" ", True), (".", True), ("'", True), ("\n", True), ("s", False), ("7", False),
                            ("ég", False), (" cat", True)):
        (i,) = TOK.encode(piece, bos=False)
        assert starts[i] == expected, piece
    assert starts[BOS] and not starts[0xA9] and not starts[0xC3] and starts[ord("-")]


def test_shares_and_continuations_on_a_text_built_to_know_them():
    # ␣cat, 8 uses: alone before ␣ twice, before "'" and at the end of the text; continued by s twice,
    # by ég and by egory
    usage = usage_of(" cat cats, cat's cats cat cat\u00e9g category cat")
    assert usage.count[CAT] == 8
    assert usage.alone[CAT] == 4
    assert usage.share(CAT) == pytest.approx(4 / 8)
    cont = usage.continuations(CAT)
    assert cont[0] == (S, 2)
    assert sorted(c for _, c in cont) == [1, 1, 2]
    assert usage.count[DOG] == 0 and usage.share(DOG) is None and usage.continuations(DOG) == []
    assert usage.count.sum() == len(TOK.encode(" cat cats, cat's cats cat cat\u00e9g category cat"))


def test_a_text_split_over_shards_is_counted_as_one_and_texts_do_not_run_into_each_other():
    ids = np.array(TOK.encode(" cats cat dog cats"), dtype=np.uint16)
    whole = count_usage([[ids]], TOK.vocab_size, starts_word(TOK))
    cut = 2  # between ␣cat and s
    assert ids[cut - 1] == CAT and ids[cut] == S
    split = count_usage([[ids[:cut], ids[cut:]]], TOK.vocab_size, starts_word(TOK))
    for a, b in ((whole.count, split.count), (whole.alone, split.alone), (whole.next_counts, split.next_counts)):
        assert np.array_equal(a, b)
    apart = count_usage([[ids[:cut]], [ids[cut:]]], TOK.vocab_size, starts_word(TOK))
    assert apart.alone[CAT] == whole.alone[CAT] + 1  # the first text ends after ␣cat


def test_the_whole_word_filter_keeps_tokens_that_mostly_stand_alone_and_were_seen_enough():
    usage = usage_of(" dog" * 30 + " cats" * 30 + " cat" * 5)
    words = usage.standalone_words(min_share=0.8, min_count=20)
    assert words[DOG] and not words[CAT]
    assert not usage.standalone_words(min_share=0.8, min_count=31)[DOG]


def test_the_sentence_names_the_share_and_the_continuations():
    usage = usage_of(" cats cats cat")
    line = usage.sentence(CAT, lambda i: TOK.id_to_piece(i).replace(" ", "␣"))
    assert line == "␣cat stands alone in 33% of its 3 uses; it also begins ␣cat+s (67%)."


def test_a_data_folder_is_counted_once_and_counted_again_when_prepared_again(tmp_path):
    (tmp_path / "a.txt").write_text(" cats cat dog.\n\n" * 8000)
    out = tmp_path / "data"
    prepare(TOK, [str(tmp_path / "a.txt")], out, log=lambda *a: None, progress=False, val_share=0.1)
    data = TokenData(out)
    first = data_usage(data, TOK)
    assert (out / USAGE_FILE).is_file()
    train_tokens = sum(len(s.train) for s in data.sources.values())
    assert first.count.sum() == train_tokens and first.count[CAT] > 0
    again = data_usage(TokenData(out))
    assert np.array_equal(first.alone, again.alone)
    (out / USAGE_FILE).write_bytes(b"not an npz")  # damaged: counted again and rewritten
    assert np.array_equal(data_usage(TokenData(out), TOK).count, first.count)
    (tmp_path / "a.txt").write_text(" dog dog.\n\n" * 8000)
    prepare(TOK, [str(tmp_path / "a.txt")], out, log=lambda *a: None, progress=False, val_share=0.1)
    assert data_usage(TokenData(out), TOK).count[CAT] == 0


def test_neighbours_say_how_the_word_is_used_and_whole_words_mean_standalone_ones(tmp_path, capsys):
    """With the training data's usage, `embed neighbors` prints how the word is used, and
    --whole-words keeps only tokens that mostly stand alone: ␣cat (which mostly begins cats) is
    no whole word there, ␣dog is."""
    import json

    import torch

    from andrea.checkpoint import save_checkpoint
    from andrea.cli import main
    from andrea.config import ModelConfig
    from andrea.embed import neighbours
    from andrea.model import ANDREA

    (tmp_path / "a.txt").write_text((" cats cats cats cat dog dog pet.\n\n") * 4000)
    out = tmp_path / "data"
    prepare(TOK, [str(tmp_path / "a.txt")], out, log=lambda *a: None, progress=False, val_share=0.1)
    usage = data_usage(TokenData(out), TOK)
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=TOK.vocab_size, n_embd=8, n_head=2, n_layer=1, block_size=8)
    model = ANDREA(cfg)
    r = neighbours(model, TOK, "dog", k=TOK.vocab_size, whole_words=True, usage=usage)
    ids = [n["id"] for n in r["neighbours"]]
    assert CAT not in ids and r["usage"]["standalone_share"] == 1.0 and "standing alone" in r["whole_words_rule"]
    assert CAT in [n["id"] for n in neighbours(model, TOK, "dog", k=TOK.vocab_size, whole_words=True)["neighbours"]]
    run = tmp_path / "run"
    run.mkdir()
    save_checkpoint(run / "latest.safetensors", cfg, model.state_dict(), meta={"step": 1, "tokenizer": TOK.to_dict()})
    (run / "train.json").write_text(json.dumps({"data": str(out)}))
    assert main(["embed", "neighbors", "--checkpoint", str(run), "cat", "--whole-words"]) == 0
    text = capsys.readouterr().out
    assert "␣cat stands alone in 25% of its" in text and "␣cat+s (75%)" in text and "standing alone" in text
