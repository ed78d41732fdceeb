"""PostgresStore's own behaviour: the schema it lays out, saves that write only what is new,
corrupt rows, connections that break, and errors that name the store but not its password.
(The store contract runs on it too: tests/test_store_contract.py.)"""

from __future__ import annotations

import concurrent.futures
import copy
import dataclasses
import json
import math
import re
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("psycopg")  # the extra agent-fsm[postgres]; tests/stores.py says more

import psycopg
from psycopg import sql

from agent_fsm import CheckpointError, ConfigError
from agent_fsm.durable.encoding import encode_header
from agent_fsm.durable.postgres import LAYOUT_VERSION, PostgresStore
from agent_fsm.messages import AssistantMessage
from agent_fsm.table import AgentState
from agent_fsm.testing.store_kit import add_turn, sample_state


def test_the_tables_live_in_a_versioned_schema_of_their_own(
    pg: PostgresStore, admin: psycopg.Connection[Any], postgres_url: str, postgres_schema: str
) -> None:
    tables = admin.execute(
        "SELECT tablename FROM pg_tables WHERE schemaname = %s ORDER BY 1", (postgres_schema,)
    ).fetchall()
    assert [name for (name,) in tables] == [
        "journal",
        "layout",
        "leases",
        "messages",
        "runs",
        "trace",
    ]
    assert admin.execute("SELECT version FROM layout").fetchall() == [(LAYOUT_VERSION,)]
    pg.save(sample_state())
    with PostgresStore(postgres_url, schema=postgres_schema + "_other") as other:
        try:
            assert not other.exists("run-1")  # another schema, another store
        finally:
            admin.execute(
                sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(postgres_schema + "_other"))
            )


def test_workers_starting_at_once_lay_the_schema_out_once(
    postgres_url: str, postgres_schema: str
) -> None:
    barrier = threading.Barrier(6)

    def open_store(_: int) -> PostgresStore:
        barrier.wait()
        return PostgresStore(postgres_url, schema=postgres_schema)

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        stores = list(pool.map(open_store, range(6)))
    stores[0].save(sample_state())
    assert all(store.load("run-1") == sample_state() for store in stores)
    for store in stores:
        store.close()


def test_a_foreign_or_newer_schema_is_refused(
    admin: psycopg.Connection[Any], postgres_url: str, postgres_schema: str
) -> None:
    admin.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(postgres_schema)))
    admin.execute("CREATE TABLE customers (id integer)")
    with pytest.raises(CheckpointError, match="not an agent_fsm checkpoint store"):
        PostgresStore(postgres_url, schema=postgres_schema)
    admin.execute("DROP TABLE customers")
    PostgresStore(postgres_url, schema=postgres_schema).close()
    admin.execute("UPDATE layout SET version = 99")
    with pytest.raises(CheckpointError, match="laid out by a newer agent_fsm"):
        PostgresStore(postgres_url, schema=postgres_schema)


_LOG = """
CREATE TABLE write_log (id serial, tbl text, op text, idx integer);
CREATE FUNCTION log_write() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        INSERT INTO write_log (tbl, op, idx) VALUES (TG_TABLE_NAME, TG_OP, OLD.idx);
    ELSE
        INSERT INTO write_log (tbl, op, idx) VALUES (TG_TABLE_NAME, TG_OP, NEW.idx);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER log_messages AFTER INSERT OR UPDATE OR DELETE ON messages
    FOR EACH ROW EXECUTE FUNCTION log_write();
CREATE TRIGGER log_trace AFTER INSERT OR UPDATE OR DELETE ON trace
    FOR EACH ROW EXECUTE FUNCTION log_write();
"""


def _drain(admin: psycopg.Connection[Any]) -> list[tuple[str, str, int]]:
    """The rows written since the last drain, sorted (one statement inserts in the
    messages and the trace tables, in no set order)."""
    rows = admin.execute("SELECT tbl, op, idx FROM write_log ORDER BY tbl, op, idx").fetchall()
    admin.execute("DELETE FROM write_log")
    return [(tbl, op, idx) for tbl, op, idx in rows]


