"""Behaviour users rely on: channels, scheduling, snapshots, policies, stores, contexts."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Awaitable
from typing import Any, TypeVar

import pytest
from payloads import get
from pydantic import BaseModel, Field

from agentsnap import (
    Agent,
    AgentState,
    ChannelId,
    ConfigurationError,
    Context,
    Feedback,
    MemoryStore,
    Message,
    NotFoundError,
    Runtime,
    Snapshot,
    SnapshotHandle,
    SnapshotPolicy,
    SnapshotStatus,
)
from agentsnap.testing import ScriptedScheduler, SeededScheduler, assert_consistent, bus_of

T = TypeVar("T")


async def within(awaitable: Awaitable[T], seconds: float = 5) -> T:
    """Await ``awaitable``, failing instead of hanging if a snapshot never completes."""
    async with asyncio.timeout(seconds):
        return await awaitable


# -- agents used below ------------------------------------------------------------------------


class LogState(AgentState):
    log: list[str] = Field(default_factory=list)
    count: int = 0


class Logger(Agent[LogState]):
    """Logs ``id payload`` of every message; forwards to ``payload["to"]`` if given."""

    async def handle(self, message: Message, ctx: Context[LogState]) -> None:
        self.state.count += 1
        self.state.log.append(f"{message.id} {json.dumps(message.payload, sort_keys=True)}")
        if isinstance(message.payload, dict) and "to" in message.payload:
            order = message.payload_as(Forward)
            for i in range(order.times):
                ctx.send(order.to, {"n": i})


class Forward(BaseModel):
    to: str
    times: int = 1


class TokenState(AgentState):
    passed: int = 0


class TokenRing(Agent[TokenState]):
    """Passes a token with a hop count to the next agent until the count runs out."""

    def __init__(self, name: str, next_agent: str) -> None:
        super().__init__(name)
        self.next_agent = next_agent

    async def handle(self, message: Message, ctx: Context[TokenState]) -> None:
        hops = message.payload_as(dict[str, int])["hops"]
        if hops > 0:
            self.state.passed += 1
            ctx.send(self.next_agent, {"hops": hops - 1}, kind="token")


class TellerState(AgentState):
    balance: int


class Teller(Agent[TellerState]):
    """Moves money around a ring; money is only ever moved, never made or lost."""

    def __init__(self, name: str, next_agent: str, balance: int) -> None:
        super().__init__(name, TellerState(balance=balance))
        self.next_agent = next_agent

    async def handle(self, message: Message, ctx: Context[TellerState]) -> None:
        hops = 0
        if message.kind == "transfer":
            transfer = message.payload_as(dict[str, int])
            self.state.balance += transfer["amount"]
            hops = transfer["hops"]
        elif message.kind == "go":
            hops = message.payload_as(dict[str, int])["hops"]
        if hops > 0 and self.state.balance > 0:
            amount = min(self.state.balance, 1 + hops % 7)
            self.state.balance -= amount
            ctx.send(self.next_agent, {"amount": amount, "hops": hops - 1}, kind="transfer")
        if message.kind == "go" and hops % 3 == 0:
            # Give the other agents a chance to run in the middle of a handler.
            await asyncio.sleep(0)


def money_in(snapshot: Snapshot) -> int:
    total = sum(
        get(cut.state, "balance", int) for name, cut in snapshot.agents.items() if name != "$env"
    )
    for channel in snapshot.channels:
        total += sum(
            get(m.payload, "amount", int) for m in channel.messages if m.kind == "transfer"
        )
    return total


def add_ring(runtime: Runtime, size: int, balance: int) -> list[str]:
    names = [f"teller-{i}" for i in range(size)]
    for i, name in enumerate(names):
        runtime.add(Teller(name, names[(i + 1) % size], balance))
    return names


# -- channels and messages --------------------------------------------------------------------


async def test_channels_are_fifo_with_seqs_from_one_created_on_first_send() -> None:
    scheduler = SeededScheduler(11)
    async with Runtime(scheduler=scheduler) as runtime:
        runtime.add(Logger("a"))
        runtime.add(Logger("b"))
        runtime.add(Logger("sink"))
        # The environment reaches every agent from the start; agents' channels come later.
        assert set(bus_of(runtime).channels) == {("$env", "a"), ("$env", "b"), ("$env", "sink")}

        first = runtime.send("a", {"to": "sink", "times": 5})
        second = runtime.send("a", {"to": "sink", "times": 5})
        other = runtime.send("b", {"to": "sink", "times": 5})
        direct = runtime.send("sink", {"direct": True})
        assert [first.seq, second.seq, other.seq, direct.seq] == [1, 2, 1, 1]
        assert ("a", "sink") not in bus_of(runtime).channels
        await runtime.run_until_idle()

        assert ("a", "sink") in bus_of(runtime).channels
        assert ("b", "sink") in bus_of(runtime).channels
        assert ("sink", "a") not in bus_of(runtime).channels
        a_to_sink = bus_of(runtime).channels["a", "sink"]
        assert (a_to_sink.sent, a_to_sink.delivered, len(a_to_sink)) == (10, 10, 0)

    log = runtime.agents["sink"].state.log
    from_a = [entry for entry in log if entry.startswith("a>sink#")]
    from_b = [entry for entry in log if entry.startswith("b>sink#")]
    # Each channel delivers in the order sent, numbered from 1.
    assert from_a == [f'a>sink#{i + 1} {{"n": {i % 5}}}' for i in range(10)]
    assert from_b == [f'b>sink#{i + 1} {{"n": {i}}}' for i in range(5)]
    assert len(log) == 16


async def test_fifo_under_the_asyncio_scheduler() -> None:
    async with Runtime() as runtime:
        runtime.add(Logger("a"))
        runtime.add(Logger("sink"))
        for i in range(30):
            runtime.send("sink", {"i": i})
            runtime.send("a", {"to": "sink", "times": 2})
        await runtime.run_until_idle()
    log = runtime.agents["sink"].state.log
    env = [entry for entry in log if entry.startswith("$env>")]
    from_a = [entry.split()[0] for entry in log if entry.startswith("a>")]
    assert env == [f'$env>sink#{i + 1} {{"i": {i}}}' for i in range(30)]
    assert from_a == [f"a>sink#{i + 1}" for i in range(60)]


async def test_message_is_immutable_and_named_by_its_place() -> None:
    async with Runtime(scheduler=ScriptedScheduler()) as runtime:
        runtime.add(Logger("alice"))
        runtime.send("alice", {"x": 1})
        message = runtime.send("alice", {"x": 2}, kind="note", headers={"trace": "t-1"})

    assert message.id == "$env>alice#2"
    assert message.channel == ChannelId("$env", "alice")
    assert str(message.channel) == "$env>alice"
    assert (message.src, message.dst, message.seq, message.kind) == ("$env", "alice", 2, "note")
    assert message.payload == {"x": 2}
    assert dict(message.headers) == {"trace": "t-1"}
    with pytest.raises(AttributeError):
        message.seq = 7  # type: ignore[misc]
    with pytest.raises(AttributeError):
        message.payload = {}  # type: ignore[misc]
    with pytest.raises(TypeError):
        message.headers["trace"] = "other"  # type: ignore[index]
    assert Message.from_json(message.to_json()) == message


async def test_headers_are_a_copy() -> None:
    headers = {"trace": "t-1"}
    async with Runtime(scheduler=ScriptedScheduler()) as runtime:
        runtime.add(Logger("alice"))
        message = runtime.send("alice", headers=headers)
    headers["trace"] = "changed"
    assert message.headers["trace"] == "t-1"


# -- the asyncio scheduler ----------------------------------------------------------------------


class EventState(AgentState):
    done: int = 0


class Waiter(Agent[EventState]):
    def __init__(self, name: str, event: asyncio.Event) -> None:
        super().__init__(name)
        self.event = event

    async def handle(self, message: Message, ctx: Context[EventState]) -> None:
        await self.event.wait()
        self.state.done += 1


class Setter(Agent[EventState]):
    def __init__(self, name: str, event: asyncio.Event) -> None:
        super().__init__(name)
        self.event = event

    async def handle(self, message: Message, ctx: Context[EventState]) -> None:
        self.event.set()
        self.state.done += 1


async def test_an_agent_waiting_on_an_event_does_not_block_the_others() -> None:
    # The waiter can only finish once the setter has handled its message: if agents were
    # served one after the other, this would deadlock (and hit the timeout).
    event = asyncio.Event()
    async with Runtime() as runtime:
        runtime.add(Waiter("waiter", event))
        runtime.add(Setter("setter", event))
        runtime.send("waiter")
        runtime.send("setter")
        async with asyncio.timeout(5):
            await runtime.run_until_idle()
        assert runtime.agents["waiter"].state.done == 1
        assert runtime.agents["setter"].state.done == 1


class Sleeper(Agent[EventState]):
    """Sleeps until another agent has handled ``expected`` messages."""

    def __init__(self, name: str, other: Agent[LogState], expected: int) -> None:
        super().__init__(name)
        self.other = other
        self.expected = expected

    async def handle(self, message: Message, ctx: Context[EventState]) -> None:
        # Polling on purpose: the point is an agent parked in asyncio.sleep, as in real I/O.
        while self.other.state.count < self.expected:  # noqa: ASYNC110
            await asyncio.sleep(0.001)
        self.state.done += 1


async def test_an_agent_sleeping_on_io_does_not_block_the_others() -> None:
    async with Runtime() as runtime:
        busy = Logger("busy")
        runtime.add(busy)
        runtime.add(Sleeper("sleeper", busy, expected=25))
        runtime.send("sleeper")
        for i in range(25):
            runtime.send("busy", {"i": i})
        async with asyncio.timeout(5):
            await runtime.run_until_idle()
        assert runtime.agents["sleeper"].state.done == 1
        assert busy.state.count == 25


class Overlap(Agent[EventState]):
    """Notices when two of its handlers run at the same time."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.running = 0
        self.most = 0

    async def handle(self, message: Message, ctx: Context[EventState]) -> None:
        self.running += 1
        self.most = max(self.most, self.running)
        for _ in range(3):
            await asyncio.sleep(0)
        self.running -= 1
        self.state.done += 1


