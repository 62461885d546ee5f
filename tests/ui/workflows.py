"""Runs for the inspector's browser tests, made by real runtimes in an SQLite database.

* the demo (``agentsnap.demo``): four agents, three snapshots, a rollback;
* ``counters``: two agents with a typed state (``count`` must be >= 0, so a fork can be
  refused), a side-effecting tool, snapshots between rounds, a rollback, and one tool call
  whose owner died before recording its outcome (reported ``unknown``);
* a hostile run: its name, a tag, its agents' names, payloads and state hold HTML and
  script that a page must show as text.
"""

from __future__ import annotations

import dataclasses
import uuid
from datetime import timedelta

from ledger_entries import claim_of
from pydantic import Field

from agentsnap import Agent, AgentState, Context, Message, Runtime
from agentsnap.demo import run_demo
from agentsnap.records import AgentCut, RollbackInfo, Snapshot, SnapshotStatus, utcnow
from agentsnap.state import content_hash
from agentsnap.store.ledger import ledger_for
from agentsnap.store.sql import SqlStore
from agentsnap.tools import tool

HOSTILE_AGENT = '<img src=x onerror="window.__pwned=1">'
HOSTILE_PEER = "<script>window.__pwned=2</script>"
HOSTILE_RUN = "<script>window.__pwned=3</script>run"
HOSTILE_TEXT = '<img src=x onerror="window.__pwned=4"><b>bold?</b>'


class CounterState(AgentState):
    count: int = Field(default=0, ge=0)
    label: str = ""


@tool(side_effect=True)
async def stamp(n: int) -> str:
    return f"stamp-{n}"


class Counter(Agent[CounterState]):
    def __init__(self, name: str, peer: str | None, *, tools: bool) -> None:
        super().__init__(name)
        self.peer = peer
        self.tools = tools

    async def handle(self, message: Message, ctx: Context[CounterState]) -> None:
        self.state.count += 1
        self.state.memory[f"m{self.state.count}"] = message.payload
        self.state.label = f"seen {self.state.count}"
        if self.tools and self.state.count % 2 == 0:
            self.state.memory["last_stamp"] = await stamp(ctx, n=self.state.count)
        if self.peer is not None and message.kind == "work":
            ctx.send(self.peer, message.payload, kind="echo")


@dataclasses.dataclass
class Runs:
    demo: str
    counters: str
    hostile: str


async def counters_run(store: SqlStore, url: str) -> str:
    runtime = Runtime(store=store, name="counters", tags={"suite": "ui"}, journal=True)
    async with runtime:
        runtime.add(Counter("alpha", "beta", tools=True))
        runtime.add(Counter("beta", None, tools=False))
        for round_ in range(4):
            for i in range(3):
                runtime.send("alpha", {"round": round_, "i": i}, kind="work")
            await runtime.run_until_idle()
            await runtime.snapshot()
        runtime.send("alpha", {"round": "wrong"}, kind="work")
        await runtime.run_until_idle()
        await runtime.rollback(reason="the last round was wrong")
        await runtime.run_until_idle()
    # A call whose owner died before it recorded an outcome: the ledger reports it unknown.
    ledger = ledger_for(store)
    assert ledger is not None
    dead = claim_of("stamp:lost", runtime.run_id, owner="elsewhere:999999999:dead", agent="alpha")
    expired = utcnow() - timedelta(seconds=1)
    await ledger.claim(dataclasses.replace(dead, tool="stamp", lease_until=expired))
    await ledger.close()
    return runtime.run_id


async def hostile_run(store: SqlStore) -> str:
    """A run named with markup whose payloads and states hold markup.

    A runtime only accepts plain agent names, but a database can hold anything: one more
    snapshot and a rollback are written through the store with agents named in HTML.
    """
    runtime = Runtime(store=store, name=HOSTILE_RUN, tags={"<b>tag</b>": "1"}, journal=True)
    async with runtime:
        runtime.add(Counter("sender", "receiver", tools=False))
        runtime.add(Counter("receiver", None, tools=False))
        runtime.send("sender", {"text": HOSTILE_TEXT}, kind="work")
        await runtime.run_until_idle()
        first = await runtime.snapshot()
        runtime.send("sender", {"text": HOSTILE_TEXT, "more": [HOSTILE_PEER]}, kind="work")
        await runtime.run_until_idle()
        await runtime.snapshot()
    state = CounterState(count=1, label=HOSTILE_TEXT).model_dump_json()
    cut = AgentCut(state_json=state, state_hash=content_hash(state))
    forged = Snapshot(
        id=uuid.uuid4().hex,
        run_id=runtime.run_id,
        seq=first.seq + 10,
        initiator=HOSTILE_AGENT,
        status=SnapshotStatus.COMPLETE,
        started_at=utcnow(),
        completed_at=utcnow(),
        agents={HOSTILE_AGENT: cut, HOSTILE_PEER: cut},
    )
    await store.save_snapshot(forged)
    await store.save_rollback(
        RollbackInfo(
            id=uuid.uuid4().hex,
            run_id=runtime.run_id,
            snapshot_id=first.id,
            agent=HOSTILE_AGENT,
            reason=HOSTILE_TEXT,
            source="manual",
            attempt=1,
            discarded=0,
        )
    )
    return runtime.run_id


async def fill(url: str) -> Runs:
    """Make the three runs in the database at ``url``; their ids."""
    store = SqlStore(url)
    try:
        demo = (await run_demo(store, journal=True)).run.id
        counters = await counters_run(store, url)
        hostile = await hostile_run(store)
    finally:
        await store.close()
    return Runs(demo=demo, counters=counters, hostile=hostile)
