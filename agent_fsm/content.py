"""Content beyond plain text: images and files in user messages and tool results.

A ``UserMessage`` or a ``ToolMessage`` keeps its leading text in ``content`` (what every
guard, policy and event reads) and anything after it in ``parts``, in order: more text
(``TextPart``), images (``ImagePart``) and files such as PDFs (``FilePart``), each as bytes
with their media type or as a URL. The parts belong to their message: a context policy
keeps or drops a message with all of its parts, never a part alone.

Bytes are kept as bytes in memory and written as base64 in JSON (checkpoints, trace files,
events), and read back from base64 in either form, so a transcript with images round-trips
through every store, and a resumed run sends the very bytes the first attempt sent.

What each provider can take differs (media types, URLs, sizes, where a part may go): an
adapter describes it with a ``PartSupport``, which ``Agent.start`` checks the user's input
against (``ConfigError``, before anything is spent) and the adapter checks every request
against before it is sent (a permanent ``ModelCallError``, never a server's 400 after the
upload).
"""

from __future__ import annotations

import base64
import mimetypes
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Self

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    model_validator,
)

__all__ = [
    "Binary",
    "ContentPart",
    "FilePart",
    "ImagePart",
    "MB",
    "PartSupport",
    "TextPart",
    "clean_text",
    "encoded_size",
]

_FROZEN = ConfigDict(frozen=True, extra="forbid")


def clean_text(text: str) -> str:
    """``text`` with every lone surrogate (``"\\ud83d"``, as ``os.listdir`` returns for a
    file name in another encoding) replaced by U+FFFD. Such text cannot be encoded as UTF-8,
    so it would break the next checkpoint, trace line or provider request; the transcript
    therefore never holds it. The same object when there is nothing to replace."""
    if text.isascii():
        return text
    try:
        text.encode()
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text


Clean = Annotated[str, AfterValidator(clean_text)]
"""Text cleaned as it enters a part (``clean_text``): a part is made clean, so the
transcript's cleaning (``messages.clean_message``) never has to look into its parts."""


def _from_base64(value: Any) -> Any:
    """Bytes as given; a str is base64 (how JSON carries bytes), in any mode of validation."""
    if isinstance(value, str):
        return base64.b64decode(value, validate=True)
    return value


def _to_base64(value: bytes) -> str:
    return base64.b64encode(value).decode("ascii")


Binary = Annotated[
    bytes,
    BeforeValidator(_from_base64),
    PlainSerializer(_to_base64, return_type=str, when_used="json"),
]
"""Bytes in memory, base64 text in JSON (and read back from base64 text)."""


class TextPart(BaseModel):
    """Text among other parts (text before any other part goes in the message's
    ``content``)."""

    model_config = _FROZEN

    type: Literal["text"] = "text"
    text: Clean


class _Media(BaseModel):
    """What images and files share: bytes with their media type, or a URL."""

    model_config = _FROZEN

    data: Binary | None = None
    """The content itself; base64 in JSON."""
    url: Clean | None = None
    """Where the provider fetches it from (``https://...``; ``gs://`` for Gemini)."""
    media_type: Clean | None = None
    """The IANA media type (``image/png``, ``application/pdf``): required with ``data``;
    with a ``url``, taken from the URL's extension where a provider needs it."""

    @model_validator(mode="after")
    def _one_source(self) -> Self:
        if (self.data is None) == (self.url is None):
            raise ValueError("give exactly one of data= (bytes) or url=")
        if self.data is not None and not self.media_type:
            raise ValueError("data= needs its media_type (e.g. 'image/png', 'application/pdf')")
        return self

    def guessed_media_type(self) -> str | None:
        """``media_type``, or the one the URL's extension names; None when neither says."""
        if self.media_type:
            return self.media_type
        assert self.url is not None
        return mimetypes.guess_type(self.url.split("?", 1)[0])[0]

    def data_url(self) -> str:
        """The bytes as a ``data:`` URL (the form OpenAI's APIs take inline content in)."""
        assert self.data is not None
        return f"data:{self.media_type};base64,{_to_base64(self.data)}"

    def base64(self) -> str:
        """The bytes as base64 text (the form Anthropic's API takes)."""
        assert self.data is not None
        return _to_base64(self.data)


