"""NATS servers for the JetStream tests: the shared one, or one of a test's own.

The tests use the server at ``AGENTSNAP_TEST_NATS_URL`` (``nats://127.0.0.1:4222`` by default)
and start their own ``nats-server`` (found on ``PATH`` or in ``/usr/sbin``) where they stop and
restart it. Without either they are skipped, saying so, except under ``CI=true``, where they
fail: CI must run them.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

SHARED_URL = os.environ.get("AGENTSNAP_TEST_NATS_URL", "nats://127.0.0.1:4222")


def server_binary() -> str | None:
    """The ``nats-server`` executable, if installed."""
    return shutil.which("nats-server") or shutil.which("nats-server", path="/usr/sbin:/usr/bin")


def reachable(url: str) -> bool:
    """Whether something listens at ``url``'s host and port."""
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 4222), 1):
            return True
    except OSError:
        return False


def unavailable(reason: str) -> None:
    """Skip the test for ``reason``, or fail it under CI."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason}, and CI must run the NATS tests")
    pytest.skip(reason)


def free_port() -> int:
    """A TCP port nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class OwnServer:
    """A ``nats-server -js`` of a test's own: a free port of ``host``, storing under ``store``."""

    def __init__(self, binary: str, store: Path, host: str = "127.0.0.1") -> None:
        self.binary = binary
        self.store = store
        self.host = host
        self.port = free_port()
        self.url = f"nats://{host}:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs."""
        return None if self.process is None else self.process.pid

    def start(self) -> None:
        """Start the server (again, on the same port and storage) and wait until it listens."""
        self.process = subprocess.Popen(
            [self.binary, "-js", "-a", self.host, "-p", str(self.port), "-sd", str(self.store)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 20
        while not reachable(self.url):
            if self.process.poll() is not None:
                raise RuntimeError(f"nats-server exited with {self.process.returncode}")
            if time.monotonic() > deadline:
                raise RuntimeError("nats-server did not listen within 20 s")
            time.sleep(0.02)

    def stop(self) -> None:
        """Stop the server (SIGTERM: it shuts down as it does when restarted by an operator)."""
        process, self.process = self.process, None
        if process is not None:
            process.terminate()
            process.wait(20)
