"""A LangChain ``create_agent`` agent on the agentsnap bus: a support agent and its supervisor.

The **support** agent is made with ``langchain.agents.create_agent``: a chat model (a small
``BaseChatModel`` with no network, answering as a tool-calling model would), two LangChain
tools, and the ``AgentsnapMiddleware``, which records every model call and routes the tools
through agentsnap: ``look_up_order`` only reads, ``refund`` pays money back, so it goes
through the ledger, its effect named by the order (``SideEffect(key_from=("order_id",))``).
``LangChainAgent`` runs it as an agentsnap agent: the customer's message is the user's
turn, the conversation is kept in the agent's state, and the final answer goes to the
**supervisor**, a plain agentsnap agent.

The supervisor wants every answer to say by when the money arrives. The first answer does
not: the supervisor rejects it, the run rolls back to the last consistent cut, and the
support agent is asked again, the reason in the user's turn. The model answers otherwise
and calls ``refund`` again, with other words for the reason: the ledger returns the recorded
refund, and the customer is refunded once. The program checks its own outcome and exits
with status 1 when it is not the expected one.

The run is kept in an SQLite database, a temporary file unless ``--db`` names one (SQLite or
PostgreSQL); ``agentsnap show`` then prints the conversation in any of its snapshots.

Run it with:

    python examples/langchain_agent.py
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from langchain.agents import create_agent
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool

from agentsnap import Agent, AgentState, Context, Message, RollbackInfo, Runtime
from agentsnap._hints import cli_command
from agentsnap.integrations.langchain import (
    AgentsnapMiddleware,
    ConversationState,
    LangChainAgent,
    SideEffect,
)
from agentsnap.runtime import interrupted_message
from agentsnap.store.sql import SqlStore

REFUNDS: list[tuple[str, int, str]] = []  # the payment service: every refund it ever made


@tool
def look_up_order(order_id: str) -> str:
    """Look up an order: what was bought and what it cost."""
    return f"order {order_id}: a desk lamp, $25, delivered broken"


@tool
def refund(order_id: str, amount: int, reason: str) -> str:
    """Refund an order; returns the refund's number."""
    REFUNDS.append((order_id, amount, reason))
    return f"refund RF-{len(REFUNDS)} of ${amount} for order {order_id}"


class SupportModel(BaseChatModel):
    """What a tool-calling model would answer: look the order up, refund it, then reply."""

    asked: int = 0

    @property
    def _llm_type(self) -> str:
        return "support-model"

    def bind_tools(self, tools: Any, **kwargs: Any) -> SupportModel:
        return self

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: Any = None,
        **kwargs: Any,
    ) -> ChatResult:
        self.asked += 1
        told = any(isinstance(m, HumanMessage) and "rejected" in m.text for m in messages)
        done = {m.name for m in messages if isinstance(m, ToolMessage)}
        if "look_up_order" not in done:
            answer = AIMessage("", tool_calls=[_call("look_up_order", order_id="A-17")])
        elif "refund" not in done:
            why = "the lamp arrived broken" if told else "broken on delivery"
            answer = AIMessage(
                "", tool_calls=[_call("refund", order_id="A-17", amount=25, reason=why)]
            )
        else:
            receipt = next(m.text for m in reversed(messages) if isinstance(m, ToolMessage))
            when = " The money is on your card within 5 days." if told else ""
            answer = AIMessage(f"Sorry about the lamp: {receipt}.{when}")
        return ChatResult(generations=[ChatGeneration(message=answer)])


def _call(name: str, **args: Any) -> dict[str, Any]:
    return {"name": name, "args": args, "id": f"{name}-{uuid.uuid4().hex[:8]}"}


class Supervisor(Agent[AgentState]):
    """Accepts an answer only if it says when the money arrives."""

    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        answer = str(message.payload)
        if "days" not in answer:
            ctx.reject("support", "tell the customer when the money arrives")
        self.state.memory["sent to the customer"] = answer


@dataclass
class Outcome:
    run_id: str
    support: ConversationState
    answer: str | None
    rollbacks: list[RollbackInfo]
    asked: int
    snapshot: str


async def simulate(url: str, run_id: str) -> Outcome:
    model = SupportModel()
    agent = create_agent(
        model,
        tools=[look_up_order, refund],
        system_prompt="You are a support agent for a lamp shop.",
        middleware=[
            AgentsnapMiddleware(
                side_effects={"refund": SideEffect(key_from=("order_id",))},
            )
        ],
    )
    store = SqlStore(url)
    try:
        async with Runtime(store=store, run_id=run_id, name="langchain support") as runtime:
            support = runtime.add(LangChainAgent("support", agent, send_to="supervisor"))
            supervisor = runtime.add(Supervisor("supervisor"))
            runtime.send("support", "My desk lamp (order A-17) arrived broken.")
            await runtime.run_until_idle()
            cut = await runtime.snapshot()
    finally:
        await store.close()
    return Outcome(
        run_id=runtime.run_id,
        support=support.state,
        answer=supervisor.state.memory.get("sent to the customer"),  # type: ignore[arg-type]
        rollbacks=runtime.rollbacks,
        asked=model.asked,
        snapshot=cut.id,
    )


def problems_of(outcome: Outcome) -> list[str]:
    problems = []
    if len(outcome.rollbacks) != 1:
        problems.append(f"expected one rollback, got {len(outcome.rollbacks)}")
    if len(REFUNDS) != 1:
        problems.append(f"expected one refund, got {REFUNDS}")
    if not (outcome.answer or "").endswith("within 5 days."):
        problems.append(f"the answer sent is not the redone one: {outcome.answer!r}")
    refunds = [c for c in outcome.support.tool_calls if c.tool == "refund"]
    if [c.status for c in refunds] != ["replayed"]:
        problems.append(f"expected the redo's refund to be replayed, got {refunds}")
    if outcome.asked != 6:
        problems.append(f"expected the model asked 3 times per attempt, got {outcome.asked}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", help="keep the run in this database (sqlite:/// or postgresql://)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        url = args.db or f"sqlite:///{Path(folder) / 'langchain_agent.db'}"
        run_id = uuid.uuid4().hex
        try:
            outcome = asyncio.run(simulate(url, run_id))
        except KeyboardInterrupt:
            print(interrupted_message(run_id, args.db), file=sys.stderr)
            return 130
    for rollback in outcome.rollbacks:
        print(f"rolled back: {rollback.agent} rejected by {rollback.source}: {rollback.reason}")
    print(f"refunds made: {REFUNDS}")
    print(f"sent to the customer: {outcome.answer}")
    print(
        f"the conversation in the support agent's state: {len(outcome.support.messages)} messages"
    )
    if args.db:
        print("print it from the last snapshot with:")
        print(f"  {cli_command('show', outcome.snapshot, '--agent', 'support', '--db', args.db)}")
    else:
        print("kept in a temporary database; pass --db sqlite:///langchain_agent.db to keep it")
    problems = problems_of(outcome)
    for problem in problems:
        print("PROBLEM:", problem)
    if problems:
        return 1
    print("the answer was redone after the review, and the order was refunded once")
    return 0


if __name__ == "__main__":
    sys.exit(main())
