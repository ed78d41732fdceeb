"""Where agent_fsm's log lines go: the application decides, and a library is silent until it
does.

An application that configures structlog gets agent_fsm's events through its own structlog
configuration (``structlog.configure`` was called: ``structlog.is_configured()``). Otherwise
they go to the standard ``logging`` logger of the module that wrote them (``agent_fsm`` and
below), rendered as ``event key=value ...``. The ``agent_fsm`` logger carries a
``logging.NullHandler`` (added by the package's ``__init__``, so importing any part of
agent_fsm sets it), so an application that configured no logging at all sees nothing
(Python's last-resort handler would otherwise print every warning, ``tool_call_failed`` for an
ordinary tool error among them, on stderr); one that calls ``logging.basicConfig`` or adds a
handler of its own gets the lines. Structlog's unconfigured default, by contrast, prints every
level to stdout.

Decided when a logger is asked for (each run asks once), so configuring logging after
importing agent_fsm works.
"""

from __future__ import annotations

import logging
from typing import Any

import structlog

from agent_fsm.events import Event

__all__ = ["RunLogger", "get_logger", "is_enabled_for"]

_LOGFMT = structlog.processors.LogfmtRenderer(bool_as_flag=False)


def _render(logger: Any, method_name: str, event_dict: Any) -> tuple[tuple[str], dict[str, Any]]:
    """``event key=value ...`` as the message; a traceback is left to the handler
    (``exc_info``), which formats it as logging always does."""
    exc_info = event_dict.pop("exc_info", None)
    event = event_dict.pop("event", "")
    fields = _LOGFMT(logger, method_name, event_dict)
    return (f"{event} {fields}" if fields else str(event),), (
        {"exc_info": exc_info} if exc_info else {}
    )


_STDLIB_PROCESSORS: list[Any] = [structlog.stdlib.filter_by_level, _render]
"""For the standard-logging route: drop what the logger's level filters out before any work,
then render one line per event (the handler adds time and level)."""


def get_logger(name: str) -> Any:
    """A structlog logger for ``name``: the application's structlog configuration if it has
    one, else one writing to ``logging.getLogger(name)``."""
    if structlog.is_configured():
        return structlog.get_logger(name)
    return structlog.wrap_logger(
        logging.getLogger(name),
        processors=_STDLIB_PROCESSORS,
        wrapper_class=structlog.stdlib.BoundLogger,
    )


def is_enabled_for(log: Any, level: int) -> bool:
    """Whether ``log`` writes lines of ``level``; True when it cannot say (a custom wrapper
    class filters for itself)."""
    check = getattr(log, "is_enabled_for", None) or getattr(log, "isEnabledFor", None)
    if check is None:
        return True
    try:
        return bool(check(level))
    except Exception:
        return True


class RunLogger:
    """The logger of one run: ``get_logger(name)`` with the run's id bound, made when the run
    first writes a line (any attribute asked for is the bound logger's). Most runs write
    nothing until they end, and a bound structlog logger (its context, its wrapped logger)
    held by every live run: a run parked in its fifth tool call held 0.3 KiB less without it
    (``benchmarks/parked_runs.py``, tracemalloc). The logging configuration read is the one
    in force at that first line."""

    __slots__ = ("_bound", "_name", "_run_id")

    def __init__(self, name: str, run_id: str) -> None:
        self._name = name
        self._run_id = run_id
        self._bound: Any = None

    def handler_failed(self, event: Event) -> None:
        """An event handler of the run raised (``EventBus``'s ``on_handler_error``): log it,
        with its traceback; the run goes on. A method: the bus holds one bound method per
        run, where a ``partial`` held its arguments and two dicts too (issue 39)."""
        self.exception("event_handler_failed", kind=event.kind)

    def __getattr__(self, attribute: str) -> Any:
        bound = self._bound
        if bound is None:
            bound = self._bound = get_logger(self._name).bind(run_id=self._run_id)
        return getattr(bound, attribute)
