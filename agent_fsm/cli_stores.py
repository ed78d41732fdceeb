"""The command line's way to open a store a user names: a SQLite file or a
``postgresql://`` URL. ``agent-fsm runs``, ``diagram``, ``cancel`` and ``ui`` share it."""

from __future__ import annotations

from pathlib import Path

from agent_fsm.durable.checkpoint import CheckpointStore, redacted
from agent_fsm.durable.sqlite import SQLiteStore
from agent_fsm.errors import ConfigError
from agent_fsm.extras import install_hint

__all__ = ["open_store"]


def open_store(location: str, schema: str) -> CheckpointStore:
    """An existing store, a SQLite file or a ``postgresql://`` URL (``schema`` its schema):
    reading never creates an empty database by mistake.

    Raises:
        ConfigError: no such SQLite file, or psycopg missing for a URL (no password shown).
    """
    if location.lower().startswith(("postgres://", "postgresql://")):
        try:
            from agent_fsm.durable.postgres import PostgresStore
        except ImportError:
            raise ConfigError(
                f"a PostgreSQL store needs psycopg: {install_hint('postgres')}"
            ) from None
        return PostgresStore(location, schema=schema, create=False)
    if not Path(location).is_file():
        raise ConfigError(
            f"no checkpoint store at {redacted(location)} (choose one with --store PATH or URL)"
        )
    return SQLiteStore(location)
