"""Worker processes started by fork, which read what they need from the parent's memory.

A job crosses to a worker as something small (a slice's bounds, a task tuple) and its result comes
back; the large, read-only things every job needs (the texts, a tokenizer with its warm word
cache) are set with `shared` before the fork, so the workers inherit them instead of receiving
them pickled. A worker function reads them with `shared()`.

Two ways to run jobs:
    map_forked(fn, shared, jobs, workers)  fn over a list of jobs on a pool started for them, in order;
    ForkPool(fn, shared, workers)          one pool started once and fed jobs one by one (submit),
                                           so the workers stay warm across all of them; with one
                                           worker, or where fork is not possible, jobs run in this
                                           process when their result is asked for.
Pools nest: each restores what was shared before it when it ends.

A worker that dies (killed, out of memory, a crash in C) does not leave its job waiting forever:
the pool is broken at once and the job's result is one AndreaError saying a worker died, which
ends the command with exit 2 (a pool of concurrent.futures, which notices a dead worker; the
multiprocessing pool replaces the worker and never finishes its job).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from andrea.errors import AndreaError

_shared = None  # what the jobs of the pool now running read; forked workers inherit it


def can_fork() -> bool:
    """Whether this process may start forked workers: fork exists here, and this is not a daemon
    process (a data loader's worker, say, may not start processes of its own)."""
    return "fork" in multiprocessing.get_all_start_methods() and not multiprocessing.current_process().daemon


def shared():
    """What the pool that runs the current job shares with its workers."""
    return _shared


def map_forked(fn, shared, jobs, workers: int):
    """fn(job) for every job, in order, on `workers` forked processes; fn reads `shared()`."""
    global _shared
    before, _shared = _shared, shared
    pool = _executor(workers)
    try:
        for future in [pool.submit(fn, job) for job in jobs]:
            yield _result(future)
    finally:
        _shutdown(pool)
        _shared = before


def _executor(workers: int) -> ProcessPoolExecutor:
    return ProcessPoolExecutor(max(1, workers), mp_context=multiprocessing.get_context("fork"),
                               initializer=_end_with_parent, initargs=(os.getpid(),))


def _end_with_parent(parent: int) -> None:
    """In a worker: be killed when the process that forked it dies (Linux), so a killed command
    leaves no worker waiting for jobs that never come."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # it died before the line above
        os._exit(1)


def _result(future):
    try:
        return future.result()
    except BrokenProcessPool:
        raise AndreaError("a worker process died before its job was done (killed, or out of memory); "
                          "nothing of that job was kept; run the command again") from None


def _shutdown(pool: ProcessPoolExecutor) -> None:
    """End the workers now, their running jobs too (a stopped command waits for none of them)."""
    procs = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join()


class _Handle:
    """A job running on a worker; get() is its result."""

    def __init__(self, future):
        self.future = future

    def get(self):
        return _result(self.future)


class _Later:
    """A job run in this process when its result is asked for (so results keep a pool's order)."""

    def __init__(self, fn, job):
        self.fn, self.job = fn, job

    def get(self):
        return self.fn(self.job)


class ForkPool:
    """`workers` processes forked once, with `shared` in their memory; submit(job) runs fn(job) on
    one of them and returns a handle whose get() is the result. close() ends the workers."""

    def __init__(self, fn, shared, workers: int):
        global _shared
        self.fn = fn
        self.n = max(1, workers)
        self.pool = None
        self._before, _shared = _shared, shared
        if self.n > 1 and can_fork():
            self.pool = _executor(self.n)

    def submit(self, job):
        return _Handle(self.pool.submit(self.fn, job)) if self.pool is not None else _Later(self.fn, job)

    def close(self) -> None:
        global _shared
        if self.pool is not None:
            _shutdown(self.pool)
            self.pool = None
        _shared = self._before

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def slices(items, n: int) -> list[tuple[int, int]]:
    """Consecutive (start, end) slices of items, in order, each of about 1/n of their total len():
    the jobs a list of texts is split into. n of them or fewer, and one more where empty items
    are left over at the end."""
    total = sum(map(len, items)) or 1
    out, start, size = [], 0, 0
    for i, item in enumerate(items):
        size += len(item)
        if size >= total / n:
            out.append((start, i + 1))
            start, size = i + 1, 0
    if start < len(items):
        out.append((start, len(items)))
    return out
