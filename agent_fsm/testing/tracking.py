"""One run followed across the ``Run`` objects that carry it (started, resumed, recovered after
a crash), with the invariants it must keep between any two steps.

The stateful machine (``stateful.py``) keeps a ``TrackedRun`` for every run it opens and asks
it to ``check`` after every transition and every rule. No hypothesis here: the record and its
checks work for any code that drives runs step by step against a durable store.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from agent_fsm.durable.checkpoint import CheckpointStore
from agent_fsm.events import Event
from agent_fsm.limits import Limits
from agent_fsm.loop.verify import TerminationBound
from agent_fsm.messages import Message
from agent_fsm.run.engine import Run
from agent_fsm.state import RunState
from agent_fsm.table import Row, StopReason, saved_with_next_step
from agent_fsm.testing.behaviour import BehaviourModel
from agent_fsm.testing.invariants import (
    InvariantViolation,
    check_invariants,
    state_problems,
)
from agent_fsm.testing.reproducer import item_source

__all__ = ["TrackedRun"]

_ENDS_WITH_AN_ANSWER = frozenset({StopReason.FINAL_ANSWER, StopReason.MAX_TOKENS})


@dataclass(eq=False)
class TrackedRun:
    """One run, what happened to it, and what was last seen of it."""

    number: int
    """1 for the first run opened, and so on: how the log and the failures name it."""
    run_id: str
    model: BehaviourModel
    """The model playing this run's behaviour (``Stage.cast``)."""
    run: Run | None = None
    """The live Run; None after a crash, until it is recovered."""
    durable: bool = False
    """The store holds the run where it is now (it stepped, or was recovered): a crash would
    lose nothing. A run just started or resumed is not durable until its first step."""
    events: list[Event] = field(default_factory=list)
    """Every event of every activation: what ``check_invariants`` adds usage up from."""
    log: list[str] = field(default_factory=list)
    """What happened to the run, in order, as the failure message tells it."""
    messages: tuple[Message, ...] = ()
    """The transcript when last checked: it may only grow."""
    trace: tuple[tuple[int, int], ...] = ()
    """The trace when last checked: it may only grow."""

    @property
    def active(self) -> bool:
        """It has a Run that has not stopped."""
        return self.run is not None and not self.run.done

    @property
    def stopped(self) -> bool:
        """It has a Run that stopped (paused or finished)."""
        return self.run is not None and self.run.done

    @property
    def resumable(self) -> bool:
        """It stopped in a way ``Agent.resume`` can continue."""
        run = self.run
        return run is not None and run.resumable

    def note(self, what: str) -> None:
        self.log.append(what)

    def attach(self, run: Run) -> None:
        """Follow a new Run object for this run (started, resumed or recovered)."""
        self.run = run
        run.subscribe(self.events.append)
        self.model.on_abort = run.abort

    def check(
        self,
        store: CheckpointStore,
        rows: tuple[Row, ...],
        *,
        limits: Limits,
        bound: TerminationBound,
    ) -> None:
        """The invariants between two steps, ended or not (``state_problems``), plus: the
        transcript and trace only grow, through crashes and resumes; the store's checkpoint
        holds the live transcript, trace and turn count. A crashed run is skipped: its
        checkpoint was checked when it was last live.

        Raises:
            InvariantViolation: naming what broke, what happened to the run and what its
                model said.
        """
        if self.run is None:
            return
        state = self.run.state
        problems = state_problems(state, rows, limits=limits, bound=bound)
        problems += self._growth(state)
        problems += self._checkpoint(store, state, rows)
        if problems:
            raise self.violation(problems)

    def check_stop(self, *, limits: Limits, bound: TerminationBound) -> None:
        """The invariants of a run that just stopped: ``check_invariants`` with its events,
        and no final answer while a steering or follow-up message waited unread.

        Raises:
            InvariantViolation: as for ``check``.
        """
        assert self.run is not None
        result = self.run.result
        try:
            check_invariants(result, limits=limits, bound=bound, events=self.events)
        except InvariantViolation as exc:
            raise self.violation([str(exc)]) from None
        waiting = [*self.run.state.pending_input, *self.run.state.follow_ups]
        if result.stop_reason in _ENDS_WITH_AN_ANSWER and waiting:
            raise self.violation(
                [f"it ended with {result.stop_reason.value} while {waiting} waited unread"]
            )

    def violation(self, problems: list[str]) -> InvariantViolation:
        """The failure for ``problems``, with the run's log and its model's replies."""
        played = "\n".join(f"    {item_source(item)[0]}," for item in self.model.played)
        return InvariantViolation(
            f"run {self.number} ({self.run_id}) broke {len(problems)} invariant(s):\n- "
            + "\n- ".join(problems)
            + "\n\nWhat happened to it, in order:\n"
            + "\n".join(f"    {line}" for line in self.log)
            + f"\n\nWhat its model said, in order:\n{played or '    (nothing)'}"
        )

    def _growth(self, state: RunState) -> list[str]:
        problems = []
        known = len(self.messages)
        if tuple(state.messages[:known]) != self.messages:
            problems.append(f"the first {known} messages of the transcript changed or went")
        if tuple(state.trace[: len(self.trace)]) != self.trace:
            problems.append(f"the first {len(self.trace)} transitions changed or went")
        self.messages, self.trace = tuple(state.messages), tuple(state.trace)
        return problems

    def _checkpoint(
        self, store: CheckpointStore, state: RunState, rows: tuple[Row, ...]
    ) -> list[str]:
        """The checkpoint holds the live run, except for a last transition the engine
        saves with the next step (``saved_with_next_step``)."""
        if not store.exists(self.run_id):
            return ["the run has stepped but the store has no checkpoint"] if state.trace else []
        saved = store.load(self.run_id)
        problems = []
        if saved.messages != state.messages:
            problems.append(
                f"the checkpoint holds {len(saved.messages)} messages that are not the run's "
                f"{len(state.messages)}"
            )
        trace = state.trace
        if trace and trace[-1][0] >= 0 and saved_with_next_step(rows[trace[-1][0]]):
            trace = trace[:-1]
        if (saved.trace, saved.turns) != (trace, state.turns):
            problems.append("the checkpoint's trace or turn count is not the run's")
        return problems
