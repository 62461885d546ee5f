"""The ``store`` fixture: every contract test runs once per store backend.

Backends are listed in ``BACKENDS``, one line each: a factory that takes the test's temporary
directory and returns a fresh, empty store (or skips the test when the backend cannot run
here). The fixture closes the store after the test.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from postgres_db import postgres_url_or_skip

from agentsnap.store import MemoryStore, Store
from agentsnap.store.sql import SqlStore

StoreFactory = Callable[[Path], Store]


def make_memory_store(tmp_path: Path) -> Store:
    return MemoryStore()


def make_sqlite_store(tmp_path: Path) -> Store:
    return SqlStore(f"sqlite:///{tmp_path / 'agentsnap.db'}")


def make_postgres_store(tmp_path: Path) -> Store:
    return SqlStore(postgres_url_or_skip())


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
