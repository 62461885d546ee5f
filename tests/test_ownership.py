"""RunOwnership: taking a run's lease, waiting for it, keeping it alive, and losing it."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from owners import dead_owner

from agentsnap import (
    ConfigurationError,
    OwnershipLost,
    RunInfo,
    RunLease,
    RunOwnedError,
    RunOwnership,
    RunStatus,
    StoreError,
)
from agentsnap.ledger import owner_id
from agentsnap.ownership import owner_is_live
from agentsnap.records import utcnow
from agentsnap.store import MemoryStore
from agentsnap.store.sql import SqlStore

RUN = "a1" * 16
ELSEWHERE = "elsewhere.example:1:0123456789ab"
SAFETY = 60.0
"""Seconds after which a test that waits for something gives up (it happens far sooner)."""


async def store_with_run() -> MemoryStore:
    store = MemoryStore()
    await store.create_run(RunInfo(id=RUN))
    return store


async def until(condition: Any) -> None:
    """Wait until ``condition()`` (an async predicate) holds."""
    async with asyncio.timeout(SAFETY):
        while True:
            if await condition():
                return
            await asyncio.sleep(0.01)


def test_owner_is_live() -> None:
    now = utcnow()
    later = now + timedelta(minutes=1)
    assert owner_is_live(RunLease(run_id=RUN, owner=owner_id(), token=1, expires_at=later), now)
    assert owner_is_live(RunLease(run_id=RUN, owner=ELSEWHERE, token=1, expires_at=later), now)
    assert not owner_is_live(None, now)
    assert not owner_is_live(RunLease(run_id=RUN, owner=owner_id(), token=1, expires_at=now), now)
    assert not owner_is_live(
        RunLease(run_id=RUN, owner=dead_owner(), token=1, expires_at=later), now
    )


async def test_the_first_owner_gets_token_1_and_fences_the_store() -> None:
    store = await store_with_run()
    ownership = RunOwnership(store, RUN)

    lease = await ownership.acquire()

    assert (lease.token, lease.owner) == (1, owner_id())
    assert ownership.lease == lease
    assert await store.get_lease(RUN) == lease
    assert (await store.get_run(RUN)).status is RunStatus.RUNNING
    await store.take_lease(RUN, ELSEWHERE, utcnow() + timedelta(hours=1), replacing=1)
    with pytest.raises(OwnershipLost):
        await store.finish_run(RUN, RunStatus.SUCCEEDED, utcnow())


async def test_a_live_owner_is_refused_at_once_by_default() -> None:
    store = await store_with_run()
    held = await RunOwnership(store, RUN, owner=ELSEWHERE).acquire()

    with pytest.raises(RunOwnedError) as refused:
        await RunOwnership(store, RUN).acquire()

    assert (refused.value.run_id, refused.value.owner) == (RUN, ELSEWHERE)
    assert refused.value.expires_at == held.expires_at
    assert ELSEWHERE in str(refused.value)
    assert await store.get_lease(RUN) == held


async def test_a_waiting_owner_takes_the_run_once_the_holder_releases_it() -> None:
    store = await store_with_run()
    first = RunOwnership(store, RUN, owner=ELSEWHERE, ttl=3600)
    await first.acquire()
    second = RunOwnership(store, RUN)
    waiting = asyncio.create_task(second.acquire(wait=SAFETY))
    await asyncio.sleep(0.05)
    assert not waiting.done(), "the live owner is waited for"

    await first.release()
    lease = await waiting

    assert (lease.token, lease.owner) == (2, owner_id())


async def test_the_lease_of_a_dead_process_is_taken_over_at_once() -> None:
    store = await store_with_run()
    await store.take_lease(RUN, dead_owner(), utcnow() + timedelta(hours=1), replacing=None)

    lease = await RunOwnership(store, RUN).acquire()

    assert lease.token == 2


async def test_an_expired_lease_is_taken_over_at_once() -> None:
    store = await store_with_run()
    await store.take_lease(RUN, ELSEWHERE, utcnow() - timedelta(seconds=1), replacing=None)
    assert (await RunOwnership(store, RUN).acquire()).token == 2


class RacedStore(MemoryStore):
    """A store on which someone else takes the lease just before this caller's first try."""

    def __init__(self, competitor: str) -> None:
        super().__init__()
        self.competitor = competitor
        self.raced = False

    async def take_lease(
        self, run_id: str, owner: str, expires_at: Any, *, replacing: int | None
    ) -> RunLease | None:
        if not self.raced:
            self.raced = True
            await super().take_lease(
                run_id, self.competitor, utcnow() + timedelta(hours=1), replacing=replacing
            )
        return await super().take_lease(run_id, owner, expires_at, replacing=replacing)


async def test_a_lost_race_is_looked_at_again() -> None:
    store = RacedStore(competitor=dead_owner())
    await store.create_run(RunInfo(id=RUN))
    lease = await RunOwnership(store, RUN).acquire()
    assert store.raced
    assert lease.token == 2, "the winner of the race was gone: taken over from it"

    live = RacedStore(competitor=ELSEWHERE)
    await live.create_run(RunInfo(id=RUN))
    with pytest.raises(RunOwnedError) as refused:
        await RunOwnership(live, RUN).acquire()
    assert refused.value.owner == ELSEWHERE


async def test_acquiring_again_keeps_the_token() -> None:
    store = await store_with_run()
    ownership = RunOwnership(store, RUN)
    first = await ownership.acquire()
    again = await ownership.acquire()
    assert again.token == first.token == 1
    assert again.expires_at >= first.expires_at


