"""Ledgers for side-effecting tool calls: in memory, or in SQL beside the runs.

A [`Ledger`][agentsnap.ledger.Ledger] keeps one entry per idempotency key; the rules for using
it live in [`agentsnap.ledger`][agentsnap.ledger]. Two implementations:

* [`MemoryLedger`][agentsnap.store.ledger.MemoryLedger]: dictionaries, for tests and quick
  experiments; what it holds ends with the process;
* [`SqlLedger`][agentsnap.store.sql_ledger.SqlLedger]: the ``agentsnap_tool_calls`` table in
  SQLite or PostgreSQL, where the key is the primary key, so that the database enforces "at
  most once" across tasks and processes.

[`ledger_for`][agentsnap.store.ledger.ledger_for] picks the one that goes with a store. This
module does not import SQLAlchemy; ``SqlLedger`` lives in ``agentsnap.store.sql_ledger``.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar, Unpack

from agentsnap.ledger import Change, Expected, Ledger, LedgerEntry
from agentsnap.model_calls import ModelCallRecord
from agentsnap.requests import (
    WITHDRAWN,
    HumanRequest,
    RequestStatus,
    Settlement,
    settled_fields,
)

if TYPE_CHECKING:
    from datetime import datetime

    from agentsnap.messages import JsonValue
    from agentsnap.store.faults import StoreRetry
    from agentsnap.store.sql_ledger import SqlLedger

__all__ = ["MemoryLedger", "ledger_for"]

_Held = TypeVar("_Held", LedgerEntry, HumanRequest)


class MemoryLedger:
    """A [`Ledger`][agentsnap.ledger.Ledger] in a dictionary, for one process.

    Also a [`ModelCallLog`][agentsnap.model_calls.ModelCallLog] and a
    [`RequestLog`][agentsnap.requests.RequestLog]: its requests can be answered only from its
    own process (with [`agentsnap.inspect.answer`][agentsnap.inspect.answer] given the ledger).

    Every method runs without awaiting anything, so each is atomic among the tasks of one
    event loop, as the SQL ledger's statements are among connections.
    """

    def __init__(self) -> None:
        self._entries: dict[str, LedgerEntry] = {}
        self._model_calls: dict[tuple[str, str, str, int, int], ModelCallRecord] = {}
        self._requests: dict[str, HumanRequest] = {}

    def __repr__(self) -> str:
        return f"MemoryLedger({len(self._entries)} entries)"

    async def claim(self, entry: LedgerEntry) -> LedgerEntry | None:  # noqa: D102
        found = self._entries.get(entry.key)
        if found is None:
            self._entries[entry.key] = entry
        return found

    async def get(self, key: str) -> LedgerEntry | None:  # noqa: D102
        return self._entries.get(key)

    async def update(  # noqa: D102
        self, key: str, change: Change, **expected: Unpack[Expected]
    ) -> bool:
        statuses = expected["statuses"]
        owner = expected.get("owner")
        attempts = expected.get("attempts")
        return _replace_if(
            self._entries,
            key,
            lambda found: (
                found.status in statuses
                and (owner is None or found.owner == owner)
                and (attempts is None or found.attempts == attempts)
            ),
            change,
        )

    def fence(self, run_id: str, token: int) -> None:
        """Do nothing: a memory ledger has no lease to check against.

        A run's lease lives in its store, and this ledger shares no database with any store;
        it is also private to its process, so no runtime elsewhere can take the run over and
        use it. A runtime that loses its lease is stopped by its store's fencing.
        """

    async def list_calls(self, run_id: str | None = None) -> list[LedgerEntry]:  # noqa: D102
        entries = [e for e in self._entries.values() if run_id is None or e.run_id == run_id]
        return sorted(entries, key=lambda e: (e.created_at, e.key))

    async def record_model_call(self, record: ModelCallRecord) -> bool:  # noqa: D102
        identity = (
            record.run_id,
            record.agent,
            record.message_id,
            record.position,
            record.timeline,
        )
        if identity in self._model_calls:
            return False
        self._model_calls[identity] = record
        return True

    async def find_model_call(  # noqa: D102
        self, run_id: str, agent: str, message_id: str, position: int, timeline: int
    ) -> ModelCallRecord | None:
        return self._model_calls.get((run_id, agent, message_id, position, timeline))

    async def find_model_answer(  # noqa: D102
        self, run_id: str, agent: str, message_id: str, position: int, timeline: int
    ) -> dict[str, JsonValue] | None:
        found = self._model_calls.get((run_id, agent, message_id, position, timeline))
        return None if found is None else found.response

    async def replayed_model_call(  # noqa: D102
        self, run_id: str, agent: str, message_id: str, position: int, timeline: int
    ) -> None:
        identity = (run_id, agent, message_id, position, timeline)
        found = self._model_calls.get(identity)
        if found is not None:
            self._model_calls[identity] = dataclasses.replace(found, replays=found.replays + 1)

    async def list_model_calls(  # noqa: D102
        self, run_id: str, agent: str | None = None
    ) -> list[ModelCallRecord]:
        calls = [
            c
            for c in self._model_calls.values()
            if c.run_id == run_id and (agent is None or c.agent == agent)
        ]
        return sorted(calls, key=lambda c: (c.started_at, c.agent, c.position))

    async def add_request(self, request: HumanRequest) -> HumanRequest:  # noqa: D102
        return self._requests.setdefault(request.id, request)

    async def find_request(self, request_id: str) -> HumanRequest | None:  # noqa: D102
        return self._requests.get(request_id)

    async def settle_request(  # noqa: D102
        self, request_id: str, status: RequestStatus, **settlement: Unpack[Settlement]
    ) -> bool:
        return _replace_if(
            self._requests,
            request_id,
            lambda found: found.pending,
            settled_fields(status, settlement),
        )

    async def withdraw_requests(  # noqa: D102
        self, run_id: str, before_timeline: int, *, by: str, at: datetime
    ) -> list[str]:
        withdrawn = [
            r.id
            for r in self._requests.values()
            if r.run_id == run_id and r.pending and r.timeline < before_timeline
        ]
        for found in withdrawn:
            self._requests[found] = dataclasses.replace(
                self._requests[found],
                status="withdrawn",
                reason=WITHDRAWN,
                answered_by=by,
                answered_at=at,
            )
        return withdrawn

    async def list_requests(  # noqa: D102
        self, run_id: str | None = None, *, pending: bool = False
    ) -> list[HumanRequest]:
        found = [
            r
            for r in self._requests.values()
            if (run_id is None or r.run_id == run_id) and (r.pending or not pending)
        ]
        return sorted(found, key=lambda r: (r.asked_at, r.position, r.id))

    async def close(self) -> None:
        """Nothing to release."""


def _replace_if(
    held: dict[str, _Held], key: str, test: Callable[[_Held], bool], changes: Mapping[str, Any]
) -> bool:
    """Replace the value ``held`` at ``key`` by one with ``changes`` if it passes ``test``
    (compare and set); whether it did (``False`` also when there is none).
    """  # noqa: D205
    found = held.get(key)
    if found is None or not test(found):
        return False
    held[key] = dataclasses.replace(found, **changes)
    return True


def ledger_for(store: object, *, create: bool = True) -> Ledger | None:
    """The ledger that goes with ``store``: an [`SqlLedger`][agentsnap.store.sql_ledger.SqlLedger]
    on the same database for a [`SqlStore`][agentsnap.store.sql.SqlStore], with its retry
    policy, else ``None``.

    Args:
        store: A store.
        create: Create the schema in an empty database, for a runtime's ledger, which opens
            connections of its own. Readers pass ``False`` and get the store's
            [`ledger()`][agentsnap.store.sql.SqlStore.ledger], on its engine.
    """  # noqa: D205
    sql = sys.modules.get("agentsnap.store.sql")
    # A SqlStore exists only once its module is imported: other stores cost no import.
    if sql is None or not isinstance(store, sql.SqlStore):
        return None
    if not create:
        shared: Ledger = store.ledger()
        return shared
    return _sql_ledger(store.url, create, store.retry)


def _sql_ledger(url: str, create: bool, retry: StoreRetry) -> SqlLedger:
    from agentsnap.store.sql_ledger import SqlLedger  # noqa: PLC0415  # SQLAlchemy on demand

    return SqlLedger(url, create=create, retry=retry)
