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
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass

import structlog

from agent_fsm.acting import act
from agent_fsm.checkpoint import CheckpointStore
from agent_fsm.context import estimate_message_tokens
from agent_fsm.errors import ConfigError, RunError, ScriptExhaustedError
from agent_fsm.events import (
    AbortRequested,
    Event,
    EventHandler,
    FollowUpQueued,
    GuardTripped,
    MessageUpdated,
    ModelFailed,
    ModelRequested,
    ModelResponded,
    RunFinished,
    RunPaused,
    RunResumed,
    RunStarted,
    StateChanged,
    SteeringQueued,
)
from agent_fsm.limits import Limits
from agent_fsm.loops import record_reply_text
from agent_fsm.machine import AgentMachine, RunHandle
from agent_fsm.messages import (
    AssistantMessage,
    FinishReason,
    Message,
    ModelRequest,
    ModelResponse,
    ReplyDelta,
    SystemMessage,
    ToolCall,
    ToolMessage,
    TranscriptView,
    Usage,
    UserMessage,
)
from agent_fsm.models.base import Model, ModelCallError
from agent_fsm.scheduling import StopEvent
from agent_fsm.state import LoopState, ModelFailure, RunResult, RunState, RunStatus, TraceEntry
from agent_fsm.table import TERMINAL_STATES, AgentState, Row, StopReason
from agent_fsm.tools import ToolRegistry, skipped_result

__all__ = ["Reflector", "Run", "RunConfig", "new_run_state"]

_logger = structlog.get_logger("agent_fsm")

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


_RESUMABLE = frozenset(
    {StopReason.ASK_USER, StopReason.APPROVAL_REQUIRED, StopReason.ABORTED, StopReason.TIMEOUT}
)
"""Runs that ended with these can be resumed."""


def _failure(exc: BaseException) -> ModelFailure:
    """Classify an exception raised by a model call."""
    if isinstance(exc, ModelCallError):
        return ModelFailure(
            message=str(exc), permanent=not exc.transient, retry_after_s=exc.retry_after_s
        )
    transient = isinstance(exc, TimeoutError | ConnectionError)
    if isinstance(exc, ScriptExhaustedError):
        transient = False
    return ModelFailure(message=f"{type(exc).__name__}: {exc}", permanent=not transient)


def _with_call_ids(message: AssistantMessage, turn: int) -> AssistantMessage:
    """The message with every tool call given a non-empty id unique within the reply.

    Each result must name its call; a model that omits or repeats ids would otherwise make
    the transcript ambiguous. Ids the model chose are kept whenever they are usable.
    """
    seen: set[str] = set()
    fixed: list[ToolCall] = []
    changed = False
    for index, tool_call in enumerate(message.tool_calls):
        if not tool_call.id or tool_call.id in seen:
            tool_call = tool_call.model_copy(update={"id": f"call_{turn}_{index}"})
            changed = True
        seen.add(tool_call.id)
        fixed.append(tool_call)
    return message.model_copy(update={"tool_calls": tuple(fixed)}) if changed else message


