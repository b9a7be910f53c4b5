"""`andrea serve` under load: concurrent streaming clients against one at a time, then a soak.

The server runs as `andrea serve` under `/usr/bin/time -v` on 127.0.0.1; the clients are asyncio
connections from this process (plain HTTP/1.1, so the load generator costs little of the CPU the
server shares). The same set of requests (prompts of different lengths, each with its own seed)
is sent one at a time and by 4, 16 and 64 clients at once, --rounds times (the levels taking
turns); for each level, side by side: aggregate tokens/s (the median round's, and every round's),
time to first token and per-token latency (p50, p95 over every round; per token: a request's time
after its first token over its further tokens), and the server's peak RSS (VmRSS sampled from /proc
while the level ran). Seeded replies do not depend on the batch, so every request's text must be
the same at every level and in every round, and the script checks it.

The soak then runs clients for --soak-seconds with a mix of good requests (streamed and not,
seeded and greedy; greedy ones are compared with the library's greedy generation of the same
prompt, seeded ones with their text above), malformed ones (each must get its 4xx in OpenAI's
error shape) and clients that hang up mid-stream. It checks every good request, the server's RSS
at the end against its RSS after the warm-up (within 10%), that its log holds no traceback, and
that it exits 0 on SIGTERM; /usr/bin/time -v gives the peak RSS of the whole run.

    .venv/bin/python benchmarks/bench_serve.py                           # newest runs/main-*
    .venv/bin/python benchmarks/bench_serve.py --checkpoint runs/a --requests 16 --soak-seconds 20
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import machine_line, md_table, say  # noqa: E402

LEVELS = (1, 4, 16, 64)
BASE_PROMPTS = ["The people of the United States", "And it came to pass", "Call me", "To be, or not to be",
                "Fellow-Citizens of the Senate and of the House of Representatives", "In the beginning",
                "It is a truth universally acknowledged", "The king said unto them", "Now is the winter of",
                "We hold these truths", "The whale", "O Romeo", "Mr. Speaker, Mr. President", "Blessed are the",
                "It was the best of times", "The ship sailed"]


# ---------------------------------------------------------------- a light HTTP client


@dataclass
class Result:
    status: int = 0
    text: str = ""
    finish: str | None = None
    tokens: int = 0
    ttft: float | None = None
    per_token: float | None = None
    error: str | None = None
    events: list = field(default_factory=list)


def request_bytes(path: str, body, port: int, content_type: str = "application/json") -> bytes:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(raw)}\r\nConnection: close\r\n\r\n")
    return head.encode() + raw


async def _read_body(reader, headers: str):
    """Yield the response body's pieces as they arrive (chunked or by length)."""
    if "transfer-encoding: chunked" in headers.lower():
        while True:
            size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
            if size == 0:
                return
            data = await reader.readexactly(size + 2)
            yield data[:-2]
    else:
        m = re.search(r"content-length:\s*(\d+)", headers, re.I)
        yield await (reader.readexactly(int(m.group(1))) if m else reader.read())


async def send(port: int, body, path: str = "/v1/completions", content_type: str = "application/json",
               hang_up_after: int | None = None) -> Result:
    """One request; a stream is read event by event with their times (hang_up_after: close after
    that many events)."""
    res = Result()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        t0 = time.perf_counter()
        writer.write(request_bytes(path, body, port, content_type))
        await writer.drain()
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
        res.status = int(head.split()[1])
        buffer, raw = b"", b""
        async for piece in _read_body(reader, head):
            if "text/event-stream" not in head.lower():
                raw += piece
                continue
            buffer += piece
            while b"\n\n" in buffer:
                event, buffer = buffer.split(b"\n\n", 1)
                res.events.append((time.perf_counter() - t0, event[6:]))
                if hang_up_after is not None and len(res.events) >= hang_up_after:
                    return res
        if raw:
            res.events.append((time.perf_counter() - t0, raw))
    finally:
        writer.close()
    return res


