"""Hostile input at the stores (issue 33, points 5 and 6), on memory, SQLite and PostgreSQL:
checkpoints damaged in storage (older headers whose fields have the wrong JSON type, schema
versions that are not integers, summary rows no store writes), ids and text no store could
keep, and the issue's own runs (a custom state writing a lone surrogate into its notes, a
run id or worker id holding one). Each store answers the same: ``CheckpointError`` naming the
run, ``ConfigError`` for an id, U+FFFD for a lone surrogate, and ``list_runs`` lists every
run. (The rules themselves are the store contract's: ``agent_fsm.testing.store_contract``.)"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

import pytest

from agent_fsm import Agent, CheckpointError, ConfigError, CustomState, Row, Table
from agent_fsm.durable.checkpoint import CheckpointStore
from agent_fsm.messages import AssistantMessage, ToolCall, ToolMessage, UserMessage
from agent_fsm.run.custom import StepContext
from agent_fsm.state import RUN_STATE_ADAPTER, RunState
from agent_fsm.table import AgentState
from agent_fsm.testing import ScriptedModel, reply
from tests.conftest import limits
from tests.stores import Opener


def _write(opener: Opener, store: CheckpointStore, run_id: str, **columns: Any) -> None:
    """Overwrite what ``store`` keeps of ``run_id`` (``version``, ``header`` JSON text, or
    summary columns), as damage in storage would."""
    if opener.kind == "memory":
        stored = store._runs[run_id]  # type: ignore[attr-defined]
        if "header" in columns:
            stored.header = columns.pop("header").encode()
        if "version" in columns:
            stored.version = columns.pop("version")
        assert not columns, "the memory store keeps only its header and version as data"
        return
    names = {"version": "schema_version", "messages": "message_count"}
    assignments = ", ".join(f"{names.get(name, name)} = ?" for name in columns)
    values = [*columns.values(), run_id]
    if opener.kind == "sqlite":
        with sqlite3.connect(opener.location[0]) as conn:
            conn.execute(f"UPDATE runs SET {assignments} WHERE run_id = ?", values)
        return
    import psycopg

    url, schema = opener.location
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT set_config('search_path', quote_ident(%s), false)", (schema,))
        statement = f"UPDATE runs SET {assignments} WHERE run_id = ?".replace("?", "%s")
        conn.execute(statement, values)  # type: ignore[arg-type]


def _older_header(**fields: Any) -> str:
    """A header as an older agent_fsm wrote it, with ``fields`` (of any JSON type) in it."""
    header = RUN_STATE_ADAPTER.dump_python(RunState(run_id="r", state=AgentState.ACT), mode="json")
    for newer in ("decisions", "stop_reason", "messages", "trace"):
        header.pop(newer)
    header.update(fields)
    return json.dumps(header)


# (version, the header's fields of the wrong type): each makes a real migration trip
_WRONG_TYPES = {
    "approvals-a-string": (1, {"approvals": "yes"}),
    "control-a-list": (1, {"approvals": {"c1": True}, "control": []}),
    "a-pending-call-a-number": (1, {"approvals": {"c1": True}, "control": {"pending_calls": [1]}}),
    "pending-calls-a-number": (1, {"approvals": {"c1": True}, "control": {"pending_calls": 5}}),
    "last-call-a-list": (2, {"loop": {"last_call": ["x"], "call_repeats": 1}}),
    "header-a-list": (2, None),
}


@pytest.mark.parametrize("case", list(_WRONG_TYPES))
def test_an_older_header_with_fields_of_the_wrong_type_is_a_checkpoint_error(
    open_store: Opener, case: str
) -> None:
    """Not ``AttributeError``/``TypeError`` from the migration: ``CheckpointError`` naming
    the run, from ``load`` and ``resume``; ``list_runs`` lists it among the others."""
    store = open_store()
    store.save(RunState(run_id="before"))
    store.save(RunState(run_id="r"))
    store.save(RunState(run_id="after"))
    version, fields = _WRONG_TYPES[case]
    _write(
        open_store,
        store,
        "r",
        version=version,
        header="[1]" if fields is None else _older_header(**fields),
    )
    with pytest.raises(CheckpointError, match="checkpoint of run 'r' is unreadable"):
        store.load("r")
    with pytest.raises(CheckpointError, match="'r' is unreadable"):
        Agent(model=ScriptedModel([]), store=store).resume_sync("r")
    assert [run.run_id for run in store.list_runs()] == ["after", "r", "before"]
    assert store.load("before") == RunState(run_id="before")


@pytest.mark.parametrize("version", ["three", 2.5, "", b"3"])
def test_a_schema_version_that_is_not_an_integer_is_a_checkpoint_error(
    open_store: Opener, version: object
) -> None:
    """What a damaged row (or another program) left in the version: ``load`` refuses it by
    name; ``list_runs`` lists the run as unreadable, and the others as usual. (PostgreSQL's
    column holds integers only.)"""
    if open_store.kind == "postgres":
        pytest.skip("PostgreSQL's schema_version column holds integers only")
    store = open_store()
    store.save(RunState(run_id="r", state=AgentState.THINK))
    store.save(RunState(run_id="other"))
    _write(open_store, store, "r", version=version)
    with pytest.raises(CheckpointError, match=r"'r' has schema version .* not an integer"):
        store.load("r")
    runs = {run.run_id: run for run in store.list_runs()}
    assert list(runs) == ["other", "r"]
    assert runs["r"].unreadable is not None
    assert "not an integer" in runs["r"].unreadable
    assert runs["r"].state is AgentState.THINK
    assert runs["other"].unreadable is None


@pytest.mark.parametrize(
    ("columns", "named"),
    [
        ({"turns": "many"}, "turns is 'many'"),
        ({"state": ""}, "state is ''"),
        ({"created_at": "yesterday", "last_row": -1}, "last_row is -1, created_at is 'yesterday'"),
        ({"messages": "lots"}, "messages is 'lots'"),
    ],
)
def test_a_summary_row_no_store_writes_is_listed_as_unreadable(
    open_store: Opener, columns: dict[str, Any], named: str
) -> None:
    if open_store.kind == "memory":
        pytest.skip("the memory store keeps summaries as objects")
    if open_store.kind == "postgres" and set(columns) & {"turns", "created_at", "messages"}:
        pytest.skip("PostgreSQL's typed columns refuse such values")
    store = open_store()
    store.save(RunState(run_id="r"))
    store.save(RunState(run_id="other"))
    _write(open_store, store, "r", **columns)
    runs = {run.run_id: run for run in store.list_runs()}
    assert list(runs) == ["other", "r"]
    assert runs["r"].unreadable == f"its summary is unreadable: {named}"
    assert not runs["r"].stuck


def test_lone_surrogates_and_nuls_anywhere_in_a_run_save_on_every_store(
    open_store: Opener,
) -> None:
    """The transcript's text is cleaned where it enters the run; a store must not depend on
    that. Nothing raises an encoding or serializer error: a store that encodes the text
    writes U+FFFD for a lone surrogate, and the summary (which PostgreSQL keeps in text
    columns) makes a NUL U+FFFD on every store."""
    store = open_store()
    call = ToolCall(id="c\ud800", name="t", arguments='{"path": "\udcff"}')
    state = RunState(
        run_id="r",
        notes={"nul": "a\x00b"},
        output="an answer with a NUL \x00 and a half \ud83d",
        messages=[
            UserMessage(content="half \ud83d"),
            AssistantMessage(content="", tool_calls=(call,)),
            ToolMessage(tool_call_id=call.id, name="t", content="\x00", details={"k\ud800": 1}),
        ],
    )
    store.save(state)
    loaded = store.load("r")
    assert loaded.notes == {"nul": "a\x00b"}
    assert loaded.output == "an answer with a NUL \x00 and a half \ufffd"
    if open_store.kind != "memory":  # it keeps the (frozen) message objects
        assert loaded.messages[0].content == "half \ufffd"
        assert loaded.messages[2].details == {"k\ufffd": 1}
    (summary,) = store.list_runs()
    assert summary.output == "an answer with a NUL \ufffd and a half \ufffd"
    journal = store.journal("r")
    journal.record_started("1:0:c\ud800", call)
    journal.record_finished(
        "1:0:c\ud800", ToolMessage(tool_call_id="c", name="t", content="\ud83d")
    )
    entry = journal.lookup("1:0:c\ud800")
    assert entry is not None
    assert entry.result is not None


def _noting(text: str) -> Table:
    """The default loop with a NOTE state before the first THINK, whose work writes ``text``
    into the run's notes (the issue's custom state)."""

    def note(step: StepContext) -> None:
        step.notes["f"] = text

    return (
        Table.default()
        .with_states(CustomState("NOTE", trigger="noted", work=note))
        .with_guards(not_noted=lambda state, limits: "f" not in state.notes)
        .insert(
            [Row("observed", "OBSERVE", "NOTE", ("not_noted",), "note")],
            before=("OBSERVE", "think"),
        )
        .insert([Row("noted", "NOTE", "THINK", (), "on")], before=("OBSERVE", "aborted"))
    )


def test_a_custom_state_writing_a_lone_surrogate_into_its_notes(open_store: Opener) -> None:
    """Issue 33, point 5: ``step.notes["f"] = "half \\ud83d"`` raised
    ``PydanticSerializationError`` out of ``run()`` with SQLiteStore. The run completes on
    every store, and its checkpoint holds the note with U+FFFD."""
    store = open_store()
    agent = Agent(
        model=ScriptedModel([reply("done")]),
        table=_noting("half \ud83d"),
        store=store,
        limits=limits(),
    )
    result = agent.run_sync("go", run_id="noted")
    assert result.output == "done"
    assert store.load("noted").notes == {"f": "half \ufffd"}


@pytest.mark.parametrize("run_id", ["half \ud83d", "nul\x00", "x" * 5000])
def test_a_run_id_no_store_could_keep_is_refused_before_the_run_starts(
    open_store: Opener, run_id: str
) -> None:
    """Issue 33, point 5: a ``UnicodeEncodeError`` on SQLite, accepted by the memory store.
    Now ``ConfigError`` from ``start``, on every store, before anything is written."""
    store = open_store()
    agent = Agent(model=ScriptedModel([reply("done")]), store=store, limits=limits())
    with pytest.raises(ConfigError, match="run id"):
        agent.start("go", run_id=run_id)
    with pytest.raises(ConfigError, match="run id"):
        agent.resume_sync(run_id)
    assert store.list_runs() == []


def test_a_worker_id_no_store_could_keep_is_refused_before_the_run_starts(
    open_store: Opener,
) -> None:
    store = open_store()
    with pytest.raises(ConfigError, match="worker id 'worker \\\\udcff'"):
        Agent(  # refused as the agent is built: it would lease every run under that id
            model=ScriptedModel([reply("done")]),
            store=store,
            limits=limits(),
            lease_s=30,
            worker_id="worker \udcff",
        )
    assert store.list_runs() == []
