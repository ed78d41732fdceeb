"""Context windows (issue 14): the prompt fits before every call, context policies shrink it
without ever orphaning a tool call, summaries are turns, and estimates learn from usage."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from agent_fsm import (
    Agent,
    AgentState,
    ClearToolResults,
    ConfigError,
    KeepLastTurns,
    Limits,
    SQLiteStore,
    StopReason,
    Summarize,
    tool,
)
from agent_fsm.compaction import Context
from agent_fsm.events import ContextCompacted, Event, ModelRequested
from agent_fsm.messages import (
    Message,
    ModelRequest,
    ModelResponse,
    SystemMessage,
    ToolMessage,
    Usage,
    UserMessage,
)
from agent_fsm.prompt import SUMMARY_HEADING, ContextEdits, SummaryDue
from agent_fsm.testing import FunctionModel, ScriptedModel, call, check_invariants, reply
from agent_fsm.testing.invariants import transcript_problems
from agent_fsm.tokens import Calibration, estimate_message_tokens, estimate_tools_tokens
from agent_fsm.tools import ToolResult

BIG = 4_000  # characters of one tool result: ~1,000 tokens


@tool
def fetch(page: int) -> ToolResult:
    """Fetch one page of a large document."""
    return ToolResult(output=f"page {page}: " + "x" * BIG, details={"page": page})


def fetches(pages: int) -> list[ModelResponse]:
    return [reply("", call("fetch", page=p)) for p in range(pages)]


def reader(pages: int, *, answer: str = "Done.") -> ScriptedModel:
    return ScriptedModel([*fetches(pages), answer])


def limits(window: int | None = 3_000, **more: object) -> Limits:
    settings: dict[str, object] = {"max_turns": 30, "token_budget": 10**7, "reply_tokens": 300}
    return Limits.model_validate({**settings, "context_window": window, **more})


def run(agent: Agent, text: str = "Read the document.") -> tuple[list[Event], object]:
    events: list[Event] = []
    result = agent.subscribe(events.append).run_sync(text)
    check_invariants(result, limits=agent.limits, bound=agent.bound, events=events)
    return events, result


def sent_prompts(model: ScriptedModel | FunctionModel) -> list[list[Message]]:
    return [list(request.messages) for request in model.requests]


def assert_prompt_sound(prompt: Sequence[Message], system: str, latest_input: str) -> None:
    assert prompt[0] == SystemMessage(content=system)
    assert UserMessage(content=latest_input) in prompt
    assert transcript_problems(prompt) == []


# --- stopping before the call --------------------------------------------------------------


def test_without_a_policy_the_run_stops_before_the_call_that_would_not_fit() -> None:
    model = reader(5)
    agent = Agent(model=model, tools=[fetch], limits=limits(), system_prompt="Read.")
    events, result = run(agent)
    assert result.stop_reason is StopReason.CONTEXT_WINDOW  # type: ignore[attr-defined]
    assert "context window" in result.error
    assert "context_policy" in result.error
    # Two fetches fit (~1,000 tokens each); the third prompt would not: it was never sent.
    assert len(model.requests) == 3
    requested = [e for e in events if isinstance(e, ModelRequested)]
    assert all(e.estimated_prompt_tokens + 300 <= 3_000 for e in requested)
    assert result.final_state is AgentState.ERROR  # type: ignore[attr-defined]
    assert [e for e in events if isinstance(e, ContextCompacted)][-1].problems == ()


def test_no_window_means_no_compaction_and_the_transcript_is_sent_as_it_is() -> None:
    model = reader(6)
    agent = Agent(model=model, tools=[fetch], limits=limits(None), context_policy=None)
    events, result = run(agent)
    assert result.stop_reason is StopReason.FINAL_ANSWER  # type: ignore[attr-defined]
    assert not any(isinstance(e, ContextCompacted) for e in events)
    assert len(sent_prompts(model)[-1]) == len(result.messages) - 1  # type: ignore[attr-defined]


def test_a_prompt_nothing_can_shrink_stops_with_context_window() -> None:
    # One user message bigger than the window: no policy may drop the latest input.
    model = ScriptedModel(["never"])
    agent = Agent(model=model, limits=limits(), context_policy=[KeepLastTurns(1)])
    _events, result = run(agent, "y" * 20_000)
    assert result.stop_reason is StopReason.CONTEXT_WINDOW  # type: ignore[attr-defined]
    assert model.requests == []
    assert "no context policy could shrink it" in result.error  # type: ignore[attr-defined]


# --- the policies --------------------------------------------------------------------------


def test_keep_last_turns_cuts_between_turns_and_keeps_the_system_prompt_and_input() -> None:
    model = reader(12)
    agent = Agent(
        model=model,
        tools=[fetch],
        limits=limits(),
        system_prompt="Read.",
        context_policy=KeepLastTurns(2),
    )
    events, result = run(agent)
    assert result.stop_reason is StopReason.FINAL_ANSWER  # type: ignore[attr-defined]
    for prompt in sent_prompts(model):
        assert_prompt_sound(prompt, "Read.", "Read the document.")
    last = sent_prompts(model)[-1]
    # system, input, then the last two turns (an assistant call and its result each).
    assert [m.role for m in last] == ["system", "user", "assistant", "tool", "assistant", "tool"]
    compacted = [e for e in events if isinstance(e, ContextCompacted)]
    assert compacted
    assert all(e.policies == ("keep_last_turns(2)",) for e in compacted)
    assert all(e.tokens_after < e.tokens_before for e in compacted)
    # The transcript itself lost nothing.
    assert sum(isinstance(m, ToolMessage) for m in result.messages) == 12  # type: ignore[attr-defined]


def test_clear_tool_results_leaves_a_stub_with_the_call_id_and_keeps_details() -> None:
    model = reader(8)
    agent = Agent(
        model=model,
        tools=[fetch],
        limits=limits(),
        system_prompt="Read.",
        context_policy=ClearToolResults(keep_last_turns=1),
    )
    _, result = run(agent)
    assert result.stop_reason is StopReason.FINAL_ANSWER  # type: ignore[attr-defined]
    last = sent_prompts(model)[-1]
    assert_prompt_sound(last, "Read.", "Read the document.")
    results = [m for m in last if isinstance(m, ToolMessage)]
    assert len(results) == 8  # every call still answered, most by a stub
    stubs = [m for m in results if m.content.startswith("[The output of this fetch call")]
    assert 6 <= len(stubs) <= 7
    assert "4008 characters" in stubs[0].content
    assert "Call the tool again" in stubs[0].content
    assert results[-1].content.startswith("page 7: ")  # the last turn's result is whole
    assert stubs[0].details == {"page": 0}
    whole = [m for m in result.messages if isinstance(m, ToolMessage)]  # type: ignore[attr-defined]
    assert all(m.content.startswith("page ") for m in whole)


def test_policies_compose_in_order_each_seeing_what_the_earlier_did() -> None:
    model = reader(20)
    agent = Agent(
        model=model,
        tools=[fetch],
        limits=limits(1_700),  # too small for twenty stubs and a whole result
        system_prompt="Read.",
        context_policy=[ClearToolResults(keep_last_turns=1), KeepLastTurns(3)],
    )
    events, result = run(agent)
    assert result.stop_reason is StopReason.FINAL_ANSWER  # type: ignore[attr-defined]
    names = {name for e in events if isinstance(e, ContextCompacted) for name in e.policies}
    assert names == {"clear_tool_results", "keep_last_turns(3)"}
    for prompt in sent_prompts(model):
        assert_prompt_sound(prompt, "Read.", "Read the document.")


def test_summarize_is_a_turn_without_tools_and_its_summary_replaces_the_early_history() -> None:
    summary_model = ScriptedModel(["The user asked to read; pages 0-2 were all x.", "Second."])
    model = reader(5)
    agent = Agent(
        model=model,
        tools=[fetch],
        limits=limits(),
        system_prompt="Read.",
        context_policy=Summarize(keep_last_turns=1, model=summary_model),
    )
    events, result = run(agent)
    assert result.stop_reason is StopReason.FINAL_ANSWER  # type: ignore[attr-defined]
    # The summary call: the policy's model, its own instructions, no tools, counted as a turn.
    first, second = summary_model.requests
    assert first.tools == ()
    assert first.messages[0].role == "system"
    assert "Result of fetch: page 0" in first.messages[1].content
    # The second summary is of the first one and what came after it.
    summary = "The user asked to read; pages 0-2 were all x."
    assert summary in second.messages[1].content
    assert result.turns == len(model.requests) + 2  # type: ignore[attr-defined]
    assert result.usage.requests == result.turns  # type: ignore[attr-defined]
    prompts = sent_prompts(model)
    assert UserMessage(content=SUMMARY_HEADING + summary) in prompts[-2]
    assert prompts[-1][1] == UserMessage(content=SUMMARY_HEADING + "Second.")
    for prompt in prompts:
        assert_prompt_sound(prompt, "Read.", "Read the document.")
    compacted = [e for e in events if isinstance(e, ContextCompacted)]
    assert compacted[0].summary_requested
    assert compacted[0].summary is None
    assert compacted[1].summary == summary
    labels = [entry.label for entry in result.trace]  # type: ignore[attr-defined]
    assert "summarise" in labels
    assert "summarised" in labels


def test_a_summary_call_is_paid_from_max_turns() -> None:
    agent = Agent(
        model=ScriptedModel([*fetches(3), "A summary."]),
        tools=[fetch],
        limits=limits(max_turns=3),
        context_policy=Summarize(keep_last_turns=1),
    )
    _, result = run(agent)
    # Three turns were fetches; the summary a fourth would have needed is refused by max_turns.
    assert result.stop_reason is StopReason.MAX_TURNS  # type: ignore[attr-defined]
    assert result.turns == 3  # type: ignore[attr-defined]


def test_an_empty_summary_is_a_transient_model_failure_that_is_retried() -> None:
    model = ScriptedModel([*fetches(3), "", "A summary.", "Done."])
    agent = Agent(
        model=model,
        tools=[fetch],
        limits=limits(model_retries=2, retry_backoff_s=0, retry_backoff_max_s=0),
        context_policy=Summarize(keep_last_turns=1),
    )
    _, result = run(agent)
    assert result.stop_reason is StopReason.FINAL_ANSWER  # type: ignore[attr-defined]
    assert result.retries == 1  # type: ignore[attr-defined]
    assert any(
        isinstance(m, UserMessage) and m.content == SUMMARY_HEADING + "A summary."
        for m in model.requests[-1].messages
    )


# --- user-written policies and their failures -------------------------------------------


@dataclass(frozen=True)
class DropEverySecondTurn:
    """A user's policy: clears results of even pages (through the same protocol)."""

    name: str = "drop_even_pages"

    def shrink(self, context: Context) -> ContextEdits | SummaryDue | None:
        even = [
            i
            for i, m in enumerate(context.messages)
            if isinstance(m, ToolMessage)
            and "page " in m.content
            and i not in context.edits.cleared
        ]
        return context.edits.clear(*even) if even else None