class ImagePart(_Media):
    """An image: ``ImagePart(data=png_bytes, media_type="image/png")``,
    ``ImagePart(url="https://...")`` or ``ImagePart.from_path("chart.png")``."""

    type: Literal["image"] = "image"

    @model_validator(mode="after")
    def _an_image(self) -> Self:
        if self.media_type and not self.media_type.startswith("image/"):
            raise ValueError(f"an image's media_type is image/*, got {self.media_type!r}")
        return self

    @classmethod
    def from_path(cls, path: str | Path, media_type: str | None = None) -> ImagePart:
        """The image in the file at ``path``, its media type guessed from its name unless
        given. Raises ``ValueError`` when it cannot be guessed, ``OSError`` when the file
        cannot be read."""
        return cls(data=Path(path).read_bytes(), media_type=_media_type(path, media_type))


class FilePart(_Media):
    """A file (a PDF, a text file): ``FilePart(data=pdf_bytes,
    media_type="application/pdf", name="report.pdf")``, ``FilePart(url=...)`` or
    ``FilePart.from_path("report.pdf")``."""

    type: Literal["file"] = "file"
    name: Clean | None = None
    """The file's name, where the provider shows it to the model (OpenAI)."""

    @classmethod
    def from_path(cls, path: str | Path, media_type: str | None = None) -> FilePart:
        """The file at ``path``, named after it, its media type guessed from its name
        unless given (``ValueError`` when it cannot be)."""
        return cls(
            data=Path(path).read_bytes(),
            media_type=_media_type(path, media_type),
            name=Path(path).name,
        )


ContentPart = Annotated[TextPart | ImagePart | FilePart, Field(discriminator="type")]
"""One part of a message after its leading text, discriminated by ``type``."""


def _media_type(path: str | Path, given: str | None) -> str:
    found = given or mimetypes.guess_type(str(path))[0]
    if not found:
        raise ValueError(f"cannot tell the media type of {str(path)!r}: pass media_type=")
    return found


def encoded_size(part: TextPart | ImagePart | FilePart) -> int:
    """Bytes the part adds to a request as sent: base64 of its data (4 per 3 bytes), its
    URL's length, or its text's UTF-8 length."""
    if isinstance(part, TextPart):
        return len(part.text.encode())
    if part.data is not None:
        return 4 * -(-len(part.data) // 3)
    return len(part.url or "")


MB = 1024 * 1024
"""A megabyte as providers count one in their limits (2**20 bytes)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PartSupport:
    """What one provider takes of images and files, from its documentation: checked before
    a request is sent, so that a part it cannot take is refused here and not by the server
    after the upload. Sizes count the part as sent (``encoded_size``)."""

    provider: str
    """The provider's name, for messages."""
    image_types: frozenset[str]
    """Media types of images it reads."""
    file_types: frozenset[str]
    """Media types of files it reads."""
    image_urls: bool
    """Whether it fetches an image from a URL."""
    file_urls: bool
    """Whether it fetches a file from a URL."""
    max_image_bytes: int
    """The largest image it takes."""
    max_file_bytes: int
    """The largest file it takes."""
    max_request_bytes: int
    """The most all parts of one request may add up to."""
    tool_results: str
    """How images and files returned by a tool reach the model (for the docs)."""

    def problem(self, part: TextPart | ImagePart | FilePart) -> str | None:
        """Why this provider cannot take ``part``; None when it can."""
        if isinstance(part, TextPart):
            return None
        kind = "image" if isinstance(part, ImagePart) else "file"
        if part.url is not None:
            if not (self.image_urls if kind == "image" else self.file_urls):
                return (
                    f"{self.provider} does not fetch {kind}s from URLs ({part.url[:80]!r}): "
                    "pass the bytes (data=, or from_path)"
                )
            return None
        accepted = self.image_types if kind == "image" else self.file_types
        if part.media_type not in accepted:
            return (
                f"{self.provider} does not take {kind}s of type {part.media_type!r}; it takes "
                + ", ".join(sorted(accepted))
            )
        size = encoded_size(part)
        largest = self.max_image_bytes if kind == "image" else self.max_file_bytes
        if size > largest:
            return (
                f"{self.provider} takes {kind}s of at most {largest:,} bytes as sent (base64), "
                f"this one is {size:,}: make it smaller"
            )
        return None

    def request_problem(self, parts: Iterable[TextPart | ImagePart | FilePart]) -> str | None:
        """Why one request with all of ``parts`` cannot be sent; None when it can."""
        total = 0
        for part in parts:
            why = self.problem(part)
            if why is not None:
                return why
            if not isinstance(part, TextPart):
                total += encoded_size(part)
        if total > self.max_request_bytes:
            return (
                f"{self.provider} takes at most {self.max_request_bytes:,} bytes of images and "
                f"files in one request, this one has {total:,}: send fewer or smaller ones"
            )
        return None
