"""One seam for where a run lives (issue 32): the engine drives a run through its keeper
(``run.residence.RunKeeper``) and asks nothing about where the run lives; the agent gets
keepers from its residence. A keeper of the test's own sees every call the engine makes."""

from __future__ import annotations

import ast
import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from agent_fsm import (
    Agent,
    AgentState,
    Limits,
    MemoryStore,
    ResumeError,
    SQLiteStore,
    StopReason,
    tool,
)
from agent_fsm.durable.journal import MemoryJournal, ToolJournal
from agent_fsm.run.context import RunConfig
from agent_fsm.run.engine import Run, new_run_state
from agent_fsm.run.residence import InProcess, Residence, RunKeeper, Timekeeping
from agent_fsm.run.stored import Leased, Stored
from agent_fsm.state import RunState, TraceEntry
from agent_fsm.table import TERMINAL_STATES
from agent_fsm.testing import ScriptedModel, call, check_invariants, reply

ENGINE = Path(__file__).resolve().parent.parent / "agent_fsm" / "run" / "engine.py"


@tool
def echo(text: str) -> str:
    """Echo the text."""
    return text


class Notebook:
    """A keeper that keeps the run in a list of snapshots and writes down every call."""

    def __init__(self, refuse_stop: bool = False) -> None:
        self.time = Timekeeping()
        self.journal: ToolJournal | None = MemoryJournal()
        self.calls: list[str] = []
        self.snapshots: list[tuple[str, int]] = []
        self.refuse_stop = refuse_stop

    def activated(self, abort: Callable[[str], None]) -> None:
        self.calls.append("activated")

    def claim_stop(self, state: RunState) -> None:
        self.calls.append("claim_stop")
        if self.refuse_stop:
            raise ResumeError("another copy went on")

    async def _during(self, work: Awaitable[None]) -> None:
        self.calls.append("during")
        await work

    def during(self, work: Awaitable[None]) -> Awaitable[None]:
        return self._during(work)

    def saved(self, state: RunState) -> None:
        self.calls.append("saved")
        self.snapshots.append((str(state.state), len(state.trace)))

    def stopped(self, state: RunState, stop_reason: StopReason, resumable: bool) -> None:
        self.calls.append(f"stopped {stop_reason.value} resumable={resumable}")

    def release(self) -> None:
        self.calls.append("release")


def saved_with_next_step_entry(entry: TraceEntry) -> bool:
    return (entry.source, entry.dest) == (AgentState.REFLECT, AgentState.OBSERVE)


def _agent(script: list[object], **more: object) -> Agent:
    return Agent(model=ScriptedModel(script), tools=[echo], limits=Limits(max_turns=5), **more)  # type: ignore[arg-type]


def test_the_engine_saves_through_its_keeper_after_every_step() -> None:
    agent = _agent([reply("", call("echo", text="a")), "done"])
    keeper = Notebook()
    assert isinstance(keeper, RunKeeper)
    config = agent.run_config
    state = new_run_state("r1", "", "Go.", config.tools_tokens)
    result = asyncio.run(Run(config, state, keeper).run())
    assert result.stop_reason is StopReason.FINAL_ANSWER
    # OBSERVE THINK ACT REFLECT OBSERVE THINK DONE: every transition but the last is saved,
    # except the turn's end that goes on (REFLECT -> OBSERVE), saved with the next step
    saved = [(i, e) for i, e in enumerate(result.trace[:-1]) if not saved_with_next_step_entry(e)]
    assert len(saved) == len(result.trace) - 2
    assert [c for c in keeper.calls if c != "during"] == [
        "activated",
        *["saved"] * len(saved),
        "stopped final_answer resumable=False",
        "release",
    ]
    # the work that awaits (the model call, the tool calls) is awaited through the keeper
    awaited = [e for e in result.trace if e.source in (AgentState.THINK, AgentState.ACT)]
    assert keeper.calls.count("during") == len(awaited) == 3
    # each save sees the run as the transition left it
    assert keeper.snapshots == [(str(e.dest), i + 1) for i, e in saved]
    check_invariants(result, limits=agent.limits, bound=agent.bound)


def test_a_reopened_run_asks_its_keeper_before_its_resume_row() -> None:
    agent = _agent([reply("", call("ask_user", question="Which city?")), "Sunny."])
    paused = agent.run_sync("Weather?")
    stored = agent.checkpoints.load(paused.run_id)
    config = agent.run_config
    refusing = Notebook(refuse_stop=True)
    run = Run(config, stored, refusing, resumed="reply")
    with pytest.raises(ResumeError, match="another copy went on"):
        asyncio.run(run.step())
    assert refusing.calls == ["claim_stop"]
    assert stored.state in TERMINAL_STATES  # the run did not move
    assert len(stored.trace) == len(paused.trace)


def test_the_engine_names_no_storage_mode() -> None:
    """Nothing in the step loop's code says where a run lives (docstrings aside)."""
    tree = ast.parse(ENGINE.read_text())
    names = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    names |= {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    names |= {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    storage = {
        "store",
        "leases",
        "lease",
        "in_process",
        "checkpoint_every_transition",
        "lease_s",
        "worker_id",
        "RunLease",
        "CheckpointStore",
        "LeaseStore",
        "MemoryStore",
        "_save",
        "_checkpoint_final",
        "_claim_the_stop",
    }
    assert not names & storage


def test_run_config_is_what_the_agent_is() -> None:
    fields = {f.name for f in dataclasses.fields(RunConfig)}
    where = {"store", "leases", "lease_s", "worker_id", "in_process", "clock", "sleep"}
    assert not fields & where
    assert {"model", "tools", "limits", "machine", "context_policies", "hooks"} <= fields


def test_each_agent_gets_the_residence_its_options_ask_for(tmp_path: Path) -> None:
    assert isinstance(_agent([]).residence, InProcess)
    with SQLiteStore(tmp_path / "runs.sqlite3") as store:
        assert isinstance(_agent([], store=store).residence, Stored)
        assert isinstance(_agent([], store=store, lease_s=30).residence, Leased)
    for residence in (
        _agent([]).residence,
        Stored(MemoryStore()),
        Leased(MemoryStore(), ttl_s=5, worker_id="w"),
    ):
        assert isinstance(residence, Residence)


def test_the_agents_clock_and_sleep_are_its_runs_time() -> None:
    waited: list[float] = []

    async def sleep(seconds: float) -> None:
        waited.append(seconds)

    now = [100.0]
    agent = _agent(
        [ConnectionError("reset"), "done"],
        clock=lambda: now[0],
        sleep=sleep,
    )
    assert agent.residence.time.clock() == 100.0
    result = agent.run_sync("Go.")
    assert (result.stop_reason, result.retries) == (StopReason.FINAL_ANSWER, 1)
    assert len(waited) == 1  # the retry's backoff went through the agent's sleep
