"""``DBOSAgent``: an agent whose runs are DBOS workflows, started directly or from a queue.

One run is one workflow, whose id is the run id. Its model calls and tool calls are steps
(``agent_fsm.dbos.steps``), and everything else the engine reads that could differ between
two executions (its clock, deadline, random numbers, backoff sleeps) is recorded or derived
from what was (``agent_fsm.dbos.replay``). When a worker dies, DBOS runs the workflow again
on a live one (``agent_fsm.dbos.recovery``): the recorded steps are replayed, the engine
takes the same transitions, and the run goes on from the first step that has no record.
The engine's own rows keep deciding every retry: DBOS never retries a step.

The contract a user's code must keep, because it runs again on every replay:

- hooks, a reflector, event handlers and a custom state's work run in the workflow, outside
  any step: they must decide the same way on every execution, and do anything with an
  effect in a step of their own (``DBOS.run_step_async``); event handlers see a replayed
  run's events again;
- a model that a ``before_model`` hook or a custom state supplies is not a step unless it is
  wrapped in ``StepModel``;
- a run cannot be aborted or steered from outside (``DBOS.cancel_workflow`` stops it);
- the agent has no ``store`` and no ``lease_s``: DBOS recovers its runs by replay, and
  checkpoints would be a second recovery that disagrees with it.

Register every ``DBOSAgent`` (construct it) before ``DBOS.launch()``, in every worker, under
the same ``name``: DBOS finds a run's workflow function by that name when it recovers it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dbos import DBOS, SetWorkflowID, WorkflowHandleAsync

from agent_fsm.agent import Agent
from agent_fsm.compaction import ContextPolicy
from agent_fsm.dbos.replay import RunTime, active, record_start, running, sleep
from agent_fsm.dbos.steps import StepModel, stepped
from agent_fsm.durable.checkpoint import CheckpointStore
from agent_fsm.errors import ConfigError
from agent_fsm.run.context import RunConfig
from agent_fsm.run.engine import Run, new_run_state
from agent_fsm.state import RunResult
from agent_fsm.tools.tool import ToolRegistry

__all__ = ["DBOSAgent", "RateLimit", "RunHandle", "RunQueue"]

WORKFLOW_PREFIX = "agent_fsm.run:"
"""A DBOSAgent's workflow is registered as this followed by its name."""


