"""Keep a card number out of the store: a run whose records hold only redaction markers.

A cashier agent takes an order with a card number. It keeps the card in its state, asks a
model to word the receipt (the prompt names the card), and charges the card with a
side-effecting tool. The runtime is given a redaction policy: the card field of the state,
the card key of payloads and the card argument of tools, and a pattern for card numbers in
any text (the model's prompt). The agent works with the real number; everything written to
the SQLite file (snapshots, journal, replay log, ledger, model calls) holds a marker instead.

Then the program starts new runs from the stored cut twice (``fork_from``): without a secret
provider the new run refuses to start, naming the agent and the field; with one (a vault the
program asks again) it gets the card back. It exits with status 1 if the card number is found in
the database file.

Run it with:

    python examples/redaction.py
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

from pydantic import BaseModel, Field

from agentsnap import (
    Agent,
    AgentState,
    Context,
    Message,
    RedactedValueNeeded,
    Redaction,
    Runtime,
    tool,
)
from agentsnap.redaction import Where
from agentsnap.store.sql import SqlStore
from agentsnap.testing import ScriptedModel

CARD = "4111 1111 1111 1111"
VAULT = {"order-1": CARD}
"""Where the card numbers really live: the secret provider reads them from here."""
CHARGED: list[str] = []


class Till(AgentState):
    """The cashier's state: the card of the order being handled, and the receipts."""

    order: str = ""
    card: str = ""
    receipts: list[str] = Field(default_factory=list)


class Order(BaseModel):
    """What the cashier is sent: an order, the card to charge and the amount."""

    order: str
    card: str
    amount: int


@tool(side_effect=True)
async def charge(card: str, amount: int) -> str:
    """Charge ``amount`` to ``card`` (a payment service would get the call's key)."""
    CHARGED.append(card)
    return f"charge-{len(CHARGED)}"


class Cashier(Agent[Till]):
    """Words a receipt with a model and charges the card once."""

    def __init__(self, name: str) -> None:
        super().__init__(name, Till())
        self.model = ScriptedModel([("receipt", "Thank you for your order.")])

    async def handle(self, message: Message, ctx: Context[Till]) -> None:
        order = message.payload_as(Order)
        ctx.state.order, ctx.state.card = order.order, order.card
        text = await ctx.complete(
            self.model, f"Write a receipt for card {order.card}, {order.amount} EUR"
        )
        await charge(ctx, card=order.card, amount=order.amount)
        ctx.state.receipts.append(text)


def vault(where: Where) -> str | None:
    """The secret provider: asked for the value of a marker a rollback or resume needs."""
    if where.path[-1:] == ("card",):  # the state's card, and its tool call's argument
        return VAULT.get("order-1")
    return None


def policy(*, with_vault: bool) -> Redaction:
    return Redaction(
        state=["card"],
        payload=["card"],
        tool_arguments=["card"],
        patterns=[r"\b(?:\d[ -]?){12,18}\d\b"],
        key="a key kept outside the database",
        secret=vault if with_vault else None,
    )


def leaked(db: Path) -> list[str]:
    """The files of the database that hold the card number (its WAL included)."""
    needles = (CARD.encode(), CARD.replace(" ", "").encode())
    return [
        path.name
        for path in db.parent.glob(db.name + "*")
        if path.is_file() and any(needle in path.read_bytes() for needle in needles)
    ]


async def main(directory: Path) -> int:
    url = f"sqlite:///{directory / 'redaction.db'}"
    async with Runtime(store=SqlStore(url), redact=policy(with_vault=False)) as runtime:
        cashier = runtime.add(Cashier("cashier"))
        runtime.send("cashier", {"order": "order-1", "card": CARD, "amount": 120})
        await runtime.run_until_idle()
        print("the agent works with the real card:", cashier.state.card == CARD)
        cut = await runtime.snapshot()
    reader = SqlStore(url)
    stored = await reader.load_snapshot(cut.id)
    await reader.close()
    print("the store holds:", stored.agents["cashier"].state["card"])
    # A new run from the stored cut needs the card back: only a secret provider has it.
    async with Runtime(store=SqlStore(url), redact=policy(with_vault=False)) as fork:
        fork.add(Cashier("cashier"))
        try:
            await fork.fork_from(cut.id)
        except RedactedValueNeeded as exc:
            print("without a secret provider:", exc)
    async with Runtime(store=SqlStore(url), redact=policy(with_vault=True)) as fork:
        forked = fork.add(Cashier("cashier"))
        await fork.fork_from(cut.id)
        print("with a vault, the fork gets the card back:", forked.state.card == CARD)
    print("charged:", len(CHARGED), "time(s)")
    found = leaked(directory / "redaction.db")
    print("files holding the card number:", found or "none")
    if found:
        return 1
    print("the card number is nowhere in the database")
    return 0


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        sys.exit(asyncio.run(main(Path(tmp))))
