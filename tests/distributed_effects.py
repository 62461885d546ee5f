"""A bank whose tellers book every transfer with a side-effecting tool, across processes.

``make_app`` is the factory ``agentsnap worker --app distributed_effects:make_app`` loads
(with this directory on ``PYTHONPATH``). A ``go`` message ``{"chain": c, "hops": h}`` starts
chain ``c``: the teller receiving a transfer keeps its amount, books it with the
side-effecting tool ``book`` (a row in the table ``bank_effects``, outside the ledger, under
the idempotency key ``run:chain:hops``; with ``BANK_DERIVED=1``, the transfers of every
even-numbered chain under the key agentsnap derives from the message being handled, so
half of the effects), and, while hops remain, sends a fixed amount to a
fixed peer, both functions of the chain and the hop: the same transfer is made again after a
rollback or a crash. Money is only moved, so every consistent cut holds the initial total.

``BANK_POISON`` (``"c:h,c:h"``) names transfers whose sender makes them careless (the check
``careful`` rejects them) until it learns better: until it got feedback, or saw a rollback;
with ``BANK_STUBBORN=1`` it never learns.
``AGENTSNAP_EFFECTS_URL`` is the PostgreSQL database of ``bank_effects``.

``BANK_OUTAGE`` (``"n:s"``) makes the database stop answering this process's ledger
claims for ``s`` seconds from its ``n``-th attempt at a claim on: each fails as a connection
refused, a transient fault the store retries until its deadline and then gives up on, so
that a handler loses its work to the database.
"""

from __future__ import annotations

import asyncio
import errno
import os
import random

import psycopg
from outside_world import execute
from pydantic import BaseModel, Field

from agentsnap import Agent, AgentState, Context, Message, RollbackInfo, Snapshot, tool
from agentsnap.distributed import App
from agentsnap.exceptions import StoreError, ToolOutcomeUnknown
from agentsnap.ledger import LedgerEntry
from agentsnap.messages import ENVIRONMENT
from agentsnap.rollback import RetryPolicy
from agentsnap.store.sql_ledger import SqlLedger

TELLERS = int(os.environ.get("BANK_TELLERS", "9"))
BALANCE = 1_000
EFFECTS = "bank_effects"
STUBBORN = os.environ.get("BANK_STUBBORN") == "1"
DERIVED = os.environ.get("BANK_DERIVED") == "1"
"""Book the even-numbered chains under derived keys (safe where the run stays on its
timeline: crashes, partitions, takeovers, moves; not after a rejected output)."""


class Outage:
    """The database away for this process's ledger claims, from one claim on, a while."""

    def __init__(self, text: str) -> None:
        first, _, seconds = text.partition(":")
        self.first = int(first)
        self.seconds = float(seconds)
        self.claims = 0
        self.until: float | None = None

    def install(self) -> None:
        """Make every claim of this process's ledgers go through ``away`` first."""
        original = SqlLedger._claim_once
        outage = self

        async def claim_once(
            ledger: SqlLedger, again: bool, entry: LedgerEntry
        ) -> LedgerEntry | None:
            if outage.away():
                error = StoreError("the database is unavailable")
                error.__cause__ = ConnectionRefusedError(errno.ECONNREFUSED, "refused")
                raise error
            return await original(ledger, again, entry)

        SqlLedger._claim_once = claim_once  # type: ignore[method-assign,assignment]

    def away(self) -> bool:
        """Whether the database is away for this attempt at a claim (retries count)."""
        now = asyncio.get_running_loop().time()
        self.claims += 1
        if self.until is None and self.claims >= self.first:
            self.until = now + self.seconds
            print(f"outage: the database stops answering claims for {self.seconds} s", flush=True)
        return self.until is not None and now < self.until


def poisoned() -> set[tuple[int, int]]:
    text = os.environ.get("BANK_POISON", "")
    return {(int(c), int(h)) for c, _, h in (p.partition(":") for p in text.split(",") if p)}


class Transfer(BaseModel):
    chain: int
    hops: int
    amount: int = 0
    careless: bool = False


class TellerState(AgentState):
    balance: int
    handled: int = 0
    lessons: list[str] = Field(default_factory=list)
    rollbacks: int = 0
    back_to: list[str] = Field(default_factory=list)
    """The snapshot each rollback went back to, as ``on_rollback`` was told."""


async def _connect() -> psycopg.AsyncConnection[tuple[int]]:
    return await psycopg.AsyncConnection.connect(
        os.environ["AGENTSNAP_EFFECTS_URL"], autocommit=True
    )


@tool(side_effect=True)
async def book(run: str, chain: int, hops: int, teller: str) -> int:
    """Record the transfer in the world: one row per call (nothing here deduplicates)."""
    await execute(
        f"INSERT INTO {EFFECTS} (run_id, chain, hops, teller, pid) VALUES (%s, %s, %s, %s, %s)",
        (run, chain, hops, teller, os.getpid()),
    )
    return 1


