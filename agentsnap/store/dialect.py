"""What differs between the databases agentsnap stores in, in one place per concern.

Each database is one [`Dialect`][agentsnap.store.dialect.Dialect]: SQLite
([`SqliteDialect`][agentsnap.store.dialect.SqliteDialect]) and PostgreSQL
([`PostgresDialect`][agentsnap.store.dialect.PostgresDialect]).
[`dialect_of`][agentsnap.store.dialect.dialect_of] finds the one for a URL or a connection's
dialect name. A dialect owns:

- **URLs**: which schemes it accepts (``postgres://`` is PostgreSQL), which URLs are
  malformed for it (an SQLite URL with a host: ``sqlite://tmp/x.db``), and the synchronous
  and asyncio drivers to use ([`sync_url`][agentsnap.store.dialect.sync_url],
  [`async_url`][agentsnap.store.dialect.async_url]);
- **the database's place**: whether an SQLite file can be opened or created where its URL
  says, checked before any connection ([`check_database`][agentsnap.store.dialect.check_database]);
- **statements**: insert-or-ignore and upsert on a table's key, whether ``RETURNING`` is
  supported, and an exact, case-sensitive "starts with" condition;
- **error classification**: which of the driver's error codes are passing faults (the base
  of [`agentsnap.store.faults`][agentsnap.store.faults]), and how to create a database the
  driver says does not exist;
- **connections**: engine options bounding each attempt, and, for SQLite, the one
  connection set-up used everywhere (WAL, ``synchronous``, foreign keys, busy timeout;
  [`connect_sqlite`][agentsnap.store.dialect.connect_sqlite] and
  [`sqlite_setup`][agentsnap.store.dialect.sqlite_setup]).

Supporting another database is one more ``Dialect`` subclass listed in ``DIALECTS``.

Example:
    ```python
    from agentsnap.store.dialect import dialect_of, sync_url

    print(dialect_of("sqlite:///agentsnap.db").name)  # sqlite
    print(sync_url("sqlite+aiosqlite:///agentsnap.db"))  # sqlite:///agentsnap.db
    ```
"""

from __future__ import annotations

import importlib.util
import math
import re
import shlex
import sqlite3
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar

from sqlalchemy import ColumnElement, Table, and_, func
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import URL, make_url
from sqlalchemy.sql.dml import Insert

from agentsnap.exceptions import ConfigurationError, StoreError
from agentsnap.store._fault_kinds import Fault

__all__ = [
    "DIALECTS",
    "POSTGRES_INSTALL",
    "Dialect",
    "PostgresDialect",
    "SqliteDialect",
    "async_url",
    "check_database",
    "connect_sqlite",
    "database_exists",
    "dialect_of",
    "driver_fault",
    "driver_remedy",
    "parse_url",
    "redacted_url",
    "sqlite_file",
    "sqlite_setup",
    "sync_url",
]

POSTGRES_INSTALL = "pip install 'agentsnap[postgres]'"
"""The command that installs the PostgreSQL driver."""

_LIKE_ESCAPE = "\\"


