"""A DBOS run's tool calls: made without a step when the journal can stand for one, else
as a step.

**A tool call made as a step** is one step around the whole call: its timeout, its retries
with their backoff, and the tool journal (``durable.journal``), kept *inside* the step:

1. the step looks its own entry up in the run's journal (keyed by the call's number in the
   activation, ``RunTime.call_key``, which a replay reproduces): a finished entry is
   answered from the journal; a started one means an earlier execution died mid-call, so a
   tool that is not idempotent is answered "outcome unknown" instead of running twice (an
   idempotent one runs again);
2. otherwise it records the call as started (durably), runs it (``tools.execution.execute``),
   and records the answer.

The run's cancel request (``agent_fsm.dbos.cancelling``) is read in the statements of 1 and
of the answer's record; a model call reads it itself only when the latest call was not
followed by such a read (``replay.RunTime.request_seen``). DBOS records the step's outcome
after that; a step with a record is never run again. So a non-idempotent call runs at most
once, whichever worker replays the run.

**A tool call made without a step** (the usual case: a step costs DBOS two transactions)
keeps the same journal in the workflow itself, the journal entry standing for the step's
record (``agent_fsm.dbos.unstepped``).

Everything else is made as a step, whose record DBOS keeps, and a replay takes the same
path: a call whose step DBOS recorded (by its name, ``TOOL_STEP`` + tool + ``#`` + number) is
answered by that record; a replay that finds the entry started and unfinished (a crash
during the call), or not at all and the deadline passed, makes it as a step, which answers
"outcome unknown" or runs it (an idempotent tool; a call never started). The first
execution makes a step when a cancel request is pending, the deadline has passed, the
journal fails (its start or its read), the activation has no recorded start yet
(``RunTime.started_at``: its first step records it), or the journal cannot keep a first end;
and when its end cannot be recorded (twice), the call's answer is recorded by a step instead
("outcome unknown" for a tool that is not idempotent: its effect happened, the journal says
"started"). Calls take their steps in the order of their numbers (``RunTime.wait_turn``),
so that DBOS numbers them the same way on every execution.

**A journal that fails** (the connection dropped) is tried once more (the store connects
again). A replay that has run no step of its own yet reads a call's entry until the journal
answers (``unstepped._read_in_replay``): an earlier execution may have made the call without a step
and gone on, and a step made in its place would meet a later step's record. Otherwise the
call is made as a step, which answers as the journal will answer any later execution of it, so
that every execution agrees whichever one DBOS records: a look-up that fails may hide a call
an earlier execution started, so a non-idempotent call is answered "outcome unknown" (never
"not run"); a start that cannot be recorded is answered "not run" (the call was not made);
an end that cannot be recorded leaves the journal saying "started", so a non-idempotent call
is answered "outcome unknown" (never "failed": its effect happened). An idempotent call's
answer is its own: running it again is allowed.

The engine's own execution runs a *stand-in* for each tool (``stepped``): the same name,
schema, approval and flags, whose function is the call as above and whose own timeout and
retries are off (the call has the real ones). The stand-in returns the answer as a
``ToolResult``, which the engine takes as it is. Before a call, both paths pass the
execution's fence (``liveness.Admission.check``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from typing import Any

from agent_fsm.dbos.answers import Answered, call_of, cancelled, not_run, outcome_unknown, twice
from agent_fsm.dbos.replay import TOOL_STEP, RunTime, active
from agent_fsm.dbos.unstepped import Ran, ended, without_step
from agent_fsm.durable.journal import (
    CallStatus,
    FirstFinish,
    JournalEntry,
    NotStarted,
    ToolJournal,
    start_fresh,
)
from agent_fsm.failures import describe
from agent_fsm.limits import Limits
from agent_fsm.messages import ToolCall, ToolMessage, ToolStatus
from agent_fsm.tools.execution import execute
from agent_fsm.tools.results import ToolResult, error_result, skipped_result
from agent_fsm.tools.tool import PreparedCall, Tool

__all__ = ["Answered", "outcome_unknown", "stepped"]

STAND_IN_TIMEOUT_S = 10.0**9
"""The stand-in tool's own timeout: never reached (the call inside has the real one, and
the run's deadline), because a real-time timeout outside it would cancel it at a
different point of a replay."""


def stepped(tool: Tool, limits: Limits) -> Tool:
    """The stand-in the engine runs for ``tool``: its function makes the call, without a
    step or as one (see the module docstring). Control tools have no function, and are
    returned as they are."""
    if tool.fn is None:
        return tool

    async def stand_in(**values: Any) -> ToolResult:
        run = active()
        if run.cancelled is not None:  # an earlier step found the request: no call now
            return ToolResult(output=not_run(tool.name, run.cancelled), is_error=True)
        number = run.next_call()
        try:
            answered = await _answer(tool, values, limits, run, number)
        finally:
            run.turn_done(number)
        if answered.cut:
            run.cut()
        else:
            run.advance(answered.ended_at)
        if answered.cancelled is not None:
            run.cancelled = answered.cancelled
        run.saw_request(getattr(answered, "looked", False))
        result = answered.result
        return ToolResult(
            output=result.content,
            details=result.details,
            is_error=result.status is not ToolStatus.OK,
        )

    return dataclasses.replace(tool, fn=stand_in, timeout_s=STAND_IN_TIMEOUT_S, max_retries=0)


async def _answer(
    tool: Tool, values: dict[str, Any], limits: Limits, run: RunTime, number: int
) -> Answered:
    """Call ``number``'s answer: without a step when it can be, else from its step."""
    key = run.call_key(number)
    name = f"{TOOL_STEP}{tool.name}#{number}"
    ran: Ran | None = None
    if (
        run.started_at is not None
        and run.first_finish is not None
        and name not in await run.recorded_steps()
    ):
        outcome = await without_step(tool, values, limits, run, key, name)
        if isinstance(outcome, Answered):
            return outcome
        ran = outcome

    async def body() -> Answered:
        run.turn_done(number)  # DBOS has numbered this step: the next call may take one
        if ran is None:
            return await _run_call(tool, values, limits, run, key)
        result = ran.result
        if not tool.idempotent:  # the journal says "started": any later execution says this
            call = call_of(tool, key, values)
            why = f"it ran, but the journal could not record its end ({describe(ran.failure)})"
            result = outcome_unknown(call, why)
        return Answered(run.fleet_now(), result, ran.cut)

    await run.wait_turn(number)
    return await run.step(name, body)


