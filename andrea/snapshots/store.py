"""The embedding tables while they learn: snapshots written beside the training loop.

A run keeps in `embeddings/` of its folder one safetensors file per snapshot,
`step-00000128.safetensors`, each written to a temporary file and renamed, so a crash leaves every
earlier snapshot whole. Snapshots are taken at step 0 (the random initialisation), at steps 1, 2,
4, 8, … (log-spaced, where a table changes most), and at every evaluation; once K evaluations
have been kept, at every 2nd, after K more every 4th, and so on, so a long run's folder grows
with the logarithm of its length. K follows from the run's disk budget (`snapshot_mb`, 256 MB):
an eighth of the snapshots the budget holds, between 2 and 48 (andrea-cpu: 18; andrea-120m: 3),
so that even 1,000 evaluations stay within about the budget.

What a snapshot holds. `rows`: the token ids kept. A small table (V·d ≤ 2²⁰ values) is kept
whole in float32; a larger one keeps the `snapshot_rows` most frequent tokens of the training
data plus every token of the word-similarity sets and the lesson's words, in float16 (the disk
cost is printed when the run starts). `input` and `output`: those rows of wte and lm_head.
`input_mean`, `output_mean`: the mean row of the whole table (to centre with). `seen`: in how many
steps' batches each token occurred since the previous snapshot (under torchrun, in the batches of
the processes together: a step counts once per process whose share held it). `input_moved`,
`output_moved`: ‖Δ‖ of each row since the previous snapshot (which ties a snapshot to the one
before it: `continues`), and `input_angle`, `output_angle`
the angle in degrees between the row then and now (both computed from the stored values, so a
resumed run computes exactly what an uninterrupted one would). The metadata names the step, the
previous snapshot's step, V, d, the recipe and each table's exact mean pairwise cosine.

State. What a checkpoint must carry to resume this exactly (the counts since the last snapshot,
that snapshot's step, how many evaluations were seen and kept) is `state_dict()`; on `--resume`
snapshots written after the checkpoint's step belong to a continuation that was lost and are
removed, and the last one kept is read back as the base of the next ‖Δ‖ (when it is missing or
damaged, as in a run folder copied without embeddings/, or, taken at the checkpoint's step, does
not hold the checkpoint's table (`holds_table`: another run's), training goes on and says so, and
the next snapshot has no ‖Δ‖). The first snapshot a process writes, resumed or not, first removes
the temporary files of writes a kill cut short.

Read back, a snapshot goes through one gate, `read_snapshot`: every field is checked before it is
believed, the sizes, the row ids (at least one), every tensor's shape, type, finiteness and range
(`seen` whole numbers from 0, ‖Δ‖ from 0, angles 0 to 180 degrees), and each metadata field's type
and range, its step the one its file's name gives. Its readers are listed beside it
(SNAPSHOT_READERS) and driven through the same damaged snapshots by tests/test_snapshots.py.
"""

from __future__ import annotations

import json
import math
import re
import time
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from andrea.errors import AndreaError
from andrea.files import atomic_output, check_regular, remove_dead_temps, write_error_reason
from andrea.inside.wordsim import mean_pairwise_cosine

FOLDER = "embeddings"
WHOLE_LIMIT = 1 << 20  # values of one table kept whole in float32
MAX_EVALS_PER_STRIDE = 48
TABLES = ("input", "output")
_NAME = re.compile(r"step-(\d{8})\.safetensors")


def snapshot_path(run_dir, step: int) -> Path:
    return Path(run_dir) / FOLDER / f"step-{step:08d}.safetensors"


def snapshot_steps(run_dir) -> list[int]:
    folder = Path(run_dir) / FOLDER
    if not folder.is_dir():
        return []
    return sorted(int(m.group(1)) for p in folder.iterdir() if (m := _NAME.fullmatch(p.name)))


def is_log_step(step: int) -> bool:
    return step == 0 or (step & (step - 1)) == 0


def choose_rows(vocab_size: int, d: int, token_counts: np.ndarray | None, keep: np.ndarray, n_frequent: int):
    """(rows, dtype): every row in float32 for a small table, else the most frequent tokens and
    `keep` (the word sets' tokens) in float16."""
    if vocab_size * d <= WHOLE_LIMIT:
        return np.arange(vocab_size, dtype=np.int64), torch.float32
    frequent = np.argsort(-token_counts, kind="stable")[:n_frequent] if token_counts is not None else np.arange(0)
    rows = np.union1d(frequent, keep[keep < vocab_size]).astype(np.int64)
    return rows, torch.float16


