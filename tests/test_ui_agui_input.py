"""AG-UI input (``POST /agui``, issue 36): a ``RunAgentInput`` starts a thread's run or
resumes its pause (an ask_user answered by the user's message or the interrupt's resume
entry, approvals decided in it, edited arguments checked against the tool's schema), and
the drive comes back as AG-UI events over SSE. Served by uvicorn on 127.0.0.1 and spoken to
with httpx. Each promise on this surface: bad input gets a clear 4xx and changes nothing,
a repeated answer runs no tool twice, the transcript answers every call exactly once, and
the POST is refused from another site or without the CSRF token (or the ui's token)."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent_fsm import Agent
from agent_fsm.messages import AssistantMessage, ToolMessage, UserMessage
from agent_fsm.state import ControlKind, RunResult, RunState
from agent_fsm.table import TABLE, AgentState, StopReason
from agent_fsm.testing import ScriptedModel, call, check_invariants, reply
from tests.conftest import limits
from tests.ui_support import Runs, get, get_weather, paid, sqlite_runs, transfer, ui

httpx = pytest.importorskip("httpx2", reason="httpx2 (a dev dependency) is not installed")

CSRF = "test-csrf-token"


@pytest.fixture
def runs(tmp_path: Path) -> Iterator[Runs]:
    found = sqlite_runs(tmp_path)
    yield found
    found.store.close()


def _events(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]


def _post(base: str, body: Any, headers: dict[str, str] | None = None) -> Any:
    sent = {"content-type": "application/json", "x-csrf-token": CSRF, **(headers or {})}
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(f"{base}/agui", content=data, headers=sent, timeout=60)


def _input(thread: str, run: str, *messages: str, **fields: Any) -> dict[str, Any]:
    return {
        "threadId": thread,
        "runId": run,
        "state": {},
        "messages": [
            {"id": f"m{i}", "role": "user", "content": text} for i, text in enumerate(messages)
        ],
        "tools": [],
        "context": [],
        "forwardedProps": {},
        **fields,
    }


def _settled(runs: Runs, run_id: str) -> RunState:
    """The run once the server's drive stopped it (the stream ends with the drive; the
    stop's save may land just after)."""
    for _ in range(3000):
        state = runs.store.load(run_id)
        if state.state in (AgentState.DONE, AgentState.ERROR):
            return state
        time.sleep(0.01)
    raise AssertionError(f"run {run_id} did not stop")


def _answered_once(state: RunState) -> None:
    """The transcript answers every tool call exactly once."""
    calls = [c.id for m in state.messages if isinstance(m, AssistantMessage) for c in m.tool_calls]
    results = [m.tool_call_id for m in state.messages if isinstance(m, ToolMessage)]
    assert sorted(calls) == sorted(results)
    assert len(set(results)) == len(results)


def _checked(state: RunState) -> None:
    _answered_once(state)
    check_invariants(RunResult.from_state(state, TABLE), limits=limits(), rows=TABLE)


def test_an_input_starts_a_thread_and_streams_its_run(runs: Runs) -> None:
    agent = Agent(
        model=ScriptedModel([reply("", call("get_weather", city="Oslo")), "Cold in Oslo."]),
        tools=[get_weather],
        limits=limits(),
        store=runs.store,
    )
    app_runs = Runs(runs.store, agent, runs.finished, runs.asking, runs.approving)
    with ui(app_runs, csrf=CSRF) as base:
        before = {"role": "assistant", "id": "a0", "content": "Hello, ask me anything."}
        body = _input("thread-oslo", "agui-run-1", "Weather in Oslo?")
        body["messages"] = [before, *body["messages"]]
        response = _post(base, body)
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = _events(response.text)
    kinds = [event["type"] for event in events]
    assert kinds[:2] == ["RUN_STARTED", "STATE_SNAPSHOT"]
    assert events[1]["snapshot"]["fsm"] == {"state": "OBSERVE", "turn": 0, "stop": None}
    assert (events[0]["threadId"], events[0]["runId"]) == ("thread-oslo", "agui-run-1")
    assert kinds[-1] == "RUN_FINISHED"
    assert (events[-1]["threadId"], events[-1]["runId"]) == ("thread-oslo", "agui-run-1")
    assert events[-1]["outcome"] == {"type": "success"}
    assert events[-1]["result"] == "Cold in Oslo."
    assert "TOOL_CALL_START" in kinds
    assert "TOOL_CALL_RESULT" in kinds
    assert "STATE_DELTA" in kinds
    text = "".join(e["delta"] for e in events if e["type"] == "TEXT_MESSAGE_CONTENT")
    assert "Cold in Oslo." in text
    state = _settled(runs, "thread-oslo")
    assert state.output == "Cold in Oslo."
    assert AssistantMessage(content="Hello, ask me anything.") in state.messages  # its history
    assert [m.content for m in state.messages if isinstance(m, UserMessage)] == ["Weather in Oslo?"]
    _checked(state)


