"""A DBOS run's model call: its body (``call_model``), and the call made without a step, its
outcome kept in the run's journal instead of a step's record (``without_step``).
``agent_fsm.dbos.steps`` says when a call is made so, and makes the others as steps.

**A model call made without a step** (the usual case: a step costs DBOS two transactions,
a thread hop and its statement building) keeps its outcome (``replies.Replied``: the reply,
the failure, the deadline's cut or the cancel request that stopped it, with the time it
ended and, on the activation's first, the time it began) under the call's journal key
(``RunJournal.model_key``: ``model:N`` after the activation's key prefix), the first
outcome kept being the only one (``journal.OutcomeJournal``):

1. an execution that may be a replay (``RunTime.fresh`` unset: it has made no call of its
   own yet) reads the call's outcome first, with the cancel request in the same statement:
   an outcome found is answered, and no call is made. An outcome not found means no earlier
   execution went past this call (it would have kept it, or made a step in its place, which
   the caller checked for first): the execution is fresh from here on, and reads nothing
   before its later calls. A read that fails is made again until the journal answers (as
   ``unstepped._read_in_replay`` does: a step made in its place could meet a later record,
   and a call made again could get another reply than the calls journalled after it
   answered). So the run's first model call waits for a journal that cannot be read, on
   its first execution too (it cannot tell itself from a replay), but never past the run's
   time limit counted from its first try (later than the activation's true start, so never
   before the deadline): the call is then cut by the deadline, and a step records the cut
   (the journal cannot). Keep the journal on DBOS's own database, which DBOS waits for as
   well;
2. the call is made as its step would make it (``call_model``: the execution's fence, the
   cancel request, the run's deadline), and its outcome kept: a second execution racing
   this one (a worker taken for dead that goes on), having kept its own first, is answered
   with that one, and this execution goes on with it. Nothing is recorded before the call:
   calling the model again after a crash is what a step does too.

The outcome is committed without waiting for the disk, as a tool call's end is: on one
PostgreSQL cluster (the journal and DBOS's tables in one database, as the README's fleet
has them) whatever the run does next that must outlive a crash of the server is committed
with a flush, which flushes the outcome before it: a tool call's start (recorded before its
effect), a step's record, the workflow's end. A crash of the server that loses the outcome
loses everything after it too, and the replay calls the model again. An outcome that cannot
be kept (the journal failed twice) is returned as ``Unkept``, and a step records it.
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass

from pydantic import ValidationError

from agent_fsm.dbos.answers import twice
from agent_fsm.dbos.replay import RunTime
from agent_fsm.dbos.replies import Replied, from_json, to_json
from agent_fsm.dbos.unstepped import REPLAY_READ_RETRY_S
from agent_fsm.errors import CheckpointError
from agent_fsm.failures import is_own_failure
from agent_fsm.messages import ModelRequest, ModelResponse
from agent_fsm.models.base import Model
from agent_fsm.run.thinking import failure_from
from agent_fsm.state import ModelFailure

__all__ = ["Unkept", "call_model", "without_step"]


@dataclass(frozen=True, slots=True)
class Unkept:
    """A model call made without a step whose outcome could not be kept: the outcome, for a
    step to record instead, and why."""

    replied: Replied
    failure: Exception


async def without_step(
    model: Model,
    request: ModelRequest,
    run: RunTime,
    key: str,
    *,
    last: bool,
    look: bool,
    heard: str | None,
) -> Replied | Unkept:
    """The call of ``key`` made without a step (see the module docstring): the outcome kept
    (this execution's, or the one kept first), or this one's when it could not be kept.
    ``last``, ``look`` and ``heard`` are ``call_model``'s.

    Raises:
        CheckpointError: the outcome kept under ``key`` is not one (a damaged journal).
    """
    if not run.fresh:
        await run.admission.check()  # first: it may wait, and the read is after it
        read = await _kept(run, key)
        if read is None:  # unreadable for the whole time limit: the deadline cuts the call
            cut = Replied(run.fleet_now(), cut=True, began_at=run.begin())
            return Unkept(cut, CheckpointError(f"the journal could not be read ({key!r})"))
        kept, reason = read
        if kept is not None:
            return _decoded(kept, key)
        run.fresh = True  # no earlier execution went past this call: none kept anything later
        if look:  # the request read just now is the call's read before it
            look, heard = False, heard if heard is not None else reason
    began = run.begin()
    replied = await call_model(model, request, run, last=last, look=look, heard=heard)
    if began is not None:
        replied = dataclasses.replace(replied, began_at=began)
    try:
        outcome = to_json(replied)
        kept = twice(run.keep_outcome, key, outcome)
    except Exception as exc:
        return Unkept(replied, exc)
    return _decoded(kept, key)  # as a replay reads it, even when it is this execution's


async def _kept(run: RunTime, key: str) -> tuple[str | None, str | None] | None:
    """``run.outcome_and_request(key)``, read again until the journal answers, the
    execution's fence passed before each try; None once the run's time limit has passed
    since the first try (on the fleet's clock) with no answer."""
    since = run.fleet_now()
    while True:
        try:
            return twice(run.outcome_and_request, key)
        except Exception:
            if run.fleet_now() - since >= run.timeout_s:
                return None
            await asyncio.sleep(REPLAY_READ_RETRY_S)
            await run.admission.check()


def _decoded(kept: str, key: str) -> Replied:
    """The outcome kept under ``key``, as every execution reads it."""
    try:
        return from_json(kept)
    except ValidationError as exc:
        raise CheckpointError(f"the outcome of model call {key!r} is unreadable: {exc}") from exc


async def call_model(
    model: Model,
    request: ModelRequest,
    run: RunTime,
    *,
    last: bool,
    look: bool,
    heard: str | None,
) -> Replied:
    """The call as its step makes it: ``look`` says whether to read the cancel request first
    (it was not read since the latest call), ``heard`` is the request a call made without a
    step read after its call (``RunTime.hear``), recorded here as this call's own read.
    ``last``: this is the last answer (``Limits.last_answer``), whose time limit is the
    engine's. Must not raise for anything the model does."""
    await run.admission.check()
    reason = heard if heard is not None else run.cancel_requested() if look else None
    if reason is not None:
        return Replied(run.fleet_now(), cancelled=reason)
    # The last answer's own limit is the engine's (see StepModel.request); others have the
    # run's deadline.
    left = 10.0**9 if last else run.remaining_s()
    if left <= 0:
        return Replied(run.fleet_now(), cut=True)
    limit = asyncio.timeout(left)
    try:
        async with limit:
            response: object = await model.request(request)
    except BaseException as exc:
        if limit.expired() or (last and isinstance(exc, asyncio.CancelledError)):
            return Replied(run.fleet_now(), cut=True)
        if not is_own_failure(exc):
            raise
        return Replied(run.fleet_now(), failure=failure_from(exc))
    if not isinstance(response, ModelResponse):  # recorded as the engine would word it
        message = f"the model returned {type(response).__name__}, not a ModelResponse"
        return Replied(run.fleet_now(), failure=ModelFailure(message=message, permanent=False))
    return Replied(run.fleet_now(), response=response)
