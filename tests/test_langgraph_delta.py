"""AgentsnapSaver gives LangGraph the history a ``DeltaChannel`` is rebuilt from.

``get_delta_channel_history`` (and its asynchronous twin) walks a checkpoint's ancestors to
the nearest stored value of each channel, on SQLite and PostgreSQL; these tests hold it to
LangGraph's contract, to the base class's reference walk, and to a graph's own state.
"""

from __future__ import annotations

import operator
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Annotated, Any, TypedDict
from uuid import uuid4

import pytest
import sqlalchemy
from postgres_db import postgres_url_or_skip

pytest.importorskip("langgraph.channels.delta")

from langchain_core.runnables import RunnableConfig
from langgraph.channels.delta import DeltaChannel
from langgraph.checkpoint.base import BaseCheckpointSaver, Checkpoint
from langgraph.checkpoint.base.id import uuid6
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.serde.types import _DeltaSnapshot
from langgraph.graph import END, START, StateGraph

from agentsnap.integrations.langgraph import AgentsnapSaver
from agentsnap.store.migrate import sync_url

URLS = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
]


@pytest.fixture(params=URLS)
async def saver(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[AgentsnapSaver]:
    url = (
        f"sqlite:///{tmp_path / 'agentsnap.db'}"
        if request.param == "sqlite"
        else postgres_url_or_skip()
    )
    found = AgentsnapSaver(url)
    try:
        yield found
    finally:
        await found.aclose()


@pytest.fixture(params=["async", "sync"])
def history(
    request: pytest.FixtureRequest, saver: AgentsnapSaver
) -> Callable[[RunnableConfig, Sequence[str]], Any]:
    """The saver's history method, asynchronous or not, as a coroutine function."""

    async def read(config: RunnableConfig, channels: Sequence[str]) -> Any:
        if request.param == "async":
            return await saver.aget_delta_channel_history(config=config, channels=channels)
        return saver.get_delta_channel_history(config=config, channels=channels)

    return read


History = Callable[[RunnableConfig, Sequence[str]], Any]


class Thread:
    """Checkpoints put one after another on one thread, each with what a step stored."""

    def __init__(self, saver: BaseCheckpointSaver[Any], ns: str = "") -> None:
        self.saver = saver
        self.thread_id = str(uuid4())
        self.ns = ns
        self.configs: list[RunnableConfig] = []

    async def step(
        self,
        values: dict[str, Any] | None = None,
        writes: Sequence[tuple[str, Any]] = (),
        *,
        parent: RunnableConfig | None = None,
        task_path: str = "",
        checkpoint_id: str | None = None,
    ) -> RunnableConfig:
        """Put a checkpoint holding ``values`` after ``parent`` (the last one), then writes."""
        config: RunnableConfig = {
            "configurable": {"thread_id": self.thread_id, "checkpoint_ns": self.ns}
        }
        after = parent if parent is not None else (self.configs[-1] if self.configs else None)
        if after is not None:
            config["configurable"]["checkpoint_id"] = after["configurable"]["checkpoint_id"]
        versions = {channel: self.saver.get_next_version(None, None) for channel in (values or {})}
        checkpoint = Checkpoint(
            v=4,
            id=checkpoint_id or str(uuid6(clock_seq=-1)),
            ts="2026-11-22T00:00:00+00:00",
            channel_values=dict(values or {}),
            channel_versions=dict(versions),
            versions_seen={},
            updated_channels=None,
        )
        saved = await self.saver.aput(config, checkpoint, {"step": len(self.configs)}, versions)
        self.configs.append(saved)
        if writes:
            await self.saver.aput_writes(saved, list(writes), str(uuid4()), task_path)
        return saved

    def at(self, checkpoint_id: str | None = None) -> RunnableConfig:
        configurable: dict[str, Any] = {"thread_id": self.thread_id, "checkpoint_ns": self.ns}
        if checkpoint_id:
            configurable["checkpoint_id"] = checkpoint_id
        return {"configurable": configurable}


def _values(entry: Any) -> list[Any]:
    return [value for _, _, value in entry["writes"]]


async def test_the_writes_since_the_nearest_snapshot_oldest_first(
    saver: AgentsnapSaver, history: History
) -> None:
    thread = Thread(saver)
    await thread.step({"ch": _DeltaSnapshot(["s0"])}, [("ch", "w0")])
    await thread.step(None, [("ch", "w1")])
    await thread.step({"ch": _DeltaSnapshot(["s2"])}, [("ch", "w2")])
    await thread.step(None, [("ch", "w3")])
    await thread.step(None, [("ch", "w4")])
    head = await thread.step(None, [("ch", "pending")])

    found = await history(head, ["ch"])

    # The snapshot's own write made its child: replayed. The head's is pending: not.
    assert _values(found["ch"]) == ["w2", "w3", "w4"]
    assert found["ch"]["seed"] == _DeltaSnapshot(["s2"])
    assert {task for task, _, _ in found["ch"]["writes"]} != set()
    assert all(channel == "ch" for _, channel, _ in found["ch"]["writes"])


async def test_each_channel_stops_at_its_own_seed(saver: AgentsnapSaver, history: History) -> None:
    thread = Thread(saver)
    await thread.step({"a": _DeltaSnapshot("A")}, [("a", 0), ("b", 0), ("c", 0)])
    await thread.step(None, [("a", 1), ("b", 1), ("c", 1)])
    await thread.step({"b": _DeltaSnapshot("B")}, [("a", 2), ("b", 2), ("c", 2)])
    head = await thread.step(None, [("a", 3), ("b", 3)])

    found = await history(head, ["a", "b", "c", "never"])

    assert _values(found["a"]) == [0, 1, 2]
    assert found["a"]["seed"] == _DeltaSnapshot("A")
    assert _values(found["b"]) == [2]
    assert found["b"]["seed"] == _DeltaSnapshot("B")
    # No stored value on the way: every write back to the first checkpoint, and no seed.
    assert _values(found["c"]) == [0, 1, 2]
    assert "seed" not in found["c"]
    assert found["never"] == {"writes": []}


async def test_nothing_to_walk(saver: AgentsnapSaver, history: History) -> None:
    thread = Thread(saver)
    first = await thread.step({"ch": _DeltaSnapshot(1)}, [("ch", 1)])
    assert await history(first, []) == {}
    # The first checkpoint has no ancestors; its own writes are pending.
    assert await history(first, ["ch"]) == {"ch": {"writes": []}}
    unknown = thread.at(str(uuid6(clock_seq=-1)))
    assert await history(unknown, ["ch"]) == {"ch": {"writes": []}}
    other = Thread(saver)
    assert await history(other.at(), ["ch"]) == {"ch": {"writes": []}}


async def test_without_a_checkpoint_id_the_newest_checkpoint_is_meant(
    saver: AgentsnapSaver, history: History
) -> None:
    thread = Thread(saver)
    await thread.step({"ch": _DeltaSnapshot("s")}, [("ch", 1)])
    await thread.step(None, [("ch", 2)])
    head = await thread.step(None, [("ch", "pending")])
    assert await history(thread.at(), ["ch"]) == await history(head, ["ch"])


async def test_a_plain_value_is_a_seed_wherever_the_saver_keeps_it(
    saver: AgentsnapSaver, history: History
) -> None:
    # A thread written before the channel became a DeltaChannel holds plain values: a small
    # scalar (kept in the checkpoint's row), a larger value (a row of its own), and a value
    # a task wrote (a reference to that write).
    scalar = Thread(saver)
    await scalar.step({"ch": 7}, [("ch", 8)])
    await scalar.step(None, [("ch", 9)])
    found = await history(await scalar.step(), ["ch"])
    assert (found["ch"]["seed"], _values(found["ch"])) == (7, [8, 9])

    large = Thread(saver)
    await large.step({"ch": ["x"] * 50}, [("ch", ["y"])])
    found = await history(await large.step(), ["ch"])
    assert (found["ch"]["seed"], _values(found["ch"])) == (["x"] * 50, [["y"]])

    written = Thread(saver)
    value = [f"item {i}" for i in range(40)]
    await written.step(None, [("ch", value)])
    await written.step({"ch": value}, [("ch", ["after"])])
    found = await history(await written.step(), ["ch"])
    assert (found["ch"]["seed"], _values(found["ch"])) == (value, [["after"]])
    assert _refers_to_a_write(saver.url, written.thread_id)


def _refers_to_a_write(url: str, thread_id: str) -> bool:
    engine = sqlalchemy.create_engine(sync_url(url))
    try:
        with engine.connect() as connection:
            rows = connection.execute(
                sqlalchemy.text(
                    "SELECT COUNT(*) FROM agentsnap_lg_blobs "
                    "WHERE thread_id = :t AND write_idx IS NOT NULL AND value IS NULL"
                ),
                {"t": thread_id},
            ).scalar_one()
    finally:
        engine.dispose()
    return bool(rows)


async def test_a_branch_replays_its_own_ancestors_only(
    saver: AgentsnapSaver, history: History
) -> None:
    thread = Thread(saver)
    await thread.step({"ch": _DeltaSnapshot([])}, [("ch", "root")])
    fork_point = await thread.step(None, [("ch", "shared")])
    await thread.step(None, [("ch", "old branch")])
    await thread.step(None, [("ch", "old branch again")])
    newer = await thread.step(parent=fork_point)
    # The new branch's checkpoint, though newer than the old branch's, sees none of them.
    head = await thread.step(parent=newer)
    assert _values((await history(head, ["ch"]))["ch"]) == ["root", "shared"]


async def test_a_steps_writes_replay_in_langgraphs_task_order(
    saver: AgentsnapSaver, history: History
) -> None:
    thread = Thread(saver)
    first = await thread.step({"ch": _DeltaSnapshot([])})
    # Stored in another order than LangGraph applies them: by task path, task id, index.
    tasks = [("~b", "t1", ["b0", "b1"]), ("~a", "t9", ["a0"]), ("", "t5", ["input"])]
    for task_path, task_id, values in tasks:
        await saver.aput_writes(first, [("ch", v) for v in values], task_id, task_path)
    await saver.aput_writes(first, [("other", "x")], "t0", "~0")
    head = await thread.step()
    found = (await history(head, ["ch"]))["ch"]["writes"]
    assert found == [
        ("t5", "ch", "input"),
        ("t9", "ch", "a0"),
        ("t1", "ch", "b0"),
        ("t1", "ch", "b1"),
    ]


async def test_namespaces_have_their_own_history(saver: AgentsnapSaver, history: History) -> None:
    root = Thread(saver)
    sub = Thread(saver, ns="child:1")
    sub.thread_id = root.thread_id
    await root.step({"ch": _DeltaSnapshot("root")}, [("ch", "in root")])
    await sub.step({"ch": _DeltaSnapshot("sub")}, [("ch", "in sub")])
    root_head = await root.step()
    sub_head = await sub.step()
    found_root = await history(root_head, ["ch"])
    found_sub = await history(sub_head, ["ch"])
    assert (found_root["ch"]["seed"], _values(found_root["ch"])) == (
        _DeltaSnapshot("root"),
        ["in root"],
    )
    assert (found_sub["ch"]["seed"], _values(found_sub["ch"])) == (
        _DeltaSnapshot("sub"),
        ["in sub"],
    )


async def test_a_long_history_is_walked_whole(saver: AgentsnapSaver, history: History) -> None:
    thread = Thread(saver)
    await thread.step({"ch": _DeltaSnapshot(-1)}, [("ch", 0)])
    for step in range(1, 300):
        await thread.step(None, [("ch", step), ("noise", step)])
    found = await history(await thread.step(), ["ch", "noise"])
    assert _values(found["ch"]) == list(range(300))
    assert found["ch"]["seed"] == _DeltaSnapshot(-1)
    assert _values(found["noise"]) == list(range(1, 300))
    assert "seed" not in found["noise"]


async def test_a_loop_of_parents_ends_the_walk(saver: AgentsnapSaver, history: History) -> None:
    # Putting a checkpoint again under one of its descendants makes its parents a loop.
    thread = Thread(saver)
    first_id = str(uuid6(clock_seq=-1))
    first = await thread.step(None, [("ch", "first")], checkpoint_id=first_id)
    second = await thread.step(None, [("ch", "second")])
    await thread.step(None, parent=second, checkpoint_id=first_id)
    found = await history(first, ["ch"])
    assert _values(found["ch"]) == ["second"]
    assert "seed" not in found["ch"]


async def test_the_history_is_the_base_classs_reference_walk(
    saver: AgentsnapSaver, history: History
) -> None:
    # The base class walks get_tuple and parent_config: the contract, read the slow way.
    thread = Thread(saver)
    for step in range(30):
        values: dict[str, Any] = {}
        if step % 7 == 3:
            values["a"] = _DeltaSnapshot(step)
        if step % 11 == 5:
            values["b"] = [step] * 30
        if step == 12:
            values["c"] = step
        await thread.step(values, [("a", step), ("b", -step), ("c", str(step))])
        if step % 5 == 0:
            await saver.aput_writes(thread.configs[-1], [("a", "again")], "zz", "~z")
    for config in (thread.configs[-1], thread.configs[17], thread.configs[3]):
        ours = await history(config, ["a", "b", "c", "d"])
        reference = await BaseCheckpointSaver.aget_delta_channel_history(
            saver, config=config, channels=["a", "b", "c", "d"]
        )
        assert ours == reference


def _extend(notes: list[str], writes: Sequence[list[str]]) -> list[str]:
    return [*notes, *(note for written in writes for note in written)]


class Notes(TypedDict):
    notes: Annotated[list[str], DeltaChannel(_extend, snapshot_frequency=3)]
    turns: Annotated[int, operator.add]


def _graph(checkpointer: BaseCheckpointSaver[Any]) -> Any:
    def note(state: Notes) -> dict[str, Any]:
        return {"notes": [f"note {state['turns']}"], "turns": 1}

    def echo(state: Notes) -> dict[str, Any]:
        return {"notes": [f"echo {len(state['notes'])}"]}

    builder = StateGraph(Notes)
    builder.add_node("note", note)
    builder.add_node("echo", echo)
    builder.add_edge(START, "note")
    builder.add_edge("note", "echo")
    builder.add_edge("echo", END)
    return builder.compile(checkpointer=checkpointer)


@pytest.mark.parametrize("mode", ["async", "sync"])
async def test_a_graph_with_a_delta_channel_keeps_its_state(
    saver: AgentsnapSaver, mode: str
) -> None:
    ours, reference = _graph(saver), _graph(InMemorySaver())
    thread: RunnableConfig = {"configurable": {"thread_id": "delta"}}
    for turn in range(8):
        update = {"notes": [f"user {turn}"], "turns": 0}
        for graph in (ours, reference):
            if mode == "async":
                await graph.ainvoke(update, thread)
            else:
                graph.invoke(update, thread)
    state = await ours.aget_state(thread) if mode == "async" else ours.get_state(thread)
    expected = await reference.aget_state(thread)
    assert state.values == expected.values
    assert len(state.values["notes"]) == 24
    # Every checkpoint of the history rebuilds as the reference saver's does.
    ours_history = [s.values async for s in ours.aget_state_history(thread)]
    assert ours_history == [s.values async for s in reference.aget_state_history(thread)]
    # A branch from an older checkpoint continues from that checkpoint's notes.
    older = [s async for s in ours.aget_state_history(thread)][10].config
    await ours.ainvoke({"notes": ["branch"], "turns": 0}, older)
    branched = (await ours.aget_state(thread)).values["notes"]
    assert branched[:-3] == (await ours.aget_state(older)).values["notes"]
    assert branched[-3] == "branch"
