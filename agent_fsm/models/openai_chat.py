"""The OpenAI Chat Completions adapter: the only module in agent_fsm that imports ``openai``.

It works with OpenAI and with the many servers that speak the same API (vLLM, llama.cpp,
Ollama, LiteLLM, ...) through ``base_url``. The wire conversion lives in ``openai_convert``;
this module owns the SDK client, the request, streaming and the mapping of SDK errors to
``ModelCallError``.

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
    one_line,
    parse_retry_after,
    redact_url,
    scrub_secrets,
    transport_failure,
)
from agent_fsm.models.openai_convert import (
    ReplyAssembler,
    response_format,
    to_openai_messages,
    to_openai_tool_choice,
    to_openai_tools,
)
from agent_fsm.models.openai_schema import strict_obstacle

__all__ = ["OpenAIChatModel", "request_settings"]

# Request fields the adapter sets itself; a setting may not override them.
_RESERVED = frozenset({"messages", "model", "tools", "functions", "stream", "stream_options"})
# Settings that only mean something when tools are sent (the API rejects them otherwise).
_TOOL_SETTINGS = ("tool_choice", "parallel_tool_calls")
# Statuses worth retrying, as the SDK itself would: timeout, conflict, rate limit, 5xx.
_TRANSIENT_STATUSES = frozenset({408, 409, 429})

# The ``tools`` payload, and the original schemas of the tools sent strict, by name.
_WireTools = tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]


@functools.cache
def _create_parameters() -> frozenset[str] | None:
    """Names ``chat.completions.create`` accepts, or None if they cannot be read."""
    try:
        create = openai.resources.chat.AsyncCompletions.create
        return frozenset(inspect.signature(create).parameters) - {"self"}
    except (AttributeError, TypeError, ValueError):  # pragma: no cover - unusual SDK builds
        return None


class OpenAIChatModel(ClosesOnExit):
    """A Model backed by the Chat Completions API (``POST /chat/completions``).

    The SDK client is built on first use, from ``api_key`` and ``base_url`` or, when they are
    None, from ``OPENAI_API_KEY`` and ``OPENAI_BASE_URL`` exactly as the SDK reads them. A
    client built here belongs to the event loop of its first request; a request from another
    loop (successive ``asyncio.run`` calls) gets a fresh one, since pooled connections cannot
    cross loops. Release it with ``await model.aclose()`` or ``async with model:``.

    Failures are raised as ``ModelCallError``: transient for rate limits (with the server's
    ``Retry-After``), 408/409/5xx, timeouts, dropped connections and malformed replies;
    permanent for the other 4xx (bad request, authentication, permission, not found,
    unprocessable) and for an exhausted quota. The API key never appears in an error, a
    repr or a log line: the adapter writes it nowhere and scrubs it from server messages.

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
        check_adapter_options(
            "OpenAIChatModel",
            "gpt-4o-mini",
            model,
            client=client,
            base_url=base_url,
            api_key=api_key,
            timeout=timeout,
            context_window=context_window,
        )
        for key, value in (("temperature", temperature), ("max_tokens", max_tokens)):
            if value is not None:
                settings[key] = value
        if timeout is not None:
            settings["timeout"] = timeout
        _check_settings(settings)
        self.context_window = context_window
        """The model's context window in tokens (the server's ``--ctx-size`` for llama.cpp),
        which ``Agent`` takes when its ``Limits`` name none."""
        self._model = model
        self._base_url = base_url
        self._api_key = api_key
        self._stream = stream
        self._strict = strict
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
        parts.append(f"stream={self._stream}")
        parts.append(f"strict={self._strict}")
        if self._settings:
            parts.append(f"settings={sorted(self._settings)}")  # names only: values may be secret
        return f"OpenAIChatModel({', '.join(parts)})"

    def tool_schema_issues(self, tools: Sequence[ToolSpec]) -> list[ToolSchemaIssue]:
        """With ``strict=True``: the tools strict mode cannot express, which are sent without
        it (the API then does not hold the model to their schemas). None otherwise: Chat
        Completions takes any JSON Schema outside strict mode."""
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
                        provider="openai strict mode",
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
            message = self._scrub(f"cannot build the OpenAI client: {err}")
            failure = ModelCallError(message, transient=False)
        else:
            kwargs = self._request_kwargs(request)
            # One assembler for both paths: a streamed reply becomes the same ModelResponse.
            assembler = ReplyAssembler(
                fallback_id_prefix=f"{request.run_id}_{request.turn}",
                strict_schemas=self._wire_tools(request.tools)[1] if request.tools else None,
                output_schema=request.output.schema
                if request.output is not None and self._strict
                else None,
            )
            attempt = attempt_at(client, "/chat/completions", self._settings.get("timeout"))
            if self._stream:
                return await self._request_streamed(client, kwargs, request, assembler, attempt)
            try:
                completion = await client.chat.completions.create(**kwargs)
            except (openai.OpenAIError, ValueError) as err:  # ValueError: a body that is no JSON
                failure = self._failure(err, attempt)
            else:
                assembler.add_completion(completion)
                return assembler.build()
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

    supports_native_output = True
    """Typed output can travel as ``response_format`` (a JSON Schema), for servers that
    support structured outputs (OpenAI, vLLM, llama.cpp)."""

    def _request_kwargs(self, request: ModelRequest) -> dict[str, Any]:
        kwargs: dict[str, Any] = dict(self._settings)
        kwargs["model"] = self._model
        kwargs["messages"] = to_openai_messages(request.messages)
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

    def _wire_tools(self, tools: tuple[ToolSpec, ...]) -> _WireTools:
        """The ``tools`` payload, and the original schemas of the tools it sends strict."""
        # The engine sends the same tuple every turn: convert (and strict-adapt) it once.
        cached = self._tools_cache
        if cached is not None and cached[0] is tools:
            return cached[1]
        payload = to_openai_tools(tools, strict=self._strict)
        # Copied like the payload, so a reply is cleaned against the schemas that were sent.
        strict_schemas = {
            spec.name: copy.deepcopy(spec.parameters)
            for spec, wire in zip(tools, payload, strict=True)
            if wire["function"].get("strict") is True
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
            stream = await client.chat.completions.create(**kwargs)
        except (openai.OpenAIError, ValueError) as err:
            failure = self._failure(err, attempt)
        if failure is not None:
            raise failure
        report = DeltaReporter(request.on_delta, request.run_id)
        async with stream:  # releases the connection however the loop below ends
            chunks = stream.__aiter__()
            while True:
                try:
                    chunk = await chunks.__anext__()
                except StopAsyncIteration:
                    break
                except Exception as err:  # the SDK's iterator: transport and decoding failures
                    failure = self._failure(err, attempt, streaming=True)
                    break
                for delta in assembler.add_chunk(chunk):
                    report(delta)
        if failure is not None:
            raise failure
        return assembler.build()

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
            status = err.status_code
            code = _error_code(err.body)
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
            message = f"server error from {attempt.url}: {_server_message(err)}"
        elif isinstance(err, openai.OpenAIError):
            message, transient = f"OpenAI client error: {err}", False
        elif isinstance(err, ValueError):
            message = f"malformed reply from {attempt.url}: {type(err).__name__}"
        else:  # the HTTP library's own error, from a stream the SDK did not wrap (older SDKs)
            message = transport_failure(err, attempt)
        if streaming and isinstance(err, ValueError | openai.APIError):
            message = f"while streaming: {message}"
        return ModelCallError(self._scrub(message), transient=transient, retry_after_s=retry_after)

    def _scrub(self, text: str) -> str:
        secrets = {self._api_key}
        for client in (self._given_client, self._own_client):
            if client is not None:
                secrets.add(getattr(client, "api_key", None))
        return scrub_secrets(text, secrets)


def _check_settings(settings: Mapping[str, Any]) -> None:
    reserved = sorted(_RESERVED.intersection(settings))
    if reserved:
        raise ConfigError(f"OpenAIChatModel sets {reserved} itself; they cannot be settings")
    accepted = _create_parameters()
    if accepted is None:
        return
    problems = [_unknown_setting(key, accepted) for key in sorted(set(settings) - accepted)]
    if problems:
        raise ConfigError("; ".join(problems))


def request_settings(fields: Mapping[str, Any]) -> dict[str, Any]:
    """``OpenAIChatModel`` settings from free-form request fields (a command line's
    ``key=value`` pairs): a field ``chat.completions.create`` takes stays a setting, any other
    goes in ``extra_body`` for the server (llama.cpp's ``top_k``, vLLM's ``min_p``).

    Raises:
        ConfigError: for a near miss of a field the SDK takes (a typo would otherwise reach
            the server silently), a client option, or a field the adapter sets itself.
    """
    accepted = _create_parameters() or frozenset()
    settings: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    problems: list[str] = []
    for key, value in fields.items():
        if key in accepted or key in _RESERVED:
            settings[key] = value
            continue
        if key == "max_retries" or key in _client_parameters() or _close_field(key, accepted):
            problems.append(_unknown_setting(key, accepted))
        else:
            extra[key] = value
    if problems:
        raise ConfigError("; ".join(problems))
    if extra:
        settings["extra_body"] = {**settings.get("extra_body", {}), **extra}
    _check_settings(settings)
    return settings


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
    close = _close_field(key, accepted)
    if close:
        return (
            f"chat.completions.create takes no argument {key!r}: did you mean {close!r}? "
            f"({server_field})"
        )
    return f"chat.completions.create takes no argument {key!r}; {server_field}"


def _close_field(key: str, accepted: frozenset[str]) -> str | None:
    """The field ``key`` is most likely a typo of. The cutoff (0.85) catches typos
    (temprature) but not a different real field (top_k is no top_p)."""
    close = difflib.get_close_matches(key, sorted(accepted), n=1, cutoff=0.85)
    return close[0] if close else None


@functools.cache
def _client_parameters() -> frozenset[str]:
    """Names ``openai.AsyncOpenAI`` accepts (empty if they cannot be read)."""
    try:
        return frozenset(inspect.signature(openai.AsyncOpenAI.__init__).parameters) - {"self"}
    except (TypeError, ValueError):  # pragma: no cover - unusual SDK builds
        return frozenset()


def _error_code(body: object) -> str | None:
    if isinstance(body, Mapping):
        for key in ("code", "type"):
            value = body.get(key)
            if isinstance(value, str) and value:
                return value
    return None


def _server_message(err: openai.APIError) -> str:
    body = err.body
    text = body.get("message") if isinstance(body, Mapping) else None
    if not isinstance(text, str) or not text:
        text = err.message
    return one_line(text)


def attempt_at(client: openai.AsyncOpenAI, path: str, timeout: object) -> Attempt:
    """A request to ``path`` of the client's server, under the adapter's ``timeout``, else
    the client's."""
    url = redact_url(f"{str(client.base_url).rstrip('/')}{path}")
    return Attempt(url, timeout if timeout is not None else client.timeout)


def _connection_failure(err: Exception, attempt: Attempt) -> str:
    """Which connection failure: none made (refused, unknown host), or one the server
    dropped before its reply was complete. The SDK wraps the HTTP library's exception: its
    kind is read from the cause."""
    return transport_failure(err.__cause__, attempt, fallback=str(err))
