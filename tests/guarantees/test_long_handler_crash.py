"""A run killed after a snapshot taken inside a long handler resumes it exactly once.

``long_handler_workflow.py`` runs in a child process: its only handler charges a card through
a side-effecting tool, then awaits a long model call. A snapshot is taken while the handler
awaits; it records the state from before the handler, with the order in flight. The child is
killed with SIGKILL right after the snapshot is stored, and the run is resumed in a new child.
The resumed run hands the order to the handler again, exactly once; the charge is not made
again (the ledger gives the handler the recorded outcome), and the receipt arrives once.
"""

from __future__ import annotations

import contextlib
import json
import signal
import sqlite3
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from postgres_db import postgres_url_or_skip

from agentsnap import RunStatus, SnapshotStatus
from agentsnap.store.sql import SqlStore
from agentsnap.testing import cut_problems

WORKFLOW = Path(__file__).with_name("long_handler_workflow.py")
TIMEOUT = 120


def child(url: str, service: Path, run_id: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(WORKFLOW), url, str(service), run_id, *args],
        stdout=subprocess.PIPE,
        text=True,
    )


def wait_for(process: subprocess.Popen[str], prefix: str) -> str:
    assert process.stdout is not None
    for line in process.stdout:
        if line.startswith(prefix):
            return line.strip()
    process.wait(TIMEOUT)
    raise AssertionError(f"the child exited ({process.returncode}) before printing {prefix}")


def executions(service: Path) -> list[tuple[int, str]]:
    with contextlib.closing(sqlite3.connect(service)) as conn:
        return [(int(p), str(k)) for p, k in conn.execute("SELECT pid, key FROM executions")]


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'agentsnap.db'}"
    return postgres_url_or_skip()


async def test_a_snapshot_inside_a_handler_survives_a_kill_and_replays_it_once(
    url: str, tmp_path: Path
) -> None:
    service = tmp_path / "service.db"
    run_id = f"long-{uuid.uuid4().hex[:8]}"
    with child(url, service, run_id) as first:
        try:
            wait_for(first, "CHARGED")
            snapshot_id = wait_for(first, "SNAPSHOT").split()[1]
            first.send_signal(signal.SIGKILL)
        finally:
            first.kill()
            first.wait(TIMEOUT)
    assert len(executions(service)) == 1

    store = SqlStore(url)
    try:
        cut = await store.load_snapshot(snapshot_id)
    finally:
        await store.close()
    assert cut.status is SnapshotStatus.COMPLETE
    assert cut_problems(cut) == []
    assert cut.agents["payer"].state["paid"] == []  # taken inside the handler
    assert [m.payload for m in cut.in_flight("$env", "payer")] == [{"order": "o-1", "amount": 42}]

    with child(url, service, run_id, "--resume") as second:
        try:
            line = wait_for(second, '{"result"')
            assert second.wait(TIMEOUT) == 0
        finally:
            second.kill()
    result = json.loads(line)["result"]
    assert result["resumed_from"] == snapshot_id
    assert result["starts"] == 1  # the handler ran once more, not twice
    assert result["paid"] == ["o-1"]
    assert result["receipts"] == [json.dumps({"charged": 42, "order": "o-1"}, sort_keys=True)]
    # The charge ran once, in the first process: the resumed handler got its recorded outcome.
    assert len(executions(service)) == 1
    with contextlib.closing(sqlite3.connect(service)) as conn:
        assert conn.execute("SELECT amount FROM charges").fetchall() == [(42,)]

    store = SqlStore(url)
    try:
        run = await store.get_run(run_id)
        problems = [
            problem
            for s in await store.list_snapshots(run_id)
            if s.status is SnapshotStatus.COMPLETE
            for problem in cut_problems(s)
        ]
    finally:
        await store.close()
    assert run.status is RunStatus.SUCCEEDED
    assert problems == []
