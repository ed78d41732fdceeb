"""DBOSAgent (agent_fsm.dbos): a run as a workflow of steps, its replay, the tool journal
inside the tool steps, the queue's limits, and clear errors for misuse.

DBOS is one per process: this module launches it once, its system tables in a schema of the
module's own on the test cluster (tests/stores.py), and every test registers agents of its
own names. A replay is made with DBOS's own machinery: ``fork_workflow`` replays a run's
recorded steps up to a given one and runs the rest again, as recovery after a crash does.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest

pytest.importorskip("psycopg")
pytest.importorskip("dbos")

from dbos import DBOS

from agent_fsm import Agent, AgentState, ConfigError, Limits, MemoryStore, StopReason, tool
from agent_fsm.dbos import DBOSAgent, RateLimit, RunQueue, StepModel
from agent_fsm.dbos.agent import RESUME_PREFIX, WORKFLOW_PREFIX
from agent_fsm.dbos.pausing import SAVE_STEP
from agent_fsm.dbos.replay import REPLAY_FORMAT, SLEEP_STEP
from agent_fsm.dbos.replies import Replied, from_json
from agent_fsm.durable.journal import CallStatus, OutcomeJournal
from agent_fsm.durable.postgres import PostgresStore
from agent_fsm.messages import AssistantMessage, ModelRequest, ModelResponse, ToolMessage
from agent_fsm.models.base import ModelCallError
from agent_fsm.state import RunResult
from agent_fsm.testing import FunctionModel, call, reply
from agent_fsm.testing.invariants import check_invariants
from tests.dbos_worker import HANG_GUARD_S, launched

pytestmark = pytest.mark.slow  # real processes or servers: make check leaves it out

FAST = RunQueue(name="unit_runs", polling_interval_s=0.05)


@pytest.fixture(scope="module")
def dbos_schema(postgres_url: str) -> Iterator[str]:
    with launched(postgres_url, "agent_fsm_unit") as schema:
        yield schema


@pytest.fixture
def journal(dbos_schema: str, postgres_url: str, postgres_schema: str) -> Iterator[PostgresStore]:
    with PostgresStore(postgres_url, schema=postgres_schema) as store:
        yield store


class Tools:
    """``send`` (not idempotent) and ``lookup`` (idempotent), counting their executions;
    ``hold`` makes the next call of either wait until released (a worker dying mid-call)."""

    def __init__(self) -> None:
        self.sent: list[int] = []
        self.looked_up: list[int] = []
        self.hold: asyncio.Event | None = None
        self.entered = asyncio.Event()
        self._held_in: asyncio.AbstractEventLoop | None = None

        @tool
        async def send(step: int) -> str:
            """Send the message of one step."""
            self.sent.append(step)
            await self._maybe_hold()
            return f"sent {step}"

        @tool(idempotent=True)
        async def lookup(key: int) -> int:
            """Look a value up."""
            self.looked_up.append(key)
            await self._maybe_hold()
            return key * key

        self.tools = [send, lookup]

    async def _maybe_hold(self) -> None:
        self.entered.set()
        if self.hold is not None:
            self._held_in = asyncio.get_running_loop()
            await self.hold.wait()

    def release(self) -> None:
        """Let the held calls go on. Queued runs run on DBOS's own event loop, in another
        thread: an asyncio.Event is set from there, or its waiters are not woken."""
        if self.hold is not None and self._held_in is not None:
            self._held_in.call_soon_threadsafe(self.hold.set)


def two_turns(request: ModelRequest) -> ModelResponse:
    """Two turns of ``send`` and ``lookup``, then the answer: a function of the transcript."""
    made = sum(1 for m in request.messages if isinstance(m, AssistantMessage) and m.tool_calls)
    if made >= 2:
        return reply("done")
    return reply("", call("send", step=made + 1), call("lookup", key=made + 1))


def durable(
    journal: PostgresStore,
    model: Any,
    tools: Tools | list[Any],
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    **limits: Any,
) -> DBOSAgent:
    agent = Agent(
        model=model if isinstance(model, FunctionModel) else FunctionModel(model),
        tools=tools.tools if isinstance(tools, Tools) else tools,
        limits=Limits(loop_detection=False, **limits),
        sleep=sleep,
    )
    return DBOSAgent(agent, journal=journal, name=uuid.uuid4().hex, queue=FAST)


async def step_names(run_id: str) -> list[str]:
    return [step["function_name"] for step in await DBOS.list_workflow_steps_async(run_id)]


def same_run(a: RunResult, b: RunResult) -> None:
    assert a.model_dump(exclude={"trace"}) == b.model_dump(exclude={"trace"})
    assert [(e.source, e.dest, e.label) for e in a.trace] == [
        (e.source, e.dest, e.label) for e in b.trace
    ]


async def test_a_run_is_a_workflow_whose_model_and_tool_calls_are_journalled(
    journal: PostgresStore,
) -> None:
    """A model call is no step of its own: its outcome, kept in the journal with the time it
    ended, stands for the step's record (``agent_fsm.dbos.model_calls``); nor is a tool call:
    its journal entry, finished with the time it ended, stands for it
    (``agent_fsm.dbos.tool_calls``)."""
    tools = Tools()
    agent = durable(journal, two_turns, tools)
    result = await agent.run("Do it.", run_id="steps-1")
    assert (result.stop_reason, result.output, result.run_id) == (
        StopReason.FINAL_ANSWER,
        "done",
        "steps-1",
    )
    check_invariants(result, limits=agent.agent.limits, bound=agent.agent.bound)
    assert await step_names("steps-1") == []
    kept = [outcome("steps-1", journal, n) for n in range(3)]
    assert [replied.response.message.content for replied in kept if replied.response] == [
        "",
        "",
        "done",
    ]
    assert kept[0].began_at is not None  # the activation's start, in its first call's outcome
    entries = [journal.journal("steps-1").lookup(f"call:{n}") for n in range(4)]
    assert [(e.call.name, e.status) for e in entries if e is not None] == [
        ("send", CallStatus.FINISHED),
        ("lookup", CallStatus.FINISHED),
    ] * 2
    # A run id is one run: running it again gives its result, and runs nothing.
    again = await agent.run("Do it.", run_id="steps-1")
    same_run(again, result)
    assert (tools.sent, tools.looked_up) == ([1, 2], [1, 2])


def outcome(run_id: str, store: PostgresStore, number: int) -> Replied:
    """The outcome model call ``number`` of the run's first activation kept in its journal."""
    journal = store.journal(run_id)
    assert isinstance(journal, OutcomeJournal)
    kept = journal.outcome_and_lookup(f"model:{number}", "cancel")[0]
    assert kept is not None
    return from_json(kept)


