"""LangGraph checkpoint storage in SQLite or PostgreSQL, on agentsnap's tables.

[`SqlGraphStore`][agentsnap.store.sql_graph.SqlGraphStore] implements
[`GraphCheckpointStore`][agentsnap.store.graph.GraphCheckpointStore]; the copying, pruning
and deleting of threads' history is SQL of its own (``agentsnap.store._graph_history``).
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import (
    AsyncIterator,
    Callable,
    Collection,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from contextlib import asynccontextmanager, contextmanager
from typing import Any, cast

from sqlalchemy import (
    Connection,
    Engine,
    Select,
    Table,
    create_engine,
    delete,
    event,
    select,
    text,
)
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from agentsnap.exceptions import ConfigurationError, StoreError
from agentsnap.store._graph_history import (
    VALUES_WITH_WRITES,
    Transaction,
    check_strategy,
    copy_thread,
    delete_runs,
    prune_threads,
)
from agentsnap.store.dialect import (
    connect_sqlite,
    dialect_of,
    sqlite_file,
    sqlite_setup,
    sync_url,
)
from agentsnap.store.faults import Fault, classify
from agentsnap.store.graph import (
    EMPTY,
    AsyncGraphReader,
    CheckpointFilter,
    GraphReader,
    Load,
    Merge,
    StoredCheckpoint,
    StoredValue,
    TaskKey,
    TaskWrites,
    written_value,
)
from agentsnap.store.migrate import ensure_schema
from agentsnap.store.tables import (
    LangGraphBlobRow,
    LangGraphCheckpointRow,
    LangGraphTaskWritesRow,
    table_of,
)

__all__ = ["CarriedWrites", "SqlGraphStore", "insert_sql"]

_checkpoints = table_of(LangGraphCheckpointRow)
_blobs = table_of(LangGraphBlobRow)
_writes = table_of(LangGraphTaskWritesRow)

_CHECKPOINT_KEY = ("thread_id", "checkpoint_ns", "checkpoint_id")
_CHECKPOINT_UPDATED = (
    "parent_checkpoint_id",
    "checkpoint_type",
    "checkpoint",
    "meta_type",
    "meta",
    "run_id",
)
_BLOB_KEY = ("thread_id", "checkpoint_ns", "channel", "version")
_WRITES_KEY = ("thread_id", "checkpoint_ns", "checkpoint_id", "task_id")
_CONFLICT_ATTEMPTS = 3
"""How often a history operation is tried on PostgreSQL when concurrent writes abort it."""

_SQLITE_TIMEOUT = 30.0
"""Seconds an SQLite connection waits for another process's write lock."""


def insert_sql(
    table: Table, key: Sequence[str], updated: Sequence[str] = (), placeholder: str = "?"
) -> str:
    """The text of an insert of a row of ``table`` (SQLite's, or PostgreSQL's with ``%s``).

    The row's values are ``placeholder`` parameters, in the order of the table's columns. On a
    conflict on ``key`` the existing row is kept, or its ``updated`` columns are updated.
    """
    columns = [column.name for column in table.columns]
    on_conflict = (
        "DO UPDATE SET " + ", ".join(f"{name} = excluded.{name}" for name in updated)
        if updated
        else "DO NOTHING"
    )
    return (
        f"INSERT INTO {table.name} ({', '.join(columns)}) "  # noqa: S608 (names of ours)
        f"VALUES ({', '.join(placeholder for _ in columns)}) "
        f"ON CONFLICT ({', '.join(key)}) {on_conflict}"
    )


# The SQLite write path runs these on a plain sqlite3 connection: the values are bound in
# the order of the tables' columns (the key's columns, for the last two).
_SQLITE_PUT_CHECKPOINT = insert_sql(_checkpoints, _CHECKPOINT_KEY, _CHECKPOINT_UPDATED)
_SQLITE_PUT_BLOB = insert_sql(_blobs, _BLOB_KEY)
_SQLITE_ADD_WRITES = insert_sql(_writes, _WRITES_KEY)
_SQLITE_GET_WRITES = (
    f"SELECT task_path, writes FROM {_writes.name} "  # noqa: S608 (names of ours)
    f"WHERE {' AND '.join(f'{name} = ?' for name in _WRITES_KEY)}"
)
_SQLITE_SET_WRITES = (
    f"UPDATE {_writes.name} SET task_path = ?, writes = ? "  # noqa: S608 (names of ours)
    f"WHERE {' AND '.join(f'{name} = ?' for name in _WRITES_KEY)}"
)
_SQLITE_DELETE_THREAD = [
    f"DELETE FROM {table.name} WHERE thread_id = ?"  # noqa: S608 (names of ours)
    for table in (_writes, _blobs, _checkpoints)
]

