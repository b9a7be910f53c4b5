"""Forked workers: results in order, what the pool shares read from the parent's memory, pools that
nest, jobs run in this process where there is one worker or no fork, and the even slices."""

from __future__ import annotations

import multiprocessing
import os
import random

import pytest

from andrea import forkpool

needs_fork = pytest.mark.skipif(not forkpool.can_fork(), reason="this platform does not fork")


def _scaled(job):
    base, pid = forkpool.shared()
    return job * base, os.getpid() != pid


@needs_fork
def test_map_forked_runs_every_job_in_order_on_workers_that_read_what_is_shared():
    out = list(forkpool.map_forked(_scaled, (10, os.getpid()), range(20), 2))
    assert [v for v, _ in out] == [10 * i for i in range(20)]
    assert all(elsewhere for _, elsewhere in out)  # each job ran in a worker, not here
    assert forkpool.shared() is None


def _sum_slice(bounds):
    return sum(forkpool.shared()[bounds[0] : bounds[1]])


@needs_fork
def test_pools_nest_and_each_restores_what_was_shared_before_it():
    with forkpool.ForkPool(_scaled, (3, os.getpid()), 1) as outer:
        assert forkpool.shared()[0] == 3
        inner = list(forkpool.map_forked(_sum_slice, list(range(10)), [(0, 5), (5, 10)], 2))
        assert inner == [10, 35]
        assert forkpool.shared()[0] == 3  # the outer pool's jobs still read theirs
        assert outer.submit(4).get() == (12, False)
    assert forkpool.shared() is None


@pytest.mark.parametrize("workers", [1, 2])
def test_a_fork_pool_gives_each_result_as_its_job_would_here(workers):
    pool = forkpool.ForkPool(_scaled, (7, os.getpid()), workers)
    try:
        handles = [pool.submit(i) for i in range(12)]
        results = [h.get() for h in handles]
    finally:
        pool.close()
    assert [v for v, _ in results] == [7 * i for i in range(12)]
    forked = workers > 1 and forkpool.can_fork()
    assert all(elsewhere == forked for _, elsewhere in results)
    assert pool.pool is None and forkpool.shared() is None


def test_without_fork_the_jobs_run_here_when_asked_for(monkeypatch):
    monkeypatch.setattr(forkpool, "can_fork", lambda: False)
    ran = []

    def job(x):
        ran.append(x)
        return x + 1

    with forkpool.ForkPool(job, None, 4) as pool:
        later = pool.submit(1)
        assert ran == [] and pool.pool is None  # nothing runs until the result is asked for
        assert later.get() == 2 and ran == [1]


def _can_fork_here(_):
    return forkpool.can_fork()


def test_a_daemon_process_may_not_fork():
    if "fork" not in multiprocessing.get_all_start_methods():
        assert not forkpool.can_fork()
        return
    assert forkpool.can_fork()
    with multiprocessing.get_context("fork").Pool(1) as pool:  # pool workers are daemons
        assert pool.apply(_can_fork_here, (None,)) is False


def test_slices_cover_the_items_in_order_with_about_equal_sizes():
    rng = random.Random(0)
    for _ in range(2000):
        items = ["x" * rng.randint(0, 50) for _ in range(rng.randint(0, 60))]
        n = rng.randint(1, 10)
        cut = forkpool.slices(items, n)
        assert len(cut) <= n or len(cut) == n + 1 and not "".join(items[cut[-1][0] :])
        assert [i for a, b in cut for i in range(a, b)] == list(range(len(items)))
        assert all(a < b for a, b in cut)
    items = ["x" * 10] * 8
    assert forkpool.slices(items, 4) == [(0, 2), (2, 4), (4, 6), (6, 8)]


def _dies_on(job):
    import signal

    if job == forkpool.shared():
        os.kill(os.getpid(), signal.SIGKILL)  # as the kernel's out-of-memory killer or `kill -9` would
    return job


@needs_fork
@pytest.mark.hostile
@pytest.mark.parametrize("doomed", [0, 3, 6])
def test_a_worker_that_dies_ends_its_pool_in_one_sentence_instead_of_a_wait_without_end(doomed):
    import signal
    import time

    from andrea.errors import AndreaError

    signal.alarm(60)  # the old pool waited for the dead worker's job for good: fail, do not hang
    try:
        t0 = time.monotonic()
        with pytest.raises(AndreaError, match="worker process died"):
            list(forkpool.map_forked(_dies_on, doomed, range(7), 2))
        with forkpool.ForkPool(_dies_on, doomed, 3) as pool:
            handles = [pool.submit(job) for job in range(7)]
            with pytest.raises(AndreaError, match="worker process died"):
                [h.get() for h in handles]
        assert time.monotonic() - t0 < 30
        assert forkpool.shared() is None
        assert list(forkpool.map_forked(_dies_on, -1, range(7), 2)) == list(range(7))  # a healthy pool after
    finally:
        signal.alarm(0)
