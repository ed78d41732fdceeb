"""Hypothesis strategies for misbehaving models: the generator behind the property tests.

Import this module only where hypothesis is installed (the ``dev`` or ``testing`` extra); it
is the one place in the package that imports hypothesis.

A generated *behaviour* is a list of script items (replies, exceptions, garbage) that a model
plays in order, optionally cycling forever, so "the same call forever" and periodic patterns
are as likely as one-off mistakes.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from agent_fsm.limits import Limits
from agent_fsm.messages import FinishReason, ModelRequest, ModelResponse, ToolCall, Usage
from agent_fsm.models.base import ModelCallError
from agent_fsm.testing.models import reply

__all__ = ["Behaviour", "BehaviourModel", "behaviours", "limits", "replies", "tool_calls"]

_GARBAGE: tuple[Any, ...] = (None, 42, {"content": "a dict, not a reply"})


def _json_values() -> st.SearchStrategy[Any]:
    return st.one_of(
        st.none(), st.booleans(), st.integers(-5, 5), st.sampled_from(["", "a", "same"])
    )


def tool_calls(tool_names: Sequence[str]) -> st.SearchStrategy[ToolCall]:
    """Valid, invalid and malformed calls to the given tools, to unknown tools, and to the
    control-flow tools (``ask_user``, ``finish_task``) with good or bad arguments."""
    known = st.sampled_from(list(tool_names)) if tool_names else st.just("missing")
    arguments = st.dictionaries(
        st.sampled_from(["text", "a", "b", "x"]), _json_values(), max_size=3
    )
    well_formed = st.builds(
        lambda name, args: ToolCall(id="", name=name, arguments=json.dumps(args)),
        known,
        arguments,
    )
    valid_echo = st.builds(
        lambda text: ToolCall(id="", name="echo", arguments=json.dumps({"text": text})),
        st.sampled_from(["a", "b", "c", "same"]),
    )
    malformed = st.builds(
        lambda name, raw: ToolCall(id="", name=name, arguments=raw),
        known,
        st.sampled_from(["{", "[1, 2]", "not json", '{"text": }', "", "null"]),
    )
    unknown = st.builds(
        lambda name: ToolCall(id="", name=name, arguments="{}"),
        st.sampled_from(["nope", "Echo", "finish", "ask-user"]),
    )
    valid_control = st.one_of(
        st.builds(
            lambda q: ToolCall(id="", name="ask_user", arguments=json.dumps({"question": q})),
            st.sampled_from(["Which city?", "q?"]),
        ),
        st.builds(
            lambda s: ToolCall(id="", name="finish_task", arguments=json.dumps({"summary": s})),
            st.sampled_from(["done", ""]),
        ),
    )
    invalid_control = st.builds(
        lambda name, args: ToolCall(id="", name=name, arguments=json.dumps(args)),
        st.sampled_from(["ask_user", "finish_task"]),
        st.sampled_from([{}, {"question": 3}, {"summary": None}, {"question": ""}]),
    )
    duplicate_id = st.builds(
        lambda name: ToolCall(id="dup", name=name, arguments='{"text": "d"}'), known
    )
    return st.one_of(
        valid_echo, well_formed, malformed, unknown, valid_control, invalid_control, duplicate_id
    )


def _usages() -> st.SearchStrategy[Usage | None]:
    return st.one_of(
        st.none(),
        st.builds(
            lambda i, o: Usage(input_tokens=i, output_tokens=o, requests=1),
            st.integers(0, 2_000),
            st.integers(0, 500),
        ),
        st.builds(  # absurd values
            lambda i, o: Usage(input_tokens=i, output_tokens=o, requests=1),
            st.integers(0, 10**9),
            st.integers(0, 10**9),
        ),
    )


def replies(tool_names: Sequence[str]) -> st.SearchStrategy[object]:
    """One model behaviour step: a reply, an exception to raise, or garbage."""
    text = st.sampled_from(["", "ok", "thinking…", "the answer is 4"])
    plain = st.builds(
        lambda t, reason, usage: reply(t, finish_reason=reason, usage=usage),
        text,
        st.sampled_from(list(FinishReason)),
        _usages(),
    )
    with_calls = st.builds(
        lambda t, calls, reason, usage: reply(t, *calls, finish_reason=reason, usage=usage),
        text,
        st.lists(tool_calls(tool_names), min_size=1, max_size=4),
        st.sampled_from(list(FinishReason)),
        _usages(),
    )
    errors = st.one_of(
        st.builds(lambda t: ModelCallError("server said no", transient=t), st.booleans()),
        st.just(TimeoutError("read timed out")),
        st.just(RuntimeError("adapter bug")),
    )
    return st.one_of(with_calls, with_calls, plain, errors, st.sampled_from(_GARBAGE))


@dataclass(frozen=True)
class Behaviour:
    """A model behaviour: ``steps`` played in order, then cycled forever if ``cycle``."""

    steps: tuple[object, ...]
    cycle: bool
    abort_at_turn: int | None = None
    """Abort the run from inside the model call of this turn (None: never)."""


def behaviours(tool_names: Sequence[str]) -> st.SearchStrategy[Behaviour]:
    """Finite or endlessly repeating model behaviours, sometimes aborted mid-run."""
    return st.builds(
        Behaviour,
        st.lists(replies(tool_names), min_size=1, max_size=12).map(tuple),
        st.booleans(),
        st.one_of(st.none(), st.integers(1, 8)),
    )


def limits(**fixed: Any) -> st.SearchStrategy[Limits]:
    """Arbitrary valid limits (zero retry backoff, so runs never sleep)."""
    return st.builds(
        lambda turns, budget, errors, k, p, detect, timeout: Limits(
            **{
                "max_turns": turns,
                "token_budget": budget,
                "max_consecutive_errors": errors,
                "loop_threshold": k,
                "loop_max_period": p,
                "loop_detection": detect,
                "timeout_s": timeout,
                "retry_backoff_s": 0.0,
                "retry_backoff_max_s": 0.0,
                **fixed,
            }
        ),
        st.integers(1, 25),
        st.one_of(st.integers(1, 400), st.integers(400, 10**7)),
        st.integers(1, 5),
        st.integers(2, 5),
        st.integers(0, 5),
        st.booleans(),
        st.one_of(st.just(1e9), st.floats(1.0, 200.0)),
    )


class BehaviourModel:
    """Plays a Behaviour; aborts its run at ``abort_at_turn`` through ``on_abort``."""

    def __init__(self, behaviour: Behaviour) -> None:
        self.behaviour = behaviour
        self.requests: list[ModelRequest] = []
        self.on_abort: Any = None

    @property
    def name(self) -> str:
        return "behaviour"

    async def request(self, request: ModelRequest) -> ModelResponse:
        self.requests.append(request)
        index = len(self.requests) - 1
        behaviour = self.behaviour
        if behaviour.abort_at_turn == request.turn and self.on_abort is not None:
            self.on_abort("aborted by the test")
        steps = behaviour.steps
        if index >= len(steps) and not behaviour.cycle:
            raise ModelCallError("behaviour exhausted", transient=False)
        step = steps[index % len(steps)]
        if isinstance(step, BaseException):
            raise step
        return step  # type: ignore[return-value]  # garbage is part of the behaviour
