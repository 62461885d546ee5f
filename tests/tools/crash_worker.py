"""A payment run killed between the charge and its recorded outcome, and its resumption.

Used by ``test_crash.py``: ``python tests/tools/crash_worker.py MODE URL RUN_ID``.

* ``crash``: takes a snapshot, sends an order to the payer and runs. The charge's body
  records the charge in ``crash_test_charges`` (the payment service's own table, committed)
  and then the process kills itself with SIGKILL: the effect happened, its outcome was never
  recorded in the ledger.
* ``resume``: continues the run from its snapshot, which restores the order (it was made
  durable before the charge was claimed), and runs; prints one JSON line with the handler
  failures and the payer's tool calls.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys

import sqlalchemy

from agentsnap import Agent, AgentState, Context, Message, Runtime, tool
from agentsnap.store.migrate import sync_url
from agentsnap.store.sql import SqlStore

URL = sys.argv[2]
CHARGES = sqlalchemy.table(
    "crash_test_charges", sqlalchemy.column("card"), sqlalchemy.column("amount")
)
KILL = sys.argv[1] == "crash"


@tool(side_effect=True, name="crash_charge")
def charge(card: str, amount: int) -> dict[str, int]:
    """The payment service: a sync call (it runs in a worker thread)."""
    engine = sqlalchemy.create_engine(sync_url(URL))
    with engine.begin() as conn:
        conn.execute(sqlalchemy.insert(CHARGES).values(card=card, amount=amount))
    engine.dispose()
    if KILL:
        os.kill(os.getpid(), signal.SIGKILL)
    return {"amount": amount}


class Payer(Agent[AgentState]):
    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        receipt = await charge(ctx, card="4242", amount=message.payload_as(int))
        self.state.memory["receipt"] = dict(receipt)


async def main(mode: str, run_id: str) -> None:
    store = SqlStore(URL)
    try:
        async with Runtime(store=store, run_id=run_id) as runtime:
            payer = runtime.add(Payer("payer"))
            if mode == "crash":
                await runtime.snapshot()
                runtime.send("payer", 500)
            else:
                await runtime.resume()
            await runtime.run_until_idle(raise_failures=False)
            report = {
                "failures": [
                    [type(f.__cause__).__name__, str(f.__cause__)] for f in runtime.failures
                ],
                "tool_calls": [call.model_dump(mode="json") for call in payer.state.tool_calls],
                "memory": payer.state.memory,
            }
    finally:
        await store.close()
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[3]))