def test_saves_write_only_the_new_entries(
    pg: PostgresStore, admin: psycopg.Connection[Any], postgres_url: str, postgres_schema: str
) -> None:
    admin.execute(_LOG)
    state = sample_state()
    pg.save(state)
    assert _drain(admin) == [("messages", "INSERT", i) for i in range(7)] + [
        ("trace", "INSERT", i) for i in range(6)
    ]
    add_turn(state, 1)
    pg.save(state)
    assert _drain(admin) == [
        ("messages", "INSERT", 7),
        ("messages", "INSERT", 8),
        *[("trace", "INSERT", i) for i in range(6, 10)],
    ]
    pg.save(state)
    assert _drain(admin) == []
    # A store that has never seen the run compares with what is stored, then appends.
    with PostgresStore(postgres_url, schema=postgres_schema) as reopened:
        add_turn(state, 2)
        reopened.save(state)
        assert _drain(admin) == [
            ("messages", "INSERT", 9),
            ("messages", "INSERT", 10),
            *[("trace", "INSERT", i) for i in range(10, 14)],
        ]
        # Restored from an older checkpoint: only the extra rows go.
        older = copy.deepcopy(state)
        del older.messages[-2:]
        del older.trace[-4:]
        reopened.save(older)
        assert _drain(admin) == [("messages", "DELETE", 9), ("messages", "DELETE", 10)] + [
            ("trace", "DELETE", i) for i in range(10, 14)
        ]
        assert reopened.load("run-1") == older
        # The first store's memory of the run is stale now: it reads the stored rows.
        add_turn(state, 3)
        pg.save(state)
        assert pg.load("run-1") == state
    # A different history under the same id is written whole.
    other = sample_state()
    other.messages[-1] = AssistantMessage(content="a different ending")
    other.trace[-1] = (2, 9)
    pg.save(other)
    assert pg.load("run-1") == other


@pytest.mark.parametrize(
    ("statement", "match"),
    [
        ('UPDATE runs SET header = \'{"turns": "many"}\'', "'run-1' is unreadable"),
        (
            "UPDATE runs SET header = json_build_object('run_id', 'x')",
            "header is for run 'x'",
        ),
        (
            'UPDATE messages SET message = \'{"role": "robot"}\' WHERE idx = 3',
            "unreadable message",
        ),
        ("DELETE FROM messages WHERE idx = 3", "incomplete: 6 of 7 messages"),
        ("DELETE FROM trace WHERE idx = 0", "incomplete"),
    ],
)
def test_a_corrupt_checkpoint_is_an_error_not_a_half_read_state(
    pg: PostgresStore, admin: psycopg.Connection[Any], statement: str, match: str
) -> None:
    pg.save(sample_state())
    admin.execute(statement)  # type: ignore[arg-type]
    with pytest.raises(CheckpointError, match=match):
        pg.load("run-1")


def test_errors_name_the_store_but_never_its_password(postgres_url: str) -> None:
    unreachable = re.sub(r"@[^/]+/", "@127.0.0.1:9/", postgres_url)
    with pytest.raises(CheckpointError, match=r"postgresql://127\.0\.0\.1:9/") as failed:
        PostgresStore(unreachable, schema="nowhere")
    password = psycopg.conninfo.conninfo_to_dict(postgres_url).get("password")
    assert password
    assert str(password) not in str(failed.value)
    with pytest.raises(CheckpointError, match="not a PostgreSQL connection string"):
        PostgresStore("port", schema="x")


@pytest.mark.parametrize(
    "url",
    [
        # (a space in the password is refused by the libpq of psycopg 3.3 only: not here)
        "postgresql://agents:hunter2@db%zz/agents",  # a bad escape: libpq quotes it back
        "postgresql://agents:hunter2@[::1/agents",  # libpq quotes the whole URL
        "host=db.internal password=hunter2 port",
        "host=db.internal password='hunter 2' junk",
    ],
)
def test_a_url_libpq_cannot_parse_is_refused_without_its_password(url: str) -> None:
    with pytest.raises(CheckpointError, match="not a PostgreSQL connection string") as failed:
        PostgresStore(url)
    assert "hunter" not in str(failed.value)
    assert failed.value.__cause__ is None
    assert failed.value.__suppress_context__  # the driver's error, which quotes it, is dropped


