"""Network partitions under a run spread over hosts, checked in the manner of Jepsen.

Three ``agentsnap worker`` processes, each on a host of its own (a network namespace of
[`netns.Hosts`][]), host the nine tellers of the bank in ``distributed_effects.py``: every
transfer is booked by a side-effecting tool in a table outside the ledger (the world's own
log), money is only moved, and the test process is the run's coordinator, beginning a
snapshot every fifth of a second. While chains of transfers are fed in, a nemesis cuts one
host off from the NATS server, from PostgreSQL, or from both, for a few seconds (its link
down, or the addresses routed away), heals it, and waits for the run to complete a snapshot
again before the next fault. Then the run must finish, and its history must show:

- every transfer booked exactly once in the world's log, and its ledger entry final (none
  lost, none twice);
- every complete snapshot stored a consistent cut holding the bank's money;
- every transfer handled once (the last cut's count of handled transfers).

CI runs one partition of each kind; ``AGENTSNAP_PARTITIONS=nightly`` runs a long random
schedule (``AGENTSNAP_PARTITIONS_FAULTS`` faults, 2 to 30 s each, any host, either way of
cutting). Each test prints its history's figures (``-s`` shows them).

In the same manner, the run's coordinator, a process on a host of its own
(``coordinator_process.py``), is SIGKILLed among the partitions, a standby coordinator
taking the run over each time (two kills in CI, ``AGENTSNAP_PARTITIONS_KILLS`` at night).
The even-numbered chains are booked under the keys agentsnap derives (``BANK_DERIVED=1``),
half of the effects, in every run: nightly's long partitions make handlers lose work to the
database, and the rollback that redoes it stays on the run's timeline; a coordinator that
takes the run over stays on it too. On the run's timeline every worker redoes its agents'
work after the cut in the order it logged, so a derived key names the same call again.

A fault is a [`Fault`][]: one more kind of fault is one more ``Fault.kind`` applied in
[`Nemesis.apply`][].
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psycopg
import pytest
from distributed_effects import (
    BALANCE,
    TellerState,
    chain_start,
    create_effects_table,
    effects,
    money_in,
)
from distributed_effects import make_app as make_bank
from netns import Hosts, How, Service, skip_unless_possible

from agentsnap import Snapshot
from agentsnap.distributed import DistributedRun
from agentsnap.integrity import cut_problems
from agentsnap.jetstream import JetStreamLink
from agentsnap.ledger import ToolCallStatus
from agentsnap.records import RunStatus, SnapshotStatus
from agentsnap.snapshot import SnapshotPolicy
from agentsnap.store.ledger import ledger_for
from agentsnap.store.sql import SqlStore

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
NIGHTLY = os.environ.get("AGENTSNAP_PARTITIONS") == "nightly"
PATIENCE = 600.0 if NIGHTLY else 150.0
"""Seconds a step may take (never reached when green)."""
TELLERS = 9
GROUPS = 3
HOSTS = GROUPS + 2
"""A host per group of tellers, a spare host for a worker taking over a group, and the host
of the coordinator processes."""
COORDINATOR_HOST = GROUPS + 1
TOTAL = TELLERS * BALANCE
HOPS = 12
LEASE = 10.0 if NIGHTLY else 2.0
"""Seconds a worker's claim holds: in CI shorter than a PostgreSQL partition, so that the
coordinator sees the leases of a cut-off worker expire and renewed late by the same worker."""


@dataclass(frozen=True)
class Fault:
    """One fault of the nemesis: cut ``host`` from ``services`` for ``seconds``, ``how``."""

    host: int
    services: tuple[Service, ...]
    seconds: float
    how: How = "down"
    kind: str = "partition"

    def __str__(self) -> str:
        if self.kind == "coordinator":
            return "coordinator killed (SIGKILL), a standby took over"
        return (
            f"host {self.host} cut from {'+'.join(self.services)} ({self.how}) {self.seconds:.1f} s"
        )


@dataclass
class History:
    """What a run went through, and what its checks found."""

    faults: list[str] = field(default_factory=list)
    chains: dict[int, int] = field(default_factory=dict)
    effects: int = 0
    duplicates: int = 0
    lost: int = 0
    ledger_unfinished: int = 0
    cuts_checked: int = 0
    cuts_failed: int = 0
    rollbacks: int = 0
    takeovers: int = 0
    busy_kills: int = 0
    """Coordinators killed while the run was busy (not idle yet)."""

    def report(self, name: str) -> None:
        figures = {k: v for k, v in asdict(self).items() if k != "chains"}
        figures["transfers"] = sum(h + 1 for h in self.chains.values())
        print(f"\n{name}: {json.dumps(figures)}")
        log = os.environ.get("AGENTSNAP_PARTITIONS_LOG")
        if log:
            with Path(log).open("a") as out:
                out.write(json.dumps({"test": name, **figures}) + "\n")


def schedule(rng: random.Random) -> list[Fault]:
    """The faults of one run: one of each kind in CI, a long random series at night."""
    kinds: list[tuple[Service, ...]] = [("nats",), ("postgres",), ("nats", "postgres")]
    if not NIGHTLY:
        hows: list[How] = ["down", "unreachable", "down"]
        return [
            Fault(rng.randrange(GROUPS), services, rng.uniform(2.0, 4.0), how)
            for services, how in zip(kinds, hows, strict=True)
        ]
    count = int(os.environ.get("AGENTSNAP_PARTITIONS_FAULTS", "12"))
    return [
        Fault(
            rng.randrange(GROUPS),
            rng.choice(kinds),
            rng.uniform(2.0, 30.0),
            rng.choice(["down", "unreachable"]),
        )
        for _ in range(count)
    ]


def worker_environment() -> dict[str, str]:
    """This process's environment, with the repository and the tests importable."""
    path = os.pathsep.join([str(ROOT), str(HERE), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path}


class Workers:
    """The run's worker processes: worker ``n`` on host ``n``, each with its log."""

    def __init__(self, hosts: Hosts, run_id: str, tmp: Path) -> None:
        self.hosts = hosts
        self.run_id = run_id
        self.tmp = tmp
        self.processes: dict[int, asyncio.subprocess.Process] = {}
        self.logs: dict[int, Path] = {}

    def env(self) -> dict[str, str]:
        return {
            **worker_environment(),
            "BANK_TELLERS": str(TELLERS),
            "BANK_DERIVED": "1",
            "BANK_POISON": "",
            "AGENTSNAP_EFFECTS_URL": self.hosts.postgres.url,
        }

    async def start(self, host: int, group: int | None = None, wait: float = 0.0) -> None:
        """Start a worker on host ``host`` for group ``group`` (by default the host's)."""
        log = self.logs[host] = self.tmp / f"worker-{host}.log"
        args = ["--nats", self.hosts.nats.url, "--db", self.hosts.postgres.url]
        args += ["--app", "distributed_effects:make_app", "--run", self.run_id]
        args += ["--group", f"{host if group is None else group}/{GROUPS}"]
        args += ["--lease", str(LEASE), "--nats-patience", "300", "--wait", str(wait)]
        argv = self.hosts.command(host, [sys.executable, "-m", "agentsnap", "worker", *args])
        with log.open("wb") as out:
            self.processes[host] = await asyncio.create_subprocess_exec(
                *argv, env=self.env(), stdout=out, stderr=out
            )

    def text(self) -> str:
        logs = [f"--- worker {n}\n{log.read_text()[-4000:]}" for n, log in self.logs.items()]
        return "\n".join([*logs, f"--- postgres\n{self.hosts.postgres.log_tail()}"])

    async def until_up(self) -> None:
        await until(
            lambda: all(" hosts " in log.read_text() for log in self.logs.values()), "up", self
        )

    async def stop(self) -> None:
        for process in self.processes.values():
            if process.returncode is None:
                process.send_signal(signal.SIGTERM)
        for host, process in self.processes.items():
            code = await asyncio.wait_for(process.wait(), PATIENCE)
            assert code == 0 or host in self.replaced, self.text()

    replaced: frozenset[int] = frozenset()
    """Hosts whose worker another one replaced: it stops as it can."""

    async def kill(self) -> None:
        for process in self.processes.values():
            if process.returncode is None:
                process.kill()
                await process.wait()


async def until(condition: Callable[[], bool], what: str, workers: Workers | None = None) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + PATIENCE
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"not {what} within {PATIENCE} s\n{workers and workers.text()}")
        await asyncio.sleep(0.05)


