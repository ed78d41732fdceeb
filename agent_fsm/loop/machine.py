"""The state machine, built from ``table.py`` after ``verify.py`` has proved it terminates.

This is the only module that imports ``transitions``. One synchronous ``Machine`` is built per
agent definition and shared by all of its runs. Each run drives it through a small
``RunHandle`` (its RunState, its Limits, the last row taken) that is handed to the machine's
events as the model. Handles are not registered with ``Machine.add_model``: nothing here uses
the trigger methods registration decorates a model with, and a shared machine must not hold
a reference to every run it ever drove.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, cast

from transitions import EventData, Machine
from transitions.core import Event, Transition

from agent_fsm.custom_table import CustomState
from agent_fsm.errors import ConfigError, RunError, TableError
from agent_fsm.limits import Limits
from agent_fsm.loop.guards import GUARDS, Guard
from agent_fsm.loop.verify import (
    TerminationBound,
    counting_states,
    termination_bound,
    verify_table,
)
from agent_fsm.state import RunState
from agent_fsm.table import (
    ANSWER_GUARDS,
    INITIAL_STATE,
    RESUME_TRIGGER,
    TABLE,
    TERMINAL_STATES,
    TRIGGER_FOR_STATE,
    AgentState,
    Row,
    StopReason,
    control_order,
    resumable_stops,
    state_named,
)
from agent_fsm.views import view_of

__all__ = ["AgentMachine", "RunHandle", "TerminationBound", "verify_table", "with_builtin_guards"]


class RunHandle:
    """What ``transitions`` sees of one run: its RunState, its Limits, and the last row taken.

    Compared by identity (the default), so any number of runs share one Machine.
    """

    __slots__ = ("_name", "limits", "rows", "run_state", "taken")

    def __init__(self, run_state: RunState, limits: Limits, rows: Mapping[str, _Groups]) -> None:
        self.run_state = run_state
        self.limits = limits
        self.rows = rows
        """The rows each loop state is left by, in order, without those that cannot fire for
        this run's agent, grouped by their first guard (``AgentMachine.handle``)."""
        self.taken = -1
        self._name: str = str(run_state.state)

    @property
    def state(self) -> str:
        """The state name as transitions sees it: a plain string (no Enum conversions on
        the hot path); the RunState keeps the AgentState."""
        return self._name

    @state.setter
    def state(self, value: str) -> None:
        self._name = value
        self.run_state.state = state_named(value)


class _GuardCondition:
    """Adapts a pure guard to transitions' callback form; keeps the guard's name for diagrams."""

    __slots__ = ("__name__", "guard")

    def __init__(self, name: str, guard: Guard) -> None:
        self.__name__ = name
        self.guard = guard

    def __call__(self, event: EventData) -> bool:
        handle = cast(RunHandle, event.model)
        return self.guard(handle.run_state, handle.limits)


# Lean execution classes, installed through transitions' documented class hooks
# (``event_cls``, ``transition_cls``). A trigger tries every row of its state until one passes,
# and most rows fail; the stock classes' per-row bookkeeping (debug-log calls, callback-name
# resolution, an EventData per row tried) made the default loop cost 73% more instructions
# per turn (benchmarks/instructions.py: 1,519,651 against 878,438). The agent's machine has
# no callbacks (the engine does each state's work between triggers, never inside one), so a
# row that passes only moves the run and records itself; ``AgentMachine`` refuses a machine
# with callbacks or queued processing, which these classes do not run.


