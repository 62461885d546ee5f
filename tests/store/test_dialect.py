"""The dialect layer: one place per database difference, the same answers on each database."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import sqlalchemy
from postgres_db import postgres_url_or_skip
from sqlalchemy import Column, MetaData, String, Table, select

from agentsnap import ConfigurationError
from agentsnap.store.dialect import (
    DIALECTS,
    PostgresDialect,
    SqliteDialect,
    async_url,
    connect_sqlite,
    dialect_of,
    driver_fault,
    sqlite_file,
    sqlite_setup,
    sync_url,
)
from agentsnap.store.faults import Fault, classify
from agentsnap.store.sql import SqlStore

_metadata = MetaData()
_items = Table(
    "dialect_items",
    _metadata,
    Column("key", String(64), primary_key=True),
    Column("value", String(64)),
)


def test_each_dialect_is_found_by_its_urls_and_its_backend_name() -> None:
    assert isinstance(dialect_of("sqlite:///x.db"), SqliteDialect)
    assert isinstance(dialect_of("sqlite+aiosqlite:///x.db"), SqliteDialect)
    assert isinstance(dialect_of("postgres://u@h/db"), PostgresDialect)
    assert isinstance(dialect_of("postgresql+asyncpg://u@h/db"), PostgresDialect)
    for dialect in DIALECTS:
        assert dialect_of(dialect.name) is dialect
    assert len({dialect.name for dialect in DIALECTS}) == len(DIALECTS)


@pytest.mark.parametrize("url", ["mysql://u@h/db", "not a url"])
def test_other_urls_are_refused_with_a_configuration_error(url: str) -> None:
    with pytest.raises(ConfigurationError):
        dialect_of(url)
    with pytest.raises(ConfigurationError):
        sync_url(url)


def test_urls_get_the_drivers_agentsnap_uses() -> None:
    assert sync_url("sqlite+aiosqlite:///x.db") == "sqlite:///x.db"
    assert async_url("sqlite:///x.db") == "sqlite+aiosqlite:///x.db"
    assert sync_url("postgres://u:secret@h/db") == "postgresql+psycopg://u:secret@h/db"
    assert async_url("postgresql://u@h/db") == "postgresql+psycopg://u@h/db"


def test_only_an_sqlite_url_naming_a_file_has_a_file() -> None:
    assert sqlite_file("sqlite:///folder/agentsnap.db") == "folder/agentsnap.db"
    assert sqlite_file("sqlite://") is None
    assert sqlite_file("sqlite:///:memory:") is None
    assert sqlite_file("postgresql://u@h/db") is None


def test_an_sqlite_url_with_two_slashes_says_how_to_write_it() -> None:
    url = "sqlite://tmp/x.db"  # "tmp" is taken for a host
    for use in (dialect_of, sync_url, async_url, sqlite_file, SqlStore):
        with pytest.raises(ConfigurationError) as refused:
            use(url)
        message = str(refused.value)
        assert message.startswith("'sqlite://tmp/x.db' is not a valid SQLite URL")
        assert "sqlite:///tmp/x.db for tmp/x.db under the current directory" in message
        assert "sqlite:////tmp/x.db for /tmp/x.db" in message
        assert "aiosqlite" not in message


def _pragmas(connection: Any) -> dict[str, Any]:
    return {
        name: connection.execute(f"PRAGMA {name}").fetchone()[0]
        for name in ("journal_mode", "synchronous", "foreign_keys", "busy_timeout")
    }


def test_a_plain_sqlite_connection_is_set_up_as_every_other(tmp_path: Path) -> None:
    connection = connect_sqlite(str(tmp_path / "a.db"), timeout=2.5)
    try:
        # synchronous: NORMAL is 1; the busy timeout is in milliseconds.
        assert _pragmas(connection) == {
            "journal_mode": "wal",
            "synchronous": 1,
            "foreign_keys": 1,
            "busy_timeout": 2500,
        }
        assert connection.isolation_level is None  # autocommit: BEGIN starts a transaction
    finally:
        connection.close()
    durable = connect_sqlite(str(tmp_path / "a.db"), timeout=0, synchronous="FULL")
    try:
        assert _pragmas(durable)["synchronous"] == 2
        assert _pragmas(durable)["busy_timeout"] == 0
    finally:
        durable.close()


def test_an_engine_connection_is_set_up_as_a_plain_one(tmp_path: Path) -> None:
    engine = sqlalchemy.create_engine(f"sqlite:///{tmp_path / 'b.db'}")
    sqlalchemy.event.listen(engine, "connect", sqlite_setup(timeout=1.0))
    try:
        with engine.connect() as connection:
            raw = connection.connection.driver_connection
            assert _pragmas(raw) == {
                "journal_mode": "wal",
                "synchronous": 1,
                "foreign_keys": 1,
                "busy_timeout": 1000,
            }
    finally:
        engine.dispose()


def test_an_unknown_synchronous_mode_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="NORMAL or FULL"):
        connect_sqlite(str(tmp_path / "c.db"), timeout=1.0, synchronous="OFF")


def test_driver_errors_are_classified_by_their_dialect() -> None:
    busy = sqlite3.connect(":memory:")
    try:
        error: BaseException | None = None
        try:
            busy.execute("SELECT * FROM missing")
        except sqlite3.Error as exc:
            error = exc
        assert error is not None
        assert driver_fault(error) is Fault.PERMANENT  # "no such table": a mistake, not a pause
    finally:
        busy.close()

    class SerializationFailure(Exception):
        sqlstate = "40001"

    class AdminShutdown(Exception):
        sqlstate = "57P01"

    assert driver_fault(SerializationFailure()) is Fault.CONFLICT
    assert classify(AdminShutdown()) is Fault.UNAVAILABLE
    assert driver_fault(ValueError("not a database error")) is None


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[sqlalchemy.Engine]:
    """An engine on each database, with the test table created."""
    url = (
        f"sqlite:///{tmp_path / 'dialect.db'}"
        if request.param == "sqlite"
        else postgres_url_or_skip()
    )
    created = sqlalchemy.create_engine(sync_url(url))
    _metadata.create_all(created)
    try:
        yield created
    finally:
        created.dispose()


def test_insert_or_ignore_keeps_the_row_there_and_upsert_replaces_it(
    engine: sqlalchemy.Engine,
) -> None:
    dialect = dialect_of(engine.dialect.name)
    with engine.begin() as connection:
        connection.execute(dialect.insert_or_ignore(_items, ["key"]), {"key": "a", "value": "1"})
        connection.execute(dialect.insert_or_ignore(_items, ["key"]), {"key": "a", "value": "2"})
        assert connection.scalar(select(_items.c.value)) == "1"
        connection.execute(dialect.upsert(_items, ["key"], ["value"]), {"key": "a", "value": "3"})
        assert connection.scalar(select(_items.c.value)) == "3"
        if dialect.supports_returning:
            returned = connection.execute(
                dialect.insert_or_ignore(_items, ["key"]).returning(_items.c.key),
                [{"key": "a", "value": "4"}],
            ).first()
            assert returned is None  # a conflict returns no row


def test_starts_with_is_exact_and_case_sensitive(engine: sqlalchemy.Engine) -> None:
    dialect = dialect_of(engine.dialect.name)
    keys = ["run:a", "run:b", "RUN:c", "run", "run_x:a", "run%:a", "ru", "run:\U0010ffff"]
    with engine.begin() as connection:
        connection.execute(_items.insert(), [{"key": key, "value": ""} for key in keys])

        def starting(prefix: str) -> set[str]:
            column = cast(Any, _items.c.key)
            return set(
                connection.scalars(select(_items.c.key).where(dialect.starts_with(column, prefix)))
            )

        assert starting("run:") == {"run:a", "run:b", "run:\U0010ffff"}
        assert starting("run_") == {"run_x:a"}
        assert starting("run%") == {"run%:a"}
        assert starting("run:\U0010ffff") == {"run:\U0010ffff"}
