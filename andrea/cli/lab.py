"""`andrea lab`: the embedding lab in a browser, served from this machine."""

from __future__ import annotations

from andrea.cli.common import check_source
from andrea.validate import MAX_SEED, flag_number


def cmd_lab(args) -> int:
    from andrea.inside.embed import load_subject
    from andrea.web.lab import LabServer

    check_source(args)
    subject = load_subject(args.checkpoint, args.preset, args.seed, args.tokenizer)
    server = LabServer(subject, args.host, args.port)
    print(f"andrea lab: {subject.name}")
    if subject.tokenizer_note:
        print(f"note: {subject.tokenizer_note}")
    print(server.growth.summary())
    if not server.loopback:
        print(f"note: listening on {args.host}: other machines that can reach it can use the lab.")
    print(f"open {server.url} in a browser (Ctrl-C stops the server)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass  # Ctrl-C is how the lab ends: uvicorn has shut down, and hands the signal on
    finally:
        server.sock.close()
    print("andrea lab: stopped.")
    return 0


def register(sub) -> None:
    p = sub.add_parser("lab", help="the embedding lab in a browser: tables, neighbours, maps, attention, the logit lens, "
                                   "the tables learning",
                       description="Serve one web page that shows a checkpoint's parameters, token table, "
                                   "neighbours, comparisons, 2-D maps, position similarity, attention patterns, "
                                   "the logit lens and token-by-token generation, and (Growth) the embedding "
                                   "tables over the snapshots its run kept in embeddings/. Everything the page "
                                   "loads comes from this server; no internet access is needed.")
    p.add_argument("--checkpoint", help="a checkpoint file or run folder (a run folder's snapshots feed the Growth view)")
    p.add_argument("--preset", help="show a freshly initialised model of this preset instead")
    p.add_argument("--seed", type=flag_number(int, 0, MAX_SEED), default=0, help="seed of the fresh model's initialisation (default 0)")
    p.add_argument("--tokenizer", help="a tokenizer folder (a checkpoint brings its own)")
    p.add_argument("--host", default="127.0.0.1",
                   help="the address to listen on (default 127.0.0.1: this machine only; 0.0.0.0 opens it to the network)")
    p.add_argument("--port", type=flag_number(int, 0, 65_535), default=8000, help="the port (default 8000; 0 picks a free one)")
    p.set_defaults(func=cmd_lab)
