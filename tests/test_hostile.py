"""Hostile inputs (issue 20): what a hostile user or a flaky production model does through
the public API must end in a stop reason or a clear error, never a replayed or doubled side
effect."""

from __future__ import annotations

import asyncio
import json
import math
import re
import traceback
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from agent_fsm import (
    Agent,
    ConfigError,
    Limits,
    MemoryStore,
    ResumeError,
    SQLiteStore,
    StopReason,
    tool,
)
from agent_fsm.durable.checkpoint import CheckpointStore
from agent_fsm.failures import failure_traceback
from agent_fsm.messages import ModelRequest, ModelResponse, Usage
from agent_fsm.testing import FunctionModel, ScriptedModel, call, raw_call, reply
from agent_fsm.tools.tool import Tool

SENT: list[str] = []


@tool
def send_email(to: str) -> str:
    """Send an email (a side effect that must happen once per call)."""
    SENT.append(to)
    return f"sent to {to}"


@tool(requires_approval=True)
async def pay(amount: int) -> str:
    """Pay (a person approves every payment)."""
    await asyncio.sleep(0.01)  # long enough for a second resume to arrive meanwhile
    SENT.append(f"paid {amount}")
    return "paid"


def _store(kind: str, tmp_path: Path) -> CheckpointStore | None:
    if kind == "sqlite":
        return SQLiteStore(tmp_path / "runs.sqlite3")
    return MemoryStore() if kind == "memory" else None


@pytest.fixture(autouse=True)
def _clear() -> None:
    SENT.clear()


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_a_reused_run_id_is_refused_and_never_answered_from_the_old_journal(
    kind: str, tmp_path: Path
) -> None:
    store = _store(kind, tmp_path)
    first = Agent(
        model=ScriptedModel([reply("", call("send_email", to="alice")), "Sent."]),
        tools=[send_email],
        store=store,
    )
    assert first.run_sync("Mail Alice.", run_id="job-7").output == "Sent."
    second = first.replace(model=ScriptedModel([reply("", call("send_email", to="bob")), "x"]))
    with pytest.raises(ConfigError, match="run id 'job-7' is taken"):
        second.run_sync("Mail Bob.", run_id="job-7")
    assert SENT == ["alice"]
    second.checkpoints.delete("job-7")  # deleting the old run frees its id, journal and all
    assert second.run_sync("Mail Bob.", run_id="job-7").status == "completed"
    assert SENT == ["alice", "bob"]


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_two_runs_started_under_one_id_before_either_steps_run_once(
    kind: str, tmp_path: Path
) -> None:
    """Two workers take the same job: the second start is refused at once, so bob's mail is
    never answered from alice's journal (it was, while the id was claimed only at the first
    checkpoint)."""
    store = _store(kind, tmp_path)
    alice = Agent(
        model=ScriptedModel([reply("", call("send_email", to="alice")), "Sent."]),
        tools=[send_email],
        store=store,
    )
    bob = alice.replace(model=ScriptedModel([reply("", call("send_email", to="bob")), "x"]))
    first = alice.start("Mail Alice.", run_id="job-7")
    with pytest.raises(ConfigError, match="run id 'job-7' is taken"):
        bob.start("Mail Bob.", run_id="job-7")
    assert (await first.run()).output == "Sent."
    assert SENT == ["alice"]


@pytest.mark.parametrize("kind", ["default", "memory", "sqlite"])
async def test_a_double_clicked_approval_pays_once(kind: str, tmp_path: Path) -> None:
    agent = Agent(
        model=ScriptedModel([reply("", call("pay", amount=5)), "Paid.", "Paid again."]),
        tools=[pay],
        store=_store(kind, tmp_path),
    )
    paused = await agent.run("Pay 5.")
    assert paused.stop_reason is StopReason.APPROVAL_REQUIRED
    outcomes = await asyncio.gather(
        agent.resume(paused.run_id, approvals=True, pause=paused.pending.pause),
        agent.resume(paused.run_id, approvals=True, pause=paused.pending.pause),
        return_exceptions=True,
    )
    assert SENT == ["paid 5"]
    errors = [o for o in outcomes if isinstance(o, BaseException)]
    assert len(errors) == 1
    assert isinstance(errors[0], ResumeError)


