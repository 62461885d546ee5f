"""An OpenAI Agents SDK team as agentsnap agents: a handoff, a review, one refund.

Two agents of the OpenAI Agents SDK, unchanged: **triage** reads the customer's message and
hands off to **billing**, which refunds through a side-effecting tool and answers. Their
models are the SDK's own ``ScriptedModel`` (``agents.testing``), so the run needs no
network and tells the same story every time.

``AgentsnapRunner.run`` runs them as agentsnap agents: every model call is a recorded step,
each agent's conversation (its SDK session) is part of every snapshot, and the handoff
travels as a message from the agent ``triage`` to the agent ``billing``. The ``refund``
tool is made with the integration's ``function_tool(side_effect=True)``: its calls go
through the ledger, under an idempotency key bound to the call.

A review (a check on billing's output) wants an apology. The first answer has none: the
team rolls back to the last consistent cut, billing runs again with the reason in its
conversation, asks its model again, words the refund otherwise, and gets the recorded
refund instead of a second one; its new answer apologises and passes.

The run is kept in a SQLite file, a temporary one unless ``--db`` names one; inspect it
with ``agentsnap show``, ``model-calls`` and ``tools``. The program checks its own outcome
and exits with status 1 when it is not the expected one.

Run it with:

    python examples/openai_agents_agent.py
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path
from typing import Any

from agents import Agent, RunConfig
from agents.testing import ModelCall, ModelStep, ScriptedModel, assistant_message, function_call

from agentsnap import Message, ToolCall
from agentsnap.integrations.openai_agents import AgentsnapRunner, function_tool
from agentsnap.store.sql import SqlStore

REFUNDS: list[str] = []
"""The payment service: every refund it made, by idempotency key."""


@function_tool(side_effect=True)
async def refund(call: ToolCall, order: str, amount: int, reason: str) -> str:
    """Refund an order."""
    assert call.key is not None  # a real service gets it, and drops a second request
    REFUNDS.append(call.key)
    return f"refunded {amount} EUR on order {order}"


def billing_answer(call: ModelCall) -> list[Any]:
    """Billing's model: refund first, then say so; an apology once the review asked for one."""
    items = call.input if isinstance(call.input, list) else []
    told = "rejected" in str(items)
    if items and items[-1].get("call_id") != "refund-1":
        reason = "charged twice, refunding the second charge" if told else "double charge"
        arguments = {"order": "A-17", "amount": 30, "reason": reason}
        return [function_call("refund", arguments, call_id="refund-1")]
    if told:
        return [assistant_message("Sorry for the trouble: your 30 EUR are on their way back.")]
    return [assistant_message("Your 30 EUR were refunded.")]


def apologises(message: Message) -> str | None:
    """The review: an answer to a customer who was charged twice says sorry."""
    output = str(message.payload)
    return None if "sorry" in output.lower() else "apologise to the customer for the trouble"


async def main(db: str) -> int:
    billing = Agent(
        name="billing",
        instructions="Refund double charges, then tell the customer.",
        model=ScriptedModel([ModelStep.respond(billing_answer) for _ in range(4)]),
        tools=[refund],
    )
    triage = Agent(
        name="triage",
        instructions="Hand every request to the agent it belongs to.",
        model=ScriptedModel([[function_call("transfer_to_billing", {}, call_id="handoff-1")]]),
        handoffs=[billing],
    )
    store = SqlStore(db)
    try:
        result = await AgentsnapRunner.run(
            triage,
            "I was charged twice for order A-17.",
            store=store,
            run_config=RunConfig(tracing_disabled=True),
            setup=lambda runtime, team: runtime.check("billing", kind="output", check=apologises),
        )
        snapshots = await store.list_snapshots(result.run_id)
    finally:
        await store.close()
    print(f"final output of {result.last_agent}: {result.final_output}")
    print(f"rollbacks: {result.rollbacks}, refunds made: {len(REFUNDS)}")
    newest = snapshots[-1].agents["billing"].state
    assert isinstance(newest, dict)
    items = newest["items"]
    assert isinstance(items, list)
    print(f"billing's conversation in the last cut: {len(items)} items")
    ok = (
        result.last_agent == "billing"
        and "Sorry" in str(result.final_output)
        and result.rollbacks == 1
        and len(REFUNDS) == 1
    )
    if not ok:
        print("unexpected outcome", file=sys.stderr)
        return 1
    print("the answer was fixed after the review, and the refund was made once")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", help="SQLite or PostgreSQL URL (default: a temporary file)")
    args = parser.parse_args()
    if args.db:
        sys.exit(asyncio.run(main(args.db)))
    with tempfile.TemporaryDirectory() as folder:
        sys.exit(asyncio.run(main(f"sqlite:///{Path(folder) / 'agentsnap.db'}")))
