"""Paused runs under DBOS: where a run's state is kept when it stops to wait for a person,
and how ``DBOSAgent.resume`` continues it.

**Where the stop is kept.** A workflow whose run stops in a way the table can resume
(ask_user, approvals; an abort, a timeout, a transient model failure) saves the run's state
as a checkpoint in the DBOSAgent's journal store (``CheckpointStore.save``, under the run
id), in a step of its own (``SAVE_STEP``), so a replay does not save it again. A resumed
run saves its every stop, resumable or not, so the checkpoint always shows where the run is
now (and a late resume of a run that has since finished says so). The store rather than the
workflow's recorded result, because: the result stays the ``RunResult`` that every handle
and DBOS client expects; the store is where ``Agent.resume`` finds runs too (load, list,
the CLI), and a resume needs only the run id, not the id of the workflow that stopped last.
Durability: the save commits before DBOS records the step, durably; with the store on the
PostgreSQL server of DBOS's system database, that later commit flushes the save with it.

**A resume is a workflow of its own**, ``f"{run_id}:resume-{n}"``, ``n`` counting the
run's resumes (1 continues its first stop). It loads the checkpoint
in a step (``LOAD_STEP``), so a replay gets the stop it loaded the first time even after
the checkpoint has moved on. It reopens the run with the answer (``run.resuming.reopen``:
the table's resume rows, as ``Agent.resume`` does) and drives it like a first workflow, with
the same replay-safe steps and a clock, deadline and random numbers of its own
(``agent_fsm.dbos.replay``). Its tool calls keep the run's journal under keys of their own
(``resume-n/call:K``: a resume's calls are numbered from 0 again).

**A double resume of one stop is one workflow.** Both callers load the same checkpoint,
so both name the same workflow id, and DBOS starts a workflow id once (any number of
processes): the second caller gets the first one's handle and result, and its own answer
is not used. So an approved call (a double-clicked Approve) is carried out once. A resume
made after the run has stopped again continues that new stop, as ``Agent.resume`` does.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from dbos import DBOS

from agent_fsm.dbos.liveness import Admission
from agent_fsm.dbos.replay import options
from agent_fsm.durable.checkpoint import CheckpointStore, ForwardSaves, behind
from agent_fsm.errors import CheckpointError, ResumeError
from agent_fsm.run.resuming import finished
from agent_fsm.state import RunResult, RunState

__all__ = [
    "LOAD_STEP",
    "SAVE_STEP",
    "key_prefix",
    "load_stop",
    "resume_id",
    "save_forward",
    "save_stop",
    "stop_of",
]

LOAD_STEP = "agent_fsm.load"
SAVE_STEP = "agent_fsm.save"
STORE_RETRY_S = 120.0
"""How long the save and load steps try again while the store fails (a server restart, a
connection cut), before the step fails, and its workflow with it."""

T = TypeVar("T")


def resume_id(run_id: str, resumes: int) -> str:
    """The workflow id of the run's resume number ``resumes`` (1-based)."""
    return f"{run_id}:resume-{resumes}"


def key_prefix(resumes: int) -> str:
    """What the journal keys of a workflow's tool steps start with: nothing for the run's
    first workflow, ``resume-n/`` for its resume number n."""
    return f"resume-{resumes}/" if resumes else ""


async def stop_of(store: CheckpointStore, run_id: str) -> RunState:
    """The checkpoint of the run's latest stop, read by a caller about to resume it.

    Only a run the store does not hold is looked up among the workflows (one that finished
    without a stop kept nothing there): a load that failed otherwise (the server away) is
    the caller's to try again, never taken for "finished", which would refuse for good the
    answer to a pause the run still waits at.

    Raises:
        ResumeError: the run has not stopped yet, or finished without a stop to resume.
        CheckpointError: no run ``run_id`` (neither in the store nor among the workflows),
            or the store cannot be read now.
    """
    try:
        return store.load(run_id)
    except CheckpointError:
        if store.exists(run_id):  # raises CheckpointError too while the store is away
            raise
        status = await DBOS.get_workflow_status_async(run_id)
        if status is None:
            raise
        if status.status in ("ENQUEUED", "PENDING"):
            raise ResumeError(
                f"run {run_id} has not stopped yet: wait for its result, then resume it"
            ) from None
        output = status.output
        if isinstance(output, RunResult):
            raise finished(run_id, output.stop_reason.value) from None
        raise


