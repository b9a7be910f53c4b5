"""Generation: KV cache against recomputation, the sliding window, sampling, streaming, chat, CLI."""

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import cli, need_time, one_sentence, peak_rss, process_sentence, unit_model
from test_embed import model, tok  # noqa: F401 (the hand-set model and its tokenizer, fixtures)

import andrea
from andrea.checkpoint import save_checkpoint
from andrea.cli import main
from andrea.decoding.generate import (
    BOS,
    Chat,
    TextGenerator,
    generate_ids,
    generate_steps,
    sample_next,
    stream_ids,
    stream_text_pieces,
    window_keep,
)
from andrea.errors import AndreaError
from andrea.tokenizer.train import train_tokenizer

ROOT = Path(__file__).resolve().parent.parent


pytestmark = pytest.mark.usefixtures("one_thread")


class ByteTokenizer:
    """A minimal tokenizer with HarrisTokenizer's interface: ids 0-255 are bytes, 256 is BOS, and
    ids 257.. are the given segments (raw bytes each)."""

    BOS = 256

    def __init__(self, segments=()):
        self.segments = [s.encode() if isinstance(s, str) else bytes(s) for s in segments]
        self.vocab_size = 257 + len(self.segments)

    def token_bytes(self, i):
        if i < 256:
            return bytes([i])
        return b"" if i == BOS else self.segments[i - 257]

    def encode(self, text, bos=True):
        return ([BOS] if bos else []) + list(text.encode())

    def decode_bytes(self, ids):
        return b"".join(self.token_bytes(i) for i in ids)

    def decode(self, ids):
        return self.decode_bytes(ids).decode("utf-8", "replace")


def tiny_model(block_size=64, vocab_size=300, seed=0, n_embd=32, n_head=4, **changes):
    return unit_model(block_size, vocab_size, seed, n_embd, n_head, **changes)


def constant_model(token, vocab_size=300):
    """A model whose logits are 32 for `token` and 0 for every other id, whatever the input."""
    model = tiny_model(vocab_size=vocab_size)
    with torch.no_grad():
        model.ln_f.weight.zero_()
        model.ln_f.bias.fill_(1.0)
        model.lm_head.weight.zero_()
        model.lm_head.weight[token] = 1.0
    return model


def reference_greedy(model, prompt, n):
    """Greedy decoding written out plainly: before each token, slide the window by the documented
    rule, then run the whole window from position 0 and take the argmax of the last logits."""
    T, keep = model.config.block_size, model.config.block_size // 2
    seq, out = list(prompt), []
    w = 0 if len(seq) <= T else len(seq) - keep
    with torch.no_grad():
        for _ in range(n):
            if len(seq) - w > T:
                w = len(seq) - keep
            logits, _ = model(torch.tensor([seq[w:]]))
            tok = int(logits[0, -1].argmax())
            out.append(tok)
            seq.append(tok)
    return out


def random_prompt(n, vocab_size=300, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (n,), generator=g).tolist()


# ---------------------------------------------------------------- the cache and the window


def test_cache_matches_recomputation_for_200_tokens_past_a_900_token_prompt():
    # context 1024: the window fills after 124 new tokens and slides to its last 512, so the
    # two paths must agree across the slide. BOS is an ordinary token here (stop_at_bos=False)
    # so that every run makes exactly 200 tokens. Width 16 keeps the 200 recomputed windows quick.
    model = tiny_model(block_size=1024, n_embd=16, n_head=2)
    prompt = random_prompt(900)
    cached = generate_ids(model, prompt, 200, greedy=True, stop_at_bos=False)
    recomputed = generate_ids(model, prompt, 200, greedy=True, stop_at_bos=False, use_cache=False)
    assert len(cached) == 200
    assert cached == recomputed
    assert cached == reference_greedy(model, prompt, 200)
    assert len(set(cached)) > 20  # a real sequence, not one token repeated


@pytest.mark.parametrize("pos", ["learned", "sinusoidal", "rope", "none"])
def test_prompt_longer_than_the_context_slides_the_same_way_on_both_paths(pos):
    model = tiny_model(block_size=32, pos=pos)
    prompt = random_prompt(80)
    cached = generate_ids(model, prompt, 70, greedy=True, stop_at_bos=False)
    assert cached == generate_ids(model, prompt, 70, greedy=True, stop_at_bos=False, use_cache=False)
    assert cached == reference_greedy(model, prompt, 70)


def test_the_window_keeps_the_last_half():
    # the tokens after a slide depend only on the kept half: changing an earlier token changes nothing
    model = tiny_model(block_size=32)
    prompt = random_prompt(40)
    changed = list(prompt)
    changed[40 - 16 - 1] = (changed[40 - 16 - 1] + 1) % 300  # just outside the kept 16
    assert window_keep(32) == 16
    assert generate_ids(model, prompt, 10, greedy=True) == generate_ids(model, changed, 10, greedy=True)
    changed = list(prompt)
    changed[40 - 16] = (changed[40 - 16] + 1) % 300  # the first kept token
    assert generate_ids(model, prompt, 10, greedy=True) != generate_ids(model, changed, 10, greedy=True)