async def test_two_reopened_copies_of_one_pause_carry_it_out_once() -> None:
    agent = Agent(model=ScriptedModel([reply("", call("pay", amount=5)), "Paid."]), tools=[pay])
    paused = await agent.run("Pay 5.")
    one = agent.reopen(paused.run_id, approvals=True, pause=paused.pending.pause)
    other = agent.reopen(paused.run_id, approvals=True, pause=paused.pending.pause)
    assert (await one.run()).output == "Paid."
    with pytest.raises(ResumeError, match="is already being resumed"):
        await other.run()
    assert SENT == ["paid 5"]


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_two_reopened_copies_of_a_durable_pause_go_on_once(kind: str, tmp_path: Path) -> None:
    """With a durable store, the second copy used to take its resume row too: the journal
    kept the payment single, but the run went on twice (another model call, and whatever
    new calls it made)."""
    model = ScriptedModel([reply("", call("pay", amount=5)), "Paid.", "Paid again."])
    agent = Agent(model=model, tools=[pay], store=_store(kind, tmp_path))
    paused = await agent.run("Pay 5.")
    one = agent.reopen(paused.run_id, approvals=True, pause=paused.pending.pause)
    other = agent.reopen(paused.run_id, approvals=True, pause=paused.pending.pause)
    assert (await one.run()).output == "Paid."
    with pytest.raises(ResumeError, match="has moved on since it was reopened"):
        await other.run()
    assert SENT == ["paid 5"]
    assert model.remaining == 1  # no second continuation


async def test_a_reopened_copy_that_fell_behind_is_refused() -> None:
    """The first resume pauses again; a stale copy of the first pause must not answer the
    second one with its old decision."""
    script = [reply("", call("pay", amount=5)), reply("", call("pay", amount=7)), "Done."]
    agent = Agent(model=ScriptedModel(script), tools=[pay])
    paused = await agent.run("Pay 5, then 7.")
    one = agent.reopen(paused.run_id, approvals=True, pause=paused.pending.pause)
    stale = agent.reopen(paused.run_id, approvals=True, pause=paused.pending.pause)
    again = await one.run()
    assert again.stop_reason is StopReason.APPROVAL_REQUIRED
    with pytest.raises(ResumeError, match="has moved on since it was reopened"):
        await stale.run()
    assert SENT == ["paid 5"]


async def test_a_stream_cut_cleanly_is_a_transient_failure_not_an_answer() -> None:
    from agent_fsm import Limits
    from agent_fsm.models import OpenAIChatModel
    from tests.local_server import LocalServer
    from tests.openai_payloads import chunks_for, completion

    whole = chunks_for(completion("The answer is forty-two, because"))
    cut = [c for c in whole if not any(ch.get("finish_reason") for ch in c["choices"])]
    server = LocalServer()
    async with server as url:
        server.stream(cut[:3], done=False)  # ends cleanly, with no finish reason, no [DONE]
        server.stream(whole)
        model = OpenAIChatModel("m", base_url=url, api_key="sk-local", stream=True)
        agent = Agent(model=model, limits=Limits(retry_backoff_s=0, retry_backoff_max_s=0))
        async with model:
            result = await agent.run("Why?")
    assert result.output == "The answer is forty-two, because"
    assert result.retries == 1
    assert [e.label for e in result.trace] == ["think", "retry", "final_answer"]


