"""Migration 0018 adds the progress note of tool calls, keeping the calls made.

Tool calls claimed before it keep every value and read no note; a note kept after it is read
back; its downgrade drops the column and keeps the calls.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import pytest
import sqlalchemy as sa
from ledger_entries import claim_of

from agentsnap.ledger import LedgerEntry, ToolCallStatus
from agentsnap.store import migrate
from agentsnap.store.sql_ledger import SqlLedger
from agentsnap.store.tables import ToolCallRow

RUN = "e" * 32
AT = datetime(2026, 12, 2, 9, 0, tzinfo=UTC)


@pytest.fixture
def url(empty_db: str) -> str:
    """An empty SQLite or PostgreSQL database."""
    return empty_db


def columns(url: str) -> set[str]:
    engine = sa.create_engine(migrate.sync_url(url))
    try:
        with engine.connect() as conn:
            return {c["name"] for c in sa.inspect(conn).get_columns("agentsnap_tool_calls")}
    finally:
        engine.dispose()


def insert_before_0018(url: str, entries: list[LedgerEntry]) -> None:
    """Write tool calls as a ledger of revision 0017 did: every column but ``note``."""
    table: sa.Table = ToolCallRow.__table__  # type: ignore[assignment]
    engine = sa.create_engine(migrate.sync_url(url))
    try:
        with engine.begin() as conn:
            for entry in entries:
                values = {
                    field.name: getattr(entry, field.name)
                    for field in dataclasses.fields(entry)
                    if field.name != "note"
                }
                conn.execute(sa.insert(table).values(values))
    finally:
        engine.dispose()


async def test_tool_calls_are_kept_across_0018_both_ways(url: str) -> None:
    migrate.upgrade(url, "0017")
    before = [dataclasses.replace(claim_of("pay-1", RUN, at=AT), timeline=0)]
    insert_before_0018(url, before)

    migrate.upgrade(url)
    assert "note" in columns(url)
    ledger = SqlLedger(url)
    try:
        assert await ledger.list_calls(RUN) == before  # every value kept, no note
        changed = await ledger.update(
            "pay-1", {"note": {"job": "j-1"}}, statuses=(ToolCallStatus.IN_PROGRESS,)
        )
        assert changed
        entry = await ledger.get("pay-1")
        assert entry is not None
        assert entry.note == {"job": "j-1"}
    finally:
        await ledger.close()

    migrate.downgrade(url, "0017")
    assert "note" not in columns(url)
    engine = sa.create_engine(migrate.sync_url(url))
    try:
        with engine.connect() as conn:
            keys = conn.execute(sa.text("SELECT key FROM agentsnap_tool_calls"))
            assert [row.key for row in keys] == ["pay-1"]
    finally:
        engine.dispose()
