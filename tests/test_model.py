"""The model pinned to independent facts: plain-indexing embeddings, sparse table gradients,
causality, order, an untied head, a numpy forward pass written from the specification, the KV
cache, initialisation, and the errors bad input ends in."""

import math

import numpy as np
import pytest
import torch

from andrea.config import POSITION_SCHEMES, PRESETS, ModelConfig
from andrea.errors import AndreaError
from andrea.model import ANDREA, KVCache, ReLUSquared, Rows, attention_weights

TINY = ModelConfig(vocab_size=300, n_embd=32, n_head=4, n_layer=2, block_size=16)


def build(cfg=TINY, seed=0, **changes):
    torch.manual_seed(seed)
    return ANDREA(cfg.replace(**changes)).eval()


def sharpen(model):
    """Larger weights than the init: attention far from uniform, so every part of the model counts."""
    g = torch.Generator().manual_seed(6)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2 and not name.startswith(("wte", "wpe")):
                p.mul_(5.0)
            elif p.dim() == 1:
                p.add_(0.3 * torch.randn(p.shape, generator=g))
    return model


def random_ids(cfg, B, T, seed=1, high=None):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, high or cfg.vocab_size, (B, T), generator=g)


def logits_of(model, ids):
    with torch.no_grad():
        return model(ids)[0]


# ---------------------------------------------------------------- the embedding layer


def test_embedding_is_plain_indexing_of_two_tables():
    model = build()
    ids = random_ids(TINY, 3, 10)
    wte, wpe = model.wte.weight.detach(), model.wpe.weight.detach()
    expected = torch.stack([torch.stack([wte[i] + wpe[t] for t, i in enumerate(row.tolist())]) for row in ids])
    assert torch.equal(model.embed(ids), expected)
    assert torch.equal(model.embed(ids, start=4), wte[ids] + wpe[4:14])


def test_sinusoidal_embedding_adds_the_vaswani_table():
    model = build(pos="sinusoidal")
    ids = random_ids(TINY, 2, 9)
    d = TINY.n_embd
    pe = np.zeros((TINY.block_size, d))
    for t in range(TINY.block_size):
        for i in range(0, d, 2):
            pe[t, i] = math.sin(t / 10000 ** (i / d))
            pe[t, i + 1] = math.cos(t / 10000 ** (i / d))
    pe *= math.sqrt(2 / d)  # every row has norm 1
    np.testing.assert_allclose(np.linalg.norm(pe, axis=1), 1.0, atol=1e-12)
    got = model.embed(ids).detach().double() - model.wte.weight.detach().double()[ids]
    np.testing.assert_allclose(got.numpy(), np.broadcast_to(pe[:9], (2, 9, d)), atol=1e-6)


@pytest.mark.parametrize("pos", ["rope", "none"])
def test_schemes_without_a_table_embed_tokens_only(pos):
    model = build(pos=pos)
    ids = random_ids(TINY, 2, 7)
    assert torch.equal(model.embed(ids), model.wte.weight[ids])
    assert not hasattr(model, "wpe")


def test_only_rows_of_ids_in_the_batch_get_gradient():
    model = build()
    present = torch.tensor([3, 17, 42, 256, 299])
    g = torch.Generator().manual_seed(2)
    ids = present[torch.randint(0, len(present), (4, 12), generator=g)]
    assert set(ids.unique().tolist()) == set(present.tolist())
    _, loss = model(ids, targets=random_ids(TINY, 4, 12))
    loss.backward()
    grad = model.wte.weight.grad
    absent = torch.ones(TINY.vocab_size, dtype=torch.bool)
    absent[present] = False
    assert torch.count_nonzero(grad[absent]) == 0
    assert all(grad[i].abs().sum() > 0 for i in present)
    # positions 0..11 were used, 12..15 were not
    assert torch.count_nonzero(model.wpe.weight.grad[12:]) == 0
    assert (model.wpe.weight.grad[:12].abs().sum(dim=1) > 0).all()
    # the head is dense: every output row gets gradient through the softmax
    assert (model.lm_head.weight.grad.abs().sum(dim=1) > 0).all()


