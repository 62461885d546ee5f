"""An MCP server's tools as agentsnap tools: a transfer survives a rollback, made once.

A clerk agent pays an invoice through a bank that is an MCP server (``mcp_server.py``,
started here over stdio). ``mcp_tools`` turns the server's tools into agentsnap tools by
their annotations: ``balance`` (``readOnlyHint``) is called plainly, ``transfer``
(``destructiveHint``) goes through the ledger, under an idempotency key bound to the call,
which the server also receives in the request's ``_meta``.

The clerk asks a sampled model for the payment's memo, which words it differently every time,
and its self-evaluation rejects its first report. The run rolls back to the last consistent
cut and the clerk handles the invoice again: its model is asked again and words the memo
otherwise, but the transfer it makes at the same place has the same key, so the recorded
result comes back and the bank is not asked again. At the end the program prints the ledger
and checks, from the bank's own request log, that the transfer reached the server once; it
exits with status 1 otherwise.

Run it with:

    python examples/mcp_tools.py
"""

from __future__ import annotations

import asyncio
import sqlite3
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentsnap import Agent, AgentState, Context, Message, Runtime
from agentsnap.integrations.mcp import mcp_server, mcp_tools
from agentsnap.testing import SampledModel
from agentsnap.tools import Tool

SERVER = Path(__file__).with_name("mcp_server.py")


class Clerk(Agent[AgentState]):
    """Pays the invoice it is sent, then reports to the auditor."""

    def __init__(self, tools: dict[str, Tool[Any]]) -> None:
        super().__init__("clerk")
        self.tools = tools
        self.model = SampledModel(
            [("memo", ["invoice 42", "Invoice #42", "inv. 42, March", "payment of invoice 42"])]
        )

    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        invoice = message.payload_as(dict[str, Any])
        before = await self.tools["balance"](ctx, account="ours")
        memo = await self.model.complete(f"write the memo for invoice {invoice['number']}")
        paid = await self.tools["transfer"](
            ctx, payee=invoice["payee"], amount=invoice["amount"], memo=memo
        )
        ctx.send("auditor", {"paid": paid, "memo": memo, "balance_before": before["balance"]})

    async def evaluate(self, outputs: Sequence[Message], ctx: Context[AgentState]) -> str | None:
        # The clerk's first report is rejected; told why, the second passes.
        return None if ctx.feedback else "say which invoice the payment settles"


class Auditor(Agent[AgentState]):
    """Keeps the clerk's report."""

    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        self.state.memory["report"] = message.payload


async def main() -> int:
    with tempfile.TemporaryDirectory() as folder:
        bank = Path(folder) / "bank.db"
        env = {"BANK_DB": str(bank)}
        async with mcp_server(sys.executable, [str(SERVER)], env=env) as session:
            tools = {tool.name: tool for tool in await mcp_tools(session)}
            for tool in tools.values():
                print(f"tool {tool.name}: {'ledger' if tool.side_effect else 'plain'}")
            async with Runtime() as runtime:
                runtime.add(Clerk(tools))
                auditor = runtime.add(Auditor("auditor"))
                runtime.send("clerk", {"number": 42, "payee": "acme", "amount": 12_500})
                await runtime.run_until_idle()
                for entry in await runtime.ledger.list_calls(runtime.run_id):
                    print(f"ledger: {entry.tool} {entry.status} {entry.result}")
            print("report:", auditor.state.memory["report"])
        conn = sqlite3.connect(bank)
        try:
            requests = conn.execute(
                "SELECT COUNT(*) FROM requests WHERE tool = 'transfer'"
            ).fetchone()[0]
        finally:
            conn.close()
    print(f"transfer requests the bank got: {requests}")
    if requests != 1:
        print("the transfer reached the bank more than once")
        return 1
    print("the transfer reached the bank once, across the rollback")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
