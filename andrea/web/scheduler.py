"""The scheduler of `andrea serve`: one thread decoding every request together.

One thread runs an `andrea.decoding.batching.BatchDecoder`: requests (`Job`s) wait in a queue of at most
`max_queue`, join a free slot of `max_batch` between steps, and leave when they end or their client
hangs up. Each step admits what waits, drops the cancelled, ends what is overdue when stopping,
samples one token for every slot and hands each job its text (`Reply`: whole UTF-8 characters, no
stop string ever sent) on its event loop. Greedy requests (temperature 0) give the tokens of
`andrea generate --greedy` alone; a seeded request gives the same tokens alone or among others.

Sharing: a job carries its client's address. A free slot goes to the waiting job whose client
decodes the fewest replies (the earliest among equals), and when the queue is full a newcomer
takes the place of the newest waiting job of a client that holds more than half of the slots and
queue places together (that job is answered 429): one client alone may use every place, but not
keep another out.

Stopping: `stop(seconds)` takes no new jobs (503) and ends those still open when the seconds pass
(a stream with an error event); `on_drained` is called once nothing is left.
"""

from __future__ import annotations

import asyncio
import codecs
import collections
import threading
import time

import torch

from andrea.config import BOS
from andrea.decoding.batching import BatchDecoder
from andrea.errors import AndreaError
from andrea.web.http import RequestError, logger

log = logger("andrea serve")


# ---------------------------------------------------------------- one request in flight


class Reply:
    """The text of a reply as tokens arrive: whole UTF-8 characters only, and never a piece that
    might begin a stop string until the next token shows it does not (so no stop string is sent)."""

    def __init__(self, tokenizer, stops: list[str], chat: bool = False):
        self.tokenizer, self.stops = tokenizer, stops
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.held = ""
        self.space = chat  # a chat reply's first space is the turn format's, after `<` (as in `andrea chat`)

    def _cut(self, text: str, final: bool) -> tuple[str, bool]:
        found = [i for i in (text.find(s) for s in self.stops) if i >= 0]
        if found:
            self.held = ""
            return text[: min(found)], True
        keep = 0
        if not final:
            for s in self.stops:
                for j in range(min(len(s) - 1, len(text)), keep, -1):
                    if text.endswith(s[:j]):
                        keep = j
                        break
        self.held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep], False

    def add(self, token: int) -> tuple[str, bool]:
        """(text that may be sent now, whether a stop string was reached)."""
        text = self.decoder.decode(self.tokenizer.token_bytes(token))
        if self.space and text:
            text, self.space = text.removeprefix(" "), False
        return self._cut(self.held + text, False)

    def finish(self) -> tuple[str, bool]:
        """What is left to send when the reply ends (at BOS or its length), and whether the last
        of it completes a stop string after all."""
        return self._cut(self.held + self.decoder.decode(b"", final=True), True)


class Job:
    """One request: its prompt and settings, and the queue on the event loop its events go to."""

    def __init__(self, ids: list[int], settings: dict, stops: list[str], tokenizer, loop, client: str | None = None,
                 chat: bool = False):
        self.ids, self.settings, self.client = ids, settings, client
        self.max_tokens = settings["max_tokens"]
        self.reply = Reply(tokenizer, stops, chat)
        self.loop = loop
        self.events: asyncio.Queue = asyncio.Queue()
        self.cancelled = False  # set by the event loop: the client went away
        self.done = False  # set by the decoding thread once the last event is out
        self.tokens = 0
        self.token_ids: list[int] = []  # the reply's tokens (a stop string's token included; BOS never)
        self.seq = None  # its place in the batch, while it has one

    @property
    def usage(self) -> dict:
        n = len(self.ids)
        return {"prompt_tokens": n, "completion_tokens": self.tokens, "total_tokens": n + self.tokens}


# ---------------------------------------------------------------- the decoding thread