# The PostgreSQL write path runs these on psycopg's connection, pipelined in one transaction.
_PG_PUT_CHECKPOINT = insert_sql(_checkpoints, _CHECKPOINT_KEY, _CHECKPOINT_UPDATED, "%s")
_PG_PUT_BLOB = insert_sql(_blobs, _BLOB_KEY, (), "%s")
# A value that refers to a task's write carried in the same transaction, if that task's row
# holds the writes as carried (a row stored before with other writes keeps them).
_PG_PUT_REFERENCE = (
    f"INSERT INTO {_blobs.name} ({', '.join(column.name for column in _blobs.columns)}) "  # noqa: S608
    f"SELECT {', '.join('NULL' if column.name == 'value' else '%s' for column in _blobs.columns)} "
    f"FROM {_writes.name} WHERE {' AND '.join(f'{name} = %s' for name in _WRITES_KEY)} "
    f"AND writes = %s ON CONFLICT ({', '.join(_BLOB_KEY)}) DO NOTHING"
)
_PG_ADD_WRITES = insert_sql(_writes, _WRITES_KEY, (), "%s") + " RETURNING task_id"
_PG_GET_WRITES = (
    _SQLITE_GET_WRITES.replace("?", "%s") + " FOR UPDATE"  # the names hold no "?"
)
_PG_SET_WRITES = _SQLITE_SET_WRITES.replace("?", "%s")

# The PostgreSQL asyncio reads, on psycopg's async connection.
_PG_SELECT_VALUES = (
    "SELECT b.channel, b.version, b.value_type, b.value, b.write_idx, w.writes "  # noqa: S608
    f"FROM {_blobs.name} b LEFT JOIN {_writes.name} w "
    "ON w.thread_id = b.thread_id AND w.checkpoint_ns = b.checkpoint_ns "
    "AND w.checkpoint_id = b.write_checkpoint_id AND w.task_id = b.write_task_id "
    "WHERE b.thread_id = %s AND b.checkpoint_ns = %s "
    "AND b.channel = ANY(%s) AND b.version = ANY(%s)"
)
_PG_SELECT_TASK_WRITES = (
    f"SELECT task_id, task_path, writes FROM {_writes.name} "  # noqa: S608
    "WHERE thread_id = %s AND checkpoint_ns = %s AND checkpoint_id = %s"
)


_PG_SELECT_WRITES_AT = (
    f"SELECT checkpoint_id, task_id, task_path, writes FROM {_writes.name} "  # noqa: S608
    "WHERE thread_id = %s AND checkpoint_ns = %s AND checkpoint_id = ANY(%s)"
)


def _lineage_sql(placeholder: Callable[[str], str]) -> str:
    """A page of a checkpoint's lineage: the checkpoint, then its ancestors, nearest first.

    A recursive query that follows ``parent_checkpoint_id`` (not the order of ids, which
    are time-ordered only within one process), each step one lookup of the primary key.
    The depth bound (``last``) ends the recursion even where parents make a loop.
    ``placeholder`` spells a named parameter for the driver.
    """
    t, ns, start, last = (placeholder(name) for name in ("t", "ns", "start", "last"))
    columns = ", ".join(column.name for column in _checkpoints.columns)
    parent_columns = ", ".join(f"c.{column.name}" for column in _checkpoints.columns)
    return (
        f"WITH RECURSIVE lineage({columns}, depth) AS ("  # noqa: S608 (names of ours)
        f"SELECT {columns}, 0 FROM {_checkpoints.name} "
        f"WHERE thread_id = {t} AND checkpoint_ns = {ns} AND checkpoint_id = {start} "
        f"UNION ALL SELECT {parent_columns}, l.depth + 1 "
        f"FROM lineage l JOIN {_checkpoints.name} c ON c.thread_id = {t} "
        f"AND c.checkpoint_ns = {ns} AND c.checkpoint_id = l.parent_checkpoint_id "
        f"WHERE l.depth < {last}) "
        f"SELECT {columns} FROM lineage ORDER BY depth"
    )


def _sqlalchemy_parameter(name: str) -> str:
    return f":{name}"


def _psycopg_parameter(name: str) -> str:
    return f"%({name})s"


_LINEAGE = text(_lineage_sql(_sqlalchemy_parameter))
_PG_LINEAGE = _lineage_sql(_psycopg_parameter)
_LINEAGE_PAGES = (8, 32, 128, 512)
"""Checkpoints read per page of a lineage: growing, so a short walk reads little."""

_BATCH = 500
"""Values bound in one ``IN (…)`` list (well under SQLite's limit on bound values)."""


class _Lineage:
    """Follows a lineage page by page: which checkpoint starts the next page, and loops."""

    def __init__(self, thread_id: str, checkpoint_ns: str, start: str) -> None:
        self._key = {"t": thread_id, "ns": checkpoint_ns}
        self._pages = 0
        self._seen: set[str] = set()
        self.parameters: dict[str, Any] | None = self._page(start)
        """The next page's parameters, or ``None`` once the lineage has ended."""

    def _page(self, start: str) -> dict[str, Any]:
        size = _LINEAGE_PAGES[min(self._pages, len(_LINEAGE_PAGES) - 1)]
        self._pages += 1
        return {**self._key, "start": start, "last": size - 1}

    def take(self, rows: Sequence[Sequence[Any]]) -> list[StoredCheckpoint]:
        """The checkpoints of a page read with ``parameters``, up to a loop if there is one."""
        assert self.parameters is not None
        size = self.parameters["last"] + 1
        found: list[StoredCheckpoint] = []
        for row in rows:
            checkpoint = StoredCheckpoint(*row)
            if checkpoint.checkpoint_id in self._seen:
                self.parameters = None
                return found
            self._seen.add(checkpoint.checkpoint_id)
            found.append(checkpoint)
        parent = found[-1].parent_checkpoint_id if found else None
        self.parameters = self._page(parent) if parent and len(rows) == size else None
        return found


