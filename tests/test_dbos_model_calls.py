"""DBOS model calls made without a step (``agent_fsm.dbos.model_calls``): each call's outcome
is kept in the run's journal (``model:N``), first one kept wins, and a replay answers the
call from it without calling the model.

Crashes are made as the other DBOS tests make them (``DBOS.fork_workflow_async``: the run's
workflow again from a step, the records from that step on left out), with the journal rows
a crash would not have written deleted by hand.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

pytest.importorskip("psycopg")
pytest.importorskip("dbos")

from dbos import DBOS
from psycopg import sql

from agent_fsm import StopReason
from agent_fsm.dbos import model_calls
from agent_fsm.dbos.replay import MODEL_STEP
from agent_fsm.dbos.replies import Replied, from_json, to_json
from agent_fsm.durable.journal import CallStatus, JournalEntry, MemoryJournal, OutcomeJournal
from agent_fsm.durable.postgres import PostgresStore
from agent_fsm.messages import ModelRequest, ModelResponse, ToolCall, ToolMessage
from agent_fsm.state import ModelFailure
from agent_fsm.testing import FunctionModel, call, reply
from agent_fsm.testing.invariants import check_invariants
from tests.dbos_worker import launched
from tests.test_dbos import Tools, durable, replay, same_run, step_names
from tests.test_dbos_journal import Journal
from tests.test_dbos_unstepped import entries, fork

pytestmark = pytest.mark.slow  # real processes or servers: make check leaves it out


@pytest.fixture(scope="module")
def dbos_schema(postgres_url: str) -> Iterator[str]:
    with launched(postgres_url, "agent_fsm_model_calls") as schema:
        yield schema


@pytest.fixture
def journal(dbos_schema: str, postgres_url: str, postgres_schema: str) -> Iterator[Journal]:
    with Journal(postgres_url, postgres_schema) as found:
        yield found


def kept(journal: Journal, run_id: str, number: int) -> Replied:
    """The outcome of model call ``number`` kept in the run's journal."""
    outcomes = journal.store.journal(run_id)
    assert isinstance(outcomes, OutcomeJournal)
    text = outcomes.outcome_and_lookup(f"model:{number}", "cancel")[0]
    assert text is not None
    return from_json(text)


def forget(journal: Journal, run_id: str, *keys: str) -> None:
    """Delete the journal rows of ``keys``: what a crash before they were written leaves."""
    journal.admin.execute(
        sql.SQL("DELETE FROM {} WHERE run_id = %s AND key = ANY(%s)").format(journal.table),
        (run_id, list(keys)),
    )


def looks_up_then(answer: Callable[[], str]) -> Callable[[ModelRequest], ModelResponse]:
    """A model that asks for one ``lookup`` (idempotent), then replies ``answer()``."""

    def decide(request: ModelRequest) -> ModelResponse:
        if any(isinstance(m, ToolMessage) for m in request.messages):
            return reply(answer())
        return reply("", call("lookup", key=1))

    return decide


lookup_then_answer = looks_up_then(lambda: "done")
"""One ``lookup``, then "done": a function of the transcript."""


async def test_a_model_call_makes_no_step_and_keeps_its_outcome_in_the_journal(
    journal: Journal,
) -> None:
    """Each model call keeps its outcome under ``model:N`` (the reply, when it ended, and on
    the first the activation's start) and takes no DBOS step: a DBOS step costs two
    transactions and most of a DBOS run's CPU. Made as a step, the run had one per call."""
    model = FunctionModel(lookup_then_answer)
    agent = durable(journal.store, model, Tools())
    result = await agent.run("Look it up.", run_id=f"kept-{uuid.uuid4().hex[:8]}")
    check_invariants(result, limits=agent.agent.limits, bound=agent.agent.bound)
    assert result.output == "done"
    assert await step_names(result.run_id) == []
    assert entries(journal, result.run_id) == {
        "model:0": "outcome",
        "call:0": "finished",
        "model:1": "outcome",
    }
    first, second = kept(journal, result.run_id, 0), kept(journal, result.run_id, 1)
    assert first.response is not None
    assert [c.name for c in first.response.message.tool_calls] == ["lookup"]
    assert first.began_at is not None
    assert second.began_at is None
    assert first.began_at <= first.ended_at <= second.ended_at
    assert second.response is not None
    assert second.response.message.content == "done"


