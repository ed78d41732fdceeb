"""The web application: Starlette routes over a store, an optional agent to steer with.

``create_app(store, ...)`` serves:

- ``GET /``: the runs list (``?state=``, ``?stop=``, ``?limit=``);
- ``GET /runs/{id}``: one run, its path, a step (``?step=N``), its transcript, its forms;
- ``GET /runs/{id}/events``: the run as AG-UI events over Server-Sent Events: the engine's
  typed events while this server drives the run (``live``), else what its checkpoints show
  as they change (the run driven elsewhere: a worker, another process), until it stops;
- ``POST /runs/{id}/answer``, ``/approve``, ``/abort``, ``/fork``: steering (an answer,
  approvals and a fork need ``agent``; abort works for a run this server drives, or
  through a store that takes cancel requests);
- ``POST /agui``: AG-UI's ``RunAgentInput`` (JSON): starts the thread's run or resumes it
  with the answer (``agui_input``), and streams the drive as AG-UI events over SSE; it
  needs ``agent``, and the CSRF token in ``X-CSRF-Token`` unless the ui has a token;
- ``GET /static/{name}``: the page's stylesheet and script, from the package.

The run the ui resumes is driven in the server's event loop, by ``agent`` with the ui's
store. Every request passes ``security.Guard``; every POST checks the CSRF token (a JSON
POST: or the ui's token) and its ``Origin``.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from importlib.resources import files
from typing import Any
from urllib.parse import parse_qsl, quote

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Route

from agent_fsm.agent import Agent
from agent_fsm.diagrams import edge_counts
from agent_fsm.durable.checkpoint import CheckpointStore
from agent_fsm.durable.leases import check_id
from agent_fsm.durable.queue import RunCancels
from agent_fsm.errors import AgentFSMError, DiagramError, ResumeError
from agent_fsm.messages import Usage
from agent_fsm.state import Approval, ControlKind, RunState
from agent_fsm.table import TABLE, TERMINAL_STATES, Row, StopReason
from agent_fsm.ui.agui_input import InputError, Start, plan, read_input
from agent_fsm.ui.layout import draw_path, tone_of
from agent_fsm.ui.live import LiveRuns
from agent_fsm.ui.pages import RunPage, error_page, run_page, runs_page, step_line
from agent_fsm.ui.recorded import TraceRuns
from agent_fsm.ui.runs import PAUSES, RunSource, run_rows
from agent_fsm.ui.security import Guard, same_origin, tokens_match
from agent_fsm.ui.steps import Step, step_at, trace_of
from agent_fsm.ui.streams import driven, followed

__all__ = ["create_app"]

_STATIC = {"ui.css": "text/css", "ui.js": "text/javascript"}
_MAX_FORM = 1_000_000


class _Ui:
    """What the routes share."""

    def __init__(
        self,
        store: RunSource,
        store_name: str,
        agent: Agent | None,
        csrf: str,
    ) -> None:
        self.store = store
        self.store_name = store_name
        self.live = LiveRuns()
        self.agent = agent.subscribe(self.live.publish) if agent is not None else None
        self.rows: tuple[Row, ...] = agent.machine.rows if agent is not None else TABLE
        self.csrf = csrf
        self.token_guarded = False
        """Every request carries the ui's token (``--token``): a JSON POST needs no CSRF
        token then."""
        self.static = {
            name: (files("agent_fsm.ui") / "static" / name).read_bytes() for name in _STATIC
        }

    def states(self) -> list[str]:
        return list(dict.fromkeys(str(s) for row in self.rows for s in (row.source, row.dest)))

    def stop(self, state: RunState) -> StopReason | None:
        if state.state not in TERMINAL_STATES:
            return None
        if state.stop_reason is not None:
            return state.stop_reason
        return self.rows[state.trace[-1][0]].stop_reason if state.trace else None


def _ui(request: Request) -> _Ui:
    found: _Ui = request.app.state.ui
    return found


async def _runs(request: Request) -> Response:
    ui = _ui(request)
    query = request.query_params
    state = query.get("state") or None
    stop = query.get("stop") or None
    try:
        limit = min(max(int(query.get("limit", "200")), 1), 10_000)
    except ValueError:
        limit = 200
    # in a thread: a long listing must not stall the runs this server drives
    runs, more = await asyncio.to_thread(
        run_rows, ui.store, ui.rows, state=state, stop=stop, limit=limit
    )
    page = runs_page(
        runs, store=ui.store_name, states=ui.states(), state=state, stop=stop, more=more
    )
    return HTMLResponse(page)


def _load(ui: _Ui, run_id: str) -> RunState | Response:
    """The run, or the page that says why it cannot be shown: an unknown run, or one whose
    trace names rows this table does not have (made with another table)."""
    try:
        state = ui.store.load(run_id)
    except AgentFSMError as exc:
        return HTMLResponse(
            error_page(str(exc), store=ui.store_name, status="no such run"), status_code=404
        )
    if any(not 0 <= index < len(ui.rows) for index, _ in state.trace):
        problem = (
            f"run {run_id} was made with another table than this one (its trace names rows "
            "it does not have): start the ui with --agent MODULE:ATTR, the agent that made it"
        )
        return HTMLResponse(
            error_page(problem, store=ui.store_name, status="another table"), status_code=409
        )
    return state


def _page(ui: _Ui, state: RunState, step: int | None, problem: str | None = None) -> str:
    stop = ui.stop(state)
    tone = tone_of(str(state.state), stop in PAUSES)
    trace = trace_of(state, ui.rows)
    chosen = step_at(state, ui.rows, step if step is not None else len(trace)) if trace else None
    try:
        counts = edge_counts(ui.rows, trace)
        drawing = draw_path(
            ui.rows,
            counts,
            stopped=str(state.state),
            tone=tone,
            current_row=chosen.row if chosen is not None and step is not None else None,
            current_state=str(chosen.entry.dest) if chosen is not None and step else None,
        )
        svg = drawing.svg
    except DiagramError as exc:
        svg = f'<p class="problem">{exc}</p>'
    # a run the ui was just told to go on may not have saved yet: it is followed all the same
    running = state.state not in TERMINAL_STATES or ui.live.driving(state.run_id)
    page = RunPage(
        state=state,
        stop=stop,
        tone=tone,
        svg=svg,
        steps=[
            (n, step_line(n, str(e.source), str(e.dest), e.label, e.turn))
            for n, e in enumerate(trace, start=1)
        ],
        step=chosen,
        csrf=ui.csrf,
        steerable=ui.agent is not None,
        live=running,
        abortable=running and (ui.live.driving(state.run_id) or isinstance(ui.store, RunCancels)),
        problem=problem,
        step_usage=_usage_at(ui, state, chosen) if chosen is not None else None,
    )
    return run_page(page, store=ui.store_name)


def _usage_at(ui: _Ui, state: RunState, step: Step) -> Usage | None:
    """The usage of the run's model calls as of ``step``, where the source keeps it per
    call: a stored run's replies, or a trace file's model calls (which count the calls
    that made no reply too); None for a checkpoint written before replies kept it."""
    if not isinstance(ui.store, TraceRuns):
        return step.usage
    turn = step.model_calls
    by_turn = ui.store.usage_by_turn(state.run_id)
    known = [t for t in by_turn if t <= turn]
    return by_turn[max(known)] if known else None


async def _run(request: Request) -> Response:
    ui = _ui(request)
    loaded = _load(ui, request.path_params["run_id"])
    if isinstance(loaded, Response):
        return loaded
    try:
        step = int(request.query_params["step"]) if "step" in request.query_params else None
    except ValueError:
        step = None
    return HTMLResponse(_page(ui, loaded, step))


async def _form(request: Request) -> dict[str, str] | Response:
    """The POST's fields, once its CSRF token and origin are checked."""
    ui = _ui(request)
    body = await request.body()
    if len(body) > _MAX_FORM:
        return PlainTextResponse("form too large", status_code=413)
    fields = dict(parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True))
    origin_ok = same_origin(request.headers.get("origin"), request.headers.get("host"))
    if not origin_ok or not tokens_match(fields.get("csrf"), ui.csrf):
        return PlainTextResponse("refused: the form did not come from this ui", status_code=403)
    return fields