def test_the_workflows_dbos_versions_name_the_replay_format(journal: PostgresStore) -> None:
    """DBOS's default application version hashes the source of the registered workflows
    (``DBOSRegistry.compute_app_version``): both of a ``DBOSAgent``'s name the replay format,
    so a release that replays differently gets a version of its own, and DBOS hands it no
    run an earlier format began (a run whose calls were steps, replayed by a release that
    makes them without one, could make a call again)."""
    from dbos._dbos import _get_or_create_dbos_registry

    agent = durable(journal, two_turns, Tools())
    registered = _get_or_create_dbos_registry().workflow_info_map
    for prefix in (WORKFLOW_PREFIX, RESUME_PREFIX):
        source = inspect.getsource(registered[prefix + agent.name])
        assert f"Replay format {REPLAY_FORMAT} (" in source


async def test_a_replay_of_every_step_gives_the_same_run_and_calls_nothing(
    journal: PostgresStore,
) -> None:
    tools = Tools()
    model = FunctionModel(two_turns)
    agent = durable(journal, model, tools)
    first = await agent.run("Do it.", run_id="replay-1")
    calls = len(model.requests)
    steps = await step_names("replay-1")
    replayed = await (await DBOS.fork_workflow_async("replay-1", len(steps) + 1)).get_result()
    same_run(replayed, first)
    assert (tools.sent, tools.looked_up, len(model.requests)) == ([1, 2], [1, 2], calls)


