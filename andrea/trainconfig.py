"""Every setting of a training run, defined once: its default, its check, its help.

The dataclass `TrainConfig` below is the one definition. From it come the defaults of the library
(`andrea.train.train` takes a TrainConfig), the checks of the JSON config file (`--config`), and
the flags of `andrea train` (`add_arguments`), so the three accept exactly the same settings:

    {
      "preset": "andrea-cpu", "data": "data/", "out": "runs/a",
      "sources": [{"name": "sotu", "path": "sotu", "floor": 0.05, "cap": 0.6}, "kjv"],
      "sampling": "ucb",
      "curriculum": {"C": 1.414, "reroll": [7, 42], "warmup_sources": ["sotu"], "warmup_steps": 200},
      "audit": {"every": 100, "tokens": 420, "threshold": 30, "patience": 5, "enabled": true},
      "recipe": "v2", "batch_size": 16, "seq_len": 256, "max_steps": 5000
    }

Every field is optional and every unknown field is an error. A field `batch_size` is the flag
`--batch-size`; a key of a section is `--<section>-<key>` (`--audit-threshold 20`,
`--curriculum-warmup-steps 100`), and `audit.enabled` is `--audit` / `--no-audit`. Flags
override the file's fields. A source is an object with `name` (required), `path` (what
`andrea prepare` reads: a fetched source name, a folder or a text file; default: the name),
`floor` (default 0) and `cap` (default 1), or just its name as a string; on the command line
each `--sources` item is a name or such an object in JSON. A partial section keeps the defaults
of the keys it leaves out. `warmup_steps` at the top level is the v2 learning-rate warm-up; the
curriculum's warm-up is `curriculum.warmup_steps`.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict, dataclass, field, fields, replace

from andrea.config import PRESETS
from andrea.curriculum import DEFAULT_C, DEFAULT_REROLL, MODES, REWARDS, Curriculum
from andrea.errors import AndreaError
from andrea.files import atomic_write_bytes, parse_json, read_json
from andrea.validate import MAX_SEED, check_fields, flag_number, is_int, is_real

# The recipes (andrea.optim builds their optimizers) and each one's peak learning rate when a
# config names none. They live here, with no torch import, so that the command line's parser
# (which reads them) starts without loading torch.
RECIPES = ("v1", "v2", "v3")
DEFAULT_LR = {"v1": 3e-4, "v2": 1e-3, "v3": 3e-3}

SAMPLING = (*MODES, "proportional")  # the curriculum's modes, or by token count with no curriculum
SOURCE_KEYS = ("name", "path", "floor", "cap")

# ---------------------------------------------------------------- checks, one per kind of value


def _is_number(value) -> bool:
    return is_real(value) and math.isfinite(value)


MAX_INT = 2**63 - 1  # what torch and numpy hold in an int64
MAX_BATCH = 2**20  # sequences per step: each needs its own offset and window


def _int_at_least(low: int, high: int = MAX_INT):
    def check(value, name):
        if not is_int(value) or value < low:
            raise AndreaError(f"{name} must be an integer >= {low}, got {str(value)[:40]}.")
        if value > high:
            raise AndreaError(f"{name} must be at most {high:,}, got {str(value)[:40]}.")
    check.kind, check.range = int, (low, high)
    return check


MAX_AUDIT_TOKENS = 10_000  # an audit sample is scored as text; more would only stall the run between steps
positive_int, non_negative_int = _int_at_least(1), _int_at_least(0)
audit_tokens_int = _int_at_least(1, MAX_AUDIT_TOKENS)
batch_int, seed_int = _int_at_least(1, MAX_BATCH), _int_at_least(0, MAX_SEED)


def positive_number(value, name):
    if not _is_number(value) or not value > 0:
        raise AndreaError(f"{name} must be a positive number, got {value!r}.")


def non_negative_number(value, name):
    if not _is_number(value) or value < 0:
        raise AndreaError(f"{name} must be a non-negative number, got {value!r}.")


def fraction(value, name):
    if not _is_number(value) or not 0 <= value <= 1:
        raise AndreaError(f"{name} must be a number in 0..1, got {value!r}.")


def percent(value, name):
    if not _is_number(value) or not 0 <= value <= 100:
        raise AndreaError(f"{name} must be a number in 0..100, got {value!r}.")


def boolean(value, name):
    if not isinstance(value, bool):
        raise AndreaError(f"{name} must be true or false, got {value!r}.")


def text(value, name):
    if not isinstance(value, str) or not value:
        raise AndreaError(f"{name} must be a non-empty string, got {value!r}.")


def names_list(value, name):
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        raise AndreaError(f"{name} must be a list of names, got {value!r}.")


def reroll_range(value, name):
    if (not isinstance(value, list) or len(value) != 2
            or not all(is_int(x) for x in value) or not 1 <= value[0] <= value[1]):
        raise AndreaError(f"{name} must be two integers 1 <= low <= high, got {value!r}.")


def one_of(*allowed):
    def check(value, name):
        if value not in allowed:
            raise AndreaError(f"{name} must be one of {', '.join(allowed)}, got {value!r}.")
    check.choices = allowed
    return check


MAX_REAL = 1e12  # the largest a real-valued setting's flag reads; the setting's check may bound it further
for _check, _range in ((positive_number, (0, MAX_REAL, True)), (non_negative_number, (0, MAX_REAL)), (fraction, (0, 1)),
                       (percent, (0, 100))):
    _check.kind, _check.range = float, _range
text.kind = str
boolean.kind = bool


def optional(check):
    """The same check, but None (\"use the default rule\") is allowed too."""
    def wrapped(value, name):
        if value is not None:
            check(value, name)
    wrapped.kind, wrapped.choices = getattr(check, "kind", None), getattr(check, "choices", None)
    wrapped.range = getattr(check, "range", None)
    return wrapped


@dataclass(frozen=True)
class Setting:
    """One setting's default, check and help; `nargs` and `kind` shape its flag."""

    default: object
    check: object
    help: str
    nargs: object = None
    kind: type | None = None
    metavar: object = None


def setting(default, check, help: str, **flag) -> object:
    """A dataclass field that carries its Setting (check and help) in its metadata."""
    spec = Setting(default, check, help, **flag)
    if isinstance(default, (dict, list)):
        return field(default_factory=lambda: json.loads(json.dumps(default)), metadata={"setting": spec})
    return field(default=default, metadata={"setting": spec})


AUDIT = {
    "enabled": Setting(True, boolean, "score a generated sample every `every` steps and halt a collapsed run"),
    "every": Setting(100, positive_int, "steps between sample audits"),
    "tokens": Setting(420, audit_tokens_int, f"tokens generated for each audit sample (at most {MAX_AUDIT_TOKENS:,})"),
    "threshold": Setting(30.0, percent, "a score below this (0-100) counts as a low score"),
    "patience": Setting(5, positive_int, "low scores in a row that halt the run"),
}
CURRICULUM = {
    "C": Setting(DEFAULT_C, non_negative_number, "the UCB1 exploration constant"),
    "reward": Setting("andrea", one_of(*REWARDS), "andrea: ANDREA's reward (the loss drop below the source's EMA "
                      "× 1000, never negative); progress: the signed drop in percent of the source's own recent "
                      "loss, averaged over recent pulls; abs-progress: the size of that average, so a source being forgotten "
                      "is drawn again"),
    "reroll": Setting(list(DEFAULT_REROLL), reroll_range, "a pick lasts a random number of steps in LOW..HIGH",
                      nargs=2, kind=int, metavar=("LOW", "HIGH")),
    "warmup_sources": Setting([], names_list, "sources drawn alone during the curriculum's warm-up", nargs="*", kind=str, metavar="NAME"),
    "warmup_steps": Setting(0, non_negative_int, "steps of curriculum warm-up on warmup_sources"),
}
SECTIONS = {"audit": AUDIT, "curriculum": CURRICULUM}


def _section_defaults(section: dict) -> dict:
    return {key: json.loads(json.dumps(s.default)) for key, s in section.items()}


@dataclass
class TrainConfig:
    # what to train on and where it goes
    preset: str | None = setting(None, optional(one_of(*PRESETS)), "model preset (default andrea-cpu)")
    model_config: str | None = setting(None, optional(text), "a model config JSON instead of a preset", metavar="FILE")
    data: str | None = setting(None, optional(text), "a folder made by `andrea prepare`", metavar="DIR")
    out: str | None = setting(None, optional(text), "the run folder (checkpoints, metrics.jsonl, loss.png)", metavar="DIR")
    sources: list = setting([], None, "train on these sources of the data only, each a name or a JSON object "
                            "with name, path, floor, cap (default: every source, no floors or caps)", nargs="+", kind=str,
                            metavar="SOURCE")
    sampling: str = setting("ucb", one_of(*SAMPLING), "how each step's source is chosen: the UCB1 curriculum, "
                            "uniform, or proportional to token count")
    curriculum: dict = setting(_section_defaults(CURRICULUM), None, "the curriculum's settings")
    audit: dict = setting(_section_defaults(AUDIT), None, "the sample audit's settings")
    # the optimizer and its schedule
    recipe: str = setting("v2", one_of(*RECIPES), "v1: Adam 3e-4 and nothing else; v2: AdamW, weight decay on "
                          "matrices, clipping, warm-up into cosine; v3: Muon for the blocks' matrices and AdamW for "
                          "the rest, clipping, warm-up/stable/decay over the run's budget")
    lr: float | None = setting(None, optional(positive_number),
                               f"peak learning rate (default v1 {DEFAULT_LR['v1']:g}, v2 {DEFAULT_LR['v2']:g}, "
                               f"v3 {DEFAULT_LR['v3']:g})")
    muon_lr: float | None = setting(None, optional(positive_number), "v3: peak learning rate of the Muon-trained "
                                    "matrices, in AdamW's units (default: lr)")
    warmup_steps: int = setting(2000, non_negative_int, "v2 and v3 linear learning-rate warm-up steps")
    min_lr_ratio: float = setting(0.1, fraction, "v2: the cosine decays to lr times this")
    decay_fraction: float = setting(0.3, fraction, "v3: the last part of the budget (steps or seconds) over which "
                                    "the learning rate decays linearly to zero")
    weight_decay: float = setting(0.1, non_negative_number, "v2 and v3 weight decay of the matrices")
    grad_clip: float = setting(1.0, non_negative_number, "v2 and v3 global gradient-norm clip (0: none)")
    # sizes and budget
    batch_size: int = setting(16, batch_int, "sequences per optimizer step, over all processes")
    micro_batch: int | None = setting(None, optional(batch_int), "sequences per forward pass per process; "
                                      "gradients accumulate (default: the whole per-process batch)")
    seq_len: int | None = setting(None, optional(positive_int), "tokens per training sequence, at most the "
                                  "model's context (default 256, or the context when shorter)")
    max_steps: int | None = setting(None, optional(positive_int), "stop after this many optimizer steps")
    time_limit: float | None = setting(None, optional(positive_number), "stop after this many seconds of training")
    # what the run measures and keeps
    eval_every: int = setting(100, positive_int, "steps between validation passes")
    eval_windows: int = setting(16, positive_int, "validation windows per source at each evaluation")
    patience: int = setting(0, non_negative_int, "stop once this many evaluations in a row have not lowered the "
                            "validation loss (0: never)")
    checkpoint_every: int = setting(100, positive_int, "steps between checkpoints")
    smma_window: int = setting(100, positive_int, "window of the smoothed (SMMA) training loss")
    snapshots: bool = setting(True, boolean, "keep snapshots of the embedding tables in embeddings/ (steps 0, 1, 2, "
                              "4, … and every evaluation) and score word similarity at every evaluation")
    snapshot_rows: int = setting(2048, _int_at_least(1, 1 << 20), "rows kept per snapshot of a large table (V·d over "
                                 "2^20): the most frequent tokens, plus every token of the similarity sets")
    snapshot_mb: float = setting(256.0, positive_number, "disk budget of the snapshots in MB: it sets after how many "
                                 "kept evaluations their spacing doubles, so 1,000 evaluations stay within about it")
    seed: int = setting(1337, seed_int, "seed of weights, data order and curriculum")
    # how it runs
    compile: bool = setting(False, boolean, "torch.compile the model (on a CPU too, where inductor needs a C++ compiler)")
    fsdp: bool = setting(False, boolean, "shard with FSDP under torchrun instead of DDP")

    def __post_init__(self):
        if not isinstance(self.sources, (list, tuple)):
            raise AndreaError(f"sources must be a list, got {self.sources!r}.")
        self.sources = [_source_entry(s) for s in self.sources]
        for name, section in SECTIONS.items():
            setattr(self, name, _section(getattr(self, name), section, name))
        for f in fields(self):
            check = f.metadata["setting"].check
            if check is not None:
                check(getattr(self, f.name), f.name)
        if self.preset is not None and self.model_config is not None:
            raise AndreaError("give either preset or model_config, not both.")
        names = self.source_names()
        if len(set(names)) != len(names):
            raise AndreaError(f"source names must be unique, got {', '.join(names)}.")
        if names and self.sampling != "proportional":
            self.make_curriculum(names)  # checks floors and caps together, and the warm-up sources

    # ---------------------------------------------------------------- what a trainer reads

    def resolved_lr(self) -> float:
        return self.lr if self.lr is not None else DEFAULT_LR[self.recipe]

    def for_model(self, block_size: int) -> "TrainConfig":
        """This config with the defaults that depend on the model filled in (seq_len), checked
        for running: a run needs to know when to stop."""
        if self.max_steps is None and self.time_limit is None:
            raise AndreaError("give max_steps or time_limit (or both) so the run knows when to stop.")
        seq_len = self.seq_len if self.seq_len is not None else min(256, block_size)
        if seq_len > block_size:
            raise AndreaError(f"seq_len {seq_len} is longer than the model's context {block_size}.")
        return replace(self, seq_len=seq_len)

    def source_names(self) -> list[str]:
        return [s["name"] for s in self.sources]

    def curriculum_kwargs(self) -> dict:
        """Keyword arguments of `Curriculum` besides the sources and the mode (which is `sampling`)."""
        c = self.curriculum
        return {"C": float(c["C"]), "reward": c["reward"], "reroll": tuple(c["reroll"]), "warmup_sources": list(c["warmup_sources"]),
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

    # ---------------------------------------------------------------- files

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "TrainConfig":
        return cls(**check_fields(data, cls, "training config"))

    def save(self, path) -> None:
        atomic_write_bytes(path, (json.dumps(self.to_dict(), indent=2) + "\n").encode())

    @classmethod
    def load(cls, path) -> "TrainConfig":
        return cls.from_dict(read_json(path, "training config"))


# ---------------------------------------------------------------- the command line


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-").lower()


def _add_flag(parser, flag: str, dest: str, spec: Setting) -> None:
    kind = spec.kind or getattr(spec.check, "kind", None) or str
    help = spec.help
    if spec.default not in (None, [], {}) and kind is not bool:
        shown = " ".join(map(str, spec.default)) if isinstance(spec.default, list) else f"{spec.default:g}" \
            if isinstance(spec.default, float) else spec.default
        help += f" (default {shown})"
    if kind is bool:
        parser.add_argument(flag, dest=dest, action=argparse.BooleanOptionalAction, default=None,
                            help=help + f" (default {'on' if spec.default else 'off'})")
        return
    choices = getattr(spec.check, "choices", None)
    metavar = spec.metavar or (None if choices else {int: "N", float: "X"}.get(kind, "VALUE"))
    if kind in (int, float):  # read by the one parser of numeric flags, within the setting's range
        wide = (-MAX_INT, MAX_INT) if kind is int else (-MAX_REAL, MAX_REAL)
        kind = flag_number(kind, *(getattr(spec.check, "range", None) or wide))
    parser.add_argument(flag, dest=dest, type=kind, nargs=spec.nargs, default=None, choices=choices,
                        metavar=metavar, help=help)


def add_arguments(parser) -> None:
    """One flag per setting of TrainConfig and per key of its sections."""
    for f in fields(TrainConfig):
        if f.name in SECTIONS:
            for key, spec in SECTIONS[f.name].items():
                flag = _flag(f.name) if key == "enabled" else _flag(f"{f.name}_{key}")
                _add_flag(parser, flag, f"{f.name}_{key}", spec)
        else:
            _add_flag(parser, _flag(f.name), f.name, f.metadata["setting"])


def setting_flags(args) -> dict:
    """The settings given on the command line, as keyword arguments of `apply_overrides`."""
    out = {}
    for f in fields(TrainConfig):
        keys = [f"{f.name}_{k}" for k in SECTIONS[f.name]] if f.name in SECTIONS else [f.name]
        out.update({k: getattr(args, k) for k in keys if getattr(args, k, None) is not None})
    if "sources" in out:
        out["sources"] = [_source_flag(s) for s in out["sources"]]
    return out


def _source_flag(item: str):
    if not item.lstrip().startswith("{"):
        return item
    try:
        return parse_json(item, "the item")
    except AndreaError as e:
        raise AndreaError(f"--sources item {item[:60]!r} is not a source name or a JSON object: {e}") from None


def apply_overrides(cfg: TrainConfig, **flags) -> TrainConfig:
    """A new config with the flags that are not None replacing fields. A flag is a field name, or
    `audit_<key>` / `curriculum_<key>` for a key of those sections (audit_threshold=20,
    curriculum_warmup_steps=100). Unknown flags are an error: pass only the config's flags."""
    top, sections, unknown = {}, {name: dict(getattr(cfg, name)) for name in SECTIONS}, []
    names = {f.name for f in fields(TrainConfig)}
    for flag, value in flags.items():
        if value is None:
            continue
        section = next((s for s in SECTIONS if flag.startswith(s + "_") and flag[len(s) + 1:] in SECTIONS[s]), None)
        if flag in names:
            top[flag] = value
        elif section is not None:
            sections[section][flag[len(section) + 1:]] = value
        else:
            unknown.append(flag)
    if unknown:
        raise AndreaError(f"unknown training setting(s): {', '.join(sorted(unknown))}.")
    for name in SECTIONS:
        sections[name].update(top.pop(name, {}))
    return replace(cfg, **sections, **top)


# ---------------------------------------------------------------- sections and sources


def _section(value, specs: dict, name: str) -> dict:
    if not isinstance(value, dict):
        raise AndreaError(f"{name} must be an object, got {value!r}.")
    unknown = sorted(set(value) - set(specs))
    if unknown:
        raise AndreaError(f"unknown {name} setting(s): {', '.join(unknown)}; known: {', '.join(specs)}.")
    out = {**_section_defaults(specs), **value}
    for key, spec in specs.items():
        if isinstance(out[key], tuple):
            out[key] = list(out[key])
        spec.check(out[key], f"{name}.{key}")
    return out


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
        fraction(value, f"source {name}: {key}")
        out[key] = float(value)
    return out


def batch_split(cfg: TrainConfig, world: int) -> tuple[int, int, int]:
    """(sequences per process, per micro-batch, micro-batches per step)."""
    if cfg.batch_size % world:
        raise AndreaError(f"batch_size {cfg.batch_size} does not split over {world} processes.")
    per_rank = cfg.batch_size // world
    micro = min(cfg.micro_batch or per_rank, per_rank)
    if per_rank % micro:
        raise AndreaError(f"the per-process batch {per_rank} is not a multiple of micro_batch {micro}.")
    return per_rank, micro, per_rank // micro
