"""Agents across processes: placement, apps, and recording parts with channels on NATS.

Several hosts in one process, each with its own connection, bus and scheduler, stand for the
processes of a run here; ``test_distributed_processes.py`` runs real worker processes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import orjson
import pytest
from distributed_teardown import Teardown
from nats_server import SHARED_URL, OwnServer, reachable, server_binary, unavailable
from teller_app import Teller, bank, finished, money_in

from agentsnap import (
    Agent,
    AgentState,
    ConfigurationError,
    Context,
    MemoryStore,
    Message,
    Redaction,
    RunCancelled,
    Snapshot,
    SnapshotFailed,
    StoreError,
)
from agentsnap.distributed import (
    AgentsHeld,
    App,
    DistributedRun,
    Worker,
    group_of,
    load_app,
    parse_group,
    place,
)
from agentsnap.distributed.orders import control_subject
from agentsnap.distributed.recovery import RollbackAuthority
from agentsnap.integrity import cut_problems
from agentsnap.jetstream import JetStreamLink
from agentsnap.jetstream.codec import order_subjects
from agentsnap.messages import ENVIRONMENT
from agentsnap.model_calls import ModelCallLog
from agentsnap.records import ReplaySegment, RunStatus, SnapshotStatus, utcnow
from agentsnap.replay import plan_replay
from agentsnap.rollback import RetryPolicy
from agentsnap.snapshot import SnapshotPolicy
from agentsnap.testing import SampledModel

if TYPE_CHECKING:
    from nats.aio.msg import Msg

    from agentsnap.store import Store

HERE = Path(__file__).resolve().parent
PATIENCE = 120.0
"""Seconds a run may take to finish its work before the test reports it stuck."""


# -- placement ------------------------------------------------------------------------------

NAMES = [f"teller-{i}" for i in range(9)]


def test_groups_place_every_agent_exactly_once() -> None:
    for m in (1, 2, 3, 5):
        placed = [name for n in range(m) if _holds(n, m) for name in place(NAMES, group=f"{n}/{m}")]
        assert sorted(placed) == sorted(NAMES)


def _holds(n: int, m: int) -> bool:
    return any(group_of(name, m) == n for name in NAMES)


def test_a_group_is_the_same_in_another_process_whatever_its_hash_seed() -> None:
    code = (
        "from agentsnap.distributed import group_of; "
        "print([group_of(f'teller-{i}', 7) for i in range(9)])"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == str([group_of(f"teller-{i}", 7) for i in range(9)])


@pytest.mark.parametrize("text", ["", "3", "3/3", "-1/3", "a/b", "1/0", "0/3/1"])
def test_a_malformed_group_is_refused(text: str) -> None:
    with pytest.raises(ConfigurationError, match="N/M"):
        parse_group(text)


def test_explicit_agents_keep_the_apps_order_and_unknown_ones_are_named() -> None:
    assert place(NAMES, agents={"teller-3", "teller-1"}) == ["teller-1", "teller-3"]
    with pytest.raises(ConfigurationError, match="'clerk'"):
        place(NAMES, agents={"teller-1", "clerk"})
    with pytest.raises(ConfigurationError, match="one of them"):
        place(NAMES)
    with pytest.raises(ConfigurationError, match="one of them"):
        place(NAMES, agents={"teller-1"}, group="0/2")


def test_an_empty_group_says_to_use_fewer() -> None:
    with pytest.raises(ConfigurationError, match="fewer groups"):
        place(["only"], group=f"{1 - group_of('only', 2)}/2")


# -- apps -----------------------------------------------------------------------------------


def test_an_app_is_loaded_from_module_and_factory() -> None:
    app = load_app("teller_app:make_app")
    assert app.names == [f"teller-{i}" for i in range(len(app.names))]


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("teller_app", "module:factory"),
        ("no_such_module_here:make", "cannot import"),
        ("teller_app:nothing", "no factory 'nothing'"),
        ("teller_app:names", "returned a list: .* not str"),
        ("teller_app:Transfer", "raised ValidationError"),
    ],
)
def test_a_bad_app_is_a_clear_error(spec: str, says: str) -> None:
    with pytest.raises(ConfigurationError, match=says):
        load_app(spec)


def test_an_app_refuses_two_agents_of_one_name() -> None:
    with pytest.raises(ConfigurationError, match="twice"):
        App(agents=[Teller("a", ["b"]), Teller("a", ["b"])])


def test_an_apps_check_takes_the_options_runtime_check_takes() -> None:
    app = App(agents=[Teller("a", ["b"])])
    app.check("a", "transfer", check=lambda message: True, name="always")
    [declared] = app.checks_of("a")
    assert (declared.kind, declared.name, declared.schema) == ("transfer", "always", None)
    with pytest.raises(ConfigurationError, match=r"App\.check\(\) needs a schema="):
        app.check("a", name="nothing")
    with pytest.raises(
        TypeError, match=r"App\.check\(\) got an unexpected keyword argument 'shema'"
    ):
        app.check("a", shema=dict)  # type: ignore[call-arg]
    assert len(app.checks_of("a")) == 1


def test_a_coordinator_ignores_a_malformed_report_and_drops_one_of_an_older_timeline(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def no_cut(seq: int) -> Snapshot:
        raise AssertionError("no rollback is decided here")

    authority = RollbackAuthority(
        "run",
        cast("Any", None),
        cast("Any", None),
        cast("Any", None),
        ["a"],
        policy=RetryPolicy(),
        targets=list,
        fail_pending=print,
        start_cut=no_cut,
        completed=print,
    )
    with caplog.at_level(logging.WARNING, logger="agentsnap.distributed"):
        authority.rejected({"generation": 0, "rejected": {"agent": "a"}})  # no reason
        authority.rejected({"rejected": {"agent": "a", "reason": "r", "source": "s"}})
        authority.lost({"lost": "database down", "generation": "first"})
    assert [record.getMessage() for record in caplog.records] == [
        "run run: a malformed rejection report was ignored: KeyError('reason')",
        "run run: a malformed rejection report was ignored: KeyError('generation')",
        'run run: a malformed report was ignored: ValueError("invalid literal for int() with '
        "base 10: 'first'\")",
    ]
    rejected = {"agent": "a", "reason": "too long", "source": "check"}
    authority.rejected({"generation": 1, "rejected": rejected})
    authority.lost({"lost": "database down", "agent": "a", "generation": 2})
    assert (authority.dropped, authority.busy) == (2, False)


# -- recording across hosts -----------------------------------------------------------------


@pytest.fixture
async def nats_url(tmp_path: Path) -> AsyncIterator[str]:
    """The shared server's URL, or one of this test's own when there is none."""
    if reachable(SHARED_URL):
        yield SHARED_URL
        return
    binary = server_binary()
    if binary is None:
        unavailable(f"no NATS server at {SHARED_URL} and no nats-server binary")
        return
    server = OwnServer(binary, tmp_path / "jetstream")
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


def in_flight_between_hosts(snapshot: Snapshot, hosts: list[set[str]]) -> int:
    where = {name: i for i, names in enumerate(hosts) for name in names}
    return sum(
        len(ch.messages)
        for ch in snapshot.channels
        if ch.src != ENVIRONMENT and where[ch.src] != where[ch.dst]
    )


async def start(run: DistributedRun, *workers: Worker) -> None:
    """Start the run, then its workers one after the other."""
    await run.start()
    for worker in workers:
        await worker.start()


async def transfers(run: DistributedRun, tellers: int, chains: int, hops: int) -> Snapshot:
    """Start ``chains`` chains of ``hops`` transfers over the tellers; the cut once idle."""
    for i in range(chains):
        run.send(f"teller-{i % tellers}", {"hops": hops}, kind="go")
    async with asyncio.timeout(PATIENCE):
        return await run.run_until_idle()


async def test_parts_recorded_on_three_hosts_join_into_consistent_cuts(
    nats_url: str, teardown: Teardown
) -> None:
    store = MemoryStore()
    app = bank(6)
    hosts = [{"teller-0", "teller-1", "teller-2"}, {"teller-3", "teller-4", "teller-5"}]
    links = await teardown.links(nats_url, 3)
    run = DistributedRun(
        links[0], store, app, policy=SnapshotPolicy(every_seconds=0.05), part_timeout=30
    )
    workers = [
        Worker(link, store, run.run_id, bank(6), agents, name=f"w{i}")
        for i, (link, agents) in enumerate(zip(links[1:], hosts, strict=True))
    ]
    teardown.workers(workers)
    teardown.stream(run)
    await start(run, *workers)
    last = await transfers(run, 6, 40, 30)
    await run.close()
    assert last.seq == max(s.seq for s in run.complete)
    assert run.complete, "no snapshot completed"
    for snapshot in run.complete:
        assert cut_problems(snapshot) == []
        assert money_in(snapshot) == 6_000
        assert await store.load_snapshot(snapshot.id) == snapshot
    crossing = [s for s in run.complete if in_flight_between_hosts(s, hosts)]
    assert crossing, "no snapshot caught a transfer between hosts"
    # The offsets of the channels between hosts say as much as the messages recorded.
    for snapshot in crossing:
        parts = await store.load_snapshot_parts(run.run_id, snapshot.seq)
        offsets = [o for part in parts for o in part.offsets if o.count]
        assert offsets
        for o in offsets:
            assert o.first_seq < o.end_seq
            assert len(snapshot.in_flight(o.src, o.dst)) == o.count


class _ReplayAway:
    """A store whose replay log takes nothing (a worker killed before its log reached the
    store is the same to a recovery); everything else goes to ``store``."""

    def __init__(self, store: MemoryStore) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def append_replay(self, run_id: str, segment: ReplaySegment) -> None:
        raise _Away("the replay log is away")


class _Away(StoreError):
    pass


async def test_messages_leave_once_the_order_is_in_the_stream_and_a_recovery_copies_it(
    nats_url: str,
    teardown: Teardown,
) -> None:
    """A worker's messages leave once its agents' delivery order is secured in the run's
    stream, not in the store; a recovery copies what the store lacks from the stream."""
    store = MemoryStore()
    app = bank(4)
    hosts = [["teller-0", "teller-1"], ["teller-2", "teller-3"]]
    links = await teardown.links(nats_url, 3)
    run = DistributedRun(links[0], store, app)
    away = cast("Store", _ReplayAway(store))
    workers = [
        Worker(links[1], store, run.run_id, bank(4), hosts[0], name="w0"),
        Worker(links[2], away, run.run_id, bank(4), hosts[1], name="w1"),
    ]
    teardown.workers(workers)
    teardown.run(run)
    await start(run, *workers)
    last = await transfers(run, 4, 8, 12)
    assert finished(last)
    assert money_in(last) == 4_000
    host = workers[1].host
    taken = sum(ch.delivered for ch in host.bus.channels.values() if ch.dst in set(hosts[1]))
    assert taken > 8, "w1's agents took messages from w0's"
    cut = Snapshot(
        id="start",
        run_id=run.run_id,
        seq=0,
        initiator=ENVIRONMENT,
        status=SnapshotStatus.COMPLETE,
        started_at=utcnow(),
    )
    timeline = host.replay.timeline if host.replay is not None else 0
    in_store = plan_replay(
        await store.load_replay(run.run_id), cut, timeline=timeline, agents=hosts[1]
    )
    assert in_store.deliveries == 0, "w1's order never reached the store"
    # A recovery on w0 (any worker may host w1's agents next) copies it from the stream:
    # every delivery before a message w1 sent (the last ones may have had no effect).
    workers[0].host.copied = 0
    segments = await workers[0].host._copy_secured(await store.load_replay(run.run_id))
    assert workers[0].host.copied > 0
    secured = plan_replay(segments, cut, timeline=timeline, agents=hosts[1])
    assert secured.deliveries > 0
    assert await links[0].read(run.run_id, order_subjects(run.run_id)) == [], (
        "the stream keeps no order the store holds"
    )
    # Secured to its last delivery, w1's whole order is in the stream.
    assert host.replay is not None
    await host.replay.secure()
    segments = await workers[0].host._copy_secured(await store.load_replay(run.run_id))
    plan = plan_replay(segments, cut, timeline=timeline, agents=hosts[1])
    assert plan.deliveries == taken, "every delivery of w1's agents, from the stream"
    for agent, order in secured.order.items():
        assert list(order) == list(plan.order[agent])[: len(order)], "in the order taken"
    stored = plan_replay(
        await store.load_replay(run.run_id), cut, timeline=timeline, agents=hosts[1]
    )
    assert stored.order == plan.order, "written to the store"
    # w0's order went to the store in the background, each piece it secured in the stream
    # after it: once those writes are done, the store holds all of it but the last
    # deliveries, which no message followed.
    mine = workers[0].host
    assert mine.replay is not None
    await mine.replay.close()
    assert not mine.replay.mirrored_at, "every piece w0 secured reached the store"
    own = sum(ch.delivered for ch in mine.bus.channels.values() if ch.dst in set(hosts[0]))
    kept = plan_replay(await store.load_replay(run.run_id), cut, timeline=timeline, agents=hosts[0])
    assert kept.deliveries == own - mine.replay.pending() > 0


async def test_a_cancelled_run_over_hosts_stops_in_every_worker_and_is_recorded_cancelled(
    nats_url: str,
    teardown: Teardown,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``agentsnap cancel`` (a request in the store) reaches the coordinator at a renewal of
    its lease: every worker stops delivering, the run is recorded ``cancelled``, and each
    snapshot taken before is a consistent cut. A cancel asked for is no error in any log."""
    store = MemoryStore()
    hosts = [{"teller-0", "teller-1", "teller-2"}, {"teller-3", "teller-4", "teller-5"}]
    links = await teardown.links(nats_url, 3)
    run = DistributedRun(
        links[0], store, bank(6), policy=SnapshotPolicy(every_seconds=0.05), lease=0.6
    )
    workers = [
        Worker(link, store, run.run_id, bank(6), agents, name=f"w{i}")
        for i, (link, agents) in enumerate(zip(links[1:], hosts, strict=True))
    ]
    teardown.workers(workers)
    teardown.stream(run)
    await start(run, *workers)
    for i in range(6):
        run.send(f"teller-{i}", {"hops": 1_000_000}, kind="go")  # never idle
    async with asyncio.timeout(PATIENCE):
        await run.snapshot().wait()  # a cut of the busy run
    await store.request_cancel(run.run_id, "enough for today")
    with pytest.raises(RunCancelled, match="enough for today"):
        async with asyncio.timeout(PATIENCE):
            await run.run_until_idle()
    async with asyncio.timeout(PATIENCE):
        for worker in workers:
            await worker.stopped.wait()
    await run.close()
    info = await store.get_run(run.run_id)
    assert info.status is RunStatus.CANCELLED
    assert info.status_reason is not None
    assert "enough for today" in info.status_reason
    for snapshot in run.complete:
        assert cut_problems(snapshot) == []
        assert money_in(snapshot) == 6_000
    stops = [r for r in caplog.records if r.getMessage().startswith("worker w")]
    stops = [r for r in stops if "the run stopped" in r.getMessage()]
    assert {r.getMessage().partition(":")[0] for r in stops} == {"worker w0", "worker w1"}
    assert {r.levelno for r in stops} == {logging.WARNING}


