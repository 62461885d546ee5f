"""The message journal: every send and delivery of a run, written to the store in segments."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import pytest
from payloads import get

from agentsnap import (
    Agent,
    AgentState,
    Context,
    JournalSegment,
    MemoryStore,
    Message,
    Runtime,
    StoreError,
)
from agentsnap.journal import read_journal
from agentsnap.store.sql import SqlStore
from agentsnap.testing import SeededScheduler


class HopState(AgentState):
    handled: int = 0


class Hopper(Agent[HopState]):
    """Passes a token on to ``next`` until its hop count runs out."""

    def __init__(self, name: str, next_agent: str) -> None:
        super().__init__(name, HopState())
        self.next_agent = next_agent

    async def handle(self, message: Message, ctx: Context[HopState]) -> None:
        self.state.handled += 1
        hops = get(message.payload, "hops", int)
        if hops > 0:
            kind = "odd" if hops % 2 else "even"
            headers = {"trace": f"t-{hops}"} if hops % 3 == 0 else None
            ctx.send(self.next_agent, {"hops": hops - 1, "note": "ü ✓"}, kind=kind, headers=headers)


class FlakyStore(MemoryStore):
    """A memory store whose first ``failures`` journal writes fail like a database away."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures

    async def append_journal(self, run_id: str, segments: Sequence[JournalSegment]) -> None:
        if self.failures:
            self.failures -= 1
            raise StoreError("cannot reach the database: connection refused")
        await super().append_journal(run_id, segments)


async def hop_run(runtime: Runtime, hops: int) -> None:
    runtime.add(Hopper("a", "b"))
    runtime.add(Hopper("b", "c"))
    runtime.add(Hopper("c", "a"))
    runtime.send("a", {"hops": hops, "note": "start"}, kind="start")
    await runtime.run_until_idle()


async def test_every_send_and_delivery_is_journaled_in_order() -> None:
    store = MemoryStore()
    before = datetime.now(UTC)
    async with Runtime(store=store, journal=True) as runtime:
        await hop_run(runtime, 30)
        snapshot = await runtime.snapshot()

    messages = read_journal(await store.load_journal(runtime.run_id))

    assert len(messages) == 31
    assert [(m.src, m.dst) for m in messages[:4]] == [
        ("$env", "a"),
        ("a", "b"),
        ("b", "c"),
        ("c", "a"),
    ]
    assert [get(m.payload, "hops", int) for m in messages] == list(range(30, -1, -1))
    assert messages[0].kind == "start"
    assert [m.kind for m in messages[1:3]] == ["even", "odd"]
    # Sequence numbers count per channel, and the journal agrees with the cut's counters.
    on_ab = [m.seq for m in messages if (m.src, m.dst) == ("a", "b")]
    assert on_ab == list(range(1, len(on_ab) + 1))
    assert snapshot.agents["a"].sent["b"] == len(on_ab)
    assert messages[1].headers == {"trace": "t-30"}
    assert messages[2].headers == {}
    for message in messages:
        assert message.delivered_at is not None
        assert before <= message.sent_at <= message.delivered_at <= datetime.now(UTC)


class Burst(Agent[HopState]):
    """Sends ``count`` messages to ``to`` in one handler, one of them with a header."""

    def __init__(self, name: str, to: str, count: int) -> None:
        super().__init__(name, HopState())
        self.to = to
        self.count = count

    async def handle(self, message: Message, ctx: Context[HopState]) -> None:
        for i in range(self.count):
            ctx.send(self.to, {"i": i}, headers={"n": "7"} if i == 7 else None)


async def test_a_burst_on_one_channel_is_journaled_whole_and_in_order() -> None:
    # Hundreds of sends in a row on one channel: the journal encodes them several times as
    # they come, each time with nothing logged on any other channel.
    store = MemoryStore()
    async with Runtime(store=store, journal=True) as runtime:
        runtime.add(Burst("burst", "sink", 1000))
        runtime.add(Burst("sink", "burst", 0))
        runtime.send("burst", None)
        await runtime.run_until_idle()

    messages = read_journal(await store.load_journal(runtime.run_id))

    burst = [m for m in messages if m.src == "burst"]
    assert [m.seq for m in burst] == list(range(1, 1001))
    assert [get(m.payload, "i", int) for m in burst] == list(range(1000))
    assert [m.headers for m in burst[6:9]] == [{}, {"n": "7"}, {}]
    assert all(m.delivered_at is not None for m in messages)


async def test_journal_is_off_by_default() -> None:
    store = MemoryStore()
    async with Runtime(store=store) as runtime:
        await hop_run(runtime, 5)
    assert await store.load_journal(runtime.run_id) == []


