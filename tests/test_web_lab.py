"""The lab's web server: each endpoint returns what the library functions return, bad requests
get one JSON sentence (never a traceback), no request reaches a file, and the real uvicorn server
and the `andrea lab` command serve the page on loopback."""

from __future__ import annotations

import builtins
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from helpers import LONG_INT, raw_get_at
from starlette.testclient import TestClient

import andrea.web
from andrea.cli import main
from andrea.decoding.generate import generate_steps
from andrea.inside import blocks, embed
from andrea.inside.wordsim import LESSON_PAIRS, LESSON_RELATED
from andrea.web import lab as web
from andrea.web.lab import LabServer, create_app

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def subject(lab_checkpoint):
    return embed.load_subject(lab_checkpoint)


@pytest.fixture(scope="module")
def client(subject):
    with TestClient(create_app(subject), raise_server_exceptions=False) as c:
        yield c


def post(client, path, body):
    r = client.post(path, json=body)
    return r.status_code, r.json()


# ---------------------------------------------------------------- one source of truth


def test_the_page_and_its_assets_are_served_from_the_installed_packages(client):
    r = client.get("/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    page = r.text
    assert "/static/plotly.min.js" in page and "/static/lab.js" in page
    assert "http://" not in page and "https://" not in page  # nothing from elsewhere
    for name, kind in (("lab.js", "javascript"), ("lab.css", "css"), ("plotly.min.js", "javascript"), ("favicon.svg", "svg")):
        r = client.get(f"/static/{name}")
        assert r.status_code == 200 and kind in r.headers["content-type"], name
    bundle = client.get("/static/plotly.min.js").content
    import plotly

    with open(os.path.join(os.path.dirname(plotly.__file__), "package_data", "plotly.min.js"), "rb") as f:
        assert bundle == f.read()
    assert "default-src 'self'" in r.headers["content-security-policy"]


def test_endpoints_return_what_the_library_returns(client, subject):
    m, tok = subject.model, subject.tokenizer
    code, r = post(client, "/api/token", {"word": "cat", "k": 5, "metric": "dot", "whole_words": True})
    assert code == 200
    for which in embed.TABLES:
        assert r["neighbours"][which] == embed.neighbours(m, tok, "cat", 5, "dot", which, whole_words=True)["neighbours"]
    assert r["word"]["form"] == "word-initial" and r["word"]["text"] == " cat"
    code, r = post(client, "/api/compare", {"a": "cat", "b": "dog"})
    assert code == 200 and r == json.loads(json.dumps(embed.compare(m, tok, "cat", "dog")))
    code, r = post(client, "/api/lens", {"prompt": "the cat sat", "k": 3})
    assert code == 200 and r == json.loads(json.dumps(blocks.logit_lens(m, tok, "the cat sat", 3)))
    code, r = post(client, "/api/attention", {"prompt": "the cat sat"})
    expected = blocks.attention(m, tok, "the cat sat")
    assert code == 200 and r["pieces"] == expected["pieces"]
    np.testing.assert_allclose(r["patterns"], expected["patterns"], atol=1e-4)
    code, r = post(client, "/api/map", {"words": ["cat", "dog", "mat", "kings"]})
    assert code == 200 and r == json.loads(json.dumps(embed.map_points(m, tok, ["cat", "dog", "mat", "kings"])))
    code, r = post(client, "/api/map", {"top": 12, "method": "tsne"})
    assert code == 200 and r["method"] == "tsne" and len(r["points"]) == 12
    code, r = post(client, "/api/params", {"preset": "andrea-120m"})
    assert code == 200 and r["rows"][-1]["count"] == 98_737_152
    code, r = post(client, "/api/params", {})
    assert r["rows"][-1]["count"] == m.num_params()
    r = client.get("/api/positions").json()
    sim = embed.positions(m)["similarity"]
    assert r["by_distance"] == pytest.approx(embed.similarity_by_distance(sim), abs=1e-6)
    assert len(r["heatmap"]) == m.config.block_size
    info = client.get("/api/info").json()
    assert info["config"]["n_embd"] == m.config.n_embd and "cat" in info["suggestions"]
    # the page's lesson pairs are andrea.inside.wordsim's, related first (lab.js keeps no copy)
    assert info["lesson_pairs"] == [list(p) for p in LESSON_PAIRS] and info["lesson_related"] == len(LESSON_RELATED)
    assert "Tuesday" not in (Path(andrea.web.__file__).parent / "static" / "lab.js").read_text()


def test_generation_streams_the_library_tokens(client, subject):
    settings = {"max_new_tokens": 8, "temperature": 0.9, "top_k": 20, "seed": 3}
    with client.stream("POST", "/api/generate", json={"prompt": "the cat", **settings}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("application/x-ndjson")
        lines = [json.loads(line) for line in r.iter_lines() if line]
    steps = list(generate_steps(subject.model, subject.tokenizer, "the cat", **settings))
    assert lines[-1] == {"done": True, "tokens": len(steps)}
    assert lines[:-1] == json.loads(json.dumps(steps))


# ---------------------------------------------------------------- bad requests


BAD = [
    ("/api/token", {"word": ""}, "non-empty"),
    ("/api/token", {"word": "x" * 101}, "at most 100"),
    ("/api/token", {"word": "#99999"}, "out of range"),
    ("/api/token", {"word": "cat", "k": 0}, "k must be an integer from 1"),
    ("/api/token", {"word": "cat", "k": 10**9}, "k must be an integer from 1"),
    ("/api/token", {"word": "cat", "k": "5"}, "k must be an integer"),
    ("/api/token", {"word": "cat", "metric": "euclid"}, "metric must be one of"),
    ("/api/token", {"word": "cat", "bare": "yes"}, "true or false"),
    ("/api/token", {"word": "cat", "path": "/etc/passwd"}, "unknown field 'path'"),
    ("/api/compare", {"a": "cat"}, "b must be a non-empty string"),
    ("/api/map", {"words": ["cat"]}, "2 to 200 words"),
    ("/api/map", {"top": 1}, "top must be an integer from 2"),
    ("/api/map", {"top": 1000, "method": "tsne"}, "to 500"),
    ("/api/map", {"top": 10, "method": "umap"}, "method must be one of"),
    ("/api/params", {"preset": "../../etc/passwd"}, "preset must be one of"),
    ("/api/attention", {"prompt": "x" * 2001}, "at most 2,000"),
    ("/api/attention", {"prompt": "the cat " * 40}, "more than this view's limit of 64 tokens"),
    ("/api/lens", {"prompt": "the cat sat", "k": 21}, "k must be an integer from 1 to 20"),
    ("/api/lens", {"prompt": None}, "prompt must be a non-empty string"),
    ("/api/layers", {"uses": 65}, "uses must be an integer from 1 to 64"),
    ("/api/layers", {"ppmi": "yes"}, "true or false"),
    # a bare model file: no run, so no training text to average a word's uses over
    ("/api/layers", {}, "the run's training text, and that is not known here"),
    ("/api/generate", {"prompt": "the", "temperature": -1}, "temperature must be a number"),
    ("/api/generate", {"prompt": "the", "temperature": float("inf")}, "temperature must be a number"),
    ("/api/generate", {"prompt": "the", "top_p": float("nan")}, "top_p must be a number"),
    ("/api/generate", {"prompt": "the", "top_p": 0}, "top_p must be a number in (0, 1]"),
    ("/api/generate", {"prompt": "the", "max_new_tokens": 100_000}, "max_new_tokens must be an integer from 1 to 500"),
    ("/api/generate", {"prompt": "the", "top_k": 0}, "top_k must be an integer"),
    # a lone surrogate is valid JSON but not valid Unicode
    ("/api/token", {"word": "\ud800"}, "not valid Unicode"),
    ("/api/compare", {"a": "cat", "b": "\ud800"}, "not valid Unicode"),
    ("/api/map", {"words": ["cat", "dog\ud800"]}, "not valid Unicode"),
    ("/api/generate", {"prompt": "the \ud800"}, "not valid Unicode"),
]


@pytest.mark.parametrize("path,body,message", BAD, ids=[f"{p}:{m}" for p, _, m in BAD])
def test_bad_values_get_one_json_sentence(client, capfd, path, body, message):
    raw = json.dumps(body, allow_nan=True)
    r = client.post(path, content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 400 and set(r.json()) == {"error"}
    assert message in r.json()["error"]
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err


def test_bodies_methods_and_paths(client, capfd):
    r = client.post("/api/token", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"] == "the request body is not valid JSON (Expecting property name enclosed in double quotes at line 1)."
    r = client.post("/api/token", content=b"[1, 2]", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "JSON object" in r.json()["error"]
    r = client.post("/api/token", content=b"\xff\xfe", headers={"content-type": "application/json"})
    assert r.status_code == 400
    r = client.post("/api/token", content=b"{" + b" " * (web.MAX_BODY + 10) + b"}", headers={"content-type": "application/json"})
    assert r.status_code == 413 and "larger than" in r.json()["error"]
    assert client.get("/api/token").status_code == 405 and "not allowed" in client.get("/api/token").json()["error"]
    assert client.get("/api/info?file=/etc/passwd").status_code == 400
    for path in ("/nothing", "/static/", "/static/server.py", "/static/index.html", "/static/../server.py",
                 "/static/..%2f..%2fpyproject.toml", "/static/%2e%2e/%2e%2e/pyproject.toml", "/static/..\\..\\pyproject.toml",
                 "/api/../../etc/passwd", "/static/plotly.min.js/../../../../etc/passwd", "//etc/passwd"):
        r = client.get(path)
        assert r.status_code in (404, 405), path
        assert set(r.json()) == {"error"}, path
        assert "root:" not in r.text and "[project]" not in r.text, path
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err


def test_a_post_must_declare_json_and_null_reads_as_the_default(client):
    """As `andrea serve` does: a POST not declared as JSON (a form a page elsewhere could send
    without asking) is refused, an empty one has no fields, and a field given as null is absent."""
    r = client.post("/api/token", content=b'{"word": "cat"}', headers={"content-type": "text/plain"})
    assert r.status_code == 400 and "Content-Type: application/json" in r.json()["error"]
    assert client.post("/api/token", content=b'{"word": "cat"}').status_code == 400
    r = client.post("/api/params", content=b"", headers={"content-type": "application/json"})
    assert r.status_code == 200 and r.json() == client.post("/api/params", json={}).json()
    r = client.post("/api/token", json={"word": "cat", "k": None, "metric": None, "bare": None})
    assert r.status_code == 200 and r.json() == client.post("/api/token", json={"word": "cat"}).json()


def test_no_request_opens_a_file(client, monkeypatch):
    opened = []
    real_open = builtins.open

    def spy(file, *args, **kwargs):
        opened.append(str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", spy)
    monkeypatch.setattr(os, "open", lambda *a, **k: opened.append(str(a[0])) or pytest.fail("os.open"))
    for path, body in (("/api/token", {"word": "cat"}), ("/api/compare", {"a": "../x", "b": "/etc/passwd"}),
                       ("/api/map", {"words": ["/etc/passwd", "cat"]}), ("/api/lens", {"prompt": "/etc/passwd"}),
                       ("/api/attention", {"prompt": "~/.ssh/id_rsa"}), ("/api/params", {"preset": "andrea-tiny"})):
        assert client.post(path, json=body).status_code == 200
    assert client.get("/static/lab.js").status_code == 200
    assert opened == []


def test_a_fault_in_the_server_is_one_line_not_a_traceback(subject, monkeypatch, capfd):
    def broken(self, f):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(web.LabViews, "lens", broken)
    with TestClient(create_app(subject), raise_server_exceptions=False) as c:
        r = c.post("/api/lens", json={"prompt": "the"})
    assert r.status_code == 500 and "RuntimeError" in r.json()["error"] and "disk" not in r.json()["error"]
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err
    assert err.strip().splitlines() == ["andrea lab: lens failed: RuntimeError: disk on fire"]


# ---------------------------------------------------------------- the real server


def raw_get(port: int, path: str, host: str = "127.0.0.1") -> tuple[int, bytes]:
    """One HTTP/1.1 request sent byte for byte (no client normalises the path)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def test_the_uvicorn_server_on_loopback(subject, capfd):
    server = LabServer(subject, "127.0.0.1", 0)
    url = server.start()
    try:
        port = int(url.rsplit(":", 1)[1].strip("/"))
        assert url == f"http://127.0.0.1:{port}/" and server.sock.getsockname()[0] == "127.0.0.1"
        with httpx.Client(base_url=url, timeout=30) as c:
            assert "andrea lab" in c.get("/").text
            r = c.post("/api/token", json={"word": "cat", "k": 3})
            assert r.status_code == 200 and len(r.json()["neighbours"]["input"]) == 3
            r = c.post("/api/attention", json={"prompt": "x" * 5000})
            assert r.status_code == 400 and "at most 2,000" in r.json()["error"]
            r = c.post("/api/token", content=b"x" * 100_000, headers={"content-type": "application/json"})
            assert r.status_code == 413
        for path in ("/static/../../../../etc/passwd", "/static/..%2f..%2f..%2f..%2fetc%2fpasswd", "/../../etc/passwd",
                     "/static/%2e%2e%2f%2e%2e%2fpyproject.toml"):
            status, body = raw_get(port, path)
            assert status in (400, 404) and b"root:" not in body and b"[project]" not in body, path
        # a page elsewhere that points a DNS name at 127.0.0.1 is refused (DNS rebinding)
        status, _ = raw_get(port, "/api/info", host="attacker.example")
        assert status == 400
        assert raw_get(port, "/api/info", host=f"localhost:{port}")[0] == 200
    finally:
        server.stop()
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err


def test_lab_command_errors(capsys, lab_checkpoint):
    assert main(["lab"]) == 2
    assert "--checkpoint" in capsys.readouterr().err
    assert main(["lab", "--checkpoint", str(lab_checkpoint), "--port", "70000"]) == 2
    assert "argument --port: must be an integer from 0 to 65,535," in capsys.readouterr().err
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        assert main(["lab", "--checkpoint", str(lab_checkpoint), "--port", str(port)]) == 2
        err = capsys.readouterr().err
        assert f"port {port} is already in use" in err and len(err.strip().splitlines()) == 1


def test_lab_command_serves_until_interrupted(lab_checkpoint):
    proc = subprocess.Popen([sys.executable, "-m", "andrea", "lab", "--checkpoint", str(lab_checkpoint), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url, said = None, []
        deadline = time.monotonic() + 60
        while url is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            said.append(line)
            if line.startswith("open http://127.0.0.1:"):
                url = line.split()[1]
        assert url, proc.stderr.read()
        # the checkpoint's folder holds no embeddings/: the Growth view says so before it is opened
        assert any(line.startswith(f"growth view: off; the checkpoint {lab_checkpoint} has no embedding snapshots")
                   for line in said), said
        assert httpx.get(url + "api/info", timeout=30).json()["config"]["n_layer"] == 2
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0 and "stopped" in out and "Traceback" not in err


# ---------------------------------------------------------------- hostile input


@pytest.mark.hostile
def test_the_lab_answers_400_to_bodies_at_python_limits(lab_checkpoint):
    """A request body holding a 5,000-digit number, or nested 8,000 or 990 deep (within the body's
    16 KB): 400 with one sentence, never 500."""
    from starlette.testclient import TestClient

    from andrea.inside import embed
    from andrea.web.lab import create_app

    with TestClient(create_app(embed.load_subject(lab_checkpoint)), raise_server_exceptions=False) as client:
        for body in ('{"k": ' + LONG_INT + "}", '{"k": ' + "[" * 8000 + "]" * 8000 + "}",
                     '{"k": ' + "[" * 990 + "]" * 990 + "}"):
            r = client.post("/api/token", content=body, headers={"content-type": "application/json"})
            assert r.status_code == 400, (r.status_code, r.text[:200])
            assert r.json()["error"].startswith("the request body ")

@pytest.mark.hostile
@pytest.mark.parametrize("address", ["127.0.0.1", "127.0.0.2", "::1", "::ffff:127.0.0.1"])
def test_the_lab_on_any_loopback_address_answers_only_this_machines_names(lab_checkpoint, address):
    """A DNS-rebinding page reaches the lab under its own name (Host: evil.example) on whatever
    loopback address the lab listens on: refused on 127.0.0.2, ::1 and ::ffff:127.0.0.1 (loopback,
    though Python 3.11's ipaddress does not say so) as on 127.0.0.1."""
    from andrea.inside import embed
    from andrea.web.lab import LabServer

    try:
        server = LabServer(embed.load_subject(lab_checkpoint), address, 0)
    except Exception as e:  # a machine without IPv6 loopback
        pytest.skip(f"cannot listen on {address}: {e}")
    server.start()
    try:
        port = server.sock.getsockname()[1]
        named = f"[{address}]" if ":" in address else address
        assert server.loopback
        for foreign in ("evil.example", f"evil.example:{port}", "127.0.0.1.evil.example", "0x7f.0.0.1", ""):
            assert raw_get_at(address, port, foreign) == 400, foreign
        assert raw_get_at(address, port, f"{named}:{port}") == 200
        assert raw_get_at(address, port, f"localhost:{port}") == 200
    finally:
        server.stop()


def test_the_lesson_view_walks_every_claim_on_the_loaded_model(client, subject):
    """/api/lesson: the nine steps of andrea.inside.lessons.embedding in order, each with a verdict; a bare model file
    has no snapshots, so the two steps that need them say so."""
    from andrea.inside.lessons.embedding import STEPS
    from andrea.inside.lessons.report import VERDICTS

    r = client.get("/api/lesson")
    assert r.status_code == 200
    steps = r.json()["steps"]
    assert [s["key"] for s in steps] == [f.__name__.removeprefix("step_") for f in STEPS]
    assert all(s["verdict"] in VERDICTS and s["claim"] and s["how"] for s in steps)
    by_key = {s["key"]: s for s in steps}
    assert by_key["lookup"]["verdict"] == "holds" and by_key["untied"]["verdict"] == "holds"
    assert by_key["init"]["verdict"] == by_key["sparse"]["verdict"] == "cannot check"
    assert client.get("/api/lesson").json() == r.json()  # computed once


@pytest.mark.hostile
def test_a_slash_too_many_is_a_404_not_a_redirect(client):
    for method, path in (("POST", "/api/token/"), ("POST", "/api/compare/"), ("GET", "/api/growth/"),
                         ("GET", "/api/info/")):
        r = client.request(method, path, json={"word": "cat"}, follow_redirects=False)
        assert r.status_code == 404 and set(r.json()) == {"error"}, (method, path, r.status_code)


def test_compare_gives_a_zero_rows_angle_as_null_as_the_cli_does(client, subject):
    m, tok = subject.model, subject.tokenizer
    ids = embed.lookup(tok, "cat", m.config.vocab_size).ids
    kept = m.wte.weight[ids].clone()
    with torch.no_grad():
        m.wte.weight[ids] = 0
    try:
        code, r = post(client, "/api/compare", {"a": "cat", "b": "dog"})
        assert code == 200 and r["input"]["angle_deg"] is None and r["input"]["cos"] == 0
        assert r["output"]["angle_deg"] is not None
    finally:
        with torch.no_grad():
            m.wte.weight[ids] = kept