def test_head_and_token_table_are_separate_storage():
    model = build()
    wte, head = model.wte.weight, model.lm_head.weight
    assert wte.shape == head.shape
    assert wte.data_ptr() != head.data_ptr()
    assert wte.untyped_storage().data_ptr() != head.untyped_storage().data_ptr()
    head_before, wte_before = head.detach().clone(), wte.detach().clone()
    with torch.no_grad():
        wte.add_(1.0)
    assert torch.equal(head, head_before)
    with torch.no_grad():
        head.mul_(2.0)
    assert torch.equal(wte, wte_before + 1.0)


def test_padded_head_matmul_gives_the_same_logits():
    model = build()
    model.loss_chunk = 0  # the loss from whole logits, so that they come back
    ids, targets = random_ids(TINY, 2, 10), random_ids(TINY, 2, 10, seed=9)
    logits, loss = model(ids, targets=targets)
    model.vocab_multiple = 64
    assert TINY.vocab_size % 64
    padded, padded_loss = model(ids, targets=targets)
    assert padded.shape == logits.shape
    torch.testing.assert_close(padded, logits, rtol=0, atol=1e-6)
    torch.testing.assert_close(padded_loss, loss, rtol=0, atol=1e-6)


def test_init_tables_have_std_one_over_sqrt_d():
    cfg = PRESETS["andrea-tiny"]
    assert cfg.n_embd == 128
    torch.manual_seed(0)
    model = ANDREA(cfg)
    target = 1 / math.sqrt(cfg.n_embd)
    for table in (model.wte.weight.detach(), model.wpe.weight.detach()):
        # the std of n normal samples has relative standard error 1/sqrt(2n): under 0.6% here
        assert abs(table.std().item() / target - 1) < 0.03
        assert abs(table.mean().item()) < 0.1 * target
        assert abs(table.std(dim=1).mean().item() / target - 1) < 0.03
        # each row's squared norm is d * (1/d) = 1 on average
        norms = table.norm(dim=1)
        assert abs(norms.mean().item() - 1) < 0.03
        assert norms.min() > 0.6 and norms.max() < 1.4


# ---------------------------------------------------------------- causality and order


@pytest.mark.parametrize("pos", POSITION_SCHEMES)
def test_causal_future_tokens_do_not_change_the_past(pos):
    model = build(pos=pos)
    ids = random_ids(TINY, 2, TINY.block_size)
    base = logits_of(model, ids)
    for t in (0, 5, TINY.block_size - 2):
        changed = ids.clone()
        changed[:, t + 1] = (changed[:, t + 1] + 1) % TINY.vocab_size
        out = logits_of(model, changed)
        torch.testing.assert_close(out[:, : t + 1], base[:, : t + 1], rtol=0, atol=1e-6)
        assert not torch.allclose(out[:, t + 1], base[:, t + 1], atol=1e-4)


@pytest.mark.parametrize("pos", ["learned", "sinusoidal", "rope"])
def test_position_schemes_see_order(pos):
    model = sharpen(build(pos=pos))
    ids = random_ids(TINY, 1, 12)
    perm = torch.randperm(12, generator=torch.Generator().manual_seed(3))
    permuted = logits_of(model, ids[:, perm])
    assert not torch.allclose(permuted, logits_of(model, ids)[:, perm], atol=1e-4)


@pytest.mark.parametrize("pos, changes", [("none", False), ("learned", True), ("sinusoidal", True), ("rope", True)])
def test_prefix_order_reaches_position_t_only_through_positions(pos, changes):
    # one layer, no positions: the output at t is a function of token t and the multiset of its prefix
    model = sharpen(build(pos=pos, n_layer=1))
    ids = random_ids(TINY, 2, 11)
    t = 10
    perm = torch.randperm(t, generator=torch.Generator().manual_seed(4))
    assert not torch.equal(perm, torch.arange(t))
    shuffled = ids.clone()
    shuffled[:, :t] = ids[:, perm]
    assert not torch.equal(shuffled, ids)
    before, after = logits_of(model, ids)[:, t], logits_of(model, shuffled)[:, t]
    if changes:
        assert not torch.allclose(before, after, atol=1e-4)
    else:
        torch.testing.assert_close(after, before, rtol=0, atol=1e-6)