async def test_a_finished_tool_step_run_again_is_answered_from_the_journal(
    journal: PostgresStore,
) -> None:
    """A replay that runs everything from the first ``send`` on again (the records of the
    later steps lost: a crash after the calls' ends) meets the journal's finished entries:
    nothing is sent twice, the answers and the clock are the recorded ones, and the run is
    the same."""
    tools = Tools()
    agent = durable(journal, two_turns, tools)
    first = await agent.run("Do it.", run_id="journal-1")
    assert await step_names("journal-1") == []  # every call kept in the journal
    replayed = await (await DBOS.fork_workflow_async("journal-1", 1)).get_result()
    same_run(replayed, first)
    assert tools.sent == [1, 2]


@pytest.mark.parametrize(("held", "runs_again"), [("send", False), ("lookup", True)])
async def test_a_tool_step_cut_short_by_a_crash_is_re_run_only_if_idempotent(
    journal: PostgresStore, held: str, runs_again: bool
) -> None:
    """The worker dies mid-call (the call started, the step has no record): the step that
    DBOS runs again answers "outcome unknown" for ``send``, and runs ``lookup`` again."""
    tools = Tools()
    tools.hold = asyncio.Event()
    model = FunctionModel(
        lambda request: (
            reply("done")
            if any(isinstance(m, ToolMessage) for m in request.messages)
            else reply("", call(held, **({"step": 1} if held == "send" else {"key": 1})))
        )
    )
    agent = durable(journal, model, tools)
    crashed = asyncio.create_task(agent.run("Do it.", run_id=f"cut-{held}"))
    await tools.entered.wait()
    tool_step = len(await step_names(f"cut-{held}")) + 1  # the call in flight: no record yet
    tools.hold = None  # the replay's call, if any, returns at once
    result = await (await DBOS.fork_workflow_async(f"cut-{held}", tool_step)).get_result()
    crashed.cancel()
    answer = next(m for m in result.messages if isinstance(m, ToolMessage))
    executions = tools.sent if held == "send" else tools.looked_up
    if runs_again:
        assert (answer.content, executions) == ("1", [1, 1])
    else:
        assert "outcome of this call to 'send' is unknown" in answer.content
        assert answer.details == {"runtime": {"outcome_unknown": True}}
        assert executions == [1]
    assert result.output == "done"


async def test_the_first_step_records_the_start_and_a_later_replay_keeps_it(
    journal: PostgresStore,
) -> None:
    """The activation's start has no step of its own: its first model call keeps it with
    its outcome (``RunTime.begin``). The run's clock reads the same on a replay made later:
    the stop it saves again has the same elapsed time (a start read afresh would shorten it)."""

    async def slow_then_ask(request: ModelRequest) -> ModelResponse:
        if len([m for m in request.messages if isinstance(m, AssistantMessage)]) == 0:
            await asyncio.sleep(0.2)  # the first model call takes time on the fleet's clock
            return reply("", call("ask_user", question="Which city?"))
        return reply("Paris")

    agent = durable(journal, FunctionModel(slow_then_ask), [])
    paused = await agent.run("Where?", run_id="start-1")
    steps = await DBOS.list_workflow_steps_async("start-1")
    assert [step["function_name"] for step in steps] == [SAVE_STEP]
    assert outcome("start-1", journal, 0).began_at is not None
    elapsed = journal.load("start-1").elapsed_s
    assert elapsed >= 0.2
    await asyncio.sleep(0.3)
    model_call = journal.journal("start-1")
    assert isinstance(model_call, OutcomeJournal)
    kept = model_call.outcome_and_lookup("model:0", "cancel")[0]
    assert kept is not None
    journal.delete("start-1")  # the replay's save writes it again; the journal goes with it
    model_call.keep_outcome("model:0", kept)  # but the model call's outcome is kept
    replayed = await (await DBOS.fork_workflow_async("start-1", len(steps))).get_result()
    same_run(replayed, paused)
    assert journal.load("start-1").elapsed_s == elapsed


