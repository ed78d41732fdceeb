"""A worker of tests/test_leases_crash.py: drives the queued runs of a PostgresStore under
leases, until every run has stopped.

``python -m tests.lease_worker URL SCHEMA WORKER_ID`` takes the runs that have not stopped,
in a random order, and resumes each (``Agent.resume``: a run never stepped and a run whose
worker died continue the same way, from their last checkpoint). A run another worker leases
is skipped (``RunLeased``) and tried again later, once its lease may have expired. Each run
makes ``STEPS`` tool turns of two calls:

- ``send`` (not idempotent) inserts ``(run_id, step, worker)`` into the ``effects`` table:
  the side effect that must never happen twice;
- ``lookup`` (idempotent) computes a value; it may run again after a takeover.

The model is a function of the transcript, so a run taken over continues the same
conversation. Each run a worker finishes is recorded in ``finishes`` (run_id, worker). Prints
``ready`` once its store is open.
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
from typing import Any

import psycopg

from agent_fsm import Agent, Limits, ResumeError, RunLeased, tool
from agent_fsm.durable.postgres import PostgresStore
from agent_fsm.messages import AssistantMessage, ModelRequest, ModelResponse
from agent_fsm.table import TERMINAL_STATES
from agent_fsm.testing import FunctionModel, call, reply

STEPS = 3
LEASE_S = 1.0
PAUSE_S = 0.01
TABLES = """
CREATE TABLE effects (run_id text NOT NULL, step integer NOT NULL, worker text NOT NULL);
CREATE TABLE finishes (run_id text NOT NULL, worker text NOT NULL)
"""
"""What the workers record, in the store's schema (made by the test before they start)."""


def build_agent(store: PostgresStore, effects: psycopg.Connection[Any], worker: str) -> Agent:
    """The agent of one worker: the job agent, checkpointed in ``store`` under leases."""
    return job_agent(effects, worker, store=store, lease_s=LEASE_S, worker_id=worker)


def job_agent(effects: psycopg.Connection[Any], worker: str, **options: Any) -> Agent:
    """The agent every crash test's workers drive (tests/dbos_worker.py's too): ``STEPS``
    turns of a ``send`` and a ``lookup`` call, then "done"; ``options`` are more ``Agent``
    settings."""

    @tool
    def send(step: int, run: str) -> str:
        """Send the message of one step (not idempotent)."""
        time.sleep(PAUSE_S)
        effects.execute("INSERT INTO effects VALUES (%s, %s, %s)", (run, step, worker))
        time.sleep(PAUSE_S)  # a kill here leaves a call done but not recorded finished
        return f"sent step {step}"

    @tool(idempotent=True)
    def lookup(key: int) -> int:
        """Look a value up."""
        time.sleep(PAUSE_S)
        return key * key

    async def model(request: ModelRequest) -> ModelResponse:
        await asyncio.sleep(PAUSE_S)
        made = sum(1 for m in request.messages if isinstance(m, AssistantMessage) and m.tool_calls)
        if made >= STEPS:
            return reply("done")
        step = made + 1
        return reply("", call("send", step=step, run=request.run_id), call("lookup", key=step))

    return Agent(
        model=FunctionModel(model),
        tools=[send, lookup],
        limits=Limits(max_turns=4 * STEPS, loop_detection=False),
        **options,
    )


def unfinished(store: PostgresStore) -> list[str]:
    return [run.run_id for run in store.list_runs() if run.state not in TERMINAL_STATES]


async def work(agent: Agent, store: PostgresStore, effects: psycopg.Connection[Any]) -> int:
    """Drive runs until none is left; return how many this worker finished."""
    finished = 0
    worker = agent.worker_id
    while pending := unfinished(store):
        random.shuffle(pending)
        for run_id in pending:
            try:
                result = await agent.resume(run_id)
            except (RunLeased, ResumeError):  # another worker drives it, or finished it
                continue
            assert result.output == "done", result
            effects.execute("INSERT INTO finishes VALUES (%s, %s)", (run_id, worker))
            finished += 1
        await asyncio.sleep(0.1)  # what is left is leased: wait for leases to expire
    return finished


def main(url: str, schema: str, worker: str) -> int:
    with (
        PostgresStore(url, schema=schema) as store,
        psycopg.connect(url, autocommit=True) as effects,
    ):
        effects.execute("SELECT set_config('search_path', quote_ident(%s), false)", (schema,))
        agent = build_agent(store, effects, worker)
        print("ready", flush=True)
        finished = asyncio.run(work(agent, store, effects))
    print(f"finished {finished}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