@pytest.fixture
def limited_role(postgres_url: str) -> Iterator[str]:
    """A URL for a role the server lets have no connection at all: what "too many clients"
    looks like, without using up the shared server's connections."""
    name = f"limited_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE ROLE {} LOGIN PASSWORD 'pw-of-the-role' CONNECTION LIMIT 0").format(
                sql.Identifier(name)
            )
        )
    try:
        yield re.sub(r"//[^@/]*@", f"//{name}:pw-of-the-role@", postgres_url)
    finally:
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


def test_too_many_clients_is_a_clear_error(limited_role: str) -> None:
    """Issue 34, point 6: the server has no connection slot left for this one."""
    with pytest.raises(CheckpointError) as failed:
        PostgresStore(limited_role, schema="nowhere")
    message = str(failed.value)
    assert "cannot connect: the server has no connection left for this one" in message
    assert "max_connections" in message
    assert "too many connections for role" in message  # the server's own words
    assert "pw-of-the-role" not in message
    assert "\n" not in message


def test_a_refused_connection_says_what_to_do(postgres_url: str) -> None:
    refused = re.sub(r"@[^/]+/", "@127.0.0.1:9/", postgres_url)
    with pytest.raises(CheckpointError, match="nothing accepts connections there") as failed:
        PostgresStore(refused, schema="nowhere")
    assert "is PostgreSQL running on that host and port?" in str(failed.value)


def test_connecting_gives_up_after_the_timeout(postgres_url: str) -> None:
    """A server that accepts the TCP connection and never answers (a stalled host, a
    firewall that drops packets): the store gives up after ``connect_timeout_s`` instead of
    hanging its worker."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    url = re.sub(r"@[^/]+/", f"@127.0.0.1:{silent.getsockname()[1]}/", postgres_url)
    failures: list[BaseException] = []

    def connect() -> None:
        try:
            PostgresStore(url, schema="nowhere", connect_timeout_s=1)
        except BaseException as exc:  # checked below
            failures.append(exc)

    worker = threading.Thread(target=connect, daemon=True)
    worker.start()
    worker.join(timeout=120)  # not a timing assertion: a bound on a hang
    silent.close()
    assert not worker.is_alive(), "the store waited for the silent server for good"
    assert len(failures) == 1
    assert isinstance(failures[0], CheckpointError)
    assert "cannot connect: no answer within 2 s" in str(failures[0])


def test_the_connect_timeout_reaches_libpq(postgres_url: str, postgres_schema: str) -> None:
    """The default, the option (whole seconds, at least 2), and the URL's own."""
    separator = "&" if "?" in postgres_url else "?"
    for options, url, expected in [
        ({}, postgres_url, "10"),
        ({"connect_timeout_s": 3.5}, postgres_url, "4"),
        ({"connect_timeout_s": 0.5}, postgres_url, "2"),
        ({}, f"{postgres_url}{separator}connect_timeout=7", "7"),
        ({"connect_timeout_s": 5}, f"{postgres_url}{separator}connect_timeout=7", "5"),
    ]:
        with PostgresStore(url, schema=postgres_schema, **options) as store:  # type: ignore[arg-type]
            assert store._db._conn is not None
            assert store._db._conn.info.get_parameters().get("connect_timeout") == expected
    for bad in (0, -1, math.nan, math.inf, "10", True):
        with pytest.raises(ConfigError, match="connect_timeout_s must be a positive number"):
            PostgresStore(postgres_url, schema=postgres_schema, connect_timeout_s=bad)  # type: ignore[arg-type]


def test_a_reader_does_not_create_a_store(postgres_url: str, postgres_schema: str) -> None:
    with pytest.raises(CheckpointError, match=r"no agent_fsm checkpoint store at .* schema"):
        PostgresStore(postgres_url, schema=postgres_schema, create=False)
    with psycopg.connect(postgres_url) as conn:
        found = conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (postgres_schema,))
        assert found.fetchone() is None
    PostgresStore(postgres_url, schema=postgres_schema).close()
    PostgresStore(postgres_url, schema=postgres_schema, create=False).close()


def test_a_closed_store_says_so(pg: PostgresStore) -> None:
    pg.close()
    pg.close()
    with pytest.raises(CheckpointError, match="is closed"):
        pg.save(sample_state())


