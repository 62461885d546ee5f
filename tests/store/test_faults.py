"""Database faults: classified by the driver's codes, retried when they pass, and a write
whose commit happened but whose answer was lost is not made twice.

The faults here are real where the database can make them on demand: a second SQLite
connection holding the write lock, a PostgreSQL trigger raising ``serialization_failure``
(SQLSTATE 40001) for the first attempts, a connection to a port nobody listens on. Lost
answers are made by letting an attempt commit and then raising a connection fault.
"""

from __future__ import annotations

import asyncio
import errno
import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import psycopg.errors
import pytest
import sqlalchemy
from ledger_entries import claim_of
from postgres_db import POSTGRES_URL_VARIABLE

from agentsnap import (
    ConfigurationError,
    JournalSegment,
    ReplaySegment,
    RollbackInfo,
    RunInfo,
    StoreError,
    StoreRetry,
)
from agentsnap.ledger import LedgerEntry, ToolCallStatus
from agentsnap.records import utcnow
from agentsnap.store.faults import Fault, classify
from agentsnap.store.sql import SqlStore
from agentsnap.store.sql_ledger import SqlLedger

from .test_contract import make_cut, make_snapshot

FAST = StoreRetry(timeout=0.5, deadline=30.0, first_wait=0.01, max_wait=0.1)


def sqlite_error(code: int, text: str = "injected") -> sqlite3.OperationalError:
    error = sqlite3.OperationalError(text)
    error.sqlite_errorcode = code
    return error


def lost_answer() -> StoreError:
    """What a write raises when the connection dropped as its commit went out."""
    error = StoreError("the connection to the database was lost")
    error.__cause__ = psycopg.OperationalError("server closed the connection unexpectedly")
    return error


# -- classification ---------------------------------------------------------------------


def test_sqlite_faults_are_told_apart_by_their_result_codes(tmp_path: Path) -> None:
    path = tmp_path / "locked.db"
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("CREATE TABLE t (x INTEGER PRIMARY KEY)")
    holder.execute("BEGIN IMMEDIATE")
    other = sqlite3.connect(path, isolation_level=None, timeout=0)
    with pytest.raises(sqlite3.OperationalError) as locked:
        other.execute("INSERT INTO t VALUES (1)")
    holder.execute("INSERT INTO t VALUES (1)")
    holder.execute("COMMIT")
    with pytest.raises(sqlite3.IntegrityError) as duplicate:
        other.execute("INSERT INTO t VALUES (1)")
    holder.close()
    other.close()

    assert classify(locked.value) is Fault.LOCKED
    assert classify(duplicate.value) is Fault.PERMANENT
    assert classify(sqlite_error(sqlite3.SQLITE_FULL)) is Fault.DISK_FULL
    assert classify(sqlite_error(sqlite3.SQLITE_IOERR)) is Fault.UNAVAILABLE
    assert Fault.LOCKED.transient
    assert not Fault.PERMANENT.transient


@pytest.mark.parametrize(
    ("sqlstate", "fault"),
    [
        ("40001", Fault.CONFLICT),
        ("40P01", Fault.CONFLICT),
        ("55P03", Fault.LOCKED),
        ("57P01", Fault.UNAVAILABLE),
        ("57P03", Fault.UNAVAILABLE),
        ("57014", Fault.TIMEOUT),
        ("53100", Fault.DISK_FULL),
        ("53300", Fault.UNAVAILABLE),
        ("08006", Fault.CONNECTION),
        ("23505", Fault.PERMANENT),
        ("42P01", Fault.PERMANENT),
        ("3D000", Fault.MISSING),
    ],
)
def test_postgres_faults_are_told_apart_by_sqlstate(sqlstate: str, fault: Fault) -> None:
    error = psycopg.errors.lookup(sqlstate)("injected")
    wrapped = StoreError("could not write")
    wrapped.__cause__ = sqlalchemy.exc.OperationalError("INSERT", {}, error)

    assert classify(error) is fault
    assert classify(wrapped) is fault  # through StoreError and SQLAlchemy to the driver


def test_a_refused_connection_is_a_connection_fault() -> None:
    with pytest.raises(psycopg.OperationalError) as refused:
        psycopg.connect("postgresql://postgres@127.0.0.1:1/test", connect_timeout=2)

    assert classify(refused.value) is Fault.CONNECTION


