"""A snapshot write that fails: earlier snapshots stay whole, the failure is reported and
recorded, and the run goes on.

The failure is injected inside the database: a trigger rejects the rows of the snapshot's
agents while a ``fault`` table holds a row, so the write fails half-way through its
transaction, after the snapshot's own row was inserted.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import sqlalchemy

from agentsnap import (
    Agent,
    AgentState,
    Context,
    MemoryStore,
    Message,
    Runtime,
    Snapshot,
    SnapshotFailed,
    SnapshotStatus,
    StoreError,
)
from agentsnap.store import migrate
from agentsnap.store.sql import SqlStore
from agentsnap.testing import assert_consistent

SQLITE_FAULT = [
    "CREATE TABLE fault (reason TEXT)",
    """
    CREATE TRIGGER reject_agents BEFORE INSERT ON agentsnap_snapshot_agents
    WHEN EXISTS (SELECT 1 FROM fault)
    BEGIN SELECT RAISE(ABORT, 'disk full (injected)'); END
    """,
]

POSTGRES_FAULT = [
    "CREATE TABLE fault (reason TEXT)",
    """
    CREATE FUNCTION reject_agents() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF EXISTS (SELECT 1 FROM fault) THEN RAISE EXCEPTION 'disk full (injected)'; END IF;
        RETURN NEW;
    END $$
    """,
    """
    CREATE TRIGGER reject_agents BEFORE INSERT ON agentsnap_snapshot_agents
    FOR EACH ROW EXECUTE FUNCTION reject_agents()
    """,
]


class CountState(AgentState):
    count: int = 0


class Counter(Agent[CountState]):
    async def handle(self, message: Message, ctx: Context[CountState]) -> None:
        self.state.count += 1
        left = message.payload_as(int)
        if left:
            ctx.send("other" if self.name == "one" else "one", left - 1)


class Faults:
    """Switches the injected failure on and off in the database at ``url``."""

    def __init__(self, url: str, statements: list[str]) -> None:
        migrate.upgrade(url)
        self.engine = sqlalchemy.create_engine(migrate.sync_url(url))
        with self.engine.begin() as connection:
            for statement in statements:
                connection.execute(sqlalchemy.text(statement))

    def set(self, on: bool) -> None:
        with self.engine.begin() as connection:
            connection.execute(sqlalchemy.text("DELETE FROM fault"))
            if on:
                connection.execute(sqlalchemy.text("INSERT INTO fault VALUES ('on')"))

    def rows(self, table: str, snapshot_id: str) -> int:
        with self.engine.connect() as connection:
            count = connection.scalar(
                sqlalchemy.text(f"SELECT count(*) FROM {table} WHERE snapshot_id = :id"),
                {"id": snapshot_id},
            )
        assert isinstance(count, int)
        return count


def sqlite_faults(tmp_path: Path) -> tuple[str, Faults]:
    url = f"sqlite:///{tmp_path / 'faults.db'}"
    return url, Faults(url, SQLITE_FAULT)


def postgres_faults(postgres_url: str) -> tuple[str, Faults]:
    return postgres_url, Faults(postgres_url, POSTGRES_FAULT)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def faulty(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[tuple[SqlStore, Faults]]:
    if request.param == "sqlite":
        url, faults = sqlite_faults(tmp_path)
    else:
        url, faults = postgres_faults(request.getfixturevalue("postgres_url"))
    store = SqlStore(url)
    try:
        yield store, faults
    finally:
        await store.close()
        faults.engine.dispose()


async def bounce(runtime: Runtime, times: int) -> None:
    runtime.send("one", times)
    await runtime.run_until_idle()


async def test_a_failed_write_is_recorded_and_the_run_goes_on(
    faulty: tuple[SqlStore, Faults],
) -> None:
    store, faults = faulty
    async with Runtime(store=store) as runtime:
        runtime.add(Counter("one", CountState()))
        runtime.add(Counter("other", CountState()))
        await bounce(runtime, 5)
        first = await runtime.snapshot()

        faults.set(on=True)
        await bounce(runtime, 3)
        handle = runtime.snapshot()
        with pytest.raises(SnapshotFailed) as failure:
            await handle
        assert "disk full (injected)" in str(failure.value)
        assert handle.id in str(failure.value)

        faults.set(on=False)
        await bounce(runtime, 4)
        third = await runtime.snapshot()
        await runtime.run_until_idle()
        run_id = runtime.run_id

    listed = await store.list_snapshots(run_id)
    assert [(s.seq, s.initiator, s.status) for s in listed] == [
        (1, "$env", SnapshotStatus.COMPLETE),  # the start snapshot, taken at the first input
        (2, "$env", SnapshotStatus.COMPLETE),  # each bounce ends in a snapshot as it goes idle
        (3, "$env", SnapshotStatus.COMPLETE),
        (4, "$env", SnapshotStatus.FAILED),  # the end of the bounce while the disk was full
        (5, "$env", SnapshotStatus.FAILED),
        (6, "$env", SnapshotStatus.COMPLETE),
        (7, "$env", SnapshotStatus.COMPLETE),
    ]
    start, idle, earlier, failed_at_idle, failed, idle_again, later = listed
    assert start.agents["one"].state["count"] == start.agents["other"].state["count"] == 0
    assert (idle.agents["one"].state["count"], idle.agents["other"].state["count"]) == (3, 3)
    assert earlier == first
    assert later == third
    assert failed.id == handle.id
    for refused in (failed_at_idle, failed):
        assert refused.error is not None
        assert "disk full (injected)" in refused.error
        assert refused.agents == {}
        # Nothing of the half-written snapshot was left behind.
        assert faults.rows("agentsnap_snapshot_agents", refused.id) == 0
        assert faults.rows("agentsnap_snapshot_messages", refused.id) == 0
    for snapshot in (start, idle, earlier, idle_again, later):
        assert_consistent(snapshot)
    # ``third`` was taken where the bounce left the run, so the last ``run_until_idle``,
    # with nothing sent or delivered since, took no further snapshot.
    assert idle_again.agents == later.agents
    assert third.agents["one"].state["count"] == 3 + 2 + 3
    assert third.agents["other"].state["count"] == 3 + 2 + 2


class UnreachableStore(MemoryStore):
    """A memory store that refuses every snapshot write while ``down`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False
        self.refused: list[str] = []

    async def save_snapshot(self, snapshot: Snapshot) -> None:
        if self.down:
            self.refused.append(snapshot.status.value)
            raise StoreError("cannot reach the database: connection refused")
        await super().save_snapshot(snapshot)


async def test_a_store_that_is_down_fails_the_snapshot_and_not_the_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = UnreachableStore()
    async with Runtime(store=store) as runtime:
        runtime.add(Counter("one", CountState()))
        runtime.add(Counter("other", CountState()))
        first = await runtime.snapshot()
        store.down = True
        with pytest.raises(SnapshotFailed, match="connection refused"):
            await runtime.snapshot()
        store.down = False
        await bounce(runtime, 2)
        last = await runtime.snapshot()
        run_id = runtime.run_id

    # The write was tried, then the failed record; both refused, both logged.
    assert store.refused == ["complete", "failed"]
    assert "could not be marked failed either" in caplog.text
    # The run's first input, once the store was back, took the start snapshot.
    # Going idle took the end snapshot, where ``last`` was then taken again.
    stored_first, start, idle, stored_last = await store.list_snapshots(run_id)
    assert (stored_first.id, stored_last.id) == (first.id, last.id)
    assert (start.seq, start.initiator, start.status) == (3, "$env", SnapshotStatus.COMPLETE)
    assert start.agents["one"].state["count"] == start.agents["other"].state["count"] == 0
    assert_consistent(start)
    assert (idle.seq, idle.initiator, idle.status) == (4, "$env", SnapshotStatus.COMPLETE)
    assert idle.agents == last.agents
    assert last.agents["one"].state["count"] == 2
