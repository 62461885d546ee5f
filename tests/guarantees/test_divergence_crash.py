"""A handler that read the clock into a side-effecting call, killed after the effect and
resumed: the call neither runs twice nor passes silently.

``divergence_workflow.py`` runs in a child process: its handler reads the clock, passes the
time to a side-effecting tool with a derived key, and, once the tool returned, waits. The test
kills the child with SIGKILL then, after the effect and before the handler ends, and resumes
the run in a new child, which re-executes the handler on the same timeline with another time:

* with the default tool, the service's table still has the one execution; ``run_until_idle``
  raises ``HandlerFailed`` whose cause is ``EffectDiverged`` naming both times (the same
  failure is in ``runtime.failures``), and the run is stored as failed;
* with ``@tool(on_divergence="recorded")``, the service's table still has the one execution,
  the handler gets the recorded outcome, and the run is stored as succeeded.

On SQLite and PostgreSQL.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agentsnap import RunStatus, SnapshotStatus
from agentsnap.store.sql import SqlStore
from agentsnap.testing import cut_problems

from .test_crash_resume import BACKENDS, DEADLINE, database

WORKFLOW = Path(__file__).with_name("divergence_workflow.py")
ROOT = WORKFLOW.parents[2]
RUN = "d1e5" + "0" * 28


def child(url: str, service: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(WORKFLOW), url, str(service), RUN, *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )


def wait_for(process: subprocess.Popen[str], prefix: str) -> str:
    assert process.stdout is not None
    for line in process.stdout:
        if line.startswith(prefix):
            return line.strip()
    process.wait(DEADLINE)
    raise AssertionError(f"the child exited ({process.returncode}) before printing {prefix}")


def executions(service: Path) -> list[tuple[str, float, int]]:
    with contextlib.closing(sqlite3.connect(service, timeout=60)) as conn:
        rows = conn.execute("SELECT key, at, pid FROM executions").fetchall()
    return [(str(k), float(a), int(p)) for k, a, p in rows]


def killed_after_the_effect(url: str, service: Path, *args: str) -> tuple[str, float, int]:
    """The first run, killed while its handler waits after the effect; the one execution."""
    with child(url, service, *args) as first:
        try:
            wait_for(first, "STAMPED")
            first.send_signal(signal.SIGKILL)
            assert first.wait(DEADLINE) == -signal.SIGKILL
        finally:
            first.kill()
    (execution,) = executions(service)
    assert execution[2] == first.pid
    return execution


def resumed(url: str, service: Path, *args: str) -> dict[str, Any]:
    with child(url, service, "--resume", *args) as second:
        try:
            line = wait_for(second, '{"result"')
            assert second.wait(DEADLINE) == 0
        finally:
            second.kill()
    result: dict[str, Any] = json.loads(line)["result"]
    return result


async def stored(url: str) -> tuple[RunStatus, str | None, list[str]]:
    store = SqlStore(url)
    try:
        run = await store.get_run(RUN)
        problems = [
            f"snapshot {s.seq}: {problem}"
            for s in await store.list_snapshots(RUN)
            if s.status is SnapshotStatus.COMPLETE
            for problem in cut_problems(s)
        ]
    finally:
        await store.close()
    return run.status, run.status_reason, problems


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_resumed_handler_that_read_the_clock_fails_with_effect_diverged(
    backend: str, tmp_path: Path
) -> None:
    url = database(backend, tmp_path)
    service = tmp_path / "service.db"
    key, at, pid = killed_after_the_effect(url, service)

    result = resumed(url, service)
    assert executions(service) == [(key, at, pid)], "the effect ran once"
    raised = result.get("raised")
    assert raised is not None, f"run_until_idle raised nothing: {result}"
    assert raised["agent"] == "stamper"
    assert raised["cause"] == "EffectDiverged", raised
    assert raised["tool"] == "dv_stamp"
    assert raised["key"] == key
    assert raised["recorded"] == {"at": at}
    (now,) = raised["arguments"].values()
    assert now != at, "the re-executed handler read the clock again"
    assert json.dumps(at) in raised["cause_message"], raised["cause_message"]
    assert json.dumps(now) in raised["cause_message"], raised["cause_message"]
    assert result["failures"] == [raised], "runtime.failures holds the same failure"
    assert result["result"] is None, "the handler did not go on with an outcome"
    (call,) = result["tool_calls"]
    assert call["status"] == "error"
    assert "EffectDiverged" in call["error"]

    status, reason, problems = asyncio.run(stored(url))
    assert status is RunStatus.FAILED, (status, reason)
    assert "EffectDiverged" in (reason or ""), reason
    assert problems == []


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_resumed_handler_that_read_the_clock_gets_the_recorded_outcome_when_lenient(
    backend: str, tmp_path: Path
) -> None:
    url = database(backend, tmp_path)
    service = tmp_path / "service.db"
    key, at, pid = killed_after_the_effect(url, service, "--lenient")

    result = resumed(url, service, "--lenient")
    assert executions(service) == [(key, at, pid)], "the effect ran once"
    assert "raised" not in result, result
    assert result["failures"] == []
    assert result["result"] == f"stamped {at!r} in {pid}", "the recorded outcome"
    (call,) = result["tool_calls"]
    assert call["status"] == "replayed", call
    assert call["key"] == key

    status, reason, problems = asyncio.run(stored(url))
    assert status is RunStatus.SUCCEEDED, (status, reason)
    assert problems == []
