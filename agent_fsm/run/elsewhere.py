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
        asked, False when it is at a stop or finished, None when it is not one of these
        runs. Blocking; may be called from a running event loop's thread.

        Raises:
            CheckpointError: where these runs live could not be read (a database away), so
                whether the run is one of them is not known. Nothing else.
        """
        ...


_REGISTERED: weakref.WeakSet[RunsElsewhere] = weakref.WeakSet()


def reach_runs_elsewhere(runs: RunsElsewhere) -> None:
    """Let ``Agent.cancel`` reach ``runs`` from now on, as long as ``runs`` lives (held
    weakly: registering keeps nothing alive)."""
    _REGISTERED.add(runs)


def cancel_elsewhere(run_id: str, reason: str) -> bool | None:
    """Ask each registered ``RunsElsewhere`` in turn; the first that knows the run answers
    (True: asked, False: stopped); None when none knows it.

    Raises:
        CheckpointError: none knows the run, and one of them could not look (its error):
            a run is never reported missing when a place it may live could not be read.
    """
    unread: CheckpointError | None = None
    for runs in list(_REGISTERED):
        try:
            found = runs.cancel_elsewhere(run_id, reason)
        except CheckpointError as exc:  # could not look: asked the others, then said
            unread = unread or exc
            continue
        if found is not None:
            return found
    if unread is not None:
        raise unread
    return None
