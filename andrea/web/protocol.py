"""OpenAI's protocol for `andrea serve`: reading a request's fields, and writing its answers.

Reading. `request_fields` reads a completion or chat body through `andrea.web.http.Fields`,
letting through the fields clients send with OpenAI's defaults (n 1, echo false, ...) and refusing
any other value of them; `sampling`, `stops` and `include_usage` check the rest, and `chat_turns`
turns a messages list into ANDREA's turn format (system lines, user/assistant pairs, the last line).

Writing. `error_body` is OpenAI's error JSON, {"error": {"message", "type", "param", "code"}};
`Render` writes one reply whole or as stream chunks (server-sent events ending in `data: [DONE]`),
with `usage` and `finish_reason`; `EventStream` streams a job's events as they arrive and `collect`
gathers them for a reply not streamed. Both free the job's slot as soon as its client hangs up.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid

from andrea.validate import MAX_SEED
from andrea.web.http import Fields, RequestError, check_text

MAX_TOKENS = 4_096  # the most tokens one reply may ask for
MAX_MESSAGES = 256
MAX_STOPS, MAX_STOP_CHARS = 4, 100
MIN_TEMPERATURE = 1e-5  # a smaller positive temperature is greedy (its division would overflow)
MIN_TOP_P = 1e-6  # a smaller top_p keeps the most likely token alone, as this does for V < 10^6

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
               405: "invalid_request_error", 413: "invalid_request_error", 429: "rate_limit_error",
               500: "server_error", 503: "service_unavailable"}


def error_body(e: RequestError) -> dict:
    """A RequestError in OpenAI's error shape."""
    return {"error": {"message": e.message, "type": ERROR_TYPES.get(e.status, "invalid_request_error"),
                      "param": e.param, "code": e.code}}


# ---------------------------------------------------------------- reading a request

SAMPLING_FIELDS = {"model", "max_tokens", "temperature", "top_p", "top_k", "stop", "seed", "stream", "stream_options", "n"}
COMPLETION_FIELDS = SAMPLING_FIELDS | {"prompt", "echo", "logprobs"}
CHAT_FIELDS = SAMPLING_FIELDS | {"messages", "max_completion_tokens", "logprobs", "top_logprobs"}
MAX_N = 16  # choices of one prompt
MAX_PROMPTS = 64  # prompts of one request
MAX_LOGPROBS = 20  # alternatives given beside each token (OpenAI's chat allows 20, its completions 5)
# fields clients send with OpenAI's defaults; any other value is refused, naming the field
OPENAI_DEFAULTS = {"n": (1,), "echo": (False,), "logprobs": (None, False), "best_of": (None, 1), "suffix": (None,),
                   "presence_penalty": (0, 0.0), "frequency_penalty": (0, 0.0), "logit_bias": (None, {}),
                   "top_logprobs": (None, 0), "user": None}


def request_fields(body: dict, allowed: set[str]) -> Fields:
    """The body's fields: those OpenAI's clients send with their defaults checked and set aside,
    the rest read by `Fields` (which refuses a field it does not know)."""
    for name, ok in OPENAI_DEFAULTS.items():
        if name in allowed:
            continue
        if name in body and ok is not None and not any(body[name] == v and type(body[name]) is type(v) for v in ok):
            raise RequestError(f"{name} is not supported here; leave it out or give {json.dumps(ok[-1])}.", param=name)
    if "user" in body and not isinstance(body["user"], str):
        raise RequestError("user must be a string.", param="user")
    return Fields({k: v for k, v in body.items() if k not in OPENAI_DEFAULTS or k in allowed}, allowed)


