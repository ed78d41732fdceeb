"""Context policies: how a prompt too big for the model's context window is made to fit.

When the next prompt (by the calibrated estimate) leaves less than ``Limits.reply_tokens`` of
``Limits.context_window``, the run enters COMPACT and offers the prompt to the agent's
policies in order, each seeing what the earlier ones did, until it fits in
``Limits.compact_to`` of that room (headroom for the next turns). A policy returns

- new ``ContextEdits`` (a later cut, more cleared tool results): the engine checks that they
  only grow and never separate a call from its result, and refuses them otherwise;
- a ``SummaryDue``: the next model call writes a summary of the messages before its
  ``through`` (a turn, paid from ``max_turns`` and the token budget like any other);
- None: it cannot help.

The transcript is never changed: policies decide what is *sent*. The system prompt and the
latest user input are always sent (``agent_fsm.prompt``). A policy that raises, or returns
something else, is reported in the ``ContextCompacted`` event and skipped; when nothing makes
the prompt fit, the run stops with ``context_window`` before the call.

Write your own by implementing ``ContextPolicy``: a ``name`` and ``shrink(context)``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from agent_fsm.content import ImagePart, TextPart
from agent_fsm.errors import ConfigError
from agent_fsm.messages import AssistantMessage, Message, ToolMessage, UserMessage
from agent_fsm.prompt import ContextEdits, SummaryDue, cleared_result, prompt_messages

if TYPE_CHECKING:
    from agent_fsm.models.base import Model

__all__ = [
    "ClearToolResults",
    "Context",
    "ContextPolicy",
    "KeepLastTurns",
    "SUMMARY_INSTRUCTIONS",
    "Summarize",
    "render_conversation",
]


@dataclass(frozen=True, slots=True)
class Context:
    """What a policy sees: the whole transcript, how the prompt differs from it so far, and
    how many tokens the prompt's messages may take."""

    messages: Sequence[Message]
    """The whole transcript, oldest first: a read-only view (``TranscriptView``), which a
    policy cannot change."""
    edits: ContextEdits
    """How the prompt differs from the transcript so far."""
    budget: int
    """Tokens the prompt's messages should take once shrunk: ``Limits.compact_to`` of the
    room the context window leaves once the reply's tokens are kept, less the tool
    definitions, by the calibrated estimate."""
    count: Callable[[Message], int]
    """The calibrated estimate of one message's tokens, as ``fits`` and the guards count."""

    def size(self, edits: ContextEdits | None = None) -> int:
        """Estimated tokens of the prompt's messages under ``edits`` (these edits if None)."""
        chosen = self.edits if edits is None else edits
        return sum(self.count(m) for m in prompt_messages(self.messages, chosen))

    def fits(self, edits: ContextEdits | None = None) -> bool:
        """Whether the prompt under ``edits`` (these edits if None) fits the budget."""
        return self.size(edits) <= self.budget

    @property
    def first(self) -> int:
        """Index of the first transcript message a cut may remove (after the system prompt,
        and after what is cut already)."""
        system = 1 if self.messages and self.messages[0].role == "system" else 0
        return max(self.edits.start, system)

    def turn_starts(self) -> list[int]:
        """Where each turn still sent begins: a turn is the user messages before a reply
        (if any), the reply, and its tool results; the user messages at the end are the turn
        to come. A cut at one of these indices never separates a call from its result."""
        messages = self.messages
        first = self.first
        starts: list[int] = []
        for index in range(first, len(messages)):
            message = messages[index]
            if isinstance(message, ToolMessage):
                continue
            if index > first and isinstance(messages[index - 1], UserMessage):
                continue
            starts.append(index)
        return starts


@runtime_checkable
class ContextPolicy(Protocol):
    """Shrinks a prompt that does not fit the context window."""

    @property
    def name(self) -> str:
        """How events, errors and the README name the policy."""
        ...

    def shrink(self, context: Context) -> ContextEdits | SummaryDue | None:
        """New edits (they may only grow ``context.edits``), a summary to be written, or
        None when this policy cannot help. Must not change ``context``."""
        ...


