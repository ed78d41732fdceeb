"""``AssistantMessage.provider_data``: what a provider needs back with a reply on later turns
(reasoning items, thinking signatures) survives the transcript, a checkpoint and a resume."""

from __future__ import annotations

from pathlib import Path

from agent_fsm import Agent
from agent_fsm.durable.sqlite import SQLiteStore
from agent_fsm.messages import (
    AssistantMessage,
    FinishReason,
    ModelResponse,
    clean_message,
)
from agent_fsm.state import RunStatus
from agent_fsm.testing import ScriptedModel, call

SIGNED = {"anthropic": {"thinking": [{"type": "thinking", "thinking": "hm", "signature": "s1"}]}}


def _asks_with_provider_data() -> ModelResponse:
    question = call("ask_user", question="Which city?")
    message = AssistantMessage(content="", tool_calls=(question,), provider_data=SIGNED)
    return ModelResponse(message=message, finish_reason=FinishReason.TOOL_CALLS)


async def test_provider_data_is_checkpointed_and_sent_back_after_a_resume(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "runs.sqlite3")
    first = Agent(model=ScriptedModel([_asks_with_provider_data()]), store=store)
    paused = await first.run("Weather?")
    assert paused.status is RunStatus.NEEDS_INPUT
    later = ScriptedModel(["Sunny in Paris."])
    reopened = Agent(model=later, store=SQLiteStore(tmp_path / "runs.sqlite3"))
    result = await reopened.resume(paused.run_id, "Paris")
    assert result.output == "Sunny in Paris."
    [sent] = [m for m in later.requests[0].messages if isinstance(m, AssistantMessage)]
    assert sent.provider_data == SIGNED


def test_a_lone_surrogate_in_provider_data_is_cleaned_like_any_text() -> None:
    dirty = AssistantMessage(content="ok", provider_data={"gemini": {"sig": "\ud83d"}})
    cleaned = clean_message(dirty)
    assert cleaned.provider_data == {"gemini": {"sig": "\ufffd"}}
    clean = AssistantMessage(content="ok", provider_data=SIGNED)
    assert clean_message(clean) is clean
