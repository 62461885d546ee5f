"""The fault fixtures themselves do what the fault tests rely on.

With plain clients (psycopg, sqlite3), no agentsnap: the proxy forwards in ``pass``, cuts in
``drop``, fails fast in ``refuse``, hangs in ``blackhole`` and lets the held traffic through
on ``heal``, adds latency in ``delay``; the private server stops and starts; the lock holder
makes a writer that does not wait fail with "database is locked"; the small disk fills up
until SQLite says ``SQLITE_FULL``, and has room again once cleared.
"""

from __future__ import annotations

import contextlib
import socket
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from .disk import SmallDisk
from .pg_server import PostgresServer
from .proxy import FaultProxy, Mode
from .sqlite_lock import SqliteLockHolder

SSL_REQUEST = (8).to_bytes(4, "big") + (80877103).to_bytes(4, "big")
"""The first message of PostgreSQL's protocol a client may send; the server answers one
byte, ``N`` (no SSL) or ``S``."""


def select_one(url: str, *, connect_timeout: int = 5) -> int:
    with psycopg.connect(url, connect_timeout=connect_timeout) as conn:
        row = conn.execute("SELECT 1").fetchone()
    assert row is not None
    return int(row[0])


@contextlib.contextmanager
def raw_connection(proxy: FaultProxy, timeout: float) -> Iterator[socket.socket]:
    with socket.create_connection((proxy.host, proxy.port), timeout=timeout) as sock:
        yield sock


def ssl_answer(sock: socket.socket) -> bytes:
    sock.sendall(SSL_REQUEST)
    return sock.recv(1)


# -- the proxy ----------------------------------------------------------------------------


@pytest.mark.postgres
def test_proxy_forwards_in_pass(fault_proxy: FaultProxy, pg_database: str) -> None:
    assert fault_proxy.mode is Mode.PASS
    url = fault_proxy.url(pg_database)
    assert f":{fault_proxy.port}/" in url
    assert select_one(url) == 1
    assert fault_proxy.stats.accepted >= 1
    assert fault_proxy.stats.forwarded > 0


@pytest.mark.postgres
def test_each_proxy_has_its_own_port(fault_proxy: FaultProxy, pg_server: PostgresServer) -> None:
    with FaultProxy((pg_server.host, pg_server.port)) as other:
        assert other.port != fault_proxy.port
        assert fault_proxy.port != pg_server.port


@pytest.mark.postgres
def test_refuse_fails_fast_and_heal_listens_again(
    fault_proxy: FaultProxy, pg_database: str
) -> None:
    url = fault_proxy.url(pg_database)
    with psycopg.connect(url) as conn:
        fault_proxy.refuse()
        with pytest.raises(psycopg.OperationalError):
            conn.execute("SELECT 1")
    started = time.monotonic()
    with pytest.raises(psycopg.OperationalError, match=r"(?i)refused"):
        select_one(url, connect_timeout=10)
    assert time.monotonic() - started < 2, "a refused connection should fail at once"
    fault_proxy.heal()
    assert select_one(url) == 1


@pytest.mark.postgres
def test_drop_cuts_open_connections_and_keeps_accepting(
    fault_proxy: FaultProxy, pg_database: str
) -> None:
    url = fault_proxy.url(pg_database)
    with psycopg.connect(url) as conn:
        assert fault_proxy.stats.open == 1
        fault_proxy.drop()
        with pytest.raises(psycopg.OperationalError):
            conn.execute("SELECT 1")
    assert fault_proxy.stats.dropped >= 1
    assert select_one(url) == 1  # still accepting and forwarding


@pytest.mark.postgres
def test_persistent_drop_resets_every_new_connection(
    fault_proxy: FaultProxy, pg_database: str
) -> None:
    url = fault_proxy.url(pg_database)
    fault_proxy.drop(persist=True)
    for _ in range(3):
        started = time.monotonic()
        with pytest.raises(psycopg.OperationalError):
            select_one(url)
        assert time.monotonic() - started < 2
    fault_proxy.heal()
    assert select_one(url) == 1


@pytest.mark.postgres
def test_blackhole_hangs_both_ways_and_heal_lets_it_through(
    fault_proxy: FaultProxy, pg_database: str
) -> None:
    url = fault_proxy.url(pg_database)
    conn = psycopg.connect(url)
    try:
        fault_proxy.blackhole()
        # A new connection is accepted (TCP), then nothing comes back.
        with raw_connection(fault_proxy, timeout=0.5) as sock, pytest.raises(TimeoutError):
            ssl_answer(sock)
        started = time.monotonic()
        with pytest.raises(psycopg.OperationalError, match=r"(?i)timeout"):
            select_one(url, connect_timeout=1)
        assert time.monotonic() - started >= 0.9
        # A query on an open connection hangs until the black hole is healed.
        answers: list[object] = []

        def query() -> None:
            row = conn.execute("SELECT 1").fetchone()
            answers.append(row[0] if row else None)

        worker = threading.Thread(target=query, daemon=True)
        worker.start()
        worker.join(1.0)
        assert worker.is_alive(), "a query went through a black hole"
        assert answers == []
        fault_proxy.heal()
        worker.join(10)
        assert answers == [1], "the held query did not complete once healed"
        assert select_one(url) == 1
    finally:
        fault_proxy.heal()
        conn.close()


