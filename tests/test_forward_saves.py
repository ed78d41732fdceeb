"""A stop saved again by a DBOS replay never takes the run back (``dbos.pausing.save_forward``,
``checkpoint.ForwardSaves``): on PostgreSQL the comparison and the save are one transaction,
so a later point committed while the stale save runs is never overwritten.

The interleaving is made, not hoped for: a second store writes the later point and holds its
transaction open until the stale save is seen waiting on the run's row lock
(``pg_stat_activity``), then commits. A save that looked before it locked (the two-statement
version) has by then read the earlier point, and overwrites the later one.
"""

from __future__ import annotations

import copy
import threading
import time
from typing import Any

import pytest

pytest.importorskip("psycopg")
pytest.importorskip("dbos")

import psycopg

from agent_fsm.dbos.pausing import save_forward
from agent_fsm.durable.postgres import PostgresStore
from agent_fsm.state import RunState
from agent_fsm.testing import sample_state
from agent_fsm.testing.store_kit import add_turn

pytestmark = pytest.mark.slow  # a real server

WAIT_S = 60.0
"""An upper bound only: how long the test waits for the stale save to block."""


def stop_and_its_resume() -> tuple[RunState, RunState]:
    """A run's stop, and the same run resumed once and further along."""
    early = sample_state("forward-1")
    early.resumed_at = []
    later = copy.deepcopy(early)
    later.resumed_at = [len(later.trace)]
    add_turn(later, 1)
    return early, later


def wait_for_a_lock_waiter(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            waiting = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND datname = current_database()"
            ).fetchone()
            if waiting is not None and waiting[0] > 0:
                return
            time.sleep(0.01)
    raise AssertionError("the stale save never waited for the run's row")


def test_a_stale_stop_saved_while_a_later_point_commits_leaves_the_later_point(
    postgres_url: str, postgres_schema: str
) -> None:
    early, later = stop_and_its_resume()
    with (
        PostgresStore(postgres_url, schema=postgres_schema) as replayed,
        PostgresStore(postgres_url, schema=postgres_schema) as resumed,
    ):
        replayed.save(early)
        in_write, go_on = threading.Event(), threading.Event()
        write = resumed._write

        def write_and_hold(conn: Any, state: RunState, lease: Any) -> Any:
            written = write(conn, state, lease)
            in_write.set()  # the later point is written, its row locked, not committed
            assert go_on.wait(WAIT_S)
            return written

        resumed._write = write_and_hold  # type: ignore[method-assign]
        outcome: dict[str, Any] = {}

        def save_later() -> None:
            resumed.save(later)

        def save_stale() -> None:
            try:
                outcome["saved"] = save_forward(replayed, early)
            except Exception as exc:  # the test's thread must not swallow it
                outcome["error"] = exc

        first = threading.Thread(target=save_later)
        first.start()
        assert in_write.wait(WAIT_S)
        second = threading.Thread(target=save_stale)
        second.start()
        wait_for_a_lock_waiter(postgres_url)
        go_on.set()
        first.join(WAIT_S)
        second.join(WAIT_S)

    assert "error" not in outcome, outcome
    assert outcome["saved"] is False
    with PostgresStore(postgres_url, schema=postgres_schema) as reader:
        stored = reader.load("forward-1")
    assert (stored.resumed_at, len(stored.trace)) == (later.resumed_at, len(later.trace))


def test_a_stop_that_is_not_behind_is_saved(postgres_url: str, postgres_schema: str) -> None:
    early, later = stop_and_its_resume()
    with PostgresStore(postgres_url, schema=postgres_schema) as store:
        assert save_forward(store, early) is True  # a new run
        assert save_forward(store, early) is True  # the same point again
        assert save_forward(store, later) is True
        assert save_forward(store, early) is False
        assert len(store.load("forward-1").trace) == len(later.trace)
