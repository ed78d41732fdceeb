"""@tool: schemas from signatures, descriptions from docstrings, conversion of arguments, and
the definitions that must be refused."""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Callable
from enum import Enum
from typing import Annotated, Any, Literal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator
from pydantic import BaseModel, Field

from agent_fsm import ConfigError, Limits, Tool, tool
from agent_fsm.messages import ToolMessage
from agent_fsm.testing import call
from agent_fsm.tools.execution import execute
from agent_fsm.tools.tool import ToolRegistry


class Address(BaseModel):
    """A postal address."""

    street: str
    city: str = "Paris"


class Colour(Enum):
    RED = "red"
    BLUE = "blue"


def s_plain(city: str, days: int, ratio: float, flag: bool) -> None: ...
def s_defaults(city: str = "Oslo", days: int = 1) -> None: ...
def s_literal(unit: Literal["c", "f"] = "c") -> None: ...
def s_optional(note: str | None = None) -> None: ...
def s_list(tags: list[str], scores: dict[str, int]) -> None: ...
def s_nested(address: Address) -> None: ...
def s_nested_list(addresses: list[Address]) -> None: ...
def s_annotated(n: Annotated[int, Field(ge=1, le=10, description="How many.")]) -> None: ...
def s_enum(colour: Colour) -> None: ...
def s_date(day: datetime.date) -> None: ...
def s_any(anything: Any) -> None: ...
def s_none() -> None: ...


PROPS = {"type": "object", "additionalProperties": False}

SIGNATURES: list[tuple[Callable[..., Any], dict[str, Any], bool]] = [
    (
        s_plain,
        {
            "properties": {
                "city": {"type": "string"},
                "days": {"type": "integer"},
                "ratio": {"type": "number"},
                "flag": {"type": "boolean"},
            },
            "required": ["city", "days", "ratio", "flag"],
        },
        False,
    ),
    (
        s_defaults,
        {
            "properties": {
                "city": {"type": "string", "default": "Oslo"},
                "days": {"type": "integer", "default": 1},
            }
        },
        False,
    ),
    (
        s_literal,
        {"properties": {"unit": {"enum": ["c", "f"], "type": "string", "default": "c"}}},
        False,
    ),
    (
        s_optional,
        {
            "properties": {
                "note": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None}
            }
        },
        False,
    ),
    (
        s_list,
        {
            "properties": {
                "tags": {"type": "array", "items": {"type": "string"}},
                "scores": {"type": "object", "additionalProperties": {"type": "integer"}},
            },
            "required": ["tags", "scores"],
        },
        True,  # a nested int is converted by the model: JSON's 2.0 passes as an integer
    ),
    (
        s_nested,
        {
            "$defs": {
                "Address": {
                    "description": "A postal address.",
                    "type": "object",
                    "properties": {
                        "street": {"type": "string"},
                        "city": {"type": "string", "default": "Paris"},
                    },
                    "required": ["street"],
                }
            },
            "properties": {"address": {"$ref": "#/$defs/Address"}},
            "required": ["address"],
        },
        True,
    ),
    (
        s_annotated,
        {
            "properties": {
                "n": {"type": "integer", "minimum": 1, "maximum": 10, "description": "How many."}
            },
            "required": ["n"],
        },
        False,
    ),
    (
        s_enum,
        {
            "$defs": {"Colour": {"enum": ["red", "blue"], "type": "string"}},
            "properties": {"colour": {"$ref": "#/$defs/Colour"}},
            "required": ["colour"],
        },
        True,
    ),
    (
        s_date,
        {"properties": {"day": {"type": "string", "format": "date"}}, "required": ["day"]},
        True,
    ),
    (s_any, {"properties": {"anything": {}}, "required": ["anything"]}, False),
    (s_none, {"properties": {}}, False),
]


@pytest.mark.parametrize(
    ("fn", "expected", "converts"), SIGNATURES, ids=[s[0].__name__ for s in SIGNATURES]
)
def test_schema_for_signature(
    fn: Callable[..., Any], expected: dict[str, Any], converts: bool
) -> None:
    made = tool(fn)
    assert made.parameters == {**PROPS, **expected}
    Draft202012Validator.check_schema(made.parameters)
    assert (made.arguments_model is not None) is converts


