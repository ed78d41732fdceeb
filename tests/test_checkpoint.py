"""Checkpoint stores: round trips, incremental saves, isolation, schema versions, the journal,
on every store (memory, SQLite, PostgreSQL: ``tests/stores.py``), several instances and
processes on one store, and SQLite's file handling (WAL, paths, foreign files)."""

from __future__ import annotations

import concurrent.futures
import copy
import itertools
import json
import re
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agent_fsm import CheckpointError, CheckpointStore, SQLiteStore
from agent_fsm.durable import RunSummary
from agent_fsm.durable import encoding as checkpoint_module
from agent_fsm.durable.journal import CallStatus, ToolJournal, journal_key
from agent_fsm.durable.sqlite import LAYOUT_VERSION
from agent_fsm.durable.sqlite_file import SQLiteFile
from agent_fsm.messages import (
    AssistantMessage,
    FinishReason,
    SystemMessage,
    ToolCall,
    ToolMessage,
    ToolStatus,
    Usage,
    UserMessage,
)
from agent_fsm.state import (
    RUN_STATE_ADAPTER,
    ControlKind,
    ControlRequest,
    LoopState,
    ModelFailure,
    RunState,
)
from agent_fsm.table import TABLE, AgentState
from tests.stores import Opener


def row_index(label: str) -> int:
    return next(i for i, row in enumerate(TABLE) if row.label == label)


THINK, ACT, REFLECT, CONTINUE = (row_index(x) for x in ("think", "act", "reflect", "continue"))


def rich_state(run_id: str = "run-1") -> RunState:
    """A paused run with something in every part of RunState."""
    calls = (
        ToolCall(id="c1", name="add", arguments='{"a": 1, "b": 2}'),
        ToolCall(id="c2", name="lookup", arguments="not json"),
        ToolCall(id="c3", name="transfer", arguments='{"amount": 10}'),
    )
    return RunState(
        run_id=run_id,
        state=AgentState.DONE,
        turns=3,
        usage=Usage(
            input_tokens=120,
            output_tokens=45,
            cached_tokens=20,
            reasoning_tokens=5,
            requests=3,
            estimated=True,
        ),
        messages=[
            SystemMessage(content="be brief"),
            UserMessage(content="add 1 and 2, then pay — ünïcode ✓"),
            AssistantMessage(content="Let me check.", tool_calls=calls),
            ToolMessage(
                tool_call_id="c1",
                name="add",
                content="3",
                details={"elapsed_ms": 1.5, "args": [1, 2], "nested": {"ok": True, "no": None}},
            ),
            ToolMessage(
                tool_call_id="c2",
                name="lookup",
                content="arguments are not JSON",
                status=ToolStatus.ERROR,
            ),
            ToolMessage(
                tool_call_id="c3",
                name="transfer",
                content="waiting for approval",
                status=ToolStatus.SKIPPED,
            ),
            AssistantMessage(content="The sum is 3."),
        ],
        pending_input=["and then?"],
        prompt_tokens_estimate=321,
        tools_tokens_estimate=64,
        consecutive_errors=1,
        last_finish_reason=FinishReason.TOOL_CALLS,
        last_tool_calls=3,
        model_failure=ModelFailure(message="rate limited", permanent=False, retry_after_s=2.5),
        control=ControlRequest(
            kind=ControlKind.APPROVAL,
            text="approve the transfer?",
            tool_call_id="c3",
            pending_calls=(calls[2],),
        ),
        loop=LoopState(
            call_streaks={"add:{}": 2, "lookup:x": 1},
            last_results="r",
            result_repeats=1,
            last_text="t",
            text_repeats=1,
            recent_calls=["add:{}", "lookup:x"],
            period_matches=[0, 1, 2],
            detected="add repeated",
        ),
        reflector_done=True,
        elapsed_s=12.375,
        abort_reason="user pressed stop",
        output="approve the transfer?",
        error="partial",
        trace=[(THINK, 0), (ACT, 1), (REFLECT, 1), (CONTINUE, 1), (THINK, 1), (ACT, 2)],
    )


