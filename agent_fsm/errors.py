"""The exceptions agent_fsm raises, and only those.

Exceptions are for the developer's mistakes. The failures of models and tools are data: they
become error tool results the model can correct from, or inputs to the guards that end a run
with a stop reason. ``run()`` therefore never raises for them.

::

    AgentFSMError                 base of everything raised here
     ├── ConfigError              bad configuration, raised at construction: invalid limits,
     │                            duplicate or invalid tool definitions, a machine table that
     │                            cannot be proved to terminate
     ├── RunError                 a run cannot be driven further (for example stepping a run
     │   │                        that already ended); carries the RunResult when there is one
     │   ├── ResumeError          resume() was asked to continue a run that cannot be (it
     │   │                        finished), or with the wrong answer for its pause
     │   └── RunLeased            another worker holds the run's lease: it drives the run now
     │                            (raised on start/resume, and mid-run by a driver whose
     │                            expired lease was taken over)
     ├── ScriptExhaustedError     a ScriptedModel was asked for more replies than it was given
     ├── DiagramError             a diagram cannot be drawn (graphviz missing or failing, or a
     │                            run that does not fit the table it is drawn on)
     ├── TraceFileError           a trace file cannot be read (also a ValueError); the message
     │                            names the file and line
     ├── CheckpointError          a checkpoint cannot be read, written or resumed
     └── MCPConnectionError       (in ``agent_fsm.mcp``, the optional extra) an MCP server
                                  cannot be started or does not complete the handshake, raised
                                  on entering its ``async with``; its failures later are results

    ToolSchemaWarning (a UserWarning)  a provider gets a tool schema with a keyword dropped
                                       or rewritten (see ``models.base.ToolSchemaIssue``)
    SkippedToolWarning (a UserWarning, in ``agent_fsm.mcp``)  an MCP server's tool is not
                                       offered to the model (a name or schema it cannot take)
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AgentFSMError",
    "CheckpointError",
    "ConfigError",
    "DiagramError",
    "TableError",
    "ResumeError",
    "RunError",
    "RunLeased",
    "ScriptExhaustedError",
    "ToolSchemaWarning",
    "TraceFileError",
]


class AgentFSMError(Exception):
    """Base class of every exception agent_fsm raises."""


class ConfigError(AgentFSMError, ValueError):
    """Invalid configuration, detected at construction time.

    Subclasses ``ValueError`` so that generic validation handlers catch it too.
    """


class RunError(AgentFSMError):
    """A run cannot be driven further; ``result`` holds what the run produced, if anything."""

    def __init__(self, message: str, result: Any = None) -> None:
        super().__init__(message)
        self.result = result
        """The ``agent_fsm.state.RunResult`` of the run, when it has one; else None. Typed
        ``Any``: this module is the bottom of the layout (everything raises its errors), so
        it names no type from above it, which would make an import cycle
        (errors -> state -> table -> errors)."""


class ResumeError(RunError):
    """``Agent.resume`` cannot continue the run as asked: it finished, or the answer does not
    fit the pause (a reply for an approval, a missing decision, an unknown call id)."""


class RunLeased(RunError):
    """Another worker holds the run's lease, so this one must not drive it.

    Raised by ``Agent.start``/``reopen``/``resume`` when the run is claimed by a live lease,
    and by a running driver at its next checkpoint save (or tool-journal write) once its own
    lease was taken over after expiring: that driver stops there, and the holder continues
    the run from its last checkpoint. Retrying later is the remedy (``expires_at`` says when
    the lease runs out if its holder stops renewing it).
    """

    def __init__(self, message: str, *, run_id: str, holder: str, expires_at: float) -> None:
        super().__init__(message)
        self.run_id = run_id
        self.holder = holder
        """The worker id of the lease's holder."""
        self.expires_at = expires_at
        """Unix time the holder's lease runs out, by the store's clock, unless renewed."""


class TableError(RunError):
    """Code of the user's own table failed as the run used it: a guard (``Table.guards``)
    raised or returned something other than a bool, or the work of a ``CustomState`` raised.
    A bug in that code, which the property harness finds
    (``agent_fsm.testing.assert_terminates``).

    Raised out of ``Run.step``/``run``; the run has not moved on, and its durable checkpoint
    is the one taken before the failing state's work, so once the code is fixed
    ``Agent.resume`` continues the run as after a crash.
    """


class ScriptExhaustedError(AgentFSMError):
    """A ScriptedModel was called more times than its script has replies.

    Raised inside the model call, so the engine records it as a permanent model error and the
    run ends in ERROR ``model_error`` with this message: the test author sees exactly which
    request found the script empty.
    """


class DiagramError(AgentFSMError):
    """A diagram cannot be drawn: graphviz is missing or failed, or a run does not fit the
    table it is drawn on."""


class TraceFileError(AgentFSMError, ValueError):
    """A trace file cannot be read: a line is not an event, or the run asked for is absent.

    The message names the file and, for a bad line, its line number.
    """


class CheckpointError(AgentFSMError):
    """A checkpoint cannot be read, written, migrated or resumed."""


class ToolSchemaWarning(UserWarning):
    """A tool's schema reaches the provider with a keyword dropped or rewritten: the provider
    holds the model to less than the schema says (agent_fsm still validates every call against
    the whole schema, and answers a call that breaks it with an error the model can correct)."""
