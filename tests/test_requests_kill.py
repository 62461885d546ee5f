"""The acceptance of requests to people: SIGKILL while a refund waits, answer with the CLI.

A child process runs a refund agent whose tool needs approval (``refund_run.py``); the test
waits until the approval request is stored, kills the child with SIGKILL, answers the request
with ``agentsnap answer`` while no process runs the run, and resumes the run in a new child:
an approval makes the refund happen exactly once, a denial makes none happen and the agent
gets the reason and issues store credit instead. On the default scheduler, on SQLite and
PostgreSQL.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
CHILD = TESTS / "refund_run.py"


@pytest.fixture
def db(empty_db: str) -> str:
    """An empty database: SQLite, then PostgreSQL."""
    return empty_db


def environment() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(TESTS)])}


def cli(db: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "agentsnap", *args, "--db", db],
        capture_output=True,
        text=True,
        env=environment(),
        timeout=60,
        check=False,
    )
    if check:
        assert done.returncode == 0, done.stderr
    return done


def requests(db: str, run_id: str, *flags: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = json.loads(cli(db, "requests", run_id, "--json", *flags).stdout)
    return found


def start_and_kill_while_waiting(db: str, run_id: str, effects: Path) -> dict[str, Any]:
    """Start the run, wait until its approval request is stored, SIGKILL it; the request."""
    log = effects.with_suffix(".log")
    with log.open("w") as output:
        child = subprocess.Popen(
            [sys.executable, str(CHILD), db, run_id, "start", str(effects)],
            env=environment(),
            stdout=output,
            stderr=output,
        )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert child.poll() is None, log.read_text()
            try:
                found = requests(db, run_id, "--pending")
            except AssertionError:  # the run or its schema is not there yet
                found = []
            if found:
                break
            time.sleep(0.1)
        else:
            raise AssertionError("the refund's approval was never asked")
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    (request,) = found
    return request


def resume(db: str, run_id: str, effects: Path) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, str(CHILD), db, run_id, "resume", str(effects)],
        capture_output=True,
        text=True,
        env=environment(),
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    memory: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return memory


def refunds(effects: Path) -> list[str]:
    return effects.read_text().splitlines() if effects.exists() else []


def test_an_approval_given_while_no_process_runs_is_delivered_on_resume(
    db: str, tmp_path: Path
) -> None:
    run_id, effects = uuid.uuid4().hex, tmp_path / "effects.txt"
    request = start_and_kill_while_waiting(db, run_id, effects)
    assert request["kind"] == "approval"
    assert request["question"]["tool"] == "refund"
    assert request["question"]["arguments"] == {"order": "A-17", "amount": 250}
    assert refunds(effects) == []  # it waited: nothing was claimed, nothing ran
    answered = cli(db, "answer", request["id"], "--approve", "--by", "ann")
    assert "answered (approved)" in answered.stdout
    again = cli(db, "answer", request["id"], "--approve", check=False)
    assert again.returncode == 1
    assert "answered already" in again.stderr
    memory = resume(db, run_id, effects)
    assert memory == {"outcome": "refunded 250 on A-17"}
    (line,) = refunds(effects)  # exactly once
    assert line.startswith("A-17 ")
    (after,) = requests(db, run_id)
    assert after["status"] == "answered"
    assert after["answered_by"] == "ann"


def test_a_denial_given_while_no_process_runs_reaches_the_agent_on_resume(
    db: str, tmp_path: Path
) -> None:
    run_id, effects = uuid.uuid4().hex, tmp_path / "effects.txt"
    request = start_and_kill_while_waiting(db, run_id, effects)
    listed = cli(db, "requests", run_id[:8], "--pending", "--wide")
    assert request["id"] in listed.stdout
    assert "1 request pending" in listed.stdout
    cli(db, "answer", request["id"], "--deny", "--reason", "refunds over 200 need a manager")
    memory = resume(db, run_id, effects)
    assert memory == {
        "denied": "refunds over 200 need a manager",
        "outcome": "credit 250 on A-17",
    }
    assert refunds(effects) == []
    (after,) = requests(db, run_id)
    assert after["status"] == "rejected"


def test_an_answer_that_does_not_fit_is_a_clear_error(db: str, tmp_path: Path) -> None:
    run_id, effects = uuid.uuid4().hex, tmp_path / "effects.txt"
    request = start_and_kill_while_waiting(db, run_id, effects)
    wrong = cli(db, "answer", request["id"], "--json", '"yes"', check=False)
    assert wrong.returncode == 1
    assert "approve (--approve) or deny (--deny)" in wrong.stderr
    unknown = cli(db, "answer", "f" * 24, "--approve", check=False)
    assert unknown.returncode == 1
    assert "no request with id" in unknown.stderr
    both = cli(db, "answer", request["id"], "--approve", "--deny", check=False)
    assert both.returncode == 2
