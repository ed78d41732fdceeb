"""Where evals keep their results: a SQLite file (the stdlib's ``sqlite3``), one row per
finished (case, repeat), written as each one finishes.

That is what makes an eval resumable: a crashed or interrupted eval, run again with the same
eval id, finds the trials already recorded and runs only the rest. It is also what a UI reads
(``evals`` lists them, ``trials`` and ``report`` show one). The tables have names of their
own (``eval_runs``, ``eval_trials``), so the file can be the one a ``SQLiteStore`` keeps its
checkpoints in: one file for an application's runs and its evals.

Each write is one transaction, committed before the next trial is counted done; the file is
in WAL mode with ``synchronous=FULL``: a recorded trial survives a crash of the process.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from agent_fsm.errors import ConfigError
from agent_fsm.evals.records import TrialRecord
from agent_fsm.evals.report import EvalReport

__all__ = ["EvalInfo", "EvalStore"]

_LAYOUT = """
CREATE TABLE IF NOT EXISTS eval_runs (
    eval_id TEXT PRIMARY KEY,
    dataset TEXT NOT NULL,
    agent TEXT NOT NULL,
    cases TEXT NOT NULL,
    repeats INTEGER NOT NULL,
    created_at REAL NOT NULL,
    finished_at REAL,
    report TEXT
);
CREATE TABLE IF NOT EXISTS eval_trials (
    eval_id TEXT NOT NULL REFERENCES eval_runs (eval_id),
    case_name TEXT NOT NULL,
    repeat INTEGER NOT NULL,
    passed INTEGER NOT NULL,
    record TEXT NOT NULL,
    recorded_at REAL NOT NULL,
    PRIMARY KEY (eval_id, case_name, repeat)
);
"""


class EvalInfo(BaseModel):
    """One eval of a store, as a list shows it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    eval_id: str
    dataset: str
    agent: str
    cases: int
    repeats: int
    created_at: float
    finished_at: float | None
    """None while it runs, or when it crashed before finishing (run it again to resume)."""
    recorded: int
    """Trials recorded so far."""
    passed: int


class EvalStore:
    """Eval results in the SQLite file at ``path`` (``":memory:"`` keeps them in memory).

    Usable from any thread, one call at a time (a lock); ``close()`` when done.
    """

    def __init__(self, path: str | Path = ":memory:") -> None:
        self.path = str(path)
        try:
            self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.execute("PRAGMA busy_timeout=30000")
            self._db.executescript(_LAYOUT)
        except sqlite3.Error as exc:
            raise ConfigError(f"cannot open the eval store {self.path!r}: {exc}") from None
        self._lock = threading.Lock()

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> EvalStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def begin(
        self, eval_id: str, *, dataset: str, agent: str, cases: Sequence[str], repeats: int
    ) -> list[TrialRecord]:
        """Start eval ``eval_id``, or continue it: returns the trials already recorded.

        Raises:
            ConfigError: ``eval_id`` is an eval of another dataset, cases or repeats (a
                resume must run the same eval).
        """
        with self._lock:
            row = self._db.execute(
                "SELECT dataset, cases, repeats FROM eval_runs WHERE eval_id = ?", (eval_id,)
            ).fetchone()
            if row is None:
                self._db.execute(
                    "INSERT INTO eval_runs (eval_id, dataset, agent, cases, repeats, created_at)"
                    " VALUES (?, ?, ?, ?, ?, ?)",
                    (eval_id, dataset, agent, json.dumps(list(cases)), repeats, time.time()),
                )
                return []
        if (row[0], json.loads(row[1]), row[2]) != (dataset, list(cases), repeats):
            raise ConfigError(
                f"eval {eval_id!r} in {self.path} ran dataset {row[0]!r} with cases "
                f"{json.loads(row[1])} and {row[2]} repeats, not this one: give another eval id"
            )
        return self.trials(eval_id)

    def add(self, eval_id: str, record: TrialRecord) -> None:
        """Record one finished trial, durably, before returning."""
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO eval_trials VALUES (?, ?, ?, ?, ?, ?)",
                (
                    eval_id,
                    record.case,
                    record.repeat,
                    int(record.passed),
                    record.model_dump_json(),
                    time.time(),
                ),
            )

    def trials(self, eval_id: str) -> list[TrialRecord]:
        """The trials of ``eval_id`` recorded so far, in the order they finished."""
        with self._lock:
            rows = self._db.execute(
                "SELECT record FROM eval_trials WHERE eval_id = ? ORDER BY recorded_at, rowid",
                (eval_id,),
            ).fetchall()
        return [TrialRecord.model_validate_json(record) for (record,) in rows]

    def finish(self, eval_id: str, report: EvalReport) -> None:
        """Mark ``eval_id`` finished, with its report (trials left out: they have rows)."""
        data = report.model_dump_json(exclude={"trials"})
        with self._lock:
            self._db.execute(
                "UPDATE eval_runs SET finished_at = ?, report = ? WHERE eval_id = ?",
                (time.time(), data, eval_id),
            )

    def report(self, eval_id: str) -> EvalReport | None:
        """The report of a finished eval, its trials included; None if it has not finished."""
        with self._lock:
            row = self._db.execute(
                "SELECT report FROM eval_runs WHERE eval_id = ?", (eval_id,)
            ).fetchone()
        if row is None or row[0] is None:
            return None
        report = EvalReport.model_validate_json(row[0])
        return report.model_copy(update={"trials": tuple(self.trials(eval_id))})

    def evals(self) -> list[EvalInfo]:
        """Every eval of the store, newest first."""
        with self._lock:
            rows = self._db.execute(
                "SELECT r.eval_id, r.dataset, r.agent, r.cases, r.repeats, r.created_at,"
                " r.finished_at, COUNT(t.case_name), COALESCE(SUM(t.passed), 0)"
                " FROM eval_runs r LEFT JOIN eval_trials t ON t.eval_id = r.eval_id"
                " GROUP BY r.eval_id ORDER BY r.created_at DESC, r.rowid DESC"
            ).fetchall()
        return [
            EvalInfo(
                eval_id=row[0],
                dataset=row[1],
                agent=row[2],
                cases=len(json.loads(row[3])),
                repeats=row[4],
                created_at=row[5],
                finished_at=row[6],
                recorded=row[7],
                passed=row[8],
            )
            for row in rows
        ]
