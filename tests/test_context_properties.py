"""Property tests of the context rules (issue 14): for arbitrary transcripts, tool-call shapes
and windows, no policy separates a tool call from its result or drops the system prompt or
the latest input, a prompt is only sent when it fits the window by the calibrated estimate,
and every run still terminates within the bound the verifier reports."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from hypothesis import event as note_event
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_fsm import Agent, Limits
from agent_fsm.compaction import ClearToolResults, Context, ContextPolicy, KeepLastTurns
from agent_fsm.events import ContextCompacted, Event
from agent_fsm.messages import (
    AssistantMessage,
    Message,
    SystemMessage,
    ToolCall,
    ToolMessage,
    UserMessage,
)
from agent_fsm.prompt import ContextEdits, SummaryDue, prompt_messages
from agent_fsm.state import RUN_STATE_ADAPTER, RunState
from agent_fsm.testing import ScriptedModel, assert_terminates
from agent_fsm.testing.harness import Stage
from agent_fsm.testing.invariants import prompt_problems, transcript_problems
from agent_fsm.testing.strategies import (
    Behaviour,
    behaviours_for,
    context_policies,
    limits,
    transcripts,
    window_pressure_for,
)
from agent_fsm.tokens import (
    CALIBRATION_PAIRS,
    MAX_RATE,
    MIN_RATE,
    Calibration,
    estimate_message_tokens,
)
from tests.conftest import add, boom, echo

TOOLS = [echo, add, boom]

SHARE = settings(max_examples=max(50, settings.default.max_examples // 4))
"""A quarter of the profile's examples for each property here (500 in CI, 5,000 thorough):
generating transcripts is costlier than generating replies."""


def _latest_input(messages: list[Message]) -> Message:
    return next(m for m in reversed(messages) if isinstance(m, UserMessage))


def _assert_sound(prompt: list[Message], messages: list[Message]) -> None:
    """A prompt is a valid transcript that keeps the system prompt and the latest input."""
    assert transcript_problems(prompt) == []
    if isinstance(messages[0], SystemMessage):
        assert prompt[0] is messages[0]
    assert any(m is _latest_input(messages) for m in prompt)


@SHARE
@given(
    messages=transcripts(),
    policies=context_policies(),
    budget=st.integers(0, 30_000),
    ratio=st.tuples(st.integers(0, 3_000), st.integers(1, 1_000)),
)
def test_no_policy_orphans_a_call_or_drops_the_system_prompt_or_the_latest_input(
    messages: list[Message],
    policies: list[ContextPolicy],
    budget: int,
    ratio: tuple[int, int],
) -> None:
    reported, estimated = ratio
    calibration = Calibration()
    calibration.learn(estimated, reported)
    calibration.learn(estimated * 2, reported * 3)

    def count(message: Message) -> int:
        return calibration.content(estimate_message_tokens(message))

    context = Context(messages=messages, edits=ContextEdits(), budget=budget, count=count)
    for policy in policies:  # as COMPACT offers the prompt to them, in order
        if context.fits():
            break
        change = policy.shrink(context)
        if isinstance(change, SummaryDue):
            # A summary replaces whole turns: the cut it will make is a turn boundary.
            assert context.first < change.through <= len(messages)
            assert not isinstance(messages[change.through], ToolMessage)
            assert change.text
            written = context.edits.cut(messages, change.through)
            _assert_sound(list(prompt_messages(messages, written)), messages)
            break
        if change is None:
            continue
        assert change.check(messages, context.edits) is None
        assert context.size(change) < context.size()  # a change always shrinks the prompt
        context = Context(messages=messages, edits=change, budget=budget, count=count)
        _assert_sound(list(prompt_messages(messages, change)), messages)


@SHARE
@given(messages=transcripts(max_turns=12), keep=st.integers(1, 5))
def test_keep_last_turns_sends_exactly_the_last_turns(messages: list[Message], keep: int) -> None:
    context = Context(messages=messages, edits=ContextEdits(), budget=0, count=lambda m: 1)
    starts = context.turn_starts()
    change = KeepLastTurns(keep).shrink(context)
    if len(starts) <= keep:
        assert change is None
        return
    assert change is not None
    prompt = list(prompt_messages(messages, change))
    assert prompt[-(len(messages) - starts[-keep]) :] == messages[starts[-keep] :]
    _assert_sound(prompt, messages)


@SHARE
@given(messages=transcripts(max_turns=10), budget=st.integers(0, 20_000))
def test_cleared_results_keep_their_call_and_only_their_output_changes(
    messages: list[Message], budget: int
) -> None:
    context = Context(
        messages=messages, edits=ContextEdits(), budget=budget, count=estimate_message_tokens
    )
    change = ClearToolResults(keep_last_turns=0, min_chars=0).shrink(context)
    if change is None:
        return
    prompt = list(prompt_messages(messages, change))
    assert len(prompt) == len(messages)
    for sent, kept in zip(prompt, messages, strict=True):
        if sent is not kept:
            assert isinstance(kept, ToolMessage)
            assert isinstance(sent, ToolMessage)
            assert (sent.tool_call_id, sent.name, sent.details) == (
                kept.tool_call_id,
                kept.name,
                kept.details,
            )


WINDOWED = Agent(model=ScriptedModel([]), tools=TOOLS, system_prompt="property test")


@SHARE
@given(
    behaviour=st.one_of(behaviours_for(WINDOWED, max_steps=8), window_pressure_for(WINDOWED)),
    run_limits=limits(token_budget=10**7),
    window=st.integers(700, 8_000),  # the first prompt (~370 tokens) fits: pressure grows
    reply_tokens=st.integers(0, 299),
    turns=st.integers(4, 25),
    policies=context_policies(),
)
def test_runs_under_window_pressure_terminate_within_the_bound_and_every_prompt_fits(
    behaviour: Behaviour,
    run_limits: Limits,
    window: int,
    reply_tokens: int,
    turns: int,
    policies: list[ContextPolicy],
) -> None:
    windowed = Limits.model_validate(
        {
            **run_limits.model_dump(),
            "context_window": window,
            "reply_tokens": reply_tokens,
            "max_turns": turns,
        }
    )
    agent = Agent(
        model=ScriptedModel([]),
        tools=TOOLS,
        system_prompt="property test",
        limits=windowed,
        context_policy=policies,
    )
    events: list[Event] = []
    stage = Stage(agent.subscribe(events.append), user_input="do the task " + "y" * 400)
    # Termination within the bound, the transcript, usage, every ModelRequested estimate
    # (calibrated) leaving reply_tokens of the window, and every prompt sent keeping the
    # system prompt, the latest input and each call with its result (prompt_problems).
    case = stage.play(behaviour)
    assert case.ok, case.violation
    assert case.result is not None
    note_event(f"stop: {case.result.stop_reason.value}")
    compacted = [e for e in events if isinstance(e, ContextCompacted)]
    note_event("compacted" if compacted else "not compacted")
    if any(e.summary is not None for e in compacted):
        note_event("a summary was written")


def test_the_harness_proves_a_windowed_agent_with_policies_terminates() -> None:
    # The harness's tool doubles return outputs of up to 200,000 characters, far past this
    # window: every generated run must still end within the bound, each prompt fitting.
    agent = Agent(
        model=ScriptedModel(["unused: the harness plays its own model"]),
        tools=TOOLS,
        limits=Limits(max_turns=8, context_window=3_000, reply_tokens=256),
        context_policy=[ClearToolResults(keep_last_turns=1), KeepLastTurns(2)],
    )
    assert_terminates(agent, max_examples=SHARE.max_examples)


def test_prompt_problems_names_an_orphaned_result_and_what_was_dropped() -> None:
    system, question = SystemMessage(content="S"), UserMessage(content="Q")
    asked = AssistantMessage(
        content="", tool_calls=(ToolCall(id="a", name="echo", arguments="{}"),)
    )
    answered = ToolMessage(tool_call_id="a", name="echo", content="A")
    transcript = [system, question, asked, answered]
    assert prompt_problems([transcript], transcript) == []
    problems = prompt_problems([[system, answered]], transcript)
    assert any("answers no call" in p for p in problems)
    assert any("latest user input (message 1) is dropped" in p for p in problems)
    assert prompt_problems([[question, asked, answered]], transcript) == [
        "prompt 1: the system prompt is not sent first"
    ]


def _fitted_afresh(pairs: list[tuple[int, int]]) -> tuple[float, int]:
    """The rate and fixed part of a least-squares fit over ``pairs``, worked out from
    nothing, in exact fractions: what ``Calibration`` must hold after any sequence of
    ``learn`` calls, however its sums were kept."""
    n = len(pairs)
    sx, sy = sum(x for x, _ in pairs), sum(y for _, y in pairs)
    spread = n * sum(x * x for x, _ in pairs) - sx * sx
    if spread < n:
        rate = 1.0
    else:
        slope = Fraction(n * sum(x * y for x, y in pairs) - sx * sy, spread)
        rate = min(max(float(slope), MIN_RATE), MAX_RATE)
    return rate, max(0, math.ceil(max(y - rate * x for x, y in pairs) - 1e-9))


@given(
    reports=st.lists(
        st.tuples(st.integers(-5, 10**7), st.integers(-5, 10**7)), min_size=1, max_size=40
    ),
    reload_at=st.integers(0, 40),
)
def test_the_calibration_is_the_fit_over_the_last_pairs_across_a_checkpoint(
    reports: list[tuple[int, int]], reload_at: int
) -> None:
    """Whatever the reports (none positive, far apart, repeated), the calibration is the
    least-squares fit over its window of the last positive pairs, worked out exactly, and a
    checkpoint and load in between changes nothing."""
    calibration = Calibration()
    for index, (estimate, reported) in enumerate(reports):
        if index == reload_at:  # a checkpoint and a load, as a resumed run has
            state = RUN_STATE_ADAPTER.validate_json(
                RUN_STATE_ADAPTER.dump_json(RunState(run_id="r", calibration=calibration))
            )
            calibration = state.calibration
        calibration.learn(estimate, reported)
    window = [(x, y) for x, y in reports if x > 0 and y > 0][-CALIBRATION_PAIRS:]
    assert calibration.pairs == window
    if window:
        rate, fixed = _fitted_afresh(window)
        assert calibration.per_content == pytest.approx(rate, rel=1e-12)
        assert calibration.fixed == fixed
        assert all(calibration.prompt(x) >= y for x, y in window)
