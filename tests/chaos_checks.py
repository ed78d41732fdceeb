"""The chaos test's verdicts (``tests/chaos.py``): what must hold of every run once the
fleet has stopped, read from the store, DBOS's results and the ledger of
``tests/chaos_worker.py``.

- Every run is there (none lost, none extra), and finished once: DONE with "done", its
  result the same however often it is read, and the same as its finisher saw it;
- every transcript keeps the run invariants (``check_invariants``, and ``state_problems``
  for a checkpoint), with the agent's limits and bound, and has every planned step;
- no effect twice: at most one ``effects`` row per (run, call id), and per (run, step, tool);
- every answer tells the truth: a call answered as done has its effect, one answered "not
  run" (or skipped) has none, one whose outcome is unknown may have either; an effect
  belongs to a call of the transcript;
- every ``transfer`` that ran was named by a click for its run, and no late click was
  applied (it answers a pause the run had left); every click was answered.
"""

from __future__ import annotations

import collections
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from agent_fsm import Agent, AgentState, RunResult, StopReason
from agent_fsm.durable.postgres import PostgresStore
from agent_fsm.messages import AssistantMessage, Message, ToolMessage, UserMessage
from agent_fsm.state import RunState
from agent_fsm.table import TERMINAL_STATES
from agent_fsm.testing.invariants import check_invariants, state_problems
from tests.chaos_worker import PRIMARY, Ledger, digest, plan, said_not_run


@dataclass(frozen=True, slots=True)
class Effect:
    run_id: str
    call_id: str
    step: int
    tool: str
    worker: str


@dataclass(frozen=True, slots=True)
class ClickRow:
    number: int
    run_id: str
    pause: str
    calls: tuple[str, ...]
    kind: str
    """``prompt``, ``double`` (the same again at once) or ``late`` (once the run left the
    pause)."""
    outcome: str | None
    holders: tuple[str, ...] = ()
    """The workers that took the click, in turn (a worker that dies holding it leaves it to
    the next)."""


@dataclass
class Tally:
    """What the verdicts counted, besides the problems they found."""

    answers: collections.Counter[str] = field(default_factory=collections.Counter)
    """Primary calls by how they were answered (``verdicts``)."""
    strange: list[str] = field(default_factory=list)
    """Answers of the ``error`` kind (neither done, nor unknown, nor not run): what they
    said."""
    invariant_violations: int = 0
    duplicates: int = 0
    """(run, call id) pairs with more than one effect."""
    step_duplicates: int = 0
    """(run, step, tool) with more than one effect: a "not run" that was a lie."""
    problems: list[str] = field(default_factory=list)

    def problem(self, run_id: str, text: str) -> None:
        self.problems.append(f"{run_id}: {text}")


_OUTCOME = re.compile(r"^- (\w+) \(call ([^)]+)\): (.*)$", re.MULTILINE)


def verdicts(result: RunResult) -> dict[str, str]:
    """How each primary call of the transcript was answered, by call id: ``done``,
    ``unknown`` (it may have run), ``not-run`` or ``error``; a ``transfer`` is ``awaiting``
    its approval, then answered in the user message that follows the decision (``denied``
    when it was one)."""
    found: dict[str, str] = {}
    for message in result.messages:
        if isinstance(message, ToolMessage) and message.name in PRIMARY:
            found[message.tool_call_id] = _verdict(message)
        elif isinstance(message, UserMessage) and isinstance(message.content, str):
            for name, call_id, text in _OUTCOME.findall(message.content):
                if name in PRIMARY:
                    found[call_id] = _outcome_verdict(text)
    return found


def _answer_text(result: RunResult, call_id: str) -> str:
    for message in result.messages:
        if isinstance(message, ToolMessage) and message.tool_call_id == call_id:
            return message.content
    return "(in a user message)"


