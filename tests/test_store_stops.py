"""A run's stop reason and cost in the stores' columns (issue 36): a file or schema laid out
before them is upgraded, the columns filled for the runs it holds from their headers (a
header that predates recorded reasons, or a damaged one, gets none and loses nothing), the
stop filter walks its index, and the ui's runs list filters in the store and still finds a
stopped run that recorded no reason by its table's row."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from agent_fsm.durable import sqlite_file
from agent_fsm.durable.checkpoint import MemoryStore
from agent_fsm.durable.encoding import encode_header
from agent_fsm.durable.sqlite import SQLiteStore
from agent_fsm.durable.sqlite_leases import LEASES_TABLE
from agent_fsm.state import RunState
from agent_fsm.table import TABLE, AgentState, StopReason
from agent_fsm.ui.runs import run_rows

_DONE = RunState(
    run_id="done", state=AgentState.DONE, stop_reason=StopReason.FINAL_ANSWER, cost=0.125
)
_GOING = RunState(run_id="going", state=AgentState.THINK, stop_reason=StopReason.ASK_USER)
"""A run resumed from a pause: its header still holds the reason it stopped for before."""
_OLD_HEADER = '{"run_id": "ancient", "state": "DONE"}'
"""A stopped run whose checkpoint predates recorded stop reasons and costs."""


def _old_rows() -> list[tuple[Any, ...]]:
    """The runs of an older layout's ``runs`` table: (id, header, state, revision)."""
    return [
        ("done", encode_header(_DONE)[1].decode(), "DONE", 1),
        ("going", encode_header(_GOING)[1].decode(), "THINK", 2),
        ("ancient", _OLD_HEADER, "DONE", 3),
        ("damaged", "{not json", "ERROR", 4),
    ]


def _final_answer_row() -> int:
    return next(i for i, row in enumerate(TABLE) if row.stop_reason is StopReason.FINAL_ANSWER)


def _check_upgraded(store: Any) -> None:
    by_id = {run.run_id: run for run in store.list_runs()}
    assert set(by_id) == {"done", "going", "ancient", "damaged"}
    assert (by_id["done"].stop_reason, by_id["done"].cost) == (StopReason.FINAL_ANSWER, 0.125)
    assert (by_id["going"].stop_reason, by_id["going"].cost) == (None, None)
    assert (by_id["ancient"].stop_reason, by_id["ancient"].cost) == (None, None)
    assert by_id["damaged"].stop_reason is None
    assert [run.run_id for run in store.list_runs(stop_reasons="final_answer")] == ["done"]
    assert [run.run_id for run in store.list_runs(stop_reasons=["ask_user"])] == []
    assert store.load("done") == _DONE  # nothing lost
    # the ui finds the run that recorded no reason by the row it last took
    rows, more = run_rows(store, TABLE, stop="final_answer")
    assert ([row.run_id for row in rows], more) == (["done"], False)
    store.save(RunState(run_id="ancient", state=AgentState.DONE, trace=[(_final_answer_row(), 1)]))
    rows, _ = run_rows(store, TABLE, stop="final_answer")
    assert [row.run_id for row in rows] == ["ancient", "done"]
    assert [row.cost for row in rows] == [None, 0.125]


def test_a_sqlite_file_of_the_layout_before_the_stop_column_is_upgraded(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite3"
    with sqlite3.connect(path) as conn:
        conn.executescript(sqlite_file._LAYOUT)
        conn.execute(LEASES_TABLE)
        for statement in sqlite_file._QUEUE:
            conn.execute(statement)
        for run_id, header, state, revision in _old_rows():
            conn.execute(
                "INSERT INTO runs (run_id, schema_version, header, state, turns, total_tokens,"
                " message_count, trace_count, created_at, updated_at, revision)"
                " VALUES (?, 3, ?, ?, 0, 0, 0, 0, 1.0, 1.0, ?)",
                (run_id, header, state, revision),
            )
        conn.execute("PRAGMA user_version = 3")
    with SQLiteStore(path) as store:
        _check_upgraded(store)
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == sqlite_file.LAYOUT_VERSION
    with SQLiteStore(path) as again:  # upgraded once
        assert len(again.list_runs()) == 4


def test_sqlite_filters_by_stop_along_its_index(tmp_path: Path) -> None:
    from agent_fsm.durable import sqlite as sqlite_store

    path = tmp_path / "runs.sqlite3"
    SQLiteStore(path).close()
    where, params = sqlite_store._filters(["DONE"], ["final_answer", ""])
    with sqlite3.connect(path) as conn:
        plan = conn.execute(
            "EXPLAIN QUERY PLAN " + sqlite_store._LIST_RUNS.format(where=where), (*params, 10)
        ).fetchall()
    assert "USING INDEX runs_by_stop" in " ".join(str(step) for step in plan)


def test_a_postgres_schema_of_the_layout_before_the_stop_column_is_upgraded(
    admin: Any, postgres_url: str, postgres_schema: str
) -> None:
    from psycopg import sql

    from agent_fsm.durable import postgres_rows as rows
    from agent_fsm.durable.postgres import PostgresStore

    admin.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(postgres_schema)))
    for statement in (*rows.LAYOUT, *rows.UPGRADES[2]):  # layout 2: before the stop column
        admin.execute(statement)
    for run_id, header, state, _ in _old_rows():
        if run_id == "damaged":  # a json column keeps no broken JSON: a JSON array, then
            header = "[1, 2]"
        admin.execute(
            "INSERT INTO runs (run_id, schema_version, header, state, turns, total_tokens,"
            " message_count, trace_count, created_at, updated_at, revision)"
            " VALUES (%s, 3, %s, %s, 0, 0, 0, 0, 1.0, 1.0, nextval('revisions'))",
            (run_id, header, state),
        )
    with PostgresStore(postgres_url, schema=postgres_schema) as store:
        _check_upgraded(store)
    assert admin.execute("SELECT version FROM layout").fetchall() == [(rows.LAYOUT_VERSION,)]
    with PostgresStore(postgres_url, schema=postgres_schema) as again:  # upgraded once
        assert len(again.list_runs()) == 4


def test_the_ui_asks_the_store_for_the_stop_and_reads_a_page_not_every_run() -> None:
    """A stop no run has, among many stopped runs: the store is asked once, for that reason
    (and the runs that recorded none), and hands back no run to read."""
    store = MemoryStore()
    for number in range(50):
        store.save(
            RunState(
                run_id=f"r{number}",
                state=AgentState.DONE,
                stop_reason=StopReason.FINAL_ANSWER,
                trace=[(_final_answer_row(), 1)],
            )
        )
    asked: list[dict[str, Any]] = []
    listed = store.list_runs

    def spy(limit: int | None = None, **options: Any) -> Any:
        found = listed(limit, **options)
        asked.append({"limit": limit, "found": len(found), **options})
        return found

    store.list_runs = spy  # type: ignore[method-assign]
    assert run_rows(store, TABLE, stop="max_tokens") == ([], False)
    assert [call["found"] for call in asked] == [0]
    assert asked[0]["stop_reasons"] == ["max_tokens", None]
    asked.clear()
    found, more = run_rows(store, TABLE, stop="final_answer", limit=10)
    assert (len(found), more) == (10, True)
    assert [call["limit"] for call in asked] == [11]
    assert run_rows(store, TABLE, stop="not_a_stop") == ([], False)
