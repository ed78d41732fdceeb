"""Hypothesis strategies for hostile inputs: what a careless application or an attacker hands
an agent beside the model's replies.

Import this module only where hypothesis is installed (the ``testing`` or ``dev`` extra).

- ``histories(tool_names)``: earlier conversations to start a run from, as an application
  might keep them: calls with empty, duplicate and reused ids, results for no call, results
  naming another tool, results out of order, missing results, stray system messages, text
  with lone surrogates. ``Agent.run(..., history=...)`` must repair every one into a valid
  transcript (``run.history``).
- ``lying_policies()``: context policies that misbehave: edits out of range, edits that move
  back, cut at a tool result or drop the latest user input, a wrong return type, an
  exception, a policy that writes the transcript it is shown. The engine must refuse or skip
  each and keep every prompt valid (``run.compacting``).
- ``unclean_text()``: text with lone surrogates and NULs, for ids and the notes of a custom
  state (``Agent`` refuses such ids; notes are cleaned).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from agent_fsm.compaction import Context
from agent_fsm.messages import (
    AssistantMessage,
    Message,
    SystemMessage,
    ToolCall,
    ToolMessage,
    ToolStatus,
    UserMessage,
)
from agent_fsm.prompt import ContextEdits

__all__ = ["LyingPolicy", "histories", "lying_policies", "unclean_text"]

_SURROGATES = st.sampled_from(["\ud83d", "\udc80", "\udfff"])


def unclean_text(*, nul: bool = True) -> st.SearchStrategy[str]:
    """Short text that is not valid UTF-8 (a lone surrogate somewhere), or holds a NUL."""
    bad = st.one_of(_SURROGATES, st.just("\x00")) if nul else _SURROGATES
    return st.tuples(st.text(max_size=4), bad, st.text(max_size=4)).map("".join)


def _ids() -> st.SearchStrategy[str]:
    """Call ids as careless histories hold them: few, so that they repeat; empty ones too."""
    return st.sampled_from(["", "a", "b", "call_0", "call_1"])


def _texts() -> st.SearchStrategy[str]:
    return st.one_of(st.sampled_from(["", "ok", "x" * 40]), unclean_text(nul=False))


def _calls(tool_names: Sequence[str]) -> st.SearchStrategy[ToolCall]:
    names = st.sampled_from([*tool_names, "no_such_tool"]) if tool_names else st.just("x")
    return st.builds(
        ToolCall,
        id=_ids(),
        name=names,
        arguments=st.sampled_from(["{}", '{"text": "x"}', "not json"]),
    )


def _results(tool_names: Sequence[str]) -> st.SearchStrategy[ToolMessage]:
    names = st.sampled_from([*tool_names, "other"]) if tool_names else st.just("x")
    return st.builds(
        ToolMessage,
        tool_call_id=_ids(),
        name=names,
        content=_texts(),
        status=st.sampled_from(list(ToolStatus)),
    )


def histories(tool_names: Sequence[str] = ("echo",)) -> st.SearchStrategy[list[Message]]:
    """Earlier conversations of every careless shape (see the module docstring)."""
    message: st.SearchStrategy[Message] = st.one_of(
        st.builds(UserMessage, content=_texts()),
        st.builds(SystemMessage, content=_texts()),
        st.builds(
            AssistantMessage,
            content=_texts(),
            tool_calls=st.lists(_calls(tool_names), max_size=3).map(tuple),
        ),
        _results(tool_names),
    )
    return st.lists(message, max_size=10)


@dataclass(frozen=True)
class LyingPolicy:
    """A context policy that returns ``change`` (called with the context, if callable),
    raises it (an exception), or writes the transcript it is shown (``"write"``)."""

    change: Any
    name: str = "liar"

    def shrink(self, context: Context) -> Any:
        change = self.change
        if change == "write":
            context.messages.append(context.messages[-1])  # type: ignore[attr-defined]
            return None
        if isinstance(change, BaseException):
            raise change
        return change(context) if callable(change) else change


def _edits() -> st.SearchStrategy[Any]:
    """Edits a lying policy returns, worked out from the context it is shown."""

    def off_by(shift: int) -> Any:
        def edits(context: Context) -> ContextEdits:
            start = len(context.messages) + shift
            return context.edits.model_copy(update={"start": max(start, -3)})

        return edits

    def clear_everything(context: Context) -> ContextEdits:
        return context.edits.clear(*range(-1, len(context.messages) + 2))

    def back_to_start(context: Context) -> ContextEdits:
        return ContextEdits()

    def latest_elsewhere(context: Context) -> ContextEdits:
        return context.edits.model_copy(update={"latest_input": 0, "start": 1})

    return st.one_of(
        st.integers(-2, 2).map(off_by),
        st.sampled_from([clear_everything, back_to_start, latest_elsewhere]),
    )


def lying_policies() -> st.SearchStrategy[LyingPolicy]:
    """Context policies that lie, raise, write or return the wrong thing."""
    return st.builds(
        LyingPolicy,
        change=st.one_of(
            _edits(),
            st.sampled_from(
                [
                    "write",
                    "cut it",
                    42,
                    ValueError("a broken policy"),
                    RecursionError("too deep"),
                    None,
                ]
            ),
        ),
    )