class Growth:
    """Takes the snapshots of one run (on the main process; see the module docstring)."""

    def __init__(self, run_dir, vocab_size: int, d: int, rows: np.ndarray, dtype, recipe: str, log=print,
                 budget_mb: float = 256.0):
        self.dir = Path(run_dir) / FOLDER
        self.V, self.d, self.rows, self.dtype, self.recipe = vocab_size, d, rows, dtype, recipe
        self.budget_mb = budget_mb
        fits = budget_mb * 1e6 / self.bytes_per_snapshot()
        self.per_stride = int(min(MAX_EVALS_PER_STRIDE, max(2, fits // 8)))
        self.rows_t = torch.from_numpy(rows)
        self.seen = torch.zeros(vocab_size, dtype=torch.int64)
        self.last_step: int | None = None
        self.evals_seen = self.evals_kept = 0
        self.previous: dict[str, torch.Tensor] | None = None
        self.swept = False  # whether this process has removed the dead writes' temporary files yet
        self.seconds = 0.0  # time spent here and in the similarity scores: what this costs a run
        self.log = log

    def keep_rows_of(self, snap, path) -> None:
        """Go on keeping the rows (and their precision) of the run's own snapshot `snap`: a run resumed
        with another --snapshot-rows (or another count of tokens) would otherwise mix snapshots of
        two row sets in one folder."""
        rows = snap.rows
        if snap.meta["vocab_size"] != self.V or snap.meta["d"] != self.d or len(rows) == 0:
            raise AndreaError(f"{path} is a snapshot of another table than this run's")
        self.log(f"note: this run's snapshots keep {len(rows):,} rows of {self.V:,}, so they go on keeping those "
                 f"(--snapshot-rows applies to a new run).")
        self.rows, self.rows_t = rows.numpy(), rows.clone()
        self.dtype = snap.tables["input"].dtype
        fits = self.budget_mb * 1e6 / self.bytes_per_snapshot()
        self.per_stride = int(min(MAX_EVALS_PER_STRIDE, max(2, fits // 8)))

    def bytes_per_snapshot(self) -> int:
        per_value = 4 if self.dtype == torch.float32 else 2
        return len(self.rows) * (2 * self.d * per_value + 4 * 5 + 8) + 2 * self.d * 4

    def describe(self) -> str:
        what = "whole tables, float32" if len(self.rows) == self.V else f"{len(self.rows):,} rows of {self.V:,}, float16"
        n = self.expected_snapshots(1000, 100_000)
        return (f"embedding snapshots: {what}, {self.bytes_per_snapshot() / 1e6:.1f} MB each, at steps 0, 1, 2, 4, … "
                f"and every evaluation (every 2nd after {self.per_stride} kept, and so on), into {self.dir}; "
                f"a run of 1,000 evaluations in 100,000 steps would keep {n} ({n * self.bytes_per_snapshot() / 1e6:,.0f} MB)")

    def expected_snapshots(self, evaluations: int, steps: int) -> int:
        """How many snapshots a run of `steps` steps evaluated `evaluations` times (evenly) keeps."""
        kept, seen = 0, 0
        every = max(1, steps // max(evaluations, 1))
        for e in range(1, evaluations + 1):
            seen += 1
            if not is_log_step(e * every) and seen % stride(kept, self.per_stride) == 0:
                kept += 1
        return kept + 2 + int(math.log2(max(steps, 1)))

    # ---- counting, each step

    def count(self, batches) -> None:
        """Count one step: `batches` are the id tensors the step trained on (its micro-batches)."""
        t0 = time.perf_counter()
        present = torch.zeros(self.V, dtype=torch.bool)
        for x in batches:
            present[x.reshape(-1).cpu()] = True
        self.seen += present
        self.seconds += time.perf_counter() - t0

    def due(self, step: int, evaluation: bool) -> bool:
        if step == self.last_step:
            return False
        if is_log_step(step):
            return True
        if not evaluation:
            return False
        return self.evals_seen % stride(self.evals_kept, self.per_stride) == 0

    # ---- a snapshot

    def take(self, step: int, model, evaluation: bool = False, seen: torch.Tensor | None = None) -> Path | None:
        """Write the snapshot of `step` if one is due; `seen` overrides the local counts (the sum
        over processes)."""
        if evaluation:
            self.evals_seen += 1
        if not self.due(step, evaluation):
            return None
        t0 = time.perf_counter()
        if evaluation and not is_log_step(step):
            self.evals_kept += 1
        seen = self.seen if seen is None else seen
        tensors, means = {"rows": self.rows_t.clone(), "seen": seen[self.rows_t].to(torch.int32)}, {}
        current = {}
        for name, w in (("input", model.wte.weight), ("output", model.lm_head.weight)):
            full = w.detach().float().cpu()
            means[name] = mean_pairwise_cosine(full.numpy())
            tensors[f"{name}_mean"] = full.mean(dim=0)
            current[name] = full[self.rows_t].to(self.dtype).contiguous()
            tensors[name] = current[name]
            now = current[name].float()
            if self.previous is None:
                moved = torch.zeros(len(self.rows))
                angle = torch.zeros(len(self.rows))
            else:
                before = self.previous[name].float()
                moved = (now - before).norm(dim=1)
                cos = torch.nn.functional.cosine_similarity(now, before, dim=1, eps=1e-30).clamp(-1, 1)
                angle = torch.rad2deg(torch.arccos(cos))
            tensors[f"{name}_moved"], tensors[f"{name}_angle"] = moved, angle
        meta = {"step": step, "previous": self.last_step, "vocab_size": self.V, "d": self.d, "recipe": self.recipe,
                "evaluation": evaluation, "mean_cos": means, "whole": len(self.rows) == self.V}
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:  # a file, FIFO or link named embeddings: the caller notes it, training goes on
            raise AndreaError(f"cannot keep snapshots in {self.dir} ({write_error_reason(e)})") from None
        if not self.dir.is_dir() or self.dir.is_symlink():
            raise AndreaError(f"{self.dir} is not a folder of its own, so snapshots cannot be kept there")
        if not self.swept:  # the temporary file of a snapshot write a kill cut short, resumed run or not
            remove_dead_temps(self.dir)
            self.swept = True
        path = snapshot_path(self.dir.parent, step)
        with atomic_output(path) as tmp:
            save_file(tensors, str(tmp), metadata={"andrea.growth": json.dumps(meta)})
        self.previous, self.last_step = current, step
        self.seen.zero_()
        self.seconds += time.perf_counter() - t0
        return path

    # ---- resume

    def state_dict(self) -> dict:
        nz = torch.nonzero(self.seen).ravel()
        return {"last_step": self.last_step, "evals_seen": self.evals_seen, "evals_kept": self.evals_kept,
                "seen_ids": nz.tolist(), "seen_counts": self.seen[nz].tolist(), "rows": len(self.rows)}

    def load_state_dict(self, d, step: int, where, table: torch.Tensor | None = None) -> None:
        """Restore from a checkpoint's metadata (checked first), drop the snapshots after `step`,
        and read the last one kept back as the base of the next ‖Δ‖: where it was taken at the
        checkpoint's step, it must hold the rows of the checkpoint's input table `table` (else it is
        another run's, and the next snapshot has no base)."""
        def bad(field):
            raise AndreaError(f"{where}: its run state field 'growth.{field}' is damaged.")

        if not isinstance(d, dict):
            bad("(the whole record)")
        last, seen_ids, seen_counts = d.get("last_step"), d.get("seen_ids"), d.get("seen_counts")
        if last is not None and (not _count(last) or last > step):
            bad("last_step")
        # at most one evaluation a step (and one at step 0), and no more kept than seen
        if not _count(d.get("evals_seen")) or d["evals_seen"] > step + 1:
            bad("evals_seen")
        if not _count(d.get("evals_kept")) or d["evals_kept"] > d["evals_seen"]:
            bad("evals_kept")
        if not isinstance(seen_ids, list) or not isinstance(seen_counts, list) or len(seen_ids) != len(seen_counts):
            bad("seen_ids")
        if not all(_count(i) and i < self.V for i in seen_ids) or not all(_count(c) and c <= step for c in seen_counts):
            bad("seen_counts")
        for later in [s for s in snapshot_steps(self.dir.parent) if s > step]:
            snapshot_path(self.dir.parent, later).unlink()
        previous = None
        if last is not None:
            path = snapshot_path(self.dir.parent, last)
            try:
                snap = read_snapshot(path)
                if table is not None and last == step and not holds_table(snap, table):
                    raise AndreaError("its table is not this checkpoint's: it is another run's")
                if not torch.equal(snap.rows, self.rows_t):
                    self.keep_rows_of(snap, path)
                previous = {name: snap.tables[name] for name in TABLES}
            except (AndreaError, OSError) as e:
                # a run folder copied without embeddings/, a damaged file or another run's: the training goes
                # on, and the next snapshot has no predecessor to measure ‖Δ‖ against (it reads 0)
                why = str(e).rstrip(".").replace(f"{path} ", "it ") if isinstance(e, AndreaError) else "it cannot be read"
                self.log(f"note: the embedding snapshot of step {last} ({path}) is missing or damaged ({why}); "
                         f"snapshots go on from this step, the next one without ‖Δ‖ and angles.")
        self.seen.zero_()
        self.seen[torch.tensor(seen_ids, dtype=torch.int64)] = torch.tensor(seen_counts, dtype=torch.int64)
        self.last_step, self.previous = last, previous
        self.evals_seen, self.evals_kept = d["evals_seen"], d["evals_kept"]


def _count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**62


def stride(kept: int, per_stride: int) -> int:
    """Every how many evaluations one is kept once `kept` are: 1, then 2 after per_stride kept, 4
    after twice that, and so on. Past 2^62 (more evaluations than any run sees) it stays there."""
    return 1 << min(kept // per_stride, 62)


class Snapshot:
    """One snapshot file, read back (see the module docstring for its fields)."""

    def __init__(self, meta: dict, tensors: dict[str, torch.Tensor]):
        self.meta, self.step = meta, meta["step"]
        self.rows = tensors["rows"]
        self.seen = tensors["seen"]
        self.tables = {name: tensors[name] for name in TABLES}
        self.means = {name: tensors[f"{name}_mean"] for name in TABLES}
        self.moved = {name: tensors[f"{name}_moved"] for name in TABLES}
        self.angle = {name: tensors[f"{name}_angle"] for name in TABLES}


MAX_SNAPSHOT_VOCAB = 1 << 24
MAX_SNAPSHOT_D = 1 << 16

# Every reader of snapshot files; each reads them through `read_snapshot` alone (the timeline's
# readers through `andrea.snapshots.timeline.Timeline`, which also ties them to the run's checkpoint).
SNAPSHOT_READERS = (
    "andrea embed timeline",      # andrea.cli.similarity.cmd_timeline
    "andrea lesson",              # andrea.inside.lessons.embedding: init and sparse
    "lab growth",                 # andrea.web.lab_growth
    "lab lesson",                 # andrea.web.lab: the embedding lesson
    "andrea train --resume",      # Growth.load_state_dict: the base of the next ‖Δ‖
    "bench_similarity",           # benchmarks/bench_similarity.py: timeline_rows
)


def read_snapshot(path) -> Snapshot:
    """A snapshot file, every field checked: its size fields in range, its row ids distinct, in
    order, below V and at least one, every tensor of its shape and type, finite and in its range,
    its metadata of their types and ranges (the step its file's name gives); else one sentence naming it."""
    path = check_regular(path, "the embedding snapshot")
    try:
        with safe_open(str(path), "pt") as f:
            meta = json.loads((f.metadata() or {})["andrea.growth"])
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as e:  # safetensors' own error type, a missing key, bad JSON, an unreadable file
        raise AndreaError(f"{path} is not an embedding snapshot ({str(e)[:80]}).") from None
    need = {"rows", "seen"} | {f"{t}{s}" for t in TABLES for s in ("", "_mean", "_moved", "_angle")}
    if not isinstance(meta, dict) or not need <= tensors.keys() or not _count(meta.get("step")):
        raise AndreaError(f"{path} is not a whole embedding snapshot.")
    named = _NAME.fullmatch(Path(path).name)
    if named and int(named.group(1)) != meta["step"]:
        raise AndreaError(f"{path} holds the snapshot of step {meta['step']:,}, not of the step its name gives.")
    V, d, rows = meta.get("vocab_size"), meta.get("d"), tensors["rows"]
    if not _count(V) or not 0 < V <= MAX_SNAPSHOT_VOCAB or not _count(d) or not 0 < d <= MAX_SNAPSHOT_D:
        raise AndreaError(f"{path} gives a vocabulary of {str(V)[:20]} rows of {str(d)[:20]} values, which no table has.")
    if rows.dtype != torch.int64 or rows.dim() != 1 or (len(rows) and (int(rows.min()) < 0 or int(rows.max()) >= V
                                                                      or bool((rows[1:] <= rows[:-1]).any()))):
        raise AndreaError(f"{path} keeps row ids that are not distinct ids below V = {V:,} in order.")
    if not len(rows):
        raise AndreaError(f"{path} keeps no rows of its table, so it shows nothing of it.")
    _check_meta(meta, path)
    if meta.get("whole", len(rows) == V) != (len(rows) == V):
        raise AndreaError(f"{path} says its table is {'' if meta['whole'] else 'not '}whole, but it keeps "
                          f"{len(rows):,} rows of {V:,}.")
    _check_tensors(tensors, len(rows), d, path)
    return Snapshot(meta, tensors)


def _check_tensors(tensors: dict, n: int, d: int, path) -> None:
    """`seen` n counts (integers, none below 0); each table (n, d) of rows and its mean (d,), finite;
    ‖Δ‖ (n,) not below 0, angles (n,) in degrees from 0 to 180."""
    seen = tensors["seen"]
    if seen.shape != (n,):
        raise AndreaError(f"{path} counts {len(seen)} rows as seen, not its {n}.")
    if seen.dtype not in (torch.int32, torch.int64) or bool((seen < 0).any()):
        raise AndreaError(f"{path} counts the rows seen with other than whole numbers from 0.")
    for t in TABLES:
        if tensors[t].shape != (n, d) or not all(tensors[f"{t}{s}"].shape == (n,) for s in ("_moved", "_angle")) \
                or tensors[f"{t}_mean"].shape != (d,):
            raise AndreaError(f"{path} holds tables of the wrong shape.")
        if not all(tensors[f"{t}{s}"].is_floating_point() and bool(torch.isfinite(tensors[f"{t}{s}"].float()).all())
                   for s in ("", "_mean", "_moved", "_angle")):
            raise AndreaError(f"{path} holds a table that is not finite.")
        moved, angle = tensors[f"{t}_moved"].float(), tensors[f"{t}_angle"].float()
        if bool((moved < 0).any()) or bool((angle < 0).any()) or bool((angle > 180).any()):
            raise AndreaError(f"{path} gives distances below 0 or angles outside 0 to 180 degrees.")


def _check_meta(meta: dict, path) -> None:
    """The metadata fields other than the sizes, each of its type and range: the recipe a short
    string, the previous step an earlier one or none, the flags booleans, each mean cosine a
    number in [-1, 1]."""
    recipe, previous, means = meta.get("recipe", "v2"), meta.get("previous"), meta.get("mean_cos", {})
    if not isinstance(recipe, str) or not 0 < len(recipe) <= 16:
        raise AndreaError(f"{path} names no recipe andrea knows ({str(recipe)[:20]!r}).")
    if previous is not None and (not _count(previous) or previous >= meta["step"]):
        raise AndreaError(f"{path} gives {str(previous)[:20]} as its previous step, which is not before its own.")
    if any(not isinstance(meta.get(k, False), bool) for k in ("evaluation", "whole")):
        raise AndreaError(f"{path} has flags that are not true or false.")
    if not isinstance(means, dict) or any(not isinstance(v, (int, float)) or isinstance(v, bool) or not -1 <= v <= 1
                                          for v in means.values()) or not set(means) <= set(TABLES):
        raise AndreaError(f"{path} gives mean cosines that are not numbers in [-1, 1] of its tables.")


def holds_table(snap: Snapshot, table: torch.Tensor) -> bool:
    """Whether a snapshot holds the rows of `table` (a checkpoint's wte) exactly as `Growth.take`
    stores them: the snapshot of the checkpoint's own step, of the run's own table."""
    if tuple(table.shape) != (snap.meta["vocab_size"], snap.meta["d"]):
        return False
    stored = snap.tables["input"]
    return torch.equal(table.detach().float().cpu()[snap.rows].to(stored.dtype), stored)


def continues(before: Snapshot, after: Snapshot) -> bool:
    """Whether `after` was taken from `before`: its ‖Δ‖ of every row are those of its values
    against `before`'s (both computed from the stored values, as `Growth.take` does)."""
    if after.meta.get("previous") != before.step:
        return True  # nothing to compare: another snapshot (or none) was its base
    for t in TABLES:
        if before.tables[t].shape != after.tables[t].shape:
            return False
        moved = (after.tables[t].float() - before.tables[t].float()).norm(dim=1)
        if not torch.allclose(moved, after.moved[t].float(), rtol=1e-4, atol=1e-6):
            return False
    return True
