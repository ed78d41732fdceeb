"""DBOS tool calls made without a step (``agent_fsm.dbos.tool_calls``): the journal's entry
stands for the step's record, and every path a replay can meet takes the same turn as the
first execution did, with the same answers and the same clock.

Crashes are made as the other DBOS tests make them: ``DBOS.fork_workflow_async`` runs the
workflow again from a step, the records of that step and of every later one left out (as if
the worker had died there), while the journal keeps what the first execution wrote.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("psycopg")
pytest.importorskip("dbos")

from dbos import DBOS
from psycopg import sql

from agent_fsm import Agent, CheckpointError, Limits, StopReason, tool
from agent_fsm.dbos import DBOSAgent
from agent_fsm.dbos.liveness import Admission
from agent_fsm.dbos.pausing import SAVE_STEP
from agent_fsm.dbos.replay import CANCEL_CALL, CANCEL_KEY, MODEL_STEP, TOOL_STEP
from agent_fsm.durable.postgres import PostgresStore
from agent_fsm.durable.postgres_journal import PostgresJournal
from agent_fsm.failures import describe
from agent_fsm.messages import ModelRequest, ModelResponse, ToolCall, ToolMessage, ToolStatus
from agent_fsm.state import RunResult
from agent_fsm.testing import FunctionModel, call, reply
from agent_fsm.testing.invariants import check_invariants
from tests.dbos_worker import launched
from tests.test_dbos import FAST, Tools, durable, replay, same_run, step_names, two_turns
from tests.test_dbos_journal import UNKNOWN, Journal

pytestmark = pytest.mark.slow  # real processes or servers: make check leaves it out


@pytest.fixture(scope="module")
def dbos_schema(postgres_url: str) -> Iterator[str]:
    with launched(postgres_url, "agent_fsm_unstepped") as schema:
        yield schema


@pytest.fixture
def journal(dbos_schema: str, postgres_url: str, postgres_schema: str) -> Iterator[Journal]:
    with Journal(postgres_url, postgres_schema) as found:
        yield found


def entries(journal: Journal, run_id: str) -> dict[str, str]:
    """The run's journal, key by key: each entry's status (the cancel request's too)."""
    rows = journal.admin.execute(
        sql.SQL("SELECT key, status FROM {} WHERE run_id = %s").format(journal.table), (run_id,)
    )
    return dict(rows)


def sequential(store: PostgresStore, model: Any, tools: list[Any], **limits: Any) -> DBOSAgent:
    """A DBOSAgent whose calls of one reply run one after another."""
    agent = Agent(
        model=model if isinstance(model, FunctionModel) else FunctionModel(model),
        tools=tools,
        limits=Limits(loop_detection=False, **limits),
        parallel_tool_calls=False,
    )
    return DBOSAgent(agent, journal=store, name=uuid.uuid4().hex, queue=FAST)


def answers(result: RunResult) -> list[ToolMessage]:
    return [m for m in result.messages if isinstance(m, ToolMessage)]


def cancelling_send(journal: Journal, run_id: str, at: int, reason: str) -> tuple[Any, list[int]]:
    """A ``send`` tool, and the steps it sent: its call of step ``at`` records a cancel
    request of the run (as ``cancel_run`` does) while it runs."""
    request = ToolCall(id=CANCEL_KEY, name=CANCEL_CALL, arguments=json.dumps({"reason": reason}))
    sent: list[int] = []

    @tool
    async def send(step: int) -> str:
        """Send the message of one step."""
        sent.append(step)
        if step == at:
            journal.store.journal(run_id).record_started(CANCEL_KEY, request)
        return f"sent {step}"

    return send, sent


async def aborted(agent: DBOSAgent, prompt: str, run_id: str, reason: str) -> RunResult:
    """The run of ``prompt``, checked valid and aborted for ``reason``."""
    result = await agent.run(prompt, run_id=run_id)
    check_invariants(result, limits=agent.agent.limits, bound=agent.agent.bound)
    assert result.stop_reason is StopReason.ABORTED
    assert reason in (result.error or "")
    return result


async def fork(run_id: str, step: int) -> RunResult:
    """The run's workflow again from ``step`` on (the records of it and of the later steps
    lost), as after a crash there."""
    return await (await DBOS.fork_workflow_async(run_id, step)).get_result()


async def test_a_run_makes_no_step_and_a_replay_meets_the_same_keys(journal: Journal) -> None:
    """Each model and tool call is one journal entry, keyed by its number in the activation,
    and no step; a replay of the whole run (a crash after its end) reaches the same keys,
    answers every call from them, calls neither the model nor a tool, and writes nothing."""
    tools = Tools()
    model = FunctionModel(two_turns)
    agent = durable(journal.store, model, tools)
    first = await agent.run("Do it.", run_id="keys-1")
    assert await step_names("keys-1") == []
    written = entries(journal, "keys-1")
    assert written == {f"call:{n}": "finished" for n in range(4)} | {
        f"model:{n}": "outcome" for n in range(3)
    }
    calls = len(model.requests)
    replayed = await fork("keys-1", 1)
    same_run(replayed, first)
    assert entries(journal, "keys-1") == written
    assert (tools.sent, tools.looked_up, len(model.requests)) == ([1, 2], [1, 2], calls)


async def test_a_replay_after_the_end_reads_the_recorded_clock(
    journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The call's end time is recorded with its answer: a replay made after the run's time
    limit has passed (a crash after the end) reads the clock the first execution read after
    the call, and takes the same path, where a time read afresh would stop the run on
    ``timeout`` (and meet the next recorded step where it has none). The fleet's clock is
    moved past the limit rather than waited for: the first run has all the time it needs."""

    @tool
    async def send(step: int) -> str:
        """Send the message of one step."""
        await asyncio.sleep(0.1)
        return f"sent {step}"

    def send_then_ask(request: ModelRequest) -> ModelResponse:
        if any(isinstance(m, ToolMessage) for m in request.messages):
            return reply("", call("ask_user", question="Anything else?"))
        return reply("", call("send", step=1))

    agent = sequential(journal.store, send_then_ask, [send], timeout_s=60.0)
    paused = await agent.run("Send it.", run_id="clock-1")
    assert paused.stop_reason is StopReason.ASK_USER
    assert await step_names("clock-1") == [SAVE_STEP]
    fleet_now = Admission.now
    monkeypatch.setattr(Admission, "now", lambda self: fleet_now(self) + 120.0)  # limit passed
    same_run(await replay("clock-1"), paused)


@pytest.mark.parametrize(("held", "runs_again"), [("send", False), ("lookup", True)])
async def test_a_crash_between_the_start_and_the_end_is_answered_by_a_step(
    journal: Journal, held: str, runs_again: bool
) -> None:
    """The worker dies mid-call: the entry says "started". The replay makes the call as a
    step, which answers "outcome unknown" (``send``) or runs it again (``lookup``, which is
    idempotent). The first execution, going on afterwards, finds the end the replay
    recorded (the first end wins) and says the same for ``send``: it is not sent twice."""
    tools = Tools()
    tools.hold = asyncio.Event()
    arguments = {"step": 1} if held == "send" else {"key": 1}

    def model(request: ModelRequest) -> ModelResponse:
        if any(isinstance(m, ToolMessage) for m in request.messages):
            return reply("done")
        return reply("", call(held, **arguments))

    run_id = f"mid-{held}-{uuid.uuid4().hex[:6]}"
    agent = durable(journal.store, model, tools)
    crashed = asyncio.create_task(agent.run("Do it.", run_id=run_id))
    await tools.entered.wait()
    assert entries(journal, run_id) == {"model:0": "outcome", "call:0": "started"}
    assert await step_names(run_id) == []  # the call in flight is no step
    hold, tools.hold = tools.hold, None  # the replay's call, if any, returns at once
    forked = await DBOS.fork_workflow_async(run_id, 1)
    result = await forked.get_result()
    made_as = TOOL_STEP + held + "#0"
    assert await step_names(forked.get_workflow_id()) == [made_as]
    answer = answers(result)[0]
    executions = tools.sent if held == "send" else tools.looked_up
    if runs_again:
        assert (answer.content, executions) == ("1", [1, 1])
    else:
        assert UNKNOWN in answer.content
        assert answer.details == {"runtime": {"outcome_unknown": True}}
        assert executions == [1]
    assert result.output == "done"
    check_invariants(result, limits=agent.agent.limits, bound=agent.agent.bound)

    hold.set()  # the first execution goes on: its end is not recorded over the replay's
    finished = await crashed
    assert finished.output == "done"
    own = answers(finished)[0]
    if not runs_again:
        assert UNKNOWN in own.content
        assert tools.sent == [1]
    assert entries(journal, run_id) == {
        "model:0": "outcome",
        "call:0": "finished",
        "model:1": "outcome",
    }


async def test_a_cancel_made_during_a_call_without_a_step_stops_the_next_call(
    journal: Journal,
) -> None:
    """A call made without a step reads no cancel request after it: the request made during
    it is read by the next call's start, which then makes that call a step that answers it
    "not run", and the run is aborted before any other model call; a replay takes the same
    path although the request is gone."""
    run_id = f"cancel-{uuid.uuid4().hex[:8]}"
    send, sent = cancelling_send(journal, run_id, at=1, reason="stop now")

    def two_sends(request: ModelRequest) -> ModelResponse:
        if any(isinstance(m, ToolMessage) for m in request.messages):
            return reply("done")
        return reply("", call("send", step=1), call("send", step=2))

    model = FunctionModel(two_sends)
    agent = sequential(journal.store, model, [send])
    result = await aborted(agent, "Send two.", run_id, "stop now")
    first, second = answers(result)
    assert (first.content, first.status) == ("sent 1", ToolStatus.OK)
    assert "was not run: the run was cancelled" in second.content
    assert (sent, len(model.requests)) == ([1], 1)
    steps = await step_names(run_id)
    assert steps[:1] == [TOOL_STEP + "send#1"]

    journal.admin.execute(
        sql.SQL("DELETE FROM {} WHERE run_id = %s AND key = %s").format(journal.table),
        (run_id, CANCEL_KEY),
    )
    same_run(await replay(run_id), result)
    assert (sent, len(model.requests)) == ([1], 1)


async def test_a_call_the_deadline_cuts_records_the_cut_and_the_next_is_a_step(
    journal: Journal,
) -> None:
    """The deadline cuts the first call, made without a step: its entry records the cut, so
    the clock reads the time limit on every execution. The second call starts after the
    deadline: no call starts, and its answer is a step's. A replay from the first call on
    gives the same run and starts nothing."""
    sent: list[int] = []

    @tool
    async def send(step: int) -> str:
        """Send the message of one step."""
        sent.append(step)
        await asyncio.sleep(3600)  # until the deadline cuts it
        return f"sent {step}"

    def two_sends(request: ModelRequest) -> ModelResponse:
        return reply("", call("send", step=1), call("send", step=2))

    run_id = f"deadline-{uuid.uuid4().hex[:8]}"
    # A limit the first model step is sure to meet even on a loaded machine: the call must
    # start before it (and is cut by it), the second must not.
    agent = sequential(journal.store, two_sends, [send], timeout_s=10.0)
    result = await agent.run("Send two.", run_id=run_id)
    check_invariants(result, limits=agent.agent.limits, bound=agent.agent.bound)
    assert result.stop_reason is StopReason.TIMEOUT
    first, second = answers(result)
    assert "cancelled because the run was stopped" in first.content
    assert "cancelled because the run was stopped" in second.content
    assert sent == [1]
    assert (await step_names(run_id))[:1] == [TOOL_STEP + "send#1"]
    assert entries(journal, run_id) == {"model:0": "outcome", "call:0": "finished"}
    same_run(await fork(run_id, 1), result)
    assert sent == [1]


@pytest.mark.parametrize("failure", ["refused start", "unread", "unrecorded end"])
async def test_a_journal_failure_makes_the_call_a_step_that_a_replay_takes_too(
    journal: Journal, failure: str
) -> None:
    """The journal fails on the way without a step (its start refused, its entry unread,
    its end unrecorded): the call is answered by a step, as before ("not run", "outcome
    unknown", "outcome unknown"). A replay, the journal healthy again and its entry absent
    or "started", finds the step's record by its name and takes the same path: nothing is
    sent, or sent again."""
    run_id = f"failing-{uuid.uuid4().hex[:8]}"
    sent: list[int] = []
    breaks = {
        "refused start": journal.refuse_writes,
        "unread": journal.hide,
        "unrecorded end": journal.refuse_writes,
    }[failure]

    @tool
    async def send(step: int) -> str:
        """Send the message of one step."""
        sent.append(step)
        if failure == "unrecorded end":
            await asyncio.to_thread(breaks)
        return f"sent {step}"

    def one_send(request: ModelRequest) -> ModelResponse:
        if any(isinstance(m, ToolMessage) for m in request.messages):
            journal.restore()
            return reply("done")
        if failure != "unrecorded end":
            breaks()
        return reply("", call("send", step=1))

    agent = durable(journal.store, one_send, [send])
    result = await agent.run("Send it.", run_id=run_id)
    check_invariants(result, limits=agent.agent.limits, bound=agent.agent.bound)
    answer = answers(result)[0]
    if failure == "refused start":
        assert "its start could not be recorded in the journal" in answer.content
        assert sent == []
    else:
        assert UNKNOWN in answer.content
        assert sent == ([] if failure == "unread" else [1])
    made = list(sent)
    # The journal broken during the first model call (in the model): its outcome is
    # recorded by a step, numbered as the call is; the second is kept in the journal.
    model_step = [] if failure == "unrecorded end" else [MODEL_STEP + "#0"]
    assert await step_names(run_id) == [*model_step, TOOL_STEP + "send#0"]
    same_run(await replay(run_id), result)
    assert sent == made


async def test_parallel_calls_take_their_steps_in_the_order_of_their_numbers(
    journal: Journal,
) -> None:
    """Two calls of one reply run at once, and neither end can be recorded: the second ends
    first, yet its step waits for the first call's (``RunTime.wait_turn``), so DBOS numbers
    them as a replay, which takes them in call order, meets them."""
    run_id = f"parallel-{uuid.uuid4().hex[:8]}"
    sent: list[int] = []
    second_done = asyncio.Event()

    @tool
    async def send(step: int) -> str:
        """Send the message of one step."""
        sent.append(step)
        if step == 1:
            await second_done.wait()
        else:
            await asyncio.to_thread(journal.refuse_writes)
            second_done.set()
        return f"sent {step}"

    def two_sends(request: ModelRequest) -> ModelResponse:
        if any(isinstance(m, ToolMessage) for m in request.messages):
            journal.restore()
            return reply("done")
        return reply("", call("send", step=1), call("send", step=2))

    agent = durable(journal.store, two_sends, [send])
    result = await agent.run("Send two.", run_id=run_id)
    check_invariants(result, limits=agent.agent.limits, bound=agent.agent.bound)
    assert [UNKNOWN in m.content for m in answers(result)] == [True, True]
    assert sorted(sent) == [1, 2]
    assert await step_names(run_id) == [TOOL_STEP + "send#0", TOOL_STEP + "send#1"]
    same_run(await replay(run_id), result)
    assert sorted(sent) == [1, 2]


class Blinking:
    """A run's journal that cannot be read or written while ``broken`` is set, counting the
    tries it refused (a journal that keeps a first end: calls are made without a step)."""

    def __init__(self, inner: Any, broken: asyncio.Event | None, refused: list[str]) -> None:
        self._inner, self._broken, self.refused = inner, broken, refused

    def _check(self, what: str) -> None:
        if self._broken is not None and self._broken.is_set():
            self.refused.append(what)
            raise CheckpointError(f"the journal is away ({what})")

    def lookup(self, key: str) -> Any:
        self._check("lookup")
        return self._inner.lookup(key)

    def lookup_or_start(self, key: str, call: ToolCall) -> Any:
        self._check("lookup_or_start")
        return self._inner.lookup_or_start(key, call)

    def record_started(self, key: str, call: ToolCall) -> None:
        self._check("record_started")
        self._inner.record_started(key, call)

    def record_finished(self, key: str, result: ToolMessage) -> None:
        self._check("record_finished")
        self._inner.record_finished(key, result)

    def finish_first(self, key: str, result: ToolMessage) -> Any:
        self._check("finish_first")
        return self._inner.finish_first(key, result)

    def keep_outcome(self, key: str, outcome: str) -> str:
        self._check("keep_outcome")
        kept: str = self._inner.keep_outcome(key, outcome)
        return kept

    def outcome_and_lookup(self, key: str, other: str) -> Any:
        self._check("outcome_and_lookup")
        return self._inner.outcome_and_lookup(key, other)


class BlinkingStore(PostgresStore):
    broken: asyncio.Event | None = None
    refused: list[str]

    def journal(self, run_id: str, *, lease: Any = None) -> Any:
        return Blinking(super().journal(run_id, lease=lease), self.broken, self.refused)


async def test_a_replay_that_cannot_read_the_journal_waits_for_it(
    journal: Journal, postgres_url: str, postgres_schema: str
) -> None:
    """A replay of the whole run, the journal away: the calls were made without a step, and
    a step made for want of an entry could meet a later step's record. The replay reads the
    first model call's outcome again until the journal is back, and gives the same run,
    calling nothing twice."""
    with BlinkingStore(postgres_url, schema=postgres_schema) as store:
        store.refused = []
        tools = Tools()
        agent = durable(store, two_turns, tools)
        first = await agent.run("Do it.", run_id="away-1")
        assert await step_names("away-1") == []
        store.broken = asyncio.Event()
        store.broken.set()
        forked = asyncio.create_task(fork("away-1", 1))
        async with asyncio.timeout(60):
            while len(store.refused) < 4:  # the start and then reads, refused
                await asyncio.sleep(0.05)
        store.broken.clear()
        replayed = await forked
        same_run(replayed, first)
        assert (tools.sent, tools.looked_up) == ([1, 2], [1, 2])


delivered: list[str] = []
"""What ``deliver`` and ``deliver_sync`` did: the effect of a tool's own DBOS step."""


@DBOS.step()
async def deliver(what: str) -> str:
    delivered.append(what)
    return f"delivered {what}"


@DBOS.step()
def deliver_sync(what: str) -> str:
    delivered.append(what)
    return f"delivered {what}"


async def record(what: str) -> str:
    delivered.append(what)
    return f"delivered {what}"


@DBOS.workflow()
async def child_workflow(what: str) -> str:
    delivered.append(what)
    return what


async def use_dbos(how: str, step: int) -> str:
    """A tool's work done with DBOS, ``how``."""
    if how == "step":
        return await deliver(f"step {step}")
    if how == "run_step":
        return await DBOS.run_step_async(None, record, f"run_step {step}")
    if how == "set_event":
        await DBOS.set_event_async("sent", step)
    elif how == "sleep":
        await DBOS.sleep_async(0.01)
    elif how == "start_workflow":
        await DBOS.start_workflow_async(child_workflow, f"child {step}")
    delivered.append(f"{how} {step}")
    return f"sent {step}"


@DBOS.workflow()
async def in_a_real_step(how: str) -> str:
    """What ``use_dbos`` fails with when a DBOS step of a workflow runs it."""
    try:
        await DBOS.run_step_async(None, use_dbos, how, 1)
    except Exception as exc:
        return describe(exc)
    return "no failure"


def uses_dbos(how: str) -> Any:
    """A ``send`` tool that does its work with DBOS, ``how``."""
    if how == "sync step":

        @tool(name="send")
        def send_sync(step: int) -> str:
            """Send the message of one step."""
            return deliver_sync(f"sync {step}")

        return send_sync

    @tool
    async def send(step: int) -> str:
        """Send the message of one step."""
        return await use_dbos(how, step)

    return send


def send_once(request: ModelRequest) -> ModelResponse:
    if any(isinstance(m, ToolMessage) for m in request.messages):
        return reply("done")
    return reply("", call("send", step=1))


async def replayed_use_of_dbos(journal: Journal, how: str) -> tuple[str, RunResult]:
    """A run whose one call, made without a step, uses DBOS ``how`` (``uses_dbos``), checked
    valid, finished, and given again by a replay of every recorded step: its id and result."""
    delivered.clear()
    run_id = f"dbos-tool-{how.replace(' ', '-')}-{uuid.uuid4().hex[:6]}"
    agent = sequential(journal.store, send_once, [uses_dbos(how)])
    first = await agent.run("Send it.", run_id=run_id)
    check_invariants(first, limits=agent.agent.limits, bound=agent.agent.bound)
    same_run(await replay(run_id), first)
    assert first.output == "done"
    return run_id, first


@pytest.mark.parametrize("how", ["step", "sync step", "run_step", "set_event"])
async def test_a_tool_that_makes_dbos_steps_runs_them_as_in_its_step_and_a_replay_agrees(
    journal: Journal, how: str
) -> None:
    """A tool made without a step that calls a ``@DBOS.step`` function (async, or sync from
    a sync tool on its worker thread), ``DBOS.run_step_async`` or ``DBOS.set_event``: DBOS
    sees the call's step context, so it runs the step as a plain function (and files the
    event as a step's), as it did when the call was a step, and the workflow records no
    step of the tool's. A replay of every recorded step answers the call from the journal
    (no DBOS error), gives the same run, and the effect happened once."""
    run_id, first = await replayed_use_of_dbos(journal, how)
    answer = answers(first)[0]
    assert answer.status is ToolStatus.OK, answer.content
    effect = how.removesuffix(" step") if how == "sync step" else how
    assert delivered == [f"{effect} 1"]
    assert await step_names(run_id) == []
    assert entries(journal, run_id) == {
        "model:0": "outcome",
        "call:0": "finished",
        "model:1": "outcome",
    }
    if how == "set_event":  # filed under the workflow's next step, which a fork from the
        assert await DBOS.get_event_async(run_id, "sent", timeout_seconds=0) == 1
        forked = await DBOS.fork_workflow_async(run_id, 2)  # one after it keeps
        same_run(await forked.get_result(), first)
        assert await DBOS.get_event_async(forked.get_workflow_id(), "sent", timeout_seconds=0) == 1
        assert delivered == ["set_event 1"]


@pytest.mark.parametrize("how", ["sleep", "start_workflow"])
async def test_a_tool_that_does_what_dbos_refuses_in_a_step_is_refused_and_a_replay_agrees(
    journal: Journal, how: str
) -> None:
    """A tool made without a step that calls ``DBOS.sleep`` or starts a workflow: DBOS
    refuses either inside a step, and refuses it in the call's step context too, so the
    tool fails as it did when the call was a step, and nothing takes a place in the
    workflow (no sleep step, no child workflow). A replay of every recorded step gives the
    same run, with no DBOS error."""
    run_id, first = await replayed_use_of_dbos(journal, how)
    answer = answers(first)[0]
    assert answer.status is ToolStatus.ERROR
    refusal = await (await DBOS.start_workflow_async(in_a_real_step, how)).get_result()
    assert refusal.startswith("AssertionError")  # DBOS's refusal inside a step
    assert answer.content == f"Tool 'send' failed: {refusal}"
    assert delivered == []
    assert await step_names(run_id) == []
    assert await DBOS.list_workflows_async(parent_workflow_id=run_id) == []


async def test_parallel_calls_that_make_dbos_steps_each_run_them_as_in_a_step(
    journal: Journal,
) -> None:
    """Two calls of one reply, made at once without a step, each calling a ``@DBOS.step``
    function while the other is in flight: each runs in a step context of its own (its
    task's), neither takes a place in the workflow, and a replay gives the same run with
    each effect once."""
    delivered.clear()
    both_in = asyncio.Event()
    inside: list[int] = []

    @tool
    async def send(step: int) -> str:
        """Send the message of one step."""
        inside.append(step)
        if len(inside) == 2:
            both_in.set()
        await both_in.wait()
        return await deliver(f"step {step}")

    def two_sends(request: ModelRequest) -> ModelResponse:
        if any(isinstance(m, ToolMessage) for m in request.messages):
            return reply("done")
        return reply("", call("send", step=1), call("send", step=2))

    run_id = f"dbos-tool-parallel-{uuid.uuid4().hex[:6]}"
    agent = durable(journal.store, two_sends, [send])
    first = await agent.run("Send two.", run_id=run_id)
    check_invariants(first, limits=agent.agent.limits, bound=agent.agent.bound)
    same_run(await replay(run_id), first)
    assert [m.content for m in answers(first)] == ["delivered step 1", "delivered step 2"]
    assert sorted(delivered) == ["step 1", "step 2"]
    assert await step_names(run_id) == []
    assert entries(journal, run_id) == {
        "model:0": "outcome",
        "call:0": "finished",
        "call:1": "finished",
        "model:1": "outcome",
    }


async def test_a_call_without_a_step_reads_the_cancel_request_with_its_end(
    journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A call made without a step reads the cancel request in the statement recording its
    end, so the model call after it reads nothing itself (a round trip fewer per turn); the
    run's first model call reads it with its look-up of its own outcome. A request made
    during a call is found there and kept by the next model call's outcome, which makes no
    model call: the run stops before its next model call. A replay with the request gone
    takes the same path (the outcome says so); one with that outcome lost answers the call
    from its entry, which read nothing, so the model call reads the request itself, in its
    look-up."""
    run_id = f"heard-{uuid.uuid4().hex[:8]}"
    send, sent = cancelling_send(journal, run_id, at=2, reason="enough")
    reads: list[str] = []
    lookup = PostgresJournal.lookup

    def counted(self: PostgresJournal, key: str) -> Any:
        reads.append(key)
        return lookup(self, key)

    monkeypatch.setattr(PostgresJournal, "lookup", counted)

    def one_send(request: ModelRequest) -> ModelResponse:
        return reply("", call("send", step=request.turn)) if request.turn <= 4 else reply("done")

    model = FunctionModel(one_send)
    agent = sequential(journal.store, model, [send])
    result = await aborted(agent, "Send four.", run_id, "enough")
    assert [m.content for m in answers(result)] == ["sent 1", "sent 2"]
    assert (sent, len(model.requests)) == ([1, 2], 2)
    assert await step_names(run_id) == [SAVE_STEP]
    assert entries(journal, run_id)["model:2"] == "outcome"  # it says: cancelled
    assert reads.count(CANCEL_KEY) == 0  # read with the first outcome's look-up, then ends

    reads.clear()
    journal.admin.execute(
        sql.SQL("DELETE FROM {} WHERE run_id = %s AND key = %s").format(journal.table),
        (run_id, "model:2"),
    )
    same_run(await fork(run_id, 1), result)  # the third model call's outcome lost
    assert (sent, len(model.requests)) == ([1, 2], 2)
    assert reads.count(CANCEL_KEY) == 0  # that call read it in its look-up
    assert entries(journal, run_id)["model:2"] == "outcome"  # kept again

    journal.admin.execute(
        sql.SQL("DELETE FROM {} WHERE run_id = %s AND key = %s").format(journal.table),
        (run_id, CANCEL_KEY),
    )
    same_run(await replay(run_id), result)
    assert (sent, len(model.requests)) == ([1, 2], 2)
