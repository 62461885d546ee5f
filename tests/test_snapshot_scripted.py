"""The textbook cases of Chandy-Lamport snapshots, replayed delivery by delivery.

Each test drives a `ScriptedScheduler` by hand: ``await scheduler.deliver(src, dst)`` takes
exactly the next item (a message or a marker) off the channel ``src -> dst``. Accounts start
with 100; a ``pay`` message from the environment makes an account send ``amount`` to ``to``
as a ``transfer``, which the receiver adds to its balance.

The runs take no start snapshot (``SnapshotPolicy(at_start=False)``): the only snapshots
are the ones each test starts, numbered from 1, and the only markers are theirs.
"""

from __future__ import annotations

from payloads import get

from agentsnap import (
    ENVIRONMENT,
    Agent,
    AgentState,
    Context,
    Marker,
    Message,
    Runtime,
    Snapshot,
    SnapshotPolicy,
    SnapshotStatus,
)
from agentsnap.testing import ScriptedScheduler, bus_of, cut_problems

ENV = ENVIRONMENT


class AccountState(AgentState):
    balance: int = 100


class Account(Agent[AccountState]):
    async def handle(self, message: Message, ctx: Context[AccountState]) -> None:
        if message.kind == "pay":
            amount = get(message.payload, "amount", int)
            self.state.balance -= amount
            ctx.send(get(message.payload, "to", str), {"amount": amount}, kind="transfer")
        elif message.kind == "transfer":
            self.state.balance += get(message.payload, "amount", int)


def pay(runtime: Runtime, src: str, dst: str, amount: int) -> Message:
    """Queue work on ``$env -> src``: when delivered, ``src`` sends ``amount`` to ``dst``."""
    return runtime.send(src, {"to": dst, "amount": amount}, kind="pay")


def balances(snapshot: Snapshot) -> dict[str, int]:
    return {
        name: get(cut.state, "balance", int) for name, cut in snapshot.agents.items() if name != ENV
    }


def in_flight(snapshot: Snapshot, src: str, dst: str) -> list[tuple[int, str, object]]:
    """``(seq, kind, payload)`` of each message recorded in flight on ``src -> dst``."""
    return [(m.seq, m.kind, m.payload) for m in snapshot.in_flight(src, dst)]


def money(snapshot: Snapshot) -> int:
    total = sum(balances(snapshot).values())
    for channel in snapshot.channels:
        total += sum(
            get(m.payload, "amount", int) for m in channel.messages if m.kind == "transfer"
        )
    return total


def scripted_runtime(scheduler: ScriptedScheduler) -> Runtime:
    """A runtime driven by ``scheduler`` that takes only the snapshots the test starts."""
    return Runtime(scheduler=scheduler, snapshot_policy=SnapshotPolicy(at_start=False))


def kinds(items: list[Message | Marker]) -> list[str]:
    """Queue contents as readable tags: message kinds, and ``marker:k`` for markers."""
    return [f"marker:{item.snapshot}" if isinstance(item, Marker) else item.kind for item in items]


async def test_message_in_flight_across_the_cut_is_in_the_channel_state() -> None:
    scheduler = ScriptedScheduler()
    async with scripted_runtime(scheduler) as runtime:
        runtime.add(Account("A"))
        runtime.add(Account("B"))
        pay(runtime, "A", "B", 10)
        await scheduler.deliver(ENV, "A")  # A sends m (seq 1) before recording
        assert runtime.agents["A"].state.balance == 90

        handle = runtime.snapshot(initiator="A")  # A records now: balance 90, sent 1
        assert kinds(scheduler.queued("A", "B")) == ["transfer", "marker:1"]
        await scheduler.deliver(ENV, "B")  # B takes $env's marker: records balance 100
        item = await scheduler.deliver("A", "B")  # m reaches B after B's recording
        assert isinstance(item, Message)
        assert item.seq == 1
        assert item.epoch == 0
        assert runtime.agents["B"].state.balance == 110
        # Both ends of every channel had recorded when B did, with the markers on them: the
        # channels closed then, m recorded in flight on A>B, without waiting for the markers
        # to be taken.
        assert runtime.snapshots_in_progress == 0
        await scheduler.deliver("A", "B")  # A's marker: A>B is closed already
        await scheduler.deliver(ENV, "A")  # $env's marker: $env>A too
        snapshot = await handle

    assert snapshot.status is SnapshotStatus.COMPLETE
    assert snapshot.initiator == "A"
    assert cut_problems(snapshot) == []
    assert balances(snapshot) == {"A": 90, "B": 100}
    assert snapshot.agents["A"].sent == {"B": 1}
    assert snapshot.agents["A"].received == {ENV: 1}
    assert snapshot.agents["B"].received == {ENV: 0, "A": 0}
    assert snapshot.agents[ENV].sent == {"A": 1, "B": 0}
    assert in_flight(snapshot, "A", "B") == [(1, "transfer", {"amount": 10})]
    assert [c.src + ">" + c.dst for c in snapshot.channels] == ["A>B"]
    assert money(snapshot) == 200


