"""The import rules of DESIGN.md: third-party libraries stay in their one module, and every
module imports only from modules above it in the layout."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "agent_fsm"

# The layout, top to bottom: a module may import only modules listed before it.
LAYERS = [
    # the bottom: plain data and the vocabulary every package shares
    "version",
    "errors",
    "constructors",
    "table",
    "messages",
    "prompt",
    "tokens",
    "failures",
    "limits",
    "state",
    "events",
    "compaction",
    "cancellation",
    "logs",
    # loop/: table-driven deciding, no I/O
    "loop.detection",
    "loop.guards",
    "loop.verify",
    "loop.machine",
    "loop",
    # durable/: what outlives a process
    "durable.journal",
    "durable.leases",
    "durable.checkpoint",
    "durable.sqlite_leases",
    "durable.sqlite_journal",
    "durable.sqlite",
    "durable.postgres_rows",
    "durable.postgres_leases",
    "durable.postgres_journal",
    "durable.postgres",
    "durable.tracefile",
    "durable",
    # tools/: a tool call from definition to answer
    "tools.schemas",
    "tools.results",
    "tools.tool",
    "tools.hooks",
    "tools.execution",
    "tools.scheduling",
    "tools",
    "output",
    # models/: the Model protocol and its adapters
    "models.base",
    "models.common",
    "models.adapter",
    "models.stainless",
    "models.openai_schema",
    "models.openai_convert",
    "models.openai_chat",
    "models.openai_responses_convert",
    "models.openai_responses_reply",
    "models.openai_responses",
    "models.anthropic_convert",
    "models.anthropic_reply",
    "models.anthropic_messages",
    "models.gemini_schema",
    "models.gemini_convert",
    "models.gemini",
    "models.registry",
    "models",
    "hooks",
    # run/: one run
    "run.context",
    "run.observing",
    "run.compacting",
    "run.thinking",
    "run.custom",
    "run.approvals",
    "run.acting",
    "run.reflecting",
    "run.answering",
    "run.outcome",
    "run.resuming",
    "run.history",
    "run.leasing",
    "run.engine",
    "run",
    # the top
    "diagrams",
    "otel",
    "agent",
    "dbos.replay",
    "dbos.steps",
    "dbos.pausing",
    "dbos.agent",
    "dbos.recovery",
    "dbos",
    "mcp",
    "testing.models",
    "testing.invariants",
    "testing.behaviour",
    "testing.reproducer",
    "testing.harness",
    "testing.tracking",
    "testing.exhaustive",
    "testing.recording",
    "testing.strategies",
    "testing.assertions",
    "testing.stateful",
    "testing.plugin",
    "testing.wire",
    "testing.adapter_contract",
    "testing",
    "demo",
    "cli_model",
    "cli",
    "",  # agent_fsm/__init__.py
]

ONLY_IN = {
    "transitions": {"loop.machine"},
    "openai": {"models.openai_chat", "models.openai_responses"},
    "anthropic": {"models.anthropic_messages"},
    "google": {"models.gemini"},
    "mcp": {"mcp"},
    "hypothesis": {
        "testing.strategies",
        "testing.assertions",
        "testing.stateful",
        "testing.plugin",
    },
    "hypothesis_jsonschema": {"testing.strategies"},
    # only users' test runs import these two: the plugin (loaded by pytest) and the contract
    "pytest": {"testing.plugin", "testing.adapter_contract"},
    "opentelemetry": {"otel"},
    "psycopg": {"durable.postgres"},
    "dbos": {"dbos.replay", "dbos.steps", "dbos.pausing", "dbos.agent", "dbos.recovery"},
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """Runtime imports (those under ``if TYPE_CHECKING:`` create no dependency)."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            node.body = []
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def test_every_module_is_in_the_layout() -> None:
    modules = {_module_name(p) for p in PACKAGE.rglob("*.py")}
    assert modules <= set(LAYERS), modules - set(LAYERS)


def test_third_party_libraries_stay_in_their_module() -> None:
    for path in PACKAGE.rglob("*.py"):
        module = _module_name(path)
        for imported in _imports(path):
            top = imported.split(".")[0]
            if top in ONLY_IN:
                assert module in ONLY_IN[top], f"{module} imports {top}"


def test_modules_import_only_from_above() -> None:
    for path in PACKAGE.rglob("*.py"):
        module = _module_name(path)
        rank = LAYERS.index(module)
        for imported in _imports(path):
            if not imported.startswith("agent_fsm"):
                continue
            target = imported.removeprefix("agent_fsm").removeprefix(".")
            assert target in LAYERS, f"{module} imports unknown {imported}"
            assert LAYERS.index(target) < rank, f"{module} imports {imported}, which is below it"
