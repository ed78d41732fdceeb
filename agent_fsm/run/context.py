"""What the work of every state receives: one ``RunContext`` per run.

Each state's work (``observing``, ``thinking``, ``acting``, ``reflecting``) is a function of
the context alone: the run's state, the agent's frozen configuration, the event bus, the stop
signal, the tool journal, the clock and the logger. The few writes that several states share
(the transcript and its size estimate, the consecutive-error count) are methods here, so each
RunState field has the writers ``state.py`` declares.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from agent_fsm.cancellation import StopEvent
from agent_fsm.compaction import ContextPolicy
from agent_fsm.durable.checkpoint import CheckpointStore
from agent_fsm.durable.journal import ToolJournal
from agent_fsm.durable.leases import LeaseStore
from agent_fsm.events import EventBus, EventHandler
from agent_fsm.hooks import StepHooks
from agent_fsm.limits import Limits
from agent_fsm.loop.machine import AgentMachine
from agent_fsm.messages import Message
from agent_fsm.models.base import Model
from agent_fsm.output import OutputSpec
from agent_fsm.prompt import ContextEdits, prompt_messages
from agent_fsm.state import RunState
from agent_fsm.table import Row, StopReason
from agent_fsm.tokens import TextCounter, estimate_message_tokens, estimate_text_tokens
from agent_fsm.tools.tool import ToolRegistry

__all__ = ["ArmDeadline", "InProcessRuns", "Reflector", "RunConfig", "RunContext", "call_later"]

Reflector = Callable[[RunState], bool | Awaitable[bool]]
"""Optional hook called in REFLECT: return True to end the run as done (REFLECTOR_DONE)."""

ArmDeadline = Callable[[float, Callable[[], None]], asyncio.TimerHandle | None]
"""Starts a run's deadline timer: ``arm(seconds, time_up)`` (``RunConfig.arm_deadline``)."""


def call_later(seconds: float, time_up: Callable[[], None]) -> asyncio.TimerHandle:
    """The default deadline timer: the running event loop's ``call_later``."""
    return asyncio.get_running_loop().call_later(seconds, time_up)


class InProcessRuns:
    """What an agent's in-process store cannot say about the runs it does not hold.

    Without a store of its own, an agent keeps a run only while it can be resumed, and a
    resumed run leaves the store until it stops again (so a second resume of the same pause,
    a double-clicked Approve, finds nothing to carry out twice). This remembers how the
    latest dropped runs ended, and which runs are out being resumed, so that ``resume`` says
    "it finished" or "it is being resumed" (``ResumeError``) instead of "no such run".
    Bounded: past ``keep`` ended ids the oldest are forgotten.
    """

    __slots__ = ("_ended", "_keep", "_resuming")

    def __init__(self, keep: int = 10_000) -> None:
        self._keep = keep
        self._ended: OrderedDict[str, StopReason] = OrderedDict()
        self._resuming: set[str] = set()

    def ended(self, run_id: str, stop_reason: StopReason) -> None:
        self._resuming.discard(run_id)
        self._ended[run_id] = stop_reason
        self._ended.move_to_end(run_id)
        if len(self._ended) > self._keep:
            self._ended.popitem(last=False)

    def how_it_ended(self, run_id: str) -> StopReason | None:
        return self._ended.get(run_id)

    def resuming(self, run_id: str) -> None:
        self._resuming.add(run_id)

    def stopped(self, run_id: str) -> None:
        """The run stopped again (and is back in the store, if it can be resumed)."""
        self._resuming.discard(run_id)

    def is_resuming(self, run_id: str) -> bool:
        return run_id in self._resuming


