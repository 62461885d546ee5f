"""A run killed while a long handler runs, after a snapshot taken inside that handler.

``test_long_handler_crash.py`` runs this in a child process. One agent, ``payer``, handles an
order: it charges a card through a side-effecting tool (the outside service records every
execution, and deduplicates by idempotency key as a payment API does), then awaits a long
model call (a sleep), then records the order as paid and sends a receipt to ``books``.

The first process prints ``CHARGED`` once the charge returned, has the runtime take a snapshot
while the handler still awaits its model call, prints ``SNAPSHOT <id>`` once it is stored, and
waits to be killed. ``--resume`` resumes the run from that snapshot and runs to the end with a
short model call, then prints one JSON line ``{"result": ...}``.

Usage::

    python tests/guarantees/long_handler_workflow.py URL SERVICE_DB RUN_ID
    python tests/guarantees/long_handler_workflow.py URL SERVICE_DB RUN_ID --resume
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sqlite3
import sys

from pydantic import Field

from agentsnap import Agent, AgentState, Context, Message, Runtime, ToolCall, tool
from agentsnap.store.sql import SqlStore

ORDER: dict[str, str | int] = {"order": "o-1", "amount": 42}
SERVICE_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS charges (key TEXT PRIMARY KEY, amount INTEGER NOT NULL);"
    "CREATE TABLE IF NOT EXISTS executions (pid INTEGER NOT NULL, key TEXT NOT NULL)"
)


class Service:
    path = ""


@tool(side_effect=True)
def charge(call: ToolCall, order: str, amount: int) -> dict[str, str | int]:
    """The outside service: every execution is logged; a key is charged once."""
    conn = sqlite3.connect(Service.path, timeout=60)
    try:
        with conn:
            conn.execute("INSERT INTO executions VALUES (?, ?)", (os.getpid(), call.key))
            conn.execute("INSERT OR IGNORE INTO charges VALUES (?, ?)", (call.key, amount))
    finally:
        conn.close()
    return {"order": order, "charged": amount}


class PayerState(AgentState):
    paid: list[str] = Field(default_factory=list)


class Payer(Agent[PayerState]):
    def __init__(self, think: float, charged: asyncio.Event) -> None:
        super().__init__("payer")
        self.think = think
        self.charged = charged
        self.starts = 0

    async def handle(self, message: Message, ctx: Context[PayerState]) -> None:
        self.starts += 1
        order = message.payload_as(dict[str, str | int])
        receipt = await charge(ctx, order=str(order["order"]), amount=int(order["amount"]))
        print("CHARGED", flush=True)
        self.charged.set()
        await asyncio.sleep(self.think)  # the model call
        self.state.paid.append(str(receipt["order"]))
        ctx.send("books", receipt)


class BooksState(AgentState):
    receipts: list[str] = Field(default_factory=list)


class Books(Agent[BooksState]):
    async def handle(self, message: Message, ctx: Context[BooksState]) -> None:
        self.state.receipts.append(json.dumps(message.payload, sort_keys=True))


async def main(options: argparse.Namespace) -> int:
    Service.path = options.service
    conn = sqlite3.connect(options.service)
    conn.executescript(SERVICE_SCHEMA)
    conn.close()
    charged = asyncio.Event()
    payer = Payer(0.05 if options.resume else 600.0, charged)
    runtime = Runtime(store=SqlStore(options.url), run_id=options.run_id, lease=1.0)
    async with runtime:
        runtime.add(payer)
        runtime.add(Books("books"))
        if options.resume:
            resumed = await runtime.resume(wait=30)
            await runtime.run_until_idle()
            books = runtime.agents["books"]
            result = {
                "resumed_from": resumed.id,
                "starts": payer.starts,
                "paid": payer.state.paid,
                "receipts": books.state.receipts,
            }
            print(json.dumps({"result": result}), flush=True)
            return 0
        runtime.send("payer", ORDER)
        await charged.wait()
        # Within far less than the model call: the snapshot does not wait for it.
        snapshot = await asyncio.wait_for(runtime.snapshot(), 30)
        print(f"SNAPSHOT {snapshot.id}", flush=True)
        await asyncio.sleep(600)  # killed here
    return 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("service")
    parser.add_argument("run_id")
    parser.add_argument("--resume", action="store_true")
    sys.exit(asyncio.run(main(parser.parse_args())))
