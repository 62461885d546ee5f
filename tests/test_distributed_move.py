"""Agents move from one worker process to another while the run goes on, for rebalancing.

The bank of ``distributed_effects.py`` runs on three ``agentsnap worker`` processes (the
default scheduler), the test process being its coordinator, while chains of transfers are
fed in. Then, with ``agentsnap worker ... --move``:

1. a new worker takes two tellers of the worker hosting the most, which lets them go at the
   cut the coordinator takes and serves on with the rest of its tellers;
2. another new worker takes every teller of another worker, which then exits by itself.

Transfers keep being booked while the agents move, and the run must finish with every
transfer booked exactly once in a table outside the ledger, every ledger entry settled,
every stored complete snapshot a consistent cut holding the bank's money, and one rollback
for each move.

In one process, hosts standing for the workers: a move whose first let-go order is lost on
its way completes (the new worker asks for the order again) at the cost of one rollback,
and the snapshots taken after it are consistent cuts.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sys
from pathlib import Path
from typing import Any

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

from agentsnap.distributed import DistributedRun, Worker, broadcast_subject, place
from agentsnap.integrity import cut_problems
from agentsnap.jetstream import JetStreamLink
from agentsnap.ledger import ToolCallStatus
from agentsnap.records import SnapshotStatus
from agentsnap.snapshot import SnapshotPolicy
from agentsnap.store.ledger import ledger_for
from agentsnap.store.sql import SqlStore

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PATIENCE = 180.0
"""Seconds a step may take (never reached when green)."""
TELLERS = 9
GROUPS = 3
HOPS = 12


@pytest.fixture
def nats_url() -> str:
    if not reachable(SHARED_URL):
        unavailable(f"no NATS server at {SHARED_URL}")
    return SHARED_URL


class WorkerProcess:
    """An ``agentsnap worker`` process whose output goes to a log."""

    def __init__(self, process: asyncio.subprocess.Process, log: Path) -> None:
        self.process = process
        self.log = log

    @classmethod
    async def start(cls, log: Path, environ: dict[str, str], *args: str) -> WorkerProcess:
        with log.open("wb") as out:
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "agentsnap", "worker", *args, env=environ, stdout=out,
                stderr=out,
            )  # fmt: skip
        return cls(process, log)

    def said(self, text: str) -> bool:
        return text in self.log.read_text()

    async def until_said(self, text: str) -> None:
        await until(lambda: self.said(text), f"{self.log.name} said {text!r}", self)


async def until(condition: object, what: str, worker: WorkerProcess | None = None) -> None:
    assert callable(condition)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + PATIENCE
    while not condition():
        tail = "" if worker is None else worker.log.read_text()[-3000:]
        assert loop.time() < deadline, f"not {what} within {PATIENCE} s\n{tail}"
        if worker is not None and worker.process.returncode not in {None, 0}:
            raise AssertionError(f"{worker.log.name} exited before {what}\n{tail}")
        await asyncio.sleep(0.05)


async def test_agents_move_between_worker_processes_while_the_run_goes_on(
    nats_url: str, postgres_url: str, tmp_path: Path, teardown: Teardown
) -> None:
    create_effects_table(postgres_url)
    environ = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(HERE), os.environ.get("PYTHONPATH", "")]),
        "BANK_TELLERS": str(TELLERS),
        "BANK_DERIVED": "1",
        "BANK_POISON": "",
        "AGENTSNAP_EFFECTS_URL": postgres_url,
    }
    rng = random.Random()
    link = teardown.link(await JetStreamLink.connect(nats_url))
    store = teardown.store(SqlStore(postgres_url))
    app = make_app()
    run = teardown.stream(
        DistributedRun(link, store, app, policy=SnapshotPolicy(every_seconds=0.2), part_timeout=10)
    )
    workers: list[WorkerProcess] = []
    chains: list[int] = []

    async def start(name: str, *args: str) -> WorkerProcess:
        common = ["--nats", nats_url, "--db", postgres_url, "--run", run.run_id]
        common += ["--app", "distributed_effects:make_app"]
        worker = await WorkerProcess.start(tmp_path / f"{name}.log", environ, *common, *args)
        workers.append(worker)
        teardown.process(worker.process)
        return worker

    async def feed() -> None:
        while True:
            chain = len(chains)
            chains.append(chain)
            run.send(chain_start(chain), {"chain": chain, "hops": HOPS}, kind="go")
            await asyncio.sleep(rng.uniform(0.1, 0.6))

    def booked() -> int:
        return sum(effects(postgres_url, run.run_id).values())

    feeding: asyncio.Future[None] | None = None

    async def stop_feeding() -> None:
        if feeding is not None:
            feeding.cancel()

    teardown.on_close(stop_feeding)
    await run.start()
    groups = [place(app.names, group=f"{n}/{GROUPS}") for n in range(GROUPS)]
    # The largest group gives two tellers away; another one gives all of its own.
    big = max(range(GROUPS), key=lambda n: len(groups[n]))
    other = next(n for n in range(GROUPS) if n != big)
    started = [await start(f"w{n}", "--group", f"{n}/{GROUPS}") for n in range(GROUPS)]
    first, second = started[big], started[other]
    for worker in started:
        await worker.until_said(" hosts ")
    feeding = asyncio.ensure_future(feed())
    await until(lambda: booked() > 30, "transfers booked")

    # 1. Two tellers of the first worker move; it keeps the others.
    moved = groups[big][:2]
    before, rollbacks = booked(), len(run.rollbacks)
    taker = await start("taker", "--agents", ",".join(moved), "--move")
    await taker.until_said(" hosts ")
    await first.until_said("lets " + ", ".join(sorted(moved)) + " go")
    await until(lambda: len(run.rollbacks) > rollbacks, "the run went back to the cut")
    seen = len(run.complete)
    await until(lambda: len(run.complete) > seen + 1, "a snapshot after the move")
    assert first.process.returncode is None, first.log.read_text()[-3000:]
    # One rollback for the move, though the first worker rejoined with the tellers it
    # kept before the taker started.
    assert len(run.rollbacks) == rollbacks + 1, run.rollbacks[rollbacks:]
    assert booked() > before, "no transfer was booked while the agents moved"

    # 2. Every teller of the second worker moves: it exits by itself.
    before, rollbacks = booked(), len(run.rollbacks)
    whole = await start("whole", "--group", f"{other}/{GROUPS}", "--move")
    await whole.until_said(" hosts ")
    code = await asyncio.wait_for(second.process.wait(), PATIENCE)
    assert code == 0, second.log.read_text()[-3000:]
    assert second.said("hosts nothing more")
    await until(lambda: len(run.rollbacks) > rollbacks, "the run went back to the cut")
    feeding.cancel()
    assert booked() > before, "no transfer was booked while the agents moved"

    async with asyncio.timeout(PATIENCE):
        last = await run.run_until_idle()
    await run.close()
    for worker in workers:
        if worker.process.returncode is None:
            worker.process.send_signal(signal.SIGTERM)
    for worker in workers:
        code = await asyncio.wait_for(worker.process.wait(), PATIENCE)
        assert code == 0, worker.log.read_text()[-3000:]

    assert [names for names, _ in run.moves] == [
        sorted(moved),
        groups[other],
    ]
    stored = await store.list_snapshots(run.run_id)
    complete = [s for s in stored if s.status is SnapshotStatus.COMPLETE]
    for snapshot in complete:
        assert cut_problems(snapshot) == [], snapshot.seq
        assert money_in(snapshot) == TELLERS * BALANCE, snapshot.seq
    assert finished(last)
    wanted = {(chain, hop): 1 for chain in chains for hop in range(HOPS + 1)}
    handled = sum(
        TellerState.model_validate(cut.state).handled
        for name, cut in last.agents.items()
        if name.startswith("teller-")
    )
    assert handled == len(wanted)
    found = effects(postgres_url, run.run_id)
    assert found == wanted, sorted(
        (k, found.get(k, 0)) for k in set(found) | set(wanted) if found.get(k) != 1
    )
    ledger = ledger_for(store)
    assert ledger is not None
    try:
        calls = await ledger.list_calls(run.run_id)
    finally:
        await ledger.close()
    assert {call.status for call in calls} == {ToolCallStatus.SUCCEEDED}
    recorded = await store.list_rollbacks(run.run_id)
    reasons = [r.reason for r in recorded]
    assert {r.source for r in recorded} == {"recovery"}, reasons
    # One rollback for each move, by the worker that took the agents.
    assert [r.split(" took over ")[-1] for r in reasons] == [
        ", ".join(sorted(moved)),
        ", ".join(groups[other]),
    ], reasons


class LosesFirstLetGo:
    """The coordinator's NATS client with the first let-go order it publishes lost: the
    publish returns as if it were sent, and nothing reaches the server (plain NATS may lose
    a message so, on a connection that breaks as it is written).
    """

    def __init__(self, link: JetStreamLink, run_id: str) -> None:
        self.publish = link.nc.publish
        self.subject = broadcast_subject(run_id)
        self.orders: list[bytes] = []

    async def __call__(self, subject: str, payload: bytes = b"", *args: Any, **kw: Any) -> None:
        if subject == self.subject and b'"let_go"' in payload:
            self.orders.append(payload)
            if len(self.orders) == 1:
                return
        await self.publish(subject, payload, *args, **kw)


async def test_a_lost_let_go_is_ordered_again_and_a_move_costs_one_rollback(
    nats_url: str, postgres_url: str, teardown: Teardown, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker that lets an agent go keeps the others: the run goes back to the cut once.

    Snapshots are taken all along: those begun while the agent moves fail (a worker let it
    go before recording its part, or the run went back), and none fails for its cut. The
    channels between the agent moved and those kept held messages in flight at the cut,
    put back by the rollback on channels between two workers now: each sender's notice of
    its recording names them, for its counters came from the cut, not from its sends.
    """
    create_effects_table(postgres_url)
    monkeypatch.setenv("AGENTSNAP_EFFECTS_URL", postgres_url)
    store = teardown.store(SqlStore(postgres_url))
    links = await teardown.links(nats_url, 4)
    run = teardown.run(
        DistributedRun(links[0], store, make_app(), policy=SnapshotPolicy(every_seconds=0.05))
    )
    lost = LosesFirstLetGo(links[0], run.run_id)
    monkeypatch.setattr(links[0].nc, "publish", lost)
    tellers = make_app().names
    old, other = teardown.workers(
        Worker(link, store, run.run_id, make_app(), agents, name=name)
        for link, agents, name in [
            (links[1], tellers[: TELLERS // 2], "old"),
            (links[2], tellers[TELLERS // 2 :], "other"),
        ]
    )
    new = teardown.worker(
        Worker(links[3], store, run.run_id, make_app(), ["teller-0"], name="new", move=True)
    )
    await run.start()
    for worker in (old, other):
        await worker.start()
    chains = range(2 * TELLERS)
    for chain in chains:
        run.send(chain_start(chain), {"chain": chain, "hops": HOPS}, kind="go")
    # Without the order sent again, the new worker gives up after a minute (AgentsHeld).
    async with asyncio.timeout(PATIENCE):
        await new.start()
    assert len(lost.orders) >= 2, "the lost order was not sent again"
    assert old.moved_out == ["teller-0"]
    assert old.agents == tellers[1 : TELLERS // 2]
    assert not old.stopped.is_set()
    async with asyncio.timeout(PATIENCE):
        last = await run.run_until_idle()
    assert finished(last)
    assert run.moves == [(["teller-0"], "new")]
    # One rollback for the move, ordered once and carried out once by every worker: the
    # old worker rejoined with the tellers it kept and waited for the one the new
    # worker's start began.
    assert run.authority.generation == 1
    for worker in (old, new, other):
        assert len(worker.host.rollbacks) == 1, worker.name
    [rollback] = run.rollbacks
    assert rollback.source == "recovery"
    assert rollback.reason == "worker new took over teller-0"
    assert await store.list_rollbacks(run.run_id) == [rollback]
    assert sorted(run.authority.restored_by[rollback.id]) == ["new", "old", "other"]
    for snapshot in run.complete:
        assert cut_problems(snapshot) == [], snapshot.seq
        assert money_in(snapshot) == TELLERS * BALANCE, snapshot.seq
    wanted = {(chain, hop): 1 for chain in chains for hop in range(HOPS + 1)}
    assert effects(postgres_url, run.run_id) == wanted
    stored = await store.list_snapshots(run.run_id)
    after = [s for s in stored if s.started_at > rollback.at]
    assert any(s.status is SnapshotStatus.COMPLETE for s in after), "no snapshot after the move"
    inconsistent = [
        (s.seq, s.error)
        for s in stored
        if s.status is SnapshotStatus.FAILED and "not consistent" in (s.error or "")
    ]
    assert inconsistent == []
