"""Fixtures of the fault tests: a private PostgreSQL server, a proxy, a small disk.

* ``pg_server`` (session): a [`PostgresServer`][] of this test session's own, never the
  shared one; skipped, saying why, only when the server binaries are missing. Tests may stop
  and start it; every test that uses it finds it running.
* ``pg_database``: the URL of a fresh, empty database on it, dropped after the test.
* ``fault_proxy``: a [`FaultProxy`][] in front of ``pg_server`` on a port of its own, in
  ``pass`` mode; closed after the test.
* ``small_disk``: an 8 MB tmpfs, unmounted after the test; skipped, saying why, where
  mounting is not permitted.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .disk import DiskUnavailable, SmallDisk
from .pg_server import PostgresServer, PostgresUnavailable
from .proxy import FaultProxy


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PostgresServer]:
    """A private PostgreSQL server for the session (stopped and removed at its end)."""
    try:
        server = PostgresServer.create()
    except PostgresUnavailable as exc:
        pytest.skip(f"no private PostgreSQL server for the fault tests: {exc}")
    with server:
        yield server


@pytest.fixture
def running_pg_server(pg_server: PostgresServer) -> PostgresServer:
    """``pg_server``, started again if an earlier test left it stopped."""
    pg_server.start()
    return pg_server


@pytest.fixture
def pg_database(running_pg_server: PostgresServer) -> Iterator[str]:
    """The URL of a fresh, empty database on the private server; dropped afterwards."""
    url = running_pg_server.create_database()
    yield url
    running_pg_server.start()
    running_pg_server.drop_database(url.rsplit("/", 1)[1])


@pytest.fixture
def fault_proxy(running_pg_server: PostgresServer) -> Iterator[FaultProxy]:
    """A proxy to the private server, forwarding, on its own port."""
    with FaultProxy((running_pg_server.host, running_pg_server.port)) as proxy:
        yield proxy


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[SmallDisk]:
    """An 8 MB tmpfs in the test's directory; skipped where mounting is not permitted."""
    try:
        disk = SmallDisk.mount(tmp_path / "disk", size_mb=8)
    except DiskUnavailable as exc:
        pytest.skip(f"no small disk for the disk-full fault: {exc}")
    with disk:
        yield disk