class Dialect(ABC):
    """One database: its URLs, statements, error codes and connection set-up."""

    name: ClassVar[str]
    """SQLAlchemy's name of the backend (``connection.dialect.name``)."""

    schemes: ClassVar[frozenset[str]]
    """The backend names of the URLs it accepts (``postgres`` as well as ``postgresql``)."""

    sync_driver: ClassVar[str]
    """The ``drivername`` of synchronous engines."""

    async_driver: ClassVar[str]
    """The ``drivername`` of asyncio engines."""

    supports_returning: ClassVar[bool] = True
    """Whether ``INSERT … RETURNING`` and ``UPDATE … RETURNING`` work."""

    one_writer: ClassVar[bool] = False
    """Whether the database lets one writer in at a time (writes take turns in the process)."""

    share_lock: ClassVar[str] = " FOR SHARE"
    """What ends a ``SELECT`` that keeps the rows it read from changing until the transaction
    ends (nothing where there are no row locks: SQLite's one writer holds everything off)."""

    bounded: ClassVar[bool] = True
    """Whether waits must be bounded by the retry policy's timeout (a network can stay
    silent; SQLite bounds its own waits with its busy timeout)."""

    def sync_url(self, url: URL) -> str:
        """``url`` with the synchronous driver, as a string (password kept)."""
        return url.set(drivername=self.sync_driver).render_as_string(hide_password=False)

    def async_url(self, url: URL) -> str:
        """``url`` with the asyncio driver, as a string (password kept)."""
        return url.set(drivername=self.async_driver).render_as_string(hide_password=False)

    def check_driver(self) -> None:  # noqa: B027 (most dialects need nothing checked)
        """Refuse early when the driver is not installed.

        Raises:
            ConfigurationError: The driver is missing (the message names how to install it).
        """

    def check_url(self, url: URL) -> None:  # noqa: B027 (most dialects need nothing checked)
        """Refuse a URL of this database that its driver cannot open, saying how to write it.

        Raises:
            ConfigurationError: The URL is malformed for this database.
        """

    def check_database(self, url: URL, *, create: bool) -> None:  # noqa: B027
        """Check, without connecting or creating anything, that ``url`` can name a database.

        Only what can be known without a connection is checked (a server's databases are
        not: connecting says whether one exists).

        Raises:
            StoreError: The database cannot be where ``url`` says; the message says what to do.
        """

    def remedy(self, fault: Fault, error: BaseException) -> str | None:
        """What to do about ``fault``, which the driver's ``error`` is; ``None`` if nothing new."""
        return None

    @abstractmethod
    def insert(self, table: Table) -> Any:
        """The dialect's ``INSERT`` of ``table``, with ``on_conflict_do_nothing``/``_update``."""

    def insert_or_ignore(self, table: Table, key: Sequence[str]) -> Insert:
        """An ``INSERT`` of ``table`` that keeps the existing row on a conflict on ``key``."""
        return self.insert(table).on_conflict_do_nothing(index_elements=list(key))  # type: ignore[no-any-return]

    def upsert(self, table: Table, key: Sequence[str], updated: Sequence[str]) -> Insert:
        """An ``INSERT`` of ``table`` that updates ``updated`` on a conflict on ``key``."""
        statement = self.insert(table)
        return statement.on_conflict_do_update(  # type: ignore[no-any-return]
            index_elements=list(key),
            set_={name: statement.excluded[name] for name in updated},
        )

    @abstractmethod
    def starts_with(self, column: ColumnElement[str], prefix: str) -> ColumnElement[bool]:
        """A condition that ``column`` starts with ``prefix``, exactly and case-sensitively.

        ``prefix`` is taken as it is (no wildcards); it is not empty.
        """

    @abstractmethod
    def fault(self, error: BaseException) -> Fault | None:
        """The fault the driver's ``error`` says it is by its code; ``None`` if not its error."""

    @abstractmethod
    def engine_options(self, timeout: float) -> dict[str, Any]:
        """Engine options bounding one attempt (connect, statement, lock wait) by ``timeout``."""


