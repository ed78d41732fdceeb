"""How to install an optional part of agent_fsm, in the words of an error message.

agent_fsm is on no package index, so installing ``agent-fsm[postgres]`` by name finds nothing:
an extra is installed from a clone (``pip install -e '.[postgres]'``) or with the wheel built
from one. Every message that names a missing extra takes its wording from here, so they all
say the same thing, and the same as the README's Install section.
"""

from __future__ import annotations

__all__ = ["install_hint"]


def install_hint(extra: str) -> str:
    """The command that installs ``extra``, e.g. ``pip install -e '.[postgres]'`` (in a
    clone of agent_fsm), for an error message."""
    return f"pip install -e '.[{extra}]' in a clone of agent_fsm (or its wheel with [{extra}])"
