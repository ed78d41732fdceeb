"""Cancelling a DBOS run from outside (agent_fsm.dbos.cancelling): the request waits in the
run's journal, every model and tool step reads it before its call and records what it
found, and the run stops in ERROR ``aborted``, resumable, its transcript valid, on every
execution at the same point.

The cancels come from another ``DBOSAgent`` on a store of its own (its own connection),
through the database only, and one from another process (tests/dbos_canceller.py).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from typing import Any

import pytest

pytest.importorskip("psycopg")
pytest.importorskip("dbos")

import psycopg
import sqlalchemy.exc
from dbos import DBOS
from psycopg import sql

from agent_fsm import Agent, AgentState, CheckpointError, Limits, StopReason, tool
from agent_fsm.dbos import DBOSAgent, RunQueue, cancelling
from agent_fsm.dbos.cancelling import cancel_run
from agent_fsm.dbos.pausing import resume_id
from agent_fsm.durable.postgres import PostgresStore
from agent_fsm.messages import AssistantMessage, ModelRequest, ModelResponse, UserMessage
from agent_fsm.state import RunResult
from agent_fsm.testing import FunctionModel, call, reply
from agent_fsm.testing.invariants import check_invariants
from tests.dbos_worker import HANG_GUARD_S, launched
from tests.test_dbos import replay, same_run

pytestmark = pytest.mark.slow  # real processes or servers: make check leaves it out


APP = "agent_fsm_cancel"
"""The DBOS application name of this module's processes."""


@pytest.fixture(scope="module")
def dbos_schema(postgres_url: str) -> Iterator[str]:
    with launched(postgres_url, APP) as schema:
        yield schema


@pytest.fixture
def journal(dbos_schema: str, postgres_url: str, postgres_schema: str) -> Iterator[PostgresStore]:
    with PostgresStore(postgres_url, schema=postgres_schema) as store:
        yield store


@pytest.fixture
def outside(dbos_schema: str, postgres_url: str, postgres_schema: str) -> Iterator[PostgresStore]:
    """The same store, opened again: what another process would hold."""
    with PostgresStore(postgres_url, schema=postgres_schema) as store:
        yield store


class Sends:
    """``send`` (not idempotent), recording each call; a call to a step in ``hold`` waits
    until released. Runs started from a queue run on DBOS's own event loop, in another
    thread: the test waits and releases across threads."""

    def __init__(self, hold: frozenset[int] = frozenset()) -> None:
        self.made: list[int] = []
        self.hold = hold
        self.entered: asyncio.Queue[int] | None = None
        self._go = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._entered_at: list[int] = []

        @tool
        async def send(step: int) -> str:
            """Send the message of one step."""
            self.made.append(step)
            if step in self.hold:
                self._loop = asyncio.get_running_loop()
                self._entered_at.append(step)
                await self._go.wait()
            return f"sent {step}"

        self.tools = [send]

    async def wait_entered(self, step: int, running: asyncio.Future[Any] | None = None) -> None:
        """Until the call to ``step`` is held; fails when ``running`` (the run) ends first,
        or nothing comes for ``HANG_GUARD_S``."""
        gives_up = time.monotonic() + HANG_GUARD_S
        while step not in self._entered_at:
            if running is not None and running.done():
                raise AssertionError(f"the run ended before its call to send {step}: {running!r}")
            if time.monotonic() > gives_up:
                raise AssertionError(f"no call to send {step} in {HANG_GUARD_S:.0f} s")
            await asyncio.sleep(0.01)

    def release(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._go.set)

    def hold_again(self, steps: frozenset[int]) -> None:
        """Hold the calls to ``steps`` from now on (the earlier ones were released)."""
        self.hold = steps
        self._go = asyncio.Event()