async def test_waiting_for_a_run_to_be_idle_needs_a_started_run(
    nats_url: str, teardown: Teardown
) -> None:
    link = teardown.link(await JetStreamLink.connect(nats_url))
    run = DistributedRun(link, MemoryStore(), bank(2))
    teardown.stream(run)
    with pytest.raises(ConfigurationError, match="needs a started run"):
        await run.run_until_idle()
    await run.start()
    with pytest.raises(ConfigurationError, match="positive"):
        await run.run_until_idle(every=0)
    await run.close()
    with pytest.raises(ConfigurationError, match="needs a started run"):
        await run.run_until_idle()


async def test_a_second_worker_for_an_agent_is_refused(nats_url: str, teardown: Teardown) -> None:
    store = MemoryStore()
    links = await teardown.links(nats_url, 3)
    run = DistributedRun(links[0], store, bank(2))
    first = Worker(links[1], store, run.run_id, bank(2), ["teller-0"], name="first")
    second = Worker(links[2], store, run.run_id, bank(2), ["teller-0", "teller-1"], name="second")
    teardown.worker(first)
    teardown.run(run)
    await run.start()
    await first.start()
    with pytest.raises(AgentsHeld, match="teller-0 by first"):
        await second.start()
    # Nothing was claimed by the refused worker: teller-1 is free.
    assert await store.claim_agents(run.run_id, "third", ["teller-1"], _later()) == []


