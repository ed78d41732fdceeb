"""THE TABLE: the agent loop as plain data.

Everything about the loop's control flow lives here and nowhere else: ``loop/machine.py``
builds the ``transitions`` machine from these rows, ``loop/verify.py`` proves they terminate
and computes the termination bound, ``diagrams.py`` draws them. Rows for one (trigger, source)
pair are tried top to bottom and the first row whose guards all pass wins, so **row order is
guard priority**: safety first (abort), then control-flow tools, then limits, then loop
detection, then "continue".

The ``resumed`` rows are the only way out of DONE and ERROR: a person's answer (``Agent.resume``)
takes a stopped run back into the loop. Which stops can be resumed is derived from them
(``resumable_stops``), nowhere else.

Each row's ``outcome`` is a ``StopReason`` (rows into DONE/ERROR) or a ``Verb`` (rows that keep
the run going). Guards are referenced by name; ``loop/guards.py`` defines a pure function for
each name and the verifier refuses a table that names an unknown guard.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

__all__ = [
    "ANSWER_GUARDS",
    "CONTROL_GUARDS",
    "CRASH_GUARD",
    "state_named",
    "trigger_named",
    "CLOSING_GUARDS",
    "INITIAL_STATE",
    "INPUT_GUARDRAIL_GUARD",
    "OUTPUT_GUARDRAIL_GUARD",
    "OUTPUT_GUARDRAIL_STATES",
    "LAST_ANSWER_DUE_GUARD",
    "LAST_ANSWER_GUARD",
    "LAST_CALL_STATE",
    "LAST_ANSWER_WINDOW_GUARD",
    "TABLE",
    "TERMINAL_STATES",
    "TRIGGER_FOR_STATE",
    "RESUME_TRIGGER",
    "STOP_GUARDS",
    "RETRY_BUDGET_GUARD",
    "TURN_BUDGET_GUARD",
    "TURN_STATE",
    "TURN_STATES",
    "AgentState",
    "Row",
    "StopReason",
    "Trigger",
    "Verb",
    "control_order",
    "crash_rows",
    "resumable_stops",
    "saved_with_next_step",
    "softened_stop",
]


class AgentState(StrEnum):
    """The states of the loop; DONE and ERROR are terminal."""

    OBSERVE = "OBSERVE"
    COMPACT = "COMPACT"
    """The prompt does not fit the context window: the context policies shrink it."""
    SUMMARISE = "SUMMARISE"
    """A context policy asked for a summary of the early conversation: one model call writes
    it (a turn, paid from the token budget like any other)."""
    THINK = "THINK"
    ACT = "ACT"
    REFLECT = "REFLECT"
    LAST_ANSWER = "LAST_ANSWER"
    """A limit is ending the run: one last model call, without tools, writes the best answer
    from what the run has (``Limits.last_answer``); then the run ends with that limit."""
    DONE = "DONE"
    ERROR = "ERROR"


class Trigger(StrEnum):
    """One trigger per non-terminal state, fired when that state's work is finished, and the
    resume trigger, fired on a stopped run that was answered."""

    OBSERVED = "observed"
    COMPACTED = "compacted"
    SUMMARISED = "summarised"
    THOUGHT = "thought"
    ACTED = "acted"
    REFLECTED = "reflected"
    LAST_ANSWERED = "last_answered"
    RESUMED = "resumed"
    """Fired on a reopened run (``Agent.resume``): the only trigger that leaves DONE or ERROR,
    and the one that restarts the step a crashed run was in."""


class StopReason(StrEnum):
    """Why a run ended (or paused). The value is the label of the row that ended it."""

    FINAL_ANSWER = "final_answer"
    FINISH_TASK = "finish_task"
    TERMINAL_TOOL = "terminal_tool"
    """A tool declared terminal ran successfully; its output is the run's output."""
    ASK_USER = "ask_user"
    APPROVAL_REQUIRED = "approval_required"
    SUB_AGENT_PAUSED = "sub_agent_paused"
    """A sub-agent (``Agent.as_tool``) stopped to ask the user or for approvals: the whole
    tree waits, and the parent's ``RunResult.pending`` says what the child asks."""
    MAX_TOKENS = "max_tokens"
    ABORTED = "aborted"
    MODEL_ERROR = "model_error"
    CONTENT_FILTER = "content_filter"
    REFUSED = "refused"
    """The model declined the request; its refusal is the last message."""
    CONSECUTIVE_ERRORS = "consecutive_errors"
    INVALID_OUTPUT = "invalid_output"
    """The final answer failed to validate against the output type more often than
    ``Limits.output_retries`` allows."""
    TOKEN_BUDGET = "token_budget"
    COST_BUDGET = "cost_budget"
    """The money budget (``Limits.cost_budget``) is spent, or the next prompt would pass it
    (stopped before the call)."""
    CONTEXT_WINDOW = "context_window"
    """The prompt cannot be made to fit the model's context window: stopped before the call,
    or after the server refused it as too long. A resume with a larger window goes on."""
    MAX_TURNS = "max_turns"
    TIMEOUT = "timeout"
    LOOP_DETECTED = "loop_detected"
    GUARDRAIL_TRIPPED = "guardrail_tripped"
    """An input guardrail stopped a user message before any model call saw it, or an output
    guardrail stopped an answer before the run ended with it (``agent_fsm.guardrails``)."""
    REFLECTOR_DONE = "reflector_done"
    REJECTED = "rejected"
    """A check of the user's own loop (a judge, say) rejected the result and ended the run."""


