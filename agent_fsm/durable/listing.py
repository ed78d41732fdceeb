"""How a store shows its runs: the summaries ``list_runs`` gives (``listed``, with the lease,
the stuck flag, the priority and a pending cancel), which states it keeps (``state_names``),
and the store's own name without credentials (``redacted``). ``durable.checkpoint``
re-exports them: a store of your own imports them from there."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import replace

from agent_fsm.durable.encoding import UNRECORDED_STOP, RunSummary, schema_problem, stop_column
from agent_fsm.errors import ConfigError
from agent_fsm.table import TERMINAL_STATES, StopReason

__all__ = ["listed", "redacted", "state_names", "stop_kept", "stop_names"]


def state_names(states: str | Iterable[str] | None) -> list[str] | None:
    """The state names ``list_runs(states=...)`` keeps: one state (an ``AgentState`` is a
    str, so it is one state, not its letters) or several, a custom state by its name; None
    keeps every run.

    Raises:
        ConfigError: a state that is not a str.
    """
    if states is None:
        return None
    chosen = [states] if isinstance(states, str) else list(states)
    for state in chosen:
        if not isinstance(state, str):
            raise ConfigError(f"list_runs(states=...) takes state names, got {state!r}")
    return [str(state) for state in chosen]


def stop_names(
    stop_reasons: StopReason | str | Iterable[StopReason | str | None] | None,
) -> list[str] | None:
    """The stop reasons ``list_runs(stop_reasons=...)`` keeps, as a store keeps them in a
    column (``encoding.stop_column``): each reason's value, and ``UNRECORDED_STOP`` for a
    None among them (the stopped runs whose checkpoint predates recorded stop reasons,
    which a caller judges by their ``last_row``). None (the argument) keeps every run.

    Raises:
        ConfigError: a value that names no ``StopReason``.
    """
    if stop_reasons is None:
        return None
    chosen = [stop_reasons] if isinstance(stop_reasons, str) else list(stop_reasons)
    values = []
    for reason in chosen:
        if reason is None:
            values.append(UNRECORDED_STOP)
            continue
        try:
            values.append(StopReason(reason).value)
        except ValueError:
            raise ConfigError(
                f"list_runs(stop_reasons=...) takes StopReason values, got {reason!r}"
            ) from None
    return list(dict.fromkeys(values))


def stop_kept(summary: RunSummary, stops: list[str]) -> bool:
    """Whether ``list_runs`` keeps ``summary`` for the ``stops`` that ``stop_names`` gave:
    for a store that filters in Python (``MemoryStore``)."""
    return stop_column(summary) in stops


def listed(
    summary: RunSummary,
    *,
    version: object,
    lease: tuple[object, object] | None,
    now: float,
    priority: object = 0,
    cancel_requested: object = None,
) -> RunSummary:
    """``summary`` as ``list_runs`` gives it, by the store's clock reading ``now``: flagged
    ``unreadable`` when this agent_fsm cannot read the run's schema ``version``
    (``encoding.schema_problem``), with the run's last ``lease`` (its holder and expiry;
    None for a run never leased), and ``stuck`` when that lease is not live and the run has
    not stopped; with its queue ``priority`` and pending ``cancel_requested``, for a store
    that keeps them (``durable.queue``). A value of the wrong type (a damaged row) is named
    in ``unreadable``, never raised."""
    problems = [summary.unreadable] if summary.unreadable else []
    problem = schema_problem(version)
    if problem is not None:
        problems.append(f"its checkpoint {problem}")
    holder, expires_at = lease if lease is not None else (None, None)
    if lease is not None and not (isinstance(holder, str) and _is_time(expires_at)):
        problems.append(f"its lease is unreadable: held by {holder!r} until {expires_at!r}"[:160])
        holder = expires_at = None
    if isinstance(priority, bool) or not isinstance(priority, int):
        problems.append(f"its priority is unreadable: {priority!r}"[:100])
        priority = 0
    if cancel_requested is not None and not isinstance(cancel_requested, str):
        problems.append(f"its cancel request is unreadable: {cancel_requested!r}"[:100])
        cancel_requested = None
    live = isinstance(expires_at, int | float) and expires_at > now
    return replace(
        summary,
        lease_holder=holder if isinstance(holder, str) else None,
        lease_expires_at=float(expires_at) if isinstance(expires_at, int | float) else None,
        lease_live=live,
        stuck=holder is not None
        and not live
        and not problems
        and summary.state not in TERMINAL_STATES,
        priority=priority,
        cancel_requested=cancel_requested,
        unreadable="; ".join(problems) or None,
    )


def _is_time(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


_URL_PASSWORD = re.compile(r"(://[^/\s:@]*:)([^/]*)@")
_PASSWORD_PARAMETER = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s&]*)", re.IGNORECASE)


def redacted(text: str, *, secrets_of: str | None = None) -> str:
    """``text`` (a store's file path, database URL or connection string, or a message about
    one) fit to be shown: a URL's password and any ``password=`` parameter replaced by
    ``***``; with ``secrets_of`` (the URL the message is about), that URL's passwords too
    wherever they appear (a driver's error may quote a piece of its URL). Stores and the CLI
    name stores through it, so credentials never reach a terminal or a log."""
    if secrets_of is not None:
        found = [m.group(2) for m in _URL_PASSWORD.finditer(secrets_of)]
        found += [m.group(2).strip("'") for m in _PASSWORD_PARAMETER.finditer(secrets_of)]
        for secret in sorted(filter(None, found), key=len, reverse=True):
            text = text.replace(secret, "***")
    return _PASSWORD_PARAMETER.sub(r"\1***", _URL_PASSWORD.sub(r"\1***@", text))