def test_two_causal_layers_recover_order_without_positions():
    # layer 1 gives position s a view of prefix 0..s, so layer 2 sees order through the mask alone
    model = sharpen(build(pos="none", n_layer=2))
    ids = random_ids(TINY, 1, 6)
    swapped = ids[:, [1, 0, 2, 3, 4, 5]]
    assert not torch.allclose(logits_of(model, ids)[:, -1], logits_of(model, swapped)[:, -1], atol=1e-5)


def test_no_positions_cannot_count_a_repeated_token():
    repeated = torch.full((1, 10), 7)
    out = logits_of(build(pos="none"), repeated)
    torch.testing.assert_close(out, out[:, :1].expand_as(out), rtol=0, atol=1e-6)
    learned = logits_of(build(pos="learned"), repeated)
    assert not torch.allclose(learned, learned[:, :1].expand_as(learned), atol=1e-4)


# ---------------------------------------------------------------- a second forward pass, in numpy


def np_norm(x, sd, prefix, kind, eps=1e-5):
    if kind == "layernorm":
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + eps) * sd[prefix + ".weight"] + sd[prefix + ".bias"]
    return x / np.sqrt((x**2).mean(-1, keepdims=True) + eps) * sd[prefix + ".weight"]


def np_sinusoids(T, d):
    t = np.arange(T)[:, None]
    i = np.arange(0, d, 2)[None, :]
    pe = np.zeros((T, d))
    pe[:, 0::2] = np.sin(t / 10000 ** (i / d))
    pe[:, 1::2] = np.cos(t / 10000 ** (i / d))
    return pe * np.sqrt(2 / d)


def np_rotate(x):
    """x: (H, T, hd); rotate pair (2i, 2i+1) at position t by t / 10000^(2i/hd)."""
    T, hd = x.shape[1], x.shape[2]
    angle = np.arange(T)[:, None] / 10000 ** (np.arange(0, hd, 2)[None, :] / hd)
    a, b = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = a * np.cos(angle) - b * np.sin(angle)
    out[..., 1::2] = a * np.sin(angle) + b * np.cos(angle)
    return out


def np_act(h, kind):
    if kind == "relu2":
        return np.maximum(h, 0) ** 2
    if kind == "relu":
        return np.maximum(h, 0)
    erf = np.vectorize(math.erf)
    return 0.5 * h * (1 + erf(h / math.sqrt(2)))


def np_forward(sd, cfg, ids):
    """Logits (T, V) for one sequence, from the state dict alone."""
    T, d, H = len(ids), cfg.n_embd, cfg.n_head
    hd = d // H
    x = sd["wte.weight"][ids]
    if cfg.pos == "learned":
        x = x + sd["wpe.weight"][:T]
    elif cfg.pos == "sinusoidal":
        x = x + np_sinusoids(T, d)
    future = np.triu(np.ones((T, T), dtype=bool), k=1)
    for layer in range(cfg.n_layer):
        p = f"h.{layer}."
        a = np_norm(x, sd, p + "ln_1", cfg.norm)
        q, k, v = ((a @ sd[p + f"attn.{w}.weight"].T).reshape(T, H, hd).transpose(1, 0, 2) for w in ("wq", "wk", "wv"))
        if cfg.pos == "rope":
            q, k = np_rotate(q), np_rotate(k)
        scores = q @ k.transpose(0, 2, 1) / math.sqrt(hd)
        scores[:, future] = -np.inf
        weights = np.exp(scores - scores.max(-1, keepdims=True))
        weights /= weights.sum(-1, keepdims=True)
        y = (weights @ v).transpose(1, 0, 2).reshape(T, d)
        x = x + y @ sd[p + "attn.wo.weight"].T
        m = np_norm(x, sd, p + "ln_2", cfg.norm)
        x = x + np_act(m @ sd[p + "mlp.fc1.weight"].T, cfg.act) @ sd[p + "mlp.fc2.weight"].T
    return np_norm(x, sd, "ln_f", cfg.norm) @ sd["lm_head.weight"].T


