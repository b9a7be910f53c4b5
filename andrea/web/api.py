"""`andrea serve`: a model behind the OpenAI HTTP API, its requests decoded together.

    GET  /health                  {"status": "ok" | "stopping", the batch and queue in use}
    GET  /v1/models               the one model served (its id: the run folder's or file's name)
    GET  /v1/models/{id}
    POST /v1/completions          {"prompt", "max_tokens", "temperature", "top_p", "top_k", "stop", "seed", "stream"}
    POST /v1/chat/completions     {"messages", the same sampling fields}

The fields, answers, stream chunks (server-sent events ending in `data: [DONE]`), `usage` and
`finish_reason` (`stop` at a stop string, the end of a chat reply or BOS; `length` at max_tokens)
are OpenAI's. `top_k` is an extension. A chat is written in ANDREA's turn format, as `andrea chat`
writes it (`andrea.generate.chat_prompt_ids`): BOS, the system messages as lines of text, then
`> person\\n< model\\n` per turn, then `> last line\\n< `; the reply ends at the first newline, and
the oldest turns are dropped when the whole would not fit the context with room for the reply.

Decoding. One thread runs an `andrea.batching.BatchDecoder`: requests wait in a queue of at most
`max_queue`, join a free slot of `max_batch` between steps, and leave when they end or their client
hangs up. Greedy requests (temperature 0) give the tokens of `andrea generate --greedy` alone; a
seeded request gives the same tokens alone or among others.

Bounds and errors. A body over MAX_BODY bytes (413), JSON that does not parse (also a 5,000-digit
number or nesting too deep for Python's parser), a field unknown or of the wrong type or range, a
prompt over the context (400); a missing or wrong API key (401); an unknown model or path (404);
a full queue (429); a server stopping (503): each is one JSON object {"error": {"message", "type",
"param", "code"}} and no request prints a traceback. On a loopback address only requests whose
Host header names a loopback host are answered (so a web page cannot reach the server through a
DNS name that points at 127.0.0.1); a POST must say its body is JSON, so a page elsewhere cannot
send one without the browser asking first.

Stopping. SIGTERM or Ctrl-C: new requests get 503, those queued and decoding go on until they end
or `drain_seconds` pass; then every reply still open ends (a stream with an error event and
`[DONE]`, a reply not streamed with 503), and the server exits. A second signal ends them at once.
"""

from __future__ import annotations

import asyncio
import codecs
import collections
import hmac
import ipaddress
import json
import math
import sys
import threading
import time
import uuid
from pathlib import Path

from andrea.config import BOS, MAX_SEED, is_int, is_real
from andrea.errors import AndreaError, longer_than_context

MAX_BODY = 262_144  # bytes of a request body
BODY_SECONDS = 30.0  # a request body must arrive within this
MAX_TOKENS = 4_096  # the most tokens one reply may ask for
MAX_MESSAGES = 256
MAX_STOPS, MAX_STOP_CHARS = 4, 100
MIN_TEMPERATURE = 1e-5  # a smaller positive temperature is greedy (its division would overflow)
MIN_TOP_P = 1e-6  # a smaller top_p keeps the most likely token alone, as this does for V < 10^6
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


class ApiError(Exception):
    """An answer in OpenAI's error shape: status, one sentence, its type, the field, a code."""

    TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
             405: "invalid_request_error", 413: "invalid_request_error", 429: "rate_limit_error",
             500: "server_error", 503: "service_unavailable"}

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.TYPES.get(self.status, "invalid_request_error"),
                          "param": self.param, "code": self.code}}


