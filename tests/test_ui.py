"""``agent-fsm ui`` without a browser (issue 36): the runs list and its filters over SQLite
and PostgreSQL, a run's path (only the edges taken, each with its guard and count), the
step-through, AG-UI events, steering through the forms (an answer, approvals with edited
arguments, abort), and the safety rules (host, token, CSRF, no secret in a page)."""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path

import pytest

from agent_fsm import Agent, tool
from agent_fsm.cli import main
from agent_fsm.diagrams import edge_counts
from agent_fsm.durable.sqlite import SQLiteStore
from agent_fsm.errors import CheckpointError
from agent_fsm.events import RunFinished, RunPaused, RunStarted, StateChanged, ToolStarted
from agent_fsm.messages import AssistantMessage, ToolCall, ToolMessage, Usage, UserMessage
from agent_fsm.pricing import Pricing
from agent_fsm.state import ControlKind, RunStatus
from agent_fsm.table import TABLE, AgentState, StopReason
from agent_fsm.testing import ScriptedModel, call, reply
from agent_fsm.ui.agui import agui_events
from agent_fsm.ui.layout import draw_path
from agent_fsm.ui.recorded import TraceRuns
from agent_fsm.ui.runs import run_rows
from agent_fsm.ui.steps import step_at, trace_of
from tests.conftest import limits
from tests.ui_support import Runs, get, make_runs, paid, post, sqlite_runs, ui


@pytest.fixture
def runs(tmp_path: Path) -> Runs:
    return sqlite_runs(tmp_path)


def _csrf(page: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found is not None
    return found.group(1)


def _settled(runs: Runs, run_id: str, paused: StopReason) -> AgentState:
    """The run's state once the ui's background drive has taken it past the pause
    ``paused`` and stopped it."""
    for _ in range(3000):
        state = runs.store.load(run_id)
        if state.state in (AgentState.DONE, AgentState.ERROR) and state.stop_reason is not paused:
            return state.state
        time.sleep(0.01)
    raise AssertionError(f"run {run_id} did not stop")


# -- the runs list ---------------------------------------------------------------------


def _listing(runs: Runs) -> None:
    listed, more = run_rows(runs.store, TABLE)
    assert not more
    by_id = {row.run_id: row for row in listed}
    assert set(by_id) == {runs.finished, runs.asking, runs.approving}
    assert (by_id[runs.finished].stop, by_id[runs.finished].paused) == ("final_answer", False)
    assert (by_id[runs.asking].stop, by_id[runs.asking].paused) == ("ask_user", True)
    assert by_id[runs.approving].stop == "approval_required"
    assert by_id[runs.finished].turns == 2
    assert by_id[runs.finished].tokens > 0
    paused, _ = run_rows(runs.store, TABLE, stop="ask_user")
    assert [row.run_id for row in paused] == [runs.asking]
    done, _ = run_rows(runs.store, TABLE, state="DONE", limit=2)
    assert len(done) == 2
    assert run_rows(runs.store, TABLE, state="ERROR")[0] == []
    assert run_rows(runs.store, TABLE, limit=1)[1] is True


def test_the_runs_list_reads_stop_reasons_and_pauses_and_filters(runs: Runs) -> None:
    _listing(runs)


def test_the_runs_list_over_postgres(postgres_url: str, postgres_schema: str) -> None:
    from agent_fsm.durable.postgres import PostgresStore

    store = PostgresStore(postgres_url, schema=postgres_schema)
    try:
        _listing(make_runs(store))
    finally:
        store.close()


def test_the_runs_page_marks_paused_runs_and_filters(runs: Runs) -> None:
    with ui(runs) as base:
        status, page, headers = get(base + "/")
        assert status == 200
        assert page.count('<tr class="run') == 3
        assert page.count('<tr class="run paused"') == 2
        assert "2 waiting for you" in page
        _, only, _ = get(base + "/?stop=final_answer")
        assert only.count('<tr class="run') == 1
        assert runs.finished in only
    assert "default-src 'self'" in headers["content-security-policy"]
    assert "https://" not in page
    assert "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")


