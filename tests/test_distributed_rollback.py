"""Rollback across processes and recovery of killed workers: real processes, NATS, PostgreSQL.

The test process is the run's coordinator; three ``agentsnap worker`` processes host nine
tellers (``--group N/3``) of the bank in ``distributed_effects.py``, whose every transfer is
booked by a side-effecting tool in a table outside the ledger. A check rejects careless
transfers; a rejected output anywhere rolls every process back to the last complete cut, and
a killed worker's agents, hosted again, roll the whole run back the same way. Whatever
happens, every complete snapshot is a consistent cut that holds the bank's money, every
transfer is booked exactly once, and every chain of transfers completes.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from distributed_effects import (
    BALANCE,
    TellerState,
    chain_start,
    create_effects_table,
    effects,
    finished,
    make_app,
    money_in,
    route,
)
from distributed_teardown import Teardown
from nats_server import SHARED_URL, reachable, unavailable

from agentsnap import RollbackExhausted, Snapshot, SnapshotFailed
from agentsnap.distributed import DistributedRun, group_of
from agentsnap.integrity import cut_problems
from agentsnap.jetstream import JetStreamLink
from agentsnap.ledger import ToolCallStatus
from agentsnap.records import SnapshotStatus
from agentsnap.snapshot import SnapshotPolicy
from agentsnap.store.ledger import ledger_for
from agentsnap.store.sql import SqlStore

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PATIENCE = 150.0
"""Seconds a step may take (never reached when green)."""
TELLERS = 9
GROUPS = 3
TOTAL = TELLERS * BALANCE

pytestmark = pytest.mark.postgres


@pytest.fixture
def nats_url() -> str:
    if not reachable(SHARED_URL):
        unavailable(f"no NATS server at {SHARED_URL}")
    return SHARED_URL


@pytest.fixture
async def store(postgres_url: str) -> AsyncIterator[SqlStore]:
    made = SqlStore(postgres_url)
    create_effects_table(postgres_url)
    try:
        yield made
    finally:
        await made.close()


class Workers:
    """The worker processes of one run, each with its log."""

    def __init__(self, run_id: str, nats_url: str, postgres_url: str, tmp: Path, poison: str):
        self.run_id = run_id
        self.nats_url = nats_url
        self.postgres_url = postgres_url
        self.tmp = tmp
        self.poison = poison
        self.processes: dict[int, asyncio.subprocess.Process] = {}
        self.logs: list[Path] = []
        self.started = 0
        self.stubborn = False
        self.outage: dict[int, str] = {}
        """Per group, the database's outage for its ledger claims (``BANK_OUTAGE``)."""

    def env(self, group: int) -> dict[str, str]:
        path = os.pathsep.join([str(ROOT), str(HERE), os.environ.get("PYTHONPATH", "")])
        return {
            **os.environ,
            "PYTHONPATH": path,
            "BANK_TELLERS": str(TELLERS),
            "BANK_POISON": self.poison,
            "BANK_STUBBORN": "1" if self.stubborn else "0",
            # Derived keys for half of the effects where the run keeps its timeline: crashes,
            # work lost to the database.
            "BANK_DERIVED": "0" if self.poison else "1",
            "BANK_OUTAGE": self.outage.get(group, ""),
            "AGENTSNAP_EFFECTS_URL": self.postgres_url,
        }

    async def start(self, group: int, *, lease: float = 10.0, wait: float = 0.0) -> Path:
        log = self.tmp / f"worker-{group}-{self.started}.log"
        self.started += 1
        self.logs.append(log)
        args = ["--nats", self.nats_url, "--db", self.postgres_url]
        args += ["--app", "distributed_effects:make_app", "--run", self.run_id]
        args += ["--group", f"{group}/{GROUPS}", "--lease", str(lease), "--wait", str(wait)]
        with log.open("wb") as out:
            self.processes[group] = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "agentsnap", "worker", *args,
                env=self.env(group), stdout=out, stderr=out,
            )  # fmt: skip
        return log

    async def until_up(self, logs: list[Path]) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + PATIENCE
        while not all(" hosts " in log.read_text() for log in logs):
            assert loop.time() < deadline, [log.read_text() for log in logs]
            await asyncio.sleep(0.05)

    async def stop(self) -> None:
        for process in self.processes.values():
            if process.returncode is None:
                process.send_signal(signal.SIGTERM)
        for group, process in self.processes.items():
            code = await asyncio.wait_for(process.wait(), PATIENCE)
            assert code == 0, (group, [log.read_text() for log in self.logs])

    async def kill_all(self) -> None:
        for process in self.processes.values():
            if process.returncode is None:
                process.kill()
                await process.wait()


