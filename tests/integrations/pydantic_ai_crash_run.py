"""A pydantic-ai clerk refunds an order, a critic rejects its first answer; killed and resumed.

``test_pydantic_ai_crash.py`` runs this in a child process. The clerk is a pydantic-ai agent
(``PydanticAIAgent``) on a ``FunctionModel`` that words the ``refund`` tool's note at random
each time it is asked (a sampled model) and logs every asking in ``ASKS``, one line each. The
``refund`` tool stands for an outside service: it inserts the logical effect into the
service's table keyed by the idempotency key it was handed (``INSERT OR IGNORE``, as a
payment API deduplicates), so one effect under two keys happened twice. The critic rejects an
answer without an apology: the run rolls back and the clerk is asked again with the reason in
its prompt, and its redo calls ``refund`` in other words.

``--hang-at effect`` hangs the first process inside the first refund (its model call is
recorded, its effect done, its outcome not yet); ``--hang-at critic`` hangs it in the critic
reading the redone answer. The process prints ``HANG`` and waits to be killed.

Usage::

    python tests/integrations/pydantic_ai_crash_run.py URL SERVICE ASKS RUN_ID --hang-at effect
    python tests/integrations/pydantic_ai_crash_run.py URL SERVICE ASKS RUN_ID --resume
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sqlite3
import sys
from typing import Any

from pydantic_ai import Agent as PydanticAgent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

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
    note = random.SystemRandom().choice(NOTES)
    return ModelResponse(parts=[ToolCallPart("refund", {"order": "A17", "note": note})])


def clerk_agent() -> PydanticAgent[None, str]:
    durability = AgentsnapDurability(tools={"refund": ToolOptions(rerun_if_unknown=True)})
    agent = PydanticAgent(FunctionModel(answer), capabilities=[durability])

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
    parser.add_argument("--hang-at", choices=["effect", "critic", "none"], default="none")
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse(sys.argv[1:]))))