def _look_up(
    run: RunTime, key: str, call: ToolCall, left: float
) -> tuple[JournalEntry | None, str | None, bool, Exception | None, Exception | None]:
    """A tool step's read before its call: its journal entry, a cancel request
    (``agent_fsm.dbos.cancelling``), whether the call was recorded as started (in the same
    round trip, when both are absent and ``left`` says the deadline has not come), the
    failure that left the entry unread, and the failure that refused the start. When the
    one round trip fails, the entry is read on its own: a journal that refuses writes must
    still tell "not run" (its start could not be recorded) from "may have run" (its entry
    could not be read). A start is a first start (``journal.start_fresh``): never recorded
    over another execution's, whose entry is answered instead."""
    if left > 0:
        try:
            entry, reason, started = twice(run.start_and_request, key, call)
        except Exception:  # told apart by the read below
            pass
        else:
            if entry is not None or reason is not None or started:
                return entry, reason, started, None, None
            try:  # a journal that cannot start a call in its read: the first start now
                entry = twice(start_fresh, run.journal, key, call)
            except NotStarted as exc:
                cause = exc.__cause__
                return None, None, False, None, cause if isinstance(cause, Exception) else exc
            except Exception as exc:  # whether another execution started it is not known
                return None, None, False, exc, None
            return entry, None, entry is None, None, None
    try:
        entry, reason = twice(run.entry_and_request, key)
    except Exception as exc:
        return None, None, False, exc, None
    return entry, reason, False, None, None


