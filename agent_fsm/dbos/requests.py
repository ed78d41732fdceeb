"""A DBOS activation's tool journal, and the request to cancel it: the journal calls its tool
calls make, each of which reads the request in the same round trip where the journal offers
it, and whether the request was read after every call made since the latest model call.

``RunJournal`` is the journal half of ``replay.RunTime`` (its base class): where the
activation's calls are keyed (``call_key``), how a tool call's start and end are recorded
together with a read of the request (``agent_fsm.dbos.tool_calls``,
``agent_fsm.dbos.unstepped``), where a model call made without a step keeps its outcome
(``model_key``, ``keep_outcome``; ``agent_fsm.dbos.model_calls``), and what the model call
after them reads itself (``request_seen``). Who makes the request, and where it waits, is
``agent_fsm.dbos.cancelling``'s.
"""

from __future__ import annotations

import json

from agent_fsm.durable.journal import (
    FinishingLookup,
    FirstFinish,
    FirstFinishingLookup,
    JournalEntry,
    OutcomeJournal,
    PairedLookup,
    StartingLookup,
    ToolJournal,
    start_fresh,
)
from agent_fsm.messages import ToolCall, ToolMessage

__all__ = ["CANCEL_CALL", "CANCEL_KEY", "RunJournal"]

CANCEL_KEY = "cancel"
"""The journal key, after an activation's key prefix (``RunJournal.key_prefix``), of a request
to cancel that activation (``agent_fsm.dbos.cancelling``); no tool step's key is one."""
CANCEL_CALL = "agent_fsm.cancel"
"""The name of the call a cancel request is recorded as, its arguments ``{"reason": ...}``."""