def positions_run(model, prompt, n, use_cache):
    """How many positions the model computes to make n tokens (each passes through the token table,
    whichever way the decode plan runs the step)."""
    seen = []
    hook = model.wte.register_forward_pre_hook(lambda m, args: seen.append(args[0].shape[1]))
    try:
        generate_ids(model, prompt, n, greedy=True, stop_at_bos=False, use_cache=use_cache)
    finally:
        hook.remove()
    return seen


def test_each_new_token_costs_one_position_with_the_cache():
    model = tiny_model(block_size=64)
    # no slide: the prompt once, then one position per token (the last token is never fed back)
    assert positions_run(model, random_prompt(10), 30, True) == [10] + [1] * 29
    # one slide at 64 tokens: the kept 32 are run again once, then one position per token
    seen = positions_run(model, random_prompt(50), 30, True)
    assert seen == [50] + [1] * 14 + [32] + [1] * 14
    # without the cache every token recomputes its whole window
    assert sum(positions_run(model, random_prompt(10), 30, False)) == sum(range(10, 40))


# ---------------------------------------------------------------- sampling


def test_top_k_1_and_tiny_top_p_and_temperature_0_equal_greedy():
    model = tiny_model()
    prompt = random_prompt(12)
    greedy = generate_ids(model, prompt, 40, greedy=True, stop_at_bos=False)
    kw = dict(stop_at_bos=False, seed=7)
    assert generate_ids(model, prompt, 40, top_k=1, **kw) == greedy
    assert generate_ids(model, prompt, 40, top_p=1e-6, **kw) == greedy
    assert generate_ids(model, prompt, 40, temperature=0, **kw) == greedy
    assert generate_ids(model, prompt, 40, temperature=1e-4, **kw) == greedy
    assert generate_ids(model, prompt, 40, **kw) != greedy  # plain sampling does wander off


def test_same_seed_same_tokens_and_different_seeds_differ():
    model = tiny_model()
    prompt = random_prompt(12)
    a = generate_ids(model, prompt, 40, seed=1, stop_at_bos=False)
    assert a == generate_ids(model, prompt, 40, seed=1, stop_at_bos=False)
    assert a == generate_ids(model, prompt, 40, seed=1, stop_at_bos=False, use_cache=False)
    assert a != generate_ids(model, prompt, 40, seed=2, stop_at_bos=False)
    assert a != generate_ids(model, prompt, 40, seed=3, stop_at_bos=False)


def draws(logits, n=2000, **kw):
    g = torch.Generator().manual_seed(0)
    return torch.bincount(torch.tensor([sample_next(logits, generator=g, **kw) for _ in range(n)]), minlength=5)


def test_sample_next_follows_softmax_and_cuts_by_top_k_and_top_p():
    logits = torch.tensor([3.0, 2.0, 1.0, 0.0, -1.0])
    p = torch.softmax(logits, 0)  # 0.636 0.234 0.086 0.032 0.012
    counts = draws(logits)
    assert ((counts / 2000 - p).abs() < 0.04).all()
    assert (draws(logits, top_k=2)[2:] == 0).all() and (draws(logits, top_k=2)[:2] > 0).all()
    # top-p 0.7: token 1 stays (the tokens above it hold 0.636 < 0.7), token 2 goes (0.870)
    assert (draws(logits, top_p=0.7)[2:] == 0).all() and draws(logits, top_p=0.7)[1] > 0
    assert draws(logits, top_p=0.5).tolist() == [2000, 0, 0, 0, 0]
    assert (draws(logits, temperature=100.0) > 300).all()  # a high temperature flattens
    assert draws(logits, temperature=0.05).tolist() == [2000, 0, 0, 0, 0]


def rule(logits, temperature, top_k, top_p):
    """The sampling rule spelled out on one row, step by step (generate's module docstring)."""
    s = logits.double()
    s = (s - s.max()) / temperature
    ids = torch.arange(s.numel())
    if top_k is not None and top_k < s.numel():
        ids = (s >= torch.topk(s, top_k).values[-1]).nonzero().squeeze(1)
    probs = torch.softmax(s[ids], dim=-1)
    if top_p is not None and top_p < 1:
        sorted_probs, order = probs.sort(descending=True)
        drop = sorted_probs.cumsum(0) - sorted_probs >= top_p
        drop[0] = False
        sorted_probs[drop] = 0
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
    return probs, ids


