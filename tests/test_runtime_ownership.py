"""A runtime owns its run: it takes the lease, keeps it, and stops when another takes it over.

The store's side (leases, fencing) has its own tests in ``tests/store``; the two-process
cases (two resumes at once, a killed owner) are in ``tests/guarantees``. Here: what a user
of ``Runtime`` sees in one process.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path

import pytest

from agentsnap import (
    Agent,
    AgentState,
    Context,
    Message,
    OwnershipLost,
    RunOwnedError,
    RunStatus,
    Runtime,
)
from agentsnap.records import utcnow
from agentsnap.store.sql import SqlStore


class Slow(Agent[AgentState]):
    """Counts its messages; each handler waits until the test lets it go on."""

    def __init__(self, name: str, gate: asyncio.Event) -> None:
        super().__init__(name)
        self.gate = gate
        self.handled = 0

    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        await self.gate.wait()
        self.handled += 1
        if message.payload and self.handled < 50:
            ctx.send(self.name, message.payload)


async def run_until_lost(runtime: Runtime) -> None:
    """Keep the run going until it raises (the heartbeat, every 0.1 s, notices the loss)."""
    while True:
        await runtime.run_until_idle()
        await asyncio.sleep(0.05)


async def test_a_new_run_is_owned_and_released_on_close(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/runs.db"
    store = SqlStore(url)
    try:
        async with Runtime(store=store) as runtime:
            runtime.add(Slow("worker", asyncio.Event()))
            await runtime.start()
            lease = await store.get_lease(runtime.run_id)
            assert lease is not None
            assert lease.token == 1
            assert (await store.get_run(runtime.run_id)).status is RunStatus.RUNNING
        released = await store.get_lease(runtime.run_id)
        assert released is not None
        assert released.expires_at <= utcnow()
        assert (await store.get_run(runtime.run_id)).status is RunStatus.SUCCEEDED
    finally:
        await store.close()


async def test_a_second_runtime_cannot_resume_a_live_run(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/runs.db"
    first_store, second_store = SqlStore(url), SqlStore(url)
    gate = asyncio.Event()
    try:
        async with Runtime(store=first_store) as first:
            first.add(Slow("worker", gate))
            first.send("worker", "go")
            await asyncio.sleep(0.01)  # the handler now waits on the gate
            second = Runtime(store=second_store, run_id=first.run_id)
            second.add(Slow("worker", asyncio.Event()))
            with pytest.raises(RunOwnedError) as refused:  # at once: its owner runs here
                await asyncio.wait_for(second.resume(), timeout=5)
            assert refused.value.owner == (await first_store.get_lease(first.run_id)).owner  # type: ignore[union-attr]
            await second.close()
            # The refused runtime changed nothing: the run is still the first one's.
            assert (await second_store.get_run(first.run_id)).status is RunStatus.RUNNING
            gate.set()
            await first.run_until_idle()
    finally:
        await first_store.close()
        await second_store.close()


async def test_a_runtime_whose_run_is_taken_over_stops_and_writes_nothing(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path}/runs.db"
    store, other = SqlStore(url), SqlStore(url)
    gate = asyncio.Event()
    try:
        runtime = Runtime(store=store, lease=0.3)
        worker = Slow("worker", gate)
        runtime.add(worker)
        async with runtime:
            runtime.send("worker", "go")
            lease = await store.get_lease(runtime.run_id)
            assert lease is not None
            # Another process takes the run over (as if this one had been suspended).
            taken = await other.take_lease(
                runtime.run_id,
                "elsewhere:1:0123456789ab",
                utcnow() + timedelta(hours=1),
                replacing=lease.token,
            )
            assert taken is not None
            gate.set()
            with pytest.raises(OwnershipLost):
                await asyncio.wait_for(run_until_lost(runtime), timeout=30)
            handled = worker.handled
            with pytest.raises(OwnershipLost):
                runtime.send("worker", "more")
            await asyncio.sleep(0.2)
            assert worker.handled == handled, "nothing is delivered after the run was lost"
        # Closing wrote nothing: the new owner's run is as the new owner left it.
        assert (await other.get_run(runtime.run_id)).status is RunStatus.RUNNING
        current = await other.get_lease(runtime.run_id)
        assert current is not None
        assert current.token == taken.token
    finally:
        await store.close()
        await other.close()
