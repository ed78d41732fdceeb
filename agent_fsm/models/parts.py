"""What the adapters share about images and files: checking a request's parts against what
the provider takes, before it is sent (no SDK here; each adapter writes its own wire form).

Every adapter converts the parts of a request through one ``PartBudget``: each part is
checked as it is converted (media type, URL, size) and their sizes are added up, so a
request the provider would refuse fails here, as a permanent ``ModelCallError`` that names
the reason, and never as a 400 after the upload. The text-only path never builds one.
"""

from __future__ import annotations

import mimetypes

from agent_fsm.content import FilePart, ImagePart, PartSupport, TextPart, encoded_size
from agent_fsm.models.base import ModelCallError

__all__ = ["PartBudget", "file_name", "media_type_of"]


class PartBudget:
    """The parts of one request, checked as an adapter converts them."""

    __slots__ = ("_support", "_total")

    def __init__(self, support: PartSupport | None) -> None:
        self._support = support
        self._total = 0

    def take(self, part: TextPart | ImagePart | FilePart) -> None:
        """Check ``part`` and count its size against the request's.

        Raises:
            ModelCallError: not transient (the same request fails again), saying why.
        """
        support = self._support
        if support is None or isinstance(part, TextPart):
            return
        why = support.problem(part)
        if why is None:
            self._total += encoded_size(part)
            if self._total > support.max_request_bytes:
                why = (
                    f"{support.provider} takes at most {support.max_request_bytes:,} bytes of "
                    f"images and files in one request, this one has more "
                    f"({self._total:,} so far): send fewer or smaller ones"
                )
        if why is not None:
            raise ModelCallError(f"cannot send this request: {why}", transient=False)


def media_type_of(part: ImagePart | FilePart, provider: str) -> str:
    """The part's media type, or the one its URL's extension names (a provider that must be
    told it: Gemini).

    Raises:
        ModelCallError: not transient: neither says.
    """
    found = part.guessed_media_type()
    if found is None:
        raise ModelCallError(
            f"cannot send this request: {provider} needs the media type of {part.url!r}: "
            "give it as media_type=",
            transient=False,
        )
    return found


def file_name(part: FilePart, position: int) -> str:
    """The part's name, or one made up from its position and media type (OpenAI's APIs
    want a file name with inline file data)."""
    if part.name:
        return part.name
    extension = mimetypes.guess_extension(part.media_type or "") or ""
    return f"file{position}{extension}"