def test_a_user_written_policy_works_through_the_same_protocol() -> None:
    model = reader(6)
    agent = Agent(model=model, tools=[fetch], limits=limits(), context_policy=DropEverySecondTurn())
    events, result = run(agent)
    assert result.stop_reason is StopReason.FINAL_ANSWER  # type: ignore[attr-defined]
    assert any(
        e.policies == ("drop_even_pages",) for e in events if isinstance(e, ContextCompacted)
    )


@dataclass(frozen=True)
class Broken:
    name: str
    change: object

    def shrink(self, context: Context) -> ContextEdits | SummaryDue | None:
        if isinstance(self.change, BaseException):
            raise self.change
        if callable(self.change):
            return self.change(context)  # type: ignore[no-any-return]
        return self.change  # type: ignore[return-value]


def _cut_at_a_tool_result(context: Context) -> ContextEdits:
    index = next(i for i, m in enumerate(context.messages) if isinstance(m, ToolMessage))
    return context.edits.model_copy(update={"start": index})


@pytest.mark.parametrize(
    ("policy", "problem"),
    [
        (Broken("raises", ValueError("bad policy")), "raises failed: ValueError: bad policy"),
        (Broken("wrong_type", "cut it"), "wrong_type returned str"),
        (Broken("orphans", _cut_at_a_tool_result), "separate it from its call"),
    ],
    ids=["raises", "wrong-type", "orphaning-cut"],
)
def test_a_broken_policy_is_skipped_and_reported_and_the_next_one_runs(
    policy: Broken, problem: str
) -> None:
    model = reader(6)
    agent = Agent(
        model=model, tools=[fetch], limits=limits(), context_policy=[policy, KeepLastTurns(1)]
    )
    events, result = run(agent)
    assert result.stop_reason is StopReason.FINAL_ANSWER  # type: ignore[attr-defined]
    compacted = [e for e in events if isinstance(e, ContextCompacted)]
    assert problem in compacted[0].problems[0]
    assert compacted[0].policies == ("keep_last_turns(1)",)


