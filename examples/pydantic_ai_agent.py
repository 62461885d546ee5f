"""A pydantic-ai support agent on the agentsnap bus: a rejected answer, one refund.

The **clerk** is a pydantic-ai ``Agent`` run by ``PydanticAIAgent``, with the
``AgentsnapDurability`` capability: each of its model requests is a recorded step, and each
tool call that changes the world goes through agentsnap's ledger. Its model is a
``FunctionModel`` standing in for a sampled one: it words the refund's note at random each
time it is asked, so the run needs no network yet meets what a real model does. It looks
the order up (``find_order``, read-only, a plain call) and refunds it (``refund``, through
the ledger: the tool hands its idempotency key to the payment service, which keeps one
refund per key).

The **critic** rejects an answer that does not apologise. The run rolls back to the last
consistent cut, the clerk's conversation with it, and the clerk is asked again with the
critic's reason in its prompt: its model answers otherwise, and its redone refund, worded
differently at the same place, gets the recorded outcome. The customer is refunded once.

The run is kept in a temporary SQLite database unless ``--db`` names one (SQLite or
PostgreSQL). The program checks its own outcome and exits with status 1 when it is not the
expected one.

Run it with:

    python examples/pydantic_ai_agent.py
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
from pathlib import Path

from pydantic_ai import Agent as PydanticAgent
from pydantic_ai.messages import (
    ModelMessage,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from agentsnap import Agent, AgentState, Context, Message, Runtime
from agentsnap.integrations.pydantic_ai import (
    AgentsnapDurability,
    PydanticAIAgent,
    idempotency_key,
)
from agentsnap.store.ledger import ledger_for
from agentsnap.store.sql import SqlStore
from agentsnap.store.sql_ledger import SqlLedger

NOTES = ("customer asked", "parcel arrived damaged", "refund as agreed", "sorry for the wait")
REFUNDS: dict[str, str] = {}
"""The payment service: one refund per idempotency key."""


def support_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Look the order up, refund it in words of the moment, then answer the customer."""
    prompt = " ".join(
        str(part.content)
        for message in messages
        for part in message.parts
        if isinstance(part, UserPromptPart)
    )
    returned = {
        part.tool_name
        for message in messages
        for part in message.parts
        if isinstance(part, ToolReturnPart)
    }
    if "find_order" not in returned:
        return ModelResponse(parts=[ToolCallPart("find_order", {"customer": "ada"})])
    if "refund" not in returned:
        note = random.choice(NOTES)
        return ModelResponse(parts=[ToolCallPart("refund", {"order": "A17", "note": note})])
    if "apologise" in prompt:
        return ModelResponse(parts=[TextPart("We are sorry: order A17 is refunded.")])
    return ModelResponse(parts=[TextPart("Order A17 is refunded.")])


def support_agent() -> PydanticAgent[None, str]:
    agent = PydanticAgent(
        FunctionModel(support_model),
        instructions="You help customers with their orders.",
        capabilities=[AgentsnapDurability(read_only={"find_order"})],
    )

    @agent.tool_plain
    def find_order(customer: str) -> str:
        """Find a customer's last order."""
        return "A17"

    @agent.tool_plain
    def refund(order: str, note: str) -> str:
        """Refund an order."""
        REFUNDS.setdefault(idempotency_key(), f"{order}: {note}")
        return f"refund of {order} accepted"

    return agent


class Critic(Agent[AgentState]):
    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        if "sorry" not in str(message.payload).lower():
            ctx.reject("clerk", "apologise to the customer")
        self.state.memory["sent"] = message.payload


async def simulate(url: str) -> list[str]:
    """Run the story in ``url``; return what went wrong (nothing, when all is well)."""
    store = SqlStore(url)
    ledger = ledger_for(store)
    assert isinstance(ledger, SqlLedger)
    try:
        async with Runtime(store=store, ledger=ledger) as runtime:
            clerk = runtime.add(PydanticAIAgent("clerk", support_agent(), to="critic"))
            critic = runtime.add(Critic("critic"))
            runtime.send("clerk", "My parcel arrived broken. Can I get my money back?")
            await runtime.run_until_idle()
        calls = await ledger.list_model_calls(runtime.run_id)
    finally:
        await ledger.close()
        await store.close()

    for rollback in runtime.rollbacks:
        print(f"rolled back: {rollback.agent} rejected by {rollback.source}: {rollback.reason}")
    for call in calls:
        answer = call.answer()
        said = answer.text or ", ".join(f"{c.name}({c.arguments})" for c in answer.tool_calls)
        print(f"model call, timeline {call.timeline}, position {call.position}: {said}")
    for record in clerk.state.tool_calls:
        print(f"tool {record.tool}: {record.status} {record.result}")
    print(f"sent to the customer: {critic.state.memory.get('sent')}")
    print(f"refunds made by the payment service: {list(REFUNDS.values())}")
    problems = []
    if len(runtime.rollbacks) != 1:
        problems.append(f"expected one rollback, got {len(runtime.rollbacks)}")
    if critic.state.memory.get("sent") != "We are sorry: order A17 is refunded.":
        problems.append("the answer sent is not the apology")
    if len(REFUNDS) != 1:
        problems.append(f"expected one refund, got {len(REFUNDS)}")
    if {call.timeline for call in calls} != {0, 1}:
        problems.append("the model was not asked again after the rollback")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", help="keep the run in this database (sqlite:/// or postgresql://)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        url = args.db or f"sqlite:///{Path(folder) / 'pydantic_ai_agent.db'}"
        problems = asyncio.run(simulate(url))
    for problem in problems:
        print("PROBLEM:", problem)
    if problems:
        return 1
    print("the answer was fixed after the review, and the refund happened once")
    return 0


if __name__ == "__main__":
    sys.exit(main())