def _verdict(answer: ToolMessage) -> str:
    runtime = answer.details.get("runtime") if isinstance(answer.details, dict) else None
    if isinstance(runtime, dict) and runtime.get("awaiting_approval"):
        return "awaiting"
    if answer.status.value == "ok":
        return "done"
    if isinstance(runtime, dict) and runtime.get("outcome_unknown"):
        return "unknown"
    return "not-run" if said_not_run(answer) else "error"


def _outcome_verdict(text: str) -> str:
    if text.startswith("approved and run"):
        return "done"
    if "is unknown" in text:
        return "unknown"
    if text.startswith("denied"):
        return "denied"
    if "was not run" in text or "Skipped:" in text:
        return "not-run"
    return "error"


def check_run(
    tally: Tally,
    result: RunResult,
    agent: Agent,
    effects: Sequence[Effect],
    clicked: set[str],
) -> None:
    """The verdicts on one finished run's result (``clicked``: the call ids the clicks for
    this run named)."""
    run_id = result.run_id
    try:
        check_invariants(result, limits=agent.limits, bound=agent.bound)
    except AssertionError as broken:
        tally.invariant_violations += 1
        tally.problem(run_id, f"invariants: {broken}")
    ended = (result.final_state, result.stop_reason, result.output)
    if ended != (AgentState.DONE, StopReason.FINAL_ANSWER, "done"):
        tally.problem(run_id, f"ended {ended}")
    calls = {
        call.id: call
        for message in result.messages
        if isinstance(message, AssistantMessage)
        for call in message.tool_calls
        if call.name in PRIMARY
    }
    steps = {int(call.id.split("-")[1]) for call in calls.values()}
    if steps != set(range(1, len(plan(run_id)) + 1)):
        tally.problem(run_id, f"steps made: {sorted(steps)}")
    answered = verdicts(result)
    made = {effect.call_id for effect in effects}
    for call_id in calls:
        verdict = answered.get(call_id, "unanswered")
        tally.answers[verdict] += 1
        if verdict == "error":
            tally.strange.append(f"{run_id} {call_id}: {_answer_text(result, call_id)[:300]}")
        if verdict == "done" and call_id not in made:
            tally.problem(run_id, f"{call_id} answered done, but it has no effect")
        if verdict in ("not-run", "denied", "awaiting", "unanswered") and call_id in made:
            tally.problem(run_id, f"{call_id} answered {verdict}, but its effect happened")
        if verdict in ("denied", "awaiting", "unanswered"):
            tally.problem(run_id, f"{call_id} was {verdict}: every approval was given")
    for effect in effects:
        if effect.call_id not in calls:
            tally.problem(run_id, f"an effect of {effect.call_id}, a call not in the transcript")
        if effect.tool == "transfer" and effect.call_id not in clicked:
            tally.problem(run_id, f"{effect.call_id} transferred, but no click named it")


def check_effects(tally: Tally, effects: Iterable[Effect]) -> None:
    """No effect twice, per call and per step."""
    effects = list(effects)
    per_call = collections.Counter((e.run_id, e.call_id) for e in effects)
    per_step = collections.Counter((e.run_id, e.step, e.tool) for e in effects)
    for (run_id, call_id), n in sorted(per_call.items()):
        if n > 1:
            tally.duplicates += 1
            workers = [e.worker for e in effects if (e.run_id, e.call_id) == (run_id, call_id)]
            tally.problem(run_id, f"{call_id} took effect {n} times (by {workers})")
    for (run_id, step, tool), n in sorted(per_step.items()):
        if n > 1:
            tally.step_duplicates += 1
            tally.problem(run_id, f"step {step} ({tool}) took effect {n} times")


def check_clicks(tally: Tally, clicks: Iterable[ClickRow]) -> None:
    """Every click answered; no late one applied. (A prompt click may be refused: the worker
    that applied it first lost the run, which another worker carried on, before it could
    write that down. The transcripts say every pause was approved: ``check_run``.)"""
    for click in clicks:
        if click.outcome is None:
            tally.problem(click.run_id, f"click {click.number} ({click.kind}) never answered")
        elif click.kind == "late" and click.outcome != "refused":
            tally.problem(
                click.run_id,
                f"late click {click.number} for {click.pause} was {click.outcome}",
            )


