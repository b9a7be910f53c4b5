"""`andrea serve`: the batched decoder against single generations, and the real server (a
subprocess on a tiny trained checkpoint) against the official `openai` client and raw HTTP."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time

import httpx
import openai
import pytest
import torch

from andrea.config import BOS, ModelConfig
from andrea.decoding.batching import BatchDecoder, generate_batch
from andrea.decoding.generate import Chat, generate_ids
from andrea.decoding.generate import load as load_generator
from andrea.decoding.plan import CPULayouts
from andrea.errors import AndreaError
from andrea.model import ANDREA, one_query_attention
from andrea.web.api import decoding_threads

KEY = "sk-test-key"


def tiny(pos: str = "learned", seed: int = 0) -> ANDREA:
    torch.manual_seed(seed)
    return ANDREA(ModelConfig(vocab_size=300, n_embd=32, n_head=2, n_layer=2, block_size=32, pos=pos)).eval()


@pytest.fixture
def threads():
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


# ---------------------------------------------------------------- the batched decoder, without HTTP


def test_one_querys_attention_rounds_alike_on_any_thread_count_and_is_sdpas(threads):
    """A decoding step's attention on the CPU (andrea.model.one_query_attention): bit for bit the
    same on 1, 2 and 3 threads at every key length of a cache slot's view, and SDPA's numbers to
    float32 rounding."""
    torch.manual_seed(0)
    keys, values = torch.randn(2, 8, 64, 32), torch.randn(2, 8, 64, 32)
    for end in range(1, 65):
        q = torch.randn(1, 8, 1, 32)
        k, v = keys[1:2, :, :end], values[1:2, :, :end]
        outs = []
        for n in (1, 2, 3):
            threads(n)
            outs.append(one_query_attention(q, k, v))
        assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])
        torch.testing.assert_close(outs[0], torch.nn.functional.scaled_dot_product_attention(q, k, v),
                                   rtol=1e-5, atol=1e-6)


def test_slots_are_joined_left_and_reused():
    dec = BatchDecoder(tiny(), 3)
    a = dec.join([BOS, 300 - 1, 260], temperature=0)
    b = dec.join([BOS] * 7, temperature=0)
    c = dec.join([BOS, 270], temperature=0.8, seed=1)
    assert (a.slot, b.slot, c.slot) == (0, 1, 2) and dec.free == 0
    assert (a.position, b.position, c.position) == (2, 6, 1)  # each at its own position
    with pytest.raises(AndreaError, match="all 3 slots are taken"):
        dec.join([BOS])
    dec.feed(dec.pick())
    assert (a.position, b.position, c.position) == (3, 7, 2) and a.new_tokens == 1
    dec.leave(b)
    assert dec.free == 1 and b.slot == -1 and dec.active == [a, c]
    d = dec.join([BOS, 280, 281, 282], temperature=0)
    assert d.slot == 1  # b's slot, at once
    pairs = dec.pick()
    assert [s for s, _ in pairs] == [a, d, c]
    dec.feed([p for p in pairs if p[0] is not c])  # c ends here: it is not fed
    dec.leave(c)
    with pytest.raises(AndreaError, match="in one of its slots"):
        dec.feed([(c, 5)])
    dec.leave(c)  # leaving twice is harmless
    assert dec.free == 1 and a.position == 4 and d.position == 4
    with pytest.raises(AndreaError, match="out of range"):
        dec.join([300])
    with pytest.raises(AndreaError, match="empty"):
        dec.join([])


# one thread and two: with two, the decode plan splits every matrix in two blocks (andrea.decoding.plan);
# two threads on a tiny model are slow where other work shares the cores, so that case is smaller
@pytest.mark.parametrize("pos,n_threads,n", [("learned", 1, 9), ("rope", 1, 9),
                                             pytest.param("learned", 2, 4, marks=pytest.mark.slow)])
def test_batched_greedy_is_token_for_token_each_generation_alone(threads, pos, n_threads, n):
    """Prompts of different lengths joining at different steps (and windows sliding past the
    context of 32) give, token for token, what generate_ids gives for each alone."""
    threads(n_threads)
    model = tiny(pos)
    rng = random.Random(5)
    prompts = [[BOS] + [rng.randrange(257, 300) for _ in range(rng.randint(0, 31))] for _ in range(n)]
    limits = [rng.randint(1, 70) for _ in prompts]
    limits[0] = 60
    arrivals = [rng.randint(0, 25) for _ in prompts]
    alone = [generate_ids(model, p, k, greedy=True) for p, k in zip(prompts, limits)]
    assert generate_batch(model, prompts, limits, 3, arrivals) == alone
    assert any(len(p) + len(a) > 32 for p, a in zip(prompts, alone))  # a window slid


@pytest.mark.parametrize("n_threads, layout_threads", [(1, 2), pytest.param(2, 3, marks=pytest.mark.slow)])
def test_batched_greedy_on_fewer_threads_than_its_layouts_is_generate_on_as_many(threads, n_threads, layout_threads):
    """What `andrea serve` does on two cores (1, 2), and the same with more: decoding on fewer
    threads than the weights are laid out for gives, token for token, what generate_ids gives alone
    on as many threads as the layout's, from the same logits."""
    torch.manual_seed(0)
    model = ANDREA(ModelConfig(vocab_size=300, n_embd=128, n_head=2, n_layer=2, block_size=32)).eval()
    rng = random.Random(7)
    prompts = [[BOS] + [rng.randrange(257, 300) for _ in range(rng.randint(0, 31))] for _ in range(4)]
    threads(layout_threads)
    alone = [generate_ids(model, p, 40, greedy=True) for p in prompts]
    threads(n_threads)
    assert generate_batch(model, prompts, 40, 3, [0, 0, 5, 9], layout_threads=layout_threads) == alone

    def logits(compute, layout):  # a greedy row and a sampled one, bit for bit
        threads(compute)
        dec = BatchDecoder(model, 2, layout)
        a, b = dec.join(prompts[0], temperature=0), dec.join(prompts[1], temperature=0.8, seed=1)
        out = []
        for _ in range(5):
            dec.feed(dec.pick())
            out.append(torch.stack([a.logits, b.logits]))
        return torch.stack(out)

    as_generate = logits(layout_threads, None)
    assert torch.equal(logits(n_threads, layout_threads), as_generate)
    w, x = torch.randn(300, 128), torch.randn(1, 128)
    if not torch.equal(CPULayouts(n_threads)(x, "w", w), CPULayouts(layout_threads)(x, "w", w)):
        # where the two layouts round apart, a layout for the computing threads differs: the test can tell
        assert not torch.equal(logits(n_threads, n_threads), as_generate)