async def test_the_heartbeat_renews_the_lease() -> None:
    store = await store_with_run()
    ownership = RunOwnership(store, RUN, ttl=0.3)
    first = await ownership.acquire()
    lost: list[OwnershipLost] = []
    ownership.start_heartbeat(lost.append)

    async def renewed() -> bool:
        lease = await store.get_lease(RUN)
        return lease is not None and lease.expires_at > first.expires_at

    await until(renewed)
    await ownership.release()

    assert lost == []
    lease = await store.get_lease(RUN)
    assert lease is not None
    assert lease.token == 1
    assert lease.expires_at <= utcnow(), "released: it holds no more"
    assert (await store.get_run(RUN)).status is RunStatus.INTERRUPTED


async def test_the_heartbeat_reports_a_takeover() -> None:
    store = await store_with_run()
    ownership = RunOwnership(store, RUN, ttl=0.3)
    lease = await ownership.acquire()
    lost: asyncio.Queue[OwnershipLost] = asyncio.Queue()
    ownership.start_heartbeat(lost.put_nowait)

    await store.take_lease(RUN, ELSEWHERE, utcnow() + timedelta(hours=1), replacing=lease.token)
    error = await asyncio.wait_for(lost.get(), SAFETY)

    assert (error.run_id, error.token) == (RUN, 1)
    assert ELSEWHERE in str(error)
    await ownership.release()  # the heartbeat stopped; the lease is not ours to release
    assert lost.empty()
    held = await store.get_lease(RUN)
    assert held is not None
    assert (held.owner, held.token) == (ELSEWHERE, 2)


class FlakyStore(MemoryStore):
    """Renewals fail with a store error ``failures`` times (every time, if negative)."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures
        self.renewals = 0

    async def renew_lease(self, run_id: str, token: int, expires_at: Any) -> bool:
        self.renewals += 1
        if self.failures < 0 or self.renewals <= self.failures:
            raise StoreError("the database is restarting")
        return await super().renew_lease(run_id, token, expires_at)


async def test_the_heartbeat_retries_store_errors() -> None:
    store = FlakyStore(failures=2)
    await store.create_run(RunInfo(id=RUN))
    ownership = RunOwnership(store, RUN, ttl=3.0)
    first = await ownership.acquire()
    lost: list[OwnershipLost] = []
    ownership.start_heartbeat(lost.append)

    async def renewed() -> bool:
        lease = await store.get_lease(RUN)
        return lease is not None and lease.expires_at > first.expires_at

    await until(renewed)
    await ownership.release()
    assert store.renewals > 2
    assert lost == []


async def test_a_lease_that_expired_during_an_outage_is_kept_if_nobody_took_it() -> None:
    # The store fails for longer than the lease lasts; nobody else wants the run meanwhile.
    store = FlakyStore(failures=8)
    await store.create_run(RunInfo(id=RUN))
    ownership = RunOwnership(store, RUN, ttl=0.3)
    first = await ownership.acquire()
    lost: list[OwnershipLost] = []
    ownership.start_heartbeat(lost.append)

    async def renewed() -> bool:
        lease = await store.get_lease(RUN)
        return store.renewals > 8 and lease is not None and lease.expires_at > first.expires_at

    await until(renewed)
    held = await store.get_lease(RUN)
    assert held is not None
    assert held.token == first.token
    assert lost == []
    await ownership.release()


async def test_a_lease_taken_over_during_an_outage_is_lost_once_the_store_answers() -> None:
    store = FlakyStore(failures=4)
    await store.create_run(RunInfo(id=RUN))
    ownership = RunOwnership(store, RUN, ttl=0.3)
    await ownership.acquire()
    lost: asyncio.Queue[OwnershipLost] = asyncio.Queue()
    ownership.start_heartbeat(lost.put_nowait)
    # Another process takes the run over once the lease has expired.
    other = RunOwnership(store, RUN, ttl=30.0)
    taken = await other.acquire(wait=SAFETY, refuse_live=False)

    error = await asyncio.wait_for(lost.get(), SAFETY)

    assert error.token < taken.token
    assert store.renewals > 4
    await ownership.release()
    await other.release()


async def test_misuse_is_a_configuration_error() -> None:
    store = await store_with_run()
    with pytest.raises(ConfigurationError):
        RunOwnership(store, RUN, ttl=0)
    ownership = RunOwnership(store, RUN)
    with pytest.raises(ConfigurationError):
        ownership.start_heartbeat(lambda lost: None)
    await ownership.acquire()
    ownership.start_heartbeat(lambda lost: None)
    with pytest.raises(ConfigurationError):
        ownership.start_heartbeat(lambda lost: None)
    await ownership.release()


async def test_ownership_on_a_sqlite_store(tmp_path: Path) -> None:
    store = SqlStore(f"sqlite:///{tmp_path / 'agentsnap.db'}")
    try:
        await store.create_run(RunInfo(id=RUN))
        ownership = RunOwnership(store, RUN, ttl=0.3)
        lease = await ownership.acquire()
        ownership.start_heartbeat(lambda lost: None)

        async def renewed() -> bool:
            found = await store.get_lease(RUN)
            return found is not None and found.expires_at > lease.expires_at

        await until(renewed)
        assert (await store.get_run(RUN)).status is RunStatus.RUNNING
        await store.finish_run(RUN, RunStatus.SUCCEEDED, utcnow())
        await ownership.release()
        assert (await store.get_run(RUN)).status is RunStatus.SUCCEEDED
    finally:
        await store.close()
