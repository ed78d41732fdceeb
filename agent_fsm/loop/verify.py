"""Verification of a transition table, from its rows alone, and the termination bound.

Pure graph checks on ``table.py``'s data (no state-machine library involved), so the same
proof applies whatever executes the table. ``verify_table`` proves that every run terminates:

1. every guard name exists, and every (trigger, source) group ends with an unguarded "else"
   row, so a step always moves; no row is shadowed by an earlier, weaker row;
2. every non-terminal state can reach DONE or ERROR;
3. every cycle passes through a *turn-counting* row (a row into THINK, which makes one model
   call), i.e. the graph without those rows is acyclic;
4. between two model calls the run always passes a row *gated by the turn budget*: a row R is
   gated by a budget guard g when an earlier row of its group leads to a terminal state on
   the guards ``{g} ∪ S`` with ``S ⊆ guards(R)``: whenever R could fire with the budget
   spent, that earlier row fires instead. Hence turns ≤ max_turns. A *retry* row (outcome
   ``Verb.RETRY``) counts a retry, not a turn: it must itself be gated by the retry budget
   (``no_retries_left``), so retries ≤ model_retries_per_run, and model calls ≤ max_turns +
   model_retries_per_run.

5. the state of the last answer (``table.LAST_CALL_STATE``) makes one model call that is not
   a turn; every row out of it ends the run, so each activation makes that call at most once.
   Every row into it softens a stop row (``table.softened_stop``): it stands right before that
   row, with its guards and ``last_answer_wanted``; and the stop each softens is the outcome
   of a row out of it (named by the ``table.CLOSING_GUARDS`` guard of its reason, or the
   unguarded last row), so the run ends with the stop that fired. Conversely every stop row
   with one of those outcomes is softened: no limit ends a run without its last answer.

Resume rows (trigger ``resumed``) leave DONE or ERROR for a loop state, each naming exactly
one of the stop guards (``table.STOP_GUARDS``); they need no "else" row (a stop no row leaves
cannot be resumed). They are taken once per answer a person gives, so rules 3 and 4 apply
within each activation: a resume's destination counts as a start for rule 4 (every turn may
be used already when a run is resumed), and each resume adds a bounded number of transitions.

From 3 and 4 the bound on transitions follows: with ``a`` the longest count-free path from the
initial state to a counting row, ``b`` from THINK back to one, ``c`` from THINK to a terminal
and ``z`` from the initial state to a terminal, a run takes at most
``max(z, a + M + (M-1)·b + c)`` transitions for ``M`` model calls (``max_turns``, plus
``model_retries_per_run`` when the table retries); each resume into state
``e`` adds at most ``1 + max(a_e + c - b, z_e)`` (``TerminationBound.per_resume``), since the
model calls of every activation together stay within ``M``. Under ``Limits.last_answer``
each activation may add its last answer: one model call, and the longest way through
LAST_ANSWER is part of ``c``; without it the rows that lead there never fire and the bound
leaves them out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import cache

from agent_fsm.errors import ConfigError
from agent_fsm.limits import Limits
from agent_fsm.loop.guards import GUARDS, Guard
from agent_fsm.table import (
    CLOSING_GUARDS,
    INITIAL_STATE,
    LAST_ANSWER_GUARD,
    LAST_CALL_STATE,
    RESUME_TRIGGER,
    RETRY_BUDGET_GUARD,
    STOP_GUARDS,
    TERMINAL_STATES,
    TRIGGER_FOR_STATE,
    TURN_BUDGET_GUARD,
    TURN_STATE,
    AgentState,
    Row,
    StopReason,
    Verb,
    softened_stop,
)

__all__ = ["TerminationBound", "termination_bound", "verify_table"]


@dataclass(frozen=True, slots=True)
class TerminationBound:
    """Upper bounds on one run, computed from the table and the limits before it starts."""

    model_calls: int
    """Model calls in a run that is never resumed: turns, retries and its last answer."""
    transitions: int
    """Transitions of a run that is never resumed."""
    per_resume: int
    """What each resume may add to ``transitions``: the resume row and the longest way its
    new activation can take beyond its model calls."""
    formula: str
    """The transitions bound as a formula of the limits, e.g.
    ``5·(max_turns + model_retries_per_run) + 2``."""
    last_answers: int = 0
    """Model calls each activation may make beyond the run's turns and retries: 1 under
    ``Limits.last_answer`` (its last answer), else 0."""

    def with_resumes(self, resumes: int) -> int:
        """The transitions bound of a run resumed ``resumes`` times (after stops)."""
        return self.transitions + resumes * self.per_resume

    def calls_with_resumes(self, resumes: int) -> int:
        """The model-call bound of a run resumed ``resumes`` times: turns and retries carry
        over a resume, and each activation may add its last answer."""
        return self.model_calls + resumes * self.last_answers


def _describe(row: Row, index: int) -> str:
    guards = " and ".join(row.guards) or "else"
    return f"row {index} ({row.source} --{row.trigger} [{guards}]--> {row.dest} {row.label})"


def _is_gated(rows: tuple[Row, ...], index: int, budget: str = TURN_BUDGET_GUARD) -> bool:
    """Whether an earlier row of the group stops the run whenever ``rows[index]`` could fire
    with ``budget`` (the guard that says it is spent) true."""
    row = rows[index]
    for earlier in rows[:index]:
        if (
            earlier.trigger == row.trigger
            and earlier.source == row.source
            and earlier.dest in TERMINAL_STATES
            and budget in earlier.guards
            and set(earlier.guards) - {budget} <= set(row.guards)
        ):
            return True
    return False


def _retries(row: Row) -> bool:
    """A row that makes a model call counted as a retry of the last one, not a turn."""
    return row.dest == TURN_STATE and row.outcome is Verb.RETRY


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
    for i in range(len(rows)):
        _check_row(rows, i, guards)
    _check_ways_out(rows)
    _check_last_answer_rows(rows)
    loop_rows = tuple(row for row in rows if not row.resumes)
    edges: dict[AgentState, set[AgentState]] = {}
    for row in loop_rows:
        edges.setdefault(row.source, set()).add(row.dest)
    for state in TRIGGER_FOR_STATE:
        if not _reaches(edges, state, TERMINAL_STATES):
            raise ConfigError(f"state {state} can never reach DONE or ERROR")
    _check_cycles_count_turns(loop_rows)
    _check_turns_are_gated(rows)


def _check_row(rows: tuple[Row, ...], i: int, guards: Mapping[str, Guard]) -> None:
    """One row: known guards, the right trigger for its source, an outcome of the kind its
    destination calls for, and not shadowed by an earlier row of its group."""
    row = rows[i]
    unknown = [g for g in row.guards if g not in guards]
    if unknown:
        raise ConfigError(f"{_describe(row, i)} names unknown guard(s) {unknown}")
    if row.resumes:
        _check_resume_row(row, i)
    elif row.source in TERMINAL_STATES:
        raise ConfigError(
            f"{_describe(row, i)} leaves terminal state {row.source}: only a "
            f"{RESUME_TRIGGER} row may"
        )
    elif TRIGGER_FOR_STATE.get(row.source) != row.trigger:
        raise ConfigError(
            f"{_describe(row, i)}: state {row.source} is left only by trigger "
            f"{TRIGGER_FOR_STATE.get(row.source)}"
        )
    ends = row.dest in TERMINAL_STATES
    if ends != isinstance(row.outcome, StopReason):
        wanted = "a StopReason" if ends else "a Verb"
        raise ConfigError(f"{_describe(row, i)}: its outcome must be {wanted}")
    for j, earlier in enumerate(rows[:i]):
        if (earlier.trigger, earlier.source) == (row.trigger, row.source) and set(
            earlier.guards
        ) <= set(row.guards):
            raise ConfigError(
                f"{_describe(row, i)} can never fire: {_describe(earlier, j)} comes first "
                "and needs no more than it"
            )


def _check_resume_row(row: Row, i: int) -> None:
    """A resume row leaves a stop for the loop, and names the one stop it leaves."""
    if row.source not in TERMINAL_STATES or row.dest in TERMINAL_STATES:
        raise ConfigError(f"{_describe(row, i)}: a resume row goes from DONE/ERROR into the loop")
    stops = [g for g in row.guards if g in STOP_GUARDS]
    if len(stops) != 1:
        raise ConfigError(
            f"{_describe(row, i)} must name exactly one of {sorted(STOP_GUARDS)}, which say "
            "which stop it resumes"
        )


def _check_ways_out(rows: tuple[Row, ...]) -> None:
    """Every loop state has rows, the last of them unguarded (a step always moves)."""
    for state, trigger in TRIGGER_FOR_STATE.items():
        group = [r for r in rows if r.source == state]
        if not group:
            raise ConfigError(f"state {state} has no way out: add rows for trigger {trigger}")
        if group[-1].guards:
            raise ConfigError(
                f"state {state} has no unguarded last row: when no guard passes, "
                "the run would be stuck"
            )


def _check_cycles_count_turns(loop_rows: tuple[Row, ...]) -> None:
    """Within an activation, every cycle makes a model call (resume rows are taken only when
    a person answers, once each)."""
    uncounted: dict[AgentState, set[AgentState]] = {}
    for row in loop_rows:
        if row.dest != TURN_STATE:
            uncounted.setdefault(row.source, set()).add(row.dest)
    cycle = _find_cycle(uncounted)
    if cycle:
        raise ConfigError(
            f"cycle {' -> '.join(cycle)} makes no model call, so no turn budget bounds it"
        )


def _check_turns_are_gated(rows: tuple[Row, ...]) -> None:
    """No model call can start, after the previous one or after a resume (when every turn may
    be used already), without passing the turn-budget guard."""
    free = _ungated_count_free_edges(rows)
    starts = {TURN_STATE} | {row.dest for row in rows if row.resumes}
    for i, row in enumerate(rows):
        if _retries(row):
            if not _is_gated(rows, i, RETRY_BUDGET_GUARD):
                raise ConfigError(
                    f"{_describe(row, i)} retries a model call without an earlier row of its "
                    f"group stopping the run on '{RETRY_BUDGET_GUARD}', so "
                    "model_retries_per_run does not bound the run"
                )
            continue
        if row.dest != TURN_STATE or _is_gated(rows, i):
            continue
        if row.resumes or any(_reaches(free, start, {row.source}) for start in starts):
            raise ConfigError(
                f"{_describe(row, i)} can start another model call without passing the "
                f"'{TURN_BUDGET_GUARD}' guard after the previous one, so max_turns does "
                "not bound the run"
            )


def _check_last_answer_rows(rows: tuple[Row, ...]) -> None:
    """Rule 5: a last answer softens a stop, ends the run, and ends it with that stop."""
    exits: set[StopReason] = set()
    for i, row in enumerate(rows):
        if row.source != LAST_CALL_STATE:
            continue
        if row.dest not in TERMINAL_STATES:
            raise ConfigError(
                f"{_describe(row, i)} does not end the run: a last answer is the run's last "
                "model call"
            )
        closing = [g for g in row.guards if g in CLOSING_GUARDS]
        if row.guards and (len(closing) != 1 or CLOSING_GUARDS[closing[0]] != row.outcome):
            raise ConfigError(
                f"{_describe(row, i)} must name the one guard of {sorted(CLOSING_GUARDS)} "
                "that says its stop reason"
            )
        exits.add(StopReason(row.outcome))
    for i, row in enumerate(rows):
        if row.dest != LAST_CALL_STATE:
            continue
        stop = softened_stop(rows, i)
        if LAST_ANSWER_GUARD not in row.guards or stop is None:
            raise ConfigError(
                f"{_describe(row, i)} must stand right before the stop row it softens, with "
                f"that row's guards and '{LAST_ANSWER_GUARD}'"
            )
        if stop not in exits:
            raise ConfigError(
                f"{_describe(row, i)} softens the stop {stop.value}, but no row out of "
                f"{LAST_CALL_STATE} ends the run with it"
            )
    for i, row in enumerate(rows):
        if (
            row.source not in (LAST_CALL_STATE, *TERMINAL_STATES)
            and row.stop_reason in exits
            and not (i and rows[i - 1].dest == LAST_CALL_STATE and softened_stop(rows, i - 1))
        ):
            raise ConfigError(
                f"{_describe(row, i)} ends the run with {row.label}, which gets a last "
                f"answer everywhere else: put its row into {LAST_CALL_STATE} right before it"
            )


def _ungated_count_free_edges(rows: tuple[Row, ...]) -> dict[AgentState, set[AgentState]]:
    """Edges of rows that neither count a turn nor are gated by the turn budget."""
    graph: dict[AgentState, set[AgentState]] = {}
    for i, row in enumerate(rows):
        if row.dest != TURN_STATE and not row.resumes and not _is_gated(rows, i):
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
    """Most transitions on a count-free path within one activation from ``start`` ending with
    a row where ``goal`` holds (that row included when it is not a counting row); -1 when
    there is none."""
    loop_rows = [r for r in rows if not r.resumes]
    count_free = [r for r in loop_rows if r.dest != TURN_STATE]

    @cache
    def longest(state: AgentState) -> int:
        best = (
            0
            if any(goal(r) and r.dest == TURN_STATE for r in loop_rows if r.source == state)
            else -1
        )
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


def _counting(row: Row) -> bool:
    return row.dest == TURN_STATE


def _terminal(row: Row) -> bool:
    return row.dest in TERMINAL_STATES


def _activation_constant(rows: tuple[Row, ...], entry: AgentState, b: int, c: int) -> int:
    """The transitions an activation entered at ``entry`` takes beyond ``(1 + b)`` per model
    call: ``a + c - b`` when it makes a call, ``z`` when it makes none."""
    a = _longest_path(rows, entry, _counting)
    z = _longest_path(rows, entry, _terminal)
    return max(a + c - b if a >= 0 else 0, z)


def termination_bound(rows: tuple[Row, ...], limits: Limits) -> TerminationBound:
    """Bounds that hold for every run of a verified table under ``limits``.

    With ``M`` turns and retries for the whole run (``max_turns``, plus ``model_retries_per_run``
    when the table has a retry row; resumes continue both counts), an
    activation entered at ``e`` that makes ``m`` calls takes at most
    ``a_e + m·(1 + b) - b + c`` transitions (``z_e`` when ``m = 0``). The first activation
    gives ``transitions``; each resume adds its own row and its entry's constant:
    ``per_resume``.
    """
    if not limits.last_answer:  # the rows into LAST_ANSWER never fire
        rows = tuple(row for row in rows if LAST_ANSWER_GUARD not in row.guards)
    last_answers = int(any(row.dest == LAST_CALL_STATE for row in rows))
    b = max(_longest_path(rows, TURN_STATE, _counting), 0)
    c = _longest_path(rows, TURN_STATE, _terminal)
    first = _activation_constant(rows, INITIAL_STATE, b, c)
    per_resume = max(
        (1 + _activation_constant(rows, row.dest, b, c) for row in rows if row.resumes),
        default=0,
    )
    retries = any(_retries(row) for row in rows)
    m = limits.max_turns + (limits.model_retries_per_run if retries else 0)
    calls = "(max_turns + model_retries_per_run)" if retries else "max_turns"
    return TerminationBound(
        model_calls=m + last_answers,
        transitions=m * (1 + b) + first,
        per_resume=per_resume,
        formula=f"{1 + b}·{calls} + {first}",
        last_answers=last_answers,
    )
