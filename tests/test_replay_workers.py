"""The replay log of a run spread over processes: one log in the store, many writers.

Every worker appends its agents' deliveries to the run's one replay log; a recovery plans,
for the agents a worker hosts, the deliveries after the cut on the timeline the run's
coordinator names. These tests pin the pieces: the plan of one worker among several, a
segment written twice planned once, segments numbered before a restore changes the
channels' counters, a timeline numbered by the coordinator, and workers appending at the
same moment on PostgreSQL losing nothing. ``test_distributed_replay.py`` kills real worker
processes.
"""

from __future__ import annotations

import asyncio
from collections import deque

from test_replay import channel, cut, delivered

from agentsnap.distributed.host import _append_shared
from agentsnap.records import ReplaySegment, RunInfo
from agentsnap.replay import InputLog, ReplayLog, missing, plan_replay
from agentsnap.store.sql import SqlStore


def test_a_worker_plans_its_own_agents_on_the_timeline_it_is_told() -> None:
    segments = [
        ReplaySegment.of(0, [("a", "$env", 1), ("c", "$env", 1)]),
        # The coordinator rolled back for a rejection: timeline 2 (its generation) starts.
        ReplaySegment.of(2),
        ReplaySegment.of(2, [("a", "$env", 1), ("a", "c", 1)]),  # worker 1 (a, b)
        ReplaySegment.of(2, [("c", "a", 1), ("c", "$env", 1)]),  # worker 2 (c)
        ReplaySegment.of(2, [("b", "a", 1), ("a", "c", 2)]),  # worker 1
        ReplaySegment.of(2, [("b", "a", 1), ("a", "c", 2)]),  # written again: answer lost
        ReplaySegment.of(3),  # the last segment's timeline is not the one named
        ReplaySegment.of(3, [("a", "c", 3)]),
    ]
    at = cut({"a": {"$env": 1}, "b": {}, "c": {}}, {})
    plan = plan_replay(segments, at, timeline=2, agents=["a", "b"])
    assert plan.timeline == 2
    assert plan.order == {"a": deque([("c", 1), ("c", 2)]), "b": deque([("a", 1)])}
    other = plan_replay(segments, at, timeline=2, agents=["c"])
    assert other.order == {"c": deque([("a", 1), ("$env", 1)])}


async def test_deliveries_taken_before_a_restore_keep_their_numbers() -> None:
    written: list[ReplaySegment] = []

    async def write(segment: ReplaySegment) -> None:
        written.append(segment)

    log = ReplayLog(write, InputLog())
    log.timeline = 4
    to_a, b_to_a = channel("$env", "a"), channel("b", "a")
    for taken in [to_a, b_to_a, to_a]:
        delivered(log, taken)
    log.take()
    to_a.delivered = b_to_a.delivered = 0  # a restore to the start of the run
    await log.flush()
    (segment,) = written
    assert segment.timeline == 4
    assert segment.decode()[0] == [("a", "$env", 1), ("a", "b", 1), ("a", "$env", 2)]


async def test_a_timeline_numbered_by_the_coordinator_drops_what_was_not_written() -> None:
    written: list[ReplaySegment] = []

    async def write(segment: ReplaySegment) -> None:
        written.append(segment)

    log = ReplayLog(write, InputLog())
    delivered(log, channel("$env", "a"))
    log.new_timeline(7)
    delivered(log, channel("b", "a"))
    await log.flush()
    assert [(s.timeline, s.decode()[0]) for s in written] == [(7, []), (7, [("a", "b", 1)])]
    assert log.timeline == 7


async def test_workers_appending_at_once_lose_no_segment(postgres_url: str) -> None:
    stores = [SqlStore(postgres_url) for _ in range(3)]
    try:
        await stores[0].create_run(RunInfo(id="shared-log"))
        await asyncio.gather(*(store.load_replay("shared-log") for store in stores))

        async def worker(n: int) -> None:
            for i in range(30):
                segment = ReplaySegment.of(0, [(f"agent-{n}", "$env", i + 1)])
                await _append_shared(stores[n], "shared-log", segment)

        await asyncio.gather(*(worker(n) for n in range(3)))
        segments = await stores[0].load_replay("shared-log")
    finally:
        for store in stores:
            await store.close()
    plan = plan_replay(segments, cut({f"agent-{n}": {} for n in range(3)}, {}))
    assert plan.order == {f"agent-{n}": deque(("$env", i + 1) for i in range(30)) for n in range(3)}


async def test_a_log_secured_in_a_mirror_reaches_the_store_behind_it() -> None:
    """Secured in a mirror at once, the order reaches the store later, joined into one
    segment; what the store lacks when a worker stops, the mirror gives back in order."""
    mirrored: list[ReplaySegment] = []
    stored: list[ReplaySegment] = []
    gate = asyncio.Event()
    told: list[int] = []

    async def mirror(segment: ReplaySegment) -> int:
        mirrored.append(segment)
        return 100 + len(mirrored)  # where the mirror stored it

    async def write(segment: ReplaySegment) -> None:
        await gate.wait()  # a slow store
        stored.append(segment)

    log = ReplayLog(write, InputLog())
    log.mirror = mirror
    log.on_written = told.append
    a, b = channel("$env", "a"), channel("a", "b")
    delivered(log, a)
    assert not log.secured()
    await log.secure()
    assert log.secured(), "secured in the mirror"
    assert log.pending() == 1, "not in the store yet"
    delivered(log, b)
    delivered(log, a)
    await log.secure()
    await log.secure()  # nothing new: no segment
    assert [s.decode()[0] for s in mirrored] == [
        [("a", "$env", 1)],
        [("b", "a", 1), ("a", "$env", 2)],
    ]
    # The worker stops before the store took anything: the mirror holds the whole order.
    assert missing([], mirrored) == mirrored
    plan = plan_replay(missing([], mirrored), cut({"a": {}, "b": {}}, {}))
    assert plan.order == {"a": deque([("$env", 1), ("$env", 2)]), "b": deque([("a", 1)])}
    # The store took the first piece (as the worker wrote it): only the second is lacking.
    assert missing(mirrored[:1], mirrored) == mirrored[1:]
    gate.set()
    await log.flush()
    assert log.pending() == 0
    assert [s.decode()[0] for s in stored] == [
        [("a", "$env", 1), ("b", "a", 1), ("a", "$env", 2)]
    ], "the pieces waiting together are written as one"
    assert told[-1] == 102, "the mirror holds nothing the store lacks up to there"
    await log.close()


async def test_a_log_whose_mirror_fails_is_secured_in_the_store() -> None:
    stored: list[ReplaySegment] = []

    async def mirror(segment: ReplaySegment) -> int:
        raise TimeoutError("the stream did not answer")

    async def write(segment: ReplaySegment) -> None:
        stored.append(segment)

    log = ReplayLog(write, InputLog())
    log.mirror = mirror
    delivered(log, channel("$env", "a"))
    try:
        await log.secure()
    except TimeoutError:
        pass
    else:  # pragma: no cover - the assertion below says it
        raise AssertionError("a mirror's error is raised")
    assert not log.secured()
    await log.flush()  # what a worker does then
    assert log.secured()
    assert [s.decode()[0] for s in stored] == [[("a", "$env", 1)]]
