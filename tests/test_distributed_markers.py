"""Markers only where they are needed: channels between processes idle since the last cut.

A channel to another process on which nothing was sent since its sender's last recording
takes no marker; its receiver closes it by the count its sender's process tells. These tests
read every item the run's stream stored and check, per channel, that each marker of an agent
follows a message sent after the marker before it (or after the start), that a snapshot of a
quiet run sends only the environment's markers, and that every cut stored is consistent and
holds the bank's money, with money moving at random between processes on the default
scheduler.

``AGENTSNAP_MARKERS_TELLERS`` sets how many tellers the in-process test runs (30 by default;
300 for a nightly run).
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest
from distributed_teardown import Teardown
from nats.js.errors import NotFoundError
from nats_server import SHARED_URL, OwnServer, reachable, server_binary, unavailable
from teller_app import BALANCE, Teller, TellerState, bank, money_in
from worker_processes import worker_command, worker_env

from agentsnap import Context, MemoryStore, Snapshot
from agentsnap.distributed import App, DistributedRun, Worker, group_of
from agentsnap.integrity import cut_problems
from agentsnap.jetstream import JetStreamLink
from agentsnap.jetstream.codec import decode, stream_name
from agentsnap.messages import ENVIRONMENT, Marker, Message
from agentsnap.records import SnapshotStatus
from agentsnap.snapshot import SnapshotPolicy
from agentsnap.store.sql import SqlStore

PATIENCE = 120.0
"""Seconds a run may take (never reached when green)."""
PEERS = 3
"""Each teller sends to the three tellers after it."""


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


class Traffic:
    """What a run's stream holds: its markers and messages, per channel."""

    def __init__(self) -> None:
        self.markers: dict[tuple[str, str], list[Marker]] = defaultdict(list)
        self.after: dict[tuple[str, str, int], int] = {}
        self.carried: set[tuple[str, str]] = set()

    def agent_markers(self) -> Counter[int]:
        """Per snapshot number, the markers agents (not the environment) sent."""
        return Counter(
            m.snapshot for (src, _), ms in self.markers.items() if src != ENVIRONMENT for m in ms
        )

    def environment_markers(self) -> Counter[int]:
        """Per snapshot number, the markers the environment sent."""
        return Counter(
            m.snapshot for (src, _), ms in self.markers.items() if src == ENVIRONMENT for m in ms
        )

    def idle_markers(self) -> list[str]:
        """Markers of agents sent on a channel that carried nothing since the marker before."""
        wrong = []
        for (src, dst), markers in self.markers.items():
            if src == ENVIRONMENT:
                continue
            before = 0
            for marker in sorted(markers, key=lambda m: m.snapshot):
                after = self.after[src, dst, marker.snapshot]
                if after <= before:
                    wrong.append(f"{src}>{dst} #{marker.snapshot} after message {after}")
                before = after
        return wrong


async def read_stream(link: JetStreamLink, run_id: str) -> Traffic:
    """Every item the run's stream holds, decoded."""
    stream = stream_name(run_id)
    info = await link.js.stream_info(stream)
    traffic = Traffic()
    seen: set[str] = set()
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        try:
            raw = await link.js.get_msg(stream, seq)
        except NotFoundError:
            continue
        if raw.subject and ".%24order." in raw.subject:
            continue  # a worker's delivery order, secured beside the channels
        envelope = decode(raw.headers or {}, raw.data or b"")
        if envelope.id in seen:
            continue  # a copy stored after the duplicate window
        seen.add(envelope.id)
        item = envelope.item
        key = (item.src, item.dst)
        if type(item) is Marker:
            traffic.markers[key].append(item)
            traffic.after[item.src, item.dst, item.snapshot] = envelope.key[1]
        else:
            assert type(item) is Message
            traffic.carried.add(key)
    return traffic


def check_cuts(complete: list[Snapshot], tellers: int) -> None:
    for snapshot in complete:
        assert cut_problems(snapshot) == [], snapshot.seq
        assert money_in(snapshot) == tellers * BALANCE, snapshot.seq