async def until_finished(run: DistributedRun) -> Snapshot:
    """Take snapshots until one shows the run has nothing left to do; return it."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + PATIENCE
    while loop.time() < deadline:
        try:
            snapshot = await run.snapshot()
        except SnapshotFailed:
            await asyncio.sleep(0.1)
            continue
        if finished(snapshot):
            return snapshot
        await asyncio.sleep(0.2)
    raise AssertionError(f"the run did not finish within {PATIENCE} s")


async def until(condition: object, what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + PATIENCE
    while not condition():  # type: ignore[operator]
        assert loop.time() < deadline, what
        await asyncio.sleep(0.02)


def worker_names(logs: list[Path]) -> list[str]:
    """The names the workers logged as they started."""
    return [log.read_text().split(" hosts ")[0].rsplit("worker ", 1)[1] for log in logs]


def sender_of(chain: int, hops: int, poison_hops: int) -> str:
    """The teller that sends chain ``chain``'s transfer at ``poison_hops``."""
    everyone = [f"teller-{i}" for i in range(TELLERS)]
    teller, left = chain_start(chain), hops
    while left != poison_hops:
        teller, _ = route(teller, [n for n in everyone if n != teller], chain, left)
        left -= 1
    return teller


async def check_the_run(
    store: SqlStore, postgres_url: str, run_id: str, chains: dict[int, int], last: Snapshot
) -> list[Snapshot]:
    """Every complete snapshot a consistent cut holding the money; every transfer booked once."""
    stored = await store.list_snapshots(run_id)
    complete = [s for s in stored if s.status is SnapshotStatus.COMPLETE]
    assert complete
    for snapshot in complete:
        assert cut_problems(snapshot) == [], snapshot.seq
        assert money_in(snapshot) == TOTAL, snapshot.seq
    assert finished(last)
    assert money_in(last) == TOTAL
    booked = effects(postgres_url, run_id)
    wanted = {(chain, h): 1 for chain, hops in chains.items() for h in range(hops + 1)}
    assert booked == wanted, sorted(
        (key, booked.get(key, 0)) for key in set(booked) | set(wanted) if booked.get(key) != 1
    )
    handled = sum(
        TellerState.model_validate(cut.state).handled
        for name, cut in last.agents.items()
        if name.startswith("teller-")
    )
    assert handled == len(wanted)
    return complete


# -- work lost to the database ---------------------------------------------------------------


async def test_work_a_worker_lost_to_the_database_is_redone_on_the_same_timeline(
    nats_url: str, postgres_url: str, store: SqlStore, tmp_path: Path
) -> None:
    """One worker's ledger claims fail for longer than its store retries (8 s against 5 s):
    its handlers lose their work, and every process goes back to the last complete cut on
    the run's timeline, the workers redoing their deliveries in the order they logged; the
    transfers booked under derived keys (half of them) happen once, and none is lost.
    """
    chains = dict.fromkeys(range(12), 30)
    link = await JetStreamLink.connect(nats_url)
    run = DistributedRun(
        link, store, make_app(), policy=SnapshotPolicy(every_seconds=0.1), part_timeout=60
    )
    workers = Workers(run.run_id, nats_url, postgres_url, tmp_path, poison="")
    workers.outage[1] = "20:8"
    try:
        await run.start()
        logs = [await workers.start(group) for group in range(GROUPS)]
        await workers.until_up(logs)
        await run.snapshot()
        for chain, hops in chains.items():
            run.send(chain_start(chain), {"chain": chain, "hops": hops}, kind="go")
        await until(lambda: any(r.source == "database" for r in run.rollbacks), "a rollback")
        last = await until_finished(run)
        await run.close()
        await workers.stop()
    finally:
        await workers.kill_all()
        await link.delete_stream(run.run_id)
        await link.close()

    await check_the_run(store, postgres_url, run.run_id, chains, last)
    assert "stops answering claims" in logs[1].read_text()
    lost = [r for r in run.rollbacks if r.source == "database"]
    assert lost
    assert {r.source for r in run.rollbacks} == {"database"}
    # No new timeline: every rollback kept the run on its first one, and the workers redid
    # their deliveries after the cut in the order they logged.
    assert run.authority.timeline == 0
    redone = [
        line
        for log in logs
        for line in log.read_text().splitlines()
        if "rolled back to" in line and "deliveries to redo in the order logged" in line
    ]
    assert redone
    assert all(", timeline 0, " in line for line in redone), redone
    ledger = ledger_for(store)
    assert ledger is not None
    try:
        calls = await ledger.list_calls(run.run_id)
    finally:
        await ledger.close()
    assert len(calls) == sum(hops + 1 for hops in chains.values())
    assert {call.status for call in calls} == {ToolCallStatus.SUCCEEDED}


