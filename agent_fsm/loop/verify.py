"""Verification of a transition table, from its rows alone, and the termination bound.

Pure graph checks on ``table.py``'s data (no state-machine library involved), so the same
proof applies whatever executes the table. ``verify_table`` proves that every run terminates:

1. every guard name exists, and every (trigger, source) group ends with an unguarded "else"
   row, so a step always moves; no row is shadowed by an earlier, weaker row;
2. every non-terminal state can reach DONE or ERROR;
3. every cycle passes through a *turn-counting* row (a row into THINK, or into a custom state
   that ``counts_turn``: each makes one model call), i.e. the graph without those rows is
   acyclic;
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

6. a guardrail row stands before what it guards (``_check_guardrail_rows``): the input
   guardrail's in OBSERVE, after nothing but stops; the output guardrail's in THINK, before
   any row into DONE.

A user's table (``custom_table.Table``) adds states of its own (``CustomState``), each left
by its own trigger, and guards of its own; every rule above holds for it unchanged, with the
counting states in place of THINK, and a refusal names the offending row and, for rules 3
and 4, the cycle.

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

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache

from agent_fsm.custom_table import CustomState
from agent_fsm.errors import ConfigError
from agent_fsm.limits import Limits
from agent_fsm.loop.guards import GUARDS, Guard
from agent_fsm.table import (
    CLOSING_GUARDS,
    CRASH_GUARD,
    INITIAL_STATE,
    INPUT_GUARDRAIL_GUARD,
    LAST_ANSWER_DUE_GUARD,
    LAST_ANSWER_GUARD,
    LAST_ANSWER_WINDOW_GUARD,
    LAST_CALL_STATE,
    OUTPUT_GUARDRAIL_GUARD,
    OUTPUT_GUARDRAIL_STATES,
    RESUME_TRIGGER,
    RETRY_BUDGET_GUARD,
    STOP_GUARDS,
    TERMINAL_STATES,
    TRIGGER_FOR_STATE,
    TURN_BUDGET_GUARD,
    TURN_STATES,
    AgentState,
    Row,
    StopReason,
    Verb,
    softened_stop,
)

__all__ = ["TerminationBound", "counting_states", "termination_bound", "verify_table"]

State = AgentState | str
COUNTING: frozenset[AgentState | str] = frozenset(TURN_STATES)
"""The states whose entry makes a model call, in the default loop."""


def counting_states(states: Sequence[CustomState] = ()) -> frozenset[State]:
    """The states entering which takes a turn: THINK and SUMMARISE, and each custom state
    that ``counts_turn``."""
    return COUNTING | {state.name for state in states if state.counts_turn}


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
    nested: tuple[tuple[str, TerminationBound], ...] = field(default=(), repr=False)
    """The bound of each sub-agent tool's agent (``Agent.as_tool``), by tool name, itself
    nested. Its model calls are carved from this run's and counted in them, so
    ``model_calls`` bounds the whole tree."""
    tree_transitions: int = field(default=0, repr=False)
    """Transitions of this run and of every sub-agent run it makes, when it is never
    resumed: each sub-agent call uses at least one of its turns, so it makes at most
    ``max_turns`` of them, each within its agent's ``tree_transitions``. Equal to
    ``transitions`` for an agent without sub-agents."""

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


def _is_gated(rows: Sequence[Row], index: int, budget: str = TURN_BUDGET_GUARD) -> bool:
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


def _retries(row: Row, counting: Collection[State] = COUNTING) -> bool:
    """A row that makes a model call counted as a retry of the last one, not a turn."""
    return row.dest in counting and row.outcome is Verb.RETRY


def _find_cycle(edges: Mapping[State, set[State]]) -> list[State] | None:
    """A cycle in the graph, as a list of states, or None when it is acyclic."""
    visiting: list[State] = []
    done: set[State] = set()

    def visit(state: State) -> list[State] | None:
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


def verify_table(
    rows: tuple[Row, ...],
    guards: Mapping[str, Guard] = GUARDS,
    states: Sequence[CustomState] = (),
) -> None:
    """Check the rules in the module docstring; raise ConfigError naming the offender.

    ``states`` are the states a user added (``custom_table.CustomState``): each is left by its own
    trigger, and one that ``counts_turn`` is held to the turn budget as THINK is.
    """
    if not rows:
        raise ConfigError("the machine table has no rows")
    triggers = _triggers(states)
    counting = counting_states(states)
    for i in range(len(rows)):
        _check_row(rows, i, guards, triggers)
    _check_ways_out(rows, triggers)
    _check_last_answer_rows(rows)
    loop_rows = tuple(row for row in rows if not row.resumes)
    edges: dict[State, set[State]] = {}
    for row in loop_rows:
        edges.setdefault(row.source, set()).add(row.dest)
    for state in triggers:
        if not _reaches(edges, state, TERMINAL_STATES):
            raise ConfigError(f"state {state} can never reach DONE or ERROR")
    _check_cycles_count_turns(loop_rows, counting)
    _check_turns_are_gated(rows, counting)
    _check_guardrail_rows(rows)


def _triggers(states: Sequence[CustomState]) -> dict[State, str]:
    """The trigger that leaves each loop state: the default loop's and the custom states'."""
    triggers: dict[State, str] = {
        state: str(trigger) for state, trigger in TRIGGER_FOR_STATE.items()
    }
    for state in states:
        if state.name in triggers or state.trigger in triggers.values():
            raise ConfigError(
                f"custom state {state.name}: a state or trigger of that name exists already"
            )
        triggers[state.name] = state.trigger
    return triggers


def _check_row(
    rows: tuple[Row, ...], i: int, guards: Mapping[str, Guard], triggers: Mapping[State, str]
) -> None:
    """One row: known guards, the right trigger for its source, an outcome of the kind its
    destination calls for, and not shadowed by an earlier row of its group."""
    row = rows[i]
    unknown = [g for g in row.guards if g not in guards]
    if unknown:
        raise ConfigError(f"{_describe(row, i)} names unknown guard(s) {unknown}")
    for state in (row.source, row.dest):
        if state not in triggers and state not in TERMINAL_STATES:
            raise ConfigError(
                f"{_describe(row, i)} names state {state}, which is neither a state of the "
                "default loop nor one of the table's custom states"
            )
    if row.resumes:
        _check_resume_row(row, i)
    elif row.source in TERMINAL_STATES:
        raise ConfigError(
            f"{_describe(row, i)} leaves terminal state {row.source}: only a "
            f"{RESUME_TRIGGER} row may"
        )
    elif triggers.get(row.source) != row.trigger:
        raise ConfigError(
            f"{_describe(row, i)}: state {row.source} is left only by trigger "
            f"{triggers.get(row.source)}"
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
    """A resume row leaves a stop for the loop, or restarts the step a crashed run was in
    (``CRASH_GUARD``: from a loop state to itself), and names the one stop it leaves."""
    if row.restarts:
        if row.source in TERMINAL_STATES or row.dest != row.source:
            raise ConfigError(
                f"{_describe(row, i)}: a row guarded by '{CRASH_GUARD}' restarts the step a "
                "crashed run was in: it goes from a loop state to that same state"
            )
    elif row.source not in TERMINAL_STATES or row.dest in TERMINAL_STATES:
        raise ConfigError(f"{_describe(row, i)}: a resume row goes from DONE/ERROR into the loop")
    stops = [g for g in row.guards if g in STOP_GUARDS]
    if len(stops) != 1:
        raise ConfigError(
            f"{_describe(row, i)} must name exactly one of {sorted(STOP_GUARDS)}, which say "
            "which stop it resumes"
        )


def _check_ways_out(rows: tuple[Row, ...], triggers: Mapping[State, str]) -> None:
    """Every loop state has rows, the last of them unguarded (a step always moves)."""
    for state, trigger in triggers.items():
        group = [r for r in rows if r.source == state and not r.resumes]
        if not group:
            raise ConfigError(f"state {state} has no way out: add rows for trigger {trigger}")
        if group[-1].guards:
            raise ConfigError(
                f"state {state} has no unguarded last row: when no guard passes, "
                "the run would be stuck"
            )


def _check_cycles_count_turns(loop_rows: tuple[Row, ...], counting: Collection[State]) -> None:
    """Within an activation, every cycle makes a model call (resume rows are taken only when
    a person answers, once each)."""
    uncounted: dict[State, set[State]] = {}
    for row in loop_rows:
        if row.dest not in counting:
            uncounted.setdefault(row.source, set()).add(row.dest)
    cycle = _find_cycle(uncounted)
    if cycle:
        raise ConfigError(
            f"cycle {' -> '.join(cycle)} makes no model call, so no turn budget bounds it"
        )


def _check_turns_are_gated(rows: tuple[Row, ...], counting: Collection[State]) -> None:
    """No model call can start, after the previous one or after a resume (when every turn may
    be used already), without passing the turn-budget guard. A row that could is named, with
    the way round the loop it opens."""
    free = _ungated_count_free_edges(rows, counting)
    # A restarted step continues the activation it crashed in, from the checkpoint taken as
    # its row was passed: that row's gate still holds, so it is no new start.
    resumed_into = sorted({row.dest for row in rows if row.resumes and not row.restarts})
    for i, row in enumerate(rows):
        if row.restarts:  # the step it restarts was entered through a gated row, and its
            continue  # count was never saved: the redone call is that same call
        if _retries(row, counting):
            if not _is_gated(rows, i, RETRY_BUDGET_GUARD):
                raise ConfigError(
                    f"{_describe(row, i)} retries a model call without an earlier row of its "
                    f"group stopping the run on '{RETRY_BUDGET_GUARD}', so "
                    "model_retries_per_run does not bound the run"
                )
            continue
        if row.dest not in counting or _is_gated(rows, i):
            continue
        way = _path_from(free, sorted(counting), row.source)
        if way is not None:
            where = f"cycle {' -> '.join([*way, row.dest])}"
        else:
            way = [row.source] if row.resumes else _path_from(free, resumed_into, row.source)
            where = f"after a resume, {' -> '.join([*way, row.dest])}" if way else ""
        if where:
            raise ConfigError(
                f"{_describe(row, i)} can start another model call without passing the "
                f"'{TURN_BUDGET_GUARD}' guard after the previous one ({where} skips the turn "
                "gate), so max_turns does not bound the run"
            )


def _check_last_answer_rows(rows: tuple[Row, ...]) -> None:
    """Rule 5: a last answer softens a stop, ends the run, and ends it with that stop."""
    exits = _last_answer_exits(rows)
    for i, row in enumerate(rows):
        if row.resumes:
            continue
        if LAST_ANSWER_DUE_GUARD in row.guards:
            if (
                row.source is not AgentState.COMPACT
                or row.dest != LAST_CALL_STATE
                or LAST_ANSWER_GUARD not in row.guards
            ):
                raise ConfigError(
                    f"{_describe(row, i)}: '{LAST_ANSWER_DUE_GUARD}' goes on to "
                    f"{LAST_CALL_STATE} from COMPACT, with '{LAST_ANSWER_GUARD}'"
                )
        elif row.dest == LAST_CALL_STATE or LAST_ANSWER_GUARD in row.guards:
            _check_softening_row(rows, i, exits)
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


def _check_guardrail_rows(rows: tuple[Row, ...]) -> None:
    """Rule 6: a guardrail row stands where its check runs, before anything it guards. The
    input guardrail's row leaves OBSERVE, after nothing but rows that end the run (no way on
    skips it: no model call, no tool, runs before the input passed); the output guardrail's
    row leaves THINK before any row into DONE (no answer ends the run unchecked). Both end
    the run."""
    for i, row in enumerate(rows):
        if row.resumes:
            continue
        for guard, states, before in (
            (INPUT_GUARDRAIL_GUARD, frozenset({INITIAL_STATE}), "every row that goes on"),
            (OUTPUT_GUARDRAIL_GUARD, OUTPUT_GUARDRAIL_STATES, "every row into DONE"),
        ):
            if guard not in row.guards:
                continue
            if row.source not in states or row.dest not in TERMINAL_STATES:
                where = " or ".join(sorted(str(state) for state in states))
                raise ConfigError(
                    f"{_describe(row, i)}: the row guarded by '{guard}' stops the run from "
                    f"{where}, where its guardrails run, before {before}"
                )
            for j, earlier in enumerate(rows[:i]):
                if (earlier.trigger, earlier.source) != (row.trigger, row.source):
                    continue
                skips = (
                    earlier.dest not in TERMINAL_STATES
                    if guard == INPUT_GUARDRAIL_GUARD
                    else earlier.dest is AgentState.DONE
                )
                if skips:
                    raise ConfigError(
                        f"{_describe(row, i)} comes after {_describe(earlier, j)}, which "
                        f"would let the run past its guardrails: put it before {before}"
                    )


def _last_answer_exits(rows: tuple[Row, ...]) -> set[StopReason]:
    """The stops a last answer may end the run with; refuses a row out of the last answer
    that does not end the run, or does not name the closing guard of its stop."""
    exits: set[StopReason] = set()
    for i, row in enumerate(rows):
        if row.source != LAST_CALL_STATE or row.resumes:
            continue
        if row.dest not in TERMINAL_STATES:
            raise ConfigError(
                f"{_describe(row, i)} does not end the run: a last answer is the run's last "
                "model call"
            )
        if row.guards == (OUTPUT_GUARDRAIL_GUARD,):  # the last answer did not pass
            continue
        closing = [g for g in row.guards if g in CLOSING_GUARDS]
        if row.guards and (len(closing) != 1 or CLOSING_GUARDS[closing[0]] != row.outcome):
            raise ConfigError(
                f"{_describe(row, i)} must name the one guard of {sorted(CLOSING_GUARDS)} "
                "that says its stop reason"
            )
        exits.add(StopReason(row.outcome))
    return exits


def _check_softening_row(rows: tuple[Row, ...], i: int, exits: set[StopReason]) -> None:
    """A row into the last answer (or into COMPACT to shrink its prompt first) stands right
    before the stop it softens, and that stop is one the last answer can end with."""
    row = rows[i]
    stop = softened_stop(rows, i)
    if row.dest not in (LAST_CALL_STATE, AgentState.COMPACT):
        raise ConfigError(
            f"{_describe(row, i)}: a row guarded by '{LAST_ANSWER_GUARD}' goes into "
            f"{LAST_CALL_STATE}, or into COMPACT to shrink the last answer's prompt"
        )
    if LAST_ANSWER_GUARD not in row.guards or stop is None:
        raise ConfigError(
            f"{_describe(row, i)} must stand right before the stop row it softens, with "
            f"that row's guards and '{LAST_ANSWER_GUARD}' (and, into COMPACT, right before "
            f"that row into {LAST_CALL_STATE}, with '{LAST_ANSWER_WINDOW_GUARD}' too)"
        )
    if stop not in exits:
        raise ConfigError(
            f"{_describe(row, i)} softens the stop {stop.value}, but no row out of "
            f"{LAST_CALL_STATE} ends the run with it"
        )


def _ungated_count_free_edges(
    rows: tuple[Row, ...], counting: Collection[State]
) -> dict[State, set[State]]:
    """Edges of rows that neither count a turn nor are gated by the turn budget."""
    graph: dict[State, set[State]] = {}
    for i, row in enumerate(rows):
        if row.dest not in counting and not row.resumes and not _is_gated(rows, i):
            graph.setdefault(row.source, set()).add(row.dest)
    return graph


def _path_from(
    edges: Mapping[State, Iterable[State]], starts: Iterable[State], goal: State
) -> list[State] | None:
    """The shortest way from one of ``starts`` to ``goal`` along ``edges``, or None."""
    came_from: dict[State, State | None] = dict.fromkeys(starts)
    queue = list(came_from)
    for state in queue:  # grows as it goes: a breadth-first search
        if state == goal:
            path: list[State] = []
            step: State | None = state
            while step is not None:
                path.append(step)
                step = came_from[step]
            return path[::-1]
        for nxt in sorted(edges.get(state, ())):
            if nxt not in came_from:
                came_from[nxt] = state
                queue.append(nxt)
    return None


def _reaches(
    edges: Mapping[State, Iterable[State]],
    start: State,
    goals: Iterable[State],
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


def _longest_path(
    rows: tuple[Row, ...],
    start: State,
    goal: Callable[[Row], bool],
    counting: Collection[State] = COUNTING,
) -> int:
    """Most transitions on a count-free path within one activation from ``start`` ending with
    a row where ``goal`` holds (that row included when it is not a counting row); -1 when
    there is none."""
    loop_rows = [r for r in rows if not r.resumes]
    count_free = [r for r in loop_rows if r.dest not in counting]

    @cache
    def longest(state: State) -> int:
        best = (
            0 if any(goal(r) and r.dest in counting for r in loop_rows if r.source == state) else -1
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


def _terminal(row: Row) -> bool:
    return row.dest in TERMINAL_STATES


def _activation_constant(
    rows: tuple[Row, ...], entry: State, b: int, c: int, counting: Collection[State]
) -> int:
    """The transitions an activation entered at ``entry`` takes beyond ``(1 + b)`` per model
    call: ``a + c - b`` when it makes a call, ``z`` when it makes none."""
    a = _longest_path(rows, entry, lambda row: row.dest in counting, counting)
    z = _longest_path(rows, entry, _terminal, counting)
    return max(a + c - b if a >= 0 else 0, z)


def termination_bound(
    rows: tuple[Row, ...], limits: Limits, counting: frozenset[State] = COUNTING
) -> TerminationBound:
    """Bounds that hold for every run of a verified table under ``limits``.

    With ``M`` turns and retries for the whole run (``max_turns``, plus ``model_retries_per_run``
    when the table has a retry row; resumes continue both counts), an
    activation entered at ``e`` that makes ``m`` calls takes at most
    ``a_e + m·(1 + b) - b + c`` transitions (``z_e`` when ``m = 0``). The first activation
    gives ``transitions``; each resume adds its own row and its entry's constant:
    ``per_resume``. ``counting`` are the states whose entry makes a model call
    (``counting_states``): ``b`` and ``c`` are the longest over all of them.
    """
    if not limits.last_answer:  # the rows into LAST_ANSWER never fire
        rows = tuple(row for row in rows if LAST_ANSWER_GUARD not in row.guards)
    last_answers = int(any(row.dest == LAST_CALL_STATE and not row.resumes for row in rows))

    def counts(row: Row) -> bool:
        return row.dest in counting

    b = max(max(_longest_path(rows, state, counts, counting) for state in counting), 0)
    c = max(_longest_path(rows, state, _terminal, counting) for state in counting)
    first = _activation_constant(rows, INITIAL_STATE, b, c, counting)
    per_resume = max(
        (1 + _activation_constant(rows, row.dest, b, c, counting) for row in rows if row.resumes),
        default=0,
    )
    retries = any(_retries(row, counting) for row in rows)
    m = limits.max_turns + (limits.model_retries_per_run if retries else 0)
    calls = "(max_turns + model_retries_per_run)" if retries else "max_turns"
    return TerminationBound(
        model_calls=m + last_answers,
        transitions=m * (1 + b) + first,
        per_resume=per_resume,
        formula=f"{1 + b}·{calls} + {first}",
        last_answers=last_answers,
        tree_transitions=m * (1 + b) + first,
    )
