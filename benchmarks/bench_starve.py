"""Can one client starve `andrea serve`? A bounded load test on 127.0.0.1 against the real server.

`andrea serve --max-batch 4 --max-queue 8` on the main job's model (under /usr/bin/time -v), then
three phases, each bounded in connections and seconds, every client on a loopback address
(127.0.0.0/8, one per role, so the server sees them as different clients):

  stalled   a client on 127.0.0.2 holds --stalled connections that send half a request's head
            and then a header line every 2 s, opening a new one whenever one is closed; honest
            clients on 127.0.0.1 send short completions all the while
  greedy    a client on 127.0.0.3 sends --greedy long completions at once; honest clients send
            short ones beside them
  crowd     --crowd honest clients send one short completion each, all at once

Each phase prints what every client got: answers by status, how many were in OpenAI's JSON shape
(an `error` object) and how many were not (uvicorn's plain-text 503 was), connections that failed,
and the honest clients' latency. The server's log must hold no traceback.

    .venv/bin/python benchmarks/bench_starve.py                       # newest runs/main-*
    .venv/bin/python benchmarks/bench_starve.py --checkpoint runs/x --seconds 20
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_serve import ServerProcess, _read_body, newest_main_checkpoint, request_bytes  # noqa: E402
from common import machine_line, md_table, say  # noqa: E402

HONEST, STALLER, GREEDY = "127.0.0.1", "127.0.0.2", "127.0.0.3"


async def ask(port: int, source: str, max_tokens: int, timeout: float = 120.0) -> tuple[str, float]:
    """One completion from `source`: (what came back: a status and its shape, or why it failed; seconds)."""
    t0 = time.perf_counter()
    body = {"prompt": "The people of the United States", "max_tokens": max_tokens, "temperature": 0}
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0)),
                                                timeout)
    except (OSError, asyncio.TimeoutError) as e:
        return f"connection failed ({type(e).__name__})", time.perf_counter() - t0
    try:
        writer.write(request_bytes("/v1/completions", body, port))
        await writer.drain()
        head = (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)).decode("latin-1")
        raw = b"".join([piece async for piece in _read_body(reader, head)])
        status = int(head.split()[1])
        try:
            obj = json.loads(raw)
            shape = "JSON" if status == 200 and "choices" in obj or "message" in obj.get("error", {}) else "other"
        except ValueError:
            shape = "not JSON"
        return f"{status} {shape}", time.perf_counter() - t0
    except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ValueError, IndexError) as e:
        return f"failed ({type(e).__name__})", time.perf_counter() - t0
    finally:
        writer.close()


async def honest(port: int, clients: int, stop: asyncio.Event, got: list, max_tokens: int = 8) -> None:
    async def one():
        while not stop.is_set():
            got.append(await ask(port, HONEST, max_tokens))

    await asyncio.gather(*(one() for _ in range(clients)))


async def stalled(port: int, n: int, stop: asyncio.Event, closed: collections.Counter) -> None:
    """n connections from STALLER, each sending half a head and a header line every 2 s; reopened
    when the server closes one. closed counts how each ended (the status it was answered with)."""
    async def one():
        while not stop.is_set():
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(STALLER, 0))
            except OSError:
                closed["could not connect"] += 1
                await asyncio.sleep(0.5)
                continue
            try:
                writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
                while not stop.is_set():
                    try:
                        head = await asyncio.wait_for(reader.read(200), 2.0)
                    except asyncio.TimeoutError:
                        writer.write(b"X-Slow: 1\r\n")
                        await writer.drain()
                        continue
                    closed[head.split(b"\r\n")[0].decode("latin-1", "replace")[9:] or "closed"] += 1
                    break
            except OSError:
                closed["reset"] += 1
            finally:
                writer.close()

    await asyncio.gather(*(one() for _ in range(n)))


def summary(got: list) -> tuple[dict, str]:
    counts = collections.Counter(k for k, _ in got)
    ok = [s for k, s in got if k.startswith("200")]
    latency = (f"p50 {statistics.median(ok):.2f} s, max {max(ok):.2f} s" if ok else "none answered")
    return dict(counts), latency


async def phase_stalled(port: int, n: int, seconds: float) -> dict:
    stop, closed, got = asyncio.Event(), collections.Counter(), []
    tasks = [asyncio.create_task(stalled(port, n, stop, closed))]
    await asyncio.sleep(3)  # the stalled connections are open before the honest clients come
    tasks.append(asyncio.create_task(honest(port, 4, stop, got)))
    await asyncio.sleep(seconds)
    stop.set()
    await asyncio.gather(*tasks)
    return {"honest": got, "stalled_closed": dict(closed)}


async def phase_greedy(port: int, n: int, honest_requests: int) -> dict:
    greedy = [asyncio.create_task(ask(port, GREEDY, 256, timeout=600)) for _ in range(n)]
    await asyncio.sleep(1)  # the greedy client holds every place it can before the others come
    sem, got = asyncio.Semaphore(4), []

    async def one():
        async with sem:
            got.append(await ask(port, HONEST, 8))

    await asyncio.gather(*(one() for _ in range(honest_requests)))
    return {"honest": got, "greedy": await asyncio.gather(*greedy)}


async def phase_crowd(port: int, n: int) -> dict:
    return {"honest": await asyncio.gather(*(ask(port, HONEST, 8) for _ in range(n)))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", help="the model to serve (default: the newest runs/main-*)")
    ap.add_argument("--stalled", type=int, default=200, help="stalled connections (default 200)")
    ap.add_argument("--seconds", type=float, default=30.0, help="seconds of the stalled phase (default 30)")
    ap.add_argument("--greedy", type=int, default=80, help="the greedy client's long requests (default 80)")
    ap.add_argument("--honest", type=int, default=20, help="honest requests beside the greedy client (default 20)")
    ap.add_argument("--crowd", type=int, default=200, help="honest clients at once in the crowd phase (default 200)")
    args = ap.parse_args()
    checkpoint = args.checkpoint or newest_main_checkpoint()
    work = Path(tempfile.mkdtemp(prefix="bench-starve-"))
    server = ServerProcess(checkpoint, 4, 8, work / "server.log")
    t0 = time.time()
    try:
        say(f"bench_starve: {args.stalled} stalled connections for {args.seconds:g} s")
        st = asyncio.run(phase_stalled(server.port, args.stalled, args.seconds))
        say(f"bench_starve: a greedy client's {args.greedy} long requests beside {args.honest} honest ones")
        gr = asyncio.run(phase_greedy(server.port, args.greedy, args.honest))
        say(f"bench_starve: {args.crowd} honest clients at once")
        cr = asyncio.run(phase_crowd(server.port, args.crowd))
    finally:
        rc, log, peak = server.stop()
    rows = []
    for name, what, got in (("stalled", f"{args.stalled} stalled connections from {STALLER} for {args.seconds:g} s; "
                             f"4 honest clients from {HONEST} meanwhile", st["honest"]),
                            ("greedy", f"{args.greedy} long requests (256 tokens) at once from {GREEDY}; "
                             f"{args.honest} short honest ones from {HONEST}, 4 at a time", gr["honest"]),
                            ("crowd", f"{args.crowd} honest clients from {HONEST} at once, one short request each",
                             cr["honest"])):
        counts, latency = summary(got)
        answered = sum(v for k, v in counts.items() if k.startswith("200"))
        rows.append([name, what, f"{answered} of {len(got)}",
                     ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())), latency])
    greedy_counts = collections.Counter(k for k, _ in gr["greedy"])
    print("## Starving andrea serve: stalled, greedy and crowding clients\n")
    print(f"machine: {machine_line()}\n")
    print(f"`andrea serve --max-batch 4 --max-queue 8` on `{checkpoint}`; honest requests: 8 tokens, greedy. "
          f"{time.time() - t0:.0f} s in all. \"JSON\": an answer in OpenAI's shape (`choices`, or an `error` object "
          f"with a message); \"not JSON\" would be uvicorn's plain text.\n")
    print(md_table(["phase", "load", "honest answered", "honest outcomes", "honest latency, answered"], rows))
    print("\n- the stalled connections' ends: "
          + ", ".join(f"{k}: {v}" for k, v in sorted(st["stalled_closed"].items())))
    print("- the greedy client's outcomes: " + ", ".join(f"{k}: {v}" for k, v in sorted(greedy_counts.items())))
    traceback = "Traceback" in log
    rss = f"peak RSS {peak / 2**20:.0f} MiB (/usr/bin/time -v)" if peak else f"RSS at the end {server.peak / 2**20:.0f} MiB"
    print(f"- the server: exit status {rc} on SIGTERM; {rss}; traceback in its log: {'yes' if traceback else 'none'}")
    return 0 if rc == 0 and not traceback else 1


if __name__ == "__main__":
    sys.exit(main())
