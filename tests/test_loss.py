"""The training loss (andrea.loss): the chunked cross-entropy against the plain one, in float32 and
under bf16 autocast, and the model's loss in chunks against the whole one."""

import pytest
import torch
import torch.nn.functional as F

from andrea.config import ModelConfig
from andrea.loss import chunked_cross_entropy
from andrea.model import ANDREA

pytestmark = pytest.mark.usefixtures("one_thread")
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def plain_and_chunked(h, w, t, chunk, multiple=1):
    out = []
    for fn in (lambda a, b: F.cross_entropy(F.linear(a, b).float().flatten(0, 1), t.flatten()),
               lambda a, b: chunked_cross_entropy(a, b, t, chunk, multiple)):
        a, b = h.clone().requires_grad_(), w.clone().requires_grad_()
        loss = fn(a, b)
        (3.0 * loss).backward()  # an incoming gradient other than 1
        out.append((loss.detach(), a.grad, b.grad))
    return out


@pytest.mark.parametrize("chunk,multiple", [(7, 1), (16, 64), (1000, 1)])
def test_chunked_cross_entropy_equals_the_plain_one_in_fp32(chunk, multiple):
    g = torch.Generator().manual_seed(0)
    h, w = torch.randn(3, 11, 24, generator=g), torch.randn(101, 24, generator=g) * 0.5
    t = torch.randint(0, 101, (3, 11), generator=g)
    (loss, gh, gw), (closs, cgh, cgw) = plain_and_chunked(h, w, t, chunk, multiple)
    torch.testing.assert_close(closs, loss, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(cgh, gh, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(cgw, gw, rtol=1e-5, atol=1e-6)
    with torch.no_grad():  # evaluation: the same loss, no gradients made
        torch.testing.assert_close(chunked_cross_entropy(h, w, t, chunk, multiple), loss, rtol=1e-6, atol=1e-6)


def test_chunked_cross_entropy_under_bf16_autocast_stays_within_bf16_of_the_plain_one():
    g = torch.Generator().manual_seed(1)
    h, w = torch.randn(2, 16, 32, generator=g), torch.randn(77, 32, generator=g) * 0.3
    t = torch.randint(0, 77, (2, 16), generator=g)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        (loss, gh, gw), (closs, cgh, cgw) = plain_and_chunked(h, w, t, 8)
    assert closs.dtype == torch.float32 and cgh.dtype == torch.float32 and cgw.dtype == torch.float32
    torch.testing.assert_close(closs, loss, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(cgh, gh, rtol=2e-2, atol=2e-3)
    torch.testing.assert_close(cgw, gw, rtol=2e-2, atol=2e-3)


def test_the_model_loss_in_chunks_equals_the_whole_one():
    torch.manual_seed(0)
    model = ANDREA(ModelConfig(vocab_size=300, n_embd=32, n_head=4, n_layer=2, block_size=16))
    ids = torch.randint(0, 300, (2, 17))
    model.vocab_multiple = 64
    grads = []
    for chunk in (0, 5):
        model.loss_chunk = chunk
        model.zero_grad()
        logits, loss = model(ids[:, :-1], ids[:, 1:])
        assert (logits is None) == (chunk > 0)
        loss.backward()
        grads.append((loss.detach(), [p.grad.clone() for p in model.parameters()]))
    (loss, g0), (closs, g1) = grads
    torch.testing.assert_close(closs, loss, rtol=1e-6, atol=1e-6)
    for a, b in zip(g0, g1):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
    model.loss_chunk = None  # the default: in blocks on a CPU too
    assert model(ids[:, :-1], ids[:, 1:])[0] is None


@cuda
def test_the_cuda_default_loss_in_blocks_stays_within_bf16_of_the_whole_one():
    torch.manual_seed(0)
    model = ANDREA(ModelConfig(vocab_size=300, n_embd=64, n_head=4, n_layer=2, block_size=64)).cuda()
    model.vocab_multiple = 64
    ids = torch.randint(0, 300, (4, 65), device="cuda")
    out = []
    for chunk in (0, None):  # whole, then the CUDA default (blocks of LOSS_CHUNK rows)
        model.loss_chunk = chunk
        model.zero_grad()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits, loss = model(ids[:, :-1], ids[:, 1:])
        assert (logits is None) == (chunk is None)
        loss.backward()
        out.append((loss.detach(), model.lm_head.weight.grad.clone(), model.wte.weight.grad.clone()))
    (a, ga, wa), (b, gb, wb) = out
    torch.testing.assert_close(b, a, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(gb, ga, rtol=5e-2, atol=5e-3)
    torch.testing.assert_close(wb, wa, rtol=5e-2, atol=5e-3)
