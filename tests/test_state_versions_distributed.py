"""A run spread over workers, stored by version 1 of a state class, goes on under version 2.

Two workers in this event loop, each with its own connection to NATS, host a relay and an
adder whose state class is at version 1; the run's coordinator takes a complete snapshot,
whose parts record version 1. The workers stop and two new ones start with version 2 of the
class (``count`` renamed ``total``, ``limit`` retyped from a string to an integer, ``seen``
added; an upcaster from version 1 does the three). Their agents ran before, so the
coordinator rolls the whole run back to its last complete cut, and the new adder restores its
state from it through the upcaster. The next snapshot records version 2.

The coordinator keeps version 1 of the app: it hosts no agent and reads no agent's state,
only the agents' names.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
from nats_server import SHARED_URL, OwnServer, reachable, server_binary, unavailable
from pydantic import Field

from agentsnap import Agent, AgentState, Context, Message, upcaster
from agentsnap.distributed import App, DistributedRun, Worker
from agentsnap.integrity import cut_problems
from agentsnap.jetstream import JetStreamLink
from agentsnap.records import Snapshot, SnapshotStatus
from agentsnap.store.sql import SqlStore

PATIENCE = 60.0
"""Seconds a step may take (never reached when green)."""

pytestmark = pytest.mark.postgres

# -- the app, in two versions ----------------------------------------------------------------


class TallyV1(AgentState):
    count: int = 0
    limit: str = "100"


class TallyV2(AgentState):
    version: ClassVar[int] = 2

    total: int = 0  # was count
    limit: int = 100  # was a string
    seen: list[int] = Field(default_factory=list)  # new

    @upcaster(from_version=1)
    def from_1(self: dict[str, Any]) -> dict[str, Any]:
        self["total"] = self.pop("count")
        self["limit"] = int(self["limit"])
        return self


class Relay(Agent[AgentState]):
    """Passes every amount on to the adder (its state class is the same in both versions)."""

    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        ctx.send("adder", message.payload, kind="add")


class AdderV1(Agent[TallyV1]):
    async def handle(self, message: Message, ctx: Context[TallyV1]) -> None:
        amount = message.payload
        assert isinstance(amount, int)
        self.state.count += amount


class AdderV2(Agent[TallyV2]):
    async def handle(self, message: Message, ctx: Context[TallyV2]) -> None:
        amount = message.payload
        assert isinstance(amount, int)
        self.state.total += amount
        self.state.seen.append(amount)


def app_v1() -> App:
    return App(agents=[Relay("relay", AgentState()), AdderV1("adder", TallyV1(limit="50"))])


def app_v2() -> App:
    return App(agents=[Relay("relay", AgentState()), AdderV2("adder", TallyV2())])


# -- fixtures ---------------------------------------------------------------------------------


@pytest.fixture
async def nats_url(tmp_path: Path) -> AsyncIterator[str]:
    """The shared server's URL, or one of this test's own when there is none."""
    if reachable(SHARED_URL):
        yield SHARED_URL
        return
    binary = server_binary()
    if binary is None:
        unavailable(f"no NATS server at {SHARED_URL} and no nats-server binary")
        return
    server = OwnServer(binary, tmp_path / "jetstream")
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
async def store(postgres_url: str) -> AsyncIterator[SqlStore]:
    made = SqlStore(postgres_url)
    try:
        yield made
    finally:
        await made.close()


class Workers:
    """A relay's worker and an adder's worker, each on its own connection to NATS."""

    def __init__(self, nats_url: str, store: SqlStore, run_id: str, app: App, tag: str) -> None:
        self.nats_url = nats_url
        self.store = store
        self.run_id = run_id
        self.app = app
        self.tag = tag
        self.links: list[JetStreamLink] = []
        self.workers: list[Worker] = []

    async def start(self) -> None:
        for agent in ("relay", "adder"):
            link = await JetStreamLink.connect(self.nats_url)
            self.links.append(link)
            worker = Worker(
                link, self.store, self.run_id, self.app, [agent], name=f"{agent}-{self.tag}"
            )
            self.workers.append(worker)
            await worker.start()

    @property
    def adder(self) -> Agent[Any]:
        (found,) = [agent for agent in self.app.agents if agent.name == "adder"]
        return found

    @property
    def adder_worker(self) -> Worker:
        (found,) = [worker for worker in self.workers if worker.agents == ["adder"]]
        return found

    async def close(self) -> None:
        for worker in self.workers:
            await worker.close()
        for link in self.links:
            await link.close()
        self.workers, self.links = [], []


async def part_of(store: SqlStore, snapshot: Snapshot, agent: str) -> int:
    """The state version the part holding ``agent`` recorded for it in ``snapshot``."""
    parts = await store.load_snapshot_parts(snapshot.run_id, snapshot.seq)
    (version,) = [p.agents[agent].state_version for p in parts if agent in p.agents]
    return version


async def test_workers_of_version_2_restore_a_cut_stored_by_version_1(
    nats_url: str, store: SqlStore
) -> None:
    link = await JetStreamLink.connect(nats_url)
    run = DistributedRun(link, store, app_v1(), part_timeout=PATIENCE)
    old: Workers | None = None
    new: Workers | None = None
    try:
        await run.start()
        old = Workers(nats_url, store, run.run_id, app_v1(), "v1")
        await old.start()
        run.send("relay", 5)
        run.send("relay", 7)
        async with asyncio.timeout(PATIENCE):
            await run.run_until_idle()
            kept = await run.snapshot()

        # Version 1 wrote the cut: the joined snapshot and the adder's part say so.
        assert old.adder.state.count == 12
        cut = kept.agents["adder"]
        assert cut.state_version == 1
        assert cut.state == {"count": 12, "limit": "50", "memory": {}, "plan": [], "tool_calls": []}
        assert kept.agents["relay"].state_version == 1
        assert await part_of(store, kept, "adder") == 1
        stored = await store.load_snapshot(kept.id)
        assert stored.status is SnapshotStatus.COMPLETE
        assert stored.agents["adder"].state_version == 1

        # The deploy: the workers stop, and workers of version 2 take their agents over.
        await old.close()
        old = None
        new = Workers(nats_url, store, run.run_id, app_v2(), "v2")
        await new.start()
        async with asyncio.timeout(PATIENCE):
            await run.run_until_idle()

        # Their agents ran before: the run went back to its last complete cut, and the adder
        # of version 2 read its state from it through the upcaster.
        assert all(worker.rejoined for worker in new.workers)
        rollbacks = new.adder_worker.host.rollbacks
        assert rollbacks
        assert {order.snapshot_id for order in rollbacks} == {kept.id}
        adder = new.adder
        assert isinstance(adder.state, TallyV2)
        assert (adder.state.total, adder.state.limit, adder.state.seen) == (12, 50, [])

        # The run goes on under version 2, and its next snapshot records version 2.
        run.send("relay", 3)
        async with asyncio.timeout(PATIENCE):
            await run.run_until_idle()
            after = await run.snapshot()
        assert (adder.state.total, adder.state.seen) == (15, [3])
        cut = after.agents["adder"]
        assert cut.state_version == 2
        assert cut.state == {
            "total": 15,
            "limit": 50,
            "seen": [3],
            "memory": {},
            "plan": [],
            "tool_calls": [],
        }
        assert await part_of(store, after, "adder") == 2
        assert (await store.load_snapshot(after.id)).agents["adder"].state_version == 2
        assert cut_problems(after) == []

        # The cut of version 1 is stored as it was written: version 1, never rewritten.
        again = await store.load_snapshot(kept.id)
        assert again.agents["adder"].state_version == 1
        assert again.agents["adder"].state["count"] == 12
        await run.close()
    finally:
        for workers in (old, new):
            if workers is not None:
                await workers.close()
        await link.delete_stream(run.run_id)
        await link.close()
