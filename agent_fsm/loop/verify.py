"""Verification of a transition table, from its rows alone, and the termination bound.

Pure graph checks on ``table.py``'s data (no state-machine library involved), so the same
proof applies whatever executes the table. ``verify_table`` proves that every run terminates:

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

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import cache

from agent_fsm.errors import ConfigError
from agent_fsm.limits import Limits
from agent_fsm.loop.guards import GUARDS, Guard
from agent_fsm.table import (
    INITIAL_STATE,
    TERMINAL_STATES,
    TRIGGER_FOR_STATE,
    TURN_BUDGET_GUARD,
    TURN_STATE,
    AgentState,
    Row,
)

__all__ = ["TerminationBound", "termination_bound", "verify_table"]


@dataclass(frozen=True, slots=True)
class TerminationBound:
    """Upper bounds on one run, computed from the table and the limits before it starts."""

    model_calls: int
    transitions: int
    formula: str
    """The transitions bound as a formula of max_turns, e.g. ``4·max_turns + 1``."""


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


def _bound_terms(rows: tuple[Row, ...]) -> tuple[int, int, int, int]:
    def counting(row: Row) -> bool:
        return row.dest == TURN_STATE

    def terminal(row: Row) -> bool:
        return row.dest in TERMINAL_STATES

    a = _longest_path(rows, INITIAL_STATE, counting)
    b = _longest_path(rows, TURN_STATE, counting)
    c = _longest_path(rows, TURN_STATE, terminal)
    z = _longest_path(rows, INITIAL_STATE, terminal)
    return a, max(b, 0), c, z


def termination_bound(rows: tuple[Row, ...], limits: Limits) -> TerminationBound:
    """Bounds that hold for every run of a verified table under ``limits``."""
    a, b, c, z = _bound_terms(rows)
    m = limits.max_turns
    return TerminationBound(
        model_calls=m,
        transitions=max(z, a + m + (m - 1) * b + c),
        formula=f"{1 + b}·max_turns + {a + c - b}",
    )