async def test_backoff_jitter_and_sleep_replay_as_recorded(journal: PostgresStore) -> None:
    tools = Tools()
    failures = iter([True, True])

    def flaky(request: ModelRequest) -> ModelResponse:
        if next(failures, False):
            raise ModelCallError("busy", transient=True)
        return two_turns(request)

    agent = durable(journal, flaky, tools, retry_backoff_s=0.01, retry_backoff_max_s=0.05)
    first = await agent.run("Do it.", run_id="backoff-1")
    steps = await step_names("backoff-1")
    assert steps == [SLEEP_STEP, SLEEP_STEP]  # the model calls are kept in the journal
    assert first.stop_reason is StopReason.FINAL_ANSWER
    started = time.monotonic()
    replayed = await (await DBOS.fork_workflow_async("backoff-1", len(steps) + 1)).get_result()
    same_run(replayed, first)
    assert time.monotonic() - started < 30  # an upper bound only: nothing waits again


async def replay(run_id: str) -> RunResult:
    """The run's workflow again, every recorded step replayed (as after a crash at its end)."""
    steps = len(await step_names(run_id))
    fork = await DBOS.fork_workflow_async(run_id, steps + 1)
    try:
        return await asyncio.wait_for(fork.get_result(), HANG_GUARD_S)
    except TimeoutError:
        status = await fork.get_status()
        version = getattr(status, "app_version", None)
        raise AssertionError(
            f"the replay of {run_id} did not end in {HANG_GUARD_S:.0f} s (status "
            f"{status.status}, application version {version}): DBOS gives a fork only to a "
            "process of the latest version on its system database"
        ) from None


async def test_a_model_call_that_outlasts_the_time_limit_ends_the_run_on_timeout(
    journal: PostgresStore,
) -> None:
    """The deadline is kept inside the model call (no timer): the call is cut at
    ``timeout_s``, the run ends ERROR ``timeout`` with a valid transcript, and a replay takes
    the same transitions from the recorded cut, calling nothing."""
    tools = Tools()
    never = asyncio.Event()

    async def hangs(request: ModelRequest) -> ModelResponse:
        await never.wait()
        return reply("too late")

    model = FunctionModel(hangs)
    agent = durable(journal, model, tools, timeout_s=0.3)
    first = await agent.run("Do it.", run_id="deadline-1")
    assert (first.final_state, first.stop_reason) == (AgentState.ERROR, StopReason.TIMEOUT)
    # The clock reads the limit exactly: the recorded cut, not the time the step returned.
    assert first.error == "timed out after 0.3 s (limit 0.3 s)"
    check_invariants(first, limits=agent.agent.limits, bound=agent.agent.bound)
    # A timeout can be resumed, so the stop is saved (agent_fsm.dbos.pausing).
    assert await step_names("deadline-1") == [SAVE_STEP]
    assert outcome("deadline-1", journal, 0).cut  # the cut is kept, and replayed
    calls = len(model.requests)  # 1, unless the machine reached the step after the deadline
    same_run(await replay("deadline-1"), first)
    assert (len(model.requests), tools.sent) == (calls, [])


async def test_a_backoff_sleep_cut_by_the_time_limit_ends_the_run_on_timeout(
    journal: PostgresStore,
) -> None:
    """A retry's backoff (Retry-After: an hour) longer than the time left: the sleep step
    is cut at the deadline and the run ends as the engine's own timer would end it. The
    agent's fake sleep makes the wait instant; the deadline is a generous upper bound."""
    tools = Tools()
    waits: list[float] = []

    async def fake_sleep(seconds: float) -> None:
        waits.append(seconds)

    def busy(request: ModelRequest) -> ModelResponse:
        raise ModelCallError("busy", transient=True, retry_after_s=3600)

    model = FunctionModel(busy)
    agent = durable(
        journal, model, tools, sleep=fake_sleep, retry_after_max_s=3600, retry_wait_s=7200
    )
    first = await agent.run("Do it.", run_id="deadline-2")
    assert (first.final_state, first.stop_reason) == (AgentState.ERROR, StopReason.TIMEOUT)
    check_invariants(first, limits=agent.agent.limits, bound=agent.agent.bound)
    assert await step_names("deadline-2") == [SLEEP_STEP, SAVE_STEP]
    assert len(waits) == 1
    assert 0 < waits[0] <= agent.agent.limits.timeout_s
    same_run(await replay("deadline-2"), first)
    assert (len(model.requests), len(waits)) == (1, 1)