class _CutOff:
    """A store a worker is cut off from: claims fail while ``claims`` is clear, and loads
    wait for ``loads``; everything else goes to ``store``."""

    def __init__(self, store: MemoryStore) -> None:
        self._store = store
        self.claims = asyncio.Event()
        self.loads = asyncio.Event()
        self.claims.set()
        self.loads.set()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def claim_agents(self, *args: Any) -> Any:
        if not self.claims.is_set():
            raise _Away("the store is away")
        return await self._store.claim_agents(*args)

    async def load_snapshot(self, snapshot_id: str) -> Snapshot:
        await self.loads.wait()
        return await self._store.load_snapshot(snapshot_id)


def cut_off_pair(
    links: list[JetStreamLink], store: MemoryStore, run: DistributedRun, name: str
) -> tuple[Worker, Worker, _CutOff]:
    """A worker for teller-0 and teller-1 on a store it can be cut off from (a claim of 1 s),
    and one for teller-2 and teller-3 on ``store``."""
    away = _CutOff(store)
    mine = ["teller-0", "teller-1"]
    cut = Worker(links[1], cast("Store", away), run.run_id, bank(4), mine, name=name, lease=1.0)
    other = Worker(links[2], store, run.run_id, bank(4), ["teller-2", "teller-3"], name="other")
    return cut, other, away


