"""`andrea.web.scheduler`: the thread that decodes every request of `andrea serve` together, and
the text of one reply as its tokens arrive, without HTTP."""

from __future__ import annotations

import asyncio

import pytest
import torch

from andrea.decoding.generate import load as load_generator
from andrea.web.http import RequestError
from andrea.web.scheduler import Job, Reply, Scheduler


def greedy(max_tokens: int) -> dict:
    return {"max_tokens": max_tokens, "temperature": 0.0, "top_k": None, "top_p": None, "seed": None}


async def _decode(scheduler: Scheduler, tok, prompts: list[str], max_tokens: int) -> list[tuple[str, str]]:
    """(text, finish reason) of each prompt, all submitted at once."""
    loop = asyncio.get_running_loop()
    jobs = [Job(tok.encode(p, bos=True), greedy(max_tokens), [], tok, loop) for p in prompts]
    for job in jobs:
        scheduler.submit(job)
    out = []
    for job in jobs:
        text = []
        while (event := await asyncio.wait_for(job.events.get(), 60))[0] == "text":
            text.append(event[1])
        assert event[0] == "end", event
        out.append(("".join(text), event[1]))
    return out


def test_jobs_decoded_together_are_each_what_generate_gives_alone(lab_checkpoint):
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        g = load_generator(lab_checkpoint)
        scheduler = Scheduler(g.model, max_batch=2, max_queue=4)  # 3 prompts: one waits for a slot
        scheduler.start()
        prompts = ["the", "the cat sat on a mat", "kings and queens"]
        try:
            got = asyncio.run(_decode(scheduler, g.tokenizer, prompts, 6))
        finally:
            scheduler.close()
        for prompt, (text, reason) in zip(prompts, got):
            expected = g.generate(prompt, 6, greedy=True)
            assert text == expected and reason in ("stop", "length"), prompt
        assert scheduler.counts()["decoding"] == 0 and scheduler.counts()["waiting"] == 0
    finally:
        torch.set_num_threads(before)


def test_a_full_queue_is_429_and_a_stopping_scheduler_503(lab_checkpoint):
    g = load_generator(lab_checkpoint)
    scheduler = Scheduler(g.model, max_batch=1, max_queue=0)  # not started: nothing leaves the queue
    loop = asyncio.new_event_loop()
    try:
        def job():
            return Job([1, 2], greedy(2), [], g.tokenizer, loop)

        scheduler.submit(job())
        with pytest.raises(RequestError, match="the server is busy") as e:
            scheduler.submit(job())
        assert (e.value.status, e.value.code) == (429, "queue_full")
        scheduler.stop(0)
        with pytest.raises(RequestError, match="shutting down") as e:
            scheduler.submit(job())
        assert (e.value.status, e.value.code) == (503, "shutting_down") and scheduler.stopping
    finally:
        loop.close()


@pytest.mark.hostile
def test_one_client_may_use_every_place_but_not_keep_another_out(lab_checkpoint):
    """A fills both slots and the queue alone; B's request then takes the place of A's newest
    waiting one (answered 429), and the next free slot goes to B, who decodes nothing, before A's
    earlier waiting job. A cannot push anyone out, nor B once it holds its share."""
    g = load_generator(lab_checkpoint)
    scheduler = Scheduler(g.model, max_batch=2, max_queue=2)  # share: 2 places; not started
    loop = asyncio.new_event_loop()
    try:
        def job(client):
            return Job([1, 2], greedy(2), [], g.tokenizer, loop, client)

        a = [job("A") for _ in range(4)]
        for j in a:
            scheduler.submit(j)  # one client alone may use every place
        scheduler._admit([])
        assert a[0].seq is not None and a[1].seq is not None and list(scheduler.waiting) == a[2:]
        assert scheduler.held() == {"A": 4}
        with pytest.raises(RequestError, match="the server is busy"):
            scheduler.submit(job("A"))
        b = job("B")
        scheduler.submit(b)
        assert a[3].done and list(scheduler.waiting) == [a[2], b]
        loop.run_until_complete(asyncio.sleep(0))  # the event is delivered on the loop
        kind, error = a[3].events.get_nowait()
        assert kind == "error" and (error.status, error.code) == (429, "queue_full") and "held 4" in error.message
        b2 = job("B")
        scheduler.submit(b2)  # A still holds 3, over its share: its last waiting job gives way too
        assert a[2].done and list(scheduler.waiting) == [b, b2] and scheduler.held() == {"A": 2, "B": 2}
        with pytest.raises(RequestError, match="the server is busy"):  # B holds its share: no one gives way
            scheduler.submit(job("B"))
        scheduler.decoder.leave(a[0].seq)  # a slot frees: B decodes nothing, A one reply
        a[0].seq = None
        a.append(job("A"))
        scheduler.waiting.appendleft(a[-1])  # even an earlier job of A's waits behind B's
        scheduler._admit([])
        assert b.seq is not None and a[-1].seq is None and list(scheduler.waiting) == [a[-1], b2]
    finally:
        loop.close()


def test_a_reply_never_sends_a_stop_string_nor_loses_what_it_held_back(lab_checkpoint):
    tok = load_generator(lab_checkpoint).tokenizer
    ids = tok.encode("the cat sat on a mat", bos=False)

    def run(stops, upto=None):
        reply, sent = Reply(tok, stops), []
        for t in ids[:upto]:
            text, stopped = reply.add(t)
            sent.append(text)
            if stopped:
                return "".join(sent), True
        text, stopped = reply.finish()
        return "".join(sent) + text, stopped

    assert run([]) == ("the cat sat on a mat", False)
    assert run(["sat", "zz"]) == ("the cat ", True)
    assert run(["mat"]) == ("the cat sat on a ", True)
    assert run(["at on a m"]) == ("the cat s", True)
    assert run(["mat and"]) == ("the cat sat on a mat", False)  # held back to the end, then sent
    n = len(tok.encode("the cat sat on", bos=False))
    assert run(["on a"], upto=n) == ("the cat sat on", False)  # the reply ended (BOS, length) inside a prefix
    reply = Reply(tok, ["x"])
    assert reply.add(tok.encode("é", bos=False)[0])[0] in ("", "é")  # whole characters only
