"""One kit per provider adapter, so the same scenarios and properties run over every protocol.

A kit knows its provider's wire format from the server's side: it encodes a provider-neutral
``ModelResponse`` as the HTTP response the real API would send for it (whole or streamed), an
error the way the API reports errors, and reads back what the adapter sent. The adapter under
test decodes those bytes through its own SDK, so a scenario written once
(``tests/test_provider_scenarios.py``) checks every adapter's conversions both ways, and the
property harness (``tests/test_provider_properties.py``) can play generated behaviours through
each wire format.

Each module ``tests/provider_kits/<name>.py`` defines ``KIT``; ``all_kits()`` finds them all.
"""

from __future__ import annotations

import importlib
import pkgutil

from tests.provider_kits.base import WireKit

__all__ = ["WireKit", "all_kits"]


def all_kits() -> list[WireKit]:
    """Every kit in this package, by module name."""
    kits: list[WireKit] = []
    for module in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if module.name == "base":
            continue
        kits.append(importlib.import_module(f"{__name__}.{module.name}").KIT)
    return kits