def log(message: str) -> None:
    print(f"andrea serve: {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- reading a request


def parse_json(raw: bytes) -> dict:
    """A request body as a JSON object, or a 400 that says why not (never Python's own error):
    andrea's one JSON reader, `andrea.files.parse_json`, with its limits on depth and digits."""
    from andrea.files import parse_json as read

    try:
        body = read(raw, "the request body")
    except AndreaError as e:
        raise ApiError(400, str(e)) from None
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object.")
    return body


def _text(value, name: str, limit: int | None = None) -> str:
    if not isinstance(value, str) or value == "":
        raise ApiError(400, f"{name} must be a non-empty string.", name)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ApiError(400, f"{name} is not valid Unicode (it holds a lone surrogate).", name) from None
    if limit is not None and len(value) > limit:
        raise ApiError(400, f"{name} is {len(value):,} characters; at most {limit:,} are taken.", name)
    return value


class Fields:
    """The fields of one request body, each read with its type and range checked."""

    # fields clients send with OpenAI's defaults; any other value is refused, naming the field
    DEFAULTS = {"n": (1,), "echo": (False,), "logprobs": (None, False), "best_of": (None, 1), "suffix": (None,),
                "presence_penalty": (0, 0.0), "frequency_penalty": (0, 0.0), "logit_bias": (None, {}),
                "top_logprobs": (None, 0), "user": None}

    def __init__(self, body: dict, allowed: set[str]):
        unknown = sorted(set(body) - allowed - set(self.DEFAULTS))
        if unknown:
            raise ApiError(400, f"unknown field {unknown[0]!r}; this endpoint takes {', '.join(sorted(allowed))}.",
                           unknown[0])
        for name, ok in self.DEFAULTS.items():
            if name in body and ok is not None and not any(body[name] == v and type(body[name]) is type(v) for v in ok):
                raise ApiError(400, f"{name} is not supported here; leave it out or give {json.dumps(ok[-1])}.", name)
        if "user" in body and not isinstance(body["user"], str):
            raise ApiError(400, "user must be a string.", "user")
        self.body = body

    def integer(self, name: str, default, lo: int, hi: int):
        v = self.body.get(name, default)
        if v is None and default is None:
            return None
        if not is_int(v) or not lo <= v <= hi:
            raise ApiError(400, f"{name} must be an integer from {lo:,} to {hi:,}, got {json.dumps(v)[:40]}.", name)
        return v

    def number(self, name: str, default, lo: float, hi: float, lo_open: bool = False):
        v = self.body.get(name, default)
        if v is None:
            return default
        ok = is_real(v) and math.isfinite(v) and v <= hi and (v > lo if lo_open else v >= lo)
        if not ok:
            span = f"({lo:g}, {hi:g}]" if lo_open else f"[{lo:g}, {hi:g}]"
            raise ApiError(400, f"{name} must be a number in {span}, got {json.dumps(v)[:40]}.", name)
        return float(v)

    def flag(self, name: str) -> bool:
        v = self.body.get(name, False)
        if v is None:
            return False
        if not isinstance(v, bool):
            raise ApiError(400, f"{name} must be true or false, got {json.dumps(v)[:40]}.", name)
        return v

    def stops(self) -> list[str]:
        v = self.body.get("stop")
        if v is None:
            return []
        items = [v] if isinstance(v, str) else v
        if not isinstance(items, list) or not 1 <= len(items) <= MAX_STOPS:
            raise ApiError(400, f"stop must be a string or a list of 1 to {MAX_STOPS} strings.", "stop")
        return [_text(s, "stop", MAX_STOP_CHARS) for s in items]

    def include_usage(self) -> bool:
        v = self.body.get("stream_options")
        if v is None:
            return False
        if not isinstance(v, dict) or set(v) - {"include_usage"} or not isinstance(v.get("include_usage", False), bool):
            raise ApiError(400, 'stream_options must be {"include_usage": true or false}.', "stream_options")
        return v.get("include_usage", False)

    def sampling(self, vocab_size: int, default_tokens: int, names=("max_tokens",)) -> dict:
        """max_tokens (the first of names given), temperature, top_p, top_k and seed, checked."""
        name = next((n for n in names if self.body.get(n) is not None), names[0])
        max_tokens = self.integer(name, default_tokens, 1, MAX_TOKENS)
        temperature = self.number("temperature", 1.0, 0.0, 2.0)
        top_p = self.number("top_p", None, 0.0, 1.0, lo_open=True)
        top_k = self.integer("top_k", None, 1, 2**31 - 1)
        seed = self.integer("seed", None, 0, MAX_SEED)
        return {"max_tokens": max_tokens, "temperature": 0.0 if temperature < MIN_TEMPERATURE else temperature,
                "top_p": None if top_p is None or top_p == 1 else max(top_p, MIN_TOP_P),
                "top_k": None if top_k is None or top_k >= vocab_size else top_k, "seed": seed}


COMPLETION_FIELDS = {"model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "stop", "seed", "stream",
                     "stream_options"}
CHAT_FIELDS = COMPLETION_FIELDS - {"prompt"} | {"messages", "max_completion_tokens"}


def _content(message: dict, i: int) -> str:
    """A message's text: a string, or a list of {"type": "text", "text": ...} parts."""
    name = f"messages[{i}].content"
    c = message.get("content")
    if isinstance(c, list):
        if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in c):
            raise ApiError(400, f"{name} must be a string or a list of text parts.", name)
        c = "".join(p["text"] for p in c)
    if not isinstance(c, str):
        raise ApiError(400, f"{name} must be a string.", name)
    if c:
        _text(c, name)
    return c


