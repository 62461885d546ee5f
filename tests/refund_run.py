"""A refund agent that asks for approval, run in a child process that a test kills.

``python refund_run.py URL RUN_ID start|resume EFFECTS`` runs (or resumes) run ``RUN_ID`` in
the database at ``URL``. The refunder calls ``refund`` (declared ``approval=True``), which
waits for a person before its call is claimed in the ledger; a denial makes it issue store
credit instead, with the reason. Each refund that really happens appends a line to the file
``EFFECTS`` (its order and this process's id), so the test counts them. When the run is idle,
the refunder's memory is printed as JSON.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any, cast

from agentsnap import Agent, AgentState, ApprovalDenied, Context, Message, Runtime, tool
from agentsnap.store.sql import SqlStore

EFFECTS = Path(sys.argv[4]) if len(sys.argv) > 4 else Path("effects.txt")


@tool(side_effect=True, approval=True)
async def refund(order: str, amount: int) -> str:
    with EFFECTS.open("a") as effects:
        effects.write(f"{order} {os.getpid()}\n")
    return f"refunded {amount} on {order}"


@tool(side_effect=True)
async def store_credit(order: str, amount: int) -> str:
    return f"credit {amount} on {order}"


class Refunder(Agent[AgentState]):
    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        payload = cast("dict[str, Any]", message.payload)
        order, amount = payload["order"], payload["amount"]
        try:
            self.state.memory["outcome"] = await refund(ctx, order=order, amount=amount)
        except ApprovalDenied as denied:
            self.state.memory["denied"] = denied.reason
            self.state.memory["outcome"] = await store_credit(ctx, order=order, amount=amount)


async def main(url: str, run_id: str, mode: str) -> None:
    async with Runtime(store=SqlStore(url), run_id=run_id) as runtime:
        refunder = runtime.add(Refunder("refunder"))
        if mode == "start":
            runtime.send("refunder", {"order": "A-17", "amount": 250})
        else:
            await runtime.resume()
        await runtime.run_until_idle()
        print(json.dumps(refunder.state.memory, sort_keys=True), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3]))