def test_an_ask_user_interrupt_is_answered_by_the_users_message(runs: Runs) -> None:
    with ui(runs, csrf=CSRF) as base:
        control = runs.store.load(runs.asking).control
        assert control is not None
        body = _input(runs.asking, "agui-2", "Weather?", "Lyon")
        response = _post(base, body)
        assert response.status_code == 200
        events = _events(response.text)
        assert events[-1]["type"] == "RUN_FINISHED"
        assert events[-1]["runId"] == "agui-2"
        assert events[-1]["result"] == "Sunny in Lyon."
        again = _post(base, _input(runs.asking, "agui-3", "Lyon"))  # the run has finished
        assert again.status_code == 422
        assert "has finished (final_answer)" in again.json()["error"]
    state = _settled(runs, runs.asking)
    assert state.output == "Sunny in Lyon."
    assert UserMessage(content="Lyon") in state.messages
    assert [m.content for m in state.messages if isinstance(m, UserMessage)].count("Lyon") == 1
    _checked(state)


def test_an_approval_interrupt_is_resumed_with_edited_arguments_once(runs: Runs) -> None:
    control = runs.store.load(runs.approving).control
    assert control is not None
    assert control.kind is ControlKind.APPROVAL
    call_id = control.pending_calls[0].id
    with ui(runs, csrf=CSRF) as base:
        wrong = {"interruptId": control.pause, "status": "resolved"}
        bad_edit = {
            **wrong,
            "payload": {"decisions": {call_id: {"allow": True, "arguments": {"amount": "lots"}}}},
        }
        refused = _post(base, _input(runs.approving, "agui-4", resume=[bad_edit]))
        assert refused.status_code == 422
        assert "do not fit the tool" in refused.json()["error"]
        assert runs.store.load(runs.approving).stop_reason is StopReason.APPROVAL_REQUIRED
        edit = {"allow": True, "arguments": {"amount": 50, "to": "bob"}, "reason": "too much"}
        good = {**wrong, "payload": {"decisions": {call_id: edit}}}
        response = _post(base, _input(runs.approving, "agui-5", resume=[good]))
        assert response.status_code == 200
        events = _events(response.text)
        assert events[-1]["type"] == "RUN_FINISHED"
        assert events[-1]["outcome"] == {"type": "success"}
        _settled(runs, runs.approving)
        repeated = _post(base, _input(runs.approving, "agui-6", resume=[good]))
        assert repeated.status_code == 422
        assert "is not what run" in repeated.json()["error"]
    assert paid == [(50, "bob")]  # once, with the edited arguments
    state = runs.store.load(runs.approving)
    _checked(state)
    told = [m.content for m in state.messages if isinstance(m, UserMessage)]
    assert "changed its arguments" in told[-1]


def test_a_denial_by_a_cancelled_resume_entry_runs_nothing(runs: Runs) -> None:
    control = runs.store.load(runs.approving).control
    assert control is not None
    with ui(runs, csrf=CSRF) as base:
        entry = {"interruptId": control.pause, "status": "cancelled"}
        response = _post(base, _input(runs.approving, "agui-7", resume=[entry]))
        assert response.status_code == 200
        assert _events(response.text)[-1]["type"] in ("RUN_FINISHED", "RUN_ERROR")
    assert paid == []
    _answered_once(_settled(runs, runs.approving))


def _bad_inputs(runs: Runs) -> list[tuple[str, Any, dict[str, str], int, str]]:
    control = runs.store.load(runs.approving).control
    assert control is not None
    good = _input(runs.asking, "r", "Lyon")
    return [
        ("not json", b"{not json", {}, 400, "not JSON"),
        ("a form", b"threadId=x", {"content-type": "text/plain"}, 415, "application/json"),
        ("no thread", {**good, "threadId": ""}, {}, 422, "threadId"),
        ("a message without a role", {**good, "messages": [{"id": "m"}]}, {}, 422, "role"),
        ("messages not a list", {**good, "messages": "Lyon"}, {}, 422, "messages"),
        (
            "front-end tools",
            {**good, "tools": [{"name": "rm_rf", "description": "", "parameters": {}}]},
            {},
            422,
            "rm_rf",
        ),
        ("a new thread without text", _input("new-thread", "r"), {}, 422, "user message"),
        (
            "a thread id no store keeps",
            _input("bad\x00id", "r", "hi"),
            {},
            422,
            "thread id",
        ),
        (
            "approvals without a decision",
            _input(runs.approving, "r", "yes"),
            {},
            422,
            "waits for approvals",
        ),
        (
            "another interrupt",
            _input(runs.asking, "r", resume=[{"interruptId": "pause-999", "payload": "x"}]),
            {},
            422,
            "is not what run",
        ),
        (
            "an approval payload of the wrong shape",
            _input(
                runs.approving,
                "r",
                resume=[{"interruptId": control.pause, "payload": {"decisions": 3}}],
            ),
            {},
            422,
            "decisions",
        ),
        ("no csrf token", good, {"x-csrf-token": "wrong"}, 403, "CSRF"),
        ("another site", good, {"origin": "http://evil.example"}, 403, "another site"),
        ("too large", b" " * 1_000_001, {}, 413, "larger"),
    ]


