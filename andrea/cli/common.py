"""Small helpers shared by the command modules."""

from __future__ import annotations

import json
import sys

from andrea.errors import AndreaError
from andrea.files import utf8_text

MAX_SEGMENTS = 65_536 - 257  # andrea.shards.MAX_VOCAB less the 257 specials (not imported: --help stays fast)
MAX_PROMPT_BYTES = 4 << 20  # a model sees at most its context (some thousand tokens) of a prompt
MAX_TEXT_BYTES = 64 << 20  # what `andrea tokenizer` reads from standard input; more is `andrea prepare`'s work


def print_json(obj) -> None:
    """obj as JSON that every JSON reader takes: a number that is not finite (NaN, ±inf), which
    JSON has no word for, is written null (`andrea.web.common.finite`, as the lab answers)."""
    from andrea.web.common import finite

    print(json.dumps(finite(obj), indent=2, ensure_ascii=False, allow_nan=False))


def read_stdin(what: str, limit: int, line: bool = False, advice: str = "give less") -> str:
    """All of standard input, or one line of it, as UTF-8 text: at most `limit` bytes, so a stream
    without end (/dev/zero, a runaway pipe) is refused, not read until memory runs out."""
    raw = getattr(sys.stdin, "buffer", None)
    if raw is None:  # a text stream with no bytes beneath it
        text = sys.stdin.readline(limit + 1) if line else sys.stdin.read(limit + 1)
        data = None
    else:
        data = raw.readline(limit + 1) if line else raw.read(limit + 1)
    if len(data if data is not None else text) > limit:
        raise AndreaError(f"{what} is longer than {limit >> 20} MiB; {advice}.")
    return text if data is None else utf8_text(data, what)


def check_source(args) -> None:
    """The library speaks of a checkpoint and a preset; the command names its flags."""
    if args.checkpoint and args.preset:
        raise AndreaError("give either --checkpoint or --preset, not both.")
    if not args.checkpoint and not args.preset:
        raise AndreaError("give --checkpoint PATH (a trained model) or --preset NAME (a freshly initialised one).")
