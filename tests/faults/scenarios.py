"""The faults the suite injects, built from the fixtures, and set up whole for the report.

Each builder turns a fixture into a [`Fault`][] for
[`run_under_fault`][tests.faults.workload.run_under_fault]; ``SCENARIOS`` lists the five
the suite runs, with their durations, and ``prepared()`` sets one up from scratch (database,
proxy, disk) for ``python -m tests.faults.report``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from .disk import SmallDisk
from .pg_server import PostgresServer
from .proxy import FaultProxy
from .sqlite_lock import SqliteLockHolder
from .workload import Fault, workdir_url

__all__ = [
    "SCENARIOS",
    "Scenario",
    "blackhole",
    "disk_full",
    "dropped_connections",
    "prepared",
    "server_restart",
    "write_lock",
]


def dropped_connections(proxy: FaultProxy, seconds: float) -> Fault:
    """Every connection through ``proxy`` is closed, and new ones reset, for ``seconds``."""
    return Fault(
        "postgres connections dropped",
        inject=lambda: proxy.drop(persist=True),
        clear=proxy.heal,
        duration=seconds,
    )


def blackhole(proxy: FaultProxy, seconds: float) -> Fault:
    """Nothing goes through ``proxy`` either way for ``seconds``; connections stay open."""
    return Fault("postgres black hole", inject=proxy.blackhole, clear=proxy.heal, duration=seconds)


def server_restart(server: PostgresServer, seconds: float) -> Fault:
    """``server`` is stopped (fast shutdown) and started again ``seconds`` later."""
    return Fault("postgres restarted", inject=server.stop, clear=server.start, duration=seconds)


def write_lock(database: Path, seconds: float) -> Fault:
    """Another process holds the write lock of the SQLite file ``database`` for ``seconds``."""
    # The holder lets go when cleared; its own limit only guards against a test that dies.
    holder = SqliteLockHolder(database, seconds=seconds + 120)
    return Fault(
        "sqlite write lock held", inject=holder.start, clear=holder.release, duration=seconds
    )


def disk_full(disk: SmallDisk, seconds: float) -> Fault:
    """The disk of the SQLite database is full for ``seconds``."""
    return Fault("sqlite disk full", inject=disk.fill, clear=disk.clear, duration=seconds)


@dataclass(frozen=True)
class Scenario:
    """One fault the suite injects.

    Attributes:
        name: Short name (``pytest -k``, ``report --fault``).
        backend: The database it needs.
        seconds: How long the fault lasts.
    """

    name: str
    backend: Literal["postgres", "sqlite"]
    seconds: float


SCENARIOS = (
    Scenario("pg-drop", "postgres", 3.0),
    Scenario("pg-restart", "postgres", 3.0),
    Scenario("pg-blackhole", "postgres", 8.0),
    Scenario("sqlite-locked", "sqlite", 3.0),
    Scenario("sqlite-disk-full", "sqlite", 3.0),
)


@contextlib.contextmanager
def prepared(
    scenario: Scenario, *, server: PostgresServer | None, workdir: Path
) -> Iterator[tuple[str, Fault]]:
    """Set ``scenario`` up from scratch: the database URL to run on, and the fault.

    Raises:
        PostgresUnavailable: (from the caller's server) no PostgreSQL for a PostgreSQL fault.
        DiskUnavailable: No tmpfs for the disk-full fault.
    """
    if scenario.backend == "postgres":
        if server is None:
            raise ValueError(f"{scenario.name} needs a PostgreSQL server")
        server.start()
        direct = server.create_database()
        try:
            with FaultProxy((server.host, server.port)) as proxy:
                if scenario.name == "pg-drop":
                    yield proxy.url(direct), dropped_connections(proxy, scenario.seconds)
                elif scenario.name == "pg-blackhole":
                    yield proxy.url(direct), blackhole(proxy, scenario.seconds)
                else:
                    yield direct, server_restart(server, scenario.seconds)
        finally:
            server.start()
            server.drop_database(direct.rsplit("/", 1)[1])
    elif scenario.name == "sqlite-locked":
        workdir.mkdir(parents=True, exist_ok=True)
        yield workdir_url(workdir), write_lock(workdir / "agentsnap.db", scenario.seconds)
    else:
        with SmallDisk.mount(workdir / "disk", size_mb=8) as disk:
            yield workdir_url(disk.path), disk_full(disk, scenario.seconds)
