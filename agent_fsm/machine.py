"""The state machine, built from ``table.py`` and verified before any run starts.

This is the only module that imports ``transitions``. One synchronous ``Machine`` is built per
agent definition and shared by all of its runs; each run attaches a small identity-compared
``RunHandle`` that wraps its RunState, and detaches it when the run ends.

Verification (``verify_table``) proves, from the rows alone, that every run terminates:

1. every guard name exists, and every (trigger, source) group ends with an unguarded "else"
   row, so a step always moves; no row is shadowed by an earlier, weaker row;
2. every non-terminal state can reach DONE or ERROR;
3. every cycle passes through a *turn-counting* row (a row into THINK, which makes one model
   call), i.e. the graph without those rows is acyclic;
4. between two model calls the run always passes a row *gated by the turn budget*: a row R is
   gated when an earlier row of its group leads to a terminal state on the guards
   ``{no_turns_left} ∪ S`` with ``S ⊆ guards(R)``: whenever R could fire with no turn left,
   that earlier row fires instead. Hence model calls ≤ max_turns.

From 3 and 4 the bound on transitions follows: with ``a`` the longest count-free path from the
initial state to a counting row, ``b`` from THINK back to one, ``c`` from THINK to a terminal
and ``z`` from the initial state to a terminal, a run takes at most
``max(z, a + M + (M-1)·b + c)`` transitions for ``M = max_turns``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any, cast

from transitions import EventData, Machine
from transitions.core import Event, Transition

from agent_fsm.errors import ConfigError, RunError
from agent_fsm.guards import GUARDS, Guard
from agent_fsm.limits import Limits
from agent_fsm.state import RunState
from agent_fsm.table import (
    INITIAL_STATE,
    TABLE,
    TERMINAL_STATES,
    TRIGGER_FOR_STATE,
    TURN_BUDGET_GUARD,
    TURN_STATE,
    AgentState,
    Row,
)

__all__ = ["AgentMachine", "RunHandle", "TerminationBound", "verify_table"]


class _DropOverrideNotices(logging.Filter):
    """transitions warns once per trigger and state whenever a model is attached with
    ``model_override=True``; that is the configuration we chose, so those notices are noise."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "due to model override policy" not in str(record.msg)


# transitions logs every callback at DEBUG; keep it out of the hot path unless asked for.
logging.getLogger("transitions").setLevel(logging.WARNING)
logging.getLogger("transitions.core").addFilter(_DropOverrideNotices())


@dataclass(frozen=True, slots=True)
class TerminationBound:
    """Upper bounds on one run, computed from the table and the limits before it starts."""

    model_calls: int
    transitions: int
    formula: str
    """The transitions bound as a formula of max_turns, e.g. ``4·max_turns + 1``."""


class RunHandle:
    """What ``transitions`` sees of one run: its RunState, its Limits, and the last row taken.

    Compared by identity (the default), so any number of runs share one Machine.
    """

    __slots__ = ("_name", "limits", "run_state", "taken")

    def __init__(self, run_state: RunState, limits: Limits) -> None:
        self.run_state = run_state
        self.limits = limits
        self.taken = -1
        self._name: str = run_state.state.value

    @property
    def state(self) -> str:
        """The state name as transitions sees it: a plain string (no Enum conversions on
        the hot path); the RunState keeps the AgentState."""
        return self._name

    @state.setter
    def state(self, value: str) -> None:
        self._name = value
        self.run_state.state = AgentState(value)


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
# (``event_cls``, ``transition_cls``, ``condition_cls``). A trigger tries every row of its
# state until one passes, and most rows fail, so the per-row and per-trigger bookkeeping of the
# stock classes (about ten debug-log calls, callback-name resolution and callback lists that
# are always empty here) dominated the machine's cost: ~11 µs per trigger, measured with
# benchmarks/overhead.py. These keep the semantics this machine uses (rows tried in order,
# all conditions must pass, before → state change with exit/enter callbacks → after) and
# record the winning row; ``AgentMachine`` asserts that the features they skip (queued
# processing, machine-level prepare/finalize/exception callbacks) stay unused.


