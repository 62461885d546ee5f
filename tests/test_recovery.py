"""Crash recovery: a run killed with SIGKILL is resumed in a fresh process and ends as if it had
never stopped.

``tests/recovery_workflow.py`` runs a small workflow (jobs round a ring of workers, a tally that
also rejects some results, so the run rolls back too) under a ``SeededScheduler``, on an SQLite
file. It is killed with SIGKILL once a few snapshots are committed, then started again with
``--resume RUN_ID``: it registers the same agents, calls ``Runtime.resume()`` and runs to the
end. Its result must equal that of an uninterrupted run with the same seed.

``Runtime.resume`` restores the agents' states, the channels' counters and the messages in
flight at the newest complete cut, but not input the environment sent after that cut (it was
never stored). The workflow therefore sends all its input right after the run's start snapshot
(snapshot 1, taken before the first input), so every later snapshot holds all of it; the tests
kill the run only after at least two complete snapshots are committed and check that it
resumed from a snapshot numbered 2 or more.
"""

from __future__ import annotations

import contextlib
import json
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

WORKFLOW = Path(__file__).with_name("recovery_workflow.py")
ROOT = WORKFLOW.parents[1]
SEED = 7
DEADLINE = 120.0
"""Longest wait, in seconds, for a child process to get somewhere (a slow, loaded machine)."""


def workflow(db: Path, *args: str) -> list[str]:
    return [sys.executable, str(WORKFLOW), str(db), "--seed", str(SEED), *args]


def finish(db: Path, *args: str) -> dict[str, Any]:
    """Run the workflow to its end and return the result it prints."""
    done = subprocess.run(
        workflow(db, *args),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=DEADLINE,
        check=False,
    )
    assert done.returncode == 0, f"{args}: exit status {done.returncode}\n{done.stderr[-3000:]}"
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def query(db: Path, sql: str) -> list[tuple[Any, ...]]:
    """Rows another process sees committed now (none until the schema exists)."""
    if not db.exists():
        return []
    try:
        with contextlib.closing(sqlite3.connect(f"{db.as_uri()}?mode=ro", uri=True)) as conn:
            return conn.execute(sql).fetchall()
    except sqlite3.OperationalError:
        return []


def complete_seqs(db: Path) -> list[int]:
    rows = query(db, "SELECT seq FROM agentsnap_snapshots WHERE status = 'complete' ORDER BY seq")
    return [seq for (seq,) in rows]


def run_status(db: Path, run_id: str) -> str:
    ((status,),) = query(db, f"SELECT status FROM agentsnap_runs WHERE id = '{run_id}'")
    return str(status)


def tail(path: Path) -> str:
    return path.read_text(errors="replace")[-3000:] or "(nothing)"


def kill(process: subprocess.Popen[bytes]) -> int:
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGKILL)
    return process.wait()


def wait_until(process: subprocess.Popen[bytes], ready: Any, log: Path, what: str) -> None:
    started = time.monotonic()
    while not ready():
        assert process.poll() is None, (
            f"the run exited ({process.returncode}) before {what}\n{tail(log)}"
        )
        assert time.monotonic() - started < DEADLINE, f"no {what} within {DEADLINE}s"
        time.sleep(0.005)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The result of a run of the seed that nothing interrupts."""
    db = tmp_path_factory.mktemp("uninterrupted") / "run.db"
    result = finish(db, "--run-id", "uninterrupted")
    assert result["resumed_from"] is None
    assert result["rollbacks"] > 0, "the workflow is meant to roll back"
    assert result["tally"]["jobs"] == list(range(40))
    return result


def check_resumed(db: Path, run_id: str, uninterrupted: dict[str, Any]) -> None:
    """Resume the killed run in a new process; it must end like the uninterrupted run."""
    assert run_status(db, run_id) == "running", "a killed run is left running"
    committed = complete_seqs(db)
    assert len(committed) >= 2
    resumed = finish(db, "--resume", run_id)
    # It went on from the newest complete snapshot committed before the kill: automatic
    # rollbacks always go back to the newest one, so none of them is abandoned.
    assert resumed["resumed_from"] == committed[-1]
    assert resumed["resumed_from"] >= 2, "resumed from before the input was sent"
    for key in ("dispatched", "handled", "tally"):
        assert resumed[key] == uninterrupted[key], key
    assert run_status(db, run_id) == "succeeded"
    # The snapshots taken before the kill are all still there, the new ones numbered after.
    after = complete_seqs(db)
    assert after[: len(committed)] == committed
    assert all(seq > committed[-1] for seq in after[len(committed) :])


def test_resumed_after_sigkill_half_way_through_a_handler(
    tmp_path: Path, uninterrupted: dict[str, Any]
) -> None:
    db = tmp_path / "run.db"
    out, err = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        process = subprocess.Popen(
            workflow(db, "--run-id", "killed", "--hold-after", "3"),
            cwd=ROOT,
            stdout=stdout,
            stderr=stderr,
        )
        try:
            # A worker changed its state, sent, and now waits forever in its handler.
            wait_until(process, lambda: "HOLDING" in out.read_text(), err, "HOLDING")
        finally:
            returncode = kill(process)
    assert returncode == -signal.SIGKILL
    committed = complete_seqs(db)
    assert len(committed) >= 3
    # The cut it resumes from is from the middle of the run, not its end.
    ((tally,),) = query(
        db,
        "SELECT b.state FROM agentsnap_snapshot_agents a "
        "JOIN agentsnap_state_blobs b ON b.hash = a.state_hash "
        "JOIN agentsnap_snapshots s ON s.id = a.snapshot_id "
        f"WHERE s.seq = {committed[-1]} AND a.agent = 'tally'",
    )
    assert len(json.loads(tally)["jobs"]) < 40
    check_resumed(db, "killed", uninterrupted)


def test_resumed_after_sigkill_at_a_random_moment(
    tmp_path: Path, uninterrupted: dict[str, Any]
) -> None:
    # The moment is drawn from a seeded generator, so a failing case can be replayed.
    delay = random.Random(SEED).uniform(0.0, 0.25)
    case = f"killed {delay:.3f}s after the second complete snapshot was committed"
    db = tmp_path / "run.db"
    err = tmp_path / "stderr.txt"
    with err.open("wb") as stderr:
        process = subprocess.Popen(
            workflow(db, "--run-id", "killed", "--slow"),
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
        try:
            wait_until(process, lambda: len(complete_seqs(db)) >= 2, err, "second snapshot")
            time.sleep(delay)
        finally:
            returncode = kill(process)
    assert returncode == -signal.SIGKILL, f"{case}: the run was not cut short\n{tail(err)}"
    check_resumed(db, "killed", uninterrupted)
