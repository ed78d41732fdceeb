"""The tool journal: a durable record of which tool calls started and which finished.

A tool call is a side effect the run cannot take back. To resume after a crash without doing
one twice, the runtime writes ``record_started`` *before* executing a call and
``record_finished`` (with the result) after it. On resume, ``lookup`` tells the runtime what
happened to each call of the interrupted turn:

- finished: the recorded result is used; the tool is not run again;
- started but never finished: the outcome is unknown. The call is re-run only if its tool is
  idempotent; otherwise the model is told that the outcome is unknown;
- absent: the call never started and runs normally.

Entries are keyed by ``journal_key(turn, index, call_id)``: models may reuse call ids across
turns, so the id alone is not unique within a run. Checkpoint stores implement this protocol
(``CheckpointStore.journal(run_id)``); ``MemoryJournal`` is the in-process implementation.
Implementations must make ``record_started`` durable before returning.

A key holds the model's call id, which may be anything: a store that keeps keys as database
text stores ``stored_key(key)``, the key itself unless it is too long or holds what some
database cannot keep (a lone surrogate, a NUL), in which case a digest of it. Entries are
still found by the key given (``lookup`` applies the same function) and carry that key.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol, runtime_checkable

from agent_fsm.messages import ToolCall, ToolMessage

__all__ = [
    "MAX_KEY_BYTES",
    "CallStatus",
    "FirstFinish",
    "FirstFinishingLookup",
    "GuardedJournal",
    "JournalEntry",
    "FinishingLookup",
    "MemoryJournal",
    "NotStarted",
    "OutcomeJournal",
    "PairedLookup",
    "StartingJournal",
    "StartingLookup",
    "ToolJournal",
    "journal_key",
    "settle",
    "start_fresh",
    "stored_key",
]

MAX_KEY_BYTES = 256
"""The longest key (bytes of UTF-8) a store keeps as it is: longer ones are digested, so that
a run id and a key together stay well within what PostgreSQL indexes."""


class CallStatus(StrEnum):
    """How far a journalled call got."""

    STARTED = "started"
    FINISHED = "finished"


@dataclass(frozen=True, slots=True)
class JournalEntry:
    """What the journal knows about one call."""

    key: str
    call: ToolCall
    status: CallStatus
    result: ToolMessage | None = None
    """The answer the model got; set once the call finished."""


def journal_key(turn: int, index: int, call_id: str) -> str:
    """The key of the ``index``-th call of the reply made on model call ``turn``."""
    return f"{turn}:{index}:{call_id}"


def stored_key(key: str) -> str:
    """How a store that keeps keys as database text stores ``key``: the key itself when it is
    valid UTF-8 of at most ``MAX_KEY_BYTES`` bytes without NUL (every key the engine makes
    from a sane call id), else ``sha256:`` and the digest of its code points (distinct keys
    stay distinct: two lone surrogates are not both U+FFFD here)."""
    if key.isascii() and len(key) <= MAX_KEY_BYTES and "\x00" not in key:
        return key
    raw = key.encode("utf-8", "surrogatepass")
    try:
        clean = len(key.encode()) <= MAX_KEY_BYTES and "\x00" not in key
    except UnicodeEncodeError:
        clean = False
    return key if clean else f"sha256:{hashlib.sha256(raw).hexdigest()}"


@runtime_checkable
class ToolJournal(Protocol):
    """Where one run's tool calls are recorded around their execution (the module's
    contract). A key names one call of the run; each method is its own durable write."""

    def lookup(self, key: str) -> JournalEntry | None:
        """The entry for ``key``, or None when the call never started. A call started but
        never finished is ``STARTED`` with no result."""
        ...

    def record_started(self, key: str, call: ToolCall) -> None:
        """Record that ``call`` is about to run *again*: an idempotent call whose entry was
        found started (its first run cut short by a crash). Durable when it returns. A key
        recorded before is replaced: one entry, ``STARTED``, no result. Not for a call's
        first start, which must not overwrite another's: ``start_fresh``."""
        ...

    def record_finished(self, key: str, result: ToolMessage) -> None:
        """Record the answer to a started call: its entry becomes ``FINISHED`` with
        ``result``.

        Raises:
            KeyError: ``key`` never started.
        """
        ...


class NotStarted(Exception):
    """``StartingJournal.lookup_or_start`` found no entry for the key, and could not record
    the call as started (its cause says why): the call must not run, and it did not."""


