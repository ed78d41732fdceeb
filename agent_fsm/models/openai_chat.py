"""The OpenAI Chat Completions adapter: the only module in agent_fsm that imports ``openai``.

It works with OpenAI and with the many servers that speak the same API (vLLM, llama.cpp,
Ollama, LiteLLM, ...) through ``base_url``. The wire conversion lives in ``openai_convert``;
the client, retries, streaming and error classification are ``StainlessModel``'s
(``models.adapter``, ``models.stainless``): this module says how a request is written and
which SDK classes to use.
"""

from __future__ import annotations

import copy
from collections.abc import Awaitable, Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, ClassVar

import openai

from agent_fsm.messages import ModelRequest, ToolSpec
from agent_fsm.models.adapter import ReplyReader
from agent_fsm.models.base import ToolSchemaIssue
from agent_fsm.models.openai_convert import (
    CHAT_PARTS,
    ReplyAssembler,
    response_format,
    to_openai_messages,
    to_openai_tool_choice,
    to_openai_tools,
)
from agent_fsm.models.openai_schema import strict_obstacle
from agent_fsm.models.stainless import (
    SDKErrors,
    StainlessModel,
    check_settings,
    split_fields,
)

__all__ = ["OpenAIChatModel", "OpenAISDKModel", "request_settings"]

# Request fields the adapter sets itself; a setting may not override them.
_RESERVED = frozenset({"messages", "model", "tools", "functions", "stream", "stream_options"})
# Settings that only mean something when tools are sent (the API rejects them otherwise).
_TOOL_SETTINGS = ("tool_choice", "parallel_tool_calls")
_CREATE = openai.resources.chat.AsyncCompletions.create

# The ``tools`` payload, and the original schemas of the tools sent strict, by name.
_WireTools = tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]


class OpenAISDKModel(StainlessModel[openai.AsyncOpenAI, _WireTools]):
    """The ``openai`` SDK's side of both OpenAI adapters (Chat Completions, Responses).

    The SDK client is built on first use, from ``api_key`` and ``base_url`` or, when they are
    None, from ``OPENAI_API_KEY`` and ``OPENAI_BASE_URL`` exactly as the SDK reads them (see
    ``SDKModel`` for its life per event loop and ``aclose``). Failures are raised as
    ``ModelCallError``: transient for rate limits (with the server's ``Retry-After``),
    408/409/5xx, timeouts, dropped connections and malformed replies; permanent for the other
    4xx (bad request, authentication, permission, not found, unprocessable) and for an
    exhausted quota. The API key never appears in an error, a repr or a log line: the adapter
    writes it nowhere and scrubs it from server messages.
    """

    label = "OpenAI"
    client_class = openai.AsyncOpenAI
    client_errors = (openai.OpenAIError,)
    sdk_errors = (openai.OpenAIError, ValueError)  # ValueError: a body that is no JSON
    errors = SDKErrors(
        timeout=openai.APITimeoutError,
        connection=openai.APIConnectionError,
        status=openai.APIStatusError,
        invalid_reply=openai.APIResponseValidationError,
        api=openai.APIError,
        client=(openai.OpenAIError,),
    )
    quota_codes = frozenset({"insufficient_quota"})  # a 429 that no amount of waiting fixes
    strict_provider: ClassVar[str] = "openai strict mode"
    """The provider a ``ToolSchemaIssue`` of strict mode names."""
    reader_class: ClassVar[Callable[..., ReplyReader]]
    """The API's reply assembler (its keywords: ``fallback_id_prefix``, ``strict_schemas``,
    ``output_schema``)."""
    _strict: bool

    def tool_schema_issues(self, tools: Sequence[ToolSpec]) -> list[ToolSchemaIssue]:
        """With ``strict=True``: the tools strict mode cannot express, which are sent without
        it (the API then does not hold the model to their schemas). None otherwise: outside
        strict mode the API takes any JSON Schema."""
        if not self._strict:
            return []
        detail = "the tool is sent without strict mode"
        return [
            ToolSchemaIssue(
                tool=spec.name, keyword=obstacle, provider=self.strict_provider, detail=detail
            )
            for spec in tools
            if (obstacle := strict_obstacle(spec.parameters)) is not None
        ]

    def _error_code(self, body: object) -> str | None:
        if isinstance(body, Mapping):
            for key in ("code", "type"):
                value = body.get(key)
                if isinstance(value, str) and value:
                    return value
        return None

    def _error_message(self, body: object) -> str | None:
        text = body.get("message") if isinstance(body, Mapping) else None
        return text if isinstance(text, str) else None

    def _reader(self, request: ModelRequest) -> ReplyReader:
        # One reader for both paths: a streamed reply becomes the same ModelResponse. It
        # takes out the nulls strict mode made the model send, against the schemas sent.
        return self.reader_class(
            fallback_id_prefix=f"{request.run_id}_{request.turn}",
            strict_schemas=self._wire_tools(request.tools)[1] if request.tools else None,
            output_schema=request.output.schema
            if request.output is not None and self._strict
            else None,
        )