REFERENCE_CASES = [
    dict(pos="learned", norm="layernorm", act="relu2"),
    dict(pos="learned", norm="layernorm", act="relu"),
    dict(pos="learned", norm="rmsnorm", act="gelu"),
    dict(pos="rope", norm="layernorm", act="relu2"),
    dict(pos="rope", norm="rmsnorm", act="gelu"),
    dict(pos="sinusoidal", norm="layernorm", act="gelu"),
    dict(pos="none", norm="rmsnorm", act="relu2"),
]


@pytest.mark.parametrize("case", REFERENCE_CASES, ids=lambda c: "-".join(c.values()))
def test_forward_matches_a_numpy_reference(case):
    model = sharpen(build(**case))
    cfg = model.config
    ids = random_ids(cfg, 2, cfg.block_size)
    targets = random_ids(cfg, 2, cfg.block_size, seed=5)
    sd = {k: v.detach().double().numpy() for k, v in model.state_dict().items()}
    expected = np.stack([np_forward(sd, cfg, row.tolist()) for row in ids])
    assert np.abs(expected).max() > 1.0  # the comparison is not between near-zero numbers

    logits, _ = model(ids)
    _, loss = model(ids, targets=targets)  # the training loss, in blocks of rows (the default)
    np.testing.assert_allclose(logits.detach().double().numpy(), expected, rtol=0, atol=1e-5)
    flat, tgt = expected.reshape(-1, cfg.vocab_size), targets.reshape(-1).numpy()
    top = flat.max(-1)
    nll = top + np.log(np.exp(flat - top[:, None]).sum(-1)) - flat[np.arange(len(tgt)), tgt]
    assert abs(loss.item() - nll.mean()) < 1e-5

    # sinusoid and rotation tables are stored in float32, so a float64 model agrees to about 1e-8 there
    atol = 1e-10 if cfg.pos in ("learned", "none") else 1e-7
    np.testing.assert_allclose(logits_of(model.double(), ids).numpy(), expected, rtol=0, atol=atol)


def test_relu_squared_matches_autograd_of_relu_square():
    x = torch.randn(64, 96, generator=torch.Generator().manual_seed(7))
    x[0, :8] = 0.0
    g = torch.randn(64, 96, generator=torch.Generator().manual_seed(8))
    a = x.clone().requires_grad_()
    b = x.clone().requires_grad_()
    ya, yb = torch.nn.functional.relu(a).square(), ReLUSquared.apply(b)
    ya.backward(g)
    yb.backward(g)
    assert torch.equal(ya, yb) and torch.equal(a.grad, b.grad)
    assert torch.autograd.gradcheck(ReLUSquared.apply, (torch.randn(5, 7, dtype=torch.float64, requires_grad=True),))


# ---------------------------------------------------------------- the KV cache


@pytest.mark.parametrize("pos", POSITION_SCHEMES)
def test_kv_cache_in_chunks_matches_one_forward(pos):
    model = build(pos=pos)
    ids = random_ids(TINY, 2, TINY.block_size)
    full = logits_of(model, ids)
    for chunks in ([TINY.block_size], [5, 1, 1, 4, 5], [1] * TINY.block_size):
        cache = KVCache(TINY, batch_size=2)
        parts, start = [], 0
        for n in chunks:
            parts.append(logits_of_cached(model, ids[:, start : start + n], cache))
            start += n
        assert cache.length == TINY.block_size
        torch.testing.assert_close(torch.cat(parts, dim=1), full, rtol=0, atol=1e-5)