class Verb(StrEnum):
    """What a row that keeps the run going does (rows into DONE/ERROR carry a StopReason)."""

    THINK = "think"
    COMPACT = "compact"
    """The prompt is too big for the context window: shrink it (COMPACT)."""
    SUMMARISE = "summarise"
    """A context policy asked for a summary: the model call of this turn writes it
    (SUMMARISE)."""
    SUMMARISED = "summarised"
    """The summary was written: the shrunk prompt is checked again (OBSERVE)."""
    RETRY = "retry"
    ACT = "act"
    CORRECT = "correct"
    """The final answer did not validate against the agent's output type: the correction
    goes back to the model (through REFLECT, whose limits still decide)."""
    FOLLOW_UP = "follow_up"
    REFLECT = "reflect"
    CONTINUE = "continue"
    LAST_ANSWER = "last_answer"
    """A limit is ending the run and a last answer is wanted: write it (LAST_ANSWER)."""
    NUDGE = "nudge"
    """A loop was found, first rung of the ladder (``Limits.loop_ladder``): tell the model
    it repeats itself, and go on (OBSERVE)."""
    WITHHOLD = "withhold"
    """A loop was found again: take the repeated tool away, and go on (OBSERVE)."""
    ANSWER = "answer"
    """Resume: the person's reply to ask_user is observed."""
    CARRY_OUT = "carry_out"
    """Resume: the decided approvals are carried out, or a paused sub-agent is resumed with
    the answer."""
    RESUME = "resume"
    """Resume: an aborted or timed-out run goes on, or one whose prompt did not fit the
    context window (with a larger one)."""
    RECOVER = "recover"
    """Resume: a run that a transient model failure stopped tries again."""
    RESTART = "restart"
    """Resume: a run whose process died mid-step does that step's work again, from its last
    checkpoint (the tool journal answers the calls that ran)."""


_STATES = {state.value: state for state in AgentState}
_TRIGGERS = {trigger.value: trigger for trigger in Trigger}
_OUTCOMES: dict[str, StopReason | Verb] = {
    **{verb.value: verb for verb in Verb},
    **{reason.value: reason for reason in StopReason},
}


def state_named(name: str) -> AgentState | str:
    """The state called ``name``: the ``AgentState`` member for a state of the default loop
    (so ``is`` comparisons hold), the name itself for a state a user added (``CustomState``)."""
    return _STATES.get(name, name)


def trigger_named(name: str) -> Trigger | str:
    """The trigger called ``name``: the ``Trigger`` member, or a custom state's trigger."""
    return _TRIGGERS.get(name, name)


