"""RunState, the mutable and serialisable record of one run, and RunResult, its outcome.

``Agent`` is frozen configuration; ``RunState`` is everything one run knows, and is what a
checkpoint stores. Anything derivable from the transcript is derived rather than stored twice:
tool results live only in ``messages``; the trace stores row numbers, not copies of rows.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import MISSING, dataclass, field, fields
from enum import StrEnum
from typing import Annotated, Any, Literal, overload

from pydantic import (
    BaseModel,
    ConfigDict,
    GetCoreSchemaHandler,
    GetPydanticSchema,
    JsonValue,
    PlainValidator,
    TypeAdapter,
    model_validator,
)
from pydantic_core import core_schema

from agent_fsm.constructors import builder, quick_init
from agent_fsm.messages import FinishReason, Message, ToolCall, Usage, UserMessage
from agent_fsm.prompt import ContextEdits, SummaryDue
from agent_fsm.table import (
    TABLE,
    AgentState,
    Row,
    StopReason,
    Trigger,
    resumable_stops,
    state_named,
)
from agent_fsm.tokens import Calibration

__all__ = [
    "CONTROL_STOPS",
    "AgentRecord",
    "Approval",
    "ControlKind",
    "ControlRequest",
    "GuardrailTrip",
    "Decision",
    "Lifetime",
    "LoopState",
    "ModelFailure",
    "ParentLink",
    "StateName",
    "SubAgentPause",
    "RunResult",
    "RunState",
    "RunStatus",
    "Trace",
    "TraceEntry",
    "RUN_STATE_ADAPTER",
    "SHARED_TURNS",
    "STEP_PAIRS",
    "calibrated_prompt_tokens",
    "reopen_fields",
    "step_pair",
]

_FROZEN = ConfigDict(frozen=True, extra="forbid")


def _state_from(value: object) -> AgentState | str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"a state name must be a non-empty str, got {value!r}")
    return state_named(value)


def _dumped_as_str(source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
    """Dumped by pydantic-core as the str it is (an ``AgentState`` is a ``StrEnum``): without
    this, a ``PlainValidator``'s field is dumped through a Python callback, once per dump,
    and a durable run dumps its state on every checkpoint save (``durable.encoding``)."""
    return {**handler(source), "serialization": core_schema.simple_ser_schema("str")}


StateName = Annotated[
    AgentState | str, PlainValidator(_state_from), GetPydanticSchema(_dumped_as_str)
]
"""A state of the loop: the ``AgentState`` member for a state of the default loop, the name
of a ``CustomState`` otherwise (``table.state_named``)."""


class ControlKind(StrEnum):
    """A control-flow request that ends the loop in DONE."""

    ASK_USER = "ask_user"
    FINISH_TASK = "finish_task"
    TERMINAL_TOOL = "terminal_tool"
    """A user tool declared ``terminal`` ran successfully: its output is the run's output."""
    APPROVAL = "approval"
    SUB_AGENT = "sub_agent"
    """A sub-agent stopped to ask the user or for approvals (``ControlRequest.sub_agent``)."""


CONTROL_STOPS: dict[ControlKind, StopReason] = {
    ControlKind.ASK_USER: StopReason.ASK_USER,
    ControlKind.FINISH_TASK: StopReason.FINISH_TASK,
    ControlKind.TERMINAL_TOOL: StopReason.TERMINAL_TOOL,
    ControlKind.APPROVAL: StopReason.APPROVAL_REQUIRED,
    ControlKind.SUB_AGENT: StopReason.SUB_AGENT_PAUSED,
}
"""The stop each kind of control request ends the run with, when its row wins."""


