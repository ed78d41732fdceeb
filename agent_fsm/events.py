"""Typed events: what happened during a run, in the past tense.

Every event is a frozen, slotted, keyword-only dataclass with a ``kind`` discriminator, and
``Event`` is their union. They are dataclasses rather than pydantic models on purpose: several
are built on every turn, and a dataclass costs a fraction of a validated model; pydantic still
serialises them (``EVENT_ADAPTER.dump_json(event)``) and reads them back, for trace files.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import Field, JsonValue, TypeAdapter

from agent_fsm.constructors import quick_init
from agent_fsm.errors import ConfigError
from agent_fsm.messages import FinishReason, ReplyDelta, ToolCall, ToolStatus, Usage
from agent_fsm.state import RunStatus
from agent_fsm.table import AgentState, StopReason

__all__ = [
    "EVENT_ADAPTER",
    "AbortRequested",
    "ContextCompacted",
    "EventBus",
    "FollowUpQueued",
    "RunPaused",
    "RunResumed",
    "SteeringQueued",
    "Event",
    "EventHandler",
    "GuardTripped",
    "HistoryRepaired",
    "MessageUpdated",
    "ModelFailed",
    "ModelRequested",
    "ModelResponded",
    "RunFinished",
    "RunStarted",
    "StateChanged",
    "SubAgentStarted",
    "ToolFinished",
    "ToolRetried",
    "ToolStarted",
]


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class RunStarted:
    """A run began."""

    kind: Literal["run_started"] = "run_started"
    run_id: str
    input: str
    """The user's message that started the run."""
    path: tuple[str, ...] = ()
    """For a sub-agent's run (``Agent.as_tool``), the runs that started it, outermost
    first (its parent last); empty for a run of its own."""


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class HistoryRepaired:
    """The run started from an earlier conversation (``history=``) that had to be repaired
    before the first model call, so that every tool call has exactly one result."""

    kind: Literal["history_repaired"] = "history_repaired"
    run_id: str
    answered: tuple[str, ...] = ()
    """Calls given an "interrupted" result: they had none."""
    dropped: tuple[str, ...] = ()
    """Results dropped (their ``tool_call_id``): they answered no open call."""
    system_messages: int = 0
    """System messages dropped: the agent's own system prompt leads the run."""
    ids: tuple[tuple[str, str], ...] = ()
    """``(old, new)`` for each call given a new id: an empty one, or one an earlier call of
    the history had taken (its result was renamed with it)."""
    names: tuple[str, ...] = ()
    """Calls whose result named another tool: it now names the call's tool."""


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class ContextCompacted:
    """The prompt was too big for the context window and the context policies shrank it
    (COMPACT), or a summary they asked for was written (THINK)."""

    kind: Literal["context_compacted"] = "context_compacted"
    run_id: str
    turn: int
    policies: tuple[str, ...]
    """The policies that changed the prompt, in the order they ran."""
    tokens_before: int
    tokens_after: int
    """The prompt's calibrated estimate before and after."""
    sent_from: int
    """Index of the first transcript message still sent after the system prompt."""
    cleared: int
    """Tool results sent as a stub."""
    summary: str | None = None
    """The summary now sent in place of the cut messages, when one was written."""
    summary_requested: bool = False
    """A policy asked for a summary: the next model call writes it."""
    problems: tuple[str, ...] = ()
    """Policies that failed or returned edits that were refused, and why."""


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class StateChanged:
    """The machine took one transition."""

    kind: Literal["state_changed"] = "state_changed"
    run_id: str
    source: AgentState | str
    """A state of the default loop, or the name of a custom state (as ``dest``)."""
    dest: AgentState | str
    trigger: str
    guards: tuple[str, ...]
    """Guards of the row that decided; empty for the "else" row."""
    label: str
    """The stop reason for a transition into DONE/ERROR, else a short verb."""
    turn: int


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class ModelRequested:
    """A model call is about to start."""

    kind: Literal["model_requested"] = "model_requested"
    run_id: str
    turn: int
    messages: int
    """Messages in the prompt."""
    estimated_prompt_tokens: int
    model: str = ""
    """The name of the model called (``Model.name``)."""
    last_answer: bool = False
    """The call asks for the last answer as a limit ends the run (``Limits.last_answer``):
    not a turn, and beyond the limit that fired."""


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class MessageUpdated:
    """A streaming model delivered a fragment of its reply."""

    kind: Literal["message_updated"] = "message_updated"
    run_id: str
    turn: int
    delta: ReplyDelta


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class ModelResponded:
    """A model call returned a reply."""

    kind: Literal["model_responded"] = "model_responded"
    run_id: str
    turn: int
    text: str
    tool_calls: tuple[ToolCall, ...]
    finish_reason: FinishReason
    usage: Usage
    """Usage of this call (estimated when the server reported none)."""
    last_answer: bool = False
    """The reply is the last answer written as a limit ended the run."""
    cost: float | None = None
    """What this call cost (``Limits.prices``); None when the agent has no prices."""


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class ModelFailed:
    """A model call raised or returned something that is not a reply."""

    kind: Literal["model_failed"] = "model_failed"
    run_id: str
    turn: int
    message: str
    permanent: bool


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class ToolStarted:
    """A tool call is about to run, emitted as it starts. A call answered without running
    (invalid, skipped, awaiting approval, control-flow) gets its ToolStarted right before
    its ToolFinished, so every call has one of each."""

    kind: Literal["tool_started"] = "tool_started"
    run_id: str
    turn: int
    call: ToolCall


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class ToolFinished:
    """A tool call was answered (run, failed, or skipped). It goes to the handlers that got
    the turn's ``ToolStarted`` events: one subscribed during the turn gets neither."""

    kind: Literal["tool_finished"] = "tool_finished"
    run_id: str
    turn: int
    call_id: str
    name: str
    status: ToolStatus
    output: str
    """The result text the model will see."""
    duration_s: float
    """Seconds from the call's start to its answer, retries and backoff included; 0 for a
    call that never ran."""
    is_error: bool = False
    """True when the call was answered as failed (``status`` is error)."""
    output_chars: int = 0
    """Length of ``output``."""
    details: JsonValue = None
    """The result's details (never sent to the model): the tool's own, plus the runtime's
    facts under ``"runtime"`` (retries, truncation, an abandoned thread, a journal replay)."""
    attempts: int = 1
    """Times the tool was run for this answer (0 when it never ran)."""


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class ToolRetried:
    """An idempotent tool call failed with a transient error and will be run again."""

    kind: Literal["tool_retried"] = "tool_retried"
    run_id: str
    turn: int
    call_id: str
    name: str
    attempt: int
    """The attempt that failed (1 for the first run)."""
    error: str
    """Why it failed, as the model would have been told."""
    delay_s: float
    """Backoff before the next attempt."""


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class GuardTripped:
    """A guard ended the run (any transition into DONE or ERROR)."""

    kind: Literal["guard_tripped"] = "guard_tripped"
    run_id: str
    state: AgentState | str
    """The state the run was in when the guard fired."""
    guards: tuple[str, ...]
    stop_reason: StopReason


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class RunFinished:
    """A run ended or paused; the last event of every run."""

    kind: Literal["run_finished"] = "run_finished"
    run_id: str
    status: RunStatus
    stop_reason: StopReason
    final_state: AgentState
    turns: int
    usage: Usage
    output: str | None
    error: str | None = None
    """For failed runs, what went wrong (the same text as RunResult.error)."""
    cost: float | None = None
    """What the run's model calls cost (``RunResult.cost``); None without prices."""


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class RunPaused:
    """A run stopped to wait for a person (ask_user or approvals); ``RunFinished`` follows.
    Continue it with ``Agent.resume``."""

    kind: Literal["run_paused"] = "run_paused"
    run_id: str
    stop_reason: StopReason
    question: str
    """ask_user's question, or a summary of what awaits approval."""
    pending_calls: tuple[ToolCall, ...] = ()
    """The calls that await approval (empty for ask_user)."""
    pause: str = ""
    """Names this pause: give it back with the answer (``Agent.resume(..., pause=...)``)."""


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class RunResumed:
    """A paused, aborted, timed-out or interrupted run continues from its checkpoint."""

    kind: Literal["run_resumed"] = "run_resumed"
    run_id: str
    state: AgentState | str
    """The state the run continues in."""
    answered: str
    """What the resume answered: "reply", "approvals", "interrupted", "recovered" or
    "crashed"."""
    turn: int


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class SteeringQueued:
    """The caller steered the run: the message is observed next, and tool calls of the
    current turn that have not started are skipped."""

    kind: Literal["steering_queued"] = "steering_queued"
    run_id: str
    message: str
    turn: int


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class FollowUpQueued:
    """The caller queued a follow-up: delivered when the run would otherwise end."""

    kind: Literal["follow_up_queued"] = "follow_up_queued"
    run_id: str
    message: str
    turn: int


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class AbortRequested:
    """The caller asked the run to stop; in-flight model and tool calls are cancelled."""

    kind: Literal["abort_requested"] = "abort_requested"
    run_id: str
    reason: str
    turn: int


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class SubAgentStarted:
    """A sub-agent tool (``Agent.as_tool``) started a child run; the child's own events
    follow, each with the child's ``run_id``, and the call's ``ToolFinished`` ends it."""

    kind: Literal["sub_agent_started"] = "sub_agent_started"
    run_id: str
    """The parent run."""
    sub_agent_run_id: str
    """The child run, whose events follow."""
    tool: str
    """The sub-agent tool that started it."""
    turn: int
    path: tuple[str, ...] = ()
    """The runs above the parent, outermost first (the child's path is this and
    ``run_id``)."""
    tool_call_id: str = ""
    """The parent's call that runs the child ("" for a child called outside a run)."""
    continued: bool = False
    """The child goes on after the pause it stopped its parent at (or is ended then): its
    call was answered when the parent paused, so no ``ToolStarted`` of this activation of
    the parent precedes it, and no ``ToolFinished`` follows."""


