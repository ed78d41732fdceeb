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
of the answer's record; a model step reads it itself only when the latest call was not
followed by such a read (``replay.RunTime.request_seen``). DBOS records the step's outcome
after that; a step with a record is never run again. So a non-idempotent call runs at most
once, whichever worker replays the run.

**A tool call made without a step** (the usual case: a step costs DBOS two transactions)
keeps the same journal in the workflow itself, the journal entry standing for the step's
record:

1. its start is recorded under the call's key in one round trip that also reads the cancel
   request (``RunTime.start_unstepped``: committed with a flush to disk); only a start
   recorded there, with no request pending, is made without a step;
2. it runs the call, and records its end with the time it ended and whether the deadline cut
   it (``journal.FirstFinish``: an end recorded before is never overwritten, and is answered
   instead), so the run's clock reads the same on a replay: every value the workflow reads
   comes from a step's record or from this entry;
3. a replay (or a second execution at once) that finds that entry finished answers from it,
   with its recorded time, and makes no call.

The call runs in DBOS's step context (``private.in_a_step``), as it would in its step:
DBOS tells a step from its workflow by that context alone, so what a tool does with DBOS
is treated as inside a step (a ``@DBOS.step`` function it calls runs as a plain function;
``DBOS.sleep`` and starting a workflow are refused, as in a step) and takes no place among
the workflow's steps, which a replay answering the call from its entry would not take.

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
so that DBOS numbers them the same way on every execution. A call made without a step reads
the cancel request in the statement recording its end, where the journal offers it
(``journal.FirstFinishingLookup``): that read is recorded nowhere, so the model step after
it records what it found as its own read (``RunTime.hear``), and reads nothing itself; a
replay that answers the call from its entry made no such read, and its model step (when
DBOS holds no record of it) reads the request itself.