async def test_a_worker_replaced_while_away_stops_at_the_rollback_instead_of_restoring(
    nats_url: str, teardown: Teardown
) -> None:
    """The rollback that a replacement's start orders reaches the worker it replaced too,
    which restores nothing once the store answers: its agents run elsewhere now."""
    store = MemoryStore()
    links = await teardown.links(nats_url, 5)
    run = DistributedRun(links[0], store, bank(4), policy=SnapshotPolicy(every_seconds=0.1))
    old, other, away = cut_off_pair(links, store, run, "old")
    teardown.workers([old, other])
    teardown.run(run)
    await start(run, old, other)
    await transfers(run, 4, 4, 6)
    reports: list[dict[str, Any]] = []

    async def heard(msg: Msg) -> None:
        reports.append(orjson.loads(msg.data))

    await links[4].nc.subscribe(control_subject(run.run_id), cb=heard)
    away.claims.clear()
    away.loads.clear()
    await asyncio.sleep(1.5)  # the old worker's claim runs out
    new = Worker(
        links[3], store, run.run_id, bank(4), ["teller-0", "teller-1"], name="new", wait=10
    )
    teardown.worker(new)
    await new.start()
    assert new.rejoined
    async with asyncio.timeout(PATIENCE):
        while not run.rollbacks:  # noqa: ASYNC110 - a list the coordinator fills
            await asyncio.sleep(0.05)
    away.loads.set()  # the store answers the old worker's load, not yet its claim
    await asyncio.sleep(1.0)
    away.claims.set()
    await asyncio.wait_for(old.stopped.wait(), 10)
    assert [r for r in reports if "restored" in r and r.get("worker") == "old"] == []
    assert {r.get("worker") for r in reports if "restored" in r} == {"new", "other"}
    last = await transfers(run, 4, 1, 6)
    assert money_in(last) == 4_000
    assert finished(last)


