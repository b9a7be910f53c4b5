"""The curriculum: a UCB1 bandit that decides which named data source the next batch comes from.

Each source k keeps a loss EMA and a reward tally. After a step on k with loss `loss_k`:

    reward_k = max(0, EMA_k(before) - loss_k) * 1000      (the first observation has reward 0)
    EMA_k    = 0.9 * EMA_k + 0.1 * loss_k                 (the first observation sets EMA_k = loss_k)
    UCB(k)   = mean_reward(k) + C * sqrt(ln N / n_k)      (N pulls in all, n_k of k; unpulled: +inf)

A source whose loss is still falling earns reward; one the model has learned earns none, and the
exploration term slowly brings it back. That is reward "andrea", ANDREA's formula and the default.

Reward "progress" measures each source's learning progress against its own recent level, so
sources of different loss scales and noise compete on equal terms:

    reward_k = 100 * (EMA_k(before) - loss_k) / EMA_k(before)   (signed; first observation 0)
    mean_k   = 0.95 * mean_k + 0.05 * reward_k                   (recent rewards; first: reward_k)
    UCB(k)   = mean_k + C * sqrt(ln N / n_k)

The relative drop is in percent of the source's own level, so a source whose loss is 2x another's
does not earn 2x for the same progress; the reward is signed, so a flat source's noise averages to
zero instead of being paid for every lucky batch (max(0, noise) > 0); and the mean is a recent one,
so the large drops of the first steps do not keep a source favoured after it has been learned.

Reward "abs-progress" is "progress" scored by its size, not its sign: UCB(k) = |mean_k| + C *
sqrt(ln N / n_k). A source the model is forgetting (its loss rising above its own recent level)
then calls for batches as one it is learning does. Under "progress" the same source scores below
zero, its weight goes to 0, and a source that is never drawn never changes its mean: one bad batch
can shut a source out for the rest of a run (at the main job's full budget, kjv was last drawn at
step 532 of 1,199). The mean is still taken over signed rewards, so a flat source's noise averages
to about zero before the size is taken, and its score falls back to the exploration term alone.
Negative scores count as 0 when they become weights. The scores become sampling weights only at re-rolls,
spaced by a seeded random interval (uniform integer in `reroll`, default 7..42 steps):

1. Open sources: during warm-up (step < warmup_steps) only `warmup_sources`; otherwise all.
   Closed sources have weight 0, and the weights are re-rolled at once when the open set changes.
2. Raw weights are proportional to UCB over the open sources (scale-free: rewards are x1000 and
   their size depends on the data, so a softmax temperature would need retuning per corpus).
   While an open source is unpulled, or when every score is 0, the raw weights are uniform.
3. Floors and caps, by clamp-and-redistribute: scale the free sources' raw weights to fill the
   mass the clamped ones leave; if some free weights exceed their caps by `excess` in total and
   others fall short of their floors by `deficit`, clamp the cap-breakers when excess >= deficit,
   else the floor-breakers; repeat. Each round clamps at least one source, and the remaining
   problem stays feasible (floors of the free sources <= free mass <= their caps), so it ends
   within len(sources) rounds with every floor and cap held and the weights summing to 1.
   Feasibility is checked up front: floors must sum to <= 1 <= caps, over all sources and over
   the warm-up sources.

Each step's source is then drawn from the weights by inverse CDF on one seeded `random.Random`
(which also draws the re-roll intervals), except that in `ucb` mode an open, unpulled source
with a non-zero weight is pulled first (UCB1's initial round; UCB is infinite there).
`uniform` mode keeps the same interface and schedule but samples uniformly over the open
sources, ignoring rewards, floors and caps: the baseline the bandit is compared against.

`state_dict()` is plain JSON (statistics, weights, RNG state, history: about 50 bytes a step);
loading it into a Curriculum built with the same arguments continues the identical schedule.
"""

from __future__ import annotations

import math
import random
from bisect import bisect_right
from itertools import accumulate

from andrea.errors import AndreaError

EMA_ALPHA = 0.1
REWARD_SCALE = 1000.0
REWARDS = ("andrea", "progress", "abs-progress")
PROGRESS_SCALE = 100.0  # progress rewards in percent of the source's own recent loss
RECENT_ALPHA = 0.05  # progress: the weight of a new reward in the recent mean
DEFAULT_C = math.sqrt(2.0)  # UCB1's constant (Auer et al., 2002)
DEFAULT_REROLL = (7, 42)
MODES = ("ucb", "uniform")
_TOL = 1e-9


