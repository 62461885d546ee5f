"""A pydantic-ai clerk refunds an order, a critic rejects its first answer; killed and resumed.

``test_pydantic_ai_crash.py`` runs this in a child process. The clerk is a pydantic-ai agent
(``PydanticAIAgent``) on a ``FunctionModel`` that words the ``refund`` tool's note at random
each time it is asked (a sampled model) and logs every asking in ``ASKS``, one line each. The
``refund`` tool stands for an outside service: it inserts the logical effect into the
service's table keyed by the idempotency key it was handed (``INSERT OR IGNORE``, as a
payment API deduplicates), so one effect under two keys happened twice. The critic rejects an
answer without an apology: the run rolls back and the clerk is asked again with the reason in
its prompt, and its redo calls ``refund`` in other words (and its arguments in another order,
at random too).

``--mcp LISTINGS`` serves ``refund`` from an MCP server (in the process, as a ``MCPToolset``)
whose every tool listing is logged in ``LISTINGS``; its tool cannot get the key (the server
runs it in a task of its own), so its effect is keyed by the note: the test runs it with
``--hang-at critic``, once every effect is done.

``--stream`` gives the clerk an event-stream handler, so that its model requests are streamed
(``FunctionModel(stream_function=...)``): each event handed to the handler is logged in
``EVENTS``, so that the test sees which were handed over twice.

``--hang-at effect`` hangs the first process inside the first refund (its model call is
recorded, its effect done, its outcome not yet); ``--hang-at critic`` hangs it in the critic
reading the redone answer. The process prints ``HANG`` and waits to be killed.

Usage::

    python tests/integrations/pydantic_ai_crash_run.py URL SERVICE ASKS RUN_ID --hang-at effect
    python tests/integrations/pydantic_ai_crash_run.py URL SERVICE ASKS RUN_ID --resume
    (either with ``--stream EVENTS`` or ``--mcp LISTINGS``)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sqlite3
import sys
from collections.abc import AsyncIterable, AsyncIterator
from typing import Any

from mcp.server.mcpserver import MCPServer
from pydantic_ai import Agent as PydanticAgent
from pydantic_ai import RunContext
from pydantic_ai.mcp import MCPToolset
from pydantic_ai.messages import (
    AgentStreamEvent,
    ModelMessage,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, DeltaToolCalls, FunctionModel
from pydantic_ai.toolsets import ToolsetTool

from agentsnap import Agent, AgentState, Context, Message, Runtime
from agentsnap.integrations.pydantic_ai import (
    AgentsnapDurability,
    PydanticAIAgent,
    ToolOptions,
    idempotency_key,
)
from agentsnap.store.sql import SqlStore

NOTES = ("as asked", "customer request", "damaged parcel", "late delivery", "goodwill")
SERVICE_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS effects (key TEXT PRIMARY KEY, effect TEXT NOT NULL, "
    "note TEXT NOT NULL, pid INTEGER NOT NULL)"
)


class Options:
    """What the command line said."""

    service = ""
    asks = ""
    hang_at = ""
    events = ""
    listings = ""


def hang() -> None:
    print("HANG", flush=True)


def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """The clerk's sampled model: a refund in random words, then a reply."""
    prompt = " ".join(
        str(part.content)
        for message in messages
        for part in message.parts
        if part.part_kind == "user-prompt"
    )
    with open(Options.asks, "a", encoding="utf-8") as log:
        log.write(json.dumps({"pid": os.getpid(), "prompt": prompt}) + "\n")
    last = messages[-1].parts
    if any(isinstance(part, ToolReturnPart) for part in last):
        apology = " Sorry for the trouble." if "rejected" in prompt else ""
        return ModelResponse(parts=[TextPart(f"Order A17 is refunded.{apology}")])
    sample = random.SystemRandom()
    arguments = [("order", "A17"), ("note", sample.choice(NOTES))]
    sample.shuffle(arguments)
    return ModelResponse(parts=[ToolCallPart("refund", json.dumps(dict(arguments)))])


async def streamed(
    messages: list[ModelMessage], info: AgentInfo
) -> AsyncIterator[str | DeltaToolCalls]:
    """The same sampled answers, streamed in two chunks."""
    (part,) = answer(messages, info).parts
    if isinstance(part, TextPart):
        yield part.content[:8]
        yield part.content[8:]
    else:
        assert isinstance(part, ToolCallPart)
        assert isinstance(part.args, str)
        yield {0: DeltaToolCall(part.tool_name, part.args[:10])}
        yield {0: DeltaToolCall(None, part.args[10:])}


