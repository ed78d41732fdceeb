"""Sub-agents: an agent run as a tool of another, within what its parent has left.

``Agent.as_tool`` makes a ``Tool`` whose call runs the child agent on the task the model gave
it. The promises of a run hold for the whole tree:

- **A child never outlives or outspends its parent.** Its limits are carved when the call
  starts (``carve``): each budget is the smaller of its own and what remains of the
  parent's: turns (model calls that are not retries, its last answer included), retries,
  tokens, money and time. What the child spent is added to the parent's counts when the
  step ends (``run.parenting.fold``: the turn count keys the tool journal, so it does not move
  while the step's calls run): its turns and last answer to the parent's turns (at least
  one: a child call that made no model call still uses a turn, so ``max_turns`` bounds how
  many a run makes), its retries, usage and cost to the parent's. The parent's own guards
  then see the tree's spend, so ``max_turns``, the token budget and the money budget bound
  the tree as they bound one run, and the parent's ``bound.model_calls`` bounds every model
  call of it. A sub-agent tool runs alone (``Tool.sequential``): the next child of the same
  reply is carved from what the previous ones left. A step redone after a crash answers a
  finished child's call from the journal, and counts its spend again from the answer's
  details (``run.parenting.fold_replayed``).
- **Cascades.** The parent's abort or deadline cancels the tool call; the child is then
  aborted (ERROR ``aborted``, a valid transcript) before the call is answered, and what it
  spent is still counted.
- **A child's failure is a tool result**: answered as an error, with the child's stop reason,
  status, run id, turns, usage and cost in ``details`` (never shown to the model).
- **Handoffs** (``Agent.as_handoff``): the child takes the conversation over (the parent's
  transcript, its own system prompt first) and its answer ends the parent's run: the tool
  is terminal, so the ``terminal_tool`` row ends the run with it; a child that fails
  answers the call as an error, and the parent goes on.
- **Events**: while the parent's run has listeners, the child's events are delivered to them
  too (each carries the child's ``run_id``; ``SubAgentStarted`` links it to the parent's call).

The tool finds its parent through a context variable that ACT sets (``PARENT_RUN``), only
for an agent that has sub-agent tools (``RunConfig.delegates``), so an agent without them
pays one attribute check per ACT. Called outside a run, a child runs with its own limits.

**Durable nesting.** A parent's call starts the child under ``child_run_id(parent run id,
turn, call id)``, its ``RunState.parent`` linking it back, in the parent's store when the
parent has one (``_home``). The tool is marked idempotent: a parent redoing the step after a
crash calls it again, and the call finds its child and goes on with it from its checkpoint
(``go_on``), whose own journal answers the calls it made; a child that had stopped is not
run again, its result taken as it is.
**A child that waits for the user pauses the tree.** Its call is answered "waits for the
user" (``details["awaiting_sub_agent"]`` holds its request); ACT makes of it a request of
the parent's turn (``run.parenting.pause_request``) and the ``sub_agent_paused`` row stops the
parent, showing what the child asks. Resumed with the answer, the parent's ACT passes it down
(``carry_out_child``) and goes on with the child within what the parent has left
(``carve`` with what was ``counted``).
**A pause nobody will answer is settled.** A parent that stops for another reason than its
child's pause (a higher-ranked row: an abort, a terminal tool, its own question or
approvals...), or that cannot go on with the child it was answered for, ends the child
(``settle``: reopened with a refusal and aborted, by its own rows, its own waiting child
settled in turn), and its model is told in the next user message, should it go on; the
call's answer only ever said the run waits unless it stops first. A child started or
reopened while its parent's stop is set is aborted before it takes a step.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import JsonValue

from agent_fsm.durable.journal import ToolJournal, start_fresh
from agent_fsm.errors import CheckpointError, ConfigError, ResumeError, RunLeased
from agent_fsm.events import SubAgentStarted
from agent_fsm.loop.verify import TerminationBound
from agent_fsm.messages import AssistantMessage, Message, ToolCall, Usage
from agent_fsm.output import typed_result
from agent_fsm.run.carving import LimitsLeft, carve, carved_config
from agent_fsm.run.context import PARENT_RUN, RunConfig, RunContext
from agent_fsm.run.engine import Run, new_run_state
from agent_fsm.run.history import prepare_history
from agent_fsm.run.identity import claim, keep_approvals
from agent_fsm.run.residence import InProcess, Residence, RunKeeper
from agent_fsm.run.resuming import Decisions, reopen
from agent_fsm.run.stored import Leased, Stored
from agent_fsm.state import (
    ControlKind,
    Decision,
    ParentLink,
    RunResult,
    RunState,
    RunStatus,
    SubAgentPause,
)
from agent_fsm.table import TERMINAL_STATES, StopReason
from agent_fsm.tools.tool import Tool, ToolResult

__all__ = [
    "Delegable",
    "Delegate",
    "LimitsLeft",
    "carve",
    "delegate_of",
    "delegation_tool",
    "run_child",
]

HANDOFF_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "note": {
            "type": "string",
            "description": "What the next agent should know, beyond the conversation.",
        }
    },
    "additionalProperties": False,
}

HANDOFF_INPUT = "(handed over by the previous agent) {note}"
"""The user message a handoff's child starts with, after the conversation."""

