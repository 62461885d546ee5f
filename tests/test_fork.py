"""One way to fork a run: ``fork_run`` (and ``agentsnap fork``) and ``Runtime.fork_from`` store
the same run, a copy of the cut as its snapshot 1 with its parent recorded; ``states=``
replaces agents' recorded states in that copy.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from agentsnap import (
    Agent,
    AgentState,
    ConfigurationError,
    Context,
    JsonInput,
    MemoryStore,
    Message,
    RunStatus,
    Runtime,
    Snapshot,
    SnapshotStatus,
)
from agentsnap.fork import fork_snapshot
from agentsnap.inspect import fork_run
from agentsnap.state import canonical_json, content_hash
from agentsnap.store import Store


class Tally(AgentState):
    n: int = 0


class Relay(Agent[Tally]):
    """Counts what it takes and passes it on to the next agent, if it has one."""

    def __init__(self, name: str, to: str | None = None) -> None:
        super().__init__(name)
        self.to = to

    async def handle(self, message: Message, ctx: Context[Tally]) -> None:
        self.state.n += 1
        if self.to is not None:
            ctx.send(self.to, message.payload, kind="relayed")


def add_agents(runtime: Runtime) -> tuple[Relay, Relay]:
    return runtime.add(Relay("a", to="b")), runtime.add(Relay("b"))


async def cut_with_messages_in_flight(store: Store) -> Snapshot:
    async with Runtime(store=store) as original:
        add_agents(original)
        for item in range(3):
            original.send("a", item)
        handle = original.snapshot()
        await original.run_until_idle()
        cut = await handle
    assert cut.status is SnapshotStatus.COMPLETE
    assert cut.channels, "the cut holds messages in flight"
    return cut


def shape(snapshot: Snapshot) -> dict[str, Any]:
    """What a fork's snapshot 1 shares with the cut it copies."""
    return snapshot.model_dump(
        mode="json", exclude={"id", "run_id", "seq", "started_at", "completed_at"}
    )


async def test_both_ways_of_forking_store_the_same_run(store: Store) -> None:
    cut = await cut_with_messages_in_flight(store)

    recorded = await fork_run(store, cut.id[:12])
    async with Runtime(store=store) as started:  # fork_from on a started runtime
        add_agents(started)
        assert await started.fork_from(cut.id) == cut
    not_started = Runtime(store=store)  # and on one that has not started yet
    add_agents(not_started)
    await not_started.fork_from(cut.id)
    await not_started.close()

    assert recorded.status is RunStatus.CREATED
    for run_id in (recorded.id, started.run_id, not_started.run_id):
        run = await store.get_run(run_id)
        assert (run.parent_run_id, run.parent_snapshot_id) == (cut.run_id, cut.id)
        first = (await store.list_snapshots(run_id))[0]
        assert (first.seq, first.run_id, first.status) == (1, run_id, SnapshotStatus.COMPLETE)
        assert first.id != cut.id
        assert shape(first) == shape(cut)

    # Resumed, the recorded fork ends where the one fork_from ran ends.
    async with Runtime(store=store, run_id=recorded.id) as resumed:
        a, b = add_agents(resumed)
        start = await resumed.resume()
        assert start.seq == 1
        await resumed.run_until_idle()
    async with Runtime(store=store) as forked:
        fa, fb = add_agents(forked)
        await forked.fork_from(cut.id)
        await forked.run_until_idle()
    assert (a.state.n, b.state.n) == (fa.state.n, fb.state.n) == (3, 3)
    assert (await store.get_run(recorded.id)).status is RunStatus.SUCCEEDED
    assert (await store.get_run(forked.run_id)).status is RunStatus.SUCCEEDED


async def test_fork_from_keeps_the_runtimes_name_tags_and_metadata() -> None:
    store = MemoryStore()
    cut = await cut_with_messages_in_flight(store)
    runtime = Runtime(store=store, name="again", tags={"try": "2"}, metadata={"why": "fork"})
    add_agents(runtime)
    await runtime.fork_from(cut.id)
    run = await store.get_run(runtime.run_id)
    assert (run.name, run.tags, run.metadata, run.status) == (
        "again",
        {"try": "2"},
        {"why": "fork"},
        RunStatus.RUNNING,
    )
    await runtime.close()


async def test_a_fork_with_edited_states(store: Store) -> None:
    cut = await cut_with_messages_in_flight(store)
    edited: dict[str, JsonInput] = {
        "memory": {"note": "edited"},
        "n": 100,
        "plan": [],
        "tool_calls": [],
    }
    run = await fork_run(store, cut.id, states={"b": edited})
    (first,) = await store.list_snapshots(run.id)
    text = canonical_json(edited)
    assert (first.agents["b"].state_json, first.agents["b"].state_hash) == (
        text,
        content_hash(text),
    )
    assert first.agents["a"] == cut.agents["a"]  # the others as recorded
    assert first.channels == cut.channels
    assert (await store.load_snapshot(first.id)).agents["b"].state == edited

    async with Runtime(store=store, run_id=run.id) as resumed:
        a, b = add_agents(resumed)
        await resumed.resume()
        assert b.state.n == 100
        assert b.state.memory == {"note": "edited"}
        await resumed.run_until_idle()
    assert b.state.n > 100
    assert a.state.n == 3


@pytest.mark.parametrize(
    ("states", "error"),
    [
        ({"nobody": {}}, r"states= names 'nobody', which is not an agent of snapshot .* 'a', 'b'"),
        ({"$env": {}}, r"states= names '\$env', which is not an agent"),
        ({"b": [1, 2]}, r"gives agent 'b' a list; an agent's state is a JSON object"),
        ({"b": {"n": math.nan}}, r"gives agent 'b' a state that is not JSON"),
    ],
)
async def test_edited_states_are_checked_before_anything_is_written(
    states: dict[str, Any], error: str
) -> None:
    store = MemoryStore()
    cut = await cut_with_messages_in_flight(store)
    runs = await store.list_runs()
    with pytest.raises(ConfigurationError, match=error):
        await fork_snapshot(store, cut, states=states)
    assert await store.list_runs() == runs


async def test_fork_from_refuses_a_run_the_store_already_holds() -> None:
    store = MemoryStore()
    cut = await cut_with_messages_in_flight(store)
    taken = await fork_run(store, cut.id)
    async with Runtime(store=store, run_id=taken.id) as started:
        add_agents(started)
        with pytest.raises(ConfigurationError, match=r"fork_from\(\) called on run .*resume\(\)"):
            await started.fork_from(cut.id)
    not_started = Runtime(store=store, run_id=taken.id)
    add_agents(not_started)
    with pytest.raises(ConfigurationError, match="there is already a run with id"):
        await not_started.fork_from(cut.id)
    await not_started.close()
    assert len(await store.list_snapshots(taken.id)) == 1


async def test_fork_snapshot_into_a_recorded_run_needs_its_id() -> None:
    store = MemoryStore()
    cut = await cut_with_messages_in_flight(store)
    with pytest.raises(ConfigurationError, match="needs the run_id"):
        await fork_snapshot(store, cut, recorded=True)