class Nemesis:
    """Applies faults to the hosts of a run and waits for the run to take a cut again."""

    def __init__(
        self,
        hosts: Hosts,
        run: DistributedRun | Callable[[], int],
        workers: Workers,
        history: History,
        kill: Callable[[], Awaitable[None]] | None = None,
    ):
        self.hosts = hosts
        if isinstance(run, DistributedRun):
            complete = run.complete
            self.completed: Callable[[], int] = lambda: len(complete)
        else:
            self.completed = run
        """How many snapshots the run completed so far."""
        self.workers = workers
        self.history = history
        self.kill = kill
        """Kills the run's coordinator, and waits for a standby to take the run over."""

    async def apply(self, fault: Fault) -> None:
        """Apply ``fault``, heal it, and wait until a snapshot begun since completes."""
        self.history.faults.append(str(fault))
        if fault.kind == "coordinator" and self.kill is not None:
            await self.kill()
        elif fault.kind == "partition":
            self.hosts.cut(fault.host, fault.services, fault.how)
            try:
                await asyncio.sleep(fault.seconds)
            finally:
                self.hosts.heal(fault.host)
        else:
            raise AssertionError(f"no such fault: {fault.kind}")
        # The run goes on: a snapshot taken now completes.
        seen = self.completed()
        await until(
            lambda: self.completed() > seen + 1,
            f"a snapshot completed after {fault}",
            self.workers,
        )