Event = Annotated[
    RunStarted
    | HistoryRepaired
    | ContextCompacted
    | StateChanged
    | ModelRequested
    | MessageUpdated
    | ModelResponded
    | ModelFailed
    | ToolStarted
    | ToolRetried
    | ToolFinished
    | GuardTripped
    | RunPaused
    | RunResumed
    | SteeringQueued
    | FollowUpQueued
    | AbortRequested
    | SubAgentStarted
    | RunFinished,
    Field(discriminator="kind"),
]
"""Any event, discriminated by ``kind``."""


EventHandler = Callable[[Event], None]
"""A subscriber. It must not raise: an exception is logged and the run goes on."""

EVENT_ADAPTER: TypeAdapter[Event] = TypeAdapter(Event)
"""Serialises and parses events (JSON), for trace files."""


def checked_handler(handler: EventHandler) -> EventHandler:
    """``handler``, if it can be one: a plain callable. An ``async def`` handler would be
    called and its coroutine never awaited, so its events would silently go nowhere.

    Raises:
        ConfigError: for something that is not callable, or is a coroutine function.
    """
    if not callable(handler):
        raise ConfigError(f"an event handler must be callable, got {type(handler).__name__}")
    if inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
        getattr(handler, "__call__", None)  # noqa: B004 - an object with an async __call__
    ):
        raise ConfigError(
            "event handlers are called synchronously and must not be async (a coroutine "
            "would never be awaited): consume events with `async for event in "
            "agent.stream(...)`, or start your coroutine from a plain handler with "
            "asyncio.get_running_loop().create_task(...)"
        )
    return handler


