"""A run spread over processes outlives a restart of its NATS server.

The test starts a ``nats-server`` of its own (its own port and storage), makes itself the
run's coordinator with snapshots by policy, and starts three ``agentsnap worker`` processes
on the bank. Mid-run it stops the server and, a few seconds later, starts it again on the
same port and storage. The run must go on where it stopped and finish: every chain of
transfers completes (each hop handled exactly once: nothing lost, nothing delivered twice),
every complete snapshot holds the bank's money, and the snapshots begun while the server was
away fail with a reason instead of hanging.

A worker whose server stays away gives up after ``--nats-patience`` seconds, saying so.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from distributed_teardown import Teardown
from nats_server import OwnServer, server_binary, unavailable
from teller_app import BALANCE, TellerState, make_app, money_in
from worker_processes import worker_command, worker_env

from agentsnap import RunInfo, Snapshot, SnapshotFailed
from agentsnap.distributed import DistributedRun
from agentsnap.integrity import cut_problems
from agentsnap.jetstream import JetStreamLink
from agentsnap.messages import ENVIRONMENT
from agentsnap.records import SnapshotStatus
from agentsnap.snapshot import SnapshotPolicy
from agentsnap.store.sql import SqlStore

PATIENCE = 180.0
"""Seconds the run may take (never reached when green)."""
TELLERS = 9
GROUPS = 3
CHAINS = 60
HOPS = 40

pytestmark = pytest.mark.postgres


@pytest.fixture
def server(tmp_path: Path) -> Iterator[OwnServer]:
    binary = server_binary()
    if binary is None:
        unavailable("no nats-server binary to stop and start")
        return
    own = OwnServer(binary, tmp_path / "jetstream")
    own.start()
    try:
        yield own
    finally:
        own.stop()


@pytest.fixture
async def store(postgres_url: str) -> AsyncIterator[SqlStore]:
    made = SqlStore(postgres_url)
    try:
        yield made
    finally:
        await made.close()


async def until(condition: object, what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + PATIENCE
    while not condition():  # type: ignore[operator]
        assert loop.time() < deadline, f"not {what} within {PATIENCE} s"
        await asyncio.sleep(0.05)


def handled(snapshot: Snapshot) -> int:
    return sum(
        TellerState.model_validate(cut.state).handled
        for name, cut in snapshot.agents.items()
        if name != ENVIRONMENT
    )


async def test_a_run_goes_on_after_its_nats_server_restarts(
    server: OwnServer, postgres_url: str, store: SqlStore, tmp_path: Path, teardown: Teardown
) -> None:
    link = teardown.link(await JetStreamLink.connect(server.url))
    run = DistributedRun(
        link, store, make_app(), policy=SnapshotPolicy(every_seconds=0.1), part_timeout=8
    )
    workers = teardown.processes()
    logs = [tmp_path / f"worker-{n}.log" for n in range(GROUPS)]
    teardown.stream(run)
    await run.start()
    for n, log in enumerate(logs):
        args = ["--nats", server.url, "--db", postgres_url]
        args += ["--app", "teller_app:make_app", "--run", run.run_id]
        args += ["--group", f"{n}/{GROUPS}", "--nats-patience", "120"]
        with log.open("wb") as out:
            workers.append(
                await asyncio.create_subprocess_exec(
                    *worker_command(*args), env=worker_env(TELLERS), stdout=out, stderr=out
                )
            )
    await until(lambda: all(" hosts " in log.read_text() for log in logs), "up")
    for i in range(CHAINS):
        run.send(f"teller-{i % TELLERS}", {"hops": HOPS}, kind="go")
    await until(lambda: len(run.complete) >= 3, "three snapshots complete")
    before = len(run.complete)
    # The server goes away mid-run: the newest cut shows hops still to be handled.
    assert handled(run.complete[-1]) < CHAINS * (HOPS + 1)
    await asyncio.to_thread(server.stop)
    await asyncio.sleep(3)  # snapshots are begun meanwhile, by the policy
    down = run.snapshot()
    await asyncio.to_thread(server.start)
    with pytest.raises(SnapshotFailed):
        await down  # its markers went nowhere for a while: it fails, and says why
    async with asyncio.timeout(PATIENCE):
        last = await run.run_until_idle()
    await run.close()
    assert link.reconnects >= 1
    for process in workers:
        process.send_signal(signal.SIGTERM)
    for process, log in zip(workers, logs, strict=True):
        assert await asyncio.wait_for(process.wait(), PATIENCE) == 0, log.read_text()
    await teardown.close()

    # Every hop of every chain was handled once: nothing lost, nothing taken twice.
    assert handled(last) == CHAINS * (HOPS + 1)
    stored = await store.list_snapshots(run.run_id)
    complete = [s for s in stored if s.status is SnapshotStatus.COMPLETE]
    assert len(complete) > before, "no snapshot completed after the restart"
    for snapshot in complete:
        assert cut_problems(snapshot) == [], snapshot.seq
        assert money_in(snapshot) == TELLERS * BALANCE, snapshot.seq
    failed = [s for s in stored if s.status is SnapshotStatus.FAILED]
    assert failed, "no snapshot begun while the server was away failed"
    assert all(s.error for s in failed)


async def test_a_worker_whose_nats_server_stays_away_gives_up(
    server: OwnServer, postgres_url: str, store: SqlStore, tmp_path: Path
) -> None:
    processes = sorted([ENVIRONMENT, *make_app().names])
    await store.create_run(RunInfo(id="bank-away", metadata={"processes": processes}))
    log = tmp_path / "worker.log"
    args = ["--nats", server.url, "--db", postgres_url, "--app", "teller_app:make_app"]
    args += ["--run", "bank-away", "--group", "0/3", "--nats-patience", "2"]
    with log.open("wb") as out:
        process = await asyncio.create_subprocess_exec(
            *worker_command(*args), env=worker_env(TELLERS), stdout=out, stderr=out
        )
    try:
        await until(lambda: " hosts " in log.read_text() or process.returncode is not None, "up")
        assert process.returncode is None, log.read_text()
        await asyncio.to_thread(server.stop)
        status = await asyncio.wait_for(process.wait(), PATIENCE)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    text = log.read_text()
    assert status == 1, text
    assert "Traceback" not in text
    assert server.url in text
    assert "gave up" in text