@pytest.mark.parametrize("own, requested, expected", [(2, None, (1, 2)), (1, None, (1, 1)), (4, None, (4, 4)),
                                                      (8, None, (8, 8)), (2, 2, (2, 2)), (2, 3, (3, 3))])
def test_on_two_threads_the_server_decodes_on_one_with_a_layout_for_two(threads, own, requested, expected):
    threads(own)
    assert decoding_threads(requested) == expected


@pytest.mark.parametrize("n_threads,n", [(1, 8), pytest.param(2, 5, marks=pytest.mark.slow)])
def test_seeded_sampling_is_the_same_alone_and_in_a_crowd(threads, n_threads, n):
    threads(n_threads)
    model = tiny(seed=1)
    rng = random.Random(6)
    prompts = [[BOS] + [rng.randrange(257, 300) for _ in range(rng.randint(0, 20))] for _ in range(n)]
    settings = [{"temperature": 0.9, "top_k": 40, "top_p": 0.95, "seed": i} for i in range(n)]
    alone = [generate_batch(model, [p], 30, 1, settings=[s])[0] for p, s in zip(prompts, settings)]
    crowd = generate_batch(model, prompts, 30, n, [3 * i for i in range(n)], settings)
    assert crowd == alone
    mixed = [s if i % 2 else {"temperature": 0.0} for i, s in enumerate(settings)]
    got = generate_batch(model, prompts, 30, 3, list(range(n)), mixed)
    for i in range(n):
        assert got[i] == (alone[i] if i % 2 else generate_ids(model, prompts[i], 30, greedy=True))
    assert generate_batch(model, prompts[:1], 30, 1, settings=[{**settings[0], "seed": 99}]) != alone[:1]


# ---------------------------------------------------------------- the real server


class Server:
    """`andrea serve` in a subprocess on a free port, one torch thread (unless `env` says otherwise)."""

    ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}

    def __init__(self, checkpoint, *args, env=None):
        self.proc = subprocess.Popen([sys.executable, "-m", "andrea", "serve", "--checkpoint", str(checkpoint),
                                      "--port", "0", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env=env or self.ENV)
        self.lines = []
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise AssertionError("the server did not start: " + self.proc.stderr.read())
            self.lines.append(line)
            if line.startswith("OpenAI API at "):
                self.url = line.split()[3]  # http://127.0.0.1:PORT/v1
                break
        self.port = int(self.url.split(":")[2].split("/")[0])

    def client(self, key=KEY) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url, api_key=key, max_retries=0, timeout=60)

    def http(self, key=KEY) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {key}"}, timeout=60)

    def stop(self) -> tuple[int, str, str]:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        out, err = self.proc.communicate(timeout=60)
        return self.proc.returncode, "".join(self.lines) + out, err


@pytest.fixture(scope="module")
def server(lab_checkpoint):
    s = Server(lab_checkpoint, "--api-key", KEY, "--max-batch", "3", "--max-queue", "2")
    yield s
    rc, out, err = s.stop()
    assert rc == 0 and "andrea serve: stopped." in out
    assert "Traceback" not in err, err