def test_the_runs_page_shows_the_cost_where_known_and_blank_where_not(runs: Runs) -> None:
    """A run made with prices records its cost in its checkpoint; the list shows it, and a
    blank cell for the runs made without prices."""
    priced = Agent(
        model=ScriptedModel([reply("Sunny.", usage=(1000, 500))]),
        tools=[],
        limits=limits(prices={"scripted": Pricing(input_per_million=2.0, output_per_million=8.0)}),
        store=runs.store,
    )
    result = priced.run_sync("Weather?")
    assert result.cost == pytest.approx(0.006)
    by_id = {row.run_id: row for row in run_rows(runs.store, TABLE)[0]}
    assert by_id[result.run_id].cost == pytest.approx(0.006)
    assert by_id[runs.finished].cost is None
    with ui(runs) as base:
        _, page, _ = get(base + "/")
    cells = dict(re.findall(r'data-run="([^"]+)".*?<td class="num cost">([^<]*)</td>', page))
    assert cells[result.run_id] == "0.0060"
    assert cells[runs.finished] == ""
    assert "<th>cost</th>" in page


# -- one run -----------------------------------------------------------------------------


def test_the_path_draws_only_the_edges_taken_with_guard_and_count(runs: Runs) -> None:
    state = runs.store.load(runs.finished)
    counts = edge_counts(TABLE, trace_of(state, TABLE))
    drawing = draw_path(TABLE, counts, stopped="DONE", tone="ok")
    taken = [i for i, n in enumerate(counts) if n]
    assert list(drawing.edges) == taken
    assert drawing.svg.count('<path class="edge') == len(taken) < len(TABLE) // 4
    think = next(i for i in taken if TABLE[i].label == "think")
    assert counts[think] == 2
    assert f'data-row="{think}"' in drawing.svg
    assert "think ×2" in drawing.svg
    guards = " ∧ ".join(TABLE[think].guards) or "else"
    assert f"[{guards}]" in drawing.svg
    assert set(drawing.states) == {"OBSERVE", "THINK", "ACT", "REFLECT", "DONE"}


def test_a_step_shows_the_prompt_the_reply_and_the_results_as_of_it(runs: Runs) -> None:
    state = runs.store.load(runs.finished)
    entries = trace_of(state, TABLE)
    to_act = next(n for n, e in enumerate(entries, 1) if e.dest == "ACT")
    step = step_at(state, TABLE, to_act)
    assert step.reply is not None
    assert [c.name for c in step.reply.tool_calls] == ["get_weather"]
    assert step.results == ()  # ACT has not run yet
    assert [m.role for m in step.prompt] == ["system", "user"] or [m.role for m in step.prompt] == [
        "user"
    ]
    after = step_at(state, TABLE, to_act + 1)
    assert [r.content for r in after.results] == ["sunny in Paris"]
    last = step_at(state, TABLE, len(entries))
    assert last.reply is not None
    assert last.reply.content == "It is sunny in Paris."
    assert last.model_calls == 2


def test_a_stored_run_keeps_each_calls_usage_and_a_step_shows_it(runs: Runs) -> None:
    """Each reply of a stored run carries its call's usage: a step shows the usage as of it
    (the replies' up to its turn, adding up to the run's total at the end) and its own (the
    call it took in, at the step right after it; none at the others)."""
    state = runs.store.load(runs.finished)
    replies_usage = [m.usage for m in state.messages if isinstance(m, AssistantMessage)]
    assert len(replies_usage) == 2
    assert all(u is not None and u.requests == 1 for u in replies_usage)
    entries = trace_of(state, TABLE)
    steps = [step_at(state, TABLE, n) for n in range(1, len(entries) + 1)]
    assert steps[-1].usage == state.usage
    owned = [(n, s.own_usage) for n, s in enumerate(steps, 1) if s.own_usage is not None]
    assert [usage for _, usage in owned] == replies_usage
    assert [entries[n - 1].source for n, _ in owned] == ["THINK", "THINK"]
    assert steps[0].usage == Usage()  # before any call
    first_call = owned[0][0]
    assert steps[first_call - 1].usage == replies_usage[0]
    assert steps[first_call - 2].usage == Usage()
    first = replies_usage[0]
    assert first is not None
    with ui(runs) as base:
        _, page, _ = get(f"{base}/runs/{runs.finished}?step={first_call}")
        assert f'<dd id="step-tokens">{first.total_tokens:,} ' in page
        assert f'<dd id="step-own-tokens">{first.total_tokens:,} ' in page
        _, before, _ = get(f"{base}/runs/{runs.finished}?step={first_call - 1}")
        assert "no model call in this step" in before


