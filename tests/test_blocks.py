"""Inside the blocks (andrea.inside.blocks): attention patterns against a hand-computed softmax and
against the layer's own output, and the logit lens against the model's own logits."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from test_embed import CAT, DOG, D, model, run, tiny_model, tok  # noqa: F401 (fixtures)

from andrea.checkpoint import save_checkpoint
from andrea.errors import AndreaError
from andrea.inside.blocks import attention, lens_logits, logit_lens
from andrea.model import ANDREA, attention_weights


def hand_set_attention_model() -> ANDREA:
    """One layer, two heads of size 4, no positions. ␣cat = (1,-1,1,-1, 1,-1,1,-1) and
    ␣dog = (1,1,-1,-1, 1,1,-1,-1) have mean 0 and variance 1, so ln_1 leaves them as they are
    (up to its eps); wq = wk = I. Head 1: q·k is 4 for the same token and 0 for the other, over
    sqrt(4) = 2. Head 2: its keys are zeroed, so every score is 0 and it attends evenly."""
    m = tiny_model("none")
    with torch.no_grad():
        m.wte.weight[CAT] = torch.tensor([1.0, -1, 1, -1, 1, -1, 1, -1])
        m.wte.weight[DOG] = torch.tensor([1.0, 1, -1, -1, 1, 1, -1, -1])
        eye = torch.eye(D)
        m.h[0].attn.wq.weight.copy_(eye)
        m.h[0].attn.wk.weight.copy_(eye)
        m.h[0].attn.wk.weight[4:] = 0
    return m


def test_attention_pattern_matches_the_hand_computed_softmax(tok):
    m = hand_set_attention_model()
    r = attention(m, tok, " cat dog cat", bos=False)
    assert r["ids"] == [CAT, DOG, CAT] and r["pieces"] == [" cat", " dog", " cat"]
    assert r["patterns"].shape == (1, 2, 3, 3)
    e2 = math.exp(2)
    head1 = [[1, 0, 0],
             [1 / (1 + e2), e2 / (1 + e2), 0],
             [e2 / (2 * e2 + 1), 1 / (2 * e2 + 1), e2 / (2 * e2 + 1)]]
    np.testing.assert_allclose(r["patterns"][0, 0], head1, atol=1e-4)
    np.testing.assert_allclose(r["patterns"][0, 1], [[1, 0, 0], [1 / 2, 1 / 2, 0], [1 / 3, 1 / 3, 1 / 3]], atol=1e-6)


@pytest.mark.parametrize("pos", ["learned", "rope"])
def test_attention_pattern_is_what_the_layer_uses(pos):
    """Weights times values, through wo, give the attention layer's own output (rope included)."""
    m = tiny_model(pos, seed=3)
    attn = m.h[0].attn
    with torch.no_grad():
        x = m.embed(torch.tensor([[256, 257, 258, 259, 3, 4]]))
        h = m.h[0].ln_1(x)
        w = attention_weights(attn, h, m.rope)
        assert torch.allclose(w.sum(-1), torch.ones(1, 2, 6)) and not w.triu(1).any()
        v = attn.wv(h).view(1, 6, 2, D // 2).transpose(1, 2)
        y = attn.wo((w @ v).transpose(1, 2).reshape(1, 6, D))
        torch.testing.assert_close(y, attn(h, m.rope), atol=1e-6, rtol=1e-5)


def test_the_lens_after_the_last_block_is_the_models_own_logits(model, tok):
    ids = tok.encode(" cat dog the walk", bos=True)
    lens = lens_logits(model, ids)
    assert lens.shape == (2, len(ids), model.config.vocab_size)  # after the embedding, after block 1
    with torch.no_grad():
        logits, _ = model(torch.tensor([ids]))
        first = model.lm_head(model.ln_f(model.embed(torch.tensor([ids]))))
    torch.testing.assert_close(lens[-1], logits[0])
    torch.testing.assert_close(lens[0], first[0])
    r = logit_lens(model, tok, " cat dog the walk", k=3)
    assert r["stages"] == ["embedding", "block 1"] and len(r["lens"][1]) == len(ids)
    probs = torch.softmax(logits[0].double(), -1)
    last = r["lens"][-1]
    for t, cell in enumerate(last):
        assert [p["id"] for p in cell["top"]] == torch.topk(probs[t], 3).indices.tolist()
        assert cell["top"][0]["prob"] == pytest.approx(float(probs[t].max()))
        if t + 1 < len(ids):
            assert cell["next_prob"] == pytest.approx(float(probs[t, ids[t + 1]]))
    assert last[-1]["next_prob"] is None
    with pytest.raises(AndreaError, match="context of 16 tokens"):
        logit_lens(model, tok, "x" * 20)
    with pytest.raises(AndreaError, match="empty"):
        attention(model, tok, "")


def test_cli_attention_and_lens(tok, tmp_path, capsys):
    m = hand_set_attention_model()
    path = save_checkpoint(tmp_path / "att.safetensors", m.config, m.state_dict(), meta={"tokenizer": tok.to_dict()})
    code, out, _ = run(capsys, "embed", "attention", " cat dog cat", "--no-bos", "--checkpoint", str(path))
    assert code == 0 and "layer 1, head 1" in out and "layer 1, head 2" in out
    e2 = math.exp(2)
    row = next(line for line in out.splitlines() if line.startswith("1:␣dog"))
    assert row.split()[1:3] == [f"{100 / (1 + e2):.0f}", f"{100 * e2 / (1 + e2):.0f}"]  # 12 and 88
    code, out, _ = run(capsys, "embed", "attention", " cat dog cat", "--no-bos", "--head", "2", "--checkpoint", str(path), "--json")
    r = json.loads(out)
    assert np.array(r["patterns"]).shape == (1, 2, 3, 3) and r["patterns"][0][1][2] == pytest.approx([1 / 3] * 3, abs=1e-6)
    code, _, err = run(capsys, "embed", "attention", " cat", "--head", "3", "--checkpoint", str(path))
    assert code == 2 and "no head 3" in err
    code, out, _ = run(capsys, "embed", "lens", " cat dog", "-k", "2", "--checkpoint", str(path))
    assert code == 0 and "embedding" in out and "block 1" in out and "position 2: ␣dog" in out
    code, out, _ = run(capsys, "embed", "lens", " cat dog", "-k", "2", "--checkpoint", str(path), "--json")
    r = json.loads(out)
    with torch.no_grad():
        logits, _ = m(torch.tensor([r["ids"]]))
    assert [c["top"][0]["id"] for c in r["lens"][-1]] == logits[0].argmax(-1).tolist()
    code, _, err = run(capsys, "embed", "lens", " cat", "-k", "0", "--checkpoint", str(path))
    assert code == 2 and "argument -k: must be an integer from 1 to" in err  # the flag's own range