async def test_each_agent_handles_one_message_at_a_time() -> None:
    async with Runtime() as runtime:
        target = Overlap("target")
        runtime.add(target)
        runtime.add(Logger("relay"))
        for _ in range(20):
            runtime.send("target")
            runtime.send("relay", {"to": "target", "times": 2})
        async with asyncio.timeout(5):
            await runtime.run_until_idle()
    assert target.state.done == 60
    assert target.most == 1


# -- snapshots ----------------------------------------------------------------------------------


async def test_snapshots_while_money_flows_are_consistent_and_conserve_money() -> None:
    async with Runtime(snapshot_policy=SnapshotPolicy(at_start=False)) as runtime:
        names = add_ring(runtime, 5, 1_000)
        total = 5_000
        handles: list[SnapshotHandle] = []
        for i in range(200):
            runtime.send(names[i % 5], {"hops": 3 + i % 11}, kind="go")
            if i % 15 == 0:
                handles.append(runtime.snapshot(initiator=[None, *names][i % 6]))
            if i % 4 == 0:
                await asyncio.sleep(0)
        async with asyncio.timeout(10):
            await runtime.run_until_idle()
            results = [await within(handle) for handle in handles]
        stored = await runtime.list_snapshots()

    *taken, end = stored
    assert [s.id for s in taken] == [h.id for h in handles]
    assert [s.id for s in results] == [h.id for h in handles]
    for snapshot in stored:
        assert snapshot.status is SnapshotStatus.COMPLETE
        assert set(snapshot.agents) == {"$env", *names}
        assert_consistent(snapshot)
        assert money_in(snapshot) == total, f"snapshot {snapshot.seq} lost or made money"
    final = sum(agent.state.balance for agent in runtime.agents.values())
    assert final == total
    # Going idle took a last snapshot: the final balances, with nothing in flight.
    assert (end.seq, end.initiator) == (len(handles) + 1, "$env")
    assert end.channels == []
    assert {name: end.agents[name].state["balance"] for name in names} == {
        name: runtime.agents[name].state.balance for name in names
    }


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
async def test_snapshots_under_seeded_interleavings_are_consistent(seed: int) -> None:
    scheduler = SeededScheduler(seed)
    policy = SnapshotPolicy(at_start=False)
    async with Runtime(scheduler=scheduler, snapshot_policy=policy) as runtime:
        names = add_ring(runtime, 4, 100)
        for i in range(60):
            runtime.send(names[i % 4], {"hops": 2 + i % 9}, kind="go")
            if i % 7 == 0:
                runtime.snapshot(initiator=[None, *names][i % 5])
            for _ in range(scheduler.random.randint(0, 6)):
                await scheduler.step()
        await runtime.run_until_idle()
        stored = await runtime.list_snapshots()

    assert len(stored) == 9 + 1  # and the last one, taken as the run went idle
    assert (stored[-1].initiator, stored[-1].channels) == ("$env", [])
    for snapshot in stored:
        assert_consistent(snapshot)
        assert money_in(snapshot) == 400
    # The schedule puts messages in flight across the cuts, so channel recording is exercised.
    assert sum(len(ch.messages) for s in stored for ch in s.channels) > 0


