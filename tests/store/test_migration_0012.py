"""Migration 0012 adds snapshot parts and agent leases, keeping the runs stored before."""

from __future__ import annotations

from datetime import timedelta

import pytest

from agentsnap.records import SnapshotPart, utcnow
from agentsnap.store import migrate
from agentsnap.store.sql import SqlStore

from .test_migration_0007 import RUN, insert_run, tables

NEW_TABLES = {"agentsnap_snapshot_parts", "agentsnap_agent_leases"}


@pytest.fixture
def url(empty_db: str) -> str:
    """An empty SQLite or PostgreSQL database."""
    return empty_db


async def test_runs_stored_before_0012_gain_parts_and_agent_leases(url: str) -> None:
    migrate.upgrade(url, "0011")
    insert_run(url)
    assert not tables(url) & NEW_TABLES

    migrate.upgrade(url, "0012")
    assert tables(url) >= NEW_TABLES
    migrate.upgrade(url)  # the store needs the newest schema
    store = SqlStore(url)
    try:
        assert await store.load_snapshot_parts(RUN, 1) == []
        written = SnapshotPart(run_id=RUN, seq=1, worker="w1")
        await store.save_snapshot_part(written)
        assert await store.load_snapshot_parts(RUN, 1) == [written]
        assert await store.claim_agents(RUN, "h:1:t", ["a"], utcnow() + timedelta(seconds=9)) == []
    finally:
        await store.close()

    migrate.downgrade(url, "0011")
    assert not tables(url) & NEW_TABLES
    migrate.upgrade(url)
    store = SqlStore(url)
    try:
        assert (await store.get_run(RUN)).id == RUN
        assert await store.load_snapshot_parts(RUN, 1) == []
    finally:
        await store.close()
