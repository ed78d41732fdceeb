"""OBSERVE: new input joins the transcript before the next model call."""

from __future__ import annotations

from collections.abc import Awaitable

from agent_fsm.content import TextPart
from agent_fsm.messages import UserMessage
from agent_fsm.run.context import RunContext
from agent_fsm.run.guarding import screen_input
from agent_fsm.state import LoopState
from agent_fsm.table import Verb

__all__ = ["NUDGE", "WITHHELD", "climb", "observe", "observe_guarded"]

NUDGE = (
    "You seem to be repeating yourself ({loop}). Repeating will not change the result: try "
    "a different approach, or answer with what you have."
)
"""The loop ladder's nudge (``Limits.loop_ladder``); ``{loop}`` says what repeats."""

WITHHELD = (
    "You kept repeating yourself ({loop}). The tool {tools} is no longer available in this "
    "run: go on without it."
)
"""The message that goes with the second rung, when a tool is withheld."""


def climb(ctx: RunContext) -> None:
    """Take the loop ladder's rung the run just passed, if it did (``Verb.NUDGE`` or
    ``Verb.WITHHOLD`` rows into OBSERVE): the message to the model, the tool withheld (the
    one the loop repeats most), and a fresh loop detector, which must find a new loop for
    the next rung."""
    row = ctx.entering_row()
    if row is None or row.outcome not in (Verb.NUDGE, Verb.WITHHOLD):
        return
    state = ctx.state
    loop = state.loop.detected or "a loop"
    if row.outcome is Verb.NUDGE:
        state.loop_rung = 1
        ctx.append(UserMessage(content=NUDGE.format(loop=loop)))
    else:
        state.loop_rung = 2
        streaks = state.loop.call_streaks
        name = max(streaks, key=streaks.__getitem__).partition(":")[0] if streaks else None
        if name is not None and name not in state.withheld:
            state.withheld = (*state.withheld, name)
            ctx.append(UserMessage(content=WITHHELD.format(loop=loop, tools=name)))
        else:  # a loop of text, or of a tool already withheld: a second nudge
            ctx.append(UserMessage(content=NUDGE.format(loop=loop)))
    state.loop = LoopState()


def observe(ctx: RunContext) -> None:
    """OBSERVE's work: every queued user message (input, steering, a resume's reply, approval
    outcomes, then the correction of an answer that did not validate) joins the transcript;
    when there is none and the last reply would have ended the run, one follow-up does. New
    words from the user change the situation, so repeats before them are no loop: the loop
    detector starts over."""
    state = ctx.state
    taken = bool(state.pending_input) or state.correction is not None
    while state.pending_input:
        waiting = state.pending_input.pop(0)
        ctx.append(waiting if isinstance(waiting, UserMessage) else UserMessage(content=waiting))
    if state.correction is not None:  # a typed answer that did not validate (``correct``)
        ctx.append(UserMessage(content=state.correction))
        state.correction = None
    # A follow-up waits for a reply that would end the run: not a tool turn, not a summary.
    ended = not state.last_tool_calls and not state.summarised
    if not taken and state.follow_ups and state.turns and ended:
        ctx.append(UserMessage(content=state.follow_ups.pop(0)))
        taken = True
    if taken and state.turns:
        state.loop = LoopState()


def observe_guarded(ctx: RunContext) -> Awaitable[None] | None:
    """OBSERVE's work (``observe``) for an agent on the loop ladder or with input
    guardrails (the engine picks it for such an agent only): first the rung of the ladder
    the run just passed (``climb``), then the input, then the input guardrails' check of
    each user message taken in (``run.guarding``); the rows decide."""
    state = ctx.state
    if ctx.limits.loop_ladder:
        climb(ctx)
    before = len(state.messages)
    ours = state.correction  # a correction is the engine's text, not the user's
    observe(ctx)
    if not ctx.config.input_guardrails:
        return None
    texts = [
        _text_of(message)
        for message in state.messages[before:]
        if isinstance(message, UserMessage) and message.content != ours
    ]
    return screen_input(ctx, texts) if texts else None


def _text_of(message: UserMessage) -> str:
    """All the text of a user message, its text parts included: a guardrail screens every
    word the model will read (images and files are not text; a guardrail of your own can
    read them from the transcript)."""
    if not message.parts:
        return message.content
    texts = [message.content, *(part.text for part in message.parts if isinstance(part, TextPart))]
    return "\n".join(text for text in texts if text)