def read_stream(res: Result) -> Result:
    """Text, finish reason, tokens and latencies of a streamed completion's events."""
    times = []
    for t, data in res.events:
        if data == b"[DONE]":
            continue
        obj = json.loads(data)
        if "error" in obj:
            res.error = obj["error"]["message"]
        if obj.get("usage"):
            res.tokens = obj["usage"]["completion_tokens"]
        for choice in obj.get("choices", []):
            piece = choice.get("text") or (choice.get("delta") or {}).get("content") or ""
            if piece:
                res.text += piece
                times.append(t)
            res.finish = choice.get("finish_reason") or res.finish
    if times:
        res.ttft = times[0]
        if res.tokens > 1:
            res.per_token = (res.events[-1][0] - times[0]) / (res.tokens - 1)
    return res


# ---------------------------------------------------------------- the server


class ServerProcess:
    """`andrea serve` under /usr/bin/time -v (when there is one), its log in a file, its RSS sampled."""

    def __init__(self, checkpoint: str, max_batch: int, max_queue: int, log_path: Path, threads: int | None = None):
        self.time_v = Path("/usr/bin/time").exists()
        cmd = [sys.executable, "-m", "andrea", "serve", "--checkpoint", checkpoint, "--port", "0", "--max-batch",
               str(max_batch), "--max-queue", str(max_queue), "--drain-seconds", "20"]
        cmd += ["--threads", str(threads)] if threads else []
        if self.time_v:
            cmd = ["/usr/bin/time", "-v", *cmd]
        self.log_path = log_path
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.log, text=True)
        self.banner = []
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise SystemExit(f"bench_serve: the server did not start; its log:\n{log_path.read_text()[-2000:]}")
            self.banner.append(line.rstrip())
            if line.startswith("OpenAI API at "):
                break
        self.port = int(line.split()[3].split(":")[2].split("/")[0])
        found = re.search(r"(\d+) torch threads?, weights laid out for (\d+)", "\n".join(self.banner))
        self.threads, self.layouts = int(found.group(1)), int(found.group(2))
        self.pid = self._server_pid()
        self.peak = 0
        self._sampling = True
        self.sampler = threading.Thread(target=self._sample, daemon=True)
        self.sampler.start()

    def _server_pid(self) -> int:
        if not self.time_v:
            return self.proc.pid
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()
        return int(children[0])

    def rss(self) -> int:
        """The server's resident memory now, in bytes (0 once it has gone)."""
        try:
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            pass
        return 0

    def _sample(self) -> None:
        while self._sampling:
            self.peak = max(self.peak, self.rss())
            time.sleep(0.05)

    def reset_peak(self) -> None:
        self.peak = self.rss()

    def stop(self) -> tuple[int, str, int | None]:
        """SIGTERM to the server; (its exit status, its log, peak RSS in bytes by /usr/bin/time -v)."""
        os.kill(self.pid, signal.SIGTERM)
        try:
            self.proc.stdout.read()
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.kill(self.pid, signal.SIGKILL)
            self.proc.wait()
        self._sampling = False
        self.log.close()
        log = self.log_path.read_text(errors="replace")
        m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", log)
        status = re.search(r"Exit status: (\d+)", log)
        rc = int(status.group(1)) if status else self.proc.returncode
        return rc, log, int(m.group(1)) * 1024 if m else None


# ---------------------------------------------------------------- the levels


def prompts(n: int, tokenizer, limit: int) -> list[str]:
    """n prompts of different lengths: a base prompt with up to five more after it, the last
    ones dropped until it is at most `limit` tokens."""
    rng = random.Random(0)
    out = []
    for i in range(n):
        parts = [BASE_PROMPTS[(i + j) % len(BASE_PROMPTS)] for j in range(rng.randint(0, 5) + 1)]
        while len(parts) > 1 and len(tokenizer.encode(". ".join(parts))) > limit:
            parts.pop()
        out.append(". ".join(parts))
    return out


