"""Retention of a run spread over processes: its stream and its snapshot parts.

With a ``StreamRetention`` the coordinator purges the run's stream below what the oldest
snapshot it keeps needs, and deletes the parts of the snapshots before it; the run goes on
unharmed (nothing a worker had still to take is purged), and every kept snapshot's channels
can still be read back from the stream at their recorded ranges. ``agentsnap runs delete`` and
``runs prune`` given ``--nats URL`` delete the runs' streams too, and delete nothing at all
when that server does not answer.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from distributed_teardown import Teardown
from nats_server import SHARED_URL, OwnServer, free_port, reachable, server_binary, unavailable
from teller_app import Transfer, bank, finished, money_in

from agentsnap import ConfigurationError, MemoryStore, RunInfo, Snapshot
from agentsnap.distributed import DistributedRun, StreamRetention, Worker, retain
from agentsnap.integrity import cut_problems
from agentsnap.jetstream import JetStreamLink
from agentsnap.jetstream.codec import decode, stream_name
from agentsnap.messages import Message
from agentsnap.records import SnapshotPart
from agentsnap.snapshot import SnapshotPolicy
from agentsnap.store.sql import SqlStore

PATIENCE = 120.0
TELLERS = 6


@pytest.fixture
async def nats_url(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[str]:
    if reachable(SHARED_URL):
        yield SHARED_URL
        return
    binary = server_binary()
    if binary is None:
        unavailable(f"no NATS server at {SHARED_URL} and no nats-server binary")
        return
    server = OwnServer(binary, tmp_path_factory.mktemp("jetstream"))
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


def test_a_retention_keeps_at_least_one_snapshot() -> None:
    with pytest.raises(ConfigurationError, match="keep=0"):
        StreamRetention(keep=0)
    with pytest.raises(ConfigurationError, match="every=0"):
        StreamRetention(every=0)


async def run_the_bank(
    nats_url: str, store: MemoryStore, retention: StreamRetention | None
) -> tuple[DistributedRun, Snapshot]:
    """Run the bank on two workers to its end; its stream is left for the test to delete."""
    async with Teardown() as opened:
        links = await opened.links(nats_url, 3)
        run = DistributedRun(
            links[0],
            store,
            bank(TELLERS),
            policy=SnapshotPolicy(every_seconds=0.05),
            part_timeout=30,
            retention=retention,
        )
        hosts = [["teller-0", "teller-1", "teller-2"], ["teller-3", "teller-4", "teller-5"]]
        workers = opened.workers(
            Worker(link, store, run.run_id, bank(TELLERS), agents, name=f"w{i}")
            for i, (link, agents) in enumerate(zip(links[1:], hosts, strict=True))
        )
        await run.start()
        for worker in workers:
            await worker.start()
        for i in range(40):
            run.send(f"teller-{i % TELLERS}", {"hops": 60}, kind="go")
        async with asyncio.timeout(PATIENCE):
            last = await run.run_until_idle()
        await run.close()
    return run, last


@pytest.fixture
async def link(nats_url: str) -> AsyncIterator[JetStreamLink]:
    made = await JetStreamLink.connect(nats_url)
    try:
        yield made
    finally:
        await made.close()


async def test_the_coordinator_purges_as_snapshots_complete_and_the_run_goes_on(
    nats_url: str, link: JetStreamLink, teardown: Teardown
) -> None:
    store = MemoryStore()
    run, last = await run_the_bank(nats_url, store, StreamRetention(keep=2, every=3))
    teardown.stream_of(run.run_id, link)
    assert run.retainer is not None
    passes = run.retainer.passes
    assert passes, f"no retention pass in {len(run.complete)} complete snapshots"
    assert all(p.purged_below > 1 for p in passes)
    assert sum(p.parts_deleted for p in passes) > 0
    # The run finished whole: nothing a worker still had to take was purged.
    assert finished(last)
    for snapshot in run.complete:
        assert cut_problems(snapshot) == []
        assert money_in(snapshot) == TELLERS * 1_000
    newest = passes[-1]
    info = await link.js.stream_info(stream_name(run.run_id))
    assert info.state.first_seq >= newest.purged_below
    for seq in range(1, newest.oldest):
        assert await store.load_snapshot_parts(run.run_id, seq) == []
    for snapshot in run.complete:
        if snapshot.seq >= newest.oldest:
            assert await store.load_snapshot_parts(run.run_id, snapshot.seq)
    # The snapshots themselves all stay.
    stored = await store.list_snapshots(run.run_id)
    assert {s.seq for s in run.complete} <= {s.seq for s in stored}


async def test_a_kept_snapshots_channels_are_still_in_the_stream_at_their_ranges(
    nats_url: str, link: JetStreamLink, teardown: Teardown
) -> None:
    store = MemoryStore()
    run, _ = await run_the_bank(nats_url, store, None)
    teardown.stream_of(run.run_id, link)
    # The cut with the most messages in flight between the hosts, and not the first.
    crossing = {
        s.seq: sum(o.count for p in await store.load_snapshot_parts(run.run_id, s.seq)
                   for o in p.offsets)
        for s in run.complete[1:]
    }  # fmt: skip
    oldest = max(crossing, key=lambda seq: crossing[seq])
    assert crossing[oldest] > 0, "no cut caught a message between the hosts"
    parts = await store.load_snapshot_parts(run.run_id, oldest)
    floor = min(o.first_seq for p in parts for o in p.offsets)

    done = await retain(link, store, run.run_id, oldest)

    assert done.oldest == oldest
    assert done.purged_below == floor > 1
    info = await link.js.stream_info(stream_name(run.run_id))
    assert info.state.first_seq == floor
    for seq in range(1, oldest):
        assert await store.load_snapshot_parts(run.run_id, seq) == []
    assert await store.load_snapshot_parts(run.run_id, oldest) == parts
    snapshot = next(s for s in run.complete if s.seq == oldest)
    for offsets in (o for p in parts for o in p.offsets if o.count):
        # The first message in flight is still in the stream, where the part says.
        raw = await link.js.get_msg(stream_name(run.run_id), offsets.first_seq)
        item = decode(raw.headers or {}, raw.data or b"").item
        assert isinstance(item, Message)
        assert item.id == snapshot.in_flight(offsets.src, offsets.dst)[0].id
        Transfer.model_validate(item.payload)


# -- deleting runs deletes their streams ---------------------------------------------------


def agentsnap(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agentsnap", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture
async def runs_with_streams(
    tmp_path: Path, link: JetStreamLink
) -> AsyncIterator[tuple[str, list[str]]]:
    """An SQLite database with three runs, each with a stream on the server."""
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    ids = [f"del-{uuid.uuid4().hex[:12]}" for _ in range(3)]
    store = SqlStore(url)
    try:
        for run_id in ids:
            await store.create_run(RunInfo(id=run_id))
            await store.save_snapshot_part(SnapshotPart(run_id=run_id, seq=1, worker="w"))
            await link.ensure_stream(run_id)
    finally:
        await store.close()
    try:
        yield url, ids
    finally:
        for run_id in ids:
            await link.delete_stream(run_id)


async def test_deleting_runs_with_nats_deletes_their_streams(
    runs_with_streams: tuple[str, list[str]], link: JetStreamLink, nats_url: str
) -> None:
    url, (first, second, third) = runs_with_streams
    dry = await asyncio.to_thread(
        agentsnap, "runs", "delete", first, "--db", url, "--nats", nats_url, "--dry-run", "--json"
    )
    assert dry.returncode == 0, dry.stderr
    assert json.loads(dry.stdout)["streams"] == [stream_name(first)]
    assert await link.has_stream(first)

    done = await asyncio.to_thread(
        agentsnap, "runs", "delete", first, "--db", url, "--nats", nats_url, "--yes"
    )
    assert done.returncode == 0, done.stderr
    assert f"deleted 1 NATS stream: {stream_name(first)}" in done.stdout
    assert not await link.has_stream(first)
    assert await link.has_stream(second)

    # Without --nats the stream stays (the database alone is asked).
    done = await asyncio.to_thread(agentsnap, "runs", "delete", second, "--db", url, "--yes")
    assert done.returncode == 0, done.stderr
    assert await link.has_stream(second)

    pruned = await asyncio.to_thread(
        agentsnap, "runs", "prune", "--keep", "0", "--db", url, "--nats", nats_url, "--yes",
        "--json",
    )  # fmt: skip
    assert pruned.returncode == 0, pruned.stderr
    assert json.loads(pruned.stdout)["streams"] == [stream_name(third)]
    assert not await link.has_stream(third)
    store = SqlStore(url, create=False)
    try:
        assert await store.list_runs() == []
    finally:
        await store.close()


async def test_an_unreachable_nats_server_deletes_nothing(
    runs_with_streams: tuple[str, list[str]], link: JetStreamLink
) -> None:
    url, (first, *_) = runs_with_streams
    nowhere = f"nats://127.0.0.1:{free_port()}"
    done = await asyncio.to_thread(
        agentsnap, "runs", "delete", first, "--db", url, "--nats", nowhere, "--yes"
    )
    assert done.returncode == 1
    assert nowhere in done.stderr
    assert "Traceback" not in done.stderr
    store = SqlStore(url, create=False)
    try:
        assert (await store.get_run(first)).id == first
        assert await store.load_snapshot_parts(first, 1) != []
    finally:
        await store.close()
    assert await link.has_stream(first)
