"""The Model protocol every adapter implements, and the error adapters raise.

A model turns one ``ModelRequest`` into one ``ModelResponse``. Failures are reported by
raising: ``ModelCallError`` says whether retrying can help; any other exception is treated as
permanent except ``TimeoutError`` and ``ConnectionError``, which are transient. The engine
catches all of them, records them, and lets the THINK guards decide (retry, or ERROR
``model_error``): a model failure never escapes ``Agent.run``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from pydantic_core import from_json

from agent_fsm.content import PartSupport
from agent_fsm.messages import (
    ModelRequest,
    ModelResponse,
    ToolSpec,
)

__all__ = [
    "Model",
    "ModelCallError",
    "ReviewsToolSchemas",
    "TakesParts",
    "ToolSchemaIssue",
    "replayable_arguments",
]


@runtime_checkable
class Model(Protocol):
    """Anything that can answer a ModelRequest."""

    @property
    def name(self) -> str:
        """A short name for logs, events and diagrams."""
        ...

    async def request(self, request: ModelRequest) -> ModelResponse:
        """Answer one request. Raise ``ModelCallError`` (or anything) on failure."""
        ...


@dataclass(frozen=True, slots=True)
class ToolSchemaIssue:
    """Something in a tool's parameter schema that a provider cannot take as it is.

    Adapters send each provider a sanitised *copy* of a tool's schema; the tool's own schema,
    and the validation of the model's arguments against it, never change. An issue says what
    the copy lost (``fatal=False``: the keyword is dropped or rewritten, so the provider holds
    the model to less than the tool checks; ``Agent`` warns) or that the tool cannot be sent
    at all (``fatal=True``; ``Agent`` raises ``ConfigError``).
    """

    tool: str
    """The tool's name."""
    keyword: str
    """The schema keyword at fault, with its place: ``"properties/when/format"``."""
    provider: str
    """The provider (adapter) that cannot express it, e.g. ``"gemini"``."""
    detail: str
    """What the adapter does about it, or why the tool cannot be sent."""
    fatal: bool = False

    def __str__(self) -> str:
        return f"tool {self.tool!r}: {self.provider} cannot express {self.keyword}: {self.detail}"


@runtime_checkable
class ReviewsToolSchemas(Protocol):
    """A Model that can say, before any request, which tool schemas its provider cannot take.

    ``Agent`` calls it once at construction with every tool it will offer (control tools
    included), so a schema problem surfaces as a warning or a ``ConfigError`` naming the tool,
    the keyword and the provider, not as an HTTP 400 in the middle of a run.
    """

    def tool_schema_issues(self, tools: Sequence[ToolSpec]) -> Sequence[ToolSchemaIssue]:
        """The issues of ``tools`` for this provider; empty when every schema goes as it is."""
        ...


@runtime_checkable
class TakesParts(Protocol):
    """A Model that says which images and files its provider takes (``PartSupport``):
    ``Agent.start`` refuses input it cannot take, and the adapter refuses a request it
    cannot send, before anything is spent. A model without it is sent every part as is."""

    @property
    def part_support(self) -> PartSupport:
        """What the provider takes."""
        ...


class ModelCallError(Exception):
    """A model call failed.

    Args:
        message: what went wrong; must never contain credentials.
        transient: True when the same request may succeed later (rate limit, 5xx, timeout,
            dropped connection); False for bad requests, authentication and the like.
        retry_after_s: the server's requested delay before retrying, if it gave one.
        context_overflow: the server refused the prompt as longer than its context window
            (OpenAI's ``context_length_exceeded``, llama.cpp's exceed-context 400,
            Anthropic's "prompt is too long", Gemini's "input token count ... exceeds"):
            never transient, since the same prompt fails again, but the run can shrink it
            (COMPACT) or stop ``context_window``, and resume with a larger window.
        prompt_tokens: the prompt's size by the server's count, where its refusal says.
    """

    def __init__(
        self,
        message: str,
        *,
        transient: bool = True,
        retry_after_s: float | None = None,
        context_overflow: bool = False,
        prompt_tokens: int | None = None,
    ) -> None:
        super().__init__(message)
        self.transient = transient and not context_overflow
        self.retry_after_s = retry_after_s
        self.context_overflow = context_overflow
        self.prompt_tokens = prompt_tokens


def replayable_arguments(raw: str) -> str:
    """The argument text to send back to a provider for a call in the history.

    ``ToolCall.arguments`` keeps what the model wrote, which may not be a JSON object (a reply
    cut off by its token limit leaves ``{"city": "Par``). Servers parse the history they are
    sent, and one such call makes every later request fail (llama.cpp answers HTTP 500), so it
    goes back as ``{}``. The model still learns what was wrong: its call was answered with an
    error result that quotes the text.
    """
    try:
        parsed = from_json(raw)
    except ValueError:
        return "{}"
    return raw if type(parsed) is dict else "{}"
