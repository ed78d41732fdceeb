"""A run remembers the agent that made it (issue 35, point 5): a resume by a different agent
(other tools, schemas, prompt or table) is refused saying what differs, before anything is
used up; the run's approval rules hold whoever resumes it; a checkpoint of an older
agent_fsm (no record) resumes as before."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agent_fsm import Agent, MemoryStore, ResumeError, SQLiteStore, StopReason, tool
from agent_fsm.durable.checkpoint import CheckpointStore
from agent_fsm.messages import ToolMessage, ToolStatus
from agent_fsm.run.identity import keep_approvals
from agent_fsm.state import RUN_STATE_ADAPTER
from agent_fsm.table import TABLE
from agent_fsm.testing import ScriptedModel, call, reply
from agent_fsm.testing.invariants import check_invariants
from tests.conftest import echo, limits
from tests.custom_tables import once

ran: list[str] = []


@tool(requires_approval=True)
def delete_file(path: str) -> str:
    """Delete a file."""
    ran.append(path)
    return "deleted"


@tool(name="delete_file")
def delete_file_unguarded(path: str) -> str:
    """Delete a file."""
    ran.append(path)
    return "deleted"


@tool(name="delete_file")
def delete_file_other_schema(path: str, force: bool = False) -> str:
    """Delete a file."""
    ran.append(path)
    return "deleted"


@tool
def rm(path: str) -> str:
    """Remove a file."""
    return "removed"


def _note(context: Any) -> None:
    context.notes["noted"] = True


@pytest.fixture(autouse=True)
def _clear() -> None:
    ran.clear()


def _agent(store: CheckpointStore, script: list[Any], **options: Any) -> Agent:
    settings: dict[str, Any] = {"tools": [delete_file, echo], "system_prompt": "Be careful."}
    settings.update(options)
    return Agent(model=ScriptedModel(script), store=store, limits=limits(), **settings)


def _paused(store: CheckpointStore) -> str:
    """A run of the first agent, paused on the approval of one delete_file call."""
    first = _agent(store, [reply("", call("delete_file", path="/tmp/a"))])
    result = first.run_sync("clean up")
    assert result.stop_reason is StopReason.APPROVAL_REQUIRED
    return result.run_id


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"tools": [echo]}, "it has no tool 'delete_file'"),
        ({"tools": [delete_file, echo, rm]}, "tools the run did not: 'rm'"),
        ({"tools": [delete_file_other_schema, echo]}, "schema of 'delete_file' changed"),
        ({"system_prompt": "Be quick."}, "system prompt differs"),
        ({"table": once("NOTE", _note, mark="noted")}, "its table differs"),
    ],
    ids=["missing-tool", "added-tool", "changed-schema", "prompt", "table"],
)
def test_a_different_agent_cannot_resume_and_uses_nothing_up(
    tmp_path: Path, options: dict[str, Any], says: str
) -> None:
    store = SQLiteStore(tmp_path / "runs.db")
    run_id = _paused(store)
    stranger = _agent(store, ["never reached"], **options)
    with pytest.raises(ResumeError, match=f"run {run_id} was made by a different agent") as err:
        stranger.resume_sync(run_id, approvals=True, pause=_pause(store, run_id))
    assert says in str(err.value)
    assert ran == []
    # The approval was not used up: the agent that made the run resumes it, the call runs.
    same = _agent(store, [reply("done")])
    result = same.resume_sync(run_id, approvals=True, pause=_pause(store, run_id))
    assert result.stop_reason is StopReason.FINAL_ANSWER
    assert ran == ["/tmp/a"]
    check_invariants(result, limits=same.limits, bound=same.bound)


def _pause(store: CheckpointStore, run_id: str) -> str:
    control = store.load(run_id).control
    assert control is not None
    return control.pause


def test_the_record_is_stored_with_the_run_as_digests(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "runs.db")
    run_id = _paused(store)
    record = store.load(run_id).agent
    assert record is not None
    assert set(record.tools) == {"delete_file", "echo", "ask_user", "finish_task"}
    assert record.approval == ("delete_file",)
    assert "Be careful." not in record.model_dump_json()  # digests, not copies


def test_a_resume_keeps_the_runs_approval_rules() -> None:
    """Resumed by an agent whose delete_file asks no approval (the CLI's resume without
    --require-approval), the model's next delete_file call still waits for one."""
    store = MemoryStore()
    run_id = _paused(store)
    forgetful = _agent(
        store,
        [reply("", call("delete_file", path="/tmp/b")), "never reached"],
        tools=[delete_file_unguarded, echo],
    )
    result = forgetful.resume_sync(run_id, approvals=True, pause=_pause(store, run_id))
    assert result.stop_reason is StopReason.APPROVAL_REQUIRED
    assert ran == ["/tmp/a"]  # the approved call ran, the new one waits
    assert result.pending is not None
    assert [json.loads(c.arguments) for c in result.pending.pending_calls] == [{"path": "/tmp/b"}]
    skipped = [m for m in result.messages if isinstance(m, ToolMessage)][-1]
    assert skipped.status is ToolStatus.SKIPPED
    # and the rule survives this resume too: a refusal then an answer end the run
    again = _agent(store, [reply("ok")], tools=[delete_file_unguarded, echo])
    final = again.resume_sync(run_id, approvals=False, pause=result.pending.pause)
    assert final.stop_reason is StopReason.FINAL_ANSWER
    assert ran == ["/tmp/a"]
    check_invariants(final, limits=again.limits, bound=again.bound)


