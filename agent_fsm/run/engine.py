"""One run: ``step()`` does the work of the current state, then fires exactly one trigger.

``iterate()`` and ``run()`` are loops over ``step()``; nothing else moves the machine, and no
trigger is ever fired from inside a callback. Model and tool work is awaited *between*
triggers, here, so the synchronous ``transitions`` machine never waits on I/O.

Per-turn work is O(1) amortised in the length of the run: the prompt-size estimate, error
counts and loop-detector state are kept incrementally, and the model receives a zero-copy
``TranscriptView`` of the transcript.

Where the run lives (in this process, in a durable store, leased from one, in a DBOS
workflow) is its ``RunKeeper``'s business (``run.residence``): this driver asks it for the
run's time and tool journal, and tells it when a step is in flight, after each step and when
the run stops, without a branch on which kind it is. When a leased run's lease was taken over,
the keeper's next save raises ``RunLeased`` and this driver stops without writing.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

from agent_fsm.cancellation import StopEvent
from agent_fsm.constructors import builder
from agent_fsm.errors import ConfigError, RunError, RunLeased
from agent_fsm.events import (
    AbortRequested,
    EventBus,
    EventHandler,
    FollowUpQueued,
    HistoryRepaired,
    RunResumed,
    RunStarted,
    StateChanged,
    SteeringQueued,
)
from agent_fsm.logs import RunLogger, get_logger, is_enabled_for
from agent_fsm.loop.machine import RunHandle
from agent_fsm.messages import (
    Message,
    SystemMessage,
    UserInput,
    UserMessage,
    clean_text,
    user_input,
)
from agent_fsm.output import typed_result
from agent_fsm.run.acting import act
from agent_fsm.run.answering import answer
from agent_fsm.run.compacting import compact
from agent_fsm.run.context import Reflector, RunConfig, RunContext
from agent_fsm.run.custom import custom_work
from agent_fsm.run.history import HistoryRepair
from agent_fsm.run.observing import observe, observe_guarded
from agent_fsm.run.outcome import ending_events, record_stop
from agent_fsm.run.parenting import act_as_parent, act_screened, settle_orphans
from agent_fsm.run.reflecting import reflect
from agent_fsm.run.residence import Cancellable, RunKeeper
from agent_fsm.run.summarising import summarise
from agent_fsm.run.thinking import think
from agent_fsm.state import (
    AgentRecord,
    RunResult,
    RunState,
    TraceEntry,
    reopen_fields,
    step_pair,
)
from agent_fsm.table import (
    LAST_CALL_STATE,
    TERMINAL_STATES,
    AgentState,
    Row,
    Trigger,
)
from agent_fsm.tokens import TextCounter, estimate_message_tokens, estimate_text_tokens

__all__ = ["Reflector", "Run", "RunConfig", "new_run_state"]


_TRIGGER_NAMES: dict[Trigger | str, str] = {trigger: trigger.value for trigger in Trigger}
_state_changed = builder(StateChanged)

_NOBODY_LISTENS = EventBus()
"""The bus of every run nobody listens to (an agent without handlers), until its first
subscriber (``Run.subscribe`` gives the run a bus of its own then): one shared bus, as it
holds no handler. A bus each, with its error handler, was two more objects every live run
held for the cyclic collector to look at (issue 39). Never subscribed to."""


_WORK: dict[AgentState | str, Callable[[RunContext], Awaitable[object] | None]] = {
    AgentState.OBSERVE: observe,
    AgentState.COMPACT: compact,
    AgentState.SUMMARISE: summarise,
    AgentState.THINK: think,
    AgentState.ACT: act,
    AgentState.REFLECT: reflect,
    AgentState.LAST_ANSWER: answer,
}
"""The work done in each state of the default loop before its trigger fires; a custom
state's is its own (``run.custom``)."""


def _work_for(config: RunConfig) -> dict[AgentState | str, Callable[[RunContext], Any]]:
    """The work of each state for the runs of ``config``: ``_WORK``, with OBSERVE's and
    ACT's variants for the features that need them (guardrails, the loop ladder,
    sub-agents), so an agent without them runs the plain work and pays nothing for them."""
    screens = "REFLECT" in config.screened_ends
    if not (config.input_guardrails or config.limits.loop_ladder or config.delegates or screens):
        return _WORK
    work = dict(_WORK)
    if config.input_guardrails or config.limits.loop_ladder:
        work[AgentState.OBSERVE] = observe_guarded
    if screens:
        work[AgentState.ACT] = act_screened
    elif config.delegates:
        work[AgentState.ACT] = act_as_parent
    return work


