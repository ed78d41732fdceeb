"""A fork: a new run that starts where a stored run stood after one of its transitions.

``fork_state`` builds the new run's state from the stored one: the transcript as it was
after transition ``at`` (before the work of the state it entered), the trace up to it, the
turns made by then, and the usage of those turns (the stored total in proportion, marked
estimated: a checkpoint keeps no usage per turn). The fork is then reopened like a run
whose process died at that point (the table's ``restart`` rows): the state it entered does
its work again, and ``copy_journal`` gives the fork the stored run's journal entries for
the calls in its transcript, so a call that ran in the stored run is answered from the
journal, never run again. Its turns count on from the stored run's, so ``max_turns`` and
the termination bound hold over the path from the stored run's start through the fork.

Turn ``t``'s reply is the ``t``-th model reply of the transcript (the journal's keys name
calls by the turn of their reply).
"""

from __future__ import annotations

from collections.abc import Sequence

from agent_fsm.durable.journal import CallStatus, ToolJournal, journal_key, settle
from agent_fsm.errors import ConfigError
from agent_fsm.messages import AssistantMessage, Message, ToolMessage, Usage, UserMessage
from agent_fsm.state import RunState
from agent_fsm.table import TERMINAL_STATES, Row
from agent_fsm.tokens import TextCounter, estimate_message_tokens

__all__ = ["copy_journal", "fork_state"]


def _cut(messages: Sequence[Message], dest: str, turn: int) -> tuple[int, list[str | UserMessage]]:
    """Where the transcript stood when the run entered ``dest`` on turn ``turn``, and the
    user messages it had taken in but not yet observed (entering OBSERVE)."""
    replies = [i for i, m in enumerate(messages) if isinstance(m, AssistantMessage)]
    if turn < 1 or not replies:
        first = replies[0] if replies else len(messages)
        return first, []
    at = replies[min(turn, len(replies)) - 1]
    if dest == "ACT":  # the reply is in, its calls not yet answered
        return at + 1, []
    end = at + 1
    while end < len(messages) and isinstance(messages[end], ToolMessage):
        end += 1
    if dest == "OBSERVE":  # what OBSERVE takes in is still waiting
        following = replies[turn] if turn < len(replies) else len(messages)
        waiting: list[str | UserMessage] = [
            (m if m.parts else m.content)
            for m in messages[end:following]
            if isinstance(m, UserMessage)
        ]
        return end, waiting
    following = replies[turn] if turn < len(replies) else len(messages)
    return following, []


def fork_state(
    stored: RunState, rows: Sequence[Row], at: int, run_id: str, count: TextCounter
) -> RunState:
    """The state of a fork of ``stored`` after its transition ``at`` (1-based).

    Raises:
        ConfigError: ``at`` is not a transition of the run, or one that ended it (a stop
            is resumed, not forked).
    """
    if isinstance(at, bool) or not isinstance(at, int) or not 1 <= at <= len(stored.trace):
        raise ConfigError(
            f"run {stored.run_id} has transitions 1 to {len(stored.trace)}: fork at one of "
            f"them, not {at!r}"
        )
    index, turn = stored.trace[at - 1]
    dest = str(rows[index].dest)
    if dest in TERMINAL_STATES:
        raise ConfigError(
            f"transition {at} of run {stored.run_id} ended it ({rows[index].label}): fork at "
            "an earlier one, or resume the run"
        )
    cut, waiting = _cut(stored.messages, dest, turn)
    messages = list(stored.messages[:cut])
    usage = stored.usage
    if stored.turns and turn < stored.turns:
        share = turn / stored.turns
        usage = Usage(
            input_tokens=round(usage.input_tokens * share),
            output_tokens=round(usage.output_tokens * share),
            requests=turn,
            estimated=True,
        )
    return RunState(
        run_id=run_id,
        state=rows[index].dest,
        messages=messages,
        pending_input=waiting,
        turns=turn,
        usage=usage,
        prompt_tokens_estimate=sum(estimate_message_tokens(m, count) for m in messages),
        tools_tokens_estimate=stored.tools_tokens_estimate,
        trace=list(stored.trace[:at]),
        notes=dict(stored.notes),
    )


def copy_journal(source: ToolJournal, target: ToolJournal, messages: Sequence[Message]) -> int:
    """Copy into ``target`` what ``source`` recorded of the calls of ``messages``' replies:
    a finished call with its answer, a call cut short as started (so the fork re-runs it
    only if its tool is idempotent, as a restarted run would). Returns how many."""
    copied = 0
    replies = (m for m in messages if isinstance(m, AssistantMessage))
    for turn, reply in enumerate(replies, start=1):
        for position, call in enumerate(reply.tool_calls):
            key = journal_key(turn, position, call.id)
            entry = source.lookup(key)
            if entry is None:
                continue
            target.record_started(key, entry.call)
            if entry.status is CallStatus.FINISHED and entry.result is not None:
                target.record_finished(key, entry.result)
            copied += 1
    settle(target)  # durable now, whenever and wherever the fork is run
    return copied
