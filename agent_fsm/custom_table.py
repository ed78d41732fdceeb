"""A loop of the user's own: ``CustomState`` (a state with work of its own) and ``Table``
(the default loop's rows edited, with the states and guards they add), given to
``Agent(table=...)``.

The table stays plain data (``table.py`` holds its vocabulary and the default rows): the
agent's machine verifies the whole at construction (``loop.verify``), and a table that could
run forever is refused, with the offending row or cycle named.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agent_fsm.errors import ConfigError
from agent_fsm.table import TABLE, AgentState, Row, Trigger, crash_rows, state_named, trigger_named

__all__ = ["CustomState", "StateWork", "Table"]


StateWork = Callable[[Any], Awaitable[None] | None]
"""The work of a ``CustomState``: called with the run's ``agent_fsm.StepContext`` (typed
``Any`` here: the table is plain data, below the engine that defines it)."""


@dataclass(frozen=True, slots=True)
class CustomState:
    """A state a user adds to the loop: its name, the trigger fired when its work is done,
    and that work.

    The work runs between triggers like that of the default states: it may read the run,
    keep data of its own in ``RunState.notes``, add a user message to the transcript, and,
    in a state that ``counts_turn``, make one model call aside from the transcript
    (``StepContext.ask``). The rows out of the state decide, through guards, where the run
    goes next.
    """

    name: str
    trigger: str
    """Fired when the work is done: every row out of this state has it."""
    work: StateWork
    counts_turn: bool = False
    """Entering the state takes one turn, as entering THINK does: its work may make one model
    call. The verifier then holds rows into it to the turn budget, like rows into THINK."""

    def __post_init__(self) -> None:
        for what, name in (("state", self.name), ("trigger", self.trigger)):
            if not isinstance(name, str) or not name.strip():
                raise ConfigError(f"a custom state's {what} needs a name, got {name!r}")
        if isinstance(state_named(self.name), AgentState):
            raise ConfigError(f"{self.name} is a state of the default loop already")
        if isinstance(trigger_named(self.trigger), Trigger):
            raise ConfigError(f"{self.trigger} is a trigger of the default loop already")
        if not callable(self.work):
            raise ConfigError(f"the work of state {self.name} must be callable")


@dataclass(frozen=True, slots=True)
class Table:
    """A loop of the user's own: rows in priority order, the states they add, and the guards
    they name beyond the built-in ones (``Agent(table=...)``).

    Built from the default loop and edited with ``with_states``, ``with_guards``,
    ``insert`` and ``replace``; each returns a new table. The agent's machine verifies the
    whole at construction (``loop.verify``): a table that could run forever is refused, with
    the offending row or cycle named.
    """

    rows: tuple[Row, ...] = ()
    states: tuple[CustomState, ...] = ()
    guards: Mapping[str, Callable[..., bool]] = field(default_factory=dict)
    """Guards by name: pure functions of ``(RunState, Limits)`` returning a bool."""

    @classmethod
    def default(cls) -> Table:
        """The default loop, to build on."""
        return cls(rows=TABLE)

    def with_states(self, *states: CustomState) -> Table:
        """This table with ``states`` added, each with its crash row (``crash_rows``): a run
        whose process died in one of them does its work again when reopened. Remove a crash
        row (``replace((name, "restart"))``) to refuse that instead."""
        return Table(
            (*self.rows, *crash_rows(*(state.name for state in states))),
            (*self.states, *states),
            self.guards,
        )

    def with_guards(self, **guards: Callable[..., bool]) -> Table:
        """This table with the named ``guards`` added (a later one replaces an earlier one of
        the same name; the built-in guards cannot be replaced)."""
        return Table(self.rows, self.states, {**self.guards, **guards})

    def insert(self, rows: Iterable[Row], *, before: tuple[str, str]) -> Table:
        """This table with ``rows`` put right before the row ``before`` names, as
        ``(source state, label)``: they take priority over it and the rows after it."""
        at = self.row_index(*before)
        return Table((*self.rows[:at], *rows, *self.rows[at:]), self.states, self.guards)

    def replace(self, row: tuple[str, str], *rows: Row) -> Table:
        """This table with the row ``row`` names, as ``(source state, label)``, replaced by
        ``rows`` (none: the row is removed)."""
        at = self.row_index(*row)
        return Table((*self.rows[:at], *rows, *self.rows[at + 1 :]), self.states, self.guards)

    def row_index(self, source: str, label: str) -> int:
        """The position of the one row from ``source`` with ``label``.

        Raises:
            ConfigError: no row, or more than one, matches (the labels there are named).
        """
        found = [i for i, row in enumerate(self.rows) if (row.source, row.label) == (source, label)]
        if len(found) != 1:
            labels = sorted({row.label for row in self.rows if row.source == source})
            raise ConfigError(
                f"{len(found)} rows from {source} are labelled {label!r}, so ({source!r}, "
                f"{label!r}) names no one row; the labels of rows from {source}: {labels}"
            )
        return found[0]
