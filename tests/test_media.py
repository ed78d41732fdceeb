"""Images and files (issue 35, point 7): in user messages and tool results, through each
adapter's SDK to a server on 127.0.0.1, checked before anything is spent, counted by the
estimate, kept whole by the context policies, and stored and resumed byte for byte.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from pydantic import ValidationError

from agent_fsm import (
    Agent,
    ClearToolResults,
    ConfigError,
    FilePart,
    ImagePart,
    Limits,
    ResumeError,
    StopReason,
    ToolResult,
    tool,
)
from agent_fsm.compaction import render_conversation
from agent_fsm.content import MB, PartSupport, TextPart
from agent_fsm.durable.encoding import MESSAGE_ADAPTER, encode_message, encode_model
from agent_fsm.messages import (
    AssistantMessage,
    FinishReason,
    ModelResponse,
    ToolCall,
    ToolMessage,
    Usage,
    UserMessage,
    user_input,
)
from agent_fsm.models.anthropic_convert import ANTHROPIC_PARTS, to_anthropic_prompt
from agent_fsm.models.base import Model, ModelCallError
from agent_fsm.models.gemini_convert import GEMINI_PARTS, to_gemini_contents
from agent_fsm.models.openai_responses_convert import RESPONSES_PARTS, to_responses_input
from agent_fsm.models.parts import PartBudget
from agent_fsm.prompt import cleared_result
from agent_fsm.testing import ScriptedModel, assert_terminates, call, check_invariants, reply
from agent_fsm.testing.wire import WireServer
from agent_fsm.tokens import (
    FILE_PAGE_TOKENS,
    IMAGE_TOKENS,
    MESSAGE_OVERHEAD_TOKENS,
    estimate_message_tokens,
)
from agent_fsm.tools.results import readable_parts
from tests.provider_kits import WireKit, all_kits
from tests.provider_kits.base import FAKE_KEY, OverTheWire
from tests.stores import Opener

KITS = {kit.name: kit for kit in all_kits()}
PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(40))
PDF = (
    b"%PDF-1.4\n1 0 obj << /Type /Pages /Count 2 >> endobj\n"
    b"2 0 obj << /Type /Page >> endobj\n3 0 obj << /Type/Page >> endobj\n%%EOF"
)
USAGE = Usage(input_tokens=20, output_tokens=5, requests=1)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def calls(*pairs: tuple[str, str]) -> ModelResponse:
    wire = tuple(ToolCall(id=i, name=n, arguments="{}") for i, n in pairs)
    return ModelResponse(
        message=AssistantMessage(tool_calls=wire),
        finish_reason=FinishReason.TOOL_CALLS,
        usage=USAGE,
    )


def text(value: str) -> ModelResponse:
    return ModelResponse(message=AssistantMessage(content=value), usage=USAGE)


@tool
def snapshot() -> list[object]:
    """Take a picture of the screen."""
    return ["the screen:", ImagePart(data=PNG, media_type="image/png")]


INPUT: list[Any] = [
    "What is in these?",
    ImagePart(data=PNG, media_type="image/png"),
    ImagePart(url="https://example.test/cat.png"),
    FilePart(data=PDF, media_type="application/pdf", name="report.pdf"),
]

# What each provider must be sent for INPUT, and for snapshot's result, exactly as its SDK
# puts it on the wire (Gemini's SDK writes bytes as URL-safe base64).
EXPECTED_INPUT: dict[str, Any] = {
    "openai": {
        "role": "user",
        "content": [
            {"type": "text", "text": "What is in these?"},
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{b64(PNG)}"}},
            {"type": "image_url", "image_url": {"url": "https://example.test/cat.png"}},
            {
                "type": "file",
                "file": {
                    "file_data": f"data:application/pdf;base64,{b64(PDF)}",
                    "filename": "report.pdf",
                },
            },
        ],
    },
    "openai-responses": {
        "type": "message",
        "role": "user",
        "content": [
            {"type": "input_text", "text": "What is in these?"},
            {
                "type": "input_image",
                "image_url": f"data:image/png;base64,{b64(PNG)}",
                "detail": "auto",
            },
            {"type": "input_image", "image_url": "https://example.test/cat.png", "detail": "auto"},
            {
                "type": "input_file",
                "file_data": f"data:application/pdf;base64,{b64(PDF)}",
                "filename": "report.pdf",
            },
        ],
    },
    "anthropic": {
        "role": "user",
        "content": [
            {"type": "text", "text": "What is in these?"},
            {
                "type": "image",
                "source": {"type": "base64", "media_type": "image/png", "data": b64(PNG)},
            },
            {"type": "image", "source": {"type": "url", "url": "https://example.test/cat.png"}},
            {
                "type": "document",
                "source": {"type": "base64", "media_type": "application/pdf", "data": b64(PDF)},
                "title": "report.pdf",
            },
        ],
    },
    "gemini": {
        "role": "user",
        "parts": [
            {"text": "What is in these?"},
            {
                "inlineData": {
                    "data": base64.urlsafe_b64encode(PNG).decode(),
                    "mime_type": "image/png",
                }
            },
            {"fileData": {"file_uri": "https://example.test/cat.png", "mime_type": "image/png"}},
            {
                "inlineData": {
                    "data": base64.urlsafe_b64encode(PDF).decode(),
                    "mime_type": "application/pdf",
                }
            },
        ],
    },
}
EXPECTED_RESULT: dict[str, list[Any]] = {
    # A tool message takes text only: the image follows the results in a user message.
    "openai": [
        {
            "role": "tool",
            "tool_call_id": "call_1",
            "content": "the screen:\n\n[1 image(s) or file(s) follow in the next user message]",
        },
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Returned by the snapshot call call_1:"},
                {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{b64(PNG)}"}},
            ],
        },
    ],
    "openai-responses": [
        {
            "type": "function_call_output",
            "call_id": "call_1",
            "output": [
                {"type": "input_text", "text": "the screen:"},
                {
                    "type": "input_image",
                    "image_url": f"data:image/png;base64,{b64(PNG)}",
                    "detail": "auto",
                },
            ],
        }
    ],
    "anthropic": [
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "call_1",
                    "content": [
                        {"type": "text", "text": "the screen:"},
                        {
                            "type": "image",
                            "source": {
                                "type": "base64",
                                "media_type": "image/png",
                                "data": b64(PNG),
                            },
                        },
                    ],
                }
            ],
        }
    ],
    "gemini": [
        {
            "role": "user",
            "parts": [
                {
                    "functionResponse": {
                        "id": "call_1",
                        "name": "snapshot",
                        "response": {"output": "the screen:"},
                    }
                },
                {"text": "Returned by the snapshot call call_1:"},
                {
                    "inlineData": {
                        "data": base64.urlsafe_b64encode(PNG).decode(),
                        "mime_type": "image/png",
                    }
                },
            ],
        }
    ],
}


@contextlib.asynccontextmanager
async def served(kit: WireKit) -> AsyncIterator[tuple[WireServer, Model]]:
    """A server on 127.0.0.1 and the kit's adapter talking to it, closed after."""
    server = WireServer()
    async with server as url:
        model = kit.build(url, api_key=FAKE_KEY)
        try:
            yield server, model
        finally:
            await model.aclose()  # type: ignore[attr-defined]