async def test_undelivered_messages_are_journaled_when_the_runtime_closes() -> None:
    store = MemoryStore()
    scheduler = SeededScheduler(1)
    async with Runtime(store=store, scheduler=scheduler, journal=True) as runtime:
        runtime.add(Hopper("a", "b"))
        runtime.add(Hopper("b", "a"))
        runtime.send("a", {"hops": 3, "note": "x"})
        runtime.send("b", {"hops": 0, "note": "y"})
        assert await scheduler.step()  # one of the two is delivered, the other never is

    messages = read_journal(await store.load_journal(runtime.run_id))

    assert len(messages) == 3
    assert sum(m.delivered_at is None for m in messages) == 2


async def test_journal_writes_are_retried_after_a_failure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = FlakyStore(failures=1)
    with caplog.at_level(logging.ERROR, logger="agentsnap.journal"):
        async with Runtime(store=store, journal=True) as runtime:
            await hop_run(runtime, 10)  # its flush fails
            runtime.send("a", {"hops": 4, "note": "again"})
            await runtime.run_until_idle()  # this flush writes both batches

    messages = read_journal(await store.load_journal(runtime.run_id))

    assert [get(m.payload, "hops", int) for m in messages] == [
        *range(10, -1, -1),
        *range(4, -1, -1),
    ]
    assert all(m.delivered_at is not None for m in messages)
    assert "journal write of" in caplog.text
    assert "connection refused" in caplog.text


async def test_journal_in_sqlite_reads_back_the_same(tmp_path: Path) -> None:
    memory = MemoryStore()
    sql = SqlStore(f"sqlite:///{tmp_path / 'journal.db'}")
    try:
        for store in (memory, sql):
            async with Runtime(store=store, journal=True, run_id="run-1") as runtime:
                runtime.add(Hopper("a", "b"))
                runtime.add(Hopper("b", "a"))
                runtime.send("a", {"hops": 6, "note": "naïve"}, headers={"k": "v"})
                await runtime.run_until_idle()
        from_memory = read_journal(await memory.load_journal("run-1"))
        from_sql = read_journal(await sql.load_journal("run-1"))
    finally:
        await sql.close()
    assert [m.model_dump(exclude={"sent_at", "delivered_at"}) for m in from_sql] == [
        m.model_dump(exclude={"sent_at", "delivered_at"}) for m in from_memory
    ]
    assert from_sql[0].headers == {"k": "v"}
    assert all(m.delivered_at is not None for m in from_sql)


def test_a_damaged_segment_is_reported_with_its_channel() -> None:
    damaged = JournalSegment("a", "b", "send", 1, 2, '{"seq": 1, "at": [1, 2], "kind": "k"}')
    with pytest.raises(ValueError, match=r"journal segment send a>b is damaged: 'payload'"):
        read_journal([damaged])
    short = JournalSegment("a", "b", "deliver", 1, 2, '{"seq": [1, 2, 3], "at": [1, 2]}')
    with pytest.raises(ValueError, match=r"column 'seq' has 3 values, not 2"):
        read_journal([short])
    unknown = JournalSegment("a", "b", "teleport", 1, 1, '{"seq": 1, "at": [1]}')
    with pytest.raises(ValueError, match=r"unknown event 'teleport'"):
        read_journal([unknown])


def test_a_delivery_goes_to_the_latest_undelivered_send() -> None:
    # After a rollback a channel's sequence numbers are reused: the second send of seq 1 is
    # the one the second delivery belongs to.
    segments = [
        JournalSegment(
            "a", "b", "send", 1, 1, '{"seq":1,"kind":"k","payload":[[1]],"epoch":0,"at":[10]}'
        ),
        JournalSegment("a", "b", "deliver", 1, 1, '{"seq":1,"at":[20]}'),
        JournalSegment(
            "a", "b", "send", 1, 1, '{"seq":1,"kind":"k","payload":[[2]],"epoch":0,"at":[30]}'
        ),
        JournalSegment("a", "b", "deliver", 1, 1, '{"seq":1,"at":[40]}'),
    ]
    first, second = read_journal(segments)
    assert (first.payload, second.payload) == ([1], [2])
    assert first.delivered_at is not None
    assert second.delivered_at is not None
    assert (first.delivered_at - first.sent_at).microseconds == 10
    assert second.delivered_at.timestamp() * 1e6 == pytest.approx(40)


def test_a_delivery_goes_to_a_send_made_before_it() -> None:
    # Both sends of seq 1 (the second after a rollback) written before either delivery.
    segments = [
        JournalSegment(
            "a", "b", "send", 1, 1, '{"seq":1,"kind":"k","payload":[[1]],"epoch":0,"at":[10]}'
        ),
        JournalSegment(
            "a", "b", "send", 1, 1, '{"seq":1,"kind":"k","payload":[[2]],"epoch":0,"at":[30]}'
        ),
        JournalSegment("a", "b", "deliver", 1, 1, '{"seq":[1,1],"at":[20,40]}'),
    ]
    first, second = read_journal(segments)
    assert first.delivered_at is not None
    assert second.delivered_at is not None
    assert first.delivered_at.timestamp() * 1e6 == pytest.approx(20)
    assert second.delivered_at.timestamp() * 1e6 == pytest.approx(40)
