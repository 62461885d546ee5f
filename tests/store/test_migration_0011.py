"""Migration 0011 adds the agents' state schemas, keeping the runs stored before."""

from __future__ import annotations

import pytest

from agentsnap.store import migrate
from agentsnap.store.sql import SqlStore

from .test_migration_0007 import RUN, insert_run, tables

TABLE = "agentsnap_state_schemas"


@pytest.fixture
def url(empty_db: str) -> str:
    """An empty SQLite or PostgreSQL database."""
    return empty_db


async def test_runs_stored_before_0011_have_no_schemas_and_can_get_them(url: str) -> None:
    migrate.upgrade(url, "0010")
    insert_run(url)
    assert TABLE not in tables(url)

    migrate.upgrade(url, "0011")
    assert TABLE in tables(url)
    migrate.upgrade(url)  # the store needs the newest schema
    store = SqlStore(url)
    try:
        assert await store.load_state_schemas(RUN) == {}
        await store.save_state_schemas(RUN, {"writer": {"type": "object"}})
        assert await store.load_state_schemas(RUN) == {"writer": {"type": "object"}}
    finally:
        await store.close()

    migrate.downgrade(url, "0010")
    assert TABLE not in tables(url)
    migrate.upgrade(url)
    store = SqlStore(url)
    try:
        assert (await store.get_run(RUN)).id == RUN
        assert await store.load_state_schemas(RUN) == {}
    finally:
        await store.close()