def transcript_of(kit: WireKit, body: dict[str, Any]) -> list[Any]:
    """The messages of a request body, in the provider's form. Gemini's JSON takes a field
    in snake_case or camelCase alike, and google-genai has written ``mime_type`` and
    ``mimeType`` in different versions: its field names are compared in snake_case."""
    key = {"openai": "messages", "openai-responses": "input", "anthropic": "messages"}
    messages = list(body[key.get(kit.name, "contents")])
    return [_snake_keys(m) for m in messages] if kit.name == "gemini" else messages


def _snake_keys(value: Any) -> Any:
    """``value`` with the keys of its objects below the part level in snake_case (a part's
    own kind, ``inlineData``, stays as the SDK writes it in every version)."""
    if isinstance(value, list):
        return [_snake_keys(item) for item in value]
    if not isinstance(value, dict):
        return value
    return {
        key: {_snake(k): _snake_keys(v) for k, v in item.items()}
        if isinstance(item, dict) and key in ("inlineData", "fileData")
        else _snake_keys(item)
        for key, item in value.items()
    }


def _snake(name: str) -> str:
    return "".join("_" + c.lower() if c.isupper() else c for c in name)


@pytest.mark.parametrize("name", sorted(KITS))
async def test_parts_reach_each_provider_in_its_own_form(name: str) -> None:
    kit = KITS[name]
    async with served(kit) as (server, model):
        server.then(kit.reply(calls(("call_1", "snapshot"))), kit.reply(text("A cat.")))
        result = await Agent(model=model, tools=[snapshot]).run(INPUT)
    assert result.stop_reason is StopReason.FINAL_ANSWER, result.error
    first, second = (transcript_of(kit, server.body(i)) for i in (0, 1))
    assert first == [EXPECTED_INPUT[name]]
    assert second[0] == EXPECTED_INPUT[name]
    assert second[2:] == EXPECTED_RESULT[name]
    # the transcript keeps the parts as typed values, the tool's too
    assert result.messages[0] == UserMessage(content="What is in these?", parts=tuple(INPUT[1:]))
    answer = result.messages[2]
    assert isinstance(answer, ToolMessage)
    assert answer.content == "the screen:"
    assert answer.parts == (ImagePart(data=PNG, media_type="image/png"),)