def test_a_checkpoint_without_per_call_usage_shows_the_total_only(runs: Runs) -> None:
    """A run saved before replies kept their usage: the step says so, and nothing breaks."""
    state = runs.store.load(runs.finished)
    state.messages = [
        m.model_copy(update={"usage": None}) if isinstance(m, AssistantMessage) else m
        for m in state.messages
    ]
    state.run_id = "older"
    runs.store.save(state)
    assert step_at(state, TABLE, len(state.trace)).usage is None
    with ui(runs) as base:
        status, page, _ = get(f"{base}/runs/older?step=3")
    assert status == 200
    assert "written before agent_fsm kept each call's usage" in page


def test_the_run_page_shows_the_path_the_steps_and_escapes_the_transcript(runs: Runs) -> None:
    with ui(runs) as base:
        status, page, _ = get(f"{base}/runs/{runs.asking}?step=2")
        assert status == 200
        assert '<svg xmlns="http://www.w3.org/2000/svg" class="path"' in page
        assert 'data-step="2"' in page
        assert "Which city, &lt;b&gt;exactly&lt;/b&gt;?" in page
        assert "<b>exactly</b>" not in page
        assert 'action="/runs/' in page
        assert "/answer" in page
        status, _missing, _ = get(f"{base}/runs/nope")
        assert status == 404


# -- steering ----------------------------------------------------------------------------


def test_an_answer_sent_from_the_page_resumes_the_run(runs: Runs) -> None:
    with ui(runs) as base:
        _, page, _ = get(f"{base}/runs/{runs.asking}")
        pause = runs.store.load(runs.asking).control
        assert pause is not None
        fields = {"csrf": _csrf(page), "reply": "Lyon", "pause": pause.pause}
        status, _, headers = post(f"{base}/runs/{runs.asking}/answer", fields)
        assert status == 303
        assert headers["location"] == f"/runs/{runs.asking}"
        assert _settled(runs, runs.asking, StopReason.ASK_USER) is AgentState.DONE
        # the same answer again is late: refused, and nothing runs twice
        status, again, _ = post(f"{base}/runs/{runs.asking}/answer", fields)
        assert status == 400
        assert "has finished (final_answer)" in again
    stored = runs.store.load(runs.asking)
    assert stored.output == "Sunny in Lyon."
    assert UserMessage(content="Lyon") in stored.messages


def test_approve_with_edited_arguments_from_the_page(runs: Runs) -> None:
    with ui(runs) as base:
        _, page, _ = get(f"{base}/runs/{runs.approving}")
        control = runs.store.load(runs.approving).control
        assert control is not None
        assert control.kind is ControlKind.APPROVAL
        call_id = control.pending_calls[0].id
        base_fields = {"csrf": _csrf(page), "pause": control.pause}
        bad = {**base_fields, f"decision:{call_id}": "allow"}
        bad[f"arguments:{call_id}"] = '{"amount": "lots", "to": "bob"}'
        status, refused, _ = post(f"{base}/runs/{runs.approving}/approve", bad)
        assert status == 400
        assert "do not fit the tool" in refused
        assert runs.store.load(runs.approving).stop_reason is StopReason.APPROVAL_REQUIRED
        good = {**bad, f"arguments:{call_id}": '{"amount": 50, "to": "bob"}'}
        good[f"reason:{call_id}"] = "500 is too much"
        status, _, _ = post(f"{base}/runs/{runs.approving}/approve", good)
        assert status == 303
        assert _settled(runs, runs.approving, StopReason.APPROVAL_REQUIRED) is AgentState.DONE
    assert paid == [(50, "bob")]
    told = [m.content for m in runs.store.load(runs.approving).messages if m.role == "user"]
    assert "changed its arguments" in told[-1]
    assert "500 is too much" in told[-1]


