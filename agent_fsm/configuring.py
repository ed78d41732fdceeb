"""What an ``Agent``'s arguments become: each checked, and what it implies for the runs.

``Agent.__post_init__`` turns its fields into one ``RunConfig`` with these: the machine of its
table, its limits with the model's own window, its context policies, output spec, pricing and
token counter, where its runs live, and the guards no run of it can take (``dead_guards``).
Each check raises ``ConfigError`` naming what is wrong, at construction, before any run: a
tool that asks for a row the table lacks, a sub-agent that calls itself, a model without a
price. ``check_given_id`` and ``check_input_parts`` also guard what each call to run is given.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Sequence

from agent_fsm.compaction import ContextPolicy
from agent_fsm.custom_table import Table
from agent_fsm.durable.checkpoint import CheckpointStore
from agent_fsm.durable.leases import LeaseStore, check_id, check_ttl, default_worker_id
from agent_fsm.errors import ConfigError, ToolSchemaWarning
from agent_fsm.guardrails import Guardrail
from agent_fsm.limits import Limits
from agent_fsm.loop.machine import AgentMachine, with_builtin_guards
from agent_fsm.messages import Message, ToolMessage, ToolSpec, UserMessage
from agent_fsm.models.base import Model, ReviewsToolSchemas, TakesParts
from agent_fsm.output import OutputMode, OutputSpec, OutputType
from agent_fsm.pricing import Pricing
from agent_fsm.run.delegation import Delegable, delegate_of
from agent_fsm.run.engine import Reflector
from agent_fsm.run.residence import InProcess, Residence, Timekeeping
from agent_fsm.run.stored import Leased, Stored
from agent_fsm.state import ControlKind
from agent_fsm.table import (
    CONTROL_GUARDS,
    INPUT_GUARDRAIL_GUARD,
    OUTPUT_GUARDRAIL_GUARD,
    TABLE,
    Row,
    StopReason,
)
from agent_fsm.tokens import TextCounter, estimate_text_tokens
from agent_fsm.tools.tool import ASK_USER, FINISH_TASK, Tool, ToolRegistry

__all__ = [
    "CONTROL_TOOLS",
    "check_control_rows",
    "check_given_id",
    "check_guardrail_rows",
    "check_input_parts",
    "check_sub_agents",
    "context_policies",
    "dead_guards",
    "guardrail_guards",
    "machine_for",
    "output_spec",
    "pricing_for",
    "residence_for",
    "review_tool_schemas",
    "token_counter",
    "with_model_window",
]

CONTROL_TOOLS = {"ask_user": ASK_USER, "finish_task": FINISH_TASK}
"""The built-in control tools an agent offers by name (``Agent.control_tools``)."""
_DEFAULT_MACHINE: AgentMachine | None = None


def machine_for(table: tuple[Row, ...] | Table) -> AgentMachine:
    """The shared machine for the default table (built once per process), or a new one.

    Raises:
        ConfigError: the table fails verification, or is neither rows nor a ``Table``.
    """
    global _DEFAULT_MACHINE
    if table is TABLE:
        if _DEFAULT_MACHINE is None:
            _DEFAULT_MACHINE = AgentMachine(TABLE)
        return _DEFAULT_MACHINE
    if isinstance(table, Table):
        return AgentMachine(table.rows, with_builtin_guards(table.guards), table.states)
    if not isinstance(table, tuple) or not all(isinstance(row, Row) for row in table):
        raise ConfigError(f"table must be a Table or a tuple of Rows, got {type(table).__name__}")
    return AgentMachine(table)


def with_model_window(limits: Limits, model: Model) -> Limits:
    """``limits``, with the model's own ``context_window`` when the limits name none."""
    window = getattr(model, "context_window", None)
    if limits.context_window is not None or window is None:
        return limits
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ConfigError(f"the model's context_window must be a positive int, got {window!r}")
    return Limits(**{**limits.model_dump(exclude_unset=True), "context_window": window})