@dataclass(frozen=True, slots=True)
class Row:
    """One transition: taken on ``trigger`` from ``source`` when every guard passes.

    States, triggers and outcomes may be given by name (``Row("observed", "OBSERVE", "PLAN",
    ("plan_needed",), "plan")``): names of the default loop become its enum members, other
    names are the states, triggers and verbs of a user's ``CustomState``s.
    """

    trigger: Trigger | str
    source: AgentState | str
    dest: AgentState | str
    guards: tuple[str, ...]
    """Names of pure guard functions that must all be true; empty means "else"."""
    outcome: StopReason | Verb | str
    """The stop reason of a row into DONE/ERROR, the verb of any other row (the verifier
    checks that each row has the kind its destination calls for); a name that is neither is
    a verb of the user's own."""
    label: str = field(init=False, repr=False, compare=False)
    """The outcome as text, as diagrams, events and trace entries show it."""
    restarts: bool = field(init=False, repr=False, compare=False)
    """A resume row that restarts the step a crashed run was in (``CRASH_GUARD``): read on
    every model call, so worked out once."""
    ends: bool = field(init=False, repr=False, compare=False)
    """The row stops the run (its destination is DONE or ERROR)."""
    saves_later: bool = field(init=False, repr=False, compare=False)
    """A durable run saves this transition with the next one (``saved_with_next_step``).
    ``ends`` and this are read after every transition, so both are worked out once."""

    def __post_init__(self) -> None:
        _set = object.__setattr__  # a frozen dataclass normalises its own fields here
        _set(self, "trigger", trigger_named(self.trigger))
        _set(self, "source", state_named(self.source))
        _set(self, "dest", state_named(self.dest))
        _set(self, "guards", tuple(self.guards))
        _set(self, "outcome", _OUTCOMES.get(self.outcome, self.outcome))
        _set(self, "label", str(self.outcome))
        _set(self, "restarts", self.trigger is Trigger.RESUMED and CRASH_GUARD in self.guards)
        _set(self, "ends", self.dest in TERMINAL_STATES)
        _set(self, "saves_later", saved_with_next_step(self))

    @property
    def stop_reason(self) -> StopReason | None:
        """The StopReason this row ends the run with, or None if it continues the loop."""
        outcome = self.outcome
        return outcome if isinstance(outcome, StopReason) else None

    @property
    def resumes(self) -> bool:
        """A resume row: it takes a reopened run back into the loop, out of a stop, or into
        the step it crashed in (``restarts``)."""
        return self.trigger is Trigger.RESUMED


S = AgentState
T = Trigger
R = StopReason
V = Verb

INITIAL_STATE = S.OBSERVE
TERMINAL_STATES = frozenset({S.DONE, S.ERROR})


def saved_with_next_step(row: Row) -> bool:
    """Whether a durable run's checkpoint skips the transition ``row`` and takes it in with
    the next one: a turn's end that goes on (REFLECT -> OBSERVE). REFLECT takes in nothing
    that lasts (a reflector's "not done" leaves no trace), and the save after OBSERVE comes
    before anything from outside does (a model call, a tool call), so a crash in between
    redoes REFLECT from the save after ACT, as a crash row allows. Every other transition is
    saved as it is taken, and every stop."""
    return row.source is AgentState.REFLECT and row.dest is AgentState.OBSERVE


TURN_STATE = S.THINK
"""Entering this state makes the turn's model call: a row into it counts one turn, or one
retry when its outcome is ``Verb.RETRY``."""

TURN_STATES = frozenset({S.THINK, S.SUMMARISE})
"""The states of the default loop whose entry makes one model call counted as a turn (or a
retry): THINK, and SUMMARISE, whose call writes a summary."""

TURN_BUDGET_GUARD = "no_turns_left"
"""The guard that is true when no turn remains; it gates every cycle of the loop."""

RETRY_BUDGET_GUARD = "no_retries_left"
"""The guard that is true when a failed model call may not be retried; it gates every retry
row, and is true at least whenever the run's retries (``model_retries_per_run``) are used."""

LAST_CALL_STATE = S.LAST_ANSWER
"""Entering this state makes one model call that is not a turn: the last answer, written
without tools when a limit ends the run. Every row out of it ends the run (the verifier
checks), so an activation makes this call at most once, and the bound counts it."""

LAST_ANSWER_GUARD = "last_answer_wanted"
"""The guard of every row into ``LAST_CALL_STATE``: true only under ``Limits.last_answer``.
Each such row stands right before the stop row it softens, with that row's guards and this
one; the verifier checks the pairing, and the bound counts the last answer only when the
limits want it."""

LAST_ANSWER_WINDOW_GUARD = "prompt_exceeds_window"
"""With ``LAST_ANSWER_GUARD`` and a limit's guards, on a row into COMPACT right before the
row into ``LAST_CALL_STATE`` it belongs to: the last answer's prompt does not fit the context
window, so the context policies shrink it first (COMPACT, without a summary: there is no
call to spare for one), through the same rows as any prompt."""

LAST_ANSWER_DUE_GUARD = "last_answer_due"
"""The guard of the COMPACT row that goes on into ``LAST_CALL_STATE`` once the last answer's
prompt was compacted: COMPACT's work records the stop it compacts for (``RunState.closing``)."""

