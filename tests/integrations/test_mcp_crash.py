"""MCP tools across a SIGKILL of the agentsnap program and ``resume()``.

The program (``mcp_crash_program.py``) starts the bank server over stdio, and its agent pays
through it with a memo a sampled model words differently every time it is asked. The test
kills the program with SIGKILL, resumes the run in a new process (which starts a new server
process on the same bank), and counts in the bank's own log how often the tool was called.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PROGRAM = "tests.integrations.mcp_crash_program"
TIMEOUT = 60


def start(url: str, bank: Path, run_id: str, tool: str, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-m", PROGRAM, url, str(bank), run_id, tool, *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(process: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = process.communicate(timeout=TIMEOUT)
    assert process.returncode == 0, err[-3000:]
    report: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return report


def kill(process: subprocess.Popen[str]) -> None:
    process.send_signal(signal.SIGKILL)
    process.communicate(timeout=TIMEOUT)  # and close its pipes
    assert process.returncode == -signal.SIGKILL


def rows(path: Path, query: str, *args: Any) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(path, timeout=30)
    try:
        return conn.execute(query, args).fetchall()
    finally:
        conn.close()


def wait_until(check: Any, what: str) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_an_effect_happens_once_across_a_kill_and_resume(tmp_path: Path) -> None:
    url, bank = f"sqlite:///{tmp_path / 'agentsnap.db'}", tmp_path / "bank.db"
    first = start(url, bank, "pay-1", "transfer", "--hang")
    assert first.stdout is not None
    line = first.stdout.readline()
    assert line.strip() == "EFFECT_DONE", first.stderr.read() if first.stderr else ""
    kill(first)
    resumed = finish(start(url, bank, "pay-1", "transfer", "--resume"))
    assert resumed["status"] == "replayed"
    assert resumed["result"]["transfer_id"] == 1
    made = rows(bank, "SELECT key, attempt FROM calls WHERE tool = 'transfer'")
    assert len(made) == 1, made
    assert rows(bank, "SELECT COUNT(*) FROM transfers") == [(1,)]


def test_a_resumed_task_call_polls_the_task_instead_of_calling_again(tmp_path: Path) -> None:
    db = tmp_path / "agentsnap.db"
    url, bank = f"sqlite:///{db}", tmp_path / "bank.db"
    first = start(url, bank, "wire-1", "wire", "--task-seconds", "3")

    def task_recorded() -> bool:
        if not db.exists():
            return False
        try:
            found = rows(db, "SELECT note FROM agentsnap_tool_calls WHERE tool = 'wire'")
        except sqlite3.OperationalError:  # the tables are not there yet
            return False
        return any(row[0] and "mcp_task" in str(row[0]) for row in found)

    wait_until(task_recorded, "the task id noted in the claim")
    kill(first)  # between the task's start and its end
    (task_id,) = rows(bank, "SELECT task_id FROM tasks")[0]
    assert rows(bank, "SELECT COUNT(*) FROM polls WHERE method = 'tasks/result'") == [(0,)]

    resumed = finish(start(url, bank, "wire-1", "wire", "--resume", "--task-seconds", "3"))
    assert resumed["status"] == "ok"
    assert resumed["result"] == {"transfer_id": 1, "to": "bob", "amount": 25, "repeated": False}
    assert len(rows(bank, "SELECT * FROM calls WHERE tool = 'wire'")) == 1
    fetched = rows(bank, "SELECT task_id FROM polls WHERE method = 'tasks/result'")
    assert fetched == [(task_id,)]
    (status, result, note) = rows(db, "SELECT status, result, note FROM agentsnap_tool_calls")[0]
    assert status == "succeeded"
    assert json.loads(result)["transfer_id"] == 1
    assert json.loads(note) == {"mcp_task": {"taskId": task_id}}
