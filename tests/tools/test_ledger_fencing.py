"""A fenced ledger: claims and updates of a run's calls only while the run's lease is ours.

The SQL ledger checks the lease (in the database of the runs) in the same statement as the
claim or the update; once another owner took the run over, nothing is written and
``OwnershipLost`` is raised. The memory ledger shares no database with a lease: its fence
does nothing.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta

import pytest

from agentsnap import OwnershipLost, RunInfo, ToolCallStatus, tool
from agentsnap.ledger import LedgerEntry, fingerprint, owner_id
from agentsnap.messages import JsonValue
from agentsnap.ownership import RunOwnership
from agentsnap.records import utcnow
from agentsnap.store.ledger import MemoryLedger
from agentsnap.store.memory import MemoryStore
from agentsnap.store.sql import SqlStore
from agentsnap.store.sql_ledger import SqlLedger

RUN = "f" * 32
OTHER_RUN = "e" * 32
DAY = timedelta(days=1)


def claim_of(key: str, run_id: str | None = RUN) -> LedgerEntry:
    now = utcnow()
    arguments: dict[str, JsonValue] = {"card": "4242", "amount": 500}
    return LedgerEntry(
        key=key,
        tool="charge",
        fingerprint=fingerprint(arguments),
        arguments=arguments,
        status=ToolCallStatus.IN_PROGRESS,
        created_at=now,
        updated_at=now,
        run_id=run_id,
        owner=owner_id(),
        lease_until=now + DAY,
    )


@dataclass
class Fenced:
    store: SqlStore
    ledger: SqlLedger
    token: int

    async def take_over(self) -> None:
        """Another owner takes the run over."""
        taken = await self.store.take_lease(
            RUN, "elsewhere.example:1:0123456789ab", utcnow() + DAY, replacing=self.token
        )
        assert taken is not None


@pytest.fixture
async def fenced(db_url: str) -> AsyncIterator[Fenced]:
    """Runs RUN (leased by this process, the ledger fenced) and OTHER_RUN (no lease)."""
    store = SqlStore(db_url)
    ledger = SqlLedger(db_url)
    try:
        await store.create_run(RunInfo(id=RUN))
        await store.create_run(RunInfo(id=OTHER_RUN))
        lease = await store.take_lease(RUN, owner_id(), utcnow() + DAY, replacing=None)
        assert lease is not None
        ledger.fence(RUN, lease.token)
        yield Fenced(store, ledger, lease.token)
    finally:
        await ledger.close()
        await store.close()


async def test_claims_and_updates_go_through_while_the_lease_is_ours(fenced: Fenced) -> None:
    ledger = fenced.ledger
    assert await ledger.claim(claim_of("k1")) is None
    found = await ledger.claim(claim_of("k1"))
    assert found is not None
    assert found.key == "k1"
    assert await ledger.update(
        "k1",
        {"status": ToolCallStatus.SUCCEEDED, "result": 1},
        statuses=(ToolCallStatus.IN_PROGRESS,),
        owner=owner_id(),
    )
    # A compare-and-set that does not match still just returns False.
    assert not await ledger.update(
        "k1", {"status": ToolCallStatus.FAILED}, statuses=(ToolCallStatus.IN_PROGRESS,)
    )
    entry = await ledger.get("k1")
    assert entry is not None
    assert entry.status is ToolCallStatus.SUCCEEDED


async def test_a_claim_after_a_takeover_is_refused_and_writes_nothing(fenced: Fenced) -> None:
    await fenced.take_over()

    with pytest.raises(OwnershipLost) as lost:
        await fenced.ledger.claim(claim_of("k1"))

    assert (lost.value.run_id, lost.value.token) == (RUN, fenced.token)
    assert "elsewhere.example:1:0123456789ab" in str(lost.value)
    assert await fenced.ledger.get("k1") is None


async def test_a_claim_of_a_taken_key_after_a_takeover_is_refused(fenced: Fenced) -> None:
    assert await fenced.ledger.claim(claim_of("k1")) is None
    await fenced.take_over()
    with pytest.raises(OwnershipLost):
        await fenced.ledger.claim(claim_of("k1"))


async def test_an_update_after_a_takeover_is_refused_and_changes_nothing(fenced: Fenced) -> None:
    assert await fenced.ledger.claim(claim_of("k1")) is None
    await fenced.take_over()

    with pytest.raises(OwnershipLost):
        await fenced.ledger.update(
            "k1",
            {"status": ToolCallStatus.SUCCEEDED, "result": 1},
            statuses=(ToolCallStatus.IN_PROGRESS,),
            owner=owner_id(),
            attempts=1,
        )

    entry = await fenced.ledger.get("k1")
    assert entry is not None
    assert (entry.status, entry.result) == (ToolCallStatus.IN_PROGRESS, None)


async def test_a_tool_call_after_a_takeover_is_refused_before_it_runs(fenced: Fenced) -> None:
    ran: list[int] = []

    @tool(side_effect=True, name="fenced_charge")
    def charge(amount: int) -> int:
        ran.append(amount)
        return amount

    assert await charge.invoke(fenced.ledger, key="before", amount=1, run_id=RUN) == 1
    await fenced.take_over()
    with pytest.raises(OwnershipLost):
        await charge.invoke(fenced.ledger, key="after", amount=2, run_id=RUN)
    assert ran == [1], "the tool did not run once the run was lost"


async def test_calls_of_other_runs_and_of_no_run_are_not_fenced(fenced: Fenced) -> None:
    await fenced.take_over()
    ledger = fenced.ledger
    for key, run_id in (("k-other", OTHER_RUN), ("k-none", None)):
        assert await ledger.claim(claim_of(key, run_id)) is None
        assert await ledger.update(
            key, {"status": ToolCallStatus.SUCCEEDED}, statuses=(ToolCallStatus.IN_PROGRESS,)
        )


async def test_a_claim_for_a_fenced_run_without_a_lease_is_refused(fenced: Fenced) -> None:
    fenced.ledger.fence(OTHER_RUN, 1)  # OTHER_RUN has no lease at all
    with pytest.raises(OwnershipLost) as lost:
        await fenced.ledger.claim(claim_of("k1", OTHER_RUN))
    assert "no lease" in str(lost.value)
    assert await fenced.ledger.get("k1") is None


async def test_run_ownership_fences_a_ledger_on_the_stores_database(db_url: str) -> None:
    store = SqlStore(db_url)
    ledger = SqlLedger(db_url)
    try:
        await store.create_run(RunInfo(id=RUN))
        ownership = RunOwnership(store, RUN)
        ownership.fence_ledger(ledger)  # before acquire: fenced once the lease is taken
        lease = await ownership.acquire()
        assert await ledger.claim(claim_of("k1")) is None
        await store.take_lease(RUN, "elsewhere.example:1:x", utcnow() + DAY, replacing=lease.token)
        with pytest.raises(OwnershipLost):
            await ledger.claim(claim_of("k2"))
    finally:
        await ledger.close()
        await store.close()


async def test_a_ledger_in_another_database_is_not_fenced(db_url: str) -> None:
    store = MemoryStore()  # its leases are not in the ledger's database
    ledger = SqlLedger(db_url)
    try:
        await store.create_run(RunInfo(id=RUN))
        ownership = RunOwnership(store, RUN)
        await ownership.acquire()
        ownership.fence_ledger(ledger)
        assert await ledger.claim(claim_of("k1")) is None
    finally:
        await ledger.close()


async def test_the_memory_ledger_fence_changes_nothing() -> None:
    ledger = MemoryLedger()
    ledger.fence(RUN, 1)  # there is no lease anywhere: a SQL ledger would refuse
    assert await ledger.claim(claim_of("k1")) is None
    assert await ledger.update(
        "k1", {"status": ToolCallStatus.SUCCEEDED}, statuses=(ToolCallStatus.IN_PROGRESS,)
    )