def _positive(what: str, value: int, least: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ConfigError(f"{what} must be an int >= {least}, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class KeepLastTurns:
    """Send only the last ``turns`` turns (and the system prompt, the latest user input and
    any summary): a window that only ever cuts between turns."""

    turns: int = 10

    def __post_init__(self) -> None:
        _positive("KeepLastTurns(turns)", self.turns)

    @property
    def name(self) -> str:
        return f"keep_last_turns({self.turns})"

    def shrink(self, context: Context) -> ContextEdits | None:
        starts = context.turn_starts()
        if len(starts) <= self.turns:
            return None
        return context.edits.cut(context.messages, starts[-self.turns])


@dataclass(frozen=True, slots=True)
class ClearToolResults:
    """Replace the output of old tool results with a short stub that says what was removed,
    oldest first and only as many as it takes to fit; the results of the last
    ``keep_last_turns`` turns, and outputs shorter than ``min_chars``, are left alone. The
    transcript keeps every result whole (``details`` too)."""

    keep_last_turns: int = 2
    min_chars: int = 200

    def __post_init__(self) -> None:
        _positive("ClearToolResults(keep_last_turns)", self.keep_last_turns, 0)
        _positive("ClearToolResults(min_chars)", self.min_chars, 0)

    @property
    def name(self) -> str:
        return "clear_tool_results"

    def shrink(self, context: Context) -> ContextEdits | None:
        messages, edits = context.messages, context.edits
        if self.keep_last_turns:
            starts = context.turn_starts()
            if len(starts) <= self.keep_last_turns:
                return None
            end = starts[-self.keep_last_turns]
        else:
            end = len(messages)
        excess = context.size() - context.budget
        chosen: list[int] = []
        for index in range(context.first, end):
            if excess <= 0:
                break
            message = messages[index]
            if (
                isinstance(message, ToolMessage)
                and index not in edits.cleared
                and (len(message.content) >= self.min_chars or message.parts)
            ):
                saved = context.count(message) - context.count(cleared_result(message))
                if saved > 0:  # a short output is smaller than its stub: leave it
                    chosen.append(index)
                    excess -= saved
        return edits.clear(*chosen) if chosen else None


SUMMARY_INSTRUCTIONS = (
    "You compress a conversation between a user and an AI agent that uses tools, so the "
    "agent can go on with its task in less space. Write a concise summary that keeps: the "
    "user's requests and constraints, decisions made, facts and numbers learned from tools, "
    "what was tried and failed, and what remains to be done. Write only the summary."
)


def render_conversation(messages: Sequence[Message], max_chars_per_message: int) -> list[str]:
    """The messages as plain text lines for a summary call, each cut to at most
    ``max_chars_per_message`` characters of content."""

    def cut(text: str) -> str:
        if len(text) <= max_chars_per_message:
            return text
        return f"{text[:max_chars_per_message]} […{len(text) - max_chars_per_message} more]"

    lines: list[str] = []
    for message in messages:
        if isinstance(message, AssistantMessage):
            calls = "".join(f" [calls {c.name}({cut(c.arguments)})]" for c in message.tool_calls)
            lines.append(f"Assistant: {cut(message.content)}{calls}")
        elif isinstance(message, ToolMessage):
            lines.append(f"Result of {message.name}: {cut(message.content)}{_noted(message)}")
        else:
            lines.append(f"{message.role.capitalize()}: {cut(message.content)}{_noted(message)}")
    return lines


def _noted(message: Message) -> str:
    """The parts of a message as a summary call is shown them: their text, and a marker
    for each image or file (a summary is text; the model writing it is not sent them)."""
    if not isinstance(message, UserMessage | ToolMessage) or not message.parts:
        return ""
    notes = []
    for part in message.parts:
        if isinstance(part, TextPart):
            notes.append(part.text)
        elif isinstance(part, ImagePart):
            notes.append("[an image]")
        else:
            notes.append(f"[a file: {part.name or part.media_type or part.url}]")
    return " " + " ".join(notes)


@dataclass(frozen=True, slots=True)
class Summarize:
    """Have a model summarise the early conversation (everything before the last
    ``keep_last_turns`` turns, and the earlier summary), and send the summary instead. The
    call is a turn: it counts against ``max_turns``, the token budget and the termination
    bound. ``model`` writes it (the agent's own model when None)."""

    keep_last_turns: int = 2
    model: Model | None = None
    instructions: str = SUMMARY_INSTRUCTIONS
    max_chars_per_message: int = 2_000
    """Longest content of one message as the summary call is shown it."""

    def __post_init__(self) -> None:
        _positive("Summarize(keep_last_turns)", self.keep_last_turns)
        _positive("Summarize(max_chars_per_message)", self.max_chars_per_message, 100)

    @property
    def name(self) -> str:
        return "summarize"

    def shrink(self, context: Context) -> SummaryDue | None:
        starts = context.turn_starts()
        if len(starts) <= self.keep_last_turns:
            return None
        through = starts[-self.keep_last_turns]
        sent = prompt_messages(list(context.messages[:through]), context.edits)
        lines = render_conversation(
            [m for m in sent if m.role != "system"], self.max_chars_per_message
        )
        # Keep the newest lines that fit the window beside the instructions.
        room = context.budget - context.count(UserMessage(content=self.instructions))
        kept: list[str] = []
        for line in reversed(lines):
            room -= context.count(UserMessage(content=line))
            if room < 0:
                kept.append("[…earlier messages omitted]")
                break
            kept.append(line)
        if len(kept) <= 1 and room < 0:
            return None  # not even the newest message fits: a summary cannot help
        return SummaryDue(
            policy=0,
            through=through,
            instructions=self.instructions,
            text="\n".join(reversed(kept)),
        )