async def test_message_sent_after_the_senders_cut_is_not_in_the_channel_state() -> None:
    scheduler = ScriptedScheduler()
    async with scripted_runtime(scheduler) as runtime:
        runtime.add(Account("A"))
        runtime.add(Account("B"))
        pay(runtime, "A", "B", 10)
        await scheduler.deliver(ENV, "A")
        await scheduler.deliver("A", "B")  # m1 received before any snapshot

        handle = runtime.snapshot(initiator="A")  # A records: balance 90, sent {B: 1}
        pay(runtime, "A", "B", 20)  # $env sends after its own cut: epoch 1
        assert kinds(scheduler.queued(ENV, "A")) == ["marker:1", "pay"]
        await scheduler.deliver(ENV, "A")  # marker
        await scheduler.deliver(ENV, "A")  # A sends m2 after its cut
        assert runtime.agents["A"].state.balance == 70
        (m2,) = [m for m in scheduler.queued("A", "B") if isinstance(m, Message)]
        assert (m2.seq, m2.epoch) == (2, 1)
        # A>B held nothing when A recorded: it closed then, with no marker put on it, and m2
        # (epoch 1) tells B to record before it counts.
        assert kinds(scheduler.queued("A", "B")) == ["transfer"]
        assert bus_of(runtime).channels["A", "B"].closed == 1

        await scheduler.deliver(ENV, "B")  # B records: balance 110, received {A: 1}
        assert runtime.snapshots_in_progress == 0  # every channel closed: complete
        await scheduler.deliver("A", "B")  # m2 arrives after the cut on both sides
        assert runtime.agents["B"].state.balance == 130
        assert bus_of(runtime).channels["A", "B"].sent == 2
        assert bus_of(runtime).channels[ENV, "A"].sent == 2
        snapshot = await handle

    assert cut_problems(snapshot) == []
    assert balances(snapshot) == {"A": 90, "B": 110}
    assert snapshot.agents["A"].sent == {"B": 1}  # m2 does not count
    assert snapshot.agents["B"].received == {ENV: 0, "A": 1}
    assert snapshot.agents[ENV].sent == {"A": 1, "B": 0}  # the second pay does not count
    assert snapshot.channels == []
    assert in_flight(snapshot, "A", "B") == []
    assert money(snapshot) == 200


async def test_message_sent_after_the_cut_on_a_new_channel_does_not_hold_the_snapshot() -> None:
    # A records, then opens A>B. The channel starts closed for the snapshot: nothing sent on
    # it can be in flight, so the snapshot completes while A's message is still queued.
    scheduler = ScriptedScheduler()
    async with scripted_runtime(scheduler) as runtime:
        runtime.add(Account("A"))
        runtime.add(Account("B"))
        handle = runtime.snapshot(initiator="A")
        pay(runtime, "A", "B", 10)
        await scheduler.deliver(ENV, "A")  # marker
        await scheduler.deliver(ENV, "A")  # A sends m on a channel created after its cut
        assert bus_of(runtime).channels["A", "B"].closed == 1
        assert kinds(scheduler.queued("A", "B")) == ["transfer"]
        await scheduler.deliver(ENV, "B")  # B records: balance 100
        assert runtime.snapshots_in_progress == 0
        assert kinds(scheduler.queued("A", "B")) == ["transfer"]
        snapshot = await handle
        await runtime.run_until_idle()
        assert runtime.agents["B"].state.balance == 110

    assert cut_problems(snapshot) == []
    assert balances(snapshot) == {"A": 100, "B": 100}
    assert snapshot.agents["A"].sent == {}
    assert snapshot.agents["B"].received == {ENV: 0, "A": 0}
    assert snapshot.channels == []
    assert money(snapshot) == 200