@pytest.mark.parametrize("pos", POSITION_SCHEMES)
def test_rows_at_their_own_positions_and_slots_match_each_sequence_alone(pos):
    """Batched decoding's step (`Rows`): three sequences of different lengths in slots 2, 0 and 3
    of a 4-slot cache, each fed its next token at its own position in one forward, give the
    logits the plain forward gives each whole sequence at that token."""
    model = build(pos=pos)
    lengths, slots = [5, 1, 9], [2, 0, 3]
    seqs = [random_ids(TINY, 1, n + 1, seed=i) for i, n in enumerate(lengths)]
    cache = KVCache(TINY, batch_size=4)
    with torch.no_grad():
        for seq, slot, n in zip(seqs, slots, lengths):  # each prompt into its slot, as BatchDecoder's prefill
            part = KVCache(TINY, batch_size=1)
            model(seq[:, :n], cache=part)
            cache.k[:, slot], cache.v[:, slot] = part.k[:, 0], part.v[:, 0]
        got = model(torch.cat([s[:, n : n + 1] for s, n in zip(seqs, lengths)]), cache=cache,
                    rows=Rows(slots, lengths))[0]
    for i, (seq, n) in enumerate(zip(seqs, lengths)):
        torch.testing.assert_close(got[i, 0], logits_of(model, seq)[0, n], rtol=0, atol=1e-5)
    assert cache.length == 0  # the caller keeps each slot's length


def logits_of_cached(model, ids, cache):
    with torch.no_grad():
        return model(ids, cache=cache)[0]


def test_kv_cache_reset_starts_over():
    model = build(pos="rope")
    ids = random_ids(TINY, 1, 6)
    cache = KVCache(TINY, batch_size=1)
    first = logits_of_cached(model, ids, cache)
    cache.reset()
    torch.testing.assert_close(logits_of_cached(model, ids, cache), first, rtol=0, atol=0)


# ---------------------------------------------------------------- bad input


def test_id_at_or_above_vocab_size_names_v():
    model = build()
    with pytest.raises(ValueError, match=rf"\b{TINY.vocab_size}\b"):
        model(torch.tensor([[1, 2, TINY.vocab_size]]))


def test_negative_id_names_the_range():
    model = build()
    with pytest.raises(ValueError, match=rf"-1.*\b{TINY.vocab_size}\b"):
        model(torch.tensor([[1, -1, 2]]))


def test_empty_sequence_is_refused():
    with pytest.raises(ValueError, match="empty"):
        build()(torch.zeros((1, 0), dtype=torch.long))


@pytest.mark.parametrize("pos", POSITION_SCHEMES)
def test_sequence_longer_than_the_context_names_it(pos):
    model = build(pos=pos)
    with pytest.raises(ValueError, match=rf"\b{TINY.block_size}\b"):
        model(torch.zeros((1, TINY.block_size + 1), dtype=torch.long))


def test_cache_past_the_context_names_it():
    model = build()
    cache = KVCache(TINY, batch_size=1)
    logits_of_cached(model, torch.zeros((1, TINY.block_size - 2), dtype=torch.long), cache)
    with pytest.raises(ValueError, match=rf"\b{TINY.block_size}\b"):
        logits_of_cached(model, torch.zeros((1, 3), dtype=torch.long), cache)


def test_cache_shorter_than_the_context_names_its_length():
    model = build()
    cache = KVCache(TINY, batch_size=1, max_len=8)
    with pytest.raises(ValueError, match=r"\b8\b"):
        logits_of_cached(model, torch.zeros((1, 9), dtype=torch.long), cache)


def test_cache_for_another_batch_size_is_refused():
    model = build()
    with pytest.raises(ValueError, match=r"batch size 2"):
        logits_of_cached(model, torch.zeros((1, 3), dtype=torch.long), KVCache(TINY, batch_size=2))


# ---------------------------------------------------------------- the traced pass and removed parts


