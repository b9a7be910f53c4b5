"""The embedding tables over a run: what the snapshots of `andrea.snapshots.store` show, as plain data.

Every function takes a `Timeline` (a run folder's snapshots and its tokenizer) and returns numbers
and lists; `andrea embed timeline` prints them and the lab's Growth view draws them.

    pair_series      cos θ of word pairs at every snapshot, with the table's mean cosine and the
                     ±1/√d band of random rows (the init's spread: "nearly orthogonal" inside it)
    rho_series       Spearman ρ on SimLex-999 and WordSim-353 at every snapshot
    neighbours_at    a word's nearest rows at one snapshot
    aligned_map      2-D positions of chosen words at every snapshot: each snapshot rotated onto
                     the last by orthogonal Procrustes (so axes do not flip from step to step),
                     then projected on the last snapshot's two principal axes
    row_updates      for an interval of steps, per row: in how many steps' batches the token was,
                     and how far its row moved, seen tokens apart from unseen ones, with why
                     unseen rows moved (or did not) under the run's optimizer

Words are looked up in their word-initial form (" cat"); a word of several tokens stands for the
mean of their rows, and results say so. A snapshot of a large table keeps only some rows: a word
whose tokens were not kept is reported as such.

A snapshot that is not the run's own is left out, and `Timeline.notes` says which and why: one
that cannot be read or fails `andrea.snapshots.store.read_snapshot`'s checks, or is of another V
than the run's tokenizer; and one off the chain that ties the snapshots to the run's own
checkpoint (latest.safetensors, else the checkpoint named). The chain starts at the snapshot the
checkpoint names as its last: taken at the checkpoint's step, it must hold the checkpoint's input
table exactly, or it is another run's. From there it goes back through each snapshot the next one
moved from, and forward through each one that moved from the one before
(`andrea.snapshots.store.continues`), so another run's snapshot put in the folder is found at
either end, never taken for the run's start or end. Snapshots of another table or row set than
the checkpoint's snapshot are left out too. Without a checkpoint that names a snapshot, the chain
starts at the newest snapshot of the table most of them keep. The lesson and `andrea embed
timeline` print the notes.
"""

from __future__ import annotations

import math
import re
from functools import lru_cache
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from andrea.checkpoint import load_checkpoint, load_model
from andrea.errors import AndreaError
from andrea.inside.vectors import cosine, nearest, unit_rows
from andrea.inside.wordsim import PAIR_SETS, WordIndex, null_spread, spearman, word_index
from andrea.snapshots.store import FOLDER, TABLES, continues, holds_table, read_snapshot, snapshot_path, snapshot_steps
from andrea.validate import is_int

WHY_UNSEEN = {
    "v1": "Adam: a token absent from a step's batch has a zero gradient, but its row still moves while Adam's "
          "momentum from the steps that did see it decays (about 1/(1 − β1) = 10 steps); a row never seen stays put.",
    "v2": "AdamW: rows of absent tokens move by momentum left from earlier batches, and decoupled weight decay "
          "shrinks every row of the table at every step, seen or not.",
    "v3": "recipe v3 trains the tables with AdamW: rows of absent tokens move by momentum left from earlier batches, "
          "and decoupled weight decay shrinks every row at every step, seen or not.",
    "output": "The output head is different: the softmax runs over the whole vocabulary, so every row of lm_head "
              "gets a gradient at every step, whether its token was in the batch or not.",
}


class Mark(NamedTuple):
    """A run's checkpoint, as far as it ties the chain of snapshots to the run."""

    step: int  # the checkpoint's step
    last: int  # the step of the last snapshot taken before it (at its step, or before)
    table: torch.Tensor  # its input table (wte)
    path: Path


