"""Migration 0020 adds each run's history of owners, keeping the runs and their leases.

A run leased before it keeps its lease and has no history; the next owner to take it over
starts the history at its own token, and a run deleted takes its history with it. The
downgrade drops the table and keeps the runs.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

from agentsnap.records import RunInfo, utcnow
from agentsnap.store import migrate
from agentsnap.store.retention import delete_runs
from agentsnap.store.sql import SqlStore
from agentsnap.store.tables import RunLeaseRow, RunRow

RUN = "f" * 32
AT = datetime(2026, 12, 2, 9, 0, tzinfo=UTC)


@pytest.fixture
def url(empty_db: str) -> str:
    """An empty SQLite or PostgreSQL database."""
    return empty_db


def tables(url: str) -> set[str]:
    engine = sa.create_engine(migrate.sync_url(url))
    try:
        with engine.connect() as conn:
            return set(sa.inspect(conn).get_table_names())
    finally:
        engine.dispose()


def insert_before_0020(url: str) -> None:
    """A run and its expired lease (token 3), as a store of revision 0019 wrote them."""
    runs: sa.Table = RunRow.__table__  # type: ignore[assignment]
    leases: sa.Table = RunLeaseRow.__table__  # type: ignore[assignment]
    engine = sa.create_engine(migrate.sync_url(url))
    try:
        with engine.begin() as conn:
            conn.execute(
                sa.insert(runs).values(
                    {"id": RUN, "status": "running", "created_at": AT, "metadata": {}}
                )
            )
            conn.execute(
                sa.insert(leases).values(
                    run_id=RUN, owner="old:1:x", token=3, expires_at=AT, renewed_at=AT
                )
            )
    finally:
        engine.dispose()


async def test_runs_and_leases_are_kept_across_0020_both_ways(url: str) -> None:
    migrate.upgrade(url, "0019")
    insert_before_0020(url)

    migrate.upgrade(url)
    assert "agentsnap_run_owners" in tables(url)
    store = SqlStore(url, create=False)
    try:
        assert await store.list_run_owners(RUN) == [], "no history from before"
        taken = await store.take_lease(RUN, "new:2:y", utcnow() + timedelta(days=1), replacing=3)
        assert taken is not None
        assert taken.token == 4
        (owner,) = await store.list_run_owners(RUN)
        assert (owner.token, owner.owner, owner.ended) == (4, "new:2:y", None)
    finally:
        await store.close()

    migrate.downgrade(url, "0019")
    assert "agentsnap_run_owners" not in tables(url)
    engine = sa.create_engine(migrate.sync_url(url))
    try:
        with engine.connect() as conn:
            found = conn.execute(sa.text("SELECT run_id, token FROM agentsnap_run_leases"))
            assert [tuple(row) for row in found] == [(RUN, 4)]
    finally:
        engine.dispose()


async def test_deleting_a_run_deletes_its_owners(url: str) -> None:
    migrate.upgrade(url)
    store = SqlStore(url, create=False)
    try:
        await store.create_run(RunInfo(id=RUN))
        assert await store.take_lease(RUN, "a:1:x", utcnow(), replacing=None) is not None
        await store.release_lease(RUN, 1)
    finally:
        await store.close()

    report = await delete_runs(url, [RUN])

    assert report.rows["agentsnap_run_owners"] == 1
    engine = sa.create_engine(migrate.sync_url(url))
    try:
        with engine.connect() as conn:
            left = conn.execute(sa.text("SELECT COUNT(*) FROM agentsnap_run_owners"))
            assert left.scalar_one() == 0
    finally:
        engine.dispose()