class EventBus:
    """The subscribers of one run, in subscription order.

    ``emit`` delivers an event to each; a handler that raises is reported to
    ``on_handler_error`` (the engine logs it) and the others still get the event, because an
    observer must never break the run it observes. ``emitter`` is ``emit`` while anyone listens
    and None otherwise, so hot paths skip building events nobody reads (a plain attribute,
    kept current by ``subscribe``, because it is read several times per turn).
    """

    __slots__ = ("_handlers", "_on_handler_error", "emitter")

    def __init__(
        self,
        handlers: Iterable[EventHandler] = (),
        *,
        on_handler_error: Callable[[Event], None] | None = None,
    ) -> None:
        # A tuple: most runs have no subscriber, and the empty tuple is no object of theirs
        # for the cyclic collector to look at (issue 39).
        self._handlers = tuple(checked_handler(handler) for handler in handlers)
        self._on_handler_error = on_handler_error
        self.emitter: EventHandler | None = self.emit if self._handlers else None

    def subscribe(self, handler: EventHandler) -> None:
        self._handlers = (*self._handlers, checked_handler(handler))
        self.emitter = self.emit

    def emit(self, event: Event) -> None:
        for handler in self._handlers:
            try:
                handler(event)
            except Exception:
                if self._on_handler_error is not None:
                    self._on_handler_error(event)

    def __bool__(self) -> bool:
        return bool(self._handlers)