def _batches(items: Sequence[Any]) -> Iterator[Sequence[Any]]:
    for start in range(0, len(items), _BATCH):
        yield items[start : start + _BATCH]


def _checkpoints_sql(
    where: CheckpointFilter, placeholder: Callable[[str], str]
) -> tuple[str, dict[str, Any]]:
    """The query of the checkpoints that pass ``where``, newest first, and its parameters.

    ``placeholder`` spells a named parameter for the driver.
    """
    parameters: dict[str, Any] = dict(where.equal())
    conditions = [f"{column} = {placeholder(column)}" for column in parameters]
    if where.before is not None:
        conditions.append(f"checkpoint_id < {placeholder('before')}")
        parameters["before"] = where.before
    columns = ", ".join(column.name for column in _checkpoints.columns)
    sql = f"SELECT {columns} FROM {_checkpoints.name}"  # noqa: S608 (names of ours)
    if conditions:
        sql += " WHERE " + " AND ".join(conditions)
    sql += " ORDER BY checkpoint_id DESC, thread_id, checkpoint_ns"
    if where.limit is not None:
        sql += f" LIMIT {placeholder('limit')}"
        parameters["limit"] = where.limit
    return sql, parameters


def _values_query(
    thread_id: str, checkpoint_ns: str, channels: Iterable[str], versions: Iterable[str]
) -> Select[Any]:
    # Only the versions wanted (with other channels' at those versions, dropped by
    # ``_resolved``), rather than every version the thread ever had; a value that
    # refers to a task's write comes with the task's writes.
    return (
        select(
            _blobs.c.channel,
            _blobs.c.version,
            _blobs.c.value_type,
            _blobs.c.value,
            _blobs.c.write_idx,
            _writes.c.writes,
        )
        .select_from(VALUES_WITH_WRITES)
        .where(
            _blobs.c.thread_id == thread_id,
            _blobs.c.checkpoint_ns == checkpoint_ns,
            _blobs.c.channel.in_(sorted(set(channels))),
            _blobs.c.version.in_(sorted(set(versions))),
        )
    )


def _wanted_values(
    rows: Iterable[Sequence[Any]], versions: Mapping[str, str]
) -> list[tuple[str, str, bytes]]:
    """The values of ``versions`` among rows of ``_values_query``, references resolved."""
    found = _resolved(rows, set(versions.items()))
    return [(channel, *value) for (channel, _), value in found.items()]


def _resolved(
    rows: Iterable[Sequence[Any]], wanted: Collection[tuple[str, str]]
) -> dict[tuple[str, str], tuple[str, bytes]]:
    """The values of the ``wanted`` pairs among rows of ``_values_query``, references resolved."""
    found: dict[tuple[str, str], tuple[str, bytes]] = {}
    for channel, version, value_type, stored, write_idx, writes in rows:
        if (channel, version) not in wanted or value_type == EMPTY:
            continue
        value = stored
        if write_idx is not None:
            # A write that was deleted leaves the value missing, as a deleted value would.
            value = None if writes is None else written_value(writes, write_idx)
            if value is None:
                continue
        found[channel, version] = (value_type, value)
    return found


def _task_writes_query(thread_id: str, checkpoint_ns: str, checkpoint_id: str) -> Select[Any]:
    return select(_writes.c.task_id, _writes.c.task_path, _writes.c.writes).where(
        _writes.c.thread_id == thread_id,
        _writes.c.checkpoint_ns == checkpoint_ns,
        _writes.c.checkpoint_id == checkpoint_id,
    )