class SnapInHandler(Agent[LogState]):
    def __init__(self, name: str, *, send_first: bool = False) -> None:
        super().__init__(name)
        self.handles: list[SnapshotHandle] = []
        self.send_first = send_first

    async def handle(self, message: Message, ctx: Context[LogState]) -> None:
        self.state.count += 1
        if message.kind == "snap":
            if self.send_first:
                ctx.send("peer", {"sent": "before the call"})
            self.handles.append(ctx.snapshot())
            self.state.count += 100
            self.state.log.append("after the snapshot call")
            ctx.send("peer", {"sent": "after the call"})


async def test_ctx_snapshot_records_the_state_as_the_handler_returns() -> None:
    async with Runtime() as runtime:
        agent = SnapInHandler("agent")
        runtime.add(agent)
        runtime.add(Logger("peer"))
        snap = runtime.send("agent", kind="snap")
        later = runtime.send("agent", kind="later")
        async with asyncio.timeout(5):
            await runtime.run_until_idle()
            snapshot = await within(agent.handles[0])

    assert snapshot.initiator == "agent"
    cut = snapshot.agents["agent"]
    # Recorded as the handler returned, with everything it did: the message it handled is
    # consumed, and what it sent after the call is in flight.
    assert cut.state["count"] == 101
    assert cut.state["log"] == ["after the snapshot call"]
    assert cut.sent == {"peer": 1}
    assert cut.received == {"$env": 1}
    assert snap.id not in [m.id for m in snapshot.in_flight("$env", "agent")]
    assert [m.id for m in snapshot.in_flight("$env", "agent")] == [later.id]
    assert [m.payload for m in snapshot.in_flight("agent", "peer")] == [{"sent": "after the call"}]
    assert snapshot.agents["peer"].received.get("agent", 0) == 0
    assert_consistent(snapshot)
    assert agent.state.count == 102


