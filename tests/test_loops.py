"""Loop-detection signatures: what counts as the same call, result or text."""

from __future__ import annotations

import math

import pytest
from pydantic_core import from_json

from agent_fsm import StopReason
from agent_fsm.limits import Limits
from agent_fsm.loop.detection import VERBATIM_CHARS, canonical_arguments, fingerprint, record_calls
from agent_fsm.state import LoopState
from agent_fsm.testing import raw_call, reply
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
    record_calls(loop, calls, limits)
    assert loop.detected is None
    assert sum(len(s) for s in loop.recent_calls) < 200
    record_calls(loop, [calls[-1]] * 2, limits)
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
