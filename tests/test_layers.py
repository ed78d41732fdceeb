"""The import rules, and the layout they follow (``LAYERS`` below is its authority): every
module imports only from modules below it, type-only imports included (so there is no import
cycle), third-party libraries stay in their one module, and no module uses another module's
underscored names."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "agent_fsm"

# The layout, top to bottom: a module may import only modules listed before it.
LAYERS = [
    # the bottom: plain data and the vocabulary every package shares
    "version",
    "errors",
    "extras",
    "constructors",
    "records",
    "table",
    "custom_table",
    "content",
    "messages",
    "prompt",
    "tokens",
    "failures",
    "pricing",
    "limits",
    "state",
    "views",
    "events",
    "cancellation",
    "watchdog",
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
    "durable.queue",
    "durable.encoding",
    "durable.header",
    "durable.listing",
    "durable.checkpoint",
    "durable.sqlite_leases",
    "durable.sqlite_file",
    "durable.sqlite_journal",
    "durable.sqlite_rows",
    "durable.sqlite",
    "durable.postgres_rows",
    "durable.postgres_queue",
    "durable.postgres_leases",
    "durable.postgres_database",
    "durable.postgres_journal",
    "durable.postgres",
    "durable.tracefile",
    "durable",
    # tools/: a tool call from definition to answer
    "tools.schemas",
    "tools.patterns",
    "tools.schema_checks",
    "tools.arguments",
    "tools.results",
    "tools.tool",
    "tools.hooks",
    "tools.execution",
    "tools.scheduling",
    "tools",
    "output",
    # models/: the Model protocol and its adapters
    "models.base",
    "models.parts",
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
    # context policies: a Summarize policy may have a model of its own (models.base)
    "compaction",
    "hooks",
    "guardrails",
    # run/: one run
    "run.context",
    "run.guarding",
    "run.live",
    "run.residence",
    "run.elsewhere",
    "run.observing",
    "run.compacting",
    "run.thinking",
    "run.summarising",
    "run.custom",
    "run.approvals",
    "run.acting",
    "run.parenting",
    "run.reflecting",
    "run.answering",
    "run.outcome",
    "run.resuming",
    "run.identity",
    "run.forking",
    "run.history",
    "run.leasing",
    "run.stored",
    "run.engine",
    "run.carving",
    "run.delegation",
    "run",
    # the top
    "diagrams",
    "composition",
    "otel_metrics",
    "otel",
    "configuring",
    "agent",
    "dbos.private",
    "dbos.recovery",
    "dbos.liveness",
    "dbos.requests",
    "dbos.replay",
    "dbos.answers",
    "dbos.replies",
    "dbos.unstepped",
    "dbos.tool_calls",
    "dbos.model_calls",
    "dbos.steps",
    "dbos.pausing",
    "dbos.cancelling",
    "dbos.agent",
    "dbos.worker",
    "dbos",
    "mcp_client",
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
    "testing.hostile",
    "testing.assertions",
    "testing.stateful",
    "testing.plugin",
    "testing.store_kit",
    "testing.journal_contract",
    "testing.lease_contract",
    "testing.queue_contract",
    "testing.store_contract",
    "testing.wire",
    "testing.adapter_contract",
    "testing",
    "demo",
    "loading",
    # evals/: datasets run against an agent, judged, reported and gated
    "evals.stats",
    "evals.context",
    "evals.evaluators",
    "evals.trajectory",
    "evals.judge",
    "evals.dataset",
    "evals.records",
    "evals.trial",
    "evals.report",
    "evals.store",
    "evals.runner",
    "evals.progress",
    "evals.report_text",
    "evals.report_html",
    "evals.gate",
    "evals.assertions",
    "evals",
    "evals.cli",
    "cli_model",
    "cli_agent",
    "cli_stores",
    # ui/: the ui extra; only its app and its command's server start import Starlette/uvicorn
    "ui.runs",
    "ui.steps",
    "ui.layout",
    "ui.agui",
    "ui.agui_input",
    "ui.recorded",
    "ui.live",
    "ui.streams",
    "ui.security",
    "ui.pages",
    "ui.app",
    "ui.cli",
    "ui",
    "cli",
    "",  # agent_fsm/__init__.py
]

ONLY_IN = {
    "transitions": {"loop.machine"},
    "openai": {"models.openai_chat", "models.openai_responses"},
    "anthropic": {"models.anthropic_messages"},
    "google": {"models.gemini"},
    "mcp": {"mcp_client", "mcp"},
    "mcp_types": {"mcp_client"},
    "hypothesis": {
        "testing.strategies",
        "testing.hostile",
        "testing.assertions",
        "testing.stateful",
        "testing.plugin",
    },
    "hypothesis_jsonschema": {"testing.strategies"},
    "opentelemetry": {"otel_metrics", "otel"},
    "yaml": {"evals.dataset"},
    "psycopg": {"durable.postgres_database"},
    "starlette": {"ui.app"},
    "uvicorn": {"ui.cli"},
    # only users' test runs import pytest: the plugin (loaded by pytest) and the contracts
    "pytest": {
        "testing.plugin",
        "testing.adapter_contract",
        "testing.store_kit",
        "testing.journal_contract",
        "testing.lease_contract",
        "testing.queue_contract",
        "testing.store_contract",
    },
    "dbos": {
        "dbos.private",
        "dbos.recovery",
        "dbos.liveness",
        "dbos.replay",
        "dbos.tool_calls",
        "dbos.steps",
        "dbos.pausing",
        "dbos.cancelling",
        "dbos.agent",
        "dbos.worker",
    },
}


PRIVATE_USES_ALLOWED = {
    # dbos has no public call that recovers another executor's workflows, reads an
    # execution's ownership of its workflow, or stops a thread with DBOS: third-party
    # private names, all in dbos/private.py, pinned by the dbos range in pyproject.toml.
    ("dbos.private", "DBOS._recover_pending_workflows"),
    ("dbos.private", "dbos._datasource._still_owns"),
    ("dbos.private", "dbos._dbos._get_dbos_instance"),
    ("dbos.private", "instance._background_threads"),
}
"""Uses of another module's underscored names that the test tolerates, each with why."""


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(path): path for path in PACKAGE.rglob("*.py")}