class _Transition(Transition):
    """A table row: knows its pure guards and its index, which it records when it fires."""

    def __init__(self, *args: Any, row_index: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.row_index = row_index
        self.dest_name = cast(str, self.dest)
        self.dest_state = state_named(self.dest_name)
        self.guards: tuple[Guard, ...] = tuple(
            cast(_GuardCondition, c.func).guard for c in self.conditions
        )
        self.guard_names: tuple[str, ...] = tuple(
            cast(_GuardCondition, c.func).__name__ for c in self.conditions
        )
        self.later_guards = self.guards[1:]
        """The guards after the first, which its group (``_grouped``) has checked."""


_Groups = list[tuple["Guard | None", list[_Transition]]]
"""A state's rows in order, as runs of consecutive rows that share their first guard (None:
a row without guards, alone), each with that guard."""


def _grouped(rows: list[_Transition]) -> _Groups:
    """``rows`` as runs that share their first guard: a guard is pure, so one that is false
    for the first row of a run is false for the rest, and none of them is tried. Nine rows
    of THINK begin with ``model_call_failed`` (the failed call's stops and retry): a turn
    whose call succeeded reads it once or twice (last-answer rows split the run), not nine
    times; without this, those readings were 3% of a default turn's instructions."""
    groups: _Groups = []
    for row in rows:
        first = row.guard_names[0] if row.guard_names else None
        if groups and first is not None and groups[-1][1][0].guard_names[:1] == (first,):
            groups[-1][1].append(row)
        else:
            groups.append((row.guards[0] if row.guards else None, [row]))
    return groups


class _Event(Event):
    """Tries the rows of the model's current state in order; the first whose guards all
    pass is taken. Guards are evaluated directly on the run's state (they are pure), a
    group's shared first guard once (``_grouped``). A loop trigger tries the handle's rows
    of the state (those that can fire for its agent); the resume trigger, all of them."""

    every_row: Mapping[str, _Groups] | None = None
    """Set on the resume trigger: every row of each state, grouped."""

    def trigger(self, model: object, *args: Any, **kwargs: Any) -> bool:
        handle: RunHandle = model  # type: ignore[assignment]  # only RunHandles are attached
        run_state, limits = handle.run_state, handle.limits
        rows = handle.rows if self.every_row is None else self.every_row
        for first, group in rows[handle._name]:
            if first is not None and not first(run_state, limits):
                continue
            for transition in group:
                for guard in transition.later_guards:
                    if not guard(run_state, limits):
                        break
                else:
                    handle._name = transition.dest_name
                    run_state.state = transition.dest_state
                    handle.taken = transition.row_index
                    return True
        return False


class _Machine(Machine):
    transition_cls = _Transition
    event_cls = _Event


@functools.lru_cache(maxsize=1024)
def _bound(
    rows: tuple[Row, ...], limits: Limits, counting: frozenset[AgentState | str]
) -> TerminationBound:
    return termination_bound(rows, limits, counting)


class _CheckedGuard:
    """A guard of the user's own (``Table.guards``), held to the guard contract as it runs: a
    bool, no exception, and no write to the run (it reads a read-only view of the state:
    ``views.view_of``). A guard that breaks it raises ``TableError`` naming it, instead of an
    error from inside the machine, a truthy value taken for a decision, or a run whose
    counts it changed."""

    __slots__ = ("guard", "name")

    def __init__(self, name: str, guard: Guard) -> None:
        self.name = name
        self.guard = guard

    def __call__(self, run_state: RunState, limits: Limits) -> bool:
        try:
            verdict = self.guard(view_of(run_state), limits)
        except Exception as exc:
            raise TableError(
                f"guard {self.name!r} raised {type(exc).__name__}: {exc} (in state "
                f"{run_state.state}, turn {run_state.turns}); a guard must be a total "
                "function of the run state"
            ) from exc
        if verdict is not True and verdict is not False:
            raise TableError(
                f"guard {self.name!r} returned {type(verdict).__name__}, not a bool (in "
                f"state {run_state.state}, turn {run_state.turns})"
            )
        return verdict


def _ranks_before(order: tuple[StopReason, ...], first: StopReason, then: StopReason) -> bool:
    """Whether ``first`` comes before ``then`` in ``order`` (a stop absent comes last)."""

    def rank(stop: StopReason) -> int:
        return order.index(stop) if stop in order else len(order)

    return rank(first) < rank(then)


def with_builtin_guards(custom: Mapping[str, Guard]) -> dict[str, Guard]:
    """The built-in guards and a table's own (``Table.guards``).

    Raises:
        ConfigError: a custom guard takes a built-in guard's name (the proof reads those by
            name: the turn gate is ``no_turns_left``), or is not callable.
    """
    taken = sorted(name for name in custom if name in GUARDS and custom[name] is not GUARDS[name])
    if taken:
        raise ConfigError(f"guard(s) {taken} are built in: give a guard of your own a new name")
    for name, guard in custom.items():
        if not callable(guard):
            raise ConfigError(f"guard {name!r} is not callable")
    return {**GUARDS, **custom}


class AgentMachine:
    """The verified, shared machine of one agent definition.

    ``rows``, ``guards`` (every guard the rows may name: ``with_builtin_guards`` adds a
    table's own to the built-in ones) and ``states`` (the user's ``CustomState``s) make the
    loop; the default is the default loop. A guard that is not built in is held to the guard
    contract as it runs (``TableError``).
    """

    def __init__(
        self,
        rows: tuple[Row, ...] = TABLE,
        guards: Mapping[str, Guard] = GUARDS,
        states: tuple[CustomState, ...] = (),
    ):
        verify_table(rows, guards, states)
        guards = {
            name: guard if name in GUARDS else _CheckedGuard(name, guard)
            for name, guard in guards.items()
        }
        self.rows = rows
        self.custom = {state.name: state for state in states}
        """The custom states of this table by name, whose work the engine does."""
        self.counting = counting_states(states)
        """The states whose entry takes a turn (a model call)."""
        self.resumable = resumable_stops(rows)
        """The stops some resume row of this table may leave."""
        self.control_order = control_order(rows)
        """The control stops in the order the REFLECT rows try them (``table.control_order``):
        ACT answers a turn's control calls in this order."""
        self.approval_first = _ranks_before(
            self.control_order, StopReason.APPROVAL_REQUIRED, StopReason.TERMINAL_TOOL
        )
        """The table ranks calls awaiting approval above a terminal tool's result: ACT then
        runs no terminal call while calls of its turn wait for a person."""
        transitions: list[dict[str, Any]] = [
            {
                "trigger": str(row.trigger),
                "source": str(row.source),
                "dest": str(row.dest),
                "conditions": [_GuardCondition(name, guards[name]) for name in row.guards],
                "row_index": i,
            }
            for i, row in enumerate(rows)
        ]
        self._machine = _Machine(
            model=None,
            states=[state.value for state in AgentState] + [state.name for state in states],
            transitions=transitions,
            initial=INITIAL_STATE.value,
            auto_transitions=False,
            send_event=True,
            name="agent_fsm",
        )
        machine = self._machine
        callbacks = [
            machine.has_queue,
            machine.prepare_event,
            machine.finalize_event,
            machine.on_exception,
            machine.on_final,
            machine.before_state_change,
            machine.after_state_change,
            *(s.on_enter or s.on_exit for s in machine.states.values()),
            *(
                t.before or t.after or t.prepare
                for e in machine.events.values()
                for ts in e.transitions.values()
                for t in ts
            ),
        ]
        if any(callbacks):
            raise ConfigError("the agent's machine runs no callbacks and no queued events")
        self._event_in: dict[str, Event] = {
            state.value: machine.events[trigger.value]
            for state, trigger in TRIGGER_FOR_STATE.items()
        }
        self._event_in.update((state.name, machine.events[state.trigger]) for state in states)
        """The event each non-terminal state fires, by state name (the handle's own key)."""
        self._resume_event = machine.events[RESUME_TRIGGER.value]
        cast(_Event, self._resume_event).every_row = {
            state: _grouped(cast(list[_Transition], rows))
            for state, rows in self._resume_event.transitions.items()
        }
        self._guards = guards
        self._live_rows: dict[frozenset[str], dict[str, _Groups]] = {}
        """The rows each loop state is left by, by the guards that are false for an agent
        (``handle``): worked out once per set."""

    def knows(self, run_state: RunState) -> bool:
        """Whether ``run_state`` can be a run of this machine: its state is one of the
        table's, and its trace names rows the table has (a run started with another table
        cannot be continued with this one)."""
        rows = len(self.rows)
        return (run_state.state in self._event_in or run_state.state in TERMINAL_STATES) and all(
            0 <= index < rows for index, _ in run_state.trace
        )

    def bound(self, limits: Limits) -> TerminationBound:
        """Bounds that hold for every run of this machine under ``limits``: computed once
        per limits (a few longest-path searches over the table), then remembered."""
        return _bound(self.rows, limits, self.counting)

    def handle(
        self, run_state: RunState, limits: Limits, dead: frozenset[str] = frozenset()
    ) -> RunHandle:
        """What one run fires this machine with; nothing to release when the run ends.

        Args:
            dead: guards that are false on every run of the agent (a feature it does not
                use: no last answer, no context window, no reflector...): rows naming one
                can never fire, so the run does not try them. A feature that is off costs
                nothing per turn; the verifier, the bound and the diagrams still read the
                whole table.
        """
        rows = self._live_rows.get(dead)
        if rows is None:
            rows = {
                state: _grouped(
                    [
                        t
                        for t in cast(list[_Transition], event.transitions[state])
                        if not dead.intersection(t.guard_names)
                    ]
                )
                for state, event in self._event_in.items()
            }
            if len(self._live_rows) < 64:  # a handful of agents share a machine
                self._live_rows[dead] = rows
        return RunHandle(run_state, limits, rows)

    def resume_row(self, run_state: RunState, limits: Limits) -> Row | None:
        """The resume row that would leave the run's stop, without taking it (guards are
        pure); None when no row accepts the run as it is."""
        for row in self.rows:
            if (
                row.resumes
                and row.source == run_state.state
                and all(self._guards[name](run_state, limits) for name in row.guards)
            ):
                return row
        return None

    def can_resume(self, run_state: RunState, limits: Limits) -> bool:
        """Some resume row leaves the run's stop, given the right answer: its guards pass
        except those that read the answer (``ANSWER_GUARDS``)."""
        return any(
            row.resumes
            and row.source == run_state.state
            and all(
                self._guards[name](run_state, limits)
                for name in row.guards
                if name not in ANSWER_GUARDS
            )
            for row in self.rows
        )

    def resume(self, handle: RunHandle) -> Row | None:
        """Fire the resume trigger on a reopened run (stopped, or crashed mid-step); return
        the row taken, or None when no resume row accepts it (the run then stays where it
        is)."""
        handle.taken = -1
        self._resume_event.trigger(handle)
        return self.rows[handle.taken] if handle.taken >= 0 else None

    def fire(self, handle: RunHandle) -> Row:
        """Fire the trigger of the handle's current state; return the row that was taken."""
        event = self._event_in.get(handle._name)
        if event is None:
            raise RunError(f"run {handle.run_state.run_id} has already ended in {handle._name}")
        handle.taken = -1
        event.trigger(handle)
        if handle.taken < 0:  # impossible for a verified table: every group ends with "else"
            raise RunError(f"no transition fired from {handle._name}")
        return self.rows[handle.taken]