def reward_and_ema(ema: float | None, loss: float) -> tuple[float, float]:
    """One observation: (reward, new EMA) from the EMA before it (None: no observation yet)."""
    before = loss if ema is None else ema
    reward = max(0.0, before - loss) * REWARD_SCALE
    return reward, (1.0 - EMA_ALPHA) * before + EMA_ALPHA * loss


def progress_reward_and_ema(ema: float | None, loss: float) -> tuple[float, float]:
    """Reward "progress": (relative drop against the source's own EMA in percent, new EMA)."""
    before = loss if ema is None else ema
    reward = (before - loss) / before * PROGRESS_SCALE if before > 0 else 0.0
    return reward, (1.0 - EMA_ALPHA) * before + EMA_ALPHA * loss


def ucb_score(mean_reward: float, pulls: int, total_pulls: int, C: float) -> float:
    if pulls == 0:
        return math.inf
    return mean_reward + C * math.sqrt(math.log(total_pulls) / pulls)


def check_bounds(sources: list[str], floors: dict[str, float], caps: dict[str, float], what: str = "sources") -> None:
    """Raise AndreaError unless the floors and caps over `sources` leave a weighting that sums to 1."""
    low = sum(floors.get(s, 0.0) for s in sources)
    high = sum(caps.get(s, 1.0) for s in sources)
    if low > 1.0 + _TOL:
        raise AndreaError(f"the floors of the {what} sum to {low:g}; they must sum to at most 1.")
    if high < 1.0 - _TOL:
        raise AndreaError(f"the caps of the {what} sum to {high:g}; they must sum to at least 1.")


def clamp_weights(raw: dict[str, float], floors: dict[str, float], caps: dict[str, float]) -> dict[str, float]:
    """Weights proportional to `raw` (non-negative), summing to 1, with floor <= w <= cap for each
    key (missing floor: 0, missing cap: 1). The bounds must be feasible (see `check_bounds`)."""
    lo = {k: floors.get(k, 0.0) for k in raw}
    hi = {k: caps.get(k, 1.0) for k in raw}
    fixed: dict[str, float] = {}
    while True:
        free = [k for k in raw if k not in fixed]
        if not free:
            return fixed
        mass = max(0.0, 1.0 - sum(fixed.values()))
        total = sum(raw[k] for k in free)
        w = {k: mass * (raw[k] / total) if total > 0 else mass / len(free) for k in free}  # share first: no underflow
        over = [k for k in free if w[k] > hi[k]]
        under = [k for k in free if w[k] < lo[k]]
        if not over and not under:
            return {k: fixed.get(k, w.get(k)) for k in raw}
        excess = sum(w[k] - hi[k] for k in over)
        deficit = sum(lo[k] - w[k] for k in under)
        if over and excess >= deficit:
            fixed.update({k: hi[k] for k in over})
        else:
            fixed.update({k: lo[k] for k in under})


