"""PostgreSQL's one-statement writes (a model call, journal segments, a replay segment, a
snapshot) are whole or absent: a fault part-way through one leaves nothing, and the retry
writes it once.

The fault is real and inside the database: a trigger on the table the statement writes last
raises ``serialization_failure`` (SQLSTATE 40001, which the store retries) for its first
rows, after the statement's earlier rows are in.
"""

from __future__ import annotations

import uuid

import pytest
import sqlalchemy
from postgres_db import postgres_url_or_skip

from agentsnap import JournalSegment, ReplaySegment, RunInfo
from agentsnap.store.migrate import sync_url
from agentsnap.store.sql import SqlStore
from agentsnap.store.sql_ledger import SqlLedger

from .test_contract import make_snapshot
from .test_contract_model_calls import call_of, conversation
from .test_faults import FAST

pytestmark = pytest.mark.postgres

FAILURES = 2


@pytest.fixture
def url() -> str:
    return postgres_url_or_skip()


def conflict_on(url: str, table: str) -> sqlalchemy.Engine:
    """Make the first ``FAILURES`` rows inserted into ``table`` fail as a conflict would.

    A sequence counts the rows tried, since a rolled-back statement does not undo it.
    """
    engine = sqlalchemy.create_engine(sync_url(url))
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE SEQUENCE fault_rows")
        conn.exec_driver_sql(
            "CREATE FUNCTION conflict() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            f"IF nextval('fault_rows') <= {FAILURES} THEN "
            "RAISE EXCEPTION 'injected conflict' USING ERRCODE = '40001'; END IF; "
            "RETURN NEW; END $$"
        )
        conn.exec_driver_sql(
            f"CREATE TRIGGER conflict BEFORE INSERT ON {table} "
            "FOR EACH ROW EXECUTE FUNCTION conflict()"
        )
    return engine


def rows_tried(engine: sqlalchemy.Engine) -> int:
    with engine.connect() as conn:
        tried = conn.scalar(sqlalchemy.text("SELECT last_value FROM fault_rows"))
    assert isinstance(tried, int)
    return tried


def count(engine: sqlalchemy.Engine, table: str, run_id: str) -> int:
    with engine.connect() as conn:
        found = conn.scalar(
            sqlalchemy.text(f"SELECT count(*) FROM {table} WHERE run_id = :r"),
            {"r": run_id},
        )
    assert isinstance(found, int)
    return found


async def new_run(store: SqlStore) -> str:
    run = RunInfo(id=uuid.uuid4().hex)
    await store.create_run(run)
    return run.id


async def test_a_model_call_refused_at_its_bodies_is_recorded_once_by_the_retry(url: str) -> None:
    store = SqlStore(url, retry=FAST)
    ledger = SqlLedger(url, retry=FAST)
    try:
        run_id = await new_run(store)
        await ledger.list_model_calls(run_id)  # the schema, before the trigger goes in
        engine = conflict_on(url, "agentsnap_model_bodies")
        record = call_of(conversation(3)[-1], run_id=run_id)

        assert await ledger.record_model_call(record)

        assert rows_tried(engine) > FAILURES  # refused twice, then written
        assert await ledger.list_model_calls(run_id) == [record]
        assert count(engine, "agentsnap_model_calls", run_id) == 1
        assert not await ledger.record_model_call(record)  # the identity is taken
        engine.dispose()
    finally:
        await ledger.close()
        await store.close()


async def test_journal_segments_refused_part_way_are_appended_once_in_order(url: str) -> None:
    store = SqlStore(url, retry=FAST)
    try:
        run_id = await new_run(store)
        engine = conflict_on(url, "agentsnap_journal")
        segments = [
            JournalSegment("$env", "a", "send", i, i, f'["n{i}"]')
            for i in range(1, 2 * FAILURES + 2)
        ]

        await store.append_journal(run_id, segments)

        assert rows_tried(engine) > FAILURES
        assert await store.load_journal(run_id) == segments
        engine.dispose()
    finally:
        await store.close()


async def test_a_replay_segment_refused_is_appended_once(url: str) -> None:
    store = SqlStore(url, retry=FAST)
    try:
        run_id = await new_run(store)
        engine = conflict_on(url, "agentsnap_replay")
        segment = ReplaySegment(0, '{"deliveries":[],"inputs":[]}')

        await store.append_replay(run_id, segment)

        assert await store.load_replay(run_id) == [segment]
        engine.dispose()
    finally:
        await store.close()


async def test_a_snapshot_refused_at_its_messages_is_written_whole_once(url: str) -> None:
    store = SqlStore(url, retry=FAST)
    try:
        run_id = await new_run(store)
        snapshot = make_snapshot(run_id, 1)
        assert any(channel.messages for channel in snapshot.channels)
        engine = conflict_on(url, "agentsnap_snapshot_messages")

        await store.save_snapshot(snapshot)

        assert rows_tried(engine) > FAILURES
        assert await store.list_snapshots(run_id) == [snapshot]
        engine.dispose()
    finally:
        await store.close()