class SqliteDialect(Dialect):
    """SQLite: a file, one writer at a time, in WAL mode."""

    name = "sqlite"
    schemes = frozenset({"sqlite"})
    sync_driver = "sqlite"
    async_driver = "sqlite+aiosqlite"
    one_writer = True
    share_lock = ""
    bounded = False

    _CODES: ClassVar[dict[int, Fault]] = {
        sqlite3.SQLITE_BUSY: Fault.LOCKED,
        sqlite3.SQLITE_LOCKED: Fault.LOCKED,
        sqlite3.SQLITE_FULL: Fault.DISK_FULL,
        sqlite3.SQLITE_IOERR: Fault.UNAVAILABLE,
        sqlite3.SQLITE_CANTOPEN: Fault.UNAVAILABLE,
        sqlite3.SQLITE_PROTOCOL: Fault.UNAVAILABLE,
    }

    def check_url(self, url: URL) -> None:
        """Refuse an SQLite URL with a host, user or port: ``sqlite://tmp/x.db`` (two slashes).

        SQLAlchemy would refuse it only on the first connection, naming the asyncio driver.

        Raises:
            ConfigurationError: The URL has a host, user or port; the message shows how to
                write the file it probably names.
        """
        if url.host is None and url.port is None and url.username is None:
            return
        named = "/".join(part for part in (url.host, url.database) if part)
        shown = url.render_as_string(hide_password=True)
        raise ConfigurationError(
            f"{shown!r} is not a valid SQLite URL: it has a host, user or port, and an SQLite "
            "URL names its file after three slashes (sqlite:///relative/path.db, or "
            f"sqlite:////absolute/path.db). Write sqlite:///{named} for {named} under the "
            f"current directory, or sqlite:////{named} for /{named}"
        )

    def check_database(self, url: URL, *, create: bool) -> None:
        """Check that the SQLite file is one, or (when ``create`` is true) can be created.

        Nothing is checked for an in-memory database, nor the directory of a ``file:`` URI.

        Raises:
            StoreError: The file is a directory, or a file that is not an SQLite database,
                or its directory does not exist, or (when ``create`` is false) it does not
                exist. The message says what to do.
        """
        database = url.database
        if database in {None, "", ":memory:"}:
            return
        # A ``file:`` URI names its file in SQLite's own syntax: its directory is not looked for.
        uri = url.query.get("uri") in {"true", "1"} and database.startswith("file:")
        path = Path(database)
        shown = url.render_as_string(hide_password=True)
        if path.is_dir():
            raise StoreError(
                f"{path} is a directory, not an SQLite database: give a file with "
                f"--db sqlite:///{path / 'agentsnap.db'}"
            )
        if not path.exists():
            if not uri:
                _check_directory(path, shown, create=create)
            if not create:
                raise StoreError(f"there is no database at {shown}: check the --db URL")
            return
        # Ask SQLite itself, never by opening the file directly: closing another descriptor
        # of a database file drops the POSIX locks this process's connections hold on it.
        try:
            probe = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
            try:
                probe.execute("PRAGMA schema_version")
            finally:
                probe.close()
        except sqlite3.DatabaseError as exc:
            if getattr(exc, "sqlite_errorcode", 0) & 0xFF == sqlite3.SQLITE_NOTADB:
                raise StoreError(
                    f"{path} is not an SQLite database (it is some other file): check the --db URL"
                ) from exc
            # Anything else (a lock, say) is for the store's own connection to meet and retry.

    def insert(self, table: Table) -> Any:  # noqa: D102
        return sqlite.insert(table)

    def starts_with(self, column: ColumnElement[str], prefix: str) -> ColumnElement[bool]:
        """A range of the column (``prefix <= column < successor``).

        Exact under SQLite's default binary collation, and answered from an index whose first
        column is ``column`` (SQLite's ``LIKE`` would ignore case).
        """
        assert prefix, "a prefix is never empty"
        if ord(prefix[-1]) == sys.maxunicode:  # no successor: compare the start itself
            return func.substr(column, 1, len(prefix)) == prefix
        successor = prefix[:-1] + chr(ord(prefix[-1]) + 1)
        return and_(column >= prefix, column < successor)

    def fault(self, error: BaseException) -> Fault | None:
        """By the extended result code's primary part; a code-less error is a programming one."""
        if not isinstance(error, sqlite3.Error):
            return None
        code = getattr(error, "sqlite_errorcode", None)
        if code is None:  # a programming error of the module, not the database
            return Fault.PERMANENT
        return self._CODES.get(code & 0xFF, Fault.PERMANENT)

    def engine_options(self, timeout: float) -> dict[str, Any]:
        """A busy timeout (the driver's ``timeout``)."""
        return {"connect_args": {"timeout": timeout}}