@pytest.fixture
def hosts() -> Iterator[Hosts]:
    skip_unless_possible()
    with Hosts(HOSTS) as made:
        create_effects_table(made.postgres.url)
        yield made


@pytest.fixture
async def store(hosts: Hosts) -> AsyncIterator[SqlStore]:
    made = SqlStore(hosts.postgres.url)
    try:
        yield made
    finally:
        await made.close()


async def feed(run: DistributedRun, history: History, rng: random.Random) -> None:
    """Start a chain of transfers every little while, until cancelled."""
    while True:
        chain = len(history.chains)
        history.chains[chain] = HOPS
        run.send(chain_start(chain), {"chain": chain, "hops": HOPS}, kind="go")
        await asyncio.sleep(rng.uniform(0.1, 0.6))


async def check(
    store: SqlStore, url: str, run: DistributedRun | str, last: Snapshot, history: History
) -> None:
    """Fill in the history's figures from the store and the world, then assert on them."""
    run_id = run if isinstance(run, str) else run.run_id
    stored = await store.list_snapshots(run_id)
    complete = [s for s in stored if s.status is SnapshotStatus.COMPLETE]
    wrong = [
        (s.seq, cut_problems(s), money_in(s))
        for s in complete
        if cut_problems(s) or money_in(s) != TOTAL
    ]
    history.cuts_checked = len(complete)
    history.cuts_failed = len(stored) - len(complete)
    history.rollbacks = len(await store.list_rollbacks(run_id))
    booked = effects(url, run_id)
    wanted = {(chain, h) for chain, hops in history.chains.items() for h in range(hops + 1)}
    history.effects = sum(booked.values())
    history.duplicates = sum(count - 1 for count in booked.values() if count > 1)
    history.lost = len(wanted - set(booked))
    ledger = ledger_for(store)
    assert ledger is not None
    try:
        calls = await ledger.list_calls(run_id)
    finally:
        await ledger.close()
    statuses = Counter(entry.status for entry in calls)
    history.ledger_unfinished = sum(
        n for status, n in statuses.items() if status is not ToolCallStatus.SUCCEEDED
    )
    handled = sum(
        TellerState.model_validate(cut.state).handled
        for name, cut in last.agents.items()
        if name.startswith("teller-")
    )
    assert wrong == [], f"inconsistent cuts (seq, problems, money): {wrong}"
    assert set(booked) <= wanted
    assert (history.duplicates, history.lost) == (0, 0), sorted(
        (key, booked.get(key, 0)) for key in wanted if booked.get(key) != 1
    )
    assert set(statuses) <= {ToolCallStatus.SUCCEEDED, ToolCallStatus.UNKNOWN}, statuses
    assert money_in(last) == TOTAL
    assert handled == len(wanted), (handled, len(wanted))