async def _run_call(
    tool: Tool, values: dict[str, Any], limits: Limits, run: RunTime, key: str
) -> Answered:
    """The body of a tool step: the journal around the call (see the module docstring).
    Must not raise for anything the journal does."""
    await run.admission.check()
    call = ToolCall(id=key, name=tool.name, arguments=json.dumps(values, default=str))
    journal = run.journal
    left = run.remaining_s()
    entry, reason, started, unread, refused = _look_up(run, key, call, left)
    # No call is made below unless said: the request just read is the latest (``looked``).
    if entry is not None and entry.status is CallStatus.FINISHED and entry.result is not None:
        found = ended(entry.result)[0]
        return Answered(run.fleet_now(), found, cancelled=reason, looked=True)
    if (entry is not None or unread is not None) and not tool.idempotent:
        if unread is not None:
            why = f"its journal could not be read ({describe(unread)}), so it may have run"
            return Answered(run.fleet_now(), outcome_unknown(call, why))
        result = _end_unknown(journal, key, outcome_unknown(call))
        return Answered(run.fleet_now(), result, cancelled=reason, looked=True)
    if reason is not None:  # cancelled from outside: the call never starts
        message = error_result(call, not_run(tool.name, reason), {"runtime": {"cancelled": True}})
        return Answered(run.fleet_now(), message, cancelled=reason, looked=True)
    if left <= 0:  # the deadline came first: the call never starts
        return Answered(run.fleet_now(), cancelled(call, tool), cut=True, looked=unread is None)
    if refused is None and not started:  # an idempotent call run again (found started, or
        refused = _restart(journal, key, call)  # maybe: unread)
    if refused is not None:
        return _not_recorded(call, refused, run, looked=unread is None)
    prepared = PreparedCall(call, tool, arguments=values, error=None, values=values)
    try:
        async with asyncio.timeout(left):
            result = (await execute(prepared, limits)).result
    except TimeoutError:  # execute never raises one of its own: it is the deadline's
        result, cut = cancelled(call, tool), True
    else:
        cut = False
    try:  # one round trip: the end recorded, and a cancel request made meanwhile read
        looked, reason = twice(run.finish_and_request, key, result)
    except Exception as exc:
        looked, reason = False, None  # the model call after it reads the request itself
        if not tool.idempotent:  # the journal says "started": any later execution says this
            why = f"it ran, but the journal could not record its end ({describe(exc)})"
            result = outcome_unknown(call, why)
    return Answered(run.fleet_now(), result, cut, cancelled=reason, looked=looked)


def _end_unknown(journal: ToolJournal, key: str, unknown: ToolMessage) -> ToolMessage:
    """Record ``unknown`` as the end of a call found started, so that a later execution
    answers the same; the end recorded first when the journal keeps one
    (``journal.FirstFinish``: the execution that started the call may have ended it since it
    was read), else ``unknown``. A journal that fails leaves it started: "outcome unknown"
    again."""
    with contextlib.suppress(Exception):
        if isinstance(journal, FirstFinish):
            entry = twice(journal.finish_first, key, unknown)
            if entry is not None and entry.result is not None:
                return ended(entry.result)[0]
        else:
            twice(journal.record_finished, key, unknown)
    return unknown


def _restart(journal: ToolJournal, key: str, call: ToolCall) -> Exception | None:
    """Record an idempotent call started again (its entry replaced); the failure if not."""
    try:
        twice(journal.record_started, key, call)
    except Exception as exc:
        return exc
    return None


def _not_recorded(
    call: ToolCall, why: BaseException, run: RunTime, *, looked: bool = True
) -> Answered:
    """The answer to a call not made because its start could not be recorded."""
    what = f"its start could not be recorded in the journal ({describe(why)})"
    return Answered(
        run.fleet_now(), skipped_result(call, f"{what}; nothing was done"), looked=looked
    )
