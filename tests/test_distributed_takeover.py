"""A run spread over processes outlives its coordinator: another one takes it over.

The process test runs the bank of ``distributed_effects.py`` on three ``agentsnap worker``
processes, its coordinator a process of its own (``coordinator_process.py``). The
coordinator is killed (SIGKILL) at random moments, and each time a new one takes the run
over; once, it is suspended (SIGSTOP) instead, taken over, and woken up again (SIGCONT): it
must find out that it was replaced and stop, its writes refused. The run must finish: every
transfer booked exactly once in a table outside the ledger, every ledger entry settled,
every stored complete snapshot a consistent cut holding the bank's money, and every snapshot
a dead coordinator began and never completed stored as failed, saying why. The even-numbered
chains, half of the transfers, are booked under the keys agentsnap derives
(``BANK_DERIVED=1``): a takeover stays on the run's timeline, the workers redoing their work
after the cut in the order they logged, so a derived key names the same call again.

``AGENTSNAP_TAKEOVER_KILLS`` sets how many coordinators are killed (10 by default; more for
a nightly run).

The in-process tests show the fencing alone (a coordinator whose lease was taken over stops
acting for the run, and its writes are refused), and the timeline a takeover keeps: the one
the stopped coordinator's last rollback for a rejected output started, on which the worker
redoes its deliveries in the order logged.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sys
from collections.abc import Callable
from pathlib import Path

import distributed_effects
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
)
from distributed_teardown import Teardown
from nats_server import SHARED_URL, reachable, unavailable
from teller_app import bank
from teller_app import money_in as bank_money

from agentsnap import (
    ConfigurationError,
    NotFoundError,
    OwnershipLost,
    RunOwnedError,
    SnapshotFailed,
)
from agentsnap.distributed import DistributedRun, Worker
from agentsnap.integrity import cut_problems
from agentsnap.jetstream import JetStreamLink
from agentsnap.ledger import ToolCallStatus
from agentsnap.records import RunStatus, SnapshotStatus
from agentsnap.snapshot import SnapshotPolicy
from agentsnap.store.ledger import ledger_for
from agentsnap.store.sql import SqlStore

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PATIENCE = 180.0
"""Seconds a step may take (never reached when green)."""
TELLERS = 9
GROUPS = 3
KILLS = int(os.environ.get("AGENTSNAP_TAKEOVER_KILLS", "10"))
CHAINS = 12
HOPS = 80
SUSPEND_AT = 3
"""The round whose coordinator is suspended and woken up after the takeover, not killed."""


@pytest.fixture
def nats_url() -> str:
    if not reachable(SHARED_URL):
        unavailable(f"no NATS server at {SHARED_URL}")
    return SHARED_URL


def env(postgres_url: str) -> dict[str, str]:
    path = os.pathsep.join([str(ROOT), str(HERE), os.environ.get("PYTHONPATH", "")])
    return {
        **os.environ,
        "PYTHONPATH": path,
        "BANK_TELLERS": str(TELLERS),
        "BANK_DERIVED": "1",
        "AGENTSNAP_EFFECTS_URL": postgres_url,
    }


class Process:
    """A child process whose output goes to a log, read line by line."""

    def __init__(self, process: asyncio.subprocess.Process, log: Path) -> None:
        self.process = process
        self.log = log

    @classmethod
    async def start(cls, log: Path, environ: dict[str, str], *args: str) -> Process:
        with log.open("wb") as out:
            process = await asyncio.create_subprocess_exec(
                sys.executable, *args, env=environ, stdout=out, stderr=out
            )
        return cls(process, log)

    def said(self, text: str) -> bool:
        return text in self.log.read_text()

    async def until_said(self, *texts: str) -> str:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + PATIENCE
        while True:
            found = next((text for text in texts if self.said(text)), None)
            if found is not None:
                return found
            assert self.process.returncode is None, self.log.read_text()[-3000:]
            assert loop.time() < deadline, self.log.read_text()[-3000:]
            await asyncio.sleep(0.02)


async def test_a_coordinator_killed_at_random_moments_is_taken_over_and_the_run_finishes(
    nats_url: str, postgres_url: str, tmp_path: Path, teardown: Teardown
) -> None:
    create_effects_table(postgres_url)
    run_id = os.urandom(16).hex()
    environ = env(postgres_url)
    rng = random.Random()
    seed = rng.randrange(1 << 30)
    rng.seed(seed)
    workers: list[Process] = []
    coordinators: list[Process] = []
    done = tmp_path / "done"

    async def coordinator(*mode: str) -> Process:
        log = tmp_path / f"coordinator-{len(coordinators)}.log"
        script = str(HERE / "coordinator_process.py")
        args = [script, nats_url, postgres_url, run_id, str(done), *mode]
        started = await Process.start(log, environ, *args)
        coordinators.append(started)
        teardown.process(started.process)
        return started

    teardown.link(await JetStreamLink.connect(nats_url))
    store = teardown.store(SqlStore(postgres_url))
    teardown.stream_of(run_id)
    current = await coordinator("new", str(CHAINS), str(HOPS))
    await current.until_said("fed")
    for group in range(GROUPS):
        args = ["-m", "agentsnap", "worker", "--nats", nats_url, "--db", postgres_url]
        args += ["--app", "distributed_effects:make_app", "--run", run_id]
        args += ["--group", f"{group}/{GROUPS}"]
        log = tmp_path / f"worker-{group}.log"
        workers.append(await Process.start(log, environ, *args))
        teardown.process(workers[-1].process)
    for worker in workers:
        await worker.until_said(" hosts ")
    # A standby coordinator waits for the run's lease all along: it takes over as soon as
    # the coordinator is killed (or, suspended, stops renewing its lease).
    standby = await coordinator("take-over")
    busy = 0
    for kill in range(1, KILLS + 1):
        await standby.until_said("waiting")
        # A random moment: during a snapshot, a rollback, the takeover's own rollback, or
        # once the run is idle (the coordinator then waits to be told to close it).
        await asyncio.sleep(rng.uniform(0.05, 1.0))
        busy += not current.said("idle")
        if kill == SUSPEND_AT:
            stale = current
            stale.process.send_signal(signal.SIGSTOP)
            await standby.until_said("took-over")
            stale.process.send_signal(signal.SIGCONT)
            assert await asyncio.wait_for(stale.process.wait(), PATIENCE) == 3, (
                stale.log.read_text()[-3000:]
            )
            assert stale.said("fenced")
        else:
            current.process.kill()
            await current.process.wait()
            await standby.until_said("took-over")
        current, standby = standby, await coordinator("take-over")
    standby.process.kill()
    await standby.process.wait()
    await current.until_said("idle")
    done.touch()
    code = await asyncio.wait_for(current.process.wait(), PATIENCE)
    assert code == 0, current.log.read_text()[-3000:]
    assert busy, "every kill point came once the run was idle"
    for worker in workers:
        worker.process.send_signal(signal.SIGTERM)
    for worker in workers:
        code = await asyncio.wait_for(worker.process.wait(), PATIENCE)
        assert code == 0, worker.log.read_text()[-3000:]

    run = await store.get_run(run_id)
    assert run.status is RunStatus.SUCCEEDED, (seed, run)
    stored = await store.list_snapshots(run_id)
    complete = [s for s in stored if s.status is SnapshotStatus.COMPLETE]
    for snapshot in complete:
        assert cut_problems(snapshot) == [], (seed, snapshot.seq)
        assert money_in(snapshot) == TELLERS * BALANCE, (seed, snapshot.seq)
    last = max(complete, key=lambda s: s.seq)
    assert finished(last), seed
    assert money_in(last) == TELLERS * BALANCE
    handled = sum(
        TellerState.model_validate(cut.state).handled
        for name, cut in last.agents.items()
        if name.startswith("teller-")
    )
    assert handled == CHAINS * (HOPS + 1), seed
    # Every transfer happened once in the world, whatever its key.
    booked = effects(postgres_url, run_id)
    wanted = {(chain, hop): 1 for chain in range(CHAINS) for hop in range(HOPS + 1)}
    assert booked == wanted, (
        seed,
        sorted((k, booked.get(k, 0)) for k in set(booked) | set(wanted) if booked.get(k) != 1),
    )
    ledger = ledger_for(store)
    assert ledger is not None
    try:
        calls = await ledger.list_calls(run_id)
    finally:
        await ledger.close()
    assert len(calls) == len(wanted), seed
    assert {call.status for call in calls} == {ToolCallStatus.SUCCEEDED}, seed
    # Each takeover is a rollback; the snapshots dead coordinators left are failed.
    rollbacks = await store.list_rollbacks(run_id)
    takeovers = [r for r in rollbacks if "took the run over" in r.reason]
    assert len(takeovers) >= 1, seed
    abandoned = [s for s in stored if s.error and "coordinator stopped" in s.error]
    assert all(s.status is SnapshotStatus.FAILED for s in abandoned)
    assert len({s.seq for s in stored}) == len(stored), "a snapshot number used twice"


# -- fencing ------------------------------------------------------------------------------


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'run.db'}"


async def until(condition: Callable[[], bool], what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + PATIENCE
    while not condition():
        assert loop.time() < deadline, f"not {what} within {PATIENCE} s"
        await asyncio.sleep(0.02)


async def test_a_coordinator_replaced_while_it_ran_is_fenced_out(
    nats_url: str, sqlite_url: str, teardown: Teardown
) -> None:
    """The old coordinator stops at its first write: nothing it writes reaches the store."""
    tellers = 3
    links = await teardown.links(nats_url, 3)
    stores = [teardown.store(SqlStore(sqlite_url)) for _ in range(3)]
    policy = SnapshotPolicy(every_seconds=0.05)
    old = DistributedRun(
        links[0], stores[0], bank(tellers), policy=policy, lease=60.0, poll=0.05, part_timeout=5
    )
    app = bank(tellers)
    worker = Worker(links[1], stores[1], old.run_id, app, app.names, lease=5.0)
    new: DistributedRun | None = None
    teardown.worker(worker)
    teardown.stream(old)
    await old.start()
    await worker.start()
    for i in range(6):
        old.send(f"teller-{i % tellers}", {"hops": 40}, kind="go")
    await old.flush()
    await until(lambda: len(old.complete) >= 2, "two snapshots complete")
    # Its lease runs out while it still runs (as when it was suspended for longer):
    # another coordinator takes the run over.
    lease = await stores[2].get_lease(old.run_id)
    assert lease is not None
    await stores[2].release_lease(old.run_id, lease.token)
    new = DistributedRun.take_over(
        links[2], stores[2], bank(tellers), old.run_id, wait=10, policy=policy, poll=0.05
    )
    await new.start()
    # The old one writes on (a snapshot it completes or fails): refused, it stops.
    await until(lambda: old.fenced is not None, "the old coordinator fenced")
    async with asyncio.timeout(PATIENCE):
        assert isinstance(old.fenced, OwnershipLost)
        with pytest.raises(OwnershipLost):
            await old.run_until_idle()
        with pytest.raises(SnapshotFailed, match="replaced"):
            await old.snapshot()
        last = await new.run_until_idle()
    assert new.took_over is not None
    assert new.took_over.source == "recovery"
    assert new.authority.generation > old.authority.generation
    # Only what the new coordinator completed or read back is stored as complete.
    stored = await stores[2].list_snapshots(old.run_id)
    complete = [s for s in stored if s.status is SnapshotStatus.COMPLETE]
    assert {s.id for s in complete} == {s.id for s in new.complete}
    for snapshot in complete:
        assert cut_problems(snapshot) == []
        assert bank_money(snapshot) == tellers * BALANCE
    assert bank_money(last) == tellers * BALANCE
    await old.close()  # records nothing: the run is the new coordinator's
    assert (await stores[2].get_run(old.run_id)).status is RunStatus.RUNNING
    await new.close()
    new = None
    assert (await stores[2].get_run(old.run_id)).status is RunStatus.SUCCEEDED


async def test_a_live_coordinator_is_not_taken_over_and_an_ended_run_not_at_all(
    nats_url: str, sqlite_url: str, teardown: Teardown
) -> None:
    links = await teardown.links(nats_url, 2)
    stores = [teardown.store(SqlStore(sqlite_url)) for _ in range(2)]
    first = DistributedRun(links[0], stores[0], bank(3), lease=1.0)
    teardown.stream(first)
    await first.start()
    # It renews its lease: a standby that waits no longer than this gives up.
    standby = DistributedRun.take_over(links[1], stores[1], bank(3), first.run_id, wait=1.5)
    with pytest.raises(RunOwnedError):
        await standby.start()
    assert first.fenced is None
    await first.close()
    late = DistributedRun.take_over(links[1], stores[1], bank(3), first.run_id, wait=1.0)
    with pytest.raises(ConfigurationError, match="ended"):
        await late.start()
    with pytest.raises(NotFoundError):
        await DistributedRun.take_over(links[1], stores[1], bank(3), "no-such-run").start()
    assert (await stores[1].get_run(first.run_id)).status is RunStatus.SUCCEEDED


async def test_a_takeover_stays_on_the_timeline_of_the_rollback_before_it(
    nats_url: str, postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rejected output started a timeline; the coordinator that takes over keeps it.

    The worker redoes its deliveries after the takeover's cut in the order it logged on that
    timeline, and the transfers booked under derived keys happen once.
    """
    monkeypatch.setenv("AGENTSNAP_EFFECTS_URL", postgres_url)
    monkeypatch.setenv("BANK_POISON", "0:150")
    monkeypatch.setattr(distributed_effects, "DERIVED", True)
    create_effects_table(postgres_url)
    chains = dict.fromkeys(range(6), 200)
    links = [await JetStreamLink.connect(nats_url) for _ in range(3)]
    stores = [SqlStore(postgres_url) for _ in range(3)]
    policy = SnapshotPolicy(every_seconds=0.05)
    old = DistributedRun(
        links[0], stores[0], make_app(), policy=policy, lease=60.0, poll=0.05, part_timeout=10
    )
    app = make_app()
    worker = Worker(links[1], stores[1], old.run_id, app, app.names, lease=5.0)
    new: DistributedRun | None = None
    try:
        await old.start()
        await worker.start()
        for chain, hops in chains.items():
            old.send(chain_start(chain), {"chain": chain, "hops": hops}, kind="go")
        await old.flush()
        await until(
            lambda: any(r.source == "careful" for r in old.rollbacks), "the careless transfer"
        )
        line = old.authority.timeline
        assert line == old.authority.generation > 0
        assert worker.host.replay is not None
        assert worker.host.replay.timeline == line
        # A few cuts on that timeline, then the coordinator stops renewing its lease.
        seen = len(old.complete)
        await until(lambda: len(old.complete) >= seen + 3, "three cuts after the rollback")
        followed = worker.host.followed
        lease = await stores[2].get_lease(old.run_id)
        assert lease is not None
        await stores[2].release_lease(old.run_id, lease.token)
        new = DistributedRun.take_over(
            links[2], stores[2], make_app(), old.run_id, wait=10, policy=policy, poll=0.05,
            part_timeout=10,
        )  # fmt: skip
        await new.start()
        assert new.authority.timeline == line
        assert new.authority.generation > old.authority.generation
        async with asyncio.timeout(PATIENCE):
            last = await new.run_until_idle()
        assert new.took_over is not None
        assert new.took_over.source == "recovery"
        # The worker stayed on the timeline and redid its deliveries in the order logged.
        assert worker.host.replay.timeline == line
        assert worker.host.followed > followed
        assert finished(last)
        assert money_in(last) == len(app.names) * BALANCE
        await old.close()
        await new.close()
        new = None
        await worker.close()
        booked = effects(postgres_url, old.run_id)
        wanted = {(chain, hop): 1 for chain, hops in chains.items() for hop in range(hops + 1)}
        assert booked == wanted, sorted(
            (k, booked.get(k, 0)) for k in set(booked) | set(wanted) if booked.get(k) != 1
        )
        ledger = ledger_for(stores[2])
        assert ledger is not None
        try:
            calls = await ledger.list_calls(old.run_id)
        finally:
            await ledger.close()
        assert len(calls) == len(wanted)
        assert {call.status for call in calls} == {ToolCallStatus.SUCCEEDED}
    finally:
        if new is not None:
            await new.close()
        await worker.close()
        for store in stores:
            await store.close()
        await links[0].delete_stream(old.run_id)
        for link in links:
            await link.close()
