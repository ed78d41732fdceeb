"""Sub-agents: an agent run as a tool of another, within what its parent has left.

``Agent.as_tool`` makes a ``Tool`` whose call runs the child agent on the task the model gave
it. The promises of a run hold for the whole tree:

- **A child never outlives or outspends its parent.** Its limits are carved when the call
  starts (``carve``): each budget is the smaller of its own and what remains of the
  parent's: turns (model calls that are not retries, its last answer included), retries,
  tokens, money and time. What the child spent is added to the parent's counts when the
  step ends (``run.acting.fold``: the turn count keys the tool journal, so it does not move
  while the step's calls run): its turns and last answer to the parent's turns (at least
  one: a child call that made no model call still uses a turn, so ``max_turns`` bounds how
  many a run makes), its retries, usage and cost to the parent's. The parent's own guards
  then see the tree's spend, so ``max_turns``, the token budget and the money budget bound
  the tree as they bound one run, and the parent's ``bound.model_calls`` bounds every model
  call of it. A sub-agent tool runs alone (``Tool.sequential``): the next child of the same
  reply is carved from what the previous ones left. A step redone after a crash answers a
  finished child's call from the journal, and counts its spend again from the answer's
  details (``run.acting.fold_replayed``).
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

Not yet: a child run's checkpoint is not linked to its parent's call, so a crash of the
parent does not resume the child (with a store, the call is journaled like any tool call:
after a crash it is answered "outcome unknown", never run twice); a child that stops to ask
a person (ask_user, an approval) answers the call with its question, as an error, and does
not pause the parent.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

from pydantic import BaseModel

from agent_fsm.errors import ConfigError
from agent_fsm.events import SubAgentStarted
from agent_fsm.limits import Limits
from agent_fsm.loop.verify import TerminationBound
from agent_fsm.messages import AssistantMessage, Message, Usage
from agent_fsm.run.context import PARENT_RUN, RunConfig, RunContext
from agent_fsm.run.engine import Run, new_run_state
from agent_fsm.run.history import prepare_history
from agent_fsm.run.residence import Residence
from agent_fsm.state import RunResult, RunStatus
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

_COST_GUARDS = frozenset({"prompt_exceeds_cost_budget", "cost_budget_spent"})

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


class LimitsLeft(BaseModel):
    """What a parent run has left when a child starts (``carve``), or why nothing is."""

    limits: Limits | None
    """The child's limits; None when the parent has nothing left to give."""
    why_not: str = ""
    """Which budget the parent has spent, when ``limits`` is None."""


def carve(own: Limits, parent: RunContext | None) -> LimitsLeft:
    """The limits of a child started now by ``parent``: each budget the smaller of the
    child's own and what remains of the parent's (turns, retries, tokens, money, time), the
    parent's prices added to the child's (its own win). A last answer is kept only when a
    turn is left for it beyond one turn of work. Without a parent: its own limits."""
    if parent is None:
        return LimitsLeft(limits=own)
    state, limits = parent.state, parent.limits
    earlier = parent.finished_children  # this step's, not counted in the state yet
    turns = limits.max_turns - state.turns - sum(max(c.turns + c.last_answers, 1) for c in earlier)
    tokens = (
        limits.token_budget - state.usage.total_tokens - sum(c.usage.total_tokens for c in earlier)
    )
    retries = max(limits.model_retries_per_run - state.retries - sum(c.retries for c in earlier), 0)
    elapsed = parent.clock() - parent.started_at
    seconds = limits.timeout_s - elapsed
    money: float | None = None
    if limits.cost_budget is not None:
        money = limits.cost_budget - (state.cost or 0.0) - sum(c.cost or 0.0 for c in earlier)
    for spent, why in (
        (turns < 1, "no turns"),
        (tokens < 1, "no tokens"),
        (money is not None and money <= 0, "no money"),
        (seconds <= 0, "no time"),
    ):
        if spent:
            return LimitsLeft(limits=None, why_not=why)
    last_answer = own.last_answer and turns >= 2
    max_turns = min(own.max_turns, turns - 1 if last_answer else turns)
    cost_budget = own.cost_budget
    if money is not None:
        cost_budget = money if cost_budget is None else min(cost_budget, money)
    prices = dict(limits.prices) | dict(own.prices)
    values = {
        **own.model_dump(exclude={"prices"}),
        "max_turns": max_turns,
        "last_answer": last_answer,
        "token_budget": min(own.token_budget, tokens),
        "model_retries_per_run": min(own.model_retries_per_run, retries),
        "timeout_s": min(own.timeout_s, seconds),
        "cost_budget": cost_budget,
        "prices": prices,
    }
    return LimitsLeft(limits=Limits(**values))


