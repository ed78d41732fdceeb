"""The private DBOS names ``agent_fsm.dbos`` relies on, all in this one module: what to check
when the ``dbos`` version range in pyproject.toml moves. Each has no public equivalent:

- ``DBOS._recover_pending_workflows``: hands another executor's unfinished workflows back to
  their queue (DBOS recovers only its own executor id, at launch);
- ``dbos._datasource._still_owns``: whether the running execution still owns its workflow
  (DBOS's fencing token, ``owner_xid``, which it checks only when it records a step; a
  workflow handed to another executor must not start a call here first);
- the launched instance's ``background_thread_stop_events`` and ``_background_threads``: a
  liveness keeper stops, and gives its lease up, when ``DBOS.destroy()`` stops DBOS's own
  threads, so a process's liveness lasts exactly as long as its DBOS;
- ``dbos._context``'s ``get_local_dbos_context``, ``DBOSContext.snapshot_step_ctx`` and
  ``EnterDBOSStepCtx``: the context DBOS sets for the body of a step, entered around a tool
  call made without a step (``in_a_step``), so that DBOS treats what the tool does as it
  treats it inside a step (a step called in it runs as a plain function, and nothing is
  recorded in the workflow). DBOS tells a step from its workflow only by this context
  (``DBOSContext.is_step``, held in a ContextVar).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from dbos import DBOS
from dbos._context import EnterDBOSStepCtx, get_local_dbos_context
from dbos._datasource import _still_owns
from dbos._dbos import _get_dbos_instance

__all__ = [
    "in_a_step",
    "launched",
    "owns_this_workflow",
    "recover_executors",
    "stop_with_dbos",
]


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


@contextlib.contextmanager
def in_a_step(name: str) -> Iterator[None]:
    """Run the block as DBOS runs a step's body, and record nothing: in a workflow, the
    block sees DBOS's step context (``DBOSContext.is_step``), so DBOS treats what it does as
    inside a step (a ``@DBOS.step`` function or ``DBOS.run_step_async`` runs as a plain
    function; ``DBOS.sleep`` and starting a workflow are refused as in a step), and no
    number of the workflow's is taken: a replay that does not run the block numbers the
    workflow's later steps as the first execution did. The step context carries the
    number of the workflow's latest step (what DBOS files a ``set_event`` or a stream
    write made in it under): a fork from a later step keeps it. Outside a workflow (or in
    a step) the block runs as it is. ``name`` names the step's trace span.

    The context is a ContextVar's value, set in the calling task: tasks and worker threads
    the block starts copy it."""
    workflow = get_local_dbos_context()
    if workflow is None or not workflow.is_workflow():
        yield
        return
    latest = workflow.function_id
    inner = workflow.snapshot_step_ctx()  # DBOS's own step context, which takes a number:
    workflow.function_id = inner.function_id = latest  # given back (nothing awaited since)
    with EnterDBOSStepCtx({"name": name, "operationType": "step"}, inner):
        yield
