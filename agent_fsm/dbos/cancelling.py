"""Cancelling a DBOS run from outside (``DBOSAgent.cancel``): from any process that reaches
the journal store and DBOS's system database, whichever worker drives the run, or before
one takes it from the queue.

**Where the request waits.** A DBOS run keeps no checkpoint while it runs (DBOS records its
steps), so there is no run row for a request to travel on, as a leased run's does
(``durable.queue``). It is kept in the run's tool journal instead, in the journal store
every worker shares, under the key of the *activation* it stops (``requests.CANCEL_KEY``
after the activation's key prefix: ``cancel`` for the run's first workflow,
``resume-n/cancel`` for its resume number n), as a started entry of a call named
``requests.CANCEL_CALL`` whose arguments hold the reason. Every journal store keeps it, and
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

**How the run reads it** (``agent_fsm.dbos.steps``, ``agent_fsm.dbos.tool_calls``): the
request is read before every model and tool call, and each step records what it found as
part of its outcome, so a replay of the run takes the same path whatever the journal holds
by then. A tool call reads it with the record of its start: one made without a step starts
only when no request is pending, and one that finds it is made as a step, which reads it
again and records it. A tool step reads it with its own journal entry before its call, and
again with the record of its end (one statement each, ``PairedLookup`` and
``FinishingLookup``); a tool call made without a step reads it with the record of its end
(``FirstFinishingLookup``), and the model call after it records what that read found
(``RunTime.hear``). A model call reads it on its own only when no such read followed the
latest call (``RunTime.request_seen``: the run's first model call, one after a model call,
after a tool step whose end-read failed, after a call made without a step answered from its
entry by a replay), since a read at the end of the turn's last tool call is the read before
the next model call. A step
that finds it before its call makes no call (a tool call is answered "not run"); the steps
after one that found it, before or after its call, in that activation are not run at all;
the run is aborted once that state's work ends (``ReplayedKeeper``): ERROR ``aborted``, with
the reason, resumable, every tool call answered. So no model or tool call starts once a
request is recorded, but for one whose step read the journal just before (as a leased run's
call started just after its save). A look-up that fails is taken for no request; the next
step reads it again.

**From a process that runs no DBOS** (``agent-fsm cancel --dbos URL``): ``cancel_outside``
reads the workflows' statuses with a ``DBOSClient`` on DBOS's system database instead of a
launched DBOS, and records the same request.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable

from dbos import DBOS, DBOSClient

from agent_fsm.dbos.pausing import key_prefix, resume_id
from agent_fsm.dbos.requests import CANCEL_CALL, CANCEL_KEY
from agent_fsm.durable.checkpoint import CheckpointStore, redacted
from agent_fsm.durable.encoding import unknown_run
from agent_fsm.durable.leases import check_id
from agent_fsm.durable.queue import check_reason
from agent_fsm.errors import CheckpointError, ConfigError
from agent_fsm.messages import ToolCall

__all__ = [
    "RUNNING",
    "StatusOf",
    "cancel_outside",
    "cancel_run",
    "launched_status_among",
    "request_cancel",
    "running_activation",
]

RUNNING = frozenset({"ENQUEUED", "PENDING"})
"""DBOS's statuses of a workflow that has not ended."""

STATUS_WAIT_S = 30.0
"""How long a cancel waits for a workflow's status before it says it cannot tell: DBOS
retries a system database it cannot reach without end, and a cancel must end."""

StatusOf = Callable[[str], Awaitable[str | None]]
"""DBOS's status of a workflow id (``ENQUEUED``, ``SUCCESS``, ...), None for no workflow."""


async def _launched_status(workflow_id: str) -> str | None:
    """The status, read through this process's launched DBOS."""
    status = await DBOS.get_workflow_status_async(workflow_id)
    return None if status is None else str(status.status)


def launched_status_among(names: frozenset[str]) -> StatusOf:
    """The status, read through this process's launched DBOS, of a workflow registered
    under one of ``names``; None for another's. One process may hold ``DBOSAgent``s on
    different journal stores, and DBOS sees the workflows of all of them: a request
    recorded in the journal of an agent whose workflow it is not would never be read."""

    async def status(workflow_id: str) -> str | None:
        found = await DBOS.get_workflow_status_async(workflow_id)
        return None if found is None or found.name not in names else str(found.status)

    return status


def _client_status(client: DBOSClient, url: str) -> StatusOf:
    """The status, read through ``client`` (no DBOS launched here) on DBOS's system
    database at ``url``; a failure is a ``CheckpointError`` naming the database without its
    password."""

    async def status(workflow_id: str) -> str | None:
        try:
            found = await client.list_workflows_async(
                workflow_ids=[workflow_id], load_input=False, load_output=False
            )
        except Exception as exc:
            why = redacted(str(exc), secrets_of=url)
            raise CheckpointError(
                f"cannot read the workflows of DBOS at {redacted(url)}: {why}"
            ) from None
        return str(found[0].status) if found else None

    return status


