"""`andrea params` and `andrea presets`: parameter accounting from the config alone."""

from __future__ import annotations

from andrea.cli.common import print_json


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


def _add_params(sub) -> None:
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


def _add_presets(sub) -> None:
    p = sub.add_parser("presets", help="list the model presets")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_presets)




def register(sub) -> None:
    _add_params(sub)
    _add_presets(sub)
