"""A redo re-executed after a crash and ``resume()`` still knows why its first try failed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

CHILD = Path(__file__).with_name("feedback_child.py")


def test_a_resumed_redo_gets_the_feedback_of_the_rollback_before_the_crash(
    tmp_path: Path,
) -> None:
    db = f"sqlite+aiosqlite:///{tmp_path / 'run.db'}"
    run_id = uuid.uuid4().hex
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    with subprocess.Popen(
        [sys.executable, str(CHILD), db, run_id], stdout=subprocess.PIPE, text=True, env=env
    ) as child:
        _kill_when_waiting(child)
    resumed = subprocess.run(
        [sys.executable, str(CHILD), db, run_id, "--resume"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=True,
    )
    outcome = json.loads(resumed.stdout.splitlines()[-1])
    assert outcome == {"seen": ["the draft is too long"], "draft": "short"}


def _kill_when_waiting(child: subprocess.Popen[str]) -> None:
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "waiting"  # the redo, after the rollback
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
