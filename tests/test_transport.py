"""The bus's seams: a transport of one's own carries every guarantee, observers see the traffic.

The runtime reaches channels only through the ``Channel`` protocol, so a transport whose
channels keep their items elsewhere (here: a plain list, and a count of every operation) runs
the snapshot protocol, rollbacks and the journal unchanged, on the default scheduler.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterator
from typing import Any, ClassVar

from agentsnap import Agent, AgentState, Context, Message, Runtime
from agentsnap.bus import AsyncioScheduler, Bus, BusObserver, Channel, Endpoint
from agentsnap.exceptions import SnapshotFailed
from agentsnap.journal import read_journal
from agentsnap.messages import Marker
from agentsnap.records import SnapshotStatus
from agentsnap.rollback import RetryPolicy
from agentsnap.store.sql import SqlStore
from agentsnap.testing import assert_consistent, bus_of

Item = Message | Marker


class ListChannel:
    """A channel on a list, counting what is done to it."""

    # False: every channel takes its snapshot markers, as a channel between processes does.
    in_process: ClassVar[bool] = False

    def __init__(self, src: str, dst: str, receiver: Endpoint, closed: int) -> None:
        self.src = src
        self.dst = dst
        self.receiver = receiver
        self.closed = closed
        self.sent = 0
        self.delivered = 0
        self.items: list[Item] = []
        self.appended = 0
        self.taken = 0

    def append(self, item: Item, /) -> None:
        self.appended += 1
        self.items.append(item)

    def take(self) -> Item:
        self.taken += 1
        return self.items.pop(0)

    def clear(self) -> None:
        self.items.clear()

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self) -> Iterator[Item]:
        return iter(list(self.items))

    def __getitem__(self, index: int, /) -> Item:
        return self.items[index]


class ListTransport:
    def __init__(self) -> None:
        self.made: list[ListChannel] = []

    def bind(self, bus: Bus) -> None:
        return None

    def channel(self, src: str, dst: str, receiver: Endpoint, closed: int) -> Channel:
        channel = ListChannel(src, dst, receiver, closed)
        self.made.append(channel)
        return channel


class Ledger(AgentState):
    balance: int = 100


class Teller(Agent[Ledger]):
    """Moves money to its peers; a transfer of more than 30 is rejected by a check."""

    peers: tuple[str, ...] = ()

    async def handle(self, message: Message, ctx: Context[Ledger]) -> None:
        payload = message.payload
        assert isinstance(payload, dict)
        amount = payload["amount"]
        assert isinstance(amount, int)
        if message.kind == "credit":
            self.state.balance += amount
            return
        self.state.balance -= amount
        await asyncio.sleep(0)
        to = payload["to"]
        assert isinstance(to, str)
        ctx.send(to, {"amount": amount}, kind="credit")


def tellers(runtime: Runtime, names: list[str]) -> list[Teller]:
    made = []
    for name in names:
        teller = Teller(name)
        teller.peers = tuple(n for n in names if n != name)
        made.append(runtime.add(teller))
    return made


async def test_a_transport_of_ones_own_carries_snapshots_and_rollbacks() -> None:
    transport = ListTransport()
    names = ["t0", "t1", "t2", "t3"]
    failed_once: set[int] = set()

    def small(message: Message) -> bool | str:
        assert isinstance(message.payload, dict)
        amount = message.payload["amount"]
        assert isinstance(amount, int)
        if amount > 30 and amount not in failed_once:
            failed_once.add(amount)
            return f"{amount} is more than 30"
        return True

    async with Runtime(transport=transport, retry=RetryPolicy.attempts(3)) as runtime:
        made = tellers(runtime, names)
        runtime.check("t1", kind="credit", check=small, name="small")
        snapshots = []
        for batch in range(4):
            for i in range(batch * 10, batch * 10 + 10):
                src, dst = names[i % 4], names[(i + 1) % 4]
                runtime.send(src, {"amount": 5 + (i * 7) % 31, "to": dst}, kind="transfer")
            handle = runtime.snapshot(initiator=names[batch])  # taken while messages fly
            await runtime.run_until_idle()
            try:
                snapshots.append(await handle)
            except SnapshotFailed:  # a rollback discards the snapshots in progress
                continue
        total = sum(teller.state.balance for teller in made)

    assert total == 400, "money was made or lost"
    assert failed_once, "the check never rejected anything: the rollback path was not run"
    assert {(c.src, c.dst) for c in transport.made} == set(bus_of(runtime).channels)
    assert all(isinstance(c, ListChannel) for c in bus_of(runtime).channels.values())
    assert sum(c.taken for c in transport.made) > 0
    assert all(not c.items for c in transport.made), "items were left on a channel"
    assert snapshots, "no snapshot completed"
    for snapshot in snapshots:
        assert snapshot.status is SnapshotStatus.COMPLETE
        assert_consistent(snapshot)


class Recorder(BusObserver):
    """A bus observer that writes down what it sees."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    def on_send(self, channel: Channel, message: Message) -> Message:
        self.events.append(("send", message.id))
        return message

    def on_enqueue(self, channel: Channel, message: Message) -> None:
        self.events.append(("enqueue", message.id))

    def on_deliver(self, channel: Channel, message: Message) -> None:
        assert channel.delivered == message.seq, "delivered before it was counted"
        self.events.append(("deliver", message.id))


