"""Progress notes on a claim: a running side-effecting call keeps what it started with its key.

Run against each ledger: the in-memory one, SQLite and PostgreSQL. A call notes the remote
job it started; its process stops before the outcome is recorded; the call taken over under
the same key reads the note and polls the job instead of starting a second one. A note is
refused once the claim is someone else's, and a tool without side effects has no claim.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from postgres_db import postgres_url_or_skip

from agentsnap import ToolCall, tool
from agentsnap.exceptions import ConfigurationError, ToolOutcomeUnknown
from agentsnap.ledger import ToolCallStatus
from agentsnap.store.ledger import MemoryLedger
from agentsnap.store.sql_ledger import SqlLedger

from .test_faults import FAST

Ledger = MemoryLedger | SqlLedger

BACKENDS = [
    pytest.param(lambda tmp_path: MemoryLedger(), id="memory"),
    pytest.param(
        lambda tmp_path: SqlLedger(f"sqlite:///{tmp_path / 'ledger.db'}", retry=FAST),
        id="sqlite",
    ),
    pytest.param(
        lambda tmp_path: SqlLedger(postgres_url_or_skip(), retry=FAST),
        id="postgres",
        marks=pytest.mark.postgres,
    ),
]


@pytest.fixture(params=BACKENDS)
async def ledger(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Ledger]:
    factory: Callable[[Path], Ledger] = request.param
    made = factory(tmp_path)
    try:
        yield made
    finally:
        await made.close()


class Jobs:
    """A remote service running jobs: started ones, and their results once done."""

    def __init__(self) -> None:
        self.started: list[dict[str, int]] = []
        self.polled: list[str] = []
        self.release = asyncio.Event()

    def start(self, amount: int) -> str:
        self.started.append({"amount": amount})
        return f"job-{len(self.started)}"

    async def result(self, job: str) -> str:
        self.polled.append(job)
        await self.release.wait()
        return f"{job} paid"


def payout_tool(jobs: Jobs, noted: asyncio.Event) -> object:
    @tool(side_effect=True, rerun_if_unknown=True, name=f"payout_{random.randrange(10**9)}")
    async def payout(call: ToolCall, amount: int) -> str:
        progress = await call.noted()
        if isinstance(progress, dict) and isinstance(progress.get("job"), str):
            return await jobs.result(str(progress["job"]))
        if call.attempt > 1:
            raise ToolOutcomeUnknown(str(call.key), call.tool, None)
        job = jobs.start(amount)
        assert await call.note({"job": job, "amount": amount})
        noted.set()
        return await jobs.result(job)

    return payout


async def test_a_call_taken_over_polls_the_job_its_note_names(ledger: Ledger) -> None:
    jobs = Jobs()
    noted = asyncio.Event()
    payout: Any = payout_tool(jobs, noted)
    amount = random.randint(1, 10_000)
    key = f"payout-{random.randrange(10**9)}"
    first = asyncio.create_task(payout.invoke(ledger, key=key, amount=amount))
    await noted.wait()
    entry = await ledger.get(key)
    assert entry is not None
    assert entry.status is ToolCallStatus.IN_PROGRESS
    assert entry.note == {"job": "job-1", "amount": amount}
    first.cancel()  # the owner stops while the job runs remotely
    with pytest.raises(asyncio.CancelledError):
        await first
    stopped = await ledger.get(key)
    assert stopped is not None
    assert stopped.status is ToolCallStatus.UNKNOWN
    assert stopped.note == {"job": "job-1", "amount": amount}  # the note outlives its owner

    jobs.release.set()
    assert await payout.invoke(ledger, key=key, amount=amount) == "job-1 paid"
    assert jobs.started == [{"amount": amount}]  # polled, not started again
    assert jobs.polled == ["job-1", "job-1"]
    done = await ledger.get(key)
    assert done is not None
    assert done.status is ToolCallStatus.SUCCEEDED
    assert done.attempts == 2
    assert done.note == {"job": "job-1", "amount": amount}
    assert (await ledger.list_calls())[0].note == done.note
    # Once recorded, the outcome is replayed: no poll, no start.
    assert await payout.invoke(ledger, key=key, amount=amount) == "job-1 paid"
    assert len(jobs.polled) == 2


async def test_a_call_taken_over_without_a_note_leaves_its_outcome_unknown(
    ledger: Ledger,
) -> None:
    started = asyncio.Event()
    runs: list[int] = []

    @tool(side_effect=True, rerun_if_unknown=True)
    async def transfer(call: ToolCall, amount: int) -> str:
        runs.append(call.attempt)
        if await call.noted() is None and call.attempt > 1:
            raise ToolOutcomeUnknown(str(call.key), call.tool, None)
        started.set()
        await asyncio.Event().wait()  # stopped before it could note anything
        return "never"

    key = f"transfer-{random.randrange(10**9)}"
    first = asyncio.create_task(transfer.invoke(ledger, key=key, amount=5))
    await started.wait()
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    with pytest.raises(ToolOutcomeUnknown, match="transfer"):
        await transfer.invoke(ledger, key=key, amount=5)
    entry = await ledger.get(key)
    assert entry is not None
    assert entry.status is ToolCallStatus.UNKNOWN  # not a recorded failure: a person decides
    assert entry.note is None
    assert runs == [1, 2]


async def test_a_note_is_refused_once_the_claim_is_someone_elses(ledger: Ledger) -> None:
    taken = asyncio.Event()
    kept: list[bool] = []

    @tool(side_effect=True)
    async def ship(call: ToolCall, parcel: str) -> str:
        assert call.ledger is ledger
        await ledger.update(
            str(call.key),
            {"owner": "elsewhere:1:x"},
            statuses=(ToolCallStatus.IN_PROGRESS,),
        )
        taken.set()
        kept.append(await call.note({"parcel": parcel}))
        with pytest.raises(ConfigurationError, match="not JSON"):
            await call.note({"parcel": {1, 2}})  # type: ignore[dict-item]
        return "shipped"

    key = f"ship-{random.randrange(10**9)}"
    await ship.invoke(ledger, key=key, parcel="p-1")
    assert kept == [False]
    entry = await ledger.get(key)
    assert entry is not None
    assert entry.note is None


async def test_a_tool_without_side_effects_has_no_claim_to_note_on() -> None:
    @tool
    async def look(call: ToolCall, what: str) -> str:
        with pytest.raises(ConfigurationError, match="no side effects"):
            await call.note({"what": what})
        with pytest.raises(ConfigurationError, match="side_effect=True"):
            await call.noted()
        return what

    assert await look.invoke(None, what="x") == "x"