def test_google_docstring_gives_summary_and_argument_descriptions() -> None:
    @tool
    def search(query: str, limit: int = 10) -> str:
        """Search the catalogue.

        Matches titles and authors.

        Args:
            query: words to look for,
                all of them.
            limit: most results to return.
        """
        return query

    assert search.description == "Search the catalogue."
    props = search.parameters["properties"]
    assert props["query"]["description"] == "words to look for, all of them."
    assert props["limit"] == {
        "type": "integer",
        "default": 10,
        "description": "most results to return.",
    }


def test_numpy_docstring() -> None:
    @tool
    def area(width: float, height: float) -> float:
        """Area of a rectangle.

        Parameters
        ----------
        width : float
            Width in metres.
        height : float
            Height in metres.
        """
        return width * height

    assert area.description == "Area of a rectangle."
    assert area.parameters["properties"]["width"]["description"] == "Width in metres."
    assert area.parameters["properties"]["height"]["description"] == "Height in metres."


def test_field_description_wins_over_the_docstring() -> None:
    @tool
    def pick(n: Annotated[int, Field(description="From the field.")]) -> int:
        """Pick.

        Args:
            n: from the docstring.
        """
        return n

    assert pick.parameters["properties"]["n"]["description"] == "From the field."


def test_no_docstring_uses_the_name_and_options_pass_through() -> None:
    async def quiet(x: int) -> int:
        return x

    made = tool(name="renamed", description="Explicit.", timeout_s=2.5, idempotent=True)(quiet)
    assert (made.name, made.description, made.timeout_s, made.idempotent) == (
        "renamed",
        "Explicit.",
        2.5,
        True,
    )
    assert made.is_async
    assert tool(quiet).description == "quiet"


def _answer(made: Tool, **arguments: Any) -> ToolMessage:
    registry = ToolRegistry([made])
    return asyncio.run(execute(registry.prepare(call(made.name, **arguments)), Limits())).result


def test_nested_model_arrives_as_an_instance() -> None:
    seen: list[object] = []

    @tool
    def mail(to: Address, when: datetime.date, colour: Colour = Colour.RED) -> str:
        """Send mail."""
        seen.extend([to, when, colour])
        return "sent"

    result = _answer(mail, to={"street": "Rue 1"}, when="2024-05-01")
    assert result.content == "sent"
    assert seen == [Address(street="Rue 1"), datetime.date(2024, 5, 1), Colour.RED]


def test_async_tool_with_plain_arguments_gets_json_values() -> None:
    @tool
    async def total(items: list[int], scale: float = 1.0) -> float:
        """Sum."""
        return sum(items) * scale

    # list[int] goes through the arguments model, which also makes scale the float it says
    assert _answer(total, items=[1, 2, 3], scale=2).content == "12.0"


def test_conversion_errors_name_the_argument_and_what_was_expected() -> None:
    @tool
    def when(day: datetime.date) -> str:
        """Day."""
        return str(day)

    result = _answer(when, day="2024-13-45")
    assert result.is_error
    lines = result.content.splitlines()
    assert lines[0] == "Invalid arguments for tool 'when':"
    assert lines[1].startswith("- at day: ")
    assert '(got "2024-13-45")' in lines[1]
    assert lines[-1] == "Call the tool again with arguments that match its schema."


def test_explicit_schema_is_used_as_given() -> None:
    schema = {
        "type": "object",
        "properties": {"q": {"type": "string", "minLength": 2}},
        "required": ["q"],
    }

    @tool(parameters=schema)
    def find(**kwargs: Any) -> str:
        """Find things."""
        return repr(kwargs)

    assert find.parameters == schema
    assert find.arguments_model is None
    assert _answer(find, q="ab").content == "{'q': 'ab'}"
    assert "- at q: 'a' is too short" in _answer(find, q="a").content
    with pytest.raises(ConfigError, match="tool 'bad': the schema is not valid JSON Schema"):
        tool(name="bad", parameters={"type": "object", "properties": 3})(find.fn)