async def test_ctx_snapshot_after_a_send_holds_every_message_of_the_handler_in_flight() -> None:
    async with Runtime() as runtime:
        agent = SnapInHandler("agent", send_first=True)
        runtime.add(agent)
        runtime.add(Logger("peer"))
        runtime.send("agent", kind="snap")
        later = runtime.send("agent", kind="later")
        async with asyncio.timeout(5):
            await runtime.run_until_idle()
            snapshot = await within(agent.handles[0])

    cut = snapshot.agents["agent"]
    # The messages sent before and after the call are both in flight.
    assert cut.state["count"] == 101
    assert cut.state["log"] == ["after the snapshot call"]
    assert cut.sent == {"peer": 2}
    assert cut.received == {"$env": 1}
    assert [m.id for m in snapshot.in_flight("$env", "agent")] == [later.id]
    assert [m.payload for m in snapshot.in_flight("agent", "peer")] == [
        {"sent": "before the call"},
        {"sent": "after the call"},
    ]
    assert snapshot.agents["peer"].received.get("agent", 0) == 0
    assert_consistent(snapshot)
    assert agent.state.count == 102


async def test_snapshot_from_the_program_names_its_initiator() -> None:
    async with Runtime() as runtime:
        runtime.add(Logger("alice"))
        by_runtime = await within(runtime.snapshot())
        by_alice = await within(runtime.snapshot(initiator="alice"))
    assert (by_runtime.seq, by_runtime.initiator) == (1, "$env")
    assert (by_alice.seq, by_alice.initiator) == (2, "alice")
    assert by_runtime.run_id == by_alice.run_id == runtime.run_id