def sends(count: int):  # type: ignore[no-untyped-def]
    """A model sending steps 1..count, one per turn, then answering (a function of the
    transcript)."""

    def model(request: ModelRequest) -> ModelResponse:
        made = sum(
            1
            for m in request.messages
            if isinstance(m, AssistantMessage)
            for c in m.tool_calls
            if c.name == "send"
        )
        if made >= count:
            return reply("done")
        return reply("", call("send", step=made + 1))

    return model


def agent_of(journal: PostgresStore, model: FunctionModel, tools: Sends, **kw: object) -> DBOSAgent:
    agent = Agent(model=model, tools=tools.tools, limits=Limits(loop_detection=False))
    return DBOSAgent(agent, journal=journal, name=uuid.uuid4().hex, **kw)  # type: ignore[arg-type]


def single_queue() -> RunQueue:
    """A queue of its own that starts one run at a time: a second run waits in it."""
    return RunQueue(name=f"q{uuid.uuid4().hex[:8]}", concurrency=1, polling_interval_s=0.05)


def canceller(store: PostgresStore) -> DBOSAgent:
    """Another DBOSAgent, on another connection to the store: cancels go through the
    database only."""
    return DBOSAgent(Agent(model=FunctionModel(sends(0))), journal=store, name=uuid.uuid4().hex)


def assert_aborted(result: RunResult, reason: str, agent: DBOSAgent) -> None:
    assert (result.final_state, result.stop_reason) == (AgentState.ERROR, StopReason.ABORTED)
    assert reason in (result.error or "")
    check_invariants(result, limits=agent.agent.limits, bound=agent.agent.bound)


async def cancelled_while_held(
    agent: DBOSAgent,
    tools: Sends,
    run: Coroutine[Any, Any, RunResult],
    *,
    step: int,
    cancel: Callable[[str], Awaitable[None]],
    reason: str,
) -> RunResult:
    """Drive ``run`` (a run or a resume of ``agent``) until its call to ``send`` ``step`` is
    held, ``cancel`` it for ``reason`` meanwhile (the cancel checks its own answer), then
    release the call: the run's result, checked aborted for ``reason``."""
    tools.hold_again(frozenset({step}))
    running = asyncio.ensure_future(run)
    await tools.wait_entered(step, running)
    try:
        await cancel(reason)
    finally:
        tools.release()  # a failed cancel leaves no run held
    result = await running
    assert_aborted(result, reason, agent)
    return result


def requested(by: DBOSAgent, run_id: str) -> Callable[[str], Awaitable[None]]:
    """A cancel of ``run_id`` asked of ``by``, which must answer that it was requested."""

    async def cancel(reason: str) -> None:
        assert await by.cancel(run_id, reason) is True

    return cancel


async def test_a_run_cancelled_while_a_worker_drives_it_stops_before_its_next_call(
    journal: PostgresStore, outside: PostgresStore, postgres_url: str, postgres_schema: str
) -> None:
    """The call in flight when the request comes finishes and is answered; no model or tool
    call starts after it; the run is aborted, resumable, and a replay of it, even with the
    request gone from the journal, takes the same path (the steps recorded what they read)."""
    tools = Sends()
    model = FunctionModel(sends(3))
    agent = agent_of(journal, model, tools)
    run_id = f"cancel-{uuid.uuid4().hex[:8]}"
    run = agent.run("Send three.", run_id=run_id)
    cancel = requested(canceller(outside), run_id)
    result = await cancelled_while_held(
        agent, tools, run, step=1, cancel=cancel, reason="stop sending"
    )
    assert tools.made == [1]
    assert len(model.requests) == 1  # the second call was answered by its step: never made
    sent = [m for m in result.messages if m.role == "tool"]
    assert [m.content for m in sent] == ["sent 1"]

    # A replay reads the recorded outcomes, not the journal: take the request away first.
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        table = sql.Identifier(postgres_schema, "journal")
        conn.execute(sql.SQL("DELETE FROM {} WHERE key = 'cancel'").format(table), ())
    same_run(await replay(run_id), result)
    assert (tools.made, len(model.requests)) == ([1], 1)

    # Resumable: the resume runs on (the request was for the first workflow only).
    done = await agent.resume(run_id)
    assert (done.final_state, done.output) == (AgentState.DONE, "done")
    assert tools.made == [1, 2, 3]
    check_invariants(done, limits=agent.agent.limits, bound=agent.agent.bound)