class PostgresDialect(Dialect):
    """PostgreSQL, through psycopg 3."""

    name = "postgresql"
    schemes = frozenset({"postgresql", "postgres"})
    sync_driver = "postgresql+psycopg"
    async_driver = "postgresql+psycopg"

    # SQLSTATE codes, exact first, then by class (the first two characters).
    _SQLSTATE: ClassVar[dict[str, Fault]] = {
        "57P01": Fault.UNAVAILABLE,  # admin_shutdown
        "57P02": Fault.UNAVAILABLE,  # crash_shutdown
        "57P03": Fault.UNAVAILABLE,  # cannot_connect_now (starting up)
        "57P05": Fault.CONNECTION,  # idle_session_timeout
        "57014": Fault.TIMEOUT,  # query_canceled (statement_timeout)
        "40001": Fault.CONFLICT,  # serialization_failure
        "40P01": Fault.CONFLICT,  # deadlock_detected
        "55P03": Fault.LOCKED,  # lock_not_available (lock_timeout)
        "53100": Fault.DISK_FULL,  # disk_full
        "58030": Fault.UNAVAILABLE,  # io_error
        "3D000": Fault.MISSING,  # invalid_catalog_name (the database does not exist)
    }
    _SQLSTATE_CLASS: ClassVar[dict[str, Fault]] = {
        "08": Fault.CONNECTION,  # connection_exception
        "53": Fault.UNAVAILABLE,  # insufficient_resources (out of memory, connections)
    }

    def check_driver(self) -> None:
        """Refuse when psycopg is missing.

        Raises:
            ConfigurationError: psycopg is not installed.
        """
        try:
            found = importlib.util.find_spec("psycopg") is not None
        except (ImportError, ValueError):  # a broken or half-imported installation
            found = False
        if not found:
            raise ConfigurationError(
                "PostgreSQL needs the psycopg driver, which is not installed: "
                f"run `{POSTGRES_INSTALL}`"
            )

    def insert(self, table: Table) -> Any:  # noqa: D102
        return postgresql.insert(table)

    def starts_with(self, column: ColumnElement[str], prefix: str) -> ColumnElement[bool]:
        """A ``LIKE`` with the wildcards of ``prefix`` escaped.

        The index answers it when the database's collation is ``C``, a scan otherwise: a
        range would follow the database's collation, which need not order strings by their
        characters.
        """
        assert prefix, "a prefix is never empty"
        pattern = (
            prefix.replace(_LIKE_ESCAPE, _LIKE_ESCAPE * 2)
            .replace("%", _LIKE_ESCAPE + "%")
            .replace("_", _LIKE_ESCAPE + "_")
        )
        return column.like(pattern + "%", escape=_LIKE_ESCAPE)

    def fault(self, error: BaseException) -> Fault | None:
        """By SQLSTATE; a psycopg error without one failed on the client's side."""
        sqlstate = getattr(error, "sqlstate", None)
        if isinstance(sqlstate, str) and len(sqlstate) == 5:
            return self._SQLSTATE.get(sqlstate) or self._SQLSTATE_CLASS.get(
                sqlstate[:2], Fault.PERMANENT
            )
        if type(error).__module__.startswith("psycopg"):
            # libpq keeps no SQLSTATE for a refused connection: the server's refusal to
            # open a database that does not exist (3D000) is told by its message alone.
            if _MISSING_DATABASE.search(str(error)):
                return Fault.MISSING
            # No SQLSTATE: the client's side failed (refused, reset, closed connection).
            if type(error).__name__ in {"OperationalError", "InterfaceError"}:
                return Fault.CONNECTION
            return Fault.PERMANENT
        return None

    def remedy(self, fault: Fault, error: BaseException) -> str | None:
        """For a missing database, the commands that create it (its name from the driver)."""
        if fault is not Fault.MISSING:
            return None
        name = _missing_name(error)
        if name is None:
            return "create it with `createdb NAME` or `CREATE DATABASE NAME`, or fix the URL"
        identifier = (
            name if _PLAIN_IDENTIFIER.fullmatch(name) else '"' + name.replace('"', '""') + '"'
        )
        return (
            f"create it with `createdb {shlex.quote(name)}` (or `CREATE DATABASE {identifier}` "
            "in psql), or fix the database name in the URL"
        )

    def engine_options(self, timeout: float) -> dict[str, Any]:
        """A connect timeout, a ``statement_timeout`` and an
        ``idle_in_transaction_session_timeout`` of three times ``timeout``.

        The last is for a client cut off by the network in the middle of a transaction: the
        server hears nothing more from it, and would keep its session, and the rows it
        locked (an agent's lease, a ledger key), for as long as the operating system keeps
        the dead connection open (hours), so that no other process could take them over.
        """  # noqa: D205
        statement = math.ceil(timeout * 1000)
        return {
            "connect_args": {
                # libpq takes whole seconds and treats less than 2 as 2.
                "connect_timeout": max(2, math.ceil(timeout)),
                "options": f"-c statement_timeout={statement} "
                f"-c idle_in_transaction_session_timeout={3 * statement}",
            }
        }


