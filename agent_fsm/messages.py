"""The provider-neutral transcript: messages, tool calls, tool results, usage, model replies.

Every model adapter converts to and from these types, so the engine, the guards and the
checkpoints never see a provider's wire format. All models are frozen: a transcript is an
append-only list of immutable messages, which is what makes a zero-copy view of it a valid
snapshot (see ``TranscriptView``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any, Literal, TypeVar, cast, overload

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from agent_fsm.constructors import quick_init
from agent_fsm.content import ContentPart, FilePart, ImagePart, TextPart, clean_text
from agent_fsm.errors import ConfigError
from agent_fsm.records import fields_set, give_fields_set

__all__ = [
    "AssistantMessage",
    "clean_json",
    "clean_message",
    "clean_text",
    "FinishReason",
    "Message",
    "ModelRequest",
    "ModelResponse",
    "OutputFormat",
    "ReplyDelta",
    "SystemMessage",
    "ToolCall",
    "ToolMessage",
    "ToolSpec",
    "ToolStatus",
    "TranscriptView",
    "Usage",
    "UserInput",
    "UserMessage",
    "user_input",
]

_FROZEN = ConfigDict(frozen=True, extra="forbid")


def _empty(parts: tuple[ContentPart, ...]) -> bool:
    return not parts


class ToolCall(BaseModel):
    """One tool call requested by the model."""

    model_config = _FROZEN

    id: str
    """Provider-assigned call id; the matching ToolMessage carries it as ``tool_call_id``."""
    name: str
    """The tool name exactly as the model wrote it (it may name no registered tool)."""
    arguments: str = "{}"
    """The arguments as the raw JSON text the model produced. Kept raw on purpose: text that is
    not JSON must reach the engine intact so it can be answered with an error result."""


class SystemMessage(BaseModel):
    """Instructions for the model."""

    model_config = _FROZEN

    role: Literal["system"] = "system"
    content: str


class UserMessage(BaseModel):
    """Input from the user (the task, an answer to ask_user, a follow-up)."""

    model_config = _FROZEN

    role: Literal["user"] = "user"
    content: str
    """The message's text (its leading text, when it has ``parts``)."""
    parts: tuple[ContentPart, ...] = Field(default=(), exclude_if=_empty)
    """What follows the text, in order: images, files, more text (``agent_fsm.content``).
    Left out of JSON when empty, so a text message is stored as it always was."""


class AssistantMessage(BaseModel):
    """One model reply: text, tool calls, or both."""

    model_config = _FROZEN

    role: Literal["assistant"] = "assistant"
    content: str = ""
    """Visible text of the reply; empty when the reply is only tool calls."""
    tool_calls: tuple[ToolCall, ...] = ()
    """Calls to run, in the order the model gave them."""
    provider_data: dict[str, JsonValue] | None = None
    """What the provider that wrote this reply needs back with it on later turns, keyed by
    the adapter's name: reasoning items, thinking blocks and their signatures, thought
    signatures. Opaque to the engine (checkpointed, never shown, never counted as text);
    an adapter reads only its own key, so a transcript can move between providers."""
    usage: Usage | None = None
    """What the model call that wrote this reply used, recorded by the engine in a run
    with a checkpoint store (so a stored run keeps each call's usage, as its step-through
    shows); None otherwise. Never sent to a model, never counted as text."""


class ToolStatus(StrEnum):
    """How a tool call was answered."""

    OK = "ok"
    ERROR = "error"
    SKIPPED = "skipped"


class ToolMessage(BaseModel):
    """The one result that answers one ToolCall."""

    model_config = _FROZEN

    role: Literal["tool"] = "tool"
    tool_call_id: str
    """The ``id`` of the ToolCall this answers."""
    name: str
    """The tool name of the call this answers."""
    content: str
    """What the model sees: the tool's output or an error it can act on."""
    parts: tuple[ContentPart, ...] = Field(default=(), exclude_if=_empty)
    """Images and files the tool returned (and text around them), after ``content``: how
    each provider takes them is its adapter's ``PartSupport.tool_results``."""
    status: ToolStatus = ToolStatus.OK
    """ok, error (the model should correct itself) or skipped (the call was never run)."""
    details: JsonValue = None
    """Structured data for people and events only; never sent to the model."""

    @property
    def is_error(self) -> bool:
        """True when the call failed (skipped calls are not errors)."""
        return self.status is ToolStatus.ERROR


Message = Annotated[
    SystemMessage | UserMessage | AssistantMessage | ToolMessage, Field(discriminator="role")
]
"""Any transcript message, discriminated by ``role``."""


