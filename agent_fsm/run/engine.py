"""One run: ``step()`` does the work of the current state, then fires exactly one trigger.

``iterate()`` and ``run()`` are loops over ``step()``; nothing else moves the machine, and no
trigger is ever fired from inside a callback. Model and tool work is awaited *between*
triggers, here, so the synchronous ``transitions`` machine never waits on I/O.

Per-turn work is O(1) amortised in the length of the run: the prompt-size estimate, error
counts and loop-detector state are kept incrementally, and the model receives a zero-copy
``TranscriptView`` of the transcript.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from agent_fsm.cancellation import StopEvent
from agent_fsm.durable.checkpoint import CheckpointStore
from agent_fsm.errors import ConfigError, RunError
from agent_fsm.events import (
    AbortRequested,
    Event,
    EventBus,
    EventHandler,
    FollowUpQueued,
    RunResumed,
    RunStarted,
    StateChanged,
    SteeringQueued,
)
from agent_fsm.limits import Limits
from agent_fsm.loop.machine import AgentMachine, RunHandle
from agent_fsm.messages import (
    AssistantMessage,
    Message,
    SystemMessage,
    ToolCall,
    ToolMessage,
    UserMessage,
)
from agent_fsm.models.base import Model
from agent_fsm.records import builder
from agent_fsm.run.acting import act
from agent_fsm.run.outcome import RESUMABLE, describe_failure, ending_events
from agent_fsm.run.thinking import Thinking
from agent_fsm.state import LoopState, RunResult, RunState, TraceEntry
from agent_fsm.table import TERMINAL_STATES, AgentState, Row, StopReason, Trigger
from agent_fsm.tokens import estimate_message_tokens
from agent_fsm.tools.tool import ToolRegistry, skipped_result

__all__ = ["Reflector", "Run", "RunConfig", "new_run_state"]

_logger = structlog.get_logger("agent_fsm")

_TRIGGER_NAMES = {trigger: trigger.value for trigger in Trigger}
_state_changed = builder(StateChanged)


def _debug_enabled(log: Any) -> bool:
    """Whether ``log`` emits debug lines, asked once per run so that the line logged on every
    transition costs nothing when it is filtered out. A logger that cannot say (structlog
    before 25.1, a custom wrapper class) is assumed to emit, and filters by itself."""
    check = getattr(log, "is_enabled_for", None)
    if check is None:
        return True
    try:
        return bool(check(logging.DEBUG))
    except Exception:
        return True


Reflector = Callable[[RunState], bool | Awaitable[bool]]
"""Optional hook called in REFLECT: return True to end the run as done (REFLECTOR_DONE)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RunConfig:
    """What a run needs from its agent: frozen, shared by every run of the agent."""

    model: Model
    tools: ToolRegistry
    limits: Limits
    machine: AgentMachine
    tools_tokens: int = 0
    reflector: Reflector | None = None
    parallel_tool_calls: bool = True
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    handlers: tuple[EventHandler, ...] = ()
    store: CheckpointStore | None = None
    checkpoint_every_transition: bool = False
    """Save after every transition (a durable store), or only runs that end resumable
    (paused, aborted, timed out) so that ``Agent.resume`` works in-process."""