class Scheduler:
    """The thread that decodes every job: a queue of at most max_queue jobs waiting for one of
    max_batch slots, one step at a time (see the module's text); `layout_threads` is the
    BatchDecoder's."""

    def __init__(self, model, max_batch: int, max_queue: int, layout_threads: int | None = None):
        self.decoder = BatchDecoder(model, max_batch, layout_threads)
        self.max_batch, self.max_queue = max_batch, max_queue
        self.waiting: collections.deque[Job] = collections.deque()
        self.cond = threading.Condition()
        self.deadline: float | None = None  # set when stopping: open replies end then
        self.closed = False
        self.on_drained = None  # called (from this thread) once stopping and nothing is left
        self.steps = 0
        self.thread = threading.Thread(target=self._run, name="andrea-decode", daemon=True)

    def start(self) -> None:
        self.thread.start()

    @property
    def stopping(self) -> bool:
        return self.deadline is not None

    def counts(self) -> dict:
        return {"decoding": len(self.decoder.active), "waiting": len(self.waiting), "max_batch": self.max_batch,
                "max_queue": self.max_queue}

    def submit(self, job: Job) -> None:
        with self.cond:
            if self.stopping or self.closed:
                raise RequestError("the server is shutting down; it takes no new requests.", 503, code="shutting_down")
            if len(self.waiting) >= self.decoder.free + self.max_queue:
                hog, held = self._over_share(job.client)
                if hog is None:
                    raise RequestError(f"the server is busy: {self.max_batch} replies are being decoded and "
                                       f"{len(self.waiting)} wait, the most it queues; try again shortly.", 429,
                                       code="queue_full")
                self.waiting.remove(hog)
                hog.done = True
                self._send([(hog, ("error", RequestError(
                    f"the server is busy, and this client held {held} of its {self.max_batch + self.max_queue} places, "
                    f"more than its share of {self.share}; another client's request took this one's place.", 429,
                    code="queue_full")))])
            self.waiting.append(job)
            self.cond.notify()

    @property
    def share(self) -> int:
        """The places (slots and queue) one client may hold while another's request waits for one."""
        return max(1, (self.max_batch + self.max_queue) // 2)

    def held(self) -> collections.Counter:
        """How many places (decoding or waiting) each client holds."""
        held = collections.Counter(seq.owner.client for seq in list(self.decoder.active))
        held.update(job.client for job in self.waiting if not job.cancelled)
        return held

    def _over_share(self, client) -> tuple[Job | None, int]:
        """(the newest waiting job of the client holding the most places, what it holds), when that
        client is another than `client`, holds more than its share, and `client` holds less; else None."""
        held = self.held()
        if not held:
            return None, 0
        top, n = held.most_common(1)[0]
        if top == client or n <= self.share or held[client] >= self.share:
            return None, 0
        return next((j for j in reversed(self.waiting) if j.client == top and not j.cancelled), None), n

    def cancel(self, job: Job) -> None:
        """The client is gone: its slot (or its place in the queue) is freed at the next step."""
        job.cancelled = True
        with self.cond:
            self.cond.notify()

    def stop(self, seconds: float) -> None:
        """Take no new jobs; end those still open in `seconds` (sooner, if a stop was already asked)."""
        with self.cond:
            at = time.monotonic() + max(0.0, seconds)
            self.deadline = at if self.deadline is None else min(self.deadline, at)
            self.cond.notify()

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify()
        self.thread.join(timeout=30)

    # ---- the loop

    def _send(self, batch: list) -> None:
        """Hand (job, event) pairs to their event loops, one call per loop."""
        by_loop: dict = {}
        for job, event in batch:
            by_loop.setdefault(job.loop, []).append((job, event))
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(_deliver, items)
            except RuntimeError:  # the loop has closed: nobody is listening
                pass

    def _end(self, job: Job, out: list, event: tuple) -> None:
        if job.done:
            return
        job.done = True
        if job.seq is not None:
            self.decoder.leave(job.seq)
            job.seq = None
        out.append((job, event))

    def _admit(self, out: list) -> None:
        while self.waiting and self.decoder.free:
            with self.cond:
                if not self.waiting:
                    return
                # the client decoding the fewest replies goes first; among equals, the earliest
                decoding = collections.Counter(seq.owner.client for seq in self.decoder.active)
                job = min(self.waiting, key=lambda j: decoding[j.client])
                self.waiting.remove(job)
            job.seq = None
            if job.cancelled:
                job.done = True
                continue
            s = job.settings
            try:
                job.seq = self.decoder.join(job.ids, s["temperature"], s["top_k"], s["top_p"], s["seed"], owner=job)
            except AndreaError as e:
                self._end(job, out, ("error", RequestError(str(e))))
            except Exception as e:  # a fault of the server: this reply ends, the others go on
                log(f"starting a reply failed: {type(e).__name__}: {e}")
                self._end(job, out, ("error", RequestError(f"starting this reply failed ({type(e).__name__}); "
                                                                "the server's log says more.", 500)))

    def _step(self) -> list:
        """One step: admit, drop the cancelled, end what is overdue, sample, hand out, feed."""
        out: list = []
        with self.cond:  # (submit appends from the event loop's thread)
            if any(job.cancelled for job in self.waiting):
                self.waiting = collections.deque(job for job in self.waiting if not job.cancelled)
        self._admit(out)
        late = self.deadline is not None and time.monotonic() >= self.deadline
        for seq in list(self.decoder.active):
            job = seq.owner
            if job.cancelled:
                self._end(job, out, ("gone",))
            elif late:
                self._end(job, out, ("error", RequestError(f"the server stopped before this reply was finished "
                                                                f"({job.tokens} tokens were made).", 503,
                                                                code="shutting_down")))
        if late:
            with self.cond:
                waiting, self.waiting = list(self.waiting), collections.deque()
            for job in waiting:
                job.seq = None
                self._end(job, out, ("error", RequestError("the server stopped before this request was started.", 503,
                                                           code="shutting_down")))
        go = []
        for seq, tok in self.decoder.pick():
            job = seq.owner
            if tok == BOS:  # not a token of the reply: what it held back goes out
                self._finish(job, out, job.reply.finish()[0], "stop")
                continue
            job.tokens += 1
            job.token_ids.append(tok)
            text, stopped = job.reply.add(tok)
            if stopped:
                self._finish(job, out, text, "stop")
            elif job.tokens >= job.max_tokens:
                rest, stopped = job.reply.finish()
                self._finish(job, out, text + rest, "stop" if stopped else "length")
            else:
                if text:
                    out.append((job, ("text", text)))
                go.append((seq, tok))
        self._send(out)
        self.decoder.feed(go)
        self.steps += 1
        return out

    def _finish(self, job: Job, out: list, text: str, reason: str) -> None:
        if text:
            out.append((job, ("text", text)))
        self._end(job, out, ("end", reason))

    def _fail_all(self, error: Exception) -> None:
        log(f"decoding failed: {type(error).__name__}: {error}")
        out: list = []
        for seq in list(self.decoder.active):
            self._end(seq.owner, out, ("error", RequestError(f"decoding failed ({type(error).__name__}); "
                                                                  "the server's log says more.", 500)))
        for seq in list(self.decoder.active):  # anything _end could not free
            self.decoder.leave(seq)
        self._send(out)

    def _run(self) -> None:
        torch.get_num_threads()  # this thread takes torch's count now, not at its first parallel product
        while True:
            with self.cond:
                while not (self.waiting or self.decoder.active or self.closed):
                    if self.stopping and self.on_drained is not None:
                        drained, self.on_drained = self.on_drained, None
                        drained()
                    self.cond.wait(timeout=0.5 if self.stopping else None)
                if self.closed:
                    return
            try:
                self._step()
            except Exception as e:  # a fault of the server, not of a request: one line, every reply ended
                self._fail_all(e)


def _deliver(items) -> None:
    for job, event in items:
        job.events.put_nowait(event)
