"""Snapshots that change little read back exactly as written, on every backend.

An SQL store keeps such a snapshot as the agent rows that changed since its run's last full
snapshot (its base); what a reader gets must not show it: every snapshot reads back equal to
the one written, whatever changed (a state, counters only, an agent added or gone), and
whoever wrote it (a store opened again starts a new base).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import sqlalchemy as sa

from agentsnap import (
    AgentCut,
    ChannelRecord,
    RecordedMessage,
    Snapshot,
    SnapshotStatus,
    Store,
)
from agentsnap.messages import JsonValue
from agentsnap.store import migrate
from agentsnap.store.sql import SqlStore

from .test_contract import assert_same_snapshot, make_cut, make_snapshot, stored_run


@dataclass
class Team:
    """Workers that the environment sends to: a consistent cut of them, changed step by step."""

    states: dict[str, dict[str, JsonValue]] = field(default_factory=dict)
    sent: dict[str, int] = field(default_factory=dict)
    received: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, size: int) -> Team:
        team = cls()
        for i in range(size):
            team.add(f"w{i:02d}")
        return team

    def add(self, name: str) -> None:
        self.states[name] = {"worker": name, "handled": 0, "notes": ["naïve café ✓"]}
        self.sent[name] = self.received[name] = 1

    def handle(self, name: str) -> None:
        """``name`` takes one more message and notes it: its state and counters change."""
        self.sent[name] += 1
        self.received[name] += 1
        state = self.states[name]
        state["handled"] = int(str(state["handled"])) + 1

    def nudge(self, name: str) -> None:
        """``name`` takes a message that leaves its state as it was: counters only change."""
        self.sent[name] += 1
        self.received[name] += 1

    def remove(self, name: str) -> None:
        for held in (self.states, self.sent, self.received):
            del held[name]

    def agents(self, in_flight: str | None = None) -> dict[str, AgentCut]:
        """The cut; with ``in_flight``, the last message to that worker not yet taken."""
        agents = {"$env": make_cut({}, sent=dict(self.sent))}
        for name, state in self.states.items():
            received = self.received[name] - (name == in_flight)
            agents[name] = make_cut(state, received={"$env": received})
        return agents

    def snapshot(self, run_id: str, seq: int, in_flight: str | None = None) -> Snapshot:
        channels = []
        if in_flight is not None:
            last = self.sent[in_flight]
            channels = [
                ChannelRecord(
                    src="$env",
                    dst=in_flight,
                    messages=[
                        RecordedMessage(
                            id=f"$env>{in_flight}#{last}", seq=last, kind="go", payload={"x": 1.5}
                        )
                    ],
                )
            ]
        return make_snapshot(
            run_id, seq, agents=self.agents(in_flight), channels=channels, initiator="$env"
        )


async def layout(store: Store, run_id: str) -> list[tuple[int, int | None, int]]:
    """Per snapshot of the run: its seq, its base's seq, and the agent rows it holds itself.

    Empty for the memory store, which keeps snapshots as they are.
    """
    if not isinstance(store, SqlStore):
        return []
    engine = sa.create_engine(migrate.sync_url(store.url))
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                sa.text(
                    "SELECT s.seq, b.seq AS base, s.agent_rows, "
                    "(SELECT count(*) FROM agentsnap_snapshot_agents a "
                    " WHERE a.snapshot_id = s.id) AS own "
                    "FROM agentsnap_snapshots s "
                    "LEFT JOIN agentsnap_snapshots b ON b.id = s.base_id "
                    "WHERE s.run_id = :run ORDER BY s.seq"
                ),
                {"run": run_id},
            ).all()
    finally:
        engine.dispose()
    for row in rows:
        assert row.agent_rows is None if row.base is None else row.agent_rows == row.own
    return [(row.seq, row.base, row.own) for row in rows]


async def assert_reads_back(store: Store, written: list[Snapshot]) -> None:
    run_id = written[0].run_id
    listed = await store.list_snapshots(run_id)
    assert [s.seq for s in listed] == [s.seq for s in written]
    for loaded, saved in zip(listed, written, strict=True):
        assert_same_snapshot(loaded, saved)
        assert list(loaded.agents) == list(saved.agents)  # in the same order
        assert_same_snapshot(await store.load_snapshot(saved.id), saved)
    paged = await store.list_snapshots_page(run_id, after_seq=1, limit=3)
    assert paged == written[1:4]
    summaries = await store.list_snapshot_summaries(run_id)
    assert [(s.id, s.status, s.error) for s in summaries] == [
        (s.id, s.status, s.error) for s in written
    ]
    history = await store.agent_history(run_id, "w01")
    complete = [s for s in written if s.status is SnapshotStatus.COMPLETE]
    assert [v.cut for v in history] == [s.agents["w01"] for s in complete]


async def test_snapshots_that_change_little_read_back_as_written(store: Store) -> None:
    run = await stored_run(store)
    team = Team.of(12)
    written = [team.snapshot(run.id, 1)]
    team.handle("w01")  # a state and its counters
    written.append(team.snapshot(run.id, 2))
    team.nudge("w02")  # counters only
    written.append(team.snapshot(run.id, 3))
    team.add("w12")  # an agent the base does not have
    written.append(team.snapshot(run.id, 4, in_flight="w03"))
    written.append(team.snapshot(run.id, 5))  # nothing changed since the one before
    written.append(
        make_snapshot(run.id, 6, status=SnapshotStatus.FAILED, error="a marker was lost")
    )
    team.remove("w05")  # an agent of the base gone: a full snapshot, the new base
    written.append(team.snapshot(run.id, 7))
    for name in list(team.states)[:8]:  # most changed: full again
        team.handle(name)
    written.append(team.snapshot(run.id, 8))
    team.handle("w00")
    written.append(team.snapshot(run.id, 9))
    for snapshot in written:
        await store.save_snapshot(snapshot)

    await assert_reads_back(store, written)
    assert await layout(store, run.id) in (
        [],
        [
            (1, None, 13),
            (2, 1, 2),  # $env, w01
            (3, 1, 3),  # $env, w01, w02
            (4, 1, 5),  # and w03 (a message in flight to it), w12
            (5, 1, 4),  # w03 as in the base again
            (6, None, 0),
            (7, None, 13),
            (8, None, 13),
            (9, 8, 2),
        ],
    )


async def test_snapshots_of_several_runs_written_at_once_read_back_as_written(
    store: Store,
) -> None:
    runs = [await stored_run(store) for _ in range(3)]
    teams = [Team.of(10) for _ in runs]
    written: dict[str, list[Snapshot]] = {run.id: [] for run in runs}
    for seq in range(1, 8):
        for run, team in zip(runs, teams, strict=True):
            team.handle(f"w{seq:02d}")
            written[run.id].append(team.snapshot(run.id, seq))
    await asyncio.gather(*(store.save_snapshot(s) for held in written.values() for s in held))
    for run in runs:
        await assert_reads_back(store, written[run.id])
        found = await layout(store, run.id)
        # Written at once, each snapshot is full or extends a full one of its run: never more.
        bases = {seq for seq, base, _ in found if base is None}
        assert all(base is None or base in bases for _, base, _ in found)


async def test_a_store_opened_again_starts_a_new_base(sql_store: SqlStore) -> None:
    run = await stored_run(sql_store)
    team = Team.of(12)
    written = [team.snapshot(run.id, 1)]
    team.handle("w01")
    written.append(team.snapshot(run.id, 2))
    for snapshot in written:
        await sql_store.save_snapshot(snapshot)

    again = SqlStore(sql_store.url)
    try:
        team.handle("w02")
        written.append(team.snapshot(run.id, 3))
        team.handle("w03")
        written.append(team.snapshot(run.id, 4))
        for snapshot in written[2:]:
            await again.save_snapshot(snapshot)
        await assert_reads_back(again, written)
        # The first store's base is not the second's: each extends a snapshot it wrote.
        team.handle("w04")
        written.append(team.snapshot(run.id, 5))
        await sql_store.save_snapshot(written[-1])
    finally:
        await again.close()
    await assert_reads_back(sql_store, written)
    assert await layout(sql_store, run.id) == [
        (1, None, 13),
        (2, 1, 2),
        (3, None, 13),
        (4, 3, 2),
        (5, 1, 5),
    ]


async def test_a_lost_row_of_a_snapshot_over_a_base_makes_it_damaged(sql_store: SqlStore) -> None:
    run = await stored_run(sql_store)
    team = Team.of(6)
    first = team.snapshot(run.id, 1)
    team.handle("w01")
    second = team.snapshot(run.id, 2)
    for snapshot in (first, second):
        await sql_store.save_snapshot(snapshot)
    # w01's own row gone, the base's row would read as an older, consistent-looking part.
    engine = sa.create_engine(migrate.sync_url(sql_store.url))
    try:
        with engine.begin() as conn:
            conn.execute(
                sa.text(
                    "DELETE FROM agentsnap_snapshot_agents "
                    "WHERE snapshot_id = :id AND agent IN ('w01', '$env')"
                ),
                {"id": second.id},
            )
    finally:
        engine.dispose()
    intact, damaged = await sql_store.list_snapshots(run.id)
    assert_same_snapshot(intact, first)
    assert damaged.status is SnapshotStatus.DAMAGED
    assert damaged.error == (
        f"it holds 0 agent rows of its own where 2 were written (it is stored as the changes "
        f"to snapshot {first.id})"
    )


async def test_a_base_deleted_behind_the_stores_back_makes_the_next_snapshot_full(
    sql_store: SqlStore,
) -> None:
    run = await stored_run(sql_store)
    team = Team.of(6)
    first = team.snapshot(run.id, 1)
    await sql_store.save_snapshot(first)
    engine = sa.create_engine(migrate.sync_url(sql_store.url))
    try:
        with engine.begin() as conn:  # foreign keys not enforced (SQLite's default)
            if engine.dialect.name == "postgresql":
                conn.execute(sa.text("SET LOCAL session_replication_role = replica"))
            for table, column in (
                ("agentsnap_snapshot_agents", "snapshot_id"),
                ("agentsnap_snapshot_messages", "snapshot_id"),
                ("agentsnap_snapshots", "id"),
            ):
                conn.execute(sa.text(f"DELETE FROM {table} WHERE {column} = :id"), {"id": first.id})
    finally:
        engine.dispose()
    team.handle("w01")
    second = team.snapshot(run.id, 2)
    await sql_store.save_snapshot(second)  # refused over the lost base, then written full
    assert_same_snapshot(await sql_store.load_snapshot(second.id), second)
    assert await layout(sql_store, run.id) == [(2, None, 7)]