def test_rows_sampled_together_are_each_the_rule_on_the_row_alone():
    """sample_rows takes its shortcut (top-k on the logits, then scaling only the kept tokens) and
    batches rows: each row's probabilities are bit for bit the rule's on that row alone, ties with
    the k-th, -inf entries, huge and tiny temperatures and logits of every float type included; the
    tokens and the generators' states after the draws equal torch.multinomial's on the rule's
    probabilities."""
    from andrea.decoding.generate import distributions, sample_rows

    rng = torch.Generator().manual_seed(5)

    def pick(xs, n):
        return [xs[int(j)] for j in torch.randint(len(xs), (n,), generator=rng)]

    for trial in range(160):
        n, V = int(torch.randint(1, 12, (1,), generator=rng)), pick([7, 60, 900], 1)[0]
        logits = torch.randn(n, V, generator=rng) * pick([0.5, 3.0, 30.0], 1)[0]
        if trial % 4 == 0:
            logits = (logits * 2).round() / 2  # ties everywhere, at the k-th too
        if trial % 3 == 0:
            logits[torch.rand(n, V, generator=rng) < 0.3] = float("-inf")  # masked tokens
            logits[:, 0] = 0.0  # every row keeps one token it can draw
        logits = logits.to(pick([torch.float32, torch.float16, torch.bfloat16, torch.float64], 1)[0])
        temps = pick([0.0, 0.8, 1.0, 2.5, 1e-300, 5e-324, 1e300, 1e308], n)  # 5e-324 and 1e308 merge scaled logits
        top_ks, top_ps, greedy = pick([None, 1, 3, 40, V, V + 5], n), pick([None, 1.0, 0.9, 0.01], n), pick([False] * 4 + [True], n)
        seeds = torch.randint(1 << 30, (n,), generator=rng).tolist()
        drawn = [i for i in range(n) if not (greedy[i] or temps[i] == 0)]
        together = distributions(logits[drawn], [temps[i] for i in drawn], [top_ks[i] for i in drawn],
                                 [top_ps[i] for i in drawn])
        for (probs, ids), i in zip(together, drawn):
            want, want_ids = rule(logits[i], temps[i], top_ks[i], top_ps[i])
            assert torch.equal(probs, want), (trial, i)
            assert torch.equal(ids if ids is not None else torch.arange(V), want_ids), (trial, i)
        ours, theirs = [torch.Generator().manual_seed(x) for x in seeds], [torch.Generator().manual_seed(x) for x in seeds]
        for _ in range(3):
            got = sample_rows(logits, temps, top_ks, top_ps, greedy, ours)
            for i in range(n):
                if i in drawn:
                    probs, ids = rule(logits[i], temps[i], top_ks[i], top_ps[i])
                    assert got[i] == int(ids[int(torch.multinomial(probs, 1, generator=theirs[i]))]), (trial, i)
                else:
                    assert got[i] == int(logits[i].argmax()), (trial, i)
        assert all(torch.equal(a.get_state(), b.get_state()) for a, b in zip(ours, theirs))


def test_the_shortcut_takes_rows_without_a_tie_together_and_a_tie_alone():
    from andrea.decoding.generate import _distributions

    logits = torch.randn(5, 300, generator=torch.Generator().manual_seed(0))
    groups = _distributions(logits, [0.8] * 5, [40] * 5, [None] * 5)
    assert [(rows, tuple(p.shape)) for rows, p, _ in groups] == [([0, 1, 2, 3, 4], (5, 40))]
    tied = logits.clone()
    tied[2, tied[2].topk(41).indices[-1]] = tied[2].topk(40).values[-1]  # row 2's 41st ties its 40th
    groups = _distributions(tied, [0.8] * 5, [40] * 5, [None] * 5)
    assert [(rows, tuple(p.shape)) for rows, p, _ in groups] == [([i], (1, 41 if i == 2 else 40)) for i in range(5)]
    merged = _distributions(logits, [5e-324] * 5, [40] * 5, [None] * 5)  # every scaled logit but the top is -inf
    assert [tuple(p.shape) for _, p, _ in merged] == [(1, 300)] * 5


def test_rows_sharing_a_generator_draw_as_calls_one_after_another():
    from andrea.decoding.generate import sample_rows

    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(1))
    kw = dict(temperatures=[0.9, 0.0, 1.2, 0.9, 1.0, 0.7], top_ks=[None, None, 5, 5, 50, 3], top_ps=[None, None, 0.8, None, None, None],
              greedy=[False] * 6)
    g, h = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    got = sample_rows(logits, generators=[g] * 6, **kw)
    assert got == [sample_next(logits[i], kw["temperatures"][i], kw["top_ks"][i], kw["top_ps"][i], generator=h) for i in range(6)]
    torch.manual_seed(3)
    got = sample_rows(logits, generators=[None] * 6, **kw)
    torch.manual_seed(3)
    assert got == [sample_next(logits[i], kw["temperatures"][i], kw["top_ks"][i], kw["top_ps"][i]) for i in range(6)]