@pytest.fixture(scope="module")
def reference(lab_checkpoint):
    """What `andrea generate --greedy` computes, in this process with the server's one thread."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield load_generator(lab_checkpoint)
    torch.set_num_threads(before)


def test_text_that_arrives_together_still_streams_as_one_chunk_per_piece():
    """However many tokens the decoder finished before the event loop woke, each is its own chunk."""
    from andrea.web.protocol import Render
    body, last, gone = Render("lab", chat=False).events([("text", "a"), ("text", " cat"), ("text", " sat")], None)
    chunks = [json.loads(line[6:]) for line in body.decode().split("\n\n") if line]
    assert [c["choices"][0]["text"] for c in chunks] == ["a", " cat", " sat"] and not last and not gone
    body, last, _ = Render("lab", chat=True).events([("text", "hi"), ("text", "!"), ("end", "length")], None)
    lines = [line[6:] for line in body.decode().split("\n\n") if line]
    assert lines[-1] == "[DONE]" and last
    deltas = [json.loads(x)["choices"][0] for x in lines[:-1]]
    assert [d["delta"] for d in deltas] == [{"role": "assistant", "content": "hi"}, {"content": "!"}, {}]
    assert [d["finish_reason"] for d in deltas] == [None, None, "length"]


def test_models_and_health(server):
    models = server.client().models.list()
    assert [m.id for m in models.data] == ["lab"]
    assert server.client().models.retrieve("lab").id == "lab"
    r = httpx.get(server.url.replace("/v1", "/health"), timeout=30)  # no key needed
    assert r.status_code == 200 and r.json()["status"] == "ok" and r.json()["max_batch"] == 3


def test_completions_whole_and_streamed_with_the_openai_client(server, reference):
    c = server.client()
    r = c.completions.create(model="lab", prompt="the cat sat", max_tokens=12, temperature=0)
    expected = reference.generate("the cat sat", 12, greedy=True)
    assert r.choices[0].text == expected and r.choices[0].finish_reason == "length"
    assert r.usage.prompt_tokens == len(reference.encode_prompt("the cat sat")) and r.usage.completion_tokens == 12
    assert r.usage.total_tokens == r.usage.prompt_tokens + 12 and r.object == "text_completion"
    chunks = list(c.completions.create(model="lab", prompt="the cat sat", max_tokens=12, temperature=0, stream=True))
    assert "".join(ch.choices[0].text for ch in chunks) == expected
    assert [ch.choices[0].finish_reason for ch in chunks][-1] == "length"
    assert all(ch.choices[0].finish_reason is None for ch in chunks[:-1]) and len(chunks) > 2
    # a stop string ends the reply before it, with finish_reason "stop"
    stop = expected[3:6]
    r = c.completions.create(model="lab", prompt="the cat sat", max_tokens=12, temperature=0, stop=[stop, "zzz"])
    assert r.choices[0].text == expected[: expected.index(stop)] and r.choices[0].finish_reason == "stop"
    streamed = "".join(ch.choices[0].text for ch in c.completions.create(
        model="lab", prompt="the cat sat", max_tokens=12, temperature=0, stop=stop, stream=True))
    assert streamed == r.choices[0].text


def test_chat_whole_and_streamed_is_andrea_chats_reply(server, reference):
    c = server.client()
    history = [("the dog ran", "a cat sat on the mat"), ("kings and queens", "talked")]
    messages = []
    for person, model in history:
        messages += [{"role": "user", "content": person}, {"role": "assistant", "content": model}]
    messages.append({"role": "user", "content": "the cat"})
    chat = Chat(reference, max_new_tokens=30, greedy=True)
    chat.turns = list(history)
    expected = "".join(chat.reply("the cat"))
    r = c.chat.completions.create(model="lab", messages=messages, max_tokens=30, temperature=0)
    assert r.choices[0].message.content == expected and r.choices[0].message.role == "assistant"
    assert r.choices[0].finish_reason in ("stop", "length") and r.object == "chat.completion"
    stream = c.chat.completions.create(model="lab", messages=messages, max_tokens=30, temperature=0, stream=True,
                                       stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == expected
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == r.usage.completion_tokens
    assert chunks[-2].choices[0].finish_reason == r.choices[0].finish_reason


def model_logprobs(model, ids: list[int]) -> torch.Tensor:
    """log_softmax of the model's logits on ids, float32: row t is the distribution of token t + 1."""
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([ids]))[0][0].float(), dim=-1)


def names(tok) -> dict:
    """Token name -> id, as the server and the exported tokenizer name tokens."""
    return {**{f"<0x{b:02X}>": b for b in range(256)}, "<BOS>": BOS, **{s: 257 + i for i, s in enumerate(tok.segments)}}


def test_echo_and_logprobs_are_the_models_log_softmax_on_the_same_ids(server, reference):
    model, tok = reference.model, reference.tokenizer
    prompt = "the cat sat on the mat"
    ids = reference.encode_prompt(prompt)
    made = generate_ids(model, ids, 6, greedy=True)
    with server.http() as h:
        r = h.post("/completions", json={"prompt": prompt, "max_tokens": 6, "temperature": 0, "echo": True,
                                         "logprobs": 3})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    lp = choice["logprobs"]
    full = ids + made
    assert choice["text"] == tok.decode(full)  # the prompt, then the reply
    assert [names(tok)[t] for t in lp["tokens"]] == full
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None  # nothing comes before BOS
    want = model_logprobs(model, full)
    for t in range(1, len(full)):
        assert abs(lp["token_logprobs"][t] - want[t - 1, full[t]].item()) <= 1e-5, t
        top = torch.topk(want[t - 1], 3)
        got = lp["top_logprobs"][t]
        assert [names(tok)[k] for k in got] == top.indices.tolist()
        assert max(abs(a - b) for a, b in zip(got.values(), top.values.tolist())) <= 1e-5
    # each token's text starts where the text before it ends
    assert lp["text_offset"] == [len(tok.decode(full[:t])) for t in range(len(full))]
    # the openai client reads the same fields
    c = server.client().completions.create(model="lab", prompt=prompt, max_tokens=6, temperature=0, logprobs=2)
    assert c.choices[0].text == tok.decode(made)
    assert c.choices[0].logprobs.token_logprobs == pytest.approx(lp["token_logprobs"][len(ids):], abs=1e-5)
    assert c.choices[0].logprobs.text_offset[0] == 0


