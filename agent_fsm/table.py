"""THE TABLE: the agent loop as plain data.

Everything about the loop's control flow lives here and nowhere else: ``machine.py`` builds the
``transitions`` machine from these rows, verifies them and computes the termination bound;
``diagrams.py`` draws them. Rows for one (trigger, source) pair are tried top to bottom and the
first row whose guards all pass wins, so **row order is guard priority**: safety first (abort),
then control-flow tools, then limits, then loop detection, then "continue".

Guards are referenced by name; ``guards.py`` defines a pure function for each name and
``machine.py`` refuses a table that names an unknown guard.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

__all__ = [
    "INITIAL_STATE",
    "TABLE",
    "TERMINAL_STATES",
    "TRIGGER_FOR_STATE",
    "TURN_BUDGET_GUARD",
    "TURN_STATE",
    "AgentState",
    "Row",
    "StopReason",
    "Trigger",
]


class AgentState(StrEnum):
    """The states of the loop; DONE and ERROR are terminal."""

    OBSERVE = "OBSERVE"
    THINK = "THINK"
    ACT = "ACT"
    REFLECT = "REFLECT"
    DONE = "DONE"
    ERROR = "ERROR"


class Trigger(StrEnum):
    """One trigger per non-terminal state, fired when that state's work is finished."""

    OBSERVED = "observed"
    THOUGHT = "thought"
    ACTED = "acted"
    REFLECTED = "reflected"


class StopReason(StrEnum):
    """Why a run ended (or paused). The value is the label of the row that ended it."""

    FINAL_ANSWER = "final_answer"
    FINISH_TASK = "finish_task"
    ASK_USER = "ask_user"
    APPROVAL_REQUIRED = "approval_required"
    MAX_TOKENS = "max_tokens"
    ABORTED = "aborted"
    MODEL_ERROR = "model_error"
    CONTENT_FILTER = "content_filter"
    CONSECUTIVE_ERRORS = "consecutive_errors"
    TOKEN_BUDGET = "token_budget"
    MAX_TURNS = "max_turns"
    TIMEOUT = "timeout"
    LOOP_DETECTED = "loop_detected"
    REFLECTOR_DONE = "reflector_done"


@dataclass(frozen=True, slots=True)
class Row:
    """One transition: taken on ``trigger`` from ``source`` when every guard passes."""

    trigger: Trigger
    source: AgentState
    dest: AgentState
    guards: tuple[str, ...]
    """Names of pure guard functions that must all be true; empty means "else"."""
    label: str
    """The stop reason for rows into a terminal state, otherwise a short verb."""

    @property
    def stop_reason(self) -> StopReason | None:
        """The StopReason this row ends the run with, or None if it continues the loop."""
        return StopReason(self.label) if self.dest in TERMINAL_STATES else None


S = AgentState
T = Trigger
R = StopReason

INITIAL_STATE = S.OBSERVE
TERMINAL_STATES = frozenset({S.DONE, S.ERROR})

TURN_STATE = S.THINK
"""Entering this state makes one model call: every row into it counts one turn."""

TURN_BUDGET_GUARD = "no_turns_left"
"""The guard that is true when no model call remains; it gates every cycle of the loop."""

TRIGGER_FOR_STATE: dict[AgentState, Trigger] = {
    S.OBSERVE: T.OBSERVED,
    S.THINK: T.THOUGHT,
    S.ACT: T.ACTED,
    S.REFLECT: T.REFLECTED,
}

TABLE: tuple[Row, ...] = (
    # OBSERVE: new input has been taken into the transcript; can the next prompt be afforded?
    # (A resumed run arrives here without passing REFLECT, so the turn limit is checked too.)
    Row(T.OBSERVED, S.OBSERVE, S.ERROR, ("abort_requested",), R.ABORTED),
    Row(T.OBSERVED, S.OBSERVE, S.ERROR, ("prompt_exceeds_budget",), R.TOKEN_BUDGET),
    Row(T.OBSERVED, S.OBSERVE, S.ERROR, ("no_turns_left",), R.MAX_TURNS),
    Row(T.OBSERVED, S.OBSERVE, S.THINK, (), "think"),
    # THINK: one model call was made (turn += 1); what did it produce?
    Row(T.THOUGHT, S.THINK, S.ERROR, ("abort_requested",), R.ABORTED),
    Row(T.THOUGHT, S.THINK, S.ERROR, ("model_call_failed", "time_is_up"), R.TIMEOUT),
    Row(
        T.THOUGHT,
        S.THINK,
        S.ERROR,
        ("model_call_failed", "model_error_is_permanent"),
        R.MODEL_ERROR,
    ),
    Row(T.THOUGHT, S.THINK, S.ERROR, ("model_call_failed", "too_many_errors"), R.MODEL_ERROR),
    Row(T.THOUGHT, S.THINK, S.ERROR, ("model_call_failed", "no_turns_left"), R.MAX_TURNS),
    Row(
        T.THOUGHT, S.THINK, S.ERROR, ("model_call_failed", "prompt_exceeds_budget"), R.TOKEN_BUDGET
    ),
    Row(T.THOUGHT, S.THINK, S.THINK, ("model_call_failed",), "retry"),
    Row(T.THOUGHT, S.THINK, S.ERROR, ("reply_was_filtered",), R.CONTENT_FILTER),
    Row(T.THOUGHT, S.THINK, S.ACT, ("reply_has_tool_calls",), "act"),
    # A reply that would end the run, while the caller has queued more input: go round again
    # (through REFLECT, so the budget guards still decide).
    Row(T.THOUGHT, S.THINK, S.REFLECT, ("input_waiting",), "follow_up"),
    Row(T.THOUGHT, S.THINK, S.DONE, ("reply_was_truncated",), R.MAX_TOKENS),
    Row(T.THOUGHT, S.THINK, S.DONE, (), R.FINAL_ANSWER),
    # ACT: the reply's tool calls have all been answered.
    Row(T.ACTED, S.ACT, S.REFLECT, (), "reflect"),
    # REFLECT: evaluate the run; the order below is the guard priority.
    Row(T.REFLECTED, S.REFLECT, S.ERROR, ("abort_requested",), R.ABORTED),
    Row(T.REFLECTED, S.REFLECT, S.DONE, ("ask_user_called",), R.ASK_USER),
    Row(T.REFLECTED, S.REFLECT, S.DONE, ("finish_task_called",), R.FINISH_TASK),
    Row(T.REFLECTED, S.REFLECT, S.DONE, ("approval_pending",), R.APPROVAL_REQUIRED),
    Row(T.REFLECTED, S.REFLECT, S.ERROR, ("too_many_errors",), R.CONSECUTIVE_ERRORS),
    Row(T.REFLECTED, S.REFLECT, S.ERROR, ("budget_exhausted",), R.TOKEN_BUDGET),
    Row(T.REFLECTED, S.REFLECT, S.ERROR, ("no_turns_left",), R.MAX_TURNS),
    Row(T.REFLECTED, S.REFLECT, S.ERROR, ("time_is_up",), R.TIMEOUT),
    Row(T.REFLECTED, S.REFLECT, S.ERROR, ("is_looping",), R.LOOP_DETECTED),
    Row(T.REFLECTED, S.REFLECT, S.DONE, ("reflector_says_done",), R.REFLECTOR_DONE),
    Row(T.REFLECTED, S.REFLECT, S.OBSERVE, (), "continue"),
)
"""The loop, in priority order. Change it and ``machine.py`` re-verifies it at construction."""
