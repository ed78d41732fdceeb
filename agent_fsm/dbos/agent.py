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
- a tool call is usually made without a step, in the workflow (``agent_fsm.dbos.tool_calls``),
  yet in DBOS's step context: what a tool does with DBOS is treated as inside a step, as when
  each call was a step (a ``@DBOS.step`` function it calls runs as a plain function, unrecorded;
  ``DBOS.sleep`` and starting a workflow fail, as DBOS refuses them in a step);
- a model that a ``before_model`` hook or a custom state supplies is not a step unless it is
  wrapped in ``StepModel``;
- a run is cancelled from outside with ``cancel`` (from any process: it stops before its
  next model or tool call, ERROR ``aborted``, resumable; ``agent_fsm.dbos.cancelling``), not
  with ``DBOS.cancel_workflow``, which ends the workflow with no stop to resume; it cannot be
  steered from outside;
- a run that stops to wait for a person (ask_user, approvals) ends its workflow with a
  needs-input result, its state saved in the journal store; ``resume`` continues it as a
  workflow of its own, once however many times it is called (``agent_fsm.dbos.pausing``);
- the agent has no ``store`` and no ``lease_s``: DBOS recovers its runs by replay, and
  checkpoints would be a second recovery that disagrees with it;
- every process that executes its runs holds a liveness lease from the moment its first run
  is admitted, before that run's first step (``agent_fsm.dbos.liveness``): the fleet takes
  no run from a process that lives, and an execution whose run the fleet took from it (its
  lease lost in a stall) stops before its next call.

Register every ``DBOSAgent`` (construct it) before ``DBOS.launch()``, in every worker, under
the same ``name``: DBOS finds a run's workflow function by that name when it recovers it.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from dbos import DBOS, SetWorkflowID, WorkflowHandleAsync

from agent_fsm.agent import Agent
from agent_fsm.dbos.cancelling import cancel_run, launched_status_among, request_cancel
from agent_fsm.dbos.liveness import Admission, process_liveness
from agent_fsm.dbos.pausing import key_prefix, load_stop, resume_id, save_stop, stop_of
from agent_fsm.dbos.private import launched
from agent_fsm.dbos.replay import RunTime, running
from agent_fsm.dbos.steps import ReplayedKeeper, durable_config
from agent_fsm.durable.checkpoint import CheckpointStore, redacted
from agent_fsm.durable.leases import LeaseStore
from agent_fsm.errors import CheckpointError, ConfigError
from agent_fsm.run.approvals import Decisions
from agent_fsm.run.context import RunConfig
from agent_fsm.run.elsewhere import reach_runs_elsewhere
from agent_fsm.run.engine import Run, new_run_state
from agent_fsm.run.identity import check_same_agent, keep_approvals
from agent_fsm.run.resuming import reopen
from agent_fsm.state import RunResult, RunState

__all__ = ["DBOSAgent", "RateLimit", "RunHandle", "RunQueue"]

WORKFLOW_PREFIX = "agent_fsm.run:"
"""A DBOSAgent's workflow is registered as this followed by its name."""
RESUME_PREFIX = "agent_fsm.resume:"
"""A DBOSAgent's resume workflow is registered as this followed by its name."""


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
    """A run started (or resumed) by a ``DBOSAgent``: its id, and its result when this
    workflow of it ends."""

    __slots__ = ("_handle", "_run_id")

    def __init__(self, handle: WorkflowHandleAsync[RunResult], run_id: str | None = None) -> None:
        self._handle = handle
        self._run_id = run_id if run_id is not None else handle.get_workflow_id()

    @property
    def run_id(self) -> str:
        return self._run_id

    @property
    def workflow_id(self) -> str:
        """The DBOS workflow: the run id, or ``f"{run_id}:resume-{n}"`` for a resume."""
        return self._handle.get_workflow_id()

    async def result(self) -> RunResult:
        """Wait for the run to end (on whichever worker) and return its result."""
        try:
            return await self._handle.get_result()
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # the caller is being cancelled
        # This process's execution of the run stopped (the fleet took the run on after
        # this process lost its liveness lease): wait for the run's result where it runs.
        handle: WorkflowHandleAsync[RunResult] = await DBOS.retrieve_workflow_async(
            self.workflow_id
        )
        return await handle.get_result()

    async def status(self) -> str:
        """DBOS's status of the run's workflow: ``ENQUEUED``, ``PENDING``, ``SUCCESS``, ..."""
        found = await self._handle.get_status()
        return str(found.status)