def _child_config(config: RunConfig, limits: Limits) -> RunConfig:
    """The child's configuration under carved ``limits``: priced by them when its own were
    not, and with the rows the carve turned on (a money budget, no last answer) live."""
    pricing = config.pricing or limits.price_of(config.model.name)
    dead = set(config.dead_guards)
    if limits.cost_budget is not None:
        dead -= _COST_GUARDS
    if not limits.last_answer:
        dead.add("last_answer_wanted")
    return replace(config, limits=limits, pricing=pricing, dead_guards=frozenset(dead))


def _details(result: RunResult) -> dict[str, Any]:
    """The call's details: how the child ended and what it spent, enough to count it in
    the parent again when the call's answer is replayed from the journal
    (``run.acting.fold_replayed``)."""
    usage: Usage = result.usage
    return {
        "sub_agent_run_id": result.run_id,
        "status": result.status.value,
        "stop_reason": result.stop_reason.value,
        "turns": result.turns,
        "retries": result.retries,
        "last_answers": result.last_answers,
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
        "usage": usage.model_dump(),
        "cost": result.cost,
    }


def _answer(name: str, result: RunResult) -> ToolResult:
    """The tool result of a finished child: its output, or why it has none."""
    details = _details(result)
    if result.status is RunStatus.COMPLETED:
        return ToolResult(result.output or "", details=details)
    said = f" Its last words: {result.output}" if result.output else ""
    why = f" ({result.error})" if result.error else ""
    return ToolResult(
        f"The sub-agent {name} stopped without finishing: {result.stop_reason.value}{why}." + said,
        details=details,
        is_error=True,
    )


async def run_child(delegate: Delegate, task: str) -> ToolResult:
    """Run the child on ``task`` within what its parent has left; the answer of the call.

    Raises only the caller's cancellation, after the child was aborted and its spend
    counted."""
    parent = PARENT_RUN.get()
    agent = delegate.agent
    config = agent.run_config
    left = carve(config.limits, parent)
    if left.limits is None:
        return ToolResult(
            f"The sub-agent {delegate.name} was not started: the run has {left.why_not} left.",
            details={"stop_reason": "not_started", "why": left.why_not},
            is_error=True,
        )
    child_config = _child_config(config, left.limits)
    run_id = uuid.uuid4().hex
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
    )
    path = () if parent is None else (*parent.path, parent.state.run_id)
    run = Run(child_config, state, agent.residence.admit(state), path=path)
    if parent is not None and parent.bus.emitter is not None:
        bus = parent.bus
        bus.emit(
            SubAgentStarted(
                run_id=parent.state.run_id,
                sub_agent_run_id=run_id,
                tool=delegate.name,
                turn=parent.state.turns,
                path=parent.path,
            )
        )
        run.subscribe(bus.emit)
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
    return _answer(delegate.name, result)


def _ended(
    delegate: Delegate, parent: RunContext | None, result: RunResult, config: RunConfig
) -> None:
    """A child run ended: its spend to be counted in its parent's when the step ends
    (``RunContext.finished_children``), its observer told."""
    if parent is not None:
        parent.finished_children.append(result)
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

    async def call_sub_agent(task: str) -> ToolResult:
        return await run_child(delegate, task)

    async def hand_off(note: str = "") -> ToolResult:
        return await run_child(delegate, note)

    fn: Callable[..., Any] = hand_off if handoff else call_sub_agent
    fn.delegate = delegate  # type: ignore[attr-defined]  # read by delegate_of
    # Its own deadline ends the child first: the tool's timeout is only a backstop.
    backstop = own.timeout_s + own.last_answer_timeout_s + 30.0 if timeout_s is None else timeout_s
    return Tool(
        name,
        description,
        HANDOFF_SCHEMA if handoff else TASK_SCHEMA,
        fn,
        timeout_s=backstop,
        sequential=True,
        terminal=handoff,
    )