class Run:
    """One run of an agent. Create it with ``Agent.start``; drive it with ``step``/``run``."""

    def __init__(self, config: RunConfig, state: RunState, *, resumed: str | None = None) -> None:
        self._config = config
        self._state = state
        self._log = _logger.bind(run_id=state.run_id)
        self._debug = _debug_enabled(self._log)
        self._bus = EventBus(config.handlers, on_handler_error=self._handler_failed)
        self._started_at = config.clock() - state.elapsed_s
        self._handle: RunHandle | None = None
        self._result: RunResult | None = None
        self._announced = False
        self._resumed = resumed
        self._entries: list[TraceEntry] = []
        """The trace entries of the transitions this Run object fired, for ``step`` and the
        result (a resumed run's earlier ones are built from ``state.trace`` at the end)."""
        self._stop = StopEvent()
        """Set by abort() or the deadline: in-flight model and tool calls are cancelled."""
        self._thinking = Thinking(
            state,
            model=config.model,
            tools=config.tools.specs,
            limits=config.limits,
            sleep=config.sleep,
            stop=self._stop,
            bus=self._bus,
            append=self._append,
            log=self._log,
        )
        self._deadline: asyncio.TimerHandle | None = None
        self._journal = (
            config.store.journal(state.run_id)
            if config.store is not None and config.checkpoint_every_transition
            else None
        )

    # -- public surface ---------------------------------------------------------------

    @property
    def run_id(self) -> str:
        return self._state.run_id

    @property
    def state(self) -> RunState:
        """The live RunState (read it, do not mutate it)."""
        return self._state

    @property
    def done(self) -> bool:
        return self._state.state in TERMINAL_STATES

    @property
    def result(self) -> RunResult:
        """The outcome; raises RunError if the run has not ended yet."""
        if self._result is None:
            raise RunError(f"run {self.run_id} has not ended (state {self._state.state})")
        return self._result

    def subscribe(self, handler: EventHandler) -> None:
        """Deliver this run's events to ``handler`` from now on."""
        self._bus.subscribe(handler)

    def abort(self, reason: str = "aborted by the caller") -> None:
        """Stop the run promptly: a model or tool call in flight is cancelled (its tool call
        answered as cancelled) and the run ends in ERROR ``aborted`` at its next transition,
        with a valid transcript and a checkpoint; ``Agent.resume`` can continue it.

        Call it from the run's event loop (another task, or a callback); from another thread
        use ``loop.call_soon_threadsafe(run.abort)``.
        """
        state = self._state
        if state.abort_reason is not None or self.done:
            return
        state.abort_reason = reason
        self._bus.emit(AbortRequested(run_id=state.run_id, reason=reason, turn=state.turns))
        self._interrupt()

    def steer(self, message: str) -> None:
        """Give the active run a new user message now.

        It is checked after each tool call finishes: the calls of the current turn that have
        not started are answered "skipped" and the message is observed before the next model
        call. Every message costs model calls like any other, so steering never lets a run
        escape its turn limit.

        Raises:
            RunError: when the run has ended (a paused run continues with ``Agent.resume``).
            ConfigError: when the message is not a string.
        """
        self._check_queueable(message)
        self._state.pending_input.append(message)
        self._bus.emit(SteeringQueued(run_id=self.run_id, message=message, turn=self._state.turns))

    def follow_up(self, message: str) -> None:
        """Queue a user message for when the run would otherwise end (a final answer): the
        run then observes it and goes on. Follow-ups are delivered one per cycle and counted
        by the same limits, so an endless source of them still stops at ``max_turns``.

        Raises:
            RunError: when the run has ended.
            ConfigError: when the message is not a string.
        """
        self._check_queueable(message)
        self._state.follow_ups.append(message)
        self._bus.emit(FollowUpQueued(run_id=self.run_id, message=message, turn=self._state.turns))

    def _check_queueable(self, message: object) -> None:
        if not isinstance(message, str):
            raise ConfigError(f"a message must be a str, got {type(message).__name__}")
        if self.done:
            raise RunError(
                f"run {self.run_id} has ended ({self._state.state}); a paused run continues "
                "with Agent.resume(run_id, ...)",
                self._result,
            )

    async def step(self) -> TraceEntry:
        """Do the current state's work, then fire exactly one trigger; return the transition.

        Raises:
            RunError: when the run has already ended.
        """
        await self._advance()
        return self._entries[-1]

    async def _advance(self) -> Row:
        """Do the current state's work and fire one trigger; return the row taken."""
        state = self._state
        if state.state in TERMINAL_STATES:
            raise RunError(f"run {state.run_id} has already ended in {state.state}", self._result)
        if self._handle is None:
            self._handle = self._config.machine.handle(state, self._config.limits)
        if not self._announced:
            self._announce()
        work = state.state
        if work is AgentState.OBSERVE:
            self._observe()
        elif work is AgentState.THINK:
            await self._thinking.think()
        elif work is AgentState.ACT:
            await self._act()
        else:
            state.reflector_done = False
            if self._config.reflector is not None and state.control is None:
                await self._reflect()
        state.elapsed_s = self._config.clock() - self._started_at
        row = self._config.machine.fire(self._handle)
        self._after(row)
        return row

    async def iterate(self) -> AsyncIterator[TraceEntry]:
        """Step until the run ends, yielding each transition."""
        while not self.done:
            yield await self.step()

    async def run(self) -> RunResult:
        """Step until the run ends; return its result."""
        while self._state.state not in TERMINAL_STATES:
            await self._advance()
        return self.result

    def _announce(self) -> None:
        """First step of this activation: start the deadline, say so, take a checkpoint."""
        state, config = self._state, self._config
        self._announced = True
        self._started_at = config.clock() - state.elapsed_s
        remaining = max(config.limits.timeout_s - state.elapsed_s, 0.0)
        self._deadline = asyncio.get_running_loop().call_later(remaining, self._time_up)
        if self._resumed is None:
            first = state.pending_input[0] if state.pending_input else ""
            self._bus.emit(RunStarted(run_id=state.run_id, input=first))
        else:
            self._bus.emit(
                RunResumed(
                    run_id=state.run_id,
                    state=state.state,
                    answered=self._resumed,
                    turn=state.turns,
                )
            )
        if config.store is not None and config.checkpoint_every_transition:
            config.store.save(state)

    def _time_up(self) -> None:
        self._state.timed_out = True
        self._interrupt()

    def _interrupt(self) -> None:
        """Cancel what is in flight: the model call or the tool calls, through the stop
        event their scopes watch."""
        self._stop.set()

    # -- events -----------------------------------------------------------------------

    def _handler_failed(self, event: Event) -> None:
        self._log.exception("event_handler_failed", kind=event.kind)

    # -- the work of each state --------------------------------------------------------

    def _append(self, message: Message) -> None:
        self._state.messages.append(message)
        self._state.prompt_tokens_estimate += estimate_message_tokens(message)

    def _observe(self) -> None:
        state = self._state
        taken = bool(state.pending_input)
        while state.pending_input:
            self._append(UserMessage(content=state.pending_input.pop(0)))
        if not taken and state.follow_ups and state.turns and not state.last_tool_calls:
            # The last reply would have ended the run: deliver one follow-up.
            self._append(UserMessage(content=state.follow_ups.pop(0)))
            taken = True
        if taken and state.turns:
            # New words from the user change the situation: repeats before them are no loop.
            state.loop = LoopState()

    async def _act(self) -> None:
        state = self._state
        if state.approvals:
            await self._carry_out_approvals()
            return
        last = state.messages[-1]
        calls = last.tool_calls if isinstance(last, AssistantMessage) else ()
        for result in await self._run_tools(calls):
            self._append(result)

    async def _run_tools(
        self, calls: Sequence[ToolCall], approved: Collection[str] = ()
    ) -> list[ToolMessage]:
        state, config = self._state, self._config
        return await act(
            state,
            calls,
            config.tools,
            config.limits,
            parallel=config.parallel_tool_calls,
            emit=self._bus.emitter,
            clock=config.clock,
            sleep=config.sleep,
            journal=self._journal,
            interruption=self._steered,
            stop=self._stop,
            approved=approved,
        )

    def _steered(self) -> str | None:
        """Asked after each tool call: a steering message skips the calls not yet started."""
        if self._state.pending_input:
            return "a new user message arrived, so this call was not run"
        return None

    async def _carry_out_approvals(self) -> None:
        """Run the calls a person allowed, refuse the others, and tell the model the outcome
        of each in the next user message (the calls were answered "awaiting approval" when
        the run paused, so the transcript is valid throughout)."""
        state = self._state
        control = state.control
        assert control is not None
        decisions = state.approvals
        allowed = [call for call in control.pending_calls if decisions[call.id].allow]
        allowed_ids = {call.id for call in allowed}
        results = {r.tool_call_id: r for r in await self._run_tools(allowed, allowed_ids)}
        lines = ["Decisions on the tool calls that awaited approval:"]
        for call in control.pending_calls:
            decision = decisions[call.id]
            why = f" Reason given: {decision.reason}" if decision.reason else ""
            result = results.get(call.id)
            if result is None:
                lines.append(f"- {call.name} (call {call.id}): denied, so it was not run.{why}")
            else:
                outcome = "approved, but it failed" if result.is_error else "approved and run"
                lines.append(
                    f"- {call.name} (call {call.id}): {outcome}.{why} Result: {result.content}"
                )
        state.pending_input.append("\n".join(lines))
        state.approvals = {}
        state.control = None

    async def _reflect(self) -> None:
        """Ask the agent's reflector (there is one, and no control tool ended the turn)."""
        reflector = self._config.reflector
        assert reflector is not None
        verdict = reflector(self._state)
        if inspect.isawaitable(verdict):
            verdict = await verdict
        self._state.reflector_done = bool(verdict)

    # -- after a transition -----------------------------------------------------------

    def _after(self, row: Row) -> None:
        state = self._state
        index = self._handle.taken if self._handle is not None else -1
        state.trace.append((index, state.turns))
        self._entries.append(TraceEntry.from_row(row, state.turns))
        if self._debug:
            self._log.debug(
                "transition",
                source=row.source,
                dest=row.dest,
                guards=row.guards,
                label=row.label,
                turn=state.turns,
            )
        emit = self._bus.emitter
        if emit is not None:
            emit(
                _state_changed(
                    run_id=state.run_id,
                    source=row.source,
                    dest=row.dest,
                    trigger=_TRIGGER_NAMES[row.trigger],
                    guards=row.guards,
                    label=row.label,
                    turn=state.turns,
                )
            )
        if row.dest in TERMINAL_STATES:
            self._finish(row)
        elif self._config.checkpoint_every_transition and self._config.store is not None:
            self._config.store.save(state)

    def _finish(self, row: Row) -> None:
        state = self._state
        stop_reason = row.stop_reason
        assert stop_reason is not None
        if row.dest is AgentState.ERROR:
            state.error = describe_failure(state, self._config.limits, stop_reason)
            state.output = None
        if row.source is AgentState.THINK and state.last_tool_calls:
            self._skip_open_calls(f"the run ended ({stop_reason.value}) before it could run")
        self._handle = None
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        result = RunResult.from_state(state, self._config.machine.rows, self._entries)
        self._result = result
        self._checkpoint_final(stop_reason)
        self._log.info(
            "run_finished",
            status=result.status.value,
            stop_reason=stop_reason.value,
            turns=state.turns,
            tokens=state.usage.total_tokens,
        )
        emit = self._bus.emitter
        if emit is not None:
            for event in ending_events(state, row, result):
                emit(event)

    def _checkpoint_final(self, stop_reason: StopReason) -> None:
        """Save the ended run: always in a durable store; in the in-process default store
        only while it can be resumed (and drop it once it cannot)."""
        store, state = self._config.store, self._state
        if store is None:
            return
        if self._config.checkpoint_every_transition or stop_reason in RESUMABLE:
            store.save(state)
        elif store.exists(state.run_id):
            store.delete(state.run_id)

    def _skip_open_calls(self, reason: str) -> None:
        """Answer the calls of a reply the run will not act on, so none is left orphaned."""
        last = self._state.messages[-1]
        if isinstance(last, AssistantMessage):
            for tool_call in last.tool_calls:
                self._append(skipped_result(tool_call, reason))
        self._state.last_tool_calls = 0


def new_run_state(run_id: str, system_prompt: str, user_input: str, tools_tokens: int) -> RunState:
    """The state of a run that has not taken a step yet."""
    state = RunState(run_id=run_id, tools_tokens_estimate=tools_tokens)
    if system_prompt:
        system = SystemMessage(content=system_prompt)
        state.messages.append(system)
        state.prompt_tokens_estimate += estimate_message_tokens(system)
    state.pending_input.append(user_input)
    return state