class DBOSAgent:
    """``agent``'s runs as DBOS workflows (see the module docstring for the contract).

    Args:
        agent: the agent; without ``store`` or ``lease_s``.
        journal: the store whose tool journal the tool steps keep (``store.journal(run_id)``),
            and where a run that stops resumable is saved for ``resume``: shared by every
            worker, so a ``PostgresStore`` (on the database DBOS uses, say). It keeps the
            process's liveness lease too, unless a ``WorkerLiveness`` was started (or a
            ``DBOSWorker`` launched) before the process's first run.
        name: names the workflow; the same in every worker, unique among DBOSAgents.
        queue: where ``enqueue`` puts runs.

    Raises:
        ConfigError: for an agent with a store or leases, a journal that is no
            CheckpointStore that leases, an invalid name or queue, or a context policy with a
            model that cannot be wrapped.
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
        if not isinstance(journal, CheckpointStore) or not isinstance(journal, LeaseStore):
            raise ConfigError(
                "journal must be a CheckpointStore that leases (PostgresStore), got"
                f" {type(journal).__name__}"
            )
        if not isinstance(name, str) or not name:
            raise ConfigError(f"name must be a non-empty str, got {name!r}")
        if queue is not None and not isinstance(queue, RunQueue):
            raise ConfigError(f"queue must be a RunQueue, got {type(queue).__name__}")
        self.agent = agent
        self.name = name
        self.queue = queue if queue is not None else RunQueue()
        self._journal = journal
        self._leases: LeaseStore = journal
        self._config = durable_config(agent.run_config)
        self._queue_registered: asyncio.Future[None] | None = None

        async def workflow(user_input: str, run_id: str) -> RunResult:
            """Replay format 4 (``replay.REPLAY_FORMAT``: DBOS's application version hashes
            this text)."""
            return await self._drive(user_input, run_id)

        async def resumed(
            run_id: str,
            resumes: int,
            reply: str | None,
            approvals: Decisions | None,
            pause: str | None = None,  # a default: a workflow recorded before it replays
        ) -> RunResult:
            """Replay format 4 (``replay.REPLAY_FORMAT``: DBOS's application version hashes
            this text)."""
            return await self._drive_resume(run_id, resumes, reply, approvals, pause)

        self._workflow: Callable[..., Any] = DBOS.workflow(name=WORKFLOW_PREFIX + name)(workflow)
        self._resumed: Callable[..., Any] = DBOS.workflow(name=RESUME_PREFIX + name)(resumed)
        reach_runs_elsewhere(self)  # Agent.cancel reaches its runs too

    async def _drive(self, user_input: str, run_id: str) -> RunResult:
        """The workflow's body: the same run on every execution (``agent_fsm.dbos.replay``)."""
        config = self._config
        admission = await self._admit()
        state = new_run_state(
            run_id,
            self.agent.system_prompt,
            user_input,
            config.tools_tokens,
            (),
            config.count_tokens,
            agent=config.record,  # a function of the agent: the same on every replay
        )
        return await self._activate(run_id, state, admission, 0, None)

    async def _drive_resume(
        self,
        run_id: str,
        resumes: int,
        reply: str | None,
        approvals: Decisions | None,
        pause: str | None = None,
    ) -> RunResult:
        """A resume workflow's body: the stop it loaded the first time, reopened with the
        answer, driven on (``agent_fsm.dbos.pausing``)."""
        admission = await self._admit()
        state = await load_stop(self._journal, run_id, resumes)
        config = keep_approvals(self._config, state)  # the same stop on every replay
        answered = reopen(
            state, config.machine, config.limits, reply, approvals, pause, tools=config.tools
        )
        return await self._activate(
            resume_id(run_id, resumes), state, admission, resumes, answered, config
        )

    async def _admit(self) -> Admission:
        """This execution, admitted under the process's liveness lease (the default one on
        the journal store started now if the process keeps none yet)."""
        return await process_liveness(self._leases).admit()

    async def _activate(
        self,
        workflow_id: str,
        state: RunState,
        admission: Admission,
        resumes: int,
        answered: str | None,
        config: RunConfig | None = None,
    ) -> RunResult:
        """Drive the run to its next stop with ``config`` (the agent's, or a resume's that
        keeps the run's approval rules); save the stop when a resume may continue it, and
        every stop of a resumed run (``agent_fsm.dbos.pausing``)."""
        config = config if config is not None else self._config
        run = RunTime(
            workflow_id,
            config.limits.timeout_s,
            self._journal.journal(state.run_id),
            state,
            admission,
            key_prefix=key_prefix(resumes),
            pause=self.agent.sleep,
        )
        with running(run):
            result = await Run(config, state, ReplayedKeeper(run), resumed=answered).run()
        if resumes or result.stop_reason in config.machine.resumable:
            await save_stop(self._journal, state, admission)
        return result

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
        """The handle of a run started earlier (by any worker): its first workflow."""
        return RunHandle(await DBOS.retrieve_workflow_async(run_id))

    async def resume(
        self,
        run_id: str,
        reply: str | None = None,
        *,
        approvals: Decisions | None = None,
        pause: str | None = None,
    ) -> RunResult:
        """Continue a run that stopped resumable, in this worker, now, to its next stop, as
        ``Agent.resume`` does: a workflow of its own (``agent_fsm.dbos.pausing``).

        Args:
            run_id: the run, as in ``RunResult.run_id``.
            reply: the user's answer when the run paused on ask_user (optional extra input
                for an aborted or timed-out run).
            approvals: for a run paused on approvals: a decision per pending call id
                (``True``, ``False`` or ``Approval``), or one decision for all of them (with
                ``pause``).
            pause: the pause this answer is for (``RunResult.pending.pause``), as for
                ``Agent.resume``: required with one decision for all, checked when given.

        Resuming the same stop again, here or in any worker, while or after the first resume
        runs, starts nothing: it returns the first resume's result (its answer is the one
        used), so an approved call is carried out once. The run keeps its approval rules
        (``run.identity.keep_approvals``): a tool that waited for approval in the run waits
        for it in the resume, whatever this agent's tool says.

        Raises:
            ResumeError: the run has not stopped, or finished, or the answer does not fit its
                stop (as ``Agent.resume``), or the run was made by a different agent (other
                tools, prompt or table: ``run.identity``; checked here, before the pause is
                answered or any workflow starts).
            CheckpointError: no run ``run_id``.
        """
        handle = await self._start_resume(run_id, reply, approvals, pause, queued=False)
        return await handle.result()

    async def cancel(self, run_id: str, reason: str = "cancelled") -> bool:
        """Stop the run wherever it is driven, or as soon as a worker takes it from the
        queue, before another model or tool call starts: ERROR ``aborted`` with ``reason``,
        resumable, every tool call answered (``agent_fsm.dbos.cancelling``). Any process
        may ask, through its own ``DBOSAgent`` of the run's name (or
        ``cancelling.cancel_run`` on the journal store), through ``Agent.cancel`` in a
        process that made a ``DBOSAgent`` (``run.elsewhere``), or from the command line
        (``agent-fsm cancel --dbos URL``).

        Returns:
            True when the request was recorded; False when the run is at a stop (a paused
            run is cancelled by not answering it) or finished: nothing is recorded then.

        Raises:
            CheckpointError: no run ``run_id``, or the journal store cannot be reached.
            ConfigError: a bad run id, a reason that is not a str.
        """
        return await cancel_run(self._journal, run_id, reason)

    def cancel_elsewhere(self, run_id: str, reason: str) -> bool | None:
        """``cancel`` for ``Agent.cancel`` (``run.elsewhere``), blocking: asked in a thread
        of its own, so that it may be called from a running event loop's thread. None when
        DBOS is not launched here, or the journal store was closed (``PostgresStore.closed``),
        or the run is none of the journal's and DBOS's.

        Raises:
            CheckpointError: the journal store or DBOS's workflows could not be read, so
                whether the run is one of these is not known (never "no such run").
        """
        if not launched() or getattr(self._journal, "closed", False):
            return None  # a journal store closed: this agent runs nothing any more
        answer: list[bool | None] = [None]
        failed: list[CheckpointError] = []
        # Only a workflow of this agent's: another DBOSAgent of the process, on another
        # journal store, sees it too, and must not record the request where it is not read.
        own_workflows = launched_status_among(
            frozenset({WORKFLOW_PREFIX + self.name, RESUME_PREFIX + self.name})
        )

        def ask() -> None:
            try:
                answer[0] = asyncio.run(
                    request_cancel(self._journal, run_id, reason, status_of=own_workflows)
                )
            except ConfigError:  # an id no store keeps: not one of these runs
                pass
            except CheckpointError as exc:
                failed.append(exc)
            except Exception as exc:  # a broken store: said, not taken for "no run"
                detail = redacted(" ".join(f"{type(exc).__name__}: {exc}".split()))
                failed.append(CheckpointError(detail))

        asking = threading.Thread(target=ask, name="agent_fsm-dbos-cancel")
        asking.start()
        asking.join()
        if failed:
            raise CheckpointError(
                f"cannot tell whether run {run_id!r} is a run of DBOSAgent {self.name!r}, so"
                f" it was not cancelled: {failed[0]}"
            ) from failed[0]
        return answer[0]

    async def enqueue_resume(
        self,
        run_id: str,
        reply: str | None = None,
        *,
        approvals: Decisions | None = None,
        pause: str | None = None,
    ) -> RunHandle:
        """``resume``, started from the agent's queue by a worker within its limits; the
        handle's ``result`` is the resumed run's. Raises as ``resume`` does, at once."""
        await self._register_queue()
        return await self._start_resume(run_id, reply, approvals, pause, queued=True)

    async def _start_resume(
        self,
        run_id: str,
        reply: str | None,
        approvals: Decisions | None,
        pause: str | None,
        *,
        queued: bool,
    ) -> RunHandle:
        if not isinstance(run_id, str) or not run_id:
            raise ConfigError(f"run_id must be a non-empty str, got {run_id!r}")
        state = await stop_of(self._journal, run_id)
        if self._config.record is not None:  # here, not in the workflow: a workflow that
            check_same_agent(state, self._config.record)  # raised would answer every resume so
        config = keep_approvals(self._config, state)  # as the workflow will
        resumes = len(state.resumed_at) + 1
        # Checked here, so that an answer that does not fit is the caller's ResumeError; the
        # workflow reopens its own copy of the stop again, the same way.
        reopen(state, config.machine, config.limits, reply, approvals, pause, tools=config.tools)
        if isinstance(approvals, Mapping):
            approvals = dict(approvals)  # a workflow argument: recorded, so picklable
        args = (run_id, resumes, reply, approvals, pause)
        handle = await self._launch(self._resumed, resume_id(run_id, resumes), args, queued)
        return RunHandle(handle, run_id)

    async def _start(self, user_input: str, run_id: str | None, *, queued: bool) -> RunHandle:
        if not isinstance(user_input, str):
            raise ConfigError(f"the input must be a str, got {type(user_input).__name__}")
        if run_id is not None and (not isinstance(run_id, str) or not run_id):
            raise ConfigError(f"run_id must be a non-empty str, got {run_id!r}")
        run_id = run_id or uuid.uuid4().hex  # chosen before the workflow: never replayed
        return RunHandle(await self._launch(self._workflow, run_id, (user_input, run_id), queued))

    async def _launch(
        self, workflow: Callable[..., Any], workflow_id: str, args: tuple[Any, ...], queued: bool
    ) -> WorkflowHandleAsync[RunResult]:
        """Start ``workflow`` under ``workflow_id``, now or from the queue. DBOS starts a
        workflow id once: starting it again gives the first one's handle."""
        with SetWorkflowID(workflow_id):
            if queued:
                handle: WorkflowHandleAsync[RunResult] = await DBOS.enqueue_workflow_async(
                    self.queue.name, workflow, *args
                )
            else:
                handle = await DBOS.start_workflow_async(workflow, *args)
        return handle

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