CLOSING_GUARDS: dict[str, StopReason] = {
    "closing_on_token_budget": R.TOKEN_BUDGET,
    "closing_on_max_turns": R.MAX_TURNS,
    "closing_on_timeout": R.TIMEOUT,
}
"""The guards of the rows out of ``LAST_CALL_STATE``, each true when the last answer was
written for the stop it names: the run then ends with the stop that fired, not with whatever
the last call's own tokens or time would trip. The last row out, unguarded, takes the one
remaining way in: loop detection."""

INPUT_GUARDRAIL_GUARD = "input_guardrail_tripped"
"""The guard of the row that stops a run whose input a guardrail did not pass: it leaves
``INITIAL_STATE`` (OBSERVE, whose work takes the input in), after nothing but rows that end
the run, so no way on skips it (the verifier checks)."""

OUTPUT_GUARDRAIL_GUARD = "output_guardrail_tripped"
"""The guard of the rows that stop a run whose answer a guardrail did not pass: they leave
the states whose work takes in an answer that would end the run (``OUTPUT_GUARDRAIL_STATES``:
THINK's final answer, REFLECT's finish_task summary or terminal tool output, which ACT
screened, and the last answer), before any row into DONE (the verifier checks)."""

OUTPUT_GUARDRAIL_STATES = frozenset({S.THINK, S.REFLECT, S.LAST_ANSWER})
"""Where a row guarded by ``OUTPUT_GUARDRAIL_GUARD`` may stand."""

RESUME_TRIGGER = T.RESUMED
"""The trigger of the resume rows: fired only on a reopened run, by ``Agent.resume``."""

CRASH_GUARD = "stopped_by_crash"
"""The stop guard of the rows that restart a step (``Verb.RESTART``): the run did not stop,
its process died mid-step, and it is reopened from its last checkpoint. Each such row leaves
a loop state for itself, so the step is done again; a state without one cannot be recovered
after a crash."""

STOP_GUARDS: dict[str, frozenset[StopReason]] = {
    "stopped_to_ask_user": frozenset({R.ASK_USER}),
    "stopped_for_approval": frozenset({R.APPROVAL_REQUIRED}),
    "stopped_for_sub_agent": frozenset({R.SUB_AGENT_PAUSED}),
    "stopped_by_interruption": frozenset({R.ABORTED, R.TIMEOUT}),
    "stopped_by_transient_model_failure": frozenset({R.MODEL_ERROR}),
    "stopped_by_context_window": frozenset({R.CONTEXT_WINDOW}),
    CRASH_GUARD: frozenset(),
}
"""The guards that say which stop a resume row leaves, and the stop reasons each accepts (a
crash is no stop: ``CRASH_GUARD`` accepts none). Every resume row names exactly one of them
(the verifier checks), so the rows alone say which stops can be resumed:
``resumable_stops``."""

ANSWER_GUARDS = frozenset({"reply_given", "approvals_decided", "sub_agent_answered"})
"""The guards of resume rows that read the answer a resume gives, rather than the stop."""

CONTROL_GUARDS: dict[str, StopReason] = {
    "ask_user_called": R.ASK_USER,
    "finish_task_called": R.FINISH_TASK,
    "terminal_tool_succeeded": R.TERMINAL_TOOL,
    "approval_pending": R.APPROVAL_REQUIRED,
    "sub_agent_paused": R.SUB_AGENT_PAUSED,
}
"""The guards that read the control requests of a turn (``RunState.requests``), each true
when the turn made a request of its kind, with the stop its row ends the run with. A turn
may make several (ask_user and finish_task in one reply, a terminal tool beside calls that
wait for approval): the REFLECT rows that name these guards decide which one ends the run,
first match first (``control_order``)."""

TRIGGER_FOR_STATE: dict[AgentState, Trigger] = {
    S.OBSERVE: T.OBSERVED,
    S.COMPACT: T.COMPACTED,
    S.SUMMARISE: T.SUMMARISED,
    S.THINK: T.THOUGHT,
    S.ACT: T.ACTED,
    S.REFLECT: T.REFLECTED,
    S.LAST_ANSWER: T.LAST_ANSWERED,
}


