"""andrea.formats.hf: the Hugging Face folder's tokenizer travels with the model. transformers'
AutoTokenizer loads the folder's own class (trust_remote_code) and gives andrea's ids, BOS first,
on thousands of generated strings; decode is exact (BOS shown as "<BOS>" unless skipped, as
transformers' tokenizers show theirs); a folder without segments refuses to load a
tokenizer instead of building an empty one; transformers' greedy generation on the folder alone
gives andrea's tokens."""

from __future__ import annotations

import random
import shutil

import pytest
import torch
from helpers import N_SMALL, morphology_text

from andrea.checkpoint import save_checkpoint
from andrea.config import BOS, ModelConfig
from andrea.decoding.generate import generate_ids
from andrea.formats import convert
from andrea.model import ANDREA
from andrea.tokenizer.harris import HarrisTokenizer
from andrea.tokenizer.train import train_tokenizer

transformers = pytest.importorskip("transformers")

LESSON_WORDS = ["cat", "dog", "pet", "Tuesday", "king", "queen", "man", "woman", "Paris", "France", "the", "cats",
                "category", "singing", "don't", "it's", "O'Neill", "naïve", "Zürich", "東京", "Москва"]
PIECES = [" ", "  ", "\t", "\n", "\n\n", "\r\n", "\x0b", "\x0c", "\u00a0", "\u2028", "\u3000", "\u200b", ",", ".", "!",
          "?", "'", "'s", "'ll", "’", "\"", "(", ")", "-", "--", "_", "__", "...", "1", "42", "٣", "²", "½", "😀",
          "👩\u200d💻", "e\u0301", "\u0301", "\ud800", "\udfff", "\0", "\x7f", "\ufeff", "<BOS>", "</w>", "<0x41>"]


