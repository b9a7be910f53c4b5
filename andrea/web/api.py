"""`andrea serve`: a model behind the OpenAI HTTP API, its requests decoded together.

    GET  /health                  {"status": "ok" | "stopping", the batch and queue in use}
    GET  /v1/models               the one model served (its id: the run folder's or file's name)
    GET  /v1/models/{id}
    POST /v1/completions          {"prompt", "max_tokens", "temperature", "top_p", "top_k", "stop", "seed", "stream"}
    POST /v1/chat/completions     {"messages", the same sampling fields}

The fields, answers, stream chunks (server-sent events ending in `data: [DONE]`), `usage` and
`finish_reason` (`stop` at a stop string, the end of a chat reply or BOS; `length` at max_tokens)
are OpenAI's (`andrea.web.protocol`). `top_k` is an extension; a field given as null reads as its
default. A chat is written in ANDREA's turn format, as `andrea chat` writes it
(`andrea.decoding.generate.chat_prompt_ids`): BOS, the system messages as lines of text, then
`> person\\n< model\\n` per turn, then `> last line\\n< `; the reply ends at the first newline, and
the oldest turns are dropped when the whole would not fit the context with room for the reply.

Decoding. One thread (`andrea.web.scheduler.Scheduler`) decodes every request together: requests
wait in a queue of at most `max_queue`, join a free slot of `max_batch` between steps, and leave
when they end or their client hangs up; one client address cannot keep another out (the
scheduler's sharing rule). Greedy requests (temperature 0) give the tokens of
`andrea generate --greedy` alone; a seeded request gives the same tokens alone or among others.
Where torch has two threads (a two-core machine), `andrea serve` decodes on one, so the event
loop that speaks HTTP keeps a core of its own: a torch thread that must share its core with the
event loop stalls every parallel product (measured: BENCHMARKS.md's serving section). The
weights stay laid out for two, as `andrea generate` lays them out, so greedy replies keep its
tokens: the layout decides a product's rounding, not the threads that compute it
(`andrea.decoding.plan`). With more threads it decodes on all of them, as a layout of k blocks on
fewer than k threads would leave blocks for a second round (not measured); `--threads N` sets both
to N (`decoding_threads`). A `ServeServer` made in-process lays out and computes on torch's count
unless told otherwise.

Bounds and errors. A body over MAX_BODY bytes (413), JSON that does not parse (also a 5,000-digit
number or nesting too deep for Python's parser), a field unknown or of the wrong type or range, a
prompt over the context (400); a missing or wrong API key (401); an unknown model or path (404);
a full queue (429); a request head slower than `andrea.web.http.HEAD_SECONDS` (408); a
connection over `connection_limits`, in all (503) or from one client address (429); a server
stopping (503): each is one JSON object {"error": {"message", "type", "param", "code"}} and no
request prints a traceback. On a loopback address only requests whose
Host header names a loopback host are answered (so a web page cannot reach the server through a
DNS name that points at 127.0.0.1); a POST must say its body is JSON, so a page elsewhere cannot
send one without the browser asking first (both as for the lab: `andrea.web.http`).

Stopping. SIGTERM or Ctrl-C: new requests get 503, those queued and decoding go on until they end
or `drain_seconds` pass; then every reply still open ends (a stream with an error event and
`[DONE]`, a reply not streamed with 503), and the server exits. A second signal ends them at once.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import threading
from pathlib import Path

import torch

from andrea.config import BOS
from andrea.decoding.generate import chat_prompt_ids
from andrea.errors import AndreaError, longer_than_context
from andrea.validate import is_int
from andrea.web.http import Guard, Limits, RequestError, UvicornServer, bind, check_text, loopback_hosts, read_body
from andrea.web.protocol import (
    CHAT_FIELDS,
    COMPLETION_FIELDS,
    EventStream,
    Render,
    chat_turns,
    collect,
    error_body,
    include_usage,
    request_fields,
    sampling,
    stop_strings,
)
from andrea.web.scheduler import Job, Scheduler, log

MAX_BODY = 262_144  # bytes of a request body
MAX_CONNECTIONS = 1024  # connections open at once (fewer where the process may open fewer files)


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
            raise RequestError(longer_than_context(len(ids), T), param=param, code="context_length_exceeded")
        return ids

    def completion_ids(self, prompt) -> list[int]:
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if isinstance(prompt, str):
            return self.check_context(self.encode(check_text(prompt, "prompt")), "prompt")
        V = self.config.vocab_size
        if isinstance(prompt, list) and prompt and all(is_int(t) for t in prompt):
            bad = [t for t in prompt if not 0 <= t < V]
            if bad:
                raise RequestError(f"token id {str(bad[0])[:40]} in prompt is out of range: ids are 0 to {V - 1}.",
                                   param="prompt")
            return self.check_context(list(prompt), "prompt")
        raise RequestError("prompt must be a non-empty string (one prompt per request) or a list of token ids.",
                           param="prompt")

    def chat_ids(self, messages, max_tokens: int) -> list[int]:
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


# ---------------------------------------------------------------- the app


def check_key(request, key: bytes | None) -> None:
    """A 401 unless the request sends `Authorization: Bearer KEY` (when the server has a key)."""
    if key is None:
        return
    given = request.headers.get("authorization", "")
    if not given.lower().startswith("bearer ") or not given[7:].strip():
        raise RequestError("this server needs an API key: send the header Authorization: Bearer KEY.", 401,
                           code="invalid_api_key")
    if not hmac.compare_digest(given[7:].strip().encode("utf-8", "replace"), key):
        raise RequestError("the API key is wrong.", 401, code="invalid_api_key")


def check_model(served: Served, name) -> None:
    if name is not None and name != served.id:
        raise RequestError(f"there is no model {json.dumps(name)[:80]} here; this server serves {served.id!r} "
                           f"(GET /v1/models).", 404, param="model", code="model_not_found")


async def reply(request, served: Served, scheduler: Scheduler, chat: bool):
    """A completion or chat request: checked, queued, then streamed or answered whole."""
    # starlette: needed only to serve
    from starlette.concurrency import run_in_threadpool
    from starlette.responses import JSONResponse, Response

    body = await read_body(request, MAX_BODY)
    f = request_fields(body, CHAT_FIELDS if chat else COMPLETION_FIELDS)
    check_model(served, body.get("model"))
    names = ("max_completion_tokens", "max_tokens") if chat else ("max_tokens",)
    settings = sampling(f, served.config.vocab_size, 256 if chat else 16, names)
    stops, stream, usage = stop_strings(f), f.flag("stream"), include_usage(f)
    if chat:
        if "messages" not in body:
            raise RequestError("messages is required.", param="messages")
        ids = await run_in_threadpool(served.chat_ids, body["messages"], settings["max_tokens"])
        stops = ["\n"] + stops  # a reply is one line, as in `andrea chat`
    else:
        if "prompt" not in body:
            raise RequestError("prompt is required.", param="prompt")
        ids = await run_in_threadpool(served.completion_ids, body["prompt"])
    job = Job(ids, settings, stops, served.tokenizer, asyncio.get_running_loop(),
              request.client.host if request.client else None)
    scheduler.submit(job)
    render = Render(served.id, chat, stream and usage)
    if stream:
        return EventStream(job, scheduler, render)
    result = await collect(job, scheduler, render, request.receive)
    return JSONResponse(result) if result is not None else Response(status_code=204)


def create_app(served: Served, scheduler: Scheduler, api_key: str | None = None,
               allowed_hosts: set[str] | None = None):
    """The ASGI app: Starlette routes inside a `Guard` (see the module's text)."""
    # starlette: needed only to serve
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    key = api_key.encode("utf-8") if api_key else None

    def error(e: RequestError) -> JSONResponse:
        return JSONResponse(error_body(e), status_code=e.status)

    def model_card() -> dict:
        return {"id": served.id, "object": "model", "created": served.created, "owned_by": "andrea",
                "context_length": served.config.block_size}

    def api(fn, auth: bool = True):
        async def endpoint(request):
            try:
                if auth:
                    check_key(request, key)
                return await fn(request)
            except RequestError as e:
                return error(e)
            except AndreaError as e:
                return error(RequestError(str(e)))

        return endpoint

    async def completions(request):
        return await reply(request, served, scheduler, chat=False)

    async def chat_completions(request):
        return await reply(request, served, scheduler, chat=True)

    async def models(request):
        return JSONResponse({"object": "list", "data": [model_card()]})

    async def one_model(request):
        check_model(served, request.path_params["name"])
        return JSONResponse(model_card())

    async def health(request):
        status = "stopping" if scheduler.stopping else "ok"
        return JSONResponse({"status": status, "model": served.id, **scheduler.counts()},
                            status_code=503 if scheduler.stopping else 200)

    async def http_error(request, exc: HTTPException):
        messages = {404: f"there is nothing at {request.url.path[:200]!r}; the API is under /v1/.",
                    405: f"{request.method} is not allowed at {request.url.path[:200]!r}."}
        return error(RequestError(messages.get(exc.status_code, str(exc.detail)), exc.status_code))

    async def server_error(request, exc: Exception):
        return error(RequestError("the server failed on this request; its log says more.", 500))

    routes = [Route("/health", api(health, auth=False), methods=["GET"]),
              Route("/v1/models", api(models), methods=["GET"]),
              Route("/v1/models/{name:path}", api(one_model), methods=["GET"]),
              Route("/v1/completions", api(completions), methods=["POST"]),
              Route("/v1/chat/completions", api(chat_completions), methods=["POST"])]
    app = Starlette(routes=routes, exception_handlers={HTTPException: http_error, Exception: server_error})
    app.router.redirect_slashes = False  # a path with a slash too many is a 404, not a redirect
    return Guard(app, allowed_hosts, error_body, log)


# ---------------------------------------------------------------- serving


def connection_limits() -> Limits:
    """Connections at once: MAX_CONNECTIONS, or fewer where the process may open fewer files; one
    client address may hold half of them. An idle connection costs little (its head must come
    within HEAD_SECONDS); many clients behind one address share its half."""
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    connections = MAX_CONNECTIONS if soft == resource.RLIM_INFINITY else max(16, min(MAX_CONNECTIONS, soft - 64))
    return Limits(connections, connections // 2)


def decoding_threads(requested: int | None = None) -> tuple[int, int]:
    """(torch threads the scheduler decodes on, threads its weights are laid out for): both
    `requested` where given; else (1, 2) where torch has two threads, and torch's count for both
    otherwise (see the module's text)."""
    if requested is not None:
        return requested, requested
    own = torch.get_num_threads()
    return (1, 2) if own == 2 else (own, own)


class ServeServer(UvicornServer):
    """`andrea serve`: uvicorn on one socket, the scheduler's thread, and the drain on a signal.
    The caller sets torch's thread count; `layout_threads` is the scheduler's."""

    def __init__(self, served: Served, host: str = "127.0.0.1", port: int = 8000, api_key: str | None = None,
                 max_batch: int = 16, max_queue: int = 64, drain_seconds: float = 30.0,
                 layout_threads: int | None = None):
        sock = bind(host, port)
        hosts = loopback_hosts(sock.getsockname()[0], host)
        if hosts is None and not api_key:
            sock.close()
            raise AndreaError(f"--host {host} opens the server to other machines; give an API key with --api-key KEY "
                              f"(or ANDREA_API_KEY), or serve on 127.0.0.1.")
        self.scheduler = Scheduler(served.model, max_batch, max_queue, layout_threads)
        self.scheduler.on_drained = self._drained
        self.drain_seconds = drain_seconds
        self.signals = 0
        super().__init__(sock, create_app(served, self.scheduler, api_key, hosts), render=error_body,
                         limits=connection_limits(), lifespan="off", timeout_graceful_shutdown=5)

    def warm_up(self) -> None:
        """Decode a token greedily and one sampled, so the weight layouts exist before the first request."""
        dec = self.scheduler.decoder
        for temperature in (0.0, 1.0):
            seq = dec.join([BOS], temperature, seed=0)
            dec.feed(dec.pick())
            dec.leave(seq)

    def on_signal(self, sig) -> bool:
        """SIGTERM or Ctrl-C: the first starts the drain, a second ends every reply now."""
        self.signals += 1
        if self.signals == 1:
            c = self.scheduler.counts()
            log(f"stopping: no new requests; {c['decoding']} decoding and {c['waiting']} waiting have "
                f"{self.drain_seconds:g} s to finish (a second signal ends them now).")
            self.scheduler.stop(self.drain_seconds)
        else:
            self.scheduler.stop(0)
        return True

    def _drained(self) -> None:
        self.server.should_exit = True

    def serve_forever(self) -> None:
        self.scheduler.start()
        try:
            super().serve_forever()
        finally:
            self.scheduler.close()

    def stop(self) -> None:
        """Stop a server started with `start`: the scheduler ends every reply, then uvicorn exits."""
        self.scheduler.stop(0)
        if self.thread is not None:
            self.thread.join(timeout=30)