def test_sampling_makes_its_tensors_on_the_logits_device():
    """Under another default device (meta), every tensor sampling makes must still be on the logits'
    own: the CPU stand-in for logits on a GPU, where a CPU tensor cannot join the products."""
    from andrea.decoding.generate import sample_rows

    logits = torch.randn(4, 60, generator=torch.Generator().manual_seed(2))
    args = ([0.8, 1.0, 5e-324, 0.0], [5, None, 5, None], [None, 0.9, None, None], [False] * 4)
    want = sample_rows(logits, *args, [torch.Generator().manual_seed(s) for s in range(4)])
    with torch.device("meta"):
        assert sample_rows(logits, *args, [torch.Generator().manual_seed(s) for s in range(4)]) == want


@pytest.mark.parametrize("row, kw", [
    ([0.0, float("nan"), 1.0], {}), ([0.0, float("nan"), 1.0], {"top_k": 2}), ([0.0, float("nan"), 1.0], {"top_k": 2, "top_p": 0.5}),
    ([float("inf"), 0.0, 1.0], {}), ([float("inf"), 0.0, 1.0], {"top_k": 1}), ([float("-inf")] * 3, {}),
    ([float("-inf")] * 3, {"top_k": 1}),
])
def test_logits_with_nothing_to_draw_from_are_one_sentence(row, kw):
    from andrea.decoding.generate import sample_rows

    with pytest.raises(AndreaError, match="no token can be drawn"):
        sample_next(torch.tensor(row), **kw)
    with pytest.raises(AndreaError, match="no token can be drawn"):  # beside a good row too
        sample_rows(torch.tensor([[0.0, 1.0, 2.0], row]), [1.0, 1.0], [kw.get("top_k")] * 2, [kw.get("top_p")] * 2,
                    [False, False], [None, None])
    assert sample_next(torch.tensor(row), greedy=True) in (0, 1, 2)  # the argmax needs no distribution


@pytest.mark.parametrize("kw, word", [
    (dict(temperature=-1.0), "temperature"), (dict(temperature=float("nan")), "temperature"),
    (dict(temperature=float("inf")), "temperature"), (dict(top_k=0), "top-k"), (dict(top_k=-3), "top-k"),
    (dict(top_k=2.5), "top-k"), (dict(top_p=0.0), "top-p"), (dict(top_p=1.5), "top-p"),
    (dict(top_p=-0.1), "top-p"), (dict(max_new_tokens=0), "max-new-tokens"),
    (dict(max_new_tokens=-5), "max-new-tokens"),
])
def test_invalid_sampling_values_are_refused_before_any_work(kw, word):
    model = tiny_model()
    args = {"max_new_tokens": 5, **kw}
    with pytest.raises(AndreaError, match=word):
        stream_ids(model, [1, 2, 3], **args)  # raised by the call itself, not at the first token


def test_empty_or_out_of_range_prompt_ids_are_refused():
    model = tiny_model()
    with pytest.raises(AndreaError, match="empty"):
        generate_ids(model, [], 5)
    with pytest.raises(AndreaError, match="V = 300"):
        generate_ids(model, [1, 300], 5)


def test_generation_stops_at_bos_and_does_not_return_it():
    model = constant_model(BOS)
    assert generate_ids(model, [1, 2], 5, seed=0) == []
    assert generate_ids(model, [1, 2], 5, greedy=True, stop_at_bos=False) == [BOS] * 5
    assert generate_ids(constant_model(65), [1, 2], 5, seed=0) == [65] * 5


# ---------------------------------------------------------------- text and streaming


def test_streamed_text_never_splits_a_multibyte_character():
    text = "héllo wörld → 🙂 ✓"
    tok = ByteTokenizer()
    pieces = list(stream_text_pieces(tok, iter(text.encode())))
    assert pieces == list(text)  # each character comes out whole, once its last byte arrives


def test_invalid_bytes_become_replacement_characters():
    tok = ByteTokenizer()
    assert "".join(stream_text_pieces(tok, iter([0xFF, 0x41]))) == "\ufffdA"
    assert "".join(stream_text_pieces(tok, iter([0x41, 0xE2, 0x82]))) == "A\ufffd"  # cut at the end
    assert "".join(stream_text_pieces(tok, iter([0xE2, 0x82, 0xAC, BOS]))) == "€"


def test_streamed_segments_join_to_the_decoded_ids():
    tok = ByteTokenizer(["\xe9t\xe9", b"\xf0\x9f", b"\x99\x82!"])  # a segment can end mid-character
    ids = [257, 32, 258, 259, 65]
    pieces = list(stream_text_pieces(tok, iter(ids)))
    assert "".join(pieces) == tok.decode(ids) == "été 🙂!A"
    assert "\ufffd" not in "".join(pieces)


@pytest.fixture(scope="module")
def harris():
    words = "the cat sat on the mat; the dog ran after the cats, and the cats ran off. unbelievable " \
            "rethinking reading readers walked talking talked walking jumped jumping quickly slowly"
    return train_tokenizer([words + " " + w for w in words.split()] * 3, 24, workers=1)