@pytest.mark.parametrize(
    ("name", "given", "why"),
    [
        ("openai", FilePart(url="https://example.test/a.pdf"), "does not fetch files from URLs"),
        ("anthropic", ImagePart(data=PNG, media_type="image/bmp"), "of type 'image/bmp'"),
        ("anthropic", ImagePart(data=bytes(4 * MB), media_type="image/png"), "at most 5,242,880"),
        ("gemini", FilePart(data=b"x", media_type="application/zip"), "application/zip"),
        (
            "gemini",
            [ImagePart(data=bytes(6 * MB), media_type="image/png")] * 3,
            "at most 20,971,520 bytes of images and files in one request",
        ),
    ],
)
async def test_input_a_provider_cannot_take_is_refused_before_the_run(
    name: str, given: Any, why: str
) -> None:
    kit = KITS[name]
    async with served(kit) as (server, model):
        agent = Agent(model=model)
        with pytest.raises(ConfigError, match=why):
            await agent.run(["Look:", *(given if isinstance(given, list) else [given])])
    assert server.requests == []  # nothing was sent, nothing spent


@tool
def bitmap() -> ToolResult:
    """Render a bitmap."""
    return ToolResult("rendered", parts=[ImagePart(data=PNG, media_type="image/bmp")])


@pytest.mark.parametrize("name", sorted(KITS))
async def test_a_tool_result_a_provider_cannot_take_is_told_to_the_model_and_the_run_goes_on(
    name: str,
) -> None:
    """A tool's image the provider cannot read (a BMP: no provider here takes one) is not
    sent: the request would fail before it left, and so would every later one, a resume's
    too. The result says what the tool returned and why the model cannot see it, the run
    goes on, and the wire carries no image."""
    kit = KITS[name]
    async with served(kit) as (server, model):
        server.then(kit.reply(calls(("call_1", "bitmap"))), kit.reply(text("No picture, then.")))
        result = await Agent(model=model, tools=[bitmap]).run("Draw.")
    assert result.stop_reason is StopReason.FINAL_ANSWER, result.error
    assert len(server.requests) == 2
    answer = result.messages[2]
    assert isinstance(answer, ToolMessage)
    assert answer.tool_call_id == "call_1"
    assert answer.parts == ()
    assert answer.content.startswith("rendered\n[The tool returned an image (image/bmp, ")
    assert "'image/bmp'" in answer.content
    assert isinstance(answer.details, dict)
    assert answer.details["runtime"]["unreadable_parts"][0]["kind"] == "image"  # type: ignore[call-overload,index]
    sent = json.dumps(server.body(1))
    assert "cannot be shown" in sent
    assert b64(PNG) not in sent
    check_invariants(result, limits=Limits())


def _png_only(*, max_request_bytes: int) -> PartSupport:
    """A provider that reads PNG images of up to 100 bytes, by value only, and no files."""
    return PartSupport(
        provider="P",
        image_types=frozenset({"image/png"}),
        file_types=frozenset(),
        image_urls=False,
        file_urls=False,
        max_image_bytes=100,
        max_file_bytes=0,
        max_request_bytes=max_request_bytes,
        tool_results="",
    )


