"""The pages, as HTML text: the runs list and one run (its path, step-through, transcript,
and the forms that steer it).

Everything shown is escaped (``html.escape``): a transcript is text a model or a tool wrote.
A page carries no inline script or style (the server's Content-Security-Policy forbids
them): its look and its live updates come from ``static/ui.css`` and ``static/ui.js``,
served by the app from the package. Each form that changes something is a POST carrying
the server's CSRF token.
"""

from __future__ import annotations

import html
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import quote, urlencode

from agent_fsm.messages import AssistantMessage, Message, ToolMessage, Usage
from agent_fsm.state import ControlKind, RunState
from agent_fsm.table import TERMINAL_STATES, AgentState, StopReason
from agent_fsm.ui.runs import PAUSES, RunRow
from agent_fsm.ui.steps import Step

__all__ = ["RunPage", "error_page", "run_page", "runs_page"]

_e = html.escape


def _layout(title: str, body: str, *, store: str) -> str:
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{_e(title)} · agent-fsm ui</title>"
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<link rel="stylesheet" href="/static/ui.css">'
        '<script src="/static/ui.js" defer></script></head><body>'
        f'<header><a class="home" href="/">agent-fsm ui</a>'
        f'<span class="store" title="the store">{_e(store)}</span></header>'
        f"<main>{body}</main></body></html>\n"
    )


def _when(timestamp: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(timestamp)) if timestamp else "-"


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, seconds = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {seconds} s"
    return f"{minutes // 60} h {minutes % 60} min"


def _options(name: str, chosen: str | None, values: Sequence[str], every: str) -> str:
    shown = [f'<option value=""{" selected" if not chosen else ""}>{_e(every)}</option>']
    for value in values:
        selected = " selected" if value == chosen else ""
        shown.append(f'<option value="{_e(value)}"{selected}>{_e(value)}</option>')
    return f'<select name="{name}" id="{name}">{"".join(shown)}</select>'


def runs_page(
    runs: Sequence[RunRow],
    *,
    store: str,
    states: Sequence[str],
    state: str | None,
    stop: str | None,
    more: bool,
) -> str:
    """The runs list: one row per run, paused ones marked, filters by state and stop."""
    stops = ["running", *(reason.value for reason in StopReason)]
    filters = (
        '<form class="filters" method="get" action="/">'
        f'<label for="state">state</label>{_options("state", state, states, "every state")}'
        f'<label for="stop">stop reason</label>{_options("stop", stop, stops, "every stop")}'
        '<button type="submit">filter</button></form>'
    )
    paused = sum(run.paused for run in runs)
    summary = f"{len(runs)}{'+' if more else ''} runs"
    if paused:
        summary += f', <strong class="paused-count">{paused} waiting for you</strong>'
    lines = []
    for run in runs:
        lease = "-"
        if run.lease_holder is not None:
            lease = f"{run.lease_holder} ({'live' if run.lease_live else 'expired'})"
        flags = ""
        if run.paused:
            flags += ' <span class="badge paused">waiting</span>'
        if run.stuck:
            flags += ' <span class="badge stuck">stuck</span>'
        if run.unreadable:
            flags += f' <span class="badge error" title="{_e(run.unreadable)}">unreadable</span>'
        lines.append(
            f'<tr class="run {run.tone}" data-run="{_e(run.run_id)}">'
            f'<td><a href="/runs/{quote(run.run_id, safe="")}">{_e(run.run_id)}</a>{flags}</td>'
            f"<td>{_e(run.state)}</td><td>{_e(run.stop or '-')}</td>"
            f'<td class="num">{run.turns}</td><td class="num">{run.tokens:,}</td>'
            f'<td class="num cost">{_cost(run.cost)}</td>'
            f'<td class="num">{_duration(run.duration_s)}</td>'
            f"<td>{_when(run.updated_at)}</td><td>{_e(lease)}</td></tr>"
        )
    table = (
        '<table class="runs"><thead><tr><th>run</th><th>state</th><th>stop reason</th>'
        "<th>turns</th><th>tokens</th><th>cost</th><th>duration</th><th>updated</th>"
        "<th>lease holder</th>"
        f"</tr></thead><tbody>{''.join(lines)}</tbody></table>"
        if runs
        else '<p class="empty">no runs</p>'
    )
    body = f'<h1>Runs</h1>{filters}<p class="summary">{summary}</p>{table}'
    return _layout("runs", body, store=store)


def _cost(cost: float | None) -> str:
    """A run's cost, in its prices' currency (``Pricing`` names none); blank when unknown."""
    if cost is None:
        return ""
    return f"{cost:,.4f}" if cost < 100 else f"{cost:,.2f}"