class Timeline:
    """The snapshots of one run folder, read on demand, with the tokenizer of its checkpoint."""

    def __init__(self, run_dir, tokenizer=None):
        given = Path(run_dir)
        run = given.parent if given.is_file() else given
        self.dir = run
        self.steps = snapshot_steps(run)
        if not self.steps:
            raise AndreaError(f"{run} holds no embedding snapshots ({FOLDER}/); train with snapshots on (the default) "
                              f"to record them.")
        # the run's own checkpoint ties the chain of snapshots to the run: latest.safetensors, its end
        own = run / "latest.safetensors" if (run / "latest.safetensors").is_file() else given
        if tokenizer is None:
            _, tokenizer, _ = load_model(run)
        ckpt = _checkpoint_or_none(own)
        if tokenizer is None:
            raise AndreaError(f"the checkpoint in {run} holds no tokenizer to look words up with.")
        self.tokenizer = tokenizer
        self.notes = []  # the snapshots left out, each with why
        first = self._check_snapshots(run, tokenizer.vocab_size, _mark(ckpt, own))
        self.V, self.d, self.recipe = first.meta["vocab_size"], first.meta["d"], first.meta.get("recipe", "v2")
        self.rows = first.rows.numpy()
        self.position = np.full(self.V, -1, dtype=np.int64)
        self.position[self.rows] = np.arange(len(self.rows))

    def snapshot(self, step: int):
        path = snapshot_path(self.dir, step)
        try:
            st = path.stat()
            stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
        except OSError:
            stamp = None
        return _read(str(path), stamp)  # a file replaced since it was read is read again

    def _leave_out(self, step: int, why: str) -> None:
        self.notes.append(f"the snapshot of step {step:,} is left out: {why}")

    def _check_snapshots(self, run, vocab_size: int, mark: Mark | None):
        """Leave out, each with a note, the snapshots that are not this run's: unreadable ones, those
        of another V than the tokenizer's, the one the checkpoint's step names where it does not
        hold the checkpoint's table, those of another table or row set than the run's own (the
        checkpoint's snapshot's; without one, most of the run's, the newest breaking ties), and
        those off the chain from the checkpoint's snapshot (`_chain`). The first kept."""
        read = {}
        for step in self.steps:
            try:
                snap = self.snapshot(step)
                if snap.meta["vocab_size"] != vocab_size:
                    raise AndreaError(f"it has V = {snap.meta['vocab_size']:,}, the run's tokenizer {vocab_size:,}")
            except AndreaError as e:
                self._leave_out(step, str(e).rstrip("."))
                continue
            read[step] = snap
        anchor = self._own_anchor(read, mark)
        if not read:
            steps = ", ".join(f"{step:,}" for step in self.steps)
            raise AndreaError(f"{run} holds no usable embedding snapshot: those of steps {steps} are left out "
                              f"({self.notes[0]}).")
        kinds = {}
        for step, snap in read.items():
            kinds.setdefault((snap.meta["d"], snap.rows.numpy().tobytes()), []).append(step)
        kept = next(steps for steps in kinds.values() if anchor in steps) if anchor is not None else \
            max(kinds.values(), key=lambda steps: (len(steps), steps[-1]))
        for step in sorted(set(read) - set(kept)):
            self._leave_out(step, f"its table ({len(read[step].rows):,} rows of {read[step].meta['d']}) is not the one the "
                                  f"run's own snapshots keep")
        if anchor is None:  # the newest snapshot at or before the checkpoint's step
            anchor = ([s for s in kept if mark is None or s <= mark.step] or kept)[-1]
        self.steps = self._chain(read, kept, anchor)
        self.notes.sort(key=lambda note: int(re.search(r"step ([\d,]+)", note).group(1).replace(",", "")))
        return read[self.steps[0]]

    def _own_anchor(self, read: dict, mark: Mark | None) -> int | None:
        """The step of the run's last snapshot before its checkpoint, where the checkpoint names one
        and it is this run's: taken at the checkpoint's step, it must hold the checkpoint's table
        (`andrea.snapshots.store.holds_table`); taken before, a table of its size. A snapshot there
        that does not is another run's: left out, with a note. None where there is no such mark."""
        if mark is None or mark.last not in read:
            return None
        snap = read[mark.last]
        if mark.last == mark.step:
            own = holds_table(snap, mark.table)
        else:
            own = tuple(mark.table.shape) == (snap.meta["vocab_size"], snap.meta["d"])
        if own:
            return mark.last
        del read[mark.last]
        self._leave_out(mark.last, f"it does not hold the table of the run's checkpoint {mark.path.name} at that step, "
                                   f"so it is another run's")
        return None

    def _chain(self, read: dict, kept: list[int], anchor: int) -> list[int]:
        """The snapshots tied to `anchor` (the run's own) by `andrea.snapshots.store.continues`: going
        back, each one the next snapshot moved from; going forward, each one that names the one before
        as its previous step and moved from its values. The others are another run's, left out."""
        chain = [anchor]
        for step in reversed([s for s in kept if s < anchor]):
            if continues(read[step], read[chain[0]]):
                chain.insert(0, step)
            else:
                self._leave_out(step, f"the snapshot of step {chain[0]:,} did not move from its values, so it is "
                                      f"another run's")
        for step in [s for s in kept if s > anchor]:
            if read[step].meta.get("previous") == chain[-1] and continues(read[chain[-1]], read[step]):
                chain.append(step)
            else:
                self._leave_out(step, f"it did not move from the run's snapshot of step {chain[-1]:,}, so it is "
                                      f"another run's")
        return chain

    def at(self, step: int) -> int:
        """The snapshot step nearest to `step` at or before it (the first one before any)."""
        before = [s for s in self.steps if s <= step]
        return before[-1] if before else self.steps[0]

    def matrix(self, step: int, table: str = "input", centre: bool = False) -> np.ndarray:
        """A (V, d) float64 matrix of the kept rows (rows not kept are NaN), centred on request."""
        if table not in TABLES:
            raise AndreaError(f"the table must be one of {', '.join(TABLES)}, got {table!r}.")
        snap = self.snapshot(step)
        m = np.full((self.V, self.d), np.nan)
        m[self.rows] = snap.tables[table].double().numpy()
        if centre:
            m -= snap.means[table].double().numpy()
        return m

    def index(self, words=(), sets=None) -> WordIndex:
        return word_index(self.tokenizer, self.V, sets, extra=tuple(words))

    def kept(self, index: WordIndex, word: str) -> bool:
        return all(self.position[i] >= 0 for i in index.ids[word])


