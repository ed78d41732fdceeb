"""Run leases on every store (``durable.leases``' contract): claims, expiry and takeover, and
the fence that refuses every write of a driver whose lease was taken over."""

from __future__ import annotations

import concurrent.futures
import math
import threading
import time

import pytest

from agent_fsm import CheckpointStore, ConfigError, RunLeased
from agent_fsm.durable.leases import LeaseStore
from agent_fsm.messages import ToolCall, UserMessage
from agent_fsm.state import RunState
from tests.stores import Opener

EXPIRES_S = 0.2
"""A lease this short is let expire by sleeping ``PAST_EXPIRY_S``: slow machines only make
the sleep longer, never the lease."""
PAST_EXPIRY_S = 0.4


def leasing(store: CheckpointStore) -> LeaseStore:
    assert isinstance(store, LeaseStore)
    return store


def said(text: str) -> RunState:
    return RunState(run_id="r", messages=[UserMessage(content=text)])


def test_every_store_leases_runs(store: CheckpointStore) -> None:
    assert isinstance(store, LeaseStore)


def test_a_claimed_run_is_refused_to_another_worker_naming_the_holder(
    store: CheckpointStore,
) -> None:
    leases = leasing(store)
    alice = leases.claim("r", "alice", 60)
    assert (alice.run_id, alice.owner, alice.token, alice.ttl_s) == ("r", "alice", 1, 60.0)
    with pytest.raises(RunLeased, match=r"run 'r' is leased to worker 'alice' for \d+\.\d s more"):
        leases.claim("r", "bob", 60)
    with pytest.raises(RunLeased) as refused:
        leases.claim("r", "alice", 60)  # the same worker id gets no second lease either
    assert (refused.value.run_id, refused.value.holder) == ("r", "alice")
    assert refused.value.expires_at == pytest.approx(alice.expires_at, abs=1.0)
    live = leases.lease("r")
    assert live is not None
    assert (live.owner, live.token) == ("alice", 1)
    assert leases.lease("never-claimed") is None


def test_a_released_lease_is_claimed_at_once_with_a_new_token(store: CheckpointStore) -> None:
    leases = leasing(store)
    alice = leases.claim("r", "alice", 60)
    leases.release(alice)
    assert leases.lease("r") is None
    bob = leases.claim("r", "bob", 60)
    assert bob.token == 2


def test_an_expired_lease_is_taken_over_and_every_write_of_its_old_holder_is_refused(
    store: CheckpointStore,
) -> None:
    leases = leasing(store)
    alice = leases.claim("r", "alice", EXPIRES_S)
    leases.save(said("alice's"), lease=alice)
    time.sleep(PAST_EXPIRY_S)
    bob = leases.claim("r", "bob", 60)
    assert bob.token == alice.token + 1
    taken = r"the lease of worker 'alice' \(token 1\) was taken over by worker 'bob'"
    with pytest.raises(RunLeased, match=taken) as lost:
        leases.save(said("stale"), lease=alice)
    assert lost.value.holder == "bob"
    with pytest.raises(RunLeased, match=taken):
        leases.journal("r", lease=alice).record_started("1:0:c", ToolCall(id="c", name="t"))
    with pytest.raises(RunLeased, match=taken):
        leases.renew(alice)
    leases.release(alice)  # too late: it leaves bob's lease alone
    live = leases.lease("r")
    assert live is not None
    assert live.owner == "bob"
    assert store.load("r") == said("alice's")  # nothing of alice's was written
    assert store.journal("r").lookup("1:0:c") is None
    leases.save(said("bob's"), lease=bob)
    assert store.load("r") == said("bob's")


def test_an_expired_lease_nobody_took_is_renewed_by_the_next_write(
    store: CheckpointStore,
) -> None:
    leases = leasing(store)
    alice = leases.claim("r", "alice", EXPIRES_S)
    time.sleep(PAST_EXPIRY_S)
    assert leases.lease("r") is None
    leases.save(said("late but alone"), lease=alice)
    live = leases.lease("r")
    assert live is not None
    assert (live.owner, live.token) == ("alice", 1)