async def load_stop(store: CheckpointStore, run_id: str, resumes: int) -> RunState:
    """Step: the stop that resume number ``resumes`` continues, as the store held it when
    the resume first ran (a replay gets the same one back). A load that fails is tried
    again (``_persisting``).

    Raises:
        ResumeError: the checkpoint is not that stop (it has moved on, which the workflow
            ids of resumes make impossible unless the store was written by other means).
        CheckpointError: the store failed for ``STORE_RETRY_S``.
    """

    async def load() -> RunState:
        return await _persisting(lambda: store.load(run_id))

    state = await DBOS.run_step_async(options(LOAD_STEP), load)
    if len(state.resumed_at) != resumes - 1:
        raise ResumeError(
            f"run {run_id} has been resumed {len(state.resumed_at)} times, so this is not "
            f"the stop resume {resumes} was for: resume it again"
        )
    return state


async def save_stop(store: CheckpointStore, state: RunState, admission: Admission) -> None:
    """Step: save the stopped run as its checkpoint, for a resume to load, unless the store
    holds a later point of the run (``save_forward``), once the execution passed its fence
    (``Admission.check``, before each attempt): an execution
    superseded meanwhile (its process stalled or lost its lease, and the fleet replays the
    run elsewhere) stops instead of saving, since by then the run may have moved on (resumed
    and finished), and its old stop would overwrite the newer checkpoint. A save that fails
    is tried again (``_persisting``).

    Raises:
        CheckpointError: the store failed for ``STORE_RETRY_S``.
        asyncio.CancelledError: the execution was superseded (``Admission.superseded``).
    """

    async def save() -> None:
        await _persisting(lambda: save_forward(store, state), before=admission.check)

    await DBOS.run_step_async(options(SAVE_STEP), save)


def save_forward(store: CheckpointStore, state: RunState) -> bool:
    """Save ``state`` unless the store holds a later point of the run (see ``_behind``);
    True when it saved. In one transaction on a store that offers it (``ForwardSaves``:
    ours do), else a look and then a save."""
    if isinstance(store, ForwardSaves):
        return store.save_unless_behind(state)
    if _behind(store, state):
        return False
    store.save(state)
    return True


def _behind(store: CheckpointStore, state: RunState) -> bool:
    """Whether the store holds a later point of the run than ``state`` (``checkpoint.behind``).
    A workflow replayed after the run went on (its worker died between saving its stop and
    DBOS recording that step, and the stop was resumed meanwhile, maybe to the end) makes
    its save again; the checkpoint must stay where the run is. Our stores compare and save
    in one transaction (``ForwardSaves``); for another store the read and the write are two
    of its calls, and a later point saved between them (a resume saving its stop at that
    very moment) would still be overwritten."""
    if not store.exists(state.run_id):
        return False
    stored = store.load(state.run_id)
    return behind(state, len(stored.resumed_at), len(stored.trace))


async def _persisting(
    work: Callable[[], T], before: Callable[[], Awaitable[None]] | None = None
) -> T:
    """``work()`` (a load or save of the store, in a thread), tried again while it raises
    ``CheckpointError``, for up to ``STORE_RETRY_S``, with growing pauses; ``before`` is
    awaited before each attempt (a fence).

    Why inside the step: a step that fails is recorded failed, and its workflow with it;
    the workflow id of a resume is fixed by the stop it continues, so every later resume
    of that stop would get the failure back and the run could never go on. A load and a
    save of one checkpoint may be made again (the save writes the same state), and a
    store that failed (PostgreSQL restarting, a connection cut) is usually back within
    seconds.
    """
    deadline = time.monotonic() + STORE_RETRY_S
    pause_s = 0.05
    while True:
        if before is not None:
            await before()
        try:
            return await asyncio.to_thread(work)
        except CheckpointError:
            if time.monotonic() + pause_s > deadline:
                raise
            await asyncio.sleep(pause_s)
            pause_s = min(2 * pause_s, 2.0)