class _Reader(GraphReader):
    """A ``GraphReader`` on one SQLAlchemy connection."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection

    def checkpoints(self, where: CheckpointFilter) -> Iterator[StoredCheckpoint]:
        sql, parameters = _checkpoints_sql(where, _sqlalchemy_parameter)
        for row in self._connection.execute(text(sql), parameters):
            yield StoredCheckpoint(*row)

    def values(
        self, thread_id: str, checkpoint_ns: str, versions: Mapping[str, str]
    ) -> list[tuple[str, str, bytes]]:
        if not versions:
            return []
        rows = self._connection.execute(
            _values_query(thread_id, checkpoint_ns, versions, versions.values())
        )
        return _wanted_values(rows, versions)

    def task_writes(
        self, thread_id: str, checkpoint_ns: str, checkpoint_id: str
    ) -> list[TaskWrites]:
        rows = self._connection.execute(_task_writes_query(thread_id, checkpoint_ns, checkpoint_id))
        return [TaskWrites(*row) for row in rows]

    def lineage(
        self, thread_id: str, checkpoint_ns: str, checkpoint_id: str | None
    ) -> Iterator[StoredCheckpoint]:
        if not checkpoint_id:
            newest = self.checkpoint(thread_id, checkpoint_ns, None)
            if newest is None:
                return
            checkpoint_id = newest.checkpoint_id
        walk = _Lineage(thread_id, checkpoint_ns, checkpoint_id)
        while walk.parameters is not None:
            rows = self._connection.execute(_LINEAGE, walk.parameters).all()
            yield from walk.take(rows)

    def values_at(
        self, thread_id: str, checkpoint_ns: str, versions: Collection[tuple[str, str]]
    ) -> dict[tuple[str, str], tuple[str, bytes]]:
        wanted = set(versions)
        found: dict[tuple[str, str], tuple[str, bytes]] = {}
        channels = {channel for channel, _ in wanted}
        for batch in _batches(sorted({version for _, version in wanted})):
            query = _values_query(thread_id, checkpoint_ns, channels, batch)
            found.update(_resolved(self._connection.execute(query), wanted))
        return found

    def writes_at(
        self, thread_id: str, checkpoint_ns: str, checkpoint_ids: Collection[str]
    ) -> dict[str, list[TaskWrites]]:
        found: dict[str, list[TaskWrites]] = {}
        for batch in _batches(sorted(set(checkpoint_ids))):
            query = select(
                _writes.c.checkpoint_id, _writes.c.task_id, _writes.c.task_path, _writes.c.writes
            ).where(
                _writes.c.thread_id == thread_id,
                _writes.c.checkpoint_ns == checkpoint_ns,
                _writes.c.checkpoint_id.in_(batch),
            )
            for checkpoint_id, *row in self._connection.execute(query):
                found.setdefault(checkpoint_id, []).append(TaskWrites(*row))
        return found


class _AsyncReader(AsyncGraphReader):
    """An ``AsyncGraphReader`` on one of psycopg's async connections (PostgreSQL)."""

    def __init__(self, connection: Any) -> None:
        self._connection = connection

    async def _rows(self, sql: str, parameters: Sequence[Any] | Mapping[str, Any]) -> list[Any]:
        async with self._connection.cursor(binary=True) as cursor:
            await cursor.execute(sql, parameters)
            return cast(list[Any], await cursor.fetchall())

    async def checkpoints(self, where: CheckpointFilter) -> list[StoredCheckpoint]:
        sql, parameters = _checkpoints_sql(where, _psycopg_parameter)
        return [StoredCheckpoint(*row) for row in await self._rows(sql, parameters)]

    async def values(
        self, thread_id: str, checkpoint_ns: str, versions: Mapping[str, str]
    ) -> list[tuple[str, str, bytes]]:
        if not versions:
            return []
        rows = await self._rows(
            _PG_SELECT_VALUES,
            (thread_id, checkpoint_ns, list(versions), sorted(set(versions.values()))),
        )
        return _wanted_values(rows, versions)

    async def task_writes(
        self, thread_id: str, checkpoint_ns: str, checkpoint_id: str
    ) -> list[TaskWrites]:
        rows = await self._rows(_PG_SELECT_TASK_WRITES, (thread_id, checkpoint_ns, checkpoint_id))
        return [TaskWrites(*row) for row in rows]

    async def lineage(
        self, thread_id: str, checkpoint_ns: str, checkpoint_id: str | None
    ) -> AsyncIterator[StoredCheckpoint]:
        if not checkpoint_id:
            newest = await self.checkpoint(thread_id, checkpoint_ns, None)
            if newest is None:
                return
            checkpoint_id = newest.checkpoint_id
        walk = _Lineage(thread_id, checkpoint_ns, checkpoint_id)
        while walk.parameters is not None:
            for checkpoint in walk.take(await self._rows(_PG_LINEAGE, walk.parameters)):
                yield checkpoint

    async def values_at(
        self, thread_id: str, checkpoint_ns: str, versions: Collection[tuple[str, str]]
    ) -> dict[tuple[str, str], tuple[str, bytes]]:
        wanted = set(versions)
        if not wanted:
            return {}
        rows = await self._rows(
            _PG_SELECT_VALUES,
            (
                thread_id,
                checkpoint_ns,
                sorted({channel for channel, _ in wanted}),
                sorted({version for _, version in wanted}),
            ),
        )
        return _resolved(rows, wanted)

    async def writes_at(
        self, thread_id: str, checkpoint_ns: str, checkpoint_ids: Collection[str]
    ) -> dict[str, list[TaskWrites]]:
        found: dict[str, list[TaskWrites]] = {}
        if checkpoint_ids:
            rows = await self._rows(
                _PG_SELECT_WRITES_AT, (thread_id, checkpoint_ns, sorted(set(checkpoint_ids)))
            )
            for checkpoint_id, *row in rows:
                found.setdefault(checkpoint_id, []).append(TaskWrites(*row))
        return found


