"""Model configuration, the family presets, and parameter accounting from the config alone."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from andrea.errors import AndreaError
from andrea.files import atomic_write_bytes, read_json
from andrea.validate import check_fields, is_int

POSITION_SCHEMES = ("learned", "sinusoidal", "rope", "none")
NORMS = ("layernorm", "rmsnorm")
ACTIVATIONS = ("relu2", "relu", "gelu")
BOS = 256  # starts every document, ends generation
N_SPECIAL = 257  # ids 0-255 are bytes, 256 is BOS; segments start at 257
@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 2305
    n_embd: int = 384
    n_head: int = 12
    n_layer: int = 6
    block_size: int = 1024
    pos: str = "learned"
    norm: str = "layernorm"
    act: str = "relu2"

    def __post_init__(self):
        for name in ("vocab_size", "n_embd", "n_head", "n_layer", "block_size"):
            value = getattr(self, name)
            if not is_int(value) or value < 1:
                raise AndreaError(f"config field {name} must be a positive integer, got {value!r}.")
        if self.vocab_size < N_SPECIAL:
            raise AndreaError(f"vocab_size must be at least {N_SPECIAL} (256 bytes + BOS), got {self.vocab_size}.")
        if self.n_embd % self.n_head:
            raise AndreaError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head}).")
        if self.pos == "rope" and self.head_dim % 2:
            raise AndreaError(f"rope needs an even head size, got {self.head_dim}.")
        for name, allowed in (("pos", POSITION_SCHEMES), ("norm", NORMS), ("act", ACTIVATIONS)):
            if getattr(self, name) not in allowed:
                raise AndreaError(f"config field {name} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}.")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def n_segments(self) -> int:
        return self.vocab_size - N_SPECIAL

    def replace(self, **changes) -> "ModelConfig":
        return ModelConfig(**{**asdict(self), **changes})

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "ModelConfig":
        return cls(**check_fields(data, cls, "model config"))

    def save(self, path) -> None:
        atomic_write_bytes(path, (json.dumps(self.to_dict(), indent=2) + "\n").encode())

    @classmethod
    def load(cls, path) -> "ModelConfig":
        return cls.from_dict(read_json(path, "config file"))


PRESETS: dict[str, ModelConfig] = {
    # the family, as specified
    "andrea-12m": ModelConfig(vocab_size=2305, n_embd=384, n_head=12, n_layer=6, block_size=1024),
    "andrea-120m": ModelConfig(vocab_size=8449, n_embd=768, n_head=12, n_layer=12, block_size=1024),
    "andrea-480m": ModelConfig(vocab_size=8449, n_embd=1536, n_head=24, n_layer=16, block_size=1024),
    # small models for CPU work: the main job and the experiments
    # 8,704 segments; width 128 (4 heads of 32) and context 128, chosen at equal wall time
    # (BENCHMARKS.md, candidates for the main job)
    "andrea-cpu": ModelConfig(vocab_size=8961, n_embd=128, n_head=4, n_layer=4, block_size=128),
    "andrea-tiny": ModelConfig(vocab_size=2305, n_embd=128, n_head=4, n_layer=2, block_size=128),
}


def get_preset(name: str) -> ModelConfig:
    if name not in PRESETS:
        raise AndreaError(f"unknown preset {name!r}; known presets: {', '.join(PRESETS)}.")
    return PRESETS[name]


def resolve_config(preset: str | None = None, config: str | None = None) -> ModelConfig:
    """The config a command asked for: a JSON file, else a preset, else andrea-12m."""
    if preset and config:
        raise AndreaError("give either --preset or --config, not both.")
    if config:
        return ModelConfig.load(config)
    return get_preset(preset or "andrea-12m")


# ---------------------------------------------------------------- parameter accounting


@dataclass(frozen=True)
class ParamRow:
    name: str
    shape: str
    count: int
    key: str = ""  # a stable name for code: wte, wpe, embedding, attention, mlp, norms, lm_head, total


def norm_params(cfg: ModelConfig) -> int:
    """Parameters of one norm layer: weight and bias for LayerNorm, weight only for RMSNorm."""
    return 2 * cfg.n_embd if cfg.norm == "layernorm" else cfg.n_embd


def param_rows(cfg: ModelConfig) -> list[ParamRow]:
    """Where every parameter lives, computed from the config alone (no model is built)."""
    d, V, T, L = cfg.n_embd, cfg.vocab_size, cfg.block_size, cfg.n_layer
    wte = V * d
    wpe = T * d if cfg.pos == "learned" else 0
    rows = [
        ParamRow("token embedding (wte)", f"{V:,} × {d:,}", wte, "wte"),
        ParamRow("position embedding (wpe)", f"{T:,} × {d:,}" if wpe else f"none ({cfg.pos})", wpe, "wpe"),
        ParamRow("embedding layer (wte + wpe)", "", wte + wpe, "embedding"),
        ParamRow("attention (wq, wk, wv, wo)", f"{L} × 4 × {d:,} × {d:,}", L * 4 * d * d, "attention"),
        ParamRow("MLP (fc1, fc2)", f"{L} × 2 × {4 * d:,} × {d:,}", L * 8 * d * d, "mlp"),
        ParamRow(f"norms ({cfg.norm})", f"{2 * L + 1} × {norm_params(cfg) // d} × {d:,}", (2 * L + 1) * norm_params(cfg),
                 "norms"),
        ParamRow("output head (lm_head)", f"{V:,} × {d:,}", V * d, "lm_head"),
    ]
    total = wte + wpe + L * 12 * d * d + (2 * L + 1) * norm_params(cfg) + V * d
    rows.append(ParamRow("total", "", total, "total"))
    return rows


def count_params(cfg: ModelConfig) -> int:
    return param_rows(cfg)[-1].count


def position_table_size(cfg: ModelConfig) -> int:
    """Values of the position tables the model computes rather than stores (sinusoidal, rope)."""
    if cfg.pos == "sinusoidal":
        return cfg.block_size * cfg.n_embd
    if cfg.pos == "rope":
        return cfg.block_size * cfg.head_dim
    return 0
