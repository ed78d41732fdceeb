"""Stateful testing: a hypothesis ``RuleBasedStateMachine`` that drives runs of a user's agent
through everything that can happen to them between two transitions.

``assert_terminates`` plays one run from start to end. Runs also pause and continue, get
steered, aborted and timed out, and outlive the process that started them. The machine here
interleaves all of that: its rules start runs (each playing a generated model behaviour),
step them a few transitions at a time (each taking no time, or a share of the time limit on
the fake clock), steer them, queue follow-ups, abort them (between steps or during a model
call), "crash" them (drop the ``Run`` and continue from the store's last checkpoint, as a
new process would), resume the ones that stopped (answering ``ask_user``, deciding
approvals, restarting aborted and timed-out runs), and try what must be refused: resumes
that do not fit the stop, a second copy of one resume (a double-clicked Approve), and a
second run started under a run's id. Up
to ``max_runs`` runs are open at once, all checkpointed as they step, in one store.

After every transition and every rule, every run must keep these invariants, and a run that
stops must pass ``check_invariants`` (resumes included) with its events:

- ``state_problems``: model calls never exceed ``max_turns`` and no activation exceeds the
  transition bound; the trace is one path, jumping back into the loop only where the run
  was resumed after a stop it can be resumed from, and leading to the state the run is in;
  every tool call is answered exactly once, in order, except those of a run about to act;
- the transcript and the trace only grow, through crashes and resumes alike;
- the store's checkpoint holds the live transcript, trace and turn count (the engine saves
  after every transition, a turn's end that goes on with the next step), so a crash loses
  nothing but input queued since the last step;
- a run never ends with a final answer while steering or follow-up messages wait unread;
- a refused resume leaves the checkpoint exactly as it was.

Hypothesis shrinks a failure to a short sequence of rules and prints it; the
``InvariantViolation`` also tells what happened to the failing run and what its model said.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, ClassVar, cast

from hypothesis import HealthCheck, Phase
from hypothesis import settings as Settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from agent_fsm.agent import Agent
from agent_fsm.durable.checkpoint import CheckpointStore, MemoryStore
from agent_fsm.errors import ConfigError, ResumeError
from agent_fsm.run.engine import Run
from agent_fsm.state import RUN_STATE_ADAPTER, Approval, RunState
from agent_fsm.table import StopReason
from agent_fsm.testing.behaviour import Behaviour
from agent_fsm.testing.harness import DEFAULT_INPUT, LoopRunner, Stage, frozen_heap
from agent_fsm.testing.strategies import behaviours_for, cooperative_behaviours_for
from agent_fsm.testing.tracking import TrackedRun

__all__ = ["AgentStateMachine", "agent_state_machine", "assert_stateful"]

_PICK = st.integers(0, 7)
"""Which of the candidate runs a rule acts on (modulo their number; shrinks to the first)."""
_MESSAGES = st.sampled_from(["Actually, use Celsius.", "Stop and summarise.", "And Paris?"])
_PACES = st.sampled_from([0.0, 0.0, 0.0, 0.1, 0.5])
"""How long each transition of a stepped run takes, as a share of the time limit."""
_REPLIES = st.sampled_from(["Oslo", "yes", "I don't know"])
_DECISIONS = st.one_of(
    st.booleans(),
    st.builds(Approval, allow=st.booleans(), reason=st.sampled_from([None, "not today"])),
)


class AgentStateMachine(RuleBasedStateMachine):
    """Runs of ``agent`` through starts, steps, steering, follow-ups, aborts, timeouts,
    crashes and resumes, with every invariant checked after each transition.

    Subclass it and set ``agent`` (and optionally the other class attributes), or let
    ``agent_state_machine(agent, ...)`` do it; you may add rules and invariants of your own.
    Run it like any hypothesis state machine: ``TestMyAgent = MyMachine.TestCase`` for
    pytest/unittest, or ``run_state_machine_as_test(MyMachine, settings=...)``.

    Attributes:
        agent: the agent under test. It is never modified and its model is never called:
            every example uses a copy (``harness.Stage``) with a generated model behaviour
            per run, tool doubles, a fake clock and a fresh store.
        user_input: the message every run starts with.
        behaviours: what each started run's model (and the tools) do; by default, two times
            in three ``cooperative_behaviours_for(agent)`` (a model doing its job, so runs
            reach pauses and approvals), else ``behaviours_for(agent)`` (misbehaving).
        tool_failures: let generated tool doubles misbehave (for the default behaviours).
        real_tools: call the agent's real tools where a double would answer "ok"
            (``harness.Stage``); False by default.
        max_runs: how many runs may be open at once (running, paused or crashed).
        make_store: returns the checkpoint store of one example (closed at its end);
            ``MemoryStore`` by default. Pass your own store to test it: the machine checks
            that every checkpoint holds the live run and that every crash resumes from it.
    """

    agent: ClassVar[Agent]
    user_input: ClassVar[str] = DEFAULT_INPUT
    behaviours: ClassVar[st.SearchStrategy[Behaviour] | None] = None
    tool_failures: ClassVar[bool] = True
    real_tools: ClassVar[bool] = False
    max_runs: ClassVar[int] = 2
    make_store: ClassVar[Callable[[], CheckpointStore]] = MemoryStore
    _stage: ClassVar[tuple[Agent, Stage]]

    def __init__(self) -> None:
        super().__init__()
        cls = type(self)
        agent = getattr(cls, "agent", None)
        if not isinstance(agent, Agent):
            raise ConfigError(
                f"{cls.__name__}.agent must be the Agent under test: subclass "
                "AgentStateMachine and set it, or use agent_state_machine(agent)"
            )
        stage = cls.__dict__.get("_stage")
        if stage is None or stage[0] is not agent:
            # one stage per class, reset for each example: preparing the tool doubles is
            # most of the cost of an example
            stage = (agent, Stage(agent, user_input=cls.user_input, real_tools=cls.real_tools))
            cls._stage = stage
        self.stage = stage[1]
        self.stage.load(Behaviour(steps=(), cycle=False))
        self.store = cls.make_store()
        # Runs hold no registration on the shared machine, so a run abandoned by a "crash"
        # leaves nothing behind but its checkpoint.
        self.staged = self.stage.agent.replace(store=self.store)
        self.rows = self.staged.machine.rows
        self.limits, self.bound = self.staged.limits, self.staged.bound
        self.loop = LoopRunner()
        self.runs: list[TrackedRun] = []

    def teardown(self) -> None:
        self.loop.close()
        self.store.close()

    def run_states(self) -> list[RunState]:
        """The state of every run opened in this example, for invariants of your own: live,
        or as last checkpointed for a run that crashed. Read them; do not change them."""
        return [t.run.state if t.run is not None else self.store.load(t.run_id) for t in self.runs]

    def _behaviours(self) -> st.SearchStrategy[Behaviour]:
        cls = type(self)
        if cls.behaviours is None:
            # built once per class: focusing strategies on the agent's schemas takes time
            failures = cls.tool_failures
            cooperative = cooperative_behaviours_for(cls.agent, tool_failures=failures)
            cls.behaviours = st.one_of(
                cooperative, cooperative, behaviours_for(cls.agent, tool_failures=failures)
            )
        return cls.behaviours

    # -- which runs a rule can act on ---------------------------------------------------

    def _active(self) -> list[TrackedRun]:
        return [t for t in self.runs if t.active]

    def _open(self) -> list[TrackedRun]:
        return [t for t in self.runs if t.active or t.run is None or t.resumable]

    @staticmethod
    def _pick(candidates: Sequence[TrackedRun], pick: int) -> TrackedRun:
        return candidates[pick % len(candidates)]

    def _run(self, tracked: TrackedRun) -> Run:
        assert tracked.run is not None
        return tracked.run

    # -- rules ------------------------------------------------------------------------------

    @precondition(lambda self: len(self._open()) < self.max_runs)
    @rule(data=st.data())
    def start(self, data: st.DataObject) -> None:
        """Start a run whose model plays a drawn behaviour (not stepped yet)."""
        behaviour = data.draw(self._behaviours(), label="behaviour")
        run_id = f"run{len(self.runs) + 1}-{uuid.uuid4().hex[:8]}"
        model = self.stage.cast(run_id, behaviour)
        tracked = TrackedRun(number=len(self.runs) + 1, run_id=run_id, model=model)
        tracked.attach(self.staged.start(self.user_input, run_id=run_id))
        tracked.note(f"started with {self.user_input!r}")
        self.runs.append(tracked)

    @precondition(lambda self: bool(self._active()))
    @rule(pick=_PICK, transitions=st.integers(1, 6), pace=_PACES)
    def advance(self, pick: int, transitions: int, pace: float) -> None:
        """Take up to ``transitions`` transitions of a running run, each taking ``pace``
        times the time limit on the clock."""
        self._advance(self._pick(self._active(), pick), transitions, pace)

    @precondition(lambda self: bool(self._active()))
    @rule(pick=_PICK, pace=_PACES)
    def run_until_it_stops(self, pick: int, pace: float) -> None:
        """Step a running run until it stops: a run that would not stop breaks the bound
        on its activation's transitions first."""
        self._advance(self._pick(self._active(), pick), self.bound.transitions + 1, pace)

    @precondition(lambda self: bool(self._active()))
    @rule(pick=_PICK, message=_MESSAGES, steer=st.booleans())
    def user_message(self, pick: int, message: str, steer: bool) -> None:
        """Steer a running run (observed before its next model call), or queue a follow-up
        (observed when it would otherwise end)."""
        tracked = self._pick(self._active(), pick)
        run = self._run(tracked)
        if steer:
            self.loop.call(lambda: run.steer(message))
            tracked.note(f"steered with {message!r}")
        else:
            self.loop.call(lambda: run.follow_up(message))
            tracked.note(f"queued the follow-up {message!r}")

    @precondition(lambda self: bool(self._active()))
    @rule(pick=_PICK, during_the_next_model_call=st.booleans())
    def abort(self, pick: int, during_the_next_model_call: bool) -> None:
        """Abort a running run now (between two steps), or from inside its next model call
        (which is then cancelled)."""
        tracked = self._pick(self._active(), pick)
        run = self._run(tracked)
        if during_the_next_model_call:
            turn = run.state.turns + 1
            tracked.model.behaviour = replace(tracked.model.behaviour, abort_at_turn=turn)
            tracked.note(f"will abort during model call {turn}")
        else:
            self.loop.call(lambda: run.abort("aborted by the test"))
            tracked.note("aborted")

    @precondition(lambda self: any(t.active and t.durable for t in self.runs))
    @rule(pick=_PICK)
    def crash(self, pick: int) -> None:
        """The process dies: the Run is dropped, with whatever it had not checkpointed."""
        tracked = self._pick([t for t in self.runs if t.active and t.durable], pick)
        tracked.run = None
        tracked.note("crashed")

    @precondition(lambda self: any(t.run is None for t in self.runs))
    @rule(pick=_PICK)
    def recover(self, pick: int) -> None:
        """A new process continues a crashed run from its last checkpoint."""
        tracked = self._pick([t for t in self.runs if t.run is None], pick)
        tracked.attach(self.staged.reopen(tracked.run_id))
        tracked.durable = True
        tracked.note("recovered from its checkpoint")

    @precondition(lambda self: any(t.resumable for t in self.runs))
    @rule(pick=_PICK, data=st.data())
    def resume(self, pick: int, data: st.DataObject) -> None:
        """Answer a stopped run the way its stop asks for, and reopen it."""
        tracked = self._pick([t for t in self.runs if t.resumable], pick)
        reason = self._run(tracked).result.stop_reason
        reply, approvals = self._answer(tracked, data)
        tracked.attach(self.staged.reopen(tracked.run_id, reply, approvals=approvals))
        tracked.durable = False
        tracked.note(f"resumed after {reason.value} with {reply or approvals!r}")

    @precondition(lambda self: any(t.resumable for t in self.runs))
    @rule(pick=_PICK, data=st.data())
    def resume_twice(self, pick: int, data: st.DataObject) -> None:
        """A double-clicked answer: two copies of a stopped run are reopened with it before
        either moves; the first takes its resume row, and the second is then refused and
        changes nothing (its pause is not carried out twice)."""
        tracked = self._pick([t for t in self.runs if t.resumable], pick)
        reason = self._run(tracked).result.stop_reason
        reply, approvals = self._answer(tracked, data)
        first = self.staged.reopen(tracked.run_id, reply, approvals=approvals)
        twin = self.staged.reopen(tracked.run_id, reply, approvals=approvals)
        tracked.attach(first)
        tracked.durable = False
        tracked.note(f"resumed twice after {reason.value} with {reply or approvals!r}")
        self._advance(tracked, 1)
        before = RUN_STATE_ADAPTER.dump_json(self.store.load(tracked.run_id))
        try:
            self.loop.run(twin.step)
        except ResumeError:
            pass
        else:
            raise tracked.violation(["a second copy of one resume took its resume row too"])
        if RUN_STATE_ADAPTER.dump_json(self.store.load(tracked.run_id)) != before:
            raise tracked.violation(["a refused second resume changed the checkpoint"])

    def _answer(
        self, tracked: TrackedRun, data: st.DataObject
    ) -> tuple[str | None, dict[str, bool | Approval] | None]:
        """The answer a stopped run's stop asks for: decisions on its pending calls, a reply
        to its question, or (for an interrupted run) maybe a new message."""
        result = self._run(tracked).result
        if result.stop_reason is StopReason.APPROVAL_REQUIRED:
            assert result.pending is not None
            pending = [c.id for c in result.pending.pending_calls]
            decisions = data.draw(
                st.lists(_DECISIONS, min_size=len(pending), max_size=len(pending)),
                label="decisions",
            )
            return None, dict(zip(pending, decisions, strict=True))
        if result.stop_reason is StopReason.ASK_USER:
            return data.draw(_REPLIES, label="reply"), None
        return data.draw(st.none() | _REPLIES, label="reply"), None

    @precondition(lambda self: bool(self.runs))
    @rule(pick=_PICK)
    def start_under_a_used_id(self, pick: int) -> None:
        """Another run started under the id of one already started (running, paused,
        crashed or ended) is refused at once, and changes nothing: it would otherwise be
        answered from the first run's tool journal."""
        tracked = self._pick(self.runs, pick)
        before = RUN_STATE_ADAPTER.dump_json(self.store.load(tracked.run_id))
        try:
            self.staged.start(self.user_input, run_id=tracked.run_id)
        except ConfigError:
            pass
        else:
            raise tracked.violation([f"a second run was started under the id {tracked.run_id}"])
        if RUN_STATE_ADAPTER.dump_json(self.store.load(tracked.run_id)) != before:
            raise tracked.violation(["a refused start changed the checkpoint"])

    @precondition(lambda self: any(t.stopped for t in self.runs))
    @rule(pick=_PICK)
    def resume_wrongly(self, pick: int) -> None:
        """A resume that does not fit the stop is refused and changes nothing."""
        tracked = self._pick([t for t in self.runs if t.stopped], pick)
        reason = self._run(tracked).result.stop_reason
        before = RUN_STATE_ADAPTER.dump_json(self.store.load(tracked.run_id))
        wrong: dict[str, Any] = {"approvals": True}  # only an approval pause takes these
        if reason is StopReason.APPROVAL_REQUIRED:
            wrong = {"reply": "yes"}
        elif not tracked.resumable:
            wrong = {"reply": "more"}
        try:
            self.staged.reopen(tracked.run_id, **wrong)
        except ResumeError:
            pass
        else:
            raise tracked.violation([f"a resume with {wrong} after {reason} was accepted"])
        if RUN_STATE_ADAPTER.dump_json(self.store.load(tracked.run_id)) != before:
            raise tracked.violation(["a refused resume changed the checkpoint"])

    @invariant()
    def every_run_keeps_its_invariants(self) -> None:
        for tracked in self.runs:
            tracked.check(self.store, self.rows, limits=self.limits, bound=self.bound)

    # -- checking -------------------------------------------------------------------------

    def _advance(self, tracked: TrackedRun, transitions: int, pace: float = 0.0) -> None:
        run = self._run(tracked)
        for _ in range(transitions):
            entry = self.loop.run(run.step)
            tracked.durable = True
            took = f", {pace:g}x the time limit later" if pace else ""
            tracked.note(f"{entry.source} -> {entry.dest} ({entry.label}), turn {entry.turn}{took}")
            tracked.check(self.store, self.rows, limits=self.limits, bound=self.bound)
            if run.done:
                tracked.check_stop(limits=self.limits, bound=self.bound)
                return
            # the clock every run reads: time passes for the others (and paused ones) too
            self.stage.clock.now += pace * self.limits.timeout_s