async def booked(run: str, chain: int, hops: int) -> bool:
    """Whether the world holds the transfer's row (for a call whose outcome is unknown)."""
    async with await _connect() as conn:
        cursor = await conn.execute(
            f"SELECT count(*) FROM {EFFECTS} WHERE run_id = %s AND chain = %s AND hops = %s",
            (run, chain, hops),
        )
        row = await cursor.fetchone()
    return row is not None and row[0] > 0


def route(name: str, peers: list[str], chain: int, hops: int) -> tuple[str, int]:
    """Where and how much a teller sends for this transfer: the same every time."""
    salt = sum(ord(ch) for ch in name)
    return peers[(chain * 31 + hops * 7 + salt) % len(peers)], (chain * 7 + hops * 13) % 50 + 1


class Teller(Agent[TellerState]):
    """Keeps and books what it receives, and passes a fixed amount on while hops remain."""

    def __init__(self, name: str, peers: list[str]) -> None:
        super().__init__(name, TellerState(balance=BALANCE))
        self.peers = peers
        self.rng = random.Random()
        self.poison = poisoned()

    async def handle(self, message: Message, ctx: Context[TellerState]) -> None:
        transfer = message.payload_as(Transfer)
        self.state.balance += transfer.amount
        self.state.handled += 1
        run, chain, hops = ctx.run_id, transfer.chain, transfer.hops
        key = f"{run}:{chain}:{hops}"
        try:
            if DERIVED and chain % 2 == 0:
                await book(ctx, run=run, chain=chain, hops=hops, teller=self.name)
            else:
                await book(ctx, key=key, run=run, chain=chain, hops=hops, teller=self.name)
        except ToolOutcomeUnknown:
            # The worker that made the call was killed during it: the world knows.
            if not await booked(run, chain, hops):
                again = f"{key}:again"
                await book(ctx, key=again, run=run, chain=chain, hops=hops, teller=self.name)
        await asyncio.sleep(self.rng.uniform(0, 0.003))
        if transfer.hops > 0:
            to, amount = route(self.name, self.peers, transfer.chain, transfer.hops)
            careless = (transfer.chain, transfer.hops) in self.poison and (
                STUBBORN or not (self.state.lessons or self.state.rollbacks)
            )
            self.state.balance -= amount
            ctx.send(
                to,
                Transfer(
                    chain=transfer.chain, hops=transfer.hops - 1, amount=amount, careless=careless
                ),
                kind="transfer",
            )

    async def on_rollback(self, rollback: RollbackInfo, ctx: Context[TellerState]) -> None:
        self.state.rollbacks += 1
        self.state.back_to.append(rollback.snapshot_id)
        self.state.lessons = [feedback.reason for feedback in ctx.feedback]


def names(tellers: int = TELLERS) -> list[str]:
    return [f"teller-{i}" for i in range(tellers)]


def careful(message: Message) -> bool | str:
    payload = message.payload
    careless = isinstance(payload, dict) and payload.get("careless")
    return not careless or "a careless transfer: check it first"


def make_app() -> App:
    """Every teller, the check ``careful`` on each, and a retry policy of three attempts."""
    everyone = names()
    app = App(
        agents=[Teller(name, [n for n in everyone if n != name]) for name in everyone],
        retry=RetryPolicy.attempts(3),
    )
    for name in everyone:
        app.check(name, kind="transfer", check=careful, name="careful")
    outage = os.environ.get("BANK_OUTAGE")
    if outage:
        Outage(outage).install()
    return app


def chain_start(chain: int) -> str:
    return f"teller-{chain % TELLERS}"


def create_effects_table(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {EFFECTS} (id serial PRIMARY KEY, run_id text, "
            "chain int, hops int, teller text, pid int)"
        )


def effects(url: str, run_id: str) -> dict[tuple[int, int], int]:
    """How many rows the world holds per transfer ``(chain, hops)``."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            f"SELECT chain, hops, count(*) FROM {EFFECTS} WHERE run_id = %s GROUP BY chain, hops",
            (run_id,),
        ).fetchall()
    return {(chain, hops): count for chain, hops, count in rows}


def money_in(snapshot: Snapshot) -> int:
    """Balances recorded in the tellers plus amounts recorded in flight."""
    total = sum(
        TellerState.model_validate(cut.state).balance
        for name, cut in snapshot.agents.items()
        if name != ENVIRONMENT
    )
    return total + sum(
        Transfer.model_validate(m.payload).amount for ch in snapshot.channels for m in ch.messages
    )


def finished(snapshot: Snapshot) -> bool:
    """Whether the cut shows a run with nothing left to do: every input taken, none in flight."""
    sent = snapshot.agents[ENVIRONMENT].sent
    return not any(ch.messages for ch in snapshot.channels) and all(
        snapshot.agents[name].received.get(ENVIRONMENT, 0) == count for name, count in sent.items()
    )
