"""A run whose snapshots hold only what changed since a base: restored, forked and deleted
as any other, on SQLite and PostgreSQL."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from agentsnap import Agent, AgentState, Context, Message, Runtime, Snapshot, SnapshotStatus
from agentsnap.inspect import fork_run
from agentsnap.store import migrate
from agentsnap.store.retention import delete_runs
from agentsnap.store.sql import SqlStore

WORKERS = [f"w{i}" for i in range(8)]


class Tally(AgentState):
    n: int = 0


class Counter(Agent[Tally]):
    async def handle(self, message: Message, ctx: Context[Tally]) -> None:
        self.state.n += 1


def add_team(runtime: Runtime) -> dict[str, Counter]:
    return {name: runtime.add(Counter(name)) for name in WORKERS}


def bases(url: str, run_id: str) -> dict[str, str | None]:
    """Each snapshot of the run (by id) and the base it extends."""
    engine = sa.create_engine(migrate.sync_url(url))
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                sa.text("SELECT id, base_id FROM agentsnap_snapshots WHERE run_id = :run"),
                {"run": run_id},
            ).all()
    finally:
        engine.dispose()
    return {row.id: row.base_id for row in rows}


def shape(snapshot: Snapshot) -> dict[str, Any]:
    return snapshot.model_dump(
        mode="json", exclude={"id", "run_id", "seq", "started_at", "completed_at"}
    )


async def run_with_a_delta(store: SqlStore) -> tuple[str, Snapshot]:
    """A finished run whose second snapshot extends its first: w0 took one message more."""
    async with Runtime(store=store) as runtime:
        add_team(runtime)
        for name in WORKERS:
            runtime.send(name, "go")
        await runtime.run_until_idle()
        await runtime.snapshot()
        runtime.send("w0", "again")
        await runtime.run_until_idle()
        delta = await runtime.snapshot()
        runtime.send("w1", "later")
        await runtime.run_until_idle()
    assert bases(store.url, runtime.run_id)[delta.id] is not None
    return runtime.run_id, delta


async def test_a_run_rolls_back_to_a_snapshot_that_extends_a_base(sql_store: SqlStore) -> None:
    async with Runtime(store=sql_store) as runtime:
        team = add_team(runtime)
        for name in WORKERS:
            runtime.send(name, "go")
        await runtime.run_until_idle()
        await runtime.snapshot()
        runtime.send("w3", "again")
        await runtime.run_until_idle()
        delta = await runtime.snapshot()
        for name in WORKERS:
            runtime.send(name, "more")
        await runtime.run_until_idle()
        assert bases(sql_store.url, runtime.run_id)[delta.id] is not None
        # Read back from the store, not from the runtime's memory of its newest cut.
        runtime._snapshots.latest = None
        info = await runtime.rollback(delta.id, reason="go back")
        assert info.snapshot_id == delta.id
        assert {name: agent.state.n for name, agent in team.items()} == {
            name: 2 if name == "w3" else 1 for name in WORKERS
        }


async def test_a_run_forks_from_a_snapshot_that_extends_a_base(sql_store: SqlStore) -> None:
    run_id, delta = await run_with_a_delta(sql_store)
    forked = await fork_run(sql_store, delta.id)
    (first,) = await sql_store.list_snapshots(forked.id)
    assert shape(first) == shape(await sql_store.load_snapshot(delta.id))
    assert bases(sql_store.url, forked.id) == {first.id: None}  # a new run starts full
    async with Runtime(store=sql_store, run_id=forked.id) as resumed:
        team = add_team(resumed)
        assert (await resumed.resume()).id == first.id
        assert {name: agent.state.n for name, agent in team.items()} == {
            name: 2 if name == "w0" else 1 for name in WORKERS
        }
        resumed.send("w0", "on")
        await resumed.run_until_idle()
    assert run_id != forked.id


async def test_deleting_runs_keeps_every_kept_snapshot_readable(sql_store: SqlStore) -> None:
    parent_id, delta = await run_with_a_delta(sql_store)
    kept_id, _ = await run_with_a_delta(sql_store)
    forked = await fork_run(sql_store, delta.id)
    kept_before = await sql_store.list_snapshots(kept_id)
    assert any(base is not None for base in bases(sql_store.url, kept_id).values())

    dry = await delete_runs(sql_store, [parent_id], dry_run=True)
    report = await delete_runs(sql_store, [parent_id])
    assert report.rows == dry.rows
    parent_rows = len(bases(sql_store.url, parent_id))
    assert (parent_rows, report.rows["agentsnap_snapshots"]) == (0, len(kept_before))
    # Its snapshots hold a row per agent in the first, fewer in those that extend it.
    assert 0 < report.rows["agentsnap_snapshot_agents"] < len(kept_before) * (len(WORKERS) + 1)

    assert await sql_store.list_snapshots(kept_id) == kept_before
    for snapshot in [*kept_before, *await sql_store.list_snapshots(forked.id)]:
        assert snapshot.status is SnapshotStatus.COMPLETE, snapshot.error
    await delete_runs(sql_store, [kept_id, forked.id])
    assert await sql_store.list_runs() == []