@lru_cache(maxsize=64)
def _read(path: str, stamp):
    return read_snapshot(path)


def _checkpoint_or_none(path):
    """The checkpoint at `path` (a file, or a run folder's own), or None where there is none that reads."""
    try:
        return load_checkpoint(path, optimizer=False)
    except AndreaError:
        return None


def _mark(ckpt, path: Path) -> Mark | None:
    """What of a run's checkpoint ties the chain of snapshots to the run; None where there is no
    checkpoint, or it names no snapshot."""
    growth = ckpt.meta.get("growth") if ckpt is not None else None
    last = growth.get("last_step") if isinstance(growth, dict) else None
    table = ckpt.model_state.get("wte.weight") if ckpt is not None else None
    if not is_int(last) or not 0 <= last <= ckpt.step or table is None:
        return None
    return Mark(ckpt.step, last, table, Path(path))


def _vec(m: np.ndarray, index: WordIndex, word: str) -> np.ndarray:
    return m[index.ids[word]].mean(axis=0)




def _check_words(tl: Timeline, index: WordIndex, words) -> None:
    for w in words:
        if not tl.kept(index, w):
            raise AndreaError(f"the snapshots of {tl.dir} do not keep the rows of {w!r} (a large table keeps its most "
                              f"frequent tokens and the similarity sets' words).")


def forms(index: WordIndex, words) -> dict:
    return {w: index.pieces[w] for w in words}


def pair_series(tl: Timeline, pairs, table: str = "input", centre: bool = True) -> dict:
    """cos θ of each pair (a, b) at every snapshot, with the table's mean pairwise cosine."""
    words = sorted({w for p in pairs for w in p})
    index = tl.index(words)
    _check_words(tl, index, words)
    series = {f"{a}·{b}": [] for a, b in pairs}
    mean_cos = []
    for step in tl.steps:
        m = tl.matrix(step, table, centre)
        for a, b in pairs:
            series[f"{a}·{b}"].append(cosine(_vec(m, index, a), _vec(m, index, b)))
        snap = tl.snapshot(step)
        mean_cos.append(snap.meta.get("mean_cos", {}).get(table) if not centre else None)
    return {"steps": tl.steps, "table": table, "centred": centre, "series": series, "forms": forms(index, words),
            "band": 1 / math.sqrt(tl.d), "mean_cos": mean_cos}


def _mean_rows(tl: Timeline, index: WordIndex, words) -> np.ndarray:
    """(len(words), kept rows): row j averages the snapshot rows of word j's tokens, so that
    `_mean_rows(...) @ table` is every word's vector (the mean of its tokens' rows) at once."""
    a = np.zeros((len(words), len(tl.rows)))
    for j, w in enumerate(words):
        ids = index.ids[w]
        for i in ids:
            a[j, tl.position[i]] += 1 / len(ids)
    return a


def rho_series(tl: Timeline, sets, table: str = "input", centre: bool = True) -> dict:
    """Spearman ρ of cosine against the ratings of each set at every snapshot, over the pairs
    whose words' rows are kept, with n and the null spread 1/√(n − 1). A pair with a zero vector
    counts as cos θ 0."""
    if table not in TABLES:
        raise AndreaError(f"the table must be one of {', '.join(TABLES)}, got {table!r}.")
    index = tl.index((), sets)
    out, pairs = {}, {}
    for name in PAIR_SETS:
        pairs[name] = [(a, b, r) for a, b, r in sets.pairs[name] if tl.kept(index, a) and tl.kept(index, b)]
        n = len(pairs[name])
        out[name] = {"rho": [], "n": n, "null": null_spread(n) if n > 1 else None}
    words = sorted({w for name in PAIR_SETS for a, b, _ in pairs[name] for w in (a, b)})
    at = {w: j for j, w in enumerate(words)}
    mean_rows = _mean_rows(tl, index, words)
    for step in tl.steps:
        snap = tl.snapshot(step)
        rows = snap.tables[table].double().numpy()
        if centre:
            rows = rows - snap.means[table].double().numpy()
        unit = unit_rows(mean_rows @ rows)
        for name in PAIR_SETS:
            ia = np.array([at[a] for a, _, _ in pairs[name]], dtype=np.int64)
            ib = np.array([at[b] for _, b, _ in pairs[name]], dtype=np.int64)
            cos = np.einsum("ij,ij->i", unit[ia], unit[ib])
            out[name]["rho"].append(spearman(cos, [r for _, _, r in pairs[name]]))
    return {"steps": tl.steps, "table": table, "centred": centre, "sets": out}