class Usage(BaseModel):
    """Token counts of one or more model calls; adds up with ``+``."""

    model_config = _FROZEN

    input_tokens: int = Field(default=0, ge=0)
    """Prompt tokens."""
    output_tokens: int = Field(default=0, ge=0)
    """Completion tokens, reasoning included."""
    cached_tokens: int = Field(default=0, ge=0)
    """Part of ``input_tokens`` served from a prompt cache, where reported."""
    reasoning_tokens: int = Field(default=0, ge=0)
    """Part of ``output_tokens`` spent on hidden reasoning, where reported."""
    requests: int = Field(default=0, ge=0)
    """Model calls that produced a reply."""
    estimated: bool = False
    """True when any part of these counts is agent_fsm's estimate, not the server's report."""

    @property
    def total_tokens(self) -> int:
        """Input plus output tokens: what the token budget counts."""
        return self.input_tokens + self.output_tokens

    def __add__(self, other: Usage) -> Usage:
        # Validated like Usage(...), through the model's own validator: the keyword call
        # of BaseModel.__init__ cost a third of this, and it runs on every reply.
        total: Usage = Usage.__pydantic_validator__.validate_python(
            {
                "input_tokens": self.input_tokens + other.input_tokens,
                "output_tokens": self.output_tokens + other.output_tokens,
                "cached_tokens": self.cached_tokens + other.cached_tokens,
                "reasoning_tokens": self.reasoning_tokens + other.reasoning_tokens,
                "requests": self.requests + other.requests,
                "estimated": self.estimated or other.estimated,
            }
        )
        give_fields_set(total, _EVERY_USAGE_FIELD)  # a run keeps its sum as long as it lives
        return total


AssistantMessage.model_rebuild()  # its ``usage`` is a Usage, defined after it
_EVERY_USAGE_FIELD = fields_set(*Usage.model_fields)  # the fields ``Usage.__add__`` gives


class FinishReason(StrEnum):
    """Why the model stopped producing its reply (provider-neutral)."""

    STOP = "stop"
    TOOL_CALLS = "tool_calls"
    LENGTH = "length"
    CONTENT_FILTER = "content_filter"
    REFUSAL = "refusal"
    """The model declined the request (its text, if any, says why)."""


class ModelResponse(BaseModel):
    """What a Model returns for one request."""

    model_config = _FROZEN

    message: AssistantMessage
    """The reply, appended to the transcript as is."""
    finish_reason: FinishReason = FinishReason.STOP
    """The provider's finish reason. Tool calls in ``message`` decide over a ``stop`` reason."""
    usage: Usage | None = None
    """Reported usage; None when the server reported none (the engine then estimates)."""
    model_name: str | None = None
    """The model that answered, where the server says."""


class ToolSpec(BaseModel):
    """A tool as the model sees it: name, description and JSON Schema of its arguments."""

    model_config = _FROZEN

    name: str
    description: str
    parameters: dict[str, Any]


class TranscriptView(Sequence[Message]):
    """A read-only, zero-copy snapshot of the first ``length`` messages of a transcript.

    The transcript is append-only and its messages are frozen, so the prefix never changes:
    holding a view is as good as holding a copy, at O(1) cost per model call instead of O(n).
    """

    __slots__ = ("_length", "_messages")

    def __init__(self, messages: list[Message], length: int | None = None) -> None:
        self._messages = messages
        self._length = len(messages) if length is None else length

    def __len__(self) -> int:
        return self._length

    @overload
    def __getitem__(self, index: int) -> Message: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[Message]: ...
    def __getitem__(self, index: int | slice) -> Message | Sequence[Message]:
        if isinstance(index, slice):
            return self._messages[: self._length][index]
        if index < 0:
            index += self._length
        if not 0 <= index < self._length:
            raise IndexError("transcript index out of range")
        return self._messages[index]

    def __iter__(self) -> Iterator[Message]:
        messages = self._messages
        for i in range(self._length):
            yield messages[i]

    def __repr__(self) -> str:
        return f"TranscriptView({self._length} messages)"


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class ReplyDelta:
    """A fragment of a reply still being streamed.

    Exactly one of ``text`` or a tool-call fragment is set. Fragments of one tool call share
    ``tool_call_index``; ``tool_call_id`` and ``tool_name`` arrive with the call's first
    fragment, ``arguments`` pieces concatenate to the call's raw argument text.
    """

    text: str = ""
    tool_call_index: int | None = None
    tool_call_id: str | None = None
    tool_name: str | None = None
    arguments: str = ""


