"""The instructions one idempotent tool call costs, for ``valgrind --tool=callgrind``.

An agent's handler makes K calls of ``@tool(side_effect=True)`` in a row (each a new key derived
from its arguments, so each claims, runs and records), on a runtime without snapshots or
journal, with the ledger named on the command line: ``memory`` (the in-memory ledger) or
``sqlite`` (``SqlLedger`` on a new SQLite file in a temporary directory, the default
durability). Run it under callgrind for two values of K; the difference of the instruction
counts divided by the difference of K is the cost of one call, free of start-up:

    PYTHONHASHSEED=0 valgrind --tool=callgrind --callgrind-out-file=/tmp/t200.out \
        python benchmarks/tool_calls.py sqlite 200
    PYTHONHASHSEED=0 valgrind --tool=callgrind --callgrind-out-file=/tmp/t600.out \
        python benchmarks/tool_calls.py sqlite 600

Instruction counts do not depend on the load of the machine, unlike timings.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

from agentsnap import Agent, AgentState, Context, Message, Runtime, SnapshotPolicy, tool
from agentsnap.ledger import Ledger
from agentsnap.store.ledger import MemoryLedger
from agentsnap.store.sql_ledger import SqlLedger


@tool(side_effect=True, name="bench_pay")
async def pay(order: int, amount: int) -> dict[str, int]:
    """As cheap as possible, so that the tool's own work is what shows."""
    return {"order": order, "amount": amount}


class Payer(Agent[AgentState]):
    """Makes ``k`` tool calls in one handler."""

    def __init__(self, name: str, k: int) -> None:
        super().__init__(name)
        self.k = k
        self.done = 0

    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        for order in range(self.k):
            await pay(ctx, order=order, amount=5)
        self.done = self.k


async def main(kind: str, k: int) -> None:
    """Run one handler making ``k`` calls on the ``kind`` ledger."""
    with tempfile.TemporaryDirectory() as folder:
        ledger: Ledger
        if kind == "memory":
            ledger = MemoryLedger()
        else:
            ledger = SqlLedger(f"sqlite:///{Path(folder) / 'ledger.db'}")
        try:
            policy = SnapshotPolicy(at_start=False, at_end=False)
            async with Runtime(ledger=ledger, snapshot_policy=policy) as runtime:
                payer = Payer("payer", k)
                runtime.add(payer)
                runtime.send("payer", None)
                await runtime.run_until_idle()
            assert payer.done == k
        finally:
            await ledger.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