def _positive(what: str, value: object) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ConfigError(f"{what} must be an int >= 1 or None, got {value!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class RateLimit:
    """At most ``starts`` runs start in any window of ``per_s`` seconds (all workers)."""

    starts: int
    per_s: float

    def __post_init__(self) -> None:
        _positive("RateLimit.starts", self.starts)
        if isinstance(self.per_s, bool) or not isinstance(self.per_s, int | float):
            raise ConfigError(f"RateLimit.per_s must be a number of seconds, got {self.per_s!r}")
        if not self.per_s > 0:
            raise ConfigError(f"RateLimit.per_s must be > 0, got {self.per_s!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class RunQueue:
    """The DBOS queue a ``DBOSAgent`` enqueues its runs on, with its limits.

    Every worker that launches DBOS with the agent registered takes runs from it, within
    the limits; the limits are stored with the queue, so the latest registration wins.
    """

    name: str = "agent_fsm_runs"
    concurrency: int | None = None
    """At most this many of its runs at once, across every worker."""
    worker_concurrency: int | None = None
    """At most this many of its runs at once in one worker process."""
    rate_limit: RateLimit | None = None
    """At most so many runs start in any window of so many seconds."""
    polling_interval_s: float = 1.0
    """How often each worker looks for runs to start."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError(f"RunQueue.name must be a non-empty str, got {self.name!r}")
        _positive("RunQueue.concurrency", self.concurrency)
        _positive("RunQueue.worker_concurrency", self.worker_concurrency)
        if self.rate_limit is not None and not isinstance(self.rate_limit, RateLimit):
            raise ConfigError(f"RunQueue.rate_limit must be a RateLimit, got {self.rate_limit!r}")
        interval = self.polling_interval_s
        if isinstance(interval, bool) or not isinstance(interval, int | float) or interval <= 0:
            raise ConfigError(f"RunQueue.polling_interval_s must be > 0, got {interval!r}")

    async def register(self) -> None:
        """Store the queue and its limits in DBOS's system database (DBOS is launched)."""
        rate = self.rate_limit
        await DBOS.register_queue_async(
            self.name,
            global_concurrency=self.concurrency,
            worker_concurrency=self.worker_concurrency,
            limiter=None if rate is None else {"limit": rate.starts, "period": rate.per_s},
            polling_interval_sec=self.polling_interval_s,
        )


class RunHandle:
    """A run started by a ``DBOSAgent``: its id, and its result when it ends."""

    __slots__ = ("_handle",)

    def __init__(self, handle: WorkflowHandleAsync[RunResult]) -> None:
        self._handle = handle

    @property
    def run_id(self) -> str:
        return self._handle.get_workflow_id()

    async def result(self) -> RunResult:
        """Wait for the run to end (on whichever worker) and return its result."""
        return await self._handle.get_result()

    async def status(self) -> str:
        """DBOS's status of the run's workflow: ``ENQUEUED``, ``PENDING``, ``SUCCESS``, ..."""
        found = await self._handle.get_status()
        return str(found.status)


class DBOSAgent:
    """``agent``'s runs as DBOS workflows (see the module docstring for the contract).

    Args:
        agent: the agent; without ``store`` or ``lease_s``.
        journal: the store whose tool journal the tool steps keep (``store.journal(run_id)``):
            shared by every worker, so a ``PostgresStore`` (on the database DBOS uses, say).
        name: names the workflow; the same in every worker, unique among DBOSAgents.
        queue: where ``enqueue`` puts runs.

    Raises:
        ConfigError: for an agent with a store or leases, a journal that is no
            CheckpointStore, an invalid name or queue, or a context policy with a model
            that cannot be wrapped.
    """

    def __init__(
        self,
        agent: Agent,
        *,
        journal: CheckpointStore,
        name: str = "agent",
        queue: RunQueue | None = None,
    ) -> None:
        if not isinstance(agent, Agent):
            raise ConfigError(f"agent must be an Agent, got {type(agent).__name__}")
        if agent.store is not None or agent.lease_s is not None:
            raise ConfigError(
                "a DBOSAgent's agent takes no store and no lease_s: DBOS recovers its runs by "
                "replaying their recorded steps, and checkpoints would be a second recovery"
            )
        if not isinstance(journal, CheckpointStore):
            raise ConfigError(
                f"journal must be a CheckpointStore (PostgresStore), got {type(journal).__name__}"
            )
        if not isinstance(name, str) or not name:
            raise ConfigError(f"name must be a non-empty str, got {name!r}")
        if queue is not None and not isinstance(queue, RunQueue):
            raise ConfigError(f"queue must be a RunQueue, got {type(queue).__name__}")
        self.agent = agent
        self.name = name
        self.queue = queue if queue is not None else RunQueue()
        self._journal = journal
        self._config = durable_config(agent.run_config)
        self._queue_registered: asyncio.Future[None] | None = None

        async def workflow(user_input: str, run_id: str) -> RunResult:
            return await self._drive(user_input, run_id)

        self._workflow: Callable[[str, str], Any] = DBOS.workflow(name=WORKFLOW_PREFIX + name)(
            workflow
        )

    async def _drive(self, user_input: str, run_id: str) -> RunResult:
        """The workflow's body: the same run on every execution (``agent_fsm.dbos.replay``)."""
        config = self._config
        started_at = await record_start()
        state = new_run_state(
            run_id,
            self.agent.system_prompt,
            user_input,
            config.tools_tokens,
            (),
            config.count_tokens,
        )
        run = RunTime(
            run_id, started_at, config.limits.timeout_s, self._journal.journal(run_id), state
        )
        with running(run):
            return await Run(config, state).run()

    async def run(self, user_input: str, *, run_id: str | None = None) -> RunResult:
        """Run in this worker, now (no queue), and return the result. A run id that was
        used before gives that run's result: a run id is one run."""
        handle = await self._start(user_input, run_id, queued=False)
        return await handle.result()

    async def enqueue(self, user_input: str, *, run_id: str | None = None) -> RunHandle:
        """Put a run on the agent's queue; a worker starts it within the queue's limits.

        Args:
            user_input: the user's message.
            run_id: the run's id (its workflow's); a fresh one when None. Enqueuing an id
                again does not start a second run: the handle is the first one's.
        """
        await self._register_queue()
        return await self._start(user_input, run_id, queued=True)

    async def retrieve(self, run_id: str) -> RunHandle:
        """The handle of a run started earlier (by any worker)."""
        return RunHandle(await DBOS.retrieve_workflow_async(run_id))

    async def _start(self, user_input: str, run_id: str | None, *, queued: bool) -> RunHandle:
        if not isinstance(user_input, str):
            raise ConfigError(f"the input must be a str, got {type(user_input).__name__}")
        if run_id is not None and (not isinstance(run_id, str) or not run_id):
            raise ConfigError(f"run_id must be a non-empty str, got {run_id!r}")
        run_id = run_id or uuid.uuid4().hex  # chosen before the workflow: never replayed
        with SetWorkflowID(run_id):
            if queued:
                handle = await DBOS.enqueue_workflow_async(
                    self.queue.name, self._workflow, user_input, run_id
                )
            else:
                handle = await DBOS.start_workflow_async(self._workflow, user_input, run_id)
        return RunHandle(handle)

    async def _register_queue(self) -> None:
        """Register the queue once per agent (later calls wait for the first)."""
        if self._queue_registered is None:
            self._queue_registered = asyncio.get_running_loop().create_future()
            try:
                await self.queue.register()
            except BaseException as exc:
                self._queue_registered.set_exception(exc)
                self._queue_registered = None
                raise
            self._queue_registered.set_result(None)
        await self._queue_registered


def durable_config(config: RunConfig) -> RunConfig:
    """``config`` with its model calls and tool calls as DBOS steps, and the clock, sleep,
    random source and deadline of the active run (``agent_fsm.dbos.replay``); without a
    store, leases or a deadline timer.

    Raises:
        ConfigError: a context policy has a model but is not a dataclass (its model cannot
            be wrapped in a ``StepModel``).
    """
    limits = config.limits
    tools = config.tools
    return dataclasses.replace(
        config,
        model=StepModel(config.model),
        tools=ToolRegistry(
            stepped(tool, limits) for spec in tools.specs if (tool := tools.get(spec.name))
        ),
        context_policies=tuple(_stepped_policy(policy) for policy in config.context_policies),
        clock=_clock,
        sleep=sleep,
        random=_random,
        arm_deadline=_no_timer,
        store=None,
        checkpoint_every_transition=False,
        leases=None,
    )


def _stepped_policy(policy: ContextPolicy) -> ContextPolicy:
    """A context policy whose own model (``Summarize(model=...)``) makes its calls as steps."""
    model = getattr(policy, "model", None)
    if model is None:
        return policy
    if not dataclasses.is_dataclass(policy) or isinstance(policy, type):
        raise ConfigError(
            f"{type(policy).__name__} has a model of its own, which a DBOSAgent must make "
            "steps of: give it a dataclass policy, or wrap its model in StepModel yourself"
        )
    replaced: ContextPolicy = dataclasses.replace(policy, model=StepModel(model))
    return replaced


def _clock() -> float:
    return active().clock()


def _random() -> float:
    return active().random.random()


def _no_timer(seconds: float, time_up: Callable[[], None]) -> None:
    """The deadline is the steps' to keep (``replay.RunTime.remaining_s``): no timer."""
