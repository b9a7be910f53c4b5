"""`andrea.web.http`: the plumbing the lab and the API share — fields, bodies, loopback, the
Host guard and the uvicorn wrapper — on a small Starlette app of its own."""

from __future__ import annotations

import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from andrea.web.http import (
    Fields,
    Guard,
    Limits,
    RequestError,
    UvicornServer,
    bind,
    check_text,
    host_name,
    is_loopback,
    logger,
    loopback_hosts,
    read_body,
)

# ---------------------------------------------------------------- fields


def test_null_reads_as_the_default_and_a_none_default_is_optional():
    f = Fields({"k": None, "t": None, "b": None, "c": None, "s": None}, {"k", "t", "b", "c", "s"})
    assert f.integer("k", 10, 1, 20) == 10 and f.integer("k", None, 1, 20) is None
    assert f.number("t", 1.0, 0.0, 2.0) == 1.0 and f.number("t", None, 0.0, 2.0) is None
    assert f.flag("b") is False and f.flag("b", True) is True
    assert f.choice("c", "pca", ("pca", "tsne")) == "pca"
    with pytest.raises(RequestError, match="s must be a non-empty string") as e:
        f.text("s", 10)
    assert (e.value.status, e.value.param) == (400, "s")


def test_wrong_values_are_one_sentence_naming_the_field():
    f = Fields({"k": True, "t": 0, "x": 10**5000, "w": "\ud800", "long": "abcdef", "words": ["a", ""],
                "y": 10**50}, {"k", "t", "x", "w", "long", "words", "y"})
    cases = [(lambda: f.integer("k", 1, 1, 20), "k must be an integer from 1 to 20, got true."),
             (lambda: f.number("t", 1, 0.0, 1.0, lo_open=True), "t must be a number in (0, 1], got 0."),
             (lambda: f.integer("x", 1, 0, 9), "x must be an integer from 0 to 9, got a number too long to show."),
             (lambda: f.integer("y", 1, 0, 9), "y must be an integer from 0 to 9, got 1000000000"),
             (lambda: f.text("w", 10), "w is not valid Unicode (it holds a lone surrogate)."),
             (lambda: f.text("long", 3), "long is 6 characters; at most 3 are taken."),
             (lambda: f.words("words", 1, 3, 5, "a map"), "words must be a list of non-empty strings of at most 5"),
             (lambda: f.choice("t", "a", ("a", "b")), "t must be one of a, b, got 0.")]
    for read, message in cases:
        with pytest.raises(RequestError) as e:
            read()
        assert e.value.message.startswith(message) and len(e.value.message) < 120, e.value.message
    with pytest.raises(RequestError, match="unknown field 'path'; this endpoint takes no fields") as e:
        Fields({"path": "/etc"}, set())
    assert e.value.param == "path"
    assert check_text("cat", "word", 3) == "cat"


# ---------------------------------------------------------------- loopback and Host


def test_loopback_addresses_ipv4_mapped_too():
    for address in ("127.0.0.1", "127.0.0.2", "127.255.255.254", "::1", "::ffff:127.0.0.1", "[::1]", "::1%lo"):
        assert is_loopback(address), address
    for address in ("0.0.0.0", "::", "10.0.0.1", "::ffff:10.0.0.1", "192.168.1.2", "localhost", "0x7f.0.0.1", ""):
        assert not is_loopback(address), address


def test_host_names_as_a_host_header_writes_them():
    assert host_name("LocalHost:8000") == "localhost" and host_name("127.0.0.1") == "127.0.0.1"
    assert host_name("[::1]:80") == "::1" and host_name("[::FFFF:127.0.0.1]:9") == "127.0.0.1"
    assert host_name("[0:0:0:0:0:0:0:1]") == "::1"
    for bad in ("", " ", "127.0.0.1:x", "localhost:", "[::1", "[::1]x", ":80", "127.0.0.1%x", "127.0.0.1%25lo:80",
                "[::1%lo]", "[fe80::1%eth0]:8000", "localhost%x"):
        assert host_name(bad) is None, bad