class _Transition(Transition):
    """A table row: knows its pure guards and its index, which it records when it fires."""

    def __init__(self, *args: Any, row_index: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.row_index = row_index
        self.guards: tuple[Guard, ...] = tuple(
            cast(_GuardCondition, c.func).guard for c in self.conditions
        )

    def passes(self, run_state: RunState, limits: Limits) -> bool:
        # A plain loop, not all(<generator>): this runs for every row tried on every trigger.
        for guard in self.guards:  # noqa: SIM110
            if not guard(run_state, limits):
                return False
        return True

    def execute(self, event_data: EventData) -> bool:
        handle = cast(RunHandle, event_data.model)
        if not self.passes(handle.run_state, handle.limits):
            return False
        self.apply(event_data)
        return True

    def apply(self, event_data: EventData) -> None:
        """The state change of a row whose guards passed: before → exit → set → enter →
        record → after, as the stock Transition does."""
        machine = event_data.machine
        if self.before or machine.before_state_change:
            machine.callbacks([*machine.before_state_change, *self.before], event_data)
        source, dest = machine.states[self.source], machine.states[cast(str, self.dest)]
        if source.on_exit:
            machine.callbacks(source.on_exit, event_data)
        setattr(event_data.model, machine.model_attribute, dest.value)
        event_data.state = dest
        if dest.on_enter:
            machine.callbacks(dest.on_enter, event_data)
        cast(RunHandle, event_data.model).taken = self.row_index
        if self.after or machine.after_state_change:
            machine.callbacks([*self.after, *machine.after_state_change], event_data)


class _Event(Event):
    """Tries the rows of the model's current state in order; the first that passes wins.

    Guards are evaluated directly on the run's state, and the EventData that callbacks
    receive is built only for the winning row.
    """

    def trigger(self, model: object, *args: Any, **kwargs: Any) -> bool:
        handle = cast(RunHandle, model)
        run_state, limits = handle.run_state, handle.limits
        rows = cast(list[_Transition], self.transitions.get(handle.state, ()))
        for transition in rows:
            if transition.passes(run_state, limits):
                event_data = EventData(None, self, self.machine, model, args=args, kwargs=kwargs)
                event_data.state = self.machine.states[handle.state]
                event_data.transition = transition
                transition.apply(event_data)
                event_data.result = True
                return True
        return False


class _Machine(Machine):
    transition_cls = _Transition
    event_cls = _Event


def _describe(row: Row, index: int) -> str:
    guards = " and ".join(row.guards) or "else"
    return f"row {index} ({row.source} --{row.trigger} [{guards}]--> {row.dest} {row.label})"


def _is_gated(rows: tuple[Row, ...], index: int) -> bool:
    row = rows[index]
    for earlier in rows[:index]:
        if (
            earlier.trigger == row.trigger
            and earlier.source == row.source
            and earlier.dest in TERMINAL_STATES
            and TURN_BUDGET_GUARD in earlier.guards
            and set(earlier.guards) - {TURN_BUDGET_GUARD} <= set(row.guards)
        ):
            return True
    return False


def _find_cycle(edges: Mapping[AgentState, set[AgentState]]) -> list[AgentState] | None:
    """A cycle in the graph, as a list of states, or None when it is acyclic."""
    visiting: list[AgentState] = []
    done: set[AgentState] = set()

    def visit(state: AgentState) -> list[AgentState] | None:
        if state in visiting:
            return [*visiting[visiting.index(state) :], state]
        if state in done:
            return None
        visiting.append(state)
        for nxt in sorted(edges.get(state, ())):
            found = visit(nxt)
            if found:
                return found
        visiting.pop()
        done.add(state)
        return None

    for start in sorted(edges):
        found = visit(start)
        if found:
            return found
    return None


def verify_table(rows: tuple[Row, ...], guards: Mapping[str, Guard] = GUARDS) -> None:
    """Check the rules in the module docstring; raise ConfigError naming the offender."""
    if not rows:
        raise ConfigError("the machine table has no rows")
    for i, row in enumerate(rows):
        unknown = [g for g in row.guards if g not in guards]
        if unknown:
            raise ConfigError(f"{_describe(row, i)} names unknown guard(s) {unknown}")
        if row.source in TERMINAL_STATES:
            raise ConfigError(f"{_describe(row, i)} leaves terminal state {row.source}")
        if TRIGGER_FOR_STATE.get(row.source) != row.trigger:
            raise ConfigError(
                f"{_describe(row, i)}: state {row.source} is left only by trigger "
                f"{TRIGGER_FOR_STATE.get(row.source)}"
            )
        for j, earlier in enumerate(rows[:i]):
            if (earlier.trigger, earlier.source) == (row.trigger, row.source) and set(
                earlier.guards
            ) <= set(row.guards):
                raise ConfigError(
                    f"{_describe(row, i)} can never fire: {_describe(earlier, j)} comes first "
                    "and needs no more than it"
                )
        if row.dest in TERMINAL_STATES:
            row.stop_reason  # noqa: B018 - raises ValueError for a label that is no StopReason
    for state, trigger in TRIGGER_FOR_STATE.items():
        group = [r for r in rows if r.source == state]
        if not group:
            raise ConfigError(f"state {state} has no way out: add rows for trigger {trigger}")
        if group[-1].guards:
            raise ConfigError(
                f"state {state} has no unguarded last row: when no guard passes, "
                "the run would be stuck"
            )

    edges: dict[AgentState, set[AgentState]] = {}
    for row in rows:
        edges.setdefault(row.source, set()).add(row.dest)
    for state in TRIGGER_FOR_STATE:
        if not _reaches(edges, state, TERMINAL_STATES):
            raise ConfigError(f"state {state} can never reach DONE or ERROR")

    uncounted: dict[AgentState, set[AgentState]] = {}
    for row in rows:
        if row.dest != TURN_STATE:
            uncounted.setdefault(row.source, set()).add(row.dest)
    cycle = _find_cycle(uncounted)
    if cycle:
        raise ConfigError(
            f"cycle {' -> '.join(cycle)} makes no model call, so no turn budget bounds it"
        )

    free = _ungated_count_free_edges(rows)
    for i, row in enumerate(rows):
        if (
            row.dest == TURN_STATE
            and not _is_gated(rows, i)
            and _reaches(free, TURN_STATE, {row.source})
        ):
            raise ConfigError(
                f"{_describe(row, i)} can start another model call without passing the "
                f"'{TURN_BUDGET_GUARD}' guard after the previous one, so max_turns does "
                "not bound the run"
            )


def _ungated_count_free_edges(rows: tuple[Row, ...]) -> dict[AgentState, set[AgentState]]:
    """Edges of rows that neither count a turn nor are gated by the turn budget."""
    graph: dict[AgentState, set[AgentState]] = {}
    for i, row in enumerate(rows):
        if row.dest != TURN_STATE and not _is_gated(rows, i):
            graph.setdefault(row.source, set()).add(row.dest)
    return graph


def _reaches(
    edges: Mapping[AgentState, Iterable[AgentState]],
    start: AgentState,
    goals: Iterable[AgentState],
) -> bool:
    goal_set, seen, stack = set(goals), {start}, [start]
    while stack:
        state = stack.pop()
        if state in goal_set:
            return True
        for nxt in edges.get(state, ()):
            if nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
    return False


def _longest_path(rows: tuple[Row, ...], start: AgentState, goal: Callable[[Row], bool]) -> int:
    """Most transitions on a count-free path from ``start`` ending with a row where ``goal``
    holds (that row included when it is not a counting row); -1 when there is none."""
    count_free = [r for r in rows if r.dest != TURN_STATE]

    @cache
    def longest(state: AgentState) -> int:
        best = 0 if any(goal(r) and r.dest == TURN_STATE for r in rows if r.source == state) else -1
        for row in count_free:
            if row.source != state:
                continue
            if goal(row):
                best = max(best, 1)
            tail = longest(row.dest)
            if tail >= 0:
                best = max(best, tail + 1)
        return best

    return longest(start)


class AgentMachine:
    """The verified, shared machine of one agent definition."""

    def __init__(self, rows: tuple[Row, ...] = TABLE, guards: Mapping[str, Guard] = GUARDS):
        verify_table(rows, guards)
        self.rows = rows
        self._bound_terms = self._bound_terms_of(rows)
        transitions: list[dict[str, Any]] = [
            {
                "trigger": row.trigger.value,
                "source": row.source,
                "dest": row.dest,
                "conditions": [_GuardCondition(name, guards[name]) for name in row.guards],
                "row_index": i,
            }
            for i, row in enumerate(rows)
        ]
        self._machine = _Machine(
            model=None,
            states=[state.value for state in AgentState],
            transitions=transitions,
            initial=INITIAL_STATE.value,
            auto_transitions=False,
            model_override=True,
            send_event=True,
            name="agent_fsm",
        )
        machine = self._machine
        unsupported = (machine.has_queue, machine.prepare_event, machine.finalize_event)
        if any(unsupported) or machine.on_exception or machine.on_final:
            raise ConfigError("the lean event classes support no queued or machine callbacks")
        self._events = {
            trigger: self._machine.events[trigger.value] for trigger in TRIGGER_FOR_STATE.values()
        }

    @staticmethod
    def _bound_terms_of(rows: tuple[Row, ...]) -> tuple[int, int, int, int]:
        def counting(row: Row) -> bool:
            return row.dest == TURN_STATE

        def terminal(row: Row) -> bool:
            return row.dest in TERMINAL_STATES

        a = _longest_path(rows, INITIAL_STATE, counting)
        b = _longest_path(rows, TURN_STATE, counting)
        c = _longest_path(rows, TURN_STATE, terminal)
        z = _longest_path(rows, INITIAL_STATE, terminal)
        return a, max(b, 0), c, z

    def bound(self, limits: Limits) -> TerminationBound:
        """Bounds that hold for every run of this machine under ``limits``."""
        a, b, c, z = self._bound_terms
        m = limits.max_turns
        per_turn = 1 + b
        constant = a + c - b
        return TerminationBound(
            model_calls=m,
            transitions=max(z, a + m + (m - 1) * b + c),
            formula=f"{per_turn}·max_turns + {constant}",
        )

    def attach(self, run_state: RunState, limits: Limits) -> RunHandle:
        handle = RunHandle(run_state, limits)
        self._machine.add_model(handle, initial=run_state.state.value)
        return handle

    def detach(self, handle: RunHandle) -> None:
        self._machine.remove_model(handle)

    def fire(self, handle: RunHandle) -> Row:
        """Fire the trigger of the handle's current state; return the row that was taken."""
        state = handle.run_state.state
        trigger = TRIGGER_FOR_STATE.get(state)
        if trigger is None:
            raise RunError(f"run {handle.run_state.run_id} has already ended in {state}")
        handle.taken = -1
        self._events[trigger].trigger(handle)
        if handle.taken < 0:  # impossible for a verified table: every group ends with "else"
            raise RunError(f"no transition fired from {state}")
        return self.rows[handle.taken]
