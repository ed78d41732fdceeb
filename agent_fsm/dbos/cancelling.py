"""Cancelling a DBOS run from outside (``DBOSAgent.cancel``): from any process that reaches
the journal store and DBOS's system database, whichever worker drives the run, or before
one takes it from the queue.

**Where the request waits.** A DBOS run keeps no checkpoint while it runs (DBOS records its
steps), so there is no run row for a request to travel on, as a leased run's does
(``durable.queue``). It is kept in the run's tool journal instead, in the journal store
every worker shares, under the key of the *activation* it stops (``replay.CANCEL_KEY``
after the activation's key prefix: ``cancel`` for the run's first workflow,
``resume-n/cancel`` for its resume number n), as a started entry of a call named
``replay.CANCEL_CALL`` whose arguments hold the reason. Every journal store keeps it, and
deleting the run deletes it. Keyed by activation, a request recorded for a workflow that
ended by itself meanwhile is never read by a later resume of the run: a resumed run runs on,
as a leased run whose stop cleared its request does.

**Which activation.** The run's latest workflow, if it has not ended: the first one while
the store holds no stop of the run; else the resume that continues the stored stop
(``pausing.resume_id``), if it was started. A run at a stop (paused, aborted, timed out)
with no resume under way has nothing to stop: ``cancel`` returns False and records
nothing, as ``RunCancels.cancel`` does for a stopped run (a pause is cancelled by not
answering it). A resume started after a cancel was refused runs on; a cancel made once a
resume has started (queued or running, its resume row taken or not) stops that resume.

**How the run reads it** (``agent_fsm.dbos.steps``): every model step and tool step looks the
request up before its call, one read of the journal and no write, and records what it found
as part of its outcome, so a replay of the run takes the same path whatever the journal
holds by then. A step that finds it makes no call (a tool call is answered "not run"); the
steps after it in that activation are not run at all; the run is aborted once that state's
work ends (``ReplayedKeeper``): ERROR ``aborted``, with the reason, resumable, every tool
call answered. So no model or tool call starts once a request is recorded, but for one
whose step read the journal just before (as a leased run's call started just after its
save). A look-up that fails is taken for no request; the next step reads it again.
"""

from __future__ import annotations

import asyncio
import json

from dbos import DBOS

from agent_fsm.dbos.pausing import key_prefix, resume_id
from agent_fsm.dbos.replay import CANCEL_CALL, CANCEL_KEY
from agent_fsm.durable.checkpoint import CheckpointStore
from agent_fsm.durable.encoding import unknown_run
from agent_fsm.durable.leases import check_id
from agent_fsm.durable.queue import check_reason
from agent_fsm.errors import CheckpointError
from agent_fsm.messages import ToolCall

__all__ = ["RUNNING", "cancel_run", "running_activation"]

RUNNING = frozenset({"ENQUEUED", "PENDING"})
"""DBOS's statuses of a workflow that has not ended."""


async def running_activation(store: CheckpointStore, run_id: str) -> int | None:
    """The activation of the run that has not ended (0: its first workflow; n: its resume
    number n), or None when the run is at a stop or finished (see the module docstring).

    Raises:
        CheckpointError: no run ``run_id`` (neither in the store nor among the workflows),
            or the store cannot be read.
    """
    try:
        stop = await asyncio.to_thread(store.load, run_id)
    except CheckpointError:
        if await asyncio.to_thread(store.exists, run_id):  # unreadable, or the store away
            raise
        stop = None
    if stop is None:  # no stop kept: its first workflow, if there is one
        status = await DBOS.get_workflow_status_async(run_id)
        if status is None:
            raise unknown_run(run_id) from None
        return 0 if status.status in RUNNING else None
    resumes = len(stop.resumed_at) + 1
    status = await DBOS.get_workflow_status_async(resume_id(run_id, resumes))
    return resumes if status is not None and status.status in RUNNING else None


async def cancel_run(store: CheckpointStore, run_id: str, reason: str) -> bool:
    """Ask the run's workflow to stop before its next model or tool call (see the module
    docstring); True when the request was recorded, False when the run is at a stop or
    finished (nothing is recorded). A second request before the first was read keeps the
    first one's reason.

    Raises:
        CheckpointError: no run ``run_id``, or the store cannot be read or written.
        ConfigError: a run id no store could keep, a reason that is not a str.
    """
    check_id(run_id)
    reason = check_reason(reason)
    activation = await running_activation(store, run_id)
    if activation is None:
        return False
    key = key_prefix(activation) + CANCEL_KEY
    journal = store.journal(run_id)
    request = ToolCall(id=key, name=CANCEL_CALL, arguments=json.dumps({"reason": reason}))

    def record() -> None:
        if journal.lookup(key) is None:  # the first reason stays
            journal.record_started(key, request)

    await asyncio.to_thread(record)
    return True
