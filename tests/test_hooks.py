"""Per-step hooks (``Agent(hooks=StepHooks(...))``): what each hook may do, what each failure
does to the run, and that no hook can break the transcript or make a run escape its bound.

Every run here is checked with ``check_invariants`` (``run_checked``)."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import time
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import structlog
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from agent_fsm import Agent, Limits, Run, StepHooks, StopReason, Tool, tool
from agent_fsm.cancellation import StopEvent
from agent_fsm.durable.journal import MemoryJournal
from agent_fsm.errors import ConfigError
from agent_fsm.events import EventBus, ModelRequested, ToolFinished, ToolStarted
from agent_fsm.hooks import Deny, ModelPlan
from agent_fsm.loop.machine import AgentMachine
from agent_fsm.messages import (
    AssistantMessage,
    ModelRequest,
    ModelResponse,
    SystemMessage,
    ToolCall,
    ToolMessage,
    ToolSpec,
    ToolStatus,
    TranscriptView,
    UserMessage,
)
from agent_fsm.models.openai_chat import OpenAIChatModel
from agent_fsm.run.acting import answer_calls
from agent_fsm.run.context import RunConfig, RunContext
from agent_fsm.run.engine import new_run_state
from agent_fsm.state import RunResult
from agent_fsm.testing import FunctionModel, ScriptedModel, assert_terminates, call, reply
from agent_fsm.testing.invariants import check_invariants
from agent_fsm.tools.scheduling import STOPPED
from agent_fsm.tools.tool import ToolRegistry
from tests.conftest import Recorder, limits
from tests.openai_payloads import completion
from tests.provider_kits.base import http  # the HTTP library the installed SDK is built on

ran: list[str] = []


@tool
def echo(text: str) -> str:
    """Return the text unchanged."""
    ran.append(f"echo {text}")
    return text


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    ran.append(f"add {a} {b}")
    return a + b


@tool(max_output_chars=50)
def secret(key: str) -> str:
    """Read a secret."""
    ran.append(f"secret {key}")
    return f"the secret of {key} is hunter2"


@tool(requires_approval=True)
def transfer(amount: int) -> str:
    """Move money (a person approves each call)."""
    ran.append(f"transfer {amount}")
    return f"moved {amount}"


@tool(terminal=True)
def submit(answer: str) -> str:
    """Deliver the answer and end the run."""
    ran.append(f"submit {answer}")
    return answer


TOOLS = (echo, add, secret, transfer, submit)


def setup_function() -> None:
    ran.clear()


def hooked_agent(
    script: Sequence[Any],
    hooks: StepHooks,
    *,
    model: Any = None,
    tools: Sequence[Tool] = TOOLS,
    **overrides: Any,
) -> tuple[Agent, ScriptedModel]:
    scripted = ScriptedModel(script)
    agent = Agent(
        model=model or scripted,
        tools=tools,
        system_prompt="You are tested.",
        hooks=hooks,
        limits=limits(**overrides),
    )
    return agent, scripted


def run_checked(agent: Agent, text: str = "go") -> tuple[RunResult, Recorder]:
    """Run ``agent`` and check every run invariant, with its events."""
    recorder = Recorder()
    result = agent.subscribe(recorder).run_sync(text)
    check_invariants(result, limits=agent.limits, bound=agent.bound, events=recorder)
    return result, recorder


def tool_results(result: RunResult) -> list[ToolMessage]:
    return [m for m in result.messages if isinstance(m, ToolMessage)]


def runtime_of(message: ToolMessage) -> dict[str, Any]:
    assert isinstance(message.details, dict)
    runtime = message.details["runtime"]
    assert isinstance(runtime, dict)
    return runtime


# -- construction ---------------------------------------------------------------------------


def test_a_hook_that_is_not_callable_is_refused_at_construction() -> None:
    with pytest.raises(ConfigError, match=r"StepHooks\(before_tool=...\) must be callable"):
        StepHooks(before_tool=42)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="hooks must be a StepHooks"):
        Agent(model=ScriptedModel([]), hooks=lambda plan: plan)  # type: ignore[arg-type]


def test_empty_hooks_change_nothing() -> None:
    agent, model = hooked_agent([reply("", call("echo", text="hi")), "done"], StepHooks())
    result, _ = run_checked(agent)
    assert result.output == "done"
    assert ran == ["echo hi"]
    assert model.requests[0].tool_choice is None


# -- before_model ---------------------------------------------------------------------------


def test_before_model_sees_the_call_as_the_engine_planned_it() -> None:
    plans: list[ModelPlan] = []

    def look(plan: ModelPlan) -> None:
        plans.append(plan)

    agent, model = hooked_agent(
        [reply("", call("echo", text="hi")), "done"], StepHooks(before_model=look)
    )
    result, _ = run_checked(agent)
    assert [(p.turn, p.retry, p.last_error, p.tool_choice) for p in plans] == [
        (1, 0, None, None),
        (2, 0, None, None),
    ]
    assert plans[0].model is model
    assert plans[0].tools == agent.registry.specs
    assert plans[0].run_id == result.run_id
    # the prompt is the one sent, message for message
    assert list(plans[1].messages) == list(model.requests[1].messages)
    assert plans[1].messages[0] == SystemMessage(content="You are tested.")


def test_before_model_chooses_the_model_per_turn() -> None:
    strong = ScriptedModel(["the strong model answers"], name="strong")

    def escalate(plan: ModelPlan) -> ModelPlan | None:
        return dataclasses.replace(plan, model=strong) if plan.turn > 1 else None

    agent, cheap = hooked_agent(
        [reply("", call("echo", text="hi"))], StepHooks(before_model=escalate)
    )
    result, events = run_checked(agent)
    assert result.output == "the strong model answers"
    assert (len(cheap.requests), len(strong.requests)) == (1, 1)
    assert [e.model for e in events if isinstance(e, ModelRequested)] == ["scripted", "strong"]


@pytest.mark.parametrize("choice", ["required", "none", "auto", "echo"])
def test_tool_choice_reaches_the_model(choice: str) -> None:
    async def choose(plan: ModelPlan) -> ModelPlan:  # an async hook, for once
        return dataclasses.replace(plan, tool_choice=choice)

    agent, model = hooked_agent(["done"], StepHooks(before_model=choose))
    run_checked(agent)
    assert model.requests[0].tool_choice == choice


def test_before_model_offers_fewer_tools_and_adds_messages() -> None:
    def narrow(plan: ModelPlan) -> ModelPlan:
        tools = tuple(spec for spec in plan.tools if spec.name == "echo")
        note = UserMessage(content="Retrieved: the answer is 42.")
        return dataclasses.replace(plan, tools=tools, messages=[*plan.messages, note])

    agent, model = hooked_agent(["42"], StepHooks(before_model=narrow))
    result, _ = run_checked(agent)
    request = model.requests[0]
    assert [spec.name for spec in request.tools] == ["echo"]
    assert request.messages[-1] == UserMessage(content="Retrieved: the answer is 42.")
    # the prompt changed, the transcript did not
    assert UserMessage(content="Retrieved: the answer is 42.") not in result.messages


def _drop_system(plan: ModelPlan) -> ModelPlan:
    return dataclasses.replace(plan, messages=list(plan.messages[1:]))


def _drop_input(plan: ModelPlan) -> ModelPlan:
    return dataclasses.replace(plan, messages=list(plan.messages[:1]))


def _orphan_result(plan: ModelPlan) -> ModelPlan:
    stray = ToolMessage(tool_call_id="nope", name="echo", content="?")
    return dataclasses.replace(plan, messages=[*plan.messages, stray])


def _unanswered_call(plan: ModelPlan) -> ModelPlan:
    asked = AssistantMessage(tool_calls=(ToolCall(id="x", name="echo", arguments="{}"),))
    return dataclasses.replace(plan, messages=[*plan.messages, asked])


def _foreign_tool(plan: ModelPlan) -> ModelPlan:
    spec = ToolSpec(name="rm_rf", description="", parameters={"type": "object"})
    return dataclasses.replace(plan, tools=(*plan.tools, spec))


def _changed_tool(plan: ModelPlan) -> ModelPlan:
    spec = plan.tools[0].model_copy(update={"description": "something else"})
    return dataclasses.replace(plan, tools=(spec, *plan.tools[1:]))


@pytest.mark.parametrize(
    ("hook", "problem"),
    [
        (lambda plan: "send it", "it returned str, not a ModelPlan or None"),
        (lambda plan: dataclasses.replace(plan, model=object()), "does not implement the Model"),
        (lambda plan: dataclasses.replace(plan, turn=7), "changed run_id, turn"),
        (_foreign_tool, "offers the tool 'rm_rf', which the agent does not have"),
        (_changed_tool, "it changed the tool 'echo'"),
        (
            lambda plan: dataclasses.replace(plan, tools=plan.tools * 2),
            "offers the tool 'echo' twice",
        ),
        (
            lambda plan: dataclasses.replace(plan, tools=(), tool_choice="required"),
            "'required' offers no tool",
        ),
        (lambda plan: dataclasses.replace(plan, tool_choice="rm_rf"), "nor an offered tool"),
        (lambda plan: dataclasses.replace(plan, tool_choice=3), "tool_choice is a int"),
        (_drop_system, "do not start with the system prompt"),
        (_drop_input, "drop the latest user input"),
        (_orphan_result, "is a tool result that answers no call"),
        (_unanswered_call, "leave calls ['x'] unanswered"),
        (lambda plan: dataclasses.replace(plan, messages="hi"), "not a sequence of messages"),
        (
            lambda plan: dataclasses.replace(plan, messages=[*plan.messages, {"role": "user"}]),
            "no transcript message",
        ),
    ],
)
def test_a_plan_that_breaks_a_rule_fails_the_call_for_good(
    hook: Callable[[ModelPlan], Any], problem: str
) -> None:
    agent, model = hooked_agent(["never sent"], StepHooks(before_model=hook))
    result, _ = run_checked(agent)
    assert result.stop_reason is StopReason.MODEL_ERROR
    assert result.error is not None
    assert result.error.startswith("before_model hook failed: ")
    assert problem in result.error
    assert model.requests == []  # nothing was sent
    assert result.retries == 0  # a broken rule is permanent: no retry


def test_a_before_model_exception_is_permanent_unless_a_model_s_would_be_transient() -> None:
    def broken(plan: ModelPlan) -> ModelPlan:
        raise ValueError("no plan today")

    agent, model = hooked_agent(["never sent"], StepHooks(before_model=broken))
    result, _ = run_checked(agent)
    assert (result.stop_reason, result.retries) == (StopReason.MODEL_ERROR, 0)
    assert result.error == "before_model hook failed: ValueError: no plan today"
    assert model.requests == []

    seen: list[tuple[int, str | None]] = []

    async def flaky(plan: ModelPlan) -> None:
        seen.append((plan.retry, plan.last_error))
        if plan.retry == 0:
            raise ConnectionError("the retrieval service is down")

    agent, _ = hooked_agent(["done"], StepHooks(before_model=flaky))
    result, _ = run_checked(agent)
    assert (result.output, result.retries) == ("done", 1)
    assert seen == [
        (0, None),
        (1, "before_model hook failed: ConnectionError: the retrieval service is down"),
    ]


@pytest.mark.parametrize("exc", [SystemExit(3), GeneratorExit(), asyncio.CancelledError()])
def test_a_before_model_base_exception_is_a_failure_not_an_escape(exc: BaseException) -> None:
    def raising(plan: ModelPlan) -> None:
        raise exc

    agent, _ = hooked_agent(["never sent"], StepHooks(before_model=raising))
    result, _ = run_checked(agent)
    assert result.stop_reason is StopReason.MODEL_ERROR
    assert result.error is not None
    assert result.error.startswith(f"before_model hook failed: {type(exc).__name__}")


def test_a_hanging_before_model_is_bounded_by_the_run_s_time_limit() -> None:
    async def hang(plan: ModelPlan) -> None:
        await asyncio.sleep(3600)

    agent, model = hooked_agent(["never sent"], StepHooks(before_model=hang), timeout_s=0.1)
    started = time.monotonic()
    result, _ = run_checked(agent)
    assert time.monotonic() - started < 600  # bounds only a hang: the hook sleeps an hour
    assert result.stop_reason is StopReason.TIMEOUT
    assert model.requests == []


def test_an_abort_inside_before_model_stops_the_run() -> None:
    runs: list[Run] = []

    async def abort_and_wait(plan: ModelPlan) -> None:
        runs[0].abort("changed my mind")
        await asyncio.sleep(30)

    hooked, model = hooked_agent(["never sent"], StepHooks(before_model=abort_and_wait))
    runs.append(hooked.start("go"))
    result = asyncio.run(runs[0].run())
    check_invariants(result, limits=hooked.limits, bound=hooked.bound)
    assert result.stop_reason is StopReason.ABORTED
    assert model.requests == []


def test_a_prompt_grown_past_the_context_window_is_refused() -> None:
    def stuff(plan: ModelPlan) -> ModelPlan:
        padding = UserMessage(content="x" * 40_000)
        return dataclasses.replace(plan, messages=[*plan.messages, padding])

    agent, model = hooked_agent(
        ["never sent"], StepHooks(before_model=stuff), context_window=4_000, reply_tokens=500
    )
    result, _ = run_checked(agent)
    assert result.stop_reason is StopReason.MODEL_ERROR
    assert "of the context window 4000" in (result.error or "")
    assert model.requests == []


def test_before_model_does_not_see_the_last_answer() -> None:
    turns: list[int] = []

    def count(plan: ModelPlan) -> None:
        turns.append(plan.turn)

    agent, model = hooked_agent(
        [reply("", call("echo", text="hi")), "best effort"],
        StepHooks(before_model=count),
        max_turns=1,
        last_answer=True,
    )
    result, _ = run_checked(agent)
    assert (result.stop_reason, result.output) == (StopReason.MAX_TURNS, "best effort")
    assert len(model.requests) == 2
    assert turns == [1]


def test_tool_choice_travels_to_openai_over_its_own_setting() -> None:
    sent: list[dict[str, Any]] = []

    async def handle(request: Any) -> Any:
        sent.append(json.loads(request.content))
        return http.Response(200, json=completion("ok"))

    async def ask(choice: str | None, tools: tuple[ToolSpec, ...]) -> None:
        async with http.AsyncClient(transport=http.MockTransport(handle)) as client:
            import openai

            sdk = openai.AsyncOpenAI(
                api_key="sk-test", base_url="https://api.test/v1", http_client=client
            )
            model = OpenAIChatModel("gpt-4o-mini", client=sdk, tool_choice="auto")
            messages = TranscriptView([UserMessage(content="hi")])
            await model.request(
                ModelRequest(messages=messages, tools=tools, run_id="r", turn=1, tool_choice=choice)
            )

    specs = ToolRegistry([echo]).specs
    asyncio.run(ask("required", specs))
    asyncio.run(ask("echo", specs))
    asyncio.run(ask(None, specs))
    asyncio.run(ask("required", ()))
    assert sent[0]["tool_choice"] == "required"
    assert sent[1]["tool_choice"] == {"type": "function", "function": {"name": "echo"}}
    assert sent[2]["tool_choice"] == "auto"  # the model's own setting, when no hook chose
    assert "tool_choice" not in sent[3]  # no tools, no tool_choice (the API refuses it)


# -- before_tool ----------------------------------------------------------------------------


def test_before_tool_denies_a_call_with_a_reason_the_model_reads() -> None:
    def no_secrets(call: ToolCall, arguments: dict[str, Any]) -> Deny | None:
        return Deny(reason="secrets are off limits") if call.name == "secret" else None

    agent, model = hooked_agent(
        [reply("", call("secret", key="db"), call("echo", text="hi")), "done"],
        StepHooks(before_tool=no_secrets),
    )
    result, _ = run_checked(agent)
    refused, echoed = tool_results(result)
    assert refused.status is ToolStatus.ERROR
    assert refused.content == "Tool 'secret' was not run: secrets are off limits"
    assert runtime_of(refused) == {"denied": "secrets are off limits"}
    assert echoed.content == "hi"
    assert ran == ["echo hi"]
    assert refused in model.requests[1].messages  # the model reads the reason


def test_a_long_deny_reason_is_cut_at_the_tools_limit_not_the_turns() -> None:
    """Issue 33: the reason stands where the tool's output would, so the tool's limit holds
    (20,000 characters by default), not the turn's (60,000)."""

    def verbose(call: ToolCall, arguments: dict[str, Any]) -> Deny | None:
        return Deny(reason="no. " * 20_000) if call.name == "secret" else None

    agent, _ = hooked_agent(
        [reply("", call("secret", key="db")), "done"], StepHooks(before_tool=verbose)
    )
    result, _ = run_checked(agent)
    (refused,) = tool_results(result)
    secret = agent.registry.get("secret")
    assert secret is not None
    limit = secret.max_output_chars or agent.limits.tool_max_output_chars
    assert limit < agent.limits.turn_max_output_chars
    assert len(refused.content) < limit + 200
    assert f"[the reason was cut: {80_000 - limit:,} of 80,000 characters]" in refused.content


