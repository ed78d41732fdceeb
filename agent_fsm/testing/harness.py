"""Play behaviours against a user's agent and judge each run: the core of the harness.

A ``Stage`` prepares one copy of the agent (``Agent.replace``) whose model, tools and clock
the harness controls: the model plays the current ``Behaviour``, each of the agent's own
tools plays the behaviour's ``ToolOutcome``s (or runs for real), and a ``FakeClock`` makes
retry backoff free and time limits deterministic. ``Stage.play`` drives one run step by step,
never past the machine's termination bound, then checks every run invariant (and, for an
agent with a context window, that every prompt sent kept the context rules); the result
carries a pasteable reproducer. No hypothesis here: ``assert_terminates`` (generated cases)
and ``check_exhaustively`` (enumerated cases) both build on it.

Stateful testing (``stateful.py``) builds on a ``Stage`` too, reset (``load``) for each
example: each run of ``stage.agent`` gets its own behaviour (``Stage.cast``), the machine
moves ``stage.clock`` itself, and a ``LoopRunner`` keeps the runs on one event loop between
its rules.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import gc
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from agent_fsm.agent import Agent
from agent_fsm.durable.checkpoint import CheckpointStore
from agent_fsm.events import Event
from agent_fsm.messages import ModelRequest, ModelResponse, UserInput
from agent_fsm.models.base import Model
from agent_fsm.run.context import RunConfig
from agent_fsm.run.delegation import delegate_of, delegation_tool
from agent_fsm.run.engine import Run
from agent_fsm.state import RunResult
from agent_fsm.testing.behaviour import (
    Behaviour,
    BehaviourModel,
    FakeClock,
    ToolOutcome,
    play_outcome,
    user_tools,
)
from agent_fsm.testing.invariants import InvariantViolation, check_invariants, prompt_problems
from agent_fsm.testing.reproducer import reproducer
from agent_fsm.tools.tool import Tool

__all__ = [
    "DEFAULT_INPUT",
    "STAND_IN",
    "CaseResult",
    "HarnessFailure",
    "LoopRunner",
    "Stage",
    "frozen_heap",
    "run_sync",
]

DEFAULT_INPUT = "Do the task."

T = TypeVar("T")


def run_sync(make: Callable[[], Awaitable[T]]) -> T:
    """Run a coroutine to completion from sync code, even inside a running event loop (an
    async test): then it runs on a fresh loop in a worker thread."""

    async def main() -> T:
        return await make()

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(main())
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, main()).result()


@contextlib.contextmanager
def frozen_heap() -> Iterator[None]:
    """Keep the objects alive on entry out of the garbage collector's scans until the block
    ends (``gc.freeze``, then ``gc.unfreeze``).

    Thousands of short runs allocate enough to trigger full collections, and each one
    scanned every object of the process: hypothesis, pydantic and the agent's modules, which
    the runs never free. That was a sixth of the harness's time; frozen, the collections
    scan what the runs made. Nothing is leaked: frozen garbage is collected after the block.
    A process that froze objects of its own (a pre-forking server) is left as it is.
    """
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


class LoopRunner:
    """One event loop that outlives each call: for driving a run step by step from sync code.

    A ``Run`` is bound to the loop it first stepped on (its deadline timer and stop event
    live there), so code that steps a run from several synchronous calls (the rules of a
    stateful test) must give every step the same loop; ``run_sync`` makes a new one each
    time. Like ``run_sync``, it works inside a running event loop too: the loop then lives
    in a worker thread, and every call is made there. ``close()`` when done.
    """

    def __init__(self) -> None:
        self._runner = asyncio.Runner()
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)

    def run(self, make: Callable[[], Awaitable[T]]) -> T:
        """Run ``make()`` to completion on the loop and return its result.

        It runs on the loop itself (``run_until_complete``), not through
        ``asyncio.Runner.run``, whose SIGINT handler is installed and removed on every call:
        that cost a sixth of a short generated run. Ctrl-C still stops the caller; the task
        it interrupted is cancelled by ``close()``.
        """

        async def main() -> T:
            return await make()

        def run() -> T:
            return self._runner.get_loop().run_until_complete(main())

        if self._pool is None:
            return run()
        return self._pool.submit(run).result()

    def call(self, function: Callable[[], T]) -> T:
        """Call ``function`` on the loop's thread (for ``Run.abort`` and friends)."""

        async def call() -> T:
            return function()

        return self.run(call)

    def close(self) -> None:
        """Close the loop (cancelling what is left on it) and its thread, if any."""
        if self._pool is None:
            self._runner.close()
            return
        self._pool.submit(self._runner.close).result()
        self._pool.shutdown()