class RunJournal:
    """An activation's tool journal and the reads of its cancel request (see the module
    docstring). Every value it keeps is set from recorded outcomes, or from reads made live
    in this execution where said (``hear``)."""

    __slots__ = (
        "_finish_and_read",
        "_starting",
        "cancelled",
        "first_finish",
        "heard",
        "journal",
        "key_prefix",
        "looked",
        "missed",
        "outcomes",
    )

    def __init__(self, journal: ToolJournal, key_prefix: str) -> None:
        self.journal = journal
        """Where tool calls are recorded (``agent_fsm.dbos.tool_calls``)."""
        self.first_finish = journal if isinstance(journal, FirstFinish) else None
        """The journal, when it keeps a first end: tool calls may then be made without a
        step (checked once: a Protocol's ``isinstance`` is slow)."""
        self._starting = journal if isinstance(journal, StartingLookup) else None
        """The journal, when it starts a call in its read (``start_and_request``: every tool
        call's)."""
        self._finish_and_read = journal if isinstance(journal, FirstFinishingLookup) else None
        self.outcomes = journal if isinstance(journal, OutcomeJournal) else None
        """The journal, when it keeps outcomes: model calls may then be made without a
        step (``agent_fsm.dbos.model_calls``)."""
        """The journal, when it reads the cancel request with a first end
        (``finish_unstepped``)."""
        self.key_prefix = key_prefix
        """Put before a tool step's journal key: a resume's steps are numbered from 1
        again, in the same run's journal (``agent_fsm.dbos.pausing``)."""
        self.cancelled: str | None = None
        """Why the activation was cancelled from outside, once a step's recorded outcome
        said so (the same on every execution): the steps after it make no call."""
        self.looked = False
        """Whether a tool step read the cancel request after its call since the latest
        model call (``saw_request``), and ``missed`` whether one did not: both from
        recorded outcomes (or a read made live, ``hear``), and each only ever set within a
        turn, so parallel tool steps ending in any order leave the same answer."""
        self.missed = False
        self.heard: str | None = None
        """The reason of a cancel request that a tool call made without a step read with its
        end, in this execution, since the latest model call (``finish_unstepped``): not
        recorded anywhere, so the model call after it records it as its own read."""

    def call_key(self, number: int) -> str:
        """The journal key of tool call ``number`` of the activation."""
        return f"{self.key_prefix}call:{number}"

    def model_key(self, number: int) -> str:
        """The journal key of model call ``number`` of the activation (its outcome's)."""
        return f"{self.key_prefix}model:{number}"

    def keep_outcome(self, key: str, outcome: str) -> str:
        """A model call made without a step keeps its outcome (``OutcomeJournal``): the
        outcome kept after, this one or the one another execution kept first. Called in the
        workflow; the journal must keep outcomes (``outcomes``).

        Raises:
            as ``OutcomeJournal.keep_outcome``.
        """
        outcomes = self.outcomes
        assert outcomes is not None  # checked by the caller
        return outcomes.keep_outcome(key, outcome)

    def outcome_and_request(self, key: str) -> tuple[str | None, str | None]:
        """The outcome kept under ``key`` (None: none) and this activation's pending cancel
        request, in one read (``OutcomeJournal.outcome_and_lookup``). Called in the workflow
        by an execution that may be a replay; the journal must keep outcomes.

        Raises:
            as ``OutcomeJournal.outcome_and_lookup``.
        """
        outcomes = self.outcomes
        assert outcomes is not None  # checked by the caller
        outcome, request = outcomes.outcome_and_lookup(key, self.key_prefix + CANCEL_KEY)
        return outcome, _reason(request)

    def start_unstepped(
        self, key: str, call: ToolCall
    ) -> tuple[JournalEntry | None, str | None, bool]:
        """A tool call's start made without a step: ``start_and_request`` on a journal that
        starts in its read, else the request read and the call's first start
        (``journal.start_fresh``) when the key has no entry.

        Raises:
            as ``start_and_request``, or ``journal.NotStarted``.
        """
        if self._starting is not None:
            return self.start_and_request(key, call)
        entry, reason = self.entry_and_request(key)
        if entry is not None or reason is not None:
            return entry, reason, False
        entry = start_fresh(self.journal, key, call)
        return entry, None, entry is None

    def finish_unstepped(
        self, key: str, result: ToolMessage
    ) -> tuple[JournalEntry | None, bool, str | None]:
        """A tool call made without a step records its end (``journal.FirstFinish``) and,
        in the same round trip where the journal offers it (``FirstFinishingLookup``), reads
        this activation's pending cancel request: (the entry after, whether the request was
        read, its reason). Called in the workflow, on the execution that made the call; the
        journal must keep a first end (``first_finish``).

        Raises:
            as ``FirstFinish.finish_first``.
        """
        reading = self._finish_and_read
        if reading is not None:
            entry, request = reading.finish_first_and_lookup(
                key, result, self.key_prefix + CANCEL_KEY
            )
            return entry, True, _reason(request)
        finishing = self.first_finish
        assert finishing is not None  # checked by the caller
        return finishing.finish_first(key, result), False, None

    def hear(self, reason: str | None) -> None:
        """A call made without a step read the cancel request with its end, live (not from a
        record): a request found is the model call's to record (``heard``); the read counts
        as one after the call (its answer says ``looked``)."""
        if reason is not None and self.heard is None:
            self.heard = reason

    def request_seen(self) -> bool:
        """Whether the cancel request was read after every call made so far (a tool step
        of the latest turn read it after its own call, and none failed to), as recorded or,
        for a call made without a step, live (``hear``): a model call then takes
        ``cancelled``, or else ``heard``, as that read, and reads nothing itself."""
        return self.looked and not self.missed

    def saw_request(self, looked: bool) -> None:
        """A tool step's recorded outcome says whether it read the request after its call."""
        if looked:
            self.looked = True
        else:
            self.missed = True

    def called_model(self) -> None:
        """A model call was made (or its outcome recorded): the request must be read again."""
        self.looked = self.missed = False
        self.heard = None

    def cancel_requested(self) -> str | None:
        """The reason of a request to cancel this activation, if one is pending in the
        run's journal (``agent_fsm.dbos.cancelling``). Read inside steps only, which record
        the answer. A look-up that fails counts as no request: a store that blinks must not
        abort every run it holds (the next step reads it again)."""
        try:
            return _reason(self.journal.lookup(self.key_prefix + CANCEL_KEY))
        except Exception:
            return None

    def entry_and_request(self, key: str) -> tuple[JournalEntry | None, str | None]:
        """The journal entry of ``key`` and this activation's pending cancel request
        (``cancel_requested``), in one read of a journal that offers it (``PairedLookup``:
        a tool step's one round trip before its call). Read inside steps only.

        Raises:
            as ``ToolJournal.lookup``, when the entry cannot be read (a request that
            cannot be read is None).
        """
        journal = self.journal
        if isinstance(journal, PairedLookup):
            entry, request = journal.lookup_pair(key, self.key_prefix + CANCEL_KEY)
            return entry, _reason(request)
        return journal.lookup(key), self.cancel_requested()

    def start_and_request(
        self, key: str, call: ToolCall
    ) -> tuple[JournalEntry | None, str | None, bool]:
        """``entry_and_request(key)`` and, when the entry is None and no request is pending,
        the call recorded as started in the same round trip where the journal offers it
        (``StartingLookup``): (the entry, the request's reason, whether ``call`` was
        recorded). Read inside steps only.

        Raises:
            as ``entry_and_request``, or ``ToolJournal.record_started``.
        """
        journal = self._starting
        if journal is not None:
            entry, request, started = journal.start_unless_known(
                key, call, self.key_prefix + CANCEL_KEY
            )
            return entry, _reason(request), started
        entry, reason = self.entry_and_request(key)
        return entry, reason, False

    def finish_and_request(self, key: str, result: ToolMessage) -> tuple[bool, str | None]:
        """Record the call of ``key`` finished with ``result`` and, in the same round trip
        where the journal offers it (``FinishingLookup``), read this activation's pending
        cancel request: (whether it was read, its reason). Read inside steps only.

        Raises:
            as ``ToolJournal.record_finished``.
        """
        journal = self.journal
        if isinstance(journal, FinishingLookup):
            request = journal.finish_and_lookup(key, result, self.key_prefix + CANCEL_KEY)
            return True, _reason(request)
        journal.record_finished(key, result)
        return False, None


def _reason(entry: JournalEntry | None) -> str | None:
    """The reason a cancel request's journal entry gives; None for no request."""
    if entry is None or entry.call.name != CANCEL_CALL:
        return None
    try:
        reason = json.loads(entry.call.arguments).get("reason")
    except (ValueError, AttributeError):
        reason = None
    return reason if isinstance(reason, str) else "cancelled"
