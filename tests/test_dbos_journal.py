"""The tool journal inside a DBOS tool step, when it fails (issue 34, point 1): a call whose
effect may have happened is answered "outcome unknown", never "failed" and never "not run";
a call that was not made says so; a dropped connection is made again.

The journal is a ``PostgresStore``; PostgreSQL itself fails it: its ``journal`` table renamed
away (every look-up and write fails), a trigger that refuses every write (look-ups work), or
its connection terminated (the next statement fails, the one after it connects again). The
model and the tools do that at the moment each test needs.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

pytest.importorskip("psycopg")
pytest.importorskip("dbos")

import psycopg
from psycopg import sql

from agent_fsm import StopReason, tool
from agent_fsm.dbos.replay import CANCEL_CALL, CANCEL_KEY
from agent_fsm.durable.journal import CallStatus
from agent_fsm.durable.postgres import PostgresStore
from agent_fsm.messages import ModelRequest, ModelResponse, ToolCall, ToolMessage, ToolStatus
from agent_fsm.testing import FunctionModel, call, reply
from agent_fsm.testing.invariants import check_invariants
from tests.dbos_worker import launched
from tests.test_dbos import durable

pytestmark = pytest.mark.slow  # real processes or servers: make check leaves it out

UNKNOWN = "The outcome of this call to 'send' is unknown"


@pytest.fixture(scope="module")
def dbos_schema(postgres_url: str) -> Iterator[str]:
    with launched(postgres_url, "agent_fsm_journal") as schema:
        yield schema


class Journal:
    """The test's hand on the journal's database: the store, and ways to break it."""

    def __init__(self, url: str, schema: str) -> None:
        self.name = f"journal-{uuid.uuid4().hex[:8]}"
        separator = "&" if "?" in url else "?"
        self.store = PostgresStore(f"{url}{separator}application_name={self.name}", schema=schema)
        self.admin = psycopg.connect(url, autocommit=True)
        self.table = sql.Identifier(schema, "journal")
        self.schema = sql.Identifier(schema)

    def hide(self) -> None:
        """Every look-up and write fails (until ``restore``)."""
        self.admin.execute(sql.SQL("ALTER TABLE {} RENAME TO journal_away").format(self.table))

    def refuse_writes(self) -> None:
        """Every write fails (until ``restore``); look-ups work."""
        self.admin.execute(
            sql.SQL(
                "CREATE FUNCTION {}.refuse() RETURNS trigger LANGUAGE plpgsql AS"
                " $$ BEGIN RAISE EXCEPTION 'the journal refuses writes'; END $$;"
                " CREATE TRIGGER refuse BEFORE INSERT OR UPDATE ON {}"
                " FOR EACH ROW EXECUTE FUNCTION {}.refuse()"
            ).format(self.schema, self.table, self.schema)
        )

    def drop_connection(self) -> None:
        """The store's connection is terminated: its next statement fails."""
        self.admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
            (self.name,),
        )

    def restore(self) -> None:
        self.admin.execute(
            sql.SQL("ALTER TABLE IF EXISTS {}.journal_away RENAME TO journal").format(self.schema)
        )
        self.admin.execute(sql.SQL("DROP TRIGGER IF EXISTS refuse ON {}").format(self.table))

    def statuses(self, run_id: str) -> list[str]:
        rows = self.admin.execute(
            sql.SQL("SELECT status FROM {} WHERE run_id = %s AND key LIKE 'call:%%'").format(
                self.table
            ),
            (run_id,),
        )
        return [status for (status,) in rows]

    def close(self) -> None:
        self.admin.close()
        self.store.close()

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@pytest.fixture
def journal(dbos_schema: str, postgres_url: str, postgres_schema: str) -> Iterator[Journal]:
    with Journal(postgres_url, postgres_schema) as found:
        yield found


def one_send(before: Callable[[], None] = lambda: None) -> Callable[[ModelRequest], ModelResponse]:
    """A model that asks for one ``send`` (calling ``before`` first), then answers."""

    def model(request: ModelRequest) -> ModelResponse:
        if any(isinstance(m, ToolMessage) for m in request.messages):
            return reply("done")
        before()
        return reply("", call("send", step=1))

    return model