def add_turn(state: RunState, n: int) -> None:
    """One more tool-calling turn: a reply with a call, its result, four transitions."""
    state.turns += 1
    state.messages.append(
        AssistantMessage(tool_calls=(ToolCall(id=f"t{n}", name="echo", arguments=f'{{"n": {n}}}'),))
    )
    state.messages.append(ToolMessage(tool_call_id=f"t{n}", name="echo", content=str(n)))
    state.trace.extend([(THINK, state.turns), (ACT, state.turns), (REFLECT, state.turns)])
    state.trace.append((CONTINUE, state.turns))


def fake_clock() -> Callable[[], float]:
    ticks = itertools.count(1000)
    return lambda: float(next(ticks))


# --- round trips -----------------------------------------------------------------------


def test_stores_implement_the_protocol(store: CheckpointStore) -> None:
    assert isinstance(store, CheckpointStore)
    assert isinstance(store.journal("r"), ToolJournal)


def test_round_trip_of_a_rich_state(store: CheckpointStore) -> None:
    state = rich_state()
    store.save(state)
    loaded = store.load("run-1")
    assert loaded == state
    assert loaded is not state
    assert store.exists("run-1")


def test_round_trip_of_a_new_run(store: CheckpointStore) -> None:
    state = RunState(run_id="empty")
    store.save(state)
    assert store.load("empty") == state


def test_round_trip_after_every_save_of_a_growing_run(store: CheckpointStore) -> None:
    state = rich_state()
    for n in range(5):
        add_turn(state, n)
        state.loop.recent_calls.append(f"echo:{n}")
        state.usage = state.usage + Usage(input_tokens=10, output_tokens=n, requests=1)
        store.save(state)
        assert store.load("run-1") == state


def test_create_saves_a_new_run_and_refuses_a_known_id_leaving_it_as_it_was(
    store: CheckpointStore,
) -> None:
    first = rich_state()
    assert store.create(first) is True
    assert store.load("run-1") == first
    other = RunState(run_id="run-1", turns=99)
    assert store.create(other) is False
    assert store.load("run-1") == first


def test_of_many_stores_on_one_storage_creating_one_run_exactly_one_wins(
    open_shared_store: Opener,
) -> None:
    """Eight "processes" (each its own connection) start runs under one id at once."""
    stores = [open_shared_store() for _ in range(8)]
    barrier = threading.Barrier(len(stores))

    def start(store: CheckpointStore, n: int) -> bool:
        barrier.wait()
        return store.create(RunState(run_id="job-7", turns=n))

    with concurrent.futures.ThreadPoolExecutor(len(stores)) as pool:
        won = list(pool.map(start, stores, range(len(stores))))
    assert won.count(True) == 1
    assert stores[0].load("job-7").turns == won.index(True)


def test_unknown_run_id(store: CheckpointStore) -> None:
    with pytest.raises(CheckpointError, match="no checkpoint for run 'nope'"):
        store.load("nope")
    assert not store.exists("nope")


# --- append-only lists -------------------------------------------------------------------


def test_restore_and_continue_drops_the_newer_entries(store: CheckpointStore) -> None:
    state = rich_state()
    store.save(state)
    older = store.load("run-1")
    add_turn(state, 1)
    add_turn(state, 2)
    store.save(state)
    store.save(older)  # the run resumed from the older checkpoint
    assert store.load("run-1") == older
    add_turn(older, 9)
    store.save(older)
    assert store.load("run-1") == older


def test_a_different_history_under_the_same_id_replaces_the_stored_one(
    store: CheckpointStore,
) -> None:
    store.save(rich_state())
    other = rich_state()
    other.messages[-1] = AssistantMessage(content="a different ending")
    other.trace[-1] = (REFLECT, 9)
    store.save(other)
    assert store.load("run-1") == other


