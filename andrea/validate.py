"""The checks every reader of outside values shares: an integer that is not a bool, a real number,
a seed torch's generators take, a JSON object whose keys are a dataclass's fields. Each fails in
one AndreaError sentence naming the value."""

from __future__ import annotations

from dataclasses import fields

from andrea.errors import AndreaError

MAX_SEED = 2**64 - 1  # the largest seed torch's generators take


def is_int(value) -> bool:
    """An integer, and not a bool (JSON's true must not pass for 1)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_real(value) -> bool:
    """An int or a float, and not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


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