def context_policies(
    given: ContextPolicy | Sequence[ContextPolicy] | None, limits: Limits
) -> tuple[ContextPolicy, ...]:
    """The agent's context policies, checked: each a ContextPolicy, and a window to keep."""
    if given is None:
        return ()
    policies = (given,) if isinstance(given, ContextPolicy) else tuple(given)
    for policy in policies:
        if isinstance(policy, type):
            raise ConfigError(
                f"context_policy got the class {policy.__name__}, not a policy: pass an "
                f"instance, {policy.__name__}(...)"
            )
        if not isinstance(policy, ContextPolicy):
            raise ConfigError(
                f"context_policy must be ContextPolicy objects (a `name` and "
                f"`shrink(context)`), got {type(policy).__name__}"
            )
        model = getattr(policy, "model", None)
        if model is not None and (
            not isinstance(model, Model) or not inspect.iscoroutinefunction(model.request)
        ):
            raise ConfigError(
                f"{type(policy).__name__}(model=...) must implement the Model protocol, got "
                f"{type(model).__name__}"
            )
    if policies and limits.context_window is None:
        raise ConfigError(
            "a context policy needs a context window to keep the prompt in: set "
            "Limits(context_window=...) or use a model that knows its own (context_window)"
        )
    return policies


def output_spec(
    output_type: OutputType | None, mode: OutputMode, model: Model
) -> OutputSpec | None:
    """The agent's output spec; native mode needs a model that says it supports it."""
    if output_type is None:
        return None
    spec = OutputSpec(output_type, mode=mode)
    if mode == "native" and getattr(model, "supports_native_output", False) is not True:
        raise ConfigError(
            f"output_mode='native' needs a model that constrains its reply to a JSON Schema "
            f"(supports_native_output); {type(model).__name__} does not say it does: use "
            "output_mode='tool'"
        )
    return spec


def review_tool_schemas(model: Model, tools: Sequence[ToolSpec]) -> None:
    """Let a model whose provider cannot take every JSON Schema keyword say so now: a schema
    it cannot send at all is a ``ConfigError``, one it sends with keywords dropped or rewritten
    a ``ToolSchemaWarning``; each names the tool, the keyword and the provider."""
    if not tools or not isinstance(model, ReviewsToolSchemas):
        return
    issues = list(model.tool_schema_issues(tools))
    fatal = [str(issue) for issue in issues if issue.fatal]
    if fatal:
        raise ConfigError("tool schemas the model cannot be sent:\n- " + "\n- ".join(fatal))
    for issue in issues:
        warnings.warn(str(issue), ToolSchemaWarning, stacklevel=4)


def check_input_parts(model: Model, messages: Sequence[Message | str]) -> None:
    """Refuse, before the run starts, images and files of the input (and of the history it
    goes on from) that the model's provider cannot take (``TakesParts``): a wrong media type,
    a URL it does not fetch, a part too large, too many for one request."""
    if not isinstance(model, TakesParts):
        return
    parts = [
        part
        for message in messages
        if isinstance(message, UserMessage | ToolMessage)
        for part in message.parts
    ]
    why = model.part_support.request_problem(parts) if parts else None
    if why is not None:
        raise ConfigError(f"the input cannot be sent to {model.name}: {why}")


def residence_for(
    store: CheckpointStore | None,
    lease_s: float | None,
    worker_id: str | None,
    time: Timekeeping,
) -> Residence:
    """Where the agent's runs live: in this process, in ``store``, or leased from it.

    Raises:
        ConfigError: a lease without a store that leases runs, a ``lease_s`` or
            ``worker_id`` of the wrong kind.
    """
    if worker_id is not None:
        check_given_id("worker id", worker_id)
    if lease_s is None:
        return InProcess(time) if store is None else Stored(store, time)
    ttl_s = check_ttl(lease_s)
    if not isinstance(store, LeaseStore):
        raise ConfigError(
            "lease_s needs a store that the workers share and that leases runs (SQLiteStore,"
            f" PostgresStore, MemoryStore), got {type(store).__name__}"
        )
    return Leased(store, ttl_s=ttl_s, worker_id=worker_id or default_worker_id(), time=time)


