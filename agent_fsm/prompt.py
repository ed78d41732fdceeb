"""What a model call is sent: the transcript, as the context policies have shrunk it.

The transcript (``RunState.messages``) is append-only and keeps everything, so the result,
the checkpoints and the audit trail lose nothing when the context is compacted. What the model
is sent is the transcript seen through ``ContextEdits``:

1. the system prompt (always);
2. the summary of the cut messages, when a policy had one written;
3. the latest user input, when it lies before the cut (it is never dropped);
4. every message from ``start`` on, each tool result listed in ``cleared`` replaced by a stub
   that says what was removed (the full result stays in the transcript, details and all).

``start`` is always a turn boundary (never a tool result), and a cleared result keeps its call
id, so a tool call is never separated from its result: the prompt is a valid transcript
whenever the transcript is. Edits only ever grow (``ContextEdits.check``).
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict

from agent_fsm.messages import (
    Message,
    SystemMessage,
    ToolMessage,
    TranscriptView,
    UserMessage,
)

__all__ = [
    "SUMMARY_HEADING",
    "ContextEdits",
    "SummaryDue",
    "cleared_result",
    "prompt_messages",
]

SUMMARY_HEADING = (
    "Summary of the earlier conversation (older messages were removed to fit the context window):\n"
)


class ContextEdits(BaseModel):
    """How the prompt differs from the transcript. Frozen; policies return new ones."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    start: int = 0
    """Index of the first transcript message sent after the system prompt (0 or 1: all)."""
    cleared: frozenset[int] = frozenset()
    """Indices of tool results sent as a short stub instead of their output."""
    summary: str | None = None
    """What the messages before ``start`` said, written by a model call (``Summarize``)."""
    latest_input: int | None = None
    """Index of the latest user message when it lies before ``start``: sent all the same."""

    @property
    def active(self) -> bool:
        """Whether the prompt differs from the transcript at all."""
        return self.start > 1 or bool(self.cleared) or self.summary is not None

    def cut(self, messages: Sequence[Message], start: int) -> ContextEdits:
        """These edits with the messages before ``start`` no longer sent (the latest user
        input excepted). ``start`` must be a turn boundary: a message that is not a tool
        result, or the end of the transcript."""
        latest = self.latest_input
        for index in range(len(messages) - 1, -1, -1):
            if isinstance(messages[index], UserMessage):
                latest = index if index < start else None
                break
        cleared = frozenset(i for i in self.cleared if i >= start)
        return self.model_copy(update={"start": start, "latest_input": latest, "cleared": cleared})

    def clear(self, *indices: int) -> ContextEdits:
        """These edits with the tool results at ``indices`` sent as stubs."""
        return self.model_copy(update={"cleared": self.cleared | frozenset(indices)})

    def check(self, messages: Sequence[Message], before: ContextEdits) -> str | None:
        """Why these edits cannot follow ``before`` on ``messages``, or None when they can.

        Edits only grow: ``start`` never moves back, a cleared result is never restored, a
        summary is never removed, and every index names what it must."""
        if not 0 <= self.start <= len(messages):
            return f"start {self.start} is outside the transcript of {len(messages)} messages"
        if self.start < before.start:
            return f"start {self.start} moves back from {before.start}"
        if self.start < len(messages) and isinstance(messages[self.start], ToolMessage):
            return f"start {self.start} is a tool result: the cut would separate it from its call"
        for index in sorted(self.cleared):
            if not (0 <= index < len(messages) and isinstance(messages[index], ToolMessage)):
                return f"cleared index {index} is not a tool result"
        if not self.cleared >= {i for i in before.cleared if i >= self.start}:
            return "a cleared tool result is restored"
        if before.summary is not None and self.summary is None:
            return "the summary is dropped"
        latest = self.latest_input
        if latest is not None and not (
            0 <= latest < len(messages) and isinstance(messages[latest], UserMessage)
        ):
            return f"latest_input {latest} is not a user message"
        return self._drops_latest_input(messages)

    def _drops_latest_input(self, messages: Sequence[Message]) -> str | None:
        """Why the latest user input would not be sent, or None: it is always sent (step 3 of
        the module docstring), so when it lies before ``start`` it must be ``latest_input``."""
        for index in range(len(messages) - 1, -1, -1):
            if isinstance(messages[index], UserMessage):
                if index < self.start and self.latest_input != index:
                    return (
                        f"start {self.start} cuts the latest user input (message {index}), "
                        "which latest_input does not name: it would not be sent"
                    )
                return None
        return None


class SummaryDue(BaseModel):
    """A summary a context policy asked for: the next model call writes it (COMPACT's
    ``summarise`` row into THINK), and the messages before ``through`` are then no longer
    sent. Kept in the run state, so a run that crashes before the call makes it on resume."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    policy: int
    """Index of the asking policy among the agent's (its model, if it has one, writes it)."""
    through: int
    """The new ``ContextEdits.start``: the summary replaces the messages before it."""
    instructions: str
    """The system prompt of the summary call."""
    text: str
    """The conversation to summarise, as text (the earlier summary first, if any)."""


def cleared_result(message: ToolMessage) -> ToolMessage:
    """The stub sent for a cleared tool result: it says what was removed, keeps the call id
    (so the call stays answered) and the details (for people; they are never sent)."""
    stub = (
        f"[The output of this {message.name} call ({len(message.content)} characters) was "
        "cleared from the context to save space. Call the tool again if you need it.]"
    )
    if message.parts:  # its images and files go with it: a part never outlives its text
        stub = stub.replace(" was ", f" and its {len(message.parts)} other part(s) were ", 1)
        return message.model_copy(update={"content": stub, "parts": ()})
    return message.model_copy(update={"content": stub})


def prompt_messages(messages: Sequence[Message], edits: ContextEdits) -> Sequence[Message]:
    """The messages a model call is sent (see the module docstring). The transcript itself,
    as a zero-copy view of a list, while no policy has edited it."""
    if not edits.active:
        return TranscriptView(messages) if isinstance(messages, list) else messages
    sent: list[Message] = []
    first = 0
    if messages and isinstance(messages[0], SystemMessage):
        sent.append(messages[0])
        first = 1
    if edits.summary is not None:
        sent.append(UserMessage(content=SUMMARY_HEADING + edits.summary))
    latest = edits.latest_input
    if latest is not None and first <= latest < edits.start:
        sent.append(messages[latest])
    cleared = edits.cleared
    for index in range(max(edits.start, first), len(messages)):
        message = messages[index]
        if index in cleared and isinstance(message, ToolMessage):
            message = cleared_result(message)
        sent.append(message)
    return sent
