"""Migration 0014 lets snapshots extend a base; its downgrade makes every snapshot full again."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from agentsnap.store import migrate
from agentsnap.store.sql import SqlStore

from .test_contract import stored_run
from .test_contract_bases import Team, assert_reads_back, layout


@pytest.fixture
def url(empty_db: str) -> str:
    """An empty SQLite or PostgreSQL database."""
    return empty_db


def rows_per_snapshot(url: str) -> dict[int, int]:
    engine = sa.create_engine(migrate.sync_url(url))
    try:
        with engine.connect() as conn:
            found = conn.execute(
                sa.text(
                    "SELECT s.seq, count(a.agent) FROM agentsnap_snapshots s "
                    "LEFT JOIN agentsnap_snapshot_agents a ON a.snapshot_id = s.id "
                    "GROUP BY s.seq ORDER BY s.seq"
                )
            ).all()
            columns = {c["name"] for c in sa.inspect(conn).get_columns("agentsnap_snapshots")}
    finally:
        engine.dispose()
    assert ("base_id" in columns) == ("agent_rows" in columns)
    return {row[0]: row[1] for row in found}


async def test_snapshots_stay_readable_down_to_0013_and_up_again(url: str) -> None:
    migrate.upgrade(url)
    store = SqlStore(url)
    team = Team.of(10)
    try:
        run = await stored_run(store)
        written = []
        for seq in range(1, 5):
            team.handle(f"w0{seq}")
            written.append(team.snapshot(run.id, seq))
            await store.save_snapshot(written[-1])
        assert await layout(store, run.id) == [(1, None, 11), (2, 1, 2), (3, 1, 3), (4, 1, 4)]
    finally:
        await store.close()

    migrate.downgrade(url, "0013")
    # Every snapshot holds a row per process again, as a store before 0014 reads them.
    assert rows_per_snapshot(url) == {1: 11, 2: 11, 3: 11, 4: 11}

    migrate.upgrade(url, "0014")  # snapshots stored before: each full, none extends another
    migrate.upgrade(url)
    store = SqlStore(url)
    try:
        await assert_reads_back(store, written)
        assert [base for _, base, _ in await layout(store, run.id)] == [None] * 4
        for seq in (5, 6):  # written after the upgrade: a new base, and one over it
            team.handle(f"w0{seq}")
            written.append(team.snapshot(run.id, seq))
            await store.save_snapshot(written[-1])
        await assert_reads_back(store, written)
        assert (await layout(store, run.id))[4:] == [(5, None, 11), (6, 5, 2)]
    finally:
        await store.close()