class SubAgentPause(BaseModel):
    """Where a paused sub-agent waits (``ControlRequest.sub_agent``): the parent's answer is
    passed down to it (``run.delegation.carry_out_child``)."""

    model_config = _FROZEN

    run_id: str
    """The child's run, checkpointed under its own id (``RunState.parent`` links it back)."""
    tool: str
    """The sub-agent tool the parent called."""
    asks: ControlKind
    """What the child waits for: ``ASK_USER`` (a reply) or ``APPROVAL`` (decisions)."""
    pause: str = ""
    """The child's own pause (its ``ControlRequest.pause``)."""
    below: tuple[str, ...] = ()
    """When the child waits for a sub-agent of its own: the sub-agent tools from the child
    down to the agent whose question or calls the pause shows (one name per level), so that
    edited arguments are checked against that agent's tools (``run.resuming``)."""
    counted: dict[str, JsonValue] = {}
    """The child's spend the parent counted when it paused (turns, last answers, retries,
    usage, cost), so that only what it spends after is added when it finishes."""


class ParentLink(BaseModel):
    """The call of the parent run that started a sub-agent's run (``RunState.parent``)."""

    model_config = _FROZEN

    run_id: str
    tool_call_id: str
    tool: str


class ControlRequest(BaseModel):
    """What a control-flow tool asked for in this turn; read by the control guards
    (``table.CONTROL_GUARDS``), one per kind."""

    model_config = _FROZEN

    kind: ControlKind
    text: str = ""
    """The question (ask_user), the summary (finish_task) or the terminal tool's output."""
    tool_call_id: str = ""
    """The call that made the request."""
    pending_calls: tuple[ToolCall, ...] = ()
    """Calls waiting for approval (kind APPROVAL)."""
    pause: str = ""
    """Names the pause the run stopped at with this request (set when it stops: ``pause-N``,
    N the transitions so far). An answer gives it back (``Agent.resume(..., pause=...)``),
    and a decision on every pending call at once (``approvals=True``) must: a decision that
    arrives late (a double click, a retried request) must not answer a pause nobody saw.
    Empty for a checkpoint of an older agent_fsm."""
    sub_agent: SubAgentPause | None = None
    """For kind SUB_AGENT: the child that waits; ``text`` and ``pending_calls`` are its
    question or the calls it waits to have approved."""

    @property
    def waits_for(self) -> ControlKind:
        """What a person answers this pause with: ``ASK_USER`` (a reply) or ``APPROVAL``
        (decisions), its own or, for a sub-agent's pause, the child's."""
        return self.sub_agent.asks if self.sub_agent is not None else self.kind


class GuardrailTrip(BaseModel):
    """A guardrail that did not pass (``agent_fsm.guardrails``): read by the
    ``input_guardrail_tripped`` and ``output_guardrail_tripped`` rows."""

    model_config = _FROZEN

    kind: Literal["input", "output"]
    guardrail: str
    """Its name."""
    reason: str = ""
    """Why, as it said (or how it failed)."""


class Approval(BaseModel):
    """A person's decision on one tool call that awaited approval.

    ``Agent.resume(run_id, approvals={call_id: True | False | Approval(...)})``; the reason,
    when given, is shown to the model.
    """

    model_config = _FROZEN

    allow: bool
    reason: str | None = None
    arguments: dict[str, JsonValue] | None = None
    """Approve the call with these arguments instead of the model's (``allow`` must be True).
    They are validated against the tool's schema as a model's call is, when the run is
    resumed (``ResumeError`` lists what is wrong, and the run stays paused); the call then
    runs with them, the decision keeps them (checkpointed with the run), and the model is
    told what changed. The transcript keeps the call as the model made it."""

    @model_validator(mode="after")
    def _arguments_only_when_allowed(self) -> Approval:
        if self.arguments is not None and not self.allow:
            raise ValueError("arguments are what an approved call runs with: allow=True")
        return self


class Decision(BaseModel):
    """A call that waited for approval, and the decision a person gave on resume."""

    model_config = _FROZEN

    call: ToolCall
    approval: Approval


