"""Paused runs under DBOS (agent_fsm.dbos.pausing): a run that stops to ask the user or for an
approval is saved in the journal store, and ``DBOSAgent.resume`` continues it as a workflow
of its own, once however often it is called, and replay-safe like the first.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("psycopg")
pytest.importorskip("dbos")

from dbos import DBOS

from agent_fsm import AgentState, CheckpointError, ResumeError, RunStatus, StopReason, tool
from agent_fsm.dbos.pausing import LOAD_STEP, SAVE_STEP, resume_id
from agent_fsm.dbos.replay import TOOL_STEP
from agent_fsm.durable.postgres import PostgresStore
from agent_fsm.messages import ModelRequest, ModelResponse, ToolMessage, UserMessage
from agent_fsm.models.base import ModelCallError
from agent_fsm.testing import FunctionModel, call, reply
from agent_fsm.testing.invariants import check_invariants
from tests.dbos_worker import launched
from tests.test_dbos import durable, replay, same_run, step_names

pytestmark = pytest.mark.slow  # real processes or servers: make check leaves it out


@pytest.fixture(scope="module")
def dbos_schema(postgres_url: str) -> Iterator[str]:
    with launched(postgres_url, "agent_fsm_resume") as schema:
        yield schema


@pytest.fixture
def journal(dbos_schema: str, postgres_url: str, postgres_schema: str) -> Iterator[PostgresStore]:
    with PostgresStore(postgres_url, schema=postgres_schema) as store:
        yield store


class Transfers:
    """``transfer``: not idempotent and approval-gated, counting its executions; ``hold``
    makes a call wait until released (a worker dying mid-call)."""

    def __init__(self) -> None:
        self.made: list[int] = []
        self.hold: asyncio.Event | None = None
        self.entered = asyncio.Event()

        @tool(requires_approval=True)
        async def transfer(amount: int) -> str:
            """Transfer money."""
            self.made.append(amount)
            self.entered.set()
            if self.hold is not None:
                await self.hold.wait()
            return f"sent {amount}"

        self.tools = [transfer]


def transfer_then_answer(request: ModelRequest) -> ModelResponse:
    """Ask for a transfer; once told the decision (a user message), answer by its result."""
    told = [m.content for m in request.messages if isinstance(m, UserMessage)][1:]
    if not told:
        return reply("", call("transfer", amount=5))
    return reply("done" if "Result: sent 5" in told[-1] else f"not sure: {told[-1]}")


def ask_then_answer(request: ModelRequest) -> ModelResponse:
    said = [m.content for m in request.messages if isinstance(m, UserMessage)]
    if len(said) == 1:
        return reply("", call("ask_user", question="Which city?"))
    return reply(f"Sunny in {said[-1]}.")


async def test_a_run_that_asks_the_user_is_resumed_with_the_reply(
    journal: PostgresStore,
) -> None:
    model = FunctionModel(ask_then_answer)
    agent = durable(journal, model, [])
    paused = await agent.run("What's the weather?", run_id="ask-1")
    assert (paused.status, paused.stop_reason) == (RunStatus.NEEDS_INPUT, StopReason.ASK_USER)
    assert await step_names("ask-1") == [SAVE_STEP]
    with pytest.raises(ResumeError, match="pass the answer as reply"):
        await agent.resume("ask-1")
    with pytest.raises(ResumeError, match="not approvals"):
        await agent.resume("ask-1", approvals=True)

    done = await agent.resume("ask-1", "Paris")
    assert (done.final_state, done.output, done.run_id) == (
        AgentState.DONE,
        "Sunny in Paris.",
        "ask-1",
    )
    check_invariants(done, limits=agent.agent.limits, bound=agent.agent.bound)
    assert done.messages[: len(paused.messages)] == paused.messages
    assert await step_names(resume_id("ask-1", 1)) == [LOAD_STEP, SAVE_STEP]
    # The stop saved is now the end: the run has finished.
    with pytest.raises(ResumeError, match="has finished"):
        await agent.resume("ask-1", "Rome")
    assert len(model.requests) == 2


async def test_resume_says_why_a_run_cannot_be_resumed(journal: PostgresStore) -> None:
    agent = durable(journal, lambda request: reply("done"), [])
    with pytest.raises(CheckpointError):
        await agent.resume("never-ran", "hello")
    await agent.run("Do it.", run_id="finished-1")  # ends for good: nothing saved
    with pytest.raises(ResumeError, match="has finished"):
        await agent.resume("finished-1", "more")


async def test_a_double_resume_of_an_approval_carries_the_call_out_once(
    journal: PostgresStore,
) -> None:
    """Two resumes at once (a double-clicked Approve) are one workflow: the transfer is made
    once, and both callers get the same result; an enqueued one gets the same handle."""
    transfers = Transfers()
    model = FunctionModel(transfer_then_answer)
    agent = durable(journal, model, transfers.tools)
    paused = await agent.run("Pay Bob.", run_id="approve-1")
    assert paused.stop_reason is StopReason.APPROVAL_REQUIRED
    assert transfers.made == []

    first, second = await asyncio.gather(
        agent.resume("approve-1", approvals=True, pause=paused.pending.pause),
        agent.resume("approve-1", approvals=True, pause=paused.pending.pause),
    )
    same_run(first, second)
    assert (first.output, transfers.made) == ("done", [5])
    check_invariants(first, limits=agent.agent.limits, bound=agent.agent.bound)
    with pytest.raises(ResumeError, match="has finished"):  # a late third click
        await agent.resume("approve-1", approvals=True, pause=paused.pending.pause)
    assert transfers.made == [5]


async def test_a_resume_while_the_store_is_away_fails_and_is_never_refused_as_finished(
    journal: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by the chaos test (issue 34): a person's approval that arrived while the
    journal store was unreachable (PostgreSQL restarting) was refused as "run has finished
    (approval_required)", read from the first workflow's paused result, and never tried
    again: the run waited for ever. Only a run the store does not hold is looked up among
    the workflows; a failed load is the caller's CheckpointError, to try again."""
    transfers = Transfers()
    agent = durable(journal, transfer_then_answer, transfers.tools)
    paused = await agent.run("Pay Bob.", run_id="approve-away")
    assert paused.pending is not None
    real_load = PostgresStore.load

    def away(store: PostgresStore, run_id: str) -> Any:
        raise CheckpointError("checkpoint store: cannot connect (the server is away)")

    monkeypatch.setattr(PostgresStore, "load", away)
    pause = paused.pending.pause
    with pytest.raises(CheckpointError, match="cannot connect"):
        await agent.resume("approve-away", approvals=True, pause=pause)
    with pytest.raises(CheckpointError, match="cannot connect"):
        await agent.enqueue_resume("approve-away", approvals=True, pause=pause)
    monkeypatch.setattr(PostgresStore, "load", real_load)
    assert transfers.made == []
    done = await agent.resume("approve-away", approvals=True, pause=pause)
    assert (done.output, transfers.made) == ("done", [5])