@pytest.mark.parametrize("which", ["bytes", "harris"])
def test_text_generator_generate_and_stream_agree_with_ids(which, harris):
    tok = ByteTokenizer() if which == "bytes" else harris
    model = tiny_model(vocab_size=tok.vocab_size)
    gen = TextGenerator(model, tok)
    prompt = "the cat é "
    ids = generate_ids(model, tok.encode(prompt, bos=True), 30, greedy=True)
    text = gen.generate(prompt, max_new_tokens=30, greedy=True)
    assert text == tok.decode_bytes(ids).decode("utf-8", "replace")
    assert "".join(gen.stream(prompt, max_new_tokens=30, greedy=True)) == text
    assert gen.generate(prompt, max_new_tokens=30, seed=5) == gen.generate(prompt, max_new_tokens=30, seed=5)
    with pytest.raises(AndreaError, match="empty"):
        gen.generate("")
    if which == "harris":
        assert any(i > BOS for i in tok.encode(prompt))  # the prompt uses segments


def test_text_generator_refuses_a_tokenizer_of_another_size():
    with pytest.raises(AndreaError, match="V = 258"):
        TextGenerator(tiny_model(vocab_size=300), ByteTokenizer(["ab"]))


# ---------------------------------------------------------------- chat


def test_chat_reply_ends_at_the_newline_and_joins_the_history():
    tok = ByteTokenizer(["ok\nnot this"])
    chat = Chat(TextGenerator(constant_model(257, vocab_size=258), tok), max_new_tokens=10, greedy=True)
    assert list(chat.reply("hi")) == ["ok"]
    assert chat.turns == [("hi", "ok")]
    assert tok.decode(chat.prompt_ids("again")) == "> hi\n< ok\n> again\n<"
    assert chat.prompt_ids("again")[0] == BOS


@pytest.mark.parametrize("segment, reply", [(" ok\n", "ok"), ("  ok\n", " ok"), ("ok\n", "ok"), (" \n", "")])
def test_the_prompt_stops_before_the_space_the_model_writes_with_its_first_word(segment, reply):
    """In the training text the space after `<` begins the reply's first word (" im good"), so the
    prompt ends at `<` and the reply is what the model wrote less that one space."""
    tok = ByteTokenizer([segment])
    chat = Chat(TextGenerator(constant_model(257, vocab_size=258), tok), max_new_tokens=10, greedy=True)
    assert tok.decode(chat.prompt_ids("hi")).endswith("> hi\n<")
    assert "".join(chat.reply("hi")) == reply and chat.ended == "turn"
    assert tok.decode(chat.prompt_ids("again")) == f"> hi\n< {reply}\n> again\n<"


def test_chat_drops_the_oldest_turns_to_stay_within_the_context():
    tok = ByteTokenizer()
    model = tiny_model(block_size=64, vocab_size=257)
    chat = Chat(TextGenerator(model, tok), max_new_tokens=8, seed=0)
    room = 64 - 8
    for i in range(8):
        "".join(chat.reply(f"line {i} of the chat"))
        assert len(chat.prompt_ids("next")) <= room
    assert 0 < len(chat.turns) < 8
    assert chat.turns[-1][0] == "line 7 of the chat"
    assert [t[0] for t in chat.turns] == [f"line {i} of the chat" for i in range(8 - len(chat.turns), 8)]


# ---------------------------------------------------------------- checkpoints and the command line


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory, harris):
    model = tiny_model(vocab_size=harris.vocab_size)
    path = tmp_path_factory.mktemp("gen") / "model.safetensors"
    save_checkpoint(path, model.config, model.state_dict(), None, {"step": 0, "tokenizer": harris.to_dict()})
    return path


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_sentence_error(code, out, err):
    assert code == 2
    assert out == ""
    assert "Traceback" not in err
    assert err.count("\n") == 1 and err.startswith("andrea: error: ") and err.rstrip().endswith(".")


def test_load_gives_a_ready_generator(ckpt, harris):
    gen = andrea.load(ckpt)
    assert gen.tokenizer.to_dict() == harris.to_dict()
    assert gen.config == gen.model.config and gen.config.vocab_size == harris.vocab_size
    text = gen.generate("the cat", max_new_tokens=20, greedy=True)
    assert "".join(gen.stream("the cat", max_new_tokens=20, greedy=True)) == text
    ids = generate_ids(gen.model, harris.encode("the cat"), 20, greedy=True)
    assert text == harris.decode_bytes(ids).decode("utf-8", "replace")


def test_cli_generate_prints_the_continuation(ckpt, capsys):
    code, out, err = run(capsys, "generate", "--checkpoint", ckpt, "--prompt", "the dog", "--greedy",
                         "--max-new-tokens", "25")
    assert code == 0 and err == ""
    assert out == andrea.load(ckpt).generate("the dog", max_new_tokens=25, greedy=True) + "\n"


def test_cli_generate_reads_the_prompt_from_stdin(ckpt, capsys, monkeypatch):
    args = ("generate", "--checkpoint", ckpt, "--max-new-tokens", "25", "--seed", "3", "--top-k", "20", "--top-p", "0.9")
    monkeypatch.setattr(sys, "stdin", io.StringIO("the dog\n"))
    code, from_stdin, _ = run(capsys, *args)
    assert code == 0
    assert run(capsys, *args, "--prompt", "the dog") == (0, from_stdin, "")