async def test_a_run_cancelled_before_a_worker_takes_it_makes_no_call(
    journal: PostgresStore, outside: PostgresStore
) -> None:
    tools = Sends(hold=frozenset({1}))
    model = FunctionModel(sends(2))
    one_at_a_time = single_queue()
    agent = agent_of(journal, model, tools, queue=one_at_a_time)
    first = await agent.enqueue("Send two.", run_id=f"busy-{uuid.uuid4().hex[:8]}")
    await tools.wait_entered(1)
    waiting = await agent.enqueue("Send two.", run_id=f"waiting-{uuid.uuid4().hex[:8]}")
    assert await waiting.status() == "ENQUEUED"
    assert await cancel_run(outside, waiting.run_id, "not needed") is True
    assert await waiting.status() == "ENQUEUED"  # cancelled before any worker took it
    calls_before = len(model.requests)
    tools.release()
    assert (await first.result()).output == "done"

    result = await waiting.result()
    assert_aborted(result, "not needed", agent)
    assert [m.role for m in result.messages] == ["user"]  # its one turn made no call
    assert len(model.requests) == calls_before + 2  # the first run's two, none of its own
    assert tools.made == [1, 2]


async def test_a_cancel_of_a_paused_run_is_refused_and_one_during_its_resume_stops_it(
    journal: PostgresStore, outside: PostgresStore
) -> None:
    """A paused run has nothing to stop (False, nothing recorded): its resume runs on. A
    cancel made while a resume runs stops that resume, which is resumable in turn."""
    tools = Sends(hold=frozenset({1}))

    def ask_then_send(request: ModelRequest) -> ModelResponse:
        said = [m for m in request.messages if isinstance(m, UserMessage)]
        if len(said) == 1:
            return reply("", call("ask_user", question="How many?"))
        return sends(2)(request)

    model = FunctionModel(ask_then_send)
    agent = agent_of(journal, model, tools)
    other = canceller(outside)
    run_id = f"paused-{uuid.uuid4().hex[:8]}"
    paused = await agent.run("Send some.", run_id=run_id)
    assert paused.stop_reason is StopReason.ASK_USER
    assert await other.cancel(run_id, "too late") is False

    resume, cancel = agent.resume(run_id, "two"), requested(other, run_id)
    stopped = await cancelled_while_held(
        agent, tools, resume, step=1, cancel=cancel, reason="stop now"
    )
    assert tools.made == [1]
    assert "too late" not in (stopped.error or "")

    done = await agent.resume(run_id)
    assert (done.output, tools.made) == ("done", [1, 2])
    check_invariants(done, limits=agent.agent.limits, bound=agent.agent.bound)
    assert await other.cancel(run_id, "after the end") is False


async def test_a_cancel_while_a_resume_is_queued_is_not_lost_when_it_leaves_the_stop(
    journal: PostgresStore, outside: PostgresStore
) -> None:
    """The resume row resets the run's abort (``reopen_fields``): a request recorded for a
    resume before it took that row still stops it, before its first call."""
    tools = Sends()

    def ask_then_send(request: ModelRequest) -> ModelResponse:
        said = [m for m in request.messages if isinstance(m, UserMessage)]
        if len(said) == 1:
            return reply("", call("ask_user", question="How many?"))
        return sends(1)(request)

    model = FunctionModel(ask_then_send)
    blocker = Sends(hold=frozenset({1}))
    one_at_a_time = single_queue()
    agent = agent_of(journal, model, tools, queue=one_at_a_time)
    busy = agent_of(journal, FunctionModel(sends(1)), blocker, queue=one_at_a_time)
    run_id = f"queued-resume-{uuid.uuid4().hex[:8]}"
    paused = await agent.run("Send some.", run_id=run_id)
    assert paused.stop_reason is StopReason.ASK_USER
    holding = await busy.enqueue("Send one.", run_id=f"holder-{uuid.uuid4().hex[:8]}")
    await blocker.wait_entered(1)
    handle = await agent.enqueue_resume(run_id, "one")
    assert handle.workflow_id == resume_id(run_id, 1)
    assert await handle.status() == "ENQUEUED"
    assert await cancel_run(outside, run_id, "changed my mind") is True
    calls = len(model.requests)
    blocker.release()
    await holding.result()

    stopped = await handle.result()
    assert_aborted(stopped, "changed my mind", agent)
    assert (len(model.requests), tools.made) == (calls, [])