def test_a_dropped_connection_fails_one_call_and_is_replaced(
    pg: PostgresStore, admin: psycopg.Connection[Any]
) -> None:
    pg.save(sample_state())
    backend = pg._db._conn.info.backend_pid if pg._db._conn is not None else 0
    admin.execute("SELECT pg_terminate_backend(%s)", (backend,))
    with pytest.raises(CheckpointError, match="cannot load run 'run-1'"):
        pg.load("run-1")
    assert pg.load("run-1") == sample_state()  # a new connection


def test_each_save_stores_the_header_encode_header_writes(
    pg: PostgresStore, admin: psycopg.Connection[Any]
) -> None:
    """The store encodes a run's headers with one encoder (``durable.header``), save after
    save: each stored header is ``encode_header``'s, also after a save that changed only
    fields kept in place or fields of the loop detector's and the calibration's records."""

    def stored() -> Any:
        return admin.execute("SELECT header::text FROM runs WHERE run_id = 'run-1'").fetchone()

    state = sample_state()
    state.state = AgentState.THINK
    changes = [
        lambda: add_turn(state, 1),
        lambda: state.notes.setdefault("seen", []).append(1),
        lambda: state.notes["seen"].append(2),
        lambda: setattr(state.loop, "result_repeats", state.loop.result_repeats + 1),
        lambda: setattr(state.loop, "call_streaks", {"echo:1": 3}),
        lambda: state.calibration.learn(500, 530),
        lambda: None,
        lambda: setattr(state, "state", AgentState.DONE),  # a stop: the encoder is let go
        lambda: setattr(state, "state", AgentState.THINK),  # resumed
        lambda: pg.delete("run-1"),
    ]
    for change in changes:
        change()
        pg.save(state)
        assert json.loads(stored()[0]) == json.loads(encode_header(state)[1])
        assert pg.load("run-1") == state


@pytest.mark.parametrize(("synchronous", "setting"), [(False, "off"), (True, "on")])
def test_saves_commit_without_a_flush_unless_asked(
    postgres_url: str, postgres_schema: str, synchronous: bool, setting: str
) -> None:
    with PostgresStore(postgres_url, schema=postgres_schema, synchronous_saves=synchronous) as pg:
        pg.save(sample_state())
        assert pg._db._conn is not None
        shown = pg._db._conn.execute("SHOW synchronous_commit").fetchone()
        assert shown == (setting,)