class Curriculum:
    def __init__(self, sources: list[str], C: float = DEFAULT_C, floors: dict[str, float] | None = None,
                 caps: dict[str, float] | None = None, warmup_sources: list[str] | tuple = (),
                 warmup_steps: int = 0, reroll: tuple[int, int] = DEFAULT_REROLL, seed: int = 0,
                 mode: str = "ucb", reward: str = "andrea"):
        self.sources = list(sources)
        self.C = float(C)
        self.floors = {k: float(v) for k, v in (floors or {}).items()}
        self.caps = {k: float(v) for k, v in (caps or {}).items()}
        self.warmup_sources = list(warmup_sources)
        self.warmup_steps = int(warmup_steps)
        self.reroll = tuple(reroll)
        self.seed = seed
        self.mode = mode
        self.reward = reward
        self._validate()
        n = len(self.sources)
        self._index = {s: i for i, s in enumerate(self.sources)}
        self._ema: list[float | None] = [None] * n
        self._pulls = [0] * n
        self._reward_sum = [0.0] * n
        self._recent: list[float | None] = [None] * n  # rewards "progress", "abs-progress": the recent mean
        self._rng = random.Random(seed)
        self._weights = [0.0] * n
        self._open: list[str] | None = None  # the open sources when the weights were last rolled
        self._next_reroll = 0
        self._step = 0
        self._rerolls: list[tuple[int, list[float]]] = []  # (step, weights) at every re-roll
        self._history: list[tuple[int, int, float, float, int]] = []  # step, source, loss, reward, re-roll index

    def _validate(self) -> None:
        if not self.sources:
            raise AndreaError("a curriculum needs at least one source.")
        if len(set(self.sources)) != len(self.sources):
            dupes = sorted({s for s in self.sources if self.sources.count(s) > 1})
            raise AndreaError(f"source names must be unique; repeated: {', '.join(dupes)}.")
        if self.mode not in MODES:
            raise AndreaError(f"curriculum mode must be one of {', '.join(MODES)}, got {self.mode!r}.")
        if self.reward not in REWARDS:
            raise AndreaError(f"curriculum reward must be one of {', '.join(REWARDS)}, got {self.reward!r}.")
        if not math.isfinite(self.C) or self.C < 0:
            raise AndreaError(f"the bandit constant C must be a non-negative number, got {self.C!r}.")
        for what, table in (("floor", self.floors), ("cap", self.caps), ("warm-up source", dict.fromkeys(self.warmup_sources))):
            unknown = sorted(set(table) - set(self.sources))
            if unknown:
                raise AndreaError(f"{what} given for unknown source(s) {', '.join(unknown)}; sources: {', '.join(self.sources)}.")
        for s in self.sources:
            lo, hi = self.floors.get(s, 0.0), self.caps.get(s, 1.0)
            if not (0.0 <= lo <= hi <= 1.0):
                raise AndreaError(f"source {s} needs 0 <= floor <= cap <= 1, got floor {lo:g} and cap {hi:g}.")
        if (len(self.reroll) != 2 or not all(isinstance(x, int) and not isinstance(x, bool) for x in self.reroll)
                or not 1 <= self.reroll[0] <= self.reroll[1]):
            raise AndreaError(f"reroll must be two integers 1 <= low <= high, got {list(self.reroll)}.")
        if self.warmup_steps < 0:
            raise AndreaError(f"warmup_steps must be >= 0, got {self.warmup_steps}.")
        if self.warmup_steps > 0 and not self.warmup_sources:
            raise AndreaError("a warm-up of more than 0 steps needs at least one warm-up source.")
        if self.mode == "ucb":
            check_bounds(self.sources, self.floors, self.caps)
            if self.warmup_steps > 0:
                check_bounds(self.warmup_sources, self.floors, self.caps, "warm-up")

    # ------------------------------------------------------------ the schedule

    def open_sources(self, step: int) -> list[str]:
        if step < self.warmup_steps:
            return [s for s in self.sources if s in self.warmup_sources]
        return list(self.sources)

    def next_source(self, step: int) -> str:
        """The source to draw the batch of `step` from. Call `update` with its loss afterwards."""
        self._step = step
        open_now = self.open_sources(step)
        if step >= self._next_reroll or open_now != self._open:
            self._roll(step, open_now)
        if self.mode == "ucb":
            for s in open_now:
                i = self._index[s]
                if self._pulls[i] == 0 and self._weights[i] > 0:
                    return s
        cdf = list(accumulate(self._weights))
        i = min(bisect_right(cdf, self._rng.random() * cdf[-1]), len(cdf) - 1)
        while self._weights[i] == 0:  # u * total can round up to total; step back to a weighted source
            i -= 1
        return self.sources[i]

    def _roll(self, step: int, open_now: list[str]) -> None:
        self._weights = [0.0] * len(self.sources)
        for s, w in self._open_weights(open_now).items():
            self._weights[self._index[s]] = w
        self._open = open_now
        self._next_reroll = step + self._rng.randint(*self.reroll)
        self._rerolls.append((step, list(self._weights)))

    def _open_weights(self, open_now: list[str]) -> dict[str, float]:
        if self.mode == "uniform":
            return {s: 1.0 / len(open_now) for s in open_now}
        scores = self.ucb_scores()
        if any(math.isinf(scores[s]) for s in open_now):
            raw = dict.fromkeys(open_now, 1.0)
        else:
            raw = {s: max(0.0, scores[s]) for s in open_now}
        return clamp_weights(raw, self.floors, self.caps)

    def update(self, source: str, loss: float) -> float:
        """Record the loss of a step on `source`; return its reward."""
        if source not in self._index:
            raise AndreaError(f"unknown source {source!r}; sources: {', '.join(self.sources)}.")
        loss = float(loss)
        if not math.isfinite(loss):
            raise AndreaError(f"the loss of source {source} is {loss}; the curriculum needs a finite loss.")
        i = self._index[source]
        if self.reward in ("progress", "abs-progress"):
            reward, self._ema[i] = progress_reward_and_ema(self._ema[i], loss)
            recent = self._recent[i]
            self._recent[i] = reward if recent is None else (1 - RECENT_ALPHA) * recent + RECENT_ALPHA * reward
        else:
            reward, self._ema[i] = reward_and_ema(self._ema[i], loss)
        self._pulls[i] += 1
        self._reward_sum[i] += reward
        self._history.append((self._step, i, loss, reward, len(self._rerolls) - 1))
        return reward

    # ------------------------------------------------------------ what a log or a plot reads

    @property
    def weights(self) -> dict[str, float]:
        return dict(zip(self.sources, self._weights))

    @property
    def ema(self) -> dict[str, float | None]:
        return dict(zip(self.sources, self._ema))

    @property
    def pulls(self) -> dict[str, int]:
        return dict(zip(self.sources, self._pulls))

    def mean_rewards(self) -> dict[str, float]:
        """The reward term of each source's score: the mean of all its rewards (reward "andrea"),
        the recent mean (reward "progress") or its size (reward "abs-progress")."""
        if self.reward == "progress":
            return {s: r if r is not None else 0.0 for s, r in zip(self.sources, self._recent)}
        if self.reward == "abs-progress":
            return {s: abs(r) if r is not None else 0.0 for s, r in zip(self.sources, self._recent)}
        return {s: self._reward_sum[i] / self._pulls[i] if self._pulls[i] else 0.0 for i, s in enumerate(self.sources)}

    def ucb_scores(self) -> dict[str, float]:
        total = sum(self._pulls)
        means = self.mean_rewards()
        return {s: ucb_score(means[s], self._pulls[i], total, self.C) for i, s in enumerate(self.sources)}

    @property
    def rerolls(self) -> list[int]:
        """The steps at which the weights were re-rolled."""
        return [step for step, _ in self._rerolls]

    @property
    def history(self) -> list[dict]:
        """One record per `update`: step, source, loss, reward and the weights the step ran under."""
        out = []
        for step, i, loss, reward, r in self._history:
            weights = dict(zip(self.sources, self._rerolls[r][1])) if r >= 0 else dict.fromkeys(self.sources, 0.0)
            out.append({"step": step, "source": self.sources[i], "loss": loss, "reward": reward, "weights": weights})
        return out

    # ------------------------------------------------------------ resume

    def state_dict(self) -> dict:
        version, internal, gauss = self._rng.getstate()
        return {
            "sources": list(self.sources), "mode": self.mode, "reward": self.reward, "recent": list(self._recent),
            "ema": list(self._ema), "pulls": list(self._pulls), "reward_sum": list(self._reward_sum),
            "weights": list(self._weights), "open": self._open, "next_reroll": self._next_reroll,
            "step": self._step, "rng": [version, list(internal), gauss],
            "rerolls": [[step, list(w)] for step, w in self._rerolls],
            "history": [list(h) for h in self._history],
        }

    def load_state_dict(self, d: dict, steps: int | None = None) -> None:
        """Continue from `state_dict()`. Every field is checked first (`check_state`), so a damaged
        state changes nothing and ends in one AndreaError naming the field."""
        (self._rng_state, self._ema, self._pulls, self._reward_sum, self._recent, self._weights, self._open,
         self._next_reroll, self._step, self._rerolls, self._history) = self.check_state(d, steps)
        self._rng.setstate(self._rng_state)
        del self._rng_state

    def check_state(self, d, steps: int | None = None) -> tuple:
        """The fields of a saved state, each checked for type, range, finiteness and length
        against this curriculum's sources (and, with `steps`, against the steps the run has taken);
        an AndreaError names the first field that is damaged."""
        def bad(name, value):
            raise AndreaError(f"its curriculum state field {name!r} is damaged (found {_short(value)}).")

        if not isinstance(d, dict):
            bad("curriculum", d)
        if d.get("sources") != self.sources:
            raise AndreaError(f"its curriculum state is for sources {_short(d.get('sources'))}, this run has {self.sources}.")
        if d.get("mode") != self.mode:
            raise AndreaError(f"its curriculum state is for mode {_short(d.get('mode'))}, this run has {self.mode!r}.")
        if d.get("reward", "andrea") != self.reward:
            raise AndreaError(f"its curriculum state is for reward {_short(d.get('reward', 'andrea'))}, "
                              f"this run has {self.reward!r}.")
        n = len(self.sources)
        for key in ("rng", "ema", "pulls", "reward_sum", "weights", "open", "next_reroll", "step", "rerolls", "history"):
            if key not in d:
                raise AndreaError(f"its curriculum state has no field {key!r}.")
        rng = _checked_rng(d["rng"]) or bad("rng", d["rng"])
        ema = _per_source(d["ema"], n, _finite_or_none) or bad("ema", d["ema"])
        pulls = _per_source(d["pulls"], n, _count) or bad("pulls", d["pulls"])
        reward_sum = _per_source(d["reward_sum"], n, _finite) or bad("reward_sum", d["reward_sum"])
        recent = _per_source(d.get("recent", [None] * n), n, _finite_or_none) or bad("recent", d.get("recent"))
        weights = _weights(d["weights"], n) or bad("weights", d["weights"])
        opened = d["open"]
        if opened is not None and (not isinstance(opened, list) or opened != [s for s in self.sources if s in opened]
                                   or not opened or any(w > 0 for s, w in zip(self.sources, weights) if s not in opened)):
            bad("open", opened)
        if opened is not None and abs(sum(weights) - 1.0) > 1e-6:
            bad("weights", d["weights"])
        step, next_reroll = d["step"], d["next_reroll"]
        if not _count(step) or (steps is not None and step > max(0, steps - 1)):
            bad("step", step)
        if not _count(next_reroll):
            bad("next_reroll", next_reroll)
        next_reroll = min(next_reroll, step + self.reroll[1])  # a run resumed with a narrower reroll re-rolls in it
        rerolls = _rerolls(d["rerolls"], n, step)
        if rerolls is None:
            bad("rerolls", d["rerolls"])
        history = _history(d["history"], n, step, len(rerolls))
        if history is None or (steps is not None and len(history) > steps):
            bad("history", d["history"])
        if [sum(1 for h in history if h[1] == i) for i in range(n)] != pulls:
            bad("pulls", pulls)
        return (rng, ema, pulls, reward_sum, recent, weights, None if opened is None else list(opened), next_reroll,
                step, rerolls, history)


