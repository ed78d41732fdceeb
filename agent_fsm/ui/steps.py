"""One stored run, step by step: what the run page shows for the transition chosen.

A checkpoint keeps the transcript and, for each transition, the row taken and the turn
(``RunState.trace``), not a snapshot per step; the step-through is derived from them. Turn
``t``'s reply is the ``t``-th model reply of the transcript, its prompt the messages before
it, and its tool results the answers to its calls once the run has been through ACT in that
turn. A stored run's replies carry their model call's usage (``AssistantMessage.usage``):
a step shows the usage as of it (the replies' up to its turn) and its own (the reply it
took in, if it is the step right after a model call). A reply without usage (a checkpoint
from before it was recorded, or a transcript whose replies were compacted away) leaves the
step's usage unknown, and the page shows the run's total.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from agent_fsm.messages import AssistantMessage, Message, ToolMessage, Usage
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
    usage: Usage | None = None
    """The usage of the model calls as of this step: the sum of the replies' up to its
    turn; None when a reply keeps none (or the transcript lost one to compaction)."""
    own_usage: Usage | None = None
    """The usage of the model call this step took in (the first step of a turn follows its
    model call); None for a step that took in none, or a reply that keeps none."""


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
    usage, own = _usages(state, positions, number, turn)
    if turn < 1 or turn > len(positions):
        first = positions[0] if positions else len(state.messages)
        prompt = tuple(state.messages[:first])
        return Step(number, entry, index, prompt, None, (), turn, usage, own)
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
    prompt = tuple(state.messages[:at])
    return Step(number, entry, index, prompt, reply, results, turn, usage, own)


def _usages(
    state: RunState, positions: list[int], number: int, turn: int
) -> tuple[Usage | None, Usage | None]:
    """The usage as of step ``number`` (of turn ``turn``) and the step's own."""
    if turn > len(positions):
        return None, None
    total = Usage()
    for at in positions[:turn]:
        reply = state.messages[at]
        assert isinstance(reply, AssistantMessage)
        if reply.usage is None:
            return None, None
        total = total + reply.usage
    first_of_turn = next(n for n, (_, t) in enumerate(state.trace, start=1) if t == turn)
    if turn < 1 or number != first_of_turn:
        return total, None
    reply = state.messages[positions[turn - 1]]
    assert isinstance(reply, AssistantMessage)
    return total, reply.usage
