"""Migration 0008 gives runs a name, tags and a status reason, keeping the runs stored before."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from agentsnap import RunInfo, RunStatus
from agentsnap.records import utcnow
from agentsnap.store import migrate
from agentsnap.store.sql import SqlStore

from .test_migration_0007 import RUN, insert_run, tables


@pytest.fixture
def url(empty_db: str) -> str:
    """An empty SQLite or PostgreSQL database."""
    return empty_db


def columns(url: str, table: str) -> set[str]:
    engine = sa.create_engine(migrate.sync_url(url))
    try:
        with engine.connect() as conn:
            return {c["name"] for c in sa.inspect(conn).get_columns(table)}
    finally:
        engine.dispose()


async def test_runs_stored_before_0008_gain_a_name_tags_and_a_reason(url: str) -> None:
    migrate.upgrade(url, "0007")
    insert_run(url)
    assert "agentsnap_run_tags" not in tables(url)

    migrate.upgrade(url, "0008")
    assert {"name", "status_reason"} <= columns(url, "agentsnap_runs")
    migrate.upgrade(url)  # the store needs the newest schema
    store = SqlStore(url)
    try:
        old = await store.get_run(RUN)
        assert (old.name, old.tags) == (None, {})
        assert old.status is RunStatus.INTERRUPTED  # an old run left running has no owner
        assert old.status_reason == "no runtime ever owned it"
        await store.create_run(RunInfo(id="new", name="nightly", tags={"team": "billing"}))
        await store.finish_run("new", RunStatus.FAILED, utcnow(), "ValueError: bad input")
        new = await store.get_run("new")
        assert (new.name, new.tags, new.status, new.status_reason) == (
            "nightly",
            {"team": "billing"},
            RunStatus.FAILED,
            "ValueError: bad input",
        )
        assert [r.tags for r in await store.list_runs()] == [{}, {"team": "billing"}]
    finally:
        await store.close()

    migrate.downgrade(url, "0007")
    assert "agentsnap_run_tags" not in tables(url)
    assert not {"name", "status_reason"} & columns(url, "agentsnap_runs")
    engine = sa.create_engine(migrate.sync_url(url))
    try:
        with engine.connect() as conn:
            found = conn.execute(sa.text("SELECT id FROM agentsnap_runs ORDER BY id")).all()
    finally:
        engine.dispose()
    assert [row[0] for row in found] == [RUN, "new"]
