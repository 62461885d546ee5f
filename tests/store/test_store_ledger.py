"""The ledger a store hands out for readers: on its database, closed before the store.

``SqlStore.ledger()`` is what the CLI and the inspector read tool calls and requests through
(``ledger_for(store, create=False)``): on PostgreSQL on the store's own engine, on SQLite on
the same file; either way it trusts the store's schema check.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection
from datetime import datetime

import pytest
from ledger_entries import claim_of

from agentsnap import RunInfo
from agentsnap.exceptions import ConfigurationError
from agentsnap.ledger import Change, Ledger, ToolCallStatus
from agentsnap.messages import JsonValue
from agentsnap.records import utcnow
from agentsnap.requests import HumanRequest, RequestLog, RequestStatus
from agentsnap.store.ledger import MemoryLedger, ledger_for
from agentsnap.store.sql import SqlStore
from agentsnap.store.sql_ledger import SqlLedger


async def test_the_stores_ledger_reads_and_writes_its_database_and_leaves_it_open(
    sql_store: SqlStore,
) -> None:
    run_id = uuid.uuid4().hex
    await sql_store.create_run(RunInfo(id=run_id, created_at=utcnow()))
    written = SqlLedger(sql_store.url)
    try:
        assert await written.claim(claim_of("charge-1", run_id)) is None
    finally:
        await written.close()

    ledger = ledger_for(sql_store, create=False)
    assert isinstance(ledger, SqlLedger)
    try:
        assert [e.key for e in await ledger.list_calls(run_id)] == ["charge-1"]
        assert await ledger.claim(claim_of("charge-2", run_id)) is None
    finally:
        await ledger.close()

    # Closing the ledger closed nothing of the store's; what it wrote is in the database.
    assert (await sql_store.get_run(run_id)).id == run_id
    again = sql_store.ledger()
    try:
        assert [e.key for e in await again.list_calls(run_id)] == ["charge-1", "charge-2"]
    finally:
        await again.close()


def test_only_a_postgresql_engine_is_shared(tmp_path: object) -> None:
    store = SqlStore(f"sqlite:///{tmp_path}/shared.db")
    with pytest.raises(ConfigurationError, match="shares only a PostgreSQL engine"):
        SqlLedger(store.url, engine=store._engine)


@pytest.mark.parametrize(
    "url",
    ["sqlite://", "sqlite:///:memory:", "sqlite:///file:shared?mode=memory&cache=shared&uri=true"],
)
def test_a_ledger_refuses_every_in_memory_sqlite_database(url: str) -> None:
    with pytest.raises(ConfigurationError, match="needs an SQLite file"):
        SqlLedger(url)


class _SpelledOut(MemoryLedger):
    """A ledger written as a third party may: the protocols' keywords spelled out."""

    async def update(
        self,
        key: str,
        change: Change,
        *,
        statuses: Collection[ToolCallStatus],
        owner: str | None = None,
        attempts: int | None = None,
    ) -> bool:
        return await super().update(key, change, statuses=statuses, owner=owner, attempts=attempts)

    async def settle_request(
        self,
        request_id: str,
        status: RequestStatus,
        *,
        answer: JsonValue,
        reason: str | None,
        by: str | None,
        at: datetime,
    ) -> bool:
        return await super().settle_request(
            request_id, status, answer=answer, reason=reason, by=by, at=at
        )


async def test_a_ledger_spelling_the_keywords_out_follows_the_protocols() -> None:
    spelled = _SpelledOut()
    ledger: Ledger = spelled  # checked by mypy: the keywords of Expected, spelled out
    requests: RequestLog = spelled  # and those of Settlement
    assert isinstance(spelled, Ledger)
    assert isinstance(spelled, RequestLog)
    assert await ledger.claim(claim_of("charge-1", "run-1")) is None
    stale: Change = {"attempts": 2, "updated_at": utcnow()}
    assert not await ledger.update(
        "charge-1", {"note": "x"}, statuses=(ToolCallStatus.IN_PROGRESS,), owner="someone"
    )
    assert await ledger.update(
        "charge-1", {"note": "x"}, statuses=(ToolCallStatus.IN_PROGRESS,), attempts=1
    )
    assert not await ledger.update("charge-1", stale, statuses=(ToolCallStatus.SUCCEEDED,))
    found = await ledger.get("charge-1")
    assert found is not None
    assert (found.note, found.attempts) == ("x", 1)

    asked = HumanRequest(
        id="r-1",
        run_id="run-1",
        agent="writer",
        message_id="m-1",
        position=0,
        timeline=0,
        kind="question",
        question="ok?",
        asked_at=utcnow(),
    )
    await requests.add_request(asked)
    at = utcnow()
    assert await requests.settle_request(
        "r-1", "answered", answer=True, reason=None, by="ann", at=at
    )
    assert not await requests.settle_request(
        "r-1", "rejected", answer=None, reason="no", by="bob", at=at
    )
    settled = await requests.find_request("r-1")
    assert settled is not None
    assert (settled.status, settled.answer, settled.answered_by, settled.answered_at) == (
        "answered",
        True,
        "ann",
        at,
    )