class Run:
    """One run of an agent. Create it with ``Agent.start``; drive it with ``step``/``run``."""

    def __init__(self, config: RunConfig, state: RunState, *, resumed: str | None = None) -> None:
        self._config = config
        self._state = state
        self._handlers: list[EventHandler] = list(config.handlers)
        self._log = _logger.bind(run_id=state.run_id)
        self._started_at = config.clock() - state.elapsed_s
        self._handle: RunHandle | None = None
        self._result: RunResult | None = None
        self._announced = False
        self._resumed = resumed
        self._stop = StopEvent()
        """Set by abort() or the deadline: in-flight model and tool calls are cancelled."""
        self._scope: asyncio.Timeout | None = None
        """The cancel scope of the model call in flight, if any."""
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
        self._handlers.append(handler)

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
        self._emit(AbortRequested(run_id=state.run_id, reason=reason, turn=state.turns))
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
        self._emit(SteeringQueued(run_id=self.run_id, message=message, turn=self._state.turns))

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
        self._emit(FollowUpQueued(run_id=self.run_id, message=message, turn=self._state.turns))

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
        state = self._state
        if state.state in TERMINAL_STATES:
            raise RunError(f"run {state.run_id} has already ended in {state.state}", self._result)
        if self._handle is None:
            self._handle = self._config.machine.attach(state, self._config.limits)
        if not self._announced:
            self._announce()
        work = state.state
        if work is AgentState.OBSERVE:
            self._observe()
        elif work is AgentState.THINK:
            await self._think()
        elif work is AgentState.ACT:
            await self._act()
        else:
            await self._reflect()
        state.elapsed_s = self._config.clock() - self._started_at
        return self._after(self._config.machine.fire(self._handle))

    async def iterate(self) -> AsyncIterator[TraceEntry]:
        """Step until the run ends, yielding each transition."""
        while not self.done:
            yield await self.step()

    async def run(self) -> RunResult:
        """Step until the run ends; return its result."""
        while self._state.state not in TERMINAL_STATES:
            await self.step()
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
            self._emit(RunStarted(run_id=state.run_id, input=first))
        else:
            self._emit(
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
        """Cancel what is in flight: the model call's scope now, tool calls through the stop
        event that ``act`` watches."""
        self._stop.set()
        scope = self._scope
        if scope is not None and not scope.expired():
            scope.reschedule(0)

    def _interruption_text(self) -> str:
        state = self._state
        if state.abort_reason is not None:
            return state.abort_reason
        return f"the run's time limit of {self._config.limits.timeout_s:g} s was reached"

    # -- events -----------------------------------------------------------------------

    def _emit(self, event: Event) -> None:
        for handler in self._handlers:
            try:
                handler(event)
            except Exception:
                self._log.exception("event_handler_failed", kind=event.kind)

    @property
    def _emitter(self) -> Callable[[Event], None] | None:
        return self._emit if self._handlers else None

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

    async def _think(self) -> None:
        state = self._state
        previous = state.model_failure
        state.model_failure = None
        state.last_finish_reason = None
        state.last_tool_calls = 0
        if self._stop.is_set():
            self._interrupted()
            return
        scope = asyncio.timeout(None)
        try:
            async with scope:
                self._scope = scope
                response = await self._call_model(previous)
        except TimeoutError as exc:
            if scope.expired():
                self._interrupted()
            else:
                self._model_failed(_failure(exc))
            return
        except Exception as exc:
            self._model_failed(_failure(exc))
            return
        finally:
            self._scope = None
        self._take_reply(response)

    def _interrupted(self) -> None:
        """The model call was cancelled by abort() or the deadline (not a model error)."""
        self._model_failed(
            ModelFailure(
                message=f"the model call was interrupted: {self._interruption_text()}",
                permanent=True,
            ),
            counts=False,
        )

    async def _call_model(self, previous: ModelFailure | None) -> object:
        """Back off if this is a retry, then make one model call (turn += 1)."""
        state, config = self._state, self._config
        if previous is not None:
            await config.sleep(self._backoff(previous))
        state.turns += 1
        emit = self._emitter
        prompt_tokens = state.prompt_tokens_estimate + state.tools_tokens_estimate
        if emit is not None:
            emit(
                ModelRequested(
                    run_id=state.run_id,
                    turn=state.turns,
                    messages=len(state.messages),
                    estimated_prompt_tokens=prompt_tokens,
                )
            )
        request = ModelRequest(
            messages=TranscriptView(state.messages),
            tools=config.tools.specs,
            run_id=state.run_id,
            turn=state.turns,
            on_delta=self._delta_handler(state.turns) if emit is not None else None,
        )
        return await config.model.request(request)

    def _take_reply(self, response: object) -> None:
        state, config = self._state, self._config
        emit = self._emitter
        if not isinstance(response, ModelResponse):
            self._model_failed(
                ModelFailure(
                    message=f"the model returned {type(response).__name__}, not a ModelResponse",
                    permanent=False,
                )
            )
            return
        message = response.message
        usage = response.usage
        if usage is None:
            usage = Usage(
                input_tokens=state.prompt_tokens_estimate + state.tools_tokens_estimate,
                output_tokens=estimate_message_tokens(message),
                requests=1,
                estimated=True,
            )
        elif usage.requests != 1:
            usage = usage.model_copy(update={"requests": 1})
        state.usage = state.usage + usage
        if emit is not None:
            emit(
                ModelResponded(
                    run_id=state.run_id,
                    turn=state.turns,
                    text=message.content,
                    tool_calls=message.tool_calls,
                    finish_reason=response.finish_reason,
                    usage=usage,
                )
            )
        empty = not message.content and not message.tool_calls
        if empty and response.finish_reason in (FinishReason.STOP, FinishReason.TOOL_CALLS):
            self._model_failed(
                ModelFailure(message="the model returned an empty reply", permanent=False)
            )
            return
        if message.tool_calls:
            message = _with_call_ids(message, state.turns)
        else:
            state.output = message.content
        self._append(message)
        state.last_finish_reason = response.finish_reason
        state.last_tool_calls = len(message.tool_calls)
        record_reply_text(state.loop, message.content, config.limits)

    def _model_failed(self, failure: ModelFailure, *, counts: bool = True) -> None:
        state = self._state
        state.model_failure = failure
        if counts:
            state.consecutive_errors += 1
        self._log.warning(
            "model_call_failed",
            turn=state.turns,
            error=failure.message,
            permanent=failure.permanent,
        )
        emit = self._emitter
        if emit is not None:
            emit(
                ModelFailed(
                    run_id=state.run_id,
                    turn=state.turns,
                    message=failure.message,
                    permanent=failure.permanent,
                )
            )

    def _backoff(self, failure: ModelFailure) -> float:
        """Exponential backoff with jitter, never shorter than the server's Retry-After."""
        limits = self._config.limits
        attempt = max(self._state.consecutive_errors, 1)
        delay = min(limits.retry_backoff_max_s, limits.retry_backoff_s * 2.0 ** (attempt - 1))
        delay *= 0.5 + random.random() / 2
        return max(delay, failure.retry_after_s or 0.0)

    def _delta_handler(self, turn: int) -> Callable[[ReplyDelta], None]:
        def on_delta(delta: ReplyDelta) -> None:
            self._emit(MessageUpdated(run_id=self._state.run_id, turn=turn, delta=delta))

        return on_delta

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
            emit=self._emitter,
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
        state, reflector = self._state, self._config.reflector
        state.reflector_done = False
        if reflector is not None and state.control is None:
            verdict = reflector(state)
            if inspect.isawaitable(verdict):
                verdict = await verdict
            state.reflector_done = bool(verdict)

    # -- after a transition -----------------------------------------------------------

    def _after(self, row: Row) -> TraceEntry:
        state = self._state
        index = self._handle.taken if self._handle is not None else -1
        state.trace.append((index, state.turns))
        entry = TraceEntry.from_row(row, state.turns)
        self._log.debug(
            "transition",
            source=row.source,
            dest=row.dest,
            guards=row.guards,
            label=row.label,
            turn=state.turns,
        )
        if self._handlers:
            self._emit(
                StateChanged(
                    run_id=state.run_id,
                    source=row.source,
                    dest=row.dest,
                    trigger=row.trigger.value,
                    guards=row.guards,
                    label=row.label,
                    turn=state.turns,
                )
            )
        if row.dest in TERMINAL_STATES:
            self._finish(row)
        elif self._config.checkpoint_every_transition and self._config.store is not None:
            self._config.store.save(state)
        return entry

    def _finish(self, row: Row) -> None:
        state = self._state
        stop_reason = row.stop_reason
        assert stop_reason is not None
        if row.dest is AgentState.ERROR:
            state.error = self._describe_failure(stop_reason)
            state.output = None
        if row.source is AgentState.THINK and state.last_tool_calls:
            self._skip_open_calls(f"the run ended ({stop_reason.value}) before it could run")
        if self._handle is not None:
            self._config.machine.detach(self._handle)
            self._handle = None
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        result = RunResult.from_state(state, self._config.machine.rows)
        self._result = result
        self._checkpoint_final(stop_reason)
        self._log.info(
            "run_finished",
            status=result.status.value,
            stop_reason=stop_reason.value,
            turns=state.turns,
            tokens=state.usage.total_tokens,
        )
        if self._handlers:
            if result.status is RunStatus.NEEDS_INPUT and state.control is not None:
                self._emit(
                    RunPaused(
                        run_id=state.run_id,
                        stop_reason=stop_reason,
                        question=state.control.text,
                        pending_calls=state.control.pending_calls,
                    )
                )
            self._emit(
                GuardTripped(
                    run_id=state.run_id,
                    state=row.source,
                    guards=row.guards,
                    stop_reason=stop_reason,
                )
            )
            self._emit(
                RunFinished(
                    run_id=state.run_id,
                    status=result.status,
                    stop_reason=stop_reason,
                    final_state=result.final_state,
                    turns=state.turns,
                    usage=state.usage,
                    output=result.output,
                    error=result.error,
                )
            )

    def _checkpoint_final(self, stop_reason: StopReason) -> None:
        """Save the ended run: always in a durable store; in the in-process default store
        only while it can be resumed (and drop it once it cannot)."""
        store, state = self._config.store, self._state
        if store is None:
            return
        if self._config.checkpoint_every_transition or stop_reason in _RESUMABLE:
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

    def _describe_failure(self, reason: StopReason) -> str:
        state, limits = self._state, self._config.limits
        failure = state.model_failure
        descriptions = {
            StopReason.ABORTED: state.abort_reason or "aborted",
            StopReason.MODEL_ERROR: failure.message if failure else "the model call failed",
            StopReason.CONTENT_FILTER: "the provider's content filter withheld the reply",
            StopReason.CONSECUTIVE_ERRORS: (
                f"{state.consecutive_errors} consecutive errors "
                f"(limit {limits.max_consecutive_errors})"
            ),
            StopReason.TOKEN_BUDGET: (
                f"token budget of {limits.token_budget} exhausted: used "
                f"{state.usage.total_tokens}, next prompt needs about "
                f"{state.prompt_tokens_estimate + state.tools_tokens_estimate}"
            ),
            StopReason.MAX_TURNS: f"all {limits.max_turns} model calls used",
            StopReason.TIMEOUT: (
                f"timed out after {state.elapsed_s:.3g} s (limit {limits.timeout_s:g} s)"
            ),
            StopReason.LOOP_DETECTED: f"loop detected: {state.loop.detected}",
        }
        return descriptions.get(reason, reason.value)


def new_run_state(run_id: str, system_prompt: str, user_input: str, tools_tokens: int) -> RunState:
    """The state of a run that has not taken a step yet."""
    state = RunState(run_id=run_id, tools_tokens_estimate=tools_tokens)
    if system_prompt:
        system = SystemMessage(content=system_prompt)
        state.messages.append(system)
        state.prompt_tokens_estimate += estimate_message_tokens(system)
    state.pending_input.append(user_input)
    return state
