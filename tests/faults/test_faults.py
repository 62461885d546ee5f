"""A run survives database faults: it finishes once the fault clears, as if nothing happened.

The workload (``workload.py``: eight token chains round a ring of four agents, two
side-effecting tools per delivery, snapshots every 50 ms, the journal on) runs on a store
with ``StoreRetry(timeout=1.0, deadline=60.0)``; a quarter of the way through, one fault
strikes:

* PostgreSQL connections dropped for 3 s: every open connection is cut and every new one
  reset, through a proxy;
* the PostgreSQL server (a private one) stopped, and started again 3 s later;
* a black hole for 8 s: the proxy accepts and keeps connections but forwards nothing, so
  only the policy's ``timeout`` notices;
* another process holding the SQLite write lock for 3 s, three times the ``timeout``;
* the SQLite database's disk full for 3 s, then freed.

Then: the run is stored as succeeded, every chain completed, every effect happened exactly
once (never twice, none missing), every stored snapshot is whole and a consistent cut, the
journal holds every send and delivery exactly once, and memory stayed flat during the
outage. ``test_without_a_fault`` runs the same checks with no fault, on both databases.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .disk import SmallDisk
from .pg_server import PostgresServer
from .proxy import FaultProxy
from .scenarios import (
    SCENARIOS,
    blackhole,
    disk_full,
    dropped_connections,
    server_restart,
    write_lock,
)
from .workload import FaultReport, Workload, run_under_fault, workdir_url

WORKLOAD = Workload(timeout=1.0, deadline=60.0)
SECONDS = {scenario.name: scenario.seconds for scenario in SCENARIOS}


def check(report: FaultReport) -> None:
    assert not report.problems(), report.describe()


@pytest.mark.postgres
async def test_postgres_connections_dropped(fault_proxy: FaultProxy, pg_database: str) -> None:
    fault = dropped_connections(fault_proxy, SECONDS["pg-drop"])
    check(await run_under_fault(fault_proxy.url(pg_database), fault, WORKLOAD))


@pytest.mark.postgres
async def test_postgres_server_restarted(
    running_pg_server: PostgresServer, pg_database: str
) -> None:
    fault = server_restart(running_pg_server, SECONDS["pg-restart"])
    check(await run_under_fault(pg_database, fault, WORKLOAD))


@pytest.mark.postgres
async def test_postgres_black_hole(fault_proxy: FaultProxy, pg_database: str) -> None:
    fault = blackhole(fault_proxy, SECONDS["pg-blackhole"])
    check(await run_under_fault(fault_proxy.url(pg_database), fault, WORKLOAD))


async def test_sqlite_write_lock_held_longer_than_timeout(tmp_path: Path) -> None:
    assert SECONDS["sqlite-locked"] > WORKLOAD.timeout
    fault = write_lock(tmp_path / "agentsnap.db", SECONDS["sqlite-locked"])
    check(await run_under_fault(workdir_url(tmp_path), fault, WORKLOAD))


async def test_sqlite_disk_full(small_disk: SmallDisk) -> None:
    fault = disk_full(small_disk, SECONDS["sqlite-disk-full"])
    check(await run_under_fault(workdir_url(small_disk.path), fault, WORKLOAD))


@pytest.mark.parametrize(
    "backend",
    [pytest.param("sqlite", id="sqlite"), pytest.param("postgres", marks=pytest.mark.postgres)],
)
async def test_without_a_fault(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    url = workdir_url(tmp_path) if backend == "sqlite" else request.getfixturevalue("pg_database")
    report = await run_under_fault(url, None, WORKLOAD)
    check(report)