TASK_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "task": {"type": "string", "description": "What the sub-agent should do, in full."}
    },
    "required": ["task"],
    "additionalProperties": False,
}


class Delegable(Protocol):
    """What a sub-agent tool needs of its agent (an ``Agent``)."""

    @property
    def run_config(self) -> RunConfig: ...
    @property
    def residence(self) -> Residence: ...
    @property
    def system_prompt(self) -> str: ...
    @property
    def bound(self) -> TerminationBound: ...


@dataclass(frozen=True, slots=True, eq=False)
class Delegate:
    """The child agent of a sub-agent tool, and the tool's name."""

    agent: Delegable
    name: str
    handoff: bool = False
    """The child takes the conversation over (``Agent.as_handoff``), rather than a task."""
    observer: Callable[[RunResult, RunConfig], None] | None = None
    """Told of each child run that ended, with the configuration it ran under (its carved
    limits): the test harness checks each child's invariants so. Must not raise."""


def delegate_of(tool: Tool) -> Delegate | None:
    """The child agent a sub-agent tool runs, or None for any other tool."""
    found = getattr(tool.fn, "delegate", None)
    return found if isinstance(found, Delegate) else None


def child_run_id(parent_run_id: str, turn: int, call_id: str) -> str:
    """The run id of the child a parent's call starts: the same for the same call of the
    same turn of the same parent, so that a parent redoing a step after a crash finds the
    child it had started, and resumes it instead of starting another."""
    key = "\x00".join((parent_run_id, str(turn), call_id)).encode("utf-8", "surrogatepass")
    return "sub-" + hashlib.sha256(key).hexdigest()[:32]


def _home(delegate: Delegate, parent: RunContext | None) -> Residence:
    """Where the child's run lives: in its parent's store (leased by the same worker)
    when the parent is kept in one, so that it outlives a crash with it; else where its own
    agent keeps runs."""
    own = delegate.agent.residence
    home = parent.home if parent is not None else None
    if isinstance(home, Stored | Leased):
        return home.nested(own.time)
    return own


def _spend(result: RunResult) -> dict[str, JsonValue]:
    """What a child spent, as its call's details keep it (``run.parenting.fold`` reads it)."""
    return {
        "turns": result.turns,
        "retries": result.retries,
        "last_answers": result.last_answers,
        "usage": result.usage.model_dump(),
        "cost": result.cost,
    }


def _details(result: RunResult) -> dict[str, Any]:
    """The call's details: how the child ended and what it spent, enough to count it in
    the parent again when the call's answer is replayed from the journal
    (``run.parenting.fold_replayed``)."""
    usage: Usage = result.usage
    return {
        "sub_agent_run_id": result.run_id,
        "status": result.status.value,
        "stop_reason": result.stop_reason.value,
        **_spend(result),
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
    }


def _answer(delegate: Delegate, result: RunResult) -> ToolResult:
    """The tool result of a child that stopped: its output, why it has none, or, for a
    child that waits for the user, that it waits (``details["awaiting_sub_agent"]`` holds
    its request, from which the parent's pause is made: ``run.parenting.pause_request``).
    A handoff's wait is answered as an error, so that the ``terminal_tool`` row does not
    end the parent with it."""
    name = delegate.name
    details = _details(result)
    if result.status is RunStatus.COMPLETED:
        return ToolResult(result.output or "", details=details)
    pending = result.pending
    if result.status is RunStatus.NEEDS_INPUT and pending is not None:
        details["awaiting_sub_agent"] = pending.model_dump(mode="json")
        return ToolResult(
            AWAITING_SUB_AGENT.format(name=name, asked=pending.text),
            details=details,
            is_error=delegate.handoff,
        )
    said = f" Its last words: {result.output}" if result.output else ""
    why = f" ({result.error})" if result.error else ""
    return ToolResult(
        f"The sub-agent {name} stopped without finishing: {result.stop_reason.value}{why}." + said,
        details=details,
        is_error=True,
    )