class Echo(Agent[AgentState]):
    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        if ctx.agent.name == "a":
            ctx.send("b", message.payload)


async def test_an_observer_sees_every_send_and_delivery_in_order() -> None:
    recorder = Recorder()
    async with Runtime() as runtime:
        runtime.add(Echo("a"))
        runtime.add(Echo("b"))
        bus_of(runtime).observe(recorder)
        runtime.send("a", 1)
        await runtime.run_until_idle()
        bus_of(runtime).unobserve(recorder)
        runtime.send("a", 2)
        await runtime.run_until_idle()
    assert recorder.events == [
        ("send", "$env>a#1"),
        ("enqueue", "$env>a#1"),
        ("deliver", "$env>a#1"),
        ("send", "a>b#1"),
        ("enqueue", "a>b#1"),
        ("deliver", "a>b#1"),
    ]


async def test_a_hold_stops_deliveries_until_it_is_released_whatever_resume_says() -> None:
    recorder = Recorder()
    async with Runtime() as runtime:
        runtime.add(Echo("a"))
        runtime.add(Echo("b"))
        bus = bus_of(runtime)
        scheduler = bus.scheduler
        assert isinstance(scheduler, AsyncioScheduler)
        bus.observe(recorder)
        scheduler.start()
        scheduler.hold("lease")
        scheduler.pause()
        runtime.send("a", 1)
        scheduler.resume()  # the hold is still in place
        for _ in range(20):
            await asyncio.sleep(0)
        assert [e for e in recorder.events if e[0] == "deliver"] == []
        assert scheduler.held() == {"lease"}
        scheduler.release("lease")
        await runtime.run_until_idle()
        assert scheduler.held() == set()
        # A pause outlives a release: delivery goes on once both are taken back.
        scheduler.pause()
        scheduler.hold("lease")
        scheduler.release("lease")
        runtime.send("a", 2)
        for _ in range(20):
            await asyncio.sleep(0)
        assert len([e for e in recorder.events if e[0] == "deliver"]) == 2
        scheduler.resume()
        await runtime.run_until_idle()
    assert [ref for kind, ref in recorder.events if kind == "deliver"] == [
        "$env>a#1",
        "a>b#1",
        "$env>a#2",
        "a>b#2",
    ]


async def test_a_held_output_is_seen_as_sent_but_enqueued_only_once_it_passes(
    tmp_path: Any,
) -> None:
    """With self-evaluation, what a handler sends is visible only once the evaluation passed;
    the journal (itself an observer) records only what became visible."""

    class Judged(Agent[AgentState]):
        async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
            ctx.send("sink", message.payload)

        async def evaluate(self, outputs: Any, ctx: Context[AgentState]) -> bool:
            return bool(outputs[0].payload != "bad" or ctx.feedback)

    class Sink(Agent[AgentState]):
        async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
            return None

    recorder = Recorder()
    store = SqlStore(f"sqlite:///{tmp_path / 'run.db'}")
    try:
        async with Runtime(store=store) as runtime:
            runtime.add(Judged("judged"))
            runtime.add(Sink("sink"))
            bus_of(runtime).observe(recorder)
            runtime.send("judged", "bad")
            await runtime.run_until_idle()
        journal = read_journal(await store.load_journal(runtime.run_id))
    finally:
        await store.close()
    sent = [event for event in recorder.events if event[1].startswith("judged>")]
    # Rejected once (sent, never enqueued), then redone after the rollback and passed.
    assert sent.count(("send", "judged>sink#1")) == 2
    assert sent.count(("enqueue", "judged>sink#1")) == 1
    assert [(m.src, m.dst, m.seq) for m in journal if m.src == "judged"] == [("judged", "sink", 1)]