async def run_bank(
    hosts: Hosts,
    store: SqlStore,
    tmp_path: Path,
    history: History,
    nemesis: Callable[[DistributedRun, Workers], Awaitable[None]],
) -> tuple[DistributedRun, Snapshot]:
    """Run the bank on the hosts while ``nemesis(run, workers)`` does its worst; its last cut."""
    rng = random.Random()
    link = await JetStreamLink.connect(hosts.nats.url)
    run = DistributedRun(
        link, store, make_bank(), policy=SnapshotPolicy(every_seconds=0.2), part_timeout=10
    )
    workers = Workers(hosts, run.run_id, tmp_path)
    closed = False
    try:
        await run.start()
        for group in range(GROUPS):
            await workers.start(group)
        await workers.until_up()
        await run.snapshot()
        feeding = asyncio.ensure_future(feed(run, history, rng))
        try:
            await nemesis(run, workers)
        finally:
            feeding.cancel()
        try:
            async with asyncio.timeout(PATIENCE):
                last = await run.run_until_idle()
        except TimeoutError as exc:
            notes = getattr(exc, "__notes__", [])
            raise AssertionError(f"the run did not finish: {notes}\n{workers.text()}") from exc
        await run.close()
        closed = True
        await workers.stop()
    finally:
        hosts.heal()
        if not closed:  # the run's tasks hold connections: end them with the test
            with contextlib.suppress(Exception):
                async with asyncio.timeout(PATIENCE):
                    await run.close(RunStatus.FAILED)
        await workers.kill()
        await link.delete_stream(run.run_id)
        await link.close()
    return run, last


async def test_partitions_of_a_worker_from_nats_postgres_or_both_lose_and_repeat_nothing(
    hosts: Hosts, store: SqlStore, tmp_path: Path
) -> None:
    rng = random.Random()
    history = History()
    faults = schedule(rng)

    async def nemesis(run: DistributedRun, workers: Workers) -> None:
        for fault in faults:
            await asyncio.sleep(rng.uniform(0.3, 1.5))
            await Nemesis(hosts, run, workers, history).apply(fault)

    run, last = await run_bank(hosts, store, tmp_path, history, nemesis)
    try:
        await check(store, hosts.postgres.url, run, last, history)
    finally:
        history.report("partitions")
    assert history.cuts_checked >= len(faults)


async def test_a_run_over_hosts_goes_on_after_its_nats_server_restarts(
    hosts: Hosts, store: SqlStore, tmp_path: Path
) -> None:
    history = History()

    async def nemesis(run: DistributedRun, workers: Workers) -> None:
        await asyncio.sleep(1.0)
        history.faults.append("NATS server stopped for 3 s")
        await asyncio.to_thread(hosts.stop_nats)
        await asyncio.sleep(3.0)
        await asyncio.to_thread(hosts.start_nats)
        seen = len(run.complete)
        await until(lambda: len(run.complete) > seen + 1, "a snapshot after the restart", workers)

    run, last = await run_bank(hosts, store, tmp_path, history, nemesis)
    try:
        await check(store, hosts.postgres.url, run, last, history)
    finally:
        history.report("nats-restart")