@dataclass(frozen=True, slots=True, kw_only=True)
class RunConfig:
    """What a run needs from its agent: frozen, shared by every run of the agent."""

    model: Model
    tools: ToolRegistry
    limits: Limits
    machine: AgentMachine
    tools_tokens: int = 0
    count_tokens: TextCounter = estimate_text_tokens
    """Counts a text's tokens for every estimate: the model's own tokenizer if it has one."""
    context_policies: tuple[ContextPolicy, ...] = ()
    """Shrink a prompt that does not fit the context window, in order (COMPACT)."""
    reflector: Reflector | None = None
    hooks: StepHooks | None = None
    """The per-step hooks (``Agent(hooks=...)``); None when no hook is set, so a run without
    hooks pays one attribute check per model call and per turn of tool calls."""
    output: OutputSpec | None = None
    """What the final answer must be (``Agent(output_type=...)``); None for free text."""
    last_answer_prompt: str | None = None
    """Asks for the last answer when a limit ends the run (``Limits.last_answer``);
    ``{reason}`` in it becomes why. None: ``run.answering.LAST_ANSWER_PROMPT``."""
    parallel_tool_calls: bool = True
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    random: Callable[[], float] = random.random
    """The jitter of the model-retry backoff (``run.thinking.backoff_s``): one number in
    [0, 1) per retry, drawn in the run's task. Replaceable for deterministic tests, and for a
    run that is replayed (``agent_fsm.dbos`` seeds one per run, so that a replay waits as
    long as the first execution did). A tool's own retries draw inside its call
    (``tools.execution.retry_delay``)."""
    arm_deadline: ArmDeadline = call_later
    """Starts the run's deadline timer, once per activation: ``arm_deadline(seconds,
    time_up)`` must call ``time_up`` from the run's event loop once ``seconds`` have passed,
    and return a handle whose ``cancel()`` stops it, or None when there is nothing to stop.
    ``time_up`` marks the run timed out and cancels the work in flight. A runner that keeps
    the deadline on a clock of its own returns None and never calls it: ``agent_fsm.dbos``
    enforces it inside each step against the run's recorded clock, because a real-time timer
    would fire at a different point of a replay than of the first execution."""
    handlers: tuple[EventHandler, ...] = ()
    store: CheckpointStore | None = None
    checkpoint_every_transition: bool = False
    """Save after every transition (a durable store), or only runs that end resumable
    (paused, aborted, timed out) so that ``Agent.resume`` works in-process."""
    leases: LeaseStore | None = None
    """The store, when runs are leased (``Agent(lease_s=...)``): a run is claimed before it
    is created or loaded, renewed while it is driven, and released when it stops."""
    lease_s: float = 30.0
    """How long a lease lasts from each renewal."""
    worker_id: str = ""
    """Who holds this agent's leases (``Agent(worker_id=...)``)."""
    in_process: InProcessRuns = field(default_factory=InProcessRuns)
    """What the in-process store knows of the runs it does not hold (``InProcessRuns``)."""


@dataclass(slots=True, kw_only=True, eq=False)
class RunContext:
    """One run's state with everything its work may use; built once per ``Run``."""

    state: RunState
    config: RunConfig
    bus: EventBus
    stop: StopEvent
    """Set by ``Run.abort`` or the deadline: in-flight model and tool calls are cancelled."""
    journal: ToolJournal | None
    """Records every tool call before and after it runs (durable stores only)."""
    log: Any
    """The structlog logger, with the run id bound."""
    limits: Limits
    """The run budgets (``RunConfig.limits``)."""
    clock: Callable[[], float]
    """The agent's time source (``RunConfig.clock``)."""
    sleep: Callable[[float], Awaitable[None]]
    """The agent's backoff sleep (``RunConfig.sleep``)."""

    def entering_row(self) -> Row | None:
        """The row that took the run into the state it is in (``entering_index``)."""
        index = self.entering_index()
        return None if index is None else self.config.machine.rows[index]

    def entering_index(self) -> int | None:
        """The table index of the row that took the run into the state it is in: the last of
        its trace, looking past the rows that restarted the state after a crash (its work is
        done again, as if that row had just been taken). None before the first transition."""
        rows = self.config.machine.rows
        for index, _ in reversed(self.state.trace):
            if not rows[index].restarts:
                return index
        return None

    def emitter(self) -> EventHandler | None:
        """Where events go while anyone listens; None when nobody does."""
        return self.bus.emitter

    def steered(self) -> str | None:
        """Asked after each tool call: a steering message skips the calls not yet started."""
        if self.state.pending_input:
            return "a new user message arrived, so this call was not run"
        return None

    def append(self, message: Message) -> None:
        """Add ``message`` to the transcript and its size to the prompt estimate.

        Its text must be clean of lone surrogates (the transcript is checkpointed, traced and
        sent to providers, all as UTF-8): text is cleaned where it enters the run (the user's
        input and answers, the model's reply, a tool's result), not here on every append."""
        state = self.state
        state.messages.append(message)
        state.prompt_tokens_estimate += estimate_message_tokens(message, self.config.count_tokens)

    def edit_context(self, edits: ContextEdits) -> None:
        """Send the transcript through ``edits`` from now on; the prompt estimate becomes
        that of the prompt they give (O(prompt), once per compaction)."""
        state, count = self.state, self.config.count_tokens
        state.context = edits
        state.prompt_tokens_estimate = sum(
            estimate_message_tokens(message, count)
            for message in prompt_messages(state.messages, edits)
        )

    def count_failure(self) -> None:
        """One more failure in a row: a failed model call, or a turn whose calls all failed."""
        self.state.consecutive_errors += 1

    def clear_failures(self) -> None:
        """A tool call succeeded: the run is making progress again."""
        self.state.consecutive_errors = 0

    def why_stopped(self) -> str:
        """Why in-flight work was stopped: the abort reason, or the time limit."""
        if self.state.abort_reason is not None:
            return self.state.abort_reason
        return f"the run's time limit of {self.limits.timeout_s:g} s was reached"