class ModelFailure(BaseModel):
    """The last model call failed; read by the THINK guards, cleared by a successful call."""

    model_config = _FROZEN

    message: str
    """What went wrong, fit for a log line and for RunResult.error."""
    permanent: bool
    """True when retrying cannot help (bad request, authentication, a broken script)."""
    retry_after_s: float | None = None
    """The server's requested delay before a retry, where it gave one."""
    context_overflow: bool = False
    """The server refused the prompt as longer than its context window (read by the
    ``context_overflowed`` guard: the run shrinks the prompt, or stops ``context_window``)."""
    prompt_tokens: int | None = None
    """The refused prompt's size by the server's count, where its refusal said."""


class AgentRecord(BaseModel):
    """What the agent that made a run was, kept with the run (``RunState.agent``): a resume
    by a different agent is refused, saying what differs, and the run's approval rules hold
    whoever resumes it (``run.identity``). Digests, not copies: a checkpoint stays small."""

    model_config = _FROZEN

    tools: dict[str, str] = {}
    """Each tool offered to the model, by name: a digest of its description and schema."""
    system_prompt: str = ""
    """A digest of the system prompt."""
    table: str = ""
    """A digest of the table's rows (the loop the run steps through)."""
    approval: tuple[str, ...] = ()
    """The tools whose calls wait for a person's approval (``Tool.requires_approval``)."""


@dataclass(slots=True, kw_only=True)
class LoopState:
    """Loop-detector memory: run lengths and a short ring of recent call signatures.

    Bounded in size by ``Limits.loop_max_period``, whatever the length of the run, which is
    what keeps loop detection O(1) amortised per turn. ``loop.detection`` holds the logic.
    """

    call_streaks: dict[str, int] = field(default_factory=dict)
    """The distinct call signatures of the last tool turn, each with how many consecutive
    turns (up to and including that one) made it."""
    last_results: str | None = None
    result_repeats: int = 0
    """How many consecutive tool turns produced results with signature ``last_results``."""
    last_text: str | None = None
    text_repeats: int = 0
    """How many consecutive replies carried the same non-empty text."""
    recent_calls: list[str] = field(default_factory=list)
    """The signatures of the last ``loop_max_period + 1`` tool turns (each the set of its
    calls), oldest first."""
    period_matches: list[int] = field(default_factory=list)
    """``period_matches[q]``: consecutive tool turns equal to the turn q turns earlier."""
    detected: str | None = None
    """A description of the loop found, once one is found."""


class Lifetime(StrEnum):
    """How long a RunState field's value lasts. Every field declares one (``_declared``), and
    ``reopen_fields`` applies them, so a new field cannot silently survive a resume."""

    RUN = "run"
    """Kept for the whole run, across every stop, resume and crash."""
    STOP = "stop"
    """Says how and why the run stopped; back to its default when a resume row is taken."""
    ACTIVATION = "activation"
    """Belongs to one activation (one process driving the run from a start or a resume);
    back to its default whenever the run is reopened, after a crash too."""


def _declared(
    lifetime: Lifetime, writers: str, default: Any = MISSING, factory: Any = MISSING
) -> Any:
    """A RunState field with its lifetime and the modules (under ``agent_fsm.``, space
    separated) that may assign it after construction; ``tests/test_state_fields.py`` holds the
    code to the declaration."""
    metadata = {"lifetime": lifetime, "writers": frozenset(writers.split())}
    if factory is not MISSING:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


L = Lifetime

_NO_USAGE = Usage()
_NO_EDITS = ContextEdits()


def _no_usage() -> Usage:
    """A new run's usage: one frozen record shared by every run (one of its own, with its
    dict and fields set, cost each run a few hundred bytes until its first reply)."""
    return _NO_USAGE


def _unedited() -> ContextEdits:
    """A new run's context edits (none): one frozen record shared by every run, as
    ``_no_usage``; a policy that edits the prompt gives the run new ones."""
    return _NO_EDITS