def test_the_allowed_hosts_on_loopback_and_none_elsewhere():
    assert loopback_hosts("10.0.0.1") is None and loopback_hosts("0.0.0.0", "0.0.0.0") is None
    names = loopback_hosts("::ffff:127.0.0.1", "::ffff:127.0.0.1")
    assert names == {"localhost", "127.0.0.1", "::1"}
    assert loopback_hosts("127.0.0.2", "Localhost") == {"localhost", "127.0.0.1", "::1", "127.0.0.2"}
    for foreign in ("evil.example", "127.0.0.1.evil.example", "localhost.evil.example", "0x7f.0.0.1", "127.1",
                    "2130706433", ""):
        assert host_name(foreign) not in names, foreign


# ---------------------------------------------------------------- the guard and the body, on a small app


def small_app(allowed_hosts=None, limit: int = 64):
    async def echo(request):
        try:
            return JSONResponse({"got": await read_body(request, limit, seconds=5)})
        except RequestError as e:
            return JSONResponse({"error": e.message, "code": e.code}, status_code=e.status)

    async def broken(request):
        raise RuntimeError("disk on fire")

    app = Starlette(routes=[Route("/echo", echo, methods=["POST"]), Route("/broken", broken, methods=["GET"])])
    return Guard(app, allowed_hosts, lambda e: {"error": e.message, "code": e.code}, logger("test"),
                 {"X-Frame-Options": "DENY"})


def test_the_body_reader():
    with TestClient(small_app()) as c:
        json_type = {"content-type": "application/json; charset=utf-8"}
        assert c.post("/echo", json={"a": 1}).json() == {"got": {"a": 1}}
        assert c.post("/echo", content=b"  ", headers=json_type).json() == {"got": {}}
        for content, headers, status, message in (
                (b'{"a": 1}', {"content-type": "text/plain"}, 400, "Content-Type: application/json"),
                (b'{"a": 1}', {}, 400, "Content-Type: application/json"),
                (b"[1]", json_type, 400, "must be a JSON object"),
                (b"{x", json_type, 400, "not valid JSON"),
                (b'{"a": "' + b"x" * 100 + b'"}', json_type, 413, "larger than 64 bytes")):
            r = c.post("/echo", content=content, headers=headers)
            assert r.status_code == status and message in r.json()["error"], r.text


@pytest.mark.hostile
def test_the_guard_refuses_foreign_hosts_and_keeps_faults_to_one_line(capfd):
    with TestClient(small_app({"localhost", "127.0.0.1", "::1"}), raise_server_exceptions=False) as c:
        for host in ("evil.example", "127.0.0.1.evil.example", "0x7f.0.0.1", "", "testserver", "127.0.0.1%x",
                     "[::1%lo]:80"):
            r = c.post("/echo", json={}, headers={"host": host})
            assert r.status_code == 400 and r.json()["code"] == "invalid_host", host
            assert r.headers["x-frame-options"] == "DENY"
        assert c.post("/echo", json={}, headers={"host": "localhost:8000"}).status_code == 200
        r = c.get("/broken", headers={"host": "[::1]:80"})
        assert r.status_code == 500
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err
    assert "test: request to /broken failed: RuntimeError: disk on fire" in err


def test_the_uvicorn_server_in_a_thread_on_an_ipv4_mapped_loopback_address():
    try:
        sock = bind("::ffff:127.0.0.1", 0)
    except Exception as e:  # a machine without IPv6
        pytest.skip(f"cannot listen on ::ffff:127.0.0.1: {e}")
    hosts = loopback_hosts(sock.getsockname()[0], "::ffff:127.0.0.1")
    server = UvicornServer(sock, small_app(hosts), lifespan="off")
    url = server.start()
    try:
        assert server.loopback and url.startswith("http://[::ffff:127.0.0.1]:")
        port = sock.getsockname()[1]
        r = httpx.post(f"http://127.0.0.1:{port}/echo", json={"a": 1}, timeout=30)
        assert r.status_code == 200 and r.json() == {"got": {"a": 1}}
        r = httpx.post(f"http://127.0.0.1:{port}/echo", json={}, headers={"host": "evil.example"}, timeout=30)
        assert r.status_code == 400
    finally:
        server.stop()
    assert not server.thread.is_alive()


