"""Agent: frozen configuration, and the ways to run it.

An ``Agent`` holds no per-run state: every ``run``/``stream``/``start`` creates a fresh
``RunState`` and shares the agent's verified machine, tool registry and limits. All
configuration errors surface here, at construction, as ``ConfigError`` (the checks, and what
each argument implies for the runs, are ``agent_fsm.configuring``'s).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, overload

from agent_fsm.compaction import ContextPolicy
from agent_fsm.composition import to_mermaid_composition
from agent_fsm.configuring import (
    CONTROL_TOOLS,
    check_control_rows,
    check_given_id,
    check_guardrail_rows,
    check_input_parts,
    check_sub_agents,
    context_policies,
    dead_guards,
    guardrail_guards,
    machine_for,
    output_spec,
    pricing_for,
    residence_for,
    review_tool_schemas,
    token_counter,
    with_model_window,
)
from agent_fsm.custom_table import Table
from agent_fsm.diagrams import RunOverlay, StoredRunOverlay, render
from agent_fsm.durable.checkpoint import CheckpointStore
from agent_fsm.durable.queue import RunQueue, check_priority, check_reason
from agent_fsm.errors import (
    CheckpointError,
    ConfigError,
    ResumeError,
    RunError,
)
from agent_fsm.events import Event, EventHandler, RunFinished, checked_handler
from agent_fsm.guardrails import Guardrail, GuardrailFunction, guardrails_of
from agent_fsm.hooks import StepHooks
from agent_fsm.limits import Limits
from agent_fsm.loop.machine import AgentMachine, TerminationBound
from agent_fsm.messages import Message, UserInput, UserMessage, user_input
from agent_fsm.models.base import Model, TakesParts
from agent_fsm.models.registry import model_named
from agent_fsm.output import OutputMode, OutputType
from agent_fsm.run.delegation import delegate_of, delegation_tool
from agent_fsm.run.elsewhere import cancel_elsewhere
from agent_fsm.run.engine import Reflector, Run, RunConfig, new_run_state
from agent_fsm.run.forking import copy_journal, fork_state
from agent_fsm.run.history import HistoryRepair, prepare_history
from agent_fsm.run.identity import agent_record, claim, keep_approvals
from agent_fsm.run.residence import Residence, Timekeeping, taken
from agent_fsm.run.resuming import Decisions, reopen
from agent_fsm.run.stored import Leased
from agent_fsm.state import RunResult, RunState
from agent_fsm.table import (
    OUTPUT_GUARDRAIL_GUARD,
    TABLE,
    AgentState,
    Row,
)
from agent_fsm.tokens import estimate_tools_tokens
from agent_fsm.tools.tool import Tool, ToolRegistry

__all__ = ["Agent", "machine_for"]

History = Sequence[Message] | RunResult
"""An earlier conversation to start a run from (``Agent.start(history=...)``)."""


@dataclass(frozen=True, kw_only=True, eq=False)
class Agent:
    """An LLM tool-calling agent run as a verified finite-state machine.

    Frozen, keyword-only configuration: ``dataclasses.replace(agent, model=...)`` (or
    ``agent.replace(...)``) makes a changed copy, and ``subscribe`` returns one too, so an
    agent shared between tasks or tests never changes under them.

    Raises:
        ConfigError: for a model that is not a Model, invalid tools, duplicate tool names,
            unknown control tools, a store that is no CheckpointStore, hooks that are no
            StepHooks, lease options that do not fit (``lease_s`` without a store that
            leases runs, a ``lease_s`` or ``worker_id`` of the wrong kind), or a table that
            fails verification.
    """

    model: Model | str
    """Anything implementing the ``Model`` protocol, or a provider's model by name
    (``"openai:gpt-4o-mini"``, ``"anthropic:..."``: ``models.registry.model_named``, which
    checks the provider's key variable now)."""
    tools: Sequence[Tool] = ()
    """The tools the model may call (``@tool`` functions or ``Tool`` objects)."""
    system_prompt: str = ""
    """Instructions sent first in every run."""
    limits: Limits = field(default_factory=Limits)
    """The run budgets; all finite."""
    control_tools: Sequence[str] = ("ask_user", "finish_task")
    """Built-in control-flow tools offered to the model; ``()`` for none."""
    reflector: Reflector | None = None
    """Optional hook called in REFLECT; returning True ends the run as done."""
    hooks: StepHooks | None = None
    """Per-step hooks (``agent_fsm.hooks``): before each model call (choose the model,
    ``tool_choice``, the tools offered, the messages sent), and before and after each tool
    call (inspect, change the arguments, deny, replace the result)."""
    parallel_tool_calls: bool = True
    """Run several calls of one reply concurrently (results stay in call order)."""
    table: tuple[Row, ...] | Table = TABLE
    """The loop: the default one, or a ``Table`` of the user's own (rows, custom states and
    guards), which is verified to terminate when the agent is built."""
    clock: Callable[[], float] = time.monotonic
    """Time source, replaceable for deterministic tests."""
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    """Awaited for retry backoff; a fake one keeps tests instant."""
    store: CheckpointStore | None = None
    """Where runs are checkpointed. With a store (``SQLiteStore(path)`` is the embedded
    default for durable runs) a run is saved after every transition and can be resumed in
    another process after a crash. Without one, runs that stop resumable are kept in an
    in-memory store of this agent, so ``resume`` works in this process."""
    lease_s: float | None = None
    """Lease every run this agent drives for this many seconds, so that several workers can
    share a ``store`` (``SQLiteStore``, ``PostgresStore``): a run is claimed before it is
    started or resumed (``RunLeased`` when another worker holds it), renewed at every save
    and while a step is in flight, and released when it stops; a worker that dies leaves its
    runs to be taken over ``lease_s`` after its last renewal, through ``take_next`` or
    ``resume``. The contract (fencing, clocks, a lease lost mid-run) is
    ``agent_fsm.durable.leases``'s. None: no leases (one driver per run is then the
    caller's to ensure)."""
    worker_id: str | None = None
    """Names this agent's leases (shown to other workers in ``RunLeased``); None: the host,
    the process id and a random suffix."""
    handlers: Sequence[EventHandler] = ()
    """Receive the events of every run of this agent (see ``subscribe``)."""
    context_policy: ContextPolicy | Sequence[ContextPolicy] | None = None
    """How a prompt too big for the context window is shrunk: one policy or several, tried
    in order (``KeepLastTurns``, ``ClearToolResults``, ``Summarize``, or your own). Needs
    a context window (``Limits.context_window``, or the model's ``context_window``). Without
    one, a prompt that does not fit ends the run with ``context_window``."""
    last_answer_prompt: str | None = None
    """The user message that asks for the last answer when a limit ends a run under
    ``Limits.last_answer``; ``{reason}`` in it becomes why the run is ending. None: the
    default (``agent_fsm.run.answering.LAST_ANSWER_PROMPT``)."""
    output_type: OutputType | None = None
    """What the final answer must be: a pydantic model class or the JSON Schema of an object.
    The run's ``RunResult.value`` is then the validated value; an answer that does not
    validate goes back to the model (``Limits.output_retries`` times at most)."""
    output_mode: OutputMode = "tool"
    """How the model gives typed output: ``"tool"`` (a terminal ``final_result`` tool whose
    arguments are the output; works with every model) or ``"native"`` (the schema is sent
    with each request and the reply's text validated; for models with
    ``supports_native_output``)."""
    input_guardrails: Sequence[GuardrailFunction | Guardrail] = ()
    """Checks of each user message as the run takes it in, before any model call or tool
    sees it (``agent_fsm.guardrails``): one that does not pass stops the run in ERROR
    ``guardrail_tripped``."""
    output_guardrails: Sequence[GuardrailFunction | Guardrail] = ()
    """Checks of an answer that would end the run, before it does: one may trip (ERROR
    ``guardrail_tripped``) or ask for a rewrite (``Rewrite``, at most
    ``Limits.guardrail_rewrites`` times)."""
    _config: RunConfig = field(init=False, repr=False)
    _residence: Residence = field(init=False, repr=False)

    def __post_init__(self) -> None:
        model, limits, store = self.model, self.limits, self.store
        if isinstance(model, str):  # "openai:gpt-4o-mini": a provider's adapter, by name
            model = model_named(model)
            object.__setattr__(self, "model", model)
        if not isinstance(limits, Limits) and limits is None:  # None: the default limits
            limits = Limits()
            object.__setattr__(self, "limits", limits)
        if not isinstance(model, Model) or not inspect.iscoroutinefunction(model.request):
            raise ConfigError(
                f"model must implement the Model protocol (a `name` and an async "
                f"`request(ModelRequest)`), got {type(model).__name__}"
                + (" whose request is not async" if isinstance(model, Model) else "")
            )
        if not isinstance(limits, Limits):
            raise ConfigError(f"limits must be a Limits, got {type(limits).__name__}")
        if store is not None and not isinstance(store, CheckpointStore):
            raise ConfigError(
                f"store must implement CheckpointStore (MemoryStore, SQLiteStore), got "
                f"{type(store).__name__}"
            )
        unknown = [name for name in self.control_tools if name not in CONTROL_TOOLS]
        if unknown:
            raise ConfigError(
                f"unknown control tool(s) {unknown}; available: {sorted(CONTROL_TOOLS)}"
            )
        hooks = self.hooks
        if hooks is not None and not isinstance(hooks, StepHooks):
            raise ConfigError(
                f"hooks must be a StepHooks(before_model=..., before_tool=..., after_tool=...), "
                f"got {type(hooks).__name__}"
            )
        prompt = self.last_answer_prompt
        if prompt is not None and (not isinstance(prompt, str) or not prompt.strip()):
            raise ConfigError(
                f"last_answer_prompt must be a non-empty str or None, got {prompt!r:.60}"
            )
        tools = (self.tools,) if isinstance(self.tools, Tool) else tuple(self.tools)
        _set = object.__setattr__  # a frozen dataclass normalises its own fields here
        limits = with_model_window(limits, model)
        _set(self, "limits", limits)
        policies = context_policies(self.context_policy, limits)
        count_tokens = token_counter(model)
        _set(self, "tools", tools)
        _set(self, "control_tools", tuple(self.control_tools))
        _set(self, "handlers", tuple(checked_handler(handler) for handler in self.handlers))
        output = output_spec(self.output_type, self.output_mode, model)
        offered = [*tools, *(CONTROL_TOOLS[name] for name in self.control_tools)]
        if output is not None and output.mode == "tool":
            offered.append(output.tool())
        registry = ToolRegistry(offered)
        review_tool_schemas(model, registry.specs)
        machine = machine_for(self.table)
        check_control_rows(machine, offered)
        pricing = pricing_for(limits, model)
        delegates = check_sub_agents(self, registry, limits)
        inputs = guardrails_of(self.input_guardrails)
        outputs = guardrails_of(self.output_guardrails)
        check_guardrail_rows(machine, inputs, outputs)
        _set(self, "input_guardrails", inputs)
        _set(self, "output_guardrails", outputs)
        config = RunConfig(
            model=model,
            tools=registry,
            limits=limits,
            machine=machine,
            tools_tokens=estimate_tools_tokens(registry.specs, count_tokens),
            count_tokens=count_tokens,
            context_policies=policies,
            reflector=self.reflector,
            hooks=None if hooks is None or hooks.empty else hooks,
            output=output,
            last_answer_prompt=prompt,
            parallel_tool_calls=self.parallel_tool_calls,
            handlers=tuple(self.handlers),
            pricing=pricing,
            part_support=model.part_support if isinstance(model, TakesParts) else None,
            delegates=delegates,
            input_guardrails=inputs,
            output_guardrails=outputs,
            screened_ends=frozenset(
                str(row.source)
                for row in machine.rows
                if outputs and OUTPUT_GUARDRAIL_GUARD in row.guards and row.source != "THINK"
            ),
            dead_guards=dead_guards(limits, offered, output, self.reflector, policies)
            - guardrail_guards(inputs, outputs),
            record=agent_record(registry.specs, self.system_prompt, machine.rows, offered),
        )
        _set(self, "_config", config)
        time = Timekeeping(clock=self.clock, sleep=self.sleep)
        _set(self, "_residence", residence_for(store, self.lease_s, self.worker_id, time))

    def __repr__(self) -> str:
        """A summary of what the agent is, not every row and schema it holds (a debugger, a
        log line or a test failure prints it): the model, the tools' names, the limits that
        differ from the defaults, the table and where its runs live."""
        model = self._config.model
        parts = [f"model={type(model).__name__}({model.name!r})"]
        if self.tools:
            parts.append(f"tools={[item.name for item in self.tools]}")
        if self.system_prompt:
            prompt = self.system_prompt
            parts.append(f"system_prompt={prompt if len(prompt) <= 40 else prompt[:37] + '...'!r}")
        changed = self.limits.model_dump(exclude_defaults=True)
        if changed:
            parts.append(f"limits=Limits({', '.join(f'{k}={v!r}' for k, v in changed.items())})")
        machine = self._config.machine
        if machine.rows is not TABLE:
            parts.append(f"table=<{len(machine.rows)} rows, states {sorted(machine.custom)}>")
        if self.store is not None:
            parts.append(f"store={type(self.store).__name__}")
        if self.lease_s is not None:
            parts.append(f"lease_s={self.lease_s:g}")
        if self.output_type is not None:
            parts.append(f"output_type={getattr(self.output_type, '__name__', 'schema')}")
        return f"Agent({', '.join(parts)})"

    def replace(self, **changes: Any) -> Agent:
        """``dataclasses.replace(self, **changes)``: a new agent with the same configuration
        except ``changes`` (the test harness runs a user's agent against a fake model this
        way). Its runs are kept in a store of its own unless ``store`` is shared.

        Raises:
            ConfigError: for a keyword the constructor does not take, or an invalid value.
        """
        unknown = sorted(set(changes) - _FIELDS)
        if unknown:
            raise ConfigError(f"Agent.replace() got unknown option(s) {unknown}")
        return dataclasses.replace(self, **changes)

    def subscribe(self, handler: EventHandler) -> Agent:
        """A copy of this agent whose runs also deliver their events to ``handler``.

        **Returns a new agent; this one is unchanged** (``agent = agent.subscribe(h)``), so
        subscribing never changes an agent someone else holds. To follow one run only, use
        ``Run.subscribe`` on ``agent.start(...)``.
        """
        return dataclasses.replace(self, handlers=(*self.handlers, handler))

    @property
    def run_config(self) -> RunConfig:
        """What every run of this agent is driven with (advanced: a runner of its own derives
        its configuration from it, as ``agent_fsm.dbos`` does, and drives ``Run`` objects,
        each with a ``run.residence.RunKeeper`` of where it lives)."""
        return self._config

    @property
    def residence(self) -> Residence:
        """Where this agent's runs live (``run.residence``): in this process, in ``store``,
        or leased from it. ``Agent.start`` and ``Agent.reopen`` ask it for each run's
        keeper; a runner of its own may too."""
        return self._residence

    @property
    def registry(self) -> ToolRegistry:
        """The tools offered to the model, control tools included, validated."""
        return self._config.tools

    @property
    def output_tool_name(self) -> str | None:
        """The tool that delivers the typed output (tool mode), or None."""
        output = self._config.output
        return output.tool_name if output is not None and output.mode == "tool" else None

    @property
    def machine(self) -> AgentMachine:
        return self._config.machine

    @property
    def bound(self) -> TerminationBound:
        """What every run of this agent is guaranteed to stay within; with sub-agents
        (``as_tool``), their bounds nested in it and the whole tree's transitions."""
        limits = self._config.limits
        own = self._config.machine.bound(limits)
        children = tuple(
            (item.name, delegate.agent.bound)
            for item in self._config.tools.tools
            if (delegate := delegate_of(item)) is not None
        )
        if not children:
            return own
        widest = max(bound.tree_transitions for _, bound in children)
        return dataclasses.replace(
            own,
            nested=children,
            tree_transitions=own.transitions + limits.max_turns * widest,
        )

    def as_tool(self, *, name: str, description: str, timeout_s: float | None = None) -> Tool:
        """This agent as a tool of another (a sub-agent): a call runs it on the ``task``
        the model gives, and answers with its output (``run.delegation``).

        The child's limits are carved from what its parent has left when the call starts
        (turns, retries, tokens, money, time: the smaller of its own and the parent's
        remainder), and what it spends is counted in the parent's, so the parent's limits
        bound the whole tree and ``bound`` composes. A child that fails answers the call
        as an error, with its stop reason in ``details``; the parent's abort or deadline
        aborts it. Sub-agent calls of one reply run one at a time.

        Args:
            name: the tool's name, as the model calls it.
            description: when the model should call it.
            timeout_s: a backstop for the whole call; by default the child's own time
                limit and its last answer's, and 30 s more (the carved time limit ends the
                child first).

        Raises:
            ConfigError: an invalid name or description.
        """
        return delegation_tool(self, name=name, description=description, timeout_s=timeout_s)

    def composition(self, name: str = "agent") -> str:
        """The mermaid ``flowchart`` of this agent and the agents it can call (sub-agents
        solid, handoffs dotted), each with its limits and bound
        (``composition.to_mermaid_composition``); each agent's own loop is its
        ``diagram()``."""
        return to_mermaid_composition(self, name)

    def as_handoff(self, *, name: str, description: str, timeout_s: float | None = None) -> Tool:
        """This agent as a handoff of another: a call passes it the conversation so far
        (and the model's ``note``), and its answer ends the calling run, with stop reason
        ``terminal_tool`` (the tool is terminal: a row of the table ends the run, no special
        path). Limits, spend, cascades and the bound are a sub-agent's (``as_tool``); a
        failed handoff answers the call as an error and the calling run goes on.

        Raises:
            ConfigError: an invalid name or description.
        """
        return delegation_tool(
            self, name=name, description=description, timeout_s=timeout_s, handoff=True
        )

    def start(
        self,
        user_input: UserInput,
        *,
        run_id: str | None = None,
        history: History | None = None,
        continues: str | None = None,
    ) -> Run:
        """A new run, not yet stepped: drive it with ``step()``, ``iterate()`` or ``run()``.

        Args:
            user_input: the user's message: text, or a list of texts, images and files
                (``["What is this?", ImagePart.from_path("photo.jpg")]``), or a
                ``UserMessage`` (``agent_fsm.content``).
            run_id: the new run's id; a fresh one when None.
            history: an earlier conversation to start from: the messages of an earlier
                ``RunResult`` (or the result itself), or any list of transcript messages
                (dicts are validated). It is repaired first (``run.history``): a call with
                no result gets an "interrupted" one, a stray result is dropped, and the
                agent's system prompt replaces the history's; a ``HistoryRepaired`` event
                reports what changed.
            continues: the id of a run in this agent's store whose conversation to go on
                with (``history`` taken from it). The stored run is left as it is.

        A run that starts from a history is a new run: its turns, usage and every limit
        count from zero, and its id is its own. The history's tokens are part of every
        prompt, so they count against the token budget as prompt tokens do.

        Raises:
            ConfigError: ``run_id`` names a run the store holds (or one being resumed): a
                new run under that id would be answered from the old run's tool journal, and
                its calls would never run. Resume that run, delete it, or choose a new id.
                With a store, the new run is saved here (``CheckpointStore.create``), so a
                second start under its id is refused even before this one takes a step.
                Also: input that is neither text nor a list of texts, images and files,
                or with an image or file the model's provider cannot take (``TakesParts``);
                a malformed ``history``, both ``history`` and ``continues``, or a
                ``continues`` run that has not stopped.
            CheckpointError: no run ``continues`` in the store.
            RunLeased: another worker leased ``run_id`` first (``lease_s``).
        """
        state, repaired = self._new_state(user_input, run_id, history, continues)
        # The run's id is claimed now: another start under the same id, here or (for a
        # durable run, atomically) in another process, is refused before either takes a step.
        keeper = self._residence.admit(state)
        return Run(self._config, state, keeper, repaired=repaired, home=self._residence)

    def _new_state(
        self,
        given: UserInput,
        run_id: str | None,
        history: History | None,
        continues: str | None,
    ) -> tuple[RunState, HistoryRepair | None]:
        """The state of a new run (``start``, ``enqueue``), checked as ``start`` says."""
        taken_in = user_input(given)
        if run_id is not None:
            check_given_id("run id", run_id)
            if self._residence.holds(run_id):
                raise taken(run_id)
        if continues is not None:
            if history is not None:
                raise ConfigError("pass history= or continues=, not both")
            history = self._stored_conversation(continues)
        messages, repaired = prepare_history(history) if history is not None else ([], None)
        if isinstance(taken_in, UserMessage) or messages:
            check_input_parts(self._config.model, [*messages, taken_in])
        state = new_run_state(
            run_id or uuid.uuid4().hex,
            self.system_prompt,
            taken_in,
            self._config.tools_tokens,
            messages,
            self._config.count_tokens,
            agent=self._config.record,
        )
        return state, repaired

    # -- a fleet: queued runs, taken by workers; cancelled from outside ------------------

    def enqueue(
        self,
        user_input: UserInput,
        *,
        run_id: str | None = None,
        priority: int = 0,
        history: History | None = None,
        continues: str | None = None,
    ) -> str:
        """Queue a new run in the store for a worker to take (``take_next``), and return its
        id: the run is saved, nobody steps it here and nobody holds its lease. Workers take
        the highest ``priority`` first, then the oldest (``durable.queue``). The other
        arguments are ``start``'s; the agent needs no lease of its own (a producer).

        Raises:
            ConfigError: no ``store`` that queues runs (``durable.queue.RunQueue``), a
                priority that is not an int of 32 bits, or what ``start`` raises for.
            RunLeased: a worker holds a lease on ``run_id``.
        """
        store = self.store
        if not isinstance(store, RunQueue):
            raise ConfigError(
                "enqueue queues runs in the store workers share: give the agent a store that"
                f" queues runs (SQLiteStore, PostgresStore), got {type(store).__name__}"
            )
        check_priority(priority)
        state, _ = self._new_state(user_input, run_id, history, continues)
        if not store.enqueue(state, priority=priority):
            raise taken(state.run_id)
        return state.run_id

    def take_next(self) -> Run | None:
        """The next runnable run of the store, claimed for this worker, made ready to go on
        (not yet stepped): drive it with ``run()``. None when no run is runnable now.

        Runnable (``durable.queue``): a run that has not stopped and that no worker holds a
        live lease on: queued (``enqueue``, or started and never stepped), or left mid-run
        by a worker that died or gave up. The highest priority first, then the oldest. The
        claim is the run's lease, so two workers never take the same run. A run cancelled
        while it waited stops at once (ERROR ``aborted``); a run stopped for an answer is
        never taken (``resume`` it). A run that cannot be loaded or continued is logged and
        left to its lease (``run_set_aside``): the next one is taken instead.

        Raises:
            ConfigError: the agent has no ``lease_s``, or its store queues no runs.
        """
        residence = self._residence
        if not isinstance(residence, Leased):
            raise ConfigError(
                "take_next hands a run to a worker under a lease: give the agent lease_s and"
                " a store the workers share (SQLiteStore, PostgresStore)"
            )
        config = self._config
        while (taken_run := residence.take_next()) is not None:
            state, keeper = taken_run
            try:
                if config.record is not None:
                    claim(state, config.record)
                answered = reopen(state, config.machine, config.limits)
            except ResumeError as exc:  # made by another agent (other tools, another table)
                residence.set_aside(state.run_id, exc)
                continue
            kept = keep_approvals(config, state)
            return Run(kept, state, keeper, resumed=answered, home=residence)
        return None

    def cancel(self, run_id: str, reason: str = "cancelled") -> bool:
        """Stop a run from outside: whoever drives it (another worker, another task or
        thread of this process) stops it at its next transition as ``Run.abort`` does, its
        model or tool call in flight cancelled: ERROR ``aborted`` with ``reason`` as its
        error, a valid transcript, resumable. A run not being driven (queued, or left by a
        worker that died) stops at once when a worker takes it. True when the request was
        made; False when the run had already stopped (done, failed, or paused for an
        answer: nothing is changed; a pause is cancelled by not answering it).

        Where it reaches: with ``lease_s``, every run of the store, through the store
        (its driver learns of it at its next save or lease renewal); without, the runs this
        agent drives in this process (an agent without a store: those it started or
        reopened and has not finished). And, in a process that made a ``DBOSAgent``, the
        runs of its fleet that are DBOS workflows (``run.elsewhere``), which no store
        holds while they run: they stop before their next model or tool call.

        Raises:
            CheckpointError: no such run; or a place the run may live could not be read
                (the store, or a ``DBOSAgent``'s journal store or DBOS's system database):
                the error says so, never "no such run" when nobody could look.
            ConfigError: a ``reason`` that is not a str; without ``lease_s``, a run of the
                store that this process does not drive.
        """
        check_given_id("run id", run_id)
        reason = check_reason(reason)
        try:
            if self._residence.cancel(run_id, reason):
                return True
        except CheckpointError:  # no such run here: it may live elsewhere
            found = cancel_elsewhere(run_id, reason)
            if found is None:
                raise
            return found
        return cancel_elsewhere(run_id, reason) is True  # stopped here, maybe resumed there

    def fork(self, run_id: str, *, at: int, fork_id: str | None = None) -> Run:
        """A new run that goes on from where stored run ``run_id`` stood after its
        transition ``at`` (1-based, as ``RunState.trace`` counts): not yet stepped, drive it
        with ``run()``. The stored run is left as it is.

        The fork has the transcript as it was then, and the state that transition entered
        does its work again (as after a crash: ``run.forking``); the stored run's journal
        entries for the calls in that transcript are copied to the fork's, so no call that
        ran is run again. Its turns count on from the stored run's, so ``max_turns`` and
        ``agent.bound`` hold over the whole path. Another model or other limits: fork from
        ``agent.replace(model=..., limits=...)``, which keeps the store.

        Raises:
            CheckpointError: no run ``run_id`` in this agent's store.
            ConfigError: ``at`` is not one of its transitions, or one that ended it (resume
                a stop instead); ``fork_id`` names a run the store holds; the run was made
                with another table.
        """
        check_given_id("run id", run_id)
        config = self._config
        store = self.checkpoints
        stored = store.load(run_id)
        if not config.machine.knows(stored):
            raise ConfigError(
                f"run {run_id} was not made with this agent's table: fork it with an agent "
                "whose table has its states and rows"
            )
        new_id = fork_id if fork_id is not None else uuid.uuid4().hex
        check_given_id("fork id", new_id)
        state = fork_state(stored, config.machine.rows, at, new_id, config.count_tokens)
        if self._residence.holds(new_id) or not store.create(state):
            raise taken(new_id)
        copy_journal(store.journal(run_id), store.journal(new_id), state.messages)
        return self.reopen(new_id)

    def _stored_conversation(self, run_id: str) -> list[Message]:
        """The transcript of a stopped run of this agent's store."""
        if not self.checkpoints.exists(run_id) and self._residence.how_it_ended(run_id):
            raise ConfigError(
                f"run {run_id} finished and the in-process store keeps only runs that can be "
                "resumed: pass its messages as history=result, or give the agent a store"
            )
        stored = self.checkpoints.load(run_id)
        if stored.state not in (AgentState.DONE, AgentState.ERROR):
            raise ConfigError(
                f"run {run_id} has not stopped (it is in {stored.state}): resume it instead"
            )
        return stored.messages

    @property
    def checkpoints(self) -> CheckpointStore:
        """Where this agent's runs are checkpointed: ``store``, or this agent's own in-memory
        store when none was given."""
        return self._residence.store

    def reopen(
        self,
        run_id: str,
        reply: UserInput | None = None,
        *,
        approvals: Decisions | None = None,
        pause: str | None = None,
    ) -> Run:
        """A stopped run, made ready to continue (not yet stepped): see ``resume``."""
        check_given_id("run id", run_id)
        config = self._config
        if reply is not None and not isinstance(reply, str):
            try:
                check_input_parts(config.model, [user_input(reply)])
            except ConfigError as exc:
                raise ResumeError(f"reply: {exc}") from None
        with self._residence.readmit(run_id) as (state, keeper):
            if config.record is not None:
                claim(state, config.record)
            kept = keep_approvals(config, state)
            answered = reopen(
                state, kept.machine, kept.limits, reply, approvals, pause, tools=kept.tools
            )
        return Run(kept, state, keeper, resumed=answered, home=self._residence)

    async def resume(
        self,
        run_id: str,
        reply: UserInput | None = None,
        *,
        approvals: Decisions | None = None,
        pause: str | None = None,
    ) -> RunResult:
        """Continue a run from its last checkpoint, and run it to its next stop.

        Args:
            run_id: the run, as in ``RunResult.run_id``.
            reply: the user's answer when the run paused on ask_user (optional extra input
                for an aborted or timed-out run): a text, or like a run's input, a list of
                texts, images and files (a sub-agent's question takes text).
            approvals: for a run paused on approvals: a decision per pending call id
                (``True``, ``False`` or ``Approval(allow=..., reason=...)``; the reason is
                shown to the model), or one decision for all of them (with ``pause``).
            pause: the pause this answer is for (``RunResult.pending.pause``, or
                ``RunPaused.pause``). Required with one decision for all the pending calls,
                which names none of them; given with any answer, it is checked, so that an
                answer arriving late (a double click, a retried request) is refused when the
                run has paused again since, instead of answering a pause nobody saw.

        Raises:
            CheckpointError: no checkpoint for ``run_id`` in this agent's store.
            ResumeError: the run finished, or the answer does not fit its pause (a reply to
                an approval, a missing decision, approvals for an ask_user, another pause,
                one decision for all without ``pause``).
            RunLeased: another worker holds the run's lease (``lease_s``), before or while
                this one drives it.

        A run whose worker died (it has not stopped) continues from its last checkpoint:
        that is also how a worker takes over a run whose lease expired.
        """
        return await self.reopen(run_id, reply, approvals=approvals, pause=pause).run()

    def resume_sync(
        self,
        run_id: str,
        reply: UserInput | None = None,
        *,
        approvals: Decisions | None = None,
        pause: str | None = None,
    ) -> RunResult:
        """``resume`` for synchronous code."""
        return self._sync(self.resume(run_id, reply, approvals=approvals, pause=pause))

    async def run(
        self,
        user_input: UserInput,
        *,
        run_id: str | None = None,
        history: History | None = None,
        continues: str | None = None,
    ) -> RunResult:
        """Run to the end (or to a pause) and return the result. Never raises for model or
        tool failures: they end the run with a stop reason. ``history`` and ``continues``
        start from an earlier conversation (see ``start``)."""
        return await self.start(
            user_input, run_id=run_id, history=history, continues=continues
        ).run()

    def run_sync(
        self,
        user_input: UserInput,
        *,
        run_id: str | None = None,
        history: History | None = None,
        continues: str | None = None,
    ) -> RunResult:
        """``run`` for synchronous code; not callable from inside a running event loop."""
        return self._sync(self.run(user_input, run_id=run_id, history=history, continues=continues))

    def _sync(self, work: Coroutine[Any, Any, RunResult]) -> RunResult:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            in_a_loop = False
        else:
            in_a_loop = True
        if in_a_loop:
            work.close()
            raise RunError("a *_sync() method was called inside a running event loop: use await")
        # Outside the except block: an error of the run must not carry a chained
        # "no running event loop" RuntimeError that has nothing to do with it.
        return asyncio.run(self._and_release(work))

    async def _and_release(self, work: Coroutine[Any, Any, RunResult]) -> RunResult:
        """Run, then let the model release what it tied to this event loop (HTTP clients
        bound to the loop that ``run_sync`` is about to close)."""
        try:
            return await work
        finally:
            aclose = getattr(self._config.model, "aclose", None)
            if aclose is not None:
                await aclose()

    async def stream(
        self,
        user_input: UserInput,
        *,
        run_id: str | None = None,
        history: History | None = None,
        continues: str | None = None,
    ) -> AsyncIterator[Event]:
        """Run and yield every event as it happens; the last one is ``RunFinished``.

        The run goes on while you read. When you stop reading early, close the stream so the
        run stops too: ``async with contextlib.aclosing(agent.stream(...)) as events:``.
        Closing it (or dropping the last reference to it) aborts an unfinished run, which then
        ends in ERROR ``aborted`` with a valid transcript, and can be resumed. A stream you
        break out of but keep a reference to cannot be told apart from a slow reader: the run
        goes on until the stream is closed.
        """
        run = self.start(user_input, run_id=run_id, history=history, continues=continues)
        queue: asyncio.Queue[Event | None] = asyncio.Queue()
        run.subscribe(queue.put_nowait)
        task = asyncio.create_task(run.run())
        task.add_done_callback(lambda _: queue.put_nowait(None))
        try:
            while (event := await queue.get()) is not None:
                yield event
                if isinstance(event, RunFinished) and event.run_id == run.run_id:
                    break  # not a sub-agent's: the run's own
            await task  # re-raises a programming error from the run, if any
        finally:
            if not task.done():
                run.abort("the stream was closed before the run ended")
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    @overload
    def diagram(
        self,
        format: Literal["mermaid", "dot", "html", "svg"] = "mermaid",
        *,
        run: RunOverlay | str | None = None,
        path_only: bool = False,
    ) -> str: ...
    @overload
    def diagram(
        self,
        format: Literal["png"],
        *,
        run: RunOverlay | str | None = None,
        path_only: bool = False,
    ) -> bytes: ...
    @overload
    def diagram(
        self, format: str, *, run: RunOverlay | str | None = None, path_only: bool = False
    ) -> str | bytes: ...
    def diagram(
        self,
        format: str = "mermaid",
        *,
        run: RunOverlay | str | None = None,
        path_only: bool = False,
    ) -> str | bytes:
        """The agent's state machine: mermaid ``stateDiagram-v2`` text by default.

        Args:
            format: ``"mermaid"`` or ``"dot"`` (text, no system program needed), ``"html"``
                (a page that draws it in a browser, with no network and no graphviz),
                ``"svg"`` (text) or ``"png"`` (bytes), which need the graphviz ``dot``
                program.
            run: a ``RunResult``, a ``RecordedRun`` read from a trace file
                (``agent_fsm.durable.tracefile.read_run``), or the id of a run in this agent's
                checkpoint store, to overlay: visited states, how many times each edge was
                taken, and the state and reason the run stopped with (or where it is, for a
                run that has not ended).
            path_only: with ``run``, draw only the edges the run took (each with its
                priority number in the whole table), not every row of the table.

        Raises:
            DiagramError: for svg/png without graphviz (the message says how to install it),
                a run that was not made with this agent's table, or ``path_only`` without a
                run.
            CheckpointError: for a run id the store does not hold.
        """
        rows = self._config.machine.rows
        if isinstance(run, str):
            run = StoredRunOverlay.of(self.checkpoints.load(run), rows)
        return render(rows, format, run=run, path_only=path_only)


_FIELDS = frozenset(f.name for f in dataclasses.fields(Agent) if f.init)
