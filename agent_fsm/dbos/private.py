"""The private DBOS names ``agent_fsm.dbos`` relies on, all in this one module: what to check
when the ``dbos`` version range in pyproject.toml moves. Each has no public equivalent:

- ``DBOS._recover_pending_workflows``: hands another executor's unfinished workflows back to
  their queue (DBOS recovers only its own executor id, at launch);
- ``dbos._datasource._still_owns``: whether the running execution still owns its workflow
  (DBOS's fencing token, ``owner_xid``, which it checks only when it records a step; a
  workflow handed to another executor must not start a call here first);
- the launched instance's ``background_thread_stop_events`` and ``_background_threads``: a
  liveness keeper stops, and gives its lease up, when ``DBOS.destroy()`` stops DBOS's own
  threads, so a process's liveness lasts exactly as long as its DBOS.
"""

from __future__ import annotations

import threading

from dbos import DBOS
from dbos._datasource import _still_owns
from dbos._dbos import _get_dbos_instance

__all__ = ["launched", "owns_this_workflow", "recover_executors", "stop_with_dbos"]


def recover_executors(executor_ids: list[str]) -> list[str]:
    """Hand the unfinished workflows of ``executor_ids`` back to their queue (each is taken
    from there by exactly one live worker); return their ids. Blocking."""
    return [handle.workflow_id for handle in DBOS._recover_pending_workflows(executor_ids)]


def owns_this_workflow() -> bool:
    """Whether the execution calling this (inside a workflow) still owns its workflow: no
    recovery has handed it to another execution since it began. Blocking (one read)."""
    workflow_id = DBOS.workflow_id
    return workflow_id is None or _still_owns(workflow_id)


def launched() -> bool:
    """Whether DBOS is launched in this process (and not destroyed)."""
    try:
        return bool(getattr(_get_dbos_instance(), "_launched", False))
    except Exception:  # no DBOS instance: DBOSException
        return False


def stop_with_dbos(stop: threading.Event, thread: threading.Thread) -> bool:
    """Have ``DBOS.destroy()`` set ``stop`` and wait for ``thread`` (as for its own threads);
    False when there is no DBOS instance to attach to."""
    try:
        instance = _get_dbos_instance()
    except Exception:  # no DBOS instance: DBOSException
        return False
    instance.background_thread_stop_events.append(stop)
    instance._background_threads.append(thread)
    return True
