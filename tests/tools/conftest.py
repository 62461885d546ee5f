"""The ``ledger`` fixture: every ledger test runs on each ledger backend.

Backends: the in-memory ledger, SQLite (a file in the test's temporary directory) and
PostgreSQL (``AGENTSNAP_TEST_POSTGRES_URL``, emptied before each test; skipped without it).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from postgres_db import postgres_url_or_skip

from agentsnap.ledger import Ledger
from agentsnap.store.ledger import MemoryLedger
from agentsnap.store.sql_ledger import SqlLedger


def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'ledger.db'}"


LedgerFactory = Callable[[Path], Ledger]

BACKENDS = [
    pytest.param(lambda tmp_path: MemoryLedger(), id="memory"),
    pytest.param(lambda tmp_path: SqlLedger(sqlite_url(tmp_path)), id="sqlite"),
    pytest.param(
        lambda tmp_path: SqlLedger(postgres_url_or_skip()),
        id="postgres",
        marks=pytest.mark.postgres,
    ),
]

SQL_BACKENDS = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
]


@pytest.fixture(params=BACKENDS)
async def ledger(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Ledger]:
    """A fresh, empty ledger of each backend; closed after the test."""
    factory: LedgerFactory = request.param
    made = factory(tmp_path)
    try:
        yield made
    finally:
        await made.close()


@pytest.fixture(params=SQL_BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty SQLite or PostgreSQL database for the SQL-only tests."""
    if request.param == "sqlite":
        return sqlite_url(tmp_path)
    return postgres_url_or_skip()