@pytest.mark.hostile
@pytest.mark.parametrize("value", [10**400, -(10**400), 2**1030])
def test_a_number_too_large_for_a_float_is_refused_not_a_500(value):
    """temperature or top_p written as a 401-digit integer: compared as sent, refused in the field's
    sentence (math.isfinite raised OverflowError before, a 500 from both servers)."""
    from andrea.web.http import Fields, RequestError

    with pytest.raises(RequestError, match="temperature must be a number in"):
        Fields({"temperature": value}, {"temperature"}).number("temperature", 1.0, 0, 2)
    assert Fields({"top_p": 1}, {"top_p"}).number("top_p", 1.0, 0, 1, lo_open=True) == 1.0


# ---------------------------------------------------------------- slow and greedy clients


def render(e: RequestError) -> dict:
    return {"error": e.message, "code": e.code}


def read_all(sock, seconds: float = 10.0) -> bytes:
    """What the server sends until it closes the connection."""
    sock.settimeout(seconds)
    out = b""
    while chunk := sock.recv(65536):
        out += chunk
    return out


def response_json(raw: bytes) -> tuple[int, dict]:
    import json

    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


@pytest.mark.hostile
def test_a_request_head_that_does_not_arrive_in_time_is_408_and_the_connection_closes():
    """Half a request, then nothing (or a header line now and then): the connection is answered in
    the server's shape and closed, on a fresh connection and on one kept alive after a reply."""
    import socket
    import time

    server = UvicornServer(bind("127.0.0.1", 0), small_app(), render=render, head_seconds=0.5, lifespan="off")
    server.start()
    port = server.sock.getsockname()[1]
    try:
        with socket.create_connection(("127.0.0.1", port)) as s:
            t0 = time.monotonic()
            s.sendall(b"POST /echo HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            time.sleep(0.3)
            s.sendall(b"X-Slow: 1\r\n")  # trickling header lines does not reset the deadline
            status, body = response_json(read_all(s))
            assert status == 408 and body["code"] == "request_timeout" and time.monotonic() - t0 < 5
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(b'POST /echo HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n'
                      b'Content-Length: 2\r\n\r\n{}')
            s.settimeout(10)
            assert s.recv(65536).startswith(b"HTTP/1.1 200")
            time.sleep(0.6)  # the first request was whole and in time: answered, not cut
            s.sendall(b"GET /echo HTTP/1.1\r\n")  # the next one stalls: 408 after its own deadline
            status, body = response_json(read_all(s))
            assert status == 408 and "did not arrive within 0.5 s" in body["error"]
        r = httpx.post(f"http://127.0.0.1:{port}/echo", json={"a": 1}, timeout=30)  # the server goes on
        assert r.json() == {"got": {"a": 1}}
    finally:
        server.stop()


@pytest.mark.hostile
def test_connections_over_the_limit_or_one_addresss_share_are_answered_in_the_servers_shape():
    """One client address holding its share of connections is refused more (429) as they open,
    while another address is still served; past the server's limit every new one gets 503; each
    answer is the server's JSON, never a plain-text 503, and the connection closes."""
    import socket

    limits = Limits(connections=4, per_client=2)
    server = UvicornServer(bind("127.0.0.1", 0), small_app(), render=render, limits=limits, lifespan="off")
    server.start()
    port = server.sock.getsockname()[1]

    def connect(source: str):
        s = socket.socket()
        s.bind((source, 0))
        s.connect(("127.0.0.1", port))
        return s

    def post(source: str) -> tuple[int, dict]:
        with connect(source) as s:
            s.sendall(b'POST /echo HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n'
                      b'Connection: close\r\nContent-Length: 2\r\n\r\n{}')
            return response_json(read_all(s, 10))

    held = []
    try:
        held += [connect("127.0.0.2"), connect("127.0.0.2")]  # idle: within the head's deadline
        status, body = post("127.0.0.2")
        assert (status, body["code"]) == (429, "too_many_connections") and "holds 2 connections" in body["error"]
        assert post("127.0.0.1") == (200, {"got": {}})  # another address is served
        held += [connect("127.0.0.3"), connect("127.0.0.3")]
        status, body = post("127.0.0.1")
        assert (status, body["code"]) == (503, "server_busy") and "holds 4 connections" in body["error"]
    finally:
        for s in held:
            s.close()
        server.stop()
