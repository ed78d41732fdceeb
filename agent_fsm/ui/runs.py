"""The runs list: a store's ``list_runs``, each run read against the table that made it.

``RunRow`` is what one line of the page shows (the stop reason, found from the row the run
last took, and whether the run is paused for a person); ``run_rows`` lists and filters them.
Plain data and no I/O beyond the store's one ``list_runs`` call, so a page of 10,000 runs
costs one query and one pass (``benchmarks/ui_pages.py`` measures it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from agent_fsm.durable.checkpoint import RunLister, RunSummary
from agent_fsm.state import RunState
from agent_fsm.table import TERMINAL_STATES, AgentState, Row, StopReason

__all__ = ["PAUSES", "RunRow", "RunSource", "run_rows", "stop_of"]

PAUSES = frozenset({StopReason.ASK_USER, StopReason.APPROVAL_REQUIRED, StopReason.SUB_AGENT_PAUSED})
"""The stops that wait for a person: the run's own question or approvals, or a sub-agent's
(answered the same way, through the parent: ``ControlRequest.waits_for``)."""
"""The stops that wait for a person: the page makes them stand out."""

_STOPS = frozenset(reason.value for reason in StopReason)


@runtime_checkable
class RunSource(RunLister, Protocol):
    """What the ui reads runs from: a checkpoint store, or a trace file
    (``recorded.TraceRuns``)."""

    def load(self, run_id: str) -> RunState:
        """The run's last known state; ``CheckpointError`` for an unknown run."""
        ...

    def close(self) -> None:
        """Release what it holds."""
        ...


@dataclass(frozen=True, slots=True)
class RunRow:
    """One run as the list shows it."""

    run_id: str
    state: str
    stop: str
    """The stop reason of a stopped run; "" for one still going (or never stepped)."""
    turns: int
    tokens: int
    cost: float | None
    """What its model calls cost so far; None where unknown (no prices, or a checkpoint
    from before costs were recorded)."""
    duration_s: float
    """From the first save to the last."""
    updated_at: float
    lease_holder: str | None
    lease_live: bool
    paused: bool
    """Stopped on ask_user or approvals: waiting for a person."""
    stuck: bool
    unreadable: str | None
    tone: str
    """``ok``, ``error``, ``paused`` or ``running``: the row's colour."""


def stop_of(summary: RunSummary, rows: Sequence[Row]) -> StopReason | None:
    """The stop reason of a run that has stopped: the one it recorded, or (a checkpoint
    that predates recorded reasons) the label of the row it last took, when that row ends
    a run and the run is still where it left it; None otherwise."""
    if summary.stop_reason is not None:
        return summary.stop_reason
    index = summary.last_row
    if index is None or not 0 <= index < len(rows) or summary.state not in TERMINAL_STATES:
        return None
    return rows[index].stop_reason


def _row(summary: RunSummary, rows: Sequence[Row]) -> RunRow:
    stop = stop_of(summary, rows)
    paused = stop in PAUSES
    if summary.state in TERMINAL_STATES:
        tone = "paused" if paused else "error" if summary.state == AgentState.ERROR else "ok"
    else:
        tone = "running"
    return RunRow(
        run_id=summary.run_id,
        state=str(summary.state),
        stop=stop.value if stop is not None else "",
        turns=summary.turns,
        tokens=summary.total_tokens,
        cost=summary.cost,
        duration_s=max(summary.updated_at - summary.created_at, 0.0),
        updated_at=summary.updated_at,
        lease_holder=summary.lease_holder,
        lease_live=summary.lease_live,
        paused=paused,
        stuck=summary.stuck,
        unreadable=summary.unreadable,
        tone=tone,
    )


def run_rows(
    store: RunLister,
    rows: Sequence[Row],
    *,
    state: str | None = None,
    stop: str | None = None,
    limit: int = 200,
) -> tuple[list[RunRow], bool]:
    """The runs of ``store`` newest first, at most ``limit``, and whether more matched: in
    ``state`` only (a state's name, case as the table spells it) and with stop reason
    ``stop`` only ("running" for the runs that have not stopped), when given. ``rows`` is
    the table the runs were made with (the default one, or the ``--agent``'s).

    The store filters by state, by stop reason (``list_runs(stop_reasons=...)``, in SQL for
    the stores that keep it in a column) and limits. A stopped run whose checkpoint
    predates recorded stop reasons comes along with them (a None among the reasons), and
    its stop is read here from the table's row; such runs are rare, so the first batch
    almost always decides, and later batches grow until enough match."""
    states = [state] if state else None
    reasons: list[str | None] | None = None
    if stop:
        if stop != "running" and stop not in _STOPS:
            return [], False  # no run stops so: not a filter the page offers
        ends = _states_of(rows, stop)
        states = [s for s in ends if s == state] if state else ends
        if not states:
            return [], False
        if stop != "running":
            reasons = [stop, None]
    if reasons is None:  # the store does the limit: one more tells whether there are more
        found = [_row(summary, rows) for summary in store.list_runs(limit + 1, states=states)]
        return found[:limit], len(found) > limit
    batch = limit + 1
    while True:
        summaries = store.list_runs(batch, states=states, stop_reasons=reasons)
        found = [row for row in (_row(summary, rows) for summary in summaries) if row.stop == stop]
        if len(found) > limit or len(summaries) < batch:
            return found[:limit], len(found) > limit
        batch *= 4


def _states_of(rows: Sequence[Row], stop: str) -> list[str]:
    """The states a run with stop reason ``stop`` can be in ("running": every state that
    is not terminal)."""
    if stop == "running":
        every = dict.fromkeys(str(s) for row in rows for s in (row.source, row.dest))
        return [s for s in every if s not in TERMINAL_STATES]
    return list(dict.fromkeys(str(row.dest) for row in rows if row.label == stop))
