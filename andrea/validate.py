"""The checks every reader of outside values shares: an integer that is not a bool, a real number,
a number within a finite range (`number_in` for values already typed, as a JSON request's;
`parse_number` for text, as a command-line flag's), a seed torch's generators take, a JSON object
whose keys are a dataclass's fields. Each fails in one sentence naming the value.

A flag's number is read by `parse_number` alone: ASCII digits (no `²`, no digits of other
scripts), at most MAX_NUMBER_CHARS characters, finite (no nan, inf, or 1e400, which float reads as
inf), inside the flag's range, so nothing that passes can overflow or fail in the arithmetic after
it. Each flag's range is declared where the flag is, with `flag_number`.
"""

from __future__ import annotations

import math
import re
from dataclasses import fields

from andrea.errors import AndreaError

MAX_SEED = 2**64 - 1  # the largest seed torch's generators take


def is_int(value) -> bool:
    """An integer, and not a bool (JSON's true must not pass for 1)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_real(value) -> bool:
    """An int or a float, and not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


MAX_NUMBER_CHARS = 40
_INT = re.compile(r"[+-]?[0-9]+")
_REAL = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")


def number_in(value, kind: type, lo, hi, lo_open: bool = False) -> bool:
    """Whether value is of kind (int: an integer, not a bool; float: an int or a float) and in
    [lo, hi] (or (lo, hi] with lo_open), compared as given: an int of any size compares exactly,
    and NaN or an infinity never passes."""
    if not (is_int(value) if kind is int else is_real(value)):
        return False
    if isinstance(value, float) and not math.isfinite(value):
        return False
    return value <= hi and (value > lo if lo_open else value >= lo)


def span(kind: type, lo, hi, lo_open: bool = False) -> str:
    """How a range reads in a sentence: "an integer from 1 to 65,535", "a number in (0, 1]"."""
    if kind is int:
        return f"an integer from {lo:,} to {hi:,}"
    return f"a number in {'(' if lo_open else '['}{lo:g}, {hi:g}]"


def parse_number(text: str, kind: type, lo, hi, lo_open: bool = False):
    """The text of a flag as an int or a float within the range; ValueError with a sentence
    naming the range and the text otherwise (see the module's text)."""
    s = text.strip() if isinstance(text, str) else ""
    value = None
    if len(s) <= MAX_NUMBER_CHARS and (_INT if kind is int else _REAL).fullmatch(s):
        value = int(s) if kind is int else float(s)
    if value is None or not number_in(value, kind, lo, hi, lo_open):
        shown = text if len(text) <= MAX_NUMBER_CHARS else text[:MAX_NUMBER_CHARS] + "…"
        raise ValueError(f"must be {span(kind, lo, hi, lo_open)}, got {shown!r}")
    return value


def flag_number(kind: type, lo, hi, lo_open: bool = False):
    """The argparse type of a numeric flag: its text read by `parse_number`, an int or a finite
    float within [lo, hi] ((lo, hi] with lo_open); anything else is a usage error in one sentence.
    Every numeric flag of andrea's commands is declared with one (tests/test_cli_flags.py)."""
    import argparse

    def parse(text: str):
        try:
            return parse_number(text, kind, lo, hi, lo_open)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    parse.__name__ = "integer" if kind is int else "number"
    return parse


def check_seed(seed, name: str = "seed") -> None:
    if not is_int(seed) or not 0 <= seed <= MAX_SEED:
        raise AndreaError(f"{name} must be an integer in 0..2^64-1, got {str(seed)[:40]}.")


def check_fields(data, cls, what: str) -> dict:
    """data, once it is known to be a dict whose keys are all fields of the dataclass cls."""
    if not isinstance(data, dict):
        raise AndreaError(f"a {what} must be a JSON object, got {type(data).__name__}.")
    known = [f.name for f in fields(cls)]
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise AndreaError(f"unknown {what} field(s): {', '.join(unknown)}; known: {', '.join(known)}.")
    return data