def test_a_post_without_the_csrf_token_or_from_another_origin_is_refused(runs: Runs) -> None:
    with ui(runs) as base:
        _, page, _ = get(f"{base}/runs/{runs.asking}")
        status, _, _ = post(f"{base}/runs/{runs.asking}/answer", {"reply": "Lyon"})
        assert status == 403
        fields = {"csrf": _csrf(page), "reply": "Lyon"}
        status, _, _ = post(
            f"{base}/runs/{runs.asking}/answer", fields, {"Origin": "http://evil.example"}
        )
        assert status == 403
        status, _, _ = get(f"{base}/runs/{runs.asking}/answer?reply=Lyon")
        assert status in (404, 405)  # a GET changes nothing
    assert runs.store.load(runs.asking).stop_reason is StopReason.ASK_USER


def test_abort_asks_the_store_to_cancel_a_run_that_has_not_stopped(runs: Runs) -> None:
    queued = runs.agent.start("not yet stepped")
    with ui(runs) as base:
        _, page, _ = get(f"{base}/runs/{queued.run_id}")
        assert 'id="abort"' in page
        assert 'id="live"' in page
        status, _, _ = post(f"{base}/runs/{queued.run_id}/abort", {"csrf": _csrf(page)})
        assert status == 303
    listed = {row.run_id: row for row in runs.store.list_runs()}
    assert listed[queued.run_id].cancel_requested == "aborted from the ui"


# -- safety ------------------------------------------------------------------------------


def test_a_loopback_ui_refuses_other_host_names(runs: Runs) -> None:
    with ui(runs) as base:
        status, _, _ = get(base + "/", {"Host": "attacker.example:80"})
        assert status == 400


def test_a_token_guards_every_request_and_is_kept_in_a_cookie(runs: Runs) -> None:
    with ui(runs, token="s3cret", hosts=None) as base:
        assert get(base + "/")[0] == 401
        assert get(base + "/?token=wrong")[0] == 401
        status, _, headers = get(base + "/?token=s3cret&state=DONE")
        assert status == 303
        assert headers["location"] == "/?state=DONE"
        assert "HttpOnly" in headers["set-cookie"]
        assert "SameSite=Strict" in headers["set-cookie"]
        status, _, headers = get(f"{base}/runs/caf%C3%A9%0D%0Aset-cookie:x?token=s3cret")
        assert status == 303
        assert headers["location"] == "/runs/caf%C3%A9%0D%0Aset-cookie%3Ax"
        assert get(base + "/", {"Cookie": "agent_fsm_ui=s3cret"})[0] == 200
        assert get(base + "/", {"Authorization": "Bearer s3cret"})[0] == 200


def test_no_store_password_reaches_a_page(runs: Runs) -> None:
    from agent_fsm.durable.checkpoint import redacted
    from agent_fsm.ui.app import create_app
    from tests.ui_support import serving

    name = redacted("postgresql://fleet:hunter2@db.internal/runs")
    app = create_app(runs.store, store_name=name, agent=runs.agent)
    with serving(app) as base:
        for path in ("/", f"/runs/{runs.approving}"):
            page = get(base + path)[1]
            assert "hunter2" not in page
            assert "fleet:***@db.internal" in page


def test_the_cli_refuses_a_missing_store_and_lists_the_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["ui", "--store", str(tmp_path / "none.sqlite3")]) == 2
    assert "no checkpoint store" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["ui", "--help"])
    assert "--agent" in capsys.readouterr().out


# -- AG-UI events -----------------------------------------------------------------------