def test_writes_renew_the_lease(store: CheckpointStore) -> None:
    leases = leasing(store)
    alice = leases.claim("r", "alice", 60)
    time.sleep(0.05)
    leases.save(said("one"), lease=alice)
    after_save = leases.lease("r")
    assert after_save is not None
    assert after_save.expires_at > alice.expires_at
    time.sleep(0.05)
    leases.journal("r", lease=alice).record_started("k", ToolCall(id="c", name="t"))
    after_journal = leases.lease("r")
    assert after_journal is not None
    assert after_journal.expires_at > after_save.expires_at
    renewed = leases.renew(alice)
    assert renewed.expires_at >= after_journal.expires_at
    assert (renewed.owner, renewed.token) == ("alice", 1)


def test_a_write_without_a_lease_is_refused_while_one_is_live(store: CheckpointStore) -> None:
    leases = leasing(store)
    store.save(said("before"))
    alice = leases.claim("r", "alice", 60)
    with pytest.raises(RunLeased, match="leased to worker 'alice'"):
        store.save(said("unleased"))
    with pytest.raises(RunLeased, match="leased to worker 'alice'"):
        store.journal("r").record_started("k", ToolCall(id="c", name="t"))
    leases.claim("new", "alice", 60)
    with pytest.raises(RunLeased, match="leased to worker 'alice'"):
        store.create(RunState(run_id="new"))
    assert not store.exists("new")
    leases.release(alice)
    store.save(said("after"))
    assert store.load("r") == said("after")


def test_create_under_a_lease(store: CheckpointStore) -> None:
    leases = leasing(store)
    alice = leases.claim("new", "alice", 60)
    assert leases.create(RunState(run_id="new"), lease=alice) is True
    assert leases.create(RunState(run_id="new", turns=3), lease=alice) is False
    assert store.load("new") == RunState(run_id="new")


def test_deleting_a_run_deletes_its_lease(store: CheckpointStore) -> None:
    leases = leasing(store)
    alice = leases.claim("r", "alice", 60)
    leases.save(said("x"), lease=alice)
    store.delete("r")
    assert leases.lease("r") is None
    assert leases.claim("r", "bob", 60).owner == "bob"


@pytest.mark.parametrize("ttl", [0, -1, math.nan, math.inf, "30", True, None])
def test_a_lease_needs_a_positive_finite_ttl(store: CheckpointStore, ttl: object) -> None:
    with pytest.raises(ConfigError, match="ttl_s must be a positive number of seconds"):
        leasing(store).claim("r", "alice", ttl)  # type: ignore[arg-type]


def test_of_many_workers_claiming_one_run_exactly_one_wins(open_shared_store: Opener) -> None:
    """Eight "processes" (each its own connection) claim one run at once."""
    stores = [leasing(open_shared_store()) for _ in range(8)]
    barrier = threading.Barrier(len(stores))

    def claim(store: LeaseStore, n: int) -> bool:
        barrier.wait()
        try:
            store.claim("job-7", f"worker-{n}", 60)
        except RunLeased:
            return False
        return True

    with concurrent.futures.ThreadPoolExecutor(len(stores)) as pool:
        won = list(pool.map(claim, stores, range(len(stores))))
    assert won.count(True) == 1
    live = stores[0].lease("job-7")
    assert live is not None
    assert live.owner == f"worker-{won.index(True)}"


def test_a_takeover_between_processes(open_shared_store: Opener) -> None:
    """Two stores on one storage, as two workers: the second takes an expired lease over,
    and the first one's writes are refused from then on."""
    first, second = leasing(open_shared_store()), leasing(open_shared_store())
    alice = first.claim("r", "alice", EXPIRES_S)
    first.save(said("alice's"), lease=alice)
    with pytest.raises(RunLeased, match="leased to worker 'alice'"):
        second.claim("r", "bob", 60)
    time.sleep(PAST_EXPIRY_S)
    bob = second.claim("r", "bob", 60)
    with pytest.raises(RunLeased, match="taken over by worker 'bob'"):
        first.save(said("stale"), lease=alice)
    second.save(said("bob's"), lease=bob)
    assert first.load("r") == said("bob's")