def test_before_tool_changes_arguments_and_the_change_is_recorded() -> None:
    def clamp(call: ToolCall, arguments: dict[str, Any]) -> dict[str, Any] | None:
        if call.name == "add" and arguments["b"] > 10:
            return {**arguments, "b": 10}
        return None

    agent, _ = hooked_agent(
        [reply("", call("add", a=1, b=99)), "done"], StepHooks(before_tool=clamp)
    )
    result, events = run_checked(agent)
    (answer,) = tool_results(result)
    assert (answer.content, ran) == ("11", ["add 1 10"])
    change = {"from": {"a": 1, "b": 99}, "to": {"a": 1, "b": 10}}
    assert runtime_of(answer)["arguments_changed"] == change
    (started,) = [e for e in events if isinstance(e, ToolStarted)]
    assert json.loads(started.call.arguments) == {"a": 1, "b": 10}
    (finished,) = [e for e in events if isinstance(e, ToolFinished)]
    assert finished.details == answer.details
    # the transcript keeps what the model asked for
    assert json.loads(result.messages[2].tool_calls[0].arguments) == {"a": 1, "b": 99}  # type: ignore[union-attr]


def test_arguments_changed_in_place_count_only_when_returned() -> None:
    def meddle(call: ToolCall, arguments: dict[str, Any]) -> None:
        arguments["text"] = "meddled"

    agent, _ = hooked_agent(
        [reply("", call("echo", text="hi")), "done"], StepHooks(before_tool=meddle)
    )
    result, _ = run_checked(agent)
    assert ran == ["echo hi"]
    assert tool_results(result)[0].details is None