@dataclass(slots=True, kw_only=True)
class RunState:
    """Everything one run knows, and what a checkpoint stores.

    Written between triggers by the work of each state (``agent_fsm.run``) and by the machine
    (``state``); each field below names the modules that write it and how long its value
    lasts. A slotted dataclass rather than a pydantic model because fields are assigned on
    every turn; ``RUN_STATE_ADAPTER`` gives it the same validation and JSON form.
    """

    run_id: str = _declared(L.RUN, "")
    state: StateName = _declared(L.RUN, "loop.machine", AgentState.OBSERVE)
    """Where the run is; moved only by the machine, when a row is taken."""
    agent: AgentRecord | None = _declared(L.RUN, "run.identity", None)
    """The agent that made the run (``AgentRecord``); None for a run checkpointed by an
    older agent_fsm, which any agent may resume, and for a queued run until a worker takes
    it (``run.identity.claim``)."""
    notes: dict[str, Any] = _declared(L.RUN, "", factory=dict)
    """What the user's own loop keeps: the work of a ``CustomState`` writes it (through
    ``StepContext.notes``), the table's own guards read it. JSON values, checkpointed with
    the run."""
    turns: int = _declared(L.RUN, "run.thinking run.parenting", 0)
    """Turns so far (model calls that were not retries), over every activation; with the
    turns of its sub-agents' runs (``run.parenting.fold``)."""
    retries: int = _declared(L.RUN, "run.thinking run.parenting", 0)
    """Retries of failed model calls so far, over every activation."""
    turn_retries: int = _declared(L.RUN, "run.thinking", 0)
    """Retries of the current turn's model call."""
    turn_retry_wait_s: float = _declared(L.RUN, "run.thinking", 0.0)
    """Seconds the current turn has waited before its retries."""
    usage: Usage = _declared(L.RUN, "run.thinking run.parenting", factory=_no_usage)
    cost: float | None = _declared(L.RUN, "run.thinking run.parenting", None)
    """What the model calls cost so far (``Limits.prices``); None while none was priced."""
    messages: list[Message] = _declared(
        L.RUN, "run.context durable.checkpoint durable.sqlite durable.postgres", factory=list
    )
    """The transcript, append-only (``RunContext.append``; the stores refill it on load)."""
    pending_input: list[str | UserMessage] = _declared(
        L.RUN, "run.observing run.engine run.resuming run.acting run.parenting", factory=list
    )
    """User messages (the input, steering, answers, approval outcomes) not yet observed; all
    are taken at the next OBSERVE. A text is kept as a str; a message with images or files
    (``UserMessage.parts``) as the message."""
    follow_ups: list[str] = _declared(L.RUN, "run.engine run.observing", factory=list)
    """Follow-up messages, delivered one at a time when the run would otherwise end."""
    prompt_tokens_estimate: int = _declared(L.RUN, "run.context", 0)
    """Running estimate of the transcript's size in tokens (kept incrementally)."""
    tools_tokens_estimate: int = _declared(L.RUN, "", 0)
    """Estimate of the tool definitions' size in tokens, sent with every request."""
    reported_prompt_tokens: int = _declared(L.RUN, "run.thinking", 0)
    estimated_prompt_tokens: int = _declared(L.RUN, "run.thinking", 0)
    """Prompt tokens the server reported, and what the engine had estimated for the same
    calls, summed over the run (``calibration`` is what scales the estimates)."""
    calibration: Calibration = _declared(L.RUN, "", factory=Calibration)
    """How the servers count what the engine estimates (``tokens.Calibration``), learned
    from every reported usage and every context overflow (``calibrated_prompt_tokens``)."""
    context: ContextEdits = _declared(L.RUN, "run.context", factory=_unedited)
    """How the prompt sent differs from the transcript (``agent_fsm.prompt``)."""
    summary_due: SummaryDue | None = _declared(L.STOP, "run.compacting", None)
    """A summary a context policy asked for, written by the next model call."""
    summarised: bool = _declared(L.STOP, "run.thinking run.compacting", False)
    """The last model call wrote the summary a policy asked for."""
    context_problem: str | None = _declared(L.STOP, "run.compacting", None)
    """Why the last compaction left the prompt too big (a policy failed or found nothing)."""
    correction: str | None = _declared(L.RUN, "run.thinking run.observing run.guarding", None)
    """What to tell the model about a final answer that did not validate against the
    agent's output type (the ``output_rejected`` row); observed, like user input, next."""
    output_failures: int = _declared(L.RUN, "run.thinking run.acting", 0)
    """Final answers that did not validate against the agent's output type, over the run
    (``Limits.output_retries`` bounds them)."""
    guardrail_trip: GuardrailTrip | None = _declared(L.STOP, "run.guarding", None)
    """The guardrail that did not pass (``agent_fsm.guardrails``); its row stops the run."""
    guardrail_rewrites: int = _declared(L.RUN, "run.guarding", 0)
    """Rewrites the output guardrails asked for, over the run
    (``Limits.guardrail_rewrites`` bounds them)."""
    consecutive_errors: int = _declared(L.STOP, "run.context", 0)
    """All-failed tool turns in a row (``RunContext.count_failure``)."""
    last_finish_reason: FinishReason | None = _declared(L.STOP, "run.thinking", None)
    last_tool_calls: int = _declared(L.STOP, "run.thinking run.outcome", 0)
    """Tool calls in the last reply (0 once they are answered by the end of the run)."""
    model_failure: ModelFailure | None = _declared(L.STOP, "run.thinking run.custom", None)
    requests: list[ControlRequest] = _declared(
        L.STOP, "run.acting run.guarding run.parenting", factory=list
    )
    """Every control request of the last turn, at most one per kind (ask_user, finish_task,
    a terminal tool's result, the calls awaiting approval): each is read by its own guard
    (``table.CONTROL_GUARDS``), and the first REFLECT row that matches decides which ends
    the run."""
    control: ControlRequest | None = _declared(L.STOP, "run.outcome", None)
    """The request the run stopped on (ask_user's question, the approvals it waits for...):
    recorded from ``requests`` when a control row ends the run."""
    parent: ParentLink | None = _declared(L.RUN, "run.delegation", None)
    """The parent run's call that started this run (a sub-agent's); None for a run of its
    own."""
    awaiting_child: ControlRequest | None = _declared(L.RUN, "run.outcome run.parenting", None)
    """The sub-agent that paused the run (kind SUB_AGENT), until its answer is carried out:
    kept across the stop, which resets ``control``."""
    child_reply: str | None = _declared(L.RUN, "run.resuming run.parenting", None)
    """The reply a resume gave for a paused sub-agent's question, until ACT passes it down."""
    decisions: list[Decision] = _declared(
        L.RUN, "run.resuming run.acting run.parenting", factory=list
    )
    """Approval decisions given on resume, with their calls; carried out and emptied by the
    ACT state the resume leads to (so empty at every stop)."""
    loop: LoopState = _declared(L.RUN, "run.observing", factory=LoopState)
    """Loop-detector memory; its own fields are kept by ``loop.detection``."""
    loop_rung: int = _declared(L.RUN, "run.observing", 0)
    """Rungs of the loop ladder climbed (``Limits.loop_ladder``): 1 after the nudge, 2 once
    the repeated tool is withheld."""
    withheld: tuple[str, ...] = _declared(L.RUN, "run.observing", ())
    """Tools the loop ladder took away from the model for the rest of the run."""
    reflector_done: bool = _declared(L.STOP, "run.reflecting", False)
    closing: StopReason | None = _declared(L.STOP, "run.answering run.compacting", None)
    """The stop a last answer is being written for (LAST_ANSWER, or COMPACT when its prompt
    is shrunk first): the rows out read it."""
    last_answers: int = _declared(L.RUN, "run.answering", 0)
    """Last-answer calls made (``Limits.last_answer``), over every activation: model calls
    beyond the turns and retries, at most one per activation."""
    elapsed_s: float = _declared(L.ACTIVATION, "run.engine", 0.0)
    """Wall-clock seconds of this activation, as of the last completed step."""
    timed_out: bool = _declared(L.ACTIVATION, "run.engine", False)
    """The activation's deadline timer fired (``Limits.timeout_s``)."""
    resumed_at: list[int] = _declared(L.RUN, "run.resuming", factory=list)
    """For each reopening (after a stop or a crash), how many transitions the trace held then;
    after a stop, the transition at that position is the resume row."""
    abort_reason: str | None = _declared(L.STOP, "run.engine", None)
    output: str | None = _declared(L.STOP, "run.thinking run.answering run.outcome", None)
    output_incomplete: bool = _declared(L.STOP, "run.thinking run.answering", False)
    """``output`` was cut off at the model's token limit (finish ``length``): a final answer
    (the run is then ``incomplete``) or a last answer (``Limits.last_answer``)."""
    error: str | None = _declared(L.STOP, "run.outcome", None)
    stop_reason: StopReason | None = _declared(L.STOP, "run.outcome run.resuming", None)
    """Why the run stopped, while it is in DONE or ERROR; what the resume rows' guards read."""
    trace: list[tuple[int, int]] = _declared(
        L.RUN, "run.engine durable.checkpoint durable.sqlite durable.postgres", factory=list
    )
    """(row index in the machine's table, turn) for every transition taken; the engine's
    pairs are shared by every run (``step_pair``)."""


