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
    for bad in ("", " ", "127.0.0.1:x", "localhost:", "[::1", "[::1]x", ":80"):
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


def test_the_guard_refuses_foreign_hosts_and_keeps_faults_to_one_line(capfd):
    with TestClient(small_app({"localhost", "127.0.0.1", "::1"}), raise_server_exceptions=False) as c:
        for host in ("evil.example", "127.0.0.1.evil.example", "0x7f.0.0.1", "", "testserver"):
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