def test_a_saved_checkpoint_does_not_follow_the_live_state(store: CheckpointStore) -> None:
    state = rich_state()
    store.save(state)
    snapshot = copy.deepcopy(state)
    add_turn(state, 1)
    state.turns = 99
    state.loop.recent_calls.append("x")
    state.loop.period_matches[0] = 7
    state.pending_input.append("more")
    state.output = "changed"
    assert store.load("run-1") == snapshot
    loaded = store.load("run-1")
    loaded.messages.clear()
    loaded.loop.recent_calls.clear()
    assert store.load("run-1") == snapshot


def _write_log(path: Path) -> sqlite3.Connection:
    """Triggers that record every row written to the messages and trace tables."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("CREATE TABLE write_log (tbl TEXT, op TEXT, idx INTEGER)")
    for table in ("messages", "trace"):
        for op, ref in (("INSERT", "NEW"), ("UPDATE", "NEW"), ("DELETE", "OLD")):
            conn.execute(
                f"CREATE TRIGGER log_{table}_{op} AFTER {op} ON {table} BEGIN "
                f"INSERT INTO write_log VALUES ('{table}', '{op}', {ref}.idx); END"
            )
    return conn


def _drain(log: sqlite3.Connection) -> list[tuple[str, str, int]]:
    rows = log.execute("SELECT tbl, op, idx FROM write_log ORDER BY rowid").fetchall()
    log.execute("DELETE FROM write_log")
    return rows


def test_sqlite_saves_write_only_the_new_entries(tmp_path: Path) -> None:
    path = tmp_path / "runs.sqlite3"
    state = rich_state()
    with SQLiteStore(path) as store:
        log = _write_log(path)
        store.save(state)
        assert _drain(log) == [("messages", "INSERT", i) for i in range(7)] + [
            ("trace", "INSERT", i) for i in range(6)
        ]
        add_turn(state, 1)
        store.save(state)
        assert _drain(log) == [
            ("messages", "INSERT", 7),
            ("messages", "INSERT", 8),
            *[("trace", "INSERT", i) for i in range(6, 10)],
        ]
        store.save(state)
        assert _drain(log) == []
    # A store that has never seen the run learns the stored counts from the file.
    with SQLiteStore(path) as reopened:
        add_turn(state, 2)
        reopened.save(state)
        assert _drain(log) == [
            ("messages", "INSERT", 9),
            ("messages", "INSERT", 10),
            *[("trace", "INSERT", i) for i in range(10, 14)],
        ]
        # Restored from an older checkpoint: only the extra rows go.
        older = copy.deepcopy(state)
        del older.messages[-2:]
        del older.trace[-4:]
        reopened.save(older)
        assert _drain(log) == [("messages", "DELETE", 9), ("messages", "DELETE", 10)] + [
            ("trace", "DELETE", i) for i in range(10, 14)
        ]
        assert reopened.load("run-1") == older
    log.close()


# --- list_runs, delete ---------------------------------------------------------------------


def test_list_runs_most_recent_first_with_summaries(open_store: Opener) -> None:
    with open_store(fake_clock()) as store:
        assert store.list_runs() == []
        for run_id in ("a", "b", "c"):
            store.save(RunState(run_id=run_id))  # clock: 1000, 1001, 1002
        state = rich_state("a")
        store.save(state)  # 1003
        runs = store.list_runs()
        assert [run.run_id for run in runs] == ["a", "c", "b"]
        assert [run.run_id for run in store.list_runs(limit=2)] == ["a", "c"]
        assert store.list_runs(limit=0) == []
        assert runs[0] == RunSummary(
            run_id="a",
            state=AgentState.DONE,
            turns=3,
            total_tokens=165,
            messages=7,
            last_row=ACT,
            created_at=1000.0,
            updated_at=1003.0,
            output="approve the transfer?",
            error="partial",
        )
        assert runs[1].last_row is None
        assert runs[1].created_at == runs[1].updated_at == 1002.0


def test_delete_removes_checkpoint_and_journal(store: CheckpointStore) -> None:
    store.save(rich_state("a"))
    store.save(rich_state("b"))
    call = ToolCall(id="c1", name="add")
    store.journal("a").record_started("k", call)
    store.journal("b").record_started("k", call)
    store.delete("a")
    store.delete("never-saved")
    assert not store.exists("a")
    with pytest.raises(CheckpointError, match="'a'"):
        store.load("a")
    assert store.journal("a").lookup("k") is None
    assert [run.run_id for run in store.list_runs()] == ["b"]
    assert store.load("b") == rich_state("b")
    assert store.journal("b").lookup("k") is not None
    store.save(rich_state("a"))  # the id can be used again
    assert store.load("a") == rich_state("a")


# --- the tool journal ------------------------------------------------------------------------


def test_journal_records_started_and_finished_calls(store: CheckpointStore) -> None:
    journal = store.journal("run-1")
    key = journal_key(2, 0, "c1")
    call = ToolCall(id="c1", name="add", arguments='{"a": 1}')
    result = ToolMessage(tool_call_id="c1", name="add", content="3", details={"ms": 2})
    assert journal.lookup(key) is None
    journal.record_started(key, call)
    started = store.journal("run-1").lookup(key)
    assert started is not None
    assert (started.key, started.call, started.status, started.result) == (
        key,
        call,
        CallStatus.STARTED,
        None,
    )
    journal.record_finished(key, result)
    finished = journal.lookup(key)
    assert finished is not None
    assert (finished.status, finished.result) == (CallStatus.FINISHED, result)
    assert store.journal("other-run").lookup(key) is None
    with pytest.raises(KeyError, match="without having started"):
        journal.record_finished("9:0:x", result)


def test_the_journal_is_durable_and_shared(open_shared_store: Opener) -> None:
    call = ToolCall(id="c1", name="transfer")
    with open_shared_store() as first, open_shared_store() as second:
        # Written from a worker thread, as a sync tool's runtime may do.
        worker = threading.Thread(target=first.journal("r").record_started, args=("k", call))
        worker.start()
        worker.join()
        entry = second.journal("r").lookup("k")  # committed before record_started returned
        assert entry is not None
        assert entry.status is CallStatus.STARTED
    with open_shared_store() as reopened:
        entry = reopened.journal("r").lookup("k")
        assert entry is not None
        assert entry.call == call
        assert entry.status is CallStatus.STARTED


# --- schema versions and corruption ----------------------------------------------------------


def _save_as_version_1(store: CheckpointStore, monkeypatch: pytest.MonkeyPatch) -> None:
    with monkeypatch.context() as patched:
        patched.setattr(checkpoint_module, "CHECKPOINT_SCHEMA_VERSION", 1)
        store.save(rich_state())


def test_a_version_1_approval_pause_migrates_to_decisions_with_their_calls() -> None:
    """Version 1 kept approval decisions by call id (a run that crashed while carrying them
    out); version 2 keeps each decision with its call, so the reset rule can clear the
    pending request on resume."""
    pending = ToolCall(id="c1", name="send", arguments='{"to": "bob"}')
    header = RUN_STATE_ADAPTER.dump_python(RunState(run_id="r", state=AgentState.ACT), mode="json")
    for new_field in ("decisions", "stop_reason", "messages", "trace"):
        header.pop(new_field)
    header["control"] = {
        "kind": "approval",
        "text": "send?",
        "pending_calls": [pending.model_dump(mode="json")],
    }
    header["approvals"] = {"c1": {"allow": True, "reason": "fine"}}
    state = checkpoint_module.decode_header("r", 1, json.dumps(header))
    assert [(d.call, d.approval.allow, d.approval.reason) for d in state.decisions] == [
        (pending, True, "fine")
    ]
    assert state.stop_reason is None


def test_a_version_2_loop_state_migrates_to_streaks_per_turn() -> None:
    """Version 2 counted repeats of the last call; version 3 counts turns per call."""
    header = RUN_STATE_ADAPTER.dump_python(RunState(run_id="r"), mode="json")
    for new_field in ("messages", "trace"):
        header.pop(new_field)
    header["loop"] = {
        "last_call": "echo:=x",
        "call_repeats": 2,
        "recent_calls": ["echo:=y", "echo:=x", "echo:=x"],
        "period_matches": [0, 0, 1],
    }
    state = checkpoint_module.decode_header("r", 2, json.dumps(header))
    assert state.loop.call_streaks == {"echo:=x": 2}
    assert state.loop.recent_calls == ["echo:=y", "echo:=x", "echo:=x"]
    header["loop"] = {"last_call": None, "call_repeats": 0}
    assert checkpoint_module.decode_header("r", 2, json.dumps(header)).loop.call_streaks == {}


def test_newer_schema_is_refused(store: CheckpointStore, monkeypatch: pytest.MonkeyPatch) -> None:
    with monkeypatch.context() as patched:
        patched.setattr(checkpoint_module, "CHECKPOINT_SCHEMA_VERSION", 7)
        store.save(rich_state())
    with pytest.raises(CheckpointError, match=r"'run-1' was written by a newer agent_fsm.*\b7\b"):
        store.load("run-1")


def test_older_schema_is_migrated_step_by_step(
    store: CheckpointStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    _save_as_version_1(store, monkeypatch)

    def one_to_two(header: dict[str, Any]) -> dict[str, Any]:
        header["output"] = "v2"
        return header

    def two_to_three(header: dict[str, Any]) -> dict[str, Any]:
        return {**header, "output": header["output"] + "+v3", "turns": header["turns"] * 10}

    monkeypatch.setattr(checkpoint_module, "CHECKPOINT_SCHEMA_VERSION", 3)
    monkeypatch.setattr(checkpoint_module, "MIGRATIONS", {1: one_to_two, 2: two_to_three})
    loaded = store.load("run-1")
    expected = rich_state()
    expected.output, expected.turns = "v2+v3", 30
    assert loaded == expected
    store.save(loaded)  # now written as version 3: no migration runs again
    assert store.load("run-1") == expected


def test_older_schema_without_a_migration_is_refused(
    store: CheckpointStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    _save_as_version_1(store, monkeypatch)
    monkeypatch.setattr(checkpoint_module, "CHECKPOINT_SCHEMA_VERSION", 3)
    monkeypatch.setattr(checkpoint_module, "MIGRATIONS", {1: lambda header: header})
    with pytest.raises(
        CheckpointError,
        match=r"'run-1' has schema version 1, this agent_fsm reads version 3.*from version 2 to 3",
    ):
        store.load("run-1")


def test_a_migration_that_breaks_the_header_is_an_error(
    store: CheckpointStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    _save_as_version_1(store, monkeypatch)
    monkeypatch.setattr(checkpoint_module, "CHECKPOINT_SCHEMA_VERSION", 2)
    monkeypatch.setattr(checkpoint_module, "MIGRATIONS", {1: lambda header: {"turns": "many"}})
    with pytest.raises(CheckpointError, match="'run-1' is unreadable"):
        store.load("run-1")


@pytest.mark.parametrize(
    ("sql", "match"),
    [
        ("UPDATE runs SET header = '{not json'", "'run-1' is unreadable"),
        ("UPDATE runs SET header = json_set(header, '$.turns', 'many')", "'run-1' is unreadable"),
        ("UPDATE runs SET header = json_set(header, '$.run_id', 'x')", "header is for run 'x'"),
        ('UPDATE messages SET json = \'{"role": "robot"}\' WHERE idx = 3', "unreadable message"),
        ("DELETE FROM messages WHERE idx = 3", "incomplete: 6 of 7 messages"),
        ("DELETE FROM trace WHERE idx = 0", "incomplete"),
    ],
)
def test_a_corrupt_checkpoint_is_an_error_not_a_half_read_state(
    tmp_path: Path, sql: str, match: str
) -> None:
    path = tmp_path / "runs.sqlite3"
    with SQLiteStore(path) as store:
        store.save(rich_state())
        with sqlite3.connect(path) as conn:
            conn.execute(sql)
        with pytest.raises(CheckpointError, match=match):
            store.load("run-1")


def test_decode_header_rejects_a_header_that_fails_validation() -> None:
    with pytest.raises(CheckpointError, match="'r' is unreadable"):
        checkpoint_module.decode_header("r", 1, b'{"run_id": "r", "turns": "many"}')


# --- SQLite files --------------------------------------------------------------------------


def test_sqlite_file_is_in_wal_mode(tmp_path: Path) -> None:
    path = tmp_path / "runs.sqlite3"
    with SQLiteStore(path) as store:
        store.save(rich_state())
        with sqlite3.connect(path) as conn:
            assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
            assert conn.execute("PRAGMA user_version").fetchone()[0] == LAYOUT_VERSION
    file = SQLiteFile(path)
    with file.transaction("read the settings", write=False) as conn:
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
    file.close()


def test_paths_that_cannot_be_opened(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-dir" / "runs.sqlite3"
    with pytest.raises(CheckpointError, match="no-such-dir"):
        SQLiteStore(missing)
    with pytest.raises(CheckpointError, match=re.escape(str(tmp_path))):
        SQLiteStore(tmp_path)  # a directory
    garbage = tmp_path / "garbage.sqlite3"
    garbage.write_bytes(b"this is not a database" * 100)
    with pytest.raises(CheckpointError, match=re.escape(str(garbage))):
        SQLiteStore(garbage)


def test_foreign_and_newer_files_are_refused(tmp_path: Path) -> None:
    foreign = tmp_path / "foreign.sqlite3"
    with sqlite3.connect(foreign) as conn:
        conn.execute("CREATE TABLE customers (id INTEGER)")
    with pytest.raises(CheckpointError, match="not an agent_fsm checkpoint store"):
        SQLiteStore(foreign)
    newer = tmp_path / "newer.sqlite3"
    SQLiteStore(newer).close()
    with sqlite3.connect(newer) as conn:
        conn.execute("PRAGMA user_version = 99")
    with pytest.raises(CheckpointError, match="laid out by a newer agent_fsm"):
        SQLiteStore(newer)


def test_a_closed_store_says_so(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "runs.sqlite3")
    store.close()
    store.close()
    with pytest.raises(CheckpointError, match="is closed"):
        store.save(rich_state())


def test_two_instances_on_one_storage(open_shared_store: Opener) -> None:
    with open_shared_store() as first, open_shared_store() as second:
        state = rich_state()
        first.save(state)
        resumed = second.load("run-1")
        assert resumed == state
        add_turn(resumed, 1)
        add_turn(resumed, 2)
        second.save(resumed)
        assert first.load("run-1") == resumed
        # first still holds the older live state and goes on from it: last writer wins,
        # and what is stored is one history, never a mix of both.
        add_turn(state, 7)
        first.save(state)
        assert second.load("run-1") == state
        second.save(rich_state("other"))
        assert [run.run_id for run in first.list_runs()] == ["other", "run-1"]


_CHILD = """
import sys
from agent_fsm.messages import ToolCall, UserMessage
from agent_fsm.state import RunState
from tests.stores import open_location

state = RunState(run_id="child")
with open_location(*sys.argv[1:]) as store:
    print("ready", flush=True)
    for n in range(200):
        state.messages.append(UserMessage(content=str(n)))
        state.trace.append((0, n))
        store.save(state)
        store.journal("child").record_started(str(n), ToolCall(id=str(n), name="t"))
"""


def test_a_writer_in_another_process(open_shared_store: Opener) -> None:
    with open_shared_store() as store:
        child = subprocess.Popen(
            [sys.executable, "-c", _CHILD, open_shared_store.kind, *open_shared_store.location],
            stdout=subprocess.PIPE,
            text=True,
            cwd=Path(__file__).resolve().parent.parent,
        )
        assert child.stdout is not None
        assert child.stdout.readline() == "ready\n"  # the two processes now write together
        state = RunState(run_id="parent")
        for n in range(100):
            add_turn(state, n)
            store.save(state)
        assert child.wait(timeout=60) == 0
        child.stdout.close()
        assert store.load("parent") == state
        from_child = store.load("child")
        assert [m.content for m in from_child.messages] == [str(n) for n in range(200)]
        assert from_child.trace == [(0, n) for n in range(200)]
        assert store.journal("child").lookup("199") is not None