def _last_answer_before(trigger: Trigger, source: AgentState, *limit: str) -> tuple[Row, ...]:
    """The rows into LAST_ANSWER that soften the stop row right after them, guarded by
    ``limit``: taken instead of that row when the limits want a last answer; through COMPACT
    first when its prompt does not fit the window (``LAST_ANSWER_WINDOW_GUARD``). Their own
    guard comes first: it is the cheapest, and false by default, so the limit's guard (a
    prompt estimate, for the budget) is not evaluated twice on every turn. A state whose
    prompt was just checked against the window, or just compacted (OBSERVE, COMPACT), goes
    straight into LAST_ANSWER."""
    into = Row(trigger, source, S.LAST_ANSWER, (LAST_ANSWER_GUARD, *limit), V.LAST_ANSWER)
    if source in (S.OBSERVE, S.COMPACT):
        return (into,)
    shrink = (LAST_ANSWER_GUARD, *limit, LAST_ANSWER_WINDOW_GUARD)
    return (Row(trigger, source, S.COMPACT, shrink, V.COMPACT), into)


def _failed_call_rows(trigger: Trigger, source: AgentState, budget: str) -> tuple[Row, ...]:
    """The stops of a state whose model call failed (THINK, SUMMARISE), in priority order:
    the deadline cut it; the server refused the prompt as longer than its context (THINK
    shrinks it when the calibration, having learnt from the refusal, now says it exceeds the
    window, through COMPACT, which stops ``context_window`` if nothing shrinks it); it cannot
    succeed; no retry is left; the tokens left (``budget``, the guard that says they are not)
    cannot pay for another. A retry row comes after."""
    failed, overflowed = "model_call_failed", "context_overflowed"
    shrink = (
        (Row(trigger, source, S.COMPACT, (failed, overflowed, "prompt_exceeds_window"), V.COMPACT),)
        if source is S.THINK
        else ()
    )
    return (
        *_last_answer_before(trigger, source, failed, "time_is_up"),
        Row(trigger, source, S.ERROR, (failed, "time_is_up"), R.TIMEOUT),
        *shrink,
        Row(trigger, source, S.ERROR, (failed, overflowed), R.CONTEXT_WINDOW),
        Row(trigger, source, S.ERROR, (failed, "model_error_is_permanent"), R.MODEL_ERROR),
        Row(trigger, source, S.ERROR, (failed, "no_retries_left"), R.MODEL_ERROR),
        *_last_answer_before(trigger, source, failed, budget),
        Row(trigger, source, S.ERROR, (failed, budget), R.TOKEN_BUDGET),
        Row(trigger, source, S.ERROR, (failed, "prompt_exceeds_cost_budget"), R.COST_BUDGET),
    )


def crash_rows(*states: AgentState | str) -> tuple[Row, ...]:
    """The rows that restart each of ``states`` after a crash (``CRASH_GUARD``)."""
    return tuple(Row(T.RESUMED, state, state, (CRASH_GUARD,), V.RESTART) for state in states)