def test_a_broken_policy_alone_stops_the_run_with_its_problem_in_the_error() -> None:
    agent = Agent(
        model=reader(6),
        tools=[fetch],
        limits=limits(),
        context_policy=Broken("raises", KeyError("k")),
    )
    _, result = run(agent)
    assert result.stop_reason is StopReason.CONTEXT_WINDOW  # type: ignore[attr-defined]
    assert "raises failed: KeyError" in result.error  # type: ignore[attr-defined]


# --- configuration -------------------------------------------------------------------------


def test_a_policy_without_a_window_is_refused() -> None:
    with pytest.raises(ConfigError, match="context window"):
        Agent(model=reader(1), context_policy=KeepLastTurns(2))


def test_something_that_is_not_a_policy_is_refused() -> None:
    with pytest.raises(ConfigError, match="ContextPolicy"):
        Agent(model=reader(1), limits=limits(), context_policy=[KeepLastTurns(2), "keep 2"])  # type: ignore[list-item]


@pytest.mark.parametrize(
    "make",
    [lambda: KeepLastTurns(0), lambda: ClearToolResults(min_chars=-1), lambda: Summarize(0)],
    ids=["keep-0", "negative-min-chars", "summarize-0"],
)
def test_policy_arguments_are_checked(make: object) -> None:
    with pytest.raises(ConfigError):
        make()  # type: ignore[operator]