def chat_turns(messages) -> tuple[str, list[tuple[str, str]], str]:
    """(preamble, turns, last line) of a messages list: system lines, then user/assistant pairs,
    then the user's last line; newlines inside a turn become spaces, as in `andrea chat`."""
    if not isinstance(messages, list) or not 1 <= len(messages) <= MAX_MESSAGES:
        raise ApiError(400, f"messages must be a list of 1 to {MAX_MESSAGES} messages.", "messages")
    system, talk = [], []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or set(m) - {"role", "content", "name"}:
            raise ApiError(400, f"messages[{i}] must be an object with role and content.", f"messages[{i}]")
        role = m.get("role")
        if role in ("system", "developer"):
            if talk:
                raise ApiError(400, f"messages[{i}]: system messages must come before the conversation.",
                               f"messages[{i}].role")
            system.append(_content(m, i))
        elif role in ("user", "assistant"):
            expected = "user" if len(talk) % 2 == 0 else "assistant"
            if role != expected:
                raise ApiError(400, f"messages[{i}] must be from the {expected}: the conversation alternates user "
                                    f"and assistant, starting with the user.", f"messages[{i}].role")
            talk.append(_content(m, i).replace("\r\n", " ").replace("\n", " "))
        else:
            raise ApiError(400, f"messages[{i}].role must be system, user or assistant, got {json.dumps(role)[:40]}.",
                           f"messages[{i}].role")
    if len(talk) % 2 == 0:
        raise ApiError(400, "the last message must be from the user.", "messages")
    preamble = "".join(s + "\n" for s in system)
    return preamble, list(zip(talk[0:-1:2], talk[1:-1:2])), talk[-1]


# ---------------------------------------------------------------- one request in flight


class Reply:
    """The text of a reply as tokens arrive: whole UTF-8 characters only, and never a piece that
    might begin a stop string until the next token shows it does not (so no stop string is sent)."""

    def __init__(self, tokenizer, stops: list[str]):
        self.tokenizer, self.stops = tokenizer, stops
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.held = ""

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
        return self._cut(self.held + self.decoder.decode(self.tokenizer.token_bytes(token)), False)

    def finish(self) -> tuple[str, bool]:
        """What is left to send when the reply ends (at BOS or its length), and whether the last
        of it completes a stop string after all."""
        return self._cut(self.held + self.decoder.decode(b"", final=True), True)


