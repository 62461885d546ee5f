"""Start ``agentsnap worker`` processes for the distributed tests.

A worker imports its app (``teller_app:make_app``) from the tests' directory, so the
processes get the repository and the tests on ``PYTHONPATH``, and ``BANK_TELLERS`` says how
many tellers the bank has.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def worker_command(*args: str) -> list[str]:
    """The command line of ``agentsnap worker`` with ``args``, in this interpreter."""
    return [sys.executable, "-m", "agentsnap", "worker", *args]


def worker_env(tellers: int = 9) -> dict[str, str]:
    """This process's environment, for a worker hosting a bank of ``tellers``."""
    path = os.pathsep.join([str(ROOT), str(HERE), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path, "BANK_TELLERS": str(tellers)}


def run_worker(*args: str, tellers: int = 9) -> subprocess.CompletedProcess[str]:
    """Run a worker to its end (two minutes at most) and capture what it printed."""
    return subprocess.run(
        worker_command(*args),
        env=worker_env(tellers),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
