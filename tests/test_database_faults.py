"""A run whose database goes away for a while loses no work and repeats no effect.

The outage is injected where the runtime meets the database (the ledger's claims or
outcomes, the store's writes at close), as transient faults the store's retry policy gives
up on, so that the runtime's own recovery is what is tested: the work of a handler that
could not finish is redone from the last cut once the database answers, an outcome the
ledger could not record is kept and written later, and what the database refuses at close
is spooled and written by the next resume or ``agentsnap db recover``. The faults suite
(``tests/faults``) makes the real faults: dropped connections, a restarted server, a held
lock, a full disk.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from payloads import get
from pydantic import Field

from agentsnap import (
    Agent,
    AgentState,
    Context,
    Message,
    RunStatus,
    Runtime,
    SnapshotPolicy,
    StoreError,
    StoreRetry,
    tool,
)
from agentsnap.journal import read_journal
from agentsnap.ledger import ToolCallStatus
from agentsnap.model_calls import ModelCallLog
from agentsnap.store.spool import Spool
from agentsnap.store.sql import SqlStore
from agentsnap.testing import SampledModel

# Retries that give up quickly, so that an outage outlasts them.
BRIEF = StoreRetry(timeout=1.0, deadline=0.2, first_wait=0.01, max_wait=0.05)
CHAINS = 4
HOPS = 12

effects: Counter[tuple[str, int]] = Counter()


@tool(side_effect=True)
async def deliver_hop(chain: str, hop: int) -> int:
    """The outside world: counts each (chain, hop) it is asked to do."""
    await asyncio.sleep(0.02)
    effects[chain, hop] += 1
    return hop


class Hops(AgentState):
    done: list[str] = Field(default_factory=list)


class Relay(Agent[Hops]):
    """Does one hop of a chain per message and passes the chain to its peer."""

    def __init__(self, name: str, peer: str) -> None:
        super().__init__(name, Hops())
        self.peer = peer

    async def handle(self, message: Message, ctx: Context[Hops]) -> None:
        chain, hop = get(message.payload, "chain", str), get(message.payload, "hop", int)
        await deliver_hop(ctx, chain=chain, hop=hop)
        ctx.state.done.append(f"{chain}:{hop}")
        if hop < HOPS:
            ctx.send(self.peer, {"chain": chain, "hop": hop + 1})


def transient() -> StoreError:
    error = StoreError("the database is unavailable")
    cause = sqlite3.OperationalError("disk I/O error")
    cause.sqlite_errorcode = sqlite3.SQLITE_IOERR
    error.__cause__ = cause
    return error


def fail_while(owner: Any, name: str, outage: asyncio.Event) -> list[int]:
    """``owner.name`` raises a transient fault while ``outage`` is set."""
    original: Callable[..., Awaitable[Any]] = getattr(owner, name)
    failed: list[int] = []

    async def sometimes(*args: Any, **kwargs: Any) -> Any:
        if outage.is_set():
            failed.append(1)
            raise transient()
        return await original(*args, **kwargs)

    setattr(owner, name, sometimes)
    return failed


def relays(runtime: Runtime) -> None:
    runtime.add(Relay("ping", "pong"))
    runtime.add(Relay("pong", "ping"))


async def start_chains(runtime: Runtime) -> None:
    for i in range(CHAINS):
        runtime.send("ping", {"chain": f"c{i}", "hop": 0})


def expected() -> Counter[tuple[str, int]]:
    return Counter({(f"c{i}", hop): 1 for i in range(CHAINS) for hop in range(HOPS + 1)})


async def outage_of(seconds: float, outage: asyncio.Event) -> None:
    await asyncio.sleep(0.05)
    outage.set()
    await asyncio.sleep(seconds)
    outage.clear()


async def test_work_a_handler_lost_to_the_database_is_redone_once(tmp_path: Path) -> None:
    effects.clear()
    url = f"sqlite:///{tmp_path / 'agentsnap.db'}"
    outage = asyncio.Event()
    store = SqlStore(url, retry=BRIEF)
    async with Runtime(
        store=store, snapshot_policy=SnapshotPolicy(every_deliveries=5), journal=True
    ) as runtime:
        relays(runtime)
        failed = fail_while(runtime.ledger, "_claim_once", outage)
        await start_chains(runtime)
        await asyncio.gather(runtime.run_until_idle(), outage_of(0.6, outage))
    await store.close()

    assert failed, "the outage hit no claim"
    assert effects == expected()  # every hop once: none lost, none twice
    assert any(r.source == "database" for r in runtime.rollbacks)
    assert runtime.failures == []
    done = [hop for name in ("ping", "pong") for hop in runtime.agents[name].state.done]
    assert sorted(done) == sorted(f"{c}:{h}" for c, h in expected())
    store = SqlStore(url)
    try:
        assert (await store.get_run(runtime.run_id)).status is RunStatus.SUCCEEDED
        journal = read_journal(await store.load_journal(runtime.run_id))
        assert len([m for m in journal if m.src != "$env"]) >= CHAINS * HOPS
    finally:
        await store.close()


async def test_an_outcome_the_ledger_could_not_record_is_kept_and_written(
    tmp_path: Path,
) -> None:
    effects.clear()
    url = f"sqlite:///{tmp_path / 'agentsnap.db'}"
    outage = asyncio.Event()
    store = SqlStore(url, retry=BRIEF)
    async with Runtime(store=store) as runtime:
        relays(runtime)
        failed = fail_while(runtime.ledger, "_update_once", outage)
        await start_chains(runtime)
        await asyncio.gather(runtime.run_until_idle(), outage_of(0.4, outage))
        calls = await runtime.ledger.list_calls(runtime.run_id)
    await store.close()

    assert failed, "the outage hit no outcome"
    assert effects == expected()
    assert len(calls) == CHAINS * (HOPS + 1)
    assert {call.status for call in calls} == {ToolCallStatus.SUCCEEDED}


async def test_writes_refused_at_close_are_spooled_and_written_later(tmp_path: Path) -> None:
    effects.clear()
    url = f"sqlite:///{tmp_path / 'agentsnap.db'}"
    outage = asyncio.Event()
    store = SqlStore(url, retry=BRIEF)
    runtime = Runtime(store=store, journal=True)
    relays(runtime)
    await runtime.start()
    await start_chains(runtime)
    await runtime.run_until_idle()
    runtime.send("ping", {"chain": "late", "hop": HOPS})  # input the run has not handled yet
    for name in ("finish_run", "append_journal", "append_replay"):
        fail_while(store, name, outage)
    outage.set()

    await runtime.close()  # does not raise: nothing was lost
    await store.close()

    spool = Spool.for_url(url)
    assert spool.runs() == [runtime.run_id]
    kinds = {op.op for op in spool.pending(runtime.run_id)}
    assert {"finish_run", "append_replay"} <= kinds
    reader = SqlStore(url)
    try:
        # The next runtime of the run writes what was spooled before anything else.
        resumed = Runtime(store=reader, run_id=runtime.run_id)
        relays(resumed)
        await resumed.resume()
        assert spool.runs() == []
        await resumed.run_until_idle()
        await resumed.close()
        assert (await reader.get_run(runtime.run_id)).status is RunStatus.SUCCEEDED
        assert effects[("late", HOPS)] == 1
        assert effects - Counter({("late", HOPS): 1}) == expected()
    finally:
        await reader.close()


async def test_policy_snapshots_are_skipped_while_the_store_is_behind(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'agentsnap.db'}"
    store = SqlStore(url)
    gate = asyncio.Event()
    original = store.save_snapshot
    writes = 0

    async def slow(snapshot: Any) -> None:
        nonlocal writes
        writes += 1
        if writes > 1:  # the first cut goes through; then the store hangs
            await gate.wait()
        await original(snapshot)

    store.save_snapshot = slow  # type: ignore[method-assign]
    async with Runtime(store=store, snapshot_policy=SnapshotPolicy(every_seconds=0.01)) as runtime:
        relays(runtime)
        await start_chains(runtime)
        await asyncio.sleep(0.5)
        behind = runtime._snapshots.writing
        while_hung = writes
        gate.set()
        await runtime.run_until_idle()
    await store.close()

    # The time policy waits until the store took its last snapshot: one write hangs, and no
    # other is started behind it (without back-pressure: one per 10 ms, some 50 by now).
    assert behind == 1
    assert while_hung == 2


class NotingRelay(Relay):
    """A relay that asks a sampled model for a note before each hop's effect."""

    def __init__(self, name: str, peer: str) -> None:
        super().__init__(name, peer)
        self.model = SampledModel([("note", [f"note {i}" for i in range(1000)])])

    async def handle(self, message: Message, ctx: Context[Hops]) -> None:
        chain, hop = get(message.payload, "chain", str), get(message.payload, "hop", int)
        note = await self.model.complete(f"note for {chain}:{hop}")
        await noted_hop(ctx, chain=chain, hop=hop, note=note)
        ctx.state.done.append(f"{chain}:{hop}")
        if hop < HOPS:
            ctx.send(self.peer, {"chain": chain, "hop": hop + 1})