async def _find(
    store: CheckpointStore, run_id: str, status_of: StatusOf
) -> tuple[bool, int | None]:
    """Whether there is a run ``run_id``, and its activation that has not ended (see
    ``running_activation``).

    Raises:
        CheckpointError: the store, or DBOS's workflows, cannot be read: whether the run
            exists is not known then.
    """
    try:
        stop = await asyncio.to_thread(store.load, run_id)
    except CheckpointError:
        if await asyncio.to_thread(store.exists, run_id):  # unreadable, or the store away
            raise
        stop = None
    if stop is None:  # no stop kept: its first workflow, if there is one
        status = await _read_status(status_of, run_id)
        if status is None:
            return False, None
        return True, (0 if status in RUNNING else None)
    resumes = len(stop.resumed_at) + 1
    status = await _read_status(status_of, resume_id(run_id, resumes))
    return True, (resumes if status in RUNNING else None)


async def _read_status(status_of: StatusOf, workflow_id: str) -> str | None:
    """``status_of(workflow_id)``; a failure to read it, or no answer within
    ``STATUS_WAIT_S``, is a ``CheckpointError`` that says so (never taken for "no such
    workflow": a run must not be reported missing when its workflows could not be looked
    at). DBOS's own retries may go on in its thread after the wait ends: they read only."""
    try:
        return await asyncio.wait_for(status_of(workflow_id), STATUS_WAIT_S)
    except CheckpointError:
        raise
    except TimeoutError:
        raise CheckpointError(
            f"cannot read the status of DBOS workflow {workflow_id!r}: no answer within "
            f"{STATUS_WAIT_S:g} s (is DBOS's system database reachable?)"
        ) from None
    except Exception as exc:
        detail = redacted(" ".join(f"{type(exc).__name__}: {exc}".split()))
        raise CheckpointError(
            f"cannot read the status of DBOS workflow {workflow_id!r}: {detail}"
        ) from exc


async def running_activation(
    store: CheckpointStore, run_id: str, status_of: StatusOf = _launched_status
) -> int | None:
    """The activation of the run that has not ended (0: its first workflow; n: its resume
    number n), or None when the run is at a stop or finished (see the module docstring).
    ``status_of`` reads the workflows (by default through this process's launched DBOS).

    Raises:
        CheckpointError: no run ``run_id`` (neither in the store nor among the workflows),
            or the store or the workflows cannot be read (the message says which).
    """
    known, activation = await _find(store, run_id, status_of)
    if not known:
        raise unknown_run(run_id)
    return activation


async def request_cancel(
    store: CheckpointStore, run_id: str, reason: str, *, status_of: StatusOf = _launched_status
) -> bool | None:
    """``cancel_run``, with None for no run ``run_id`` (nothing is recorded), so that a
    caller asking several places (``Agent.cancel``: ``run.elsewhere``) can tell a run that
    is not here from one that could not be looked up, which raises.

    Raises:
        CheckpointError: the store or the workflows cannot be read, or the store written.
        ConfigError: a run id no store could keep, a reason that is not a str.
    """
    check_id(run_id)
    reason = check_reason(reason)
    known, activation = await _find(store, run_id, status_of)
    if not known:
        return None
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


async def cancel_run(
    store: CheckpointStore, run_id: str, reason: str, *, status_of: StatusOf = _launched_status
) -> bool:
    """Ask the run's workflow to stop before its next model or tool call (see the module
    docstring); True when the request was recorded, False when the run is at a stop or
    finished (nothing is recorded). A second request before the first was read keeps the
    first one's reason. ``status_of`` reads the workflows (by default through this
    process's launched DBOS; ``cancel_outside`` reads them with a client).

    Raises:
        CheckpointError: no run ``run_id``; or the store or the workflows cannot be read
            (never reported as "no such run"), or the store cannot be written.
        ConfigError: a run id no store could keep, a reason that is not a str.
    """
    found = await request_cancel(store, run_id, reason, status_of=status_of)
    if found is None:
        raise unknown_run(run_id)
    return found


def cancel_outside(
    store: CheckpointStore,
    run_id: str,
    reason: str,
    *,
    system_database_url: str,
    dbos_schema: str = "dbos",
) -> bool:
    """``cancel_run`` from a process that has not launched DBOS (the command line): the
    workflows are read with a ``DBOSClient`` on DBOS's system database
    (``system_database_url``, its tables in ``dbos_schema``: the fleet's
    ``DBOSConfig``). Blocking; the client is closed before it returns.

    Raises:
        CheckpointError: as ``cancel_run``; or DBOS's system database cannot be reached or
            read (the error names the database without its password).
        ConfigError: as ``cancel_run``.
    """
    where = redacted(system_database_url)
    try:
        client = DBOSClient(
            system_database_url=system_database_url,
            dbos_system_schema=dbos_schema,
            system_database_pool_size=1,
            retry_connection_errors=False,  # a database away is said, not waited for
        )
    except Exception as exc:
        why = redacted(str(exc), secrets_of=system_database_url)
        raise CheckpointError(f"cannot reach DBOS's system database at {where}: {why}") from None
    try:
        return asyncio.run(
            cancel_run(store, run_id, reason, status_of=_client_status(client, system_database_url))
        )
    except (CheckpointError, ConfigError):
        raise
    except Exception as exc:
        why = redacted(str(exc), secrets_of=system_database_url)
        raise CheckpointError(f"cannot read the workflows of DBOS at {where}: {why}") from None
    finally:
        client.destroy()