class Job:
    """One request: its prompt and settings, and the queue on the event loop its events go to."""

    def __init__(self, ids: list[int], settings: dict, stops: list[str], tokenizer, loop):
        self.ids, self.settings = ids, settings
        self.max_tokens = settings["max_tokens"]
        self.reply = Reply(tokenizer, stops)
        self.loop = loop
        self.events: asyncio.Queue = asyncio.Queue()
        self.cancelled = False  # set by the event loop: the client went away
        self.done = False  # set by the decoding thread once the last event is out
        self.tokens = 0
        self.seq = None  # its place in the batch, while it has one

    @property
    def usage(self) -> dict:
        n = len(self.ids)
        return {"prompt_tokens": n, "completion_tokens": self.tokens, "total_tokens": n + self.tokens}


# ---------------------------------------------------------------- the decoding thread


class Engine:
    """The thread that decodes every job: a queue of at most max_queue jobs waiting for one of
    max_batch slots, one step at a time (see the module's text)."""

    def __init__(self, model, max_batch: int, max_queue: int):
        from andrea.batching import BatchDecoder

        self.decoder = BatchDecoder(model, max_batch)
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
                raise ApiError(503, "the server is shutting down; it takes no new requests.", code="shutting_down")
            if len(self.waiting) >= self.decoder.free + self.max_queue:
                raise ApiError(429, f"the server is busy: {self.max_batch} replies are being decoded and "
                                    f"{len(self.waiting)} wait, the most it queues; try again shortly.",
                               code="queue_full")
            self.waiting.append(job)
            self.cond.notify()

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
                job = self.waiting.popleft() if self.waiting else None
            if job is None:
                return
            job.seq = None
            if job.cancelled:
                job.done = True
                continue
            s = job.settings
            try:
                job.seq = self.decoder.join(job.ids, s["temperature"], s["top_k"], s["top_p"], s["seed"], owner=job)
            except AndreaError as e:
                self._end(job, out, ("error", ApiError(400, str(e))))
            except Exception as e:  # a fault of the server: this reply ends, the others go on
                log(f"starting a reply failed: {type(e).__name__}: {e}")
                self._end(job, out, ("error", ApiError(500, f"starting this reply failed ({type(e).__name__}); "
                                                            "the server's log says more.")))

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
                self._end(job, out, ("error", ApiError(503, f"the server stopped before this reply was finished "
                                                            f"({job.tokens} tokens were made).", code="shutting_down")))
        if late:
            with self.cond:
                waiting, self.waiting = list(self.waiting), collections.deque()
            for job in waiting:
                job.seq = None
                self._end(job, out, ("error", ApiError(503, "the server stopped before this request was started.",
                                                       code="shutting_down")))
        go = []
        for seq, tok in self.decoder.pick():
            job = seq.owner
            if tok == BOS:  # not a token of the reply: what it held back goes out
                self._finish(job, out, job.reply.finish()[0], "stop")
                continue
            job.tokens += 1
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
            self._end(seq.owner, out, ("error", ApiError(500, f"decoding failed ({type(error).__name__}); "
                                                              "the server's log says more.")))
        for seq in list(self.decoder.active):  # anything _end could not free
            self.decoder.leave(seq)
        self._send(out)

    def _run(self) -> None:
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


# ---------------------------------------------------------------- the model served


class Served:
    """The model and tokenizer behind the API, its id, and the prompt arithmetic."""

    def __init__(self, model, tokenizer, model_id: str, created: int = 0):
        self.model, self.tokenizer = model.eval(), tokenizer
        self.config = model.config
        self.id, self.created = model_id, created
        self.max_token_bytes = max(len(tokenizer.token_bytes(i)) for i in range(tokenizer.vocab_size))
        self.lock = threading.Lock()  # one encoding at a time (the tokenizer's word cache is shared)

    def encode(self, text: str) -> list[int]:
        with self.lock:
            return self.tokenizer.encode(text, bos=True)

    def check_context(self, ids: list[int], param: str) -> list[int]:
        T = self.config.block_size
        if len(ids) > T:
            raise ApiError(400, longer_than_context(len(ids), T), param, "context_length_exceeded")
        return ids

    def completion_ids(self, prompt) -> list[int]:
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if isinstance(prompt, str):
            return self.check_context(self.encode(_text(prompt, "prompt")), "prompt")
        V = self.config.vocab_size
        if isinstance(prompt, list) and prompt and all(is_int(t) for t in prompt):
            bad = [t for t in prompt if not 0 <= t < V]
            if bad:
                raise ApiError(400, f"token id {str(bad[0])[:40]} in prompt is out of range: ids are 0 to {V - 1}.", "prompt")
            return self.check_context(list(prompt), "prompt")
        raise ApiError(400, "prompt must be a non-empty string (one prompt per request) or a list of token ids.", "prompt")

    def chat_ids(self, messages, max_tokens: int) -> list[int]:
        from andrea.generate import chat_prompt_ids

        preamble, turns, line = chat_turns(messages)
        with self.lock:
            ids, _ = chat_prompt_ids(self.tokenizer, self.config.block_size, max_tokens, turns, line, preamble,
                                     self.max_token_bytes)
        return self.check_context(ids, "messages")