def error_page(message: str, *, store: str, status: str = "error") -> str:
    """A page that says what went wrong (an unknown run, a refused answer)."""
    body = f'<h1>{_e(status)}</h1><p class="problem">{_e(message)}</p><p><a href="/">runs</a></p>'
    return _layout(status, body, store=store)


@dataclass(frozen=True, slots=True)
class RunPage:
    """What the run page shows, gathered by the app."""

    state: RunState
    stop: StopReason | None
    tone: str
    svg: str
    steps: Sequence[tuple[int, str]]
    """(number, its line) for each transition."""
    step: Step | None
    csrf: str
    steerable: bool
    """An agent was given (``--agent``): answers and approvals can be sent."""
    live: bool
    """The run has not stopped: the page follows it."""
    abortable: bool
    problem: str | None = None
    step_usage: Usage | None = None
    """The usage of the model calls as of the chosen step, where the source keeps it (a
    stored run's replies, a trace file); None where it does not (an older checkpoint)."""


def _message(message: Message) -> str:
    role = message.role
    if isinstance(message, AssistantMessage):
        calls = "".join(
            f'<div class="call"><code>{_e(call.name)}</code> '
            f"<code>{_e(call.arguments)}</code></div>"
            for call in message.tool_calls
        )
        text = f"<p>{_e(message.content)}</p>" if message.content else ""
        return (
            f'<div class="message assistant"><span class="role">assistant</span>{text}{calls}</div>'
        )
    if isinstance(message, ToolMessage):
        return (
            f'<div class="message tool {message.status.value}"><span class="role">tool '
            f"{_e(message.name)} · {message.status.value}</span>"
            f"<pre>{_e(message.content)}</pre></div>"
        )
    return (
        f'<div class="message {role}"><span class="role">{role}</span>'
        f"<pre>{_e(message.content)}</pre></div>"
    )


def _fork_form(page: RunPage, step: Step) -> str:
    if not page.steerable or str(step.entry.dest) in TERMINAL_STATES:
        return ""
    run = quote(page.state.run_id, safe="")
    return (
        f'<form class="fork" method="post" action="/runs/{run}/fork">'
        f'<input type="hidden" name="csrf" value="{_e(page.csrf)}">'
        f'<input type="hidden" name="at" value="{step.number}">'
        '<button type="submit" id="fork">fork a new run from this step</button></form>'
    )


def _tokens(usage: Usage) -> str:
    return f"{usage.total_tokens:,} ({usage.input_tokens:,} in, {usage.output_tokens:,} out)" + (
        " estimated" if usage.estimated else ""
    )


def _usage_line(usage: Usage | None, step: Step) -> str:
    if usage is None:
        return (
            '<dt>tokens as of this step</dt><dd class="hint">this checkpoint keeps the run\'s '
            "total only (above): it was written before agent_fsm kept each call's usage</dd>"
        )
    own = (
        f'<dd id="step-own-tokens">{_tokens(step.own_usage)}</dd>'
        if step.own_usage is not None
        else '<dd id="step-own-tokens" class="hint">none: no model call in this step</dd>'
    )
    return (
        f'<dt>tokens as of this step</dt><dd id="step-tokens">{_tokens(usage)}</dd>'
        f"<dt>this step's model call</dt>{own}"
    )


def _step_detail(step: Step, fork: str = "", usage: str = "") -> str:
    entry = step.entry
    guards = " ∧ ".join(entry.guards) or "else"
    prompt = "".join(_message(m) for m in step.prompt) or '<p class="empty">no model call yet</p>'
    reply = _message(step.reply) if step.reply is not None else '<p class="empty">none yet</p>'
    results = "".join(_message(m) for m in step.results) or '<p class="empty">none</p>'
    return (
        f'<section class="step" id="step" data-step="{step.number}">'
        f"<h2>Step {step.number}: {_e(str(entry.source))} → {_e(str(entry.dest))}</h2>"
        f"<dl><dt>row</dt><dd><code>{_e(str(entry.trigger))}</code> "
        f"[{_e(guards)}] {_e(entry.label)}</dd>"
        f"<dt>state after</dt><dd>{_e(str(entry.dest))}</dd>"
        f"<dt>model calls as of this step</dt><dd>{step.model_calls}</dd>{usage}</dl>"
        f'<details class="prompt"><summary>prompt sent ({len(step.prompt)} messages)</summary>'
        f"{prompt}</details>"
        f'<h3>reply</h3><div class="reply">{reply}</div>'
        f'<h3>tool results</h3><div class="results">{results}</div>{fork}</section>'
    )