TABLE: tuple[Row, ...] = (
    # OBSERVE: new input has been taken into the transcript; can the next prompt be afforded?
    # (A resumed run arrives here without passing REFLECT, so the turn limit is checked too.)
    # The first priority of a turn, after abort: the prompt must fit the context window.
    # Every stop for the token budget, max_turns, the time limit or a loop, here and below,
    # is preceded by its row into LAST_ANSWER (``Limits.last_answer``; the verifier's rule 5).
    Row(T.OBSERVED, S.OBSERVE, S.ERROR, ("abort_requested",), R.ABORTED),
    # The input guardrails read what OBSERVE took in: nothing runs before they pass.
    Row(T.OBSERVED, S.OBSERVE, S.ERROR, (INPUT_GUARDRAIL_GUARD,), R.GUARDRAIL_TRIPPED),
    Row(T.OBSERVED, S.OBSERVE, S.COMPACT, ("prompt_exceeds_window",), V.COMPACT),
    *_last_answer_before(T.OBSERVED, S.OBSERVE, "prompt_exceeds_budget"),
    Row(T.OBSERVED, S.OBSERVE, S.ERROR, ("prompt_exceeds_budget",), R.TOKEN_BUDGET),
    Row(T.OBSERVED, S.OBSERVE, S.ERROR, ("prompt_exceeds_cost_budget",), R.COST_BUDGET),
    *_last_answer_before(T.OBSERVED, S.OBSERVE, "no_turns_left"),
    Row(T.OBSERVED, S.OBSERVE, S.ERROR, ("no_turns_left",), R.MAX_TURNS),
    Row(T.OBSERVED, S.OBSERVE, S.THINK, (), V.THINK),
    # COMPACT: the context policies have shrunk the prompt, or asked for a summary, which
    # is a model call like any other: it takes a turn and is paid from the token budget.
    # Entered for a last answer (a row guarded by LAST_ANSWER_WINDOW_GUARD), it goes on
    # into LAST_ANSWER.
    Row(T.COMPACTED, S.COMPACT, S.ERROR, ("abort_requested",), R.ABORTED),
    Row(
        T.COMPACTED,
        S.COMPACT,
        S.LAST_ANSWER,
        (LAST_ANSWER_GUARD, LAST_ANSWER_DUE_GUARD),
        V.LAST_ANSWER,
    ),
    *_last_answer_before(T.COMPACTED, S.COMPACT, "no_turns_left"),
    Row(T.COMPACTED, S.COMPACT, S.ERROR, ("no_turns_left",), R.MAX_TURNS),
    *_last_answer_before(T.COMPACTED, S.COMPACT, "budget_exhausted"),
    Row(T.COMPACTED, S.COMPACT, S.ERROR, ("budget_exhausted",), R.TOKEN_BUDGET),
    Row(T.COMPACTED, S.COMPACT, S.ERROR, ("cost_budget_spent",), R.COST_BUDGET),
    Row(T.COMPACTED, S.COMPACT, S.SUMMARISE, ("summary_requested",), V.SUMMARISE),
    Row(T.COMPACTED, S.COMPACT, S.ERROR, ("prompt_exceeds_window",), R.CONTEXT_WINDOW),
    *_last_answer_before(T.COMPACTED, S.COMPACT, "prompt_exceeds_budget"),
    Row(T.COMPACTED, S.COMPACT, S.ERROR, ("prompt_exceeds_budget",), R.TOKEN_BUDGET),
    Row(T.COMPACTED, S.COMPACT, S.ERROR, ("prompt_exceeds_cost_budget",), R.COST_BUDGET),
    Row(T.COMPACTED, S.COMPACT, S.THINK, (), V.THINK),
    # SUMMARISE: the model call of this turn wrote the summary a policy asked for (or failed:
    # then the same ways out as a failed call in THINK, retries included).
    Row(T.SUMMARISED, S.SUMMARISE, S.ERROR, ("abort_requested",), R.ABORTED),
    *_failed_call_rows(T.SUMMARISED, S.SUMMARISE, "budget_exhausted"),
    Row(T.SUMMARISED, S.SUMMARISE, S.SUMMARISE, ("model_call_failed",), V.RETRY),
    Row(T.SUMMARISED, S.SUMMARISE, S.OBSERVE, (), V.SUMMARISED),
    # THINK: one model call was made (turn += 1); what did it produce?
    Row(T.THOUGHT, S.THINK, S.ERROR, ("abort_requested",), R.ABORTED),
    *_failed_call_rows(T.THOUGHT, S.THINK, "prompt_exceeds_budget"),
    # The failed call's report raised the prompt estimate past the window: shrink it first
    # (the call after COMPACT is a new turn, gated there).
    Row(
        T.THOUGHT,
        S.THINK,
        S.COMPACT,
        ("model_call_failed", "prompt_exceeds_window"),
        V.COMPACT,
    ),
    Row(T.THOUGHT, S.THINK, S.THINK, ("model_call_failed",), V.RETRY),
    Row(T.THOUGHT, S.THINK, S.ERROR, ("reply_was_filtered",), R.CONTENT_FILTER),
    Row(T.THOUGHT, S.THINK, S.ERROR, ("reply_was_refused",), R.REFUSED),
    Row(T.THOUGHT, S.THINK, S.ACT, ("reply_has_tool_calls",), V.ACT),
    # The output guardrails read an answer that would end the run, before any row ends it
    # (a rewrite they ask for is a correction: the next row).
    Row(T.THOUGHT, S.THINK, S.ERROR, (OUTPUT_GUARDRAIL_GUARD,), R.GUARDRAIL_TRIPPED),
    # A final answer that did not validate against the output type: the correction goes back
    # to the model (through REFLECT, whose limits decide, ``output_retries`` among them).
    Row(T.THOUGHT, S.THINK, S.REFLECT, ("output_rejected",), V.CORRECT),
    # A reply that would end the run, while the caller has queued more input: go round again
    # (through REFLECT, so the budget guards still decide).
    Row(T.THOUGHT, S.THINK, S.REFLECT, ("input_waiting",), V.FOLLOW_UP),
    Row(T.THOUGHT, S.THINK, S.DONE, ("reply_was_truncated",), R.MAX_TOKENS),
    Row(T.THOUGHT, S.THINK, S.DONE, (), R.FINAL_ANSWER),
    # ACT: the reply's tool calls have all been answered.
    Row(T.ACTED, S.ACT, S.REFLECT, (), V.REFLECT),
    # REFLECT: evaluate the run; the order below is the guard priority. The control rows
    # (``CONTROL_GUARDS``) decide among the requests of one turn: the first that matches ends
    # the run, and ACT answers the turn's calls in this same order (``control_order``).
    Row(T.REFLECTED, S.REFLECT, S.ERROR, ("abort_requested",), R.ABORTED),
    # The output guardrails read a finish_task summary or a terminal tool's output that
    # would end the run (ACT screened it), before any row ends it with it.
    Row(T.REFLECTED, S.REFLECT, S.ERROR, (OUTPUT_GUARDRAIL_GUARD,), R.GUARDRAIL_TRIPPED),
    Row(T.REFLECTED, S.REFLECT, S.DONE, ("ask_user_called",), R.ASK_USER),
    Row(T.REFLECTED, S.REFLECT, S.DONE, ("finish_task_called",), R.FINISH_TASK),
    Row(T.REFLECTED, S.REFLECT, S.DONE, ("terminal_tool_succeeded",), R.TERMINAL_TOOL),
    Row(T.REFLECTED, S.REFLECT, S.DONE, ("approval_pending",), R.APPROVAL_REQUIRED),
    # A sub-agent stopped to ask the user or for approvals: the whole tree waits.
    Row(T.REFLECTED, S.REFLECT, S.DONE, ("sub_agent_paused",), R.SUB_AGENT_PAUSED),
    Row(T.REFLECTED, S.REFLECT, S.ERROR, ("too_many_errors",), R.CONSECUTIVE_ERRORS),
    Row(T.REFLECTED, S.REFLECT, S.ERROR, ("output_retries_exhausted",), R.INVALID_OUTPUT),
    *_last_answer_before(T.REFLECTED, S.REFLECT, "budget_exhausted"),
    Row(T.REFLECTED, S.REFLECT, S.ERROR, ("budget_exhausted",), R.TOKEN_BUDGET),
    Row(T.REFLECTED, S.REFLECT, S.ERROR, ("cost_budget_spent",), R.COST_BUDGET),
    *_last_answer_before(T.REFLECTED, S.REFLECT, "no_turns_left"),
    Row(T.REFLECTED, S.REFLECT, S.ERROR, ("no_turns_left",), R.MAX_TURNS),
    *_last_answer_before(T.REFLECTED, S.REFLECT, "time_is_up"),
    Row(T.REFLECTED, S.REFLECT, S.ERROR, ("time_is_up",), R.TIMEOUT),
    # The loop ladder (``Limits.loop_ladder``): a nudge, then the repeated tool withheld,
    # then the last answer (when wanted) and the stop.
    Row(T.REFLECTED, S.REFLECT, S.OBSERVE, ("is_looping", "nudge_due"), V.NUDGE),
    Row(T.REFLECTED, S.REFLECT, S.OBSERVE, ("is_looping", "withhold_due"), V.WITHHOLD),
    *_last_answer_before(T.REFLECTED, S.REFLECT, "is_looping"),
    Row(T.REFLECTED, S.REFLECT, S.ERROR, ("is_looping",), R.LOOP_DETECTED),
    Row(T.REFLECTED, S.REFLECT, S.DONE, ("reflector_says_done",), R.REFLECTOR_DONE),
    Row(T.REFLECTED, S.REFLECT, S.OBSERVE, (), V.CONTINUE),
    # LAST_ANSWER: the last answer was written (or could not be); the run ends with the stop
    # that asked for it. No abort row: that stop has fired already, and an abort during the
    # last answer cancels the call, nothing more. The output guardrails read the last
    # answer first: one they do not pass is not the run's output.
    Row(T.LAST_ANSWERED, S.LAST_ANSWER, S.ERROR, (OUTPUT_GUARDRAIL_GUARD,), R.GUARDRAIL_TRIPPED),
    Row(T.LAST_ANSWERED, S.LAST_ANSWER, S.ERROR, ("closing_on_token_budget",), R.TOKEN_BUDGET),
    Row(T.LAST_ANSWERED, S.LAST_ANSWER, S.ERROR, ("closing_on_max_turns",), R.MAX_TURNS),
    Row(T.LAST_ANSWERED, S.LAST_ANSWER, S.ERROR, ("closing_on_timeout",), R.TIMEOUT),
    Row(T.LAST_ANSWERED, S.LAST_ANSWER, S.ERROR, (), R.LOOP_DETECTED),
    # RESUMED: a stopped run was answered (Agent.resume). There is no "else" row: a stop that
    # no row leaves cannot be resumed, and resume refuses it before changing anything.
    Row(T.RESUMED, S.DONE, S.OBSERVE, ("stopped_to_ask_user", "reply_given"), V.ANSWER),
    Row(T.RESUMED, S.DONE, S.ACT, ("stopped_for_approval", "approvals_decided"), V.CARRY_OUT),
    # The answer of a paused sub-agent goes down to it; ACT resumes it, its result comes up.
    Row(T.RESUMED, S.DONE, S.ACT, ("stopped_for_sub_agent", "sub_agent_answered"), V.CARRY_OUT),
    Row(T.RESUMED, S.ERROR, S.OBSERVE, ("stopped_by_interruption",), V.RESUME),
    Row(T.RESUMED, S.ERROR, S.OBSERVE, ("stopped_by_transient_model_failure",), V.RECOVER),
    Row(T.RESUMED, S.ERROR, S.OBSERVE, ("stopped_by_context_window",), V.RESUME),
    # A run whose process died mid-step is reopened where its last checkpoint left it, and
    # does that step again (the tool journal keeps a call that ran from running twice).
    *crash_rows(S.OBSERVE, S.COMPACT, S.SUMMARISE, S.THINK, S.ACT, S.REFLECT, S.LAST_ANSWER),
)
"""The loop, in priority order. Change it and ``machine.py`` re-verifies it at construction."""


