"""The checks every reader of outside values shares: an integer that is not a bool, a real number,
a number within a finite range (`number_in` for values already typed, as a JSON request's;
`parse_number` for text, as a command-line flag's), a seed torch's generators take, a JSON object
whose keys are a dataclass's fields, and the declared shape of a JSON value andrea wrote (`Shape`,
`check_shape`). Each fails in one sentence naming the value.

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


# ---------------------------------------------------------------- the declared shape of a JSON value


class Shape:
    """What a JSON value andrea wrote must be before a field of it is used, declared once beside
    its reader and checked by `shape_problem` (`andrea.files.read_json(..., shape=...)`):

        Shape.integer(lo, hi)          an integer, not a bool, in [lo, hi]
        Shape.real(lo, hi)             an int or float, finite, in [lo, hi]
        Shape.text(most)               a string of at most `most` characters
        Shape.name()                   a plain file name: no folder, not . or ..
        Shape.flag()                   true or false
        Shape.anything()               any JSON value
        Shape.optional(shape)          that shape, or null
        Shape.items(shape, most)       a list of at most `most` values of one shape
        Shape.fixed(*shapes)           a list of exactly these, in order
        Shape.record(key=shape, ...)   an object with these keys (a key ending in "_" is optional,
                                       the underscore dropped; other keys are allowed and ignored)
        Shape.mapping(shape, most)     an object of at most `most` keys, every value of one shape
    """

    def __init__(self, kind: str, *args, **fields):
        self.kind, self.args, self.fields = kind, args, fields

    integer = classmethod(lambda cls, lo=-(2**63), hi=2**63 - 1: cls("integer", lo, hi))
    real = classmethod(lambda cls, lo=-1e300, hi=1e300: cls("real", lo, hi))
    text = classmethod(lambda cls, most=4096: cls("text", most))
    name = classmethod(lambda cls: cls("name"))
    flag = classmethod(lambda cls: cls("flag"))
    anything = classmethod(lambda cls: cls("anything"))
    optional = classmethod(lambda cls, shape: cls("optional", shape))
    items = classmethod(lambda cls, shape, most=1 << 20: cls("items", shape, most))
    fixed = classmethod(lambda cls, *shapes: cls("fixed", *shapes))
    record = classmethod(lambda cls, **fields: cls("record", **fields))
    mapping = classmethod(lambda cls, shape, most=1 << 20: cls("mapping", shape, most))


def shape_problem(value, shape: Shape, at: str = "") -> str | None:
    """What in value breaks its declared shape, as "FIELD is ..." (None where nothing does)."""
    where = at or "the value"
    k, a = shape.kind, shape.args
    if k == "anything":
        return None
    if k == "optional":
        return None if value is None else shape_problem(value, a[0], at)
    if k == "integer":
        return None if number_in(value, int, a[0], a[1]) else f"{where} is not an integer from {a[0]:,} to {a[1]:,}"
    if k == "real":
        return None if number_in(value, float, a[0], a[1]) else f"{where} is not a finite number from {a[0]:g} to {a[1]:g}"
    if k == "text":
        return None if isinstance(value, str) and len(value) <= a[0] else f"{where} is not a text of at most {a[0]:,} characters"
    if k == "name":
        plain = isinstance(value, str) and 0 < len(value) <= 255 and "/" not in value and "\0" not in value
        return None if plain and value not in (".", "..") else f"{where} is not a plain file name"
    if k == "flag":
        return None if isinstance(value, bool) else f"{where} is not true or false"
    if k in ("items", "fixed"):
        if not isinstance(value, list):
            return f"{where} is not a list"
        if k == "items" and len(value) > a[1] or k == "fixed" and len(value) != len(a):
            return f"{where} holds {len(value):,} values, not " + (f"at most {a[1]:,}" if k == "items" else f"{len(a)}")
        shapes = a if k == "fixed" else [a[0]] * len(value)
        return next((p for i, (v, s) in enumerate(zip(value, shapes)) if (p := shape_problem(v, s, f"{at}[{i}]"))), None)
    if not isinstance(value, dict):
        return f"{where} is not an object"
    if k == "mapping":
        if len(value) > a[1]:
            return f"{where} holds {len(value):,} keys, more than {a[1]:,}"
        return next((p for key, v in value.items() if (p := shape_problem(v, a[0], f"{at}[{str(key)[:40]!r}]"))), None)
    for name, s in shape.fields.items():
        key = name[:-1] if name.endswith("_") else name
        if key not in value:
            if name.endswith("_"):
                continue
            return f"{at + '.' if at else ''}{key} is missing"
        if problem := shape_problem(value[key], s, f"{at + '.' if at else ''}{key}"):
            return problem
    return None


def same_json(a, b) -> bool:
    """Whether two JSON values are the same as JSON: in Python true == 1 and 1 == 1.0, so a damaged
    record would pass for the one it is compared with."""
    import json

    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def check_shape(value, shape: Shape, where: str):
    """value, once it has its declared shape; else one sentence naming `where` and the field."""
    problem = shape_problem(value, shape)
    if problem:
        raise AndreaError(f"{where} is not as andrea writes it: {problem}.")
    return value
