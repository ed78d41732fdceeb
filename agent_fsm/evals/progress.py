"""A progress bar for an eval: pass it as ``on_trial`` (the command line does, on stderr).

On a terminal it redraws one line in place:

    [##########..........] 20/40 passed 18 failed 2 broken 0

Elsewhere (a CI log, a pipe) it writes a line at each tenth of the way, never one per trial.
"""

from __future__ import annotations

import sys
from typing import TextIO

from agent_fsm.evals.records import TrialRecord

__all__ = ["ProgressBar"]


class ProgressBar:
    """Draws the trials done so far; an ``OnTrial`` callback."""

    def __init__(self, stream: TextIO | None = None, *, width: int = 30, live: bool | None = None):
        self.stream = stream if stream is not None else sys.stderr
        self.width = width
        self.live = self.stream.isatty() if live is None else live
        self.passed = self.failed = self.broken = 0
        self._tenths = -1

    def line(self, done: int, total: int) -> str:
        """The bar for ``done`` of ``total`` trials."""
        filled = self.width * done // total if total else self.width
        bar = "#" * filled + "." * (self.width - filled)
        return (
            f"[{bar}] {done}/{total} passed {self.passed} failed {self.failed} broken {self.broken}"
        )

    def __call__(self, record: TrialRecord, done: int, total: int) -> None:
        if record.passed:
            self.passed += 1
        else:
            self.failed += 1
        self.broken += record.broken
        finished = done >= total
        if self.live:
            self.stream.write("\r\x1b[2K" + self.line(done, total) + ("\n" if finished else ""))
        else:
            tenths = 10 * done // total if total else 10
            if tenths == self._tenths and not finished:
                return
            self._tenths = tenths
            self.stream.write(self.line(done, total) + "\n")
        self.stream.flush()