def test_typed_events_map_to_ag_ui_events_with_interrupts() -> None:
    call = ToolCall(id="c1", name="transfer", arguments='{"amount": 5}')
    events = [
        RunStarted(run_id="r", input="pay"),
        StateChanged(
            run_id="r",
            source="OBSERVE",
            dest="THINK",
            trigger="observed",
            guards=(),
            label="think",
            turn=0,
        ),
        ToolStarted(run_id="r", turn=1, call=call),
        RunPaused(
            run_id="r",
            stop_reason=StopReason.APPROVAL_REQUIRED,
            question="Approve?",
            pending_calls=(call,),
            pause="p1",
        ),
        RunFinished(
            run_id="r",
            status=RunStatus.NEEDS_INPUT,
            stop_reason=StopReason.APPROVAL_REQUIRED,
            final_state=AgentState.DONE,
            turns=1,
            usage=Usage(),
            output="Approve?",
        ),
    ]
    mapped = agui_events(events)
    assert [e["type"] for e in mapped] == [
        "RUN_STARTED", "STATE_SNAPSHOT", "STATE_DELTA", "TOOL_CALL_START", "TOOL_CALL_ARGS",
        "TOOL_CALL_END", "STATE_SNAPSHOT", "RUN_FINISHED",
    ]  # fmt: skip
    delta = mapped[2]["delta"]
    assert {"op": "replace", "path": "/fsm/state", "value": "THINK"} in delta
    finished = mapped[-1]
    assert finished["outcome"]["type"] == "interrupt"
    (asked,) = finished["outcome"]["interrupts"]
    assert asked["id"] == "p1"
    assert asked["payload"]["pendingCalls"][0]["name"] == "transfer"


def test_the_event_stream_of_a_stopped_run_ends_with_its_interrupt(runs: Runs) -> None:
    with ui(runs) as base:
        status, body, headers = get(f"{base}/runs/{runs.asking}/events")
    assert status == 200
    assert headers["content-type"].startswith("text/event-stream")
    events = [json.loads(line[6:]) for line in body.splitlines() if line.startswith("data: ")]
    assert events[0]["type"] == "RUN_STARTED"
    assert events[-1]["type"] == "RUN_FINISHED"
    assert events[-1]["outcome"]["type"] == "interrupt"
    (asked,) = events[-1]["outcome"]["interrupts"]
    assert asked["message"] == asked["payload"]["question"] == "Which city, <b>exactly</b>?"


def test_a_run_followed_from_its_checkpoints_streams_what_each_save_adds(tmp_path: Path) -> None:
    runs = sqlite_runs(tmp_path)
    writer = SQLiteStore(tmp_path / "runs.sqlite3")
    queued = runs.agent.start("go on")
    state = writer.load(queued.run_id)
    with ui(runs) as base:
        import threading
        import urllib.request

        lines: list[str] = []
        snapshot = threading.Event()

        def read() -> None:
            with urllib.request.urlopen(f"{base}/runs/{queued.run_id}/events") as response:
                for line in response:
                    lines.append(line.decode())
                    if b"STATE_SNAPSHOT" in line:
                        snapshot.set()

        reader = threading.Thread(target=read)
        reader.start()
        snapshot.wait()
        # another process steps the run: its saves reach the stream
        state.messages.append(AssistantMessage(content="Working on it."))
        state.state = AgentState.DONE
        state.output = "Working on it."
        state.stop_reason = StopReason.FINAL_ANSWER
        state.trace.append((next(i for i, r in enumerate(TABLE) if r.label == "final_answer"), 1))
        writer.save(state)
        reader.join()
    events = [json.loads(line[6:]) for line in lines if line.startswith("data: ")]
    kinds = [e["type"] for e in events]
    assert "TEXT_MESSAGE_CONTENT" in kinds
    assert kinds[-1] == "RUN_FINISHED"
    assert events[-1]["result"] == "Working on it."