@dataclass(frozen=True, slots=True)
class CaseResult:
    """One played behaviour and its verdict."""

    behaviour: Behaviour
    played: tuple[object, ...]
    """What each model request got, in order."""
    result: RunResult | None
    """The run's result; None when it did not end (or raised)."""
    violation: str | None
    """Every broken invariant, or None when the run was fine."""
    user_input: UserInput = DEFAULT_INPUT
    """The message the run started with."""
    tools: Mapping[str, tuple[ToolOutcome, ...]] = field(default_factory=dict)
    """The tool doubles that were called, with their outcomes."""
    aborted_at: int | None = None
    """The model request during which the run was aborted, if it was."""

    @property
    def ok(self) -> bool:
        return self.violation is None

    @property
    def reproducer(self) -> str:
        """Python source that replays this case with a ScriptedModel (expects ``agent``).
        Written when asked for: most cases pass, and nobody reads theirs."""
        return reproducer(
            self.played, user_input=self.user_input, tools=self.tools, aborted_at=self.aborted_at
        )


class HarnessFailure(AssertionError):
    """A case broke a run invariant. The message shows the violated invariant(s) and a
    minimal reproducing script; both are also attributes."""

    def __init__(self, case: CaseResult, *, header: str = "") -> None:
        self.case = case
        self.violation = case.violation or ""
        self.reproducer = case.reproducer
        intro = header or "The agent broke a run invariant."
        super().__init__(
            f"{intro}\n\n{self.violation}\n\n"
            "Reproducer (paste into a test where `agent` is your agent):\n\n"
            f"{self.reproducer}"
        )


class _StageModel:
    """The model of the staged agent: delegates to the BehaviourModel cast for the request's
    run, or to the current case's."""

    supports_native_output = True  # it plays generated replies: valid output or not

    def __init__(self, name: str = "harness") -> None:
        self.current = BehaviourModel(Behaviour(steps=(), cycle=False))
        self.by_run: dict[str, BehaviourModel] = {}
        self._name = name

    @property
    def name(self) -> str:
        """The staged agent's own model's name: its price (``Limits.prices``) applies."""
        return self._name

    async def request(self, request: ModelRequest) -> ModelResponse:
        return await self.by_run.get(request.run_id, self.current).request(request)


class _StageChild:
    """The model of a staged sub-agent: the staged agent's, under the sub-agent's own model
    name (its price applies)."""

    supports_native_output = True

    def __init__(self, root: _StageModel, name: str) -> None:
        self._root = root
        self._name = name

    @property
    def name(self) -> str:
        return self._name

    async def request(self, request: ModelRequest) -> ModelResponse:
        return await self._root.current.request(request)


STAND_IN = ToolOutcome("returns", "ok")
"""What a tool double answers where the real tool would have run (``Stage(real_tools=False)``,
the default)."""