def test_an_agent_without_approvals_keeps_its_approval_row_dead() -> None:
    """Free when off: the record changes nothing for a run whose tools ask no approval."""
    store = MemoryStore()
    agent = _agent(store, [reply("", call("ask_user", question="which?"))], tools=[echo])
    assert "approval_pending" in agent.run_config.dead_guards
    result = agent.run_sync("go")
    assert result.stop_reason is StopReason.ASK_USER
    assert keep_approvals(agent.run_config, store.load(result.run_id)) is agent.run_config


def test_a_checkpoint_without_a_record_resumes_with_any_agent(tmp_path: Path) -> None:
    """Runs checkpointed before the record existed have none: any agent may resume them."""
    store = MemoryStore()
    run_id = _paused(store)
    state = store.load(run_id)
    header = json.loads(RUN_STATE_ADAPTER.dump_json(state))
    del header["agent"]
    old = RUN_STATE_ADAPTER.validate_json(json.dumps(header))
    assert old.agent is None
    store.save(old)
    other = _agent(store, [reply("done")], system_prompt="Another prompt.")
    result = other.resume_sync(run_id, approvals=True, pause=_pause(store, run_id))
    assert result.stop_reason is StopReason.FINAL_ANSWER
    assert ran == ["/tmp/a"]


def test_the_default_table_digest_is_stable() -> None:
    """The record is the same for two agents built alike (a restart resumes its runs)."""
    one = _agent(MemoryStore(), [])
    two = _agent(MemoryStore(), [], table=TABLE)
    assert one.run_config.record == two.run_config.record


async def test_a_worker_takes_queued_work_as_its_own_and_never_another_agents_run() -> None:
    """A producer (no tools) queues work: the worker that takes it, before any step, records
    itself. A run another agent began is set aside by a worker of a different agent, and
    taken by one of the same."""
    store = MemoryStore()
    producer = Agent(model=ScriptedModel([]), store=store)
    producer.enqueue("queued work", run_id="queued")
    assert store.load("queued").agent == producer.run_config.record
    started = _agent(store, [reply("", call("echo", text="x")), "never reached"])
    await started.start("started work", run_id="started").step()  # then its process died

    def worker(name: str, script: list[Any], **options: Any) -> Agent:
        return _agent(store, script, lease_s=30, worker_id=name, **options)

    stranger = worker("stranger", ["done by the stranger"], tools=[echo])
    taken = stranger.take_next()
    assert taken is not None
    assert taken.run_id == "queued"
    assert (await taken.run()).output == "done by the stranger"
    assert store.load("queued").agent == stranger.run_config.record
    assert stranger.take_next() is None  # "started" is another agent's: set aside
    lease = store.lease("started")
    assert lease is not None
    assert lease.owner == "stranger"
    store.release(lease)
    same = worker("same", ["done by the same agent"])
    again = same.take_next()
    assert again is not None
    assert again.run_id == "started"
    assert (await again.run()).output == "done by the same agent"


def test_a_run_that_took_no_step_is_anyones_to_resume() -> None:
    """Started, then its process died before a step: nothing was asked or run, so a worker
    of another configuration may carry it on (a producer that starts runs for workers), and
    the run is then that worker's."""
    store = MemoryStore()
    Agent(model=ScriptedModel([]), store=store).start("begun", run_id="r")
    worker = _agent(store, [reply("", call("echo", text="hi")), "done"])
    result = worker.resume_sync("r")
    assert (result.stop_reason, result.output) == (StopReason.FINAL_ANSWER, "done")
    assert store.load("r").agent == worker.run_config.record
