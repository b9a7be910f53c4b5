"""`andrea serve`: a model behind the OpenAI HTTP API, its requests decoded together.

    GET  /health                  {"status": "ok" | "stopping", the batch and queue in use}
    GET  /v1/models               the one model served (its id: the run folder's or file's name)
    GET  /v1/models/{id}
    POST /v1/completions          {"prompt", "max_tokens", "temperature", "top_p", "top_k", "stop", "seed", "stream",
                                   "n", "echo", "logprobs"}
    POST /v1/chat/completions     {"messages", the same sampling fields, "n", "logprobs", "top_logprobs"}
    POST /tokenize                {"prompt", "add_special_tokens"} -> {"count", "max_model_len", "tokens"} (vLLM's)
    POST /detokenize              {"tokens"} -> {"prompt"}

The fields, answers, stream chunks (server-sent events ending in `data: [DONE]`), `usage` and
`finish_reason` (`stop` at a stop string, the end of a chat reply or BOS; `length` at max_tokens)
are OpenAI's (`andrea.web.protocol`). `top_k` is an extension; a field given as null reads as its
default. A chat is written in ANDREA's turn format, as `andrea chat` writes it
(`andrea.decoding.generate.chat_prompt_ids`): BOS, the system messages as lines of text, then
`> person\\n< model\\n` per turn, then `> last line\\n<` (the reply's first space comes with its first
word, as in training, and is not part of the reply's text); the reply ends at the first newline, and
the oldest turns are dropped when the whole would not fit the context with room for the reply.

Several answers. A completion's prompt may be a list of prompts (strings or lists of token ids,
at most MAX_PROMPTS), and `n` asks for up to MAX_N choices of each: every choice is a request of
its own in the scheduler, so each equals the single request that asks for it alone (greedy, or
seeded: choice j of a request with seed s is the single request with seed s + j). Choices are
numbered prompt by prompt, as OpenAI numbers them. A streamed reply has one prompt and one choice.

Log-probabilities. `logprobs` (completions: an integer k, the alternatives given beside each
token; chat: true, with `top_logprobs` k) gives each reply token's log-probability, and with
`echo` (completions) every prompt token's too (the first has none: nothing comes before it), in
OpenAI's shapes. They are not the decoder's: once a reply is made, one forward pass over the
prompt and the reply gives `log_softmax` of the model's logits on exactly those ids
(`Served.scores`), which is why prompt and reply must fit the context together. With `echo`,
`max_tokens` may be 0 (the prompt alone, scored: what lm-evaluation-harness's loglikelihood
tasks ask). Tokens are named as the exported tokenizer names them: <0xNN> for a byte, <BOS>, a
segment's text (" cat</w>" after a word end).

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
import os
import threading
from pathlib import Path

import torch

from andrea.config import BOS
from andrea.decoding.generate import chat_prompt_ids
from andrea.errors import AndreaError, longer_than_context
from andrea.validate import MAX_SEED, is_int
from andrea.web.http import Guard, Limits, RequestError, UvicornServer, bind, check_text, loopback_hosts, read_body
from andrea.web.protocol import (
    CHAT_FIELDS,
    COMPLETION_FIELDS,
    MAX_PROMPTS,
    EventStream,
    Render,
    chat_turns,
    collect,
    error_body,
    include_usage,
    probabilities,
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

    def encode(self, text: str, bos: bool = True) -> list[int]:
        with self.lock:
            return self.tokenizer.encode(text, bos=bos)

    def check_context(self, ids: list[int], param: str) -> list[int]:
        T = self.config.block_size
        if len(ids) > T:
            raise RequestError(longer_than_context(len(ids), T), param=param, code="context_length_exceeded")
        return ids

    def completion_prompts(self, prompt) -> list[list[int]]:
        """The ids of each prompt of a request: a string, a list of token ids, or a list of 1 to
        MAX_PROMPTS of either."""
        if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
            if len(prompt) > MAX_PROMPTS:
                raise RequestError(f"prompt takes at most {MAX_PROMPTS} prompts in one request, got {len(prompt):,}.",
                                   param="prompt")
            return [self.completion_ids(p) for p in prompt]
        return [self.completion_ids(prompt)]

    def completion_ids(self, prompt) -> list[int]:
        if isinstance(prompt, str):
            return self.check_context(self.encode(check_text(prompt, "prompt")), "prompt")
        V = self.config.vocab_size
        if isinstance(prompt, list) and prompt and all(is_int(t) for t in prompt):
            bad = [t for t in prompt if not 0 <= t < V]
            if bad:
                raise RequestError(f"token id {str(bad[0])[:40]} in prompt is out of range: ids are 0 to {V - 1}.",
                                   param="prompt")
            return self.check_context(list(prompt), "prompt")
        raise RequestError("prompt must be a non-empty string, a list of token ids, or a list of either.",
                           param="prompt")

    def text(self, ids: list[int]) -> str:
        with self.lock:
            return self.tokenizer.decode(ids)

    def label(self, i: int) -> str:
        """A token's name in logprobs, as the exported tokenizer names it (its
        `convert_ids_to_tokens`): <0xNN> for byte NN, <BOS>, and a segment's own text (" cat</w>"
        after a word end), so no two tokens share one."""
        if i < 256:
            return f"<0x{i:02X}>"
        return "<BOS>" if i == BOS else self.tokenizer.segments[i - 257]

    def scores(self, ids: list[int], start: int, k: int) -> list[tuple[float, list[tuple[int, float]]]]:
        """For each position t from start (>= 1) on: the model's log-probability of ids[t] after
        ids[:t] (log_softmax of its logits, float32, one forward over ids[:-1]) and the k most
        likely tokens there with theirs."""
        if start >= len(ids):
            return []
        with torch.no_grad():
            logits = self.model(torch.tensor([ids[:-1]], device=self.model.wte.weight.device))[0][0]
            logp = torch.log_softmax(logits.float(), dim=-1)[start - 1:]
            picked = logp.gather(1, torch.tensor(ids[start:], device=logp.device)[:, None])[:, 0].tolist()
            top = torch.topk(logp, k, dim=-1) if k else None
        out = []
        for j, lp in enumerate(picked):
            alts = list(zip(top.indices[j].tolist(), top.values[j].tolist())) if k else []
            out.append((lp, alts))
        return out

    def chat_ids(self, messages, max_tokens: int) -> list[int]:
        preamble, turns, line = chat_turns(messages)
        with self.lock:
            ids, _ = chat_prompt_ids(self.tokenizer, self.config.block_size, max_tokens, turns, line, preamble,
                                     self.max_token_bytes)
        return self.check_context(ids, "messages")


def model_id(path) -> str:
    """A checkpoint's name for the API: its run folder's name, or the file's name without suffix.
    A name whose bytes are not UTF-8 (Python keeps them as surrogates) has each such byte shown
    as U+FFFD, so every reply that names the model can be written."""
    p = Path(path).resolve()
    if p.is_dir() or p.name in ("best.safetensors", "latest.safetensors"):
        name = (p if p.is_dir() else p.parent).name
    else:
        name = p.stem
    return os.fsencode(name).decode("utf-8", "replace") or "andrea"


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
    """A completion or chat request: checked, queued (a job per prompt and choice), then streamed
    or answered whole, with log-probabilities where asked."""
    # starlette: needed only to serve
    from starlette.concurrency import run_in_threadpool
    from starlette.responses import JSONResponse, Response

    body = await read_body(request, MAX_BODY)
    f = request_fields(body, CHAT_FIELDS if chat else COMPLETION_FIELDS)
    check_model(served, body.get("model"))
    asked = probabilities(f, chat)
    names = ("max_completion_tokens", "max_tokens") if chat else ("max_tokens",)
    settings = sampling(f, served.config.vocab_size, 256 if chat else 16, names, least=0 if asked["echo"] else 1)
    stops, stream, usage = stop_strings(f), f.flag("stream"), include_usage(f)
    if chat:
        if "messages" not in body:
            raise RequestError("messages is required.", param="messages")
        prompts = [await run_in_threadpool(served.chat_ids, body["messages"], settings["max_tokens"])]
        stops = ["\n"] + stops  # a reply is one line, as in `andrea chat`
    else:
        if "prompt" not in body:
            raise RequestError("prompt is required.", param="prompt")
        prompts = await run_in_threadpool(served.completion_prompts, body["prompt"])
    n, logprobs, echo = asked["n"], asked["logprobs"], asked["echo"]
    if stream and (len(prompts) * n > 1 or logprobs is not None or echo):
        raise RequestError("a streamed reply has one prompt and one choice, without logprobs or echo; "
                           "leave stream out for those.", param="stream")
    if logprobs is not None:
        T = served.config.block_size
        if chat:  # a chat reply ends at its line's end: its logprobs take the room the prompt leaves
            settings["max_tokens"] = max(1, min(settings["max_tokens"], T + 1 - len(prompts[0])))
        for ids in prompts:
            if len(ids) + settings["max_tokens"] - 1 > T:
                raise RequestError(f"logprobs are read from one pass over the prompt and the reply, which must fit "
                                   f"the context of {T:,} tokens: this prompt has {len(ids):,} and max_tokens is "
                                   f"{settings['max_tokens']:,}.", param="max_tokens", code="context_length_exceeded")
    places = scheduler.max_batch + scheduler.max_queue
    if len(prompts) * n > places:
        raise RequestError(f"this request asks for {len(prompts) * n:,} replies, and this server holds at most {places:,} "
                           f"at once (its --max-batch and --max-queue); send fewer prompts or a smaller n.",
                           param="prompt" if n == 1 else "n")
    loop, client = asyncio.get_running_loop(), request.client.host if request.client else None
    jobs = []
    if settings["max_tokens"]:
        try:
            for ids in prompts:
                for j in range(n):
                    seed = settings["seed"] if settings["seed"] is None else (settings["seed"] + j) % (MAX_SEED + 1)
                    job = Job(ids, {**settings, "seed": seed}, stops, served.tokenizer, loop, client, chat)
                    scheduler.submit(job)
                    jobs.append(job)
        except RequestError:
            for job in jobs:
                scheduler.cancel(job)
            raise
    render = Render(served.id, chat, stream and usage)
    if stream:
        return EventStream(jobs[0], scheduler, render)
    if jobs:
        results = await collect(jobs, scheduler, request.receive)
        if results is None:
            return Response(status_code=204)
    else:  # echo with max_tokens 0: the prompt alone, scored
        jobs = [None] * (len(prompts) * n)
        results = [("", "length")] * len(jobs)
    choices = await run_in_threadpool(_choices, served, render, prompts, jobs, results, n, echo, logprobs)
    completion = sum(job.tokens for job in jobs if job is not None)
    prompt_tokens = sum(map(len, prompts))
    return JSONResponse(render.whole(choices, {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
                                               "total_tokens": prompt_tokens + completion}))


def _choices(served: Served, render: Render, prompts, jobs, results, n: int, echo: bool, logprobs: int | None) -> list:
    """Each choice's JSON: prompt p's j-th choice is number p·n + j, as OpenAI orders them."""
    out = []
    for i, (job, (text, reason)) in enumerate(zip(jobs, results)):
        ids = prompts[i // n]
        made = job.token_ids if job is not None else []
        head = served.text(ids) if echo else ""
        lp = None
        if logprobs is not None:
            full = ids + made
            start = 0 if echo else len(ids)
            scored = served.scores(full, max(start, 1), logprobs)
            if start == 0:  # the first token has nothing before it
                scored = [(None, None)] + scored
            lp = chat_logprobs(served, full[start:], scored) if render.chat else \
                completion_logprobs(served, full[start:], scored, head + text)
        out.append(render.choice(i, head + text, reason, lp))
    return out


def completion_logprobs(served: Served, ids: list[int], scored: list, text: str) -> dict:
    """OpenAI's completions logprobs: tokens, token_logprobs, top_logprobs (the alternatives by
    label, most likely first) and text_offset (where each token's text starts in `text`)."""
    offsets, at = [], 0
    for k in range(len(ids)):  # a token's text starts where the text of those before it ends
        offsets.append(min(at, len(text)))
        at = len(served.text(ids[: k + 1]))
    tops = []
    for _, alts in scored:
        top = None if alts is None else {}
        for t, v in alts or ():  # most likely first
            top.setdefault(served.label(t), v)
        tops.append(top)
    return {"tokens": [served.label(t) for t in ids], "token_logprobs": [lp for lp, _ in scored],
            "top_logprobs": tops, "text_offset": offsets}


def chat_logprobs(served: Served, ids: list[int], scored: list) -> dict:
    """OpenAI's chat logprobs: {"content": [{token, logprob, bytes, top_logprobs}]} per reply token;
    the reply's bytes joined are its text (the first token's space, the turn format's, left out)."""
    def entry(t: int, v: float) -> dict:
        return {"token": served.label(t), "logprob": v, "bytes": list(served.tokenizer.token_bytes(t))}

    content = [{**entry(t, lp), "top_logprobs": [entry(a, v) for a, v in alts]} for t, (lp, alts) in zip(ids, scored)]
    if content and content[0]["bytes"][:1] == [0x20]:  # the turn format's space, not part of the reply's text
        content[0]["bytes"] = content[0]["bytes"][1:]
    return {"content": content}


async def tokenize_reply(request, served: Served):
    """vLLM's /tokenize: {"prompt", "add_special_tokens" (default true: BOS first, as andrea
    encodes a document)} -> {"count", "max_model_len", "tokens"}."""
    from starlette.responses import JSONResponse

    body = await read_body(request, MAX_BODY)
    f = request_fields(body, {"model", "prompt", "add_special_tokens"})
    check_model(served, body.get("model"))
    text = check_text(body.get("prompt"), "prompt")
    ids = served.encode(text, bos=f.flag("add_special_tokens", True))
    return JSONResponse({"count": len(ids), "max_model_len": served.config.block_size, "tokens": ids})


async def detokenize_reply(request, served: Served):
    """vLLM's /detokenize: {"tokens"} -> {"prompt"} (BOS stands for no text)."""
    from starlette.responses import JSONResponse

    body = await read_body(request, MAX_BODY)
    request_fields(body, {"model", "tokens"})
    check_model(served, body.get("model"))
    ids, V = body.get("tokens"), served.config.vocab_size
    if not isinstance(ids, list) or not all(is_int(t) and 0 <= t < V for t in ids):
        raise RequestError(f"tokens must be a list of token ids from 0 to {V - 1}.", param="tokens")
    return JSONResponse({"prompt": served.text(ids)})


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

    async def tokenize(request):
        return await tokenize_reply(request, served)

    async def detokenize(request):
        return await detokenize_reply(request, served)

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
              Route("/v1/chat/completions", api(chat_completions), methods=["POST"]),
              Route("/tokenize", api(tokenize), methods=["POST"]),
              Route("/detokenize", api(detokenize), methods=["POST"])]
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