# -- a rejected output ----------------------------------------------------------------------


async def test_a_rejected_output_rolls_every_worker_process_back_to_the_last_cut(
    nats_url: str, postgres_url: str, store: SqlStore, tmp_path: Path, teardown: Teardown
) -> None:
    chains = dict.fromkeys(range(12), 24)
    poisoned = sender_of(0, 24, 12)
    link = teardown.link(await JetStreamLink.connect(nats_url))
    run = DistributedRun(
        link, store, make_app(), policy=SnapshotPolicy(every_seconds=0.1), part_timeout=60
    )
    workers = Workers(run.run_id, nats_url, postgres_url, tmp_path, poison="0:12")
    teardown.on_close(workers.kill_all)
    teardown.stream(run)
    await run.start()
    logs = [await workers.start(group) for group in range(GROUPS)]
    await workers.until_up(logs)
    await run.snapshot()  # a cut before any input
    for chain, hops in chains.items():
        run.send(chain_start(chain), {"chain": chain, "hops": hops}, kind="go")
    last = await until_finished(run)
    await run.close()
    await workers.stop()
    await teardown.close()

    complete = await check_the_run(store, postgres_url, run.run_id, chains, last)
    # One rollback, for the careless transfer, recorded as in one process.
    [rollback] = run.rollbacks
    assert (rollback.agent, rollback.source) == (poisoned, "careful")
    assert rollback.reason == "a careless transfer: check it first"
    assert await store.list_rollbacks(run.run_id) == [rollback]
    target = await store.load_snapshot(rollback.snapshot_id)
    assert target.status is SnapshotStatus.COMPLETE
    assert target in complete
    # Every worker process went back to the cut.
    assert sorted(run.authority.restored_by[rollback.id]) == sorted(worker_names(logs))
    # The rejected agent got the reason as feedback; every teller saw the rollback.
    for name, cut in last.agents.items():
        if name.startswith("teller-"):
            state = TellerState.model_validate(cut.state)
            assert state.rollbacks == 1, name
            assert state.lessons == ([rollback.reason] if name == poisoned else []), name


