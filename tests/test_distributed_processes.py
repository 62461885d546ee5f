"""Agents across OS processes: three ``agentsnap worker`` processes, NATS and PostgreSQL.

The test process is the run's coordinator: it creates the run, sends the input and begins a
snapshot every tenth of a second; three worker processes host nine tellers (placed by
``--group N/3``) that move money among themselves at random, with short random pauses in
their handlers. Every complete snapshot stored must be a consistent cut that holds the bank's
money, and several must have caught transfers in flight between processes.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from distributed_teardown import Teardown
from nats_server import SHARED_URL, reachable, unavailable
from teller_app import BALANCE, make_app, money_in
from worker_processes import worker_command, worker_env

from agentsnap.distributed import DistributedRun, group_of
from agentsnap.integrity import cut_problems
from agentsnap.jetstream import JetStreamLink
from agentsnap.messages import ENVIRONMENT
from agentsnap.records import SnapshotStatus
from agentsnap.snapshot import SnapshotPolicy
from agentsnap.store.sql import SqlStore

PATIENCE = 120.0
"""Seconds the run may take (never reached when green)."""
TELLERS = 9
GROUPS = 3

pytestmark = pytest.mark.postgres


@pytest.fixture
def nats_url() -> str:
    if not reachable(SHARED_URL):
        unavailable(f"no NATS server at {SHARED_URL}")
    return SHARED_URL


@pytest.fixture
async def store(postgres_url: str) -> AsyncIterator[SqlStore]:
    made = SqlStore(postgres_url)
    try:
        yield made
    finally:
        await made.close()


async def until_up(logs: list[Path]) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + PATIENCE
    while not all(" hosts " in log.read_text() for log in logs):
        assert loop.time() < deadline, [log.read_text() for log in logs]
        await asyncio.sleep(0.05)


async def test_three_worker_processes_store_consistent_cuts_of_one_bank(
    nats_url: str, postgres_url: str, store: SqlStore, tmp_path: Path, teardown: Teardown
) -> None:
    link = teardown.link(await JetStreamLink.connect(nats_url))
    run = DistributedRun(
        link, store, make_app(), policy=SnapshotPolicy(every_seconds=0.1), part_timeout=60
    )
    workers = teardown.processes()
    logs = [tmp_path / f"worker-{n}.log" for n in range(GROUPS)]
    teardown.stream(run)
    await run.start()
    for n, log in enumerate(logs):
        args = ["--nats", nats_url, "--db", postgres_url, "--app", "teller_app:make_app"]
        args += ["--run", run.run_id, "--group", f"{n}/{GROUPS}"]
        with log.open("wb") as out:
            workers.append(
                await asyncio.create_subprocess_exec(
                    *worker_command(*args), env=worker_env(TELLERS), stdout=out, stderr=out
                )
            )
    await until_up(logs)
    for i in range(90):
        run.send(f"teller-{i % TELLERS}", {"hops": 40}, kind="go")
        await asyncio.sleep(0.01)
    async with asyncio.timeout(PATIENCE):
        await run.run_until_idle()
    await run.close()
    for process in workers:
        process.send_signal(signal.SIGTERM)
    for process, log in zip(workers, logs, strict=True):
        assert await asyncio.wait_for(process.wait(), PATIENCE) == 0, log.read_text()
    await teardown.close()

    stored = await store.list_snapshots(run.run_id)
    complete = [s for s in stored if s.status is SnapshotStatus.COMPLETE]
    assert len(complete) >= 5, [(s.seq, s.status, s.error) for s in stored]
    group = {name: group_of(name, GROUPS) for name in make_app().names}
    crossing = 0
    for snapshot in complete:
        assert cut_problems(snapshot) == [], snapshot.seq
        assert money_in(snapshot) == TELLERS * BALANCE, snapshot.seq
        assert set(snapshot.agents) == {ENVIRONMENT, *group}
        crossing += any(
            ch.messages
            for ch in snapshot.channels
            if ch.src != ENVIRONMENT and group[ch.src] != group[ch.dst]
        )
    assert crossing >= 3, f"{crossing} of {len(complete)} cuts caught money between processes"
    # The workers' parts stay, with the stream ranges of what was in flight between them.
    parts = await store.load_snapshot_parts(run.run_id, complete[-1].seq)
    assert "coordinator" in {p.worker for p in parts}
    assert len(parts) == GROUPS + 1
