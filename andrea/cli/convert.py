"""`andrea convert`: between our checkpoints, ANDREA's .bin, the portable JSON model and Hugging Face."""

from __future__ import annotations

from pathlib import Path

from andrea.trainconfig import RECIPES

SUFFIXES = {".bin": "bin", ".json": "json", ".safetensors": "native"}
NAMES = {"native": "andrea checkpoint", "bin": "ANDREA .bin", "json": "ANDREA JSON model", "hf": "Hugging Face GPT-2 folder"}


def cmd_convert(args) -> int:
    from andrea.config import resolve_config
    from andrea.errors import AndreaError
    from andrea.formats import convert

    to = args.to or SUFFIXES.get(Path(args.dst).suffix)
    if to is None:
        raise AndreaError(f"cannot tell the target format from {args.dst}; give --to native, bin, json or hf.")
    config = resolve_config(args.preset, args.config) if (args.preset or args.config) else None
    fmt, notes = convert(args.src, args.dst, to, config=config, segments=args.segments,
                         orientation=args.orientation, recipe=args.recipe)
    print(f"read {args.src}: {NAMES[fmt]}")
    for note in notes:
        print(f"  {note}")
    print(f"wrote {args.dst}: {NAMES[to]}")
    if to == "native" and fmt == "bin":
        print(f"  to resume training from it: save it as RUN/latest.safetensors and run "
              f"`andrea train --resume --out RUN --data DATA --recipe {args.recipe}` with the model's config.")
    return 0


def register(sub) -> None:
    p = sub.add_parser("convert", help="convert a model between andrea checkpoints, ANDREA .bin, JSON and Hugging Face",
                       description="Read SRC, whatever it holds (found by content: an andrea checkpoint or run folder, "
                                   "an ANDREA .bin or release folder, an ANDREA JSON model, a Hugging Face GPT-2 folder), "
                                   "and write it to DST in the format --to names. A .bin holds no config: give "
                                   "--preset or --config, or a release folder with its config JSON. Where a release's "
                                   "layout differs from ours (norm parameters, matrix orientation), the layout found "
                                   "is printed.")
    p.add_argument("src", metavar="SRC", help="the model to read: a file or a folder")
    p.add_argument("dst", metavar="DST", help="where to write; a .bin path gets the file alone, any other path with "
                   "--to bin a release folder (model.bin, config.json, harris_segments.json)")
    p.add_argument("--to", choices=["native", "bin", "json", "hf"],
                   help="the target format (default from DST's suffix: .safetensors, .bin, .json)")
    p.add_argument("--preset", help="the model preset of a .bin")
    p.add_argument("--config", help="the model config JSON of a .bin")
    p.add_argument("--segments", help="a harris_segments.json to attach as the model's tokenizer")
    p.add_argument("--orientation", choices=["auto", "out-in", "in-out"], default="auto",
                   help="how a .bin stores its matrices: [out][in] as ours, [in][out], or auto (default): the layout "
                        "in which the model predicts a probe text best")
    p.add_argument("--recipe", choices=list(RECIPES), default="v1",
                   help="the optimizer a .bin's Adam moments go into when converted to an andrea checkpoint: v1 "
                        "Adam (default, as ANDREA trained), v2 AdamW, or v3 (AdamW for the tables, head and norms; "
                        "the blocks' Muon-trained matrices start with zero momentum)")
    p.set_defaults(func=cmd_convert)
