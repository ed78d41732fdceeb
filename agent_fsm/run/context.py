"""What the work of every state receives: one ``RunContext`` per run.

Each state's work (``observing``, ``thinking``, ``acting``, ``reflecting``) is a function of
the context alone: the run's state, the agent's frozen configuration, the event bus, the stop
signal, the tool journal, the run's time and the logger. The few writes that several states share
(the transcript and its size estimate, the consecutive-error count) are methods here, so each
RunState field has the writers ``state.py`` declares.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Awaitable, Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from agent_fsm.cancellation import StopEvent
from agent_fsm.compaction import ContextPolicy
from agent_fsm.content import PartSupport
from agent_fsm.durable.journal import ToolJournal
from agent_fsm.events import EventBus, EventHandler
from agent_fsm.guardrails import Guardrail
from agent_fsm.hooks import StepHooks
from agent_fsm.limits import Limits
from agent_fsm.loop.machine import AgentMachine
from agent_fsm.messages import AssistantMessage, Message, UserMessage
from agent_fsm.models.base import Model
from agent_fsm.output import OutputSpec
from agent_fsm.pricing import Pricing
from agent_fsm.prompt import ContextEdits, prompt_messages
from agent_fsm.records import share_fields_sets
from agent_fsm.state import AgentRecord, RunResult, RunState
from agent_fsm.table import Row
from agent_fsm.tokens import TextCounter, estimate_message_tokens, estimate_text_tokens
from agent_fsm.tools.tool import ToolRegistry

__all__ = ["PARENT_RUN", "Reflector", "RunConfig", "RunContext", "acting_for"]

Reflector = Callable[[RunState], bool | Awaitable[bool]]
"""Optional hook called in REFLECT: return True to end the run as done (REFLECTOR_DONE)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RunConfig:
    """What the agent is, as its runs need it: model, tools, limits, table, policies, hooks.
    Frozen, shared by every run of the agent. Where a run lives (in this process, a store, a
    lease, a DBOS workflow) is not here: it is the run's ``run.residence.RunKeeper``."""

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
    handlers: tuple[EventHandler, ...] = ()
    input_guardrails: tuple[Guardrail, ...] = ()
    """Check each user message OBSERVE takes in (``agent_fsm.guardrails``)."""
    output_guardrails: tuple[Guardrail, ...] = ()
    """Check an answer that would end the run, in THINK (and in ACT and LAST_ANSWER, where
    ``screened_ends`` says)."""
    screened_ends: frozenset[str] = frozenset()
    """Beyond THINK, the states whose answers the output guardrails screen, because a row
    guarded by ``output_guardrail_tripped`` leaves them: REFLECT (a finish_task summary, a
    terminal tool's output, screened by ACT) and LAST_ANSWER. Empty without output
    guardrails."""
    delegates: bool = False
    """Some tool is a sub-agent (``Agent.as_tool``): ACT lets the tools see the run
    (``run.delegation.acting_for``). False costs one attribute check per ACT."""
    part_support: PartSupport | None = None
    """The images and files the model's provider takes (``models.base.TakesParts``): ACT
    holds a tool's parts to it (``tools.results.readable_parts``); None for a model that
    does not say, whose tool results go as they are."""
    pricing: Pricing | None = None
    """What the agent's model's tokens cost (``Limits.prices``); None without prices, so
    an agent without a price pays one attribute check per model call."""
    record: AgentRecord | None = None
    """What the agent is, kept with each run it starts (``run.identity``)."""
    dead_guards: frozenset[str] = frozenset()
    """Guards that are false on every run of this agent, because it does not use the
    feature they read (``Agent``: no last answer, no context window, no reflector, no
    output type, no policy, no such tool...): the runs do not try the rows that name them
    (``AgentMachine.handle``), so a feature that is off costs nothing per turn."""


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
    """The run's clock (``Timekeeping.clock`` of where it lives)."""
    sleep: Callable[[float], Awaitable[None]]
    """The run's backoff sleep (``Timekeeping.sleep``)."""
    random: Callable[[], float] = random.random
    """The jitter of the model-retry backoff (``Timekeeping.random``)."""
    path: tuple[str, ...] = ()
    """The runs that started this one (a sub-agent's), outermost first; empty for a run of
    its own."""
    finished_children: tuple[RunResult, ...] = ()
    """Sub-agent runs that ended during the current ACT, counted in this run's spend when
    the step ends (``run.parenting.fold``): the turn count keys the tool journal, so it must
    not move while the step's calls run. A child started meanwhile is carved from what
    they left too (``run.delegation.carve``). A tuple: a run without sub-agents makes no
    list for the cyclic collector to look at (issue 39)."""
    home: Any = None
    """Where the run lives (its agent's ``run.residence.Residence``), for its sub-agents:
    a child of a run kept in a store is kept in the same store (``run.delegation``). None
    where the driver does not say (a child then lives where its own agent keeps runs)."""
    counted_children: dict[str, Any] | None = None
    """By child run id: what this run counted of a child when it paused, so that only
    what the child spends after it goes on is added (``run.parenting.fold``). None until
    a paused child goes on: a run without one makes no dict (issue 39)."""
    chosen_pricing: Pricing | None = None
    """The price of the model a ``before_model`` hook chose for the call in flight, when it
    is not the agent's own (``run.thinking``): its reply is priced at it, then it is
    cleared."""
    started_at: float = 0.0
    """When this activation started by ``clock``, less the run's elapsed time before it:
    ``clock() - started_at`` is the run's time so far (a sub-agent's is carved from what
    is left)."""

    def entering_row(self) -> Row | None:
        """The row that took the run into the state it is in (``entering_index``)."""
        index = self.entering_index()
        return None if index is None else self.config.machine.rows[index]

    def entering_index(self) -> int | None:
        """The table index of the row that took the run into the state it is in: the last of
        its trace, looking past the rows that restarted the state after a crash (its work is
        done again, as if that row had just been taken). None before the first transition."""
        rows, trace = self.config.machine.rows, self.state.trace
        if trace and not rows[trace[-1][0]].restarts:  # the usual case: no crash in between
            return trace[-1][0]
        for index, _ in reversed(trace):
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
        # records kept as long as the run share their fields sets (records.py says why; a
        # tool's answer gets its shared set where it is built)
        if type(message) is AssistantMessage:
            share_fields_sets((message, *message.tool_calls))
            if message.usage is not None:
                share_fields_sets((message.usage,))
        elif type(message) is UserMessage:
            share_fields_sets((message,))
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


PARENT_RUN: ContextVar[RunContext | None] = ContextVar("agent_fsm_parent_run", default=None)
"""The run whose ACT is calling tools, while it does: a sub-agent tool's parent
(``run.delegation``). Set only for agents that have sub-agent tools (``RunConfig.delegates``)."""


@contextlib.contextmanager
def acting_for(ctx: RunContext) -> Iterator[None]:
    """While the block runs, sub-agent tools called in it (and the tasks it starts, which
    copy the context) are children of ``ctx``'s run."""
    token = PARENT_RUN.set(ctx)
    try:
        yield
    finally:
        PARENT_RUN.reset(token)
