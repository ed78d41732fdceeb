"""Token estimation for budget checks made before a model call, and its calibration.

The estimate is deliberately cheap (about four characters per token, plus a per-message
overhead, or a model's own tokenizer: ``TextCounter``) because it gates whether a call may
start. It is computed once per message as the message is appended, so the prompt estimate is
O(1) per turn.

A server counts differently: its chat template adds a fixed cost to every request (about 190
tokens on llama-server with Gemma 3), and its tokenizer counts the content at its own rate.
``Calibration`` learns both from the usage servers report, as ``fixed + per_content x
estimate``: the rate from a least-squares fit over the last ``CALIBRATION_PAIRS`` (estimate,
reported) pairs, the fixed part as the smallest that leaves none of them under-counted. One
ratio for everything (what this module did before) counts the template cost again in every
message, and stopped a run at 3,862 "tokens" for a prompt of 1,116.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from agent_fsm.content import FilePart, ImagePart, TextPart
from agent_fsm.messages import AssistantMessage, Message, ToolMessage, ToolSpec, UserMessage

__all__ = [
    "CALIBRATION_PAIRS",
    "FILE_PAGE_TOKENS",
    "IMAGE_TOKENS",
    "Calibration",
    "TextCounter",
    "calibrate",
    "estimate_message_tokens",
    "estimate_parts_tokens",
    "estimate_text_tokens",
    "estimate_tools_tokens",
]

TextCounter = Callable[[str], int]
"""Counts the tokens of a text: ``estimate_text_tokens``, or a model's exact tokenizer (a
model may offer one as its ``count_tokens`` method)."""

CHARS_PER_TOKEN = 4
MESSAGE_OVERHEAD_TOKENS = 4
"""Role markers and separators that chat formats add around every message."""


def estimate_text_tokens(text: str) -> int:
    """Estimated tokens in ``text`` (rounded up, never negative)."""
    return -(-len(text) // CHARS_PER_TOKEN)


def estimate_message_tokens(message: Message, count: TextCounter = estimate_text_tokens) -> int:
    """Estimated tokens one message adds to a prompt (``count`` counts its texts)."""
    tokens = MESSAGE_OVERHEAD_TOKENS + count(message.content)
    if isinstance(message, AssistantMessage):
        for call in message.tool_calls:
            tokens += MESSAGE_OVERHEAD_TOKENS + count(call.name + call.arguments)
    elif isinstance(message, ToolMessage):
        tokens += count(message.tool_call_id)
        if message.parts:
            tokens += estimate_parts_tokens(message.parts, count)
    elif isinstance(message, UserMessage) and message.parts:
        tokens += estimate_parts_tokens(message.parts, count)
    return tokens


IMAGE_TOKENS = 1_600
"""The estimate for one image, whatever its size: providers scale an image down before
they count it, and an image at the size they scale to costs about this much (Anthropic
counts width x height / 750, some 1,600 at its 1.15 megapixels; OpenAI at most 1,105 for
its high detail at 768 x 2,000; Gemini 258 per 768 x 768 tile). The estimate gates a call,
so it takes the high end. Its base64 text is never counted as prose: that would make a
100 KB screenshot 34,000 "tokens"."""

FILE_PAGE_TOKENS = 2_000
"""The estimate per page of a PDF (providers send each page as its text and as an image:
Anthropic says 1,500 to 3,000 tokens a page). A file of another type is counted as its text
when it is text (``text/*``, JSON), else as one page; a PDF given by URL, as one page."""


def estimate_parts_tokens(
    parts: tuple[TextPart | ImagePart | FilePart, ...], count: TextCounter = estimate_text_tokens
) -> int:
    """Estimated tokens of a message's parts (``IMAGE_TOKENS``, ``FILE_PAGE_TOKENS``)."""
    tokens = 0
    for part in parts:
        if isinstance(part, TextPart):
            tokens += count(part.text)
        elif isinstance(part, ImagePart):
            tokens += IMAGE_TOKENS
        else:
            tokens += _file_tokens(part, count)
    return tokens


def _file_tokens(part: FilePart, count: TextCounter) -> int:
    data, kind = part.data, part.guessed_media_type() or ""
    if data is None:
        return FILE_PAGE_TOKENS
    if kind.startswith("text/") or kind == "application/json":
        return count(data.decode(errors="replace"))
    if kind == "application/pdf":
        # Page objects: "/Type /Page" (not "/Pages", the page tree), spaced or not.
        pages = data.count(b"/Type /Page") + data.count(b"/Type/Page")
        pages -= data.count(b"/Type /Pages") + data.count(b"/Type/Pages")
        return FILE_PAGE_TOKENS * max(pages, 1)
    return FILE_PAGE_TOKENS


def estimate_tools_tokens(
    tools: Iterable[ToolSpec], count: TextCounter = estimate_text_tokens
) -> int:
    """Estimated tokens the tool definitions add to every request."""
    return sum(
        MESSAGE_OVERHEAD_TOKENS + count(spec.name + spec.description + json.dumps(spec.parameters))
        for spec in tools
    )


CALIBRATION_PAIRS = 8
"""How many recent (estimate, reported) pairs a calibration fits: enough to see past one odd
request, few enough that refitting once per reply costs nothing next to the reply."""

MIN_RATE, MAX_RATE = 0.2, 5.0
"""The bounds of a fitted per-content rate: a fit outside them is noise, not a tokenizer."""


@dataclass(slots=True, kw_only=True)
class Calibration:
    """How a server counts a prompt the engine estimated at ``x`` tokens:
    ``fixed + ceil(per_content * x)``.

    Learned (``learn``) from each reply's reported prompt tokens, and from a server that
    refused a prompt as longer than its context (a lower bound of its size). With one pair
    (or every pair of the same estimate) the gap is taken as fixed cost at the estimate's own
    rate; a prompt is then never counted below what the server said of a prompt of that size.
    Reading it is O(1): the guards scale an estimate on every turn.
    """

    pairs: list[tuple[int, int]] = field(default_factory=list)
    """The last ``CALIBRATION_PAIRS`` (estimate, reported) pairs, oldest first."""
    fixed: int = 0
    """Tokens a server adds to every request (its template, the tool preamble)."""
    per_content: float = 1.0
    """Tokens the server counts per estimated token of content."""

    def prompt(self, tokens: int) -> int:
        """A whole request estimated at ``tokens``, as the server would count it."""
        return self.fixed + self.content(tokens)

    def content(self, tokens: int) -> int:
        """Part of a request (a message, the tools) estimated at ``tokens``: no fixed cost."""
        if self.per_content == 1.0:
            return tokens
        return math.ceil(tokens * self.per_content - 1e-9)

    def learn(self, estimate: int, reported: int) -> None:
        """Take in one request the engine estimated at ``estimate`` tokens and the server
        counted at ``reported`` (or at least that many); pairs with a count that is not
        positive are no evidence and ignored."""
        if estimate <= 0 or reported <= 0:
            return
        pairs = self.pairs
        pairs.append((estimate, reported))
        if len(pairs) > CALIBRATION_PAIRS:
            del pairs[0]
        rate = self.per_content = _rate(pairs)
        # One pass, no generators: this runs on every reply of every run (issue 35's
        # "free when off": the per-turn cost in benchmarks/instructions.py).
        worst = -math.inf
        for x, y in pairs:
            gap = y - rate * x
            if gap > worst:
                worst = gap
        self.fixed = max(0, math.ceil(worst - 1e-9))


def _rate(pairs: list[tuple[int, int]]) -> float:
    """The least-squares slope of reported over estimated tokens, within the rate bounds;
    1.0 while the estimates do not differ (no slope can be told from one size). Summed in
    integers, in one pass: exact, whatever the sizes."""
    n = sx = sy = sxx = sxy = 0
    for x, y in pairs:
        n += 1
        sx += x
        sy += y
        sxx += x * x
        sxy += x * y
    spread = n * sxx - sx * sx  # n times the sum of squared deviations
    if spread < n:  # the deviations' squares sum to less than 1
        return 1.0
    slope = (n * sxy - sx * sy) / spread
    return min(max(slope, MIN_RATE), MAX_RATE)


def calibrate(tokens: int, calibration: Calibration) -> int:
    """``tokens``, the engine's estimate of a whole request, as the server would count it
    (``Calibration.prompt``)."""
    return calibration.prompt(tokens)