def _back(run_id: str) -> Response:
    return RedirectResponse(f"/runs/{quote(run_id, safe='')}", status_code=303)


def _refused(ui: _Ui, run_id: str, problem: str) -> Response:
    loaded = _load(ui, run_id)
    if isinstance(loaded, Response):
        return loaded
    return HTMLResponse(_page(ui, loaded, None, problem), status_code=400)


def _drive(ui: _Ui, run_id: str, reply: str | None, approvals: Any, pause: str | None) -> None:
    """Reopen the run with the answer (raises what ``Agent.reopen`` raises for an answer
    that does not fit), then drive it on in the server's loop."""
    assert ui.agent is not None
    if ui.live.driving(run_id):  # a second click while the first answer runs
        raise ResumeError(f"run {run_id} is running on the answer it was given")
    run = ui.agent.reopen(run_id, reply, approvals=approvals, pause=pause)
    ui.live.start(run_id, asyncio.get_running_loop().create_task(run.run()))


async def _answer(request: Request) -> Response:
    ui = _ui(request)
    run_id = request.path_params["run_id"]
    fields = await _form(request)
    if isinstance(fields, Response):
        return fields
    if ui.agent is None:
        return _refused(ui, run_id, "start the ui with --agent to answer runs")
    try:
        _drive(ui, run_id, fields.get("reply", ""), None, fields.get("pause") or None)
    except AgentFSMError as exc:
        return _refused(ui, run_id, str(exc))
    return _back(run_id)


