"""The training config file: one JSON object naming the data plan, the curriculum, the audit and
the run's settings, in the spirit of ANDREA's TRAIN.json.

    {
      "preset": "andrea-cpu", "data": "data/", "out": "runs/a",
      "sources": [{"name": "sotu", "path": "sotu", "floor": 0.05, "cap": 0.6}, "kjv"],
      "sampling": "ucb",
      "curriculum": {"C": 1.414, "reroll": [7, 42], "warmup_sources": ["sotu"], "warmup_steps": 200},
      "audit": {"every": 100, "tokens": 420, "threshold": 30, "patience": 5, "enabled": true},
      "recipe": "v2", "batch_size": 16, "seq_len": 256, "max_steps": 5000
    }

Every field is optional and every unknown field is an error. A source is an object with `name`
(required), `path` (what `andrea prepare` reads: a fetched source name, a folder or a text file;
default: the name), `floor` (default 0) and `cap` (default 1), or just its name as a string.
`curriculum` holds the keyword arguments of `Curriculum` that are not per source, `audit` the
sample-audit settings; a partial section keeps the defaults of the keys it leaves out.
`warmup_steps` at the top level is the v2 learning-rate warm-up; the curriculum's warm-up is
`curriculum.warmup_steps`. `micro_batch` is the sequences per forward pass, so gradients
accumulate over batch_size / (micro_batch x processes) passes; None means no accumulation.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

from andrea.config import PRESETS, check_fields, read_json
from andrea.curriculum import DEFAULT_C, DEFAULT_REROLL, Curriculum
from andrea.errors import AndreaError

RECIPES = ("v1", "v2")
SAMPLING = ("ucb", "uniform", "proportional")  # proportional: by token count, no curriculum
SOURCE_KEYS = ("name", "path", "floor", "cap")


def default_curriculum() -> dict:
    return {"C": DEFAULT_C, "reroll": list(DEFAULT_REROLL), "warmup_sources": [], "warmup_steps": 0}


def default_audit() -> dict:
    return {"every": 100, "tokens": 420, "threshold": 30.0, "patience": 5, "enabled": True}


@dataclass
class TrainConfig:
    preset: str | None = None
    model_config: str | None = None  # a model config JSON instead of a preset
    data: str | None = None  # a folder made by `andrea prepare`
    out: str | None = None  # the run folder
    sources: list = field(default_factory=list)  # empty: every source in the data, no floors or caps
    sampling: str = "ucb"
    curriculum: dict = field(default_factory=default_curriculum)
    audit: dict = field(default_factory=default_audit)
    recipe: str = "v2"
    batch_size: int = 16
    micro_batch: int | None = None
    seq_len: int | None = None  # None: 256, or the model's context when that is shorter
    lr: float | None = None  # None: the recipe's default
    warmup_steps: int = 2000  # v2 learning-rate warm-up
    max_steps: int | None = None
    time_limit: float | None = None  # seconds
    eval_every: int = 100
    checkpoint_every: int = 100
    seed: int = 1337

    def __post_init__(self):
        self.sources = [_source_entry(s) for s in _list_of(self.sources, "sources")]
        self.curriculum = _section(self.curriculum, default_curriculum(), "curriculum")
        self.audit = _section(self.audit, default_audit(), "audit")
        self._check()

    def _check(self) -> None:
        for name in ("preset", "model_config", "data", "out"):
            _optional(self, name, str)
        if self.preset is not None and self.preset not in PRESETS:
            raise AndreaError(f"unknown preset {self.preset!r}; known presets: {', '.join(PRESETS)}.")
        if self.preset is not None and self.model_config is not None:
            raise AndreaError("give either preset or model_config, not both.")
        _choice(self.sampling, SAMPLING, "sampling")
        _choice(self.recipe, RECIPES, "recipe")
        for name in ("batch_size", "eval_every", "checkpoint_every"):
            _positive_int(getattr(self, name), name)
        for name in ("micro_batch", "max_steps", "seq_len"):
            if getattr(self, name) is not None:
                _positive_int(getattr(self, name), name)
        _int(self.warmup_steps, "warmup_steps", low=0)
        _int(self.seed, "seed", low=0)
        for name in ("lr", "time_limit"):
            value = getattr(self, name)
            if value is not None and (not _is_number(value) or not value > 0):
                raise AndreaError(f"{name} must be a positive number, got {value!r}.")
        a = self.audit
        _positive_int(a["every"], "audit.every")
        _positive_int(a["tokens"], "audit.tokens")
        _positive_int(a["patience"], "audit.patience")
        if not _is_number(a["threshold"]) or not 0 <= a["threshold"] <= 100:
            raise AndreaError(f"audit.threshold must be a number in 0..100, got {a['threshold']!r}.")
        if not isinstance(a["enabled"], bool):
            raise AndreaError(f"audit.enabled must be true or false, got {a['enabled']!r}.")
        c = self.curriculum
        reroll = c["reroll"]
        if (not isinstance(reroll, (list, tuple)) or len(reroll) != 2
                or not all(isinstance(x, int) and not isinstance(x, bool) for x in reroll) or not 1 <= reroll[0] <= reroll[1]):
            raise AndreaError(f"curriculum.reroll must be two integers 1 <= low <= high, got {reroll!r}.")
        c["reroll"] = list(reroll)
        c["warmup_sources"] = _list_of(c["warmup_sources"], "curriculum.warmup_sources")
        if not _is_number(c["C"]) or c["C"] < 0:
            raise AndreaError(f"curriculum.C must be a non-negative number, got {c['C']!r}.")
        _int(c["warmup_steps"], "curriculum.warmup_steps", low=0)
        names = self.source_names()
        if len(set(names)) != len(names):
            raise AndreaError(f"source names must be unique, got {', '.join(names)}.")
        if names and self.sampling != "proportional":
            self.make_curriculum(names)  # checks floors and caps together, and the warm-up sources

    # ---------------------------------------------------------------- what a trainer reads

    def source_names(self) -> list[str]:
        return [s["name"] for s in self.sources]

    def curriculum_kwargs(self) -> dict:
        """Keyword arguments of `Curriculum` besides the sources and the mode (which is `sampling`)."""
        c = self.curriculum
        return {"C": float(c["C"]), "reroll": tuple(c["reroll"]), "warmup_sources": list(c["warmup_sources"]),
                "warmup_steps": c["warmup_steps"], "seed": self.seed,
                "floors": {s["name"]: s["floor"] for s in self.sources if s["floor"] > 0},
                "caps": {s["name"]: s["cap"] for s in self.sources if s["cap"] < 1}}

    def make_curriculum(self, names: list[str] | None = None) -> Curriculum:
        """The curriculum over `names` (default: the config's sources) in mode `sampling`."""
        if self.sampling == "proportional":
            raise AndreaError("sampling 'proportional' draws by token count and has no curriculum.")
        names = list(names) if names is not None else self.source_names()
        if not names:
            raise AndreaError("a curriculum needs sources; list them in the config's sources.")
        return Curriculum(names, mode=self.sampling, **self.curriculum_kwargs())

    def to_options(self, block_size: int, **extra):
        """The loop's settings (`andrea.train.TrainOptions`) for this config and a model context."""
        from andrea.train import TrainOptions

        seq_len = self.seq_len if self.seq_len is not None else min(256, block_size)
        return TrainOptions(recipe=self.recipe, batch_size=self.batch_size,
                            micro_batch=self.micro_batch or self.batch_size, seq_len=seq_len, lr=self.lr,
                            warmup_steps=self.warmup_steps, max_steps=self.max_steps, time_limit=self.time_limit,
                            eval_every=self.eval_every, checkpoint_every=self.checkpoint_every, seed=self.seed,
                            sampling=self.sampling, curriculum=self.curriculum_kwargs(), audit=dict(self.audit),
                            sources=self.source_names() or None, **extra)

    # ---------------------------------------------------------------- files

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "TrainConfig":
        return cls(**check_fields(data, cls, "training config"))

    def save(self, path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path) -> "TrainConfig":
        return cls.from_dict(read_json(path, "training config"))


def apply_overrides(cfg: TrainConfig, **flags) -> TrainConfig:
    """A new config with the flags that are not None replacing fields. A flag is a field name, or
    `audit_<key>` / `curriculum_<key>` for a key of those sections (audit_threshold=20,
    curriculum_warmup_steps=100). Unknown flags are an error: pass only the config's flags."""
    top, audit, curriculum, unknown = {}, dict(cfg.audit), dict(cfg.curriculum), []
    names = {f.name for f in fields(TrainConfig)}
    for flag, value in flags.items():
        if value is None:
            continue
        if flag in names:
            top[flag] = value
        elif flag.startswith("audit_") and flag[6:] in audit:
            audit[flag[6:]] = value
        elif flag.startswith("curriculum_") and flag[11:] in curriculum:
            curriculum[flag[11:]] = value
        else:
            unknown.append(flag)
    if unknown:
        raise AndreaError(f"unknown training setting(s): {', '.join(sorted(unknown))}.")
    return replace(cfg, **{"audit": {**audit, **top.pop("audit", {})},
                           "curriculum": {**curriculum, **top.pop("curriculum", {})}, **top})


# ---------------------------------------------------------------- checks


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _int(value, name: str, low: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise AndreaError(f"{name} must be an integer >= {low}, got {value!r}.")


def _positive_int(value, name: str) -> None:
    _int(value, name, low=1)


def _optional(cfg, name: str, kind: type) -> None:
    value = getattr(cfg, name)
    if value is not None and not isinstance(value, kind):
        raise AndreaError(f"{name} must be a {kind.__name__}, got {value!r}.")


def _choice(value, allowed: tuple, name: str) -> None:
    if value not in allowed:
        raise AndreaError(f"{name} must be one of {', '.join(allowed)}, got {value!r}.")


def _list_of(value, name: str) -> list:
    if not isinstance(value, (list, tuple)):
        raise AndreaError(f"{name} must be a list, got {value!r}.")
    return list(value)


def _section(value, defaults: dict, name: str) -> dict:
    if not isinstance(value, dict):
        raise AndreaError(f"{name} must be an object, got {value!r}.")
    unknown = sorted(set(value) - set(defaults))
    if unknown:
        raise AndreaError(f"unknown {name} setting(s): {', '.join(unknown)}; known: {', '.join(defaults)}.")
    return {**defaults, **value}


def _source_entry(entry) -> dict:
    if isinstance(entry, str):
        entry = {"name": entry}
    if not isinstance(entry, dict):
        raise AndreaError(f"a source must be a name or an object with {', '.join(SOURCE_KEYS)}, got {entry!r}.")
    unknown = sorted(set(entry) - set(SOURCE_KEYS))
    if unknown:
        raise AndreaError(f"unknown source field(s): {', '.join(unknown)}; known: {', '.join(SOURCE_KEYS)}.")
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        raise AndreaError(f"every source needs a name, got {entry!r}.")
    path = entry.get("path", name)
    if not isinstance(path, str) or not path:
        raise AndreaError(f"source {name}: path must be a non-empty string, got {path!r}.")
    out = {"name": name, "path": path}
    for key, default in (("floor", 0.0), ("cap", 1.0)):
        value = entry.get(key, default)
        if not _is_number(value) or not 0 <= value <= 1:
            raise AndreaError(f"source {name}: {key} must be a number in 0..1, got {value!r}.")
        out[key] = float(value)
    return out
