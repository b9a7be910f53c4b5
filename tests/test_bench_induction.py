"""benchmarks/bench_induction.py's reading of a run's metrics: where the best induction score first
passes 0.3, and whether the smoothed loss fell faster over the window up to it (a bump)."""

import importlib
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(BENCH))
    try:
        yield importlib.import_module("bench_induction")
    finally:
        sys.path.remove(str(BENCH))


def rows_with(scores: dict[int, float], loss) -> list[dict]:
    rows = [{"step": s, "smma": loss(s)} for s in range(0, 4001, 50)]
    return rows + [{"step": s, "heads": {"best": {"induction": v, "previous": 0.5}}} for s, v in scores.items()]


def test_the_crossing_is_the_first_scored_step_above_present(bench):
    rows = rows_with({250: 0.1, 500: 0.29, 750: 0.31, 1000: 0.6, 1250: 0.4}, lambda s: 5.0)
    assert bench.crossing(rows) == (750, 0.6, 1000)
    assert bench.crossing(rows_with({250: 0.1, 500: 0.2}, lambda s: 5.0)) == (None, 0.2, 500)


def test_a_sudden_fall_up_to_the_crossing_is_a_bump_and_a_steady_one_is_not(bench):
    # falls 0.1 per 500 steps, then 1.0 over the 500 steps up to step 3,000
    sudden = rows_with({3000: 0.5}, lambda s: 6.0 - 0.0002 * s - (0.002 * (s - 2500) if s > 2500 else 0.0))
    before, to = bench.loss_fall(sudden, 3000)
    assert before == pytest.approx(0.1) and to == pytest.approx(1.1)
    assert bench.bump(before, to) == "11.0× faster, a bump"
    steady = rows_with({3000: 0.5}, lambda s: 6.0 - 0.0002 * s)
    assert bench.bump(*bench.loss_fall(steady, 3000)) == "no bump"
    assert bench.bump(0.0, 0.5) == "no bump"  # no fall before: no ratio to speak of
