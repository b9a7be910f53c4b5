"""What several test modules share: synthetic text, tiny models and run settings, and the check
that a command ended in one sentence. Fixtures live in conftest.py; this module holds plain
functions, imported by name (`from helpers import cli`)."""

from __future__ import annotations

import math
import random
from pathlib import Path

import torch

from andrea.cli import main
from andrea.config import ModelConfig
from andrea.data import TokenData
from andrea.model import ANDREA
from andrea.trainconfig import TrainConfig

WORDS = ("the cat sat on a mat and the dog ran to its pet owner while kings and queens "
         "talked of unbelievable things rethinking old ideas quickly").split()


def synthetic_text(seed: int, n_docs: int, words_per_doc: int = 400) -> list[str]:
    """Documents of sentences drawn from WORDS, seeded."""
    rng = random.Random(seed)
    docs = []
    for _ in range(n_docs):
        sentences, n = [], 0
        while n < words_per_doc:
            k = rng.randint(4, 12)
            sentences.append(" ".join(rng.choice(WORDS) for _ in range(k)).capitalize() + ".")
            n += k
        docs.append(" ".join(sentences))
    return docs


def tiny_config(data_dir: Path, **changes) -> ModelConfig:
    """A 2-layer, d = 32 model for a data folder's vocabulary."""
    V = TokenData(data_dir).vocab_size
    return ModelConfig(**{**dict(vocab_size=V, n_embd=32, n_head=2, n_layer=2, block_size=32), **changes})


def opts(**changes) -> TrainConfig:
    """Settings of a tiny run: 8 steps of 4 × 32 tokens, evaluated and saved every 4."""
    base = dict(batch_size=4, micro_batch=2, seq_len=32, max_steps=8, eval_every=4, checkpoint_every=4,
                warmup_steps=2, eval_windows=2, seed=7)
    base.update(changes)
    return TrainConfig(**base)


def quiet(*args, **kwargs):
    """A log that keeps nothing."""


def unit_model(block_size=64, vocab_size=300, seed=0, n_embd=32, n_head=4, **changes) -> ANDREA:
    """A 2-layer model with unit-scale random weights: attention and logits far from uniform, so
    the tokens it picks depend on the context it sees."""
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=vocab_size, n_embd=n_embd, n_head=n_head, n_layer=2, block_size=block_size, **changes)
    model = ANDREA(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 1.0 / math.sqrt(p.shape[1]))
    return model


def cli(capsys, *args) -> tuple[int, str, str]:
    """Run the command in this process: (exit status, stdout, stderr); never a traceback."""
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    assert "Traceback" not in err and "Traceback" not in out
    return code, out, err


def one_sentence(code: int, err: str) -> str:
    """The one line `andrea: error: ...` a refused command prints, with exit status 2."""
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("andrea: error: "), err
    return lines[0]