async def test_no_message_is_counted_both_in_a_state_and_in_a_channel() -> None:
    scheduler = ScriptedScheduler()
    async with scripted_runtime(scheduler) as runtime:
        runtime.add(Account("A"))
        runtime.add(Account("B"))
        pay(runtime, "A", "B", 10)
        pay(runtime, "A", "B", 20)
        await scheduler.deliver(ENV, "A")
        await scheduler.deliver(ENV, "A")  # A>B holds m1 (10) and m2 (20); A has 70
        await scheduler.deliver("A", "B")  # B takes m1: 110

        handle = runtime.snapshot(initiator="B")  # B records: balance 110, received {A: 1}
        await scheduler.deliver("A", "B")  # m2: sent before A records, after B did
        assert runtime.agents["B"].state.balance == 130
        await scheduler.deliver(ENV, "A")  # A records: balance 70, sent {B: 2}
        # B took m2 already and has recorded: A>B holds nothing of A's old epoch, so it
        # closes at once, with no marker, and the snapshot is complete.
        assert kinds(scheduler.queued("A", "B")) == []
        assert runtime.snapshots_in_progress == 0
        await scheduler.deliver(ENV, "B")  # $env's marker: $env>B was closed already
        snapshot = await handle

    assert cut_problems(snapshot) == []
    assert balances(snapshot) == {"A": 70, "B": 110}
    assert snapshot.agents["A"].sent == {"B": 2}
    assert snapshot.agents["B"].received == {ENV: 0, "A": 1}
    # m1 is in B's state (received 1, balance 110) and only there; m2 only on the channel.
    assert in_flight(snapshot, "A", "B") == [(2, "transfer", {"amount": 20})]
    received = snapshot.agents["B"].received["A"]
    assert all(m.seq > received for m in snapshot.in_flight("A", "B"))
    assert [m.id for m in snapshot.in_flight("A", "B")] == ["A>B#2"]
    assert money(snapshot) == 200


async def test_message_from_a_recorded_sender_acts_as_the_marker() -> None:
    scheduler = ScriptedScheduler()
    async with scripted_runtime(scheduler) as runtime:
        runtime.add(Account("A"))
        runtime.add(Account("B"))
        handle = runtime.snapshot(initiator="A")  # A records balance 100
        pay(runtime, "A", "B", 10)
        await scheduler.deliver(ENV, "A")  # marker
        await scheduler.deliver(ENV, "A")  # A sends m (epoch 1) on a new channel to B
        (m,) = scheduler.queued("A", "B")  # no marker ahead of it: the channel is new
        assert isinstance(m, Message)
        assert m.epoch == 1
        assert kinds(scheduler.queued(ENV, "B")) == ["marker:1"]  # B has not recorded

        await scheduler.deliver("A", "B")  # B records *before* handling m
        assert runtime.agents["B"].state.balance == 110
        assert bus_of(runtime).endpoints["B"].epoch == 1
        # $env>B carries $env's marker and both its ends have recorded: closed at once.
        assert runtime.snapshots_in_progress == 0
        await scheduler.deliver(ENV, "B")
        snapshot = await handle

    assert cut_problems(snapshot) == []
    assert balances(snapshot) == {"A": 100, "B": 100}  # m is in neither state
    assert snapshot.agents["A"].sent == {}
    assert snapshot.agents["B"].received == {ENV: 0, "A": 0}
    assert in_flight(snapshot, "A", "B") == []  # nor in the channel: it is after the cut
    assert snapshot.channels == []
    assert money(snapshot) == 200