@pytest.mark.parametrize(
    ("answer", "problem"),
    [
        ({"a": "one", "b": 2}, "its arguments were refused: Invalid arguments for tool 'add'"),
        ({"a": float("nan"), "b": 2}, "its arguments are not JSON (ValueError"),
        ({"a": {1, 2}, "b": 2}, "its arguments are not JSON (TypeError"),
        ("go", "it returned str, not None, Deny or a dict of arguments"),
        (Deny(reason=5), "its Deny reason is a int, not a str"),  # type: ignore[arg-type]
    ],
)
def test_a_before_tool_answer_that_cannot_be_taken_stops_the_call(
    answer: Any, problem: str
) -> None:
    agent, _ = hooked_agent(
        [reply("", call("add", a=1, b=2)), "done"], StepHooks(before_tool=lambda c, a: answer)
    )
    result, _ = run_checked(agent)
    (refused,) = tool_results(result)
    assert refused.status is ToolStatus.ERROR
    assert refused.content.startswith("Tool 'add' was not run: the before_tool hook failed (")
    assert problem in refused.content
    assert runtime_of(refused)["hook_failed"]["hook"] == "before_tool"
    assert ran == []


def test_a_before_tool_failure_is_fail_safe_and_logged() -> None:
    def broken(call: ToolCall, arguments: dict[str, Any]) -> None:
        raise KeyError("policy")

    agent, _ = hooked_agent(
        [reply("", call("echo", text="hi")), "done"], StepHooks(before_tool=broken)
    )
    with structlog.testing.capture_logs() as logs:
        result, _ = run_checked(agent)
    (refused,) = tool_results(result)
    assert refused.content == (
        "Tool 'echo' was not run: the before_tool hook failed (KeyError: 'policy')."
    )
    assert ran == []
    assert [log["event"] for log in logs if log["log_level"] == "warning"] == ["tool_hook_failed"]