def test_the_readme_shows_the_pictures_the_browser_test_takes() -> None:
    root = Path(__file__).resolve().parent.parent
    readme = (root / "README.md").read_text(encoding="utf-8")
    pictures = re.findall(r"!\[[^\]]*\]\((docs/ui/[^)]+\.png)\)", readme)
    assert pictures == ["docs/ui/runs.png", "docs/ui/run.png"]
    browser_test = (root / "tests" / "test_ui_browser.py").read_text(encoding="utf-8")
    for picture in pictures:
        assert (root / picture).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f'"{Path(picture).name}"' in browser_test


def test_a_stop_filter_reads_on_in_growing_batches_until_enough_match(runs: Runs) -> None:
    import copy

    finished = runs.store.load(runs.finished)
    for number in range(40):  # newer than the paused runs: the filter must read past them
        state = copy.deepcopy(finished)
        state.run_id = f"newer-{number:02d}"
        runs.store.save(state)
    asking, more = run_rows(runs.store, TABLE, stop="ask_user", limit=1)
    assert [row.run_id for row in asking] == [runs.asking]
    assert not more
    done, more = run_rows(runs.store, TABLE, stop="final_answer", limit=5)
    assert len(done) == 5
    assert more
    assert run_rows(runs.store, TABLE, stop="running") == ([], False)
    assert run_rows(runs.store, TABLE, stop="timeout", state="DONE") == ([], False)


def test_fork_from_a_step_of_the_page_starts_a_new_run_there(runs: Runs) -> None:
    parent = runs.store.load(runs.finished)
    to_act = next(n for n, e in enumerate(trace_of(parent, TABLE), 1) if e.dest == "ACT")
    with ui(runs) as base:
        _, page, _ = get(f"{base}/runs/{runs.finished}?step={to_act}")
        assert 'id="fork"' in page
        fields = {"csrf": _csrf(page), "at": str(to_act)}
        status, _, headers = post(f"{base}/runs/{runs.finished}/fork", fields)
        assert status == 303
        fork_id = headers["location"].removeprefix("/runs/")
        assert fork_id != runs.finished
        assert _settled(runs, fork_id, StopReason.ASK_USER) is AgentState.DONE
        status, _, _ = post(f"{base}/runs/{runs.finished}/fork", {**fields, "at": "99"})
        assert status == 400
    fork = runs.store.load(fork_id)
    assert fork.trace[:to_act] == parent.trace[:to_act]
    results = [m for m in fork.messages if isinstance(m, ToolMessage)]
    assert results[0].content == "sunny in Paris"
    assert results[0].details == {"runtime": {"replayed": True}}  # from the copied journal
    assert runs.store.load(runs.finished).output == "It is sunny in Paris."


gate = threading.Event()


@tool
def slow_lookup() -> str:
    """Waits for the test's go."""
    gate.wait()
    return "looked up"


def _slow_run(tmp_path: Path) -> Runs:
    gate.clear()
    store = SQLiteStore(tmp_path / "runs.sqlite3")
    model = ScriptedModel(
        [reply("", call("ask_user", question="Go?")), reply("", call("slow_lookup")), "Done."]
    )
    agent = Agent(model=model, tools=[slow_lookup], limits=limits(), store=store)
    run_id = agent.run_sync("Start").run_id
    return Runs(store, agent, run_id, run_id, run_id)


def _answered_and_acting(runs: Runs, base: str) -> str:
    """Answer the slow run's question in the ui; once it waits in ACT, the page's CSRF."""
    run_id = runs.asking
    _, page, _ = get(f"{base}/runs/{run_id}")
    control = runs.store.load(run_id).control
    assert control is not None
    fields = {"csrf": _csrf(page), "reply": "go", "pause": control.pause}
    assert post(f"{base}/runs/{run_id}/answer", fields)[0] == 303
    while runs.store.load(run_id).state is not AgentState.ACT:
        time.sleep(0.01)
    return _csrf(page)


def _aborted_validly(runs: Runs, reason: str) -> None:
    stopped = runs.store.load(runs.asking)
    assert (stopped.state, stopped.stop_reason) == (AgentState.ERROR, StopReason.ABORTED)
    assert stopped.error == reason
    calls = [
        c.id for m in stopped.messages if isinstance(m, AssistantMessage) for c in m.tool_calls
    ]
    answered = [m.tool_call_id for m in stopped.messages if isinstance(m, ToolMessage)]
    assert answered == calls  # every call answered, once, in order


