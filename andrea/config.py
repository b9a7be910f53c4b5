"""Model configuration, the family presets, and parameter accounting from the config alone."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, fields

from andrea.errors import AndreaError
from andrea.files import atomic_write_bytes, read_json

POSITION_SCHEMES = ("learned", "sinusoidal", "rope", "none")
NORMS = ("layernorm", "rmsnorm")
ACTIVATIONS = ("relu2", "relu", "gelu")
BOS = 256  # starts every document, ends generation
N_SPECIAL = 257  # ids 0-255 are bytes, 256 is BOS; segments start at 257
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


def check_fields(data, cls, what: str) -> dict:
    """data, once it is known to be a dict whose keys are all fields of the dataclass cls."""
    if not isinstance(data, dict):
        raise AndreaError(f"a {what} must be a JSON object, got {type(data).__name__}.")
    known = [f.name for f in fields(cls)]
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise AndreaError(f"unknown {what} field(s): {', '.join(unknown)}; known: {', '.join(known)}.")
    return data


PRESETS: dict[str, ModelConfig] = {
    # the family, as specified
    "andrea-12m": ModelConfig(vocab_size=2305, n_embd=384, n_head=12, n_layer=6, block_size=1024),
    "andrea-120m": ModelConfig(vocab_size=8449, n_embd=768, n_head=12, n_layer=12, block_size=1024),
    "andrea-480m": ModelConfig(vocab_size=8449, n_embd=1536, n_head=24, n_layer=16, block_size=1024),
    # small models for CPU work: the main job and the experiments
    "andrea-cpu": ModelConfig(vocab_size=6401, n_embd=256, n_head=8, n_layer=4, block_size=256),  # 6,144 segments
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


# ---------------------------------------------------------------- memory, counted before it is taken

FLOAT_BYTES = 4  # weights, gradients and moments are float32
LAYER_BYTES = 32_768  # the Python objects of one block's modules (measured: about 36 KB)


def model_bytes(cfg: ModelConfig) -> int:
    """Bytes a model of cfg takes in memory: its weights, its computed position tables and its
    blocks' Python objects (which a model of a million tiny layers is mostly made of)."""
    return FLOAT_BYTES * (count_params(cfg) + position_table_size(cfg)) + LAYER_BYTES * cfg.n_layer


def training_bytes(cfg: ModelConfig, micro_batch: int, seq_len: int, loss_rows: int | None = None) -> int:
    """A lower bound on the bytes one training process holds: the model, its gradients and two
    Adam moments; per micro-batch the windows (int64) and, per token and layer, the sixteen d-wide
    activations a block keeps for the backward pass (its input, the first norm's output, q, k
    and v, attention's output, the residual sum, the second norm's output, and the MLP's two
    4d-wide ones); and the loss's logits: whole, they and their log-softmax (2 × tokens × V);
    in blocks of `loss_rows` rows, one block and the gradient of the final norm's output."""
    tokens = micro_batch * seq_len
    if loss_rows is None or loss_rows >= tokens:
        logits = 2 * tokens * cfg.vocab_size
    else:
        logits = loss_rows * cfg.vocab_size + tokens * cfg.n_embd
    return (model_bytes(cfg) + 3 * FLOAT_BYTES * count_params(cfg) + 16 * micro_batch * (seq_len + 1)
            + FLOAT_BYTES * 16 * tokens * cfg.n_layer * cfg.n_embd + FLOAT_BYTES * logits)


def available_memory() -> int | None:
    """Bytes of memory this process can still take: the kernel's MemAvailable, within the
    process's control group's limit where it has one; None where neither can be read."""
    have = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    have = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    if have is None:
        try:
            have = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            pass
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        with open("/sys/fs/cgroup/memory.current") as f:
            left = int(limit) - int(f.read()) if limit.isdigit() else None
        if left is not None:
            have = left if have is None else min(have, left)
    except (OSError, ValueError):
        pass
    return have


def _gb(n: int) -> str:
    return f"{n / 1e9:,.1f} GB" if n >= 1e8 else f"{n / 1e6:,.0f} MB"


def check_memory(need: int, what: str, advice: str, have: int | None = None, where: str = "this machine") -> None:
    """Refuse, in one sentence, work that needs more memory than there is (`have`, default what
    available_memory finds); where it cannot be known, nothing is refused."""
    have = available_memory() if have is None else have
    if have is not None and need > have:
        raise AndreaError(f"{what} needs at least {_gb(need)} of memory, but {where} has {_gb(max(0, have))} available; "
                          f"{advice}.")