SHARED_TURNS = 256
"""The turns whose ``(row, turn)`` pairs are shared (``step_pair``)."""

STEP_PAIRS: dict[int, list[tuple[int, int]]] = {}
"""``STEP_PAIRS[row][turn]``: the one ``(row, turn)`` tuple of the process, for every turn
below ``SHARED_TURNS``, made for a row the first time a run takes it (``step_pair``)."""


def step_pair(row: int, turn: int) -> tuple[int, int]:
    """The ``(row, turn)`` pair to add to a trace: one tuple shared by every run that took
    ``row`` at ``turn`` (``STEP_PAIRS``), or, past ``SHARED_TURNS``, a new one.

    A trace holds a pair per transition for as long as its run lives; a tuple of its own was
    64 bytes each, 1.2 KiB of a run parked at turn 5 (``benchmarks/parked_runs.py``, issue
    39), and an object for the cyclic collector to look at. Shared, a transition costs a
    trace one reference. The tuples are plain: a trace, its JSON and the stores are as
    they were. A row's pairs (16 KiB) are made at once, the first time any run takes it.
    """
    if row < 0 or not 0 <= turn < SHARED_TURNS:
        return (row, turn)
    pairs = STEP_PAIRS.get(row)
    if pairs is None:
        pairs = STEP_PAIRS[row] = [(row, shared) for shared in range(SHARED_TURNS)]
    return pairs[turn]