@dataclass(frozen=True, slots=True)
class OutputFormat:
    """The JSON Schema a reply's text must match, for models that constrain their output
    natively (``Agent(output_type=..., output_mode="native")``)."""

    name: str
    """A name for the schema (some providers require one)."""
    schema: dict[str, Any]
    """The JSON Schema of the reply (an object); adapters send a copy, adapted as needed."""


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class ModelRequest:
    """One request to a Model.

    A plain frozen dataclass rather than a pydantic model: ``messages`` is a zero-copy
    ``TranscriptView`` and validating it would copy the whole history on every turn.
    """

    messages: Sequence[Message]
    """The prompt, oldest first; a read-only snapshot."""
    tools: tuple[ToolSpec, ...]
    """Tools the model may call."""
    run_id: str
    """The run this request belongs to (for logs and correlation)."""
    turn: int
    """1-based number of the turn this call belongs to: a retry of a failed call keeps its
    turn's number (``RunState.turns`` counts turns, ``RunState.retries`` the retries), and a
    call aside from the turns (a last answer, a custom state's ``ask``) carries the number of
    the turn it follows."""
    on_delta: Callable[[ReplyDelta], None] | None = None
    """Where a streaming model reports fragments as they arrive; None when nobody listens.
    Must not raise into the model; the assembled ModelResponse is still returned at the end."""
    output: OutputFormat | None = None
    """The schema the reply's text must match (native typed output); None for free text."""
    tool_choice: str | None = None
    """What the model must do with ``tools``: ``"auto"``, ``"required"`` (call at least one),
    ``"none"`` (call none), or the name of one of them (call it), as a ``before_model`` hook
    chose (``agent_fsm.hooks``). None: the model's own settings decide. An adapter sends it
    only with tools, over any setting of its own for the same thing (``OpenAIChatModel``:
    its ``tool_choice``)."""


def _json_is_clean(value: JsonValue) -> bool:
    if isinstance(value, str):
        return clean_text(value) is value
    if isinstance(value, list):
        return all(_json_is_clean(item) for item in value)
    if isinstance(value, dict):
        return all(clean_text(key) is key and _json_is_clean(item) for key, item in value.items())
    return True


def clean_json(value: JsonValue) -> JsonValue:
    """A JSON value with every string cleaned by ``clean_text``."""
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, list):
        return [clean_json(item) for item in value]
    if isinstance(value, dict):
        return {clean_text(key): clean_json(item) for key, item in value.items()}
    return value


_M = TypeVar("_M", bound=SystemMessage | UserMessage | AssistantMessage | ToolMessage)


def clean_message(message: _M) -> _M:
    """``message`` with its text cleaned by ``clean_text``: the same object when it is clean
    (the common case costs one ``isascii`` per text)."""
    update: dict[str, Any] = {}
    content = clean_text(message.content)
    if content is not message.content:
        update["content"] = content
    if (
        isinstance(message, AssistantMessage)
        and message.tool_calls
        and not all(
            call.id.isascii() and call.name.isascii() and call.arguments.isascii()
            for call in message.tool_calls
        )
    ):
        update["tool_calls"] = tuple(
            call.model_copy(
                update={
                    "id": clean_text(call.id),
                    "name": clean_text(call.name),
                    "arguments": clean_text(call.arguments),
                }
            )
            for call in message.tool_calls
        )
    if isinstance(message, ToolMessage) and not (
        message.tool_call_id.isascii() and message.name.isascii()
    ):
        update["tool_call_id"] = clean_text(message.tool_call_id)
        update["name"] = clean_text(message.name)
    if (
        isinstance(message, ToolMessage)
        and message.details is not None
        and not _json_is_clean(message.details)
    ):
        update["details"] = clean_json(message.details)
    if (
        isinstance(message, AssistantMessage)
        and message.provider_data is not None
        and not _json_is_clean(message.provider_data)
    ):
        update["provider_data"] = clean_json(message.provider_data)
    if not update:
        return message
    return cast("_M", message.model_copy(update=update))


UserInput = str | UserMessage | Sequence[str | TextPart | ImagePart | FilePart]
"""What a run takes as the user's message: text; or a list of texts, images and files
(``["What is in this picture?", ImagePart.from_path("cat.png")]``); or a ``UserMessage``."""


def user_input(value: object) -> str | UserMessage:
    """The user's message as the transcript keeps it: a str stays a str (the text-only path
    builds nothing more); a list becomes one ``UserMessage``, its leading text the
    ``content`` and everything after it ``parts`` (a str among them a ``TextPart``). Text
    is cleaned (``clean_text``).

    Raises:
        ConfigError: anything else (a list of something other than texts and parts, an
            empty list).
    """
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, UserMessage):
        return clean_message(value)
    if isinstance(value, TextPart | ImagePart | FilePart):
        value = [value]
    if not isinstance(value, Sequence) or isinstance(value, bytes) or not value:
        raise ConfigError(
            "the input must be a str, a UserMessage, or a non-empty list of str, TextPart,"
            f" ImagePart and FilePart; got {type(value).__name__}"
        )
    items = list(value)
    content = ""
    first = items[0]
    if isinstance(first, str | TextPart):
        content = first if isinstance(first, str) else first.text
        items = items[1:]
    parts: list[TextPart | ImagePart | FilePart] = []
    for item in items:
        if isinstance(item, str):
            parts.append(TextPart(text=item))
        elif isinstance(item, TextPart | ImagePart | FilePart):
            parts.append(item)
        else:
            raise ConfigError(
                "an input list holds str, TextPart, ImagePart and FilePart, "
                f"got {type(item).__name__}"
            )
    return clean_message(UserMessage(content=content, parts=tuple(parts)))