@pytest.mark.parametrize("pos", ["learned", "rope"])
def test_a_traced_pass_is_the_forward_pass_and_its_parts_add_up(pos):
    """The last block's output through ln_f and the head is forward's logits bit for bit; every
    block's parts add up as a pre-norm block computes them; the weights, the heads and W_o give
    the attention output; the hidden activations through fc2 give the MLP's."""
    model = sharpen(build(pos=pos))
    ids = random_ids(TINY, 2, 12)
    t = model.trace(ids, keep=("input", "normed", "weights", "heads", "attention", "middle", "hidden", "mlp", "output"))
    assert len(t.blocks) == TINY.n_layer and torch.equal(t.embedded, model.embed(ids))
    with torch.no_grad():
        assert torch.equal(model.head(model.ln_f(t["output"][-1])), model(ids)[0])
        for i, (block, b) in enumerate(zip(model.h, t.blocks)):
            assert torch.equal(b["input"], t.stream()[i])
            assert torch.equal(b["normed"], block.ln_1(b["input"]))
            assert torch.equal(b["middle"], b["input"] + b["attention"])
            assert torch.equal(b["output"], b["middle"] + b["mlp"])
            assert b["hidden"].shape == (2, 12, 4 * TINY.n_embd) and (b["hidden"] >= 0).all()  # relu²
            torch.testing.assert_close(block.mlp.fc2(b["hidden"]), b["mlp"])
            v = block.attn.wv(b["normed"]).view(2, 12, TINY.n_head, TINY.head_dim).transpose(1, 2)
            if pos == "learned":  # rope turns q and k, never v
                torch.testing.assert_close(b["weights"] @ v, b["heads"], atol=1e-5, rtol=1e-5)
            joined = b["heads"].transpose(1, 2).reshape(2, 12, TINY.n_embd)
            torch.testing.assert_close(block.attn.wo(joined), b["attention"])
            torch.testing.assert_close(b["weights"], attention_weights(block.attn, b["normed"], model.rope))
            assert not b["weights"].triu(1).any()
            torch.testing.assert_close(b["weights"].sum(-1), torch.ones(2, TINY.n_head, 12))


def test_a_trace_keeps_only_what_it_is_asked_for():
    model = sharpen(build())
    ids = random_ids(TINY, 1, 10)
    whole = model.trace(ids, keep=("output", "weights"))
    one = model.trace(ids, keep=("weights",), blocks=1)
    assert len(one.blocks) == 1 and set(one.blocks[0]) == {"weights"}
    assert torch.equal(one["weights"][0], whole["weights"][0])
    last = model.trace(ids, keep=("output", "weights"), at=-1)
    assert torch.equal(last.embedded, whole.embedded[:, -1])
    for a, b in zip(last.blocks, whole.blocks):
        assert torch.equal(a["output"], b["output"][:, -1]) and torch.equal(a["weights"], b["weights"][..., -1, :])
    with pytest.raises(AndreaError, match="not logits"):
        model.trace(ids, keep=("logits",))
    with pytest.raises(AndreaError, match="out of range"):
        model.trace(torch.tensor([[TINY.vocab_size]]))


def test_removed_parts_are_zeroed_in_every_pass_and_come_back_after():
    model = sharpen(build())
    ids = random_ids(TINY, 1, 10)
    before = logits_of(model, ids)
    with model.removed(heads=[(1, 2)], mlp=[0]):
        t = model.trace(ids, keep=("heads", "mlp", "attention"))
        assert not t["heads"][1][:, 2].any() and t["heads"][1][:, 1].any() and t["heads"][0][:, 2].any()
        assert not t["mlp"][0].any() and t["mlp"][1].any()
        assert not torch.equal(logits_of(model, ids), before)
    with model.removed(attention=[0, 1]):
        t = model.trace(ids, keep=("attention", "middle", "input"))
        assert not any(a.any() for a in t["attention"]) and torch.equal(t["middle"][0], t["input"][0])
    # every head removed is every attention layer removed: W_o of zeros is zero
    with model.removed(heads=[(i, h) for i in range(TINY.n_layer) for h in range(TINY.n_head)]):
        no_heads = logits_of(model, ids)
    with model.removed(attention=range(TINY.n_layer)):
        assert torch.equal(logits_of(model, ids), no_heads)
    with pytest.raises(RuntimeError), model.removed(mlp=[1]):
        raise RuntimeError("a pass that fails")
    assert torch.equal(logits_of(model, ids), before)


def test_parts_removed_in_one_thread_are_whole_in_another():
    """The lab answers a lens or a chat in one thread while a lesson removes parts in another: the
    removal is the removing thread's alone."""
    import threading

    model = sharpen(build())
    ids = random_ids(TINY, 1, 10)
    before, seen = logits_of(model, ids), {}
    with model.removed(heads=[(0, 1)], attention=[1], mlp=[0]):
        removed = logits_of(model, ids)
        other = threading.Thread(target=lambda: seen.update(logits=logits_of(model, ids)))
        other.start()
        other.join()
    assert not torch.equal(removed, before) and torch.equal(seen["logits"], before)