async def test_a_run_is_cancelled_from_another_process(
    journal: PostgresStore, dbos_schema: str, postgres_url: str, postgres_schema: str
) -> None:
    tools = Sends()
    model = FunctionModel(sends(2))
    agent = agent_of(journal, model, tools)
    run_id = f"elsewhere-{uuid.uuid4().hex[:8]}"

    async def from_another_process(reason: str) -> None:
        args = [postgres_url, postgres_schema, dbos_schema, run_id, reason]
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tests.dbos_canceller", *args, stdout=subprocess.PIPE
        )
        said, _ = await process.communicate()
        assert (process.returncode, said.decode().strip()) == (0, "True")

    run = agent.run("Send two.", run_id=run_id)
    await cancelled_while_held(
        agent, tools, run, step=1, cancel=from_another_process, reason="from afar"
    )
    assert (tools.made, len(model.requests)) == ([1], 1)


HELPER = """
import sys

from dbos import DBOS

from tests.dbos_worker import dbos_config


@DBOS.workflow()
async def registered_in_the_helper_only() -> None:
    '''By default, a version of this process's own: DBOS hashes what it registered.'''


DBOS(config=dbos_config(sys.argv[1], sys.argv[2], "helper", sys.argv[3]))
DBOS.launch()
print(DBOS.application_version, flush=True)
DBOS.destroy()
"""
"""A process that launches DBOS on a test's system database as tests/dbos_canceller.py does,
having registered a workflow this process did not."""


async def test_a_replay_runs_here_after_another_process_launched_dbos_on_its_database(
    journal: PostgresStore, dbos_schema: str, postgres_url: str
) -> None:
    """DBOS hands a workflow that names no application version (a fork: ``replay``) only to
    a process of the latest version registered on its system database. A helper process
    launched there (tests/dbos_canceller.py) runs this process's version whatever it
    registered (``dbos_worker.APP_VERSION``): one of another version would take the latest
    from this process, and every replay made here afterwards would wait for ever."""
    tools = Sends()
    model = FunctionModel(sends(1))
    agent = agent_of(journal, model, tools)
    run_id = f"version-{uuid.uuid4().hex[:8]}"
    result = await agent.run("Send one.", run_id=run_id)
    helper = await asyncio.create_subprocess_exec(
        sys.executable, "-c", HELPER, postgres_url, dbos_schema, APP, stdout=subprocess.PIPE
    )
    said, _ = await helper.communicate()
    assert (helper.returncode, said.decode().strip()) == (0, DBOS.application_version)
    latest = await DBOS.get_latest_application_version_async()
    assert latest["version_name"] == DBOS.application_version
    same_run(await replay(run_id), result)  # run here: it waited for ever
    assert (tools.made, len(model.requests)) == ([1], 2)


async def test_cancel_says_when_there_is_no_such_run(outside: PostgresStore) -> None:
    with pytest.raises(CheckpointError):
        await canceller(outside).cancel("never-ran", "why")
    assert DBOS is not None