class FlushRecorder(io.StringIO):
    """Stands in for stdout and records what each flush made visible."""

    def __init__(self):
        super().__init__()
        self.flushed = []

    def flush(self):
        self.flushed.append(self.getvalue())


def test_cli_generate_streams_piece_by_piece(ckpt, monkeypatch):
    out = FlushRecorder()
    monkeypatch.setattr(sys, "stdout", out)
    assert main(["generate", "--checkpoint", str(ckpt), "--prompt", "the", "--greedy", "--max-new-tokens", "20"]) == 0
    pieces = list(andrea.load(ckpt).stream("the", max_new_tokens=20, greedy=True))
    assert len(pieces) > 3
    # after the k-th flush exactly the first k pieces are out: text appears as it is produced
    for k in range(1, len(pieces) + 1):
        assert out.flushed[k - 1] == "".join(pieces[:k])


def test_cli_chat_from_a_pipe(ckpt, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO("hello there\nhow are you\n\nnever read\n"))
    code, out, err = run(capsys, "chat", "--checkpoint", ckpt, "--max-new-tokens", "12", "--seed", "0")
    assert code == 0 and err == ""
    lines = out.split("\n")
    assert lines[-1] == "" and len(lines) == 3 and all(line.startswith("< ") for line in lines[:2])
    chat = andrea.load(ckpt).chat(max_new_tokens=12, seed=0)
    assert lines[:2] == ["< " + "".join(chat.reply("hello there")), "< " + "".join(chat.reply("how are you"))]


def test_chat_samples_at_its_own_settings_and_generate_at_the_models_distribution(ckpt, capsys, monkeypatch):
    """`andrea chat` and Chat sample at temperature CHAT_TEMPERATURE among the CHAT_TOP_K most likely
    tokens unless told otherwise (what bench_chat.py measured readable); `andrea generate` keeps
    temperature 1 over every token. The CLI's replies are the library's at those settings, and
    differ from replies over every token."""
    from andrea.cli import build_parser
    from andrea.decoding import CHAT_TEMPERATURE, CHAT_TOP_K

    parser = build_parser()
    chat_args = parser.parse_args(["chat", "--checkpoint", "x"])
    generate_args = parser.parse_args(["generate", "--checkpoint", "x"])
    assert (chat_args.temperature, chat_args.top_k) == (CHAT_TEMPERATURE, CHAT_TOP_K) == (0.8, 40)
    assert (generate_args.temperature, generate_args.top_k) == (1.0, None)
    lines = [f"line {i}" for i in range(8)]
    monkeypatch.setattr(sys, "stdin", io.StringIO("".join(f"{line}\n" for line in lines)))
    code, out, _ = run(capsys, "chat", "--checkpoint", ckpt, "--max-new-tokens", "8", "--seed", "3")
    assert code == 0
    explicit = andrea.load(ckpt).chat(max_new_tokens=8, seed=3, temperature=0.8, top_k=40)
    assert out.split("\n")[:-1] == ["< " + "".join(explicit.reply(line)) for line in lines]
    everything = andrea.load(ckpt).chat(max_new_tokens=8, seed=3, temperature=1.0, top_k=None)
    assert out.split("\n")[:-1] != ["< " + "".join(everything.reply(line)) for line in lines]


@pytest.mark.parametrize("stdin, replies", [("one\n/quit\ntwo\n", 1), ("one\ntwo", 2), ("", 0)],
                         ids=["quit", "no-final-newline", "empty"])
def test_cli_chat_stops_where_the_input_says(ckpt, capsys, monkeypatch, stdin, replies):
    monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    code, out, _ = run(capsys, "chat", "--checkpoint", ckpt, "--max-new-tokens", "5", "--seed", "0")
    assert code == 0 and out.count("\n") == replies and out.count("< ") >= replies


def bad_checkpoints(tmp, harris):
    model = tiny_model(vocab_size=harris.vocab_size)
    (tmp / "garbage.safetensors").write_bytes(b"\x00\x01 not a checkpoint at all" * 10)
    save_checkpoint(tmp / "no_tokenizer.safetensors", model.config, model.state_dict(), None, {"step": 0})
    other = tiny_model(vocab_size=harris.vocab_size + 3)
    save_checkpoint(tmp / "other_v.safetensors", other.config, other.state_dict(), None,
                    {"step": 0, "tokenizer": harris.to_dict()})
    forged = {**harris.to_dict(), "fingerprint": "0" * 64}
    save_checkpoint(tmp / "forged.safetensors", model.config, model.state_dict(), None, {"step": 0, "tokenizer": forged})