def test_a_hanging_before_tool_is_bounded_by_the_tool_timeout() -> None:
    async def hang(call: ToolCall, arguments: dict[str, Any]) -> None:
        await asyncio.sleep(30)

    agent, _ = hooked_agent(
        [reply("", call("echo", text="hi")), "done"],
        StepHooks(before_tool=hang),
        tool_timeout_s=0.05,
    )
    result, _ = run_checked(agent)
    (refused,) = tool_results(result)
    assert "the before_tool hook failed (it did not finish within 0.05 s)" in refused.content
    assert ran == []


def test_an_abort_inside_before_tool_answers_every_call_and_asks_no_one() -> None:
    runs: list[Run] = []

    async def abort_and_wait(call: ToolCall, arguments: dict[str, Any]) -> None:
        runs[0].abort("stop now")
        await asyncio.sleep(30)

    agent, _ = hooked_agent(
        [reply("", call("echo", text="a"), call("transfer", amount=5)), "never"],
        StepHooks(before_tool=abort_and_wait),
    )
    runs.append(agent.start("go"))
    result = asyncio.run(runs[0].run())
    check_invariants(result, limits=agent.limits, bound=agent.bound)
    assert result.stop_reason is StopReason.ABORTED
    # neither run nor put to a person: the transfer is not left "awaiting approval"
    assert [m.content for m in tool_results(result)] == [f"Skipped: {STOPPED}"] * 2
    assert ran == []