def test_readable_parts_keeps_what_the_provider_takes_and_notes_the_rest() -> None:
    support = _png_only(max_request_bytes=1000)
    good = ImagePart(data=bytes(10), media_type="image/png")
    results = [
        ToolMessage(tool_call_id="a", name="t", content="plain"),
        ToolMessage(
            tool_call_id="b",
            name="t",
            content="two",
            parts=(good, TextPart(text="x"), ImagePart(url="https://example.test/p.png")),
        ),
    ]
    plain = results[0]
    readable_parts(results, support)
    assert results[0] is plain  # nothing to do, nothing copied
    assert results[1].parts == (good, TextPart(text="x"))
    assert "(https://example.test/p.png)" in results[1].content
    assert "does not fetch images from URLs" in results[1].content


def test_a_request_s_parts_are_checked_one_by_one_and_in_total() -> None:
    support = _png_only(max_request_bytes=150)
    budget = PartBudget(support)
    budget.take(TextPart(text="x" * 10_000))  # text is not a part's size
    budget.take(ImagePart(data=bytes(60), media_type="image/png"))  # 80 as sent
    with pytest.raises(ModelCallError, match="at most 150 bytes") as caught:
        budget.take(ImagePart(data=bytes(60), media_type="image/png"))
    assert caught.value.transient is False
    with pytest.raises(ModelCallError, match="does not fetch images from URLs"):
        PartBudget(support).take(ImagePart(url="https://example.test/a.png"))
    PartBudget(None).take(ImagePart(data=bytes(10**6), media_type="image/tiff"))  # unchecked


# --------------------------------------------------------------------------- the types


def test_input_lists_become_one_user_message() -> None:
    image = ImagePart(data=PNG, media_type="image/png")
    assert user_input("plain") == "plain"
    assert user_input(["Look", image, "and this", TextPart(text="too")]) == UserMessage(
        content="Look", parts=(image, TextPart(text="and this"), TextPart(text="too"))
    )
    assert user_input([image, "what?"]) == UserMessage(
        content="", parts=(image, TextPart(text="what?"))
    )
    assert user_input(image) == UserMessage(content="", parts=(image,))
    assert user_input(["bad \ud83d"]) == UserMessage(content="bad \ufffd")
    # a part's text is cleaned as the part is made, wherever it is made (a tool's result too)
    assert user_input(["a", "b \ud83d"]).parts == (TextPart(text="b \ufffd"),)  # type: ignore[union-attr]
    named = FilePart(data=PDF, media_type="application/pdf", name="r\udcff.pdf")
    assert named.name == "r\ufffd.pdf"
    for bad in ([], [1], b"bytes", {"a": 1}, None):
        with pytest.raises(ConfigError, match=r"the input must be|an input list holds"):
            user_input(bad)


def test_a_part_has_exactly_one_source_and_a_media_type_for_its_bytes() -> None:
    with pytest.raises(ValidationError, match="exactly one of data"):
        ImagePart(data=PNG, url="https://example.test/a.png", media_type="image/png")
    with pytest.raises(ValidationError, match="exactly one of data"):
        FilePart(name="x.pdf")
    with pytest.raises(ValidationError, match="needs its media_type"):
        FilePart(data=PDF)
    with pytest.raises(ValidationError, match="image/"):
        ImagePart(data=PDF, media_type="application/pdf")


def test_parts_from_paths(tmp_path: Any) -> None:
    (tmp_path / "chart.png").write_bytes(PNG)
    (tmp_path / "report.pdf").write_bytes(PDF)
    (tmp_path / "blob").write_bytes(b"?")
    assert ImagePart.from_path(tmp_path / "chart.png") == ImagePart(
        data=PNG, media_type="image/png"
    )
    assert FilePart.from_path(tmp_path / "report.pdf") == FilePart(
        data=PDF, media_type="application/pdf", name="report.pdf"
    )
    with pytest.raises(ValueError, match="media type"):
        FilePart.from_path(tmp_path / "blob")