def test_reply_tokens_must_leave_room_in_the_window() -> None:
    with pytest.raises(ConfigError, match="reply_tokens"):
        Limits(context_window=1_000, reply_tokens=1_000)


class WindowedModel(FunctionModel):
    """A model that knows its window and tokenizer (one token per character)."""

    context_window = 2_500

    def count_tokens(self, text: str) -> int:
        return len(text)


def test_the_model_may_name_its_window_and_count_tokens_exactly() -> None:
    model = WindowedModel(lambda request: "ok")
    agent = Agent(model=model, limits=Limits(reply_tokens=100))
    assert agent.limits.context_window == 2_500
    events, result = run(agent, "z" * 1_000)
    (requested,) = [e for e in events if isinstance(e, ModelRequested)]
    # The exact counter counts a character per token: four times the estimate's count.
    assert requested.estimated_prompt_tokens >= 1_000
    _, result = run(agent, "z" * 2_500)
    assert result.stop_reason is StopReason.CONTEXT_WINDOW  # type: ignore[attr-defined]


def test_limits_name_the_window_over_the_model() -> None:
    agent = Agent(model=WindowedModel(lambda r: "ok"), limits=Limits(context_window=9_000))
    assert agent.limits.context_window == 9_000


# --- calibration ---------------------------------------------------------------------------


def test_one_report_is_taken_as_fixed_cost_and_never_scales_down() -> None:
    calibration = Calibration()
    assert calibration.prompt(100) == 100
    calibration.learn(60, 250)  # llama-server: ~190 tokens of template on every request
    assert (calibration.fixed, calibration.per_content) == (190, 1.0)
    assert calibration.prompt(965) == 1_155  # the one ratio said 3,862 for 1,116
    assert calibration.content(965) == 965  # a message alone carries no template
    lower = Calibration()
    lower.learn(100, 50)
    assert lower.prompt(100) == 100


def test_two_sizes_tell_the_rate_from_the_fixed_cost() -> None:
    calibration = Calibration()
    calibration.learn(100, 190 + 150)
    calibration.learn(1_000, 190 + 1_500)
    assert calibration.per_content == pytest.approx(1.5)
    assert calibration.fixed == 190
    assert calibration.prompt(2_000) == 3_190
    # noise never leaves a pair seen under-counted
    calibration.learn(500, 1_100)
    assert all(calibration.prompt(x) >= y for x, y in calibration.pairs)
    for n in range(20):  # a bounded memory
        calibration.learn(100 + n, 200 + n)
    assert len(calibration.pairs) == 8


def engine_count(request: ModelRequest) -> int:
    """The engine's own estimate of a request: messages and tool definitions."""
    messages = sum(estimate_message_tokens(m) for m in request.messages)
    return messages + estimate_tools_tokens(request.tools)


def server_like(ratio: float, pages: int) -> FunctionModel:
    """A server whose chat template adds ``ratio - 1`` of the engine's estimate, as it
    reports in usage; it fetches ``pages`` pages and then answers."""

    fetched = 0

    def answer(request: ModelRequest) -> ModelResponse:
        nonlocal fetched
        usage = Usage(input_tokens=int(engine_count(request) * ratio), output_tokens=5, requests=1)
        if fetched >= pages or not request.tools:
            return reply("Done.", usage=usage)
        fetched += 1
        return reply("", call("fetch", page=fetched), usage=usage)

    return FunctionModel(answer)