def test_a_database_that_does_not_exist_is_not_a_passing_fault() -> None:
    # libpq refuses the connection without an SQLSTATE: the server's message tells it.
    refused = psycopg.OperationalError(
        'connection failed: connection to server at "127.0.0.1", port 5432 failed: '
        'FATAL:  database "runs" does not exist'
    )

    assert classify(refused) is Fault.MISSING
    assert not Fault.MISSING.transient


def test_other_errors_are_not_database_faults() -> None:
    assert classify(ValueError("bad")) is None
    assert classify(StoreError("run x is not stored")) is None
    assert classify(TimeoutError()) is Fault.TIMEOUT
    assert classify(OSError(errno.ENOSPC, "No space left on device")) is Fault.DISK_FULL


# -- the retry policy -------------------------------------------------------------------


class Flaky:
    """An operation that fails with ``error`` the first ``failures`` times."""

    def __init__(self, failures: int, error: Callable[[], Exception]) -> None:
        self.failures = failures
        self.error = error
        self.calls: list[bool] = []

    async def __call__(self, again: bool) -> str:
        self.calls.append(again)
        if len(self.calls) <= self.failures:
            raise self.error()
        return "done"


async def test_transient_faults_are_retried_and_retries_know_they_are_retries() -> None:
    flaky = Flaky(3, lambda: sqlite_error(sqlite3.SQLITE_BUSY, "database is locked"))

    assert await FAST.call("write", flaky, where="the database") == "done"
    assert flaky.calls == [False, True, True, True]


async def test_a_permanent_fault_is_raised_at_once() -> None:
    flaky = Flaky(1, lambda: sqlite_error(sqlite3.SQLITE_CONSTRAINT, "UNIQUE failed"))

    with pytest.raises(StoreError, match="refused the operation"):
        await FAST.call("write", flaky, where="the database")
    assert flaky.calls == [False]


async def test_a_fault_that_outlasts_the_deadline_says_what_and_why() -> None:
    policy = StoreRetry(timeout=0.5, deadline=0.3, first_wait=0.01, max_wait=0.05)
    flaky = Flaky(10**6, lambda: sqlite_error(sqlite3.SQLITE_FULL, "database or disk is full"))

    with pytest.raises(StoreError) as raised:
        await policy.call("write snapshot 3", flaky, where="the database /data/a.db")

    message = str(raised.value)
    assert "could not write snapshot 3" in message
    assert "the disk of the database /data/a.db is full" in message
    assert "gave up after retrying" in message
    assert len(flaky.calls) > 2
    assert classify(raised.value) is Fault.DISK_FULL


async def test_no_deadline_retries_nothing() -> None:
    flaky = Flaky(1, lambda: sqlite_error(sqlite3.SQLITE_BUSY))

    with pytest.raises(StoreError, match="locked by another writer"):
        await StoreRetry.never().call("write", flaky, where="the database")
    assert flaky.calls == [False]


async def test_an_attempt_that_hangs_is_bounded_by_the_timeout() -> None:
    policy = StoreRetry(timeout=0.05, deadline=5.0, first_wait=0.01, max_wait=0.02)
    calls: list[bool] = []

    async def hangs_once(again: bool) -> str:
        calls.append(again)
        if not again:
            await asyncio.sleep(3600)
        return "done"

    assert await policy.call("read", hangs_once, where="the database", bounded=True) == "done"
    assert calls == [False, True]


def test_a_bad_policy_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="timeout"):
        StoreRetry(timeout=0)
    with pytest.raises(ConfigurationError, match="deadline"):
        StoreRetry(deadline=-1)


# -- real faults, retried ---------------------------------------------------------------


async def test_a_write_waits_out_another_process_holding_the_sqlite_lock(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'agentsnap.db'}"
    store = SqlStore(url, retry=FAST)
    ledger = SqlLedger(url, retry=FAST)
    try:
        run = RunInfo(id=uuid.uuid4().hex)
        await store.create_run(run)
        released = threading.Event()

        def hold_the_lock() -> None:
            holder = sqlite3.connect(tmp_path / "agentsnap.db", isolation_level=None)
            holder.execute("BEGIN IMMEDIATE")
            released.wait()
            time.sleep(1.5)  # three times the policy's per-attempt timeout
            holder.execute("COMMIT")
            holder.close()

        thread = threading.Thread(target=hold_the_lock)
        thread.start()
        await asyncio.sleep(0.2)
        released.set()
        snapshot = make_snapshot(
            run.id, 1, agents={"$env": make_cut({}), "a": make_cut({"n": 1})}, channels=[]
        )
        await store.save_snapshot(snapshot)
        await store.append_journal(run.id, [JournalSegment("$env", "a", "send", 1, 1, "[]")])
        assert await ledger.claim(entry(run.id)) is None
        thread.join()

        assert (await store.load_snapshot(snapshot.id)).agents["a"].state == {"n": 1}
        assert len(await store.load_journal(run.id)) == 1
    finally:
        await ledger.close()
        await store.close()


