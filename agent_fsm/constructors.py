"""Cheaper construction for frozen, slotted, keyword-only dataclasses: ``quick_init`` and
``builder``.

Contract: a record built either way is exactly what ``cls(**fields)`` builds (the same
keyword-only signature and defaults, an instance of ``cls``, frozen; ``dataclasses.fields``,
``replace``, equality and pydantic support unchanged). ``quick_init`` replaces the class's
``__init__`` with one that stores each field through its slot's descriptor instead of
``object.__setattr__``; ``builder(cls)`` is a plain function with the class's keyword-only
signature, which skips the call of a class with keywords. Why it stays: a dozen records are
built per turn (events, trace entries, the model request), and without these the engine ran
10% more instructions per turn (``benchmarks/instructions.py``), past the 5% rule for keeping
a speed-only mechanism.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar, cast

__all__ = ["builder", "quick_init"]

T = TypeVar("T")
P = ParamSpec("P")


def _storing_function(cls: type, name: str, prologue: str, epilogue: str) -> Any:
    """Compile ``name(<cls's keyword-only fields>)`` that runs ``prologue``, stores every
    field of ``self`` through its slot descriptor, then runs ``epilogue``."""
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen or "__slots__" not in cls.__dict__:
        raise TypeError(f"{cls.__name__} must be a frozen dataclass with slots")
    if hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__name__}.__post_init__ would not run: it is not supported")
    namespace: dict[str, Any] = {"_new": object.__new__, "_cls": cls}
    parameters: list[str] = []
    body: list[str] = [prologue] if prologue else []
    for item in dataclasses.fields(cls):
        if not item.kw_only:
            raise TypeError(f"{cls.__name__}.{item.name} must be keyword-only")
        if item.default_factory is not dataclasses.MISSING:
            raise TypeError(f"{cls.__name__}.{item.name}: default factories are not supported")
        if item.default is dataclasses.MISSING:
            parameters.append(item.name)
        else:
            namespace[f"_default_{item.name}"] = item.default
            parameters.append(f"{item.name}=_default_{item.name}")
        namespace[f"_store_{item.name}"] = cls.__dict__[item.name].__set__
        body.append(f"    _store_{item.name}(self, {item.name})")
    if epilogue:
        body.append(epilogue)
    signature = ", ".join(["*", *parameters]) if parameters else ""
    self_first = "self, " if name == "__init__" else ""
    source = f"def {name}({self_first}{signature}):\n" + "\n".join(body or ["    pass"])
    exec(source, namespace)  # built only from the class's own field names, as dataclasses does
    function = namespace[name]
    function.__qualname__ = f"{cls.__qualname__}.{name}"
    function.__module__ = cls.__module__
    return function


def quick_init(cls: type[T]) -> type[T]:
    """Replace the ``__init__`` of a frozen, slotted, keyword-only dataclass (apply it above
    ``@dataclass(frozen=True, slots=True, kw_only=True)``); the signature is unchanged.

    Raises:
        TypeError: for any other kind of class, a field with a default factory, or a
            ``__post_init__``.
    """
    cls.__init__ = _storing_function(cls, "__init__", "", "")  # type: ignore[method-assign]
    return cls


def builder(cls: Callable[P, T]) -> Callable[P, T]:
    """A function that builds ``cls`` records exactly as ``cls(**fields)`` does: the same
    keyword-only signature and defaults, an instance of ``cls``, frozen.

    Raises:
        TypeError: for the classes ``quick_init`` refuses.
    """
    if not isinstance(cls, type):
        raise TypeError(f"{cls!r} is not a class")
    build = _storing_function(cls, "build", "    self = _new(_cls)", "    return self")
    return cast(Callable[P, T], build)