class _PgConnections:
    """The store's own psycopg connections (PostgreSQL), in autocommit mode, kept between uses.

    Sync and asyncio connections are kept apart; an asyncio connection serves the event
    loop that opened it only (one left by another loop is closed when next seen). At most
    ``keep`` idle connections of each kind are kept open.
    """

    def __init__(self, conninfo: str, keep: int = 4) -> None:
        self._conninfo = conninfo
        self._keep = keep
        self._lock = threading.Lock()
        self._idle: list[Any] = []
        self._aidle: list[tuple[asyncio.AbstractEventLoop, Any]] = []

    @contextmanager
    def connection(self) -> Iterator[Any]:
        """An idle connection, or a new one; kept again after the block if still usable."""
        import psycopg  # noqa: PLC0415 (PostgreSQL's driver is optional)

        with self._lock:
            connection = self._idle.pop() if self._idle else None
        if connection is None or connection.closed:
            connection = psycopg.Connection.connect(self._conninfo, autocommit=True)
        try:
            yield connection
        finally:
            if self._reusable(connection):
                with self._lock:
                    if len(self._idle) < self._keep:
                        self._idle.append(connection)
                        connection = None
            if connection is not None:
                connection.close()

    @asynccontextmanager
    async def aconnection(self) -> AsyncIterator[Any]:
        """``connection`` for asyncio: one of psycopg's async connections."""
        import psycopg  # noqa: PLC0415 (PostgreSQL's driver is optional)

        loop = asyncio.get_running_loop()
        connection = None
        with self._lock:
            while self._aidle and connection is None:
                owner, found = self._aidle.pop()
                if owner is loop and not found.closed:
                    connection = found
                else:
                    found.pgconn.finish()  # its loop's coroutines cannot close it here
        if connection is None:
            connection = await psycopg.AsyncConnection.connect(self._conninfo, autocommit=True)
        try:
            yield connection
        finally:
            if self._reusable(connection):
                with self._lock:
                    if len(self._aidle) < self._keep:
                        self._aidle.append((loop, connection))
                        connection = None
            if connection is not None:
                await connection.close()

    @staticmethod
    def _reusable(connection: Any) -> bool:
        from psycopg.pq import TransactionStatus  # noqa: PLC0415 (optional driver)

        return (
            not connection.closed and connection.info.transaction_status == TransactionStatus.IDLE
        )

    def close(self) -> None:
        """Close the idle connections (one in use is kept when given back after this)."""
        with self._lock:
            idle, self._idle = self._idle, []
            aidle, self._aidle = self._aidle, []
        for connection in idle:
            connection.close()
        for _, connection in aidle:
            connection.pgconn.finish()

    async def aclose(self) -> None:
        """``close``, closing this loop's asyncio connections with their own coroutine."""
        loop = asyncio.get_running_loop()
        with self._lock:
            mine = [connection for owner, connection in self._aidle if owner is loop]
            self._aidle = [(owner, c) for owner, c in self._aidle if owner is not loop]
        for connection in mine:
            await connection.close()
        self.close()