def test_bad_input_gets_a_clear_4xx_and_changes_nothing(runs: Runs) -> None:
    before = {run.run_id: run for run in runs.store.list_runs()}
    stored = {run_id: runs.store.load(run_id) for run_id in before}
    with ui(runs, csrf=CSRF) as base:
        for name, body, headers, status, says in _bad_inputs(runs):
            response = _post(base, body, headers)
            assert response.status_code == status, name
            assert says in response.json()["error"], (name, response.text)
    after = {run.run_id: run for run in runs.store.list_runs()}
    assert set(after) == set(before)
    for run_id, state in stored.items():
        assert runs.store.load(run_id) == state  # nothing changed
    assert paid == []


def test_a_token_stands_for_the_csrf_token_and_the_host_check_holds(runs: Runs) -> None:
    with ui(runs, csrf=CSRF, token="s3cret", hosts=None) as base:
        body = _input(runs.asking, "agui-8", "Lyon")
        bare = {"content-type": "application/json"}
        no_token = httpx.post(f"{base}/agui", content=json.dumps(body), headers=bare)
        assert no_token.status_code == 401
        bearer = {**bare, "authorization": "Bearer s3cret"}
        response = httpx.post(f"{base}/agui", content=json.dumps(body), headers=bearer, timeout=60)
        assert response.status_code == 200
        assert _events(response.text)[-1]["result"] == "Sunny in Lyon."
    with ui(runs, csrf=CSRF) as base:
        status, _, _ = get(base.replace("127.0.0.1", "localhost") + "/")
        assert status == 200
        other_host = httpx.post(
            f"{base}/agui", content=b"{}", headers={"host": "evil.example", **bare}
        )
        assert other_host.status_code == 400


def test_an_input_for_a_run_going_on_is_a_conflict(runs: Runs) -> None:
    gate: list[str] = []

    def slow(city: str) -> str:
        """Slow weather."""
        while not gate:
            time.sleep(0.01)
        return f"sunny in {city}"

    from agent_fsm import tool

    slow_tool = tool(slow)
    agent = Agent(
        model=ScriptedModel([reply("", call("slow", city="Rome")), "Warm in Rome."]),
        tools=[slow_tool, transfer],
        limits=limits(tool_timeout_s=60),
        store=runs.store,
    )
    app_runs = Runs(runs.store, agent, runs.finished, runs.asking, runs.approving)
    with ui(app_runs, csrf=CSRF) as base:
        with httpx.stream(
            "POST",
            f"{base}/agui",
            content=json.dumps(_input("thread-rome", "agui-9", "Rome?")),
            headers={"content-type": "application/json", "x-csrf-token": CSRF},
            timeout=60,
        ) as streaming:
            lines = streaming.iter_lines()
            for line in lines:
                if "TOOL_CALL_START" in line:
                    break
            busy = _post(base, _input("thread-rome", "agui-10", "again"))
            assert busy.status_code == 409
            assert "is going on" in busy.json()["error"]
            gate.append("go")
            rest = "\n".join(lines)
        assert re.search(r'"type":"RUN_FINISHED"', rest)
    state = _settled(runs, "thread-rome")
    assert state.output == "Warm in Rome."
    _checked(state)


def test_one_decision_for_every_pending_call_and_a_client_that_goes_away(runs: Runs) -> None:
    """``payload: true`` approves every pending call; the client closing the stream at once
    stops nothing: the server drives the run to its end, the call made once."""
    control = runs.store.load(runs.approving).control
    assert control is not None
    entry = {"interruptId": control.pause, "status": "resolved", "payload": True}
    with ui(runs, csrf=CSRF) as base:
        with httpx.stream(
            "POST",
            f"{base}/agui",
            content=json.dumps(_input(runs.approving, "agui-11", resume=[entry])),
            headers={"content-type": "application/json", "x-csrf-token": CSRF},
            timeout=60,
        ) as streaming:
            assert streaming.status_code == 200
            first = next(streaming.iter_lines())
            assert '"RUN_STARTED"' in first
        state = _settled(runs, runs.approving)
    assert paid == [(500, "bob")]
    assert state.stop_reason is StopReason.FINAL_ANSWER
    _checked(state)
