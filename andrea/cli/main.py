"""`andrea main`: the main job."""

from __future__ import annotations

import argparse

from andrea.cli.params import cmd_params


def cmd_main(args) -> int:
    from andrea.config import PRESETS

    for name in PRESETS:
        cmd_params(argparse.Namespace(preset=name, config=None, json=False))
        print()
    return 0


def register(sub) -> None:
    p = sub.add_parser("main", help="the main job: the parameter accounting of every preset")
    p.set_defaults(func=cmd_main)