def test_a_client_cut_off_in_a_transaction_does_not_keep_its_rows_locked(hosts: Hosts) -> None:
    """The server ends the session of a client it no longer hears from inside a transaction.

    A store's connections ask for it (``idle_in_transaction_session_timeout``): otherwise
    the rows a cut-off worker was updating (its agents' leases) stay locked for as long as
    the dead connection lives, and no worker can take its agents over.
    """
    url = hosts.postgres.url
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE leased (agent text PRIMARY KEY, owner text)")
        conn.execute("INSERT INTO leased VALUES ('teller-0', 'old')")
    script = (
        "import psycopg, time\n"
        "from agentsnap.store.faults import StoreRetry\n"
        "from agentsnap.store.sql import engine_options\n"
        f"url = {url!r}\n"
        "args = engine_options(url, StoreRetry(timeout=1.0))['connect_args']\n"
        "conn = psycopg.connect(url, **args)\n"
        "conn.execute(\"UPDATE leased SET owner = 'old' WHERE agent = 'teller-0'\")\n"
        "print('locked', flush=True)\n"
        "time.sleep(600)\n"
    )
    argv = hosts.command(0, [sys.executable, "-c", script])
    with subprocess.Popen(argv, stdout=subprocess.PIPE, env=worker_environment()) as old:
        try:
            assert old.stdout is not None
            assert old.stdout.readline() == b"locked\n"
            hosts.cut(0, ("postgres",))
            with psycopg.connect(url, autocommit=True, options="-c lock_timeout=60000") as conn:
                conn.execute("UPDATE leased SET owner = 'new' WHERE agent = 'teller-0'")
                row = conn.execute("SELECT owner FROM leased").fetchone()
                idle = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE state = 'idle in transaction'"
                ).fetchone()
        finally:
            old.kill()
    assert row == ("new",)
    assert idle == (0,)


async def test_a_worker_cut_from_postgres_past_its_lease_is_replaced_and_does_nothing_visible(
    hosts: Hosts, store: SqlStore, tmp_path: Path
) -> None:
    """Split brain: the old worker still reaches NATS while a new one hosts its tellers."""
    rng = random.Random()
    history = History()
    group = rng.randrange(GROUPS)
    spare = GROUPS

    async def nemesis(run: DistributedRun, workers: Workers) -> None:
        await asyncio.sleep(rng.uniform(0.5, 1.5))
        how: How = rng.choice(["down", "unreachable"])
        history.faults.append(f"host {group} cut from postgres ({how}) past its lease; replaced")
        before = len(run.rollbacks)
        hosts.cut(group, ("postgres",), how)
        try:
            await workers.start(spare, group, wait=PATIENCE)
            workers.replaced = frozenset([group])
            await until(lambda: " hosts " in workers.logs[spare].read_text(), "taken over", workers)
            await until(lambda: len(run.rollbacks) > before, "the run recovered", workers)
            await asyncio.sleep(rng.uniform(0.5, 3.0))
        finally:
            hosts.heal(group)
        # The old worker learns that its claim went to another and stops.
        old = workers.processes[group]
        await asyncio.wait_for(old.wait(), PATIENCE)
        seen = len(run.complete)
        await until(lambda: len(run.complete) > seen + 1, "a snapshot after the heal", workers)

    run, last = await run_bank(hosts, store, tmp_path, history, nemesis)
    try:
        await check(store, hosts.postgres.url, run, last, history)
    finally:
        history.report("takeover")
    assert "lost its agents" in (tmp_path / f"worker-{group}.log").read_text()


KILLS = int(os.environ.get("AGENTSNAP_PARTITIONS_KILLS", "6" if NIGHTLY else "2"))
"""Coordinators SIGKILLed during the run of partitions and coordinator kills."""
CHAINS = 60 if NIGHTLY else 24
KILL_HOPS = 40
"""Hops of each chain in that run: long enough that coordinators die while it is busy."""


class Coordinator:
    """A coordinator process of the run (``coordinator_process.py``) on the coordinator host."""

    def __init__(self, process: asyncio.subprocess.Process, log: Path) -> None:
        self.process = process
        self.log = log

    def lines(self) -> list[str]:
        return self.log.read_text().splitlines()

    def said(self, text: str) -> bool:
        return any(line.startswith(text) for line in self.lines())

    def completed(self) -> int:
        return sum(line.startswith("complete ") for line in self.lines())