async def test_a_replay_answers_each_model_call_from_its_outcome_without_calling_the_model(
    journal: Journal,
) -> None:
    """A replay of the whole run (every DBOS record lost but the journal's) calls neither
    the model nor a tool: a model replying otherwise the second time changes nothing."""
    replies = itertools.count()
    tools = Tools()
    model = FunctionModel(looks_up_then(lambda: f"done {next(replies)}"))
    agent = durable(journal.store, model, tools)
    run_id = f"replayed-{uuid.uuid4().hex[:8]}"
    first = await agent.run("Look it up.", run_id=run_id)
    assert first.output == "done 0"
    calls = len(model.requests)
    same_run(await fork(run_id, 1), first)
    assert (len(model.requests), tools.looked_up) == (calls, [1])


@pytest.mark.parametrize("same_reply", [True, False])
async def test_a_crash_between_the_reply_and_its_outcome_calls_the_model_again(
    journal: Journal, same_reply: bool
) -> None:
    """The worker dies after the model replied, before its outcome was kept: the replay
    finds no outcome and calls the model again (as a step would be called again), and the
    run it makes is valid, whatever the model answers this time."""
    replies = itertools.count()
    tools = Tools()
    model = FunctionModel(looks_up_then(lambda: "done" if same_reply else f"done {next(replies)}"))
    agent = durable(journal.store, model, tools)
    run_id = f"lost-{uuid.uuid4().hex[:8]}"
    first = await agent.run("Look it up.", run_id=run_id)
    calls = len(model.requests)
    forget(journal, run_id, "model:1")  # the crash came before it was written
    replayed = await fork(run_id, 1)
    check_invariants(replayed, limits=agent.agent.limits, bound=agent.agent.bound)
    assert len(model.requests) == calls + 1  # the second call only: the first was kept
    assert tools.looked_up == [1]  # answered from the journal
    if same_reply:
        same_run(replayed, first)
    else:
        assert (first.output, replayed.output) == ("done 0", "done 1")
    reply_kept = kept(journal, run_id, 1).response  # kept by the replay, this time
    assert reply_kept is not None
    assert reply_kept.message.content == replayed.output


async def test_a_second_execution_racing_the_first_adopts_the_outcome_kept_first(
    journal: Journal,
) -> None:
    """Two executions of one run at once (a worker taken for dead that goes on): the
    second one's model call replies first and keeps its outcome; the first one's reply,
    coming later, is not kept, and the first execution goes on with the kept one, so both
    end the same (the first end wins)."""
    held = asyncio.Event()
    released = asyncio.Event()
    answers = iter(["the first's", "the second's"])

    async def racing(request: ModelRequest) -> ModelResponse:
        mine = next(answers, "again")
        if mine == "the first's":
            held.set()
            await released.wait()
        return reply(mine)

    model = FunctionModel(racing)
    agent = durable(journal.store, model, [])
    run_id = f"race-{uuid.uuid4().hex[:8]}"
    first = asyncio.create_task(agent.run("Answer.", run_id=run_id))
    await held.wait()  # the first execution is inside its model call
    second = await fork(run_id, 1)
    assert second.output == "the second's"
    released.set()
    ended = await first
    check_invariants(ended, limits=agent.agent.limits, bound=agent.agent.bound)
    assert ended.output == "the second's"
    same_run(ended, second)
    assert len(model.requests) == 2
    reply_kept = kept(journal, run_id, 0).response
    assert reply_kept is not None
    assert reply_kept.message.content == "the second's"


async def test_a_model_call_the_deadline_cuts_keeps_the_cut_and_a_replay_reads_it(
    journal: Journal,
) -> None:
    """Each model call made without a step still keeps the run's deadline: the call is
    cut at ``timeout_s``, the cut is kept as its outcome, and a replay made long after (the
    fleet's clock well past the limit) reads the cut and ends the same, calling nothing."""
    never = asyncio.Event()

    async def hangs(request: ModelRequest) -> ModelResponse:
        await never.wait()
        return reply("too late")

    model = FunctionModel(hangs)
    agent = durable(journal.store, model, [], timeout_s=0.3)
    run_id = f"cut-{uuid.uuid4().hex[:8]}"
    first = await agent.run("Answer.", run_id=run_id)
    assert first.stop_reason is StopReason.TIMEOUT
    assert first.error == "timed out after 0.3 s (limit 0.3 s)"
    check_invariants(first, limits=agent.agent.limits, bound=agent.agent.bound)
    assert kept(journal, run_id, 0).cut
    calls = len(model.requests)
    steps = len(await step_names(run_id))
    replayed = await (await DBOS.fork_workflow_async(run_id, steps + 1)).get_result()
    same_run(replayed, first)
    assert len(model.requests) == calls


