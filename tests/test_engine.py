"""The run engine: step(), events, stream(), results, fake models, bad input."""

from __future__ import annotations

import asyncio
import logging

import pytest
import structlog
import structlog.testing

from agent_fsm import Agent, AgentState, ConfigError, Limits, RunError, StopReason, tool
from agent_fsm.events import EVENT_ADAPTER, Event, RunFinished, StateChanged, ToolFinished
from agent_fsm.messages import ToolCall, ToolMessage, TranscriptView, UserMessage
from agent_fsm.testing import ScriptedModel, call, raw_call, reply
from agent_fsm.testing.invariants import check_invariants
from tests.conftest import Recorder, echo, limits, make_agent


async def test_step_fires_exactly_one_trigger() -> None:
    agent, _ = make_agent([reply("", call("echo", text="x")), "done"])
    run = agent.start("go")
    seen = []
    while not run.done:
        before = run.state.state
        entry = await run.step()
        assert entry.source is before
        assert run.state.state is entry.dest
        seen.append((entry.source.value, entry.dest.value))
    assert seen == [
        ("OBSERVE", "THINK"),
        ("THINK", "ACT"),
        ("ACT", "REFLECT"),
        ("REFLECT", "OBSERVE"),
        ("OBSERVE", "THINK"),
        ("THINK", "DONE"),
    ]
    with pytest.raises(RunError, match="already ended in DONE"):
        await run.step()
    assert run.result.output == "done"


async def test_iterate_yields_the_trace() -> None:
    agent, _ = make_agent(["hi"])
    run = agent.start("go")
    entries = [entry async for entry in run.iterate()]
    assert entries == list(run.result.trace)


def test_result_of_an_unfinished_run_is_an_error() -> None:
    agent, _ = make_agent(["hi"])
    with pytest.raises(RunError, match="has not ended"):
        _ = agent.start("go").result


def test_events_in_order(recorder: Recorder) -> None:
    agent, _ = make_agent([reply("", call("echo", text="x")), "done"])
    agent = agent.subscribe(recorder)
    result = agent.run_sync("go")
    assert recorder.kinds() == [
        "run_started",
        "state_changed",
        "model_requested",
        "model_responded",
        "state_changed",
        "tool_started",
        "tool_finished",
        "state_changed",
        "state_changed",
        "state_changed",
        "model_requested",
        "model_responded",
        "state_changed",
        "guard_tripped",
        "run_finished",
    ]
    finished = recorder[-1]
    assert isinstance(finished, RunFinished)
    assert finished.stop_reason is StopReason.FINAL_ANSWER
    changes = [e for e in recorder if isinstance(e, StateChanged)]
    assert [(c.source, c.dest) for c in changes] == [(t.source, t.dest) for t in result.trace]
    for event in recorder:  # every event survives a JSON round trip (trace files)
        assert EVENT_ADAPTER.validate_json(EVENT_ADAPTER.dump_json(event)) == event
    check_invariants(result, limits=agent.limits, events=recorder)


def test_a_failing_subscriber_does_not_break_the_run(recorder: Recorder) -> None:
    def broken(event: object) -> None:
        raise ValueError("subscriber bug")

    agent, _ = make_agent(["hi"])
    agent = agent.subscribe(broken)
    agent = agent.subscribe(recorder)
    assert agent.run_sync("go").output == "hi"
    assert recorder.kinds()[-1] == "run_finished"


async def test_stream_yields_every_event_and_ends_with_run_finished() -> None:
    agent, _ = make_agent([reply("", call("echo", text="x")), "done"])
    events = [event async for event in agent.stream("go")]
    assert events[0].kind == "run_started"
    assert isinstance(events[-1], RunFinished)
    assert events[-1].output == "done"
    tools = [e for e in events if isinstance(e, ToolFinished)]
    assert [t.output for t in tools] == ["x"]


async def test_run_sync_inside_an_event_loop_is_a_clear_error() -> None:
    agent, _ = make_agent(["hi"])
    with pytest.raises(RunError, match="inside a running event loop"):
        agent.run_sync("go")


def test_scripted_model_says_when_the_script_runs_out() -> None:
    agent, model = make_agent([reply("", call("echo", text="x"))])
    result = agent.run_sync("go")
    assert result.stop_reason is StopReason.MODEL_ERROR
    assert "has 1 replies but received request 2" in (result.error or "")
    assert "last message: tool: x" in (result.error or "")
    assert model.remaining == -1
    assert len(model.requests) == 2