def model_id(path) -> str:
    """A checkpoint's name for the API: its run folder's name, or the file's name without suffix."""
    p = Path(path).resolve()
    if p.is_dir() or p.name in ("best.safetensors", "latest.safetensors"):
        return (p if p.is_dir() else p.parent).name or "andrea"
    return p.stem or "andrea"


# ---------------------------------------------------------------- answers


def _json_bytes(obj) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


class Render:
    """The JSON of one reply, whole or as stream chunks, for completions or chat."""

    def __init__(self, served: Served, chat: bool, usage_in_stream: bool = False):
        self.chat, self.usage_in_stream = chat, usage_in_stream
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.head = {"id": self.id, "object": "chat.completion.chunk" if chat else "text_completion",
                     "created": int(time.time()), "model": served.id}
        self.first = True

    def whole(self, text: str, reason: str, usage: dict) -> dict:
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                      "finish_reason": reason}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}
        return {**self.head, "object": "chat.completion" if self.chat else "text_completion", "choices": [choice],
                "usage": usage}

    def chunk(self, text: str | None, reason: str | None = None) -> bytes:
        if self.chat:
            delta = {} if text is None else {"content": text}
            if self.first:
                delta = {"role": "assistant", **delta}
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": reason}
        self.first = False
        obj = {**self.head, "choices": [choice]}
        if self.usage_in_stream:
            obj["usage"] = None
        return b"data: " + _json_bytes(obj) + b"\n\n"

    def events(self, events: list, job: Job) -> tuple[bytes, bool, bool]:
        """(bytes to send, whether the stream ends with them, whether the client is gone)."""
        out, text = [], []
        for event in events:
            kind = event[0]
            if kind == "gone":
                return b"", True, True
            if kind == "text":
                text.append(event[1])
                continue
            if text:
                out.append(self.chunk("".join(text)))
                text = []
            if kind == "end":
                out.append(self.chunk(None, event[1]))
                if self.usage_in_stream:
                    out.append(b"data: " + _json_bytes({**self.head, "choices": [], "usage": job.usage}) + b"\n\n")
            else:  # an error after the stream began: OpenAI's error event
                out.append(b"data: " + _json_bytes(event[1].body()) + b"\n\n")
            out.append(b"data: [DONE]\n\n")
            return b"".join(out), True, False
        if text:
            out.append(self.chunk("".join(text)))
        return b"".join(out), False, False


async def _watch(receive, job: Job, engine: Engine) -> None:
    """Wait for the client to hang up; then free its slot and wake whoever waits for the job."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            engine.cancel(job)
            job.events.put_nowait(("gone",))
            return


class EventStream:
    """An ASGI response streaming one job as server-sent events; a client that hangs up frees
    the job's slot at once (not only when the next token would be sent)."""

    def __init__(self, job: Job, engine: Engine, render: Render):
        self.job, self.engine, self.render = job, engine, render

    async def __call__(self, scope, receive, send) -> None:
        job = self.job
        headers = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache"),
                   (b"x-accel-buffering", b"no")]
        watcher = asyncio.ensure_future(_watch(receive, job, self.engine))
        try:
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            while True:
                events = [await job.events.get()]
                while not job.events.empty():
                    events.append(job.events.get_nowait())
                body, last, gone = self.render.events(events, job)
                if gone:
                    return
                await send({"type": "http.response.body", "body": body, "more_body": not last})
                if last:
                    return
        except OSError:  # the connection broke while sending
            return
        finally:
            watcher.cancel()
            if not job.done:
                self.engine.cancel(job)


