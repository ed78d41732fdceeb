"""What the checkpoint-store contract is built from: the run states it saves, the clock it
moves, and the base class that opens the stores under test (``store_contract`` is the suite).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import ClassVar, Protocol

import pytest

from agent_fsm.durable.checkpoint import CheckpointStore
from agent_fsm.durable.journal import ToolJournal
from agent_fsm.durable.leases import MAX_ID_BYTES, Lease, LeaseStore
from agent_fsm.errors import ConfigError
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
from agent_fsm.prompt import ContextEdits, SummaryDue
from agent_fsm.state import (
    AgentRecord,
    Approval,
    ControlKind,
    ControlRequest,
    Decision,
    GuardrailTrip,
    LoopState,
    ModelFailure,
    ParentLink,
    RunState,
    SubAgentPause,
)
from agent_fsm.table import StopReason
from agent_fsm.tokens import Calibration

__all__ = [
    "BAD_IDS",
    "BAD_ID_NAMES",
    "ContractClock",
    "LeasingStore",
    "StoreContractBase",
    "add_turn",
    "refuses",
    "sample_state",
]


BAD_IDS = ("half \ud83d", "nul\x00byte", "x" * (MAX_ID_BYTES + 1), "é" * (MAX_ID_BYTES // 2 + 1))
"""Ids some store could not keep, so every store refuses them (``durable.leases.check_id``):
a lone surrogate, a NUL, too many bytes of ASCII, too many bytes of fewer characters."""
BAD_ID_NAMES = ("lone-surrogate", "nul", "too-long", "too-many-bytes")


def refuses(call: Callable[[], object]) -> bool:
    """Whether ``call`` raises ``ConfigError`` (any other error propagates, so a store that
    fails some other way shows how)."""
    try:
        call()
    except ConfigError:
        return True
    return False


class LeasingStore(CheckpointStore, LeaseStore, Protocol):
    """A checkpoint store that leases runs: what the lease tests run on."""

    def save(self, state: RunState, *, lease: Lease | None = None) -> Lease | None: ...

    def create(self, state: RunState, *, lease: Lease | None = None) -> bool: ...

    def journal(self, run_id: str, *, lease: Lease | None = None) -> ToolJournal: ...


class ContractClock:
    """A clock that moves only when told: ``clock()`` is unix time, ``advance(s)`` moves it.

    The suite gives one to each store it opens, so timestamps and lease expiry are exact and
    no test waits on the wall clock."""

    __slots__ = ("now",)

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.now = start
        """What the clock reads."""

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        """Move the clock ``seconds`` on."""
        self.now += seconds


def sample_state(run_id: str = "run-1") -> RunState:
    """A run state with something in every field (a custom state's name and ``notes``
    included): a store that loses or changes any part of a run fails to round-trip it."""
    calls = (
        ToolCall(id="c1", name="add", arguments='{"a": 1, "b": 2}'),
        ToolCall(id="c2", name="lookup", arguments="not json"),
        ToolCall(id="c3", name="transfer", arguments='{"amount": 10}'),
    )
    return RunState(
        run_id=run_id,
        state="TRIAGE",
        agent=AgentRecord(
            tools={"add": "0123456789abcdef", "transfer": "fedcba9876543210"},
            system_prompt="00ff00ff00ff00ff",
            table="abcdefabcdefabcd",
            approval=("transfer",),
        ),  # a CustomState of the user's table: stored by name
        notes={"plan": ["look", "pay"], "nested": {"n": 1.5, "none": None, "ok": True}},
        turns=3,
        retries=2,
        turn_retries=1,
        turn_retry_wait_s=0.25,
        usage=Usage(
            input_tokens=120,
            output_tokens=45,
            cached_tokens=20,
            reasoning_tokens=5,
            requests=3,
            estimated=True,
        ),
        cost=0.0125,
        messages=[
            SystemMessage(content="be brief"),
            UserMessage(content="add 1 and 2, then pay — ünïcode ✓"),
            AssistantMessage(
                content="Let me check.",
                tool_calls=calls,
                provider_data={"reasoning": [{"id": "rs_1", "encrypted": "xyz"}]},
            ),
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
        follow_ups=["one more thing"],
        prompt_tokens_estimate=321,
        tools_tokens_estimate=64,
        reported_prompt_tokens=300,
        estimated_prompt_tokens=280,
        calibration=Calibration(pairs=[(280, 300), (400, 420)], fixed=20, per_content=1.0),
        context=ContextEdits(start=1, cleared=frozenset({3}), summary="earlier", latest_input=1),
        summary_due=SummaryDue(policy=0, through=2, instructions="summarise", text="..."),
        summarised=True,
        context_problem="the prompt is too big",
        correction="Give the result by calling the `final_result` tool.",
        output_failures=1,
        guardrail_trip=GuardrailTrip(kind="output", guardrail="no_secrets", reason="a key"),
        guardrail_rewrites=1,
        loop_rung=2,
        withheld=("lookup",),
        consecutive_errors=1,
        last_finish_reason=FinishReason.TOOL_CALLS,
        last_tool_calls=3,
        model_failure=ModelFailure(message="rate limited", permanent=False, retry_after_s=2.5),
        requests=[
            ControlRequest(kind=ControlKind.FINISH_TASK, text="done", tool_call_id="c1"),
            ControlRequest(
                kind=ControlKind.APPROVAL,
                text="approve the transfer?",
                tool_call_id="c3",
                pending_calls=(calls[2],),
            ),
        ],
        control=ControlRequest(
            kind=ControlKind.APPROVAL,
            text="approve the transfer?",
            tool_call_id="c3",
            pending_calls=(calls[2],),
        ),
        decisions=[Decision(call=calls[2], approval=Approval(allow=False, reason="too much"))],
        parent=ParentLink(run_id="parent-run", tool_call_id="p7", tool="research"),
        awaiting_child=ControlRequest(
            kind=ControlKind.SUB_AGENT,
            text="Which city?",
            tool_call_id="c9",
            sub_agent=SubAgentPause(
                run_id="child-run",
                tool="research",
                asks=ControlKind.ASK_USER,
                pause="pause-2",
                counted={"turns": 1},
            ),
        ),
        child_reply="Lyon",
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
        closing=StopReason.MAX_TURNS,
        last_answers=1,
        elapsed_s=12.375,
        timed_out=True,
        resumed_at=[2],
        abort_reason="user pressed stop",
        output="approve the transfer?",
        output_incomplete=True,
        error="partial",
        stop_reason=StopReason.APPROVAL_REQUIRED,
        trace=[(0, 0), (1, 1), (2, 1), (3, 1), (0, 1), (1, 2)],
    )


def add_turn(state: RunState, n: int) -> None:
    """One more tool-calling turn, as the engine leaves it: a reply with a call, its result,
    four transitions, and the usage and counters that go with them."""
    state.turns += 1
    call = ToolCall(id=f"t{n}", name="echo", arguments=f'{{"n": {n}}}')
    state.messages.append(AssistantMessage(tool_calls=(call,)))
    state.messages.append(ToolMessage(tool_call_id=call.id, name="echo", content=str(n)))
    state.trace.extend((row, state.turns) for row in (0, 1, 2, 3))
    state.usage = state.usage + Usage(input_tokens=10, output_tokens=n, requests=1)
    state.loop.recent_calls.append(f"echo:{n}")


class StoreContractBase:
    """Opens the stores under test: subclass ``CheckpointStoreContract``, not this."""

    shares_storage: ClassVar[bool] = False
    """True when every ``make_store`` call of one test opens the same storage, as another
    process (or worker) would: the suite then checks several stores on one storage."""
    timestamps_from_clock: ClassVar[bool] = True
    """``created_at``/``updated_at`` are the given clock's readings (else the suite checks
    only their order)."""
    leases_from_clock: ClassVar[bool] = True
    """Lease expiry follows the given clock. False for a store that reads the time
    elsewhere (PostgresStore reads the database server's): the suite then waits for short
    leases to expire on the wall clock."""

    clock: ContractClock
    """The clock of this test's stores."""
    tmp_path: Path
    """A directory of this test's own (pytest's ``tmp_path``), for a store that keeps files."""

    def make_store(self, clock: Callable[[], float]) -> CheckpointStore:
        """A store for this test, reading the time from ``clock`` (unix seconds). The first
        call of a test gets an empty storage; with ``shares_storage``, later calls of the
        same test open that same storage again. The suite closes each store it got."""
        raise NotImplementedError(
            f"{type(self).__name__} must define make_store(self, clock) -> CheckpointStore"
        )

    @pytest.fixture(autouse=True)
    def _contract_stores(self, tmp_path: Path) -> Iterator[None]:
        self.clock = ContractClock()
        self.tmp_path = tmp_path
        self._opened: list[CheckpointStore] = []
        yield
        for store in reversed(self._opened):
            store.close()

    def open_store(self) -> CheckpointStore:
        """``make_store``, remembered so that the store is closed after the test."""
        store = self.make_store(self.clock)
        self._opened.append(store)
        return store

    def open_shared(self) -> CheckpointStore:
        """Another store on this test's storage; the test is skipped without one."""
        if not self.shares_storage:
            pytest.skip("the store's storage is not shared (shares_storage = False)")
        return self.open_store()

    def open_leasing(self, *, shared: bool = False) -> LeasingStore:
        """A store that leases runs (``shared``: another on this test's storage); the test
        is skipped for a store that does not."""
        store = self.open_shared() if shared else self.open_store()
        if not isinstance(store, LeaseStore):
            pytest.skip("the store does not lease runs (it is no LeaseStore)")
        return store

    def pass_time(self, seconds: float) -> None:
        """Let ``seconds`` pass for the stores: on their clock, or else on the wall clock."""
        if self.leases_from_clock:
            self.clock.advance(seconds)
        else:
            time.sleep(seconds)

    def let_expire(self, store: LeaseStore, lease: Lease) -> None:
        """Let ``lease`` run out (nobody renews it), by the store's clock."""
        if self.leases_from_clock:
            self.clock.advance(lease.ttl_s + 1.0)
            return
        time.sleep(lease.ttl_s)
        for _ in range(200):  # a slow machine: the server's clock is a little behind ours
            if store.lease(lease.run_id) is None:
                return
            time.sleep(0.05)
        raise AssertionError(f"the lease of run {lease.run_id!r} never expired: {lease}")

    @property
    def expiring_ttl_s(self) -> float:
        """The ttl of a lease a test lets expire: short when expiry is on the wall clock."""
        return 30.0 if self.leases_from_clock else 0.2
