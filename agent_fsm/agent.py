"""Agent: frozen configuration, and the ways to run it.

An ``Agent`` holds no per-run state: every ``run``/``stream``/``start`` creates a fresh
``RunState`` and shares the agent's verified machine, tool registry and limits. All
configuration errors surface here, at construction, as ``ConfigError``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable, Sequence
from typing import Any, Literal, overload

from agent_fsm.diagrams import RunOverlay, StoredRunOverlay, render
from agent_fsm.durable.checkpoint import CheckpointStore, MemoryStore
from agent_fsm.errors import ConfigError, RunError
from agent_fsm.events import Event, EventHandler, RunFinished
from agent_fsm.limits import Limits
from agent_fsm.loop.machine import AgentMachine, TerminationBound
from agent_fsm.models.base import Model
from agent_fsm.run.engine import Reflector, Run, RunConfig, new_run_state
from agent_fsm.run.resuming import Decisions, reopen
from agent_fsm.state import RunResult
from agent_fsm.table import TABLE, Row
from agent_fsm.tokens import estimate_tools_tokens
from agent_fsm.tools.tool import ASK_USER, FINISH_TASK, Tool, ToolRegistry

__all__ = ["Agent"]

_CONTROL_TOOLS = {"ask_user": ASK_USER, "finish_task": FINISH_TASK}
_DEFAULT_MACHINE: AgentMachine | None = None


def _machine_for(table: tuple[Row, ...]) -> AgentMachine:
    """The shared machine for the default table (built once per process), or a new one."""
    global _DEFAULT_MACHINE
    if table is TABLE:
        if _DEFAULT_MACHINE is None:
            _DEFAULT_MACHINE = AgentMachine(TABLE)
        return _DEFAULT_MACHINE
    return AgentMachine(table)


class Agent:
    """An LLM tool-calling agent run as a verified finite-state machine.

    Args:
        model: anything implementing the ``Model`` protocol.
        tools: the tools the model may call (``@tool`` functions or ``Tool`` objects).
        system_prompt: instructions sent first in every run.
        limits: the run budgets; ``Limits()`` by default (all finite).
        control_tools: built-in control-flow tools offered to the model: ``"ask_user"`` and
            ``"finish_task"`` by default; pass ``()`` for none.
        reflector: optional hook called in REFLECT; returning True ends the run as done.
        parallel_tool_calls: run several calls of one reply concurrently (results stay in
            call order); False runs them one after another.
        table: the transition table (advanced: for testing alternative machines).
        clock, sleep: time sources, replaceable for deterministic tests.
        store: where runs are checkpointed. With a store (``SQLiteStore(path)`` is the
            embedded default for durable runs), the run is saved after every transition and
            can be resumed in another process after a crash. Without one, runs that pause,
            abort or time out are kept in memory so ``resume`` works in this process.

    Raises:
        ConfigError: for a model that is not a Model, invalid tools, duplicate tool names,
            unknown control tools or a table that fails verification.
    """

    __slots__ = ("_config", "_handlers", "_options", "_system_prompt")

    def __init__(
        self,
        *,
        model: Model,
        tools: Iterable[Tool] = (),
        system_prompt: str = "",
        limits: Limits | None = None,
        control_tools: Sequence[str] = ("ask_user", "finish_task"),
        reflector: Reflector | None = None,
        parallel_tool_calls: bool = True,
        table: tuple[Row, ...] = TABLE,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        store: CheckpointStore | None = None,
    ) -> None:
        if not isinstance(model, Model):
            raise ConfigError(
                f"model must implement the Model protocol (a `name` and an async "
                f"`request(ModelRequest)`), got {type(model).__name__}"
            )
        if limits is None:
            limits = Limits()
        elif not isinstance(limits, Limits):
            raise ConfigError(f"limits must be a Limits, got {type(limits).__name__}")
        if store is not None and not isinstance(store, CheckpointStore):
            raise ConfigError(
                f"store must implement CheckpointStore (MemoryStore, SQLiteStore), got "
                f"{type(store).__name__}"
            )
        unknown = [name for name in control_tools if name not in _CONTROL_TOOLS]
        if unknown:
            raise ConfigError(
                f"unknown control tool(s) {unknown}; available: {sorted(_CONTROL_TOOLS)}"
            )
        if isinstance(tools, Tool):
            tools = [tools]
        tools = tuple(tools)
        self._options: dict[str, Any] = {
            "model": model,
            "tools": tools,
            "system_prompt": system_prompt,
            "limits": limits,
            "control_tools": tuple(control_tools),
            "reflector": reflector,
            "parallel_tool_calls": parallel_tool_calls,
            "table": table,
            "clock": clock,
            "sleep": sleep,
            "store": store,
        }
        registry = ToolRegistry([*tools, *(_CONTROL_TOOLS[name] for name in control_tools)])
        self._system_prompt = system_prompt
        self._handlers: list[EventHandler] = []
        self._config = RunConfig(
            model=model,
            tools=registry,
            limits=limits,
            machine=_machine_for(table),
            tools_tokens=estimate_tools_tokens(registry.specs),
            reflector=reflector,
            parallel_tool_calls=parallel_tool_calls,
            clock=clock,
            sleep=sleep,
            store=store if store is not None else MemoryStore(),
            checkpoint_every_transition=store is not None,
        )

    def replace(self, **changes: Any) -> Agent:
        """A new agent with the same configuration except ``changes`` (constructor keywords).

        The test harness uses it to run a user's agent against a fake model or fake tools;
        subscribers are not carried over.

        Raises:
            ConfigError: for a keyword the constructor does not take, or an invalid value.
        """
        unknown = sorted(set(changes) - set(self._options))
        if unknown:
            raise ConfigError(f"Agent.replace() got unknown option(s) {unknown}")
        return Agent(**{**self._options, **changes})

    @property
    def system_prompt(self) -> str:
        return self._system_prompt

    @property
    def model(self) -> Model:
        return self._config.model

    @property
    def limits(self) -> Limits:
        return self._config.limits

    @property
    def tools(self) -> ToolRegistry:
        return self._config.tools

    @property
    def machine(self) -> AgentMachine:
        return self._config.machine

    @property
    def bound(self) -> TerminationBound:
        """What every run of this agent is guaranteed to stay within."""
        return self._config.machine.bound(self._config.limits)

    def subscribe(self, handler: EventHandler) -> None:
        """Deliver the events of every run started after this call to ``handler``."""
        self._handlers.append(handler)

    def start(self, user_input: str, *, run_id: str | None = None) -> Run:
        """A new run, not yet stepped: drive it with ``step()``, ``iterate()`` or ``run()``."""
        if not isinstance(user_input, str):
            raise ConfigError(f"the input must be a str, got {type(user_input).__name__}")
        run_id = run_id or uuid.uuid4().hex
        state = new_run_state(run_id, self._system_prompt, user_input, self._config.tools_tokens)
        run = Run(self._config, state)
        for handler in self._handlers:
            run.subscribe(handler)
        return run

    @property
    def store(self) -> CheckpointStore:
        """Where this agent's runs are checkpointed (an in-memory store by default)."""
        store = self._config.store
        assert store is not None
        return store

    def reopen(
        self, run_id: str, reply: str | None = None, *, approvals: Decisions | None = None
    ) -> Run:
        """A stopped run, made ready to continue (not yet stepped): see ``resume``."""
        if not isinstance(run_id, str):
            raise ConfigError(f"run_id must be a str, got {type(run_id).__name__}")
        state = self.store.load(run_id)
        answered = reopen(state, self._config.machine, self._config.limits, reply, approvals)
        run = Run(self._config, state, resumed=answered)
        for handler in self._handlers:
            run.subscribe(handler)
        return run

    async def resume(
        self, run_id: str, reply: str | None = None, *, approvals: Decisions | None = None
    ) -> RunResult:
        """Continue a run from its last checkpoint, and run it to its next stop.

        Args:
            run_id: the run, as in ``RunResult.run_id``.
            reply: the user's answer when the run paused on ask_user (optional extra input
                for an aborted or timed-out run).
            approvals: for a run paused on approvals: a decision per pending call id
                (``True``, ``False`` or ``Approval(allow=..., reason=...)``; the reason is
                shown to the model), or one decision for all of them.

        Raises:
            CheckpointError: no checkpoint for ``run_id`` in this agent's store.
            ResumeError: the run finished, or the answer does not fit its pause (a reply to
                an approval, a missing decision, approvals for an ask_user).
        """
        return await self.reopen(run_id, reply, approvals=approvals).run()

    def resume_sync(
        self, run_id: str, reply: str | None = None, *, approvals: Decisions | None = None
    ) -> RunResult:
        """``resume`` for synchronous code."""
        return self._sync(self.resume(run_id, reply, approvals=approvals))

    async def run(self, user_input: str, *, run_id: str | None = None) -> RunResult:
        """Run to the end (or to a pause) and return the result. Never raises for model or
        tool failures: they end the run with a stop reason."""
        return await self.start(user_input, run_id=run_id).run()

    def run_sync(self, user_input: str, *, run_id: str | None = None) -> RunResult:
        """``run`` for synchronous code; not callable from inside a running event loop."""
        return self._sync(self.run(user_input, run_id=run_id))

    def _sync(self, work: Coroutine[Any, Any, RunResult]) -> RunResult:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self._and_release(work))
        work.close()
        raise RunError("a *_sync() method was called inside a running event loop: use await")

    async def _and_release(self, work: Coroutine[Any, Any, RunResult]) -> RunResult:
        """Run, then let the model release what it tied to this event loop (HTTP clients
        bound to the loop that ``run_sync`` is about to close)."""
        try:
            return await work
        finally:
            aclose = getattr(self._config.model, "aclose", None)
            if aclose is not None:
                await aclose()

    async def stream(self, user_input: str, *, run_id: str | None = None) -> AsyncIterator[Event]:
        """Run and yield every event as it happens; the last one is ``RunFinished``."""
        run = self.start(user_input, run_id=run_id)
        queue: asyncio.Queue[Event | None] = asyncio.Queue()
        run.subscribe(queue.put_nowait)
        task = asyncio.create_task(run.run())
        task.add_done_callback(lambda _: queue.put_nowait(None))
        try:
            while (event := await queue.get()) is not None:
                yield event
                if isinstance(event, RunFinished):
                    break
            await task  # re-raises a programming error from the run, if any
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    @overload
    def diagram(
        self,
        format: Literal["mermaid", "dot", "svg"] = "mermaid",
        *,
        run: RunOverlay | str | None = None,
    ) -> str: ...
    @overload
    def diagram(self, format: Literal["png"], *, run: RunOverlay | str | None = None) -> bytes: ...
    @overload
    def diagram(self, format: str, *, run: RunOverlay | str | None = None) -> str | bytes: ...
    def diagram(
        self, format: str = "mermaid", *, run: RunOverlay | str | None = None
    ) -> str | bytes:
        """The agent's state machine: mermaid ``stateDiagram-v2`` text by default.

        Args:
            format: ``"mermaid"`` or ``"dot"`` (text, no system program needed), ``"svg"``
                (text) or ``"png"`` (bytes), which need the graphviz ``dot`` program.
            run: a ``RunResult``, a ``RecordedRun`` read from a trace file
                (``agent_fsm.durable.tracefile.read_run``), or the id of a run in this agent's
                checkpoint store, to overlay: visited states, how many times each edge was
                taken, and the state and reason the run stopped with (or where it is, for a
                run that has not ended).

        Raises:
            DiagramError: for svg/png without graphviz (the message says how to install it),
                or a run that was not made with this agent's table.
            CheckpointError: for a run id the store does not hold.
        """
        rows = self._config.machine.rows
        if isinstance(run, str):
            run = StoredRunOverlay.of(self.store.load(run), rows)
        return render(rows, format, run=run)
