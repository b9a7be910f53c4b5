"""andrea: grow, run and understand ANDREA small language models on hardware you own."""

from andrea.config import PRESETS, ModelConfig, count_params, get_preset, param_rows
from andrea.errors import AndreaError
from andrea.generate import load
from andrea.model import ANDREA, KVCache

__version__ = "0.1.0"

__all__ = ["ANDREA", "AndreaError", "KVCache", "ModelConfig", "PRESETS", "count_params", "get_preset", "load", "param_rows"]
