"""The ``store`` fixture: every contract test runs once per store backend.

Backends are listed in ``BACKENDS``, one line each: a factory that takes the test's temporary
directory and returns a fresh, empty store (or skips the test when the backend cannot run
here). The fixture closes the store after the test.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
import sqlalchemy

from agentsnap.store import MemoryStore, Store
from agentsnap.store.migrate import sync_url
from agentsnap.store.sql import SqlStore

POSTGRES_URL_VARIABLE = "AGENTSNAP_TEST_POSTGRES_URL"

StoreFactory = Callable[[Path], Store]


def make_memory_store(tmp_path: Path) -> Store:
    return MemoryStore()


def make_sqlite_store(tmp_path: Path) -> Store:
    return SqlStore(f"sqlite:///{tmp_path / 'agentsnap.db'}")


def make_postgres_store(tmp_path: Path) -> Store:
    url = os.environ.get(POSTGRES_URL_VARIABLE)
    if not url:
        pytest.skip(f"{POSTGRES_URL_VARIABLE} is not set: no PostgreSQL to test against")
    reset_postgres(url)
    return SqlStore(url)


def reset_postgres(url: str) -> None:
    """Drop everything in the target database, so each test starts from an empty one."""
    engine = sqlalchemy.create_engine(sync_url(url))
    try:
        with engine.begin() as connection:
            connection.execute(sqlalchemy.text("DROP SCHEMA public CASCADE"))
            connection.execute(sqlalchemy.text("CREATE SCHEMA public"))
    finally:
        engine.dispose()


# One line per backend: the id shown in test names, and its factory.
BACKENDS = [
    pytest.param(make_memory_store, id="memory"),
    pytest.param(make_sqlite_store, id="sqlite"),
    pytest.param(make_postgres_store, id="postgres", marks=pytest.mark.postgres),
]


@pytest.fixture(params=BACKENDS)
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    """A fresh, empty store of each backend; closed after the test."""
    factory: StoreFactory = request.param
    made = factory(tmp_path)
    try:
        yield made
    finally:
        await made.close()


@pytest.fixture
def postgres_url() -> str:
    """The test PostgreSQL database, emptied; skips when none is configured."""
    url = os.environ.get(POSTGRES_URL_VARIABLE)
    if not url:
        pytest.skip(f"{POSTGRES_URL_VARIABLE} is not set: no PostgreSQL to test against")
    reset_postgres(url)
    return url
