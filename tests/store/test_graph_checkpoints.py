"""``Store.list_graph_checkpoints``: a graph agent's LangGraph checkpoints beside the snapshots.

The runs here have a graph agent whose ``AgentsnapSaver`` shares the store's database; a
rollback makes its thread branch, and a rollback to before its first message starts a second
thread. ``graph_checkpoints_table`` then says which snapshots hold which checkpoint.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest
import sqlalchemy
from langgraph_graphs import RoutingInbox, notes_graph

from agentsnap import (
    GraphCheckpoint,
    MemoryStore,
    NotFoundError,
    RunInfo,
    Runtime,
    Store,
)
from agentsnap.inspect import graph_checkpoints_table
from agentsnap.integrations.langgraph import AgentsnapSaver, GraphAgent
from agentsnap.store.graph import GraphCheckpointIndex
from agentsnap.store.migrate import sync_url
from agentsnap.store.sql import SqlStore
from agentsnap.store.tables import LangGraphCheckpointRow


async def feed(runtime: Runtime, agent: str, *notes: str) -> None:
    for note in notes:
        runtime.send("inbox", note, kind=agent)
        await runtime.run_until_idle()


@dataclass
class GraphRun:
    store: SqlStore
    run_id: str
    thread: str
    restored: str
    """The checkpoint the rollback went back to, which two branches follow."""
    cut_seq: int
    """The snapshot that holds ``restored``."""
    final_seq: int
    """The last snapshot, taken after the rollback."""
    final: str
    """The checkpoint the last snapshot holds."""


@pytest.fixture
async def graph_run(sql_store: SqlStore) -> AsyncIterator[GraphRun]:
    """A run whose graph agent "graph" branched (a rollback), then both graph agents restarted."""
    saver = AgentsnapSaver(sql_store.url)
    try:
        async with Runtime(store=sql_store) as runtime:
            runtime.add(RoutingInbox("inbox"))
            graph = runtime.add(GraphAgent("graph", notes_graph(), checkpointer=saver))
            other = runtime.add(GraphAgent("other", notes_graph(), checkpointer=saver))
            assert isinstance(graph, GraphAgent)
            assert isinstance(other, GraphAgent)
            first = await runtime.snapshot()  # before any graph ran
            await feed(runtime, "graph", "a")
            await feed(runtime, "other", "x")
            cut = await runtime.snapshot()
            restored = graph.state.checkpoint_id
            assert restored is not None
            await feed(runtime, "graph", "b")
            await runtime.rollback(cut.id)  # replays "b" from the restored checkpoint
            await feed(runtime, "graph", "c")
            last = await runtime.snapshot()
            assert graph.state.checkpoint_id is not None
            final = graph.state.checkpoint_id
            # Back to before any graph ran: the replayed input runs on second threads.
            await runtime.rollback(first.id)
            await runtime.run_until_idle()
            assert graph.state.thread_id == f"{runtime.run_id}:graph:2"
            assert other.state.thread_id == f"{runtime.run_id}:other:2"
        yield GraphRun(
            sql_store,
            runtime.run_id,
            f"{runtime.run_id}:graph",
            restored,
            cut.seq,
            last.seq,
            final,
        )
    finally:
        saver.close()


async def test_a_branched_thread_lists_every_checkpoint_oldest_first(graph_run: GraphRun) -> None:
    found = await graph_run.store.list_graph_checkpoints(graph_run.run_id, "graph")
    assert all(isinstance(c, GraphCheckpoint) for c in found)
    assert {(c.run_id, c.agent) for c in found} == {(graph_run.run_id, "graph")}
    assert {c.thread_id for c in found} == {graph_run.thread, f"{graph_run.thread}:2"}
    ids = [c.checkpoint_id for c in found]
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)
    for thread in (graph_run.thread, f"{graph_run.thread}:2"):
        on_thread = [c for c in found if c.thread_id == thread]
        # The thread's first checkpoint is the input; every other follows one before it.
        assert on_thread[0].parent_id is None
        assert (on_thread[0].source, on_thread[0].step) == ("input", -1)
        earlier = [c.checkpoint_id for c in on_thread]
        assert all(c.parent_id in earlier[:i] for i, c in enumerate(on_thread) if i)
    # The rollback made the first thread branch at the restored checkpoint ("b" twice).
    children = [c for c in found if c.parent_id == graph_run.restored]
    assert len(children) == 2
    assert {c.thread_id for c in children} == {graph_run.thread}
    assert graph_run.final in ids
    # The metadata is JSON: step and source are read from it.
    assert all(c.metadata is not None for c in found)
    assert {c.source for c in found} == {"input", "loop"}
    assert all(c.step == (c.metadata or {}).get("step") for c in found)
    # Times come from the ids: in order, and recent.
    times = [c.created_at for c in found]
    assert all(t is not None for t in times)
    assert times == sorted(times)  # type: ignore[type-var]
    now = datetime.now(UTC)
    assert all(now - timedelta(minutes=5) < t <= now for t in times)  # type: ignore[operator]


async def test_every_agent_and_thread_of_the_run_without_an_agent(graph_run: GraphRun) -> None:
    every = await graph_run.store.list_graph_checkpoints(graph_run.run_id)
    run = graph_run.run_id
    assert {(c.agent, c.thread_id) for c in every} == {
        ("graph", f"{run}:graph"),
        ("graph", f"{run}:graph:2"),
        ("other", f"{run}:other"),
        ("other", f"{run}:other:2"),
    }
    ids = [c.checkpoint_id for c in every]
    assert ids == sorted(ids)
    other = await graph_run.store.list_graph_checkpoints(run, "other")
    assert other == [c for c in every if c.agent == "other"]
    assert await graph_run.store.list_graph_checkpoints(run, "inbox") == []
    assert await graph_run.store.list_graph_checkpoints(run, "nobody") == []


async def test_the_table_says_which_snapshots_hold_each_checkpoint(graph_run: GraphRun) -> None:
    rows = await graph_checkpoints_table(graph_run.store, graph_run.run_id[:8], "graph")
    held = {row.checkpoint_id: row.snapshots for row in rows}
    assert graph_run.cut_seq in held[graph_run.restored]
    assert graph_run.final_seq in held[graph_run.final]
    # Each snapshot that recorded the graph's checkpoint is listed under exactly it.
    snapshots = await graph_run.store.list_snapshots(graph_run.run_id)
    expected: dict[str, list[int]] = {}
    for snapshot in snapshots:
        named = snapshot.agents["graph"].state.get("checkpoint_id")
        if isinstance(named, str):
            expected.setdefault(named, []).append(snapshot.seq)
    assert {k: v for k, v in held.items() if v} == expected
    assert set(rows[0].model_dump(mode="json")) == {
        "agent",
        "thread_id",
        "checkpoint_id",
        "parent_id",
        "step",
        "source",
        "created_at",
        "snapshots",
        "metadata",
    }
    assert rows[0].created_at is not None
    every = await graph_checkpoints_table(graph_run.store, graph_run.run_id)
    assert {row.agent for row in every} == {"graph", "other"}


async def test_an_unknown_run_is_not_found(store: Store) -> None:
    assert isinstance(store, GraphCheckpointIndex)
    with pytest.raises(NotFoundError):
        await store.list_graph_checkpoints(uuid.uuid4().hex)
    with pytest.raises(NotFoundError):
        await graph_checkpoints_table(store, "f" * 32)


async def test_the_memory_store_holds_no_checkpoints() -> None:
    store = MemoryStore()
    async with Runtime(store=store) as runtime:
        runtime.add(RoutingInbox("inbox"))
        runtime.add(GraphAgent("graph", notes_graph()))
        await feed(runtime, "graph", "a")
        await runtime.snapshot()
    assert await store.list_graph_checkpoints(runtime.run_id) == []
    assert await store.list_graph_checkpoints(runtime.run_id, "graph") == []
    assert await graph_checkpoints_table(store, runtime.run_id) == []


def uuid6_text(moment: datetime, node: int) -> str:
    """A version-6 UUID of ``moment``, as LangGraph makes checkpoint ids."""
    ticks = (moment - datetime(1582, 10, 15, tzinfo=UTC)) // timedelta(microseconds=1) * 10
    value = ((ticks >> 12) << 80) | (0x6000 | (ticks & 0xFFF)) << 64 | (0x8 << 60) | node
    return str(uuid.UUID(int=value))


async def test_threads_are_matched_exactly_and_only_json_metadata_is_read(
    sql_store: SqlStore,
) -> None:
    run = "ab_%" + "0" * 28  # wildcards of LIKE, matched literally
    await sql_store.create_run(RunInfo(id=run))
    await sql_store.create_run(RunInfo(id="abx%" + "0" * 28))
    t0 = datetime(2025, 3, 1, 9, 30, tzinfo=UTC)

    def row(thread: str, n: int, *, ns: str = "", meta: Any = None) -> dict[str, Any]:
        meta_type, meta_bytes = ("msgpack", b"\x80") if meta is None else ("json", meta)
        return {
            "thread_id": thread,
            "checkpoint_ns": ns,
            "checkpoint_id": uuid6_text(t0 + timedelta(seconds=n), n),
            "parent_checkpoint_id": None,
            "checkpoint_type": "msgpack",
            "checkpoint": b"\x80",
            "meta_type": meta_type,
            "meta": meta_bytes,
        }

    step = orjson.dumps({"source": "loop", "step": 3, "parents": {}})
    rows = [
        row(f"{run}:g_1", 1, meta=step),
        row(f"{run}:g_1:2", 2),  # msgpack metadata: not decoded
        row(f"{run}:g_1", 3, ns="child:1", meta=step),  # a subgraph's: left out
        row(f"{run}:gx1:2", 4, meta=step),  # "_" is no wildcard
        row(f"{run}:G_1:2", 5, meta=step),  # case matters
        row(f"{run}:g_1:x", 6, meta=step),  # not a graph agent's thread
        row(f"{run}:g_1", 7, meta=b"[1, 2]"),  # JSON, not an object
        row(f"{'abx%' + '0' * 28}:g_1", 8, meta=step),  # another run
    ]
    await sql_store.list_runs()  # the schema is there
    engine = sqlalchemy.create_engine(sync_url(sql_store.url))
    try:
        with engine.begin() as connection:
            connection.execute(LangGraphCheckpointRow.__table__.insert(), rows)  # type: ignore[attr-defined]
    finally:
        engine.dispose()

    found = await sql_store.list_graph_checkpoints(run, "g_1")
    assert [(c.thread_id, c.checkpoint_id) for c in found] == [
        (rows[0]["thread_id"], rows[0]["checkpoint_id"]),
        (rows[1]["thread_id"], rows[1]["checkpoint_id"]),
        (rows[6]["thread_id"], rows[6]["checkpoint_id"]),
    ]
    first, second, third = found
    assert (first.step, first.source, first.metadata) == (3, "loop", orjson.loads(step))
    assert (second.step, second.source, second.metadata) == (None, None, None)
    assert (third.step, third.source, third.metadata) == (None, None, None)
    assert first.created_at == t0 + timedelta(seconds=1)
    every = await sql_store.list_graph_checkpoints(run)
    assert [c.agent for c in every] == ["g_1", "g_1", "gx1", "G_1", "g_1"]
