"""Schema migrations: upgrade, downgrade and check agentsnap's tables with Alembic.

The migration scripts live in the repository's top-level ``migrations/`` folder and are
shipped inside the wheel as ``agentsnap/_migrations``, so these functions (and the
``agentsnap db`` commands built on them) work from an installed package.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, inspect, pool
from sqlalchemy.engine import make_url

from agentsnap.exceptions import ConfigurationError, SchemaOutOfDate, StoreError
from agentsnap.store.dialect import POSTGRES_INSTALL, check_database, sync_url
from agentsnap.store.tables import VERSION_TABLE, Base

__all__ = [
    "POSTGRES_INSTALL",
    "alembic_config",
    "check_database",
    "current",
    "downgrade",
    "ensure_schema",
    "head",
    "migrations_dir",
    "sync_url",
    "upgrade",
]


def migrations_dir() -> Path:
    """Where the migration scripts are: inside the package when installed from a wheel."""
    package = Path(__file__).resolve().parent.parent
    for candidate in (package / "_migrations", package.parent / "migrations"):
        if (candidate / "env.py").is_file():
            return candidate
    raise ConfigurationError(
        "agentsnap's migration scripts are missing from this installation; reinstall agentsnap"
    )


def alembic_config(url: str) -> Config:
    """An Alembic configuration for agentsnap's schema in the database at ``url``."""
    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    config.set_main_option("sqlalchemy.url", sync_url(url).replace("%", "%%"))
    return config


def script_directory() -> ScriptDirectory:
    """Alembic's view of agentsnap's migrations."""
    return ScriptDirectory.from_config(alembic_config("sqlite://"))


def head() -> str:
    """The newest schema revision this version of agentsnap knows."""
    revision = script_directory().get_current_head()
    assert revision is not None, "agentsnap ships at least one migration"
    return revision


def current(url: str) -> str | None:
    """The schema revision of the database at ``url`` (``None`` for an empty database)."""
    engine = create_engine(sync_url(url), poolclass=pool.NullPool)
    try:
        with engine.connect() as connection:
            context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
            return context.get_current_revision()
    finally:
        engine.dispose()


def upgrade(url: str, revision: str = "head") -> None:
    """Upgrade the schema of the database at ``url`` to ``revision``."""
    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str = "base") -> None:
    """Downgrade the schema of the database at ``url`` to ``revision``."""
    command.downgrade(alembic_config(url), revision)


def ensure_schema(url: str, *, create: bool = True) -> None:
    """Make the database at ``url`` ready for a store.

    An empty database (no agentsnap tables) is brought to the newest revision when ``create``
    is true; one at the newest revision is used as it is.

    Raises:
        SchemaOutOfDate: The database holds agentsnap tables at another revision; the message
            says which command upgrades it.
        StoreError: ``create`` is false and there is no agentsnap database at ``url``, or
            the database cannot be where ``url`` says (an SQLite file whose directory does
            not exist, say: see [`check_database`][agentsnap.store.dialect.check_database]).
    """
    # Alembic's script loading is not safe in two threads at once (a store and its ledger
    # open the same database together): one schema check at a time in a process.
    with _schema_lock:
        _ensure_schema(url, create=create)


_schema_lock = threading.Lock()


def _ensure_schema(url: str, *, create: bool) -> None:
    shown = make_url(url).render_as_string(hide_password=True)
    check_database(url, create=create)
    needed = head()
    found = current(url)
    if found == needed:
        return
    if found is None and not _has_tables(url):
        if not create:
            raise StoreError(
                f"{shown} holds no agentsnap runs (it has no agentsnap tables): check the --db "
                "URL, or run `agentsnap db upgrade` to add them"
            )
        upgrade(url)
        return
    raise SchemaOutOfDate(shown, found, needed)


class SchemaGate:
    """Checks once, off the event loop, that a database is ready for a store or ledger.

    Args:
        url: The database.
        create: Create the schema in an empty database (see ``ensure_schema``).
        then: Awaited once the schema is there (to open a writer's connection, say).
    """

    def __init__(
        self, url: str, *, create: bool, then: Callable[[], Awaitable[None]] | None = None
    ) -> None:
        self._url = url
        self._create = create
        self._then = then
        self._ready = False
        self._lock = asyncio.Lock()

    async def wait(self) -> None:
        """Return once the database is ready; the first caller does the work.

        Raises:
            SchemaOutOfDate: The schema is at another revision.
            StoreError: ``create`` is false and there is no agentsnap database.
        """
        if self._ready:
            return
        async with self._lock:
            if not self._ready:
                # Alembic is synchronous: run it off the event loop.
                await asyncio.to_thread(ensure_schema, self._url, create=self._create)
                if self._then is not None:
                    await self._then()
                self._ready = True


def _has_tables(url: str) -> bool:
    engine = create_engine(sync_url(url), poolclass=pool.NullPool)
    try:
        with engine.connect() as connection:
            existing = set(inspect(connection).get_table_names())
    finally:
        engine.dispose()
    return bool(existing & set(Base.metadata.tables))
