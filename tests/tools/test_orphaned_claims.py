"""Claims left in progress by an owner that stopped are reported, and marked, unknown.

An owner stopped when its process (on this host) is gone, when the claim's own lease
expired, or when the run's lease expired or passed to another owner. The read side
(``agentsnap tools [RUN]``) reports such a claim as unknown without writing;
``mark_orphaned`` (called by ``reconcile`` and on resume) records it so.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner
from owners import dead_owner

from agentsnap import RunInfo, RunLease, ToolCallStatus
from agentsnap.cli import main as cli
from agentsnap.inspect import ledger_calls
from agentsnap.ledger import LedgerEntry, is_orphaned, mark_orphaned, orphaned, owner_id
from agentsnap.ownership import RunOwnership
from agentsnap.records import utcnow
from agentsnap.store import MemoryStore, migrate
from agentsnap.store.ledger import MemoryLedger
from agentsnap.store.sql import SqlStore
from agentsnap.store.sql_ledger import SqlLedger

WORKER = Path(__file__).parent.parent / "store" / "lease_worker.py"
RUN = "0f" * 16
NOW = datetime(2025, 1, 1, 12, tzinfo=utcnow().tzinfo)
ELSEWHERE = "elsewhere.example:1:0123456789ab"


def entry(
    owner: str | None = None,
    *,
    lease: timedelta = timedelta(minutes=5),
    status: ToolCallStatus = ToolCallStatus.IN_PROGRESS,
    key: str = "k1",
    at: datetime = NOW,
) -> LedgerEntry:
    return LedgerEntry(
        key=key,
        tool="charge",
        fingerprint="f",
        arguments={},
        status=status,
        created_at=at,
        updated_at=at,
        run_id=RUN,
        owner=owner_id() if owner is None else owner,
        lease_until=at + lease,
    )


def run_lease(owner: str | None = None, expires_in: timedelta = timedelta(minutes=5)) -> RunLease:
    return RunLease(
        run_id=RUN,
        owner=owner_id() if owner is None else owner,
        token=1,
        expires_at=NOW + expires_in,
    )


# -- the rule -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("claim", "lease", "expected"),
    [
        pytest.param(entry(), run_lease(), False, id="live-owner-holds-the-run"),
        pytest.param(entry(), None, False, id="live-owner-run-without-lease"),
        pytest.param(entry(ELSEWHERE), run_lease(ELSEWHERE), False, id="other-host-holds-it"),
        pytest.param(entry(ELSEWHERE), None, False, id="other-host-lease-unknown"),
        pytest.param(entry(lease=timedelta(0)), run_lease(), True, id="claim-lease-expired"),
        pytest.param(
            entry(), run_lease(expires_in=timedelta(seconds=-1)), True, id="run-lease-expired"
        ),
        pytest.param(entry(), run_lease(ELSEWHERE), True, id="run-taken-over"),
        pytest.param(entry(ELSEWHERE), run_lease(), True, id="claim-of-a-former-owner"),
        pytest.param(
            entry(status=ToolCallStatus.SUCCEEDED, lease=timedelta(0)),
            run_lease(ELSEWHERE),
            False,
            id="outcome-recorded",
        ),
        pytest.param(
            entry(status=ToolCallStatus.UNKNOWN), run_lease(ELSEWHERE), False, id="already-unknown"
        ),
    ],
)
def test_a_claim_is_orphaned_when_its_owner_stopped(
    claim: LedgerEntry, lease: RunLease | None, expected: bool
) -> None:
    assert is_orphaned(claim, lease, NOW) is expected


def test_a_claim_of_a_dead_process_is_orphaned_at_once() -> None:
    gone = dead_owner()
    assert is_orphaned(entry(gone), run_lease(gone), NOW)
    assert is_orphaned(entry(gone), None, NOW)


async def test_mark_orphaned_records_them_unknown_and_leaves_the_others() -> None:
    store = MemoryStore()
    ledger = MemoryLedger()
    await store.create_run(RunInfo(id=RUN))
    await store.take_lease(RUN, ELSEWHERE, utcnow() + timedelta(hours=1), replacing=None)
    now = utcnow()
    for claim in (
        entry(key="mine", at=now),  # made by this process, whose run another owner holds now
        entry(ELSEWHERE, key="theirs", at=now),  # made by the run's owner
        entry(status=ToolCallStatus.SUCCEEDED, key="done", at=now),
    ):
        assert await ledger.claim(claim) is None

    assert [e.key for e in await orphaned(ledger, store, RUN)] == ["mine"]
    marked = await mark_orphaned(ledger, store, RUN)

    assert [(e.key, e.status) for e in marked] == [("mine", ToolCallStatus.UNKNOWN)]
    statuses = {e.key: e.status for e in await ledger.list_calls(RUN)}
    assert statuses == {
        "mine": ToolCallStatus.UNKNOWN,
        "theirs": ToolCallStatus.IN_PROGRESS,
        "done": ToolCallStatus.SUCCEEDED,
    }
    assert await mark_orphaned(ledger, store, RUN) == []


# -- a claim whose process was killed -------------------------------------------------------


def cli_out(*args: str) -> str:
    result = CliRunner().invoke(cli, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def test_a_killed_owners_claim_is_unknown_at_once_and_its_run_interrupted(db_url: str) -> None:
    migrate.upgrade(db_url)

    async def create() -> None:
        store = SqlStore(db_url)
        try:
            await store.create_run(RunInfo(id=RUN))
        finally:
            await store.close()

    asyncio.run(create())
    with subprocess.Popen(
        [sys.executable, str(WORKER), "claim", db_url, RUN],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as worker:
        out, err = worker.communicate("go\n", timeout=120)
    assert worker.returncode == -signal.SIGKILL, err
    assert out.split() == ["ready", "claimed"], err

    # Read side: reported unknown, at once (no lease had to expire), nothing written.
    _, listed, _ = cli_out("tools", "--status", "unknown", "--db", db_url).splitlines()
    assert listed.split()[:4] == ["!", "orphan-1", "unknown", "charge"]
    assert cli_out("tools", "--status", "in_progress", "--json", "--db", db_url) == "[]\n"
    (row,) = json.loads(cli_out("tools", RUN, "--json", "--db", db_url))
    assert (row["key"], row["status"], row["unknown"]) == ("orphan-1", "unknown", True)
    (run,) = json.loads(cli_out("runs", "--json", "--db", db_url))
    assert (run["id"], run["status"]) == (RUN, "interrupted")

    async def resume() -> None:
        store = SqlStore(db_url)
        ledger = SqlLedger(db_url)
        try:
            (raw,) = await ledger.list_calls(RUN)
            assert raw.status is ToolCallStatus.IN_PROGRESS
            (shown,) = await ledger_calls(store, RUN)
            assert shown.status is ToolCallStatus.UNKNOWN

            # A new owner takes the run over at once, and marks the claim unknown.
            ownership = RunOwnership(store, RUN)
            lease = await ownership.acquire()
            ownership.fence_ledger(ledger)
            assert lease.token == 2
            marked = await mark_orphaned(ledger, store, RUN)
            assert [(e.key, e.status) for e in marked] == [("orphan-1", ToolCallStatus.UNKNOWN)]
            (raw,) = await ledger.list_calls(RUN)
            assert raw.status is ToolCallStatus.UNKNOWN
            assert (await store.get_run(RUN)).status == "running"
            await ownership.release()
        finally:
            await ledger.close()
            await store.close()

    asyncio.run(resume())