async def test_concurrent_snapshots_do_not_interfere() -> None:
    scheduler = ScriptedScheduler()
    async with scripted_runtime(scheduler) as runtime:
        for name in ("A", "B", "C"):
            runtime.add(Account(name))
        pay(runtime, "A", "B", 10)
        pay(runtime, "C", "B", 5)
        await scheduler.deliver(ENV, "A")  # A: 90, A>B holds a1 (10)
        await scheduler.deliver(ENV, "C")  # C: 95, C>B holds c1 (5)

        first = runtime.snapshot(initiator="A")  # $env and A record snapshot 1
        pay(runtime, "C", "B", 7)  # after $env's cut 1, before its cut 2
        await scheduler.deliver(ENV, "B")  # B records 1: balance 100
        await scheduler.deliver("C", "B")  # c1: in flight for 1; B: 105

        second = runtime.snapshot(initiator="C")  # C records 1 and 2 at once: balance 95
        assert (first.seq, second.seq) == (1, 2)
        assert bus_of(runtime).endpoints["C"].epoch == 2
        # B took c1 already: C>B holds nothing of C's old epoch, so it closes for 1 and 2 at
        # once, with no marker put on it.
        assert kinds(scheduler.queued("C", "B")) == []
        assert bus_of(runtime).channels["C", "B"].closed == 2
        # Every process has recorded 1, and every channel is closed for 1 or has marker 1 on
        # it: snapshot 1 is complete before any is taken. $env>C is closed for 2 as well,
        # with pay 7 (between its markers 1 and 2) in flight for 2.
        assert runtime.snapshots_in_progress == 1
        await scheduler.deliver("A", "B")  # a1: in flight for 1 only (B recorded 1, not 2)
        await scheduler.deliver(ENV, "C")  # marker 1
        await scheduler.deliver(ENV, "C")  # pay 7
        assert runtime.agents["C"].state.balance == 88
        await scheduler.deliver("A", "B")  # marker 1
        await scheduler.deliver("C", "B")  # c2 (7), epoch 2: B records 2 first, with 115
        assert runtime.agents["B"].state.balance == 122
        assert runtime.snapshots_in_progress == 1  # A has not recorded 2
        await scheduler.deliver(ENV, "A")  # marker 1
        assert runtime.snapshots_in_progress == 1
        await scheduler.deliver(ENV, "A")  # marker 2: A records 2; A>B is empty, closed at once
        assert runtime.snapshots_in_progress == 0
        await scheduler.deliver(ENV, "B")  # marker 2
        await scheduler.deliver(ENV, "C")  # marker 2
        assert not any(bus_of(runtime).channels.values())
        one, two = await first, await second

    assert (one.initiator, two.initiator) == ("A", "C")
    assert cut_problems(one) == []
    assert cut_problems(two) == []

    assert balances(one) == {"A": 90, "B": 100, "C": 95}
    assert one.agents[ENV].sent == {"A": 1, "B": 0, "C": 1}
    assert one.agents["B"].received == {ENV: 0, "A": 0, "C": 0}
    assert in_flight(one, "A", "B") == [(1, "transfer", {"amount": 10})]
    assert in_flight(one, "C", "B") == [(1, "transfer", {"amount": 5})]
    assert [(c.src, c.dst) for c in one.channels] == [("A", "B"), ("C", "B")]
    assert money(one) == 300

    assert balances(two) == {"A": 90, "B": 115, "C": 95}
    assert two.agents[ENV].sent == {"A": 1, "B": 0, "C": 2}
    assert two.agents["B"].received == {ENV: 0, "A": 1, "C": 1}
    assert two.agents["C"].received == {ENV: 1}
    assert in_flight(two, ENV, "C") == [(2, "pay", {"to": "B", "amount": 7})]
    assert [(c.src, c.dst) for c in two.channels] == [(ENV, "C")]
    assert money(two) == 300

    # C recorded both snapshots at the same point; A's state did not change in between.
    c1, c2 = one.agents["C"], two.agents["C"]
    assert (c1.state_json, c1.sent, c1.received) == (c2.state_json, c2.sent, c2.received)
    assert one.agents["A"].state_hash == two.agents["A"].state_hash
    assert one.agents["A"].sent == two.agents["A"].sent == {"B": 1}


