"""The `andrea` command. Thin: it parses arguments and calls the library.

Every command is a function `cmd_NAME(args) -> int`; `main` turns any error a user can cause
(`AndreaError`, a missing file, Ctrl-C) into one sentence on stderr and a non-zero exit.
"""

from __future__ import annotations

import argparse
import json
import sys

from andrea.errors import AndreaError


def print_json(obj) -> None:
    print(json.dumps(obj, indent=2, ensure_ascii=False))


# ---------------------------------------------------------------- andrea params


def cmd_params(args) -> int:
    from andrea.config import param_rows, resolve_config

    cfg = resolve_config(args.preset, args.config)
    rows = param_rows(cfg)
    total = rows[-1].count
    if args.json:
        print_json({
            "config": cfg.to_dict(),
            "rows": [{"name": r.name, "shape": r.shape, "count": r.count, "share": r.count / total} for r in rows],
        })
        return 0
    name = args.config or args.preset or "andrea-12m"
    print(f"{name}: d_model {cfg.n_embd}, heads {cfg.n_head}, layers {cfg.n_layer}, context {cfg.block_size}, "
          f"V {cfg.vocab_size:,} ({cfg.n_segments:,} segments + 257), pos {cfg.pos}, norm {cfg.norm}, act {cfg.act}")
    w = max(len(r.name) for r in rows)
    ws = max(len(r.shape) for r in rows)
    wc = max(len(f"{r.count:,}") for r in rows)
    for r in rows:
        if r.name == "total":
            print("-" * (w + ws + wc + 14))
        print(f"{r.name:<{w}}  {r.shape:<{ws}}  {r.count:>{wc},}  {100 * r.count / total:6.2f}%")
    return 0


def add_params_parser(sub) -> None:
    p = sub.add_parser("params", help="where every parameter lives (arithmetic from the config alone)",
                       description="Print the shape, count and share of every parameter group: token embedding, "
                                   "position embedding, their sum, attention, MLP, norms, output head and total.")
    p.add_argument("--preset", help="a named preset (default andrea-12m); see `andrea presets`")
    p.add_argument("--config", help="a model config JSON file instead of a preset")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_params)


def cmd_presets(args) -> int:
    from andrea.config import PRESETS, count_params

    if args.json:
        print_json({name: {**cfg.to_dict(), "params": count_params(cfg)} for name, cfg in PRESETS.items()})
        return 0
    for name, cfg in PRESETS.items():
        print(f"{name:<12} d {cfg.n_embd:>5}  heads {cfg.n_head:>3}  layers {cfg.n_layer:>3}  T {cfg.block_size:>5}  "
              f"V {cfg.vocab_size:>6,}  params {count_params(cfg):>12,}")
    return 0


def add_presets_parser(sub) -> None:
    p = sub.add_parser("presets", help="list the model presets")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_presets)


# ---------------------------------------------------------------- andrea main


def cmd_main(args) -> int:
    from andrea.config import PRESETS

    for name in PRESETS:
        cmd_params(argparse.Namespace(preset=name, config=None, json=False))
        print()
    return 0


def add_main_parser(sub) -> None:
    p = sub.add_parser("main", help="the main job: the parameter accounting of every preset")
    p.set_defaults(func=cmd_main)


# ---------------------------------------------------------------- entry point


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="andrea",
        description="Grow, run and understand ANDREA small language models on hardware you own.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for add in (add_main_parser, add_params_parser, add_presets_parser):
        add(sub)
    return parser




def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return args.func(args) or 0
    except AndreaError as e:
        print(f"andrea: error: {e}", file=sys.stderr)
        return 2
    except FileNotFoundError as e:
        print(f"andrea: error: {e.filename or e} does not exist.", file=sys.stderr)
        return 2
    except PermissionError as e:
        print(f"andrea: error: permission denied for {e.filename or e}.", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("andrea: interrupted.", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