AWAITING_SUB_AGENT = (
    "The sub-agent {name} waits for the user ({asked}). The whole run waits with it, unless "
    "it stops for another reason first; its result, or that it was stopped, will arrive in a "
    "later user message."
)
"""The answer of a call whose child stopped to ask the user (a question, approvals)."""


async def run_child(delegate: Delegate, task: str, call: ToolCall | None = None) -> ToolResult:
    """Run the child on ``task`` within what its parent has left; the answer of the call.

    Called by a parent, the child's run id is ``child_run_id`` of the call, and it lives
    where ``_home`` says: a call redone after the parent crashed finds the child's run and
    goes on with it from its checkpoint (its journal answers the calls it made), or takes
    its result if it had stopped.

    Raises only the caller's cancellation, after the child was aborted and its spend
    counted."""
    parent = PARENT_RUN.get()
    if parent is None or call is None:
        return await _start(delegate, parent, uuid.uuid4().hex, delegate.agent.residence, task)
    if any(child.status is RunStatus.NEEDS_INPUT for child in parent.finished_children):
        return ToolResult(  # one child waits for the user: the run pauses with it
            f"The sub-agent {delegate.name} was not started: another sub-agent of this turn "
            "waits for the user, and the run waits with it. Call it again afterwards.",
            details={"stop_reason": "not_started", "why": "another sub-agent waits"},
            is_error=True,
        )
    run_id = child_run_id(parent.state.run_id, parent.state.turns, call.id)
    home = _home(delegate, parent)
    if parent.journal is not None and isinstance(home, InProcess):
        lost = _started_before(parent.journal, run_id, call)
        if lost is not None:
            return lost
    try:
        if home.holds(run_id):
            outcome = await go_on(delegate, parent, home, run_id)
            return outcome if isinstance(outcome, ToolResult) else _answer(delegate, outcome)
        link = ParentLink(run_id=parent.state.run_id, tool_call_id=call.id, tool=delegate.name)
        return await _start(delegate, parent, run_id, home, task, link)
    except (CheckpointError, ResumeError, RunLeased, ConfigError) as exc:
        return _not_run(delegate.name, run_id, exc)


async def carry_out_child(
    delegate: Delegate,
    parent: RunContext,
    pause: SubAgentPause,
    reply: str | None,
    decisions: Sequence[Decision],
) -> ToolResult:
    """Pass a resume's answer down to the child its parent paused for (``pause``), go on
    with it within what the parent has left, and return the answer its call would have
    had (``_answer``): its result, why it stopped, or that it waits again. Only what it
    spends from now is added to the parent's (``RunContext.counted_children``)."""
    approvals = {d.call.id: d.approval for d in decisions} if decisions else None
    if parent.counted_children is None:
        parent.counted_children = {}
    parent.counted_children[pause.run_id] = pause.counted
    try:
        outcome = await go_on(
            delegate,
            parent,
            _home(delegate, parent),
            pause.run_id,
            counted=pause.counted,
            reply=reply,
            approvals=approvals,
            pause=pause.pause,
        )
    except (CheckpointError, ResumeError, RunLeased, ConfigError) as exc:
        return _not_run(delegate.name, pause.run_id, exc)
    return outcome if isinstance(outcome, ToolResult) else _answer(delegate, outcome)


