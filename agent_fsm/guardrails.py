"""Guardrails: checks of what goes into a run and what comes out of it, decided by rows.

An input guardrail reads each user message as the run takes it in (OBSERVE), before any
model call or tool sees it; an output guardrail reads an answer that would end the run
(THINK), before the run ends with it. A guardrail is a function of the text, sync or async,
returning its verdict:

- ``True`` or ``None``: the text passes;
- ``False`` or ``Trip("why")``: the guardrail trips, and the run stops in ERROR
  ``guardrail_tripped`` by a row of its own (``input_guardrail_tripped`` in OBSERVE,
  ``output_guardrail_tripped`` in THINK), before anything else runs;
- ``Rewrite("what to change")`` (output guardrails): the answer goes back to the model with
  the instructions, like an answer that failed its output type, at most
  ``Limits.guardrail_rewrites`` times; after that, the guardrail trips.

A guardrail is user code, contained: one that raises, returns anything else, or takes longer
than ``Limits.tool_timeout_s`` trips (it fails closed: a check that cannot say yes says no).
Sync guardrails run in a worker thread, so a slow one never holds the event loop. Checks of
tool calls are the step hooks' (``StepHooks(before_tool=...)``).
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from agent_fsm.errors import ConfigError

__all__ = ["Guardrail", "GuardrailFunction", "Rewrite", "Trip", "Verdict", "guardrails_of"]


@dataclass(frozen=True, slots=True)
class Trip:
    """The guardrail trips: the run stops with ``guardrail_tripped``, and ``reason``."""

    reason: str = ""


@dataclass(frozen=True, slots=True)
class Rewrite:
    """An output guardrail asks the model to write its answer again, told ``instructions``
    (at most ``Limits.guardrail_rewrites`` times; then the guardrail trips)."""

    instructions: str


Verdict = bool | None | Trip | Rewrite
"""What a guardrail returns: True/None pass, False/Trip trip, Rewrite asks for a rewrite."""

GuardrailFunction = Callable[[str], Verdict | Awaitable[Verdict]]
"""A guardrail: the text in, a verdict out (sync or async)."""


@dataclass(frozen=True, slots=True)
class Guardrail:
    """A named guardrail; a plain function is wrapped in one, named after it.

    Raises:
        ConfigError: ``fn`` is not callable, or the name is empty.
    """

    fn: GuardrailFunction
    name: str = ""
    is_async: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise ConfigError(f"a guardrail must be callable, got {type(self.fn).__name__}")
        name = self.name or getattr(self.fn, "__name__", "")
        if not isinstance(name, str) or not name or name == "<lambda>":
            raise ConfigError("a guardrail needs a name: Guardrail(fn, name=...)")
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "is_async", inspect.iscoroutinefunction(self.fn))


def guardrails_of(given: GuardrailFunction | Guardrail | Sequence[object]) -> tuple[Guardrail, ...]:
    """The guardrails of ``Agent(input_guardrails=...)`` or ``output_guardrails``: each a
    ``Guardrail`` or a function (wrapped, named after it).

    Raises:
        ConfigError: one that is neither, or two with one name.
    """
    items: Sequence[object] = (given,) if isinstance(given, Guardrail) or callable(given) else given
    found: list[Guardrail] = []
    for item in items:
        if isinstance(item, Guardrail):
            found.append(item)
        elif callable(item):
            found.append(Guardrail(item))
        else:
            raise ConfigError(f"a guardrail must be a function or a Guardrail, got {item!r:.60}")
    names = [guard.name for guard in found]
    if len(set(names)) != len(names):
        raise ConfigError(f"two guardrails share a name: {names}")
    return tuple(found)