def probabilities(f: Fields, chat: bool) -> dict:
    """What a request asks of log-probabilities: {"echo", "logprobs" (None, or how many
    alternatives beside each token), "n"}. Completions: `logprobs` an integer 0 to MAX_LOGPROBS and
    `echo`; chat: `logprobs` true or false and `top_logprobs` 0 to MAX_LOGPROBS (which needs it)."""
    n = f.integer("n", 1, 1, MAX_N)
    if chat:
        wanted = f.flag("logprobs")
        top = f.integer("top_logprobs", None, 0, MAX_LOGPROBS)
        if top is not None and not wanted:
            raise RequestError("top_logprobs needs logprobs: true.", param="top_logprobs")
        return {"echo": False, "logprobs": (top or 0) if wanted else None, "n": n}
    if f.body.get("logprobs") is False:  # as OpenAI's clients send "none asked"
        f.body = {k: v for k, v in f.body.items() if k != "logprobs"}
    return {"echo": f.flag("echo"), "logprobs": f.integer("logprobs", None, 0, MAX_LOGPROBS), "n": n}


def stop_strings(f: Fields) -> list[str]:
    v = f.body.get("stop")
    if v is None:
        return []
    items = [v] if isinstance(v, str) else v
    if not isinstance(items, list) or not 1 <= len(items) <= MAX_STOPS:
        raise RequestError(f"stop must be a string or a list of 1 to {MAX_STOPS} strings.", param="stop")
    return [check_text(s, "stop", MAX_STOP_CHARS) for s in items]


def include_usage(f: Fields) -> bool:
    v = f.body.get("stream_options")
    if v is None:
        return False
    if not isinstance(v, dict) or set(v) - {"include_usage"} or not isinstance(v.get("include_usage", False), bool):
        raise RequestError('stream_options must be {"include_usage": true or false}.', param="stream_options")
    return v.get("include_usage", False)


def sampling(f: Fields, vocab_size: int, default_tokens: int, names=("max_tokens",), least: int = 1) -> dict:
    """max_tokens (the first of names given; 0 only where `least` allows it, as with echo),
    temperature, top_p, top_k and seed, checked."""
    name = next((n for n in names if f.body.get(n) is not None), names[0])
    max_tokens = f.integer(name, default_tokens, least, MAX_TOKENS)
    temperature = f.number("temperature", 1.0, 0.0, 2.0)
    top_p = f.number("top_p", None, 0.0, 1.0, lo_open=True)
    top_k = f.integer("top_k", None, 1, 2**31 - 1)
    seed = f.integer("seed", None, 0, MAX_SEED)
    return {"max_tokens": max_tokens, "temperature": 0.0 if temperature < MIN_TEMPERATURE else temperature,
            "top_p": None if top_p is None or top_p == 1 else max(top_p, MIN_TOP_P),
            "top_k": None if top_k is None or top_k >= vocab_size else top_k, "seed": seed}


def _content(message: dict, i: int) -> str:
    """A message's text: a string, or a list of {"type": "text", "text": ...} parts."""
    name = f"messages[{i}].content"
    c = message.get("content")
    if isinstance(c, list):
        if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in c):
            raise RequestError(f"{name} must be a string or a list of text parts.", param=name)
        c = "".join(p["text"] for p in c)
    if not isinstance(c, str):
        raise RequestError(f"{name} must be a string.", param=name)
    if c:
        check_text(c, name)
    return c


def chat_turns(messages) -> tuple[str, list[tuple[str, str]], str]:
    """(preamble, turns, last line) of a messages list: system lines, then user/assistant pairs,
    then the user's last line; newlines inside a turn become spaces, as in `andrea chat`."""
    if not isinstance(messages, list) or not 1 <= len(messages) <= MAX_MESSAGES:
        raise RequestError(f"messages must be a list of 1 to {MAX_MESSAGES} messages.", param="messages")
    system, talk = [], []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or set(m) - {"role", "content", "name"}:
            raise RequestError(f"messages[{i}] must be an object with role and content.", param=f"messages[{i}]")
        role, where = m.get("role"), f"messages[{i}].role"
        if role in ("system", "developer"):
            if talk:
                raise RequestError(f"messages[{i}]: system messages must come before the conversation.", param=where)
            system.append(_content(m, i))
        elif role in ("user", "assistant"):
            expected = "user" if len(talk) % 2 == 0 else "assistant"
            if role != expected:
                raise RequestError(f"messages[{i}] must be from the {expected}: the conversation alternates user "
                                   f"and assistant, starting with the user.", param=where)
            talk.append(_content(m, i).replace("\r\n", " ").replace("\n", " "))
        else:
            raise RequestError(f"messages[{i}].role must be system, user or assistant, got {json.dumps(role)[:40]}.",
                               param=where)
    if len(talk) % 2 == 0:
        raise RequestError("the last message must be from the user.", param="messages")
    preamble = "".join(s + "\n" for s in system)
    return preamble, list(zip(talk[0:-1:2], talk[1:-1:2])), talk[-1]


