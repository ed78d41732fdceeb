"""The diagram of a composition: the agents of a tree and the calls between them.

``to_mermaid_composition(agent)`` draws a mermaid ``flowchart``: one node per agent (its
model, the limits its runs are carved from, and its bound: model calls, and transitions of
the whole tree below it), and one edge per sub-agent tool (``Agent.as_tool``, solid) or
handoff (``Agent.as_handoff``, dotted), labelled with the tool's name. Each agent's own loop
is its table's diagram (``agent.diagram()``); the tree has no rows of its own: a call of a
sub-agent is a tool call of its parent's ACT, and a handoff its terminal tool's row.
"""

from __future__ import annotations

from agent_fsm.run.delegation import Delegable, delegate_of

__all__ = ["to_mermaid_composition"]


def _label(agent: Delegable, name: str) -> str:
    config = agent.run_config
    limits = config.limits
    bound = agent.bound
    parts = [
        f"<b>{name}</b>",
        f"model {config.model.name}",
        f"max_turns={limits.max_turns}, token_budget={limits.token_budget:,}",
    ]
    if limits.cost_budget is not None:
        parts.append(f"cost_budget={limits.cost_budget:g}")
    parts.append(f"bound: {bound.model_calls} model calls, {bound.tree_transitions:,} transitions")
    return "<br/>".join(part.replace('"', "'") for part in parts)


def to_mermaid_composition(agent: Delegable, name: str = "agent") -> str:
    """The mermaid ``flowchart`` of ``agent`` and every agent it can call, each drawn once
    (a tree is acyclic: ``Agent`` refuses an agent reachable from itself)."""
    lines = ["flowchart TD"]
    ids: dict[int, str] = {}

    def visit(node: Delegable, title: str) -> str:
        known = ids.get(id(node))
        if known is not None:
            return known
        node_id = f"a{len(ids)}"
        ids[id(node)] = node_id
        lines.append(f'    {node_id}["{_label(node, title)}"]')
        for item in node.run_config.tools.tools:
            delegate = delegate_of(item)
            if delegate is None:
                continue
            child = visit(delegate.agent, item.name)
            arrow = f"-. {item.name} (handoff) .->" if delegate.handoff else f"-- {item.name} -->"
            lines.append(f"    {node_id} {arrow} {child}")
        return node_id

    visit(agent, name)
    return "\n".join(lines) + "\n"
