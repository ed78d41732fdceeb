"""The Anthropic Messages adapter: the only module in agent_fsm that imports ``anthropic``.

It speaks ``POST /v1/messages`` through the ``anthropic`` SDK (the optional extra
``agent-fsm[anthropic]``). The transcript and tool conversion lives in ``anthropic_convert``,
the reading of replies (stop reasons, usage, streams) in ``anthropic_reply``; the client,
streaming and the mapping of failures to ``ModelCallError`` are ``StainlessModel``'s
(``models.adapter``, ``models.stainless``). This module writes the request, continues paused
turns and says how the SDK's errors read.
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

import anthropic

from agent_fsm.errors import ConfigError
from agent_fsm.messages import ModelRequest, ToolSpec
from agent_fsm.models.adapter import ReplyReader
from agent_fsm.models.anthropic_convert import (
    ANTHROPIC_PARTS,
    PROVIDER,
    anthropic_schema,
    stub_tools,
    to_anthropic_prompt,
    to_anthropic_tool_choice,
    to_anthropic_tools,
)
from agent_fsm.models.anthropic_reply import AnthropicReply
from agent_fsm.models.base import ModelCallError, ToolSchemaIssue
from agent_fsm.models.stainless import SDKErrors, StainlessModel, check_settings, split_fields

__all__ = ["DEFAULT_MAX_TOKENS", "MAX_CONTINUATIONS", "AnthropicModel", "request_settings"]

DEFAULT_MAX_TOKENS = 4096
"""The reply cap sent when none is given. The API requires one; 4096 is the largest every
Claude model accepts (the Claude 3 models cap their output there), so the default never turns
into an HTTP 400, and it is ample for a tool-calling turn. Long answers or extended thinking
(whose ``budget_tokens`` must stay below it) want ``max_tokens=`` set."""

MAX_CONTINUATIONS = 4
"""How many times one model call sends a ``pause_turn`` reply back to let the turn go on
(see ``anthropic_reply``), each a request of its own; a turn still paused then ends as
``FinishReason.LENGTH``."""

# Request fields the adapter sets itself; a setting may not override them.
_RESERVED = frozenset({"messages", "model", "system", "tools", "stream", "max_tokens"})
# Settings that only mean something when tools are offered (the API rejects them otherwise).
_TOOL_SETTINGS = ("tool_choice",)
# Sampling fields that API version 2026-10-21 (the SDK's default since 2.0) refuses.
_SAMPLING = frozenset({"temperature", "top_p", "top_k"})
# Error types that say retrying cannot help, for an error event inside a 200 stream.
_PERMANENT_TYPES = frozenset(
    {
        "invalid_request_error",
        "authentication_error",
        "permission_error",
        "not_found_error",
        "request_too_large",
        "billing_error",
    }
)
_KEY_HINT = "pass api_key= or client=, or set ANTHROPIC_API_KEY"


class AnthropicModel(StainlessModel[anthropic.AsyncAnthropic, list[dict[str, Any]]]):
    """A Model backed by the Anthropic Messages API (``POST /v1/messages``).

    The SDK client is built on first use, from ``api_key`` and ``base_url`` or, when they are
    None, from ``ANTHROPIC_API_KEY`` and ``ANTHROPIC_BASE_URL`` exactly as the SDK reads them
    (see ``SDKModel`` for its life per event loop and ``aclose``).

    Extended thinking (``thinking={"type": "enabled", "budget_tokens": ...}``, or
    ``{"type": "adaptive"}`` on the models that take it) works across tool turns: the thinking
    blocks of a reply, with their signatures, travel in its
    ``AssistantMessage.provider_data["anthropic"]`` and go back unchanged, in their places.

    Failures are raised as ``ModelCallError``: transient for 408/409/429 (with the server's
    ``Retry-After``), 5xx and 529 ``overloaded_error``, an ``error`` event inside a stream
    (unless its type says the request itself is wrong), timeouts, dropped connections,
    malformed replies and streams cut before ``message_stop``; permanent for the other 4xx
    (bad request, authentication, billing, permission, not found, too large) and a missing
    key. The API key never appears in an error, a repr or a log line.

    Args:
        model: the model name, e.g. ``"claude-sonnet-4-6"``.
        base_url: the API root, e.g. ``"https://api.anthropic.com"``; default: the SDK's.
        api_key: the key; default: the SDK's (``ANTHROPIC_API_KEY``).
        client: a ready ``anthropic.AsyncAnthropic`` to use instead (then ``base_url`` and
            ``api_key`` must be None). It is used through a copy with ``max_retries=0`` and
            is never closed by this adapter: its owner closes it.
        stream: stream replies, reporting fragments to ``ModelRequest.on_delta``. The result
            is the same ModelResponse either way.
        temperature: sampling temperature, for SDKs before 2.0 (API version 2023-06-01). The
            SDK 2.x speaks API version 2026-10-21, which refuses sampling parameters, and
            its ``create`` has none: then this is a ConfigError (a compatible server that
            takes it can get ``extra_body={"temperature": ...}``).
        max_tokens: cap on the reply's tokens, thinking included; the API requires one, and
            None sends ``DEFAULT_MAX_TOKENS``.
        timeout: seconds allowed for one request; None keeps the SDK's default.
        context_window: the model's context window in tokens, for ``Agent`` to keep every
            prompt inside; None when unknown.
        **settings: any other ``messages.create`` argument (``thinking``, ``tool_choice``,
            ``stop_sequences``, ``metadata``, ``extra_headers``, ``extra_body``, ...), sent with
            every request.

    Raises:
        ConfigError: for an empty model name, ``client`` combined with ``base_url`` or
            ``api_key``, a non-positive timeout, ``max_tokens`` or ``context_window``, or a
            setting ``create`` does not accept.
    """

    label = "Anthropic"
    example = "claude-sonnet-4-6"
    key_variables = ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN")
    key_hint = _KEY_HINT
    endpoint = "/v1/messages"
    client_class = anthropic.AsyncAnthropic
    client_errors = (anthropic.AnthropicError, ValueError, TypeError)
    sdk_errors = (anthropic.AnthropicError, ValueError, TypeError)  # ValueError: no JSON
    errors = SDKErrors(
        timeout=anthropic.APITimeoutError,
        connection=anthropic.APIConnectionError,
        status=anthropic.APIStatusError,
        invalid_reply=anthropic.APIResponseValidationError,
        api=anthropic.APIError,
        client=(anthropic.AnthropicError, TypeError),
    )

    part_support = ANTHROPIC_PARTS
    """Images and documents, in user messages and tool results (``ANTHROPIC_PARTS``)."""

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        client: anthropic.AsyncAnthropic | None = None,
        stream: bool = False,
        temperature: float | None = None,
        max_tokens: int | None = None,
        timeout: float | None = None,
        context_window: int | None = None,
        **settings: Any,
    ) -> None:
        super().__init__(
            model,
            base_url=base_url,
            api_key=api_key,
            client=client,
            stream=stream,
            timeout=timeout,
            context_window=context_window,
        )
        if max_tokens is not None and (type(max_tokens) is not int or max_tokens < 1):
            raise ConfigError(f"max_tokens must be a positive int, got {max_tokens!r}")
        if temperature is not None:
            settings["temperature"] = temperature
        if timeout is not None:
            settings["timeout"] = timeout
        _check_settings(settings)
        self._max_tokens = max_tokens if max_tokens is not None else DEFAULT_MAX_TOKENS
        self._settings = MappingProxyType(dict(settings))
        self._check_credentials()

    def tool_schema_issues(self, tools: Sequence[ToolSpec]) -> list[ToolSchemaIssue]:
        """What each tool's schema loses on its way to the API (see
        ``anthropic_convert.anthropic_schema``): a top-level ``anyOf``/``oneOf``/``allOf``
        merged into the object (a warning), or a top-level type other than object (fatal).
        Anything else goes as it is: outside strict mode, which this adapter never uses, the
        API takes JSON Schema broadly, ``$ref`` and ``$defs`` included."""
        issues: list[ToolSchemaIssue] = []
        for spec in tools:
            for problem in anthropic_schema(spec.parameters).problems:
                issues.append(
                    ToolSchemaIssue(
                        tool=spec.name,
                        keyword=problem.keyword,
                        provider=PROVIDER,
                        detail=problem.detail,
                        fatal=problem.fatal,
                    )
                )
        return issues

    # -- the wire conversion

    def _repr_options(self) -> list[str]:
        return [f"max_tokens={self._max_tokens}"]

    def _call(self, request: ModelRequest) -> dict[str, Any]:
        prompt = to_anthropic_prompt(request.messages, support=ANTHROPIC_PARTS)
        kwargs: dict[str, Any] = dict(self._settings)
        kwargs["model"] = self._model
        kwargs["max_tokens"] = self._max_tokens
        if prompt.system is not None:
            kwargs["system"] = prompt.system
        kwargs["messages"] = prompt.messages
        if request.tools:
            kwargs["tools"] = self._wire_tools(request.tools)
            if request.tool_choice is not None:  # the request's own choice wins over settings
                kwargs["tool_choice"] = to_anthropic_tool_choice(request.tool_choice)
        else:
            for key in _TOOL_SETTINGS:
                kwargs.pop(key, None)
            if prompt.tool_names:  # the API refuses tool blocks in a request without tools
                kwargs["tools"] = stub_tools(prompt.tool_names)
                kwargs["tool_choice"] = {"type": "none"}
        if self._stream:
            kwargs["stream"] = True
        return kwargs

    def _reader(self, request: ModelRequest) -> ReplyReader:
        return AnthropicReply(fallback_id_prefix=f"{request.run_id}_{request.turn}")

    def _send(self, client: anthropic.AsyncAnthropic, call: dict[str, Any]) -> Awaitable[Any]:
        return client.messages.create(**call)

    def _convert_tools(self, tools: tuple[ToolSpec, ...]) -> list[dict[str, Any]]:
        return to_anthropic_tools(tools)

    def _continuation(
        self, call: dict[str, Any], reader: ReplyReader, part: int
    ) -> dict[str, Any] | None:
        """A turn the server paused (``pause_turn``) is sent back to go on, up to
        ``MAX_CONTINUATIONS`` times; one still paused then ends as ``LENGTH``."""
        assert isinstance(reader, AnthropicReply)
        if not reader.paused or part == MAX_CONTINUATIONS:
            return None
        return {**call, "messages": _continued(call["messages"], reader.continuation())}

    def _check_client(self, client: anthropic.AsyncAnthropic) -> ModelCallError | None:
        """A permanent failure when the client has no way to authenticate (the SDK would
        raise a bare TypeError from inside the request)."""
        names = ("api_key", "auth_token", "credentials")
        if any(getattr(client, name, None) is not None for name in names):
            return None
        return ModelCallError(f"no Anthropic API key: {_KEY_HINT}", transient=False)

    # -- how the API's errors read: {"type": "error", "error": {"type", "message"}}

    def _error_code(self, body: object) -> str | None:
        error = body.get("error") if isinstance(body, Mapping) else None
        kind = error.get("type") if isinstance(error, Mapping) else None
        return kind if isinstance(kind, str) and kind else None

    def _error_message(self, body: object) -> str | None:
        error = body.get("error") if isinstance(body, Mapping) else None
        text = error.get("message") if isinstance(error, Mapping) else None
        return text if isinstance(text, str) else None

    def _event_transient(self, code: str | None) -> bool:
        """An ``error`` event inside a 200 stream passes on a retry unless its type says the
        request itself is wrong."""
        return code not in _PERMANENT_TYPES


def _continued(
    messages: list[dict[str, Any]], content: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """``messages`` followed by the paused turn's content as the last assistant message (the
    API continues the turn from it)."""
    if messages and messages[-1]["role"] == "assistant":  # a prefilled reply: one message
        last = messages[-1]
        return [*messages[:-1], {"role": "assistant", "content": [*last["content"], *content]}]
    return [*messages, {"role": "assistant", "content": content}]


def request_settings(fields: Mapping[str, Any]) -> dict[str, Any]:
    """``AnthropicModel`` settings from free-form request fields (a command line's
    ``key=value`` pairs and sampling options): a field ``messages.create`` takes stays a
    setting, any other goes in ``extra_body``, so a compatible server still gets the
    ``temperature`` an SDK without sampling parameters cannot send.

    Raises:
        ConfigError: for a near miss of a field the SDK takes, a client option, or a field
            the adapter sets itself.
    """
    settings = split_fields(
        fields,
        create=anthropic.resources.messages.AsyncMessages.create,
        create_name="messages.create",
        client_class=anthropic.AsyncAnthropic,
        reserved=_RESERVED,
    )
    _check_settings(settings)
    return settings


def _check_settings(settings: Mapping[str, Any]) -> None:
    check_settings(
        settings,
        adapter="AnthropicModel",
        reserved=_RESERVED,
        create=anthropic.resources.messages.AsyncMessages.create,
        create_name="messages.create",
        client_class=anthropic.AsyncAnthropic,
        explain=_sampling,
    )


def _sampling(key: str) -> str | None:
    """Why a sampling field is no setting of an SDK that has none."""
    if key not in _SAMPLING:
        return None
    return (
        f"{key}: the installed anthropic SDK ({anthropic.__version__}) has no sampling "
        "parameters, since the API version it speaks (2026-10-21) refuses them; a "
        f"compatible server that takes one can get extra_body={{{key!r}: ...}}"
    )
