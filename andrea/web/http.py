"""The HTTP plumbing both servers share: the lab (`andrea.web.lab`) and the OpenAI API (`andrea.web.api`).

    RequestError        a request answered with an error: a status, one sentence, the field and a code;
                        each server writes it in its own shape (the lab {"error": sentence}, the API
                        OpenAI's {"error": {"message", "type", "param", "code"}})
    Fields              a JSON body's fields, each read with its type and range checked; a field
                        given as null reads as its default
    read_body           a POST's JSON object: declared as JSON, at most `limit` bytes, arriving in time
    is_loopback         whether an address is a loopback one (127.0.0.0/8, ::1, ::ffff:127.x.x.x)
    loopback_hosts      the Host names a server on a loopback address answers; `Guard` refuses the rest
    Guard               the outermost ASGI layer: the Host check, and no exception ever reaching uvicorn
    Limits              how many connections the server holds at once, and one client address of them
    bind, url_of        a listening socket, and its URL
    UvicornServer       uvicorn on that socket, in the foreground or from a background thread

On a loopback address only a Host header that names this machine (localhost, 127.0.0.1, [::1], the
address listened on, the name given to listen on) is answered, so a web page elsewhere cannot reach
a server through a DNS name of its own that resolves to a loopback address (DNS rebinding); and a
POST must declare its body as JSON, so a page elsewhere cannot send one without the browser asking
first (a CORS preflight, which neither server answers).

No client holds a connection for nothing: a request's head (its line and headers) must arrive
within HEAD_SECONDS of the connection opening or of the previous reply ending, else the server
answers 408 in its own shape and closes the connection; its body must arrive within BODY_SECONDS.
A connection over the server's limit, or over one client address's share of it, is answered in
the server's shape (503, 429) as it opens and closed, never with uvicorn's plain-text 503.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import socket
import sys
import threading
import time

from andrea.errors import AndreaError
from andrea.files import parse_json
from andrea.validate import number_in, span

BODY_SECONDS = 30.0  # a request body must arrive within this
HEAD_SECONDS = 10.0  # a request's line and headers must arrive within this
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


class RequestError(Exception):
    """A request answered with an error: its status, one sentence, and (for the API's error JSON)
    the field it is about and a code."""

    def __init__(self, message: str, status: int = 400, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message, self.status, self.param, self.code = message, status, param, code


def logger(name: str):
    """A function that writes one line `name: message` to stderr."""

    def log(message: str) -> None:
        print(f"{name}: {message}", file=sys.stderr, flush=True)

    return log


# ---------------------------------------------------------------- reading a request's fields


def _shown(value) -> str:
    """A value as a message quotes it: JSON, cut at 40 characters (a number may have thousands of digits)."""
    try:
        return json.dumps(value)[:40]
    except ValueError:  # an integer past Python's limit on digits converted to text
        return "a number too long to show"


def check_text(value, name: str, limit: int | None = None) -> str:
    """value, if it is a non-empty string of at most `limit` characters that UTF-8 can write."""
    if not isinstance(value, str) or value == "":
        raise RequestError(f"{name} must be a non-empty string.", param=name)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise RequestError(f"{name} is not valid Unicode (it holds a lone surrogate).", param=name) from None
    if limit is not None and len(value) > limit:
        raise RequestError(f"{name} is {len(value):,} characters; at most {limit:,} are taken.", param=name)
    return value


def _writable(name: str) -> str:
    """A name from a request as an answer can quote it: itself, or with a lone surrogate (which no
    UTF-8 answer can hold) and every other character past ASCII escaped as Python writes them."""
    try:
        name.encode("utf-8")
        return name
    except UnicodeEncodeError:
        return ascii(name)[1:-1]


class Fields:
    """The fields of one JSON request body, each read with its type and range checked. A field
    that is absent or null reads as its default; a default of None makes the field optional."""

    def __init__(self, body: dict, allowed: set[str]):
        unknown = sorted(set(body) - allowed)
        if unknown:
            name = _writable(unknown[0])
            raise RequestError(f"unknown field '{name}'; this endpoint takes "
                               f"{', '.join(sorted(allowed)) or 'no fields'}.", param=name)
        self.body = body

    def get(self, name: str, default=None):
        v = self.body.get(name)
        return default if v is None else v

    def text(self, name: str, limit: int) -> str:
        return check_text(self.body.get(name), name, limit)

    def flag(self, name: str, default: bool = False) -> bool:
        v = self.get(name, default)
        if not isinstance(v, bool):
            raise RequestError(f"{name} must be true or false, got {_shown(v)}.", param=name)
        return v

    def integer(self, name: str, default, lo: int, hi: int) -> int | None:
        v = self.get(name, default)
        if v is None:
            return None
        if not number_in(v, int, lo, hi):
            raise RequestError(f"{name} must be {span(int, lo, hi)}, got {_shown(v)}.", param=name)
        return v

    def number(self, name: str, default, lo: float, hi: float, lo_open: bool = False) -> float | None:
        v = self.get(name, default)
        if v is None:
            return None
        # bounds first, on the value as sent: an int of 401 digits compares exactly, but has no float
        if not number_in(v, float, lo, hi, lo_open):
            raise RequestError(f"{name} must be {span(float, lo, hi, lo_open)}, got {_shown(v)}.", param=name)
        return float(v)

    def choice(self, name: str, default, choices) -> str:
        v = self.get(name, default)
        if v not in choices:
            raise RequestError(f"{name} must be one of {', '.join(choices)}, got {_shown(v)}.", param=name)
        return v

    def words(self, name: str, lo: int, hi: int, chars: int, what: str) -> list[str]:
        """A list of lo to hi words, each a non-empty string of at most `chars` characters."""
        v = self.body.get(name)
        if not isinstance(v, list) or not all(isinstance(w, str) and 0 < len(w) <= chars for w in v):
            raise RequestError(f"{name} must be a list of non-empty strings of at most {chars} characters.", param=name)
        if not lo <= len(v) <= hi:
            raise RequestError(f"{what} takes {lo} to {hi} words, got {len(v)}.", param=name)
        return [check_text(w, name) for w in v]


# ---------------------------------------------------------------- reading a request's body


async def read_body(request, limit: int, seconds: float = BODY_SECONDS) -> dict:
    """The JSON object a POST carries ({} for an empty body): declared as JSON, at most `limit`
    bytes, arriving within `seconds`; else RequestError saying what is wrong."""
    from starlette.requests import ClientDisconnect  # starlette: needed only to serve

    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/json":
        raise RequestError("send the body as JSON, with the header Content-Type: application/json.")
    too_big = RequestError(f"the request body is larger than {limit:,} bytes.", 413, code="request_too_large")
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > limit):
        raise too_big
    raw = bytearray()

    async def read():
        async for chunk in request.stream():
            raw.extend(chunk)
            if len(raw) > limit:
                raise too_big

    try:
        await asyncio.wait_for(read(), seconds)
    except asyncio.TimeoutError:
        raise RequestError(f"the request body did not arrive within {seconds:g} s.") from None
    except ClientDisconnect:
        raise RequestError("the client hung up before its request body arrived.") from None
    if not raw.strip():
        return {}
    try:
        body = parse_json(bytes(raw), "the request body")
    except AndreaError as e:  # not JSON, not UTF-8, too deep, a number too long: one sentence
        raise RequestError(str(e)) from None
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object.")
    return body


# ---------------------------------------------------------------- loopback and the Host header


def _ip(text: str):
    """The IP address text writes ([] and a %zone dropped; an IPv4-mapped IPv6 address unwrapped),
    or None when it is not an IP address (a name, or a form like 0x7f.0.0.1 or 127.1)."""
    try:
        ip = ipaddress.ip_address(text.strip("[]").split("%")[0])
    except ValueError:
        return None
    return getattr(ip, "ipv4_mapped", None) or ip


def is_loopback(address: str) -> bool:
    """Whether address is a loopback address: 127.0.0.0/8, ::1, or either as IPv4-mapped IPv6
    (::ffff:127.0.0.1, which `ipaddress` alone does not count as loopback before Python 3.13)."""
    ip = _ip(address)
    return ip is not None and ip.is_loopback


def host_name(header: str) -> str | None:
    """The host a Host header names, lowercased, without its port and brackets, an IP address in
    its one standard form; None when the header is empty, malformed or carries a %zone."""
    h = header.strip().lower()
    if h.startswith("["):
        end = h.find("]")
        name, rest = (h[1:end], h[end + 1 :]) if end > 0 else (None, "")
    elif h.count(":") == 1:
        name, rest = h.split(":")
        rest = ":" + rest
    else:
        name, rest = h, ""
    if not name or "%" in name or (rest and not (rest.startswith(":") and rest[1:].isdigit())):
        return None  # a zone (127.0.0.1%x, [::1%lo]) names no host a client addresses
    ip = _ip(name)
    return str(ip) if ip is not None else name


def loopback_hosts(address: str, given: str | None = None) -> set[str] | None:
    """The host names (as `host_name` reads them) a server listening on address answers: the
    loopback names, the address and the name it was given to listen on; None (any) when the
    address is not a loopback one."""
    if not is_loopback(address):
        return None
    names = {*LOOPBACK_NAMES, str(_ip(address))}
    if given:
        ip = _ip(given)
        names.add(str(ip) if ip is not None else given.strip().lower())
    return names


async def send_json(send, status: int, body: dict, headers: dict | None = None) -> None:
    """A whole JSON response, sent on a raw ASGI `send`."""
    raw = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    head = [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]
    head += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": head})
    await send({"type": "http.response.body", "body": raw})


class Limits:
    """At most `connections` open at once, and `per_client` of them from one client address."""

    def __init__(self, connections: int, per_client: int):
        self.connections, self.per_client = connections, per_client

    def refusal(self, addresses: list, client) -> RequestError | None:
        """Why a new connection of `client` is refused, given every open one's client address
        (its own included), or None."""
        if len(addresses) > self.connections:
            return RequestError(f"the server holds {len(addresses) - 1} connections, its most; try again shortly.", 503,
                                code="server_busy")
        mine = sum(a == client for a in addresses)
        if client is not None and mine > self.per_client:
            return RequestError(f"this client address holds {mine - 1} connections, the most one address may; close "
                                f"some, or try again shortly.", 429, code="too_many_connections")
        return None


class Guard:
    """The outermost ASGI layer of both servers. On loopback (allowed_hosts given) a request whose
    Host header is not one of them gets 400; no exception ever reaches uvicorn (which would print
    its traceback): a fault is one line in the log and a 500. `render` writes a RequestError as
    the server's JSON; `headers` go with every answer the guard gives itself; `state` is the app's."""

    def __init__(self, app, allowed_hosts: set[str] | None, render, log, headers: dict | None = None):
        self.app, self.allowed_hosts, self.render, self.log, self.headers = app, allowed_hosts, render, log, headers
        self.state = getattr(app, "state", None)

    async def answer(self, send, error: RequestError) -> None:
        await send_json(send, error.status, self.render(error), self.headers)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            return await self.app(scope, receive, send)
        if scope["type"] != "http":
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1008})
            return
        if self.allowed_hosts is not None:
            host = dict(scope.get("headers") or []).get(b"host", b"").decode("latin-1")
            if host_name(host) not in self.allowed_hosts:
                return await self.answer(send, RequestError(
                    "this server answers only requests addressed to a loopback host (localhost, 127.0.0.1, [::1]).",
                    code="invalid_host"))
        started = False

        async def watched(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, watched)
        except Exception as e:  # Starlette has answered 500 where it could; keep the log to one line
            self.log(f"request to {scope.get('path', '?')} failed: {type(e).__name__}: {e}")
            if not started:
                await self.answer(send, RequestError("the server failed on this request; its log says more.", 500))


# ---------------------------------------------------------------- serving


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (port 0: any free port), or an AndreaError saying why not."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror:
        raise AndreaError(f"cannot resolve the host {host!r}.") from None
    family, _, _, _, address = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as e:
        sock.close()
        if e.errno == 98:
            raise AndreaError(f"port {port} is already in use on {host}; give another port (0 picks a free one).") from None
        raise AndreaError(f"cannot listen on {host}:{port} ({e.strerror}).") from None
    sock.listen(128)
    sock.setblocking(False)
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://{'[' + host + ']' if ':' in host else host}:{port}/"


def timed_protocol(head_seconds: float, render, limits: Limits | None = None):
    """uvicorn's HTTP/1.1 protocol (h11), with a deadline for each request's head: a connection
    whose request line and headers have not all arrived `head_seconds` after it opened, or after
    its previous reply ended, is answered 408 and closed. With `limits`, a connection over them is
    answered 503 or 429 as it opens. `render` writes the answer's JSON body."""
    from uvicorn.protocols.http.h11_impl import H11Protocol  # needed only to serve

    class TimedH11Protocol(H11Protocol):
        _head_timer = None
        _refused = False

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            client = (self.client or (None,))[0]
            refused = limits and limits.refusal([(c.client or (None,))[0] for c in self.connections], client)
            if refused:
                self._refuse(refused)
            else:
                self._arm()

        def data_received(self, data: bytes) -> None:
            if not self._refused:  # a refused connection's request is read and dropped
                super().data_received(data)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm()

        def connection_lost(self, exc) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
            super().connection_lost(exc)

        def _arm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
            self._head_timer = self.loop.call_later(head_seconds, self._head_late, self.cycle)

        def _head_late(self, cycle) -> None:
            self._head_timer = None
            waiting = self.cycle is cycle and (cycle is None or cycle.response_complete)  # no new request began
            if waiting and not self.transport.is_closing():
                self._refuse(RequestError(f"the request's line and headers did not arrive within {head_seconds:g} s.",
                                          408, code="request_timeout"))

        def _refuse(self, error: RequestError) -> None:
            """Answer in the server's shape, then close: at once for writing, and for reading once the
            client has had a second to see the answer (a close with its request unread would reset
            the connection before the answer is read)."""
            self._refused = True
            body = json.dumps(render(error), ensure_ascii=False).encode("utf-8")
            reason = {408: b"Request Timeout", 429: b"Too Many Requests", 503: b"Service Unavailable"}[error.status]
            self.transport.write(b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
                                 b"connection: close\r\n\r\n%s" % (error.status, reason, len(body), body))
            if self.transport.can_write_eof():
                self.transport.write_eof()
            self.loop.call_later(1.0, self.transport.close)

    return TimedH11Protocol


class UvicornServer:
    """uvicorn serving one ASGI app on one listening socket, in the foreground (`serve_forever`)
    or from a background thread (`start`, `stop`: tests and scripts). With `render` (the app's
    error writer) a request's head must arrive within `head_seconds`, and with `limits` too, a
    connection over them is refused as it opens (`timed_protocol`). A subclass may override `on_signal` to
    handle SIGTERM and Ctrl-C itself (return True) instead of uvicorn closing at once."""

    def __init__(self, sock: socket.socket, app, render=None, head_seconds: float = HEAD_SECONDS,
                 limits: Limits | None = None, **config):
        import uvicorn  # a heavy optional dependency, needed only to serve

        owner = self

        class Server(uvicorn.Server):
            def handle_exit(self, sig, frame) -> None:
                if not owner.on_signal(sig):
                    super().handle_exit(sig, frame)

        self.sock, self.app, self.url = sock, app, url_of(sock)
        self.loopback = is_loopback(sock.getsockname()[0])
        settings = {"log_level": "warning", "access_log": False, "server_header": False, **config}
        if render is not None:
            settings["http"] = timed_protocol(head_seconds, render, limits)
        self.server = Server(uvicorn.Config(app, **settings))
        self.thread: threading.Thread | None = None

    def on_signal(self, sig) -> bool:
        return False

    def serve_forever(self) -> None:
        try:
            self.server.run(sockets=[self.sock])
        finally:
            self.sock.close()

    def start(self, seconds: float = 30.0) -> str:
        """Serve from a background thread (where no signal arrives; `stop` ends it); the base URL."""
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + seconds
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise AndreaError(f"the server at {self.url} did not start.")
            time.sleep(0.02)
        return self.url

    def stop(self) -> None:
        self.server.should_exit = True
        if self.thread is not None:
            self.thread.join(timeout=30)
