"""The OpenAI Responses API adapter (``POST /responses``), through the ``openai`` SDK.

Beside ``openai_chat``, the only module in agent_fsm that imports ``openai``. The wire
conversion lives in ``openai_responses_convert`` (requests) and ``openai_responses_reply``
(replies); this module owns the SDK client, the request, streaming and the mapping of failures
to ``ModelCallError``. Its error texts, timeouts and
connection diagnostics are ``openai_chat``'s, for the same SDK.

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

Retrying is the engine's job (its THINK → THINK row, bounded by the consecutive-error guard,
with backoff honouring ``retry_after_s``), so the SDK client is always used with
``max_retries=0``: retries hidden in here would be invisible to the budgets.
"""

from __future__ import annotations

import asyncio
import copy
import difflib
import functools
import inspect
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

import openai

from agent_fsm.errors import ConfigError
from agent_fsm.messages import ModelRequest, ModelResponse, ToolSpec
from agent_fsm.models.base import ModelCallError, ToolSchemaIssue
from agent_fsm.models.common import (
    Attempt,
    ClosesOnExit,
    DeltaReporter,
    check_adapter_options,
    parse_retry_after,
    redact_url,
    scrub_secrets,
    transport_failure,
)
from agent_fsm.models.openai_chat import (
    _TRANSIENT_STATUSES,
    _client_parameters,
    _connection_failure,
    _error_code,
    _server_message,
    attempt_at,
)
from agent_fsm.models.openai_responses_convert import (
    text_format,
    to_responses_input,
    to_responses_tools,
)
from agent_fsm.models.openai_responses_reply import TRANSIENT_ERROR_CODES, ReplyAssembler
from agent_fsm.models.openai_schema import strict_obstacle

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


@functools.cache
def _create_parameters() -> frozenset[str] | None:
    """Names ``responses.create`` accepts, or None if they cannot be read."""
    try:
        from openai.resources.responses import AsyncResponses

        return frozenset(inspect.signature(AsyncResponses.create).parameters) - {"self"}
    except (ImportError, AttributeError, TypeError, ValueError):  # pragma: no cover
        return None  # an SDK build whose signature cannot be read: settings go unchecked


