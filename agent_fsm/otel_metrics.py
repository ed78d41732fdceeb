"""OpenTelemetry metrics of a fleet: the runs of a store counted as ``agent-fsm runs`` shows
them, as observable gauges (``agent_fsm.otel`` re-exports ``FleetMetrics``).

Opt-in and free when unused: nothing is counted until an application makes a
``FleetMetrics`` and its metric reader collects; then one ``list_runs`` per collection
counts every gauge (each gauge's callback reads the same listing: the first callback of a
collection lists, the others read what it counted). A listing reads the summary of every
stored run, so collect a store of many runs at a relaxed interval (a minute, say), and give
``FleetMetrics`` a store object of its own: a store's calls are serialised on its one
connection, and a worker's saves should not wait for a listing.

The gauges (unit ``{run}``):

- ``agent_fsm.runs``: the runs by the state of their last save, attribute
  ``agent_fsm.state`` (``DONE``, ``ERROR``, ``THINK``, ... or a custom state's name);
- ``agent_fsm.runs.leased``: the runs a worker holds a live lease on (being driven);
- ``agent_fsm.runs.waiting``: the runs a worker would take (``durable.queue``: not
  stopped, no live lease): queued, or left by a worker that died or gave up;
- ``agent_fsm.runs.stuck``: of those, the runs left mid-run (``RunSummary.stuck``);
- ``agent_fsm.runs.cancelling``: the runs cancelled whose driver has not stopped them yet.

Only ``opentelemetry-api`` is imported (``pip install -e '.[otel]'``): which SDK,
reader and exporter receive the measurements is the application's choice, through the
global meter provider or the one passed in.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterable

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, MeterProvider, Observation

from agent_fsm.durable.checkpoint import RunLister
from agent_fsm.errors import CheckpointError
from agent_fsm.logs import get_logger
from agent_fsm.table import TERMINAL_STATES
from agent_fsm.version import __version__

__all__ = ["FleetMetrics"]

_COUNTS = ("leased", "waiting", "stuck", "cancelling")
"""The gauges besides ``agent_fsm.runs``: ``agent_fsm.runs.<name>``."""


class FleetMetrics:
    """Observable gauges of the runs of ``store`` (see the module for their names).

    Args:
        store: the store the fleet shares (any ``RunLister``: ``PostgresStore``, ...).
        meter_provider: where the gauges are registered; the global provider
            (``opentelemetry.metrics.set_meter_provider``) when None.

    A store that cannot be listed at a collection (the database is down) yields no
    measurement for it and logs ``fleet_metrics_unavailable``: a gap in the series, never an
    error in the application's metric pipeline.
    """

    def __init__(self, store: RunLister, *, meter_provider: MeterProvider | None = None) -> None:
        self._store = store
        self._lock = threading.Lock()
        self._by_state: Counter[str] = Counter()
        self._counts: Counter[str] = Counter()
        self._read: set[str] = set()
        """The gauges that read the current listing: one that reads again lists again."""
        self._listed: bool | None = None
        """Whether the current listing succeeded; None before the first."""
        meter = metrics.get_meter("agent_fsm", __version__, meter_provider=meter_provider)
        meter.create_observable_gauge(
            "agent_fsm.runs",
            callbacks=[self._observe_states],
            unit="{run}",
            description="Stored runs, by the state of their last save",
        )
        descriptions = {
            "leased": "Runs a worker holds a live lease on",
            "waiting": "Runs a worker would take: not stopped, no live lease",
            "stuck": "Runs left mid-run by a worker that died or gave up",
            "cancelling": "Runs cancelled that their driver has not stopped yet",
        }
        for name in _COUNTS:
            meter.create_observable_gauge(
                f"agent_fsm.runs.{name}",
                callbacks=[self._observer(name)],
                unit="{run}",
                description=descriptions[name],
            )

    def _observer(self, name: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observe(options: CallbackOptions) -> Iterable[Observation]:
            if not self._fresh(name):
                return []
            return [Observation(self._counts[name])]

        return observe

    def _observe_states(self, options: CallbackOptions) -> Iterable[Observation]:
        if not self._fresh("runs"):
            return []
        return [
            Observation(count, {"agent_fsm.state": state})
            for state, count in sorted(self._by_state.items())
        ]

    def _fresh(self, gauge: str) -> bool:
        """Make sure the counts are this collection's: list the runs again when ``gauge``
        already read the current listing (a new collection has begun). False when the
        store could not be listed (once per collection: the other gauges do not try)."""
        with self._lock:
            if gauge in self._read or self._listed is None:
                self._read.clear()
                self._listed = self._list()
            self._read.add(gauge)
            return self._listed

    def _list(self) -> bool:
        try:
            runs = self._store.list_runs()
        except CheckpointError as exc:
            get_logger("agent_fsm").warning("fleet_metrics_unavailable", error=str(exc))
            return False
        by_state: Counter[str] = Counter()
        counts: Counter[str] = Counter()
        for run in runs:
            by_state[str(run.state)] += 1
            counts["leased"] += run.lease_live
            waiting = run.state not in TERMINAL_STATES and not run.lease_live
            counts["waiting"] += waiting and not run.unreadable
            counts["stuck"] += run.stuck
            counts["cancelling"] += run.cancel_requested is not None
        self._by_state, self._counts = by_state, counts
        return True
