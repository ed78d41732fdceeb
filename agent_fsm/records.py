"""``quick_init``: a faster ``__init__`` for frozen, slotted, keyword-only dataclasses.

A frozen dataclass's generated ``__init__`` stores every field through
``object.__setattr__``. Several such records are built on every turn (events, the model
request, trace entries), and that made building them a tenth of the engine's per-turn cost.
The ``__init__`` made here stores each field through its slot's own descriptor instead
(StateChanged: 1.1 → 0.7 µs, measured with ``timeit``). Nothing else changes: the class stays
a frozen dataclass (``dataclasses.fields``, ``replace``, equality, pydantic support), and
assigning to a field still raises ``FrozenInstanceError``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

__all__ = ["quick_init"]

T = TypeVar("T")


def quick_init(cls: type[T]) -> type[T]:
    """Replace the ``__init__`` of a frozen, slotted, keyword-only dataclass (apply it above
    ``@dataclass(frozen=True, slots=True, kw_only=True)``); the signature is unchanged.

    Raises:
        TypeError: for any other kind of class, or a field with a default factory.
    """
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen or "__slots__" not in cls.__dict__:
        raise TypeError(f"{cls.__name__} must be a frozen dataclass with slots")
    namespace: dict[str, Any] = {}
    parameters: list[str] = []
    body: list[str] = []
    for item in dataclasses.fields(cls):  # type: ignore[arg-type]
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
    source = f"def __init__(self, *, {', '.join(parameters)}):\n" + "\n".join(body or ["    pass"])
    exec(source, namespace)  # built only from the class's own field names, as dataclasses does
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    cls.__init__ = init  # type: ignore[method-assign]
    return cls