def test_parts_are_base64_in_json_and_read_back_from_it() -> None:
    message = ToolMessage(
        tool_call_id="c1",
        name="snapshot",
        content="",
        parts=(ImagePart(data=PNG, media_type="image/png"), FilePart(url="https://x.test/a")),
    )
    text_ = encode_message(message)
    assert json.loads(text_)["parts"][0]["data"] == b64(PNG)
    assert MESSAGE_ADAPTER.validate_json(text_) == message
    # a dict from JSON (history=, a checkpoint read as Python) reads base64 too
    assert MESSAGE_ADAPTER.validate_python(json.loads(text_)) == message
    # the tool journal keeps a result the same way: a replayed result has its parts
    assert ToolMessage.model_validate_json(encode_model(message)) == message
    # a text message is stored as it always was: no "parts" key
    assert "parts" not in json.loads(encode_message(UserMessage(content="hi")))


# --------------------------------------------------------------------------- the estimate


def test_an_image_counts_as_an_image_not_as_its_base64() -> None:
    small = ImagePart(data=PNG, media_type="image/png")
    large = ImagePart(data=bytes(400_000), media_type="image/png")  # 533,336 chars of base64
    by_url = ImagePart(url="https://example.test/cat.png")
    for image in (small, large, by_url):
        message = UserMessage(content="abcd", parts=(image,))
        assert estimate_message_tokens(message) == MESSAGE_OVERHEAD_TOKENS + 1 + IMAGE_TOKENS


def test_a_file_counts_by_its_pages_or_as_text() -> None:
    def cost(*parts: Any) -> int:
        return estimate_message_tokens(
            ToolMessage(tool_call_id="", name="t", content="", parts=parts)
        )

    pdf = FilePart(data=PDF, media_type="application/pdf")  # two pages, one page tree
    assert cost(pdf) == MESSAGE_OVERHEAD_TOKENS + 2 * FILE_PAGE_TOKENS
    assert cost(FilePart(data=b"x" * 400, media_type="text/plain")) == MESSAGE_OVERHEAD_TOKENS + 100
    assert cost(FilePart(url="https://x.test/a.pdf")) == MESSAGE_OVERHEAD_TOKENS + FILE_PAGE_TOKENS
    assert cost(TextPart(text="x" * 40)) == MESSAGE_OVERHEAD_TOKENS + 10


async def test_the_run_s_prompt_estimate_counts_the_parts() -> None:
    image = ImagePart(data=bytes(10**5), media_type="image/png")
    plain = await Agent(model=ScriptedModel(["fine"])).run("abcd")
    shown = await Agent(model=ScriptedModel(["fine"])).run(["abcd", image])
    assert shown.usage.estimated  # the scripted model reports no usage: the estimate counts
    assert shown.usage.input_tokens - plain.usage.input_tokens == IMAGE_TOKENS


# --------------------------------------------------------------------------- policies


def test_a_cleared_result_loses_its_parts_with_its_text() -> None:
    message = ToolMessage(
        tool_call_id="c1",
        name="snapshot",
        content="the screen:",
        parts=(ImagePart(data=PNG, media_type="image/png"),),
    )
    cleared = cleared_result(message)
    assert cleared.parts == ()
    assert "and its 1 other part(s) were cleared" in cleared.content
    assert estimate_message_tokens(cleared) < estimate_message_tokens(message)


@tool
def look(at: int) -> list[object]:
    """Look at one screen."""
    return [f"screen {at}:", ImagePart(data=PNG, media_type="image/png")]


async def test_clear_tool_results_clears_a_short_result_with_an_image() -> None:
    model = ScriptedModel(
        [
            reply("", call("look", at=1)),
            reply("", call("look", at=2)),
            reply("", call("look", at=3)),
            "ok",
        ]
    )
    agent = Agent(
        model=model,
        tools=[look],
        limits=Limits(context_window=2 * IMAGE_TOKENS + 1_000, reply_tokens=100),
        context_policy=[ClearToolResults(keep_last_turns=1, min_chars=1_000)],
    )
    result = await agent.run("Watch the screen.")
    assert result.status == "completed", result.error
    last = model.requests[-1].messages
    shown = [m for m in last if isinstance(m, ToolMessage)]
    assert [bool(m.parts) for m in shown] == [False, False, True]  # the older two cleared
    assert all(m.tool_call_id for m in shown)  # every call still answered


def test_a_summary_call_is_told_of_the_parts() -> None:
    lines = render_conversation(
        [
            UserMessage(
                content="Look",
                parts=(
                    ImagePart(data=PNG, media_type="image/png"),
                    FilePart(data=PDF, media_type="application/pdf", name="r.pdf"),
                    TextPart(text="closely"),
                ),
            )
        ],
        100,
    )
    assert lines == ["User: Look [an image] [a file: r.pdf] closely"]


