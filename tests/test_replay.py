"""The replay log: what is made durable before an effect, and what a resume replays.

The crash suite (``tests/guarantees``) kills real processes; these tests pin the pieces:
which deliveries and inputs a plan takes from the log, the group commit that makes them
durable before a side-effecting call, and a resumed run taking its messages in the order
the log says, whatever the scheduler would prefer.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

import pytest
from pydantic import Field

from agentsnap import Agent, AgentState, Context, Message, Runtime, SnapshotPolicy, tool
from agentsnap.bus import Channel, Endpoint, LocalChannel
from agentsnap.messages import EMPTY_HEADERS, ENVIRONMENT
from agentsnap.records import (
    AgentCut,
    ReplaySegment,
    Snapshot,
    SnapshotStatus,
    utcnow,
)
from agentsnap.replay import InputLog, ReplayLog, plan_replay
from agentsnap.store import MemoryStore
from agentsnap.store.ledger import MemoryLedger
from agentsnap.testing import SeededScheduler


def cut(received: dict[str, dict[str, int]], env_sent: dict[str, int]) -> Snapshot:
    agents = {
        name: AgentCut(state_json="{}", state_hash="h", received=counts)
        for name, counts in received.items()
    }
    agents[ENVIRONMENT] = AgentCut(state_json="{}", state_hash="h", sent=env_sent)
    return Snapshot(
        id="s",
        run_id="r",
        seq=1,
        initiator=ENVIRONMENT,
        status=SnapshotStatus.COMPLETE,
        started_at=utcnow(),
        agents=agents,
    )


def recorded(dst: str, seq: int, payload: Any = None) -> tuple[str, int, str, Any, None, int]:
    return dst, seq, "message", payload, None, 0


def test_a_plan_takes_the_deliveries_after_the_cut_of_the_last_timeline() -> None:
    segments = [
        ReplaySegment.of(0, [("a", "$env", 1), ("a", "b", 1)]),
        ReplaySegment.of(1),  # a rollback: what timeline 0 did after the cut is gone
        ReplaySegment.of(1, [("a", "$env", 1), ("b", "a", 1), ("a", "b", 2)]),
        ReplaySegment.of(1, [("a", "b", 3)]),
    ]
    plan = plan_replay(segments, cut({"a": {"b": 1}, "b": {}}, {}))
    assert plan.timeline == 1
    # a had received b#1 at the cut: only what comes after it is replayed, in order.
    assert plan.order == {"a": deque([("$env", 1), ("b", 2), ("b", 3)]), "b": deque([("a", 1)])}
    assert plan.deliveries == 4


def test_a_plan_restores_the_inputs_sent_after_the_cut_up_to_the_first_missing() -> None:
    segments = [
        ReplaySegment.of(0, inputs=[recorded("a", 1), recorded("a", 2), recorded("b", 1)]),
        ReplaySegment.of(1, inputs=[recorded("a", 3), recorded("b", 3)]),  # b#2 lost
    ]
    plan = plan_replay(segments, cut({"a": {}, "b": {}}, {"a": 1}))
    assert [m.id for m in plan.inputs] == ["$env>a#2", "$env>b#1", "$env>a#3"]


def channel(src: str, dst: str) -> Channel:
    return LocalChannel(src, dst, Endpoint(dst), closed=0)


def delivered(log: ReplayLog, on: Channel) -> None:
    """What the runtime does as an agent takes the next message of ``on``."""
    on.delivered += 1
    log.deliveries.append(on)


async def test_the_log_keeps_sequence_numbers_in_runs() -> None:
    written: list[ReplaySegment] = []

    async def write(segment: ReplaySegment) -> None:
        written.append(segment)

    log = ReplayLog(write, InputLog())
    to_a, b_to_a = channel("$env", "a"), channel("b", "a")
    to_a.delivered = 4  # taken before this piece of the log
    for taken in [to_a, to_a, b_to_a, to_a, b_to_a, b_to_a]:
        delivered(log, taken)
    await log.flush()
    (segment,) = written
    assert '"deliveries":[["a","$env",5,2],["a","b",1,1],["a","$env",7,1],["a","b",2,2]]' in (
        segment.body
    )
    assert segment.decode()[0] == [
        ("a", "$env", 5),
        ("a", "$env", 6),
        ("a", "b", 1),
        ("a", "$env", 7),
        ("a", "b", 2),
        ("a", "b", 3),
    ]


async def test_concurrent_flushes_share_writes_and_a_failed_write_is_retried() -> None:
    written: list[ReplaySegment] = []
    failures = [RuntimeError("the database is down")]
    gate = asyncio.Event()

    async def write(segment: ReplaySegment) -> None:
        await gate.wait()
        if failures:
            raise failures.pop()
        written.append(segment)

    log = ReplayLog(write, InputLog())
    to_a, a_to_b = channel("$env", "a"), channel("a", "b")
    delivered(log, to_a)
    first = asyncio.ensure_future(log.flush())
    await asyncio.sleep(0)
    delivered(log, a_to_b)
    second = asyncio.ensure_future(log.flush())
    await asyncio.sleep(0)
    gate.set()
    with pytest.raises(RuntimeError, match="down"):
        await first
    with pytest.raises(RuntimeError, match="down"):
        await second
    assert log.pending() == 2, "nothing is lost when a write fails"
    await log.flush()
    assert [s.decode()[0] for s in written] == [[("a", "$env", 1)], [("b", "a", 1)]]
    assert log.pending() == 0
    await log.flush()  # nothing left: no write
    assert len(written) == 2


async def test_a_new_timeline_drops_the_deliveries_not_written_and_keeps_the_inputs() -> None:
    written: list[ReplaySegment] = []

    async def write(segment: ReplaySegment) -> None:
        written.append(segment)

    inputs = InputLog()
    log = ReplayLog(write, inputs)
    delivered(log, channel("$env", "a"))
    inputs.buffer.append(Message(ENVIRONMENT, "a", 2, "message", None, EMPTY_HEADERS, 0))
    assert log.pending() == 2
    log.new_timeline()
    await log.flush()
    decoded = [(s.timeline, *s.decode()) for s in written]
    assert [(t, d, [row[1] for row in i]) for t, d, i in decoded] == [(1, [], [2])]
    assert log.pending() == 0


CALLS: list[str] = []


@tool(side_effect=True, name="replay_test_effect")
async def effect(call_of: str) -> str:
    CALLS.append(call_of)
    return call_of


class Collector(AgentState):
    seen: list[str] = Field(default_factory=list)


class Counter(Agent[Collector]):
    """Its effect's arguments depend on the order it takes its messages in."""

    async def handle(self, message: Message, ctx: Context[Collector]) -> None:
        self.state.seen.append(str(message.payload))
        await effect(ctx, call_of=f"{len(self.state.seen)}:{message.payload}")


