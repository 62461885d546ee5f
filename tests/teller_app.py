"""The bank as an app for runs spread over processes: tellers moving money at random.

``make_app`` is the factory ``agentsnap worker --app teller_app:make_app`` loads (with
this directory on ``PYTHONPATH``). A ``go`` message from the environment starts a chain of
``hops`` transfers: each teller that receives a transfer keeps it, waits a little, and sends a
random part of its balance on to a random teller, until the chain's hops run out. Money is
only ever moved, so every consistent cut holds the initial total in balances plus amounts in
flight.
"""

from __future__ import annotations

import asyncio
import os
import random

from pydantic import BaseModel

from agentsnap import Agent, AgentState, Context, Message, Snapshot
from agentsnap.distributed import App
from agentsnap.messages import ENVIRONMENT

TELLERS = int(os.environ.get("BANK_TELLERS", "9"))
PEERS = int(os.environ.get("BANK_PEERS", "0"))
"""How many tellers each teller sends to (the next ones, in a ring); 0 for every other."""
BALANCE = 1_000


class Transfer(BaseModel):
    amount: int = 0
    hops: int


class TellerState(AgentState):
    balance: int
    handled: int = 0


class Teller(Agent[TellerState]):
    """Keeps what it receives and passes some of its balance on while the chain has hops."""

    def __init__(self, name: str, peers: list[str]) -> None:
        super().__init__(name, TellerState(balance=BALANCE))
        self.peers = peers
        self.rng = random.Random()

    async def handle(self, message: Message, ctx: Context[TellerState]) -> None:
        transfer = message.payload_as(Transfer)
        self.state.balance += transfer.amount
        self.state.handled += 1
        await asyncio.sleep(self.rng.uniform(0, 0.004))
        if transfer.hops > 0:
            amount = self.rng.randint(0, min(self.state.balance, 50))
            self.state.balance -= amount
            to = self.rng.choice(self.peers)
            ctx.send(to, Transfer(amount=amount, hops=transfer.hops - 1), kind="transfer")


def names(tellers: int = TELLERS) -> list[str]:
    return [f"teller-{i}" for i in range(tellers)]


def bank(tellers: int = TELLERS, peers: int = 0) -> App:
    """``tellers`` tellers, each with the same starting balance.

    Each sends to every other teller, or with ``peers`` to the ``peers`` tellers after it.
    """
    everyone = names(tellers)

    def peers_of(i: int) -> list[str]:
        if peers:
            return [everyone[(i + k) % tellers] for k in range(1, peers + 1)]
        return [n for n in everyone if n != everyone[i]]

    return App(
        agents=[Teller(name, peers_of(i)) for i, name in enumerate(everyone)],
        metadata={"example": "teller_app"},
    )


def make_app() -> App:
    """Every teller of the bank (``BANK_TELLERS`` of them, ``BANK_PEERS`` peers each)."""
    return bank(peers=PEERS)


def money_in(snapshot: Snapshot) -> int:
    """Balances recorded in the tellers plus amounts recorded in flight."""
    total = sum(
        TellerState.model_validate(cut.state).balance
        for name, cut in snapshot.agents.items()
        if name != ENVIRONMENT
    )
    return total + sum(
        Transfer.model_validate(m.payload).amount for ch in snapshot.channels for m in ch.messages
    )


def finished(snapshot: Snapshot) -> bool:
    """Whether the cut shows a run with nothing left to do: every input taken, none in flight."""
    sent = snapshot.agents[ENVIRONMENT].sent
    return not any(ch.messages for ch in snapshot.channels) and all(
        snapshot.agents[name].received.get(ENVIRONMENT, 0) == count for name, count in sent.items()
    )