def test_scripted_model_records_snapshots_of_each_request() -> None:
    agent, model = make_agent([reply("", call("echo", text="x")), "done"])
    agent.run_sync("go")
    first, second = model.requests
    assert [m.role for m in first.messages] == ["system", "user"]
    assert [m.role for m in second.messages] == ["system", "user", "assistant", "tool"]
    assert first.turn == 1
    assert second.turn == 2
    assert {t.name for t in first.tools} == {"echo", "add", "boom", "ask_user", "finish_task"}


def test_transcript_view_is_a_stable_prefix() -> None:
    messages: list[object] = [UserMessage(content="a")]
    view = TranscriptView(messages, 1)  # type: ignore[arg-type]
    messages.append(UserMessage(content="b"))
    assert len(view) == 1
    assert list(view) == [UserMessage(content="a")]
    assert view[-1] == UserMessage(content="a")
    with pytest.raises(IndexError):
        view[1]


def test_missing_and_duplicate_call_ids_are_made_unique() -> None:
    agent, _ = make_agent(
        [
            reply(
                "",
                raw_call("echo", '{"text": "a"}', id="dup"),
                raw_call("echo", '{"text": "b"}', id="dup"),
                call("echo", text="c"),
            ),
            "done",
        ]
    )
    result = agent.run_sync("go")
    ids = [m.tool_call_id for m in result.messages if isinstance(m, ToolMessage)]
    assert ids[0] == "dup"
    assert len(set(ids)) == 3
    check_invariants(result, limits=agent.limits)


def test_a_made_up_call_id_never_takes_one_the_model_chose() -> None:
    """The made-up id for the second call of turn 1 would be call_1_1, which the model
    already gave to the first call (and a later call's own id is not taken either)."""
    agent, _ = make_agent(
        [
            reply(
                "",
                raw_call("echo", '{"text": "a"}', id="call_1_1"),
                raw_call("echo", '{"text": "b"}', id=""),
                raw_call("echo", '{"text": "c"}', id=""),
                raw_call("echo", '{"text": "d"}', id="call_1_2"),
            ),
            "done",
        ]
    )
    result = agent.run_sync("go")
    ids = [m.tool_call_id for m in result.messages if isinstance(m, ToolMessage)]
    assert (ids[0], ids[3]) == ("call_1_1", "call_1_2")
    assert len(set(ids)) == 4
    check_invariants(result, limits=agent.limits)


def test_parallel_calls_answer_in_call_order() -> None:
    @tool
    async def wait(ms: int) -> int:
        """Sleep ms milliseconds."""
        await asyncio.sleep(ms / 1000)
        return ms

    for parallel in (True, False):
        agent = Agent(
            model=ScriptedModel(
                [reply("", call("wait", ms=30), call("wait", ms=1), call("wait", ms=10)), "ok"]
            ),
            tools=[wait],
            limits=limits(),
            parallel_tool_calls=parallel,
        )
        result = agent.run_sync("go")
        outputs = [m.content for m in result.messages if isinstance(m, ToolMessage)]
        assert outputs == ["30", "1", "10"]


def test_usage_is_estimated_when_the_model_reports_none() -> None:
    agent, _ = make_agent(["hi"])
    result = agent.run_sync("go")
    assert result.usage.estimated
    assert result.usage.input_tokens > 0
    assert result.usage.requests == 1
    agent, _ = make_agent([reply("hi", usage=(10, 5))])
    usage = agent.run_sync("go").usage
    assert (usage.input_tokens, usage.output_tokens, usage.estimated) == (10, 5, False)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"max_turns": 0}, "max_turns"),
        ({"max_turns": -3}, "max_turns"),
        ({"token_budget": 0}, "token_budget"),
        ({"timeout_s": -1}, "timeout_s"),
        ({"loop_threshold": 1}, "loop_threshold"),
        ({"max_turns": "many"}, "max_turns"),
        ({"max_turnz": 3}, "max_turnz"),
        ({"retry_backoff_s": 5, "retry_backoff_max_s": 1}, "retry_backoff_max_s"),
    ],
)
def test_invalid_limits_are_config_errors(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError, match=f"invalid Limits: .*{field}"):
        Limits(**kwargs)  # type: ignore[arg-type]


def test_agents_share_one_verified_machine_and_runs_do_not_interfere() -> None:
    first, _ = make_agent([reply("", call("echo", text="1")), "one"])
    second, _ = make_agent(["two"])
    assert first.machine is second.machine

    async def both() -> tuple[str | None, str | None]:
        a, b = await asyncio.gather(first.run("x"), second.run("y"))
        return a.output, b.output

    assert asyncio.run(both()) == ("one", "two")


def test_the_input_must_be_text() -> None:
    agent, _ = make_agent([])
    with pytest.raises(ConfigError, match="must be a str"):
        agent.start(42)  # type: ignore[arg-type]


