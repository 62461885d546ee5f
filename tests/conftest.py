"""Fixtures shared by every test module.

``store`` runs a test once per store backend (memory, SQLite, PostgreSQL, and the
one-process double) and ``sql_store`` once per SQL backend; each gives a fresh, empty store
and closes it after the test. Backends are listed one line each in ``BACKENDS``: a factory
taking the test's temporary directory. PostgreSQL comes from ``AGENTSNAP_TEST_POSTGRES_URL``
and is skipped, with that reason, without it.

**Roles.** A backend claims the store roles it implements (``CLAIMS``; every role unless
listed there), and a test using ``store`` says which it needs with
``@pytest.mark.store_roles("runs", "log", ...)`` (every role when it says nothing). A test is
run on each backend that claims every role it needs, and left out of the others (deselected,
not skipped: a backend that does not keep distributed parts has nothing to skip). The roles:

- ``runs``: [`RunStore`][agentsnap.store.RunStore] (runs, snapshots, rollbacks, schemas);
- ``log``: [`RunLog`][agentsnap.store.RunLog] (journal and replay log);
- ``leases``: [`RunLeases`][agentsnap.store.RunLeases] (run leases and fencing);
- ``queries``: [`RunQueries`][agentsnap.store.RunQueries] (listings, pages, summaries);
- ``parts``: [`DistributedParts`][agentsnap.store.DistributedParts] (snapshot parts, agent
  leases).

A one-process run needs ``runs``, ``log`` and ``leases`` (a
[`OneProcessStore`][agentsnap.store.OneProcessStore]).

However the test run was started, the processes tests start get Ctrl-C (SIGINT) delivered:
see ``pytest_configure``.
"""

from __future__ import annotations

import signal
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from distributed_teardown import Teardown
from one_process_store import OneProcessDouble
from postgres_db import postgres_url_or_skip

from agentsnap.store import MemoryStore, OneProcessStore, Store
from agentsnap.store.sql import SqlStore

StoreFactory = Callable[[Path], Store]
ROLES = frozenset({"runs", "log", "leases", "queries", "parts"})
"""Every store role, as ``store_roles`` names them."""
ONE_PROCESS = frozenset({"runs", "log", "leases"})
"""The roles of a ``OneProcessStore``."""


def pytest_configure(config: pytest.Config) -> None:
    """Handle SIGINT as Python does by default, even when this process was started ignoring it.

    A shell running a command in the background without job control (``(make test &)`` in a
    script, or a launcher doing so) starts it with SIGINT ignored, and an ignored signal stays
    ignored in every process it starts in turn: the examples and servers that tests stop with
    Ctrl-C would then never see it. A handled signal is reset to its default in a child, so
    with Python's handler here they get Ctrl-C again (see ``ctrl_c.py``).
    """
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def make_memory_store(tmp_path: Path) -> Store:
    return MemoryStore()


def make_sqlite_store(tmp_path: Path) -> Store:
    return SqlStore(f"sqlite:///{tmp_path / 'agentsnap.db'}")


def make_postgres_store(tmp_path: Path) -> Store:
    return SqlStore(postgres_url_or_skip())


def make_one_process_store(tmp_path: Path) -> OneProcessStore:
    return OneProcessDouble()


CLAIMS: dict[Callable[[Path], object], frozenset[str]] = {make_one_process_store: ONE_PROCESS}
"""The roles of each backend that does not implement them all."""

SQL_BACKENDS = [
    pytest.param(make_sqlite_store, id="sqlite"),
    pytest.param(make_postgres_store, id="postgres", marks=pytest.mark.postgres),
]
BACKENDS = [
    pytest.param(make_memory_store, id="memory"),
    *SQL_BACKENDS,
    pytest.param(make_one_process_store, id="one-process"),
]


def roles_needed(item: pytest.Item) -> frozenset[str]:
    """The store roles ``item`` says it needs (every role when it says nothing)."""
    marks = list(item.iter_markers("store_roles"))
    if not marks:
        return ROLES
    needed = frozenset(role for mark in marks for role in mark.args)
    unknown = needed - ROLES
    if unknown:
        raise pytest.UsageError(f"{item.nodeid}: unknown store roles {sorted(unknown)}")
    return needed


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Leave out the tests needing roles their ``store`` backend does not claim."""
    kept: list[pytest.Item] = []
    left: list[pytest.Item] = []
    for item in items:
        callspec = getattr(item, "callspec", None)
        factory = callspec.params.get("store") if callspec is not None else None
        claims = CLAIMS.get(factory, ROLES) if callable(factory) else ROLES
        (kept if roles_needed(item) <= claims else left).append(item)
    if left:
        config.hook.pytest_deselected(items=left)
        items[:] = kept


@pytest.fixture(params=BACKENDS)
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    """A fresh, empty store of each backend; closed after the test."""
    factory: StoreFactory = request.param
    made = factory(tmp_path)
    try:
        yield made
    finally:
        await made.close()


@pytest.fixture(params=SQL_BACKENDS)
async def sql_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[SqlStore]:
    """A fresh, empty SqlStore on SQLite and on PostgreSQL; closed after the test."""
    factory: StoreFactory = request.param
    made = factory(tmp_path)
    assert isinstance(made, SqlStore)
    try:
        yield made
    finally:
        await made.close()


@pytest.fixture
def postgres_url() -> str:
    """The test PostgreSQL database, emptied; skips when none is configured."""
    return postgres_url_or_skip()


@pytest.fixture(
    params=[
        pytest.param("sqlite", id="sqlite"),
        pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
    ]
)
def empty_db(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The URL of an empty database: an SQLite file, then PostgreSQL (emptied)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'agentsnap.db'}"
    url: str = request.getfixturevalue("postgres_url")
    return url


@pytest.fixture
async def teardown() -> AsyncIterator[Teardown]:
    """Closes what a test of a run spread over processes opened, in order, after the test
    (see ``distributed_teardown.py``).
    """
    done = Teardown()
    try:
        yield done
    finally:
        await done.close()


@pytest.fixture(autouse=True)
def _terminal_width_from_the_test(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tables printed in a test are not fitted to the terminal the suite was started from.

    A shell that exports ``COLUMNS`` would otherwise make the CLI cut wide columns; a test
    that is about the width sets it itself.
    """
    monkeypatch.delenv("COLUMNS", raising=False)
