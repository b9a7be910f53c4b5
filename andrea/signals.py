"""What a signal asks of a training run, from the moment the run starts until its last checkpoint
is on disk.

SIGTERM and Ctrl-C (SIGINT) ask for a clean stop, SIGUSR1 for a checkpoint now. While the run
starts up (data checked, model built, checkpoint read) there is no state of its own to save yet:
a stop request ends it at once, as Ctrl-C does (KeyboardInterrupt, so every `finally` runs and
no temporary file stays), and a checkpoint request waits for the first step. Once the loop runs
(`running`), a stop request is a flag that the loop reads between steps; the final evaluation and
the final checkpoint run with the handlers still installed, so a second SIGTERM during them
changes nothing and the last checkpoint is always written whole. Only SIGKILL stops a write,
and then the previous checkpoint is as it was.

Only the standard library is imported, so the command line installs the handlers before it loads
the heavy modules (torch) that a start-up spends most of its time in.
"""

from __future__ import annotations

import os
import signal


def is_main_process() -> bool:
    """Whether this process takes the signals: the only one, or rank 0 under torchrun."""
    return os.environ.get("RANK", "0") == "0"


class Signals:
    """The run's signal handlers, installed for the `with` block (on the main process only:
    `install=False` makes a no-op that reads as never signalled)."""

    def __init__(self, install: bool = True):
        self.stop = self.save_now = False
        self.starting = True  # no state to save yet: a stop request ends the process at once
        self.install, self.previous = install, {}

    def running(self) -> None:
        """The loop has begun: from now on a stop request is a flag the loop reads."""
        self.starting = False

    def take_save_request(self) -> bool:
        asked, self.save_now = self.save_now, False
        return asked

    def __enter__(self):
        if self.install:
            handlers = {signal.SIGTERM: self._on_stop, signal.SIGINT: self._on_stop, signal.SIGUSR1: self._on_usr1}
            self.previous = {sig: signal.signal(sig, handler) for sig, handler in handlers.items()}
        return self

    def __exit__(self, *exc):
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        self.previous = {}

    def _on_stop(self, signum, frame):
        if self.starting:
            raise KeyboardInterrupt
        self.stop = True

    def _on_usr1(self, signum, frame):
        self.save_now = True