_RESUMABLE: dict[int, tuple[tuple[Row, ...], frozenset[StopReason]]] = {}
"""``resumable_stops`` by the identity of the rows it was asked about: asked for every run's
result (``state.status_for``), it would otherwise scan the table each time."""


def resumable_stops(rows: tuple[Row, ...]) -> frozenset[StopReason]:
    """The stop reasons some resume row of ``rows`` may leave (a row may still refuse a given
    run: a model failure must have been transient). The one place this set is known."""
    known = _RESUMABLE.get(id(rows))
    if known is not None and known[0] is rows:
        return known[1]
    stops = frozenset(
        reason
        for row in rows
        if row.resumes
        for guard in row.guards
        for reason in STOP_GUARDS.get(guard, ())
    )
    if len(_RESUMABLE) < 256:  # a handful of tables per process; never grows without bound
        _RESUMABLE[id(rows)] = (rows, stops)
    return stops


def softened_stop(rows: tuple[Row, ...], index: int) -> StopReason | None:
    """The stop reason of the row that ``rows[index]`` softens: for a row into
    ``LAST_CALL_STATE``, the next row, of the same group, with the same guards but
    ``LAST_ANSWER_GUARD``, into DONE or ERROR; for the row into COMPACT right before it (its
    guards and ``LAST_ANSWER_WINDOW_GUARD``), that row's. None when there is no such row (the
    verifier refuses that table)."""
    row = rows[index]
    if LAST_ANSWER_GUARD not in row.guards or index + 1 >= len(rows):
        return None
    after = rows[index + 1]
    if (after.trigger, after.source) != (row.trigger, row.source):
        return None
    if row.dest is AgentState.COMPACT:
        shrinks = after.dest == LAST_CALL_STATE and set(after.guards) == set(row.guards) - {
            LAST_ANSWER_WINDOW_GUARD
        }
        return softened_stop(rows, index + 1) if shrinks else None
    if row.dest == LAST_CALL_STATE and set(after.guards) == set(row.guards) - {LAST_ANSWER_GUARD}:
        return after.stop_reason
    return None


_CONTROL_ORDERS: dict[int, tuple[tuple[Row, ...], tuple[StopReason, ...]]] = {}


def control_order(rows: tuple[Row, ...]) -> tuple[StopReason, ...]:
    """The control stops (``CONTROL_GUARDS``) in the order the REFLECT rows try them: the
    priority among the requests of one turn. ACT answers a turn's calls in this order (a
    turn that calls ask_user and finish_task answers the first-ranked as made and skips the
    other), so the transcript agrees with the row that ends the run."""
    known = _CONTROL_ORDERS.get(id(rows))
    if known is not None and known[0] is rows:
        return known[1]
    order: list[StopReason] = []
    for row in rows:
        if row.trigger is Trigger.REFLECTED:
            for guard in row.guards:
                stop = CONTROL_GUARDS.get(guard)
                if stop is not None and stop not in order:
                    order.append(stop)
    if len(_CONTROL_ORDERS) < 256:  # a handful of tables per process
        _CONTROL_ORDERS[id(rows)] = (rows, tuple(order))
    return tuple(order)