def calibrated_prompt_tokens(state: RunState) -> int:
    """The next prompt's estimated size (transcript as sent, plus tool definitions), as the
    server would count it (``RunState.calibration``)."""
    return state.calibration.prompt(state.prompt_tokens_estimate + state.tools_tokens_estimate)


def _check_declarations(cls: type) -> None:
    """Refuse a RunState field that does not say how long it lives and who writes it."""
    for item in fields(cls):
        if (
            not isinstance(item.metadata.get("lifetime"), Lifetime)
            or "writers" not in item.metadata
        ):
            raise TypeError(f"RunState.{item.name} must be declared with _declared(...)")


_check_declarations(RunState)


def reopen_fields(state: RunState, *, stopped: bool) -> None:
    """Reset, by their declared lifetime, the fields a reopened run must not carry over:
    ACTIVATION fields always, and STOP fields too when the run leaves a stop (``stopped``)."""
    reset = {Lifetime.ACTIVATION, Lifetime.STOP} if stopped else {Lifetime.ACTIVATION}
    for item in fields(state):
        if item.metadata["lifetime"] in reset:
            value = item.default_factory() if item.default_factory is not MISSING else item.default
            setattr(state, item.name, value)


RUN_STATE_ADAPTER: TypeAdapter[RunState] = TypeAdapter(RunState)
"""Validates and serialises RunState (to JSON for checkpoints, and back)."""