async def test_a_serialization_failure_on_postgres_is_retried(postgres_url: str) -> None:
    store = SqlStore(postgres_url, retry=FAST)
    try:
        run = RunInfo(id=uuid.uuid4().hex)
        await store.create_run(run)
        # The first two attempts fail inside the database, as a conflicting transaction
        # would make them; a sequence counts attempts, since it is not rolled back.
        engine = sqlalchemy.create_engine(
            postgres_url.replace("postgresql:", "postgresql+psycopg:")
        )
        with engine.begin() as conn:
            conn.exec_driver_sql("CREATE SEQUENCE fault_attempts")
            conn.exec_driver_sql(
                "CREATE FUNCTION conflict() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                "IF nextval('fault_attempts') <= 2 THEN "
                "RAISE EXCEPTION 'injected conflict' USING ERRCODE = '40001'; END IF; "
                "RETURN NEW; END $$"
            )
            conn.exec_driver_sql(
                "CREATE TRIGGER conflict BEFORE INSERT ON agentsnap_snapshots "
                "FOR EACH ROW EXECUTE FUNCTION conflict()"
            )
        engine.dispose()
        snapshot = make_snapshot(
            run.id, 1, agents={"$env": make_cut({}), "a": make_cut({"n": 1})}, channels=[]
        )

        await store.save_snapshot(snapshot)

        assert [s.id for s in await store.list_snapshots(run.id)] == [snapshot.id]
    finally:
        await store.close()


# -- a commit whose answer was lost -----------------------------------------------------


def answer_lost_once(owner: Any, name: str) -> list[int]:
    """Make ``owner.name`` commit its first call, then raise as if the answer was lost."""
    original: Callable[..., Awaitable[Any]] = getattr(owner, name)
    calls: list[int] = []

    async def commits_then_fails(*args: Any) -> Any:
        calls.append(1)
        result = await original(*args)
        if len(calls) == 1:
            raise lost_answer()
        return result

    setattr(owner, name, commits_then_fails)
    return calls


def entry(run_id: str, key: str = "charge-1") -> LedgerEntry:
    return claim_of(key, run_id, agent="a")


async def test_store_writes_whose_answer_was_lost_are_not_made_twice(empty_db: str) -> None:
    store = SqlStore(empty_db, retry=FAST)
    try:
        run = RunInfo(id=uuid.uuid4().hex)
        await store.create_run(run)
        for name in (
            "_save_snapshot",
            "_append_journal",
            "_append_replay",
            "_save_rollback",
            "_take_lease",
        ):
            answer_lost_once(store, name)
        snapshot = make_snapshot(
            run.id, 1, agents={"$env": make_cut({}), "a": make_cut({"n": 1})}, channels=[]
        )
        segment = JournalSegment("$env", "a", "send", 1, 2, "[]")
        rollback = RollbackInfo(
            id=uuid.uuid4().hex,
            run_id=run.id,
            snapshot_id=snapshot.id,
            agent=None,
            reason="test",
            source="manual",
            attempt=1,
            discarded=0,
        )

        await store.save_snapshot(snapshot)
        await store.append_journal(run.id, [segment])
        await store.append_replay(run.id, ReplaySegment(0, '{"deliveries":[],"inputs":[]}'))
        await store.save_rollback(rollback)
        lease = await store.take_lease(
            run.id, "me", utcnow() + timedelta(seconds=30), replacing=None
        )

        assert [s.id for s in await store.list_snapshots(run.id)] == [snapshot.id]
        assert await store.load_journal(run.id) == [segment]
        assert len(await store.load_replay(run.id)) == 1
        assert [r.id for r in await store.list_rollbacks(run.id)] == [rollback.id]
        assert lease is not None
        assert lease.owner == "me"
        assert lease.token == 1
        assert [(o.owner, o.token) for o in await store.list_run_owners(run.id)] == [("me", 1)]
    finally:
        await store.close()


