"""``agentsnap run``, ``resume``, ``cancel``, ``events`` and a failed run's tracebacks, as a user
types them: each command in a process of its own, on an SQLite file, with ``payroll_app``.

The payroll pays each employee through a side-effecting tool that a payment service
deduplicates by idempotency key; a run killed with SIGKILL at a random payment and resumed
from the command line must pay every employee exactly once (one key each), and its auditor
must add every payment up once.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from agentsnap.cli import main

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
DEADLINE = 120.0
"""Longest wait, in seconds, for a process to get somewhere (a slow, loaded machine)."""
EMPLOYEES = int(os.environ.get("AGENTSNAP_RUN_CLI_EMPLOYEES", "12"))
"""Employees of each payroll; the nightly size sets ``AGENTSNAP_RUN_CLI_EMPLOYEES``."""


class Payroll:
    """A database, a payment service and the environment the commands run with."""

    def __init__(self, tmp: Path, delay: float = 0.01) -> None:
        self.db = f"sqlite:///{tmp / 'runs.db'}"
        self.service = tmp / "service.db"
        self.progress = tmp / "progress.txt"
        self.tmp = tmp
        self.env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT), str(TESTS)]),
            "PAYROLL_SERVICE": str(self.service),
            "PAYROLL_PROGRESS": str(self.progress),
            "PAYROLL_DELAY": str(delay),
            "NO_COLOR": "1",
        }

    def command(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "agentsnap", *args, "--db", self.db]

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.command(*args),
            cwd=self.tmp,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=DEADLINE,
            check=False,
        )

    def start(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            self.command(*args),
            cwd=self.tmp,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def read(self, *args: str) -> subprocess.CompletedProcess[str]:
        """A command run in this process (the commands that only read need no process)."""
        result = CliRunner(env={"NO_COLOR": "1"}).invoke(main, [*args, "--db", self.db])
        return subprocess.CompletedProcess(
            args, result.exit_code, stdout=result.stdout, stderr=result.stderr
        )

    def paid(self) -> list[tuple[str, str]]:
        """``(key, employee)`` of each payment the service recorded."""
        if not self.service.exists():
            return []
        with contextlib.closing(sqlite3.connect(self.service)) as conn:
            return list(conn.execute("SELECT key, employee FROM payments ORDER BY employee"))

    def progress_lines(self) -> int:
        return len(self.progress.read_text().splitlines()) if self.progress.exists() else 0

    def json(self, *args: str) -> Any:
        done = self.read(*args, "--json")
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)


@pytest.fixture
def payroll(tmp_path: Path) -> Payroll:
    return Payroll(tmp_path)


def wait_until(condition: Any, what: str, process: subprocess.Popen[str] | None = None) -> None:
    deadline = time.monotonic() + DEADLINE
    while not condition():
        if process is not None and process.poll() is not None:
            out, err = process.communicate()
            pytest.fail(f"the run ended before {what}: {process.returncode}\n{out}\n{err}")
        if time.monotonic() > deadline:
            pytest.fail(f"gave up waiting for {what}")
        time.sleep(0.005)


@contextlib.contextmanager
def killed_on_exit(process: subprocess.Popen[str]) -> Iterator[subprocess.Popen[str]]:
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate()


def final_auditor(payroll: Payroll, run_id: str) -> dict[str, Any]:
    snapshots = payroll.json("snapshots", run_id)
    last = [s for s in snapshots if s["status"] == "complete"][-1]
    shown = payroll.json("show", last["id"], "--agent", "auditor")
    state: dict[str, Any] = shown["agents"]["auditor"]["state"]
    return state


def test_a_run_killed_mid_run_is_finished_by_resume_with_each_payment_once(
    payroll: Payroll,
) -> None:
    run_id = uuid.uuid4().hex
    kill_after = random.randint(1, EMPLOYEES - 2)  # a random payment, not the last
    with killed_on_exit(
        payroll.start(
            "run",
            "--app",
            "payroll_app:make_app",
            "--input",
            json.dumps({"employees": EMPLOYEES}),
            "--run-id",
            run_id,
        )
    ) as first:
        assert first.stdout is not None
        assert first.stdout.readline().strip() == f"run {run_id}: started"
        wait_until(lambda: payroll.progress_lines() >= kill_after, "a payment", first)
        first.send_signal(signal.SIGKILL)
        first.wait(DEADLINE)
    assert len(payroll.paid()) < EMPLOYEES, "the kill came after the run's last payment"

    done = payroll.run("resume", run_id[:10], "--app", "payroll_app:make_app")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[0].startswith("resumed from snapshot ")
    assert done.stdout.splitlines()[-1] == f"run {run_id}: succeeded"

    paid = payroll.paid()
    assert sorted(employee for _, employee in paid) == sorted(f"e{i}" for i in range(EMPLOYEES))
    assert len({key for key, _ in paid}) == EMPLOYEES  # one key, one payment per employee
    auditor = final_auditor(payroll, run_id)
    assert (auditor["paid"], auditor["total"]) == (EMPLOYEES, 100 * EMPLOYEES)
    (run,) = payroll.json("runs")
    assert (run["id"], run["status"], run["traceback"]) == (run_id, "succeeded", None)

    again = payroll.read("resume", run_id, "--app", "payroll_app:make_app")
    assert again.returncode != 0
    assert f"run {run_id} already finished (succeeded" in again.stderr


def test_resume_says_what_is_wrong(payroll: Payroll) -> None:
    done = payroll.run("run", "--app", "payroll_app:make_app", "--input", '{"employees": 1}')
    assert done.returncode == 0, done.stderr

    unknown = payroll.read("resume", "f" * 32, "--app", "payroll_app:make_app")
    assert unknown.returncode != 0
    assert "no run" in unknown.stderr.lower()
    assert "Traceback" not in unknown.stderr

    for app, says in [
        ("payroll_app", "is not module:factory"),
        ("no_such_module:make_app", "cannot import the app's module 'no_such_module'"),
        ("payroll_app:nothing", "has no factory 'nothing'"),
    ]:
        bad = payroll.read("run", "--app", app, "--input", "{}")
        assert bad.returncode == 2, bad.stderr
        assert says in bad.stderr
        assert "--app" in bad.stderr

    wrong_input = payroll.read("run", "--app", "payroll_app:make_app", "--input", "{oops")
    assert wrong_input.returncode == 2
    assert "--input is not JSON" in wrong_input.stderr
    wrong_agent = payroll.read(
        "run", "--app", "payroll_app:make_app", "--input", "{}", "--to", "boss"
    )
    assert wrong_agent.returncode == 1
    assert "'boss', which is not an agent of the app" in wrong_agent.stderr


def test_cancel_stops_a_running_process_and_resume_finishes_the_run(payroll: Payroll) -> None:
    hold = payroll.tmp / "hold"
    hold.touch()  # the payer waits after its first payment, until the run is cancelled
    payroll.env["PAYROLL_HOLD"] = str(hold)
    run_id = uuid.uuid4().hex
    with killed_on_exit(
        payroll.start(
            "run",
            "--app",
            "payroll_app:make_app",
            "--input",
            json.dumps({"employees": 40}),
            "--run-id",
            run_id,
        )
    ) as running:
        wait_until(lambda: payroll.progress_lines() >= 1, "a payment", running)

        owned = payroll.read("resume", run_id, "--app", "payroll_app:make_app")
        assert owned.returncode != 0
        assert f"run {run_id} is owned by" in owned.stderr

        asked = payroll.read("cancel", run_id, "--reason", "payday moved")
        assert asked.returncode == 0, asked.stderr
        assert "cancel requested" in asked.stdout

        out, err = running.communicate(timeout=DEADLINE)
        assert running.returncode == 1, err
        assert f"run {run_id}: cancelled: " in out
        assert "payday moved" in out
    (run,) = payroll.json("runs", "--status", "cancelled")
    assert run["id"] == run_id
    assert "payday moved" in run["status_reason"]
    assert [employee for _, employee in payroll.paid()] == ["e0"]

    cancelled_again = payroll.read("cancel", run_id)
    assert cancelled_again.returncode != 0
    assert "has ended (cancelled)" in cancelled_again.stderr

    hold.unlink()
    done = payroll.run("resume", run_id, "--app", "payroll_app:make_app")
    assert done.returncode == 0, done.stderr
    paid = payroll.paid()
    assert sorted(employee for _, employee in paid) == sorted(f"e{i}" for i in range(40))
    assert len({key for key, _ in paid}) == 40
    (run,) = payroll.json("runs")
    assert (run["status"], run["cancel_requested"]) == ("succeeded", None)


def test_a_failed_run_keeps_its_tracebacks(payroll: Payroll) -> None:
    done = payroll.run(
        "run", "--app", "payroll_app:make_app", "--input", '{"names": ["ann", "boom", "cy"]}'
    )
    assert done.returncode == 1
    first = done.stdout.splitlines()[0].split(":")[0]
    run_id = first.removeprefix("run ")
    assert f"run {run_id}: failed: HandlerFailed: agent 'payer'" in done.stdout
    assert "KeyError: 'boom'" in done.stderr  # the chain, on standard error

    (row,) = payroll.json("runs", "--status", "failed")
    traceback = row["traceback"]
    assert traceback.index("KeyError: 'boom'") < traceback.index("ValueError: the bank refused")
    assert "The above exception was the direct cause of the following exception" in traceback
    assert "HandlerFailed: agent 'payer' failed while handling message clerk>payer#2" in traceback

    listed = payroll.read("runs", "--status", "failed")
    why = next(line for line in listed.stdout.splitlines() if "why:" in line)
    assert "(at payroll_app.py:" in why
    assert "in pay)" in why
    assert "KeyError" in payroll.read("runs", "--traceback").stdout

    snapshots = payroll.json("snapshots", run_id)
    shown = payroll.read("show", snapshots[0]["id"])
    assert "run failed: HandlerFailed" in shown.stdout
    assert "KeyError: 'boom'" in shown.stdout


def test_events_lists_each_handler_execution(payroll: Payroll) -> None:
    done = payroll.run("run", "--app", "payroll_app:make_app", "--input", '{"employees": 3}')
    assert done.returncode == 0, done.stderr
    run_id = done.stdout.split()[1].rstrip(":")

    rows = payroll.json("events", run_id)
    assert [r["agent"] for r in rows[:1]] == ["clerk"]
    clerk = rows[0]
    assert clerk["message"] == "$env>clerk#1"
    assert [(m["to"], m["kind"]) for m in clerk["sent"]] == [("payer", "pay")] * 3
    payers = [r for r in rows if r["agent"] == "payer"]
    assert [r["message"] for r in payers] == [f"clerk>payer#{i}" for i in (1, 2, 3)]
    for row in payers:
        ((call,),) = [row["tool_calls"]]
        assert (call["tool"], call["status"]) == ("pay", "succeeded")
        assert [m["to"] for m in row["sent"]] == ["auditor"]
        assert row["duration_ms"] is not None
        assert row["timeline"] == 0
    assert len([r for r in rows if r["agent"] == "auditor"]) == 3
    times = [r["started_at"] for r in rows]
    assert times == sorted(times)

    one = payroll.json("events", run_id, "--agent", "payer", "--grep", '"E1"')
    assert [r["message"] for r in one] == ["clerk>payer#2"]
    assert payroll.json("events", run_id, "--kind", "paid") == [
        r for r in rows if r["agent"] == "auditor"
    ]
    table = payroll.read("events", run_id)
    assert table.returncode == 0
    assert table.stdout.splitlines()[0].split()[:4] == ["#", "STARTED", "AGENT", "TOOK"]
    assert "pay succeeded" in table.stdout