def request_set(texts: list[str], max_tokens: int, temperature: float) -> list[dict]:
    return [{"prompt": p, "max_tokens": max_tokens, "temperature": temperature, "top_k": 40, "seed": i,
             "stream": True, "stream_options": {"include_usage": True}} for i, p in enumerate(texts)]


async def run_level(port: int, requests: list[dict], clients: int) -> tuple[list[Result], float]:
    """Every request, sent by `clients` clients each taking the next one when its last ends."""
    todo = list(range(len(requests)))
    results: list[Result | None] = [None] * len(requests)

    async def client():
        while todo:
            i = todo.pop(0)
            results[i] = read_stream(await send(port, requests[i]))

    t0 = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    return results, time.perf_counter() - t0


def pct(values, q: float) -> float:
    values = sorted(v for v in values if v is not None)
    if not values:
        return float("nan")
    return values[min(len(values) - 1, max(0, round(q * (len(values) - 1))))]


def levels(server: ServerProcess, requests: list[dict], level_list, rounds: int) -> tuple[list[list], dict, list[str], list[str]]:
    """(table rows, figures by level, notes, the texts): the whole request set at each level, `rounds`
    times, the levels taking turns (so a slower spell of the machine falls on every level alike).
    Tokens/s and seconds are the median round's; the latencies are over every round's requests."""
    runs: dict[int, list] = {c: [] for c in level_list}  # clients: [(results, seconds)] a round
    peak = {c: 0 for c in level_list}
    for r in range(rounds):
        for clients in level_list:
            server.reset_peak()
            results, seconds = asyncio.run(run_level(server.port, requests, clients))
            runs[clients].append((results, seconds))
            peak[clients] = max(peak[clients], server.peak)
            tokens = sum(x.tokens for x in results)
            say(f"bench_serve: round {r + 1} of {rounds}, {clients} clients: {tokens / seconds:.0f} tokens/s")
    rows, figures, notes = [], {}, []
    first = [x.text for x in runs[level_list[0]][0][0]]
    for clients in level_list:
        every = [x for results, _ in runs[clients] for x in results]
        bad = [x for x in every if x.status != 200 or x.error or x.finish not in ("stop", "length")]
        if bad:
            notes.append(f"{clients} clients: {len(bad)} requests failed (first: status {bad[0].status}, {bad[0].error})")
        done = [(sum(x.tokens for x in results), sec) for results, sec in runs[clients]]  # (tokens, seconds) a round
        tokens, seconds = sorted(done, key=lambda d: d[0] / d[1])[len(done) // 2]
        f = {"tps": tokens / seconds, "rounds": [t / sec for t, sec in done], "ttft50": pct([x.ttft for x in every], 0.5),
             "ttft95": pct([x.ttft for x in every], 0.95), "tok50": pct([x.per_token for x in every], 0.5),
             "tok95": pct([x.per_token for x in every], 0.95), "rss": peak[clients], "tokens": tokens}
        figures[clients] = f
        base = figures[level_list[0]]["tps"]
        rows.append([("1 (one at a time)" if clients == 1 else str(clients)), len(requests), f"{tokens:,}",
                     f"{seconds:.1f}", f"{f['tps']:.0f}", f"{f['tps'] / base:.2f}×",
                     " / ".join(f"{t:.0f}" for t in f["rounds"]), f"{f['ttft50'] * 1e3:.0f} ms",
                     f"{f['ttft95'] * 1e3:.0f} ms", f"{f['tok50'] * 1e3:.1f} ms", f"{f['tok95'] * 1e3:.1f} ms",
                     f"{f['rss'] / 2**20:.0f} MiB"])
    same = all([x.text for x in results] == first for c in level_list for results, _ in runs[c])
    notes.append(f"every request's text is the same at every level and in every round (seeded replies do not depend "
                 f"on the batch): {'yes' if same else 'NO'}")
    return rows, figures, notes, first


# ---------------------------------------------------------------- the soak


MALFORMED = [
    (b"{not json", "application/json", 400),
    (b'{"prompt": "the", "temperature": NaN}', "application/json", 400),
    (b'{"prompt": "the", "bogus": 1}', "application/json", 400),
    (b'{"prompt": "the", "seed": 1' + b"0" * 5000 + b"}", "application/json", 400),
    (b'{"prompt": ' + b"[" * 50_000 + b"]" * 50_000 + b"}", "application/json", 400),
    (json.dumps({"prompt": "the king said " * 2000}).encode(), "application/json", 400),
    (b'{"prompt": "' + b"a" * 300_000 + b'"}', "application/json", 413),
    (b'{"prompt": "the"}', "text/plain", 400),
    (b'{"prompt": "the", "max_tokens": 100000}', "application/json", 400),
    (b'{"messages": [{"role": "assistant", "content": "hi"}]}', "application/json", 400),
]
CHAT_SOAK = [{"role": "user", "content": "Who are you"}, {"role": "assistant", "content": "A reader of old books."},
             {"role": "user", "content": "What do you read"}]


def references(g, texts: list[str], n_tokens: int) -> tuple[list[str], str]:
    """The library's greedy continuations of texts, and its chat reply (run on as many threads as the
    server lays its weights out for)."""
    from andrea.decoding.generate import Chat

    greedy = [g.generate(p, n_tokens, greedy=True) for p in texts]
    chat = Chat(g, n_tokens, greedy=True)
    chat.turns = [(CHAT_SOAK[0]["content"], CHAT_SOAK[1]["content"])]
    return greedy, "".join(chat.reply(CHAT_SOAK[2]["content"]))


async def soak_one(port: int, rng: random.Random, requests, texts, greedy, chat_reply, n_tokens: int):
    """One random request of the soak: (kind, whether it was answered as it must be, what went wrong)."""
    roll = rng.random()
    if roll < 0.35:
        i = rng.randrange(len(requests))
        r = read_stream(await send(port, requests[i]))
        return "seeded, streamed", r.status == 200 and r.text == texts[i] and not r.error, r.error
    if roll < 0.50:
        j = rng.randrange(len(greedy))
        body = {"prompt": requests[j]["prompt"], "max_tokens": n_tokens, "temperature": 0, "stream": True}
        r = read_stream(await send(port, body))
        return "greedy, streamed", r.status == 200 and r.text == greedy[j] and not r.error, r.error
    if roll < 0.60:
        j = rng.randrange(len(greedy))
        r = await send(port, {"prompt": requests[j]["prompt"], "max_tokens": n_tokens, "temperature": 0})
        text = json.loads(r.events[-1][1])["choices"][0]["text"] if r.status == 200 else None
        return "greedy, whole", text == greedy[j], None if text == greedy[j] else f"status {r.status}"
    if roll < 0.68:
        r = await send(port, {"messages": CHAT_SOAK, "max_tokens": n_tokens, "temperature": 0}, "/v1/chat/completions")
        text = json.loads(r.events[-1][1])["choices"][0]["message"]["content"] if r.status == 200 else None
        return "chat, greedy, whole", text == chat_reply, None if text == chat_reply else f"status {r.status}"
    if roll < 0.85:
        body, kind, status = MALFORMED[rng.randrange(len(MALFORMED))]
        r = await send(port, body, content_type=kind)
        try:
            error = json.loads(r.events[-1][1])["error"]
            shaped = set(error) == {"message", "type", "param", "code"}
        except (ValueError, KeyError, IndexError, TypeError):
            shaped = False
        return "malformed", r.status == status and shaped, f"status {r.status} (expected {status})"
    r = await send(port, {**requests[rng.randrange(len(requests))], "max_tokens": 512}, hang_up_after=rng.randint(1, 4))
    return "hung up mid-stream", r.status == 200, f"status {r.status}"


async def soak(server: ServerProcess, seconds: float, clients: int, requests, texts, greedy, chat_reply,
               n_tokens: int) -> tuple[dict, int, list[str]]:
    """({kind: [sent, as it must be]}, RSS after the warm-up, the first failures)."""
    counts: dict = {}
    failures: list[str] = []
    end = time.monotonic() + seconds
    warm = time.monotonic() + max(2.0, min(30.0, 0.1 * seconds))
    warm_rss = 0

    async def client(k: int):
        rng = random.Random(1000 + k)
        while time.monotonic() < end:
            kind, ok, why = await soak_one(server.port, rng, requests, texts, greedy, chat_reply, n_tokens)
            c = counts.setdefault(kind, [0, 0])
            c[0] += 1
            c[1] += bool(ok)
            if not ok and len(failures) < 5:
                failures.append(f"{kind}: {why}")

    async def watch():
        nonlocal warm_rss
        await asyncio.sleep(max(0.0, warm - time.monotonic()))
        warm_rss = server.rss()

    await asyncio.gather(watch(), *(client(k) for k in range(clients)))
    return counts, warm_rss, failures


# ---------------------------------------------------------------- the report


def newest_main_checkpoint(root: Path = Path("runs")) -> str:
    for name in ("best.safetensors", "latest.safetensors"):
        found = sorted(root.glob(f"main-*/{name}"), key=lambda p: p.stat().st_mtime, reverse=True)
        if found:
            return str(found[0].parent)
    raise SystemExit(f"bench_serve: no runs/main-*/ with a checkpoint under {root}; run `andrea main` (the model the "
                     f"targets are set for) or pass --checkpoint PATH.")


def print_levels(args, server: ServerProcess, model: dict, rows, figures, notes) -> None:
    print(f"## Serving: `andrea serve` under concurrent streaming clients, {model['id']} "
          f"(context {model['context_length']})")
    print()
    print(f"machine: {machine_line()}")
    print(f"server: {server.banner[0].removeprefix('andrea serve: ')}; --max-batch {args.max_batch} --max-queue "
          f"{args.max_queue}{f' --threads {args.threads}' if args.threads else ''}; on 127.0.0.1, the clients in this process (asyncio, plain HTTP/1.1)")
    print(f"requests: {args.requests}, streamed, prompts of 1 to 6 sentences (at most half the context), up to {args.max_tokens} new tokens each, "
          f"temperature {args.temperature:g}, top-k 40, each its own seed; the same set at every level, each level "
          f"{args.rounds} times, the levels taking turns (tokens, seconds and tokens/s: the median round; latencies over "
          f"every round's requests)")
    print()
    print(md_table(["clients", "requests", "tokens", "seconds", "tokens/s", "× one at a time", "tokens/s by round",
                    "TTFT p50", "TTFT p95", "per token p50", "per token p95", "server RSS peak"], rows))
    print()
    for note in notes:
        print(f"- {note}")
    if 16 in figures and 1 in figures:
        x, ttft = figures[16]["tps"] / figures[1]["tps"], figures[16]["ttft95"]
        print(f"- targets at 16 clients: aggregate tokens/s ≥ 4× one at a time: {'met' if x >= 4 else 'not met'} "
              f"({x:.2f}×); TTFT p95 < 1 s: {'met' if ttft < 1 else 'not met'} ({ttft:.2f} s)")
    print()


def print_soak(args, counts: dict, warm_rss: int, end_rss: int, failures, rc: int, log: str, peak) -> None:
    print(f"### Soak: {args.soak_seconds:g} s, {args.soak_clients} clients")
    print()
    rows = [[kind, f"{n:,}", f"{ok:,}"] for kind, (n, ok) in sorted(counts.items())]
    print(md_table(["request", "sent", "answered as it must be"], rows))
    print()
    good = {k: v for k, v in counts.items() if k not in ("malformed", "hung up mid-stream")}
    all_good = all(ok == n for n, ok in good.values()) and all(ok == n for n, ok in counts.values())
    print(f"- every request answered as it must be (good ones complete and equal to their reference, malformed ones "
          f"their 4xx in OpenAI's shape): {'yes' if all_good else 'NO'}")
    for f in failures:
        print(f"  - {f}")
    change = (end_rss - warm_rss) / warm_rss if warm_rss else float("nan")
    print(f"- server RSS after the warm-up {warm_rss / 2**20:.1f} MiB, at the end {end_rss / 2**20:.1f} MiB "
          f"({change:+.1%}; target within 10%: {'met' if abs(change) <= 0.10 else 'not met'})")
    tracebacks = log.count("Traceback")
    print(f"- server log: {len(log.splitlines())} lines, {tracebacks} tracebacks; exit status after SIGTERM: {rc}")
    if peak is not None:
        print(f"- server peak RSS over the whole run (/usr/bin/time -v): {peak / 2**20:.1f} MiB")
    else:
        print("- server peak RSS over the whole run: unmeasured (no /usr/bin/time here)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", help="a checkpoint or run folder (default: the newest runs/main-*)")
    ap.add_argument("--requests", type=int, default=64, help="requests in the set each level sends (default 64)")
    ap.add_argument("--max-tokens", type=int, default=128, help="new tokens per request at most (default 128)")
    ap.add_argument("--temperature", type=float, default=0.8, help="of the request set (default 0.8; 0 is greedy)")
    ap.add_argument("--levels", type=int, nargs="+", default=list(LEVELS), help="clients at once (default 1 4 16 64)")
    ap.add_argument("--rounds", type=int, default=3, help="times each level sends the set, taking turns (default 3)")
    ap.add_argument("--max-batch", type=int, default=64, help="the server's --max-batch (default 64)")
    ap.add_argument("--max-queue", type=int, default=64, help="the server's --max-queue (default 64)")
    ap.add_argument("--threads", type=int, help="the server's --threads (default: the server's own)")
    ap.add_argument("--soak-seconds", type=float, default=300, help="the soak's length (default 300; 0: no soak)")
    ap.add_argument("--soak-clients", type=int, default=16, help="clients at once in the soak (default 16)")
    ap.add_argument("--greedy-tokens", type=int, default=48, help="new tokens of the soak's greedy requests (default 48)")
    args = ap.parse_args()
    if args.levels[0] != 1:
        ap.error("--levels must start with 1 (one at a time): the other levels are compared with it.")
    if args.rounds < 1:
        ap.error("--rounds must be at least 1.")
    checkpoint = args.checkpoint or newest_main_checkpoint()
    work = Path(tempfile.mkdtemp(prefix="bench-serve-"))
    server = ServerProcess(checkpoint, args.max_batch, args.max_queue, work / "server.log", args.threads)
    rc, log, peak = None, "", None
    try:
        import httpx

        model = httpx.get(f"http://127.0.0.1:{server.port}/v1/models", timeout=60).json()["data"][0]
        say(f"bench_serve: server on port {server.port} ({server.threads} torch threads, weights laid out for "
            f"{server.layouts}); references ...")
        import torch

        from andrea.decoding.generate import load

        torch.set_num_threads(server.layouts)  # as the server lays its weights out: the greedy references are its tokens
        g = load(checkpoint)
        texts = prompts(args.requests, g.tokenizer, g.config.block_size // 2)
        greedy, chat_reply = references(g, texts[:8], args.greedy_tokens)
        requests = request_set(texts, args.max_tokens, args.temperature)
        rows, figures, notes, replies = levels(server, requests, args.levels, args.rounds)
        print_levels(args, server, model, rows, figures, notes)
        sys.stdout.flush()
        if args.soak_seconds > 0:
            say(f"bench_serve: soak of {args.soak_seconds:g} s ...")
            counts, warm_rss, failures = asyncio.run(soak(server, args.soak_seconds, args.soak_clients, requests,
                                                          replies, greedy, chat_reply, args.greedy_tokens))
            time.sleep(1.0)
            end_rss = server.rss()
        rc, log, peak = server.stop()
        if args.soak_seconds > 0:
            print_soak(args, counts, warm_rss, end_rss, failures, rc, log, peak)
    finally:
        if server.proc.poll() is None:
            server.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0 if rc == 0 and "Traceback" not in log else 1


if __name__ == "__main__":
    sys.exit(main())
