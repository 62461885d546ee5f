"""Run leases between processes and between store objects, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentsnap import OwnershipLost, RunInfo, RunStatus
from agentsnap.ownership import RunOwnership
from agentsnap.store import migrate
from agentsnap.store.sql import SqlStore
from agentsnap.store.sql_ledger import SqlLedger

from .test_contract import make_snapshot
from .test_contract_ownership import replay_segment

WORKER = Path(__file__).with_name("lease_worker.py")
RUN_ID = "1ea5e" * 6 + "00"


@pytest.fixture
def url(empty_db: str) -> str:
    """An empty SQLite or PostgreSQL database."""
    return empty_db


async def create_run(url: str, run_id: str = RUN_ID) -> None:
    store = SqlStore(url)
    try:
        await store.create_run(RunInfo(id=run_id))
    finally:
        await store.close()


@pytest.fixture
def workers() -> Iterator[list[subprocess.Popen[str]]]:
    """Started workers; any left running are killed after the test."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for worker in started:
        if worker.poll() is None:
            worker.kill()
        worker.wait()
        for stream in (worker.stdin, worker.stdout, worker.stderr):
            if stream is not None:
                stream.close()


def start(workers: list[subprocess.Popen[str]], count: int, *args: str) -> None:
    """Start ``count`` workers, wait until each is ready, then let them all go at once."""
    workers.extend(
        subprocess.Popen(
            [sys.executable, str(WORKER), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(count)
    )
    for worker in workers:
        assert worker.stdout is not None
        line = worker.stdout.readline().strip()
        assert line == "ready", worker.stderr.read() if worker.stderr else line
    for worker in workers:
        assert worker.stdin is not None
        worker.stdin.write("go\n")
        worker.stdin.flush()


def report(worker: subprocess.Popen[str]) -> Any:
    assert worker.stdout is not None
    line = worker.stdout.readline()
    assert line, worker.stderr.read() if worker.stderr else "no report"
    return json.loads(line)


def test_two_processes_racing_for_a_run_exactly_one_acquires_it(
    url: str, workers: list[subprocess.Popen[str]]
) -> None:
    migrate.upgrade(url)
    asyncio.run(create_run(url))
    start(workers, 2, "acquire", url, RUN_ID)

    # Both report while both are alive: the loser sees a live owner, not a gone one.
    reports = [report(worker) for worker in workers]
    for worker in workers:
        assert worker.stdin is not None
        worker.stdin.close()
    for worker in workers:
        assert worker.wait(timeout=120) == 0, worker.stderr.read() if worker.stderr else ""

    winners = [r for r in reports if "token" in r]
    losers = [r for r in reports if "owned_by" in r]
    assert len(winners) == 1, reports
    assert len(losers) == 1, reports
    assert winners[0]["token"] == 1
    assert losers[0]["owned_by"] == winners[0]["owner"]


def test_take_lease_is_compare_and_set_across_processes(
    url: str, workers: list[subprocess.Popen[str]]
) -> None:
    migrate.upgrade(url)
    asyncio.run(create_run(url))
    start(workers, 2, "cas", url, RUN_ID)
    won = [token for worker in workers for token in report(worker)]
    for worker in workers:
        assert worker.wait(timeout=120) == 0

    async def final() -> int:
        store = SqlStore(url)
        try:
            lease = await store.get_lease(RUN_ID)
            assert lease is not None
            return lease.token
        finally:
            await store.close()

    # Every token was won exactly once: no two takers ever replaced the same lease.
    assert sorted(won) == list(range(1, len(won) + 1))
    assert asyncio.run(final()) == len(won)
    assert len(won) > 1


async def test_the_old_owners_store_and_ledger_are_refused_after_a_takeover(url: str) -> None:
    old_store, new_store = SqlStore(url), SqlStore(url)
    old_ledger, new_ledger = SqlLedger(url), SqlLedger(url)
    try:
        await old_store.create_run(RunInfo(id=RUN_ID))
        # The old owner's lease lapses at once (as if its process had been suspended).
        old = RunOwnership(old_store, RUN_ID, ttl=0.001)
        await old.acquire()
        old.fence_ledger(old_ledger)
        await old_store.save_snapshot(make_snapshot(RUN_ID, seq=1))

        new = RunOwnership(new_store, RUN_ID, owner="elsewhere.example:7:0123456789ab")
        taken = await new.acquire(wait=60)
        new.fence_ledger(new_ledger)
        assert taken.token == 2

        with pytest.raises(OwnershipLost):
            await old_store.save_snapshot(make_snapshot(RUN_ID, seq=2))
        with pytest.raises(OwnershipLost):
            await old_store.append_replay(RUN_ID, replay_segment(0, ("a", "b", 1)))
        with pytest.raises(OwnershipLost):
            await old_store.finish_run(RUN_ID, RunStatus.FAILED, taken.expires_at)
        assert [s.seq for s in await new_store.list_snapshots(RUN_ID)] == [1]
        assert await new_store.load_replay(RUN_ID) == []

        # The new owner writes.
        await new_store.save_snapshot(make_snapshot(RUN_ID, seq=2))
        await new_store.append_replay(RUN_ID, replay_segment(1, ("a", "b", 1)))
        await new_store.finish_run(RUN_ID, RunStatus.SUCCEEDED, taken.expires_at)
        assert (await old_store.get_run(RUN_ID)).status is RunStatus.SUCCEEDED
    finally:
        for closable in (old_store, new_store, old_ledger, new_ledger):
            await closable.close()