def _steer(page: RunPage) -> str:
    state = page.state
    control = state.control
    run = quote(state.run_id, safe="")
    csrf = f'<input type="hidden" name="csrf" value="{_e(page.csrf)}">'
    parts = []
    if page.problem:
        parts.append(f'<p class="problem" id="problem">{_e(page.problem)}</p>')
    paused = state.state is AgentState.DONE and control is not None and page.stop in PAUSES
    if paused and control is not None:
        pause = f'<input type="hidden" name="pause" value="{_e(control.pause)}">'
        if not page.steerable:
            parts.append(
                '<p class="hint">start the ui with <code>--agent MODULE:ATTR</code> to answer '
                "this run from here</p>"
            )
        elif control.waits_for is ControlKind.ASK_USER:
            parts.append(
                f'<form class="answer" method="post" action="/runs/{run}/answer">{csrf}{pause}'
                f'<label for="reply">{_e(control.text)}</label>'
                '<textarea id="reply" name="reply" rows="3" required></textarea>'
                '<button type="submit" id="send-reply">answer</button></form>'
            )
        elif control.waits_for is ControlKind.APPROVAL:
            calls = []
            for call in control.pending_calls:
                key = _e(call.id)
                arguments = _e(json.dumps(call.arguments, ensure_ascii=False, indent=1))
                calls.append(
                    f'<fieldset class="pending" data-call="{key}"><legend><code>{_e(call.name)}'
                    f"</code> ({key})</legend>"
                    f'<label><input type="radio" name="decision:{key}" value="allow" checked> '
                    "approve</label>"
                    f'<label><input type="radio" name="decision:{key}" value="deny"> deny</label>'
                    f'<label for="arguments:{key}">arguments (edit to approve others)</label>'
                    f'<textarea id="arguments:{key}" name="arguments:{key}" rows="4">'
                    f"{arguments}</textarea>"
                    f'<label for="reason:{key}">reason (shown to the model)</label>'
                    f'<input id="reason:{key}" name="reason:{key}" type="text"></fieldset>'
                )
            parts.append(
                f'<form class="approve" method="post" action="/runs/{run}/approve">{csrf}{pause}'
                f"<p>{_e(control.text)}</p>{''.join(calls)}"
                '<button type="submit" id="send-decisions">send decisions</button></form>'
            )
    if page.abortable:
        parts.append(
            f'<form class="abort" method="post" action="/runs/{run}/abort">{csrf}'
            '<button type="submit" id="abort">abort this run</button></form>'
        )
    if not parts:
        return ""
    return f'<section class="steer"><h2>Steer</h2>{"".join(parts)}</section>'


def run_page(page: RunPage, *, store: str) -> str:
    """One run: its path on the table, the steps, the chosen step, the transcript, the
    forms that steer it, and (while it runs) the live feed."""
    state = page.state
    run = quote(state.run_id, safe="")
    stop = page.stop.value if page.stop is not None else "-"
    facts = (
        f'<dl class="facts"><dt>state</dt><dd id="run-state">{_e(str(state.state))}</dd>'
        f'<dt>stop reason</dt><dd id="run-stop">{_e(stop)}</dd>'
        f"<dt>turns</dt><dd>{state.turns}</dd>"
        f"<dt>tokens</dt><dd>{state.usage.total_tokens:,} ({state.usage.input_tokens:,} in, "
        f"{state.usage.output_tokens:,} out)</dd></dl>"
    )
    if state.error:
        facts += f'<p class="problem">error: {_e(state.error)}</p>'
    chosen = page.step.number if page.step is not None else None
    steps = "".join(
        f"<li{' class=current' if number == chosen else ''}>"
        f'<a href="/runs/{run}?{urlencode({"step": number})}#step">{_e(line)}</a></li>'
        for number, line in page.steps
    )
    detail = ""
    if page.step is not None:
        usage = _usage_line(page.step_usage, page.step)
        detail = _step_detail(page.step, _fork_form(page, page.step), usage)
    transcript = "".join(_message(m) for m in state.messages)
    live = (
        f'<section class="live" id="live" data-events="/runs/{run}/events">'
        '<h2>Live</h2><ol id="live-events"></ol></section>'
        if page.live
        else ""
    )
    body = (
        f'<h1>Run <code>{_e(state.run_id)}</code> <span class="tone {page.tone}">'
        f"{_e(page.tone)}</span></h1>{facts}{_steer(page)}{live}"
        '<div class="columns"><div class="left">'
        f'<section class="diagram"><h2>Path</h2>{page.svg}</section>'
        f'<section class="steps"><h2>Steps</h2><ol>{steps}</ol></section>{detail}</div>'
        f'<section class="transcript right"><h2>Transcript</h2>{transcript}</section></div>'
    )
    return _layout(f"run {state.run_id}", body, store=store)


def step_line(number: int, source: str, dest: str, label: str, turn: int) -> str:
    """One step as the list shows it."""
    return f"{number}. turn {turn}: {source} → {dest} ({label})"
