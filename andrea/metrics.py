"""A run's metrics: the speed meter, and metrics.jsonl written and read back.

metrics.jsonl holds one JSON object per line: one per step (loss, smoothed loss, lr, source,
tokens/s, MFU), one per evaluation (`eval`: loss and bits per byte per source) and one per audit.
Rows are appended as the run goes; a reader skips a damaged line (cut off by a crash, garbage),
since the file feeds pictures and summaries, never the run itself.
"""

from __future__ import annotations

import json
import math
import time
from contextlib import contextmanager
from pathlib import Path

from andrea.errors import AndreaError
from andrea.files import json_lines, open_regular, write_error_reason
from andrea.validate import is_int, is_real


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


def read_metrics(path: Path) -> list[dict]:
    """The rows of a metrics.jsonl that are JSON objects, in order. A damaged line (cut off by a
    crash, garbage, null) is left out: the file feeds pictures and summaries, never the run."""
    rows = []
    try:
        with open_regular(path, "rb", "the metrics file") as f:
            for row in json_lines(f, str(path)):  # a line of more than MAX_JSON_LINE bytes is skipped
                if isinstance(row, dict):
                    rows.append(row)
    except (OSError, AndreaError):  # none yet, or not a regular file: nothing to draw from
        pass
    return rows


def _finite_number(x) -> bool:
    return is_real(x) and math.isfinite(x)


def loss_curves(rows: list[dict]):
    """(steps, losses, smoothed losses, {source: [(step, validation loss)]}) from the rows of a
    metrics.jsonl; a row missing a number, or holding one of the wrong type, is left out."""
    steps, loss, smma, ev = [], [], [], {}
    for row in rows:
        step = row.get("step")
        if not is_int(step):
            continue
        if "eval" in row:
            got = row["eval"]
            if not isinstance(got, dict):
                continue
            for name, m in got.items():
                if isinstance(m, dict) and _finite_number(m.get("loss")):
                    ev.setdefault(str(name), []).append((step, m["loss"]))
        elif _finite_number(row.get("loss")) and _finite_number(row.get("smma")):
            steps.append(step), loss.append(row["loss"]), smma.append(row["smma"])
    return steps, loss, smma, ev


def append_row(path: Path, row: dict) -> None:
    """Add one row to a metrics.jsonl; a failed write stops the run in one sentence."""
    try:
        with open_regular(path, "a", "the metrics file") as f:
            f.write(json.dumps(row) + "\n")
    except OSError as e:
        raise AndreaError(f"could not add to {path} ({write_error_reason(e)}); training stopped.") from None