class UnprintableError(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no message for you")


def _raising_tool(exc: BaseException, *, is_async: bool) -> Tool:
    if is_async:

        async def fragile(x: int) -> str:
            """Raise."""
            raise exc

        return tool(fragile)

    def fragile_sync(x: int) -> str:
        """Raise."""
        raise exc

    return tool(name="fragile")(fragile_sync)


@pytest.mark.parametrize(
    ("exc", "is_async", "says"),
    [
        (SystemExit(3), False, "SystemExit: 3"),
        (SystemExit(3), True, "SystemExit: 3"),
        (KeyboardInterrupt(), False, "KeyboardInterrupt"),  # raised on the worker thread
        (asyncio.CancelledError(), False, "CancelledError"),
        (asyncio.CancelledError(), True, "CancelledError"),  # of its own accord
        (GeneratorExit(), True, "GeneratorExit"),
        (UnprintableError(), False, "UnprintableError: <its message could not be read"),
        (UnprintableError(), True, "UnprintableError: <its message could not be read"),
    ],
)
def test_whatever_a_tool_raises_is_an_error_result(
    exc: BaseException, is_async: bool, says: str
) -> None:
    agent = Agent(
        model=ScriptedModel([reply("", call("fragile", x=1)), "Handled."]),
        tools=[_raising_tool(exc, is_async=is_async)],
    )
    result = agent.run_sync("Go.")
    assert (result.stop_reason, result.output) == (StopReason.FINAL_ANSWER, "Handled.")
    answers = [m for m in result.messages if m.role == "tool"]
    assert len(answers) == 1
    assert says in answers[0].content


def test_a_failed_tools_traceback_is_pythons_without_the_column_markers() -> None:
    """``failure_traceback`` skips only the ``^^^`` lines, which cost a parse of every
    frame's source: the chain, the frames, their source lines and a broken ``__str__`` all
    come out as ``traceback.format_exception`` writes them."""

    def lookup() -> None:
        try:
            {}["key"]
        except KeyError as exc:
            raise ValueError("not found") from exc

    def handle() -> None:
        try:
            lookup()
        except ValueError:
            raise UnprintableError()  # noqa: B904 (the implicit context is the point)

    with pytest.raises(UnprintableError) as caught:
        handle()
    ours = failure_traceback(caught.value)
    python = "".join(traceback.format_exception(caught.value))
    assert ours == re.sub(r"\n *[~^]+(?=\n)", "", python)
    assert "direct cause" in ours
    assert "During handling" in ours
    assert '{}["key"]' in ours
    assert "<exception str() failed>" in ours
    assert "^" not in ours


@pytest.mark.parametrize(
    ("exc", "says"),
    [
        (asyncio.CancelledError(), "CancelledError"),
        (GeneratorExit(), "GeneratorExit"),
        (SystemExit(2), "SystemExit: 2"),
        (UnprintableError(), "UnprintableError: <its message could not be read"),
    ],
)
def test_whatever_a_model_raises_ends_the_run_with_model_error(
    exc: BaseException, says: str
) -> None:
    def broken(request: ModelRequest) -> ModelResponse:
        raise exc

    result = Agent(model=FunctionModel(broken)).run_sync("Go.")
    assert result.stop_reason is StopReason.MODEL_ERROR
    assert result.error is not None
    assert says in result.error


async def test_an_abort_still_cancels_a_tool_that_is_running() -> None:
    """The boundary keeps the run's own cancellation: abort() stops a running tool."""
    started = asyncio.Event()

    @tool
    async def slow(x: int) -> str:
        """Wait a long time."""
        started.set()
        await asyncio.sleep(60)
        return "late"

    agent = Agent(model=ScriptedModel([reply("", call("slow", x=1)), "x"]), tools=[slow])
    run = agent.start("Go.")
    task = asyncio.ensure_future(run.run())
    await started.wait()
    run.abort("the user pressed stop")
    result = await task
    assert result.stop_reason is StopReason.ABORTED


def test_a_reflector_that_raises_is_logged_and_the_budgets_still_end_the_run() -> None:
    def broken(state: object) -> bool:
        raise ValueError("reflector bug")

    agent = Agent(
        model=ScriptedModel([reply("", call("send_email", to="a")), "Done."]),
        tools=[send_email],
        reflector=broken,
    )
    with capture_logs() as logs:
        result = agent.run_sync("Go.")
    assert (result.stop_reason, result.output) == (StopReason.FINAL_ANSWER, "Done.")
    failed = [line for line in logs if line["event"] == "reflector_failed"]
    assert failed[0]["error"] == "ValueError: reflector bug"


def test_an_async_event_handler_is_refused_where_it_is_given() -> None:
    async def handler(event: object) -> None:
        pass

    class Handler:
        async def __call__(self, event: object) -> None:
            pass

    agent = Agent(model=ScriptedModel(["x"]))
    for wrong in (handler, Handler()):
        with pytest.raises(ConfigError, match="must not be async"):
            agent.subscribe(wrong)  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="must not be async"):
            Agent(model=ScriptedModel(["x"]), handlers=[wrong])  # type: ignore[list-item]
        with pytest.raises(ConfigError, match="must not be async"):
            agent.start("Go.").subscribe(wrong)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="must be callable"):
        agent.subscribe("print")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "field", ["timeout_s", "tool_timeout_s", "retry_backoff_s", "retry_wait_s", "retry_after_max_s"]
)
def test_limits_refuse_infinite_and_nan_durations(field: str) -> None:
    for value in (math.inf, math.nan):
        with pytest.raises(ConfigError, match=f"{field}: Input should be a finite number"):
            Limits(**{field: value})


LONE = "\ud83d"  # half of a surrogate pair: what os.listdir returns for a Latin-1 file name


@tool
def list_files(folder: str) -> str:
    """List a folder (its names may not be valid UTF-8)."""
    return f"report{LONE}.txt"