def test_a_run_the_ui_drives_is_aborted_with_a_valid_transcript_when_the_ui_stops(
    tmp_path: Path,
) -> None:
    runs = _slow_run(tmp_path)
    try:
        with ui(runs) as base:
            _answered_and_acting(runs, base)
        # the server stopped: the run it drove was cancelled, not left mid-step
        _aborted_validly(runs, "the ui stopped")
    finally:
        gate.set()


def test_abort_from_the_page_stops_a_run_the_ui_drives(tmp_path: Path) -> None:
    runs = _slow_run(tmp_path)
    try:
        with ui(runs) as base:
            csrf = _answered_and_acting(runs, base)
            _, page, _ = get(f"{base}/runs/{runs.asking}")
            assert 'id="abort"' in page
            assert post(f"{base}/runs/{runs.asking}/abort", {"csrf": csrf})[0] == 303
            _settled(runs, runs.asking, StopReason.ASK_USER)
            _aborted_validly(runs, "aborted from the ui")
    finally:
        gate.set()


def test_a_bind_beyond_loopback_gets_a_token(monkeypatch: pytest.MonkeyPatch, runs: Runs) -> None:
    import uvicorn

    from agent_fsm.ui.cli import is_loopback

    assert is_loopback("127.0.0.1")
    assert is_loopback("::1")
    assert is_loopback("localhost")
    assert not is_loopback("0.0.0.0")
    assert not is_loopback("192.168.1.5")
    served: list[object] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **options: served.append((app, options)))
    path = str(tmp_path_of(runs))
    assert main(["ui", "--store", path, "--host", "0.0.0.0", "--port", "9"]) == 0
    app, options = served[0]  # type: ignore[misc]
    assert options["host"] == "0.0.0.0"
    assert app.token is not None  # type: ignore[attr-defined]
    assert app.hosts is None  # type: ignore[attr-defined]
    assert main(["ui", "--store", path, "--token", "given"]) == 0
    app, options = served[1]  # type: ignore[misc]
    assert options["host"] == "127.0.0.1"
    assert app.token == "given"  # type: ignore[attr-defined]
    assert "127.0.0.1" in app.hosts  # type: ignore[attr-defined]


def tmp_path_of(runs: Runs) -> Path:
    store = runs.store
    assert isinstance(store, SQLiteStore)
    return Path(store.path)


# -- trace files -------------------------------------------------------------------------


def _traced(tmp_path: Path) -> tuple[Path, TraceRuns]:
    from agent_fsm.durable.tracefile import TraceWriter

    path = tmp_path / "runs.jsonl"
    writer = TraceWriter(path)
    model = ScriptedModel(
        [
            reply("", call("get_weather", city="Oslo")),
            "Cold in Oslo.",
            reply("", call("ask_user", question="Which day?")),
        ]
    )
    from tests.ui_support import get_weather

    agent = Agent(model=model, tools=[get_weather], limits=limits()).subscribe(writer)
    agent.run_sync("Weather in Oslo?")
    agent.run_sync("Weather?")
    writer.close()
    return path, TraceRuns(path, TABLE)


def test_a_trace_file_is_a_source_of_runs_with_usage_per_step(tmp_path: Path) -> None:
    _, traced = _traced(tmp_path)
    listed = traced.list_runs()
    assert [s.state for s in listed] == [AgentState.DONE, AgentState.DONE]
    asking, answered = listed
    assert [stop_of_row.stop for stop_of_row in run_rows(traced, TABLE)[0]] == [
        "ask_user",
        "final_answer",
    ]
    state = traced.load(answered.run_id)
    assert [m.role for m in state.messages] == ["user", "assistant", "tool", "assistant"]
    assert state.output == "Cold in Oslo."
    by_turn = traced.usage_by_turn(answered.run_id)
    assert 0 < by_turn[1].total_tokens < by_turn[2].total_tokens == state.usage.total_tokens
    step = step_at(state, TABLE, 2)
    assert step.reply is not None
    assert step.reply.tool_calls[0].name == "get_weather"
    with pytest.raises(CheckpointError, match="no run 'nope'"):
        traced.load("nope")
    assert traced.list_runs(states=["ERROR"]) == []
    assert asking.last_row is not None