class Run:
    """One run of an agent. Create it with ``Agent.start``; drive it with ``step``/``run``."""

    def __init__(
        self,
        config: RunConfig,
        state: RunState,
        keeper: RunKeeper,
        *,
        resumed: str | None = None,
        repaired: HistoryRepair | None = None,
        path: tuple[str, ...] = (),
        home: object = None,
    ) -> None:
        log = RunLogger("agent_fsm", state.run_id)
        time = keeper.time
        self._config = config
        self._state = state
        self._keeper = keeper
        """Where the run lives: saves it, journals its calls, keeps its time."""
        # Asked once per run: the transition line is built only when it will be written.
        # Filtered out, building it still cost 6% of a turn's wall time (the interpreter's
        # call and keyword dict; callgrind counts 3% of instructions).
        self._debug = is_enabled_for(get_logger("agent_fsm"), logging.DEBUG)  # (binds no id)
        self._ctx = RunContext(
            state=state,
            config=config,
            bus=_bus(config.handlers, log) if config.handlers else _NOBODY_LISTENS,
            stop=StopEvent(),
            journal=keeper.journal,
            log=log,
            limits=config.limits,
            clock=time.clock,
            sleep=time.sleep,
            random=time.random,
            path=path,
            home=home,
        )
        self._started_at = time.clock() - state.elapsed_s
        self._handle: RunHandle | None = None
        self._result: RunResult | None = None
        self._announced = False
        self._resumed = resumed
        self._reopen_pending = resumed is not None
        self._abort_on_reopen: str | None = None
        """An abort asked before the resume row was taken: the run's, once it is."""
        """Reopened (after a stop or a crash), and the resume row not taken yet: the first
        step takes it."""
        self._repaired = repaired
        """What was repaired in the history the run started from, announced with its start."""
        self._deadline: Cancellable | None = None
        self._work = _work_for(config)

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
        """The run has stopped and is not waiting to take its resume row."""
        return self._state.state in TERMINAL_STATES and not self._reopen_pending

    @property
    def resumable(self) -> bool:
        """The run has stopped in a way ``Agent.resume`` can continue (with the answer its
        stop asks for): a row of the table's resume rows leaves it."""
        config = self._config
        return self.done and config.machine.can_resume(self._state, config.limits)

    @property
    def result(self) -> RunResult:
        """The outcome; raises RunError if the run has not ended yet."""
        if self._result is None:
            raise RunError(f"run {self.run_id} has not ended (state {self._state.state})")
        return self._result

    def subscribe(self, handler: EventHandler) -> None:
        """Deliver this run's events to ``handler`` from now on."""
        ctx = self._ctx
        if ctx.bus is _NOBODY_LISTENS:
            ctx.bus = _bus((handler,), ctx.log)
        else:
            ctx.bus.subscribe(handler)

    def abort(self, reason: str = "aborted by the caller") -> None:
        """Stop the run promptly: a model or tool call in flight is cancelled (its tool call
        answered as cancelled) and the run ends in ERROR ``aborted`` at its next transition,
        with a valid transcript and a checkpoint; ``Agent.resume`` can continue it.

        Call it from the run's event loop (another task, or a callback); from another thread
        use ``loop.call_soon_threadsafe(run.abort)``.
        """
        state = self._state
        if self.done:
            return
        if self._reopen_pending:  # kept past the resume row, which clears a stop's fields
            if self._abort_on_reopen is not None:
                return
            self._abort_on_reopen = reason
        elif state.abort_reason is not None:
            return
        else:
            state.abort_reason = reason
        self._ctx.bus.emit(AbortRequested(run_id=state.run_id, reason=reason, turn=state.turns))
        self._interrupt()

    def steer(self, message: UserInput) -> None:
        """Give the active run a new user message now: a text, or like a run's input, a list
        of texts, images and files.

        It is checked after each tool call finishes: the calls of the current turn that have
        not started are answered "skipped" and the message is observed before the next model
        call. Every message costs model calls like any other, so steering never lets a run
        escape its turn limit.

        Raises:
            RunError: when the run has ended (a paused run continues with ``Agent.resume``).
            ConfigError: when the message is neither, or holds an image or file the model's
                provider cannot take (``RunConfig.part_support``).
        """
        self._check_open()
        taken = user_input(message)
        support = self._config.part_support
        if isinstance(taken, UserMessage) and support is not None:
            why = support.request_problem(taken.parts)
            if why is not None:
                raise ConfigError(f"this message cannot be sent to the model: {why}")
        self._state.pending_input.append(taken)
        text = taken if isinstance(taken, str) else taken.content
        self._ctx.bus.emit(SteeringQueued(run_id=self.run_id, message=text, turn=self._state.turns))

    def follow_up(self, message: str) -> None:
        """Queue a user message for when the run would otherwise end (a final answer): the
        run then observes it and goes on. Follow-ups are delivered one per cycle and counted
        by the same limits, so an endless source of them still stops at ``max_turns``.

        Raises:
            RunError: when the run has ended.
            ConfigError: when the message is not a string.
        """
        self._check_queueable(message)
        self._state.follow_ups.append(clean_text(message))
        self._ctx.bus.emit(
            FollowUpQueued(run_id=self.run_id, message=message, turn=self._state.turns)
        )

    def _check_queueable(self, message: object) -> None:
        if not isinstance(message, str):
            raise ConfigError(f"a message must be a str, got {type(message).__name__}")
        self._check_open()

    def _check_open(self) -> None:
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
            RunLeased: the run's lease was taken over: this driver must stop (nothing of
                this step was saved).
        """
        try:
            row = await self._advance()
        except RunLeased:
            self._release()
            raise
        return TraceEntry.from_row(row, self._state.turns)

    async def _advance(self) -> Row:
        """Do the current state's work and fire one trigger; return the row taken."""
        state, config = self._state, self._config
        reopened = self._reopen_pending
        if state.state in TERMINAL_STATES and not reopened:
            raise RunError(f"run {state.run_id} has already ended in {state.state}", self._result)
        if reopened:
            self._keeper.claim_stop(state)
        if self._handle is None:
            self._handle = config.machine.handle(state, config.limits, config.dead_guards)
        if not self._announced:
            self._announce()
        if reopened:  # take the resume row: out of the stop, or into the step that crashed
            row = self._take_resume_row(self._handle)
        else:
            doing = self._work.get(state.state)
            work = (
                doing(self._ctx)
                if doing is not None
                else custom_work(self._ctx, config.machine.custom[state.state])
            )
            if work is not None:
                await self._keeper.during(work)
            state.elapsed_s = self._ctx.clock() - self._started_at
            row = config.machine.fire(self._handle)
        self._after(row)
        if row.ends:
            if config.delegates:  # a child left waiting at a pause nobody will answer
                await settle_orphans(self._ctx, row)
            self._finish(row)
        elif not row.saves_later:  # one write transaction fewer per turn
            self._keeper.saved(state)
        return row

    def _take_resume_row(self, handle: RunHandle) -> Row:
        """The first step of a reopened run: take its resume row, clear the fields of the
        stop it leaves, and keep an abort asked before it (``abort``)."""
        state = self._state
        row = self._config.machine.resume(handle)
        if row is None:  # reopen checked that one accepts it; nothing changed since
            raise RunError(f"run {state.run_id}: no resume row accepts it any more")
        self._reopen_pending = False
        if row.source in TERMINAL_STATES:
            reopen_fields(state, stopped=True)
        if self._abort_on_reopen is not None:  # aborted before it took the row
            state.abort_reason = self._abort_on_reopen
        return row

    async def iterate(self) -> AsyncIterator[TraceEntry]:
        """Step until the run ends, yielding each transition."""
        while not self.done:
            yield await self.step()

    async def run(self) -> RunResult:
        """Step until the run ends; return its result.

        Raises:
            RunLeased: the run's lease was taken over by another worker (this driver stopped
                at its next save, writing nothing; the other one carries the run on).
        """
        try:
            ended = self.done
            while not ended:
                ended = (await self._advance()).ends  # a row into DONE or ERROR ends it
        except BaseException:
            self._release()  # a driver that gives up lets the run go at once
            raise
        return self.result

    def _announce(self) -> None:
        """First step of this activation: start the deadline, say so, tell the keeper."""
        state, config = self._state, self._config
        self._announced = True
        time = self._keeper.time
        self._started_at = time.clock() - state.elapsed_s
        self._ctx.started_at = self._started_at
        remaining = max(config.limits.timeout_s - state.elapsed_s, 0.0)
        self._deadline = time.arm_deadline(remaining, self._time_up)
        bus = self._ctx.bus
        if self._resumed is None:
            first = state.pending_input[0] if state.pending_input else ""
            if isinstance(first, UserMessage):
                first = first.content
            bus.emit(RunStarted(run_id=state.run_id, input=first, path=self._ctx.path))
            repaired = self._repaired
            if repaired:
                bus.emit(
                    HistoryRepaired(
                        run_id=state.run_id,
                        answered=repaired.answered,
                        dropped=repaired.dropped,
                        system_messages=repaired.system_messages,
                        ids=repaired.ids,
                        names=repaired.names,
                    )
                )
        else:
            resume_row = config.machine.resume_row(state, config.limits)
            continues_in = resume_row.dest if resume_row is not None else state.state
            bus.emit(
                RunResumed(
                    run_id=state.run_id,
                    state=continues_in,
                    answered=self._resumed,
                    turn=state.turns,
                )
            )
        # A new run was saved as it was admitted, where it is kept (``Residence.admit``); a
        # reopened run is saved once its resume row is taken: until then its answer is not
        # accepted, and a crash leaves the checkpoint as it was.
        self._keeper.activated(self.abort)

    def _release(self) -> None:
        """Let the run go where it lives (a leased run gives its lease up)."""
        self._keeper.release()

    def _time_up(self) -> None:
        self._state.timed_out = True
        if self._state.state is not LAST_CALL_STATE:  # the last answer has its own limit
            self._interrupt()

    def _interrupt(self) -> None:
        """Cancel what is in flight: the model call or the tool calls, through the stop
        event their scopes watch."""
        self._ctx.stop.set()

    # -- after a transition -----------------------------------------------------------

    def _after(self, row: Row) -> None:
        state = self._state
        index = self._handle.taken if self._handle is not None else -1
        # a pair every run shares (``state.step_pair``), the one record of the transition:
        # the result's trace (``state.Trace``) reads it, building TraceEntry records on read
        state.trace.append(step_pair(index, state.turns))
        if self._debug:
            self._ctx.log.debug(
                "transition",
                source=row.source,
                dest=row.dest,
                guards=row.guards,
                label=row.label,
                turn=state.turns,
            )
        emit = self._ctx.bus.emitter
        if emit is not None:
            emit(
                _state_changed(
                    run_id=state.run_id,
                    source=row.source,
                    dest=row.dest,
                    trigger=_TRIGGER_NAMES.get(row.trigger, row.trigger),
                    guards=row.guards,
                    label=row.label,
                    turn=state.turns,
                )
            )

    def _finish(self, row: Row) -> None:
        state, config = self._state, self._config
        record_stop(self._ctx, row)
        self._handle = None
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        result = RunResult.from_state(state, config.machine.rows)
        if config.output is not None:
            result = typed_result(result, config.output)
        self._result = result
        stop = result.stop_reason
        self._keeper.stopped(state, stop, stop in config.machine.resumable)
        self._release()
        self._ctx.log.info(
            "run_finished",
            status=result.status.value,
            stop_reason=result.stop_reason.value,
            turns=state.turns,
            tokens=state.usage.total_tokens,
        )
        emit = self._ctx.bus.emitter
        if emit is not None:
            for event in ending_events(state, row, result):
                emit(event)


def _bus(handlers: Sequence[EventHandler], log: RunLogger) -> EventBus:
    """A run's own bus; a handler that raises is logged (not a method of the ``Run``: a bus
    holding one would make every Run a cycle)."""
    return EventBus(handlers, on_handler_error=log.handler_failed)


def new_run_state(
    run_id: str,
    system_prompt: str,
    user_input: str | UserMessage,
    tools_tokens: int,
    history: Sequence[Message] = (),
    count: TextCounter = estimate_text_tokens,
    agent: AgentRecord | None = None,
) -> RunState:
    """The state of a run that has not taken a step yet: the system prompt, then ``history``
    (already repaired: ``run.history``), with ``user_input`` waiting to be observed."""
    messages: list[Message] = (
        [SystemMessage(content=clean_text(system_prompt))] if system_prompt else []
    )
    messages.extend(history)
    return RunState(
        run_id=run_id,
        agent=agent,
        messages=messages,
        prompt_tokens_estimate=sum(estimate_message_tokens(m, count) for m in messages),
        tools_tokens_estimate=tools_tokens,
        pending_input=[clean_text(user_input) if isinstance(user_input, str) else user_input],
    )
