"""The round trips of PostgresStore's transactions. Its one-transaction writes of leases and
the queue (``claim``, ``renew``, ``release``, ``claim_next``, ``cancel``) are each sent in
*one* round trip and committed with a flush to disk (``PostgresDatabase.durable_statements``);
a transaction whose statements wait for answers (a run's creation) waits for nothing else
(``PostgresDatabase.transaction``: not for BEGIN, not before COMMIT). One that fails is
rolled back whole, leaving the store's connection in no transaction and usable.

Counted from libpq's trace of the store's connection: the messages it sent (a Sync ends a
pipeline and asks for every answer) and received; a round trip is a send followed by the
reading of an answer. (Before: a claim took five, a release four, a creation five.)"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("psycopg")  # the extra agent-fsm[postgres]; tests/stores.py says more

import psycopg

from agent_fsm import CheckpointError, RunLeased
from agent_fsm.durable.leases import Lease
from agent_fsm.durable.postgres import PostgresStore
from agent_fsm.testing.store_kit import sample_state

IDLE = psycopg.pq.TransactionStatus.IDLE


def _connection(store: PostgresStore) -> psycopg.Connection[Any]:
    conn = store._db._connection()
    conn.prepare_threshold = None  # every statement's text in the trace, never a name
    return conn


def _traced(store: PostgresStore, tmp_path: Path, call: Callable[[], Any]) -> list[list[str]]:
    """The messages the store's connection sent (``F``) and received (``B``) during
    ``call`` (libpq's trace: columns time, direction, length, type, contents), whether it
    raised or not."""
    conn = _connection(store)
    trace = tmp_path / "trace"
    with trace.open("w") as out:
        conn.pgconn.trace(out.fileno())
        try:
            call()
        finally:
            conn.pgconn.untrace()
    lines = [line.split("\t") for line in trace.read_text().splitlines()]
    return [line for line in lines if len(line) > 3]


def _sent(store: PostgresStore, tmp_path: Path, call: Callable[[], Any]) -> list[list[str]]:
    """The messages the store's connection sent during ``call``."""
    return [message for message in _traced(store, tmp_path, call) if message[1] == "F"]


def _syncs(sent: list[list[str]]) -> int:
    return sum(message[3] == "Sync" for message in sent)


def _round_trips(traced: list[list[str]]) -> int:
    """How many times the client read an answer after sending."""
    directions = [message[1] for message in traced]
    return sum(a == "F" and b == "B" for a, b in itertools.pairwise(directions))


def _flushed(sent: list[list[str]]) -> bool:
    """Whether the transaction sent asked for its commit to be flushed to disk (the
    session's commits are not: ``synchronous_saves`` is off)."""
    return any(
        message[3] == "Parse" and "SET LOCAL synchronous_commit = on" in message[4]
        for message in sent
    )


def _prepared(pg: PostgresStore, operation: str) -> tuple[Callable[[], Any], str]:
    """Set the store up for ``operation``; return a call making it (again and again), and
    the table whose row for the run a transaction must lock to make it wait (then fail)."""
    if operation in ("renew", "release"):
        pg.create(sample_state())
        lease = pg.claim("run-1", "alice", 60)
        if operation == "renew":
            return lambda: pg.renew(lease), "leases"
        return lambda: pg.release(lease), "leases"
    if operation == "cancel":
        pg.create(sample_state())
        return lambda: pg.cancel("run-1", "stop"), "runs"
    pg.enqueue(sample_state())
    pg.release(pg.claim("run-1", "alice", 60))  # its lease's row stays, expired
    if operation == "claim":
        return lambda: pg.release(pg.claim("run-1", "bob", 60)), "leases"
    return lambda: pg.release(_taken(pg.claim_next("bob", 60))), "leases"


def _taken(lease: Lease | None) -> Lease:
    assert lease is not None
    return lease


@pytest.mark.parametrize("operation", ["claim", "renew", "release", "claim_next", "cancel"])
def test_a_lease_or_queue_write_is_one_round_trip_flushed_and_a_failed_one_leaves_no_transaction(
    pg: PostgresStore, admin: psycopg.Connection[Any], tmp_path: Path, operation: str
) -> None:
    """Each of these writes is one transaction of its own, sent in one round trip, whose
    commit is flushed to disk (as it was when it took several). One whose statement fails
    (here: it waits for a row another transaction holds locked, past ``lock_timeout``) is a
    ``CheckpointError`` naming the operation; its transaction is rolled back, and the same
    connection serves the next call."""
    call, table = _prepared(pg, operation)
    sent = _sent(pg, tmp_path, call)
    transactions = 2 if operation in ("claim", "claim_next") else 1  # a claim, and its release
    assert _syncs(sent) == transactions, sent
    assert _flushed(sent)
    conn = _connection(pg)
    conn.execute("SET lock_timeout = '50ms'")  # the store's is LOCK_WAIT_S: a test need not wait
    with admin.transaction():
        admin.execute(f"SELECT FROM {table} WHERE run_id = 'run-1' FOR UPDATE")
        with pytest.raises(CheckpointError, match="lock timeout") as failed:
            call()
        assert conn.pgconn.transaction_status == IDLE
        assert conn is pg._db._conn  # not replaced: the connection is fine
    what = {
        "claim": "claim run 'run-1'",
        "renew": "renew the lease of run 'run-1'",
        "release": "release the lease of run 'run-1'",
        "claim_next": "claim the next run",
        "cancel": "cancel run 'run-1'",
    }[operation]
    assert f"cannot {what}:" in str(failed.value)
    call()  # the lock is gone: the same connection makes it
    assert conn.pgconn.transaction_status == IDLE
    assert conn is pg._db._conn


def test_a_refused_claim_names_the_holder_in_the_same_round_trip(
    pg: PostgresStore, tmp_path: Path
) -> None:
    """A claim refused by a live lease reads who holds it in the claim's own transaction,
    while the row its ``ON CONFLICT`` locked is still locked (the holder cannot change in
    between): still one round trip, and nothing written."""
    pg.create(sample_state())
    alice = pg.claim("run-1", "alice", 60)
    refused: list[RunLeased] = []

    def claim() -> None:
        with pytest.raises(RunLeased) as raised:
            pg.claim("run-1", "bob", 60)
        refused.append(raised.value)

    assert _syncs(_sent(pg, tmp_path, claim)) == 1
    assert (refused[0].run_id, refused[0].holder) == ("run-1", "alice")
    assert refused[0].expires_at == pytest.approx(alice.expires_at, abs=1e-3)
    live = pg.lease("run-1")
    assert live is not None
    assert (live.owner, live.token) == ("alice", alice.token)


def test_a_taken_over_lease_is_renewed_in_one_round_trip_and_refused_in_two(
    pg: PostgresStore, admin: psycopg.Connection[Any], tmp_path: Path
) -> None:
    """A renewal is one statement; only when it was refused (the lease was taken over) does
    the store read who took it, in a second round trip, after the renewal's transaction."""
    pg.create(sample_state())
    alice = pg.claim("run-1", "alice", 60)
    assert _syncs(_sent(pg, tmp_path, lambda: pg.renew(alice))) == 1
    admin.execute("UPDATE leases SET expires_at = 0 WHERE run_id = 'run-1'")  # it ran out
    bob = pg.claim("run-1", "bob", 60)
    refused: list[RunLeased] = []

    def renew() -> None:
        with pytest.raises(RunLeased, match="taken over by worker 'bob'") as raised:
            pg.renew(alice)
        refused.append(raised.value)

    assert _syncs(_sent(pg, tmp_path, renew)) == 2
    assert (refused[0].holder, refused[0].expires_at) == ("bob", bob.expires_at)
    live = pg.lease("run-1")
    assert live is not None
    assert (live.owner, live.token, live.expires_at) == ("bob", bob.token, bob.expires_at)


def test_a_creation_is_two_round_trips_and_a_failed_one_is_rolled_back_whole(
    pg: PostgresStore, admin: psycopg.Connection[Any], tmp_path: Path
) -> None:
    """A run's creation reads whether its row was inserted (and the fence) before writing
    the rest: two round trips, its first also carrying BEGIN. When its last statement fails
    (the messages' insert, after the run's row was inserted), or the fence refuses it (an
    error raised in the transaction's block), nothing of it is committed, and the
    connection is left in no transaction, for the next call."""
    created = _traced(pg, tmp_path, lambda: pg.create(sample_state("one")))
    assert _round_trips(created) == 2, created
    assert _flushed([message for message in created if message[1] == "F"])
    admin.execute("ALTER TABLE messages ADD CONSTRAINT none_kept CHECK (idx < 0) NOT VALID")
    with pytest.raises(CheckpointError, match=r"cannot create run 'two':.*none_kept"):
        pg.create(sample_state("two"))
    conn = pg._db._conn
    assert conn is not None
    assert conn.pgconn.transaction_status == IDLE
    assert not pg.exists("two")  # the run's row, inserted first, was rolled back
    assert admin.execute("SELECT count(*) FROM runs WHERE run_id = 'two'").fetchone() == (0,)
    admin.execute("ALTER TABLE messages DROP CONSTRAINT none_kept")
    assert pg.create(sample_state("two"))
    assert pg.load("two") == sample_state("two")
    assert conn is pg._db._conn
    pg.claim("three", "alice", 60)  # a creation the fence refuses: raised inside the block
    with pytest.raises(RunLeased, match="leased to worker 'alice'"):
        pg.create(sample_state("three"))
    assert conn.pgconn.transaction_status == IDLE
    assert not pg.exists("three")


def test_a_load_is_one_round_trip(pg: PostgresStore, tmp_path: Path) -> None:
    """A load's three reads (the run's row, its messages, its trace) go out with BEGIN and
    COMMIT, and are read after the commit, from one snapshot."""
    pg.save(sample_state())
    loaded: list[Any] = []
    assert _round_trips(_traced(pg, tmp_path, lambda: loaded.append(pg.load("run-1")))) == 1
    assert loaded == [sample_state()]
