"""Bank transfers across processes: consistent cuts of tellers spread over worker processes.

The same check as ``bank_transfers.py``, with the tellers in separate ``agentsnap worker``
processes talking over NATS JetStream, and every snapshot written to PostgreSQL. This
program is both the app and its driver:

- the app is ``make_app`` (each worker loads it with ``--app distributed_bank:make_app``);
- the driver creates the run (it is the run's coordinator: it hosts the environment and
  numbers every snapshot), starts ``--workers`` worker processes placed with ``--group n/N``,
  sends ``--transfers`` orders to random tellers while snapshots are taken every
  ``--snapshot-every`` seconds, waits until the run is idle (every order carried out), stops
  the workers, and checks every snapshot stored: a consistent cut whose balances
  (``balance``) plus the amounts in flight (``amount``) add up to the bank's money.

With ``--kill-one`` the driver kills one worker with SIGKILL half-way, starts it again on the
same agents (the same ``--group``), and waits for the run to recover and finish. A snapshot
in progress when the worker died may fail (a failed snapshot claims nothing); every complete
one must still hold all the money.

It prints the run's id as ``run: <id>`` and exits with status 1 if any check fails. The
run exports like any other (``agentsnap export <id> --db URL``). It needs the ``nats``
extra, a NATS server with JetStream, and PostgreSQL (shared by every process).

Run it with:

    python examples/distributed_bank.py --workers 3 --nats nats://127.0.0.1:4222 --db postgresql://postgres@127.0.0.1:5432/agentsnap
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import signal
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel

from agentsnap import Agent, AgentState, Context, Message, Snapshot, SnapshotFailed
from agentsnap._hints import cli_command
from agentsnap.distributed import App, DistributedRun, group_of
from agentsnap.messages import ENVIRONMENT
from agentsnap.records import RunStatus, SnapshotStatus
from agentsnap.snapshot import SnapshotPolicy
from agentsnap.testing import cut_problems

HERE = Path(__file__).resolve().parent
TELLERS_VARIABLE = "BANK_ACROSS_PROCESSES_TELLERS"
"""How many tellers ``make_app`` makes (the driver sets it for its workers)."""
BALANCE = 1_000
"""Each teller's starting balance."""


class Transfer(BaseModel):
    amount: int


class TellerState(AgentState):
    balance: int
    transfers_out: int = 0
    transfers_in: int = 0


