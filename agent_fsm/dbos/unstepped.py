"""A DBOS run's tool call made without a step: the journal's entry stands for the step's
record (``agent_fsm.dbos.tool_calls`` says when a call is made so, and makes the others as
steps).

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

It reads the cancel request in the statement recording its end, where the journal offers
it (``journal.FirstFinishingLookup``): that read is recorded nowhere, so the model call
after it records what it found as its own read (``RunTime.hear``), and reads nothing
itself; a replay that answers the call from its entry made no such read, and its model call
(when nothing recorded its outcome) reads the request itself.

The journal's end is committed without waiting for the disk, as the outcome of the model
call after it is (``agent_fsm.dbos.model_calls``): on one PostgreSQL cluster (the journal
and DBOS's tables in one database, as the README's fleet has them) the next commit made with
a flush to disk (the next tool call's start, a step's record, the workflow's end) flushes
both before it, so no side effect follows an end that a crash of the server could lose.
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass
from typing import Any

from pydantic import JsonValue

from agent_fsm.dbos.answers import Answered, call_of, cancelled, twice
from agent_fsm.dbos.private import in_a_step
from agent_fsm.dbos.replay import RunTime
from agent_fsm.durable.journal import CallStatus, JournalEntry, ToolJournal
from agent_fsm.limits import Limits
from agent_fsm.messages import ToolMessage
from agent_fsm.tools.execution import execute
from agent_fsm.tools.tool import PreparedCall, Tool

__all__ = ["ENDED", "REPLAY_READ_RETRY_S", "Ran", "ended", "without_step"]

REPLAY_READ_RETRY_S = 1.0
"""How long a replay waits before reading again a journal entry it could not read."""

ENDED = "agent_fsm.dbos.ended"
"""The key, in the details of an answer recorded by a call made without a step, of when it
ended and whether the deadline cut it (``{"at": unix time, "cut": bool}``): taken off
before the engine sees the answer."""


@dataclass(frozen=True, slots=True)
class Ran:
    """A call made without a step whose end could not be recorded: what it answered."""

    result: ToolMessage
    cut: bool
    failure: Exception


async def without_step(
    tool: Tool, values: dict[str, Any], limits: Limits, run: RunTime, key: str, name: str
) -> Answered | Ran | None:
    """The call made without a step (see the module docstring): its answer; or what it
    answered when its end could not be recorded; or None, for a step to make it (nothing
    was started here). Read in the workflow: every answer it gives comes from the journal's
    entry, the same on every execution that finds it."""
    call = call_of(tool, key, values)
    journal = run.journal
    await run.admission.check()  # first: it may wait, and the deadline is read after it
    left = run.remaining_s()
    if left <= 0:  # no call starts now: only a recorded one is answered
        try:
            found = twice(journal.lookup, key)
        except Exception:
            if run.fresh:  # nothing after this point is recorded: the step finds out
                return None
            found = await _read_in_replay(run, journal, key)
        return _recorded(found)
    try:
        entry, _, started = twice(run.start_unstepped, key, call)
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
        result, cut = cancelled(call, tool), True
    else:
        cut = False
    ending = _with_end(result, run.fleet_now(), cut)
    try:  # one round trip: the end recorded, and a cancel request made meanwhile read
        entry, looked, reason = twice(run.finish_unstepped, key, ending)
    except Exception as exc:
        return Ran(result, cut, exc)
    answered = None if entry is None else _recorded(entry)
    if answered is None:  # ended first by a step of another execution (it found it started)
        return Ran(result, cut, RuntimeError("another execution recorded its end first"))
    if not looked:  # the model call after it reads the request itself
        return answered
    run.hear(reason)  # read live, after the call: the model call after it records it
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
            return twice(journal.lookup, key)
        except Exception:
            continue


def _with_end(result: ToolMessage, ended_at: float, cut: bool) -> ToolMessage:
    """``result`` as the journal keeps it: with when the call ended (``ENDED``)."""
    details: dict[str, JsonValue] = {ENDED: {"at": ended_at, "cut": cut}}
    if result.details is not None:
        details["answer"] = result.details
    return result.model_copy(update={"details": details})


def ended(result: ToolMessage) -> tuple[ToolMessage, float | None, bool]:
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
    result, ended_at, cut = ended(entry.result)
    if ended_at is None:
        return None
    return Answered(ended_at, result, cut)