def test_a_save_of_a_run_the_store_knows_is_one_statement(
    pg: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After the first save, a save that only appends is one statement (one round trip),
    leased or not; a lease to report on takes the long way, which says why."""
    state = sample_state()
    pg.save(state)
    sent: list[str] = []
    execute = psycopg.Connection.execute

    def counting(conn: psycopg.Connection[Any], query: Any, *args: Any, **kwargs: Any) -> Any:
        sent.append(str(query))
        return execute(conn, query, *args, **kwargs)

    monkeypatch.setattr(psycopg.Connection, "execute", counting)
    add_turn(state, 1)
    pg.save(state)
    assert len(sent) == 1
    alice = pg.claim("run-1", "alice", 60)
    sent.clear()
    add_turn(state, 2)
    pg.save(state, lease=alice)
    assert len(sent) == 1
    assert sent[0].startswith("WITH fence AS (UPDATE leases")
    assert pg.load("run-1") == state


def test_a_worker_frozen_inside_a_transaction_holds_up_only_its_own_runs(
    postgres_url: str, postgres_schema: str
) -> None:
    """Found by the chaos test's full profile (issue 34): a DBOS worker SIGSTOPped between
    a statement of its lease renewal and the commit kept its lease's row locked (a pipelined
    transaction never counts as idle on the server, so nothing ends it); every worker that
    came to recover its runs waited on that lock with the thread renewing its own lease,
    and the whole fleet stood still until the frozen worker was continued. A store's
    statement waits ``LOCK_WAIT_S`` for a lock, then fails, and the store goes on."""
    with (
        PostgresStore(postgres_url, schema=postgres_schema) as frozen,
        PostgresStore(postgres_url, schema=postgres_schema) as other,
    ):
        frozen.claim("executor:w1", "w1", 0.5)
        locked, thaw = threading.Event(), threading.Event()

        def freeze() -> None:  # inside a renewal's transaction, then SIGSTOPped
            with frozen._db.transaction("renew the lease of run 'executor:w1'") as conn:
                conn.execute(
                    "SELECT 1 FROM leases WHERE run_id = %s FOR UPDATE", ("executor:w1",)
                ).fetchone()
                locked.set()
                thaw.wait(2 * UPPER_BOUND_S)  # until the test ends

        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            frozen_worker = pool.submit(freeze)
            try:
                assert locked.wait(UPPER_BOUND_S)
                while other.lease("executor:w1") is not None:  # it expires: w1 looks dead
                    time.sleep(0.05)
                recovery = pool.submit(other.claim, "executor:w1", "recovery", 60.0)
                with pytest.raises(CheckpointError, match="lock timeout"):
                    recovery.result(timeout=UPPER_BOUND_S)  # a bound for a hang
                other.save(sample_state())  # the recovering worker goes on
                assert other.load("run-1") == sample_state()
            finally:
                thaw.set()
                frozen_worker.result()
        taken = other.claim("executor:w1", "recovery", 60.0)  # w1 woke: its lock is gone
        assert taken.owner == "recovery"


UPPER_BOUND_S = 120.0
"""How long a thread of these tests may wait: a limit for a hang, not a measure."""


def test_a_paired_lookup_reads_what_two_lookups_would(pg: PostgresStore) -> None:
    """``lookup_pair`` (a DBOS tool step's one read: its call's entry and its run's cancel
    request) answers as two ``lookup`` calls, keys digested by ``stored_key`` included."""
    from agent_fsm.durable.journal import PairedLookup
    from agent_fsm.messages import ToolCall, ToolMessage

    journal = pg.journal("paired")
    assert isinstance(journal, PairedLookup)
    long_key = "k" * 400  # stored as a digest
    journal.record_started("a", ToolCall(id="a", name="send", arguments="{}"))
    journal.record_started(long_key, ToolCall(id="b", name="send", arguments="{}"))
    journal.record_finished(long_key, ToolMessage(tool_call_id="b", name="send", content="ok"))
    for pair in (("a", long_key), (long_key, "a"), ("a", "absent"), ("absent", "a"), ("x", "y")):
        assert journal.lookup_pair(*pair) == (journal.lookup(pair[0]), journal.lookup(pair[1]))
    assert journal.lookup_pair("a", "a") == (journal.lookup("a"), journal.lookup("a"))


def test_a_starting_lookup_reads_both_entries_and_starts_only_when_neither_exists(
    pg: PostgresStore,
) -> None:
    """``start_unless_known`` (a DBOS tool step's one round trip before its call) reads as
    ``lookup_pair`` does, and records the call started (durably) exactly when both entries
    are absent; a live lease on the run fences it as ``record_started`` is fenced."""
    from agent_fsm.durable.journal import CallStatus, StartingLookup
    from agent_fsm.errors import RunLeased
    from agent_fsm.messages import ToolCall

    journal = pg.journal("starting")
    assert isinstance(journal, StartingLookup)
    long_key = "k" * 400  # stored as a digest
    send = ToolCall(id="a", name="send", arguments='{"n": 1}')
    assert journal.start_unless_known(long_key, send, "cancel") == (None, None, True)
    started = journal.lookup(long_key)
    assert started is not None
    assert (started.status, started.call) == (CallStatus.STARTED, send)
    # Known now: read, nothing recorded again; nor under a key whose "other" exists.
    assert journal.start_unless_known(long_key, send, "cancel") == (started, None, False)
    assert journal.start_unless_known("b", send, long_key) == (None, started, False)
    assert journal.lookup("b") is None
    pg.claim("fenced", "someone", 30.0)
    with pytest.raises(RunLeased):
        pg.journal("fenced").start_unless_known("a", send, "cancel")
    assert pg.journal("fenced").lookup("a") is None


@pytest.mark.parametrize("leased", [False, True], ids=["unleased", "leased"])
def test_of_two_executions_starting_a_call_at_once_only_one_starts_it(
    pg: PostgresStore, postgres_url: str, postgres_schema: str, leased: bool
) -> None:
    """Two executions of one DBOS tool step at once (a worker taken for dead that goes on,
    and the one that recovered its run): the second's ``start_unless_known`` runs while the
    first's start is written but not committed, so its read sees no entry and its insert
    meets the first's row and does nothing. It must answer the first's entry, not record
    the call again and run it (the chaos test saw the effect twice). Under a lease it reads,
    then starts in a statement of its own: the same holds."""
    from agent_fsm.durable.journal import CallStatus
    from agent_fsm.messages import ToolCall

    run_id = f"both-{'leased' if leased else 'unleased'}"
    second = pg.journal(run_id, lease=pg.claim(run_id, "us", 60.0) if leased else None)
    ours = ToolCall(id="a", name="send", arguments='{"by": "us"}')
    entry, request, started = _race_a_first_start(
        pg,
        postgres_url,
        postgres_schema,
        run_id,
        lambda: second.start_unless_known("call", ours, "cancel"),
    )
    assert (started, request) == (False, None)
    assert entry is not None
    assert (entry.status, entry.call.arguments) == (CallStatus.STARTED, '{"by": "other"}')


def _race_a_first_start(
    pg: PostgresStore,
    postgres_url: str,
    postgres_schema: str,
    run_id: str,
    start: Any,
) -> Any:
    """``start()`` (a first start of call ``call`` of ``run_id``, on ``pg``) made while
    another execution's start of the same call is written but not committed: its read sees
    no entry and its insert meets the other's row. What ``start`` returned."""
    from agent_fsm.messages import ToolCall
    from tests.test_forward_saves import wait_for_a_lock_waiter

    theirs = ToolCall(id="a", name="send", arguments='{"by": "other"}')
    outcome: dict[str, Any] = {}
    with PostgresStore(postgres_url, schema=postgres_schema) as other:
        in_write = threading.Event()

        def second_starts() -> None:
            assert in_write.wait(30)
            outcome["second"] = start()

        racing = threading.Thread(target=second_starts)
        racing.start()
        # Not pipelined (as the store's own transactions are): the insert has reached
        # the server, and holds the row, before the second is let go.
        with other._db.connected("hold the first start") as conn, conn.transaction():
            conn.execute(
                "INSERT INTO journal VALUES (%s, %s, %s::json, 'started', NULL)",
                (run_id, "call", theirs.model_dump_json()),
            )
            in_write.set()
            wait_for_a_lock_waiter(postgres_url)  # the second waits on the first's row
        racing.join(30)
    return outcome["second"]


def test_a_first_start_racing_another_answers_its_entry_and_does_not_start(
    pg: PostgresStore, postgres_url: str, postgres_schema: str
) -> None:
    """``lookup_or_start`` (a call's first start: ACT's, a DBOS tool step's whose journal
    cannot start in its read) while another execution's start of the call commits: it
    answers that entry and records nothing over it (an upsert would start the call twice)."""
    from agent_fsm.durable.journal import CallStatus, StartingJournal
    from agent_fsm.messages import ToolCall

    journal = pg.journal("first")
    assert isinstance(journal, StartingJournal)
    ours = ToolCall(id="a", name="send", arguments='{"by": "us"}')
    entry = _race_a_first_start(
        pg, postgres_url, postgres_schema, "first", lambda: journal.lookup_or_start("call", ours)
    )
    assert entry is not None
    assert entry.status is CallStatus.STARTED
    assert entry.call.arguments == '{"by": "other"}'
    assert pg.journal("first").lookup("call") == entry


def test_a_first_start_refused_by_the_fence_is_not_started(pg: PostgresStore) -> None:
    """``lookup_or_start`` fenced as ``record_started``: under another's live lease, or a
    lease taken over, it records nothing and says why (``NotStarted`` from ``RunLeased``);
    an entry already there is answered whoever holds the run."""
    from agent_fsm.durable.journal import NotStarted
    from agent_fsm.errors import RunLeased
    from agent_fsm.messages import ToolCall

    send = ToolCall(id="a", name="send")
    pg.claim("fenced-first", "someone", 30.0)
    with pytest.raises(NotStarted) as refused:
        pg.journal("fenced-first").lookup_or_start("a", send)
    assert isinstance(refused.value.__cause__, RunLeased)
    assert pg.journal("fenced-first").lookup("a") is None
    mine = pg.claim("fenced-mine", "me", 30.0)
    assert pg.journal("fenced-mine", lease=mine).lookup_or_start("a", send) is None
    stale = dataclasses.replace(mine, token=mine.token + 1)  # taken over since
    with pytest.raises(NotStarted) as lost:
        pg.journal("fenced-mine", lease=stale).lookup_or_start("b", send)
    assert isinstance(lost.value.__cause__, RunLeased)
    assert pg.journal("fenced-mine").lookup("b") is None
    found = pg.journal("fenced-mine", lease=stale).lookup_or_start("a", send)
    assert found is not None  # read, whoever holds the run
    assert found.call == send


def test_a_finishing_lookup_records_the_end_and_reads_the_other_entry(pg: PostgresStore) -> None:
    """``finish_and_lookup`` (a DBOS tool step's end, and its run's cancel request read in
    the same round trip) does what ``record_finished`` then ``lookup`` would: the end
    recorded, the other entry (present, absent, a digested key) as it is; a call never
    started is a KeyError, and nothing is written."""
    from agent_fsm.durable.journal import CallStatus, FinishingLookup
    from agent_fsm.messages import ToolCall, ToolMessage

    journal = pg.journal("finishing")
    assert isinstance(journal, FinishingLookup)
    long_key = "k" * 400  # stored as a digest
    for key in ("a", "b", long_key):
        journal.record_started(key, ToolCall(id=key[:8], name="send", arguments="{}"))
    answer = ToolMessage(tool_call_id="a", name="send", content="ok")
    assert journal.finish_and_lookup("a", answer, long_key) == journal.lookup(long_key)
    finished = journal.lookup("a")
    assert finished is not None
    assert (finished.status, finished.result) == (CallStatus.FINISHED, answer)
    assert journal.finish_and_lookup(long_key, answer, "absent") is None
    assert journal.finish_and_lookup("b", answer, "a") == finished
    with pytest.raises(KeyError, match="without having started"):
        journal.finish_and_lookup("never", answer, "a")
    assert journal.lookup("never") is None


def test_a_journal_start_is_one_round_trip_and_a_failed_one_leaves_no_transaction(
    pg: PostgresStore, admin: psycopg.Connection[Any], tmp_path: Path
) -> None:
    """A call's start (``record_started``, ``lookup_or_start``, ``start_unless_known``) is
    committed with a flush to disk in *one* round trip (``PostgresDatabase.durable_statement``:
    one Sync sent to the server, per libpq's trace), the tool call's one fsync-bearing round
    trip. A start that fails is rolled back: the connection is left in no transaction, and
    the next start works."""
    from agent_fsm.durable.journal import CallStatus
    from agent_fsm.messages import ToolCall

    send = ToolCall(id="c", name="send", arguments="{}")
    journal = pg.journal("one-trip")
    assert journal.lookup("none") is None  # connected
    conn = pg._db._connection()
    starts = {
        "a": lambda: journal.record_started("a", send),
        "b": lambda: journal.lookup_or_start("b", send),
        "c": lambda: journal.start_unless_known("c", send, "cancel"),
    }
    for key, start in starts.items():
        trace = tmp_path / f"{key}.trace"
        with trace.open("w") as out:
            conn.pgconn.trace(out.fileno())
            try:
                start()
            finally:
                conn.pgconn.untrace()
        sent = [line.split("\t") for line in trace.read_text().splitlines()]
        assert [m[3] for m in sent if m[1] == "F" and m[3] == "Sync"] == ["Sync"], key
        entry = journal.lookup(key)
        assert entry is not None
        assert entry.status is CallStatus.STARTED
    admin.execute("ALTER TABLE journal ADD CONSTRAINT short_keys CHECK (length(key) < 2)")
    with pytest.raises(CheckpointError):
        journal.record_started("too long", send)
    assert conn.pgconn.transaction_status == psycopg.pq.TransactionStatus.IDLE
    admin.execute("ALTER TABLE journal DROP CONSTRAINT short_keys")
    journal.record_started("too long", send)
    assert journal.lookup("too long") is not None