# --------------------------------------------------------------------------- stores, resume


async def test_a_resumed_run_sends_the_same_parts(open_shared_store: Opener) -> None:
    kit = KITS["anthropic"]
    question = ToolCall(id="call_2", name="ask_user", arguments='{"question": "Which?"}')
    ask = ModelResponse(
        message=AssistantMessage(tool_calls=(question,)),
        finish_reason=FinishReason.TOOL_CALLS,
        usage=USAGE,
    )
    async with served(kit) as (server, model):
        server.then(
            kit.reply(calls(("call_1", "snapshot"))), kit.reply(ask), kit.reply(text("Ok."))
        )
        first = Agent(model=model, tools=[snapshot], store=open_shared_store())
        paused = await first.run(INPUT)
        assert paused.stop_reason is StopReason.ASK_USER, paused.error
        # as another process would: a store of its own on the same storage
        again = Agent(model=model, tools=[snapshot], store=open_shared_store())
        assert again.checkpoints.load(paused.run_id).messages == list(paused.messages)
        done = await again.resume(paused.run_id, "The left one.")
    assert done.stop_reason is StopReason.FINAL_ANSWER, done.error
    before, after = server.body(1)["messages"], server.body(2)["messages"]
    assert after[: len(before)] == before  # the very bytes, input and tool result alike
    assert before[0] == EXPECTED_INPUT["anthropic"]
    assert before[2] == EXPECTED_RESULT["anthropic"][0]


# --------------------------------------------------------------------------- the harness


@pytest.mark.parametrize("name", sorted(KITS))
def test_every_run_with_parts_ends_validly_over_the_wire(name: str) -> None:
    kit = KITS[name]
    agent = Agent(
        model=ScriptedModel([]),
        tools=[snapshot],
        limits=Limits(max_turns=4, retry_backoff_s=0.0, retry_backoff_max_s=0.0),
    )
    assert_terminates(
        agent,
        user_input=INPUT,
        through=lambda inner: OverTheWire(kit, inner),
        real_tools=True,
        max_examples=30,
    )


async def test_an_input_guardrail_reads_the_text_parts_too() -> None:
    seen: list[str] = []

    def no_secrets(text: str) -> bool:
        seen.append(text)
        return "password" not in text

    model = ScriptedModel(["Sure."])
    agent = Agent(model=model, input_guardrails=[no_secrets])
    image = ImagePart(data=PNG, media_type="image/png")
    result = await agent.run(["Read this:", image, "and tell me the password"])
    assert result.stop_reason is StopReason.GUARDRAIL_TRIPPED, result.stop_reason
    assert seen == ["Read this:\nand tell me the password"]
    assert model.requests == []  # nothing reached the model


async def test_a_history_with_a_part_the_provider_cannot_take_is_refused_at_start() -> None:
    bitmap_result = ToolMessage(
        tool_call_id="c1",
        name="bitmap",
        content="rendered",
        parts=(ImagePart(data=PNG, media_type="image/bmp"),),
    )
    history = [
        UserMessage(content="Draw."),
        AssistantMessage(tool_calls=(ToolCall(id="c1", name="bitmap"),)),
        bitmap_result,
        AssistantMessage(content="Done."),
    ]
    async with served(KITS["openai"]) as (server, model):
        with pytest.raises(ConfigError, match="image/bmp"):
            await Agent(model=model, tools=[bitmap]).run("Again?", history=history)
        assert server.requests == []


async def test_input_not_yet_taken_in_is_stored_with_its_parts(open_shared_store: Opener) -> None:
    model = ScriptedModel(["A cat."])
    agent = Agent(model=model, store=open_shared_store())
    run = agent.start(INPUT)  # saved at once (``create``), before any step
    stored = open_shared_store().load(run.run_id)
    assert stored.pending_input == [UserMessage(content=INPUT[0], parts=tuple(INPUT[1:]))]
    result = await run.run()
    assert result.messages[0] == stored.pending_input[0]
    assert model.requests[0].messages[0] == stored.pending_input[0]