async def test_ledger_writes_whose_answer_was_lost_are_recognised(empty_db: str) -> None:
    store = SqlStore(empty_db, retry=FAST)
    ledger = SqlLedger(empty_db, retry=FAST)
    try:
        run = RunInfo(id=uuid.uuid4().hex)
        await store.create_run(run)
        answer_lost_once(ledger, "_claim_once")
        answer_lost_once(ledger, "_update_once")
        claim = entry(run.id)

        # The claim was committed: the retry sees the row, and knows it as its own.
        assert await ledger.claim(claim) is None
        done = await ledger.update(
            claim.key,
            {"status": ToolCallStatus.SUCCEEDED, "result": 7, "updated_at": utcnow()},
            statuses=(ToolCallStatus.IN_PROGRESS,),
            owner=claim.owner,
            attempts=1,
        )

        assert done
        stored = await ledger.get(claim.key)
        assert stored is not None
        assert stored.status is ToolCallStatus.SUCCEEDED
        assert stored.result == 7
        # Someone else's claim of the key is still refused.
        assert await ledger.claim(entry(run.id)) is not None
    finally:
        await ledger.close()
        await store.close()


# -- a database that is not there ------------------------------------------------------


def retried(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The warnings a store logs when it starts retrying an operation."""
    return [r.getMessage() for r in caplog.records if "retrying" in r.getMessage()]


async def test_an_sqlite_file_in_a_missing_directory_is_refused_at_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = tmp_path / "nope"
    store = SqlStore(f"sqlite:///{folder / 'runs.db'}", retry=FAST)
    try:
        with pytest.raises(StoreError) as refused:
            await store.create_run(RunInfo(id=uuid.uuid4().hex))
    finally:
        await store.close()

    message = str(refused.value)
    assert f"its directory {folder} does not exist" in message
    assert f"mkdir -p {folder}" in message
    assert "unavailable" not in message
    assert retried(caplog) == []
    assert not folder.exists()


async def test_a_reader_of_an_sqlite_file_in_a_missing_directory_names_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = tmp_path / "nope"
    url = f"sqlite:///{folder / 'runs.db'}"
    store = SqlStore(url, create=False, retry=FAST)
    try:
        with pytest.raises(StoreError) as refused:
            await store.list_runs()
    finally:
        await store.close()

    assert str(refused.value) == (
        f"there is no database at {url} (its directory {folder} does not exist): check the --db URL"
    )
    assert retried(caplog) == []
    assert not folder.exists()


def missing_postgres_database() -> tuple[str, str]:
    """A URL of the test server naming a database that does not exist, and that name."""
    url = os.environ.get(POSTGRES_URL_VARIABLE)
    if not url:
        pytest.skip(f"{POSTGRES_URL_VARIABLE} is not set: no PostgreSQL to test against")
    name = f"agentsnap_missing_{uuid.uuid4().hex[:12]}"
    missing = sqlalchemy.make_url(url).set(database=name)
    return missing.render_as_string(hide_password=False), name


@pytest.mark.postgres
@pytest.mark.parametrize("create", [True, False], ids=["writer", "reader"])
async def test_a_postgres_database_that_does_not_exist_is_refused_at_once(
    create: bool, caplog: pytest.LogCaptureFixture
) -> None:
    url, name = missing_postgres_database()
    store = SqlStore(url, create=create, retry=FAST)
    try:
        with pytest.raises(StoreError) as refused:
            await store.list_runs()
    finally:
        await store.close()

    message = str(refused.value)
    assert f"/{name} does not exist" in message
    assert f"createdb {name}" in message
    assert f"CREATE DATABASE {name}" in message
    assert "cannot be reached" not in message
    assert retried(caplog) == []
    assert classify(refused.value) is Fault.MISSING


def test_the_cli_says_when_the_database_cannot_be_reached() -> None:
    from click.testing import CliRunner

    from agentsnap.cli import main

    result = CliRunner().invoke(main, ["runs", "--db", "postgresql://app@127.0.0.1:1/runs"])

    assert result.exit_code == 1
    assert "the database postgresql://app@127.0.0.1:1/runs cannot be reached" in result.output
    assert "gave up after retrying" in result.output
    assert "Traceback" not in result.output