async def settle(delegate: Delegate, parent: RunContext, pause: SubAgentPause, why: str) -> bool:
    """End the child that waits at ``pause`` when its parent will not answer it (it stopped
    for another reason, or could not go on with it): it is reopened with a refusal (an
    unanswered question, every call denied) and aborted at its next transition, so that it
    is no longer resumable as a pause; a child that waits for its own sub-agent settles it
    the same way (its ACT goes on with it under its own, set, stop scope). The rows decide:
    the child leaves its stop by its resume row and ends by ``abort_requested``. True when it
    was ended so; False when it no longer waited there (or could not be reached), nothing
    done. Never raises."""
    home = _home(delegate, parent)
    config = delegate.agent.run_config
    try:
        with home.readmit(pause.run_id) as (state, keeper):  # held: driven, not orphaned
            control = state.control
            if (
                state.state not in TERMINAL_STATES
                or control is None
                or not control.pause
                or state.stop_reason not in _PAUSES
            ):
                keeper.release()
                return False
            asks = control.waits_for
            reply = None if asks is ControlKind.APPROVAL else f"(no answer: {why})"
            approvals: Decisions | None = False if asks is ControlKind.APPROVAL else None
            child_config = keep_approvals(config, state)
            answered = reopen(
                state,
                child_config.machine,
                child_config.limits,
                reply,
                approvals,
                control.pause,
                tools=child_config.tools,
            )
        run = Run(child_config, state, keeper, resumed=answered, path=_path(parent), home=home)
        _announce(delegate, parent, run, continued=True)
        await run.step()  # its resume row, out of the pause
        run.abort(f"the parent run stopped: {why}")
        result = await run.run()
    except (CheckpointError, ResumeError, RunLeased, ConfigError):
        return False
    except Exception as exc:  # its own table's code, say: the parent's stop must not fail
        parent.log.warning("sub_agent_not_settled", sub_agent_run_id=pause.run_id, error=str(exc))
        return False
    if delegate.observer is not None:
        delegate.observer(result, child_config)
    return True


_PAUSES = frozenset(
    {StopReason.ASK_USER, StopReason.APPROVAL_REQUIRED, StopReason.SUB_AGENT_PAUSED}
)
"""The stops at which a child waits for its parent's answer."""


def _started_before(journal: ToolJournal, run_id: str, call: ToolCall) -> ToolResult | None:
    """For a durable parent whose child cannot outlive the process (kept in memory: a DBOS
    parent's, say): the call's answer when the child was started before, by a process that
    died (it cannot be found, and starting it again could repeat its side effects: the
    outcome is unknown), or when that cannot be known; None after recording, in the parent's
    journal, that it starts now."""
    key = f"sub-agent {run_id}"
    try:
        if start_fresh(journal, key, call) is not None:  # never over another's start
            return ToolResult(
                f"The sub-agent was started before the run was interrupted, and its outcome "
                f"is unknown: it was not run again (call {call.id}).",
                details={"sub_agent_run_id": run_id, "stop_reason": "outcome_unknown"},
                is_error=True,
            )
    except Exception as exc:  # unread is not unrun: never start a child the journal cannot see
        return _not_run(call.name, run_id, exc)
    return None


def _not_run(name: str, run_id: str, exc: Exception) -> ToolResult:
    return ToolResult(
        f"The sub-agent {name} could not be run: {exc}",
        details={"sub_agent_run_id": run_id, "stop_reason": "not_started", "why": str(exc)},
        is_error=True,
    )


async def _start(
    delegate: Delegate,
    parent: RunContext | None,
    run_id: str,
    home: Residence,
    task: str,
    link: ParentLink | None = None,
) -> ToolResult:
    """Start a new child run under ``run_id`` where ``home`` keeps it, and drive it."""
    agent = delegate.agent
    config = agent.run_config
    left = carve(config.limits, parent)
    if left.limits is None:
        return ToolResult(
            f"The sub-agent {delegate.name} was not started: the run has {left.why_not} left.",
            details={"stop_reason": "not_started", "why": left.why_not},
            is_error=True,
        )
    child_config = carved_config(config, left.limits)
    history: list[Message] = []
    if delegate.handoff:
        history = _conversation(parent)
        task = HANDOFF_INPUT.format(note=task or "Take over the conversation.")
    state = new_run_state(
        run_id,
        agent.system_prompt,
        task,
        child_config.tools_tokens,
        history,
        child_config.count_tokens,
        agent=config.record,
    )
    state.parent = link
    run = Run(child_config, state, home.admit(state), path=_path(parent), home=home)
    result = await _drive(delegate, parent, run, child_config)
    return _answer(delegate, result)


def _path(parent: RunContext | None) -> tuple[str, ...]:
    return () if parent is None else (*parent.path, parent.state.run_id)