def strings(n: int, seed: int) -> list[str]:
    """Adversarial texts: the lesson's words (with and without a space, cased, inflected), runs of
    whitespace, word ends right before punctuation, marks, surrogates, control characters."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(0, 12)):
            r = rng.random()
            if r < 0.45:
                w = rng.choice(LESSON_WORDS)
                w = w.upper() if rng.random() < 0.1 else w.capitalize() if rng.random() < 0.1 else w
                parts.append((" " if rng.random() < 0.7 else "") + w + (rng.choice(["s", "ing", "ed"]) if rng.random() < 0.1 else ""))
            elif r < 0.85:
                parts.append(rng.choice(PIECES))
            else:
                parts.append(chr(rng.randint(1, 0x10FFFF)))
        out.append("".join(parts))
    return out


def export(tmp_path, tok: HarrisTokenizer | None, name="hf", seed=0, block_size=32) -> tuple:
    cfg = ModelConfig(vocab_size=tok.vocab_size if tok else 300, block_size=block_size, n_layer=2, n_head=2, n_embd=32)
    torch.manual_seed(seed)
    model = ANDREA(cfg).eval()
    with torch.no_grad():  # weights large enough that greedy choices are not near ties
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    meta = {"tokenizer": tok.to_dict()} if tok else {}
    save_checkpoint(tmp_path / f"{name}.safetensors", cfg, model.state_dict(), meta=meta)
    convert(tmp_path / f"{name}.safetensors", tmp_path / name, "hf")
    return model, tmp_path / name


@pytest.fixture(scope="module")
def trained() -> HarrisTokenizer:
    return train_tokenizer([morphology_text() + " " + " ".join(LESSON_WORDS * 5)], N_SMALL, reserve=[" cat", " dog"])


@pytest.fixture(scope="module")
def folder(trained, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hf")
    model, path = export(tmp, trained)
    return model, path


def load(path, **kw):
    return transformers.AutoTokenizer.from_pretrained(str(path), trust_remote_code=True, **kw)


def test_the_folder_carries_the_tokenizer_class_and_the_engine_verbatim(folder):
    _, path = folder
    import andrea.stdlib_engine

    assert (path / "andrea_engine.py").read_bytes() == open(andrea.stdlib_engine.__file__, "rb").read()
    assert {"tokenization_andrea.py", "tokenizer_config.json", "harris_segments.json"} <= {f.name for f in path.iterdir()}


def test_autotokenizer_encodes_as_andrea_on_thousands_of_strings_and_decodes_exactly(folder, trained):
    _, path = folder
    tok = load(path)
    assert trained.word_ends and tok.vocab_size == trained.vocab_size and tok.bos_token_id == BOS == tok.eos_token_id
    texts = strings(3000, seed=1) + [" " + w for w in LESSON_WORDS] + [morphology_text(2, seed=9)]
    for s in texts:
        ids = trained.encode(s)
        got = tok(s)["input_ids"]
        assert got == ids, s
        assert tok.encode(s, add_special_tokens=False) == ids[1:]
        assert tok.decode(got, skip_special_tokens=True) == trained.decode(ids)
        assert tok.decode(got) == "<BOS>" + trained.decode(ids)  # a special token shows as its text, as in transformers
        assert tok.convert_tokens_to_ids(tok.convert_ids_to_tokens(got)) == got
    # a batch is each string alone
    batch = tok(texts[:50])["input_ids"]
    assert batch == [trained.encode(s) for s in texts[:50]]
    # every id has a string of its own, and decode gives back the text
    assert len(set(tok.get_vocab())) == trained.vocab_size
    assert tok.decode(trained.encode("The cat sat on the mat, the cats' cat."), skip_special_tokens=True) == \
        "The cat sat on the mat, the cats' cat."
    assert tok.decode([BOS]) == "<BOS>" and tok.decode([BOS], skip_special_tokens=True) == ""


def test_a_tokenizer_without_word_ends_loads_both_ways_and_both_agree(tmp_path):
    plain = HarrisTokenizer([" the", "the", " cat", " sat", " on", " mat", "ing", " and", "er", " dog", "é", " été", "q"])
    _, path = export(tmp_path, plain)
    tok = load(path)
    from tokenizers import Tokenizer

    fast = Tokenizer.from_file(str(path / "tokenizer.json"))
    for s in strings(300, seed=2):
        if any(0xD800 <= ord(c) <= 0xDFFF for c in s):
            continue  # `tokenizers` takes no lone surrogate; the folder's class does (test above)
        assert tok(s)["input_ids"] == plain.encode(s) == fast.encode(s).ids, s


def test_saved_again_it_loads_and_encodes_the_same(folder, trained, tmp_path):
    _, path = folder
    tok = load(path)
    tok.save_pretrained(tmp_path / "again")
    again = load(tmp_path / "again")
    for s in strings(200, seed=3):
        assert again(s)["input_ids"] == trained.encode(s)


def test_a_folder_without_a_tokenizer_refuses_to_load_one_with_a_sentence(tmp_path):
    _, path = export(tmp_path, None, name="bare")
    assert not (path / "harris_segments.json").exists()
    with pytest.raises(ValueError, match="carries no ANDREA tokenizer"):
        load(path)
    # nor does transformers build an empty GPT-2 tokenizer in its place when code is not trusted
    for trust in (False, None):
        with pytest.raises(ValueError):
            transformers.AutoTokenizer.from_pretrained(str(path), trust_remote_code=trust)


def test_without_trusting_its_code_a_folder_with_word_ends_gives_no_tokenizer_rather_than_a_wrong_one(folder):
    _, path = folder
    for trust in (False, None):
        with pytest.raises(ValueError):
            transformers.AutoTokenizer.from_pretrained(str(path), trust_remote_code=trust)


def test_transformers_generate_on_the_folder_alone_gives_andreas_greedy_tokens(folder, trained, tmp_path):
    model, path = folder
    alone = tmp_path / "alone"
    shutil.copytree(path, alone)  # nothing of andrea is read from here on
    tok = load(alone)
    hf = transformers.GPT2LMHeadModel.from_pretrained(str(alone), dtype=torch.float32).eval()
    for prompt in ("The cat", " the dog and the", "Tuesday"):
        enc = tok(prompt, return_tensors="pt")
        assert enc["input_ids"][0].tolist() == trained.encode(prompt)
        out = hf.generate(**enc, max_new_tokens=12, do_sample=False, pad_token_id=BOS)
        new = out[0, enc["input_ids"].shape[1]:].tolist()
        ours = generate_ids(model, trained.encode(prompt), 12, greedy=True)  # both stop at BOS, andrea without it
        assert (new[:-1] if new[-1] == BOS else new) == ours
        assert tok.decode(out[0], skip_special_tokens=True) == trained.decode(trained.encode(prompt) + ours)