async def test_a_worker_whose_claim_ran_out_unrenewed_delivers_nothing_until_it_renews_it(
    nats_url: str, teardown: Teardown
) -> None:
    """Another worker may take over agents whose claim ran out at any moment: the worker
    cut off from the store starts no delivery until its claim is renewed."""
    store = MemoryStore()
    links = await teardown.links(nats_url, 3)
    run = DistributedRun(links[0], store, bank(4))
    cut, other, away = cut_off_pair(links, store, run, "cut")
    mine = cut.agents
    teardown.workers([cut, other])
    teardown.run(run)
    await start(run, cut, other)

    def delivered() -> int:
        return sum(ch.delivered for ch in cut.host.bus.channels.values() if ch.dst in mine)

    away.claims.clear()
    await asyncio.sleep(1.5)
    assert cut.host.scheduler.held()
    before = delivered()
    run.send("teller-0", {"hops": 6}, kind="go")
    await asyncio.sleep(1.0)
    assert delivered() == before, "delivered with a claim that ran out"
    away.claims.set()
    async with asyncio.timeout(PATIENCE):
        last = await run.run_until_idle()
    assert not cut.host.scheduler.held()
    assert delivered() > before
    assert finished(last)
    assert money_in(last) == 4_000


async def test_a_snapshot_whose_worker_never_comes_fails_and_the_run_goes_on(
    nats_url: str,
    teardown: Teardown,
) -> None:
    store = MemoryStore()
    link = teardown.link(await JetStreamLink.connect(nats_url))
    run = DistributedRun(link, store, bank(2), part_timeout=0.5)
    teardown.run(run)
    await run.start()
    with pytest.raises(SnapshotFailed, match=r"no part from teller-0, teller-1 within 0\.5 s"):
        await run.snapshot()
    stored = await store.list_snapshots(run.run_id)
    assert [s.status for s in stored] == ["failed"]


def _later() -> datetime:
    return utcnow() + timedelta(seconds=30)