def test_final_state_and_diagram() -> None:
    agent, _ = make_agent(["hi"])
    assert agent.run_sync("go").final_state is AgentState.DONE
    text = agent.diagram()
    assert text.startswith("stateDiagram-v2")
    assert "REFLECT --> DONE : reflected #3 [ask_user_called] ask_user" in text
    assert ToolCall(id="a", name="b").arguments == "{}"


def test_replace_keeps_the_configuration_and_swaps_what_is_given() -> None:
    agent = Agent(
        model=ScriptedModel([reply("first")]),
        tools=[echo],
        system_prompt="be brief",
        limits=limits(max_turns=3),
    )
    other = agent.replace(model=ScriptedModel([reply("second")]))
    assert other.limits == agent.limits
    assert other.system_prompt == "be brief"
    assert [t.name for t in other.registry.specs] == [t.name for t in agent.registry.specs]
    assert other.run_sync("hi").output == "second"
    assert agent.run_sync("hi").output == "first"
    with pytest.raises(ConfigError, match="unknown option"):
        agent.replace(modle=ScriptedModel([]))


def _log_at(level: int) -> None:
    """Configure structlog for one test (conftest's autouse fixture restores the suite's)."""
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(level))


def test_every_transition_is_logged_at_debug_with_the_run_id() -> None:
    _log_at(logging.DEBUG)
    agent, _ = make_agent([reply("", call("echo", text="x")), "done"])
    with structlog.testing.capture_logs() as logs:
        result = agent.run_sync("go")
    lines = [line for line in logs if line["event"] == "transition"]
    assert [(line["source"], line["dest"], line["label"]) for line in lines] == [
        (entry.source, entry.dest, entry.label) for entry in result.trace
    ]
    assert {line["run_id"] for line in lines} == {result.run_id}
    assert all(line["log_level"] == "debug" for line in lines)


def test_a_failing_event_handler_is_logged_with_the_run_id_and_the_run_goes_on() -> None:
    _log_at(logging.INFO)
    agent, _ = make_agent([reply("", call("echo", text="x")), "done"])

    def broken(event: Event) -> None:
        if event.kind == "tool_started":
            raise RuntimeError("observer bug")

    with structlog.testing.capture_logs() as logs:
        result = agent.subscribe(broken).run_sync("go")
    assert result.output == "done"
    failed = [line for line in logs if line["event"] == "event_handler_failed"]
    assert [(line["kind"], line["run_id"], line["log_level"]) for line in failed] == [
        ("tool_started", result.run_id, "error")
    ]
    assert failed[0]["exc_info"] is True


def test_a_subscriber_of_one_run_hears_that_run_only() -> None:
    """Runs nobody listens to share one empty bus until their first subscriber."""
    agent, _ = make_agent([])
    scripts = [ScriptedModel([reply("", call("echo", text=t)), t]) for t in ("a", "b")]
    first, second = (agent.replace(model=script).start("go") for script in scripts)
    heard: list[tuple[str, str]] = []
    first.subscribe(lambda event: heard.append(("one", event.run_id)))
    first.subscribe(lambda event: heard.append(("two", event.run_id)))

    async def both() -> list[str | None]:
        return [(await run.run()).output for run in (first, second)]

    assert asyncio.run(both()) == ["a", "b"]
    assert heard
    assert {run_id for _, run_id in heard} == {first.run_id}
    assert [who for who, _ in heard[:2]] == ["one", "two"]  # in subscription order


def test_filtered_debug_lines_are_not_built_and_info_lines_still_are() -> None:
    _log_at(logging.INFO)
    agent, _ = make_agent(["done"])
    with structlog.testing.capture_logs() as logs:
        result = agent.run_sync("go")
    assert [line["event"] for line in logs] == ["run_finished"]
    assert logs[0]["run_id"] == result.run_id


def test_a_logger_that_cannot_tell_its_level_gets_every_transition_line() -> None:
    lines: list[tuple[str, dict[str, object]]] = []

    class Plain:
        """A custom wrapper class without ``is_enabled_for``: it filters for itself."""

        def __init__(self, logger: object, processors: object, context: dict[str, object]):
            self._context = context

        def bind(self, **values: object) -> Plain:
            return Plain(None, None, {**self._context, **values})

        def _log(self, event: str, **values: object) -> None:
            lines.append((event, {**self._context, **values}))

        debug = info = warning = exception = _log

    structlog.configure(wrapper_class=Plain, cache_logger_on_first_use=False)
    agent, _ = make_agent(["done"])
    result = agent.run_sync("go")
    assert [event for event, _ in lines] == ["transition", "transition", "run_finished"]
    assert all(values["run_id"] == result.run_id for _, values in lines)
