"""andrea.evaluate: bits per byte, by hand, for training's evaluations and the positions experiment."""

import math
from contextlib import nullcontext

import numpy as np
import pytest
import torch
from helpers import tiny_config

from andrea.evaluate import bits_per_byte, evaluate, token_byte_lengths
from andrea.model import ANDREA
from andrea.shards import TokenData

pytestmark = pytest.mark.usefixtures("one_thread")


def test_bits_per_byte_is_nats_over_ln2_bytes():
    assert bits_per_byte(math.log(2) * 12, 6) == pytest.approx(2.0)
    assert bits_per_byte(5.0, 0) == pytest.approx(5.0 / math.log(2))  # no bytes counts as one


def test_bits_per_byte_is_loss_over_bytes(data_dir, tmp_path):
    """bpb = total nats / (ln 2 · bytes of the predicted tokens), checked by hand on one source."""
    cfg = tiny_config(data_dir)
    torch.manual_seed(0)
    model = ANDREA(cfg)
    data = TokenData(data_dir)
    tok = data.load_tokenizer()
    result = evaluate(model, data, 32, 2, 2, token_byte_lengths(tok, cfg.vocab_size), "cpu", nullcontext())
    x, y = data.val_windows("alpha", 32, 2)
    with torch.no_grad():
        logits, _ = model(x)
    nats = torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum").item()
    nbytes = sum(len(tok.token_bytes(int(i))) for i in y.flatten())
    assert result["alpha"]["bpb"] == pytest.approx(nats / (np.log(2) * nbytes), rel=1e-6)