def test_control_and_output_tools_are_not_hooked() -> None:
    seen: list[str] = []

    def watch(call: ToolCall, arguments: dict[str, Any]) -> Deny:
        seen.append(call.name)
        return Deny(reason="no")

    agent, _ = hooked_agent(
        [reply("", call("finish_task", summary="all done"))], StepHooks(before_tool=watch)
    )
    result, _ = run_checked(agent)
    assert result.stop_reason is StopReason.FINISH_TASK

    class Answer(BaseModel):
        value: int

    typed = Agent(
        model=ScriptedModel([reply("", call("final_result", value=4))]),
        output_type=Answer,
        hooks=StepHooks(before_tool=watch, after_tool=lambda c, r: seen.append(c.name)),
    )
    result, _ = run_checked(typed)
    assert result.value == Answer(value=4)
    assert seen == []


def test_a_denied_terminal_call_lets_the_next_one_end_the_run() -> None:
    def first_one_no(call: ToolCall, arguments: dict[str, Any]) -> Deny | None:
        return Deny(reason="too early") if arguments["answer"] == "early" else None

    agent, _ = hooked_agent(
        [reply("", call("submit", answer="early"), call("submit", answer="late"))],
        StepHooks(before_tool=first_one_no),
    )
    result, _ = run_checked(agent)
    assert (result.stop_reason, result.output) == (StopReason.TERMINAL_TOOL, "late")
    assert ran == ["submit late"]