async def test_a_rollback_before_the_first_complete_snapshot_is_recorded_against_the_start(
    nats_url: str, postgres_url: str, store: SqlStore, tmp_path: Path, teardown: Teardown
) -> None:
    chains = dict.fromkeys(range(4), 6)
    poisoned = sender_of(0, 6, 3)
    link = teardown.link(await JetStreamLink.connect(nats_url))
    # No snapshot is taken before the careless transfer: the run goes back to its start.
    run = DistributedRun(link, store, make_app(), part_timeout=60)
    workers = Workers(run.run_id, nats_url, postgres_url, tmp_path, poison="0:3")
    teardown.on_close(workers.kill_all)
    teardown.stream(run)
    await run.start()
    logs = [await workers.start(group) for group in range(GROUPS)]
    await workers.until_up(logs)
    for chain, hops in chains.items():
        run.send(chain_start(chain), {"chain": chain, "hops": hops}, kind="go")
    async with asyncio.timeout(PATIENCE):
        # No snapshot before the rollback: run_until_idle begins its looks at once.
        while not run.rollbacks:  # noqa: ASYNC110 - the run offers no event for it
            await asyncio.sleep(0.01)
        last = await run.run_until_idle()
    await run.close()
    await workers.stop()
    await teardown.close()

    complete = await check_the_run(store, postgres_url, run.run_id, chains, last)
    # Recorded as in one process: against a complete snapshot, the cut it went back to.
    [rollback] = run.rollbacks
    assert (rollback.agent, rollback.source) == (poisoned, "careful")
    assert await store.list_rollbacks(run.run_id) == [rollback]
    start = await store.load_snapshot(rollback.snapshot_id)
    assert start in complete
    assert start.seq < last.seq
    # That cut is the run's start: every teller's initial state, nothing sent or in flight.
    assert start.channels == []
    assert set(start.agents) == set(last.agents)
    for name, cut in start.agents.items():
        assert (cut.sent, cut.received) == ({}, {}), name
        if name.startswith("teller-"):
            assert TellerState.model_validate(cut.state) == TellerState(balance=BALANCE), name
    # Every teller's on_rollback was told the snapshot recorded.
    for name, cut in last.agents.items():
        if name.startswith("teller-"):
            assert TellerState.model_validate(cut.state).back_to == [start.id], name


async def test_rejections_in_two_workers_at_once_become_one_rollback(
    nats_url: str, postgres_url: str, store: SqlStore, tmp_path: Path, teardown: Teardown
) -> None:
    # Two chains whose first transfer is careless, started on tellers of different workers.
    first = 0
    second = next(
        c for c in range(1, TELLERS)
        if group_of(chain_start(c), GROUPS) != group_of(chain_start(first), GROUPS)
    )  # fmt: skip
    chains = {first: 10, second: 10, **dict.fromkeys(range(10, 16), 10)}
    link = teardown.link(await JetStreamLink.connect(nats_url))
    run = DistributedRun(
        link, store, make_app(), policy=SnapshotPolicy(every_seconds=0.1), part_timeout=60
    )
    workers = Workers(
        run.run_id, nats_url, postgres_url, tmp_path, poison=f"{first}:10,{second}:10"
    )
    # The reports are held on their way to the coordinator until both rejections happened,
    # so that they are concurrent whatever the timing of the processes.
    held: list[dict[str, object]] = []
    rejected = run.authority.rejected
    run.authority.rejected = held.append  # type: ignore[method-assign,assignment]
    teardown.on_close(workers.kill_all)
    teardown.stream(run)
    await run.start()
    logs = [await workers.start(group) for group in range(GROUPS)]
    await workers.until_up(logs)
    await run.snapshot()
    for chain, hops in chains.items():
        run.send(chain_start(chain), {"chain": chain, "hops": hops}, kind="go")
    await until(lambda: len(held) == 2, "two rejections")
    for report in held:
        rejected(report)
    run.authority.rejected = rejected  # type: ignore[method-assign]
    last = await until_finished(run)
    await run.close()
    await workers.stop()
    await teardown.close()

    await check_the_run(store, postgres_url, run.run_id, chains, last)
    agents = {report["rejected"]["agent"] for report in held}  # type: ignore[index]
    assert agents == {chain_start(first), chain_start(second)}
    assert len({report["worker"] for report in held}) == 2
    assert run.authority.dropped == 1
    [rollback] = run.rollbacks
    assert await store.list_rollbacks(run.run_id) == [rollback]
    assert rollback.agent in {chain_start(first), chain_start(second)}