def sender(during: Callable[[], None] = lambda: None) -> tuple[list[int], Any]:
    """``send`` (not idempotent), which calls ``during`` once it has sent."""
    sent: list[int] = []

    @tool
    async def send(step: int) -> str:
        """Send the message of one step."""
        sent.append(step)
        await asyncio.to_thread(during)
        return f"sent {step}"

    return sent, send


async def answer_of(journal: Journal, model: Any, send: Any, run_id: str) -> ToolMessage:
    agent = durable(journal.store, model, [send])
    result = await agent.run("Do it.", run_id=run_id)
    check_invariants(result, limits=agent.agent.limits, bound=agent.agent.bound)
    assert (result.stop_reason, result.output) == (StopReason.FINAL_ANSWER, "done")
    return next(m for m in result.messages if isinstance(m, ToolMessage))


async def test_a_finished_call_whose_end_cannot_be_recorded_is_answered_outcome_unknown(
    journal: Journal,
) -> None:
    """The call ran (its effect happened); recording its end fails, also when tried again:
    "outcome unknown", as any later execution of the step would say (the journal says
    "started"), never "failed"."""
    sent, send = sender(during=journal.refuse_writes)
    answer = await answer_of(journal, one_send(), send, f"end-{uuid.uuid4().hex[:8]}")
    journal.restore()
    assert UNKNOWN in answer.content
    assert "could not record its end" in answer.content
    assert answer.details == {"runtime": {"outcome_unknown": True}}
    assert sent == [1]


async def test_a_journal_that_cannot_be_read_is_not_taken_for_a_call_never_made(
    journal: Journal,
) -> None:
    """The look-up fails (twice): an earlier execution of the step may have made the call,
    so it is answered "outcome unknown", not run (and not "failed")."""
    run_id = f"lookup-{uuid.uuid4().hex[:8]}"
    sent, send = sender()
    answer = await answer_of(journal, one_send(before=journal.hide), send, run_id)
    journal.restore()
    assert UNKNOWN in answer.content
    assert "journal could not be read" in answer.content
    assert answer.details == {"runtime": {"outcome_unknown": True}}
    assert sent == []


async def test_a_call_whose_start_cannot_be_recorded_is_not_made_and_says_so(
    journal: Journal,
) -> None:
    run_id = f"start-{uuid.uuid4().hex[:8]}"
    sent, send = sender()
    answer = await answer_of(journal, one_send(before=journal.refuse_writes), send, run_id)
    journal.restore()
    assert answer.status is ToolStatus.ERROR
    assert "its start could not be recorded in the journal" in answer.content
    assert "nothing was done" in answer.content
    assert sent == []


async def test_a_dropped_connection_is_made_again_and_the_answer_kept(journal: Journal) -> None:
    """The journal's connection is terminated while the call runs: recording its end is
    tried again on a new connection, and the call's own answer stands."""
    run_id = f"drop-{uuid.uuid4().hex[:8]}"
    sent, send = sender(during=journal.drop_connection)
    answer = await answer_of(journal, one_send(), send, run_id)
    assert (answer.status, answer.content) == (ToolStatus.OK, "sent 1")
    assert journal.statuses(run_id) == [CallStatus.FINISHED.value]
    assert sent == [1]


async def test_a_request_the_end_of_a_call_could_not_read_is_read_by_the_next_model_step(
    journal: Journal,
) -> None:
    """A tool step reads the cancel request with the record of its end; when that fails,
    the model step after it reads the request itself, so a request made during the call
    still stops the run before its next model call (``RunTime.request_seen``)."""
    run_id = f"unread-{uuid.uuid4().hex[:8]}"
    request = ToolCall(id=CANCEL_KEY, name=CANCEL_CALL, arguments='{"reason": "stop now"}')

    def cancelled_then_refused() -> None:  # as cancel_run records it, then writes fail
        journal.store.journal(run_id).record_started(CANCEL_KEY, request)
        journal.refuse_writes()

    sent, send = sender(during=cancelled_then_refused)
    model = FunctionModel(one_send())
    agent = durable(journal.store, model, [send])
    result = await agent.run("Do it.", run_id=run_id)
    journal.restore()
    check_invariants(result, limits=agent.agent.limits, bound=agent.agent.bound)
    assert (result.stop_reason, "stop now" in (result.error or "")) == (StopReason.ABORTED, True)
    answer = next(m for m in result.messages if isinstance(m, ToolMessage))
    assert "could not record its end" in answer.content
    assert (sent, len(model.requests)) == ([1], 1)  # the second model call was never made
