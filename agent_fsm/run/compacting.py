"""COMPACT: the prompt does not fit the context window, so the context policies shrink it.

``compact(ctx)`` is the COMPACT state's work: each policy in turn (``agent_fsm.compaction``)
until the prompt fits in ``Limits.compact_to`` of the room the window leaves it (headroom, so
the next turns need not compact again); only a prompt that still exceeds the room itself
stops the run. Edits a policy returns are checked (``ContextEdits.check``) before they
apply; a policy that raises or returns something unusable is skipped and reported. A policy
may instead ask for a summary: the COMPACT rows then take the run into SUMMARISE, whose model
call writes it (``take_summary``), and back to OBSERVE, which checks the shrunk prompt again.

A limit that ends the run with a last answer whose prompt does not fit enters COMPACT too
(a row guarded by ``table.LAST_ANSWER_WINDOW_GUARD``): the work then records the stop it
compacts for (``RunState.closing``), asks no summary (there is no call to spare for one), and
the ``last_answer_due`` row takes the run on into LAST_ANSWER.
"""

from __future__ import annotations

from agent_fsm.compaction import Context
from agent_fsm.events import ContextCompacted
from agent_fsm.failures import describe, is_own_failure
from agent_fsm.messages import Message, SystemMessage, TranscriptView, UserMessage
from agent_fsm.prompt import ContextEdits, SummaryDue
from agent_fsm.run.context import RunContext
from agent_fsm.state import calibrated_prompt_tokens
from agent_fsm.table import softened_stop
from agent_fsm.tokens import estimate_message_tokens

__all__ = ["compact", "policy_context", "summary_messages", "take_summary"]


def policy_context(
    ctx: RunContext, edits: ContextEdits | None = None, *, share: float | None = None
) -> Context:
    """What the policies see of this run: the transcript, its edits, and the tokens the
    prompt's messages may take, all calibrated: ``share`` (``Limits.compact_to`` when None)
    of the room the window leaves for the prompt once the reply is kept, less the tools."""
    state, config, limits = ctx.state, ctx.config, ctx.limits
    if share is None:
        share = limits.compact_to
    calibration = state.calibration
    count_text = config.count_tokens

    def count(message: Message) -> int:
        return calibration.content(estimate_message_tokens(message, count_text))

    # The server's fixed cost of a request is spent whatever the messages: room for none.
    room = (limits.context_window or 0) - limits.reply_tokens - calibration.fixed
    tools = calibration.content(state.tools_tokens_estimate)
    return Context(
        messages=TranscriptView(state.messages),  # read-only: a policy cannot change the run
        edits=state.context if edits is None else edits,
        budget=int(room * share) - tools,
        count=count,
    )


def compact(ctx: RunContext) -> None:
    """COMPACT's work: the policies shrink the prompt, or one asks for a summary (not for a
    last answer's prompt: a policy that asks then is passed over, and reported)."""
    state = ctx.state
    _note_closing(ctx)
    summaries = state.closing is None
    state.summary_due = None
    state.context_problem = None
    before = calibrated_prompt_tokens(state)
    context = policy_context(ctx)
    applied: list[str] = []
    problems: list[str] = []
    due: SummaryDue | None = None
    for index, policy in enumerate(ctx.config.context_policies):
        if context.fits():
            break
        name = _name(policy)
        try:
            change = policy.shrink(context)
        except BaseException as exc:
            if not is_own_failure(exc):
                raise
            problems.append(f"{name} failed: {describe(exc)}")
            continue
        if change is None:
            continue
        if isinstance(change, SummaryDue) and not summaries:
            problems.append(f"{name} asked for a summary, which there is no call left for")
            continue
        if isinstance(change, SummaryDue):
            due = change.model_copy(update={"policy": index})
            applied.append(name)
            break
        if not isinstance(change, ContextEdits):
            problems.append(
                f"{name} returned {type(change).__name__}, not ContextEdits, a SummaryDue or None"
            )
            continue
        why = change.check(state.messages, context.edits)
        if why is not None:
            problems.append(f"{name} returned edits refused because {why}")
            continue
        context = policy_context(ctx, change)
        applied.append(name)
    if context.edits != state.context:
        ctx.edit_context(context.edits)
    state.summary_due = due
    if due is None and not policy_context(ctx, context.edits, share=1.0).fits():
        state.context_problem = "; ".join(problems) or (
            "no context policy could shrink it"
            if ctx.config.context_policies
            else "the agent has no context policy (Agent(context_policy=...))"
        )
    _announce(ctx, before, applied, problems, summary_requested=due is not None)


def _note_closing(ctx: RunContext) -> None:
    """Entered to shrink a last answer's prompt (a row that softens a stop): record that
    stop (``RunState.closing``), which the ``last_answer_due`` row and LAST_ANSWER read."""
    entered_by = ctx.entering_index()
    if entered_by is not None:
        closing = softened_stop(ctx.config.machine.rows, entered_by)
        if closing is not None:
            ctx.state.closing = closing


def take_summary(ctx: RunContext, summary: str) -> None:
    """The summary a policy asked for was written: send it in place of the messages before
    the cut, from the next call on."""
    state = ctx.state
    due = state.summary_due
    assert due is not None  # only a summary call gets here
    before = calibrated_prompt_tokens(state)
    edits = state.context.cut(state.messages, due.through).model_copy(update={"summary": summary})
    ctx.edit_context(edits)
    state.summary_due = None
    state.summarised = True
    _announce(ctx, before, [f"summary by {_name(ctx.config.context_policies[due.policy])}"], [])


def summary_messages(due: SummaryDue) -> list[Message]:
    """The prompt of the call that writes ``due``."""
    return [SystemMessage(content=due.instructions), UserMessage(content=due.text)]


def _name(policy: object) -> str:
    try:
        name = policy.name  # type: ignore[attr-defined]
    except Exception:
        return type(policy).__name__
    return name if isinstance(name, str) else type(policy).__name__


def _announce(
    ctx: RunContext,
    before: int,
    applied: list[str],
    problems: list[str],
    *,
    summary_requested: bool = False,
) -> None:
    state = ctx.state
    emit = ctx.bus.emitter
    if emit is not None:
        emit(
            ContextCompacted(
                run_id=state.run_id,
                turn=state.turns,
                policies=tuple(applied),
                tokens_before=before,
                tokens_after=calibrated_prompt_tokens(state),
                sent_from=state.context.start,
                cleared=len(state.context.cleared),
                summary=state.context.summary if state.summarised else None,
                summary_requested=summary_requested,
                problems=tuple(problems),
            )
        )
    ctx.log.info("context_compacted", policies=applied, problems=problems)