def _is_type_checking(test: ast.expr) -> bool:
    """``if TYPE_CHECKING:`` or ``if typing.TYPE_CHECKING:``."""
    if isinstance(test, ast.Attribute):
        return test.attr == "TYPE_CHECKING"
    return isinstance(test, ast.Name) and test.id == "TYPE_CHECKING"


def _tree(path: Path, *, typing: bool) -> ast.Module:
    """The module's syntax tree; without ``typing``, its ``if TYPE_CHECKING:`` blocks
    emptied (they import nothing at run time)."""
    tree = ast.parse(path.read_text())
    if not typing:
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and _is_type_checking(node.test):
                node.body = []
    return tree


def _absolute(module: str, node: ast.ImportFrom) -> str:
    """The module a ``from ... import`` names, a relative one made absolute."""
    if not node.level:
        return node.module or ""
    package = [part for part in module.split(".") if part]
    if MODULES[module].name != "__init__.py":
        package = package[:-1]
    package = package[: len(package) - (node.level - 1)]
    return ".".join(["agent_fsm", *package, *([node.module] if node.module else [])])


def _imports(path: Path, *, typing: bool = False) -> set[str]:
    """The modules ``path`` imports: at run time, or (``typing``) for the type checker too.
    ``from agent_fsm.x import y`` imports ``agent_fsm.x.y`` as well when ``y`` is a module."""
    module = _module_name(path)
    found: set[str] = set()
    for node in ast.walk(_tree(path, typing=typing)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(module, node)
            found.add(base)
            for alias in node.names:
                inner = f"{base}.{alias.name}".removeprefix("agent_fsm.")
                if base.startswith("agent_fsm") and inner in MODULES:
                    found.add(f"agent_fsm.{inner}")
    return found


def _inside(imported: str) -> str | None:
    """The layout name of a module of the package (``""`` for the package), else None."""
    if imported != "agent_fsm" and not imported.startswith("agent_fsm."):
        return None
    return imported.removeprefix("agent_fsm").removeprefix(".")


def test_every_module_is_in_the_layout() -> None:
    assert set(MODULES) <= set(LAYERS), set(MODULES) - set(LAYERS)


def test_third_party_libraries_stay_in_their_module() -> None:
    """Run-time imports only: a type-only import of psycopg loads nothing."""
    for module, path in MODULES.items():
        for imported in _imports(path):
            top = imported.split(".")[0]
            if top in ONLY_IN:
                assert module in ONLY_IN[top], f"{module} imports {top}"


def test_modules_import_only_from_below_type_only_imports_included() -> None:
    """An ``if TYPE_CHECKING:`` import is a dependency too: one going up the layout is a
    cycle waiting for a run-time import (errors -> state -> table -> errors was one)."""
    wrong = []
    for module, path in MODULES.items():
        rank = LAYERS.index(module)
        for imported in _imports(path, typing=True):
            target = _inside(imported)
            if target is None or target == module:
                continue
            assert target in LAYERS, f"{module} imports unknown {imported}"
            if LAYERS.index(target) > rank:
                wrong.append(f"{module} imports {imported}, which is above it")
    assert not wrong, "\n".join(sorted(wrong))


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph``, as the modules along it, or None."""
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> list[str] | None:
        if node in path:
            return [*path[path.index(node) :], node]
        if node in done:
            return None
        for target in sorted(graph.get(node, ())):
            found = visit(target, [*path, node])
            if found:
                return found
        done.add(node)
        return None

    for start in sorted(graph):
        found = visit(start, [])
        if found:
            return found
    return None


def test_no_import_cycle_type_only_imports_included() -> None:
    graph = {
        module: {
            target
            for imported in _imports(path, typing=True)
            if (target := _inside(imported)) not in (None, module, "")
        }
        for module, path in MODULES.items()
    }
    cycle = _cycle(graph)
    assert cycle is None, " -> ".join(cycle or ())


def test_the_cycle_finder_finds_cycles() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _defined_names(tree: ast.Module) -> set[str]:
    """The underscored names a module defines: its functions, classes and assignments,
    attributes it sets (``self._x = ...``) and ``__slots__`` entries."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Name | ast.arg):
            names.add(node.id if isinstance(node, ast.Name) else node.arg)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names.add(node.value)  # __slots__ = ("_x", ...), and the like
    return {name for name in names if _is_private(name)}


def _imported_names(module: str, tree: ast.Module) -> tuple[dict[str, str], list[str]]:
    """The modules ``tree`` binds to local names (``import agent_fsm.x as y``, ``from
    agent_fsm import x``), and the underscored names it imports by name."""
    aliases: dict[str, str] = {}
    private: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                aliases[alias.asname or alias.name] = alias.name
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(module, node)
            for alias in node.names:
                if _is_private(alias.name):
                    private.append(f"{base}.{alias.name}")
                elif f"{base}.{alias.name}".removeprefix("agent_fsm.") in MODULES:
                    aliases[alias.asname or alias.name] = f"{base}.{alias.name}"
    return aliases, private


def _private_uses(module: str, path: Path) -> Iterator[str]:
    """Another module's underscored names that ``module`` uses: imported by name, read off
    an imported module, or read off an object when the name is not one this module defines
    (``self._store._transaction``)."""
    tree = _tree(path, typing=True)
    aliases, private = _imported_names(module, tree)
    yield from private
    own = _defined_names(tree)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or not _is_private(node.attr):
            continue
        value = node.value
        if isinstance(value, ast.Name) and value.id in aliases:
            yield f"{aliases[value.id]}.{node.attr}"
        elif isinstance(value, ast.Name) and value.id in ("self", "cls"):
            continue
        elif node.attr not in own:
            yield f"{ast.unparse(value)}.{node.attr}"


def test_no_module_uses_another_modules_private_names() -> None:
    """A module reaching into another's ``_private`` names is asking for a public function
    (STYLE 16): the journals once ran their store's ``_transaction``."""
    found = {
        (module, use) for module, path in MODULES.items() for use in _private_uses(module, path)
    }
    unexpected = sorted(found - PRIVATE_USES_ALLOWED)
    assert not unexpected, "\n".join(f"{module} uses {use}" for module, use in unexpected)
    stale = sorted(PRIVATE_USES_ALLOWED - found)
    assert not stale, f"allowed uses no longer found, remove them: {stale}"


def test_the_private_name_check_sees_a_journal_reaching_into_its_store(tmp_path: Path) -> None:
    probe = tmp_path / "sqlite_journal.py"
    probe.write_text(
        "import agent_fsm.durable.sqlite_leases as leases\n"
        "from agent_fsm.durable.sqlite import _helper\n"
        "class Journal:\n"
        "    __slots__ = ('_store',)\n"
        "    def lookup(self):\n"
        "        leases._fence()\n"
        "        with self._store._transaction('x') as conn:\n"
        "            return conn\n"
    )
    assert sorted(_private_uses("durable.sqlite_journal", probe)) == [
        "agent_fsm.durable.sqlite._helper",
        "agent_fsm.durable.sqlite_leases._fence",
        "self._store._transaction",
    ]


def test_every_file_a_docstring_or_comment_names_exists() -> None:
    """A pointer such as ``loops.py`` or DESIGN.md in the package or the tests names a file of
    the repository (modules get renamed; a stale pointer sends readers nowhere)."""
    import re

    root = PACKAGE.parent
    files = {p.name for p in root.rglob("*") if ".venv" not in p.parts and ".git" not in p.parts}
    stale: list[str] = []
    for path in [*PACKAGE.rglob("*.py"), *(root / "tests").rglob("*.py")]:
        if path == Path(__file__).resolve():
            continue  # this test names stale pointers on purpose
        for name in re.findall(r"``([A-Za-z_][\w]*\.(?:py|md))``", path.read_text()):
            if name not in files:
                stale.append(f"{path.relative_to(root)} names {name}")
        cites = path.parent.name == "tests" and "DESIGN.md" in path.read_text()
        if cites and "DESIGN.md" not in files:
            stale.append(f"{path.relative_to(root)} cites DESIGN.md")
    assert not stale, stale