async def go_on(
    delegate: Delegate,
    parent: RunContext,
    home: Residence,
    run_id: str,
    *,
    counted: Mapping[str, JsonValue] | None = None,
    reply: str | None = None,
    approvals: Decisions | None = None,
    pause: str = "",
) -> RunResult | ToolResult:
    """Go on with the child run ``run_id`` that ``home`` keeps, within what ``parent`` has
    left beyond what it counted of the child already (``counted``), and return how it
    stopped; a ``ToolResult`` when it cannot go on (the parent has nothing left for it).

    Where the child stands decides: at the pause ``pause`` the answer (``reply`` or
    ``approvals``) is for, it is resumed with it; stopped elsewhere (another pause, or for
    good), it is not run, and how it stopped is returned; interrupted (its process died),
    or aborted with its parent, it goes on from its last checkpoint without an answer.

    Raises:
        CheckpointError, ResumeError, RunLeased: the child's run cannot be loaded or taken
            (the caller answers with why).
    """
    agent = delegate.agent
    config = agent.run_config
    with contextlib.ExitStack() as readmitted:
        state, keeper = await _readmit(home, run_id, parent, readmitted)
        stopped = state.state in TERMINAL_STATES
        control = state.control
        at_pause = (
            stopped
            and control is not None
            and bool(pause)
            and control.pause == pause
            and (reply is not None or approvals is not None)
        )
        interrupted = not stopped or state.stop_reason in _GOES_ON
        if not at_pause and not interrupted:  # it stopped: report how, run nothing
            keeper.release()
            result = _stored_result(state, config)
            _ended(delegate, parent, result, config)  # its spend counts, as if it ran now
            return result
        left = carve(config.limits, parent, counted or {})
        if left.limits is None:
            keeper.release()
            return ToolResult(
                f"The sub-agent {delegate.name} cannot go on: the run has {left.why_not} left.",
                details={"sub_agent_run_id": run_id, "stop_reason": "not_resumed"},
                is_error=True,
            )
        child_config = keep_approvals(carved_config(config, left.limits), state)
        if config.record is not None:
            claim(state, config.record)
        if at_pause:
            answered = reopen(
                state,
                child_config.machine,
                child_config.limits,
                reply,
                approvals,
                pause,
                tools=child_config.tools,
            )
        else:
            answered = reopen(state, child_config.machine, child_config.limits)
    run = Run(child_config, state, keeper, resumed=answered, path=_path(parent), home=home)
    return await _drive(delegate, parent, run, child_config, continued=bool(pause))


async def _readmit(
    home: Residence, run_id: str, parent: RunContext, stack: contextlib.ExitStack
) -> tuple[RunState, RunKeeper]:
    """``home.readmit(run_id)``, entered on ``stack``; a lease that another driver still
    holds on the child is waited out, however long the parent has left (its abort or
    deadline cancels the wait: the call is then answered as cancelled, and the step redone
    later finds the lease free). The holder is the parent's previous driver, whose lease on
    the parent expired (this driver took it over): dead, its lease on the child expires
    too; stalled, it loses the parent's lease at its next renewal and aborts the child,
    releasing it. A transient state, never answered to the model as a failure.

    Raises:
        CheckpointError, ResumeError: as ``Residence.readmit``.
    """
    while True:
        admitted = home.readmit(run_id)
        try:
            found = admitted.__enter__()
        except RunLeased as held:
            wait = held.expires_at - time.time()
            parent.log.info("sub_agent_lease_held", sub_agent_run_id=run_id, wait_s=wait)
            await parent.sleep(min(max(wait, _LEASE_POLL_S), _LEASE_POLL_MAX_S))
            continue
        stack.push(admitted)
        return found


_LEASE_POLL_S = 0.05
_LEASE_POLL_MAX_S = 5.0
"""How long a driver waits at least, and at most, before it claims a held child again."""


_GOES_ON = frozenset({StopReason.ABORTED, StopReason.TIMEOUT})
"""The stops a child goes on from without an answer when its parent calls it again: its
parent's abort or deadline stopped it (a parent redoing the step after a crash)."""


def _stored_result(state: RunState, config: RunConfig) -> RunResult:
    """How a stored child run stopped, as its ``RunResult``."""
    result = RunResult.from_state(state, config.machine.rows)
    if config.output is not None:
        result = typed_result(result, config.output)
    return result


def _announce(delegate: Delegate, parent: RunContext, run: Run, continued: bool) -> None:
    """Tell the parent's listeners, if it has any, that the child runs (``SubAgentStarted``,
    ``continued`` after the parent's pause), and deliver the child's events to them."""
    bus = parent.bus
    if bus.emitter is None:
        return
    link = run.state.parent
    bus.emit(
        SubAgentStarted(
            run_id=parent.state.run_id,
            sub_agent_run_id=run.run_id,
            tool=delegate.name,
            turn=parent.state.turns,
            path=parent.path,
            tool_call_id=link.tool_call_id if link is not None else "",
            continued=continued,
        )
    )
    run.subscribe(bus.emit)