def check_checkpoint(tally: Tally, state: RunState, agent: Agent) -> None:
    """A leases-only run's stored checkpoint keeps the invariants between steps."""
    found = state_problems(state, agent.machine.rows, limits=agent.limits, bound=agent.bound)
    if found:
        tally.invariant_violations += 1
        tally.problem(state.run_id, f"checkpoint: {found}")


def same_result(tally: Tally, run_id: str, what: str, first: str, again: str | None) -> None:
    """The run's result as its finisher saw it (a digest) is the one stored."""
    if again is not None and first != again:
        tally.problem(run_id, f"its result changed: {what}")


def same_transcript(
    tally: Tally, run_id: str, what: str, first: Sequence[Message], again: Sequence[Message]
) -> None:
    """The run's transcript read twice (or from DBOS and from the store) is the same; else
    where they part."""
    if digest(list(first)) == digest(list(again)):
        return
    index = next(
        (n for n, (a, b) in enumerate(zip(first, again, strict=False)) if a != b),
        min(len(first), len(again)),
    )

    def shown(messages: Sequence[Message]) -> str:
        if index >= len(messages):
            return "(none)"
        return repr(messages[index])[:300]

    tally.problem(
        run_id,
        f"its result changed: {what}: {len(first)} and {len(again)} messages, first"
        f" different at {index}: {shown(first)} / {shown(again)}",
    )


# -- reading what the fleet left ---------------------------------------------------------------


@dataclass
class Left:
    """What the fleet left in the ledger (``tests/chaos_worker.py``'s tables)."""

    effects: dict[str, list[Effect]]
    clicks: list[ClickRow]
    finishes: dict[str, list[tuple[str, str | None]]]
    """Per run, who saw it finish, and the digest of its transcript then (leases-only)."""

    @classmethod
    def read(cls, ledger: Ledger) -> Left:
        effects: dict[str, list[Effect]] = collections.defaultdict(list)
        for row in ledger.execute("SELECT run_id, call_id, step, tool, worker FROM effects"):
            effects[row[0]].append(Effect(*row))
        clicks = [
            ClickRow(n, run_id, pause, tuple(calls), kind, outcome, tuple(holders or ()))
            for n, run_id, pause, calls, kind, outcome, holders in ledger.execute(
                "SELECT id, run_id, pause, calls, kind, outcome, holders FROM clicks ORDER BY id"
            )
        ]
        finishes: dict[str, list[tuple[str, str | None]]] = collections.defaultdict(list)
        for run_id, worker, text in ledger.execute("SELECT run_id, worker, digest FROM finishes"):
            finishes[run_id].append((worker, text))
        return cls(effects, clicks, finishes)

    def workers_of(self, run_id: str) -> set[str]:
        """The workers that took a click of ``run_id`` or made one of its effects: the
        ones that drove it, as far as the ledger tells."""
        clicks = {w for click in self.clicks if click.run_id == run_id for w in click.holders}
        return clicks | {effect.worker for effect in self.effects.get(run_id, [])}

    def clicked(self, run_id: str) -> set[str]:
        """The call ids the clicks for ``run_id`` named."""
        return {call for click in self.clicks if click.run_id == run_id for call in click.calls}


def judge(
    tally: Tally,
    left: Left,
    results: dict[str, RunResult],
    agent: Agent,
    run_ids: Sequence[str],
) -> None:
    """Every verdict on the finished runs' ``results`` and what the fleet ``left``."""
    check_effects(tally, [e for rows in left.effects.values() for e in rows])
    check_clicks(tally, left.clicks)
    for run_id, result in sorted(results.items()):
        check_run(tally, result, agent, left.effects.get(run_id, []), left.clicked(run_id))
    lost = sorted(set(run_ids) - set(results))
    if lost:
        tally.problems.append(f"runs not finished: {lost}")
    extra = sorted(set(left.effects) - set(run_ids))
    if extra:
        tally.problems.append(f"effects of unknown runs: {extra}")


