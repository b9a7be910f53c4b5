"""What the lab's two view modules (`andrea.web.lab`, `andrea.web.lab_growth`) share: their
limits on words and neighbours, and the numbers they answer made ready for JSON. Reading a
request (its fields, its body, the Host check) is `andrea.web.http`'s, for both servers.
"""

from __future__ import annotations

import math

import numpy as np

MAX_WORD_CHARS = 100
MAX_K = 200  # neighbours, lens predictions


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
