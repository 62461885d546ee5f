"""An agentsnap run whose agent pays through the MCP bank server; ``test_mcp_crash`` kills it.

One agent, ``teller``, handles one message: it asks a sampled model for the payment's memo
(other words every time it is asked, unless the call is replayed) and calls the bank's
``transfer`` tool, or its ``wire`` tool, which the bank runs as an MCP task. The bank server
is started by this process over stdio (``mcp_server``) and stops with it.

Usage::

    python -m tests.integrations.mcp_crash_program URL BANK_DB RUN_ID TOOL [--resume] [--hang]

``TOOL`` is ``transfer`` or ``wire``. With ``--hang`` the handler prints ``EFFECT_DONE`` after
the tool returned and then waits forever (to be killed). At the end the process prints one
JSON line ``{"result": ..., "status": ...}``: what the tool returned and the ledger status of
the agent's last call.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from agentsnap import Agent, AgentState, Context, Message, Runtime
from agentsnap.integrations.mcp import mcp_server, mcp_tools
from agentsnap.store.sql import SqlStore
from agentsnap.testing import SampledModel
from agentsnap.tools import Tool

BANK = Path(__file__).with_name("mcp_bank.py")
MEMOS = ["rent for May", "May's rent", "rent, May", "the rent (May)", "monthly rent: May"]


class Teller(Agent[AgentState]):
    def __init__(self, tool: Tool[Any], hang: bool) -> None:
        super().__init__("teller")
        self.tool = tool
        self.hang = hang
        self.model = SampledModel([("memo", MEMOS)])

    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        memo = await self.model.complete(f"write the memo of a payment to {message.payload}")
        arguments: dict[str, Any] = {"to": "bob", "amount": 25}
        if self.tool.name == "transfer":
            arguments["memo"] = memo
        else:
            self.state.memory["memo"] = memo
        self.state.memory["result"] = await self.tool.run(ctx, arguments)
        if self.hang:
            print("EFFECT_DONE", flush=True)
            await asyncio.Event().wait()


async def main(options: argparse.Namespace) -> int:
    env = {"BANK_DB": options.bank, "BANK_TASK_SECONDS": options.task_seconds}
    store = SqlStore(options.url)
    try:
        async with mcp_server(sys.executable, [str(BANK)], env=env) as session:
            tools = {tool.name: tool for tool in await mcp_tools(session)}
            runtime = Runtime(store=store, run_id=options.run_id)
            async with runtime:
                teller = runtime.add(Teller(tools[options.tool], options.hang))
                if options.resume:
                    await runtime.resume()
                else:
                    runtime.send("teller", {"payee": "bob"})
                await runtime.run_until_idle()
                last = teller.state.tool_calls[-1]
                report = {"result": teller.state.memory.get("result"), "status": last.status}
    finally:
        await store.close()
    print(json.dumps(report), flush=True)
    return 0


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="a run paying through the MCP bank server")
    parser.add_argument("url")
    parser.add_argument("bank")
    parser.add_argument("run_id")
    parser.add_argument("tool", choices=["transfer", "wire"])
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--hang", action="store_true")
    parser.add_argument("--task-seconds", default="0.3")
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse(sys.argv[1:]))))