async def _fork(request: Request) -> Response:
    """A new run from where this one stood after step ``at`` (``Agent.fork``), driven here;
    the page goes to it."""
    ui = _ui(request)
    run_id = request.path_params["run_id"]
    fields = await _form(request)
    if isinstance(fields, Response):
        return fields
    if ui.agent is None:
        return _refused(ui, run_id, "start the ui with --agent to fork runs")
    try:
        at = int(fields.get("at", ""))
        run = ui.agent.fork(run_id, at=at)
    except ValueError:
        return _refused(ui, run_id, "fork at a step: its number")
    except AgentFSMError as exc:
        return _refused(ui, run_id, str(exc))
    fork_id = run.state.run_id
    ui.live.start(fork_id, asyncio.get_running_loop().create_task(run.run()))
    return _back(fork_id)


def _decisions(state: RunState, fields: dict[str, str]) -> dict[str, bool | Approval]:
    """The approvals a form gives: per pending call, allow or deny, the reason, and the
    arguments when the person changed them.

    Raises:
        ValueError: arguments that are not a JSON object.
    """
    control = state.control
    if control is None or control.waits_for is not ControlKind.APPROVAL:
        return {}
    decided: dict[str, bool | Approval] = {}
    for call in control.pending_calls:
        allow = fields.get(f"decision:{call.id}", "deny") == "allow"
        reason = fields.get(f"reason:{call.id}", "").strip() or None
        arguments: dict[str, Any] | None = None
        text = fields.get(f"arguments:{call.id}")
        if allow and text is not None and text.strip():
            try:
                edited = json.loads(text)
            except ValueError as exc:
                raise ValueError(f"the arguments for {call.id} are not JSON: {exc}") from None
            if not isinstance(edited, dict):
                raise ValueError(f"the arguments for {call.id} must be a JSON object")
            try:
                original = json.loads(call.arguments)
            except ValueError:
                original = None
            arguments = edited if edited != original else None
        decided[call.id] = Approval(allow=allow, reason=reason, arguments=arguments)
    return decided


async def _approve(request: Request) -> Response:
    ui = _ui(request)
    run_id = request.path_params["run_id"]
    fields = await _form(request)
    if isinstance(fields, Response):
        return fields
    if ui.agent is None:
        return _refused(ui, run_id, "start the ui with --agent to decide approvals")
    loaded = _load(ui, run_id)
    if isinstance(loaded, Response):
        return loaded
    try:
        approvals = _decisions(loaded, fields)
        _drive(ui, run_id, None, approvals or None, fields.get("pause") or None)
    except (ValueError, AgentFSMError) as exc:
        return _refused(ui, run_id, str(exc))
    return _back(run_id)


async def _abort(request: Request) -> Response:
    ui = _ui(request)
    run_id = request.path_params["run_id"]
    fields = await _form(request)
    if isinstance(fields, Response):
        return fields
    reason = fields.get("reason") or "aborted from the ui"
    try:
        if ui.live.driving(run_id) and ui.agent is not None:
            ui.agent.cancel(run_id, reason)
        elif isinstance(ui.store, RunCancels):
            ui.store.cancel(run_id, reason)
        else:
            return _refused(ui, run_id, "this store takes no cancel requests")
    except AgentFSMError as exc:
        return _refused(ui, run_id, str(exc))
    return _back(run_id)


async def _events(request: Request) -> Response:
    ui = _ui(request)
    run_id = request.path_params["run_id"]
    loaded = _load(ui, run_id)
    if isinstance(loaded, Response):
        return loaded
    source = driven if ui.live.driving(run_id) else followed
    return StreamingResponse(
        source(ui.store, ui.live, ui.stop, request.is_disconnected, run_id),
        media_type="text/event-stream",
        headers={"x-accel-buffering": "no"},
    )


def _problem(status: int, message: str) -> Response:
    """An AG-UI input refused: JSON, saying why."""
    return JSONResponse({"error": message}, status_code=status)