class OpenAIChatModel(OpenAISDKModel):
    """A Model backed by the Chat Completions API (``POST /chat/completions``).

    The client and its life, the errors and the key are ``OpenAISDKModel``'s (above).

    Args:
        model: the model name sent to the server, e.g. ``"gpt-4o-mini"``.
        base_url: the API root, e.g. ``"http://127.0.0.1:8000/v1"``; default: the SDK's.
        api_key: the key; default: the SDK's (``OPENAI_API_KEY``).
        client: a ready ``openai.AsyncOpenAI`` to use instead of building one (then
            ``base_url`` and ``api_key`` must be None). It is used through a copy with
            ``max_retries=0`` and is never closed by this adapter: its owner closes it.
        stream: stream replies, reporting fragments to ``ModelRequest.on_delta``. The result
            is the same ModelResponse either way.
        strict: send tools in strict mode (see ``openai_schema.strict_schema``). The model
            then sends ``null`` for every optional argument it leaves out; the adapter removes
            those nulls again where the tool's own schema does not accept them, so the engine's
            validation sees the arguments the tool declared. The API does not guarantee strict
            schemas for parallel calls; pass ``parallel_tool_calls=False`` to rule them out.
        temperature: sampling temperature; None leaves it to the server.
        max_tokens: cap on the reply's tokens; None leaves it to the server. (Reasoning models
            want ``max_completion_tokens=...`` instead, passed as a setting.)
        timeout: seconds allowed for one request; None keeps the SDK's default.
        context_window: the model's context window in tokens (a local server's context
            size), for ``Agent`` to keep every prompt inside; None when unknown.
        **settings: any other ``chat.completions.create`` argument (``top_p``, ``seed``,
            ``tool_choice``, ``reasoning_effort``, ``extra_body``, ...), sent with every request.

    Raises:
        ConfigError: for an empty model name, ``client`` combined with ``base_url`` or
            ``api_key``, a non-positive timeout, or a setting ``create`` does not accept.
    """

    example = "gpt-4o-mini"
    key_variables = ("OPENAI_API_KEY",)
    endpoint = "/chat/completions"
    reader_class = ReplyAssembler
    supports_native_output = True
    """Typed output can travel as ``response_format`` (a JSON Schema), for servers that
    support structured outputs (OpenAI, vLLM, llama.cpp)."""
    part_support = CHAT_PARTS
    """Images and PDFs, and how a tool result's reach the model (``CHAT_PARTS``)."""

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        client: openai.AsyncOpenAI | None = None,
        stream: bool = False,
        strict: bool = False,
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
        self._strict = strict
        for key, value in (("temperature", temperature), ("max_tokens", max_tokens)):
            if value is not None:
                settings[key] = value
        if timeout is not None:
            settings["timeout"] = timeout
        _check_settings(settings)
        self._settings = MappingProxyType(dict(settings))
        self._check_credentials()

    # -- the wire conversion

    def _repr_options(self) -> list[str]:
        return [f"strict={self._strict}"]

    def _call(self, request: ModelRequest) -> dict[str, Any]:
        kwargs: dict[str, Any] = dict(self._settings)
        kwargs["model"] = self._model
        kwargs["messages"] = to_openai_messages(request.messages, support=CHAT_PARTS)
        if request.output is not None:
            kwargs["response_format"] = response_format(request.output, strict=self._strict)
        if request.tools:
            kwargs["tools"] = self._wire_tools(request.tools)[0]
            if request.tool_choice is not None:  # the request's own choice wins over settings
                kwargs["tool_choice"] = to_openai_tool_choice(request.tool_choice)
        else:
            for key in _TOOL_SETTINGS:
                kwargs.pop(key, None)
        if self._stream:
            kwargs["stream"] = True
            kwargs["stream_options"] = {"include_usage": True}
        return kwargs

    def _send(self, client: openai.AsyncOpenAI, call: dict[str, Any]) -> Awaitable[Any]:
        return client.chat.completions.create(**call)

    def _convert_tools(self, tools: tuple[ToolSpec, ...]) -> _WireTools:
        """The ``tools`` payload, and the original schemas of the tools it sends strict."""
        payload = to_openai_tools(tools, strict=self._strict)
        # Copied like the payload, so a reply is cleaned against the schemas that were sent.
        strict_schemas = {
            spec.name: copy.deepcopy(spec.parameters)
            for spec, wire in zip(tools, payload, strict=True)
            if wire["function"].get("strict") is True
        }
        return payload, strict_schemas


def _check_settings(settings: Mapping[str, Any]) -> None:
    check_settings(
        settings,
        adapter="OpenAIChatModel",
        reserved=_RESERVED,
        create=_CREATE,
        create_name="chat.completions.create",
        client_class=openai.AsyncOpenAI,
    )


def request_settings(fields: Mapping[str, Any]) -> dict[str, Any]:
    """``OpenAIChatModel`` settings from free-form request fields (a command line's
    ``key=value`` pairs): a field ``chat.completions.create`` takes stays a setting, any other
    goes in ``extra_body`` for the server (llama.cpp's ``top_k``, vLLM's ``min_p``).

    Raises:
        ConfigError: for a near miss of a field the SDK takes (a typo would otherwise reach
            the server silently), a client option, or a field the adapter sets itself.
    """
    settings = split_fields(
        fields,
        create=_CREATE,
        create_name="chat.completions.create",
        client_class=openai.AsyncOpenAI,
        reserved=_RESERVED,
    )
    _check_settings(settings)
    return settings