# ---------------------------------------------------------------- checking a saved state


def _short(value) -> str:
    """A value as an error message shows it: its type for containers, else at most 60 characters."""
    if isinstance(value, (list, dict)):
        return f"a {type(value).__name__} of {len(value):,} items"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10**30:
        return "an integer of more than 30 digits"
    return repr(value)[:60]


def _count(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 2**62  # a count no run reaches


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _finite_or_none(x) -> bool:
    return x is None or _finite(x)


def _per_source(value, n: int, ok) -> list | None:
    """value as a list of n items that pass ok (ints kept, reals as floats), or None."""
    if not isinstance(value, list) or len(value) != n or not all(ok(x) for x in value):
        return None
    return [x if x is None or (isinstance(x, int) and ok is _count) else float(x) for x in value]


def _weights(value, n: int) -> list | None:
    w = _per_source(value, n, _finite)
    return w if w is not None and all(0.0 <= x <= 1.0 + _TOL for x in w) else None


def _checked_rng(value) -> tuple | None:
    """random.Random's state (version 3: 624 words and a position, then the gauss spare), or None."""
    if not isinstance(value, list) or len(value) != 3:
        return None
    version, internal, gauss = value
    if (version != 3 or not isinstance(internal, list) or len(internal) != 625
            or not all(_count(x) and x < 2**32 for x in internal) or internal[-1] > 624
            or not _finite_or_none(gauss)):
        return None
    return version, tuple(internal), gauss


def _rerolls(value, n: int, step: int) -> list | None:
    if not isinstance(value, list):
        return None
    out = []
    for r in value:
        if not isinstance(r, list) or len(r) != 2 or not _count(r[0]) or r[0] > step:
            return None
        w = _weights(r[1], n)
        if w is None:
            return None
        out.append((r[0], w))
    return out


def _history(value, n: int, step: int, rerolls: int) -> list | None:
    if not isinstance(value, list):
        return None
    out = []
    for h in value:
        if (not isinstance(h, list) or len(h) != 5 or not _count(h[0]) or h[0] > step or not _count(h[1]) or h[1] >= n
                or not _finite(h[2]) or not _finite(h[3]) or not isinstance(h[4], int) or isinstance(h[4], bool)
                or not -1 <= h[4] < rerolls):
            return None
        out.append((h[0], h[1], float(h[2]), float(h[3]), h[4]))
    return out


def pick_source(curriculum, names: list[str], share: dict, rng, step: int) -> str:
    """The source of a step: the only one, the curriculum's pick, or a draw in proportion to
    `share` with `rng` (a numpy Generator)."""
    if len(names) == 1:
        return names[0]
    if curriculum is not None:
        return curriculum.next_source(step)
    total = sum(share[n] for n in names)
    return names[int(rng.choice(len(names), p=[share[n] / total for n in names]))]


def make_curriculum(cfg, names: list[str]) -> Curriculum | None:
    """The curriculum of a run (`cfg`: its TrainConfig) over these sources, or None for
    token-proportional sampling or a single source."""
    if cfg.sampling == "proportional" or len(names) == 1:
        return None
    return cfg.make_curriculum(names)