def check_control_rows(machine: AgentMachine, offered: Sequence[Tool]) -> None:
    """Every kind of control request the tools can make has a REFLECT row that ends the run
    for it: without one, a question asked, a task finished, a terminal result or calls
    waiting for approval would be answered and then ignored.

    Raises:
        ConfigError: naming the tools and the guard of the missing row.
    """
    wanted: dict[StopReason, list[str]] = {}
    for item in offered:
        if item.control is ControlKind.ASK_USER:
            wanted.setdefault(StopReason.ASK_USER, []).append(item.name)
        elif item.control is ControlKind.FINISH_TASK:
            wanted.setdefault(StopReason.FINISH_TASK, []).append(item.name)
        if item.terminal:
            wanted.setdefault(StopReason.TERMINAL_TOOL, []).append(item.name)
        if item.requires_approval is not False:
            wanted.setdefault(StopReason.APPROVAL_REQUIRED, []).append(item.name)
        if delegate_of(item) is not None:  # its child may stop to ask: the tree waits
            wanted.setdefault(StopReason.SUB_AGENT_PAUSED, []).append(item.name)
    guards = {stop: guard for guard, stop in CONTROL_GUARDS.items()}
    missing = [
        f"{', '.join(names)} need(s) a REFLECT row guarded by {guards[stop]!r} (ending the run "
        f"with {stop.value})"
        for stop, names in wanted.items()
        if stop not in machine.control_order
    ]
    if missing:
        raise ConfigError("the table has no row for what these tools ask: " + "; ".join(missing))


def check_given_id(what: str, value: object) -> None:
    """An id is text every store can keep and every log line can print: a non-empty str
    that every store takes (``durable.leases.check_id``: valid UTF-8, no NUL, not too
    long), checked before anything is claimed or written, whatever the store.

    Raises:
        ConfigError: naming what is wrong with it.
    """
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{what.replace(' ', '_')} must be a non-empty str, got {value!r}")
    check_id(value, what)


def _dead_by_limits(limits: Limits) -> set[str]:
    """The guards the limits alone make false on every run (``dead_guards``)."""
    dead: set[str] = set()
    if not limits.last_answer:
        dead.add("last_answer_wanted")
    if limits.cost_budget is None:
        dead.update(("prompt_exceeds_cost_budget", "cost_budget_spent"))
    if limits.context_window is None:
        dead.add("prompt_exceeds_window")
    if not limits.loop_detection:
        dead.add("is_looping")
    if not limits.loop_ladder or not limits.loop_detection:
        dead.update(("nudge_due", "withhold_due"))
    return dead


def dead_guards(
    limits: Limits,
    offered: Sequence[Tool],
    output: OutputSpec | None,
    reflector: Reflector | None,
    policies: tuple[ContextPolicy, ...],
) -> frozenset[str]:
    """The guards that are false on every run of an agent with this configuration: each
    reads a feature the agent does not use, so the rows naming it can never fire
    (``RunConfig.dead_guards``)."""
    dead = _dead_by_limits(limits)
    dead.update((INPUT_GUARDRAIL_GUARD, OUTPUT_GUARDRAIL_GUARD))  # live: guardrail_guards
    if reflector is None:
        dead.add("reflector_says_done")
    if output is None:
        dead.update(("output_rejected", "output_retries_exhausted"))
    if not policies:
        dead.add("summary_requested")
    kinds = {item.control for item in offered}
    if ControlKind.ASK_USER not in kinds:
        dead.add("ask_user_called")
    if ControlKind.FINISH_TASK not in kinds:
        dead.add("finish_task_called")
    if not any(item.terminal for item in offered):
        dead.add("terminal_tool_succeeded")
    if all(item.requires_approval is False for item in offered):
        dead.add("approval_pending")
    if all(delegate_of(item) is None for item in offered):
        dead.add("sub_agent_paused")
    return frozenset(dead)