async def test_the_queue_keeps_its_worker_concurrency(journal: PostgresStore) -> None:
    tools = Tools()
    running, most = 0, 0

    async def slow(request: ModelRequest) -> ModelResponse:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.05)
        running -= 1
        return reply("done")

    agent = dataclasses.replace(durable(journal, slow, tools).agent)
    queued = DBOSAgent(
        agent,
        journal=journal,
        name=uuid.uuid4().hex,
        queue=RunQueue(name="two_at_a_time", worker_concurrency=2, polling_interval_s=0.05),
    )
    handles = [await queued.enqueue(f"run {n}") for n in range(6)]
    results = [await handle.result() for handle in handles]
    assert {r.output for r in results} == {"done"}
    assert most == 2


async def test_the_queue_keeps_its_rate_limit(journal: PostgresStore) -> None:
    """Read from what DBOS records as each run leaves the queue (``dequeued_at``), not from
    when its model call happened to start: on a busy machine the first run's call can come
    late and the third's early, whatever the queue did (issue 40: this test was red 4 of 4
    times on a loaded machine when it timed the calls)."""
    agent = Agent(model=FunctionModel(lambda request: reply("done")))
    limited = DBOSAgent(
        agent,
        journal=journal,
        name=uuid.uuid4().hex,
        queue=RunQueue(
            name="two_per_second",
            rate_limit=RateLimit(starts=2, per_s=1.0),
            polling_interval_s=0.05,
        ),
    )
    handles = [await limited.enqueue(f"run {n}") for n in range(4)]
    for handle in handles:
        await handle.result()
    statuses = [await DBOS.get_workflow_status_async(h.workflow_id) for h in handles]
    dequeued = sorted(s.dequeued_at for s in statuses if s is not None and s.dequeued_at)
    assert len(dequeued) == 4
    # at most two starts in any one-second window: the third a whole window after the first
    assert dequeued[2] - dequeued[0] >= 1000
    assert dequeued[3] - dequeued[1] >= 1000


def test_misuse_is_a_config_error(journal: PostgresStore) -> None:
    model = FunctionModel(lambda request: reply("done"))
    with pytest.raises(ConfigError, match="no store and no lease_s"):
        DBOSAgent(Agent(model=model, store=MemoryStore()), journal=journal)
    with pytest.raises(ConfigError, match="journal must be a CheckpointStore"):
        DBOSAgent(Agent(model=model), journal="postgresql://")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="worker_concurrency"):
        RunQueue(worker_concurrency=0)
    with pytest.raises(ConfigError, match="per_s"):
        RateLimit(starts=1, per_s=0)

    class Summariser:
        """A policy with a model of its own that is not a dataclass."""

        name = "summarise"

        def __init__(self, model: FunctionModel) -> None:
            self.model = model

        def shrink(self, context: object) -> object:
            return context

    with pytest.raises(ConfigError, match="model of its own"):
        DBOSAgent(
            Agent(
                model=model, context_policy=Summariser(model), limits=Limits(context_window=99_999)
            ),  # type: ignore[arg-type]
            journal=journal,
        )


async def test_the_steps_work_only_inside_a_run(journal: PostgresStore) -> None:
    agent = DBOSAgent(Agent(model=FunctionModel(lambda r: reply("x"))), journal=journal)
    with pytest.raises(ConfigError, match="works only inside"):
        await StepModel(agent.agent.model).request(
            ModelRequest(messages=[], tools=(), run_id="r", turn=1)
        )
    with pytest.raises(ConfigError, match="the input must be a str"):
        await agent.run(42)  # type: ignore[arg-type]


def test_a_tool_steps_outcome_is_recorded_under_the_module_it_was_first_defined_in() -> None:
    """DBOS pickles a tool step's outcome (``Answered``) into its record by module and name:
    the class lives in ``dbos.answers`` now, but is pickled as ``dbos.tool_calls``'s (which
    still imports it), so records written by one release read in another of its replay
    format, whichever wrote them."""
    import pickle

    from agent_fsm.dbos.tool_calls import Answered
    from agent_fsm.messages import ToolMessage

    answered = Answered(1.5, ToolMessage(tool_call_id="c", name="send", content="sent"))
    recorded = pickle.dumps(answered)
    assert b"agent_fsm.dbos.tool_calls" in recorded
    assert b"agent_fsm.dbos.answers" not in recorded
    assert pickle.loads(recorded) == answered