# ---------------------------------------------------------------- answers


def json_bytes(obj) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


class Render:
    """The JSON of one reply, whole or as stream chunks, for completions or chat."""

    def __init__(self, model_id: str, chat: bool, usage_in_stream: bool = False):
        self.chat, self.usage_in_stream = chat, usage_in_stream
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.head = {"id": self.id, "object": "chat.completion.chunk" if chat else "text_completion",
                     "created": int(time.time()), "model": model_id}
        self.first = True

    def choice(self, index: int, text: str, reason: str, logprobs: dict | None = None) -> dict:
        if self.chat:
            return {"index": index, "message": {"role": "assistant", "content": text}, "logprobs": logprobs,
                    "finish_reason": reason}
        return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": reason}

    def whole(self, choices: list[dict], usage: dict) -> dict:
        return {**self.head, "object": "chat.completion" if self.chat else "text_completion", "choices": choices,
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
        return b"data: " + json_bytes(obj) + b"\n\n"

    def events(self, events: list, job) -> tuple[bytes, bool, bool]:
        """(bytes to send, whether the stream ends with them, whether the client is gone)."""
        out = []
        for event in events:
            kind = event[0]
            if kind == "gone":
                return b"", True, True
            if kind == "text":  # one chunk per piece of text, as it was decoded, however many arrive at once
                out.append(self.chunk(event[1]))
                continue
            if kind == "end":
                out.append(self.chunk(None, event[1]))
                if self.usage_in_stream:
                    out.append(b"data: " + json_bytes({**self.head, "choices": [], "usage": job.usage}) + b"\n\n")
            else:  # an error after the stream began: OpenAI's error event
                out.append(b"data: " + json_bytes(error_body(event[1])) + b"\n\n")
            out.append(b"data: [DONE]\n\n")
            return b"".join(out), True, False
        return b"".join(out), False, False


async def _watch(receive, job, scheduler) -> None:
    """Wait for the client to hang up; then free its slot and wake whoever waits for the job."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            scheduler.cancel(job)
            job.events.put_nowait(("gone",))
            return


class EventStream:
    """An ASGI response streaming one job (`andrea.web.scheduler.Job`) as server-sent events; a
    client that hangs up frees the job's slot at once (not only when the next token would be sent)."""

    def __init__(self, job, scheduler, render: Render):
        self.job, self.scheduler, self.render = job, scheduler, render

    async def __call__(self, scope, receive, send) -> None:
        job = self.job
        headers = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache"),
                   (b"x-accel-buffering", b"no")]
        watcher = asyncio.ensure_future(_watch(receive, job, self.scheduler))
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
                self.scheduler.cancel(job)


async def collect(jobs: list, scheduler, receive) -> list[tuple[str, str]] | None:
    """The whole text and finish reason of each job of a request not streamed (raising the first
    error); None when the client has gone (every job is then cancelled)."""
    gone = asyncio.Event()

    async def watch():
        while True:
            if (await receive())["type"] == "http.disconnect":
                gone.set()
                for job in jobs:
                    scheduler.cancel(job)
                    job.events.put_nowait(("gone",))
                return

    watcher = asyncio.ensure_future(watch())
    out = []
    try:
        for job in jobs:
            text = []
            while True:
                event = await job.events.get()
                if event[0] == "text":
                    text.append(event[1])
                elif event[0] == "end":
                    out.append(("".join(text), event[1]))
                    break
                elif event[0] == "error":
                    raise event[1]
                else:
                    return None
        return None if gone.is_set() else out
    finally:
        watcher.cancel()
        for job in jobs:
            if not job.done:
                scheduler.cancel(job)
