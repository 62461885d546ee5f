"""Payments under rollbacks and retries: every card is charged exactly once.

A cashier agent takes orders for chairs. For each order it reserves the chairs at the
warehouse, charges the customer's card through a payment service, and sends a receipt to an
auditor. Both are tools with side effects, so every call is claimed in the ledger under an
idempotency key before it runs, and its outcome recorded after.

Things go wrong on purpose:

* the payment gateway times out on the first request for every order: a declared transient
  error, retried under the same key;
* on its first try at each order the cashier misreads the quantity and reserves too many
  chairs; the receipt check rejects it, the run rolls back to the last consistent cut, and
  the cashier, told why, handles the order again. The charge it repeats has the same key,
  so it gets the recorded result and the card is not charged again. A reservation is named
  by its order and its number of chairs (the tool declares ``key_from``), so reserving the
  right number is a reservation of its own, and the wrong one, which the new path does not
  hold, is abandoned and released by the tool's compensating action when the run ends.

The payment service counts charges in its own table. At the end the program prints the
ledger and checks, from the service's table, that each order's card was charged exactly once
and that every wrong reservation was released; it exits with status 1 otherwise. The run is
kept in SQLite (a temporary file unless ``--db`` names a database, SQLite or PostgreSQL).

Run it with:

    python examples/payments.py --orders 3
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import uuid
from collections import Counter
from pathlib import Path

import sqlalchemy
from pydantic import BaseModel

from agentsnap import (
    Agent,
    AgentState,
    Context,
    LedgerEntry,
    Message,
    Runtime,
    ToolCallStatus,
    ToolRetry,
    tool,
)
from agentsnap._hints import cli_command
from agentsnap.runtime import interrupted_message
from agentsnap.store.migrate import sync_url
from agentsnap.store.sql import SqlStore


class GatewayTimeout(Exception):
    """The payment gateway did not answer; no charge was made."""


class PaymentService:
    """A fake payment service that records every charge it makes in its own table."""

    def __init__(self, url: str) -> None:
        self.engine = sqlalchemy.create_engine(sync_url(url))
        self.table = sqlalchemy.Table(
            "payment_service_charges",
            sqlalchemy.MetaData(),
            sqlalchemy.Column("id", sqlalchemy.Integer, primary_key=True, autoincrement=True),
            sqlalchemy.Column("card", sqlalchemy.String(32)),
            sqlalchemy.Column("order_id", sqlalchemy.String(32)),
            sqlalchemy.Column("amount", sqlalchemy.Integer),
        )
        self.table.create(self.engine, checkfirst=True)
        self.requests: Counter[str] = Counter()

    def charge(self, card: str, order_id: str, amount: int) -> int:
        self.requests[order_id] += 1
        if self.requests[order_id] == 1:
            raise GatewayTimeout(f"no answer from the gateway for order {order_id}")
        with self.engine.begin() as conn:
            inserted = conn.execute(
                self.table.insert().values(card=card, order_id=order_id, amount=amount)
            )
        key = inserted.inserted_primary_key
        assert key is not None  # an INSERT of one row into a table with a primary key
        return int(key[0])

    def charges(self) -> Counter[str]:
        with self.engine.connect() as conn:
            rows = conn.execute(sqlalchemy.select(self.table.c.order_id))
            return Counter(order_id for (order_id,) in rows)


SERVICE: PaymentService
HELD: dict[str, int] = {}  # the warehouse: chairs on hold, by reservation


def release(entry: LedgerEntry) -> dict[str, object]:
    """Compensating action of ``reserve_chairs``: give the chairs back."""
    reservation = str(entry.result)
    chairs = HELD.pop(reservation)
    return {"released": reservation, "chairs": chairs}


# Holding 2 chairs is another effect than holding 3: both arguments name the reservation.
@tool(side_effect=True, compensate=release, key_from=("order_id", "chairs"))
async def reserve_chairs(order_id: str, chairs: int) -> str:
    reservation = f"hold-{order_id}-{chairs}"
    HELD[reservation] = chairs
    return reservation


@tool(side_effect=True, transient=(GatewayTimeout,), retry=ToolRetry.attempts(4))
def charge_card(card: str, order_id: str, amount: int) -> int:
    """Sync, like most payment SDKs: it runs in a worker thread."""
    return SERVICE.charge(card, order_id, amount)


class Order(BaseModel):
    id: str
    chairs: int
    card: str


class Receipt(BaseModel):
    order_id: str
    chairs: int
    reservation: str
    charge_id: int


class Cashier(Agent[AgentState]):
    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        order = message.payload_as(Order)
        told = any(f"order {order.id}:" in feedback.reason for feedback in ctx.feedback)
        chairs = order.chairs if told else order.chairs + 1  # misread on the first try
        reservation = await reserve_chairs(ctx, order_id=order.id, chairs=chairs)
        charge_id = await charge_card(
            ctx, card=order.card, order_id=order.id, amount=order.chairs * 45
        )
        receipt = Receipt(
            order_id=order.id, chairs=chairs, reservation=reservation, charge_id=charge_id
        )
        ctx.send("auditor", receipt, kind="receipt")


class Auditor(Agent[AgentState]):
    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        self.state.memory[message.payload_as(Receipt).order_id] = message.payload


async def simulate(
    url: str, orders: int, run_id: str | None = None
) -> tuple[Runtime, list[LedgerEntry], dict[str, int]]:
    ordered = {f"o{n}": 1 + n % 3 for n in range(1, orders + 1)}

    def matches_order(message: Message) -> bool | str:
        receipt = message.payload_as(Receipt)
        wanted = ordered[receipt.order_id]
        if receipt.chairs == wanted:
            return True
        return f"order {receipt.order_id}: reserved {receipt.chairs} chairs, ordered {wanted}"

    store = SqlStore(url)
    try:
        # One rejected receipt per order: each is its own episode of the default retry
        # policy, so any number of orders fits.
        runtime = Runtime(
            store=store, run_id=run_id, name="payments", metadata={"example": "payments"}
        )
        runtime.check("cashier", kind="receipt", schema=Receipt)
        runtime.check("cashier", kind="receipt", check=matches_order)
        async with runtime:
            runtime.add(Cashier("cashier"))
            runtime.add(Auditor("auditor"))
            for order_id, chairs in ordered.items():
                card = f"4000-0000-0000-{order_id[1:]:0>4}"
                runtime.send("cashier", Order(id=order_id, chairs=chairs, card=card))
            await runtime.run_until_idle()
        # Closing the runtime reconciled the ledger (abandoned calls compensated): read it now.
        entries = await ledger_calls(url, runtime.run_id)
    finally:
        await store.close()
    return runtime, entries, ordered


async def ledger_calls(url: str, run_id: str) -> list[LedgerEntry]:
    from agentsnap.store.sql_ledger import SqlLedger  # noqa: PLC0415

    ledger = SqlLedger(url)
    try:
        return await ledger.list_calls(run_id)
    finally:
        await ledger.close()


def show(entries: list[LedgerEntry]) -> None:
    print(f"{'key':<12} {'tool':<15} {'arguments':<52} {'status':<12} tries  outcome")
    for entry in entries:
        arguments = ", ".join(f"{k}={v}" for k, v in entry.arguments.items())
        outcome = entry.compensation if entry.compensation is not None else entry.result
        print(
            f"{entry.key[:12]:<12} {entry.tool:<15} {arguments:<52} {entry.status.value:<12} "
            f"{entry.attempts:>5}  {outcome}"
        )


def interrupted(run_id: str, db: str | None) -> int:
    """Ctrl-C: say in one line what became of the run, and exit with 130, like a shell."""
    print(interrupted_message(run_id, db), file=sys.stderr)
    return 130


def main(argv: list[str] | None = None) -> int:
    global SERVICE  # noqa: PLW0603  # the tools reach the service like they would an SDK client
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--orders", type=int, default=3, help="how many orders (default 3)")
    parser.add_argument("--db", help="keep the run in this database (sqlite:/// or postgresql://)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        url = args.db or f"sqlite:///{Path(folder) / 'payments.db'}"
        SERVICE = PaymentService(url)
        before = SERVICE.charges()
        run_id = uuid.uuid4().hex
        try:
            runtime, entries, ordered = asyncio.run(simulate(url, args.orders, run_id))
        except KeyboardInterrupt:
            SERVICE.engine.dispose()
            return interrupted(run_id, args.db)
        charged = SERVICE.charges() - before
        SERVICE.engine.dispose()

    show(entries)
    retried = sum(e.attempts - 1 for e in entries if e.tool == "charge_card")
    released = [e for e in entries if e.status == ToolCallStatus.COMPENSATED]
    print(
        f"{len(ordered)} orders, {len(runtime.rollbacks)} rollbacks, {retried} retried "
        f"gateway timeouts, {len(released)} wrong reservations released"
    )
    problems = [
        f"order {order_id} was charged {charged[order_id]} times"
        for order_id in ordered
        if charged[order_id] != 1
    ]
    if len(runtime.rollbacks) < len(ordered):
        problems.append(f"expected a rollback per order, got {len(runtime.rollbacks)}")
    kept = {f"hold-{order_id}-{chairs}": chairs for order_id, chairs in ordered.items()}
    if len(released) != len(ordered) or kept != HELD:
        problems.append(f"the warehouse holds {HELD}, the wrong reservations were not released")
    for problem in problems:
        print("PROBLEM:", problem)
    if problems:
        return 1
    print("every order charged exactly once")
    if args.db:
        print(f"inspect it with: {cli_command('export', runtime.run_id, '--db', args.db)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