def _json_refused(request: Request, ui: _Ui) -> Response | None:
    """Why a JSON POST from a front end is refused, if it is: another site's ``Origin``,
    or neither the ui's token (``--token``, which ``security.Guard`` checked) nor its CSRF
    token in ``X-CSRF-Token``. Its JSON content type (``agui_input.read_input``) makes a
    browser ask before sending it across sites, which this server never allows."""
    if not same_origin(request.headers.get("origin"), request.headers.get("host")):
        return _problem(403, "refused: the request came from another site")
    if not ui.token_guarded and not tokens_match(request.headers.get("x-csrf-token"), ui.csrf):
        return _problem(
            403, "refused: send the ui's CSRF token in X-CSRF-Token, or start the ui with --token"
        )
    return None


async def _agui(request: Request) -> Response:
    """AG-UI's ``RunAgentInput``: start the thread's run or resume it (``agui_input``), and
    stream the drive as AG-UI events."""
    ui = _ui(request)
    refused = _json_refused(request, ui)
    if refused is not None:
        return refused
    if ui.agent is None or not isinstance(ui.store, CheckpointStore):
        return _problem(409, "start the ui with --agent (over a store) to run agents")
    agent, store = ui.agent, ui.store
    try:
        given = read_input(await request.body(), request.headers.get("content-type"))
        run_id = given.threadId
        check_id(run_id, "thread id")
        stored = await asyncio.to_thread(_stored, store, run_id)
        action = plan(given, stored, driving=ui.live.driving(run_id))
        if isinstance(action, Start):
            run = agent.start(action.user_input, run_id=run_id, history=action.history)
        else:
            run = agent.reopen(run_id, action.reply, approvals=action.approvals, pause=action.pause)
    except InputError as exc:
        return _problem(exc.status, str(exc))
    except AgentFSMError as exc:  # an id, a history or an answer that does not fit the run
        return _problem(422, str(exc))  # (refused before anything of the run changed)
    ui.live.start(run_id, asyncio.get_running_loop().create_task(run.run()))
    return StreamingResponse(
        driven(
            store,
            ui.live,
            ui.stop,
            request.is_disconnected,
            run_id,
            thread=run_id,
            agui_run=given.runId,
        ),
        media_type="text/event-stream",
        headers={"x-accel-buffering": "no"},
    )


def _stored(store: CheckpointStore, run_id: str) -> RunState | None:
    """The thread's run, or None when the store holds none."""
    return store.load(run_id) if store.exists(run_id) else None


async def _static(request: Request) -> Response:
    ui = _ui(request)
    name = request.path_params["name"]
    if name not in _STATIC:
        return PlainTextResponse("not found", status_code=404)
    return Response(ui.static[name], media_type=_STATIC[name])


def create_app(
    store: RunSource,
    *,
    store_name: str,
    agent: Agent | None = None,
    token: str | None = None,
    hosts: Sequence[str] | None = ("127.0.0.1", "localhost", "::1"),
    csrf: str | None = None,
) -> Guard:
    """The ui over ``store`` (named ``store_name`` on its pages: pass it through
    ``checkpoint.redacted``), steering with ``agent`` (its store replaced by ``store``)
    when given and ``store`` is a checkpoint store (a trace file, ``recorded.TraceRuns``,
    is only read).

    Args:
        token: required of every request when given (see ``security``).
        hosts: the ``Host`` names answered; None to answer any (a token must then guard it).
        csrf: the forms' token (a random one by default).
    """
    steerable = agent is not None and isinstance(store, CheckpointStore)
    driver = agent.replace(store=store) if steerable and agent is not None else None
    ui = _Ui(store, store_name, driver, csrf or secrets.token_urlsafe(32))
    ui.token_guarded = token is not None

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        ui.live.bind(asyncio.get_running_loop())
        yield
        if ui.agent is not None:
            await ui.live.stop_all(lambda run_id: ui.agent.cancel(run_id, "the ui stopped"))  # type: ignore[union-attr]

    app = Starlette(
        routes=[
            Route("/", _runs),
            Route("/agui", _agui, methods=["POST"]),
            Route("/runs/{run_id:path}/events", _events),
            Route("/runs/{run_id:path}/answer", _answer, methods=["POST"]),
            Route("/runs/{run_id:path}/approve", _approve, methods=["POST"]),
            Route("/runs/{run_id:path}/abort", _abort, methods=["POST"]),
            Route("/runs/{run_id:path}/fork", _fork, methods=["POST"]),
            Route("/runs/{run_id:path}", _run),
            Route("/static/{name}", _static),
        ],
        lifespan=lifespan,
    )
    app.state.ui = ui
    return Guard(app, token=token, hosts=None if hosts is None else frozenset(hosts))