class SqlGraphStore:
    """A [`GraphCheckpointStore`][agentsnap.store.graph.GraphCheckpointStore] in SQLite or
    PostgreSQL, on agentsnap's tables.

    On SQLite, writes take turns in the process (one writer at a time) and go through one
    plain ``sqlite3`` connection in autocommit mode with the statements' text ready, so that
    a write of one statement is one step of SQLite; SQLAlchemy would cost more than the
    writes themselves. On PostgreSQL, writes go through psycopg connections of the store's
    own, in autocommit mode: a checkpoint's statements are sent together (pipeline mode)
    and run as one implicit transaction, in one round trip. Reads go through SQLAlchemy. On
    PostgreSQL the store also has native asyncio methods (``aput_checkpoint``,
    ``aput_task_writes``, ``areading``) on psycopg's async connections, opened on first use.

    Args:
        url: Database URL, as for [`SqlStore`][agentsnap.store.sql.SqlStore].
        create: Create agentsnap's schema in an empty database on first use.
        echo: Log every SQL statement (the SQLite write path is not logged).

    Raises:
        ConfigurationError: The URL is not SQLite or PostgreSQL, or is an in-memory SQLite
            database (each connection would see its own).
    """  # noqa: D205

    def __init__(self, url: str, *, create: bool = True, echo: bool = False) -> None:
        self.url = url
        self._create = create
        self._dialect = dialect_of(sync_url(url))
        self._path = sqlite_file(url)
        self._sqlite = self._dialect.one_writer
        if self._sqlite and self._path is None:
            raise ConfigurationError(
                "the LangGraph saver needs an SQLite file (sqlite:///path.db): an in-memory "
                "database is private to one connection"
            )
        self._engine: Engine = create_engine(
            sync_url(url),
            echo=echo,
            connect_args={"check_same_thread": False} if self._sqlite else {},
        )
        if self._sqlite:
            event.listen(self._engine, "connect", sqlite_setup(timeout=_SQLITE_TIMEOUT))
        self._pg = None if self._sqlite else _PgConnections(_conninfo(url))
        self._lock = threading.Lock()
        self._ready = False
        self._raw: sqlite3.Connection | None = None

    def __repr__(self) -> str:
        return f"SqlGraphStore({make_url(self.url).render_as_string(hide_password=True)!r})"

    @property
    def native_async(self) -> bool:
        """Whether the asyncio methods run on an asyncio driver (PostgreSQL) or not (SQLite)."""
        return not self._sqlite

    def close(self) -> None:
        """Close the store's database connections, its asyncio connections included."""
        if self._pg is not None:
            self._pg.close()
        with self._lock:
            if self._raw is not None:
                self._raw.close()
                self._raw = None
        self._engine.dispose()

    async def aclose(self) -> None:
        """Close the store's database connections, its asyncio connections included."""
        if self._pg is not None:
            await self._pg.aclose()
        self.close()

    def _ensure_schema(self) -> None:
        if not self._ready:
            with self._lock:
                if not self._ready:
                    ensure_schema(self.url, create=self._create)
                    self._ready = True

    def _connect(self) -> Connection:
        self._ensure_schema()
        return self._engine.connect()

    @contextmanager
    def reading(self) -> Iterator[GraphReader]:
        """A reader on one connection, for the block's duration."""
        with self._connect() as connection:
            yield _Reader(connection)

    # Writes.

    def put_checkpoint(self, checkpoint: StoredCheckpoint, values: Sequence[StoredValue]) -> None:
        """Store a checkpoint (replacing one with its key) and new values (kept if present)."""
        if self._sqlite:
            values = [_own_row(value) for value in values]
            if not values:
                self._sqlite_write(_SQLITE_PUT_CHECKPOINT, checkpoint)
            else:
                with self._sqlite_transaction() as raw:
                    raw.executemany(_SQLITE_PUT_BLOB, values)
                    raw.execute(_SQLITE_PUT_CHECKPOINT, checkpoint)
            return
        self.put_checkpoint_with_writes(checkpoint, values, ())

    def put_checkpoint_with_writes(
        self,
        checkpoint: StoredCheckpoint,
        values: Sequence[StoredValue],
        writes: Sequence[CarriedWrites],
    ) -> list[bool]:
        """``put_checkpoint``, with tasks' writes stored in the same transaction.

        A task that has writes stored already keeps them. A value that refers to one of
        ``writes`` and still holds its bytes (see ``StoredValue``) refers to it if the task's
        row holds the writes as carried, and is stored in a row of its own otherwise.

        Returns:
            For each of ``writes``: whether it went in as given (the task had none stored).
        """
        if self._sqlite:
            return self._sqlite_put_with_writes(checkpoint, values, writes)
        carried, own, referring = _pg_checkpoint_rows(values, writes)
        # Autocommit: the statements up to the pipeline's end run as one implicit transaction.
        with self._pg_connection() as connection:
            cursors = [connection.cursor() for _ in writes]
            with connection.pipeline(), connection.cursor() as cursor:
                for found, row in zip(cursors, carried, strict=True):
                    found.execute(_PG_ADD_WRITES, row)
                if referring:
                    cursor.executemany(_PG_PUT_REFERENCE, referring)
                if own:
                    cursor.executemany(_PG_PUT_BLOB, own)
                cursor.execute(_PG_PUT_CHECKPOINT, checkpoint)
            return [_closed_with_row(found) for found in cursors]

    def _sqlite_put_with_writes(
        self,
        checkpoint: StoredCheckpoint,
        values: Sequence[StoredValue],
        writes: Sequence[CarriedWrites],
    ) -> list[bool]:
        """``put_checkpoint_with_writes`` on SQLite, in one transaction."""
        with self._sqlite_transaction() as raw:
            stored: list[bool] = []
            holding: dict[tuple[str, str, str | None, str | None], bool] = {}
            for key, task_path, packed in writes:
                added = raw.execute(_SQLITE_ADD_WRITES, (*key, task_path, packed)).rowcount == 1
                stored.append(added)
                if not added:  # the task had writes: a value may refer to them if the same
                    found = raw.execute(_SQLITE_GET_WRITES, key).fetchone()
                    added = found is not None and bytes(found[1]) == packed
                holding[key] = added
            rows = [
                value
                if value.value is None
                or value.write_idx is None
                or holding.get(
                    (
                        value.thread_id,
                        value.checkpoint_ns,
                        value.write_checkpoint_id,
                        value.write_task_id,
                    ),
                    False,
                )
                else _own_row(value)
                for value in values
            ]
            # A value that refers to a write it may refer to drops its own bytes.
            rows = [
                row._replace(value=None)
                if row.value is not None and row.write_idx is not None
                else row
                for row in rows
            ]
            if rows:
                raw.executemany(_SQLITE_PUT_BLOB, rows)
            raw.execute(_SQLITE_PUT_CHECKPOINT, checkpoint)
            return stored

    def put_task_writes(self, key: TaskKey, task_path: str, writes: bytes, merge: Merge) -> bool:
        """Store a task's writes, or merge them into the ones stored for its key.

        Arguments and result as for ``GraphCheckpointStore.put_task_writes``.
        """
        row = (*key, task_path, writes)
        if self._sqlite:
            if self._sqlite_write(_SQLITE_ADD_WRITES, row) == 1:
                return True
            # The task has writes already: merge the new ones into them.
            with self._sqlite_transaction() as raw:
                found = raw.execute(_SQLITE_GET_WRITES, key).fetchone()
                if found is None:  # deleted in between
                    raw.execute(_SQLITE_ADD_WRITES, row)
                else:
                    raw.execute(_SQLITE_SET_WRITES, (*merge(*found), *key))
            return found is None
        with self._pg_connection() as connection, connection.cursor() as cursor:
            cursor.execute(_PG_ADD_WRITES, row)  # a transaction of its own
            if cursor.fetchone() is not None:
                return True
            # The task has writes already: merge the new ones into them.
            with connection.transaction():
                cursor.execute(_PG_GET_WRITES, key)
                found = cursor.fetchone()
                if found is None:  # deleted in between
                    cursor.execute(_PG_ADD_WRITES, row)
                else:
                    cursor.execute(_PG_SET_WRITES, (*merge(*found), *key))
            return found is None

    # Native asyncio (PostgreSQL).

    @asynccontextmanager
    async def areading(self) -> AsyncIterator[AsyncGraphReader]:
        """A reader on one asyncio connection, for the block's duration (PostgreSQL)."""
        async with self._apg_connection() as connection:
            yield _AsyncReader(connection)

    async def aput_checkpoint(
        self,
        checkpoint: StoredCheckpoint,
        values: Sequence[StoredValue],
        writes: Sequence[CarriedWrites] = (),
    ) -> list[bool]:
        """``put_checkpoint_with_writes`` on the asyncio driver (PostgreSQL)."""
        carried, own, referring = _pg_checkpoint_rows(values, writes)
        async with self._apg_connection() as connection:
            cursors = [connection.cursor() for _ in writes]
            async with connection.pipeline(), connection.cursor() as cursor:
                for found, row in zip(cursors, carried, strict=True):
                    await found.execute(_PG_ADD_WRITES, row)
                if referring:
                    await cursor.executemany(_PG_PUT_REFERENCE, referring)
                if own:
                    await cursor.executemany(_PG_PUT_BLOB, own)
                await cursor.execute(_PG_PUT_CHECKPOINT, checkpoint)
            stored = []
            for found in cursors:
                stored.append(await found.fetchone() is not None)
                await found.close()
            return stored

    async def aput_task_writes(
        self, key: TaskKey, task_path: str, writes: bytes, merge: Merge
    ) -> bool:
        """``put_task_writes`` on the asyncio driver (PostgreSQL)."""
        row = (*key, task_path, writes)
        async with self._apg_connection() as connection, connection.cursor() as cursor:
            await cursor.execute(_PG_ADD_WRITES, row)  # a transaction of its own
            if await cursor.fetchone() is not None:
                return True
            async with connection.transaction():
                await cursor.execute(_PG_GET_WRITES, key)
                found = await cursor.fetchone()
                if found is None:  # deleted in between
                    await cursor.execute(_PG_ADD_WRITES, row)
                else:
                    await cursor.execute(_PG_SET_WRITES, (*merge(*found), *key))
            return found is None

    def delete_thread(self, thread_id: str) -> None:
        """Delete every checkpoint, value and write of a thread."""
        if self._sqlite:
            with self._sqlite_transaction() as raw:
                for statement in _SQLITE_DELETE_THREAD:
                    raw.execute(statement, (thread_id,))
            return
        with self._writing() as connection:
            for table in (_writes, _blobs, _checkpoints):
                connection.execute(delete(table).where(table.c.thread_id == thread_id))
            connection.commit()

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every row of a thread onto another, in one transaction.

        Rows the target already holds under the same key are replaced by the copy (a
        channel value, which its version names, is kept).

        Raises:
            StoreError: On PostgreSQL, concurrent writes to the same threads aborted it each
                time it was tried.
        """
        if source_thread_id != target_thread_id:
            self._maintain(
                "copy_thread", lambda found: copy_thread(found, source_thread_id, target_thread_id)
            )

    def delete_for_runs(self, run_ids: Sequence[str], load: Load) -> None:
        """Delete the checkpoints of LangGraph runs, their writes and the values only they used.

        Raises:
            StoreError: On PostgreSQL, concurrent writes to the same threads aborted it each
                time it was tried.
        """
        if run_ids:
            ids = list(run_ids)
            self._maintain("delete_for_runs", lambda found: delete_runs(found, ids, load))

    def prune(
        self, thread_ids: Sequence[str], strategy: str, load: Load, load_metadata: Load
    ) -> None:
        """Delete threads' history: all of it, or all but what each namespace's newest needs.

        Raises:
            ConfigurationError: ``strategy`` is not one of ``PRUNE_STRATEGIES``.
            StoreError: On PostgreSQL, concurrent writes to the same threads aborted it each
                time it was tried.
        """
        check_strategy(strategy)
        if thread_ids:
            ids = list(thread_ids)
            self._maintain(
                "prune", lambda found: prune_threads(found, ids, strategy, load, load_metadata)
            )

    # Plumbing.

    def _raw_connection(self) -> sqlite3.Connection:
        """The SQLite write connection; the caller holds the lock."""
        if self._raw is None:
            args, kwargs = self._engine.dialect.create_connect_args(self._engine.url)
            kwargs = {**kwargs, "timeout": kwargs.get("timeout", _SQLITE_TIMEOUT)}
            for option in ("check_same_thread", "isolation_level"):
                kwargs.pop(option, None)
            self._raw = connect_sqlite(*args, **kwargs)
        return self._raw

    def _sqlite_write(self, sql: str, parameters: Sequence[Any]) -> int:
        """Run one statement, a transaction of its own, on SQLite; the rows it changed."""
        self._ensure_schema()
        with self._lock:
            return self._raw_connection().execute(sql, parameters).rowcount

    @contextmanager
    def _sqlite_transaction(self) -> Iterator[sqlite3.Connection]:
        """The SQLite write connection, under the lock, in one transaction."""
        self._ensure_schema()
        with self._lock:
            raw = self._raw_connection()
            # IMMEDIATE: take the write lock now, not on the first write after a read, when
            # another process holding it would make SQLite give up rather than wait.
            raw.execute("BEGIN IMMEDIATE")
            with raw:  # commits, or rolls back on an exception
                yield raw

    @contextmanager
    def _pg_connection(self) -> Iterator[Any]:
        """One of the store's psycopg connections (PostgreSQL), in autocommit mode."""
        assert self._pg is not None, "PostgreSQL only"
        self._ensure_schema()
        with self._pg.connection() as connection:
            yield connection

    @asynccontextmanager
    async def _apg_connection(self) -> AsyncIterator[Any]:
        """One of the store's psycopg async connections, in autocommit mode."""
        if self._pg is None:
            raise ConfigurationError("the graph store's asyncio methods need PostgreSQL")
        if not self._ready:
            await asyncio.to_thread(self._ensure_schema)
        async with self._pg.aconnection() as connection:
            yield connection

    @contextmanager
    def _writing(self) -> Iterator[Connection]:
        """A SQLAlchemy connection for writing (on SQLite, under the store's lock)."""
        connection = self._connect()
        try:
            if self._sqlite:
                with self._lock:
                    yield connection
            else:
                yield connection
        finally:
            connection.close()

    def _maintain(self, what: str, operation: Callable[[Transaction], None]) -> None:
        """Run ``operation`` in one transaction that sees the database as of one moment.

        On SQLite the transaction takes the write lock first (``BEGIN IMMEDIATE``), so no
        other writer runs before it ends. On PostgreSQL it is ``REPEATABLE READ``, so rows
        that others commit meanwhile are neither seen nor deleted; when PostgreSQL aborts it
        for a conflicting concurrent write, it is run again from the start.
        """
        if self._sqlite:
            with self._sqlite_transaction() as raw:
                operation(Transaction(raw))
            return
        for attempt in range(1, _CONFLICT_ATTEMPTS + 1):
            try:
                with self._writing() as connection:
                    connection.execution_options(isolation_level="REPEATABLE READ")
                    operation(Transaction(connection))
                    connection.commit()
                return
            except DBAPIError as exc:
                if classify(exc) is not Fault.CONFLICT:
                    raise
                if attempt == _CONFLICT_ATTEMPTS:
                    raise StoreError(
                        f"the LangGraph saver's {what} was aborted {attempt} times by "
                        "concurrent writes to the same threads; run it again when no graph "
                        "is writing them"
                    ) from exc