class Stage:
    """The user's agent, prepared once to play many behaviours.

    Args:
        agent: the agent under test; it is not modified (a copy is made with
            ``agent.replace``), and its own model is never called.
        user_input: the message every run starts with.
        store: where the staged runs are checkpointed. None (the default) keeps them in an
            in-memory store of the harness: generated runs never land in the agent's own
            store (a user's production database, say) unless a test passes it on purpose.
        through: wraps the harness's model before the staged agent gets it, e.g. in a
            provider adapter whose fake HTTP transport serves the harness's replies in the
            provider's wire format: the same behaviours then test the adapter's conversions
            too. The wrapper must pass each request on (its replies and failures may change
            form, never meaning).
        real_tools: let the agent's real tools run where a behaviour does not give a tool
            doubles (``ToolOutcome("real")``). False (the default): every call plays a double
            built from the tool, with its name and JSON Schema (the engine validates the
            arguments as for the real tool), which answers ``STAND_IN`` where the real tool
            would have run. A search makes hundreds of calls: a tool with side effects, or
            one that takes seconds, must not be called that often unless a test asks.
    """

    def __init__(
        self,
        agent: Agent,
        *,
        user_input: UserInput = DEFAULT_INPUT,
        store: CheckpointStore | None = None,
        through: Callable[[Model], Model] | None = None,
        real_tools: bool = False,
    ) -> None:
        self.user_input = user_input
        self.real_tools = real_tools
        self._model = _StageModel(agent.run_config.model.name)
        self._clock = FakeClock()
        self._outcomes: dict[str, tuple[ToolOutcome, ...]] = {}
        self._children: list[tuple[RunResult, RunConfig]] = []
        self._calls: dict[str, int] = {}
        self.tool_names = tuple(t.name for t in user_tools(agent))
        self.agent = agent.replace(
            model=through(self._model) if through is not None else self._model,
            tools=[self._staged(t) for t in user_tools(agent)],
            clock=self._clock,
            sleep=self._clock.sleep,
            store=store,
        )
        self._bound = self.agent.bound  # computed from the limits on every access

    def _staged(self, tool: Tool) -> Tool:
        """A tool of the staged agent: a double, or, for a sub-agent tool (``as_tool``), the
        sub-agent staged too: the same behaviour plays its model (its requests go on the
        same script), its tools are doubles, and the same clock keeps its time."""
        delegate = delegate_of(tool)
        if delegate is None:
            return self._double(tool)
        child = delegate.agent
        if not isinstance(child, Agent):  # only Agent.as_tool/as_handoff make them
            return self._double(tool)
        staged = child.replace(
            model=_StageChild(self._model, child.run_config.model.name),
            tools=[self._staged(t) for t in user_tools(child)],
            clock=self._clock,
            sleep=self._clock.sleep,
            store=None,
            lease_s=None,
        )
        return delegation_tool(
            staged,
            name=tool.name,
            description=tool.description,
            timeout_s=tool.timeout_s,
            handoff=delegate.handoff,
            observer=self._child_ended,
        )

    def _children_problem(self) -> str | None:
        """The first invariant a staged sub-agent's run broke, or None."""
        for result, config in self._children:
            problem = _child_problem(result, config)
            if problem is not None:
                return problem
        return None

    def _child_ended(self, result: RunResult, config: RunConfig) -> None:
        """A staged sub-agent's run ended: kept, to be checked under its carved limits."""
        self._children.append((result, config))

    def _double(self, tool: Tool) -> Tool:
        async def double(**arguments: Any) -> Any:
            outcomes = self._outcomes.get(tool.name)
            if not outcomes:
                return await play_outcome(tool, ToolOutcome("real"), arguments)
            index = self._calls.get(tool.name, 0)
            self._calls[tool.name] = index + 1
            return await play_outcome(tool, outcomes[index % len(outcomes)], arguments)

        return replace(tool, fn=double)

    @property
    def clock(self) -> FakeClock:
        """The staged agent's clock: it moves only when a run sleeps or a test moves it."""
        return self._clock

    def load(self, behaviour: Behaviour) -> BehaviourModel:
        """Make ``behaviour`` what the staged model and tools do from now on, and reset the
        clock; returns the model playing it (its ``played`` and ``requests`` fill as runs of
        ``self.agent`` go)."""
        model = BehaviourModel(behaviour)
        self._model.current = model
        self._model.by_run.clear()
        self._clock.now = 0.0
        self._outcomes = self._doubles(behaviour)
        self._calls = {}
        self._children = []
        return model

    def cast(self, run_id: str, behaviour: Behaviour) -> BehaviourModel:
        """Make ``behaviour``'s model answer the requests of run ``run_id`` only, so that
        several runs in flight each play their own; returns the model playing it. Tools are
        shared by every run: when ``behaviour`` names tool outcomes, they replace the current
        ones for all runs. The clock is left alone."""
        model = BehaviourModel(behaviour)
        self._model.by_run[run_id] = model
        if behaviour.tools or not self._outcomes:
            self._outcomes = self._doubles(behaviour)
            self._calls = {}
        return model

    def _doubles(self, behaviour: Behaviour) -> dict[str, tuple[ToolOutcome, ...]]:
        """What each tool plays under ``behaviour``: its outcomes, where it gives some, each
        ``real`` one (and a tool with none) the stand-in unless ``real_tools``."""
        given = {name: outcomes for name, outcomes in behaviour.tools if outcomes}
        if self.real_tools:
            return given
        return {
            name: tuple(STAND_IN if o.kind == "real" else o for o in given.get(name, (STAND_IN,)))
            for name in self.tool_names
        }

    def play(self, behaviour: Behaviour, loop: LoopRunner | None = None) -> CaseResult:
        """Run the agent against ``behaviour`` and check every invariant. Never raises for
        what the run does: a run that raises or does not end is a violation.

        Args:
            loop: the event loop to play on, kept by the caller for many plays (a new loop
                per play costs as much as a short run); a fresh one when None.
        """
        model = self.load(behaviour)
        events: list[Event] = []
        run = self.agent.start(self.user_input)
        run.subscribe(events.append)
        model.on_abort = run.abort
        bound = self._bound
        result: RunResult | None = None
        violation: str | None = None
        try:
            drive = loop.run if loop is not None else run_sync
            if drive(lambda: _drive(run, bound.transitions)):
                result = run.result
            else:
                violation = (
                    f"the run had not ended after {bound.transitions} transitions, the "
                    f"termination bound ({bound.formula}); it was in {run.state.state}"
                )
        except Exception as exc:  # a programming error escaped the run: that is the finding
            violation = f"the run raised {type(exc).__name__}: {exc}"
        if result is not None:
            try:
                check_invariants(result, limits=self.agent.limits, bound=bound, events=events)
            except InvariantViolation as exc:
                violation = str(exc)
            if violation is None:
                violation = self._children_problem()
            if violation is None and self.agent.limits.context_window is not None:
                # the prompts, as the context policies shrank them (O(prompt) each: only
                # where a window makes them differ from the transcript)
                sent = [request.messages for request in model.requests]
                problems = prompt_problems(sent, result.messages)
                if problems:
                    violation = "the prompts sent broke the context rules:\n- " + "\n- ".join(
                        problems
                    )
        tools: Mapping[str, tuple[ToolOutcome, ...]] = {
            name: outcomes for name, outcomes in self._outcomes.items() if self._calls.get(name)
        }
        return CaseResult(
            behaviour=behaviour,
            played=tuple(model.played),
            result=result,
            violation=violation,
            user_input=self.user_input,
            tools=tools,
            aborted_at=model.aborted_at,
        )


def _child_problem(result: RunResult, config: RunConfig) -> str | None:
    """What a sub-agent's run broke, under the limits it was carved (its events are checked
    with its parent's, which count its spend)."""
    machine = config.machine
    try:
        check_invariants(
            result, limits=config.limits, bound=machine.bound(config.limits), rows=machine.rows
        )
    except InvariantViolation as exc:
        return f"a sub-agent's run broke its invariants: {exc}"
    return None


async def _drive(run: Run, cap: int) -> bool:
    """Step until the run ends or ``cap`` transitions were taken; True when it ended."""
    for _ in range(cap):
        if run.done:
            break
        await run.step()
    return run.done