def pricing_for(limits: Limits, model: Model) -> Pricing | None:
    """The price of the agent's model's tokens, when the limits have prices.

    Raises:
        ConfigError: the limits have prices but none for the agent's model: its calls could
            not be counted against the money budget, nor its cost reported.
    """
    if not limits.prices:
        return None
    pricing = limits.price_of(model.name)
    if pricing is None:
        raise ConfigError(
            f"Limits.prices has no price for the agent's model {model.name!r} (it prices "
            f"{[name for name, _ in limits.prices]})"
        )
    return pricing


def guardrail_guards(inputs: Sequence[Guardrail], outputs: Sequence[Guardrail]) -> set[str]:
    """The guards an agent's guardrails make live: the rows of the ones it has; a rewrite
    is a correction (``output_rejected``)."""
    live: set[str] = set()
    if inputs:
        live.add(INPUT_GUARDRAIL_GUARD)
    if outputs:
        live.update((OUTPUT_GUARDRAIL_GUARD, "output_rejected"))
    return live


def check_guardrail_rows(
    machine: AgentMachine, inputs: Sequence[Guardrail], outputs: Sequence[Guardrail]
) -> None:
    """The table has a row for each kind of guardrail the agent has: without one, a
    guardrail that trips would be ignored.

    Raises:
        ConfigError: naming the guard of the missing row.
    """
    named = {guard for row in machine.rows for guard in row.guards}
    for kind, have, guard in (
        ("input", inputs, INPUT_GUARDRAIL_GUARD),
        ("output", outputs, OUTPUT_GUARDRAIL_GUARD),
    ):
        if have and guard not in named:
            raise ConfigError(
                f"{kind} guardrails need a row guarded by {guard!r} ending the run with "
                f"guardrail_tripped; the table has none"
            )


def check_sub_agents(agent: Delegable, registry: ToolRegistry, limits: Limits) -> bool:
    """Whether the agent has sub-agent tools (``Agent.as_tool``), checked: no agent is
    reachable from itself through them (an unbounded recursion), and, when the agent has
    prices, every agent of the tree has a price for its model (its calls are counted in the
    parent's money).

    Raises:
        ConfigError: naming the cycle, or the sub-agent whose model has no price.
    """
    found = False
    stack: list[tuple[Delegable, tuple[Delegable, ...], tuple[str, ...], Limits]] = [
        (agent, (), (), limits)
    ]
    while stack:
        node, path, names, inherited = stack.pop()
        tools = registry.tools if node is agent else node.run_config.tools.tools
        for item in tools:
            delegate = delegate_of(item)
            if delegate is None:
                continue
            found = True
            child = delegate.agent
            where = " -> ".join([*names, item.name])
            if child is agent or child in path:
                raise ConfigError(
                    f"sub-agent {where} leads back to an agent that calls it: an unbounded "
                    "recursion (each call would start another)"
                )
            config = child.run_config
            own = config.limits
            prices = dict(inherited.prices) | dict(own.prices)
            if inherited.prices and config.model.name not in prices:
                raise ConfigError(
                    f"sub-agent {where}: the limits price models {sorted(prices)}, but not its "
                    f"model {config.model.name!r}: its calls could not be counted"
                )
            merged = Limits(**{**own.model_dump(exclude={"prices"}), "prices": prices})
            stack.append((child, (*path, node), (*names, item.name), merged))
    return found


def token_counter(model: Model) -> TextCounter:
    """The model's own tokenizer (a ``count_tokens(text) -> int`` method), or the estimate."""
    count = getattr(model, "count_tokens", None)
    return count if callable(count) else estimate_text_tokens