The journal's end is committed without waiting for the disk, as a step's record is after
it: on one PostgreSQL cluster (the journal and DBOS's tables in one database, as the
README's fleet has them) a later step's record, flushed to disk, flushes the end before it.

**A journal that fails** (the connection dropped) is tried once more (the store connects
again). A replay that has run no step of its own yet reads a call's entry until the journal
answers (``_read_in_replay``): an earlier execution may have made the call without a step
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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import JsonValue

from agent_fsm.dbos.private import in_a_step
from agent_fsm.dbos.replay import TOOL_STEP, RunTime, active
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
from agent_fsm.tools.execution import ABANDONED_NOTE, execute
from agent_fsm.tools.results import ToolResult, error_result, skipped_result
from agent_fsm.tools.tool import PreparedCall, Tool

__all__ = ["Answered", "outcome_unknown", "stepped"]

STAND_IN_TIMEOUT_S = 10.0**9
"""The stand-in tool's own timeout: never reached (the call inside has the real one, and
the run's deadline), because a real-time timeout outside it would cancel it at a
different point of a replay."""

REPLAY_READ_RETRY_S = 1.0
"""How long a replay waits before reading again a journal entry it could not read."""

ENDED = "agent_fsm.dbos.ended"
"""The key, in the details of an answer recorded by a call made without a step, of when it
ended and whether the deadline cut it (``{"at": unix time, "cut": bool}``): taken off
before the engine sees the answer."""


@dataclass(frozen=True, slots=True)
class Answered:
    """A tool step's outcome: the answer, and whether the deadline cut the call."""

    ended_at: float
    result: ToolMessage
    cut: bool = False
    cancelled: str | None = None
    """The reason of a cancel request the step found, before its call (the call was not
    made) or after it (its answer is the call's): the steps after it make no call."""
    looked: bool = False
    """Whether the step's latest read of the cancel request came after its call (or it made
    none): the model step after it then reads nothing itself (``RunTime.request_seen``).
    An outcome recorded by an earlier version has no such field: read with ``getattr``."""
    began_at: float | None = None
    """The activation's start, when this was its first step (``RunTime.step``)."""


def stepped(tool: Tool, limits: Limits) -> Tool:
    """The stand-in the engine runs for ``tool``: its function makes the call, without a
    step or as one (see the module docstring). Control tools have no function, and are
    returned as they are."""
    if tool.fn is None:
        return tool

    async def stand_in(**values: Any) -> ToolResult:
        run = active()
        if run.cancelled is not None:  # an earlier step found the request: no call now
            return ToolResult(output=_not_run(tool.name, run.cancelled), is_error=True)
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


@dataclass(frozen=True, slots=True)
class _Ran:
    """A call made without a step whose end could not be recorded: what it answered."""

    result: ToolMessage
    cut: bool
    failure: Exception


async def _answer(
    tool: Tool, values: dict[str, Any], limits: Limits, run: RunTime, number: int
) -> Answered:
    """Call ``number``'s answer: without a step when it can be, else from its step."""
    key = run.call_key(number)
    name = f"{TOOL_STEP}{tool.name}#{number}"
    ran: _Ran | None = None
    if (
        run.started_at is not None
        and run.first_finish is not None
        and name not in await run.recorded_steps()
    ):
        outcome = await _without_step(tool, values, limits, run, key, name)
        if isinstance(outcome, Answered):
            return outcome
        ran = outcome

    async def body() -> Answered:
        run.turn_done(number)  # DBOS has numbered this step: the next call may take one
        if ran is None:
            return await _run_call(tool, values, limits, run, key)
        result = ran.result
        if not tool.idempotent:  # the journal says "started": any later execution says this
            call = _call_of(tool, key, values)
            why = f"it ran, but the journal could not record its end ({describe(ran.failure)})"
            result = outcome_unknown(call, why)
        return Answered(run.fleet_now(), result, ran.cut)

    await run.wait_turn(number)
    return await run.step(name, body)


def _call_of(tool: Tool, key: str, values: dict[str, Any]) -> ToolCall:
    return ToolCall(id=key, name=tool.name, arguments=json.dumps(values, default=str))


async def _without_step(
    tool: Tool, values: dict[str, Any], limits: Limits, run: RunTime, key: str, name: str
) -> Answered | _Ran | None:
    """The call made without a step (see the module docstring): its answer; or what it
    answered when its end could not be recorded; or None, for a step to make it (nothing
    was started here). Read in the workflow: every answer it gives comes from the journal's
    entry, the same on every execution that finds it."""
    call = _call_of(tool, key, values)
    journal = run.journal
    await run.admission.check()  # first: it may wait, and the deadline is read after it
    left = run.remaining_s()
    if left <= 0:  # no call starts now: only a recorded one is answered
        try:
            found = _twice(journal.lookup, key)
        except Exception:
            if run.fresh:  # nothing after this point is recorded: the step finds out
                return None
            found = await _read_in_replay(run, journal, key)
        return _recorded(found)
    try:
        entry, _, started = _twice(run.start_unstepped, key, call)
    except Exception:  # refused, or unread
        if run.fresh:  # nothing after this point is recorded: the step finds out which
            return None
        found = await _read_in_replay(run, journal, key)
        return None if found is None else _recorded(found)
    if not started:  # found (answered if finished), or a cancel request, or refused
        return None if entry is None else _recorded(entry)
    prepared = PreparedCall(call, tool, arguments=values, error=None, values=values)
    try:
        async with asyncio.timeout(left):
            with in_a_step(name):  # what the tool does with DBOS, as inside its step
                result = (await execute(prepared, limits)).result
    except TimeoutError:  # execute never raises one of its own: it is the deadline's
        result, cut = _cancelled(call, tool), True
    else:
        cut = False
    ending = _with_end(result, run.fleet_now(), cut)
    try:  # one round trip: the end recorded, and a cancel request made meanwhile read
        entry, looked, reason = _twice(run.finish_unstepped, key, ending)
    except Exception as exc:
        return _Ran(result, cut, exc)
    answered = None if entry is None else _recorded(entry)
    if answered is None:  # ended first by a step of another execution (it found it started)
        return _Ran(result, cut, RuntimeError("another execution recorded its end first"))
    if not looked:  # the model step after it reads the request itself
        return answered
    run.hear(reason)  # read live, after the call: the model step after it records it
    return dataclasses.replace(answered, looked=True)


async def _read_in_replay(run: RunTime, journal: ToolJournal, key: str) -> JournalEntry | None:
    """The entry of ``key``, read by an execution that has not run a step of its own yet:
    DBOS may hold records of steps after this call, which an earlier execution took after
    making it without a step, so a step made here for want of its entry would meet one of
    them (and the run would fail on it). Read again until the journal answers (as DBOS waits
    for its own database), the execution's fence passed before each try. An entry found
    absent means no earlier execution started the call (nor went on past it): a step may
    make it."""
    while True:
        await asyncio.sleep(REPLAY_READ_RETRY_S)
        await run.admission.check()
        try:
            return _twice(journal.lookup, key)
        except Exception:
            continue


def _with_end(result: ToolMessage, ended_at: float, cut: bool) -> ToolMessage:
    """``result`` as the journal keeps it: with when the call ended (``ENDED``)."""
    details: dict[str, JsonValue] = {ENDED: {"at": ended_at, "cut": cut}}
    if result.details is not None:
        details["answer"] = result.details
    return result.model_copy(update={"details": details})


def _ended(result: ToolMessage) -> tuple[ToolMessage, float | None, bool]:
    """A recorded answer as the engine sees it, and the end recorded with it, if any."""
    details = result.details
    if not isinstance(details, dict):
        return result, None, False
    end = details.get(ENDED)
    if not isinstance(end, dict):
        return result, None, False
    at, cut = end.get("at"), end.get("cut")
    if not isinstance(at, int | float) or not isinstance(cut, bool):
        return result, None, False
    plain = result.model_copy(update={"details": details.get("answer")})
    return plain, float(at), cut


def _recorded(entry: JournalEntry | None) -> Answered | None:
    """The answer of a call made without a step, from its finished entry; None for an entry
    that is not one (none, started, or finished by a step: a step answers it)."""
    if entry is None or entry.status is not CallStatus.FINISHED or entry.result is None:
        return None
    result, ended_at, cut = _ended(entry.result)
    if ended_at is None:
        return None
    return Answered(ended_at, result, cut)


def outcome_unknown(call: ToolCall, why: str = "it started before an interruption") -> ToolMessage:
    """The answer to a non-idempotent call whose effect may have happened: worded as the
    engine's own journal words it (``tools.scheduling``), ``why`` saying what is known."""
    return error_result(
        call,
        f"The outcome of this call to '{call.name}' is unknown: {why}, and it is not re-run"
        " because the tool is not idempotent. Check its effect before calling it again.",
        {"runtime": {"outcome_unknown": True}},
    )


def _not_run(name: str, reason: str) -> str:
    """The answer to a call a cancel request stopped before it started."""
    return f"Tool '{name}' was not run: the run was cancelled before this call started ({reason})."


def _cancelled(call: ToolCall, tool: Tool) -> ToolMessage:
    """The answer to a call the deadline cut, worded as the engine words a call its stop
    cancels (``tools.scheduling``)."""
    message = f"Tool '{call.name}' was cancelled because the run was stopped."
    runtime: dict[str, Any] = {"cancelled": True}
    if not tool.is_async:
        message += ABANDONED_NOTE
        runtime["abandoned"] = True
    return error_result(call, message, {"runtime": runtime})


_T = TypeVar("_T")


def _twice(write: Callable[..., _T], *args: Any) -> _T:
    """A journal call, made once more if it raises (a dropped connection is made again)."""
    try:
        return write(*args)
    except Exception:
        return write(*args)


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
            entry, reason, started = _twice(run.start_and_request, key, call)
        except Exception:  # told apart by the read below
            pass
        else:
            if entry is not None or reason is not None or started:
                return entry, reason, started, None, None
            try:  # a journal that cannot start a call in its read: the first start now
                entry = _twice(start_fresh, run.journal, key, call)
            except NotStarted as exc:
                cause = exc.__cause__
                return None, None, False, None, cause if isinstance(cause, Exception) else exc
            except Exception as exc:  # whether another execution started it is not known
                return None, None, False, exc, None
            return entry, None, entry is None, None, None
    try:
        entry, reason = _twice(run.entry_and_request, key)
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
        found = _ended(entry.result)[0]
        return Answered(run.fleet_now(), found, cancelled=reason, looked=True)
    if (entry is not None or unread is not None) and not tool.idempotent:
        if unread is not None:
            why = f"its journal could not be read ({describe(unread)}), so it may have run"
            return Answered(run.fleet_now(), outcome_unknown(call, why))
        result = _end_unknown(journal, key, outcome_unknown(call))
        return Answered(run.fleet_now(), result, cancelled=reason, looked=True)
    if reason is not None:  # cancelled from outside: the call never starts
        message = error_result(call, _not_run(tool.name, reason), {"runtime": {"cancelled": True}})
        return Answered(run.fleet_now(), message, cancelled=reason, looked=True)
    if left <= 0:  # the deadline came first: the call never starts
        return Answered(run.fleet_now(), _cancelled(call, tool), cut=True, looked=unread is None)
    if refused is None and not started:  # an idempotent call run again (found started, or
        refused = _restart(journal, key, call)  # maybe: unread)
    if refused is not None:
        return _not_recorded(call, refused, run, looked=unread is None)
    prepared = PreparedCall(call, tool, arguments=values, error=None, values=values)
    try:
        async with asyncio.timeout(left):
            result = (await execute(prepared, limits)).result
    except TimeoutError:  # execute never raises one of its own: it is the deadline's
        result, cut = _cancelled(call, tool), True
    else:
        cut = False
    try:  # one round trip: the end recorded, and a cancel request made meanwhile read
        looked, reason = _twice(run.finish_and_request, key, result)
    except Exception as exc:
        looked, reason = False, None  # the model step after it reads the request itself
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
            entry = _twice(journal.finish_first, key, unknown)
            if entry is not None and entry.result is not None:
                return _ended(entry.result)[0]
        else:
            _twice(journal.record_finished, key, unknown)
    return unknown


def _restart(journal: ToolJournal, key: str, call: ToolCall) -> Exception | None:
    """Record an idempotent call started again (its entry replaced); the failure if not."""
    try:
        _twice(journal.record_started, key, call)
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
