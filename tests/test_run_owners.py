"""Who owned a run, when: a run killed (SIGKILL) and resumed twice in quick succession shows
both resumes, each with its owner, and both crashes, in the web inspector's incidents and in
``agentsnap owners``; a run stopped cleanly and resumed shows a resume and no crash. On
SQLite and on PostgreSQL, each command in a process of its own, with ``payroll_app``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import signal
import subprocess
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_run_command import DEADLINE, Payroll, killed_on_exit, wait_until

from agentsnap.store.sql import SqlStore
from agentsnap.ui.server import create_app

APP = "payroll_app:make_app"


@pytest.fixture(
    params=[
        pytest.param("sqlite", id="sqlite"),
        pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
    ]
)
def payroll(request: pytest.FixtureRequest, tmp_path: Path) -> Payroll:
    """A payroll whose payer holds after each payment while ``tmp/hold`` exists."""
    made = Payroll(tmp_path)
    if request.param == "postgres":
        made.db = request.getfixturevalue("postgres_url")
    hold = tmp_path / "hold"
    hold.touch()
    made.env["PAYROLL_HOLD"] = str(hold)
    return made


def pid_of(owner: str) -> int:
    return int(owner.split(":")[-2])


def kill_when_paid(payroll: Payroll, process: subprocess.Popen[str], lines: int) -> None:
    """SIGKILL ``process`` once the progress file has ``lines`` lines (it holds then)."""
    with killed_on_exit(process):
        wait_until(lambda: payroll.progress_lines() >= lines, f"payment line {lines}", process)
        process.send_signal(signal.SIGKILL)
        process.wait(DEADLINE)


async def incidents(payroll: Payroll, run_id: str) -> dict[str, Any]:
    store = SqlStore(payroll.db, create=False)
    try:
        app = create_app(store)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://ui") as client:
            body: dict[str, Any] = (await client.get(f"/api/runs/{run_id}/incidents")).json()
            return body
    finally:
        await store.close()


def test_a_run_killed_and_resumed_twice_at_once_shows_both_resumes_and_crashes(
    payroll: Payroll,
) -> None:
    run_id = uuid.uuid4().hex
    first = payroll.start(
        "run", "--app", APP, "--input", json.dumps({"employees": 6}), "--run-id", run_id
    )
    kill_when_paid(payroll, first, 1)
    # Resumed at once, and killed again as soon as it re-did its payment: no silence.
    second = payroll.start("resume", run_id, "--app", APP)
    kill_when_paid(payroll, second, 2)
    (payroll.tmp / "hold").unlink()
    done = payroll.run("resume", run_id, "--app", APP)
    assert done.returncode == 0, done.stderr

    owners = payroll.json("owners", run_id)
    assert [o["token"] for o in owners] == [1, 2, 3]
    assert [pid_of(o["owner"]) for o in owners[:2]] == [first.pid, second.pid]
    assert [o["ended"] for o in owners] == ["crashed", "crashed", "released"]
    for before, after in itertools.pairwise(owners):
        assert before["ended_at"] == after["acquired_at"], "ended when the next took over"
    text = payroll.read("owners", run_id, "--utc", "--wide")
    assert text.returncode == 0, text.stderr
    assert text.stdout.count("crashed") == 2
    assert text.stdout.count("released") == 1
    for process in (first, second):
        assert f":{process.pid}:" in text.stdout

    body = asyncio.run(incidents(payroll, run_id))
    assert body["history"] is True
    assert body["owner_changes"] == 2
    resumes = body["resumes"]
    assert [r["owner"] for r in resumes] == [o["owner"] for o in owners[1:]]
    assert [r["token"] for r in resumes] == [2, 3]
    assert [r["crashed"] for r in resumes] == [True, True]
    for resume, owner in zip(resumes, owners[1:], strict=True):
        assert resume["at_us"] == body["owners"][owner["token"] - 1]["acquired_us"]
        assert resume["stopped_us"] is not None
        assert resume["stopped_us"] <= resume["at_us"]
    assert resumes[0]["at_us"] <= resumes[1]["stopped_us"] <= resumes[1]["at_us"], (
        "the second owner stopped between its resume and the third's"
    )
    crashes = body["crashes"]
    assert [(c["token"], c["by"]) for c in crashes] == [
        (1, owners[1]["owner"]),
        (2, owners[2]["owner"]),
    ]


def test_a_run_stopped_cleanly_and_resumed_shows_a_resume_and_no_crash(
    payroll: Payroll,
) -> None:
    run_id = uuid.uuid4().hex
    with killed_on_exit(
        payroll.start(
            "run", "--app", APP, "--input", json.dumps({"employees": 4}), "--run-id", run_id
        )
    ) as running:
        wait_until(lambda: payroll.progress_lines() >= 1, "a payment", running)
        asked = payroll.read("cancel", run_id, "--reason", "stop for now")
        assert asked.returncode == 0, asked.stderr
        running.communicate(timeout=DEADLINE)
        assert running.returncode == 1
    (payroll.tmp / "hold").unlink()
    done = payroll.run("resume", run_id, "--app", APP)
    assert done.returncode == 0, done.stderr

    owners = payroll.json("owners", run_id)
    assert [o["ended"] for o in owners] == ["released", "released"]
    assert owners[0]["ended_at"] < owners[1]["acquired_at"]
    body = asyncio.run(incidents(payroll, run_id))
    assert body["crashes"] == []
    (resume,) = body["resumes"]
    assert resume["crashed"] is False
    assert resume["owner"] == owners[1]["owner"]
    assert resume["stopped_us"] == body["owners"][0]["ended_us"], "stopped at its release"
