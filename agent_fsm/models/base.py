"""The Model protocol every adapter implements, and the error adapters raise.

A model turns one ``ModelRequest`` into one ``ModelResponse``. Failures are reported by
raising: ``ModelCallError`` says whether retrying can help; any other exception is treated as
permanent except ``TimeoutError`` and ``ConnectionError``, which are transient. The engine
catches all of them, records them, and lets the THINK guards decide (retry, or ERROR
``model_error``): a model failure never escapes ``Agent.run``.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from pydantic_core import from_json

from agent_fsm.messages import ModelRequest, ModelResponse

__all__ = ["Model", "ModelCallError", "replayable_arguments"]


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


class ModelCallError(Exception):
    """A model call failed.

    Args:
        message: what went wrong; must never contain credentials.
        transient: True when the same request may succeed later (rate limit, 5xx, timeout,
            dropped connection); False for bad requests, authentication and the like.
        retry_after_s: the server's requested delay before retrying, if it gave one.
    """

    def __init__(
        self, message: str, *, transient: bool = True, retry_after_s: float | None = None
    ) -> None:
        super().__init__(message)
        self.transient = transient
        self.retry_after_s = retry_after_s


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