async def test_random_transfers_across_worker_processes_skip_idle_channels(
    nats_url: str, postgres_url: str, tmp_path: Path, teardown: Teardown
) -> None:
    tellers, groups = 12, 3
    store = teardown.store(SqlStore(postgres_url))
    link = teardown.link(await JetStreamLink.connect(nats_url))
    app = bank(tellers, peers=PEERS)
    run = DistributedRun(
        link, store, app, policy=SnapshotPolicy(every_seconds=0.05), part_timeout=60
    )
    teardown.stream(run)
    workers = teardown.processes()
    logs = [tmp_path / f"worker-{n}.log" for n in range(groups)]
    await run.start()
    env = {**worker_env(tellers), "BANK_PEERS": str(PEERS)}
    for n, log in enumerate(logs):
        args = ["--nats", nats_url, "--db", postgres_url, "--app", "teller_app:make_app"]
        args += ["--run", run.run_id, "--group", f"{n}/{groups}"]
        with log.open("wb") as out:
            workers.append(
                await asyncio.create_subprocess_exec(
                    *worker_command(*args), env=env, stdout=out, stderr=out
                )
            )
    loop = asyncio.get_running_loop()
    deadline = loop.time() + PATIENCE
    while not all(" hosts " in log.read_text() for log in logs):
        assert loop.time() < deadline, [log.read_text() for log in logs]
        await asyncio.sleep(0.05)
    for i in range(60):
        run.send(f"teller-{i % tellers}", {"hops": 30}, kind="go")
        await asyncio.sleep(0.005)
    async with asyncio.timeout(PATIENCE):
        await run.run_until_idle()
        quiet = [await run.snapshot().wait() for _ in range(2)]
    await run.close()
    for process in workers:
        process.send_signal(signal.SIGTERM)
    for process, log in zip(workers, logs, strict=True):
        assert await asyncio.wait_for(process.wait(), PATIENCE) == 0, log.read_text()
    traffic = await read_stream(link, run.run_id)
    stored = await store.list_snapshots(run.run_id)
    await teardown.close()

    complete = [s for s in stored if s.status is SnapshotStatus.COMPLETE]
    assert len(complete) >= 5, [(s.seq, s.status, s.error) for s in stored]
    check_cuts(complete, tellers)
    group = {name: group_of(name, groups) for name in app.names}
    crossing = sum(
        any(
            ch.messages
            for ch in s.channels
            if ch.src != ENVIRONMENT and group[ch.src] != group[ch.dst]
        )
        for s in complete
    )
    assert crossing, "no cut caught money between processes"
    # No agent sent a marker on a channel that carried nothing since its marker before, and
    # none on a channel that never carried a message.
    assert traffic.idle_markers() == []
    assert {key for key, ms in traffic.markers.items() if key[0] != ENVIRONMENT} <= traffic.carried
    between = sum(group[a] != group[b] for a in app.names for b in app.names if a != b)
    recordings = max(s.seq for s in stored)
    assert sum(traffic.agent_markers().values()) < recordings * between
    # A snapshot of a quiet run: the environment's markers only, one per teller.
    for snapshot in quiet:
        assert traffic.agent_markers()[snapshot.seq] == 0
        assert traffic.environment_markers()[snapshot.seq] == tellers