@runtime_checkable
class StartingJournal(Protocol):
    """A journal that records a call's first start as an insert that refuses an existing
    entry, and answers that entry instead (every journal of agent_fsm: one durable write
    where ``lookup`` and ``record_started`` take two). Of any number of executions starting
    one call at once (a worker taken for dead that goes on, and the one that took its run
    over), exactly one records it and runs it. ``start_fresh`` calls it."""

    def lookup_or_start(self, key: str, call: ToolCall) -> JournalEntry | None:
        """The entry for ``key`` when there is one (then nothing is written); otherwise
        ``call`` is recorded as started (durable when it returns), and None is returned.
        Atomic: an entry another writer records meanwhile is answered, never replaced.

        Raises:
            NotStarted: there was no entry and the record could not be written (the call
                must not run).
            Exception: anything else: the entry could not be read (it may have run).
        """
        ...


@runtime_checkable
class PairedLookup(Protocol):
    """A journal that reads two entries in one round trip (``PostgresJournal``): a DBOS
    tool step reads its own entry and its activation's cancel request
    (``agent_fsm.dbos.cancelling``) at once."""

    def lookup_pair(self, key: str, other: str) -> tuple[JournalEntry | None, JournalEntry | None]:
        """``(lookup(key), lookup(other))``, read together."""
        ...


@runtime_checkable
class FinishingLookup(Protocol):
    """A journal that records a call finished and reads another entry in the same round
    trip (``PostgresJournal``): a DBOS tool step records its answer and reads its
    activation's cancel request at once, so the model call after it need not read it
    again (``agent_fsm.dbos.cancelling``)."""

    def finish_and_lookup(self, key: str, result: ToolMessage, other: str) -> JournalEntry | None:
        """``record_finished(key, result)``, then ``lookup(other)`` (another key), together.

        Raises:
            as ``record_finished``.
        """
        ...


@runtime_checkable
class StartingLookup(Protocol):
    """A journal that reads two entries and records a call started, when neither exists, in
    one round trip (``PostgresJournal``): a DBOS tool step's read of its own entry and its
    activation's cancel request, and the start of its call when both are absent (the first
    execution of the step, the usual case)."""

    def start_unless_known(
        self, key: str, call: ToolCall, other: str
    ) -> tuple[JournalEntry | None, JournalEntry | None, bool]:
        """``(lookup(key), lookup(other), started)``: ``record_started(key, call)`` was done,
        as durably, when (and only when) ``started``; it is done when both entries are None.

        Raises:
            as ``record_started``.
        """
        ...


@runtime_checkable
class FirstFinish(Protocol):
    """A journal that records a call's end only if none is recorded yet (``PostgresJournal``,
    ``MemoryJournal``): the first end wins, and a second execution of the same call (a worker
    taken for dead that goes on) reads the end the first one recorded instead of writing its
    own. A DBOS run's tool call made without a step (``agent_fsm.dbos.unstepped``) keeps its
    answer, and the time it ended, nowhere else: that answer must never change once read."""

    def finish_first(self, key: str, result: ToolMessage) -> JournalEntry | None:
        """Record ``result`` as the end of the started call of ``key``, unless an end is
        recorded already; the entry as it stands after (``result``'s, or the earlier end's).
        None when ``key`` has no entry. Committed as ``record_finished`` is.

        Raises:
            Exception: the journal failed (the end may or may not have been recorded: a
                second call answers which).
        """
        ...


@runtime_checkable
class FirstFinishingLookup(Protocol):
    """A journal that keeps a first end (``FirstFinish``) and reads another entry in the
    same round trip (``PostgresJournal``, ``MemoryJournal``): a DBOS tool call made without a
    step records its end and reads its activation's cancel request at once, so the model
    step after it need not read it again (``agent_fsm.dbos.cancelling``)."""

    def finish_first_and_lookup(
        self, key: str, result: ToolMessage, other: str
    ) -> tuple[JournalEntry | None, JournalEntry | None]:
        """``(finish_first(key, result), lookup(other))``, together (``other`` another key
        than ``key``).

        Raises:
            as ``finish_first``.
        """
        ...


@runtime_checkable
class OutcomeJournal(Protocol):
    """A journal that also keeps the outcomes of what a run does that is no tool call (a DBOS
    run's model call: ``agent_fsm.dbos.model_calls``), each a JSON text its writer encodes
    and decodes, under a key of its own (never a tool call's, nor the cancel request's). The
    first outcome kept under a key is the only one: a second execution of the same thing (a
    worker taken for dead that goes on, a replay) reads it instead of keeping its own, so an
    outcome never changes once read (``PostgresJournal``, ``MemoryJournal``)."""

    def keep_outcome(self, key: str, outcome: str) -> str:
        """Keep ``outcome`` (a JSON text) under ``key`` unless an outcome is kept there
        already; the outcome kept after (``outcome``, or the earlier one, unchanged).
        Committed as ``record_finished`` is (a store may not wait for the disk).

        Raises:
            Exception: the journal failed (the outcome may or may not have been kept: a
                second call answers which).
        """
        ...

    def outcome_and_lookup(self, key: str, other: str) -> tuple[str | None, JournalEntry | None]:
        """The outcome kept under ``key`` (None: none), and ``lookup(other)``, read together
        (``other`` a tool call's key or the cancel request's)."""
        ...