def test_before_tool_runs_before_approval_and_the_person_approves_the_new_arguments() -> None:
    asked: list[dict[str, Any]] = []

    def cap(call: ToolCall, arguments: dict[str, Any]) -> dict[str, Any] | Deny | None:
        asked.append(arguments)
        if arguments["amount"] < 0:
            return Deny(reason="no refunds")
        return {"amount": min(arguments["amount"], 100)}

    agent, _ = hooked_agent(
        [reply("", call("transfer", amount=-5), call("transfer", amount=500)), "done"],
        StepHooks(before_tool=cap),
    )
    paused = agent.run_sync("go")
    check_invariants(paused, limits=agent.limits, bound=agent.bound)
    assert paused.stop_reason is StopReason.APPROVAL_REQUIRED
    assert paused.pending is not None
    (waiting,) = paused.pending.pending_calls  # the denied call never waits for a person
    assert json.loads(waiting.arguments) == {"amount": 100}
    refused, awaiting = tool_results(paused)
    assert refused.content == "Tool 'transfer' was not run: no refunds"
    assert runtime_of(awaiting)["arguments_changed"]["to"] == {"amount": 100}
    done = agent.resume_sync(paused.run_id, approvals=True, pause=paused.pending.pause)
    check_invariants(done, limits=agent.limits, bound=agent.bound)
    assert done.output == "done"
    assert ran == ["transfer 100"]
    assert len(asked) == 2  # the approved call was not put to the hook again


def _context(hooks: StepHooks, tools: Sequence[Tool], journal: MemoryJournal) -> RunContext:
    """An ACT context of its own, as ``tests/test_tool_acting.act_on`` builds one."""
    config = RunConfig(
        model=ScriptedModel([]),
        tools=ToolRegistry(tools),
        limits=limits(),
        machine=AgentMachine(),
        hooks=hooks,
    )
    state = new_run_state("run", "", "go", 0)
    state.pending_input.clear()
    state.turns = 1
    return RunContext(
        state=state,
        config=config,
        bus=EventBus([]),
        stop=StopEvent(),
        journal=journal,
        log=structlog.get_logger("test"),
        limits=config.limits,
        clock=time.monotonic,
        sleep=asyncio.sleep,
    )


def test_a_resumed_durable_run_replays_finished_calls_without_asking_the_hook() -> None:
    journal = MemoryJournal()
    calls = [ToolCall(id="c0", name="add", arguments='{"a": 1, "b": 99}')]
    asked: list[str] = []

    def clamp(call: ToolCall, arguments: dict[str, Any]) -> dict[str, Any]:
        asked.append(call.id)
        return {"a": 1, "b": 1}

    def deny(call: ToolCall, arguments: dict[str, Any]) -> Deny:
        asked.append(call.id)
        return Deny(reason="changed my mind")

    (first,) = asyncio.run(
        answer_calls(_context(StepHooks(before_tool=clamp), [add], journal), calls)
    )
    # the process "crashed" after the call finished; the resumed run asks ACT again
    (again,) = asyncio.run(
        answer_calls(_context(StepHooks(before_tool=deny), [add], journal), calls)
    )
    assert asked == ["c0"]
    assert ran == ["add 1 1"]
    assert again.content == first.content == "2"
    assert runtime_of(again)["arguments_changed"] == runtime_of(first)["arguments_changed"]
    assert runtime_of(again)["replayed"] is True


# -- after_tool -----------------------------------------------------------------------------


def test_after_tool_replaces_the_answer_the_model_reads() -> None:
    def redact(call: ToolCall, result: ToolMessage) -> ToolMessage | None:
        if call.name != "secret":
            return None
        return result.model_copy(update={"content": result.content.replace("hunter2", "***")})

    agent, model = hooked_agent(
        [reply("", call("secret", key="db"), call("echo", text="hi")), "done"],
        StepHooks(after_tool=redact),
    )
    result, _ = run_checked(agent)
    redacted, echoed = tool_results(result)
    assert redacted.content == "the secret of db is ***"
    assert runtime_of(redacted) == {"result_changed": True}
    assert echoed.details is None
    assert redacted in model.requests[1].messages


def test_after_tool_cannot_drop_the_record_of_changed_arguments() -> None:
    seen: list[dict[str, Any]] = []

    def rewrite(call: ToolCall, arguments: dict[str, Any]) -> dict[str, Any]:
        return {"text": "rewritten"}

    def replace_all(call: ToolCall, result: ToolMessage) -> ToolMessage:
        seen.append(runtime_of(result))
        return result.model_copy(update={"content": "replaced", "details": {"mine": 1}})

    agent, _ = hooked_agent(
        [reply("", call("echo", text="hi")), "done"],
        StepHooks(before_tool=rewrite, after_tool=replace_all),
    )
    result, _ = run_checked(agent)
    (answer,) = tool_results(result)
    assert seen == [{"arguments_changed": {"from": {"text": "hi"}, "to": {"text": "rewritten"}}}]
    assert answer.content == "replaced"
    assert answer.details == {
        "mine": 1,
        "runtime": {
            "result_changed": True,
            "arguments_changed": {"from": {"text": "hi"}, "to": {"text": "rewritten"}},
        },
    }