class Relay(Agent[AgentState]):
    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        ctx.send("counter", f"relayed {message.payload}")


WORDS = ["a", "b", "c", "d", "e", "f"]


def feed(runtime: Runtime) -> None:
    runtime.add(Counter("counter"))
    runtime.add(Relay("relay"))
    for word in WORDS:
        runtime.send("counter", word)
        runtime.send("relay", word)


async def order_under(seed: int) -> list[str]:
    async with Runtime(scheduler=SeededScheduler(seed)) as runtime:
        feed(runtime)
        await runtime.run_until_idle()
        return list(runtime.agents["counter"].state.seen)


async def test_a_resumed_run_takes_its_messages_in_the_logged_order(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Two channels into the counter: the seeds below interleave them differently, and under
    # the first the counter first takes a message on a channel the cut does not have yet.
    assert await order_under(5) != await order_under(1)
    store, ledger = MemoryStore(), MemoryLedger()
    # No snapshot as it goes idle or closes: the resume goes back to the first cut and
    # replays every delivery.
    first = Runtime(
        store=store,
        ledger=ledger,
        scheduler=SeededScheduler(5),
        snapshot_policy=SnapshotPolicy(at_end=False),
    )
    async with first:
        feed(first)
        await first.run_until_idle()
        order = list(first.agents["counter"].state.seen)
        keys = [c.key for c in first.agents["counter"].state.tool_calls]
        first.send("counter", "last")  # left for the resume
    logged = [d for s in await store.load_replay(first.run_id) for d in s.decode()[0]]
    assert len([d for d in logged if d[0] == "counter"]) == len(order)

    CALLS.clear()
    resumed = Runtime(store=store, ledger=ledger, scheduler=SeededScheduler(1), run_id=first.run_id)
    async with resumed:
        feed_agents = resumed.add(Counter("counter")), resumed.add(Relay("relay"))
        start = await resumed.resume()
        assert start.seq == 1, "the run's first cut, taken before any delivery"
        assert resumed.inputs_sent == {"counter": 7, "relay": 6}
        await resumed.run_until_idle()
        seen = feed_agents[0].state
        assert isinstance(seen, Collector)
        assert seen.seen == [*order, "last"]
        replayed = seen.tool_calls
    assert [c.key for c in replayed[: len(keys)]] == keys
    assert [c.status for c in replayed] == ["replayed"] * len(keys) + ["ok"]
    # The relay's channel to the counter did not exist at the cut: the counter waited for it.
    assert "could not repeat" not in caplog.text
    ran = CALLS
    assert ran == [f"{len(keys) + 1}:last"], "only the new input ran its effect"
