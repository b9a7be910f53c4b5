"""A run's metrics: the speed meter, and metrics.jsonl written and read back.

metrics.jsonl holds one JSON object per line, each of one kind (`row_kind`): a step (loss,
smoothed loss, lr, source, tokens/s, MFU), an evaluation (`eval`: loss and bits per byte per
source), an audit (`audit`), the word-similarity scores (`similarity`, andrea.inside.wordsim) and the
heads' scores at a snapshot (`heads`, andrea.inside.heads). Rows are appended as the run goes.

Read back, every row goes through one gate, `read_metrics`: a line that is no JSON object (cut off
by a crash, garbage, null) and a row whose fields fail their declared shape (`valid_row`: the
fields of its kind, each of its type, in its range and finite; the heads' scores lists of the
model's blocks × heads) is left out, with a note for a reader that shows notes. The file feeds
pictures and summaries, never the run, so a damaged row costs at most its point. Every reader of
the rows is listed beside the gate (METRICS_READERS) and driven through the same damaged rows by
tests/test_metrics.py.
"""

from __future__ import annotations

import json
import math
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

from andrea.errors import AndreaError
from andrea.files import MAX_JSON_LINE, json_lines, open_regular, write_error_reason
from andrea.inside.heads import KINDS
from andrea.validate import Shape, number_in, shape_problem

# Every reader of metrics.jsonl's rows; each reads them through `read_metrics` alone.
METRICS_READERS = (
    "loss.png",                  # andrea.plots.plot_losses, through loss_curves
    "andrea main's best evaluation",  # andrea.mainjob._eval_at
    "lab growth heads",          # andrea.web.lab_growth, POST /api/growth/heads
    "bench_induction",           # benchmarks/bench_induction.py: crossing, loss_fall
    "bench_similarity",          # benchmarks/bench_similarity.py: cost, the snapshots' share of a run's time
    "bench_curriculum",          # benchmarks/bench_curriculum.py: step_losses, a run's (source, loss) steps
    "gpu_bench",                 # benchmarks/gpu_bench.py: last_step_and_bpb
)


class Meter:
    """Tokens/s and MFU over windows of about two seconds, with pauses taken out."""

    def __init__(self, tokens_per_step: int, flops_per_token: float, peak: float | None):
        self.tokens_per_step, self.fpt, self.peak = tokens_per_step, flops_per_token, peak
        self.window_t, self.window_tokens = time.time(), 0
        self.tokens_per_s, self.mfu = 0.0, None

    def count(self, step: int) -> None:
        self.window_tokens += self.tokens_per_step
        now = time.time()
        if now - self.window_t >= 2.0 or step == 1:
            self.tokens_per_s = self.window_tokens / (now - self.window_t)
            self.mfu = self.tokens_per_s * self.fpt / self.peak if self.peak else None
            self.window_t, self.window_tokens = now, 0

    @contextmanager
    def paused(self):
        start = time.time()
        try:
            yield
        finally:
            self.window_t += time.time() - start


# ---------------------------------------------------------------- the rows' declared shape

MAX_STEP = 2**62
MAX_LOSS = 1e4  # nats per token: a random model's is about ln V (9 for V = 8,704)
MAX_N = 1 << 16  # tokens of the heads' random sequence r


_COUNT, _UNIT, _ANY = Shape.integer(0, MAX_STEP), Shape.real(0, 1), Shape.real(0, math.inf)
_LOSS, _TEXT = Shape.real(0, MAX_LOSS), Shape.text(MAX_JSON_LINE)  # a row is at most one line long
_SOURCE_EVAL = Shape.mapping(Shape.record(loss=_LOSS, bpb=_ANY, tokens_=Shape.optional(_COUNT), se_=Shape.optional(_ANY)))

# each kind of row: the field that names it, and the row's declared shape (andrea.validate.Shape: a
# key ending in "_" is optional); a row holds "step" (an integer from 0) and the fields of exactly one kind
KINDS_OF_ROW = {
    "step": ("loss", Shape.record(loss=_LOSS, smma=_LOSS, lr_=_ANY, source_=_TEXT, tokens_=_COUNT, tok_per_s_=_ANY,
                                  mfu_=Shape.optional(_ANY), time_=_ANY, grad_norm_=Shape.optional(_ANY),
                                  weights_=Shape.mapping(_UNIT))),
    "eval": ("eval", Shape.record(eval=_SOURCE_EVAL)),  # and a source "all"
    "audit": ("audit", Shape.record(audit=Shape.record(score=Shape.real(0, 100), components=Shape.mapping(_UNIT),
                                                       text=_TEXT))),
    "similarity": ("similarity", Shape.record(similarity=Shape.mapping(Shape.mapping(Shape.optional(Shape.real(-1, 1)))),
                                              growth_seconds_=_ANY)),
    "heads": ("heads", Shape.record(heads=Shape.mapping(Shape.anything()))),  # and _heads_fault: the model's shape
}


def row_kind(row) -> str | None:
    """The kind of a metrics row (a key of KINDS_OF_ROW), or None when it names none or more than one."""
    kinds = [kind for kind, (key, _) in KINDS_OF_ROW.items() if isinstance(row, dict) and key in row]
    return kinds[0] if len(kinds) == 1 else None