def leases_results(
    tally: Tally,
    store: PostgresStore,
    left: Left,
    agent: Agent,
    run_ids: Sequence[str],
    killed: set[str],
) -> dict[str, RunResult]:
    """Leases-only: the finished runs of the store; each finished by one worker, as that
    worker saw it (a worker killed just after a run's last save never wrote it down), its
    checkpoint within the invariants, and the same when read again."""
    summaries = {s.run_id: s for s in store.list_runs()}
    if sorted(summaries) != sorted(run_ids):
        tally.problems.append(f"the store holds {len(summaries)} runs, not {len(run_ids)}")
    results: dict[str, RunResult] = {}
    for run_id, summary in sorted(summaries.items()):
        state = store.load(run_id)
        check_checkpoint(tally, state, agent)
        if state.state not in TERMINAL_STATES:
            continue
        result = RunResult.from_state(state)
        if result.status == "needs_input":
            continue
        results[run_id] = result
        seen = left.finishes.get(run_id, [])
        if len(seen) > 1:
            tally.problem(run_id, f"finished by {len(seen)} workers: {seen}")
        elif (
            not seen and summary.lease_holder not in killed and not killed & left.workers_of(run_id)
        ):
            # A worker writes a run's finish down once its last save is in and its lease
            # let go; one killed in between (by a fault armed for another run's save or
            # call, in the same process) never does, and holds no lease any more: a worker
            # that drove the run and was killed may be the one that finished it.
            tally.problem(run_id, "finished, but no worker saw it finish")
        for _, text in seen:
            same_result(tally, run_id, "finisher vs store", digest(result.messages), text)
        again = store.load(run_id)
        same_transcript(tally, run_id, "read twice", result.messages, again.messages)
    return results


def dbos_results(
    tally: Tally, client: Any, store: PostgresStore, run_ids: Sequence[str]
) -> dict[str, RunResult]:
    """DBOS: the finished runs. Every workflow succeeded; each run's workflows (the run,
    then its resumes) paused until the last, which finished; its result read twice is the
    same, and so is the checkpoint of a resumed run (each of its stops is saved)."""
    chains: dict[str, dict[int, Any]] = collections.defaultdict(dict)
    for status in client.list_workflows(load_input=False):
        if status.status != "SUCCESS":
            tally.problem(status.workflow_id, f"workflow {status.status}: {status.error}")
        run_id, _, resume = status.workflow_id.partition(":resume-")
        chains[run_id][int(resume or 0)] = status.output
    if sorted(chains) != sorted(run_ids):
        tally.problems.append(f"DBOS holds {len(chains)} runs, not {len(run_ids)}")
    results: dict[str, RunResult] = {}
    for run_id, chain in sorted(chains.items()):
        order = [chain[n] for n in sorted(chain)]
        if sorted(chain) != list(range(len(chain))):
            tally.problem(run_id, f"workflows {sorted(chain)}")
        ends = [r for r in order if isinstance(r, RunResult) and r.status != "needs_input"]
        if len(ends) != 1 or order[-1] is not ends[-1]:
            tally.problem(run_id, f"{len(ends)} finished results among {len(order)} workflows")
        if not ends:
            continue
        result = results[run_id] = ends[-1]
        last = max(chain)
        workflow = run_id if last == 0 else f"{run_id}:resume-{last}"
        again = client.retrieve_workflow(workflow).get_result()
        same_transcript(tally, run_id, "read twice", result.messages, again.messages)
        if last:
            stored = store.load(run_id).messages
            same_transcript(tally, run_id, "workflow vs checkpoint", result.messages, stored)
    return results
