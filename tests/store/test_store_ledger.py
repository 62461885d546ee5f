"""The ledger a store hands out for readers: on its database, closed before the store.

``SqlStore.ledger()`` is what the CLI and the inspector read tool calls and requests through
(``ledger_for(store, create=False)``): on PostgreSQL on the store's own engine, on SQLite on
the same file; either way it trusts the store's schema check.
"""

from __future__ import annotations

import uuid

import pytest
from ledger_entries import claim_of

from agentsnap import RunInfo
from agentsnap.exceptions import ConfigurationError
from agentsnap.records import utcnow
from agentsnap.store.ledger import ledger_for
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
