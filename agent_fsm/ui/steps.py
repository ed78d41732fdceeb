"""One stored run, step by step: what the run page shows for the transition chosen.

A checkpoint keeps the transcript and, for each transition, the row taken and the turn
(``RunState.trace``), not a snapshot per step; the step-through is derived from them. Turn
``t``'s reply is the ``t``-th model reply of the transcript, its prompt the messages before
it, and its tool results the answers to its calls once the run has been through ACT in that
turn. What a checkpoint does not keep is per-step usage: the step shows the run's total,
and the model calls made as of the step (its turn).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from agent_fsm.messages import AssistantMessage, Message, ToolMessage
from agent_fsm.state import RunState, TraceEntry
from agent_fsm.table import Row

__all__ = ["Step", "replies", "step_at", "trace_of"]


@dataclass(frozen=True, slots=True)
class Step:
    """What the run looked like as of one transition."""

    number: int
    """1-based position in the trace."""
    entry: TraceEntry
    row: int
    """The row's index in the table."""
    prompt: tuple[Message, ...]
    """The transcript sent with the turn's model call (empty before the first)."""
    reply: AssistantMessage | None
    results: tuple[ToolMessage, ...]
    """The answers to the reply's calls, once ACT has run them."""
    model_calls: int
    """Turns made as of this step."""


def trace_of(state: RunState, rows: Sequence[Row]) -> list[TraceEntry]:
    """The run's transitions, each read from its row."""
    return [TraceEntry.from_row(rows[index], turn) for index, turn in state.trace]


def replies(messages: Sequence[Message]) -> list[int]:
    """The positions of the model's replies in ``messages``, in order."""
    return [i for i, message in enumerate(messages) if isinstance(message, AssistantMessage)]


def step_at(state: RunState, rows: Sequence[Row], number: int) -> Step:
    """Step ``number`` (1-based, clamped to the trace) of ``state``.

    Raises:
        ValueError: the run has taken no transition.
    """
    if not state.trace:
        raise ValueError(f"run {state.run_id} has taken no transition")
    number = min(max(number, 1), len(state.trace))
    index, turn = state.trace[number - 1]
    entry = TraceEntry.from_row(rows[index], turn)
    positions = replies(state.messages)
    if turn < 1 or turn > len(positions):
        first = positions[0] if positions else len(state.messages)
        return Step(number, entry, index, tuple(state.messages[:first]), None, (), turn)
    at = positions[turn - 1]
    reply = state.messages[at]
    assert isinstance(reply, AssistantMessage)
    acted = (
        any(str(rows[i].source) == "ACT" and t == turn for i, t in state.trace[: number - 1])
        or str(entry.source) == "ACT"
    )
    results: tuple[ToolMessage, ...] = ()
    if acted and reply.tool_calls:
        ids = {call.id for call in reply.tool_calls}
        end = positions[turn] if turn < len(positions) else len(state.messages)
        results = tuple(
            m
            for m in state.messages[at + 1 : end]
            if isinstance(m, ToolMessage) and m.tool_call_id in ids
        )
    return Step(number, entry, index, tuple(state.messages[:at]), reply, results, turn)