async def log_events(ctx: RunContext[None], events: AsyncIterable[AgentStreamEvent]) -> None:
    """Log each event handed over: its kind, and the tool call it is about."""
    async for event in events:
        log_event(event.event_kind, getattr(event, "tool_call_id", None))


def log_event(kind: str, call: str | None) -> None:
    with open(Options.events, "a", encoding="utf-8") as log:
        log.write(json.dumps({"pid": os.getpid(), "kind": kind, "call": call}) + "\n")


def clerk_agent() -> PydanticAgent[None, str]:
    durability = AgentsnapDurability(
        tools={"refund": ToolOptions(rerun_if_unknown=True)},
        event_stream_handler=log_events if Options.events else None,
    )
    model = FunctionModel(answer)
    if Options.events:
        model = FunctionModel(answer, stream_function=streamed)
    if Options.listings:
        return PydanticAgent(model, toolsets=[ListedShop(shop())], capabilities=[durability])
    agent = PydanticAgent(model, capabilities=[durability])

    @agent.tool_plain
    async def refund(order: str, note: str) -> str:
        """Refund an order."""
        key = idempotency_key()
        with sqlite3.connect(Options.service) as db:
            db.execute(
                "INSERT OR IGNORE INTO effects VALUES (?, ?, ?, ?)",
                (key, f"refund:{order}", note, os.getpid()),
            )
        if Options.hang_at == "effect":
            hang()
            await asyncio.sleep(120)
        return f"refunded {order}"

    return agent


def shop() -> MCPServer:
    """The MCP server refunding orders: one effect per order and note."""
    server = MCPServer("shop")

    @server.tool()
    def refund(order: str, note: str) -> str:
        """Refund an order."""
        with sqlite3.connect(Options.service) as db:
            db.execute(
                "INSERT OR IGNORE INTO effects VALUES (?, ?, ?, ?)",
                (f"{order}:{note}", f"refund:{order}", note, os.getpid()),
            )
        return f"refunded {order}"

    return server


class ListedShop(MCPToolset[None]):
    """The shop's toolset, logging each listing of its tools."""

    async def get_tools(self, ctx: RunContext[None]) -> dict[str, ToolsetTool[None]]:
        log_listing()
        return await super().get_tools(ctx)


def log_listing() -> None:
    with open(Options.listings, "a", encoding="utf-8") as log:
        log.write(json.dumps({"pid": os.getpid()}) + "\n")


class Critic(Agent[AgentState]):
    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        text = str(message.payload)
        if "Sorry" not in text:
            ctx.reject("clerk", "apologise to the customer")
        if Options.hang_at == "critic":
            hang()
            await asyncio.sleep(120)
        self.state.memory["accepted"] = text


async def main(options: argparse.Namespace) -> int:
    Options.service, Options.asks = options.service, options.asks
    Options.events = options.stream or ""
    Options.listings = options.mcp or ""
    Options.hang_at = "" if options.resume else options.hang_at
    with sqlite3.connect(Options.service) as db:
        db.execute(SERVICE_SCHEMA)
    store = SqlStore(options.url)
    report: dict[str, Any] = {}
    try:
        async with Runtime(store=store, run_id=options.run_id) as runtime:
            clerk = runtime.add(PydanticAIAgent("clerk", clerk_agent(), to="critic"))
            critic = runtime.add(Critic("critic"))
            if options.resume:
                await runtime.resume()
            else:
                runtime.send("clerk", "Refund order A17.")
            await runtime.run_until_idle()
            report["accepted"] = critic.state.memory.get("accepted")
            report["refunds"] = [c.status for c in clerk.state.tool_calls]
            report["rollbacks"] = len(runtime.rollbacks)
    finally:
        await store.close()
    print(json.dumps({"result": report}), flush=True)
    return 0


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", help="the agentsnap database URL")
    parser.add_argument("service", help="the service's SQLite file")
    parser.add_argument("asks", help="where every asking of the model is logged")
    parser.add_argument("run_id")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--stream", metavar="EVENTS", help="stream, logging events in EVENTS")
    parser.add_argument("--mcp", metavar="LISTINGS", help="refund by MCP, logging listings")
    parser.add_argument("--hang-at", choices=["effect", "critic", "none"], default="none")
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse(sys.argv[1:]))))
