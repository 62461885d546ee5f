"""Migration 0007 adds run leases and the replay log to a database that holds runs already."""

from __future__ import annotations

from datetime import timedelta

import pytest
import sqlalchemy as sa

from agentsnap import RunStatus
from agentsnap.ledger import owner_id
from agentsnap.records import utcnow
from agentsnap.store import migrate
from agentsnap.store.sql import SqlStore

from .test_contract_ownership import replay_segment

RUN = "7" * 32
NEW_TABLES = {"agentsnap_run_leases", "agentsnap_replay"}


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


def insert_run(url: str) -> None:
    engine = sa.create_engine(migrate.sync_url(url))
    try:
        with engine.begin() as conn:
            conn.execute(
                sa.text(
                    "INSERT INTO agentsnap_runs (id, created_at, metadata, status) "
                    "VALUES (:id, :at, '{}', 'running')"
                ),
                {"id": RUN, "at": utcnow().replace(tzinfo=None)},
            )
    finally:
        engine.dispose()


async def test_runs_stored_before_0007_gain_leases_and_a_replay_log(url: str) -> None:
    migrate.upgrade(url, "0006")
    insert_run(url)
    assert not tables(url) & NEW_TABLES

    migrate.upgrade(url, "0007")
    assert tables(url) >= NEW_TABLES
    migrate.upgrade(url)  # the store needs the newest schema
    store = SqlStore(url)
    try:
        # A run left running by an older version has no owner: it is interrupted.
        assert (await store.get_run(RUN)).status is RunStatus.INTERRUPTED
        lease = await store.take_lease(
            RUN, owner_id(), utcnow() + timedelta(hours=1), replacing=None
        )
        assert lease is not None
        assert lease.token == 1
        await store.append_replay(RUN, replay_segment(0, ("a", "$env", 1)))
        assert await store.load_replay(RUN) == [replay_segment(0, ("a", "$env", 1))]
        assert (await store.get_run(RUN)).status is RunStatus.RUNNING
    finally:
        await store.close()

    migrate.downgrade(url, "0006")
    assert not tables(url) & NEW_TABLES
    engine = sa.create_engine(migrate.sync_url(url))
    try:
        with engine.connect() as conn:
            found = conn.execute(sa.text("SELECT id, status FROM agentsnap_runs")).all()
    finally:
        engine.dispose()
    assert [tuple(row) for row in found] == [(RUN, "running")]