async def test_partitions_and_coordinators_killed_in_the_same_run_lose_and_repeat_nothing(
    hosts: Hosts, store: SqlStore, tmp_path: Path
) -> None:
    """Partitions of a worker and SIGKILLs of the coordinator, one after the other, in one run.

    The coordinator is a process on a host of its own, a standby waiting beside it for the
    run's lease; each kill is taken over by the standby (which rolls the run back to its last
    complete cut), and a new standby is started.
    """
    rng = random.Random()
    history = History()
    run_id = os.urandom(16).hex()
    done = tmp_path / "done"
    workers = Workers(hosts, run_id, tmp_path)
    coordinators: list[Coordinator] = []

    async def coordinator(*mode: str) -> Coordinator:
        log = tmp_path / f"coordinator-{len(coordinators)}.log"
        script = str(HERE / "coordinator_process.py")
        args = [script, hosts.nats.url, hosts.postgres.url, run_id, str(done), *mode]
        argv = hosts.command(COORDINATOR_HOST, [sys.executable, *args])
        with log.open("wb") as out:
            process = await asyncio.create_subprocess_exec(
                *argv, env=workers.env(), stdout=out, stderr=out
            )
        started = Coordinator(process, log)
        coordinators.append(started)
        return started

    def completed() -> int:
        return sum(c.completed() for c in coordinators)

    current = first = await coordinator("new", str(CHAINS), str(KILL_HOPS), "0.3")
    standby: Coordinator | None = None

    async def kill() -> None:
        nonlocal current, standby
        assert standby is not None
        await until(lambda: standby is not None and standby.said("waiting"), "a standby")
        current.process.kill()
        await current.process.wait()
        await until(lambda: standby is not None and standby.said("took-over"), "a takeover")
        history.takeovers += 1
        history.busy_kills += not current.said("idle")
        current, standby = standby, await coordinator("take-over")

    faults = [*schedule(rng), *[Fault(0, (), 0.0, kind="coordinator") for _ in range(KILLS)]]
    rng.shuffle(faults)
    link = await JetStreamLink.connect(hosts.nats.url)
    try:
        await until(lambda: current.said("started"), "the run created", workers)
        for group in range(GROUPS):
            await workers.start(group)
        await workers.until_up()
        standby = await coordinator("take-over")
        nemesis = Nemesis(hosts, completed, workers, history, kill)
        for fault in faults:
            await asyncio.sleep(rng.uniform(0.3, 1.5))
            if fault.kind == "coordinator":
                # Every chain is in the stream first: a coordinator killed while it feeds
                # would lose what it had not sent.
                await until(lambda: first.said("fed"), "the input fed", workers)
            await nemesis.apply(fault)
        assert standby is not None
        standby.process.kill()
        await standby.process.wait()
        await until(lambda: current.said("idle"), "the run idle", workers)
        done.touch()
        code = await asyncio.wait_for(current.process.wait(), PATIENCE)
        assert code == 0, current.log.read_text()[-3000:]
        await workers.stop()
    finally:
        hosts.heal()
        for started in coordinators:
            if started.process.returncode is None:
                started.process.kill()
                await started.process.wait()
        await workers.kill()
        await link.delete_stream(run_id)
        await link.close()
    history.chains = dict.fromkeys(range(CHAINS), KILL_HOPS)
    stored = await store.list_snapshots(run_id)
    last = max((s for s in stored if s.status is SnapshotStatus.COMPLETE), key=lambda s: s.seq)
    try:
        await check(store, hosts.postgres.url, run_id, last, history)
    finally:
        history.report("partitions-and-coordinator-kills")
    assert history.takeovers == KILLS
    abandoned = [s for s in stored if s.error and "coordinator stopped" in s.error]
    assert all(s.status is SnapshotStatus.FAILED for s in abandoned)