def test_after_tool_sees_failed_calls_but_not_calls_that_never_ran() -> None:
    seen: list[tuple[str, ToolStatus]] = []

    @tool
    def crash() -> str:
        """Always fails."""
        raise RuntimeError("crashed")

    def watch(call: ToolCall, result: ToolMessage) -> None:
        seen.append((call.name, result.status))

    agent, _ = hooked_agent(
        [
            reply(
                "",
                call("add", a=1, b=2),
                call("crash"),  # runs and fails
                call("add", a="x", b=2),  # invalid: never runs
                call("nope"),  # unknown: never runs
                call("secret", key="k"),  # denied: never runs
            ),
            "done",
        ],
        StepHooks(
            before_tool=lambda c, a: Deny(reason="no") if c.name == "secret" else None,
            after_tool=watch,
        ),
        tools=[*TOOLS, crash],
    )
    run_checked(agent)
    assert sorted(seen) == [("add", ToolStatus.OK), ("crash", ToolStatus.ERROR)]


def _withheld(call: ToolCall, result: ToolMessage) -> object:
    raise RuntimeError("redactor down")


@pytest.mark.parametrize(
    ("hook", "problem"),
    [
        (_withheld, "RuntimeError: redactor down"),
        (lambda c, r: "text", "it returned str, not a ToolMessage or None"),
        (
            lambda c, r: r.model_copy(update={"tool_call_id": "other"}),
            "answers another call (the call id and name cannot change)",
        ),
        (lambda c, r: r.model_copy(update={"name": "echo"}), "answers another call"),
        (lambda c, r: r.model_copy(update={"content": 42}), "its ToolMessage is invalid"),
        (
            lambda c, r: r.model_copy(update={"status": ToolStatus.SKIPPED}),
            "says 'skipped', but the call ran",
        ),
    ],
)
def test_an_after_tool_failure_withholds_the_output(
    hook: Callable[[ToolCall, ToolMessage], Any], problem: str
) -> None:
    agent, _ = hooked_agent(
        [reply("", call("secret", key="db")), "done"], StepHooks(after_tool=hook)
    )
    result, _ = run_checked(agent)
    (answer,) = tool_results(result)
    assert answer.status is ToolStatus.ERROR
    assert answer.content.startswith(
        "Tool 'secret' ran, but its output is withheld: the after_tool hook failed ("
    )
    assert problem in answer.content
    assert "hunter2" not in json.dumps(answer.model_dump(mode="json"))
    assert ran == ["secret db"]


def test_an_after_tool_replacement_is_cut_to_the_tool_s_output_limit() -> None:
    def bloat(call: ToolCall, result: ToolMessage) -> ToolMessage:
        return result.model_copy(update={"content": "y" * 500})

    agent, _ = hooked_agent(
        [reply("", call("secret", key="db")), "done"], StepHooks(after_tool=bloat)
    )
    result, _ = run_checked(agent)
    (answer,) = tool_results(result)
    assert answer.content.startswith("y" * 50 + "\n[output truncated")
    assert runtime_of(answer) == {"result_changed": True, "original_chars": 500, "shown_chars": 50}


def test_a_hanging_after_tool_is_bounded_by_the_tool_timeout() -> None:
    async def hang(call: ToolCall, result: ToolMessage) -> None:
        await asyncio.sleep(30)

    agent, _ = hooked_agent(
        [reply("", call("echo", text="hi")), "done"],
        StepHooks(after_tool=hang),
        tool_timeout_s=0.05,
    )
    result, _ = run_checked(agent)
    (answer,) = tool_results(result)
    assert "(it did not finish within 0.05 s)" in answer.content
    assert answer.status is ToolStatus.ERROR


# -- no hook breaks a run -------------------------------------------------------------------


def _pick(count: int, *parts: object) -> int:
    """A choice among ``count`` that depends only on ``parts``: hooks as chaotic as random
    ones, but deterministic, so hypothesis can shrink and replay what it found."""
    return zlib.crc32(repr(parts).encode()) % count


def _chaotic_plan(plan: ModelPlan) -> ModelPlan | None:
    last = plan.messages[-1]
    choice = _pick(9, plan.turn, plan.retry, last.content[:50])
    if choice == 0 and plan.retry == 0:
        raise ConnectionError("flaky retrieval")  # transient: retried
    if choice == 1:
        return dataclasses.replace(plan, tool_choice="required")
    if choice == 2:
        return dataclasses.replace(plan, tools=plan.tools[:1])
    if choice == 3:
        note = UserMessage(content="Context: nothing new.")
        return dataclasses.replace(plan, messages=[*plan.messages, note])
    if choice == 4 and plan.turn > 3:
        return dataclasses.replace(plan, messages=list(plan.messages[1:]))  # breaks a rule
    return None