async def test_snapshot_completes_when_agents_never_talked() -> None:
    scheduler = ScriptedScheduler()
    async with scripted_runtime(scheduler) as runtime:
        for name in ("A", "B", "C"):
            runtime.add(Account(name))
        assert set(bus_of(runtime).channels) == {(ENV, "A"), (ENV, "B"), (ENV, "C")}

        by_runtime = runtime.snapshot()
        by_agent = runtime.snapshot(initiator="B")
        for name in ("A", "B", "C"):
            assert kinds(scheduler.queued(ENV, name)) == ["marker:1", "marker:2"]
        await scheduler.deliver(ENV, "A")
        await scheduler.deliver(ENV, "B")
        assert runtime.snapshots_in_progress == 2  # C has not recorded 1
        await scheduler.deliver(ENV, "C")
        assert runtime.snapshots_in_progress == 1  # snapshot 1 done: every marker 1 in
        for name in ("A", "B", "C"):
            await scheduler.deliver(ENV, name)
        assert runtime.snapshots_in_progress == 0
        assert set(bus_of(runtime).channels) == {(ENV, "A"), (ENV, "B"), (ENV, "C")}
        snapshots = [await by_runtime, await by_agent]

    assert [s.initiator for s in snapshots] == [ENV, "B"]
    for snapshot in snapshots:
        assert snapshot.status is SnapshotStatus.COMPLETE
        assert cut_problems(snapshot) == []
        assert balances(snapshot) == {"A": 100, "B": 100, "C": 100}
        assert snapshot.agents[ENV].sent == {"A": 0, "B": 0, "C": 0}
        for name in ("A", "B", "C"):
            assert snapshot.agents[name].sent == {}
            assert snapshot.agents[name].received == {ENV: 0}
        assert snapshot.channels == []


async def test_channels_with_nothing_queued_close_without_markers() -> None:
    # A, B and C have paid each other in a circle, and every transfer was taken: the channels
    # between them are empty. Only $env's markers are needed, to have each agent record.
    scheduler = ScriptedScheduler()
    async with scripted_runtime(scheduler) as runtime:
        for name in ("A", "B", "C"):
            runtime.add(Account(name))
        for src, dst in (("A", "B"), ("B", "C"), ("C", "A")):
            pay(runtime, src, dst, 10)
            await scheduler.deliver(ENV, src)
            await scheduler.deliver(src, dst)

        handle = runtime.snapshot()
        await scheduler.deliver(ENV, "A")  # A records; B and C have not
        # A>B held nothing of A's old epoch: closed for 1 at once, with nothing put on it.
        assert kinds(scheduler.queued("A", "B")) == []
        assert bus_of(runtime).channels["A", "B"].closed == 1
        pay(runtime, "C", "B", 5)  # after $env's cut: epoch 1, behind its marker to C
        await scheduler.deliver(ENV, "B")
        await scheduler.deliver(ENV, "C")  # the last to record: the snapshot completes
        assert runtime.snapshots_in_progress == 0
        assert not any(
            type(item) is Marker for ch in bus_of(runtime).channels.values() for item in ch
        )
        snapshot = await handle
        await runtime.run_until_idle()

    assert cut_problems(snapshot) == []
    assert balances(snapshot) == {"A": 100, "B": 100, "C": 100}
    assert snapshot.channels == []
    assert snapshot.agents["B"].received == {ENV: 1, "A": 1}


async def test_snapshot_with_no_agents_completes_at_once() -> None:
    scheduler = ScriptedScheduler()
    async with scripted_runtime(scheduler) as runtime:
        handle = runtime.snapshot()
        assert runtime.snapshots_in_progress == 0
        snapshot = await handle

    assert snapshot.status is SnapshotStatus.COMPLETE
    assert list(snapshot.agents) == [ENV]
    assert snapshot.agents[ENV].sent == {}
    assert snapshot.channels == []
    assert cut_problems(snapshot) == []
