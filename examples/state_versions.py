"""A deploy changes an agent's state class; the runs stored before it still resume and fork.

A cart agent adds up the items a shop sends it. Version 1 of its state kept ``count`` (the
items) and ``currency`` as free text. Version 2, deployed while a run was under way, renames
``count`` to ``items``, turns ``discount`` from a string (``"10%"``) into a number of
percent, and adds ``history``; one upcaster, declared in the class, turns a version-1 state
into a version-2 one.

The program stores a run with version 1, which stops before it is done. Then, with
version 2 only, it checks which stored states the code can read (what
``agentsnap states check RUN --app module:factory`` does), resumes the run (the old state is
read through the upcaster), rolls it back to the cut version 1 stored, and forks a new run
from that cut with an edited state, validated against version 2. It exits with status 1 if
anything comes out otherwise. The runs are kept in a temporary SQLite file unless ``--db``
names a database.

Run it with:

    python examples/state_versions.py
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field

from agentsnap import Agent, AgentState, Context, Message, Runtime, upcaster
from agentsnap.inspect import check_stored_states, fork_run, show_snapshot
from agentsnap.store.sql import SqlStore

# -- before the deploy ---------------------------------------------------------------------------


class CartV1(AgentState):
    count: int = 0
    discount: str = "0%"


class CartAgentV1(Agent[CartV1]):
    async def handle(self, message: Message, ctx: Context[CartV1]) -> None:
        amount = message.payload
        assert isinstance(amount, int)
        self.state.count += amount


# -- after it ------------------------------------------------------------------------------------


class Cart(AgentState):
    version: ClassVar[int] = 2

    items: int = 0  # "count" in version 1
    discount: float = 0.0  # percent; "10%" in version 1
    history: list[int] = Field(default_factory=list)  # new in version 2

    @upcaster(from_version=1)
    def from_1(self: dict[str, Any]) -> dict[str, Any]:
        self["items"] = self.pop("count")
        self["discount"] = float(self["discount"].rstrip("%"))
        return self


class CartAgent(Agent[Cart]):
    async def handle(self, message: Message, ctx: Context[Cart]) -> None:
        amount = message.payload
        assert isinstance(amount, int)
        self.state.items += amount
        self.state.history.append(amount)


def current_app() -> list[Agent[Any]]:
    """The app as deployed now: what ``--app examples.state_versions:current_app`` names."""
    return [CartAgent("cart")]


class Stopped(Exception):
    """The process running version 1 stops before the run is done."""


async def before_the_deploy(store: SqlStore) -> tuple[str, str]:
    """A run of version 1 that stopped with 2 items in the cart: its id, and its cut."""
    with contextlib.suppress(Stopped):
        async with Runtime(store=store, name="shop") as runtime:
            runtime.add(CartAgentV1("cart", CartV1(discount="10%")))
            runtime.send("cart", 2)
            await runtime.run_until_idle()
            cut = await runtime.snapshot()
            raise Stopped  # the run is left to resume
    return runtime.run_id, cut.id


async def after_the_deploy(store: SqlStore, run_id: str, cut_id: str) -> list[str]:
    problems: list[str] = []
    models = {agent.name: agent.state_type for agent in current_app()}

    report = await check_stored_states(store, models, run_id)
    for row in report:
        print(
            f"stored states of {row.agent}: version {row.stored_version} -> "
            f"{row.current_version}, {row.readable} readable, {row.unreadable} not"
        )
    if any(row.unreadable for row in report):
        problems.append("the code cannot read some stored states")

    shown = await show_snapshot(store, cut_id, models=models)
    print("the cut, as version 2 reads it:", shown.agents["cart"].state)

    runtime = Runtime(store=store, run_id=run_id)
    cart = runtime.add(CartAgent("cart"))
    await runtime.resume()
    runtime.send("cart", 3)
    await runtime.run_until_idle()
    print("resumed:", cart.state.items, "items,", cart.state.discount, "% off", cart.state.history)
    if (cart.state.items, cart.state.discount, cart.state.history) != (5, 10.0, [3]):
        problems.append(f"the resumed cart is {cart.state}")
    await runtime.rollback(cut_id, reason="back to the cut version 1 stored")
    if (cart.state.items, cart.state.history) != (2, []):
        problems.append(f"the rolled back cart is {cart.state}")
    await runtime.close()

    edited = {"cart": {"items": 7, "discount": 25.0}}
    fork = await fork_run(store, cut_id, states=edited, models=models)
    forked = Runtime(store=store, run_id=fork.id)
    copy = forked.add(CartAgent("cart"))
    await forked.resume()
    await forked.close()
    print("forked with an edited state:", copy.state.items, "items,", copy.state.discount, "% off")
    if (copy.state.items, copy.state.discount) != (7, 25.0):
        problems.append(f"the forked cart is {copy.state}")
    return problems


async def simulate(url: str) -> list[str]:
    store = SqlStore(url)
    try:
        run_id, cut_id = await before_the_deploy(store)
        print(f"run {run_id} stored by version 1")
        return await after_the_deploy(store, run_id, cut_id)
    finally:
        await store.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", help="keep the runs in this database (sqlite:/// or postgresql://)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        url = args.db or f"sqlite:///{Path(folder) / 'shop.db'}"
        try:
            problems = asyncio.run(simulate(url))
        except KeyboardInterrupt:
            print("interrupted: the runs stored so far are in", url, file=sys.stderr)
            return 130
    for problem in problems:
        print("PROBLEM:", problem)
    if problems:
        return 1
    print("the runs stored before the deploy resume and fork under version 2")
    return 0


if __name__ == "__main__":
    sys.exit(main())
