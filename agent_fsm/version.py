"""The installed distribution's version, as ``agent_fsm.__version__`` and ``agent-fsm --version``
report it."""

from importlib.metadata import PackageNotFoundError, version

__all__ = ["__version__"]

try:
    __version__ = version("agent-fsm")
except PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"
