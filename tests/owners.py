"""Owner names for tests of leases and claims."""

from __future__ import annotations

import socket
import subprocess
import sys


def dead_owner() -> str:
    """The owner name (``host:pid:token``) of a process of this host that has exited."""
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    return f"{socket.gethostname()}:{int(done.stdout)}:0123456789ab"