def test_removing_a_part_the_model_does_not_have_is_refused_in_a_sentence():
    model = build()
    for kwargs in ({"heads": [(0, TINY.n_head)]}, {"heads": [(TINY.n_layer, 0)]}, {"attention": [-1]}, {"mlp": [TINY.n_layer]}):
        with pytest.raises(AndreaError, match="counted from 0"), model.removed(**kwargs):
            pass
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


def sdpa_calls(monkeypatch) -> list:
    """The shapes of the queries andrea.model hands to SDPA from now on."""
    import andrea.model

    calls, real = [], torch.nn.functional.scaled_dot_product_attention

    def counted(q, *args, **kwargs):
        calls.append(tuple(q.shape))
        return real(q, *args, **kwargs)

    monkeypatch.setattr(andrea.model.F, "scaled_dot_product_attention", counted)
    return calls


def attention_and_gradients(f, q, k, v, dtype):
    """f's output and the gradients of q, k and v (of the sum of its squares), taken in dtype."""
    inputs = [t.detach().to(dtype).clone().requires_grad_() for t in (q, k, v)]
    out = f(*inputs)
    out.double().square().sum().backward()
    return [out.detach().double()] + [t.grad.double() for t in inputs]


def test_training_attention_in_plain_products_is_sdpas_in_value_and_gradient():
    """andrea.model.plain_causal_attention (a bf16 CPU training step's kernel) is SDPA's causal
    attention: equal in float64, output and gradients of q, k and v; and in bfloat16 no further
    from the float64 values than SDPA's own kernel in bfloat16 is (within 2×, on three draws)."""
    from andrea.model import plain_causal_attention

    def sdpa(q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    for seed in range(3):
        g = torch.Generator().manual_seed(seed)
        q, k, v = (torch.randn(2, 3, 16, 8, generator=g, dtype=torch.float64) * 2 for _ in range(3))
        exact = attention_and_gradients(sdpa, q, k, v, torch.float64)
        for a, b in zip(attention_and_gradients(plain_causal_attention, q, k, v, torch.float64), exact):
            torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)
        plain = attention_and_gradients(plain_causal_attention, q, k, v, torch.bfloat16)
        theirs = attention_and_gradients(sdpa, q, k, v, torch.bfloat16)
        for a, b, want in zip(plain, theirs, exact):
            assert (a - want).abs().max() <= 2 * (b - want).abs().max() + 1e-3 * want.abs().max()
    # causality: the last value moves nothing before it
    q, k, v = (torch.randn(1, 2, 16, 8, generator=g, dtype=torch.bfloat16) for _ in range(3))
    out = plain_causal_attention(q, k, v)
    v[..., -1, :] += 10
    assert torch.equal(plain_causal_attention(q, k, v)[..., :-1, :], out[..., :-1, :])


def test_a_bf16_cpu_training_pass_computes_attention_in_plain_products_and_every_other_pass_in_sdpa(monkeypatch):
    """The kernel choice (andrea.model.causal_attention): SDPA is not called by a training forward
    under bf16 autocast on the CPU at a window of at most PLAIN_ATTENTION_MAX_T; it is called in
    float32, without gradients, and past that window."""
    import andrea.model

    model = build()
    ids = random_ids(TINY, 2, 16)
    calls = sdpa_calls(monkeypatch)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(ids, targets=ids)[1].backward()
    assert calls == []
    model(ids, targets=ids)[1].backward()  # float32
    assert len(calls) == TINY.n_layer
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        model(ids)  # evaluation and decoding
    assert len(calls) == 2 * TINY.n_layer
    monkeypatch.setattr(andrea.model, "PLAIN_ATTENTION_MAX_T", 15)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(ids, targets=ids)[1].backward()
    assert len(calls) == 3 * TINY.n_layer and all(shape[2] == 16 for shape in calls)
