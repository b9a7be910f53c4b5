"""The `andrea` command. Thin: it parses arguments and calls the library.

One module per command group in this package; each has `register(sub)` that adds its
subcommands, and each subcommand is a function `cmd_NAME(args) -> int`. `main` turns any error a
user can cause (`AndreaError`, a missing file, Ctrl-C) into one sentence on stderr and a non-zero
exit, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from andrea.errors import AndreaError

# command modules, in the order their commands appear in --help
COMMAND_MODULES = [
    "andrea.cli.mainjob",
    "andrea.cli.params",
    "andrea.cli.doctor",
    "andrea.cli.data",
    "andrea.cli.tokenizer",
    "andrea.cli.train",
    "andrea.cli.generate",
    "andrea.cli.serve",
    "andrea.cli.convert",
    "andrea.cli.lesson",
    "andrea.cli.embed",
    "andrea.cli.experiment",
    "andrea.cli.lab",
]


class UsageError(Exception):
    """A command line argparse refuses: the flag and why, printed as every other refusal is."""

    def __init__(self, message: str, prog: str):
        super().__init__(message)
        self.prog = prog


class Parser(argparse.ArgumentParser):
    """argparse's parser whose usage errors are one sentence, `andrea: error: ...` and exit 2, as
    every other refusal (a subcommand's parsers are of the same class)."""

    def error(self, message):
        raise UsageError(message, self.prog)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="andrea",
        description="Grow, run and understand ANDREA small language models on hardware you own.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def printable_output() -> None:
    """Make stdout and stderr write what they cannot encode as backslash escapes, not fail: a file
    name with bytes that are not UTF-8 reaches Python as lone surrogates, which a strict UTF-8
    stream refuses (stderr already escapes them by default; a stream set otherwise is left so)."""
    for stream in (sys.stdout, sys.stderr):
        if getattr(stream, "errors", None) == "strict" and hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")


def main(argv=None) -> int:
    printable_output()
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except UsageError as e:
        print(f"andrea: error: {e} (see {e.prog} --help).", file=sys.stderr)
        return 2
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
    except BrokenPipeError:
        return 0
    except OSError as e:  # the system refused: a full disk, a read-only filesystem, a failing device
        where = f" ({e.filename})" if e.filename else ""
        print(f"andrea: error: {e.strerror or e}{where}.", file=sys.stderr)
        return 2
    except UnicodeDecodeError as e:  # text read from a file or stream that is not UTF-8
        print(f"andrea: error: the input is not UTF-8 text ({e.reason} at byte {e.start:,}).", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("andrea: interrupted.", file=sys.stderr)
        return 130
