"""Workers killed at random while their agents ask a sampled model: recorded answers are kept.

The test process is the run's coordinator; three ``agentsnap worker`` processes host the
samplers of ``sampled_workers_app.py`` (``--group N/3``), who ask a sampled model what to
do (other words, other tool-call arguments and another next agent on every call), run the
side-effecting tools it answers with (one under a key derived from the call's place, one
under a key the caller gives) and pass their tasks on to the agent the model named. A worker
is killed (SIGKILL) at a random moment while a batch of tasks is being handled (after a
random number of its questions were asked), and a spare worker started ahead takes its agents
over. The run goes back to its last complete cut and stays on its timeline: every worker's
agents redo their deliveries in the order the workers logged, the handlers get the answers
their model calls recorded, and so send the same messages to the same agents and derive the
same keys. Then:

* no write was performed twice: each ``(tool, task, hop)`` is in the service's table under
  one key, and every write of every hop happened;
* no model call was asked again after its answer was recorded (its prompt names the message
  and the timeline), and recorded answers were replayed;
* every hop of every task was handled, the run finished, and every complete snapshot is a
  consistent cut.

After the kills, the run's coordinator is replaced in the same manner, while a batch is
being handled: its lease is given up and another coordinator takes the run over. The
takeover goes back to the last complete cut on the run's timeline as well: the same
guarantees hold across it.

``AGENTSNAP_DISTRIBUTED_REPLAY_KILLS`` sets the kills (3 by default; 20 for a nightly run),
``AGENTSNAP_CRASH_SEED`` replays the kill moments.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sys
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import psycopg
import pytest
from distributed_teardown import Teardown
from nats_server import SHARED_URL, reachable, unavailable
from sampled_workers_app import ASKS, WRITE_TOOLS, WRITES, create_tables, make_app, names

from agentsnap import Snapshot, SnapshotFailed
from agentsnap.distributed import DistributedRun
from agentsnap.integrity import cut_problems
from agentsnap.jetstream import JetStreamLink
from agentsnap.messages import ENVIRONMENT
from agentsnap.records import SnapshotStatus
from agentsnap.snapshot import SnapshotPolicy
from agentsnap.store.sql import SqlStore
from agentsnap.store.sql_ledger import SqlLedger

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PATIENCE = 150.0
"""Seconds a step may take (never reached when green)."""
GROUPS = 3
AGENTS = 6
HOPS = 5
TASKS_PER_KILL = 3
BATCH_ASKS = TASKS_PER_KILL * (HOPS + 1)
"""Questions a batch of tasks asks the model (one per hop) when nothing is replayed."""
KILLS = int(os.environ.get("AGENTSNAP_DISTRIBUTED_REPLAY_KILLS", "3"))
SEED = os.environ.get("AGENTSNAP_CRASH_SEED") or str(random.randrange(10**9))
LEASE = 2.0
"""Seconds a worker's claim holds: a dead worker's agents are taken over once it expires."""

pytestmark = pytest.mark.postgres


@pytest.fixture
def nats_url() -> str:
    if not reachable(SHARED_URL):
        unavailable(f"no NATS server at {SHARED_URL}")
    return SHARED_URL


@pytest.fixture
async def store(postgres_url: str) -> AsyncIterator[SqlStore]:
    made = SqlStore(postgres_url)
    create_tables(postgres_url)
    try:
        yield made
    finally:
        await made.close()


class Workers:
    """The worker processes of one run (by group), and spares waiting to take over."""

    def __init__(self, run_id: str, nats_url: str, postgres_url: str, tmp: Path) -> None:
        self.run_id = run_id
        self.nats_url = nats_url
        self.postgres_url = postgres_url
        self.tmp = tmp
        self.active: dict[int, asyncio.subprocess.Process] = {}
        self.spares: dict[int, tuple[asyncio.subprocess.Process, Path]] = {}
        self.logs: list[Path] = []

    async def _start(self, group: int, wait: float) -> tuple[asyncio.subprocess.Process, Path]:
        log = self.tmp / f"worker-{group}-{len(self.logs)}.log"
        self.logs.append(log)
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT), str(HERE), os.environ.get("PYTHONPATH", "")]),
            "SAMPLED_AGENTS": str(AGENTS),
            "AGENTSNAP_EFFECTS_URL": self.postgres_url,
        }
        args = ["--nats", self.nats_url, "--db", self.postgres_url]
        args += ["--app", "sampled_workers_app:make_app", "--run", self.run_id]
        args += ["--group", f"{group}/{GROUPS}", "--lease", str(LEASE), "--wait", str(wait)]
        with log.open("wb") as out:
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "agentsnap", "worker", *args,
                env=env, stdout=out, stderr=out,
            )  # fmt: skip
        return process, log

    async def start(self, group: int) -> Path:
        self.active[group], log = await self._start(group, 0.0)
        return log

    async def spare(self, group: int) -> None:
        """A worker for ``group``'s agents, waiting until their worker stops."""
        self.spares[group] = await self._start(group, PATIENCE)

    def ready(self) -> list[int]:
        return [group for group, (_, log) in self.spares.items() if "waits for" in log.read_text()]

    async def kill(self, group: int) -> Path:
        """SIGKILL ``group``'s worker; its spare takes over (its log is returned)."""
        victim = self.active[group]
        victim.kill()
        await victim.wait()
        self.active[group], log = self.spares.pop(group)
        return log

    async def stop(self) -> None:
        for process, _ in self.spares.values():
            process.kill()
            await process.wait()
        self.spares.clear()
        for process in self.active.values():
            process.send_signal(signal.SIGTERM)
        for group, process in self.active.items():
            code = await asyncio.wait_for(process.wait(), PATIENCE)
            assert code == 0, (group, self.text())

    async def kill_all(self) -> None:
        for process in [*self.active.values(), *(p for p, _ in self.spares.values())]:
            if process.returncode is None:
                process.kill()
                await process.wait()

    def text(self) -> str:
        return "\n".join(f"--- {log.name}\n{log.read_text()}" for log in self.logs)