async def test_the_first_input_takes_a_snapshot_before_it_is_sent() -> None:
    async with Runtime() as runtime:
        runtime.add(Logger("a"))
        runtime.add(Logger("b", LogState(log=["registered"], count=7)))
        runtime.add(Logger("idle"))
        registered = {name: a.state.model_dump(mode="json") for name, a in runtime.agents.items()}
        runtime.send("a", {"to": "b"})
        runtime.send("b", {"x": 1})
        await runtime.run_until_idle()
        start, end = await runtime.list_snapshots()  # and the one taken as the run went idle

    assert (start.seq, start.initiator, start.status) == (1, "$env", SnapshotStatus.COMPLETE)
    assert_consistent(start)
    assert {name: cut.state for name, cut in start.agents.items()} == {"$env": {}, **registered}
    assert start.agents["b"].state["log"] == ["registered"]
    # The cut precedes the first input: it is neither sent, received nor in flight.
    assert start.agents["$env"].sent == {"a": 0, "b": 0, "idle": 0}
    assert start.agents["a"].received == {"$env": 0}
    assert start.in_flight("$env", "a") == []
    assert start.channels == []
    assert runtime.agents["b"].state.count == 9
    assert (end.seq, end.initiator, end.status) == (2, "$env", SnapshotStatus.COMPLETE)
    assert end.agents["b"].state["count"] == 9

    async with Runtime(snapshot_policy=SnapshotPolicy(at_start=False)) as runtime:
        runtime.add(Logger("a"))
        runtime.send("a", {"x": 1})
        await runtime.run_until_idle()
        # None before the input: the only one was taken as the run went idle, after it.
        (end,) = await runtime.list_snapshots()
        assert (end.seq, end.initiator) == (1, "$env")
        assert end.agents["a"].received == {"$env": 1}
        assert runtime.agents["a"].state.count == 1


# -- snapshot policies --------------------------------------------------------------------------


async def run_token_ring(seed: int, policy: SnapshotPolicy, hops: int) -> tuple[Runtime, int]:
    runtime = Runtime(scheduler=SeededScheduler(seed), snapshot_policy=policy)
    names = ["r0", "r1", "r2", "r3"]
    async with runtime:
        for i, name in enumerate(names):
            runtime.add(TokenRing(name, names[(i + 1) % 4]))
        runtime.send("r0", {"hops": hops}, kind="token")
        runtime.send("r2", {"hops": hops}, kind="token")
        await runtime.run_until_idle()
    delivered = sum(ch.delivered for ch in bus_of(runtime).channels.values())
    return runtime, delivered


