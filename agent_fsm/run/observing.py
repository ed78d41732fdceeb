"""OBSERVE: new input joins the transcript before the next model call."""

from __future__ import annotations

from collections.abc import Awaitable

from agent_fsm.messages import UserMessage
from agent_fsm.run.context import RunContext
from agent_fsm.run.guarding import screen_input
from agent_fsm.state import LoopState

__all__ = ["observe"]


def observe(ctx: RunContext) -> Awaitable[None] | None:
    """OBSERVE's work: every queued user message (input, steering, a resume's reply, approval
    outcomes, then the correction of an answer that did not validate) joins the transcript;
    when there is none and the last reply would have ended the run, one follow-up does. New
    words from the user change the situation, so repeats before them are no loop: the loop
    detector starts over. For an agent with input guardrails, the user's messages taken in
    are then checked (``run.guarding``), and the rows decide; without, nothing is awaited."""
    state = ctx.state
    guarded = ctx.config.input_guardrails
    before = len(state.messages) if guarded else 0
    ours = state.correction  # a correction is the engine's text, not the user's
    taken = bool(state.pending_input) or ours is not None
    while state.pending_input:
        ctx.append(UserMessage(content=state.pending_input.pop(0)))
    if ours is not None:  # a typed answer that did not validate (``correct``)
        ctx.append(UserMessage(content=ours))
        state.correction = None
    # A follow-up waits for a reply that would end the run: not a tool turn, not a summary.
    ended = not state.last_tool_calls and not state.summarised
    if not taken and state.follow_ups and state.turns and ended:
        ctx.append(UserMessage(content=state.follow_ups.pop(0)))
        taken = True
    if taken and state.turns:
        state.loop = LoopState()
    if not guarded or not taken:
        return None
    texts = [
        message.content
        for message in state.messages[before:]
        if isinstance(message, UserMessage) and message.content != ours
    ]
    return screen_input(ctx, texts) if texts else None
