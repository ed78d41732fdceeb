"""The OpenAI Responses API adapter (``POST /responses``), through the ``openai`` SDK.

Beside ``openai_chat``, the only module in agent_fsm that imports ``openai``. The wire
conversion lives in ``openai_responses_convert`` (requests) and ``openai_responses_reply``
(replies); the client, streaming and the mapping of failures to ``ModelCallError`` are
``openai_chat.OpenAISDKModel``'s, for the same SDK: this module writes the request.

The adapter is stateless: ``store=False`` by default, no ``previous_response_id``, the whole
transcript sent every turn. A reasoning model's reasoning items come back with their
``encrypted_content`` (asked for with ``include``) and are sent back on later turns, before the
calls they preceded, through ``AssistantMessage.provider_data``.

How a reply ends (``response.status`` and ``incomplete_details.reason``):

=======================================================  =================================
Responses API                                            agent_fsm
=======================================================  =================================
``completed``                                            STOP
``completed`` with ``function_call`` items               TOOL_CALLS
``completed``, a ``refusal`` content part, no calls      REFUSAL (its text is the content)
``incomplete`` / ``max_output_tokens``                   LENGTH
``incomplete`` / ``content_filter``                      CONTENT_FILTER
``incomplete`` / another or no reason                    LENGTH (the reply was cut short)
``failed``, ``error.code`` ``server_error``,             ModelCallError, transient
``rate_limit_exceeded``, ``vector_store_timeout``, none
``failed``, any other code (``invalid_prompt``,          ModelCallError, permanent
``insufficient_quota``, ...); the same for an
``error`` stream event
``cancelled``                                            ModelCallError, transient
no status, or an unknown one                             STOP (TOOL_CALLS with calls)
a stream without its terminal event                      ModelCallError, transient
HTTP 408, 409, 429 (with Retry-After), 5xx               ModelCallError, transient
HTTP 400, 401, 403, 404, 422;                            ModelCallError, permanent
429 ``insufficient_quota``
=======================================================  =================================
"""

from __future__ import annotations

import copy
from collections.abc import Awaitable, Mapping
from types import MappingProxyType
from typing import Any

import openai
from openai.resources.responses import AsyncResponses

from agent_fsm.errors import ConfigError
from agent_fsm.messages import ModelRequest, ToolSpec
from agent_fsm.models.openai_chat import OpenAISDKModel
from agent_fsm.models.openai_responses_convert import (
    RESPONSES_PARTS,
    text_format,
    to_responses_input,
    to_responses_tools,
)
from agent_fsm.models.openai_responses_reply import TRANSIENT_ERROR_CODES, ReplyAssembler
from agent_fsm.models.stainless import check_settings

__all__ = ["OpenAIResponsesModel"]

PROVIDER = "openai-responses"
# Request fields the adapter sets itself, or that would make it stateful; no setting may be one.
_RESERVED = frozenset(
    {
        "input",
        "model",
        "tools",
        "stream",
        "instructions",
        "previous_response_id",
        "conversation",
        "background",
    }
)
# Settings that only mean something when tools are sent (the API rejects them otherwise).
_TOOL_SETTINGS = ("tool_choice", "parallel_tool_calls", "max_tool_calls")
_ENCRYPTED_REASONING = "reasoning.encrypted_content"

# The ``tools`` payload, and the original schemas of the tools sent strict, by name.
_WireTools = tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]


