"""andrea: grow, run and understand ANDREA small language models on hardware you own.

`from andrea import load, ANDREA, ModelConfig, ...` works as usual; the names are imported when
first asked for, so that importing a part of the package (the command line, andrea.signals)
does not load torch: `andrea train` installs its signal handlers before anything heavy.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_HOMES = {"ANDREA": "andrea.model", "KVCache": "andrea.model", "AndreaError": "andrea.errors",
          "ModelConfig": "andrea.config", "PRESETS": "andrea.config", "count_params": "andrea.config",
          "get_preset": "andrea.config", "param_rows": "andrea.config", "load": "andrea.decoding.generate"}

__all__ = sorted(_HOMES)


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module 'andrea' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOMES[name]), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_HOMES))