@pytest.mark.postgres
def test_delay_adds_latency_each_way(fault_proxy: FaultProxy, pg_database: str) -> None:
    with raw_connection(fault_proxy, timeout=5) as sock:
        assert ssl_answer(sock) == b"N"
    fault_proxy.delay(0.25)
    with raw_connection(fault_proxy, timeout=5) as sock:
        started = time.monotonic()
        assert ssl_answer(sock) == b"N"
        took = time.monotonic() - started
    assert 0.45 <= took < 3, f"a round trip took {took:.3f} s with 0.25 s each way"
    fault_proxy.heal()
    assert fault_proxy.delay_seconds == 0


# -- the private server -------------------------------------------------------------------


@pytest.mark.postgres
def test_private_server_stops_and_starts(
    running_pg_server: PostgresServer, pg_database: str
) -> None:
    server = running_pg_server
    assert server.port != 5432
    assert select_one(pg_database) == 1
    with psycopg.connect(pg_database) as conn:
        started = time.monotonic()
        server.stop()
        assert time.monotonic() - started < 10
        assert not server.is_running()
        with pytest.raises(psycopg.OperationalError):
            conn.execute("SELECT 1")
    with pytest.raises(psycopg.OperationalError):
        select_one(pg_database, connect_timeout=2)
    server.start()
    assert server.is_running()
    assert select_one(pg_database) == 1


@pytest.mark.postgres
def test_private_server_listens_on_loopback_only(running_pg_server: PostgresServer) -> None:
    with psycopg.connect(running_pg_server.url) as conn:
        row = conn.execute("SHOW listen_addresses").fetchone()
        fsync = conn.execute("SHOW fsync").fetchone()
    assert row is not None
    assert row[0] == "127.0.0.1"
    assert fsync is not None
    assert fsync[0] == "off"


# -- SQLite: a lock held by another process, a full disk ------------------------------------


def make_database(path: Path) -> None:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("CREATE TABLE t (x BLOB)")
        conn.commit()


def write(path: Path, size: int = 10, *, timeout: float = 0) -> None:
    with contextlib.closing(sqlite3.connect(path, timeout=timeout)) as conn:
        conn.execute("INSERT INTO t VALUES (?)", (b"x" * size,))
        conn.commit()


def test_lock_holder_blocks_writers_until_released(tmp_path: Path) -> None:
    path = tmp_path / "locked.db"
    make_database(path)
    with SqliteLockHolder(path, seconds=30) as holder:
        assert holder.is_held()
        with pytest.raises(sqlite3.OperationalError, match="database is locked"):
            write(path)
        # Readers go on (WAL).
        with contextlib.closing(sqlite3.connect(path, timeout=0)) as conn:
            assert conn.execute("SELECT count(*) FROM t").fetchone() == (0,)
    assert not holder.is_held()
    write(path)


def test_lock_holder_lets_go_after_its_time(tmp_path: Path) -> None:
    path = tmp_path / "locked.db"
    make_database(path)
    holder = SqliteLockHolder(path, seconds=0.5).start()
    with pytest.raises(sqlite3.OperationalError, match="database is locked"):
        write(path)
    holder.wait()
    assert holder.locked_at is not None
    assert holder.released_at is not None
    assert holder.released_at - holder.locked_at >= 0.45
    write(path)


def test_small_disk_fills_up_and_clears(small_disk: SmallDisk) -> None:
    path = small_disk.path / "full.db"
    make_database(path)
    assert small_disk.free_bytes() > 4 << 20
    # Open across the fault, as a store's connections are (WAL and index files exist).
    with contextlib.closing(sqlite3.connect(path, timeout=0, isolation_level=None)) as conn:
        conn.execute("INSERT INTO t VALUES (x'00')")
        filled = small_disk.fill()
        assert filled > 4 << 20
        assert small_disk.free_bytes() == 0
        with pytest.raises(sqlite3.OperationalError, match="database or disk is full") as raised:
            conn.execute("INSERT INTO t VALUES (?)", (b"x" * 10,))  # autocommit
        assert raised.value.sqlite_errorname == "SQLITE_FULL"
        small_disk.clear()
        assert small_disk.free_bytes() > 4 << 20
        conn.execute("INSERT INTO t VALUES (?)", (b"x" * (64 << 10),))
    assert not small_disk.full
