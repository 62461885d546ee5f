"""Migration 0015 adds the model calls and the timeline of tool calls, keeping the calls made.

Tool calls claimed before it keep every value and have no timeline; its downgrade drops the
model calls' tables and the column, and keeps the tool calls again.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import pytest
import sqlalchemy as sa
from ledger_entries import claim_of

from agentsnap.ledger import LedgerEntry
from agentsnap.model_calls import ModelCallRecord
from agentsnap.store import migrate
from agentsnap.store.sql_ledger import SqlLedger
from agentsnap.store.tables import ToolCallRow

RUN = "d" * 32
AT = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)
NEW_TABLES = {"agentsnap_model_calls", "agentsnap_model_bodies"}


@pytest.fixture
def url(empty_db: str) -> str:
    """An empty SQLite or PostgreSQL database."""
    return empty_db


def schema(url: str) -> tuple[set[str], set[str]]:
    """The database's tables, and the columns of its tool calls."""
    engine = sa.create_engine(migrate.sync_url(url))
    try:
        with engine.connect() as conn:
            inspector = sa.inspect(conn)
            tables = set(inspector.get_table_names())
            columns = {c["name"] for c in inspector.get_columns("agentsnap_tool_calls")}
    finally:
        engine.dispose()
    return tables, columns


def insert_before_0015(url: str, entries: list[LedgerEntry]) -> None:
    """Write tool calls as a ledger of revision 0014 did: every column but ``timeline`` (and
    ``note``, added by 0018)."""
    table: sa.Table = ToolCallRow.__table__  # type: ignore[assignment]
    engine = sa.create_engine(migrate.sync_url(url))
    try:
        with engine.begin() as conn:
            for entry in entries:
                values = {
                    field.name: getattr(entry, field.name)
                    for field in dataclasses.fields(entry)
                    if field.name not in {"timeline", "note"}
                }
                conn.execute(sa.insert(table).values(values))
    finally:
        engine.dispose()


def model_call(position: int) -> ModelCallRecord:
    return ModelCallRecord(
        run_id=RUN,
        agent="writer",
        message_id="$env>writer#1",
        position=position,
        timeline=0,
        request={"messages": [{"role": "user", "content": f"question {position}"}]},
        response={"text": f"answer {position}"},
        model=None,
        input_tokens=3,
        output_tokens=2,
        started_at=AT,
        latency_ms=4.5,
    )


async def test_tool_calls_are_kept_across_0015_both_ways(url: str) -> None:
    migrate.upgrade(url, "0014")
    before = [claim_of("charge-1", RUN, at=AT), claim_of("charge-2", RUN, at=AT, agent="critic")]
    insert_before_0015(url, before)

    migrate.upgrade(url)
    tables, columns = schema(url)
    assert tables >= NEW_TABLES
    assert "timeline" in columns
    ledger = SqlLedger(url)
    try:
        # Every value kept; no timeline, since none was recorded.
        assert await ledger.list_calls(RUN) == before
        assert all(entry.timeline is None for entry in await ledger.list_calls(RUN))
        later = dataclasses.replace(claim_of("charge-3", RUN, at=AT), timeline=2)
        assert await ledger.claim(later) is None
        assert await ledger.record_model_call(model_call(0))
        assert [c.position for c in await ledger.list_model_calls(RUN)] == [0]
    finally:
        await ledger.close()

    migrate.downgrade(url, "0014")
    tables, columns = schema(url)
    assert not tables & NEW_TABLES
    assert "timeline" not in columns
    engine = sa.create_engine(migrate.sync_url(url))
    try:
        with engine.connect() as conn:
            keys = conn.execute(sa.text("SELECT key FROM agentsnap_tool_calls ORDER BY key"))
            assert [row.key for row in keys] == ["charge-1", "charge-2", "charge-3"]
    finally:
        engine.dispose()

    migrate.upgrade(url)  # and up again: the downgrade left nothing in the way
    ledger = SqlLedger(url)
    try:
        assert [entry.timeline for entry in await ledger.list_calls(RUN)] == [None] * 3
        assert await ledger.list_model_calls(RUN) == []
        assert await ledger.record_model_call(model_call(0))
    finally:
        await ledger.close()