_MISSING_DATABASE = re.compile(r'database "(?P<name>[^"]*)" does not exist')
"""The server's message for SQLSTATE 3D000 (in English, the server's default)."""

_PLAIN_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_$]*")
"""A PostgreSQL identifier that needs no quotes."""


def _missing_name(error: BaseException) -> str | None:
    """The name of the database that ``error`` says does not exist, if it tells."""
    found = _MISSING_DATABASE.search(str(error))
    if found:
        return found["name"]
    if getattr(error, "sqlstate", None) is None:  # refused at connect: the one it asked for
        name = getattr(getattr(error, "pgconn", None), "db", None)
        if isinstance(name, bytes) and name:
            return name.decode("utf-8", "replace")
    return None


def _check_directory(path: Path, shown: str, *, create: bool) -> None:
    """Refuse an SQLite file whose directory does not exist, naming the directory."""
    folder = path.absolute().parent
    if folder.is_dir():
        return
    missing = f"its directory {folder} does not exist"
    if folder.exists():
        missing = f"{folder} is a file, not a directory"
    if not create:
        raise StoreError(f"there is no database at {shown} ({missing}): check the --db URL")
    fix = (
        ""
        if folder.exists()
        else f"create the directory (`mkdir -p {shlex.quote(str(folder))}`), or "
    )
    raise StoreError(
        f"cannot create the SQLite database {path}: {missing}; {fix}give a path in a "
        "directory that exists"
    )


DIALECTS: tuple[Dialect, ...] = (SqliteDialect(), PostgresDialect())
"""Every database agentsnap stores in."""

_BY_NAME = {scheme: dialect for dialect in DIALECTS for scheme in dialect.schemes}


def parse_url(url: str | URL) -> URL:
    """``url`` parsed.

    Raises:
        ConfigurationError: It is not a database URL.
    """
    if isinstance(url, URL):
        return url
    try:
        return make_url(url)
    except Exception as exc:
        raise ConfigurationError(f"{url!r} is not a database URL: {exc}") from exc


def dialect_of(url: str | URL) -> Dialect:
    """The dialect of a database URL, or of a backend name (``connection.dialect.name``).

    Raises:
        ConfigurationError: Neither SQLite nor PostgreSQL, not a URL, or a URL malformed for
            its database (``sqlite://tmp/x.db``); the message shows how to write it.
    """
    if isinstance(url, str) and url in _BY_NAME:
        return _BY_NAME[url]
    parsed = parse_url(url)
    backend = parsed.get_backend_name()
    try:
        dialect = _BY_NAME[backend]
    except KeyError:
        raise ConfigurationError(
            f"agentsnap stores runs in SQLite or PostgreSQL; {str(url)!r} is a {backend} URL"
        ) from None
    dialect.check_url(parsed)
    return dialect


def sync_url(url: str) -> str:
    """The URL with a synchronous driver: ``sqlite`` or ``postgresql+psycopg``.

    ``postgres://`` (as Heroku and others write it) is taken for ``postgresql://``.

    Raises:
        ConfigurationError: The URL is not an SQLite or PostgreSQL URL, or it is a PostgreSQL
            URL and the psycopg driver is not installed (the message names the command that
            installs it).
    """
    parsed = parse_url(url)
    dialect = dialect_of(parsed)
    dialect.check_driver()
    return dialect.sync_url(parsed)


def async_url(url: str) -> str:
    """The URL with an asyncio driver: ``sqlite+aiosqlite`` or ``postgresql+psycopg``.

    Raises:
        ConfigurationError: As for [`sync_url`][agentsnap.store.dialect.sync_url].
    """
    parsed = parse_url(url)
    dialect = dialect_of(parsed)
    dialect.check_driver()
    return dialect.async_url(parsed)


def redacted_url(url: str) -> str:
    """``url`` as messages and ``repr`` show it: its password hidden."""
    return make_url(url).render_as_string(hide_password=True)


def sqlite_file(url: str) -> str | None:
    """The file of an SQLite URL; ``None`` for an in-memory SQLite database or another one.

    Raises:
        ConfigurationError: As for [`sync_url`][agentsnap.store.dialect.sync_url].
    """
    parsed = parse_url(url)
    if dialect_of(parsed).name != SqliteDialect.name:
        return None
    database = parsed.database
    if database in {None, "", ":memory:"} or "mode=memory" in str(url):
        return None
    return database


