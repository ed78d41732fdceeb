"""Failures of user code (tools, models, hooks) as data: which exceptions are that code's
own, and how to describe one without trusting it.

The engine's promise is that nothing a tool or a model does escapes ``run()``. Python's
``except Exception`` is not enough for that: a tool may call ``sys.exit`` (``SystemExit``),
close a generator wrongly (``GeneratorExit``) or raise ``asyncio.CancelledError`` of its own
accord, and an exception's ``__str__`` may itself raise. ``is_own_failure`` draws the one line
the engine needs: a cancellation the run asked for, and a ``KeyboardInterrupt`` (the person at
the keyboard), pass; everything else is the code's failure.
"""

from __future__ import annotations

import asyncio
import traceback

from agent_fsm.messages import clean_text

__all__ = ["describe", "failure_traceback", "is_own_failure"]

_CAUSE = "\nThe above exception was the direct cause of the following exception:\n\n"
_CONTEXT = "\nDuring handling of the above exception, another exception occurred:\n\n"


def describe(exc: BaseException) -> str:
    """``Type: message`` (or ``Type``), its text cleaned of lone surrogates; never raises,
    whatever the exception's ``__str__`` does."""
    name = type(exc).__name__
    try:
        text = clean_text(str(exc))
    except BaseException as err:  # a broken __str__ must not break the report of a failure
        text = f"<its message could not be read: {type(err).__name__}>"
    return f"{name}: {text}" if text else name


def is_own_failure(exc: BaseException) -> bool:
    """Whether ``exc``, raised by code the current task awaited, is that code's failure
    rather than the run being stopped: every ``Exception``, ``SystemExit`` and
    ``GeneratorExit``, and a ``CancelledError`` nobody asked for (the task is not being
    cancelled). A ``KeyboardInterrupt`` belongs to the person at the keyboard and passes."""
    if isinstance(exc, Exception | SystemExit | GeneratorExit):
        return True
    if isinstance(exc, asyncio.CancelledError):
        task = asyncio.current_task()
        return task is not None and task.cancelling() == 0
    return False


def failure_traceback(exc: BaseException) -> str:
    """The traceback of ``exc`` as Python prints it, source lines and chained exceptions
    included, but without Python 3.11's column markers (``^^^^``). Finding those parses the
    source of every frame: ``traceback.format_exception`` took 0.4 ms for a tool failure,
    more than a whole turn of the engine. Never raises, whatever the exception's
    ``__str__`` does."""
    chain: list[tuple[BaseException, str]] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    link = ""
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        chain.append((current, link))
        if current.__cause__ is not None:
            current, link = current.__cause__, _CAUSE
        elif current.__context__ is not None and not current.__suppress_context__:
            current, link = current.__context__, _CONTEXT
        else:
            current = None
    parts: list[str] = []
    for failure, link in reversed(chain):
        frames = traceback.StackSummary.extract(traceback.walk_tb(failure.__traceback__))
        if frames:
            parts.append("Traceback (most recent call last):\n")
            parts.extend(frames.format())
        parts.extend(traceback.format_exception_only(failure))
        parts.append(link)
    return clean_text("".join(parts))