async def test_an_output_rejected_past_the_retry_policy_stops_every_process(
    nats_url: str, postgres_url: str, store: SqlStore, tmp_path: Path, teardown: Teardown
) -> None:
    link = teardown.link(await JetStreamLink.connect(nats_url))
    run = DistributedRun(link, store, make_app(), part_timeout=60)
    workers = Workers(run.run_id, nats_url, postgres_url, tmp_path, poison="0:5")
    workers.stubborn = True
    teardown.on_close(workers.kill_all)
    teardown.stream(run)
    await run.start()
    logs = [await workers.start(group) for group in range(GROUPS)]
    await workers.until_up(logs)
    await run.snapshot()
    run.send(chain_start(0), {"chain": 0, "hops": 5}, kind="go")
    with pytest.raises(RollbackExhausted) as failed:
        async with asyncio.timeout(PATIENCE):
            await run.run_until_idle()
    assert failed.value is run.exhausted
    # Every worker stops delivering and ends by itself.
    for group, process in workers.processes.items():
        assert await asyncio.wait_for(process.wait(), PATIENCE) == 0, group
    await run.close()
    await teardown.close()

    assert isinstance(run.exhausted, RollbackExhausted)
    assert run.exhausted.attempts == 3
    assert "a careless transfer" in str(run.exhausted)
    assert len(run.rollbacks) == 2
    assert await store.list_rollbacks(run.run_id) == run.rollbacks
    stored = await store.get_run(run.run_id)
    assert stored.status == "failed"
    for log in logs:
        assert "the run stopped" in log.read_text()


# -- crash recovery -------------------------------------------------------------------------


async def test_workers_killed_at_random_moments_lose_nothing_and_repeat_no_effect(
    nats_url: str, postgres_url: str, store: SqlStore, tmp_path: Path, teardown: Teardown
) -> None:
    rng = random.Random()
    kills = 20
    lease = 1.0
    chains: dict[int, int] = {}
    link = teardown.link(await JetStreamLink.connect(nats_url))
    run = DistributedRun(
        link, store, make_app(), policy=SnapshotPolicy(every_seconds=0.1), part_timeout=60
    )
    workers = Workers(run.run_id, nats_url, postgres_url, tmp_path, poison="")
    # Per group, a worker started ahead, waiting to take over the group's agents.
    spares: dict[int, tuple[asyncio.subprocess.Process, Path]] = {}

    async def spare(group: int) -> None:
        active = workers.processes[group]
        log = await workers.start(group, lease=lease, wait=PATIENCE)
        spares[group] = (workers.processes[group], log)
        workers.processes[group] = active

    def ready() -> list[int]:
        return [group for group, (_, log) in spares.items() if "waits for" in log.read_text()]

    async def kill_spares() -> None:
        for process, _ in spares.values():
            if process.returncode is None:
                process.kill()
                await process.wait()

    teardown.on_close(kill_spares)
    teardown.on_close(workers.kill_all)
    teardown.stream(run)
    await run.start()
    logs = [await workers.start(group, lease=lease) for group in range(GROUPS)]
    await workers.until_up(logs)
    for group in range(GROUPS):
        await spare(group)
    await run.snapshot()
    for kill in range(kills):
        for chain in range(len(chains), len(chains) + 2):
            chains[chain] = 20
            run.send(chain_start(chain), {"chain": chain, "hops": 20}, kind="go")
        await asyncio.sleep(rng.uniform(0.05, 1.0))
        await until(ready, "a worker waiting to take over")
        group = rng.choice(ready())
        victim = workers.processes[group]
        victim.kill()
        await victim.wait()
        workers.processes[group], taking_over = spares.pop(group)
        recovered = len(run.rollbacks) + 1
        await until(lambda n=recovered: len(run.rollbacks) >= n, f"recovery {kill}")
        assert " hosts " in taking_over.read_text()
        await spare(group)
    last = await until_finished(run)
    await run.close()
    for process, _ in spares.values():
        process.kill()
        await process.wait()
    await workers.stop()
    await teardown.close()

    await check_the_run(store, postgres_url, run.run_id, chains, last)
    # The ranges in flight between processes came back from the stream, none from the bodies.
    replays = run.authority.replays.values()
    assert sum(replayed for replayed, _ in replays) > 0
    assert sum(put_back for _, put_back in replays) == 0
    recoveries = [r for r in run.rollbacks if r.source == "recovery"]
    assert len(recoveries) >= kills
    assert await store.list_rollbacks(run.run_id) == [r for r in run.rollbacks if r.snapshot_id]
    # Calls whose worker was killed during them are never run again under their key.
    ledger = ledger_for(store)
    assert ledger is not None
    try:
        calls = await ledger.list_calls(run.run_id)
    finally:
        await ledger.close()
    assert {entry.status for entry in calls} <= {ToolCallStatus.SUCCEEDED, ToolCallStatus.UNKNOWN}
