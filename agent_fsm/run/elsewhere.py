"""Runs that live where no agent's residence looks: how ``Agent.cancel`` reaches them.

A ``DBOSAgent``'s run is a DBOS workflow: its first workflow keeps no checkpoint in any
store, and while a resume of it runs the store still shows the stop it continues. So the
residence of an agent (its store, or this process's runs) answers "no such run" for the
first, "it has stopped" for the second, though the run is being driven. An extra whose runs
live elsewhere registers a ``RunsElsewhere`` (``agent_fsm.dbos``: each ``DBOSAgent``, when it
is made), and ``Agent.cancel`` asks the registered ones when its residence did not reach the
run. The core imports no extra: it only keeps what the extras registered.

Free when off: with nothing registered, ``cancel_elsewhere`` looks at an empty set, and only
a cancel its residence did not reach calls it.
"""

from __future__ import annotations

import weakref
from typing import Protocol

from agent_fsm.errors import CheckpointError

__all__ = ["RunsElsewhere", "cancel_elsewhere", "reach_runs_elsewhere"]


class RunsElsewhere(Protocol):
    """Where some runs live that no residence holds (a fleet of DBOS workflows)."""

    def cancel_elsewhere(self, run_id: str, reason: str) -> bool | None:
        """Ask the run, if it is one of these, to stop as ``Agent.cancel`` says: True when
        asked, False when it is at a stop or finished, None when it is not one of these runs
        (or cannot be told now). Blocking; may be called from a running event loop's thread.
        Must not raise."""
        ...


_REGISTERED: weakref.WeakSet[RunsElsewhere] = weakref.WeakSet()


def reach_runs_elsewhere(runs: RunsElsewhere) -> None:
    """Let ``Agent.cancel`` reach ``runs`` from now on, as long as ``runs`` lives (held
    weakly: registering keeps nothing alive)."""
    _REGISTERED.add(runs)


def cancel_elsewhere(run_id: str, reason: str) -> bool | None:
    """Ask each registered ``RunsElsewhere`` in turn; the first that knows the run answers
    (True: asked, False: stopped); None when none knows it."""
    for runs in list(_REGISTERED):
        try:
            found = runs.cancel_elsewhere(run_id, reason)
        except CheckpointError:  # a contract broken: taken for "not one of these runs"
            found = None
        if found is not None:
            return found
    return None