def test_the_ui_over_a_trace_file_shows_each_steps_usage_and_does_not_steer(
    tmp_path: Path,
) -> None:
    from agent_fsm.ui.app import create_app
    from tests.ui_support import serving

    path, traced = _traced(tmp_path)
    answered = traced.list_runs()[1].run_id
    asking = traced.list_runs()[0].run_id
    tokens = traced.usage_by_turn(answered)[1].total_tokens
    agent = Agent(model=ScriptedModel([]))
    with serving(create_app(traced, store_name=str(path), agent=agent)) as base:
        status, page, _ = get(f"{base}/runs/{answered}?step=2")
        assert status == 200
        assert f'<dd id="step-tokens">{tokens:,} ' in page
        _, paused, _ = get(f"{base}/runs/{asking}")
        assert 'action="/runs/' not in paused  # a trace is read, never answered
        listing = get(base + "/")[1]
        assert listing.count('<tr class="run') == 2


def test_the_cli_serves_a_trace_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import uvicorn

    path, _ = _traced(tmp_path)
    served: list[object] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **options: served.append(app))
    assert main(["ui", "--trace", str(path)]) == 0
    assert len(served) == 1
    assert main(["ui", "--trace", str(tmp_path / "missing.jsonl")]) == 2
    assert "no trace file" in capsys.readouterr().err


def test_a_run_of_another_table_is_named_not_a_server_error(runs: Runs) -> None:
    import copy

    state = copy.deepcopy(runs.store.load(runs.finished))
    state.run_id = "custom-table"
    state.trace.append((len(TABLE) + 5, 2))  # a row this table does not have
    runs.store.save(state)
    with ui(runs) as base:
        status, page, _ = get(f"{base}/runs/custom-table")
        assert status == 409
        assert "--agent" in page
        assert get(f"{base}/runs/custom-table/events")[0] == 409
        listing = get(base + "/")[1]
        assert "custom-table" in listing


def test_a_sub_agents_question_is_answered_from_the_parents_page(tmp_path: Path) -> None:
    """A child's ask_user pauses the whole tree (``sub_agent_paused``): the parent's page
    shows the child's question with the answer form, and the answer sent there resumes the
    tree to the end."""
    store = SQLiteStore(tmp_path / "runs.sqlite3")
    child = Agent(
        model=ScriptedModel(
            [reply("", call("ask_user", question="Which city?")), "Lyon is sunny."]
        ),
        limits=limits(),
    )
    parent = Agent(
        model=ScriptedModel([reply("", call("research", task="Weather?")), "It is sunny."]),
        tools=[child.as_tool(name="research", description="Researches.")],
        limits=limits(),
        store=store,
    )
    paused = parent.run_sync("Weather?")
    assert paused.stop_reason is StopReason.SUB_AGENT_PAUSED
    runs = Runs(store, parent, paused.run_id, paused.run_id, paused.run_id)
    listed, _ = run_rows(store, TABLE)
    assert [row.paused for row in listed if row.run_id == paused.run_id] == [True]
    with ui(runs) as base:
        _, page, _ = get(f"{base}/runs/{paused.run_id}")
        assert "/answer" in page
        assert "Which city?" in page
        pause = store.load(paused.run_id).control
        assert pause is not None
        fields = {"csrf": _csrf(page), "reply": "Lyon", "pause": pause.pause}
        status, _, _ = post(f"{base}/runs/{paused.run_id}/answer", fields)
        assert status == 303
        assert _settled(runs, paused.run_id, StopReason.SUB_AGENT_PAUSED) is AgentState.DONE
    assert store.load(paused.run_id).output == "It is sunny."