def test_lm_eval_asks_a_batch_of_token_prompts_scored_with_echo_and_each_is_the_single_request(server, reference):
    model, tok = reference.model, reference.tokenizer
    prompts = [tok.encode(t) for t in ("the cat sat", "a dog ran to its pet owner", "kings")]
    body = {"temperature": 0, "max_tokens": 1, "logprobs": 1, "echo": True, "seed": 1234}
    with server.http() as h:
        batch = h.post("/completions", json={**body, "prompt": prompts}).json()["choices"]
        alone = [h.post("/completions", json={**body, "prompt": p}).json()["choices"][0] for p in prompts]
        scored = h.post("/completions", json={**body, "prompt": prompts[1], "max_tokens": 0}).json()["choices"][0]
    assert [c["index"] for c in batch] == [0, 1, 2]
    for c, a, ids in zip(batch, alone, prompts):
        assert {**c, "index": 0} == a
        assert len(c["logprobs"]["token_logprobs"]) == len(ids) + 1  # the prompt's tokens and one made
        want = model_logprobs(model, ids)
        assert c["logprobs"]["token_logprobs"][1:len(ids)] == pytest.approx(
            [want[t - 1, ids[t]].item() for t in range(1, len(ids))], abs=1e-5)
    # max_tokens 0: the prompt alone, scored; no token made
    assert scored["text"] == tok.decode(prompts[1]) and scored["finish_reason"] == "length"
    assert scored["logprobs"]["token_logprobs"] == batch[1]["logprobs"]["token_logprobs"][:-1]