CarriedWrites = tuple[TaskKey, str, bytes]
"""A task's writes stored with a checkpoint: thread, namespace, checkpoint id and task id,
the task's path, and its writes, packed."""


def _own_row(value: StoredValue) -> StoredValue:
    """A value that holds its bytes, in a row of its own (no reference)."""
    if value.value is None or value.write_idx is None:
        return value
    return value._replace(write_checkpoint_id=None, write_task_id=None, write_idx=None)


def _pg_checkpoint_rows(
    values: Sequence[StoredValue], writes: Sequence[CarriedWrites]
) -> tuple[list[tuple[Any, ...]], list[StoredValue], list[tuple[Any, ...]]]:
    """A checkpoint's rows on PostgreSQL: the carried writes' rows, the values' rows, and
    the parameters of ``_PG_PUT_REFERENCE`` for the values that refer to carried writes.

    A value that refers to a carried write also has a row of its own, inserted after the
    reference: it is kept only when the reference was not (its key is then free).
    """  # noqa: D205
    packed = {key: data for key, _, data in writes}
    own: list[StoredValue] = []
    referring: list[tuple[Any, ...]] = []
    for value in values:
        if value.value is not None and value.write_idx is not None:
            key = cast(
                TaskKey,
                (
                    value.thread_id,
                    value.checkpoint_ns,
                    value.write_checkpoint_id,
                    value.write_task_id,
                ),
            )
            data = packed.get(key)
            if data is not None:
                reference = (*value[:5], *value[6:])  # the value's row but its bytes
                referring.append((*reference, *key, data))
        own.append(_own_row(value))
    return [(*key, path, data) for key, path, data in writes], own, referring


def _closed_with_row(cursor: Any) -> bool:
    """Whether a cursor's statement returned a row; the cursor is closed."""
    with cursor:
        return cursor.fetchone() is not None


def _conninfo(url: str) -> str:
    """The libpq connection string for a PostgreSQL URL (its driver name left out)."""
    return (
        make_url(sync_url(url)).set(drivername="postgresql").render_as_string(hide_password=False)
    )