class RunStatus(StrEnum):
    """The caller's view of how a run ended."""

    COMPLETED = "completed"
    INCOMPLETE = "incomplete"
    """Ended in DONE without a whole answer: the reply was cut off at the model's token limit
    (stop reason ``max_tokens``; ``output`` holds the text that came). Not "completed", so a
    caller that checks the status never takes a cut-off answer for a finished one."""
    NEEDS_INPUT = "needs_input"
    FAILED = "failed"


def status_for(
    final_state: AgentState | str, stop_reason: StopReason, rows: tuple[Row, ...] = TABLE
) -> RunStatus:
    """The status implied by a terminal state and stop reason: a run that ended in DONE with
    a stop its table can resume waits for a person (ask_user, approvals); one whose reply was
    cut off is incomplete."""
    if final_state is AgentState.ERROR:
        return RunStatus.FAILED
    if stop_reason in resumable_stops(rows):
        return RunStatus.NEEDS_INPUT
    if stop_reason is StopReason.MAX_TOKENS:
        return RunStatus.INCOMPLETE
    return RunStatus.COMPLETED


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class TraceEntry:
    """One transition taken, with the guards of the row that decided it.

    A frozen dataclass rather than a pydantic model: one is built on every transition, and
    a dataclass costs a fraction of even an unvalidated model (pydantic still serialises it
    inside RunResult).
    """

    trigger: Trigger | str
    source: AgentState | str
    dest: AgentState | str
    guards: tuple[str, ...]
    """The guards that all passed on the winning row; empty for the "else" row."""
    label: str
    turn: int
    """Model calls made when the transition fired."""

    @staticmethod
    def from_row(row: Row, turn: int) -> TraceEntry:
        return _trace_entry(
            trigger=row.trigger,
            source=row.source,
            dest=row.dest,
            guards=row.guards,
            label=row.label,
            turn=turn,
        )


_trace_entry = builder(TraceEntry)  # one per transition (see constructors.builder)


class Trace(Sequence[TraceEntry]):
    """The transitions of a run (``RunResult.trace``): a read-only sequence of
    ``TraceEntry``, compared, hashed, pickled and serialised as the tuple of its entries.

    Kept as the run keeps it, its rows' numbers and turns (``RunState.trace``) over the
    table, and the entries built the first time any is read: most results are never
    walked, and building four entries per turn when each run ended was 6% of a default
    turn's instructions (``benchmarks/instructions.py``, issue 39).
    """

    __slots__ = ("_entries", "_rows", "_taken")

    def __init__(self, rows: tuple[Row, ...], taken: Sequence[tuple[int, int]]) -> None:
        """``taken``: (row number in ``rows``, turn) of each transition, in order; copied."""
        self._rows = rows
        self._taken = tuple(taken)
        self._entries: tuple[TraceEntry, ...] | None = None

    @classmethod
    def of(cls, entries: Iterable[TraceEntry]) -> Trace:
        """A trace of entries already built (a result read back from JSON or a pickle)."""
        trace = cls((), ())
        trace._entries = tuple(entries)
        return trace

    def entries(self) -> tuple[TraceEntry, ...]:
        """Every entry, built once."""
        entries = self._entries
        if entries is None:
            rows, from_row = self._rows, TraceEntry.from_row
            entries = self._entries = tuple([from_row(rows[i], turn) for i, turn in self._taken])
        return entries

    def __len__(self) -> int:
        entries = self._entries
        return len(self._taken) if entries is None else len(entries)

    @overload
    def __getitem__(self, index: int) -> TraceEntry: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[TraceEntry, ...]: ...
    def __getitem__(self, index: int | slice) -> TraceEntry | tuple[TraceEntry, ...]:
        return self.entries()[index]

    def __iter__(self) -> Iterator[TraceEntry]:
        return iter(self.entries())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Trace):
            return self.entries() == other.entries()
        if isinstance(other, tuple | list):
            return self.entries() == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.entries())

    def __repr__(self) -> str:
        return f"Trace({self.entries()!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        # As its entries: the table's rows may hold user guards that do not pickle.
        return (Trace.of, (self.entries(),))

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        entries = handler.generate_schema(tuple[TraceEntry, ...])
        return core_schema.no_info_after_validator_function(
            cls._validated,
            entries,
            serialization=core_schema.plain_serializer_function_ser_schema(
                Trace.entries, return_schema=entries
            ),
        )

    @classmethod
    def _validated(cls, entries: tuple[TraceEntry, ...]) -> Trace:
        return cls.of(entries)