def test_files_by_url_and_plain_text_in_each_form() -> None:
    by_url = FilePart(url="https://example.test/a.pdf")
    notes = FilePart(data="héllo".encode(), media_type="text/plain", name="notes.txt")
    message = UserMessage(content="", parts=(by_url, notes))
    _, items = to_responses_input(
        [UserMessage(content="", parts=(by_url,))], support=RESPONSES_PARTS
    )
    assert items[0]["content"] == [{"type": "input_file", "file_url": "https://example.test/a.pdf"}]
    with pytest.raises(ModelCallError, match="'text/plain'"):  # PDFs only
        to_responses_input([message], support=RESPONSES_PARTS)
    prompt = to_anthropic_prompt([message], support=ANTHROPIC_PARTS)
    assert prompt.messages[0]["content"] == [
        {"type": "document", "source": {"type": "url", "url": "https://example.test/a.pdf"}},
        {
            "type": "document",
            "source": {"type": "text", "media_type": "text/plain", "data": "héllo"},
            "title": "notes.txt",
        },
    ]
    request = to_gemini_contents([message], run_id="r", support=GEMINI_PARTS)
    assert request.contents[0]["parts"] == [
        {"file_data": {"file_uri": "https://example.test/a.pdf", "mime_type": "application/pdf"}},
        {"inline_data": {"mime_type": "text/plain", "data": "héllo".encode()}},
    ]
    unknown = UserMessage(content="", parts=(FilePart(url="gs://bucket/blob"),))
    with pytest.raises(ModelCallError, match="needs the media type"):
        to_gemini_contents([unknown], run_id="r", support=GEMINI_PARTS)


# --------------------------------------------------------------------------- answers after a pause


class _AnthropicLike(ScriptedModel):
    """A scripted model that says what Anthropic takes (``TakesParts``)."""

    @property
    def part_support(self) -> PartSupport:
        return ANTHROPIC_PARTS


async def test_an_ask_user_reply_can_carry_an_image() -> None:
    image = ImagePart(data=PNG, media_type="image/png")
    model = _AnthropicLike([reply("", call("ask_user", question="Which one?")), "That one."])
    agent = Agent(model=model, limits=Limits(max_turns=4))
    paused = await agent.run("Pick a picture.")
    assert paused.stop_reason is StopReason.ASK_USER
    result = await agent.resume(paused.run_id, ["This one:", image])
    assert result.stop_reason is StopReason.FINAL_ANSWER, result.error
    answer = model.requests[-1].messages[-1]
    assert answer == UserMessage(content="This one:", parts=(image,))
    check_invariants(result, limits=Limits(max_turns=4))


async def test_a_reply_the_provider_cannot_take_is_refused_and_loses_nothing() -> None:
    model = _AnthropicLike([reply("", call("ask_user", question="Which one?")), "Ok."])
    agent = Agent(model=model, limits=Limits(max_turns=4))
    paused = await agent.run("Pick a picture.")
    bmp = ImagePart(data=PNG, media_type="image/bmp")
    with pytest.raises(ResumeError, match="image/bmp"):
        await agent.resume(paused.run_id, ["This one:", bmp])
    with pytest.raises(ResumeError, match="reply: the input must be"):
        await agent.resume(paused.run_id, [])
    result = await agent.resume(paused.run_id, "The first.")  # the pause is still there
    assert result.stop_reason is StopReason.FINAL_ANSWER


async def test_a_run_can_be_steered_with_an_image() -> None:
    image = ImagePart(data=PNG, media_type="image/png")
    gate = asyncio.Event()

    @tool
    async def wait() -> str:
        """Wait."""
        await gate.wait()
        return "waited"

    model = _AnthropicLike([reply("", call("wait")), "Seen."])
    run = Agent(model=model, tools=[wait], limits=Limits(max_turns=4)).start("Go.")
    task = asyncio.create_task(run.run())
    for _ in range(1000):  # counts event-loop turns, not time: the tool is waiting by then
        if model.requests:
            break
        await asyncio.sleep(0)
    assert model.requests, "the run never called the model"
    await asyncio.sleep(0)
    with pytest.raises(ConfigError, match="image/bmp"):
        run.steer(["Look:", ImagePart(data=PNG, media_type="image/bmp")])
    run.steer(["Look:", image])
    gate.set()
    result = await task
    assert result.stop_reason is StopReason.FINAL_ANSWER, result.error
    assert model.requests[-1].messages[-1] == UserMessage(content="Look:", parts=(image,))
