"""Reading the lab's requests: a JSON body's fields, each checked for its type and range.

`Fields` reads one request body; a field that is unknown, of the wrong type or out of range raises
`BadRequest` with the one sentence the page shows (status 400 unless it says otherwise). The lab's
views (`andrea.web.lab`, `andrea.web.lab_growth`) take their parameters through it and nothing else.
"""

from __future__ import annotations

import json
import math

import numpy as np

from andrea.config import is_int, is_real

MAX_WORD_CHARS = 100
MAX_K = 200  # neighbours, lens predictions


class BadRequest(Exception):
    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.message, self.status = message, status


# ---------------------------------------------------------------- reading a request's fields


class Fields:
    """The fields of one JSON request body, each read with its type and range checked."""

    def __init__(self, body: dict, allowed: set[str]):
        unknown = sorted(set(body) - allowed)
        if unknown:
            raise BadRequest(f"unknown field {unknown[0]!r}; this endpoint takes {', '.join(sorted(allowed)) or 'no fields'}.")
        self.body = body

    def text(self, name: str, limit: int, default=None, required: bool = True) -> str | None:
        v = self.body.get(name, default)
        if v is None and not required:
            return None
        if not isinstance(v, str) or v == "":
            raise BadRequest(f"{name} must be a non-empty string.")
        if len(v) > limit:
            raise BadRequest(f"{name} is {len(v):,} characters; the lab takes at most {limit:,}.")
        return v

    def flag(self, name: str, default: bool = False) -> bool:
        v = self.body.get(name, default)
        if not isinstance(v, bool):
            raise BadRequest(f"{name} must be true or false, got {v!r}.")
        return v

    def integer(self, name: str, default, lo: int, hi: int, optional: bool = False) -> int | None:
        v = self.body.get(name, default)
        if v is None and optional:
            return None
        if not is_int(v) or not lo <= v <= hi:
            raise BadRequest(f"{name} must be an integer from {lo:,} to {hi:,}, got {json.dumps(v)}.")
        return v

    def number(self, name: str, default, lo: float, hi: float, lo_open: bool = False, optional: bool = False) -> float | None:
        v = self.body.get(name, default)
        if v is None and optional:
            return None
        ok = is_real(v) and math.isfinite(v) and v <= hi
        ok = ok and (v > lo if lo_open else v >= lo)
        if not ok:
            span = f"({lo}, {hi}]" if lo_open else f"[{lo}, {hi}]"
            raise BadRequest(f"{name} must be a number in {span}, got {json.dumps(v)}.")
        return float(v)

    def choice(self, name: str, default: str, choices) -> str:
        v = self.body.get(name, default)
        if v not in choices:
            raise BadRequest(f"{name} must be one of {', '.join(choices)}, got {json.dumps(v)}.")
        return v

    def words(self, name: str, lo: int, hi: int, what: str = "a map") -> list[str]:
        """A list of lo to hi words, each a non-empty string of at most MAX_WORD_CHARS."""
        v = self.body.get(name)
        if not isinstance(v, list) or not all(isinstance(w, str) and 0 < len(w) <= MAX_WORD_CHARS for w in v):
            raise BadRequest(f"{name} must be a list of non-empty strings of at most {MAX_WORD_CHARS} characters.")
        if not lo <= len(v) <= hi:
            raise BadRequest(f"{what} takes {lo} to {hi} words, got {len(v)}.")
        return v


def rounded(a, digits: int = 6):
    return np.round(np.asarray(a, dtype=np.float64), digits).tolist()


def finite(value):
    """`value` with every float that is not finite (a ρ of too few pairs, a cosine of a zero row)
    turned into None, which JSON can carry."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value