async def test_every_deliveries_policy_takes_one_snapshot_per_n_messages() -> None:
    # No snapshot at the end: whether one is taken depends on where the last cut fell.
    policy = SnapshotPolicy(
        every_deliveries=10, max_in_progress=1_000, at_start=False, at_end=False
    )
    runtime, delivered = await run_token_ring(3, policy, hops=60)
    assert delivered == 122
    snapshots = await runtime.list_snapshots()
    assert len(snapshots) == delivered // 10
    for snapshot in snapshots:
        assert snapshot.initiator == "$env"
        assert_consistent(snapshot)


async def test_every_deliveries_policy_skips_while_too_many_are_in_progress() -> None:
    policy = SnapshotPolicy(every_deliveries=5, at_start=False)
    runtime, delivered = await run_token_ring(3, policy, hops=60)
    snapshots = await runtime.list_snapshots()
    assert 1 <= len(snapshots) <= delivered // 5
    assert all(s.status is SnapshotStatus.COMPLETE for s in snapshots)
    # Deterministic under the seeded scheduler: the same seed takes the same snapshots.
    again, _ = await run_token_ring(3, policy, hops=60)
    assert len(await again.list_snapshots()) == len(snapshots)


async def test_every_seconds_policy_takes_snapshots_on_a_timer() -> None:
    runtime = Runtime(snapshot_policy=SnapshotPolicy(every_seconds=0.01, at_start=False))
    async with runtime:
        runtime.add(Logger("alice"))
        runtime.send("alice", {"x": 1})
        async with asyncio.timeout(5):
            while not await runtime.list_snapshots():  # noqa: ASYNC110
                await asyncio.sleep(0.005)
        await runtime.run_until_idle()
    snapshots = await runtime.list_snapshots()
    assert snapshots
    assert snapshots[0].initiator == "$env"
    assert snapshots[0].status is SnapshotStatus.COMPLETE
    assert_consistent(snapshots[0])
    # The timer stops with the runtime.
    count = len(snapshots)
    await asyncio.sleep(0.05)
    assert len(await runtime.list_snapshots()) == count


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"every_deliveries": 0}, "every_deliveries"),
        ({"every_deliveries": -5}, "every_deliveries"),
        ({"every_seconds": 0}, "every_seconds"),
        ({"every_seconds": -1.5}, "every_seconds"),
        ({"every_seconds": math.nan}, "every_seconds"),
        ({"max_in_progress": 0}, "max_in_progress"),
    ],
    ids=["deliveries-0", "deliveries-neg", "seconds-0", "seconds-neg", "seconds-nan", "max-0"],
)
def test_invalid_policy_values(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigurationError, match=field):
        SnapshotPolicy(**kwargs)


# -- agents that join while a snapshot is in progress ----------------------------------------------


async def test_an_agent_added_during_a_snapshot_is_part_of_it() -> None:
    scheduler = ScriptedScheduler()
    async with Runtime(scheduler=scheduler) as runtime:
        runtime.add(Logger("a"))
        runtime.add(Logger("b"))
        runtime.send("a", {"to": "b"})
        handle = runtime.snapshot()
        assert runtime.snapshots_in_progress == 1

        runtime.add(Logger("late"))
        runtime.add(Logger("idle"))  # joins, and is never sent anything
        assert runtime.snapshots_in_progress == 1
        # The newcomer talks to agents that have not recorded yet.
        runtime.send("late", {"to": "a", "times": 2})
        await scheduler.deliver("$env", "late")
        await scheduler.deliver("late", "a")  # a records before this message counts
        await scheduler.deliver("$env", "a")  # the message sent before the snapshot
        await scheduler.run_until_idle()
        await runtime.run_until_idle()
        snapshot = await within(handle)

    assert set(snapshot.agents) == {"$env", "a", "b", "late", "idle"}
    assert_consistent(snapshot)
    assert snapshot.agents["late"].state["count"] == 0
    assert snapshot.agents["idle"].state["count"] == 0
    assert snapshot.agents["a"].state["count"] == 0
    assert [m.id for m in snapshot.in_flight("$env", "a")] == ["$env>a#1"]
    assert runtime.agents["a"].state.count == 3
    assert runtime.agents["b"].state.count == 1