def test_n_choices_of_a_seeded_request_are_the_single_requests_of_seeds_s_to_s_plus_n(server):
    c = server.client()
    r = c.completions.create(model="lab", prompt=["the cat", "a dog"], max_tokens=8, temperature=1.0, seed=7, n=2)
    assert [ch.index for ch in r.choices] == [0, 1, 2, 3]
    for i, ch in enumerate(r.choices):
        alone = c.completions.create(model="lab", prompt=["the cat", "a dog"][i // 2], max_tokens=8, temperature=1.0,
                                     seed=7 + i % 2)
        assert ch.text == alone.choices[0].text
    assert r.usage.completion_tokens <= 4 * 8


def test_chat_logprobs_are_the_models_on_the_chat_prompt_and_the_reply(server, reference):
    from andrea.decoding.generate import chat_prompt_ids

    model, tok = reference.model, reference.tokenizer
    r = server.client().chat.completions.create(model="lab", messages=[{"role": "user", "content": "the cat"}],
                                                max_tokens=10, temperature=0, logprobs=True, top_logprobs=2)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens and all(len(e.top_logprobs) == 2 for e in content)
    ids, _ = chat_prompt_ids(tok, model.config.block_size, 10, [], "the cat")
    reply = [names(tok)[e.token] for e in content]
    assert b"".join(bytes(e.bytes) for e in content) == b"".join(map(tok.token_bytes, reply)).removeprefix(b" ")
    # the bytes are the reply's text, then (when it ended at the turn) the token that ended it
    assert b"".join(bytes(e.bytes) for e in content).decode("utf-8", "replace").startswith(r.choices[0].message.content)
    want = model_logprobs(model, ids + reply)
    for j, e in enumerate(content):
        assert abs(e.logprob - want[len(ids) - 1 + j, reply[j]].item()) <= 1e-5
        assert e.logprob == pytest.approx(e.top_logprobs[0].logprob, abs=1e-6)  # greedy: the most likely


def test_tokenize_and_detokenize_in_vllms_shape(server, reference):
    tok = reference.tokenizer
    base = server.url.removesuffix("/v1")
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {KEY}"}, timeout=60) as h:
        r = h.post("/tokenize", json={"prompt": "the cat sat"}).json()
        assert r == {"count": len(tok.encode("the cat sat")), "max_model_len": 64, "tokens": tok.encode("the cat sat")}
        assert h.post("/tokenize", json={"prompt": "the cat", "add_special_tokens": False}).json()["tokens"] == \
            tok.encode("the cat", bos=False)
        assert h.post("/detokenize", json={"tokens": tok.encode("the cat sat")}).json() == {"prompt": "the cat sat"}
        bad = h.post("/detokenize", json={"tokens": [1, 10**6]})
        assert bad.status_code == 400 and "tokens must be a list of token ids" in bad.json()["error"]["message"]
        assert h.post("/tokenize", json={"prompt": 3}).status_code == 400
        assert httpx.post(base + "/tokenize", json={"prompt": "a"}, timeout=30).status_code == 401  # the key, as for /v1


def test_greedy_requests_arriving_together_are_each_what_andrea_generate_gives_alone(server, reference, lab_checkpoint):
    prompts = ["the", "the cat sat on a mat and the dog ran to its pet owner", "Kings and queens talked of",
               "unbelievable things", "a", "the dog ran to its pet owner while kings"]
    limits = [40, 25, 60, 10, 70, 33]  # past the context of 64 for some: the window slides
    results: dict = {}

    def ask(i):
        time.sleep(0.05 * i)  # arriving at different times, while the others decode
        r = server.client().completions.create(model="lab", prompt=prompts[i], max_tokens=limits[i], temperature=0)
        results[i] = r.choices[0].text

    workers = [threading.Thread(target=ask, args=(i,)) for i in range(len(prompts))]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    for i, p in enumerate(prompts):
        assert results[i] == reference.generate(p, limits[i], greedy=True), p
    cli = subprocess.run([sys.executable, "-m", "andrea", "generate", "--checkpoint", str(lab_checkpoint), "--prompt",
                          prompts[2], "--max-new-tokens", str(limits[2]), "--greedy"], capture_output=True, text=True,
                         env=Server.ENV, timeout=120)
    assert cli.returncode == 0 and cli.stdout == results[2] + "\n"


def test_on_two_cores_the_server_decodes_on_one_thread_and_greedy_is_still_andrea_generates(lab_checkpoint):
    """At its default on two threads' worth of torch, the server decodes on one (HTTP keeps the
    other) with its weights laid out for two, as `andrea generate` run alike lays them out. (On
    this small model a rounding difference would seldom change a token: the logits are pinned bit
    for bit by test_batched_greedy_on_fewer_threads_than_its_layouts_is_generate_on_as_many.)"""
    two = {**Server.ENV, "OMP_NUM_THREADS": "2"}
    s = Server(lab_checkpoint, "--api-key", KEY, env=two)
    try:
        assert "; 1 torch thread, weights laid out for 2" in "".join(s.lines)
        prompt = "Kings and queens talked of"
        got = s.client().completions.create(model="lab", prompt=prompt, max_tokens=50, temperature=0).choices[0].text
    finally:
        rc, _, err = s.stop()
    assert rc == 0 and "Traceback" not in err
    cli = subprocess.run([sys.executable, "-m", "andrea", "generate", "--checkpoint", str(lab_checkpoint), "--prompt",
                          prompt, "--max-new-tokens", "50", "--greedy"], capture_output=True, text=True, env=two,
                         timeout=120)
    assert cli.returncode == 0 and cli.stdout == got + "\n"


def test_seeded_requests_repeat(server):
    c = server.client()
    ask = dict(model="lab", prompt="the cat", max_tokens=30, temperature=0.9, top_p=0.9, seed=7)
    first = c.completions.create(**ask).choices[0].text
    streamed = "".join(ch.choices[0].text for ch in c.completions.create(**ask, stream=True))
    assert streamed == first and c.completions.create(**ask).choices[0].text == first
    assert c.completions.create(**{**ask, "seed": 8}).choices[0].text != first
    # extremes that overflow a float32 division are handled: greedy, and the most likely token alone
    assert c.completions.create(**{**ask, "temperature": 1e-300}).choices[0].text == \
        c.completions.create(**{**ask, "temperature": 0}).choices[0].text
    assert c.completions.create(**{**ask, "top_p": 1e-300}).choices[0].text == \
        c.completions.create(**{**ask, "temperature": 0}).choices[0].text


def test_keys_models_and_the_context_with_the_openai_client(server):
    with pytest.raises(openai.AuthenticationError, match="API key is wrong"):
        server.client("sk-wrong").completions.create(model="lab", prompt="the", max_tokens=2)
    r = httpx.post(server.url + "/completions", json={"prompt": "the"}, timeout=30)
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    with pytest.raises(openai.NotFoundError, match="no model"):
        server.client().completions.create(model="gpt-4", prompt="the", max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="context of 64 tokens") as e:
        server.client().completions.create(model="lab", prompt="the cat sat " * 40, max_tokens=2)
    assert e.value.code == "context_length_exceeded" and e.value.param == "prompt"
    with pytest.raises(openai.BadRequestError, match="context of 64 tokens"):
        server.client().chat.completions.create(model="lab", messages=[{"role": "user", "content": "cat " * 100}])


BAD = [
    (b"{not json", "not valid JSON"),
    (b"[1, 2]", "must be a JSON object"),
    (b"\xff\xfe{}", "not UTF-8"),
    (b'{"prompt": "the", "seed": 1' + b"0" * 5000 + b"}", "a number of more than 4,300 digits"),
    (b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nests its JSON more than 100 levels deep"),
    (b'{"prompt": "the", "temperature": NaN}', "temperature must be a number in [0, 2]"),
    (b'{"prompt": "the", "temperature": 1e999}', "temperature must be a number"),
    (b'{"prompt": "the", "temperature": "hot"}', "temperature must be a number"),
    (b'{"prompt": "the", "top_p": 0}', "top_p must be a number in (0, 1]"),
    (b'{"prompt": "the", "max_tokens": 100000}', "max_tokens must be an integer from 1 to 4,096"),
    (b'{"prompt": "the", "max_tokens": true}', "max_tokens must be an integer"),
    (b'{"prompt": "the", "seed": 1180591620717411303424}', "seed must be an integer from 0 to"),
    (b'{"prompt": "the", "seed": -1}', "seed must be an integer"),
    (b'{"prompt": "the", "top_k": 0}', "top_k must be an integer"),
    (b'{"prompt": "the", "stop": ["a", "b", "c", "d", "e"]}', "stop must be a string or a list of 1 to 4"),
    (b'{"prompt": "the", "stop": ""}', "stop must be a non-empty string"),
    (b'{"prompt": "the", "n": 0}', "n must be an integer from 1 to 16"),
    (b'{"prompt": "the", "n": 17}', "n must be an integer from 1 to 16"),
    (b'{"prompt": "the", "n": 6, "max_tokens": 2}', "holds at most 5 at once"),
    (b'{"prompt": ["a", "b", "c", "d", "e", "f"], "max_tokens": 2}', "asks for 6 replies"),
    (b'{"prompt": "the", "logprobs": 21}', "logprobs must be an integer from 0 to 20"),
    (b'{"prompt": "the", "logprobs": true}', "logprobs must be an integer"),
    (b'{"prompt": "the", "top_logprobs": 2}', "top_logprobs is not supported"),
    (b'{"prompt": "the", "echo": "yes"}', "echo must be true or false"),
    (b'{"prompt": "the", "echo": true, "stream": true}', "a streamed reply has one prompt and one choice"),
    (b'{"prompt": ["a", "b"], "stream": true}', "a streamed reply has one prompt and one choice"),
    (b'{"prompt": "the", "max_tokens": 0}', "max_tokens must be an integer from 1"),
    (b'{"prompt": "the", "logprobs": 1, "max_tokens": 64}', "must fit the context of 64 tokens"),
    (b'{"prompt": "the", "stream": "yes"}', "stream must be true or false"),
    (b'{"prompt": "the", "path": "/etc/passwd"}', "unknown field 'path'"),
    (b'{"prompt": ""}', "prompt must be a non-empty string"),
    (b'{"prompt": ["a", 3]}', "a list of token ids, or a list of either"),
    (b'{"prompt": [[1, 2], []]}', "a list of token ids, or a list of either"),
    (b'{"prompt": [[1, 2], [3, 99999]]}', "token id 99999 in prompt is out of range"),
    (b'{"prompt": [1, 99999]}', "token id 99999 in prompt is out of range"),
    (b'{"prompt": "\\ud800"}', "lone surrogate"),
    (b'{"max_tokens": 3}', "prompt is required"),
]


@pytest.mark.parametrize("body,message", BAD, ids=[m for _, m in BAD])
def test_a_bad_body_is_a_400_in_the_openai_shape(server, body, message):
    with server.http() as h:
        r = h.post("/completions", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    assert message in error["message"]


CHAT_BAD = [
    ({"messages": []}, "messages must be a list of 1 to 256"),
    ({"messages": [{"role": "assistant", "content": "hi"}]}, "must be from the user"),
    ({"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]}, "must be from the assistant"),
    ({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}, "last message must be"),
    ({"messages": [{"role": "tool", "content": "a"}]}, "role must be system, user or assistant"),
    ({"messages": [{"role": "user", "content": 5}]}, "content must be a string"),
    ({"messages": [{"role": "user", "content": "a", "tool_calls": []}]}, "must be an object with role and content"),
    ({"messages": [{"role": "user", "content": "a"}], "tools": []}, "unknown field 'tools'"),
    ({"messages": [{"role": "user", "content": "a"}], "prompt": "x"}, "unknown field 'prompt'"),
]


@pytest.mark.parametrize("body,message", CHAT_BAD, ids=[m for _, m in CHAT_BAD])
def test_a_bad_chat_is_a_400(server, body, message):
    with server.http() as h:
        r = h.post("/chat/completions", json=body)
    assert r.status_code == 400 and message in r.json()["error"]["message"], r.text


def test_null_fields_read_as_their_defaults(server):
    """A field given as null is absent (as in the lab): a number its default, a flag false."""
    nulls = {"max_tokens": None, "temperature": None, "top_p": None, "top_k": None, "seed": None, "stop": None,
             "stream": None, "stream_options": None}
    with server.http() as h:
        r = h.post("/completions", json={"prompt": "the", **nulls})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] <= 16 and r.json()["object"] == "text_completion"
        r = h.post("/chat/completions", json={"messages": [{"role": "user", "content": "the"}], **nulls,
                                              "max_completion_tokens": None})
        assert r.status_code == 200, r.text


def test_sizes_types_paths_and_hosts(server):
    with server.http() as h:
        r = h.post("/completions", content=b'{"prompt": "' + b"a" * 300_000 + b'"}',
                   headers={"content-type": "application/json"})
        assert r.status_code == 413 and "larger than 262,144 bytes" in r.json()["error"]["message"]
        r = h.post("/completions", content=b'{"prompt": "the"}', headers={"content-type": "text/plain"})
        assert r.status_code == 400 and "Content-Type: application/json" in r.json()["error"]["message"]
        assert h.get("/completions").status_code == 405
        for path in ("/nothing", "/../../etc/passwd", "/models/../../../etc/passwd", "/static/index.html"):
            r = h.get(path)
            assert r.status_code == 404 and set(r.json()) == {"error"} and "root:" not in r.text, path
        r = h.post("/completions", json={"prompt": "the", "max_tokens": 2}, headers={"host": "evil.example"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_host"
        r = h.post("/completions", json={"prompt": "the", "max_tokens": 2}, headers={"host": "127.0.0.1.evil.example"})
        assert r.status_code == 400
        for host in (f"localhost:{server.port}", "127.0.0.1", "[::1]:80"):
            r = h.post("/completions", json={"prompt": "the", "max_tokens": 2}, headers={"host": host})
            assert r.status_code == 200, host


@pytest.mark.hostile
def test_a_field_named_with_a_lone_surrogate_is_a_400_and_a_slash_too_many_a_404(server):
    json_type = {"content-type": "application/json"}
    with server.http() as h:
        for body, shown in ((b'{"prompt": "the", "\\udc80x": 1}', "'\\udc80x'"),
                            (b'{"prompt": "the", "a\\ud800\\u00e9": 1}', "'a\\ud800\\xe9'")):
            r = h.post("/completions", content=body, headers=json_type)
            assert r.status_code == 400, r.text
            assert r.json()["error"]["message"].startswith(f"unknown field {shown};")
        for method, path in (("GET", "/models/"), ("POST", "/completions/"), ("POST", "/chat/completions/"),
                             ("GET", "/../health/")):
            r = h.request(method, path, json={"prompt": "the"})
            assert r.status_code == 404 and set(r.json()) == {"error"}, (method, path, r.status_code)


def _open_stream(server, max_tokens=4096):
    """A greedy stream (no BOS comes before 4,096 tokens) left open: (client, response, its
    lines) once its first event has arrived."""
    h = server.http()
    r = h.send(h.build_request("POST", "/completions", json={"prompt": "the", "max_tokens": max_tokens,
                                                             "temperature": 0, "stream": True}), stream=True)
    assert r.status_code == 200
    lines = r.iter_lines()
    assert next(line for line in lines if line).startswith("data: ")
    return h, r, lines


def _health(server) -> dict:
    return httpx.get(server.url.replace("/v1", "/health"), timeout=30).json()


def test_a_full_queue_is_429_and_a_client_that_hangs_up_frees_its_slot(server):
    streams = [_open_stream(server) for _ in range(3)]  # the 3 slots
    assert _health(server)["decoding"] == 3
    results = {}

    def queued(i):
        with server.http() as h:
            results[i] = h.post("/completions", json={"prompt": "the", "max_tokens": 5})

    workers = [threading.Thread(target=queued, args=(i,)) for i in range(2)]
    for w in workers:
        w.start()
    deadline = time.monotonic() + 30
    while _health(server)["waiting"] < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    with pytest.raises(openai.RateLimitError, match="the server is busy"):
        server.client().completions.create(model="lab", prompt="the", max_tokens=2)
    for h, r, _ in streams:  # hang up: the slots free at the next step and the queued requests run
        r.close()
        h.close()
    for w in workers:
        w.join(timeout=60)
    assert [results[i].status_code for i in range(2)] == [200, 200]
    deadline = time.monotonic() + 30
    while _health(server)["decoding"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _health(server)["decoding"] == 0 and _health(server)["waiting"] == 0


def test_sigterm_finishes_what_is_in_flight_and_ends_every_stream(lab_checkpoint):
    s = Server(lab_checkpoint, "--drain-seconds", "60")
    long_h, long_r, long_lines = _open_stream(s, 4096)
    short_h, short_r, short_lines = _open_stream(s, 300)
    s.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 30
    while _health(s)["status"] != "stopping" and time.monotonic() < deadline:
        time.sleep(0.02)
    r = s.http().post("/completions", json={"prompt": "the", "max_tokens": 2})
    assert r.status_code == 503 and r.json()["error"]["code"] == "shutting_down"
    short = [line for line in short_lines if line]  # finishes within the drain
    assert short[-1] == "data: [DONE]" and json.loads(short[-2][6:])["choices"][0]["finish_reason"] == "length"
    assert s.proc.poll() is None  # the long reply still decodes
    s.proc.send_signal(signal.SIGTERM)  # a second signal ends it now, with an error event and [DONE]
    rest = [line for line in long_lines if line]
    assert rest[-1] == "data: [DONE]" and "the server stopped before this reply was finished" in rest[-2]
    assert "error" in json.loads(rest[-2][6:])
    for h, r in ((long_h, long_r), (short_h, short_r)):
        r.close()
        h.close()
    rc, out, err = s.stop()
    assert rc == 0 and "andrea serve: stopped." in out and "Traceback" not in err
    assert "stopping: no new requests; 2 decoding" in err


def test_serve_command_errors(lab_checkpoint, capsys):
    from andrea.cli import main

    assert main(["serve", "--checkpoint", str(lab_checkpoint), "--host", "0.0.0.0", "--port", "0"]) == 2
    assert "give an API key with --api-key" in capsys.readouterr().err
    assert main(["serve", "--checkpoint", str(lab_checkpoint), "--max-batch", "0"]) == 2
    assert "argument --max-batch: must be an integer from 1 to 256," in capsys.readouterr().err
    assert main(["serve", "--checkpoint", str(lab_checkpoint), "--port", "70000"]) == 2
    assert "argument --port: must be an integer from 0 to 65,535," in capsys.readouterr().err
    assert main(["serve", "--checkpoint", str(lab_checkpoint), "--api-key", ""]) == 2
    assert "--api-key must be printable" in capsys.readouterr().err
    assert main(["serve", "--checkpoint", str(lab_checkpoint), "--threads", "0"]) == 2
    assert "argument --threads: must be an integer from 1 to 256," in capsys.readouterr().err
    assert main(["serve", "--checkpoint", str(lab_checkpoint), "--drain-seconds", "nan"]) == 2
    assert "argument --drain-seconds: must be a number in [0, 3600]" in capsys.readouterr().err
    assert main(["serve", "--checkpoint", str(lab_checkpoint), "--max-queue", "-1"]) == 2
    assert "argument --max-queue: must be an integer from 0 to 4,096," in capsys.readouterr().err


@pytest.mark.parametrize("host", ["127.0.0.2", "::1", "localhost", "::ffff:127.0.0.1"])
def test_every_loopback_address_answers_only_loopback_hosts(lab_checkpoint, host):
    """A page elsewhere that points a DNS name at a loopback address is refused on any of them,
    ::ffff:127.0.0.1 too (loopback, though Python 3.11's ipaddress does not say so): with no key."""
    from andrea.web.api import Served, ServeServer

    g = load_generator(lab_checkpoint)
    try:
        server = ServeServer(Served(g.model, g.tokenizer, "lab"), host, 0, max_batch=2)
    except AndreaError as e:  # no IPv6 loopback on this machine
        pytest.skip(str(e))
    url = server.start()
    try:
        ask = {"prompt": "the", "max_tokens": 3}
        assert server.loopback
        for name, status in (("evil.example", 400), ("evil.example:80", 400), ("localhost.evil.example", 400),
                             ("127.0.0.1.evil.example", 400), ("0x7f.0.0.1", 400), ("127.1", 400),
                             ("", 400), ("127.0.0.1:x", 400), ("localhost", 200), ("[::1]:9", 200),
                             ("127.0.0.1", 200), (f"[{host}]" if ":" in host else host, 200)):
            r = httpx.post(f"{url}v1/completions", json=ask, headers={"host": name}, timeout=30)
            assert r.status_code == status, (name, r.text)
        r = httpx.post(f"{url}v1/completions", json={**ask, "seed": 2**64 - 1}, timeout=30)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] <= 3
    finally:
        server.stop()


def test_a_request_not_streamed_whose_client_hangs_up_frees_its_slot(server):
    import socket

    body = json.dumps({"prompt": "the", "max_tokens": 4096, "temperature": 0}).encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Authorization: Bearer " + KEY.encode() + b"\r\nContent-Length: " + str(len(body)).encode()
                     + b"\r\n\r\n" + body)
        deadline = time.monotonic() + 30
        while _health(server)["decoding"] == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _health(server)["decoding"] == 1
    deadline = time.monotonic() + 30
    while _health(server)["decoding"] and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _health(server)["decoding"] == 0


SLOW_LOAD = """
import sys, time
import andrea.decoding.generate
from andrea.cli import main

real = andrea.decoding.generate.load

def slow_load(*args):  # the real load, after a pause in which the signal arrives
    print("loading", flush=True)
    time.sleep(30)
    return real(*args)

andrea.decoding.generate.load = slow_load
sys.exit(main(["serve", "--checkpoint", sys.argv[1], "--port", "0"]))
"""


def test_sigterm_while_loading_ends_at_once_with_exit_0(lab_checkpoint):
    proc = subprocess.Popen([sys.executable, "-c", SLOW_LOAD, str(lab_checkpoint)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=Server.ENV)
    assert proc.stdout.readline() == "loading\n"
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0 and "andrea serve: stopped." in out and "Traceback" not in err


def test_no_request_opens_a_file(lab_checkpoint, monkeypatch):
    import builtins

    from andrea.web.api import Served, ServeServer

    g = load_generator(lab_checkpoint)
    server = ServeServer(Served(g.model, g.tokenizer, "lab"), "127.0.0.1", 0, max_batch=2)
    url = server.start()
    opened = []
    real_open = builtins.open

    def spy(file, *args, **kwargs):
        opened.append(str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", spy)
    monkeypatch.setattr(os, "open", lambda *a, **k: opened.append(str(a[0])) or pytest.fail("os.open"))
    try:
        with httpx.Client(base_url=url, timeout=30) as h:
            for path, body in (("v1/completions", {"prompt": "/etc/passwd", "max_tokens": 3}),
                               ("v1/completions", {"prompt": "~/.ssh/id_rsa", "stop": "../x", "max_tokens": 3}),
                               ("v1/chat/completions", {"messages": [{"role": "system", "content": "/etc/shadow"},
                                                                     {"role": "user", "content": "file:///etc"}]}),
                               ("v1/completions", {"prompt": "x", "model": "../../etc/passwd"})):
                assert h.post(path, json=body).status_code in (200, 404)
            assert h.get("v1/models/..%2f..%2fetc%2fpasswd").status_code == 404
            assert h.get("health").status_code == 200
    finally:
        monkeypatch.undo()
        server.stop()
    assert opened == []


def test_a_run_folder_whose_name_is_not_utf8_names_the_model_in_replies_that_can_be_written(tmp_path):
    import os

    from andrea.web.api import model_id

    folder = tmp_path / os.fsdecode(b"run-\xff\xfe")
    folder.mkdir()
    assert model_id(folder) == "run-\ufffd\ufffd" and model_id(folder / "best.safetensors") == "run-\ufffd\ufffd"
    json.dumps({"model": model_id(folder)}, ensure_ascii=False).encode("utf-8")  # a surrogate would raise here
    assert model_id(tmp_path / "plain.safetensors") == "plain"