async def _drive(
    delegate: Delegate,
    parent: RunContext | None,
    run: Run,
    child_config: RunConfig,
    *,
    continued: bool = False,
) -> RunResult:
    """Run the child to its stop, its events delivered to the parent's listeners; the
    parent's cancellation aborts it first (its spend still counted)."""
    if parent is not None:
        _announce(delegate, parent, run, continued)
    if parent is not None and parent.stop.is_set():  # stopped already: it must not go on
        run.abort(f"the parent run stopped: {parent.why_stopped()}")
    task_of_child = asyncio.ensure_future(run.run())
    try:
        result = await asyncio.shield(task_of_child)
    except asyncio.CancelledError:
        reason = "the parent run stopped" if parent is None else parent.why_stopped()
        run.abort(f"the parent run stopped: {reason}")
        await asyncio.wait({task_of_child})
        ended = not task_of_child.cancelled() and task_of_child.exception() is None
        if ended:
            _ended(delegate, parent, task_of_child.result(), child_config)
        raise
    _ended(delegate, parent, result, child_config)
    return result


def _ended(
    delegate: Delegate, parent: RunContext | None, result: RunResult, config: RunConfig
) -> None:
    """A child run ended: its spend to be counted in its parent's when the step ends
    (``RunContext.finished_children``), its observer told."""
    if parent is not None:
        parent.finished_children += (result,)
    if delegate.observer is not None:
        delegate.observer(result, config)


def _conversation(parent: RunContext | None) -> list[Message]:
    """The parent's conversation for a handoff's child: its transcript without the reply
    that hands off (whose calls are not answered yet), repaired (``run.history``: the
    child's own system prompt leads it)."""
    if parent is None:
        return []
    messages = list(parent.state.messages)
    if messages and isinstance(messages[-1], AssistantMessage) and messages[-1].tool_calls:
        messages.pop()
    repaired, _ = prepare_history(messages)
    return repaired


def delegation_tool(
    agent: Delegable,
    *,
    name: str,
    description: str,
    timeout_s: float | None = None,
    handoff: bool = False,
    observer: Callable[[RunResult, RunConfig], None] | None = None,
) -> Tool:
    """A tool that runs ``agent`` on the task the model gives it (``Agent.as_tool``), or,
    as a ``handoff``, on the conversation so far (``Agent.as_handoff``): a terminal tool,
    whose child's answer ends the parent run (the ``terminal_tool`` row).

    Raises:
        ConfigError: an invalid name or description (as for any tool), or a timeout that is
            not a positive number.
    """
    if not isinstance(description, str) or not description.strip():
        raise ConfigError(f"sub-agent tool {name!r} needs a description for the model")
    delegate = Delegate(agent=agent, name=name, handoff=handoff, observer=observer)
    own = agent.run_config.limits

    # The engine passes the call first (``Tool.receives_call``); called directly, without
    # one, the child runs under a fresh id.
    async def call_sub_agent(call: ToolCall | None = None, /, *, task: str) -> ToolResult:
        return await run_child(delegate, task, call)

    async def hand_off(call: ToolCall | None = None, /, *, note: str = "") -> ToolResult:
        return await run_child(delegate, note, call)

    fn: Callable[..., Any] = hand_off if handoff else call_sub_agent
    fn.delegate = delegate  # type: ignore[attr-defined]  # read by delegate_of
    fn.receives_call = True  # type: ignore[attr-defined]  # the child is named after it

    async def go_on_after_pause(
        parent: RunContext, pause: SubAgentPause, reply: str | None, decisions: list[Decision]
    ) -> ToolResult:
        return await carry_out_child(delegate, parent, pause, reply, decisions)

    async def settle_pause(parent: RunContext, pause: SubAgentPause, why: str) -> bool:
        return await settle(delegate, parent, pause, why)

    fn.go_on = go_on_after_pause  # type: ignore[attr-defined]  # read by run.parenting
    fn.settle = settle_pause  # type: ignore[attr-defined]  # read by run.parenting
    # Its own deadline ends the child first: the tool's timeout is only a backstop.
    backstop = own.timeout_s + own.last_answer_timeout_s + 30.0 if timeout_s is None else timeout_s
    return Tool(
        name,
        description,
        HANDOFF_SCHEMA if handoff else TASK_SCHEMA,
        fn,
        timeout_s=backstop,
        sequential=True,
        # Run again when a crash left the call unfinished: it finds its child and goes on
        # with it (``run_child``), whose own journal keeps its calls from running twice.
        # Never retried on a failure of its own.
        idempotent=True,
        max_retries=0,
        terminal=handoff,
    )