async def test_markers_per_snapshot_grow_with_the_channels_that_carried_messages(
    nats_url: str,
    teardown: Teardown,
) -> None:
    tellers = int(os.environ.get("AGENTSNAP_MARKERS_TELLERS", "30"))
    hosts = 3
    store = MemoryStore()
    app = bank(tellers, peers=PEERS)
    placed = [[n for n in app.names if group_of(n, hosts) == h] for h in range(hosts)]
    links = await teardown.links(nats_url, hosts + 1)
    run = DistributedRun(links[0], store, app, part_timeout=60)
    workers = [
        Worker(link, store, run.run_id, bank(tellers, peers=PEERS), agents, name=f"w{i}")
        for i, (link, agents) in enumerate(zip(links[1:], placed, strict=True))
    ]
    teardown.workers(workers)
    teardown.stream(run)
    await run.start()
    for worker in workers:
        await worker.start()
    busy: list[Snapshot] = []
    async with asyncio.timeout(PATIENCE):
        for round_ in range(3):
            for i in range(tellers):
                run.send(f"teller-{i}", {"hops": 4 + round_}, kind="go")
            busy.append(await run.snapshot().wait())
        await run.run_until_idle()
        quiet = await run.snapshot().wait()
    await run.close()
    traffic = await read_stream(links[0], run.run_id)
    held = [len(worker.host.bus.channels) for worker in workers]
    await teardown.close()

    check_cuts([*busy, quiet], tellers)
    # Channels are made on first use: a worker holds the environment's channel to every
    # teller and those its tellers used (at most PEERS out and PEERS in each), not one
    # between each of its tellers and every other.
    for agents, count in zip(placed, held, strict=True):
        assert count <= tellers + 2 * PEERS * len(agents), (count, len(agents))
    assert traffic.idle_markers() == []
    agent = traffic.agent_markers()
    environment = traffic.environment_markers()
    # Per snapshot: one marker per teller from the environment, and at most one per channel
    # that carried a message, of the tellers * PEERS channels (not tellers squared).
    used = {key for key in traffic.carried if key[0] != ENVIRONMENT}
    assert len(used) <= tellers * PEERS
    for snapshot in [*busy, quiet]:
        assert environment[snapshot.seq] == tellers
        assert agent[snapshot.seq] <= len(used)
    assert any(agent[s.seq] for s in busy), "no snapshot caught a channel carrying messages"
    assert agent[quiet.seq] == 0
    # The quiet snapshot skipped the marker of every channel that carried messages before.
    skipped = sum(worker.host.coordinator.markers_skipped for worker in workers)
    assert skipped >= len(used)


class Careful(Teller):
    """A teller that checks its own work: what it sends is held back while it thinks."""

    async def evaluate(self, outputs: Sequence[Message], ctx: Context[TellerState]) -> None:
        await asyncio.sleep(self.rng.uniform(0, 0.01))


def careful_bank(tellers: int) -> App:
    everyone = [f"teller-{i}" for i in range(tellers)]
    return App(
        agents=[
            Careful(name, [everyone[(i + k) % tellers] for k in range(1, PEERS + 1)])
            for i, name in enumerate(everyone)
        ]
    )


async def test_a_message_held_back_at_a_recording_still_takes_its_marker(
    nats_url: str, teardown: Teardown
) -> None:
    tellers, hosts = 9, 3
    store = MemoryStore()
    app = careful_bank(tellers)
    placed = [[n for n in app.names if group_of(n, hosts) == h] for h in range(hosts)]
    links = await teardown.links(nats_url, hosts + 1)
    run = DistributedRun(
        links[0], store, app, policy=SnapshotPolicy(every_seconds=0.01), part_timeout=60
    )
    workers = [
        Worker(link, store, run.run_id, careful_bank(tellers), agents, name=f"w{i}")
        for i, (link, agents) in enumerate(zip(links[1:], placed, strict=True))
    ]
    teardown.workers(workers)
    teardown.stream(run)
    await run.start()
    for worker in workers:
        await worker.start()
    for i in range(tellers * 3):
        run.send(f"teller-{i % tellers}", {"hops": 12}, kind="go")
    async with asyncio.timeout(PATIENCE):
        await run.run_until_idle()
    await run.close()
    traffic = await read_stream(links[0], run.run_id)
    await teardown.close()

    assert len(run.complete) >= 5
    check_cuts(run.complete, tellers)
    # Recordings found messages held back: numbered since the marker before, so the channel
    # took a marker, but not visible yet, so no message came between the two.
    assert traffic.idle_markers(), "no recording found a message held back"
    assert sum(worker.host.coordinator.markers_skipped for worker in workers)