def neighbours_at(tl: Timeline, step: int, word: str, k: int = 10, table: str = "input", whole_words: bool = True) -> dict:
    """The k kept rows nearest (cos θ) to a word at the snapshot at or before `step`."""
    step = tl.at(step)
    index = tl.index([word])
    _check_words(tl, index, [word])
    m = tl.matrix(step, table)
    only = tl.position >= 0  # the kept rows: the others are NaN
    if whole_words:
        only &= np.isin(np.arange(tl.V), index.whole_words)
    rows = nearest(m, _vec(m, index, word), k, "cos", exclude=set(index.ids[word]), only=only)
    return {"step": step, "word": word, "form": index.pieces[word], "table": table,
            "neighbours": [{"id": i, "piece": tl.tokenizer.id_to_piece(i), "score": s} for i, s in rows]}


def _procrustes(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The rotation R minimising ‖a R − b‖ (orthogonal Procrustes, by SVD of aᵀb)."""
    u, _, vt = np.linalg.svd(a.T @ b)
    return u @ vt


def aligned_map(tl: Timeline, words, table: str = "input") -> dict:
    """2-D positions of `words` at every snapshot (see the module docstring)."""
    index = tl.index(words)
    _check_words(tl, index, words)
    if len(words) < 3:
        raise AndreaError("a map needs at least 3 words.")
    mats = [np.stack([_vec(tl.matrix(s, table, centre=True), index, w) for w in words]) for s in tl.steps]
    last = mats[-1] - mats[-1].mean(axis=0)
    _, sv, vt = np.linalg.svd(last, full_matrices=False)
    axes = vt[:2].T  # (d, 2): the last snapshot's principal axes
    frames = []
    for x in mats:
        x = x - x.mean(axis=0)
        scale = np.linalg.norm(last) / max(np.linalg.norm(x), 1e-30)  # an early table is smaller: show its shape
        frames.append(((x * scale) @ _procrustes(x, last) @ axes).tolist())
    explained = (sv[:2] ** 2 / max((sv ** 2).sum(), 1e-30)).tolist()
    return {"steps": tl.steps, "words": list(words), "table": table, "frames": frames, "explained": explained,
            "forms": forms(index, words)}


def row_updates(tl: Timeline, start: int, end: int, table: str = "input") -> dict:
    """How far each kept row moved between two snapshots, against in how many steps' batches its
    token was in between: seen and unseen tokens apart, with the sentence that explains the unseen."""
    a, b = tl.at(start), tl.at(end)
    if b <= a:
        later = [s for s in tl.steps if s > a]
        if not later:
            raise AndreaError(f"there is no snapshot after step {a} to compare it with.")
        b = later[0]
    seen = np.zeros(len(tl.rows), dtype=np.int64)
    for s in tl.steps:
        if a < s <= b:
            seen += tl.snapshot(s).seen.numpy().astype(np.int64)
    before = tl.snapshot(a).tables[table].double().numpy()
    after = tl.snapshot(b).tables[table].double().numpy()
    moved = np.linalg.norm(after - before, axis=1)
    groups = {}
    for name, mask in (("seen", seen > 0), ("unseen", seen == 0)):
        m = moved[mask]
        groups[name] = {"tokens": int(mask.sum()), "mean_moved": float(m.mean()) if len(m) else None,
                        "median_moved": float(np.median(m)) if len(m) else None,
                        "share_moved": float((m > 0).mean()) if len(m) else None}
    why = WHY_UNSEEN["output"] if table == "output" else WHY_UNSEEN.get(tl.recipe, WHY_UNSEEN["v2"])
    return {"start": a, "end": b, "steps": b - a, "table": table, "recipe": tl.recipe, "why": why, "groups": groups,
            "rows": [{"id": int(i), "piece": tl.tokenizer.id_to_piece(int(i)), "seen": int(n), "moved": float(d)}
                     for i, n, d in zip(tl.rows, seen, moved)]}