class Deliveries(BusObserver):
    """Overrides one hook only."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def on_deliver(self, channel: Channel, message: Message) -> None:
        self.seen.append(message.id)


async def test_the_bus_calls_only_the_hooks_an_observer_overrides() -> None:
    deliveries, recorder = Deliveries(), Recorder()
    async with Runtime() as runtime:
        runtime.add(Echo("a"))
        runtime.add(Echo("b"))
        bus_of(runtime).observe(deliveries)
        first = bus_of(runtime).on_deliver
        bus_of(runtime).observe(recorder)
        runtime.send("a", 1)
        await runtime.run_until_idle()
        bus_of(runtime).unobserve(deliveries)
        bus_of(runtime).unobserve(recorder)
        last = bus_of(runtime).on_deliver
    assert first == deliveries.on_deliver, "one observer's hook is called directly"
    assert last is None, "no observer left: nothing to call"
    assert deliveries.seen == ["$env>a#1", "a>b#1"]
    assert [event for event in recorder.events if event[0] == "deliver"] == [
        ("deliver", "$env>a#1"),
        ("deliver", "a>b#1"),
    ]


async def _replay_plan_run(b_sends: bool) -> tuple[list[str], int]:
    """Agent ``a`` must first take ``b``'s message #1; ``$env`` sends to ``a`` and ``b``.

    ``b``'s handler awaits a moment, then sends that message if ``b_sends``. Returns the
    messages ``a`` took, in order, and how many times the bus declared the plan stuck.
    """
    bus = Bus(AsyncioScheduler())
    b = bus.add("b", 0)  # b's handler starts first, and awaits while a looks at its plan
    a = bus.add("a", 0)
    taken: list[str] = []
    stalls: list[None] = []

    def stalled() -> None:
        stalls.append(None)
        bus.abandon_replay()

    async def deliver(channel: Channel) -> None:
        message = channel.take()
        assert type(message) is Message
        bus.delivered(channel, message)
        receiver = channel.receiver
        plan = receiver.replay
        if plan and plan[0] == (message.src, message.seq):
            plan.popleft()
        if receiver is a:
            taken.append(f"{message.src}#{message.seq}")
        elif b_sends:
            await asyncio.sleep(0.01)
            bus.send(b, "a", "planned", "message", None)

    bus.replay_stalled = stalled
    bus.scheduler.bind(bus, deliver)
    a.replay = deque([("b", 1)])
    bus.send(bus.environment, "a", "input", "message", None)
    bus.send(bus.environment, "b", "input", "message", None)
    try:
        await bus.scheduler.run_until_idle()
    finally:
        await bus.scheduler.close()
    return taken, len(stalls)


async def test_a_replay_plan_waits_for_its_message_while_a_handler_may_still_send_it() -> None:
    taken, stalls = await _replay_plan_run(b_sends=True)
    assert taken == ["b#1", "$env#1"], "the planned message first, though the input was there"
    assert stalls == 0


async def test_a_replay_plan_no_message_can_fulfil_is_given_up_once_nothing_runs() -> None:
    taken, stalls = await _replay_plan_run(b_sends=False)
    assert taken == ["$env#1"], "the process takes its messages in any order again"
    assert stalls == 1


async def test_closing_the_scheduler_ends_a_delivery_a_rollback_interrupted() -> None:
    """A rollback interrupts a handler that first finishes what it does (as a side-effecting
    tool call does), and the scheduler closes meanwhile (its worker stops): both cancellations
    arrive as one ``CancelledError``, and ``close()`` must still end the delivery's task."""
    bus = Bus(AsyncioScheduler())
    a = bus.add("a", 0)
    started = asyncio.Event()
    finish = asyncio.Event()

    async def deliver(channel: Channel) -> None:
        message = channel.take()
        assert type(message) is Message
        bus.delivered(channel, message)
        a.busy = True
        try:
            started.set()
            try:
                await finish.wait()
            except asyncio.CancelledError:
                await finish.wait()  # the call in progress ends first
                raise
        finally:
            a.busy = False

    bus.scheduler.bind(bus, deliver)
    bus.send(bus.environment, "a", "input", "message", None)
    bus.scheduler.start()
    await started.wait()
    assert bus.scheduler.interrupt(a)
    closing = asyncio.ensure_future(bus.scheduler.close())
    await asyncio.sleep(0)
    finish.set()
    # Bounded only so that the failure is a test failure, not a hang.
    await asyncio.wait_for(closing, 30)