class ToolCallsOnly:
    """A run's journal that keeps tool calls (a first end too) but no outcomes."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def lookup(self, key: str) -> Any:
        return self._inner.lookup(key)

    def lookup_or_start(self, key: str, call: ToolCall) -> Any:
        return self._inner.lookup_or_start(key, call)

    def record_started(self, key: str, call: ToolCall) -> None:
        self._inner.record_started(key, call)

    def record_finished(self, key: str, result: ToolMessage) -> None:
        self._inner.record_finished(key, result)

    def finish_first(self, key: str, result: ToolMessage) -> Any:
        return self._inner.finish_first(key, result)


class ToolCallsOnlyStore(PostgresStore):
    def journal(self, run_id: str, *, lease: Any = None) -> Any:
        return ToolCallsOnly(super().journal(run_id, lease=lease))


async def test_a_journal_that_keeps_no_outcomes_makes_each_model_call_a_step(
    journal: Journal, postgres_url: str, postgres_schema: str
) -> None:
    """Without ``OutcomeJournal`` the model calls are steps, numbered (tool calls are still
    made without one), and a replay of every step answers them from DBOS's records."""
    with ToolCallsOnlyStore(postgres_url, schema=postgres_schema) as store:
        tools = Tools()
        model = FunctionModel(lookup_then_answer)
        agent = durable(store, model, tools)
        run_id = f"stepped-{uuid.uuid4().hex[:8]}"
        first = await agent.run("Look it up.", run_id=run_id)
        check_invariants(first, limits=agent.agent.limits, bound=agent.agent.bound)
        assert await step_names(run_id) == [MODEL_STEP + "#0", MODEL_STEP + "#1"]
        assert entries(journal, run_id) == {"call:0": "finished"}
        calls = len(model.requests)
        same_run(await replay(run_id), first)
        assert (len(model.requests), tools.looked_up) == (calls, [1])


class UnreadableOutcomes:
    """A run's journal whose outcomes cannot be read (its server is away); all else works."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def outcome_and_lookup(self, key: str, other: str) -> Any:
        raise OSError("the journal's server is away")


class UnreadableOutcomesStore(PostgresStore):
    def journal(self, run_id: str, *, lease: Any = None) -> Any:
        return UnreadableOutcomes(super().journal(run_id, lease=lease))


async def test_a_first_model_call_waits_for_an_unreadable_journal_until_the_deadline_only(
    journal: Journal, postgres_url: str, postgres_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first model call cannot tell a first execution from a replay, so it reads the
    journal before calling; a journal that never answers holds it until the run's time
    limit, not for ever: the deadline cuts the call (no model call is made), a step records
    the cut, and the run ends with ``timeout`` within its limit."""
    monkeypatch.setattr(model_calls, "REPLAY_READ_RETRY_S", 0.05)
    with UnreadableOutcomesStore(postgres_url, schema=postgres_schema) as store:
        model = FunctionModel(lookup_then_answer)
        agent = durable(store, model, Tools(), timeout_s=0.3)
        run_id = f"unreadable-{uuid.uuid4().hex[:8]}"
        result = await agent.run("Look it up.", run_id=run_id)
        assert result.stop_reason is StopReason.TIMEOUT
        assert result.error == "timed out after 0.3 s (limit 0.3 s)"
        check_invariants(result, limits=agent.agent.limits, bound=agent.agent.bound)
        assert model.requests == []
        assert await step_names(run_id) == [MODEL_STEP + "#0", "agent_fsm.save"]
        same_run(await replay(run_id), result)
        assert model.requests == []


def test_an_outcome_reads_back_as_it_was_kept() -> None:
    """The record's JSON: every field, the reply and the failure as their models dump, and
    times that read back equal."""
    outcomes = [
        Replied(1764180000.123456789, response=reply("", call("lookup", key=1)), began_at=1.5),
        Replied(2.0, failure=ModelFailure(message="busy", permanent=False, retry_after_s=0.25)),
        Replied(3.0, cut=True),
        Replied(4.0, cancelled="enough"),
    ]
    for outcome in outcomes:
        assert from_json(to_json(outcome)) == outcome


def test_a_memory_journal_keeps_the_first_outcome() -> None:
    journal = MemoryJournal()
    assert isinstance(journal, OutcomeJournal)
    request = ToolCall(id="cancel", name="stop", arguments="{}")
    journal.record_started("cancel", request)
    assert journal.keep_outcome("model:0", "1") == "1"
    assert journal.keep_outcome("model:0", "2") == "1"
    assert journal.outcome_and_lookup("model:0", "cancel") == (
        "1",
        JournalEntry("cancel", request, CallStatus.STARTED),
    )
    assert journal.lookup("model:0") is None  # no tool call's entry