async def _chaotic_before_tool(call: ToolCall, arguments: dict[str, Any]) -> Any:
    choice = _pick(6, call.id, call.name, call.arguments)
    if choice == 0:
        return Deny(reason="not now")
    if choice == 1:
        raise RuntimeError("policy engine crashed")
    if choice == 2:
        return {"text": "rewritten"} if call.name == "echo" else {"a": 1, "b": 2}
    if choice == 3:
        return {"nonsense": True}  # refused by the schema
    return None


def _chaotic_after_tool(call: ToolCall, result: ToolMessage) -> ToolMessage | None:
    choice = _pick(5, call.id, result.content[:50])
    if choice == 0:
        return result.model_copy(update={"content": "[redacted]"})
    if choice == 1:
        raise ValueError("redactor crashed")
    if choice == 2:
        return result.model_copy(update={"tool_call_id": "forged"})
    return None


CHAOS = StepHooks(
    before_model=_chaotic_plan, before_tool=_chaotic_before_tool, after_tool=_chaotic_after_tool
)


def test_hooks_that_deny_rewrite_and_raise_never_stop_a_run_from_ending_well() -> None:
    agent = Agent(
        model=ScriptedModel([]),
        tools=[echo, add],
        system_prompt="You are tested.",
        hooks=CHAOS,
        limits=Limits(max_turns=6, retry_backoff_s=0, retry_backoff_max_s=0),
    )
    assert_terminates(agent, max_examples=150)


class PlayedHooks:
    """Hooks that give hypothesis-chosen answers, in turn (cycling)."""

    def __init__(self, before: list[str], after: list[str], plans: list[str]) -> None:
        self.decisions = itertools.cycle(before)
        self.reviews = itertools.cycle(after)
        self.plans = itertools.cycle(plans)

    def hooks(self) -> StepHooks:
        return StepHooks(
            before_model=self.before_model,
            before_tool=self.before_tool,
            after_tool=self.after_tool,
        )

    def before_model(self, plan: ModelPlan) -> ModelPlan | None:
        action = next(self.plans)
        if action == "required" and plan.tools:
            return dataclasses.replace(plan, tool_choice="required")
        if action == "raise" and plan.retry == 0:
            raise TimeoutError("slow hook")  # transient: the call is retried
        if action == "garbage" and plan.turn == 3:
            return dataclasses.replace(plan, messages=[])  # breaks a rule: the run ends
        return None

    async def before_tool(self, call: ToolCall, arguments: dict[str, Any]) -> Any:
        action = next(self.decisions)
        if action == "raise":
            raise RuntimeError("broken hook")
        if action == "swallow-cancel":
            raise asyncio.CancelledError  # its own, not the run's: a failure
        return {
            "deny": Deny(reason="denied"),
            "rewrite": {"a": 2, "b": 3},
            "refused": {"a": "two"},
        }.get(action)

    def after_tool(self, call: ToolCall, result: ToolMessage) -> ToolMessage | None:
        action = next(self.reviews)
        if action == "raise":
            raise ValueError("broken hook")
        if action == "replace":
            return result.model_copy(update={"content": "replaced"})
        if action == "forge":
            return result.model_copy(update={"name": "echo"})
        return None


@settings(max_examples=60, deadline=None)
@given(
    before=st.lists(
        st.sampled_from(["go", "deny", "raise", "rewrite", "refused", "swallow-cancel"]),
        min_size=1,
        max_size=6,
    ),
    after=st.lists(st.sampled_from(["keep", "replace", "raise", "forge"]), min_size=1, max_size=4),
    plans=st.lists(
        st.sampled_from(["keep", "required", "raise", "garbage"]), min_size=1, max_size=4
    ),
    calls_per_turn=st.lists(st.integers(min_value=0, max_value=3), min_size=1, max_size=4),
)
def test_every_tool_call_gets_one_answer_whatever_the_hooks_do(
    before: list[str], after: list[str], plans: list[str], calls_per_turn: list[int]
) -> None:
    """Hypothesis chooses each hook's answers, in order; the model calls tools for a few
    turns and then answers. Every run ends within its bound with a valid transcript."""

    def respond(request: ModelRequest) -> ModelResponse | str:
        turn = request.turn - 1
        if turn >= len(calls_per_turn):
            return "done"
        calls = [call("add", a=i, b=turn) for i in range(calls_per_turn[turn])]
        return reply("", *calls) if calls else reply("", call("echo", text="x"))

    agent = Agent(
        model=FunctionModel(respond),
        tools=[echo, add],
        hooks=PlayedHooks(before, after, plans).hooks(),
        limits=Limits(max_turns=8, retry_backoff_s=0, retry_backoff_max_s=0),
    )
    result, _ = run_checked(agent)
    if result.stop_reason is StopReason.MODEL_ERROR:  # the model never fails: a hook did
        assert (result.error or "").startswith("before_model hook failed")