async def collect(job: Job, engine: Engine, render: Render, receive):
    """The whole reply to a request not streamed, or its error; None when the client has gone."""
    watcher = asyncio.ensure_future(_watch(receive, job, engine))
    text = []
    try:
        while True:
            event = await job.events.get()
            if event[0] == "text":
                text.append(event[1])
            elif event[0] == "end":
                return render.whole("".join(text), event[1], job.usage)
            elif event[0] == "error":
                raise event[1]
            else:
                return None
    finally:
        watcher.cancel()
        if not job.done:
            engine.cancel(job)


# ---------------------------------------------------------------- the app


def _host_name(header: str) -> str | None:
    """The host in a Host header (without its port), lowercased; None when it is malformed."""
    h = header.strip().lower()
    if h.startswith("["):
        end = h.find("]")
        name, rest = (h[1:end], h[end + 1 :]) if end > 0 else (None, "")
    elif h.count(":") == 1:
        name, rest = h.split(":")[0], ":" + h.split(":")[1]
    else:
        name, rest = h, ""
    if rest and not (rest.startswith(":") and rest[1:].isdigit()):
        return None
    return name or None


class Guard:
    """The outermost layer: the Host check on loopback, and no exception ever reaches uvicorn
    (which would print its traceback): a fault is one line in the log and a 500."""

    def __init__(self, app, allowed_hosts: set[str] | None):
        self.app, self.allowed_hosts = app, allowed_hosts

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            return await self.app(scope, receive, send)
        if scope["type"] != "http":
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1008})
            return
        if self.allowed_hosts is not None:
            host = dict(scope.get("headers") or []).get(b"host", b"").decode("latin-1")
            if _host_name(host) not in self.allowed_hosts:
                return await _send_error(send, ApiError(400, "this server answers only requests addressed to a loopback "
                                                             "host (localhost, 127.0.0.1, [::1]).", code="invalid_host"))
        started = False

        async def watched(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, watched)
        except Exception as e:  # Starlette has answered 500 where it could; keep the log to one line
            log(f"request to {scope.get('path', '?')} failed: {type(e).__name__}: {e}")
            if not started:
                await _send_error(send, ApiError(500, "the server failed on this request; its log says more."))