class Teller(Agent[TellerState]):
    """Moves money: on a ``go`` order it sends a part of its balance to another teller.

    The part (1 to 5 %) and the payee are drawn from the order's message id; the amount
    depends on the balance, so on every transfer taken before the order. Handling the
    orders again in another order moves other amounts: only going back to a consistent
    cut, not replaying each teller's input on its own, keeps the money after a crash.
    """

    def __init__(self, name: str, peers: list[str]) -> None:
        super().__init__(name, TellerState(balance=BALANCE))
        self.peers = peers

    async def handle(self, message: Message, ctx: Context[TellerState]) -> None:
        if message.kind == "transfer":
            self.state.balance += message.payload_as(Transfer).amount
            self.state.transfers_in += 1
        elif message.kind == "go" and self.state.balance > 0:
            rng = random.Random(message.id)
            amount = max(1, self.state.balance * rng.randint(1, 5) // 100)
            self.state.balance -= amount
            self.state.transfers_out += 1
            ctx.send(rng.choice(self.peers), Transfer(amount=amount), kind="transfer")


def teller_names(tellers: int) -> list[str]:
    return [f"teller-{i}" for i in range(tellers)]


def make_app() -> App:
    """The bank: every teller with the same balance (``BANK_ACROSS_PROCESSES_TELLERS`` of them)."""
    names = teller_names(int(os.environ.get(TELLERS_VARIABLE, "9")))
    return App(
        agents=[Teller(name, [n for n in names if n != name]) for name in names],
        metadata={"example": "distributed_bank", "tellers": len(names), "balance": BALANCE},
    )


def money_in(snapshot: Snapshot) -> int:
    """Balances recorded in the tellers plus amounts recorded in flight."""
    total = sum(
        TellerState.model_validate(cut.state).balance
        for name, cut in snapshot.agents.items()
        if name != ENVIRONMENT
    )
    for channel in snapshot.channels:
        total += sum(
            Transfer.model_validate(m.payload).amount
            for m in channel.messages
            if m.kind == "transfer"
        )
    return total


# -- the driver -----------------------------------------------------------------------------


@dataclass
class WorkerProcess:
    """One ``agentsnap worker`` process of the run, and its log."""

    group: str
    log: Path
    process: asyncio.subprocess.Process | None = None
    since: int = 0
    """Where the latest start's output begins in the log."""

    def text(self, since: int = 0) -> str:
        if not self.log.exists():
            return ""
        with self.log.open("rb") as log:
            log.seek(since)
            return log.read().decode(errors="replace")


class Driver:
    """Starts, kills and stops the workers of one run."""

    def __init__(self, args: argparse.Namespace, run_id: str, logs: Path) -> None:
        self.args = args
        self.run_id = run_id
        self.workers = [
            WorkerProcess(f"{n}/{args.workers}", logs / f"worker-{n}.log")
            for n in range(args.workers)
        ]

    def command(self, worker: WorkerProcess, wait: float = 0.0) -> list[str]:
        return [
            sys.executable, "-m", "agentsnap", "worker",
            "--nats", self.args.nats, "--db", self.args.db,
            "--app", "distributed_bank:make_app", "--run", self.run_id,
            "--group", worker.group, "--lease", str(self.args.lease), "--wait", str(wait),
        ]  # fmt: skip

    async def launch(self, worker: WorkerProcess, wait: float = 0.0) -> None:
        env = {**os.environ, TELLERS_VARIABLE: str(self.args.tellers)}
        # The worker imports the app from its current directory: this one.
        with worker.log.open("ab") as out:
            worker.since = out.tell()
            worker.process = await asyncio.create_subprocess_exec(
                *self.command(worker, wait), cwd=HERE, env=env, stdout=out, stderr=out
            )

    async def until_hosting(self, worker: WorkerProcess, deadline: float) -> None:
        """Wait until ``worker`` says it hosts its agents; start it again while they are
        still held by the worker it replaces (whose claim has not expired yet)."""
        loop = asyncio.get_running_loop()
        while loop.time() < deadline:
            if " hosts " in worker.text(worker.since):
                return
            process = worker.process
            assert process is not None
            if process.returncode is not None:
                if "already hosted by another live worker" not in worker.text(worker.since):
                    raise RuntimeError(
                        f"worker {worker.group} exited with status {process.returncode}"
                    )
                await asyncio.sleep(0.25)
                await self.launch(worker)
            await asyncio.sleep(0.05)
        raise RuntimeError(f"worker {worker.group} did not start within {self.args.timeout} s")

    async def start_all(self, deadline: float) -> None:
        for worker in self.workers:
            await self.launch(worker)
        for worker in self.workers:
            await self.until_hosting(worker, deadline)

    async def kill_and_restart(self, worker: WorkerProcess, deadline: float) -> None:
        process = worker.process
        assert process is not None
        process.send_signal(signal.SIGKILL)
        await process.wait()
        # The new worker waits for the dead one's claim on the agents to expire.
        await self.launch(worker, wait=3 * self.args.lease)
        await self.until_hosting(worker, deadline)

    async def stop_all(self) -> list[str]:
        """SIGTERM every worker; what went wrong in those that did not stop cleanly."""
        problems = []
        for worker in self.workers:
            if worker.process is not None and worker.process.returncode is None:
                worker.process.send_signal(signal.SIGTERM)
        for worker in self.workers:
            process = worker.process
            if process is None:
                continue
            try:
                status = await asyncio.wait_for(process.wait(), self.args.timeout)
            except TimeoutError:
                process.kill()
                status = await process.wait()
            if status != 0:
                problems.append(f"worker {worker.group} exited with status {status}")
        return problems


async def a_complete_snapshot(run: DistributedRun, deadline: float) -> Snapshot:
    """Take snapshots until one completes."""
    loop = asyncio.get_running_loop()
    while loop.time() < deadline:
        with contextlib.suppress(SnapshotFailed):
            return await run.snapshot()
    raise TimeoutError("no snapshot completed in time")


async def drive(args: argparse.Namespace, logs: Path) -> tuple[str, list[Snapshot], list[str]]:
    """Run the bank; return the run id, its snapshots as stored, and what went wrong."""
    from agentsnap.jetstream import JetStreamLink  # noqa: PLC0415 - the nats extra
    from agentsnap.store.sql import SqlStore  # noqa: PLC0415

    loop = asyncio.get_running_loop()
    deadline = loop.time() + args.timeout
    os.environ[TELLERS_VARIABLE] = str(args.tellers)
    app = make_app()
    names = app.names
    rng = random.Random(args.seed)
    problems: list[str] = []
    store = SqlStore(args.db)
    link = await JetStreamLink.connect(args.nats)
    run = DistributedRun(
        link,
        store,
        app,
        policy=SnapshotPolicy(every_seconds=args.snapshot_every),
        name="distributed_bank",
    )
    driver = Driver(args, run.run_id, logs)
    status = RunStatus.FAILED
    try:
        await run.start()
        await driver.start_all(deadline)
        print(f"run: {run.run_id}", flush=True)
        kill_at = args.transfers // 2 if args.kill_one else -1
        for i in range(args.transfers):
            if i == kill_at:
                # A cut to go back to, then a worker gone without a word.
                await a_complete_snapshot(run, deadline)
                victim = driver.workers[0]
                print(f"killing worker {victim.group} (SIGKILL) after {i} orders", flush=True)
                await driver.kill_and_restart(victim, deadline)
                print(f"worker {victim.group} started again", flush=True)
            run.send(rng.choice(names), kind="go")
            if i % args.batch == args.batch - 1:
                await asyncio.sleep(args.batch / args.rate)
        # A cut that shows every order carried out: nothing in flight, no handler running.
        async with asyncio.timeout_at(deadline):
            final = await run.run_until_idle()
        orders = sum(final.agents[ENVIRONMENT].sent.values())
        if orders != args.transfers:
            problems.append(f"the final cut took {orders} orders of {args.transfers}")
        status = RunStatus.SUCCEEDED
    except (TimeoutError, RuntimeError) as exc:
        # The timeout of run_until_idle() notes, on its cause, what the run was still doing.
        notes = getattr(exc.__cause__, "__notes__", [])
        problems.append(str(exc) or "; ".join(notes) or "the run did not finish in time")
    finally:
        try:
            await run.close(status)
        finally:
            problems += await driver.stop_all()
            await link.delete_stream(run.run_id)
            await link.close()
    try:
        stored = await store.list_snapshots(run.run_id)
    finally:
        await store.close()
    if problems:
        for worker in driver.workers:
            tail = worker.text().strip().splitlines()[-15:]
            print(f"--- worker {worker.group} ({worker.log}):", *tail, sep="\n  ")
    return run.run_id, stored, problems


def check(args: argparse.Namespace, stored: list[Snapshot]) -> int:
    """Print each stored snapshot with its sum; the number that is wrong."""
    total = BALANCE * args.tellers
    group = {name: group_of(name, args.workers) for name in teller_names(args.tellers)}
    bad = 0
    for snapshot in stored:
        if snapshot.status is not SnapshotStatus.COMPLETE:
            print(f"  snapshot {snapshot.seq:3}: {snapshot.status}: {snapshot.error}")
            # Only a dead worker excuses a snapshot that did not complete.
            bad += not args.kill_one
            continue
        in_flight = sum(len(ch.messages) for ch in snapshot.channels)
        crossing = sum(
            len(ch.messages)
            for ch in snapshot.channels
            if ch.src != ENVIRONMENT and group[ch.src] != group[ch.dst]
        )
        found = money_in(snapshot)
        problems = cut_problems(snapshot)
        ok = found == total and not problems
        bad += not ok
        print(
            f"  snapshot {snapshot.seq:3}: sum {found} with {in_flight:3} in flight "
            f"({crossing:3} between processes)  {'ok' if ok else 'WRONG'}"
        )
        for problem in problems:
            print(f"      {problem}")
    if not any(s.status is SnapshotStatus.COMPLETE for s in stored):
        print("  no complete snapshot")
        bad += 1
    return bad


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=3, help="worker processes (default 3)")
    parser.add_argument(
        "--nats", required=True, metavar="URL", help="the NATS server (JetStream on)"
    )
    parser.add_argument(
        "--db", required=True, metavar="URL", help="the PostgreSQL database every process shares"
    )
    parser.add_argument("--tellers", type=int, default=9, help="tellers (default 9)")
    parser.add_argument(
        "--transfers", type=int, default=1000, help="transfer orders to send (default 1000)"
    )
    parser.add_argument(
        "--rate", type=float, default=500.0, help="orders sent per second (default 500)"
    )
    parser.add_argument(
        "--snapshot-every",
        type=float,
        default=0.2,
        metavar="SECONDS",
        help="begin a snapshot this often (default 0.2)",
    )
    parser.add_argument(
        "--kill-one",
        action="store_true",
        help="SIGKILL one worker half-way and start it again on the same agents",
    )
    parser.add_argument(
        "--lease",
        type=float,
        default=3.0,
        help="seconds a worker's claim on its agents holds without renewal (default 3)",
    )
    parser.add_argument(
        "--timeout", type=float, default=120.0, help="seconds the run may take (default 120)"
    )
    parser.add_argument("--seed", type=int, default=7, help="random seed (default 7)")
    args = parser.parse_args(argv)
    if args.workers < 1 or args.tellers < 2 or args.workers > args.tellers:
        parser.error("--tellers must be at least 2, and --workers between 1 and --tellers")
    if not args.db.startswith("postgresql"):
        parser.error("--db must be a PostgreSQL URL: every worker process shares the database")
    if args.transfers < 0 or args.rate <= 0 or args.snapshot_every <= 0 or args.lease < 1:
        parser.error("--transfers >= 0, --rate > 0, --snapshot-every > 0 and --lease >= 1")
    args.batch = max(1, int(args.rate // 50))
    placed = {group_of(name, args.workers) for name in teller_names(args.tellers)}
    if len(placed) < args.workers:
        parser.error(
            f"{args.tellers} tellers leave some of {args.workers} groups empty: "
            "use more tellers or fewer workers"
        )

    print(
        f"{args.workers} workers, {args.tellers} tellers, initial total "
        f"{BALANCE * args.tellers}, {args.transfers} transfers",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="distributed_bank-") as logs:
        try:
            run_id, stored, problems = asyncio.run(drive(args, Path(logs)))
        except KeyboardInterrupt:
            print("interrupted: the workers were stopped", file=sys.stderr)
            return 130
    bad = check(args, stored)
    for problem in problems:
        print(f"  {problem}")
    bad += len(problems)
    print("all snapshots consistent" if not bad else f"{bad} problem(s) found")
    print(f"inspect it with: {cli_command('export', run_id, '--db', args.db)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