def f_varargs(*items: str) -> None: ...
def f_kwargs(**options: str) -> None: ...
def f_posonly(a: int, /) -> None: ...
def f_unknown_type(x: NoSuchType) -> None: ...  # type: ignore[name-defined]  # noqa: F821
def f_callable(fn: Callable[[int], int]) -> None: ...


@pytest.mark.parametrize(
    ("fn", "message"),
    [
        (f_varargs, "cannot be described"),
        (f_kwargs, "cannot be described"),
        (f_posonly, "positional-only"),
        (f_unknown_type, "NoSuchType"),
        (f_callable, "PydanticInvalidForJsonSchema: .*CallableSchema$"),
    ],
)
def test_signatures_that_cannot_become_a_schema(fn: Callable[..., Any], message: str) -> None:
    with pytest.raises(ConfigError, match=f"tool '{fn.__name__}': cannot derive.*{message}"):
        tool(fn)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"timeout_s": 0}, "timeout_s must be a finite number of seconds > 0, got 0"),
        ({"timeout_s": float("inf")}, "timeout_s must be"),
        ({"timeout_s": "5"}, "timeout_s must be"),
        ({"max_output_chars": 0}, "max_output_chars must be an integer >= 1"),
        ({"max_retries": -1, "idempotent": True}, "max_retries must be an integer >= 0"),
        ({"max_retries": 2}, "max_retries needs idempotent=True"),
        ({"retry_on": (ValueError, "x")}, "retry_on must be a tuple of exception types"),
        ({"requires_approval": "yes"}, "requires_approval must be a bool or a predicate"),
        ({"sequential": 1}, "sequential must be a bool"),
    ],
)
def test_invalid_options_are_refused_naming_the_tool(options: dict[str, Any], message: str) -> None:
    def ok(x: int) -> int:
        return x

    with pytest.raises(ConfigError, match=f"tool 'ok': .*{message}"):
        tool(**options)(ok)


def test_bad_names_and_unknown_options() -> None:
    def fine() -> None: ...

    with pytest.raises(ConfigError, match="tool name 'has space' is invalid"):
        tool(name="has space")(fine)
    with pytest.raises(ConfigError, match=r"unknown option\(s\) \['timeout'\]"):
        tool(timeout=3)(fine)
    with pytest.raises(ConfigError, match="needs a function"):
        tool("not callable")  # type: ignore[arg-type]
    single = Tool("one", "d", {"type": "object"}, fine, retry_on=ValueError)  # type: ignore[arg-type]
    assert single.retry_on == (ValueError,)


_JSON_SCALARS = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=3)
_TYPES = st.sampled_from(["string", "integer", "number", "boolean", "null"])


@settings(max_examples=200, deadline=None)
@given(
    types=st.dictionaries(st.sampled_from("abcd"), _TYPES, max_size=4),
    required=st.lists(st.sampled_from("abcde"), max_size=3, unique=True),
    closed=st.booleans(),
    arguments=st.dictionaries(
        st.sampled_from("abcde"), _JSON_SCALARS | st.lists(_JSON_SCALARS, max_size=2), max_size=5
    ),
)
def test_the_fast_check_never_accepts_what_the_schema_rejects(
    types: dict[str, str], required: list[str], closed: bool, arguments: dict[str, Any]
) -> None:
    schema = {
        "type": "object",
        "properties": {name: {"type": kind, "description": "d"} for name, kind in types.items()},
        "required": required,
        "additionalProperties": not closed,
    }
    made = Tool("t", "d", schema, lambda **kw: "x")
    assert made.fast_check is not None
    if made.fast_check(arguments):
        assert made.validator.is_valid(arguments)
    elif all(not isinstance(v, float) for v in arguments.values()):
        assert not made.validator.is_valid(arguments)  # exact, floats aside (1.0 is an integer)


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {"a": {"type": "string", "minLength": 1}}},
        {"type": "object", "properties": {"a": {"type": ["string", "null"]}}},
        {"type": "object", "properties": {"a": {"$ref": "#/$defs/A"}}, "$defs": {"A": {}}},
        {"type": "object", "additionalProperties": {"type": "string"}},
    ],
)
def test_schemas_beyond_the_fast_check_use_the_full_validator(schema: dict[str, Any]) -> None:
    assert Tool("t", "d", schema, lambda **kw: "x").fast_check is None
