"""Ask a person before acting: refunds wait for approval, even across a stopped program.

Two refund desk agents handle refund requests. Their ``refund`` tool moves money, so it is
declared ``@tool(side_effect=True, approval=...)``: a refund above 100 waits for a person's
approval before its call is claimed in the ledger. A denial is an ordinary failure the agent
sees: it issues store credit instead, and tells the customer why. (A desk waiting for a
person handles nothing else meanwhile, as any agent in a long handler: its other messages
queue behind the one it handles.)

The program stops while two refunds wait (as a crash would stop it), so nothing runs the
run. A person answers from outside it, through the database, as ``agentsnap answer`` does:
one refund approved, the other denied with a reason. The run is then resumed: each answer
reaches its own call, the approved refund happens once, the denied one never. At the end
the program checks, from the payment service's own table, that each approved refund
happened exactly once; it exits with status 1 otherwise. The run is kept in SQLite (a
temporary file unless ``--db`` names a database, SQLite or PostgreSQL).

Run it with:

    python examples/approvals.py
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import uuid
from collections import Counter
from typing import Any, cast

from agentsnap import Agent, AgentState, ApprovalDenied, Context, Message, Runtime, tool
from agentsnap.inspect import approve, deny, list_requests
from agentsnap.store.sql import SqlStore

PAID: Counter[str] = Counter()
"""The payment service's own record: refunds paid, by order."""


@tool(side_effect=True, approval=lambda arguments: arguments["amount"] > 100)
async def refund(order: str, amount: int) -> str:
    """Pay ``amount`` back on ``order``'s card."""
    PAID[order] += 1
    return f"refunded {amount} on {order}"


@tool(side_effect=True)
async def store_credit(order: str, amount: int) -> str:
    """Give ``amount`` as store credit instead."""
    return f"store credit of {amount} for {order}"


class RefundDesk(Agent[AgentState]):
    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        payload = cast("dict[str, Any]", message.payload)
        order, amount = payload["order"], payload["amount"]
        try:
            outcome = await refund(ctx, order=order, amount=amount)
        except ApprovalDenied as denied:  # the person said no: try something else
            outcome = await store_credit(ctx, order=order, amount=amount)
            outcome += f" (refund denied: {denied.reason})"
        self.state.memory[order] = outcome


ORDERS = [("A-1", 40, "desk-1"), ("B-2", 250, "desk-1"), ("C-3", 900, "desk-2")]
DESKS = ("desk-1", "desk-2")


async def wait_for_requests(url: str, run_id: str, count: int) -> list[str]:
    """Poll the database until ``count`` requests of the run are pending; their ids."""
    store = SqlStore(url, create=False)
    try:
        for _ in range(1000):
            found = await list_requests(store, run_id, pending=True)
            if len(found) >= count:
                return [request.id for request in found]
            await asyncio.sleep(0.02)
    finally:
        await store.close()
    raise SystemExit("the refunds never asked for approval")


async def main(url: str) -> int:
    run_id = uuid.uuid4().hex
    store = SqlStore(url)
    try:
        await first_program(store, url, run_id)
        await answer_as_a_person(url, run_id)
        return await second_program(store, run_id)
    finally:
        await store.close()


async def first_program(store: SqlStore, url: str, run_id: str) -> None:
    """The program starts the run; two refunds wait for approval, then it stops."""
    async with Runtime(store=store, run_id=run_id) as runtime:
        for name in DESKS:
            runtime.add(RefundDesk(name))
        for order, amount, desk in ORDERS:
            runtime.send(desk, {"order": order, "amount": amount})
        running = asyncio.create_task(runtime.run_until_idle())
        await wait_for_requests(url, run_id, 2)
        running.cancel()
    print(f"stopped with 2 refunds waiting; paid so far: {dict(PAID)}")


async def answer_as_a_person(url: str, run_id: str) -> None:
    """While nothing runs the run, a person answers, through the database."""
    store = SqlStore(url, create=False)
    try:
        for request in await list_requests(store, run_id, pending=True):
            assert isinstance(request.question, dict)
            order = cast("dict[str, Any]", request.question)["arguments"]["order"]
            if order == "B-2":
                await approve(store, request.id, by="maria")
            else:
                await deny(store, request.id, "above the 500 limit for card refunds", by="maria")
            print(f"answered {request.id} ({order})")
    finally:
        await store.close()


async def second_program(store: SqlStore, run_id: str) -> int:
    """The program runs again: the run resumes and each answer reaches its call."""
    async with Runtime(store=store, run_id=run_id) as runtime:
        for name in DESKS:
            runtime.add(RefundDesk(name))
        await runtime.resume()
        await runtime.run_until_idle()
        for order, _, desk in ORDERS:
            print(f"{order}: {runtime.agents[desk].state.memory[order]}")
    if Counter({"A-1": 1, "B-2": 1}) != PAID:
        print(f"FAILED: refunds paid {dict(PAID)}, expected A-1 and B-2 once each")
        return 1
    print("each approved refund paid exactly once, the denied one never")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--db", default=None, help="database URL (default: a temporary SQLite)")
    args = parser.parse_args()
    if args.db:
        sys.exit(asyncio.run(main(args.db)))
    with tempfile.TemporaryDirectory() as folder:
        sys.exit(asyncio.run(main(f"sqlite:///{folder}/approvals.db")))