@pytest.mark.parametrize("kind", ["default", "sqlite"])
def test_lone_surrogates_anywhere_never_break_a_checkpoint_or_the_transcript(
    kind: str, tmp_path: Path
) -> None:
    script = [
        reply(f"Looking{LONE}", call("list_files", folder="docs")),
        reply("", call("ask_user", question=f"Which one{LONE}?")),
        f"Done{LONE}.",
    ]
    agent = Agent(
        model=ScriptedModel(script),
        tools=[list_files],
        system_prompt=f"Be brief{LONE}",
        store=_store(kind, tmp_path),
    )
    paused = agent.run_sync(f"Find the report{LONE}.")
    assert paused.stop_reason is StopReason.ASK_USER
    done = agent.resume_sync(paused.run_id, f"the first{LONE}")
    assert done.output == "Done\ufffd."
    texts = [m.content for m in done.messages]
    assert all(LONE not in text for text in texts)
    assert "report\ufffd.txt" in texts
    for text in texts:
        text.encode()  # every one is valid UTF-8 now


@pytest.mark.parametrize("kind", ["default", "sqlite"])
def test_absurd_usage_from_a_broken_proxy_is_clamped_and_the_budget_ends_the_run(
    kind: str, tmp_path: Path
) -> None:
    absurd = Usage(input_tokens=2**63, output_tokens=2**64)
    script = [ModelResponse(message=reply("", call("send_email", to="a")).message, usage=absurd)]
    agent = Agent(model=ScriptedModel(script), tools=[send_email], store=_store(kind, tmp_path))
    result = agent.run_sync("Go.")
    assert result.stop_reason is StopReason.TOKEN_BUDGET
    assert result.usage.input_tokens == result.usage.output_tokens == 10**12


def test_a_schema_with_a_dangling_ref_is_refused_when_the_tool_is_made() -> None:
    schema = {"type": "object", "properties": {"to": {"$ref": "#/$defs/Address"}}}
    with pytest.raises(ConfigError, match=r"refer to what they do not define: #/\$defs/Address"):
        Tool(name="mail", description="Mail.", parameters=schema, fn=lambda to: to)
    fine = {**schema, "$defs": {"Address": {"type": "string"}}}
    assert Tool(name="mail", description="Mail.", parameters=fine, fn=lambda to: to)


def test_an_integer_parameter_receives_an_int_even_when_the_json_says_2_0() -> None:
    seen: list[object] = []

    @tool
    def repeat(times: int, counts: list[int]) -> str:
        """Repeat."""
        seen.extend([times, *counts])
        return "ok"

    @tool
    def maybe(times: int | None = None) -> str:
        """Maybe repeat."""
        seen.append(times)
        return "ok"

    script = [
        reply("", raw_call("repeat", '{"times": 2.0, "counts": [1.0, 3]}')),
        reply("", raw_call("maybe", '{"times": 4.0}')),
        "Done.",
    ]
    Agent(model=ScriptedModel(script), tools=[repeat, maybe]).run_sync("Go.")
    assert seen == [2, 1, 3, 4]
    assert all(type(value) is int for value in seen)


@st.composite
def _schemas_with_a_ref(draw: st.DrawFn) -> tuple[dict[str, Any], str]:
    """A tool schema with one ``$ref`` somewhere inside it, and the name it refers to."""
    name = draw(st.from_regex(r"[A-Z][a-z]{0,8}", fullmatch=True))
    node: dict[str, Any] = {"$ref": f"#/$defs/{name}"}
    for wrap in draw(st.lists(st.sampled_from(["items", "anyOf", "allOf", "object"]), max_size=4)):
        if wrap == "items":
            node = {"type": "array", "items": node}
        elif wrap == "anyOf":
            node = {"anyOf": [{"type": "null"}, node]}
        elif wrap == "allOf":
            node = {"allOf": [node]}
        else:
            node = {"type": "object", "properties": {"inner": node}}
    return {"type": "object", "properties": {"x": node}}, name


@settings(max_examples=200)  # each example builds two tools: no run, no need for thousands
@given(found=_schemas_with_a_ref(), remote=st.booleans())
def test_a_ref_anywhere_that_cannot_resolve_is_refused_when_the_tool_is_made(
    found: tuple[dict[str, Any], str], remote: bool
) -> None:
    schema, name = found
    if remote:  # never fetched: the network is not part of validating a call
        text = json.dumps(schema).replace("#/$defs/", "https://schemas.example/defs.json#/")
        schema = json.loads(text)
    with pytest.raises(ConfigError, match="refer to what they do not define"):
        Tool(name="t", description="T.", parameters=schema, fn=lambda **kw: "ok")
    if not remote:
        defined = {**schema, "$defs": {name: {"type": "string"}}}
        assert Tool(name="t", description="T.", parameters=defined, fn=lambda **kw: "ok")