class OpenAIResponsesModel(ClosesOnExit):
    """A Model backed by the OpenAI Responses API (``client.responses.create``).

    The SDK client is built on first use, from ``api_key`` and ``base_url`` or, when they are
    None, from ``OPENAI_API_KEY`` and ``OPENAI_BASE_URL`` exactly as the SDK reads them. A
    client built here belongs to the event loop of its first request; a request from another
    loop gets a fresh one, since pooled connections cannot cross loops. Release it with
    ``await model.aclose()`` or ``async with model:``.

    The leading system messages of the transcript travel as ``instructions``; tools as flat
    ``function`` tools, each with an explicit ``strict`` (the API would otherwise make it
    strict). Failures are raised as ``ModelCallError`` (see the module docstring for which are
    transient); the API key never appears in an error, a repr or a log line.

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

    supports_native_output = True
    """Typed output travels as ``text.format`` (a JSON Schema)."""

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
        check_adapter_options(
            "OpenAIResponsesModel",
            "gpt-4.1-mini",
            model,
            client=client,
            base_url=base_url,
            api_key=api_key,
            timeout=timeout,
            context_window=context_window,
        )
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
        self.context_window = context_window
        """The model's context window in tokens, which ``Agent`` takes when its ``Limits``
        name none."""
        self._model = model
        self._base_url = base_url
        self._api_key = api_key
        self._stream = stream
        self._strict = strict
        self._store = store
        self._settings: Mapping[str, Any] = MappingProxyType(dict(settings))
        self._given_client = client.with_options(max_retries=0) if client is not None else None
        self._own_client: openai.AsyncOpenAI | None = None
        self._own_loop: asyncio.AbstractEventLoop | None = None
        self._tools_cache: tuple[tuple[ToolSpec, ...], _WireTools] | None = None

    @property
    def name(self) -> str:
        """The model name, as sent to the server."""
        return self._model

    def __repr__(self) -> str:
        parts = [repr(self._model)]
        if self._base_url is not None:
            parts.append(f"base_url={redact_url(self._base_url)!r}")
        parts += [f"stream={self._stream}", f"strict={self._strict}", f"store={self._store}"]
        if self._settings:
            parts.append(f"settings={sorted(self._settings)}")  # names only: values may be secret
        return f"OpenAIResponsesModel({', '.join(parts)})"

    def tool_schema_issues(self, tools: Sequence[ToolSpec]) -> list[ToolSchemaIssue]:
        """With ``strict=True``: the tools strict mode cannot express, which are sent with
        ``"strict": false`` (the API then does not hold the model to their schemas). None
        otherwise: outside strict mode the API takes any JSON Schema."""
        if not self._strict:
            return []
        issues: list[ToolSchemaIssue] = []
        for spec in tools:
            obstacle = strict_obstacle(spec.parameters)
            if obstacle is not None:
                issues.append(
                    ToolSchemaIssue(
                        tool=spec.name,
                        keyword=obstacle,
                        provider=f"{PROVIDER} strict mode",
                        detail="the tool is sent without strict mode",
                    )
                )
        return issues

    async def request(self, request: ModelRequest) -> ModelResponse:
        """Send one request and convert the reply.

        Raises:
            ModelCallError: for every failure of the server, the network or the reply. It is
                raised with no chained cause, because the SDK's exceptions can carry text
                that contains the key.
        """
        failure: ModelCallError
        try:
            client = self._client()
        except openai.OpenAIError as err:  # e.g. no key given and OPENAI_API_KEY unset
            failure = ModelCallError(
                self._scrub(f"cannot build the OpenAI client: {err}"), transient=False
            )
        else:
            kwargs = self._request_kwargs(request)
            assembler = ReplyAssembler(
                fallback_id_prefix=f"{request.run_id}_{request.turn}",
                strict_schemas=self._wire_tools(request.tools)[1] if request.tools else None,
                output_schema=request.output.schema
                if request.output is not None and self._strict
                else None,
            )
            attempt = attempt_at(client, "/responses", self._settings.get("timeout"))
            if self._stream:
                return await self._request_streamed(client, kwargs, request, assembler, attempt)
            try:
                response = await client.responses.create(**kwargs)
            except (openai.OpenAIError, ValueError) as err:  # ValueError: a body that is no JSON
                failure = self._failure(err, attempt)
            else:
                try:
                    assembler.add_response(response)
                    return assembler.build()
                except ModelCallError as err:
                    failure = self._rescrubbed(err)
        raise failure  # outside the except blocks, so no __context__ links to the SDK error

    async def aclose(self) -> None:
        """Close the client this adapter built, if any; a given ``client`` is left open.

        The adapter stays usable: the next request builds a new client.
        """
        client, self._own_client, self._own_loop = self._own_client, None, None
        if client is not None:
            await client.close()

    # -- internals

    def _client(self) -> openai.AsyncOpenAI:
        if self._given_client is not None:
            return self._given_client
        loop = asyncio.get_running_loop()
        if self._own_client is None or self._own_loop is not loop:
            self._own_client = openai.AsyncOpenAI(
                api_key=self._api_key, base_url=self._base_url, max_retries=0
            )
            self._own_loop = loop
        return self._own_client

    def _request_kwargs(self, request: ModelRequest) -> dict[str, Any]:
        kwargs: dict[str, Any] = dict(self._settings)
        instructions, items = to_responses_input(request.messages, stored=self._store)
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

    def _wire_tools(self, tools: tuple[ToolSpec, ...]) -> _WireTools:
        """The ``tools`` payload, and the original schemas of the tools it sends strict."""
        # The engine sends the same tuple every turn: convert (and strict-adapt) it once.
        cached = self._tools_cache
        if cached is not None and cached[0] is tools:
            return cached[1]
        payload = to_responses_tools(tools, strict=self._strict)
        strict_schemas = {
            spec.name: copy.deepcopy(spec.parameters)
            for spec, wire in zip(tools, payload, strict=True)
            if wire["strict"] is True
        }
        self._tools_cache = (tools, (payload, strict_schemas))
        return payload, strict_schemas

    async def _request_streamed(
        self,
        client: openai.AsyncOpenAI,
        kwargs: dict[str, Any],
        request: ModelRequest,
        assembler: ReplyAssembler,
        attempt: Attempt,
    ) -> ModelResponse:
        failure: ModelCallError | None = None
        try:
            stream = await client.responses.create(**kwargs)
        except (openai.OpenAIError, ValueError) as err:
            failure = self._failure(err, attempt)
        if failure is not None:
            raise failure
        report = DeltaReporter(request.on_delta, request.run_id)
        async with stream:  # releases the connection however the loop below ends
            events = stream.__aiter__()
            while failure is None:
                try:
                    event = await events.__anext__()
                except StopAsyncIteration:
                    break
                except Exception as err:  # the SDK's iterator: transport and decoding failures
                    failure = self._failure(err, attempt, streaming=True)
                    break
                try:
                    for delta in assembler.add_event(event):
                        report(delta)
                except ModelCallError as err:
                    failure = self._rescrubbed(err)
        if failure is None:
            try:
                return assembler.build()
            except ModelCallError as err:
                failure = self._rescrubbed(err)
        raise failure

    def _failure(
        self, err: Exception, attempt: Attempt, *, streaming: bool = False
    ) -> ModelCallError:
        """Map an exception from the SDK to a ModelCallError (scrubbed, never chained) that
        says what failed, where, and after how long."""
        transient = True
        retry_after: float | None = None
        if isinstance(err, openai.APITimeoutError):
            message = (
                f"the request to {attempt.url} timed out: no reply within the"
                f" {attempt.timeout()} timeout (gave up after {attempt.elapsed()})"
            )
        elif isinstance(err, openai.APIConnectionError):
            message = _connection_failure(err, attempt)
        elif isinstance(err, openai.APIStatusError):
            status, code = err.status_code, _error_code(err.body)
            transient = status in _TRANSIENT_STATUSES or status >= 500
            if code == "insufficient_quota":  # a 429 that no amount of waiting fixes
                transient = False
            retry_after = parse_retry_after(err.response.headers) if transient else None
            label = f"HTTP {status}" + (f", {code}" if code else "")
            message = f"{type(err).__name__} ({label}) from {attempt.url}: {_server_message(err)}"
            request_id = getattr(err, "request_id", None)
            if request_id:
                message += f" [request id {request_id}]"
        elif isinstance(err, openai.APIError):  # an error event inside a stream, bad data, ...
            code = _error_code(err.body)
            transient = code is None or code in TRANSIENT_ERROR_CODES
            label = f" ({code})" if code else ""
            message = f"server error{label} from {attempt.url}: {_server_message(err)}"
        elif isinstance(err, openai.OpenAIError):
            message, transient = f"OpenAI client error: {err}", False
        elif isinstance(err, ValueError):
            message = f"malformed reply from {attempt.url}: {type(err).__name__}"
        else:  # the HTTP library's own error, from a stream the SDK did not wrap (older SDKs)
            message = transport_failure(err, attempt)
        if streaming and isinstance(err, ValueError | openai.APIError):
            message = f"while streaming: {message}"
        return ModelCallError(self._scrub(message), transient=transient, retry_after_s=retry_after)

    def _rescrubbed(self, err: ModelCallError) -> ModelCallError:
        """``err`` (from the reply's own text) with any secret taken out."""
        return ModelCallError(
            self._scrub(str(err)), transient=err.transient, retry_after_s=err.retry_after_s
        )

    def _scrub(self, text: str) -> str:
        secrets = {self._api_key}
        for client in (self._given_client, self._own_client):
            if client is not None:
                secrets.add(getattr(client, "api_key", None))
        return scrub_secrets(text, secrets)


def _check_settings(settings: Mapping[str, Any]) -> None:
    reserved = sorted(_RESERVED.intersection(settings))
    if reserved:
        raise ConfigError(
            f"OpenAIResponsesModel sets {reserved} itself (or keeps no server-side state); "
            "they cannot be settings"
        )
    accepted = _create_parameters()
    if accepted is None:
        return
    problems = [_unknown_setting(key, accepted) for key in sorted(set(settings) - accepted)]
    if problems:
        raise ConfigError("; ".join(problems))


def _unknown_setting(key: str, accepted: frozenset[str]) -> str:
    """Why ``key`` is no setting, and what the user most likely meant."""
    if key == "max_retries":
        return (
            "max_retries: retries are the engine's, where budgets and the termination bound "
            "see them (the SDK client is always used with max_retries=0); set them in Limits"
        )
    if key in _client_parameters():
        return (
            f"{key} is an option of the SDK client, not of a request: pass "
            f"client=openai.AsyncOpenAI(..., {key}=...)"
        )
    server_field = "a field only your server knows goes in extra_body={...}"
    close = difflib.get_close_matches(key, sorted(accepted), n=1, cutoff=0.85)
    if close:
        return (
            f"responses.create takes no argument {key!r}: did you mean {close[0]!r}? "
            f"({server_field})"
        )
    return f"responses.create takes no argument {key!r}; {server_field}"


def _tool_choice(choice: str) -> str | dict[str, str]:
    """``ModelRequest.tool_choice`` as the Responses API takes it: a mode as it is, a tool's
    name as a forced function call."""
    if choice in ("auto", "required", "none"):
        return choice
    return {"type": "function", "name": choice}