@pytest.mark.parametrize("argv, word", [
    (["generate", "--checkpoint", "{tmp}/missing.safetensors", "--prompt", "x"], "does not exist"),
    (["generate", "--checkpoint", "{tmp}/garbage.safetensors", "--prompt", "x"], "not a readable checkpoint"),
    (["generate", "--checkpoint", "{tmp}/no_tokenizer.safetensors", "--prompt", "x"], "no tokenizer"),
    (["generate", "--checkpoint", "{tmp}/other_v.safetensors", "--prompt", "x"], "V ="),
    (["chat", "--checkpoint", "{tmp}/forged.safetensors"], "fingerprint"),
    (["generate", "--checkpoint", "{ckpt}", "--prompt", ""], "empty"),
    (["generate", "--checkpoint", "{ckpt}", "--prompt", "x", "--top-p", "1.5"], "top-p"),
    (["generate", "--checkpoint", "{ckpt}", "--prompt", "x", "--temperature", "-1"], "temperature"),
    (["generate", "--checkpoint", "{ckpt}", "--prompt", "x", "--top-k", "0"], "top-k"),
    (["chat", "--checkpoint", "{ckpt}", "--max-new-tokens", "0"], "max-new-tokens"),
])
def test_cli_errors_are_one_sentence_and_exit_2(argv, word, tmp_path, ckpt, harris, capsys):
    bad_checkpoints(tmp_path, harris)
    code, out, err = run(capsys, *[a.format(tmp=tmp_path, ckpt=ckpt) for a in argv])
    assert_one_sentence_error(code, out, err)
    assert word in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")
def test_cli_device_cuda_without_one_is_one_sentence(ckpt, capsys):
    code, out, err = run(capsys, "generate", "--checkpoint", ckpt, "--prompt", "x", "--device", "cuda")
    assert_one_sentence_error(code, out, err)
    assert "CUDA" in err


def test_cli_empty_prompt_from_stdin_is_refused(ckpt, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n"))
    assert_one_sentence_error(*run(capsys, "generate", "--checkpoint", ckpt))


def test_cli_in_a_real_process(ckpt, tmp_path):
    cmd = [sys.executable, "-m", "andrea"]
    p = subprocess.run(cmd + ["generate", "--checkpoint", str(tmp_path / "nope.safetensors"), "--prompt", "x"],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert_one_sentence_error(p.returncode, p.stdout, p.stderr)
    p = subprocess.run(cmd + ["chat", "--checkpoint", str(ckpt), "--max-new-tokens", "6", "--seed", "1"],
                       input="hello\nand again\n", capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert p.returncode == 0 and p.stderr == ""
    lines = p.stdout.split("\n")
    assert len(lines) == 3 and lines[2] == "" and all(line.startswith("< ") for line in lines[:2])


# ---------------------------------------------------------------- hostile input


@pytest.mark.hostile
@pytest.mark.parametrize("command", ["generate", "chat"])
def test_input_that_is_not_utf8_is_one_sentence(text_run, capsys, monkeypatch, command):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"caf\xe9 au lait\n"), encoding="utf-8"))
    code, _, err = cli(capsys, command, "--checkpoint", text_run, "--max-new-tokens", "3")
    assert "not UTF-8 text (byte 0xe9 at offset 3" in one_sentence(code, err)

@pytest.mark.hostile
def test_a_prompt_argument_that_is_not_utf8_is_one_sentence(text_run, capsys):
    bad = b"caf\xe9".decode("utf-8", "surrogateescape")  # how Python hands over such an argument
    code, _, err = cli(capsys, "generate", "--checkpoint", text_run, "--prompt", bad)
    assert "not UTF-8" in one_sentence(code, err)

@pytest.mark.hostile
@pytest.mark.slow
def test_a_prompt_without_end_is_refused_not_read(audited_run):
    """generate and chat reading /dev/zero: one sentence, exit 2, a bounded read (not MemoryError)."""
    need_time()
    for command in ("generate", "chat"):
        with open("/dev/zero", "rb") as zero:
            done, peak = peak_rss([command, "--checkpoint", audited_run, "--max-new-tokens", "1"], stdin=zero, timeout=120)
        assert "longer than 4 MiB" in process_sentence(done)
        assert peak < 800_000_000, f"{command} peaked at {peak:,} bytes"

@pytest.mark.hostile
def test_tiny_temperatures_and_top_p_are_the_argmax(lab_checkpoint):
    """temperature and top-p 1e-300 (and 5e-324, the smallest float above 0) are allowed
    values: every draw is the most likely token, on random logits with a clear maximum."""
    from andrea.decoding.generate import sample_next

    gen = torch.Generator().manual_seed(0)
    for trial in range(50):
        logits = torch.randn(300, generator=gen) * (1 + trial)
        best = int(logits.argmax())
        for kw in ({"temperature": 1e-300}, {"temperature": 5e-324}, {"top_p": 1e-300}, {"top_p": 5e-324}, {"top_p": 1e-300, "top_k": 3},
                   {"temperature": 1e-300, "top_p": 0.5}):
            assert sample_next(logits, generator=gen, **kw) == best, (trial, kw)
    # float16 logits (a model run in half precision) too
    assert sample_next(logits.half(), temperature=1e-300, generator=gen) == int(logits.half().argmax())

