"""Bank transfers: the textbook check that snapshots are consistent cuts.

N tellers each start with the same balance and send random amounts to one another, while
snapshots start from random initiators, several at once. Money is only ever moved, so for every
completed snapshot the balances recorded in the agents plus the amounts recorded in flight on
the channels must add up to the initial total. The program prints that sum for each snapshot
and exits with status 1 if any snapshot gets it wrong. With ``--db URL`` (SQLite or
PostgreSQL) the run and its snapshots are written to that database and the run id is printed,
and every transfer is kept there too (see ``agentsnap export``; ``--no-journal`` does not).

Run it with:

    python examples/bank_transfers.py --agents 8 --transfers 2000 --snapshot-every 100 --seed 7
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import uuid

from pydantic import BaseModel

from agentsnap import Agent, AgentState, Context, Message, Runtime, Snapshot, Store
from agentsnap._hints import cli_command
from agentsnap.runtime import interrupted_message
from agentsnap.store.sql import SqlStore
from agentsnap.testing import SeededScheduler, cut_problems


class Transfer(BaseModel):
    amount: int


class TellerState(AgentState):
    balance: int
    transfers_out: int = 0


class Teller(Agent[TellerState]):
    """Moves money: on a ``go`` message it sends some of its balance to another teller."""

    def __init__(self, name: str, balance: int, peers: list[str], rng: random.Random) -> None:
        super().__init__(name, TellerState(balance=balance))
        self.peers = peers
        self.rng = rng

    async def handle(self, message: Message, ctx: Context[TellerState]) -> None:
        if message.kind == "transfer":
            self.state.balance += message.payload_as(Transfer).amount
        elif message.kind == "go" and self.state.balance > 0:
            amount = self.rng.randint(1, min(self.state.balance, 50))
            self.state.balance -= amount
            self.state.transfers_out += 1
            ctx.send(self.rng.choice(self.peers), Transfer(amount=amount), kind="transfer")


def money_in(snapshot: Snapshot) -> int:
    """Balances recorded in the tellers plus amounts recorded in flight."""
    total = sum(
        TellerState.model_validate(cut.state).balance
        for name, cut in snapshot.agents.items()
        if name != "$env"
    )
    for channel in snapshot.channels:
        total += sum(
            Transfer.model_validate(m.payload).amount
            for m in channel.messages
            if m.kind == "transfer"
        )
    return total


async def simulate(  # noqa: PLR0917
    agents: int,
    transfers: int,
    snapshot_every: int,
    seed: int,
    deterministic: bool,
    store: Store | None = None,
    journal: bool | None = None,
    run_id: str | None = None,
) -> tuple[str, int, list[Snapshot]]:
    """Run the simulation; return the run id, the initial total and every snapshot taken."""
    rng = random.Random(seed)
    names = [f"teller-{i}" for i in range(agents)]
    scheduler = SeededScheduler(seed) if deterministic else None
    async with Runtime(
        scheduler=scheduler,
        store=store,
        name="bank_transfers",
        metadata={"example": "bank_transfers", "seed": seed},
        journal=journal,
        run_id=run_id,
    ) as runtime:
        for name in names:
            peers = [n for n in names if n != name]
            runtime.add(Teller(name, 1_000, peers, random.Random(rng.random())))
        total = 1_000 * agents
        for i in range(transfers):
            runtime.send(rng.choice(names), kind="go")
            if i % snapshot_every == 0:
                # Several snapshots from random initiators, sometimes overlapping.
                for _ in range(rng.choice((1, 1, 2, 3))):
                    runtime.snapshot(initiator=rng.choice([None, *names]))
            if i % 10 == 0:
                await asyncio.sleep(0) if not deterministic else await _steps(scheduler, rng)
        await runtime.run_until_idle()
        return runtime.run_id, total, await runtime.list_snapshots()


async def _steps(scheduler: SeededScheduler | None, rng: random.Random) -> None:
    assert scheduler is not None
    for _ in range(rng.randint(0, 20)):
        if not await scheduler.step():
            break


async def run(args: argparse.Namespace, run_id: str) -> tuple[str, int, list[Snapshot]]:
    store: Store | None = None
    if args.db:
        store = SqlStore(args.db)
    try:
        return await simulate(
            args.agents,
            args.transfers,
            args.snapshot_every,
            args.seed,
            args.deterministic,
            store,
            args.journal,
            run_id,
        )
    finally:
        if store is not None:
            await store.close()


def interrupted(run_id: str, db: str | None) -> int:
    """Ctrl-C: say in one line what became of the run, and exit with 130, like a shell."""
    print(interrupted_message(run_id, db), file=sys.stderr)
    return 130


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=8, help="number of tellers (default 8)")
    parser.add_argument("--transfers", type=int, default=2000, help="transfers to start")
    parser.add_argument(
        "--snapshot-every", type=int, default=100, help="start snapshots every N transfers"
    )
    parser.add_argument("--seed", type=int, default=7, help="random seed (default 7)")
    parser.add_argument(
        "--deterministic",
        action="store_true",
        help="use the seeded scheduler: the same seed gives the same interleaving",
    )
    parser.add_argument(
        "--db", help="write the run to this database (sqlite:///file.db or postgresql://...)"
    )
    parser.add_argument(
        "--journal",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="keep every message in the database (the default with --db; --no-journal: don't)",
    )
    args = parser.parse_args(argv)
    if args.agents < 2:
        parser.error("--agents must be at least 2 (tellers need someone to pay)")
    if args.journal and not args.db:
        parser.error("--journal needs --db: the journal is kept in the database")
    if args.transfers < 0 or args.snapshot_every < 1:
        parser.error("--transfers must be >= 0 and --snapshot-every >= 1")

    run_id = uuid.uuid4().hex
    try:
        run_id, total, snapshots = asyncio.run(run(args, run_id))
    except KeyboardInterrupt:
        return interrupted(run_id, args.db)
    bad = 0
    print(f"{args.agents} tellers, initial total {total}, {len(snapshots)} snapshots")
    for snapshot in snapshots:
        if snapshot.status != "complete":
            print(f"  snapshot {snapshot.seq:3}: {snapshot.status}: {snapshot.error}")
            bad += 1
            continue
        in_flight = sum(len(c.messages) for c in snapshot.channels)
        found = money_in(snapshot)
        problems = cut_problems(snapshot)
        ok = found == total and not problems
        bad += not ok
        print(
            f"  snapshot {snapshot.seq:3} by {snapshot.initiator:<10} "
            f"sum {found} with {in_flight:2} in flight  {'ok' if ok else 'WRONG'}"
        )
        for problem in problems:
            print(f"      {problem}")
    print("all snapshots consistent" if not bad else f"{bad} snapshot(s) inconsistent")
    if args.db:
        print(f"run {run_id} written to {args.db}")
        print(f"inspect it with: {cli_command('export', run_id, '--db', args.db)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