def test_estimates_learn_from_reported_usage_and_err_on_the_safe_side() -> None:
    model = server_like(2.0, 20)
    agent = Agent(model=model, tools=[fetch], limits=limits(6_000), context_policy=KeepLastTurns(1))
    events, result = run(agent)
    assert result.stop_reason is StopReason.FINAL_ANSWER  # type: ignore[attr-defined]
    requested = [e for e in events if isinstance(e, ModelRequested)]
    # One report is read as a fixed cost (a template's); once two prompt sizes were reported,
    # the estimates are about twice the engine's own count...
    own = [engine_count(request) for request in model.requests]
    assert requested[0].estimated_prompt_tokens == own[0]
    assert requested[1].estimated_prompt_tokens == own[1] + own[0]
    assert all(e.estimated_prompt_tokens >= 2 * own[i] for i, e in enumerate(requested) if i > 1)
    # ...so what the server counts (twice the engine's count) always fit the window.
    assert all(2 * tokens + 300 <= 6_000 for tokens in own[2:])


@pytest.mark.parametrize("budget", range(6_000, 60_000, 3_000))
def test_the_budget_guard_uses_the_calibrated_estimate(budget: int) -> None:
    agent = Agent(
        model=server_like(3.0, 30),
        tools=[fetch],
        limits=Limits(max_turns=30, token_budget=budget),
    )
    _, result = run(agent)
    assert result.stop_reason is StopReason.TOKEN_BUDGET  # type: ignore[attr-defined]
    # Stopped before the call that would have spent past the budget (by the server's count),
    # where an estimate a third of the server's would have started it.
    assert result.usage.total_tokens <= budget  # type: ignore[attr-defined]


# --- durability ----------------------------------------------------------------------------


def test_context_edits_survive_a_checkpoint_and_resume(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "runs.db")
    pages = [reply("", call("fetch", page=p)) for p in range(6)]
    model = ScriptedModel([*pages, reply("", call("ask_user", question="Go on?")), "Done."])
    agent = Agent(
        model=model,
        tools=[fetch],
        limits=limits(),
        store=store,
        context_policy=ClearToolResults(keep_last_turns=1),
    )
    paused = agent.run_sync("Read the document.")
    assert paused.stop_reason is StopReason.ASK_USER
    cleared_before = {
        i for i, m in enumerate(model.requests[-1].messages) if "cleared" in m.content
    }
    assert cleared_before
    resumed = agent.resume_sync(paused.run_id, reply="Yes.")
    assert resumed.stop_reason is StopReason.FINAL_ANSWER
    last = list(model.requests[-1].messages)
    assert {i for i, m in enumerate(last) if "cleared" in m.content} >= cleared_before
    assert any(m.content == "Yes." for m in last)
    check_invariants(resumed, limits=agent.limits, bound=agent.bound)


@pytest.mark.parametrize("compact_to", [1.0, 0.5])
def test_compaction_leaves_headroom_so_the_next_turns_need_not_compact(compact_to: float) -> None:
    model = reader(24)
    agent = Agent(
        model=model,
        tools=[fetch],
        limits=limits(12_000, compact_to=compact_to),
        context_policy=ClearToolResults(keep_last_turns=1),
    )
    events, result = run(agent)
    assert result.stop_reason is StopReason.FINAL_ANSWER  # type: ignore[attr-defined]
    compactions = sum(isinstance(e, ContextCompacted) for e in events)
    # Each result is ~1,000 tokens of a ~11,700-token room: shrinking to the room itself
    # compacts on every turn once it is full; shrinking to half of it, every fifth or so.
    if compact_to == 1.0:
        assert compactions >= 12
    else:
        assert 2 <= compactions <= 6


def test_a_failed_call_whose_report_outgrows_the_window_is_not_retried_as_it_was() -> None:
    """Found by the property test: an empty reply (a transient failure) reported a prompt
    of 2,800 tokens, which calibrated the estimate past the window; the retry row then sent
    the same prompt again. A failed call now goes through COMPACT when its prompt no longer
    fits, and the call after it is a new turn."""
    script = [
        reply("", call("fetch", page=1)),
        reply("", usage=(2_800, 0)),  # empty: a failed call, with a report
        "Done.",
    ]
    model = ScriptedModel(script)
    agent = Agent(
        model=model,
        tools=[fetch],
        limits=limits(model_retries=3),
        context_policy=ClearToolResults(keep_last_turns=0),
        system_prompt="Read.",
    )
    _, result = run(agent)  # every prompt sent fit the window, by the invariants
    assert result.output == "Done."  # type: ignore[attr-defined]
    labels = [(entry.source, entry.label) for entry in result.trace]  # type: ignore[attr-defined]
    assert (AgentState.THINK, "compact") in labels
    assert (AgentState.THINK, "retry") not in labels
    assert result.turns == 3  # type: ignore[attr-defined]