def valid_row(row, heads_shape: tuple[int, int] | None = None) -> str | None:
    """Why a metrics row fails its declared shape (KINDS_OF_ROW), or None when it passes: a JSON
    object of one kind, its step an integer from 0, every field of its kind present where required
    and of its type, range and finiteness; the heads' scores (L, heads) lists, of `heads_shape` when given."""
    if not isinstance(row, dict):
        return "it is not a JSON object"
    if shape_problem(row.get("step"), _COUNT):
        return "its step is not an integer from 0"
    kind = row_kind(row)
    if kind is None:
        return "it is no one kind of row andrea writes"
    problem = shape_problem(row, KINDS_OF_ROW[kind][1])
    if problem:
        return f"its {problem}"
    if kind == "eval" and "all" not in row["eval"]:
        return "its eval gives no figure over all sources"
    return _heads_fault(row["heads"], heads_shape) if kind == "heads" else None


def heads_shape_of(value) -> tuple[int, int] | None:
    """(blocks, heads) of a heads row's scores of the first kind, or None where they are no list of
    non-empty lists."""
    scores = value.get("scores") if isinstance(value, dict) else None
    first = scores.get(KINDS[0]) if isinstance(scores, dict) else None
    if not isinstance(first, list) or not first or not isinstance(first[0], list) or not first[0]:
        return None
    return len(first), len(first[0])


def _heads_fault(value, shape: tuple[int, int] | None) -> str | None:
    """Why a row's "heads" is not what andrea.inside.heads.score_heads writes: {"n", "scores": {kind: (L, heads)
    list of weights in [0, 1]}, "best": {kind: weight}}, every kind of KINDS, one shape for all."""
    if not isinstance(value, dict) or not number_in(value.get("n"), int, 2, MAX_N):
        return "its heads' scores name no sequence length n"
    scores, best = value.get("scores"), value.get("best")
    if not isinstance(scores, dict) or not isinstance(best, dict) \
            or any(k not in scores or shape_problem(best.get(k), _UNIT) for k in KINDS):
        return f"its heads' scores do not give each of {', '.join(KINDS)}"
    got = heads_shape_of(value)
    for kind in KINDS:
        s = scores[kind]
        if got is None or not isinstance(s, list) or len(s) != got[0] or not all(
                isinstance(b, list) and len(b) == got[1] and not any(shape_problem(w, _UNIT) for w in b) for b in s):
            return f"its heads' {kind} scores are not a list of blocks of heads' weights in [0, 1]"
    if shape is not None and got != tuple(shape):
        return f"its heads' scores are of {got[0]} blocks × {got[1]} heads, the model's {shape[0]} × {shape[1]}"
    return None


# ---------------------------------------------------------------- the gate


def read_metrics(path: Path, heads_shape: tuple[int, int] | None = None, notes: list | None = None) -> list[dict]:
    """The rows of a metrics.jsonl that pass `valid_row`, in order; the others are left out, and
    `notes` (when given) gets one line for each ("line 7: its loss is missing or ..."). The heads'
    scores must be of `heads_shape` (the model's blocks × heads) when given, else of the one shape
    most heads rows share. A file that is missing or no regular file gives no rows."""
    kept, faults = [], []
    try:
        with open_regular(path, "rb", "the metrics file") as f:
            for number, row in enumerate(json_lines(f, str(path)), 1):  # a line over MAX_JSON_LINE bytes is None
                why = "it is not a whole JSON line" if row is None else valid_row(row, heads_shape)
                (faults if why else kept).append((number, why or row))
    except (OSError, AndreaError):  # none yet, or not a regular file: nothing to draw from
        pass
    if heads_shape is None:  # no model to compare with: one run's heads rows share one shape
        shapes = Counter(heads_shape_of(row["heads"]) for _, row in kept if "heads" in row)
        most = max(shapes, key=shapes.get) if shapes else None  # the first seen of the commonest
        faults += [(n, "its heads' scores are of another shape than most of the run's") for n, row in kept
                   if "heads" in row and heads_shape_of(row["heads"]) != most]
        kept = [(n, row) for n, row in kept if "heads" not in row or heads_shape_of(row["heads"]) == most]
    if notes is not None:
        notes.extend(f"line {number:,}: {why}" for number, why in sorted(faults))
    return [row for _, row in kept]


def loss_curves(rows: list[dict]):
    """(steps, losses, smoothed losses, {source: [(step, validation loss)]}) from rows that passed
    `read_metrics`' gate."""
    steps, loss, smma, ev = [], [], [], {}
    for row in rows:
        if row_kind(row) == "eval":
            for name, m in row["eval"].items():
                ev.setdefault(str(name), []).append((row["step"], m["loss"]))
        elif row_kind(row) == "step":
            steps.append(row["step"]), loss.append(row["loss"]), smma.append(row["smma"])
    return steps, loss, smma, ev


def append_row(path: Path, row: dict) -> None:
    """Add one row to a metrics.jsonl; a failed write stops the run in one sentence."""
    try:
        with open_regular(path, "a", "the metrics file") as f:
            f.write(json.dumps(row) + "\n")
    except OSError as e:
        raise AndreaError(f"could not add to {path} ({write_error_reason(e)}); training stopped.") from None
