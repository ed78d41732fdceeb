"""Loop-detection signatures: what counts as the same call, result or text."""

from __future__ import annotations

import math

import pytest
from pydantic_core import from_json

from agent_fsm import StopReason
from agent_fsm.limits import Limits
from agent_fsm.loop.detection import VERBATIM_CHARS, canonical_arguments, fingerprint, record_calls
from agent_fsm.state import LoopState
from agent_fsm.testing import call, raw_call, reply
from tests.conftest import make_agent


def _canonical(raw: str) -> str:
    return canonical_arguments(from_json(raw), raw)


def test_key_order_and_whitespace_do_not_make_a_call_different() -> None:
    assert _canonical('{"b": 1, "a": {"y": [1, {"q": 2, "p": 3}], "x": null}}') == _canonical(
        '{"a":{"x":null,"y":[1,{"p":3,"q":2}]},"b":1}'
    )
    assert _canonical('{"b": 1, "a": 2}') == '{"a":2,"b":1}'


@pytest.mark.parametrize(
    ("left", "right"),
    [
        ('{"n": 1}', '{"n": 1.0}'),
        ('{"n": 1}', '{"n": true}'),
        ('{"n": 1}', '{"n": "1"}'),
        ('{"n": null}', '{"n": NaN}'),
        ('{"n": Infinity}', '{"n": -Infinity}'),
        ('{"n": [1, 2]}', '{"n": [2, 1]}'),
        ('{"n": "é"}', '{"n": "e"}'),
    ],
)
def test_different_values_stay_different(left: str, right: str) -> None:
    assert _canonical(left) != _canonical(right)


def test_arguments_that_did_not_parse_are_compared_as_stripped_text() -> None:
    assert canonical_arguments(None, "  {broken ") == "{broken"
    assert canonical_arguments(math.nan, "NaN") == "NaN"


def test_short_texts_are_their_own_fingerprint_and_long_ones_are_digested() -> None:
    short = "x" * VERBATIM_CHARS
    long_a, long_b = "y" * 10_000 + "a", "y" * 10_000 + "b"
    assert fingerprint(short) == "=" + short
    assert fingerprint(long_a) == fingerprint("y" * 10_000 + "a")
    assert fingerprint(long_a) != fingerprint(long_b)
    assert len(fingerprint(long_a)) == 17
    # A digest never equals a verbatim text, even one that looks like a digest.
    assert fingerprint(long_a) != fingerprint(fingerprint(long_a)[1:])


def test_signatures_of_long_arguments_keep_the_loop_state_small() -> None:
    loop, limits = LoopState(), Limits(loop_threshold=3)
    calls = [("write", canonical_arguments({"text": "z" * 100_000 + str(i)}, "")) for i in range(9)]
    record_calls(loop, calls, limits)  # one turn of nine calls
    for call_ in calls:  # nine turns of one call
        record_calls(loop, [call_], limits)
    assert loop.detected is None
    assert sum(len(s) for s in loop.recent_calls) < 200
    assert sum(len(s) for s in loop.call_streaks) < 200
    record_calls(loop, [calls[-1]], limits)
    record_calls(loop, [calls[-1]], limits)
    assert loop.detected is not None
    assert loop.detected.startswith("the same call write(")


def test_the_same_call_formatted_differently_is_still_a_loop() -> None:
    texts = ['{"text": "poll"}', '{ "text":"poll" }', '{"text":\n "poll"}']
    script = [reply("", raw_call("echo", text)) for text in texts] + ["never reached"]
    agent, model = make_agent(script, loop_threshold=3)
    result = agent.run_sync("go")
    assert result.stop_reason is StopReason.LOOP_DETECTED
    assert "the same call echo" in (result.error or "")
    assert len(model.requests) == 3


def test_one_reply_that_fans_out_is_no_loop() -> None:
    """Calls in one reply are made at one moment: repeats and patterns among them are not
    repeats in time (issue 15)."""
    same_thrice = [call("echo", text="a")] * 3
    alternating = [call("echo", text=t) for t in "ababab"]
    script = [reply("", *same_thrice), reply("", *alternating), "done"]
    agent, _ = make_agent(script, loop_threshold=3, max_turns=5)
    result = agent.run_sync("go")
    assert (result.stop_reason, result.output) == (StopReason.FINAL_ANSWER, "done")


def test_a_call_repeated_across_turns_is_a_loop_whatever_else_each_reply_asks() -> None:
    script = [reply("", call("echo", text="same"), call("echo", text=f"new {n}")) for n in range(3)]
    agent, model = make_agent([*script, "never reached"], loop_threshold=3)
    result = agent.run_sync("go")
    assert result.stop_reason is StopReason.LOOP_DETECTED
    assert result.error is not None
    assert 'the same call echo({"text":"same"}) in 3 turns in a row' in result.error
    assert len(model.requests) == 3


def test_a_cycle_of_turns_names_its_calls() -> None:
    turns = [reply("", call("echo", text=t)) for t in "ababab"]
    agent, model = make_agent([*turns, "never reached"], loop_threshold=3)
    result = agent.run_sync("go")
    assert result.stop_reason is StopReason.LOOP_DETECTED
    assert result.error is not None
    assert (
        'a cycle of 2 turns (echo({"text":"a"}) → echo({"text":"b"})) repeated 3 times'
        in result.error
    )
    assert len(model.requests) == 6
