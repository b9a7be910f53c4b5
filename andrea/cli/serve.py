"""`andrea serve`: a checkpoint behind the OpenAI HTTP API, its requests decoded together."""

from __future__ import annotations

import os
import signal

from andrea.validate import flag_number

MAX_BATCH = 256
MAX_QUEUE = 4_096


def _check(args, cfg) -> None:
    from andrea.errors import AndreaError

    # the numbers' ranges are their flags' (andrea.validate.flag_number)
    if args.api_key is not None and (not args.api_key.strip() or not args.api_key.isprintable()):
        raise AndreaError("--api-key must be printable text, not empty.")
    if cfg is None:
        return
    cache = 2 * cfg.n_layer * args.max_batch * cfg.block_size * cfg.n_embd * 4  # keys and values, fp32
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        memory = None
    if memory and cache > memory // 2:
        raise AndreaError(f"--max-batch {args.max_batch} needs a KV cache of {cache / 2**30:.1f} GiB, more than half "
                          f"this machine's {memory / 2**30:.1f} GiB; give a smaller --max-batch.")


class _Stopped(Exception):
    """A SIGTERM or Ctrl-C before the server serves: nothing is in flight, so it just ends."""


def _stop_now(sig, frame):
    raise _Stopped


def cmd_serve(args) -> int:
    if args.api_key is None:
        args.api_key = os.environ.get("ANDREA_API_KEY") or None
    _check(args, None)
    before = {s: signal.signal(s, _stop_now) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        return _serve(args)
    except _Stopped:
        print("andrea serve: stopped.", flush=True)
        return 0
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


def _serve(args) -> int:
    import torch

    from andrea.decoding.generate import load
    from andrea.web.api import Served, ServeServer, decoding_threads, model_id

    threads, layouts = decoding_threads(args.threads)
    torch.set_num_threads(threads)
    generator = load(args.checkpoint, "cpu")
    cfg = generator.config
    _check(args, cfg)
    path = args.checkpoint
    try:
        created = int(os.stat(path).st_mtime)
    except OSError:
        created = 0
    served = Served(generator.model, generator.tokenizer, model_id(path), created)
    server = ServeServer(served, args.host, args.port, args.api_key, args.max_batch, args.max_queue, args.drain_seconds,
                         layouts)
    server.warm_up()
    print(f"andrea serve: {served.id} ({generator.model.num_params():,} parameters, context {cfg.block_size} tokens), "
          f"up to {args.max_batch} replies decoded together and {args.max_queue} waiting; {threads} torch "
          f"thread{'s' if threads != 1 else ''}, weights laid out for {layouts}")
    if not server.loopback:
        print(f"note: listening on {args.host}: other machines that can reach it can use it with the API key.")
    print(f"OpenAI API at {server.url}v1 (Ctrl-C stops the server)", flush=True)
    server.serve_forever()  # uvicorn's signal handlers (the drain) hold while it serves
    print("andrea serve: stopped.", flush=True)
    return 0


def register(sub) -> None:
    p = sub.add_parser(
        "serve", help="serve a checkpoint over the OpenAI HTTP API, decoding many requests together",
        description="Serve a checkpoint over the OpenAI HTTP API (GET /v1/models, POST /v1/completions, POST "
                    "/v1/chat/completions, streamed or not; GET /health), so OpenAI clients, chat front-ends and editors "
                    "can use it. Requests in flight are decoded together, one forward per step over up to --max-batch "
                    "of them, each joining and leaving between steps; a greedy request (temperature 0) gives exactly "
                    "what `andrea generate --greedy` gives, and a seeded one the same text alone or among others. A "
                    "chat is written in `andrea chat`'s turn format and its reply is one line. The model runs on the "
                    "CPU. SIGTERM or Ctrl-C stops taking requests, lets those in flight finish within --drain-seconds, "
                    "ends every reply still open, and exits.")
    p.add_argument("--checkpoint", required=True, help="a checkpoint file or a run folder (best, else latest)")
    p.add_argument("--host", default="127.0.0.1",
                   help="the address to listen on (default 127.0.0.1: this machine only; any other address needs --api-key)")
    p.add_argument("--port", type=flag_number(int, 0, 65_535), default=8000, help="the port (default 8000; 0 picks a free one)")
    p.add_argument("--api-key", default=None, metavar="KEY",
                   help="answer only requests that send `Authorization: Bearer KEY` (default: $ANDREA_API_KEY, else "
                        "no key on loopback)")
    p.add_argument("--max-batch", type=flag_number(int, 1, MAX_BATCH), default=16, metavar="N",
                   help="most replies decoded together, each in its own KV-cache slot (default 16)")
    p.add_argument("--max-queue", type=flag_number(int, 0, MAX_QUEUE), default=64, metavar="N",
                   help="most requests waiting for a slot; more are answered 429 (default 64)")
    p.add_argument("--threads", type=flag_number(int, 1, 256), default=None, metavar="N",
                   help="torch threads for decoding, and the weights laid out for as many (default: torch's choice "
                        "of one per core, except that on two cores it decodes on one, so HTTP keeps a core, with the "
                        "weights laid out for two as `andrea generate` lays them out); greedy replies equal `andrea "
                        "generate --greedy`'s at the default, and with N, those of it run with OMP_NUM_THREADS=N")
    p.add_argument("--drain-seconds", type=flag_number(float, 0, 3_600), default=30.0, metavar="S",
                   help="on SIGTERM or Ctrl-C, how long replies in flight may take to finish (default 30)")
    p.set_defaults(func=cmd_serve)