async def test_a_stop_saved_and_loaded_while_the_store_blinks_is_not_lost(
    journal: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by the chaos test (issue 34): PostgreSQL restarting while a resume workflow
    loaded its stop (or a workflow saved one) failed that step, so the workflow ended in
    ERROR; every later resume of the stop names the same workflow id and got that error
    back: the run could never go on. The save and load steps try again while the store
    fails (they are idempotent), so a short outage only delays them."""
    transfers = Transfers()
    agent = durable(journal, transfer_then_answer, transfers.tools)
    # The save step saves with save_unless_behind (dbos.pausing.save_forward).
    real_load, real_save = PostgresStore.load, PostgresStore.save_unless_behind
    failures = {"load": 0, "save": 0}

    def blinking(kind: str, real: Any) -> Any:
        def call(store: PostgresStore, *args: Any, **kwargs: Any) -> Any:
            if failures[kind] < 2:  # twice in a row, then the server is back
                failures[kind] += 1
                raise CheckpointError(f"cannot {kind}: terminating connection (restart)")
            return real(store, *args, **kwargs)

        return call

    monkeypatch.setattr(PostgresStore, "save_unless_behind", blinking("save", real_save))
    paused = await agent.run("Pay Bob.", run_id="approve-blink")
    assert failures["save"] == 2
    assert paused.pending is not None
    pause = paused.pending.pause
    assert journal.load("approve-blink").control == paused.pending  # the stop was saved

    calls = 0

    def load_in_the_workflow(store: PostgresStore, run_id: str) -> Any:
        nonlocal calls
        calls += 1
        if calls in (2, 3):  # the caller's look (stop_of) passes; the step's fails twice
            raise CheckpointError("cannot load run: terminating connection (restart)")
        return real_load(store, run_id)

    monkeypatch.setattr(PostgresStore, "load", load_in_the_workflow)
    done = await agent.resume("approve-blink", approvals=True, pause=pause)
    assert calls >= 4
    assert (done.output, transfers.made) == ("done", [5])
    check_invariants(done, limits=agent.agent.limits, bound=agent.agent.bound)


async def test_an_enqueued_resume_of_one_stop_is_one_workflow(journal: PostgresStore) -> None:
    transfers = Transfers()
    agent = durable(journal, transfer_then_answer, transfers.tools)
    paused = await agent.run("Pay Bob.", run_id="approve-2")
    assert paused.pending is not None
    pause = paused.pending.pause
    handles = [
        await agent.enqueue_resume("approve-2", approvals=True, pause=pause) for _ in range(2)
    ]
    assert {h.workflow_id for h in handles} == {resume_id("approve-2", 1)}
    assert {h.run_id for h in handles} == {"approve-2"}
    results = [await h.result() for h in handles]
    same_run(results[0], results[1])
    assert (results[0].output, transfers.made) == ("done", [5])


async def test_a_resume_cut_short_by_a_crash_runs_nothing_twice(journal: PostgresStore) -> None:
    """The resume's worker dies inside the approved transfer (started, not recorded): the
    replay answers it "outcome unknown" from the journal instead of transferring again; a
    replay of the whole resume calls nothing at all."""
    transfers = Transfers()
    model = FunctionModel(transfer_then_answer)
    agent = durable(journal, model, transfers.tools)
    paused = await agent.run("Pay Bob.", run_id="approve-3")
    assert paused.pending is not None
    transfers.hold = asyncio.Event()
    crashed = asyncio.create_task(
        agent.resume("approve-3", approvals=True, pause=paused.pending.pause)
    )
    await transfers.entered.wait()
    resumed = resume_id("approve-3", 1)
    names = await step_names(resumed)
    assert names == [LOAD_STEP]
    in_flight = len(names) + 1  # the transfer's step: no record yet
    hold, transfers.hold = transfers.hold, None
    result = await (await DBOS.fork_workflow_async(resumed, in_flight)).get_result()
    assert result.output is not None
    assert "outcome of this call to 'transfer' is unknown" in result.output
    assert transfers.made == [5]
    check_invariants(result, limits=agent.agent.limits, bound=agent.agent.bound)

    hold.set()  # the first execution goes on: its transfer returns, once
    finished = await crashed  # and it agrees with the replay: the first outcome kept wins
    assert (finished.output, transfers.made) == (result.output, [5])
    calls = len(model.requests)
    assert await step_names(resumed) == [
        LOAD_STEP,
        TOOL_STEP + "transfer#0",  # a resume's first call: no recorded start to go by
        SAVE_STEP,
    ]
    same_run(await replay(resumed), finished)
    assert (len(model.requests), transfers.made) == (calls, [5])


async def test_a_run_stopped_by_a_transient_model_failure_is_resumed(
    journal: PostgresStore,
) -> None:
    """The resume rows out of ERROR too: no answer is needed, and the resumed activation
    has a clock, deadline and retries of its own."""
    failures = iter([True])

    def flaky(request: ModelRequest) -> ModelResponse:
        if next(failures, False):
            raise ModelCallError("overloaded", transient=True)
        return reply("done")

    agent = durable(journal, flaky, [], model_retries=0)
    stopped = await agent.run("Do it.", run_id="flaky-1")
    assert (stopped.final_state, stopped.stop_reason) == (AgentState.ERROR, StopReason.MODEL_ERROR)
    done = await agent.resume("flaky-1")
    assert (done.final_state, done.output) == (AgentState.DONE, "done")
    check_invariants(done, limits=agent.agent.limits, bound=agent.agent.bound)


async def test_a_resume_by_a_different_agent_is_refused_before_the_pause_is_answered(
    journal: PostgresStore,
) -> None:
    """The run keeps its agent's fingerprint (``run.identity``): a resume by an agent with
    another tool set or prompt is a ResumeError naming what differs, raised before any
    workflow starts, so the approval is not used up; the right agent then carries it out."""
    transfers = Transfers()
    model = FunctionModel(transfer_then_answer)
    agent = durable(journal, model, transfers.tools)
    paused = await agent.run("Pay Bob.", run_id="identity-1")
    assert paused.stop_reason is StopReason.APPROVAL_REQUIRED
    stored = journal.load("identity-1")
    assert stored.agent is not None
    assert "transfer" in stored.agent.tools

    @tool(requires_approval=True)
    async def transfer(amount: int, memo: str = "") -> str:
        """Transfer money, with a memo."""
        return f"sent {amount}"

    @tool
    def audit() -> str:
        """Audit."""
        return "ok"

    other = durable(journal, model, [transfer, audit])
    with pytest.raises(ResumeError, match="different agent") as refused:
        await other.resume("identity-1", approvals=True, pause=paused.pending.pause)
    said = str(refused.value)
    assert "'audit'" in said
    assert "schema of 'transfer' changed" in said
    assert await DBOS.get_workflow_status_async(resume_id("identity-1", 1)) is None
    assert journal.load("identity-1").trace == stored.trace  # the pause is unanswered

    done = await agent.resume("identity-1", approvals=True, pause=paused.pending.pause)
    assert (done.output, transfers.made) == ("done", [5])


def transfer_twice(request: ModelRequest) -> ModelResponse:
    """Ask for a transfer of 5; once it was answered, one of 7; once that was, answer."""
    answered = [m for m in request.messages if isinstance(m, ToolMessage)]
    if not answered:
        return reply("", call("transfer", amount=5))
    if len(answered) == 1:
        return reply("", call("transfer", amount=7))
    return reply("done")


@pytest.mark.parametrize("queued", [False, True])
async def test_a_resume_keeps_the_runs_approval_rules(journal: PostgresStore, queued: bool) -> None:
    """Resumed (now, or from the queue) by an agent whose transfer asks no approval (a
    worker that forgot it), the run's next transfer still waits for one, as with
    ``Agent.resume`` (``run.identity.keep_approvals``): the approved call runs, the new one
    does not, and the rule holds over the next resume too."""
    transfers = Transfers()
    model = FunctionModel(transfer_twice)
    agent = durable(journal, model, transfers.tools)
    run_id = f"keep-approvals-{queued}"
    paused = await agent.run("Pay Bob twice.", run_id=run_id)
    assert paused.stop_reason is StopReason.APPROVAL_REQUIRED

    @tool  # the same name, description and schema: only the approval rule is missing
    async def transfer(amount: int) -> str:
        """Transfer money."""
        transfers.made.append(amount)
        return f"sent {amount}"

    forgetful = durable(journal, model, [transfer])

    async def resume(approvals: bool, pause: str) -> Any:
        if queued:
            handle = await forgetful.enqueue_resume(run_id, approvals=approvals, pause=pause)
            return await handle.result()
        return await forgetful.resume(run_id, approvals=approvals, pause=pause)

    assert paused.pending is not None
    again = await resume(True, paused.pending.pause)
    assert again.stop_reason is StopReason.APPROVAL_REQUIRED
    assert transfers.made == [5]  # the approved call ran, the new one waits
    assert again.pending is not None
    assert [c.name for c in again.pending.pending_calls] == ["transfer"]
    check_invariants(again, limits=agent.agent.limits, bound=agent.agent.bound)
    final = await resume(False, again.pending.pause)
    assert (final.output, transfers.made) == ("done", [5])
    check_invariants(final, limits=agent.agent.limits, bound=agent.agent.bound)
