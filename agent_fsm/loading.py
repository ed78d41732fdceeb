"""Find a user's object from a ``module:attr`` or ``path/to/file.py:attr`` reference.

The command line runs *your* agent (``agent-fsm run --agent app.agents:support``), and evals
and workers are pointed at one the same way. The reference names a module (imported as Python
would, from the current directory first) or a ``.py`` file (loaded under a private module name
so it never shadows an installed module), then an attribute path inside it. When the attribute
is a function or class rather than an instance of the wanted type, it is called with no
arguments: a factory (``def make_agent() -> Agent``) is the usual way to build an agent whose
construction reads the environment.

Every way to get this wrong (no colon, a module that does not import, an attribute that does
not exist, an object of the wrong type, a factory that raises) is a ``ConfigError`` naming the
reference and what was wrong, never a bare ``ImportError`` or ``AttributeError`` traceback.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import TypeVar

from agent_fsm.agent import Agent
from agent_fsm.errors import ConfigError

__all__ = ["load_agent", "load_object"]

T = TypeVar("T")


def load_object(reference: str, kind: type[T]) -> T:
    """The ``kind`` instance that ``reference`` (``module:attr`` or ``file.py:attr``) names.

    A callable that is not itself a ``kind`` is called with no arguments and its result must
    be one. Raises ``ConfigError`` for every failure, with the reference in the message.
    """
    source, sep, attribute = reference.rpartition(":")
    if not sep or not source or not attribute:
        raise ConfigError(
            f"{reference!r} is not a reference to an object: write module:attribute "
            "(app.agents:support) or path/to/file.py:attribute"
        )
    module = _module(source, reference)
    found: object = module
    for part in attribute.split("."):
        if not part.isidentifier():
            raise ConfigError(f"{reference!r}: {attribute!r} is not an attribute path")
        try:
            found = getattr(found, part)
        except AttributeError:
            raise ConfigError(f"{reference!r}: {source} has no attribute {attribute!r}") from None
    if isinstance(found, kind):
        return found
    if callable(found):
        try:
            made = found()
        except Exception as exc:
            raise ConfigError(
                f"{reference!r}: calling {attribute}() to build the {kind.__name__} raised "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        if isinstance(made, kind):
            return made
        raise ConfigError(
            f"{reference!r}: {attribute}() returned type {type(made).__name__}, not {kind.__name__}"
        )
    raise ConfigError(
        f"{reference!r} is of type {type(found).__name__}, not {kind.__name__} "
        "(nor a function that returns one)"
    )


def load_agent(reference: str) -> Agent:
    """The ``Agent`` that ``reference`` names (see ``load_object``)."""
    return load_object(reference, Agent)


def _module(source: str, reference: str) -> ModuleType:
    """The module ``source`` names: a ``.py`` path, or a dotted module name."""
    if source.endswith(".py") or "/" in source or "\\" in source:
        return _file_module(Path(source), reference)
    if not all(part.isidentifier() for part in source.split(".")):
        raise ConfigError(f"{reference!r}: {source!r} is neither a module name nor a .py file")
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, "")  # as `python -m` does: the current directory's modules first
    try:
        return importlib.import_module(source)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (source == exc.name or source.startswith(f"{exc.name}.")):
            raise ConfigError(
                f"{reference!r}: no module named {source!r} (looked in the current "
                "directory and the installed packages)"
            ) from None
        raise ConfigError(
            f"{reference!r}: importing {source} failed: {type(exc).__name__}: {exc}"
        ) from exc
    except Exception as exc:
        raise ConfigError(
            f"{reference!r}: importing {source} failed: {type(exc).__name__}: {exc}"
        ) from exc


def _file_module(path: Path, reference: str) -> ModuleType:
    """Load a ``.py`` file once per process, under a name derived from its resolved path."""
    if not path.is_file():
        raise ConfigError(f"{reference!r}: there is no file {str(path)!r}")
    resolved = path.resolve()
    digest = hashlib.sha256(str(resolved).encode()).hexdigest()[:12]
    name = f"_agent_fsm_loaded_{resolved.stem}_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, resolved)
    if spec is None or spec.loader is None:
        raise ConfigError(f"{reference!r}: {str(path)!r} cannot be loaded as Python")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before executing: dataclasses and pickling look it up
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise ConfigError(
            f"{reference!r}: running {path} failed: {type(exc).__name__}: {exc}"
        ) from exc
    return module