async def _send_error(send, error: ApiError) -> None:
    body = _json_bytes(error.body())
    await send({"type": "http.response.start", "status": error.status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


async def read_body(request) -> dict:
    """The JSON object a POST carries: declared as JSON, at most MAX_BODY bytes, in time."""
    from starlette.requests import ClientDisconnect

    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/json":
        raise ApiError(400, "send the body as JSON, with the header Content-Type: application/json.")
    declared = request.headers.get("content-length")
    too_big = ApiError(413, f"the request body is larger than {MAX_BODY:,} bytes.", code="request_too_large")
    if declared is not None and (not declared.isdigit() or int(declared) > MAX_BODY):
        raise too_big
    raw = bytearray()

    async def read():
        async for chunk in request.stream():
            raw.extend(chunk)
            if len(raw) > MAX_BODY:
                raise too_big

    try:
        await asyncio.wait_for(read(), BODY_SECONDS)
    except asyncio.TimeoutError:
        raise ApiError(400, f"the request body did not arrive within {BODY_SECONDS:g} s.") from None
    except ClientDisconnect:
        raise ApiError(400, "the client hung up before its request body arrived.") from None
    return parse_json(bytes(raw))


def check_key(request, key: bytes | None) -> None:
    """A 401 unless the request sends `Authorization: Bearer KEY` (when the server has a key)."""
    if key is None:
        return
    given = request.headers.get("authorization", "")
    if not given.lower().startswith("bearer ") or not given[7:].strip():
        raise ApiError(401, "this server needs an API key: send the header Authorization: Bearer KEY.",
                       code="invalid_api_key")
    if not hmac.compare_digest(given[7:].strip().encode("utf-8", "replace"), key):
        raise ApiError(401, "the API key is wrong.", code="invalid_api_key")


def check_model(served: Served, name) -> None:
    if name is not None and name != served.id:
        raise ApiError(404, f"there is no model {json.dumps(name)[:80]} here; this server serves {served.id!r} "
                            f"(GET /v1/models).", "model", "model_not_found")


async def reply(request, served: Served, engine: Engine, chat: bool):
    """A completion or chat request: checked, queued, then streamed or answered whole."""
    from starlette.concurrency import run_in_threadpool
    from starlette.responses import JSONResponse, Response

    body = await read_body(request)
    f = Fields(body, CHAT_FIELDS if chat else COMPLETION_FIELDS)
    check_model(served, body.get("model"))
    names = ("max_completion_tokens", "max_tokens") if chat else ("max_tokens",)
    settings = f.sampling(served.config.vocab_size, 256 if chat else 16, names)
    stops, stream, usage = f.stops(), f.flag("stream"), f.include_usage()
    if chat:
        if "messages" not in body:
            raise ApiError(400, "messages is required.", "messages")
        ids = await run_in_threadpool(served.chat_ids, body["messages"], settings["max_tokens"])
        stops = ["\n"] + stops  # a reply is one line, as in `andrea chat`
    else:
        if "prompt" not in body:
            raise ApiError(400, "prompt is required.", "prompt")
        ids = await run_in_threadpool(served.completion_ids, body["prompt"])
    job = Job(ids, settings, stops, served.tokenizer, asyncio.get_running_loop())
    engine.submit(job)
    render = Render(served, chat, stream and usage)
    if stream:
        return EventStream(job, engine, render)
    result = await collect(job, engine, render, request.receive)
    return JSONResponse(result) if result is not None else Response(status_code=204)


def create_app(served: Served, engine: Engine, api_key: str | None = None, allowed_hosts: set[str] | None = None):
    """The ASGI app: Starlette routes inside a Guard (see the module's text)."""
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    key = api_key.encode("utf-8") if api_key else None

    def error(e: ApiError) -> JSONResponse:
        return JSONResponse(e.body(), status_code=e.status)

    def model_card() -> dict:
        return {"id": served.id, "object": "model", "created": served.created, "owned_by": "andrea",
                "context_length": served.config.block_size}

    def api(fn, auth: bool = True):
        async def endpoint(request):
            try:
                if auth:
                    check_key(request, key)
                return await fn(request)
            except ApiError as e:
                return error(e)
            except AndreaError as e:
                return error(ApiError(400, str(e)))

        return endpoint

    async def completions(request):
        return await reply(request, served, engine, chat=False)

    async def chat_completions(request):
        return await reply(request, served, engine, chat=True)

    async def models(request):
        return JSONResponse({"object": "list", "data": [model_card()]})

    async def one_model(request):
        check_model(served, request.path_params["name"])
        return JSONResponse(model_card())

    async def health(request):
        status = "stopping" if engine.stopping else "ok"
        return JSONResponse({"status": status, "model": served.id, **engine.counts()},
                            status_code=503 if engine.stopping else 200)

    async def http_error(request, exc: HTTPException):
        messages = {404: f"there is nothing at {request.url.path[:200]!r}; the API is under /v1/.",
                    405: f"{request.method} is not allowed at {request.url.path[:200]!r}."}
        return error(ApiError(exc.status_code, messages.get(exc.status_code, str(exc.detail))))

    async def server_error(request, exc: Exception):
        return error(ApiError(500, "the server failed on this request; its log says more."))

    routes = [Route("/health", api(health, auth=False), methods=["GET"]),
              Route("/v1/models", api(models), methods=["GET"]),
              Route("/v1/models/{name:path}", api(one_model), methods=["GET"]),
              Route("/v1/completions", api(completions), methods=["POST"]),
              Route("/v1/chat/completions", api(chat_completions), methods=["POST"])]
    app = Starlette(routes=routes, exception_handlers={HTTPException: http_error, Exception: server_error})
    return Guard(app, allowed_hosts)


# ---------------------------------------------------------------- serving


def loopback_hosts(address: str) -> set[str] | None:
    """The Host names a server bound to address answers: the loopback names and the address
    itself when it is a loopback address (any of 127.0.0.0/8 or ::1); None (any) otherwise."""
    try:
        ip = ipaddress.ip_address(address.split("%")[0])
    except ValueError:
        return None
    if not ip.is_loopback:
        return None
    return {*LOOPBACK_NAMES, str(ip)}


class ServeServer:
    """`andrea serve`: uvicorn on one socket, the decoding thread, and the stop on a signal."""

    def __init__(self, served: Served, host: str = "127.0.0.1", port: int = 8000, api_key: str | None = None,
                 max_batch: int = 16, max_queue: int = 64, drain_seconds: float = 30.0):
        import uvicorn

        from andrea.web.http import bind, url_of

        self.sock = bind(host, port)
        address = self.sock.getsockname()[0]
        hosts = loopback_hosts(address)
        if hosts is None and not api_key:
            self.sock.close()
            raise AndreaError(f"--host {host} opens the server to other machines; give an API key with --api-key KEY "
                              f"(or ANDREA_API_KEY), or serve on 127.0.0.1.")
        self.url = url_of(self.sock)
        self.loopback = hosts is not None
        self.engine = Engine(served.model, max_batch, max_queue)
        self.engine.on_drained = self._drained
        self.drain_seconds = drain_seconds
        self.app = create_app(served, self.engine, api_key, hosts)
        limit = 2 * (max_batch + max_queue) + 32  # connections at once; more get uvicorn's 503
        config = uvicorn.Config(self.app, log_level="warning", access_log=False, lifespan="off",
                                timeout_graceful_shutdown=5, limit_concurrency=limit, server_header=False)
        self.server = _Uvicorn(config)
        self.server.on_signal = self.signalled
        self.signals = 0

    def warm_up(self) -> None:
        """Decode a token greedily and one sampled, so the weight layouts exist before the first request."""
        dec = self.engine.decoder
        for temperature in (0.0, 1.0):
            seq = dec.join([BOS], temperature, seed=0)
            dec.feed(dec.pick())
            dec.leave(seq)

    def signalled(self, sig) -> None:
        self.signals += 1
        if self.signals == 1:
            c = self.engine.counts()
            log(f"stopping: no new requests; {c['decoding']} decoding and {c['waiting']} waiting have "
                f"{self.drain_seconds:g} s to finish (a second signal ends them now).")
            self.engine.stop(self.drain_seconds)
        else:
            self.engine.stop(0)

    def _drained(self) -> None:
        self.server.should_exit = True

    def serve_forever(self) -> None:
        self.engine.start()
        try:
            self.server.run(sockets=[self.sock])
        finally:
            self.engine.close()
            self.sock.close()

    def start(self) -> str:
        """Serve from a background thread (no signals there; `stop` ends it); the base URL."""
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise AndreaError("the server did not start.")
            time.sleep(0.02)
        return self.url

    def stop(self) -> None:
        self.engine.stop(0)
        self.thread.join(timeout=30)


def _Uvicorn(config):
    """uvicorn's server, whose signals start the drain (`on_signal`) instead of closing at once."""
    import uvicorn

    class Server(uvicorn.Server):
        on_signal = None

        def handle_exit(self, sig, frame) -> None:
            if self.on_signal is None:
                return super().handle_exit(sig, frame)
            self.on_signal(sig)

    return Server(config)