async def agent_fsm_cancel(*args: str) -> tuple[int, str, str]:
    """``agent-fsm cancel ARGS`` in a process of its own (no DBOS launched there): its exit
    code, stdout and stderr. Awaited, so this process's workflows run meanwhile."""
    command = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "agent_fsm.cli",
        "cancel",
        *args,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = await command.communicate()
    assert command.returncode is not None
    return command.returncode, out.decode(), err.decode()


async def test_the_command_line_cancels_a_dbos_run_through_its_system_database(
    journal: PostgresStore, dbos_schema: str, postgres_url: str, postgres_schema: str
) -> None:
    """``agent-fsm cancel --dbos URL`` reaches a DBOS run: its first workflow (which keeps no
    checkpoint, so the store alone says "no such run", and the error says to add --dbos),
    and a resume under way (where the store shows the stop it continues); a run at a stop
    is left as it is, an unknown run exits 2. No password is printed."""
    tools = Sends()
    model = FunctionModel(sends(2))
    agent = agent_of(journal, model, tools)
    store = ("--store", postgres_url, "--schema", postgres_schema)
    dbos = ("--dbos", postgres_url, "--dbos-schema", dbos_schema)
    run_id = f"cli-{uuid.uuid4().hex[:8]}"

    async def from_the_shell(reason: str) -> None:
        code, out, err = await agent_fsm_cancel(run_id, *store)
        assert code == 2
        assert "add --dbos URL" in err
        code, out, err = await agent_fsm_cancel(run_id, *store, *dbos, "--reason", reason)
        assert (code, err) == (0, "")
        assert "cancel requested" in out

    run = agent.run("Send two.", run_id=run_id)
    await cancelled_while_held(
        agent, tools, run, step=1, cancel=from_the_shell, reason="from the shell"
    )
    assert (tools.made, len(model.requests)) == ([1], 1)

    # At its stop (aborted, resumable): nothing to cancel. Resumed: the resume is stopped.
    code, out, _ = await agent_fsm_cancel(run_id, *store, *dbos)
    assert (code, "already stopped" in out) == (0, True)

    async def with_dbos(reason: str) -> None:
        code, out, _ = await agent_fsm_cancel(run_id, *store, *dbos, "--reason", reason)
        assert (code, "cancel requested" in out) == (0, True)

    await cancelled_while_held(
        agent, tools, agent.resume(run_id), step=2, cancel=with_dbos, reason="again"
    )
    assert tools.made == [1, 2]

    code, _, err = await agent_fsm_cancel("never-ran", *store, *dbos)
    assert code == 2
    assert "never-ran" in err
    password = psycopg.conninfo.conninfo_to_dict(postgres_url).get("password")
    if password:
        assert password not in err


async def test_agent_cancel_reaches_a_dbos_run(
    journal: PostgresStore, outside: PostgresStore
) -> None:
    """``Agent.cancel`` (sync, called on the event loop's thread) reaches a DBOS run that no
    store holds while it runs: through the DBOSAgent's own agent, and through a leased agent
    on the journal store, for the run's first workflow and for a resume under way (where
    the store shows the stop it continues). A run at a stop is left; an unknown one is no
    run (``run.elsewhere``)."""
    tools = Sends()
    model = FunctionModel(sends(3))
    agent = agent_of(journal, model, tools)
    run_id = f"library-{uuid.uuid4().hex[:8]}"
    leased = Agent(model=FunctionModel(sends(0)), store=outside, lease_s=5.0)

    def through(library: Agent) -> Callable[[str], Awaitable[None]]:
        async def cancel(reason: str) -> None:
            assert library.cancel(run_id, reason) is True  # sync, on the loop's thread

        return cancel

    run = agent.run("Send three.", run_id=run_id)
    cancel = through(agent.agent)
    await cancelled_while_held(agent, tools, run, step=1, cancel=cancel, reason="from the library")
    assert (tools.made, len(model.requests)) == ([1], 1)

    assert leased.cancel(run_id, "at its stop") is False
    resume, cancel = agent.resume(run_id), through(leased)
    await cancelled_while_held(
        agent, tools, resume, step=2, cancel=cancel, reason="from a leased agent"
    )
    assert tools.made == [1, 2]
    with pytest.raises(CheckpointError):
        leased.cancel("never-ran", "why")
    with pytest.raises(CheckpointError):
        agent.agent.cancel("never-ran", "why")


