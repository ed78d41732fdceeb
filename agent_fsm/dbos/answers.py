"""What a DBOS run's tool call answers, on either path (``agent_fsm.dbos.tool_calls``, made
as a step; ``agent_fsm.dbos.unstepped``, without one): the outcome a step records
(``Answered``), the answers the run words itself (outcome unknown, not run, cut by the
deadline), and the journal calls both paths make, each tried once more when it fails.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from agent_fsm.messages import ToolCall, ToolMessage
from agent_fsm.tools.execution import ABANDONED_NOTE
from agent_fsm.tools.results import NOT_RERUN, error_result, outcome_unknown_answer
from agent_fsm.tools.tool import Tool

__all__ = ["Answered", "call_of", "cancelled", "not_run", "outcome_unknown", "twice"]


@dataclass(frozen=True, slots=True)
class Answered:
    """A tool step's outcome: the answer, and whether the deadline cut the call.

    DBOS pickles it into the step's record, by module and name: it keeps the module it was
    first defined in (``agent_fsm.dbos.tool_calls``, which imports it), so that records
    written by releases of one replay format read the same in any of them."""

    ended_at: float
    result: ToolMessage
    cut: bool = False
    cancelled: str | None = None
    """The reason of a cancel request the step found, before its call (the call was not
    made) or after it (its answer is the call's): the steps after it make no call."""
    looked: bool = False
    """Whether the step's latest read of the cancel request came after its call (or it made
    none): the model call after it then reads nothing itself (``RunTime.request_seen``).
    An outcome recorded by an earlier version has no such field: read with ``getattr``."""
    began_at: float | None = None
    """The activation's start, when this was its first step (``RunTime.step``)."""


Answered.__module__ = "agent_fsm.dbos.tool_calls"  # set after: the decorator reads its own


def call_of(tool: Tool, key: str, values: dict[str, Any]) -> ToolCall:
    """The call as the journal records it: keyed by its journal key, its arguments as JSON."""
    return ToolCall(id=key, name=tool.name, arguments=json.dumps(values, default=str))


def outcome_unknown(call: ToolCall, why: str = "it started before an interruption") -> ToolMessage:
    """The answer to a non-idempotent call whose effect may have happened, in the engine's
    own wording (``tools.results.outcome_unknown_answer``), ``why`` saying what is known."""
    return outcome_unknown_answer(call, f"{why}, and it {NOT_RERUN}")


def not_run(name: str, reason: str) -> str:
    """The answer to a call a cancel request stopped before it started."""
    return f"Tool '{name}' was not run: the run was cancelled before this call started ({reason})."


def cancelled(call: ToolCall, tool: Tool) -> ToolMessage:
    """The answer to a call the deadline cut, worded as the engine words a call its stop
    cancels (``tools.scheduling``)."""
    message = f"Tool '{call.name}' was cancelled because the run was stopped."
    runtime: dict[str, Any] = {"cancelled": True}
    if not tool.is_async:
        message += ABANDONED_NOTE
        runtime["abandoned"] = True
    return error_result(call, message, {"runtime": runtime})


_T = TypeVar("_T")


def twice(write: Callable[..., _T], *args: Any) -> _T:
    """A journal call, made once more if it raises (a dropped connection is made again)."""
    try:
        return write(*args)
    except Exception:
        return write(*args)