async def test_agents_added_during_a_snapshot_under_asyncio_keep_cuts_consistent() -> None:
    async with Runtime() as runtime:
        names = add_ring(runtime, 3, 100)
        handles: list[SnapshotHandle] = []
        for i in range(30):
            runtime.send(names[i % 3], {"hops": 5}, kind="go")
            handles.append(runtime.snapshot())
            if i % 10 == 5:
                # A teller joins the ring's traffic while snapshots are in progress.
                assert runtime.snapshots_in_progress > 0
                joiner = Teller(f"joiner-{i}", names[0], 50)
                runtime.add(joiner)
                runtime.send(joiner.name, {"hops": 4}, kind="go")
            await asyncio.sleep(0)
        async with asyncio.timeout(10):
            await runtime.run_until_idle()
            snapshots = [await within(handle) for handle in handles]
    for snapshot in snapshots:
        assert_consistent(snapshot)
        joined = [name for name in snapshot.agents if name.startswith("joiner-")]
        assert money_in(snapshot) == 300 + 50 * len(joined)
    assert {"joiner-5", "joiner-15", "joiner-25"} <= set(snapshots[-1].agents)


# -- the memory store ---------------------------------------------------------------------------


async def test_memory_store_keeps_an_unchanged_state_once() -> None:
    store = MemoryStore()
    async with Runtime(store=store) as runtime:
        runtime.add(Logger("still"))
        await within(runtime.snapshot())
        after_first = store.blob_count
        assert after_first == 2  # the environment's "{}" and the agent's state
        for _ in range(5):
            await within(runtime.snapshot())
        assert store.blob_count == after_first

        # The first input takes the start snapshot (number 7): nothing new to keep. Going idle
        # takes number 8, which keeps the changed state; the two after it, nothing new.
        runtime.send("still", {"x": 1})
        await runtime.run_until_idle()
        assert store.blob_count == after_first + 1
        await within(runtime.snapshot())
        assert store.blob_count == after_first + 1
        await within(runtime.snapshot())
        assert store.blob_count == after_first + 1

        snapshots = await runtime.list_snapshots()
    assert len(snapshots) == 10
    assert len({s.agents["still"].state_hash for s in snapshots}) == 2
    assert snapshots[0].agents["still"].state["count"] == 0
    assert snapshots[6].agents["still"].state["count"] == 0
    assert snapshots[7].initiator == "$env"
    assert snapshots[7].agents["still"].state["count"] == 1
    assert snapshots[-1].agents["still"].state["count"] == 1


async def test_list_snapshots_in_the_order_they_were_started() -> None:
    store = MemoryStore()
    async with Runtime(store=store, run_id="run-one") as first:
        first.add(Logger("a"))
        first.add(Logger("b"))
        handles = [first.snapshot(initiator=name) for name in (None, "a", "b", None, "b")]
        results = [await within(handle) for handle in handles]
    async with Runtime(store=store, run_id="run-two") as second:
        second.add(Logger("a"))
        await within(second.snapshot())

    listed = await store.list_snapshots("run-one")
    assert [s.seq for s in listed] == [1, 2, 3, 4, 5]
    assert [s.id for s in listed] == [h.id for h in handles]
    assert [s.initiator for s in listed] == ["$env", "a", "b", "$env", "b"]
    assert listed == results
    assert await first.list_snapshots() == listed
    assert [s.run_id for s in await store.list_snapshots("run-two")] == ["run-two"]
    assert [run.id for run in await store.list_runs()] == ["run-one", "run-two"]
    assert (await store.get_run("run-one")).id == "run-one"