async def test_agent_cancel_is_recorded_by_the_dbos_agent_whose_run_it_is(
    journal: PostgresStore, postgres_url: str
) -> None:
    """DBOS sees the workflows of every ``DBOSAgent`` of the process: one on another
    journal store must not take another's run for its own (its request, recorded in its
    own journal, would never be read, and the run would go on)."""
    tools = Sends()
    model = FunctionModel(sends(3))
    agent = agent_of(journal, model, tools)
    run_id = f"whose-{uuid.uuid4().hex[:8]}"
    other_schema = f"test_{uuid.uuid4().hex[:16]}"
    try:
        with PostgresStore(postgres_url, schema=other_schema) as elsewhere:
            stranger = canceller(elsewhere)  # registered too, on a journal of its own

            async def by_the_runs_own_agent(reason: str) -> None:
                assert stranger.cancel_elsewhere(run_id, "not mine") is None
                assert elsewhere.journal(run_id).lookup("cancel") is None
                assert agent.cancel_elsewhere(run_id, reason) is True

            run, cancel = agent.run("Send three.", run_id=run_id), by_the_runs_own_agent
            await cancelled_while_held(agent, tools, run, step=1, cancel=cancel, reason="mine")
    finally:
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(other_schema))
            )


async def test_a_cancel_that_cannot_look_says_so_and_never_no_such_run(
    outside: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When DBOS's status look-up fails (its database away) or the journal store cannot be
    read, ``DBOSAgent.cancel`` and ``Agent.cancel`` raise a ``CheckpointError`` saying they
    could not look, not "no checkpoint for run": a user must not be told a run does not
    exist when nobody could look (issue 34). Once they can look again, an unknown run is
    no run."""
    agent = canceller(outside)  # registered: Agent.cancel asks it
    plain = Agent(model=FunctionModel(sends(0)))  # its residence: this process's runs

    async def database_away(workflow_id: str, **_: object) -> object:
        raise sqlalchemy.exc.OperationalError(
            "SELECT", {}, Exception("connection refused: is the server running?")
        )

    with monkeypatch.context() as patched:
        patched.setattr(DBOS, "get_workflow_status_async", database_away)
        with pytest.raises(CheckpointError, match="cannot read the status of DBOS") as raised:
            await agent.cancel("not-stored", "why")
        assert "connection refused" in str(raised.value)
        with pytest.raises(CheckpointError, match="cannot tell whether run 'not-stored'") as told:
            plain.cancel("not-stored", "why")
        assert "no checkpoint" not in str(told.value)

    def store_away(run_id: str) -> object:
        raise CheckpointError(f"checkpoint store {outside.name}: cannot connect: refused")

    with monkeypatch.context() as patched:
        patched.setattr(outside, "load", store_away)
        patched.setattr(outside, "exists", store_away)
        with pytest.raises(CheckpointError, match="cannot connect"):
            await agent.cancel("not-stored", "why")
        with pytest.raises(CheckpointError, match="cannot tell whether run 'not-stored'") as told:
            plain.cancel("not-stored", "why")
        assert "no checkpoint" not in str(told.value)

    with pytest.raises(CheckpointError, match="no checkpoint for run 'not-stored'"):
        await agent.cancel("not-stored", "why")
    with pytest.raises(CheckpointError, match="not-stored") as told:
        plain.cancel("not-stored", "why")
    assert "cannot tell" not in str(told.value)


async def test_a_cancel_whose_status_look_up_never_answers_ends_saying_so(
    outside: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DBOS retries a system database it cannot reach without end: a cancel waits
    ``STATUS_WAIT_S`` for the status, then says it cannot tell (every call ends)."""
    agent = canceller(outside)
    never = asyncio.Event()

    async def database_unreachable(workflow_id: str, **_: object) -> object:
        await never.wait()  # as DBOS's retries against a database that does not answer
        raise AssertionError("unreachable")

    monkeypatch.setattr(DBOS, "get_workflow_status_async", database_unreachable)
    monkeypatch.setattr(cancelling, "STATUS_WAIT_S", 0.2)
    with pytest.raises(CheckpointError, match=r"no answer within 0\.2 s") as raised:
        await agent.cancel("not-stored", "why")
    assert "no checkpoint" not in str(raised.value)


class CountedReads:
    """A run's journal that counts its reads of the activation's cancel request, by kind:
    ``lookup`` (a model step's own read), ``start_unless_known`` (a tool step's before its
    call, with its start), ``lookup_pair`` (the same, in a journal that cannot start with
    it), ``finish_and_lookup`` (a tool step's with the record of its end)."""

    def __init__(self, journal: Any, reads: dict[str, int]) -> None:
        self._journal = journal
        self._reads = reads

    def _count(self, kind: str, key: str) -> None:
        if key.endswith("cancel"):
            self._reads[kind] = self._reads.get(kind, 0) + 1

    def lookup(self, key: str) -> Any:
        self._count("lookup", key)
        return self._journal.lookup(key)

    def lookup_pair(self, key: str, other: str) -> Any:
        self._count("lookup_pair", other)
        return self._journal.lookup_pair(key, other)

    def start_unless_known(self, key: str, call: Any, other: str) -> Any:
        self._count("start_unless_known", other)
        return self._journal.start_unless_known(key, call, other)

    def finish_and_lookup(self, key: str, result: Any, other: str) -> Any:
        self._count("finish_and_lookup", other)
        return self._journal.finish_and_lookup(key, result, other)

    def record_started(self, key: str, call: Any) -> None:
        self._journal.record_started(key, call)

    def record_finished(self, key: str, result: Any) -> None:
        self._journal.record_finished(key, result)


async def test_a_request_made_during_a_tool_call_is_read_with_its_end_and_no_model_step_reads_again(
    journal: PostgresStore,
    outside: PostgresStore,
    postgres_url: str,
    postgres_schema: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A tool step reads the cancel request in the statement recording its start and in the
    one recording its end, so the model step after it reads nothing itself (a round trip
    fewer per turn): only the run's first model step, which follows no tool step, reads it
    on its own. A request
    made during a call is found there: the run stops before its next model call, and a
    replay with the request gone from the journal takes the same path."""
    reads: dict[str, int] = {}
    opened = journal.journal
    monkeypatch.setattr(journal, "journal", lambda run_id: CountedReads(opened(run_id), reads))
    tools = Sends()
    model = FunctionModel(sends(4))
    agent = agent_of(journal, model, tools)
    run_id = f"reads-{uuid.uuid4().hex[:8]}"
    run = agent.run("Send four.", run_id=run_id)
    cancel = requested(canceller(outside), run_id)
    result = await cancelled_while_held(agent, tools, run, step=3, cancel=cancel, reason="enough")
    assert tools.made == [1, 2, 3]
    assert len(model.requests) == 3  # the fourth call was never made
    assert [m.content for m in result.messages if m.role == "tool"] == [
        "sent 1",
        "sent 2",
        "sent 3",
    ]
    assert reads == {"lookup": 1, "start_unless_known": 3, "finish_and_lookup": 3}

    with psycopg.connect(postgres_url, autocommit=True) as conn:
        table = sql.Identifier(postgres_schema, "journal")
        conn.execute(sql.SQL("DELETE FROM {} WHERE key = 'cancel'").format(table), ())
    same_run(await replay(run_id), result)
    assert (tools.made, len(model.requests)) == ([1, 2, 3], 3)