class RunResult(BaseModel):
    """The outcome of a run (or of a pause, when status is needs_input)."""

    model_config = _FROZEN

    run_id: str
    status: RunStatus
    stop_reason: StopReason
    final_state: AgentState
    output: str | None
    """The final text, finish_task's summary, or ask_user's question."""
    error: str | None = None
    """For failed runs, what went wrong (for example the model's error message)."""
    turns: int
    """Turns taken: model calls that were not retries."""
    usage: Usage
    cost: float | None = None
    """What the run's model calls cost (``Limits.prices``), its sub-agents' included; None
    when the agent has no prices."""
    messages: tuple[Message, ...]
    trace: Trace
    """The transitions taken, in order (a ``Trace``: a sequence of ``TraceEntry``)."""
    pending: ControlRequest | None = None
    """The open ask_user question or approval request, when status is needs_input."""
    resumed_at: tuple[int, ...] = ()
    """Trace positions where the run was resumed (see ``RunState.resumed_at``)."""
    retries: int = 0
    """Retries of failed model calls."""
    last_answers: int = 0
    """Last answers asked for when a limit ended the run (``Limits.last_answer``): model
    calls that are neither turns nor retries (``turns + retries + last_answers`` in all)."""
    output_incomplete: bool = False
    """``output`` is text cut off at the model's token limit, not a whole answer: a final
    answer (status ``incomplete``) or the last answer of a run a limit ended (status
    ``failed``, its text the best the run had)."""
    value: Any = None
    """The typed output (``Agent(output_type=...)``): an instance of the pydantic model, or
    the JSON value of the schema, validated; None when the run did not end with one."""

    def __repr_args__(self) -> Iterator[tuple[str | None, Any]]:
        """A summary, not the whole transcript: a result is repr'd by debuggers, logs and
        ``asyncio.run`` (which formats its finished task, result included, on exit), and a
        long run's transcript would make each of those cost as much as the run."""
        yield "run_id", self.run_id
        yield "status", self.status
        yield "stop_reason", self.stop_reason
        yield "turns", self.turns
        yield (
            "output",
            self.output
            if self.output is None or len(self.output) <= 80
            else (self.output[:77] + "..."),
        )
        yield "error", self.error
        yield "messages", f"<{len(self.messages)} messages>"
        yield "trace", f"<{len(self.trace)} transitions>"

    @classmethod
    def from_state(cls, state: RunState, table: tuple[Row, ...] = TABLE) -> RunResult:
        """Build the result of a run whose state is terminal; its trace is ``state.trace``
        (row numbers and turns) over ``table``, its entries built when first read."""
        if not state.trace or state.state not in (AgentState.DONE, AgentState.ERROR):
            raise ValueError(f"run {state.run_id} has not ended (state {state.state})")
        last_row = table[state.trace[-1][0]]
        stop_reason = last_row.stop_reason
        assert stop_reason is not None  # a row into a terminal state always has one
        status = status_for(state.state, stop_reason, table)
        trace = Trace(table, state.trace)
        # Every part is already a validated model from the run itself; validating again would
        # walk the whole transcript once more.
        return cls.model_construct(
            run_id=state.run_id,
            status=status,
            stop_reason=stop_reason,
            final_state=state.state,
            output=state.output,
            output_incomplete=state.output_incomplete,
            error=state.error,
            turns=state.turns,
            usage=state.usage,
            cost=state.cost,
            messages=tuple(state.messages),
            trace=trace,
            pending=state.control if status is RunStatus.NEEDS_INPUT else None,
            resumed_at=tuple(state.resumed_at),
            retries=state.retries,
            last_answers=state.last_answers,
        )