async def test_unknown_ids_raise_not_found() -> None:
    store = MemoryStore()
    async with Runtime(store=store) as runtime:
        runtime.add(Logger("a"))
        await within(runtime.snapshot())
    with pytest.raises(NotFoundError, match=r"no snapshot with id 'missing'") as info:
        await store.load_snapshot("missing")
    assert isinstance(info.value, LookupError)
    assert (info.value.what, info.value.ident) == ("snapshot", "missing")
    with pytest.raises(NotFoundError, match=r"no run with id 'missing'"):
        await store.get_run("missing")
    with pytest.raises(NotFoundError, match=r"no run with id 'missing'"):
        await store.list_snapshots("missing")


# -- snapshot records are JSON ----------------------------------------------------------------


async def test_snapshot_round_trips_through_json() -> None:
    scheduler = ScriptedScheduler()
    async with Runtime(scheduler=scheduler, metadata={"test": "round trip"}) as runtime:
        runtime.add(Logger("a"))
        runtime.add(Logger("b"))
        runtime.send("a", {"to": "b", "times": 2}, headers={"trace": "abc"})
        handle = runtime.snapshot()
        await scheduler.deliver("$env", "b")  # b records first
        await scheduler.deliver("$env", "a")  # a sends two messages to b, unrecorded yet
        await scheduler.deliver("$env", "a")  # marker: a records
        await scheduler.run_until_idle()
        snapshot = await within(handle)
        stored = await runtime.store.load_snapshot(snapshot.id)

    assert [m.id for m in snapshot.in_flight("a", "b")] == ["a>b#1", "a>b#2"]
    assert_consistent(snapshot)
    # Reading the decoded state (a cached property) must not change equality.
    assert snapshot.agents["a"].state["count"] == 1

    text = snapshot.model_dump_json()
    assert isinstance(json.loads(text), dict)
    again = Snapshot.model_validate_json(text)
    assert again == snapshot
    assert again.model_dump_json() == text
    assert again.agents["a"].state == snapshot.agents["a"].state
    assert stored == snapshot


async def test_failed_snapshot_round_trips_through_json() -> None:
    runtime = Runtime(scheduler=ScriptedScheduler())
    runtime.add(Logger("a"))
    await runtime.start()
    handle = runtime.snapshot()
    await runtime.close()
    (failed,) = await runtime.list_snapshots()
    assert failed.id == handle.id
    assert Snapshot.model_validate_json(failed.model_dump_json()) == failed


# -- the context --------------------------------------------------------------------------------


class Inspector(Agent[LogState]):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.seen: list[dict[str, Any]] = []

    async def handle(self, message: Message, ctx: Context[LogState]) -> None:
        self.seen.append(
            {
                "message_is_current": ctx.message is message,
                "feedback": ctx.feedback,
                "run_id": ctx.run_id,
                "agent": ctx.agent,
                "state_is_mine": ctx.state is self.state,
            }
        )
        if message.kind == "complain":
            ctx.add_feedback("too slow", "validator")


async def test_context_tells_the_handler_what_it_needs() -> None:
    async with Runtime(run_id="ctx-run") as runtime:
        inspector = Inspector("inspector")
        runtime.add(inspector)
        runtime.send("inspector", kind="complain")
        runtime.send("inspector", kind="look")
        await runtime.run_until_idle()

    assert runtime.run_id == "ctx-run"
    first, second = inspector.seen
    assert first["feedback"] == ()
    assert second["feedback"] == (Feedback(reason="too slow", source="validator"),)
    for seen in (first, second):
        assert seen["message_is_current"] is True
        assert seen["run_id"] == runtime.run_id
        assert seen["agent"] is inspector
        assert seen["state_is_mine"] is True


async def test_generated_run_id_is_passed_to_handlers() -> None:
    async with Runtime() as runtime:
        inspector = Inspector("inspector")
        runtime.add(inspector)
        runtime.send("inspector")
        await runtime.run_until_idle()
        run = await runtime.store.get_run(runtime.run_id)
    assert len(runtime.run_id) == 32
    assert inspector.seen[0]["run_id"] == runtime.run_id == run.id