def check_database(url: str, *, create: bool) -> None:
    """Check, without connecting or creating anything, that ``url`` can name a database.

    For SQLite: the file is not a directory nor another kind of file, its directory exists,
    and (when ``create`` is false) the file exists. Nothing is checked for a PostgreSQL URL
    (the server says whether its database exists), nor for an in-memory SQLite one.

    Raises:
        ConfigurationError: As for [`sync_url`][agentsnap.store.dialect.sync_url].
        StoreError: The database cannot be where ``url`` says; the message says what to do.
    """
    parsed = parse_url(url)
    dialect_of(parsed).check_database(parsed, create=create)


def database_exists(url: str) -> bool:
    """False for an SQLite URL naming a file that does not exist, else true.

    A server's databases are not looked for: connecting says whether one exists.

    Raises:
        ConfigurationError: As for [`sync_url`][agentsnap.store.dialect.sync_url].
    """
    path = sqlite_file(url)
    return path is None or Path(path).exists()


def driver_fault(error: BaseException) -> Fault | None:
    """The fault a driver's error says it is by its code, for whichever dialect it is from."""
    for dialect in DIALECTS:
        fault = dialect.fault(error)
        if fault is not None:
            return fault
    return None


def driver_remedy(fault: Fault, error: BaseException) -> str | None:
    """What to do about ``fault``, as the dialect of the driver's ``error`` knows it."""
    for dialect in DIALECTS:
        if dialect.fault(error) is not None:
            return dialect.remedy(fault, error)
    return None


# SQLite connections: one set-up for every connection agentsnap opens.


def _sqlite_pragmas(timeout: float, synchronous: str) -> tuple[str, ...]:
    if synchronous not in {"NORMAL", "FULL"}:
        raise ConfigurationError(f"synchronous must be NORMAL or FULL, not {synchronous!r}")
    return (
        f"PRAGMA busy_timeout={max(0, round(timeout * 1000))}",
        "PRAGMA journal_mode=WAL",
        f"PRAGMA synchronous={synchronous}",
        "PRAGMA foreign_keys=ON",
    )


def sqlite_setup(*, timeout: float, synchronous: str = "NORMAL") -> Callable[[Any, Any], None]:
    """A ``connect`` event listener that sets an SQLite connection up as agentsnap does.

    WAL mode, ``synchronous`` (``NORMAL``, or ``FULL`` to flush every commit), foreign keys
    on, and a busy timeout of ``timeout`` seconds. Pass it to
    ``sqlalchemy.event.listen(engine, "connect", …)`` (the ``sync_engine`` of an asyncio
    engine).

    Raises:
        ConfigurationError: ``synchronous`` is neither of those.
    """
    pragmas = _sqlite_pragmas(timeout, synchronous)

    def set_up(dbapi_connection: Any, record: Any) -> None:
        cursor = dbapi_connection.cursor()
        try:
            for pragma in pragmas:
                cursor.execute(pragma)
        finally:
            cursor.close()

    return set_up


def connect_sqlite(
    path: str, *, timeout: float, synchronous: str = "NORMAL", **options: Any
) -> sqlite3.Connection:
    """A plain ``sqlite3`` connection to ``path``, set up as ``sqlite_setup`` does.

    It is in autocommit mode (``BEGIN`` starts a transaction) and may be used from any
    thread (one at a time).

    Args:
        path: The database file.
        timeout: Seconds to wait for a lock (the busy timeout); 0 fails at once.
        synchronous: ``NORMAL`` or ``FULL``.
        **options: More keyword arguments for ``sqlite3.connect`` (``uri=True``…).

    Raises:
        ConfigurationError: ``synchronous`` is neither of those.
        sqlite3.Error: The file cannot be opened.
    """
    pragmas = _sqlite_pragmas(timeout, synchronous)
    connection: sqlite3.Connection = sqlite3.connect(
        path,
        **{"timeout": timeout, **options, "isolation_level": None, "check_same_thread": False},
    )
    try:
        for pragma in pragmas:
            connection.execute(pragma)
    except BaseException:
        connection.close()
        raise
    return connection
