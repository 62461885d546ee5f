"""What a run leaves behind: its final states, its name and tags, why it ended, its journal.

* ``SnapshotPolicy(at_end=True)``, the default: a last snapshot when the run goes idle and
  when it closes, so the final agent states can be shown, diffed and forked; none when nothing
  happened since the newest one, none while a handler is half-way.
* ``Runtime(name=, tags=)`` are stored with the run; bad ones are refused at once.
* Each ending has its status and a one-line reason.
* The journal is on by default with a store kept in a database.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from agentsnap import (
    Agent,
    AgentState,
    ConfigurationError,
    Context,
    MemoryStore,
    Message,
    RunStatus,
    Runtime,
    SnapshotPolicy,
)
from agentsnap.inspect import fork_run
from agentsnap.store.sql import SqlStore


class Counter(Agent[AgentState]):
    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        n = self.state.memory.get("n", 0)
        assert isinstance(n, int)
        self.state.memory["n"] = n + 1
        if message.payload == "forward":
            ctx.send("other", "hello")


class HalfWay(Agent[AgentState]):
    """Changes its state, then waits forever: cancelled half-way through a handler."""

    def __init__(self, name: str, started: asyncio.Event) -> None:
        super().__init__(name)
        self.started = started

    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        self.state.memory["half"] = "way"
        self.started.set()
        await asyncio.Event().wait()


class Failing(Agent[AgentState]):
    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        raise ValueError("the price is negative")


@pytest.fixture
def store(tmp_path: Path) -> SqlStore:
    return SqlStore(f"sqlite:///{tmp_path / 'runs.db'}")


async def test_the_final_states_of_a_run_are_stored(store: SqlStore) -> None:
    try:
        async with Runtime(store=store) as runtime:
            runtime.add(Counter("counter"))
            runtime.send("counter", "count")
            await runtime.run_until_idle()
        snapshots = await store.list_snapshots(runtime.run_id)
        assert [s.seq for s in snapshots] == [1, 2]
        first, last = snapshots
        assert first.agents["counter"].state["memory"] == {}
        assert last.agents["counter"].state["memory"] == {"n": 1}
        # The final cut is a cut like any other: a fork starts from the final states.
        fork = await fork_run(store, last.id)
        assert fork.status is RunStatus.CREATED
        (forked,) = await store.list_snapshots(fork.id)
        assert forked.agents["counter"].state["memory"] == {"n": 1}
    finally:
        await store.close()


async def test_no_final_snapshot_repeats_the_newest_one(store: SqlStore) -> None:
    try:
        async with Runtime(store=store) as runtime:
            runtime.add(Counter("counter"))
            runtime.add(Counter("other"))
            runtime.send("counter", "forward")
            await runtime.run_until_idle()  # snapshot 2: both agents counted
            await runtime.run_until_idle()  # nothing happened since: none
            runtime.send("counter", "count")
            await runtime.run_until_idle()  # snapshot 3
        # Closing after going idle takes none either.
        snapshots = await store.list_snapshots(runtime.run_id)
        assert [s.seq for s in snapshots] == [1, 2, 3]
        assert snapshots[1].agents["other"].state["memory"] == {"n": 1}
        assert snapshots[2].agents["counter"].state["memory"] == {"n": 2}
    finally:
        await store.close()


async def test_at_end_false_keeps_only_the_snapshots_asked_for(store: SqlStore) -> None:
    try:
        policy = SnapshotPolicy(at_end=False)
        async with Runtime(store=store, snapshot_policy=policy) as runtime:
            runtime.add(Counter("counter"))
            runtime.send("counter", "count")
            await runtime.run_until_idle()
        assert [s.seq for s in await store.list_snapshots(runtime.run_id)] == [1]
    finally:
        await store.close()


async def test_a_run_cancelled_half_way_through_a_handler_keeps_its_newest_cut(
    store: SqlStore,
) -> None:
    started = asyncio.Event()
    runtime = Runtime(store=store)

    async def work() -> None:
        async with runtime:
            runtime.add(Counter("counter"))
            runtime.add(HalfWay("slow", started))
            runtime.send("counter", "count")
            await runtime.run_until_idle()  # snapshot 2: the counter counted
            runtime.send("slow", "go")
            await runtime.run_until_idle()

    try:
        task = asyncio.create_task(work())
        await asyncio.wait_for(started.wait(), 10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        run = await store.get_run(runtime.run_id)
        assert run.status is RunStatus.CANCELLED
        snapshots = await store.list_snapshots(runtime.run_id)
        assert [s.seq for s in snapshots] == [1, 2]  # none with the handler half-way
        assert snapshots[-1].agents["slow"].state["memory"] == {}
    finally:
        await store.close()


async def test_name_and_tags_are_stored_with_the_run(store: SqlStore) -> None:
    try:
        runtime = Runtime(store=store, name="nightly report", tags={"team": "billing", "env": ""})
        async with runtime:
            runtime.add(Counter("counter"))
            runtime.send("counter", "count")
            await runtime.run_until_idle()
        run = await store.get_run(runtime.run_id)
        assert (run.name, run.tags) == ("nightly report", {"team": "billing", "env": ""})
        assert (run.status, run.status_reason) == (RunStatus.SUCCEEDED, None)
    finally:
        await store.close()


@pytest.mark.parametrize(
    ("name", "tags", "message"),
    [
        ("x" * 129, None, "a run's name 'xxx"),
        ("", None, "a run's name must not be empty"),
        (None, {"": "v"}, "a tag key must not be empty"),
        (None, {"k": 1}, "a tag value must be a string, got int 1"),
        (None, {"k": "v" * 256}, "is 256 characters long"),
        (None, ["k"], "tags must be a mapping of strings to strings"),
    ],
)
def test_bad_names_and_tags_are_refused_at_once(name: object, tags: object, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message.replace("(", r"\(")):
        Runtime(name=name, tags=tags)  # type: ignore[arg-type]


async def test_a_failed_run_says_why(store: SqlStore) -> None:
    try:
        async with Runtime(store=store) as runtime:
            runtime.add(Failing("pricer"))
            runtime.send("pricer", "quote")
            await runtime.run_until_idle(raise_failures=False)
        run = await store.get_run(runtime.run_id)
        assert run.status is RunStatus.FAILED
        assert run.status_reason is not None
        assert run.status_reason.startswith("HandlerFailed: ")
        assert "the price is negative" in run.status_reason
        # No end-of-run snapshot after a failed handler: resumed, the run goes back to the
        # cut before it and handles that message again.
        assert [s.seq for s in await store.list_snapshots(runtime.run_id)] == [1]
    finally:
        await store.close()


async def test_a_run_closed_with_work_left_is_interrupted_and_says_so(store: SqlStore) -> None:
    try:
        runtime = Runtime(store=store)
        await runtime.start()
        runtime.add(Counter("counter"))
        runtime.send("counter", "count")
        runtime.send("counter", "count")
        await runtime.close()  # before anything was delivered
        run = await store.get_run(runtime.run_id)
        assert run.status is RunStatus.INTERRUPTED
        assert run.status_reason == (
            "closed with 2 messages not delivered yet; resume() continues it"
        )
        # Resumed, it runs again: no end and no reason until it is closed.
        resumed = Runtime(store=store, run_id=runtime.run_id)
        resumed.add(Counter("counter"))
        await resumed.resume()
        run = await store.get_run(runtime.run_id)
        assert (run.status, run.status_reason, run.finished_at) == (RunStatus.RUNNING, None, None)
        await resumed.run_until_idle()
        await resumed.close()
        assert (await store.get_run(runtime.run_id)).status is RunStatus.SUCCEEDED
    finally:
        await store.close()


async def test_the_journal_is_on_by_default_with_a_database(store: SqlStore) -> None:
    try:
        for journal, expected in [(None, 1), (False, 0)]:
            async with Runtime(store=store, journal=journal) as runtime:
                runtime.add(Counter("counter"))
                runtime.send("counter", "count")
                await runtime.run_until_idle()
            segments = await store.load_journal(runtime.run_id)
            assert len([s for s in segments if s.event == "deliver"]) == expected
        memory = MemoryStore()
        async with Runtime(store=memory) as runtime:
            runtime.add(Counter("counter"))
            runtime.send("counter", "count")
            await runtime.run_until_idle()
        assert await memory.load_journal(runtime.run_id) == []
    finally:
        await store.close()
