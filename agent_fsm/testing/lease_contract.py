"""The lease part of the checkpoint-store contract (``durable.leases`` states it): run on a
store that leases runs, skipped for one that does not. ``CheckpointStoreContract`` includes
it; it is not meant to be used alone."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import math
import threading

import pytest

from agent_fsm.durable.leases import LeaseStore
from agent_fsm.errors import ConfigError, RunLeased
from agent_fsm.messages import ToolCall, ToolMessage, UserMessage
from agent_fsm.state import RunState
from agent_fsm.table import AgentState
from agent_fsm.testing.store_kit import BAD_ID_NAMES, BAD_IDS, StoreContractBase, refuses

__all__ = ["LeaseContract"]

_TAKEN = r"the lease of worker 'alice' \(token 1\) was taken over by worker 'bob'"


def said(text: str, run_id: str = "r") -> RunState:
    """A run that said ``text``: states told apart by what they hold."""
    return RunState(run_id=run_id, messages=[UserMessage(content=text)])


class LeaseContract(StoreContractBase):
    """Claims, expiry by the store's clock, takeover, and the fence on every write."""

    def test_a_claimed_run_is_refused_to_another_worker_naming_the_holder(self) -> None:
        store = self.open_leasing()
        alice = store.claim("r", "alice", 60)
        assert (alice.run_id, alice.owner, alice.ttl_s) == ("r", "alice", 60.0)
        with pytest.raises(RunLeased, match=r"run 'r' is leased to worker 'alice' for [\d.]+ s"):
            store.claim("r", "bob", 60)
        with pytest.raises(RunLeased) as refused:
            store.claim("r", "alice", 60)  # the same worker id gets no second lease either
        assert (refused.value.run_id, refused.value.holder) == ("r", "alice")
        assert refused.value.expires_at == pytest.approx(alice.expires_at, abs=1.0)
        live = store.lease("r")
        assert live is not None
        assert (live.run_id, live.owner, live.token) == ("r", "alice", alice.token)
        assert store.lease("never-claimed") is None

    def test_every_claim_raises_the_runs_token(self) -> None:
        store = self.open_leasing()
        alice = store.claim("r", "alice", 60)
        store.release(alice)
        assert store.lease("r") is None  # released: claimable at once
        bob = store.claim("r", "bob", 60)
        assert bob.token == alice.token + 1
        other = store.claim("another run", "bob", 60)
        assert other.run_id == "another run"

    def test_a_lease_expires_by_the_stores_clock(self) -> None:
        if not self.leases_from_clock:
            pytest.skip("the store's leases do not follow the given clock")
        store = self.open_leasing()
        alice = store.claim("r", "alice", 60)
        assert alice.expires_at == self.clock() + 60
        self.clock.advance(59)
        with pytest.raises(RunLeased, match="leased to worker 'alice'"):
            store.claim("r", "bob", 60)
        self.clock.advance(2)
        assert store.lease("r") is None
        assert store.claim("r", "bob", 60).token == alice.token + 1

    def test_a_taken_over_lease_fences_every_write_of_its_old_holder(self) -> None:
        store = self.open_leasing()
        starting = store.claim("new", "alice", self.expiring_ttl_s)  # to create "new" with
        alice = store.claim("r", "alice", self.expiring_ttl_s)
        store.save(said("alice's"), lease=alice)
        self.let_expire(store, alice)  # and the lease on "new", claimed before it
        bob = store.claim("r", "bob", 60)
        assert bob.token == alice.token + 1
        with pytest.raises(RunLeased, match=_TAKEN) as lost:
            store.save(said("stale"), lease=alice)
        assert (lost.value.run_id, lost.value.holder) == ("r", "bob")
        with pytest.raises(RunLeased, match=_TAKEN):
            store.journal("r", lease=alice).record_started("1:0:c", ToolCall(id="c", name="t"))
        with pytest.raises(RunLeased, match=_TAKEN):
            store.renew(alice)
        store.release(alice)  # too late: it leaves bob's lease alone
        live = store.lease("r")
        assert live is not None
        assert live.owner == "bob"
        assert store.load("r") == said("alice's")  # nothing of alice's went through
        assert store.journal("r").lookup("1:0:c") is None
        store.save(said("bob's"), lease=bob)
        assert store.load("r") == said("bob's")
        store.claim("new", "bob", 60)
        with pytest.raises(RunLeased, match="taken over by worker 'bob'"):
            store.create(RunState(run_id="new"), lease=starting)
        assert not store.exists("new")

    def test_a_call_finishing_after_a_takeover_is_still_recorded(self) -> None:
        """``record_finished`` is not fenced: it records what a call started under a valid
        lease really did, which the new holder replays instead of calling it unknown."""
        store = self.open_leasing()
        alice = store.claim("r", "alice", self.expiring_ttl_s)
        call = ToolCall(id="c", name="send")
        store.journal("r", lease=alice).record_started("1:0:c", call)
        self.let_expire(store, alice)
        store.claim("r", "bob", 60)
        sent = ToolMessage(tool_call_id="c", name="send", content="sent")
        store.journal("r", lease=alice).record_finished("1:0:c", sent)
        entry = store.journal("r").lookup("1:0:c")
        assert entry is not None
        assert entry.result == sent

    def test_an_expired_lease_nobody_took_is_renewed_by_the_next_write(self) -> None:
        store = self.open_leasing()
        alice = store.claim("r", "alice", self.expiring_ttl_s)
        self.let_expire(store, alice)
        assert store.lease("r") is None
        store.save(said("late but alone"), lease=alice)
        live = store.lease("r")
        assert live is not None
        assert (live.owner, live.token) == ("alice", alice.token)
        assert store.load("r") == said("late but alone")

    def test_writes_and_renewals_extend_the_lease(self) -> None:
        store = self.open_leasing()
        alice = store.claim("r", "alice", 60)
        self.pass_time(0.05)
        store.save(said("one"), lease=alice)
        after_save = store.lease("r")
        assert after_save is not None
        assert after_save.expires_at > alice.expires_at
        self.pass_time(0.05)
        store.journal("r", lease=alice).record_started("k", ToolCall(id="c", name="t"))
        after_journal = store.lease("r")
        assert after_journal is not None
        assert after_journal.expires_at > after_save.expires_at
        self.pass_time(0.05)
        renewed = store.renew(alice)
        assert renewed.expires_at > after_journal.expires_at
        assert (renewed.run_id, renewed.owner, renewed.token) == ("r", "alice", alice.token)

    def test_a_write_without_a_lease_is_refused_while_one_is_live(self) -> None:
        store = self.open_leasing()
        store.save(said("before"))
        alice = store.claim("r", "alice", 60)
        with pytest.raises(RunLeased, match="leased to worker 'alice'"):
            store.save(said("unleased"))
        with pytest.raises(RunLeased, match="leased to worker 'alice'"):
            store.journal("r").record_started("k", ToolCall(id="c", name="t"))
        store.claim("new", "alice", 60)
        with pytest.raises(RunLeased, match="leased to worker 'alice'"):
            store.create(RunState(run_id="new"))
        assert not store.exists("new")
        store.release(alice)
        store.save(said("after"))
        assert store.load("r") == said("after")

    def test_create_under_a_lease(self) -> None:
        store = self.open_leasing()
        alice = store.claim("new", "alice", 60)
        assert store.create(RunState(run_id="new"), lease=alice) is True
        assert store.create(RunState(run_id="new", turns=3), lease=alice) is False
        assert store.load("new") == RunState(run_id="new")

    def test_deleting_a_run_deletes_its_lease(self) -> None:
        store = self.open_leasing()
        alice = store.claim("r", "alice", 60)
        store.save(said("x"), lease=alice)
        store.delete("r")
        assert store.lease("r") is None
        assert store.claim("r", "bob", 60).owner == "bob"

    @pytest.mark.parametrize("ttl", [0, -1, math.nan, math.inf, "30", True, None])
    def test_a_lease_needs_a_positive_finite_ttl(self, ttl: object) -> None:
        store = self.open_leasing()
        with pytest.raises(ConfigError, match="ttl_s must be a positive number of seconds"):
            store.claim("r", "alice", ttl)  # type: ignore[arg-type]
        assert store.lease("r") is None

    @pytest.mark.parametrize("bad", BAD_IDS, ids=BAD_ID_NAMES)
    def test_an_id_some_store_could_not_keep_gets_no_lease(self, bad: str) -> None:
        """Run ids and worker ids alike (``durable.leases.check_id``)."""
        store = self.open_leasing()
        alice = store.claim("r", "alice", 60)
        forged = dataclasses.replace(alice, run_id=bad)
        calls = {
            "claim(run id)": lambda: store.claim(bad, "alice", 60),
            "claim(worker id)": lambda: store.claim("other", bad, 60),
            "lease": lambda: store.lease(bad),
            "renew": lambda: store.renew(forged),
            "release": lambda: store.release(forged),
            "save": lambda: store.save(RunState(run_id=bad), lease=forged),
        }
        assert [name for name, call in calls.items() if not refuses(call)] == []
        assert store.lease("other") is None
        live = store.lease("r")
        assert live is not None
        assert live.owner == "alice"

    def test_list_runs_shows_each_runs_lease_and_flags_the_stuck_ones(self) -> None:
        """A run is stuck when it has not stopped and its lease is no longer live (it expired
        or was released mid-run): no worker drives it until one resumes it."""
        store = self.open_leasing()
        store.save(said("never leased", "free"))
        dead = store.claim("dead", "bob", self.expiring_ttl_s)
        store.save(said("bob died", "dead"), lease=dead)
        done = store.claim("done", "bob", self.expiring_ttl_s)
        store.save(RunState(run_id="done", state=AgentState.DONE), lease=done)
        gave_up = store.claim("gave-up", "carol", 60)
        store.save(said("carol gave up", "gave-up"), lease=gave_up)
        store.release(gave_up)
        self.let_expire(store, dead)
        self.let_expire(store, done)
        alive = store.claim("alive", "alice", 60)
        store.save(said("alice drives it", "alive"), lease=alive)
        runs = {run.run_id: run for run in store.list_runs()}
        assert list(runs) == ["alive", "gave-up", "done", "dead", "free"]
        leases = {
            run_id: (run.lease_holder, run.lease_live, run.stuck) for run_id, run in runs.items()
        }
        assert leases == {
            "alive": ("alice", True, False),
            "gave-up": ("carol", False, True),
            "done": ("bob", False, False),
            "dead": ("bob", False, True),
            "free": (None, False, False),
        }
        assert runs["free"].lease_expires_at is None
        live = store.lease("alive")
        assert live is not None
        assert runs["alive"].lease_expires_at == pytest.approx(live.expires_at)
        assert [run.run_id for run in store.list_runs(states=AgentState.OBSERVE) if run.stuck] == [
            "gave-up",
            "dead",
        ]

    # -- several stores on one storage (shares_storage) ------------------------------------------

    def test_of_many_workers_claiming_one_run_exactly_one_wins(self) -> None:
        first = self.open_leasing()
        stores = [first, *(self.open_leasing(shared=True) for _ in range(5))]
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
        live = first.lease("job-7")
        assert live is not None
        assert live.owner == f"worker-{won.index(True)}"

    def test_a_takeover_between_two_stores_on_one_storage(self) -> None:
        first, second = self.open_leasing(), self.open_leasing(shared=True)
        alice = first.claim("r", "alice", self.expiring_ttl_s)
        first.save(said("alice's"), lease=alice)
        with pytest.raises(RunLeased, match="leased to worker 'alice'"):
            second.claim("r", "bob", 60)
        self.let_expire(second, alice)
        bob = second.claim("r", "bob", 60)
        with pytest.raises(RunLeased, match="taken over by worker 'bob'"):
            first.save(said("stale"), lease=alice)
        second.save(said("bob's"), lease=bob)
        assert first.load("r") == said("bob's")