def start_fresh(journal: ToolJournal, key: str, call: ToolCall) -> JournalEntry | None:
    """The first start of a call: ``lookup_or_start`` on a journal that has it (every
    journal of agent_fsm: atomic), else ``lookup`` then ``record_started`` (a journal of
    someone else's, which cannot refuse a concurrent start). None when the call was
    recorded started and must run now; the entry found otherwise (nothing written).

    Raises:
        NotStarted: there was no entry and the start could not be recorded (the call must
            not run); with a journal lacking ``lookup_or_start``, any failure of
            ``record_started`` is raised as this too.
        Exception: the entry could not be read (the call may have run).
    """
    starting = getattr(journal, "lookup_or_start", None)  # not isinstance: a Protocol's is
    if starting is not None:  # slow, and this runs for every call of a durable run
        found: JournalEntry | None = starting(key, call)
        return found
    entry = journal.lookup(key)
    if entry is not None:
        return entry
    try:
        journal.record_started(key, call)
    except Exception as exc:
        raise NotStarted(f"{type(exc).__name__}: {exc}") from exc
    return None


class MemoryJournal:
    """A journal kept in a dict: survives a resumed ``Run`` object, not a process."""

    __slots__ = ("_entries", "_outcomes")

    def __init__(self) -> None:
        self._entries: dict[str, JournalEntry] = {}
        self._outcomes: dict[str, str] = {}

    def lookup(self, key: str) -> JournalEntry | None:
        return self._entries.get(key)

    def lookup_or_start(self, key: str, call: ToolCall) -> JournalEntry | None:
        started = JournalEntry(key, call, CallStatus.STARTED)
        found = self._entries.setdefault(key, started)  # atomic: one writer wins
        return None if found is started else found

    def record_started(self, key: str, call: ToolCall) -> None:
        self._entries[key] = JournalEntry(key, call, CallStatus.STARTED)

    def record_finished(self, key: str, result: ToolMessage) -> None:
        entry = self._entries.get(key)
        if entry is None:
            raise KeyError(f"journal entry {key!r} finished without having started")
        self._entries[key] = JournalEntry(key, entry.call, CallStatus.FINISHED, result)

    def finish_first(self, key: str, result: ToolMessage) -> JournalEntry | None:
        entry = self._entries.get(key)
        if entry is None or entry.status is CallStatus.FINISHED:
            return entry
        finished = JournalEntry(key, entry.call, CallStatus.FINISHED, result)
        self._entries[key] = finished
        return finished

    def finish_first_and_lookup(
        self, key: str, result: ToolMessage, other: str
    ) -> tuple[JournalEntry | None, JournalEntry | None]:
        return self.finish_first(key, result), self._entries.get(other)

    def keep_outcome(self, key: str, outcome: str) -> str:
        return self._outcomes.setdefault(key, outcome)  # atomic: the first one stays

    def outcome_and_lookup(self, key: str, other: str) -> tuple[str | None, JournalEntry | None]:
        return self._outcomes.get(key), self._entries.get(other)

    def __len__(self) -> int:
        return len(self._entries)


class GuardedJournal:
    """``journal`` with ``guard()`` called before every ``record_started``: raising refuses
    the record, and so the call (a run lease that was taken over: ``durable.leases``)."""

    __slots__ = ("_guard", "_journal")

    def __init__(self, journal: ToolJournal, guard: Callable[[], None]) -> None:
        self._journal = journal
        self._guard = guard

    def lookup(self, key: str) -> JournalEntry | None:
        return self._journal.lookup(key)

    def lookup_or_start(self, key: str, call: ToolCall) -> JournalEntry | None:
        """Guarded only when it writes: an entry found is answered whoever holds the run."""
        entry = self._journal.lookup(key)
        if entry is not None:
            return entry
        try:
            self._guard()
        except Exception as exc:
            raise NotStarted(f"{type(exc).__name__}: {exc}") from exc
        return start_fresh(self._journal, key, call)

    def record_started(self, key: str, call: ToolCall) -> None:
        self._guard()
        self._journal.record_started(key, call)

    def record_finished(self, key: str, result: ToolMessage) -> None:
        self._journal.record_finished(key, result)


def settle(journal: ToolJournal | None) -> None:
    """Write now what ``journal`` holds back, if it holds anything back (a ``SQLiteJournal``
    keeps the finished record of a run's last call in flight for the run's next write): the
    run's driver lets go of it. Never raises: a record lost reads as started, the call's
    outcome unknown, as after a crash."""
    settling = getattr(journal, "settle", None)
    if settling is not None:
        with contextlib.suppress(Exception):
            settling()
