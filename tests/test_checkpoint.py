"""Checkpoint stores beyond their contract (which every store runs:
``tests/test_store_contract.py``): the rows SQLite writes, the real migrations of older
headers, corrupt checkpoints, SQLite's file handling (WAL, paths, foreign files), and a writer
in another process."""

from __future__ import annotations

import copy
import json
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from agent_fsm import CheckpointError, SQLiteStore
from agent_fsm.durable import RunSummary, encoding
from agent_fsm.durable.sqlite import LAYOUT_VERSION
from agent_fsm.durable.sqlite_file import SQLiteFile
from agent_fsm.messages import ToolCall, Usage
from agent_fsm.state import RUN_STATE_ADAPTER, RunState
from agent_fsm.table import AgentState, StopReason
from agent_fsm.testing.store_kit import add_turn, sample_state
from tests.stores import Opener


def test_a_summary_is_the_runs_last_saved_state() -> None:
    state = sample_state("a")
    state.state, state.usage = AgentState.DONE, Usage(input_tokens=120, output_tokens=45)
    assert encoding.summarize(state, created_at=1000.0, updated_at=1003.0) == RunSummary(
        run_id="a",
        state=AgentState.DONE,
        turns=3,
        total_tokens=165,
        messages=7,
        last_row=1,
        created_at=1000.0,
        updated_at=1003.0,
        output="approve the transfer?",
        error="partial",
        stop_reason=StopReason.APPROVAL_REQUIRED,
        cost=0.0125,
    )
    assert encoding.summarize(RunState(run_id="b"), created_at=1, updated_at=1).last_row is None


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
    state = sample_state()
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


# --- schema versions and corruption ----------------------------------------------------------


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
    state = encoding.decode_header("r", 1, json.dumps(header))
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
    state = encoding.decode_header("r", 2, json.dumps(header))
    assert state.loop.call_streaks == {"echo:=x": 2}
    assert state.loop.recent_calls == ["echo:=y", "echo:=x", "echo:=x"]
    header["loop"] = {"last_call": None, "call_repeats": 0}
    assert encoding.decode_header("r", 2, json.dumps(header)).loop.call_streaks == {}


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
        store.save(sample_state())
        with sqlite3.connect(path) as conn:
            conn.execute(sql)
        with pytest.raises(CheckpointError, match=match):
            store.load("run-1")


def test_decode_header_rejects_a_header_that_fails_validation() -> None:
    with pytest.raises(CheckpointError, match="'r' is unreadable"):
        encoding.decode_header("r", 1, b'{"run_id": "r", "turns": "many"}')


# --- SQLite files --------------------------------------------------------------------------


def test_sqlite_file_is_in_wal_mode(tmp_path: Path) -> None:
    path = tmp_path / "runs.sqlite3"
    with SQLiteStore(path) as store:
        store.save(sample_state())
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
        store.save(sample_state())


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