async def test_a_worker_asks_the_coordinator_for_a_snapshot_and_cannot_begin_one(
    nats_url: str,
    teardown: Teardown,
) -> None:
    store = MemoryStore()
    links = await teardown.links(nats_url, 2)
    run = DistributedRun(links[0], store, bank(2))
    worker = Worker(links[1], store, run.run_id, bank(2), ["teller-0", "teller-1"], name="w")
    teardown.worker(worker)
    teardown.run(run)
    await run.start()
    await worker.start()
    with pytest.raises(ConfigurationError, match="request_snapshot"):
        worker.host.coordinator.begin(None)
    await worker.request_snapshot()
    for _ in range(int(PATIENCE / 0.05)):
        if run.complete:
            break
        await asyncio.sleep(0.05)
    assert [s.seq for s in run.complete] == [1]
    assert set(run.complete[0].agents) == {ENVIRONMENT, "teller-0", "teller-1"}


class Scribe(Agent[AgentState]):
    """Asks its model for a line about each message, then passes the message on."""

    def __init__(self, name: str, to: str | None) -> None:
        super().__init__(name)
        self.to = to
        self.model = SampledModel([("line", [f"line {i}" for i in range(100)])])

    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        line = await self.model.complete(f"a line about {message.payload}")
        self.state.memory[message.id] = line
        if self.to is not None:
            ctx.send(self.to, message.payload, kind="pass")


def scribes() -> App:
    return App(agents=[Scribe("s0", "s1"), Scribe("s1", None)])


async def test_model_calls_of_a_run_over_hosts_are_recorded_on_the_runs_timeline(
    nats_url: str,
    teardown: Teardown,
) -> None:
    store = MemoryStore()
    links = await teardown.links(nats_url, 3)
    run = DistributedRun(links[0], store, scribes(), part_timeout=30)
    apps = [scribes(), scribes()]
    workers = [
        Worker(link, store, run.run_id, app, [name], name=f"w{i}")
        for i, (link, app, name) in enumerate(zip(links[1:], apps, ["s0", "s1"], strict=True))
    ]
    teardown.workers(workers)
    teardown.stream(run)
    await start(run, *workers)
    for i in range(5):
        run.send("s0", {"n": i}, kind="go")
    async with asyncio.timeout(PATIENCE):
        await run.run_until_idle()
    for worker, app, name in zip(workers, apps, ["s0", "s1"], strict=True):
        ledger = worker.host.ledger
        assert isinstance(ledger, ModelCallLog)
        calls = await ledger.list_model_calls(run.run_id)
        (agent,) = [a for a in app.agents if a.name == name]
        memory = agent.state.memory
        assert len(memory) == 5
        assert sorted(c.message_id for c in calls) == sorted(memory), (
            "every handled message's model call is recorded"
        )
        assert {(c.agent, c.position, c.timeline) for c in calls} == {(name, 0, 0)}
        for call in calls:
            assert memory[call.message_id] == call.answer().text
    await run.close()


async def test_a_redacted_run_over_hosts_stores_only_markers(
    nats_url: str, teardown: Teardown
) -> None:
    # The app's policy reaches the run's coordinator and a worker that takes it from the
    # app; another worker is given its own (the same one).
    policy = Redaction(state=["balance"], payload=["amount"], key="distributed key")
    store = MemoryStore()
    app = dataclasses.replace(bank(4), redact=policy)
    hosts = [{"teller-0", "teller-1"}, {"teller-2", "teller-3"}]
    links = await teardown.links(nats_url, 3)
    run = DistributedRun(
        links[0], store, app, policy=SnapshotPolicy(every_seconds=0.05), part_timeout=30
    )
    workers = [
        Worker(
            links[1],
            store,
            run.run_id,
            dataclasses.replace(bank(4), redact=policy),
            hosts[0],
            name="w0",
        ),
        Worker(links[2], store, run.run_id, bank(4), hosts[1], name="w1", redact=policy),
    ]
    teardown.workers(workers)
    teardown.stream(run)
    await start(run, *workers)
    await transfers(run, 4, 8, 10)
    await run.close()
    assert run.complete
    for snapshot in run.complete:
        stored = await store.load_snapshot(snapshot.id)
        for name, cut in stored.agents.items():
            if name != ENVIRONMENT:
                assert str(cut.state["balance"]).startswith("[redacted int hmac:"), name
        for channel in stored.channels:
            for message in channel.messages:
                payload = message.payload
                amount = payload.get("amount") if isinstance(payload, dict) else None
                assert amount is None or str(amount).startswith("[redacted int hmac:")