async def until(condition: object, what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + PATIENCE
    while not condition():  # type: ignore[operator]
        assert loop.time() < deadline, what
        await asyncio.sleep(0.02)


def handled(snapshot: Snapshot) -> list[str]:
    """Every ``task:hop`` the cut's agents handled."""
    done: list[str] = []
    for name, cut in snapshot.agents.items():
        if name != ENVIRONMENT:
            memory = cut.state.get("memory", {})
            assert isinstance(memory, dict)
            items = memory.get("done", [])
            assert isinstance(items, list)
            done += [str(item) for item in items]
    return done


async def first_cut(run: DistributedRun) -> Snapshot:
    """A complete snapshot of the run before any task (a busy machine may fail one)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + PATIENCE
    while True:
        try:
            return await run.snapshot()
        except SnapshotFailed:
            assert loop.time() < deadline, "no snapshot completed"
            await asyncio.sleep(0.1)


async def until_finished(run: DistributedRun, hops: int) -> Snapshot:
    """Take snapshots until one shows every hop handled and nothing in flight."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + PATIENCE
    while loop.time() < deadline:
        try:
            snapshot = await run.snapshot()
        except SnapshotFailed:
            await asyncio.sleep(0.1)
            continue
        if len(handled(snapshot)) >= hops and not any(ch.messages for ch in snapshot.channels):
            return snapshot
        await asyncio.sleep(0.2)
    raise AssertionError(f"the run did not finish within {PATIENCE} s")


async def asks_count(url: str, run_id: str) -> int:
    """How many questions the run's agents have asked the model so far."""

    def count() -> int:
        with psycopg.connect(url, autocommit=True) as conn:
            row = conn.execute(
                f"SELECT count(*) FROM {ASKS} WHERE prompt LIKE %s", (f"% of {run_id})",)
            ).fetchone()
        return int(row[0]) if row else 0

    return await asyncio.to_thread(count)


async def until_asked(url: str, run_id: str, asks: int) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + PATIENCE
    while await asks_count(url, run_id) < asks:
        assert loop.time() < deadline, f"{asks} questions asked"
        await asyncio.sleep(0.01)


def service_rows(
    url: str, run_id: str
) -> tuple[list[tuple[str, str, int, int]], list[tuple[str, float]]]:
    """The writes ``(key, tool, task, hop)`` and the asks ``(prompt, asked_at)`` of the run."""
    with psycopg.connect(url, autocommit=True) as conn:
        writes = conn.execute(
            f"SELECT key, tool, task, hop FROM {WRITES} WHERE run_id = %s", (run_id,)
        ).fetchall()
        asks = conn.execute(
            f"SELECT prompt, asked_at FROM {ASKS} WHERE prompt LIKE %s", (f"% of {run_id})",)
        ).fetchall()
    return (
        [(str(k), str(t), int(n), int(h)) for k, t, n, h in writes],
        [(str(prompt), float(at)) for prompt, at in asks],
    )


async def test_workers_killed_mid_run_replay_recorded_answers_and_write_once(
    nats_url: str, postgres_url: str, store: SqlStore, tmp_path: Path, teardown: Teardown
) -> None:
    rng = random.Random(f"{SEED}:distributed-replay")
    link = teardown.link(await JetStreamLink.connect(nats_url))
    policy = SnapshotPolicy(every_seconds=0.2)
    run = DistributedRun(link, store, make_app(), policy=policy, part_timeout=60)
    workers = Workers(run.run_id, nats_url, postgres_url, tmp_path)
    tasks = 0
    teardown.on_close(workers.kill_all)
    teardown.stream(run)
    successor_link = teardown.link(await JetStreamLink.connect(nats_url))
    successor_store = teardown.store(SqlStore(postgres_url))
    successor: DistributedRun | None = None
    closed = False

    async def close_successor() -> None:
        if successor is not None and not closed:
            await successor.close()

    teardown.on_close(close_successor)
    await run.start()
    logs = [await workers.start(group) for group in range(GROUPS)]
    await until(lambda: all(" hosts " in log.read_text() for log in logs), "workers up")
    for group in range(GROUPS):
        await workers.spare(group)
    await first_cut(run)
    everyone = names(AGENTS)
    for kill in range(KILLS):
        await until(workers.ready, "a worker waiting to take over")
        # The kill lands while the batch is being handled: after a random number of its
        # questions were asked (never all), so some answers are recorded after the last
        # cut and must be replayed, not asked again.
        kill_at = await asks_count(postgres_url, run.run_id) + rng.randint(3, BATCH_ASKS - 3)
        for _ in range(TASKS_PER_KILL):
            run.send(everyone[tasks % AGENTS], {"task": tasks, "hops": HOPS}, kind="task")
            tasks += 1
        await until_asked(postgres_url, run.run_id, kill_at)
        await asyncio.sleep(rng.uniform(0, 0.02))
        recovered = len(run.rollbacks) + 1
        group = rng.choice(workers.ready())
        taking_over = await workers.kill(group)
        await until(lambda n=recovered: len(run.rollbacks) >= n, f"recovery {kill}")
        assert " hosts " in taking_over.read_text()
        await workers.spare(group)
    # The coordinator gives up its lease while a batch is being handled, as one that died
    # would stop renewing it: another takes the run over.
    taken_at = await asks_count(postgres_url, run.run_id) + rng.randint(3, BATCH_ASKS - 3)
    for _ in range(TASKS_PER_KILL):
        run.send(everyone[tasks % AGENTS], {"task": tasks, "hops": HOPS}, kind="task")
        tasks += 1
    await run.flush()
    await until_asked(postgres_url, run.run_id, taken_at)
    lease = await successor_store.get_lease(run.run_id)
    assert lease is not None
    await successor_store.release_lease(run.run_id, lease.token)
    successor = new = DistributedRun.take_over(
        successor_link, successor_store, make_app(), run.run_id, wait=10, policy=policy,
        part_timeout=60,
    )  # fmt: skip
    await new.start()
    await until(lambda: new.took_over is not None, "the takeover")
    last = await until_finished(new, tasks * (HOPS + 1))
    await run.close()  # fenced: records nothing
    await new.close()
    closed = True
    await workers.stop()
    await teardown.close()
    assert successor is not None
    assert successor.took_over is not None
    rollbacks = successor.rollbacks
    logs_text = workers.text()
    context = f"seed {SEED}\n{logs_text}"

    # Every hop of every task was handled once in the end, and every cut is consistent.
    wanted = sorted(f"{task}:{hop}" for task in range(tasks) for hop in range(HOPS + 1))
    assert sorted(handled(last)) == wanted, context
    complete = [
        s for s in await store.list_snapshots(run.run_id) if s.status is SnapshotStatus.COMPLETE
    ]
    for snapshot in complete:
        assert cut_problems(snapshot) == [], (snapshot.seq, context)

    # Every recovery (the takeover's too) stayed on the run's timeline and redid the order
    # the workers logged.
    recoveries = [r for r in rollbacks if r.source == "recovery"]
    assert len(recoveries) == len(rollbacks) >= KILLS + 1, context
    assert successor.authority.timeline == 0, context
    assert "in the order logged" in logs_text, context

    # No write twice, none missing.
    writes, asks = service_rows(postgres_url, run.run_id)
    seen = Counter((tool, task, hop) for _, tool, task, hop in writes)
    twice = sorted(write for write, count in seen.items() if count > 1)
    assert not twice, (twice, context)
    expected = {(tool, t, h) for tool in WRITE_TOOLS for t in range(tasks) for h in range(HOPS + 1)}
    assert set(seen) == expected, (sorted(expected ^ set(seen)), context)

    # No model call asked again after its answer was recorded; recorded answers replayed.
    ledger = SqlLedger(postgres_url, create=False)
    try:
        calls = await ledger.list_model_calls(run.run_id)
    finally:
        await ledger.close()
    asked: dict[str, list[float]] = {}
    for prompt, at in asks:
        asked.setdefault(str(prompt), []).append(float(at))
    again = []
    for call in calls:
        assert call.timeline == 0, call  # no recovery started a timeline
        prompt = str(call.asked().messages[0].content)
        done = call.finished_at.timestamp()
        later = [at for at in asked.get(prompt, []) if at > done + 0.001]
        if later:
            again.append(f"{prompt!r} asked {len(later)} more time(s) after it was recorded")
    assert not again, (again, context)
    assert len(calls) == tasks * (HOPS + 1), context
    replays = sum(call.replays for call in calls)
    print(
        f"run {run.run_id} (seed {SEED}): {KILLS} kills, {len(recoveries)} recoveries, "
        f"{len(calls)} model calls recorded, {replays} answers replayed, {len(asks)} asks, "
        f"{len(writes)} writes"
    )
    assert replays > 0, context
