"""Token estimates: cheap, pessimistic, and the same whichever way a message is built."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from agent_fsm.messages import AssistantMessage, SystemMessage, ToolCall, ToolMessage, UserMessage
from agent_fsm.tokens import (
    MESSAGE_OVERHEAD_TOKENS,
    estimate_message_tokens,
    estimate_text_tokens,
)

texts = st.text(max_size=40)
calls = st.builds(ToolCall, id=texts, name=texts, arguments=texts)
arithmetic = settings(max_examples=300)
"""Plain arithmetic over lengths: a few hundred examples cover it, whatever the profile."""


@arithmetic
@given(st.integers(min_value=0, max_value=10_000))
def test_text_estimates_round_up_at_four_characters_a_token(length: int) -> None:
    assert estimate_text_tokens("x" * length) == (length + 3) // 4


@arithmetic
@given(texts, st.lists(calls, max_size=4))
def test_an_assistant_message_counts_its_text_and_each_call(
    text: str, tool_calls: list[ToolCall]
) -> None:
    message = AssistantMessage(content=text, tool_calls=tuple(tool_calls))
    expected = MESSAGE_OVERHEAD_TOKENS + estimate_text_tokens(text)
    for call in tool_calls:
        expected += MESSAGE_OVERHEAD_TOKENS + estimate_text_tokens(call.name + call.arguments)
    assert estimate_message_tokens(message) == expected


@arithmetic
@given(texts, texts, texts)
def test_other_messages_count_their_text_and_a_tool_result_its_call_id(
    text: str, call_id: str, name: str
) -> None:
    overhead_and_text = MESSAGE_OVERHEAD_TOKENS + estimate_text_tokens(text)
    assert estimate_message_tokens(UserMessage(content=text)) == overhead_and_text
    assert estimate_message_tokens(SystemMessage(content=text)) == overhead_and_text
    result = ToolMessage(tool_call_id=call_id, name=name, content=text)
    assert estimate_message_tokens(result) == overhead_and_text + estimate_text_tokens(call_id)