@pytest.mark.hostile
def test_tiny_temperatures_in_generate_the_lab_and_the_engine(lab_checkpoint, tmp_path, capsys):
    from starlette.testclient import TestClient

    from andrea import stdlib_engine
    from andrea.inside import embed
    from andrea.web.lab import create_app

    common = ["--checkpoint", lab_checkpoint, "--prompt", "the cat", "--max-new-tokens", "12"]
    code, greedy, err = cli(capsys, "generate", *common, "--greedy")
    assert code == 0, err
    for extra in (["--temperature", "1e-300"], ["--top-p", "1e-300"]):
        code, out, err = cli(capsys, "generate", *common, *extra, "--seed", "3")
        assert code == 0 and out == greedy, (extra, err)
    subject = embed.load_subject(lab_checkpoint)
    with TestClient(create_app(subject), raise_server_exceptions=False) as client:
        picked = {}
        for name, settings in (("greedy", {"temperature": 0}), ("t", {"temperature": 1e-300}), ("p", {"top_p": 1e-300})):
            with client.stream("POST", "/api/generate", json={"prompt": "the cat", "max_new_tokens": 8, **settings}) as r:
                rows = [json.loads(line) for line in r.iter_lines() if line]
            assert r.status_code == 200 and rows[-1] == {"done": True, "tokens": 8}, rows[-1]
            picked[name] = [x["id"] for x in rows[:-1]]
        assert picked["t"] == picked["greedy"] and picked["p"] == picked["greedy"]
    model_json = tmp_path / "model.json"
    assert cli(capsys, "convert", lab_checkpoint, model_json, "--to", "json")[0] == 0
    assert stdlib_engine.main([str(model_json), "--prompt", "the cat", "--temperature", "nan"]) == 2
    assert "temperature a finite number" in capsys.readouterr().err
    assert stdlib_engine.main([str(model_json), "--prompt", "the cat", "--max-new-tokens", "8", "--greedy"]) == 0
    engine_greedy = capsys.readouterr().out
    assert stdlib_engine.main([str(model_json), "--prompt", "the cat", "--max-new-tokens", "8", "--temperature", "1e-300"]) == 0
    assert capsys.readouterr().out == engine_greedy

@pytest.mark.hostile
def test_seeds_at_and_past_the_edge(lab_checkpoint, capsys, monkeypatch):
    """--seed 2^70 for a fresh preset (embed, lab) is one sentence; a chat seeded 2^64 - 1 derives
    its next reply's seed inside 0..2^64-1 (it wraps) and answers every line."""
    import io

    for args in (["embed", "table", "--preset", "andrea-tiny", "--seed", 2**70],
                 ["lab", "--preset", "andrea-tiny", "--seed", 2**70, "--port", "0"]):
        code, _, err = cli(capsys, *args)
        assert "argument --seed: must be an integer from 0 to 18,446,744,073,709,551,615" in one_sentence(code, err)
    from andrea.decoding.generate import load

    chat = load(lab_checkpoint).chat(max_new_tokens=6, seed=2**64 - 1)
    replies = ["".join(chat.reply(line)) for line in ("hello", "the cat", "and the dog")]
    again = load(lab_checkpoint).chat(max_new_tokens=6, seed=2**64 - 1)
    assert replies == ["".join(again.reply(line)) for line in ("hello", "the cat", "and the dog")]
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"hello\nthe cat\n"), encoding="utf-8"))
    code, out, err = cli(capsys, "chat", "--checkpoint", lab_checkpoint, "--seed", 2**64 - 1, "--max-new-tokens", "4")
    assert code == 0, err


# ---------------------------------------------------------------- token by token, with probabilities (the lab)


def test_generated_steps_carry_their_probability_and_alternatives(model, tok):  # test_embed's hand-set model
    steps = list(generate_steps(model, tok, " cat", max_new_tokens=6, temperature=0.9, top_k=20, seed=5, alternatives=4))
    # the same tokens as plain generation with the same settings
    assert [s["id"] for s in steps] == generate_ids(model, tok.encode(" cat"), 6, 0.9, 20, None, 5)
    ids = tok.encode(" cat")
    for s in steps:
        with torch.no_grad():
            probs = torch.softmax(model(torch.tensor([ids]))[0][0, -1].double(), -1)
        assert s["prob"] == pytest.approx(float(probs[s["id"]]))
        assert [a["id"] for a in s["alternatives"]] == torch.topk(probs, 4).indices.tolist()
        ids.append(s["id"])
    greedy = list(generate_steps(model, tok, " cat", max_new_tokens=3, temperature=0))
    assert all(s["id"] == s["alternatives"][0]["id"] for s in greedy)
    with pytest.raises(AndreaError, match="temperature"):
        generate_steps(model, tok, " cat", temperature=-1)