class OpenAIResponsesModel(OpenAISDKModel):
    """A Model backed by the OpenAI Responses API (``client.responses.create``).

    The client and its life, the errors and the key are ``OpenAISDKModel``'s.
    The leading system messages of the transcript travel as ``instructions``; tools as flat
    ``function`` tools, each with an explicit ``strict`` (the API would otherwise make it
    strict). Failures are raised as ``ModelCallError`` (see the module docstring for which are
    transient).

    Args:
        model: the model name sent to the server, e.g. ``"gpt-4.1-mini"`` or ``"o4-mini"``.
        base_url: the API root, e.g. ``"http://127.0.0.1:8000/v1"``; default: the SDK's.
        api_key: the key; default: the SDK's (``OPENAI_API_KEY``).
        client: a ready ``openai.AsyncOpenAI`` to use instead of building one (then
            ``base_url`` and ``api_key`` must be None). It is used through a copy with
            ``max_retries=0`` and is never closed by this adapter: its owner closes it.
        stream: stream replies, reporting fragments to ``ModelRequest.on_delta``. The result
            is the same ModelResponse either way.
        strict: send tools (and a typed reply's schema) in strict mode where
            ``openai_schema.strict_schema`` can adapt them; the nulls strict mode makes the
            model send for optional arguments are taken out again before validation.
        store: let the server store responses (``store=True``). The adapter never refers to
            stored responses; storing only lets reasoning items without ``encrypted_content``
            be sent back by id.
        temperature: sampling temperature; None leaves it to the server.
        max_tokens: cap on the reply's tokens, reasoning included (``max_output_tokens``);
            None leaves it to the server.
        timeout: seconds allowed for one request; None keeps the SDK's default.
        context_window: the model's context window in tokens, for ``Agent`` to keep every
            prompt inside; None when unknown.
        **settings: any other ``responses.create`` argument (``reasoning``, ``top_p``,
            ``tool_choice``, ``include``, ``text``, ``extra_body``, ...), sent with every
            request. With ``reasoning`` given and ``store=False``, ``include`` gains
            ``"reasoning.encrypted_content"``, so the model's reasoning is kept across turns
            (it is not asked for otherwise: models that do not reason refuse it).

    Raises:
        ConfigError: for an empty model name, ``client`` combined with ``base_url`` or
            ``api_key``, a non-positive timeout, ``max_tokens`` with ``max_output_tokens``,
            or a setting ``responses.create`` does not accept or the adapter sets itself.
    """

    example = "gpt-4.1-mini"
    key_variables = ("OPENAI_API_KEY",)
    endpoint = "/responses"
    reader_class = ReplyAssembler
    strict_provider = f"{PROVIDER} strict mode"
    supports_native_output = True
    """Typed output travels as ``text.format`` (a JSON Schema)."""
    part_support = RESPONSES_PARTS
    """Images and files: ``input_image`` and ``input_file``, in user messages and tool
    results (``RESPONSES_PARTS``)."""

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        client: openai.AsyncOpenAI | None = None,
        stream: bool = False,
        strict: bool = False,
        store: bool = False,
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
        if max_tokens is not None and "max_output_tokens" in settings:
            raise ConfigError("pass max_tokens or max_output_tokens, not both")
        for key, value in (
            ("temperature", temperature),
            ("max_output_tokens", max_tokens),
            ("timeout", timeout),
        ):
            if value is not None:
                settings[key] = value
        _check_settings(settings)
        if not store and settings.get("reasoning") is not None:
            include = list(settings.get("include") or ())
            if _ENCRYPTED_REASONING not in include:
                include.append(_ENCRYPTED_REASONING)
            settings["include"] = include
        self._store = store
        self._settings = MappingProxyType(dict(settings))
        self._check_credentials()

    # -- the wire conversion

    def _repr_options(self) -> list[str]:
        return [f"strict={self._strict}", f"store={self._store}"]

    def _call(self, request: ModelRequest) -> dict[str, Any]:
        kwargs: dict[str, Any] = dict(self._settings)
        instructions, items = to_responses_input(
            request.messages, stored=self._store, support=RESPONSES_PARTS
        )
        kwargs.update(model=self._model, input=items, store=self._store)
        if instructions is not None:
            kwargs["instructions"] = instructions
        if request.output is not None:
            text = dict(kwargs.get("text") or {})  # keeps a `verbosity` setting
            text["format"] = text_format(request.output, strict=self._strict)
            kwargs["text"] = text
        if request.tools:
            kwargs["tools"] = self._wire_tools(request.tools)[0]
            if request.tool_choice is not None:  # a hook's choice wins over the settings
                kwargs["tool_choice"] = _tool_choice(request.tool_choice)
        else:
            for key in _TOOL_SETTINGS:
                kwargs.pop(key, None)
        if self._stream:
            kwargs["stream"] = True
        return kwargs

    def _send(self, client: openai.AsyncOpenAI, call: dict[str, Any]) -> Awaitable[Any]:
        return client.responses.create(**call)

    def _convert_tools(self, tools: tuple[ToolSpec, ...]) -> _WireTools:
        """The ``tools`` payload, and the original schemas of the tools it sends strict."""
        payload = to_responses_tools(tools, strict=self._strict)
        strict_schemas = {
            spec.name: copy.deepcopy(spec.parameters)
            for spec, wire in zip(tools, payload, strict=True)
            if wire["strict"] is True
        }
        return payload, strict_schemas

    def _event_transient(self, code: str | None) -> bool:
        """An ``error`` event (or a failed response) passes on a retry when its code says
        so, or when it has none."""
        return code is None or code in TRANSIENT_ERROR_CODES


def _check_settings(settings: Mapping[str, Any]) -> None:
    check_settings(
        settings,
        adapter="OpenAIResponsesModel",
        reserved=_RESERVED,
        reserved_why=" (or keeps no server-side state)",
        create=AsyncResponses.create,
        create_name="responses.create",
        client_class=openai.AsyncOpenAI,
    )


def _tool_choice(choice: str) -> str | dict[str, str]:
    """``ModelRequest.tool_choice`` as the Responses API takes it: a mode as it is, a tool's
    name as a forced function call."""
    if choice in ("auto", "required", "none"):
        return choice
    return {"type": "function", "name": choice}