def agent_state_machine(
    agent: Agent,
    *,
    user_input: str = DEFAULT_INPUT,
    behaviours: st.SearchStrategy[Behaviour] | None = None,
    tool_failures: bool = True,
    max_runs: int = 2,
    make_store: Callable[[], CheckpointStore] = MemoryStore,
    real_tools: bool = False,
) -> type[AgentStateMachine]:
    """An ``AgentStateMachine`` for ``agent``; the arguments are its class attributes.

    ``TestMyAgent = agent_state_machine(agent).TestCase`` collects it under pytest.
    """
    if not isinstance(agent, Agent):
        raise ConfigError(f"agent_state_machine needs an Agent, got {type(agent).__name__}")
    if max_runs < 1:
        raise ConfigError(f"max_runs must be at least 1, got {max_runs}")
    attributes = {
        "agent": agent,
        "user_input": user_input,
        "behaviours": behaviours,
        "tool_failures": tool_failures,
        "real_tools": real_tools,
        "max_runs": max_runs,
        "make_store": staticmethod(make_store),
    }
    return cast(
        type[AgentStateMachine], type("AgentStateMachine", (AgentStateMachine,), attributes)
    )


def assert_stateful(
    agent: Agent,
    *,
    max_examples: int | None = None,
    steps: int | None = None,
    settings: Settings | None = None,
    **options: Any,
) -> None:
    """Check that ``agent``'s runs keep every invariant however they are interleaved,
    steered, aborted, timed out, crashed and resumed (see the module docstring).

    Args:
        agent: the agent under test (never modified; its model is never called).
        max_examples: how many sequences of rules to try; the active profile's by default.
        steps: most rules per sequence (hypothesis' ``stateful_step_count``); the active
            profile's by default (50).
        settings: hypothesis settings to start from; the active profile by default.
        **options: ``user_input``, ``behaviours``, ``tool_failures``, ``max_runs``,
            ``make_store``, ``real_tools``, as for ``agent_state_machine``.

    Raises:
        InvariantViolation: for the shortest failing sequence hypothesis found (printed
            with the failure), naming the broken invariants, what happened to the run and
            what its model said.
    """
    base = settings if settings is not None else Settings()
    chosen = Settings(
        base,
        max_examples=max_examples if max_examples is not None else base.max_examples,
        stateful_step_count=steps if steps is not None else base.stateful_step_count,
        deadline=None,
        report_multiple_bugs=False,
        phases=[phase for phase in base.phases if phase is not Phase.explain],
        suppress_health_check=[*base.suppress_health_check, HealthCheck.too_slow],
    )
    with frozen_heap():
        run_state_machine_as_test(agent_state_machine(agent, **options), settings=chosen)