@tool(side_effect=True)
async def noted_hop(chain: str, hop: int, note: str) -> int:
    """The outside world, told a sampled model's note with each hop."""
    await asyncio.sleep(0.01)
    effects[chain, hop] += 1
    return hop


async def test_a_model_call_the_database_could_not_record_is_redone_and_no_effect_twice(
    tmp_path: Path,
) -> None:
    effects.clear()
    url = f"sqlite:///{tmp_path / 'agentsnap.db'}"
    outage = asyncio.Event()
    store = SqlStore(url, retry=BRIEF)
    async with Runtime(store=store, snapshot_policy=SnapshotPolicy(every_deliveries=5)) as runtime:
        runtime.add(NotingRelay("ping", "pong"))
        runtime.add(NotingRelay("pong", "ping"))
        refused = fail_while(runtime.ledger, "_record_once", outage)
        fail_while(runtime.ledger, "_claim_once", outage)
        await start_chains(runtime)
        await asyncio.gather(runtime.run_until_idle(), outage_of(0.6, outage))
        ledger = runtime.ledger
        assert isinstance(ledger, ModelCallLog)
        calls = await ledger.list_model_calls(runtime.run_id)
    await store.close()

    assert refused, "the outage hit no model call"  # and claims, when a handler got so far
    assert effects == expected(), "every hop once, though its note was worded anew"
    assert any(r.source == "database" for r in runtime.rollbacks)
    assert runtime.failures == []
    recorded = {c.asked().messages[0].content for c in calls}
    assert recorded == {f"note for {c}:{h}" for c, h in expected()}
