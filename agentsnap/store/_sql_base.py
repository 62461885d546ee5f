"""What every part of an ``SqlStore`` shares.

The engine, the schema gate, the writers, the fences, the retry policy, and the tables.

An ``SqlStore`` is composed of one class per role (``_sql_runs``, ``_sql_snapshots``,
``_sql_log``, ``_sql_leases``, ``_sql_queries``, ``_sql_parts``), each a subclass of
``SqlBase``; writes for a run go through ``SqlBase``'s fence check, and every operation
through its retry policy.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from datetime import UTC, datetime
from typing import Any, ParamSpec, Protocol, TypeVar

from sqlalchemy import Column, Insert, Select, Table, event, literal, select
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from agentsnap.exceptions import ConfigurationError, NotFoundError, StoreError
from agentsnap.liveness import lost, owner_gone, owner_is_live
from agentsnap.records import AgentCut, RunInfo, RunLease, RunStatus
from agentsnap.state import compact_json
from agentsnap.store import _postgres_writes as one_statement
from agentsnap.store._bases import Bases
from agentsnap.store.chunks import SplitMemo
from agentsnap.store.dialect import Dialect, async_url, dialect_of, sqlite_file, sqlite_setup
from agentsnap.store.faults import StoreRetry
from agentsnap.store.migrate import SchemaGate
from agentsnap.store.sqlite_writer import SqliteWriter, Statements
from agentsnap.store.tables import (
    AgentLeaseRow,
    JournalRow,
    LangGraphCheckpointRow,
    ReplayRow,
    RollbackRow,
    RunLeaseRow,
    RunOwnerRow,
    RunRow,
    RunTagRow,
    SnapshotAgentRow,
    SnapshotMessageRow,
    SnapshotPartRow,
    SnapshotRow,
    StateBlobRow,
    StateSchemaRow,
    table_of,
)

__all__ = [
    "DEFAULT_URL",
    "SqlBase",
    "database_name",
    "engine_options",
    "retried",
]

P = ParamSpec("P")
T = TypeVar("T")


class _Identified(Protocol):
    @property
    def id(self) -> str: ...


_R = TypeVar("_R", bound=_Identified)

_dumps = compact_json
_KNOWN_BLOBS_MAX = 100_000
_KNOWN_CHUNKS_MAX = 100_000
_PAGE = 500  # snapshots whose parts are read in one query


def _counters(counts: dict[str, int]) -> str:
    """Channel counters as JSON (orjson writes a hundred of them in microseconds)."""
    return _dumps(counts)


DEFAULT_URL = "sqlite:///agentsnap.db"
"""Where runs go when no database is named."""

_runs = table_of(RunRow)
_tags = table_of(RunTagRow)
_snapshots = table_of(SnapshotRow)
_blobs = table_of(StateBlobRow)
_agents = table_of(SnapshotAgentRow)
_messages = table_of(SnapshotMessageRow)
_journal = table_of(JournalRow)
_rollbacks = table_of(RollbackRow)
_lg_checkpoints = table_of(LangGraphCheckpointRow)
_leases = table_of(RunLeaseRow)
_owners = table_of(RunOwnerRow)
_replay = table_of(ReplayRow)
_schemas = table_of(StateSchemaRow)
_parts = table_of(SnapshotPartRow)
_agent_leases = table_of(AgentLeaseRow)
_PART_BODY = {"agents", "channels", "offsets"}
_RUN_AND_LEASE = select(
    _runs,
    _leases.c.owner.label("lease_owner"),
    _leases.c.token.label("lease_token"),
    _leases.c.expires_at.label("lease_expires_at"),
).outerjoin(_leases, _leases.c.run_id == _runs.c.id)


def database_name(url: str) -> str:
    """How messages name the database of ``url``: its file, or its URL without password."""
    path = sqlite_file(url)
    if path is not None:
        return f"the database {path}"
    return f"the database {make_url(url).render_as_string(hide_password=True)}"


def engine_options(url: str, retry: StoreRetry) -> dict[str, Any]:
    """``create_async_engine`` options bounding each attempt by ``retry.timeout``.

    PostgreSQL gets a connect timeout and a ``statement_timeout``; SQLite a busy timeout.
    """
    return dialect_of(url).engine_options(retry.timeout)


def retried(
    what: str,
) -> Callable[[Callable[P, Coroutine[Any, Any, T]]], Callable[P, Coroutine[Any, Any, T]]]:
    """Run the decorated store method under the store's retry policy."""

    def decorate(
        method: Callable[P, Coroutine[Any, Any, T]],
    ) -> Callable[P, Coroutine[Any, Any, T]]:
        @functools.wraps(method)
        async def retried(*args: P.args, **kwargs: P.kwargs) -> T:
            store: SqlBase = args[0]  # type: ignore[assignment]
            return await store.retrying(what, lambda _again: method(*args, **kwargs))

        return retried

    return decorate


class SqlBase:
    """The connection to the database and what every role's writes need (see the module)."""

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        echo: bool = False,
        create: bool = True,
        retry: StoreRetry | None = None,
    ) -> None:
        self.url = url
        self.retry = retry or StoreRetry()
        self.where = database_name(url)
        self._engine: AsyncEngine = create_async_engine(
            async_url(url), echo=echo, **engine_options(url, self.retry)
        )
        self._dialect: Dialect = dialect_of(self._engine.dialect.name)
        self._backend = self._dialect.name
        # SQLite bounds its own waits (the busy timeout); a network can stay silent.
        self.bounded = self._dialect.bounded
        if self._backend == "sqlite":
            event.listen(
                self._engine.sync_engine, "connect", sqlite_setup(timeout=self.retry.timeout)
            )
        self._write_lock = asyncio.Lock() if self._dialect.one_writer else None
        # PostgreSQL: the engine's connections in autocommit (the same pool), for the writes
        # that are one statement each (see agentsnap.store._postgres_writes).
        self._autocommit: AsyncEngine | None = (
            self._engine.execution_options(isolation_level="AUTOCOMMIT")
            if self._backend == "postgresql"
            else None
        )
        # Hashes of states and state chunks known to be stored (committed), so they are not
        # sent again.
        self._known_blobs: set[str] = set()
        self._known_chunks: set[str] = set()
        # Per process name, its part of the snapshot written last and its counters as JSON.
        self._counter_texts: dict[str, tuple[AgentCut, str, str]] = {}
        # Per run, the last full snapshot written: later ones may hold only what changed.
        self._bases = Bases()
        self._split_memo = SplitMemo()
        self._mark = "?" if self._engine.dialect.paramstyle == "qmark" else "%s"
        self._statements = _statements(self._mark, self._dialect)
        # Runs whose writes must carry a lease token: run id -> token.
        self._fences: dict[str, int] = {}
        database = sqlite_file(url)
        self._writer = (
            SqliteWriter(database, self._statements, timeout=self.retry.timeout)
            if database is not None
            else None
        )
        self._gate = SchemaGate(
            url, create=create, then=self._writer.open if self._writer is not None else None
        )

    def retrying(
        self, what: str, operation: Callable[..., Awaitable[T]], *args: Any
    ) -> Coroutine[Any, Any, T]:
        """``operation(again, *args)`` under the store's retry policy (see
        [`StoreRetry.call`][agentsnap.store.faults.StoreRetry.call]), named as ``what``.

        The policy's own coroutine, to await: the hot writes (journal, snapshots) pay no
        frame of their own for it.
        """  # noqa: D205
        return self.retry.call(what, operation, *args, where=self.where, bounded=self.bounded)

    def _saving(
        self,
        what: str,
        record: _R,
        write: Callable[[_R], Awaitable[None]],
        key: Column[str],
    ) -> Coroutine[Any, Any, None]:
        """``write(record)`` under the retry policy (see ``retrying``), named as ``what``.

        A retry first looks for the row whose ``key`` is the record's id, and writes nothing
        when it is there: the attempt before was committed, though its answer was lost.
        """
        return self.retrying(what, self._save_once, record, write, key)

    async def _save_once(
        self, again: bool, record: _R, write: Callable[[_R], Awaitable[None]], key: Column[str]
    ) -> None:
        await self._gate.wait()
        if again and await self._stored(key == record.id):
            return
        await write(record)

    def _when(self, moment: datetime | None) -> datetime | str | None:
        """A timestamp as the driver takes it (SQLite: UTC text, as SQLAlchemy stores it)."""
        if moment is None or self._backend != "sqlite":
            return moment
        return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")

    async def _stored(self, *where: Any) -> bool:
        """Whether a row matching ``where`` exists (in the table the columns name)."""
        async with self._engine.connect() as conn:
            return await conn.scalar(select(literal(1)).where(*where).limit(1)) is not None

    async def _explain_missing_run(self, run_id: str) -> None:
        async with self._engine.connect() as conn:
            await self._require_run(conn, run_id)

    def _fence_of(self, run_id: str) -> tuple[str, int] | None:
        token = self._fences.get(run_id)
        return None if token is None else (run_id, token)

    async def _check_fence(self, conn: AsyncConnection, run_id: str) -> None:
        """Raise OwnershipLost if the run is fenced and its lease has another token.

        Called after the transaction's first write: on SQLite the transaction then holds the
        write lock, on PostgreSQL the lease's row is share-locked by the read; either way no
        takeover commits before this transaction ends.
        """
        token = self._fences.get(run_id)
        if token is None:
            return
        found = await conn.exec_driver_sql(self._statements.lease, (run_id,))
        holder: tuple[str, int] | None = found.first()  # type: ignore[assignment]
        if holder is None or holder[1] != token:
            raise lost(run_id, token, None if holder is None else (holder[0], holder[1]))

    async def _run_lease(self, run_id: str) -> RunLease | None:
        """The run's lease as it stands, read once (no retry)."""
        row = await self._row(select(_leases).where(_leases.c.run_id == run_id))
        if row is None:
            return None
        return RunLease(
            run_id=row.run_id, owner=row.owner, token=row.token, expires_at=row.expires_at
        )

    async def _require_run(self, conn: AsyncConnection, run_id: str) -> None:
        if await conn.scalar(select(_runs.c.id).where(_runs.c.id == run_id)) is None:
            raise NotFoundError("run", run_id)

    async def _run_rows(self, run_id: str, query: Select[Any]) -> Sequence[Any]:
        """The rows of ``query``, read once the run is found (no retry).

        Raises:
            NotFoundError: The store holds no such run.
        """
        await self._gate.wait()
        async with self._engine.connect() as conn:
            await self._require_run(conn, run_id)
            rows: Sequence[Any] = (await conn.execute(query)).all()
        return rows

    async def _row(self, query: Select[Any]) -> Any:
        """The one row of ``query``, or ``None`` (no retry)."""
        await self._gate.wait()
        async with self._engine.connect() as conn:
            return (await conn.execute(query)).one_or_none()

    async def _one_statement(
        self, sql: str, values: tuple[Any, ...]
    ) -> tuple[int, tuple[Any, ...] | None]:
        """Run ``sql`` in autocommit: how many rows it changed, and its first row if it has rows.

        Raises:
            StoreError: The database could not be reached, or refused the statement (then
                nothing of it is stored; a constraint violation is its ``__cause__``).
        """
        assert self._autocommit is not None
        try:
            conn = await self._autocommit.connect()
        except SQLAlchemyError as exc:
            raise StoreError(f"cannot reach the database: {exc}") from exc
        try:
            result = await conn.exec_driver_sql(sql, values)
            if not result.returns_rows:
                return result.rowcount, None
            found = result.first()
            return result.rowcount, None if found is None else tuple(found)
        except SQLAlchemyError as exc:
            raise StoreError(f"the database refused the write: {exc}") from exc
        finally:
            await conn.close()

    def _begin(self) -> _Transaction:
        return _Transaction(self._engine, self._write_lock)

    def _insert_ignore(self, table: Table, keys: list[str]) -> Insert:
        return self._dialect.insert_or_ignore(table, keys)

    async def close(self) -> None:
        """Close every pooled connection."""
        if self._writer is not None:
            await self._writer.close()
        await self._engine.dispose()


def _statements(mark: str, dialect: Dialect) -> Statements:
    """The fast writes' statements in the driver's own placeholder style."""

    def insert(table: Table, columns: list[str], suffix: str = "") -> str:
        marks = ", ".join([mark] * len(columns))
        # Table and column names are this module's constants; values are bound.
        return f"INSERT INTO {table.name} ({', '.join(columns)}) VALUES ({marks}){suffix}"  # noqa: S608

    # PostgreSQL: a share lock on the lease row holds a takeover off until the write commits.
    # SQLite has no row locks: a fenced write checks the lease once it holds the write lock.
    share = dialect.share_lock
    holds = f"SELECT 1 FROM {_leases.name} WHERE run_id = {mark} AND token = {mark}{share}"  # noqa: S608
    # The position is the run's next one, found on the primary key's index.
    replay = (
        f"INSERT INTO {_replay.name} (run_id, position, timeline, body) "  # noqa: S608
        f"SELECT {mark}, (SELECT COALESCE(MAX(position), 0) + 1 FROM {_replay.name} "
        f"WHERE run_id = {mark}), {mark}, {mark}"
    )

    return Statements(
        snapshot=insert(_snapshots, one_statement.SNAPSHOT_COLUMNS),
        blobs=insert(_blobs, one_statement.BLOB_COLUMNS, " ON CONFLICT (hash) DO NOTHING"),
        agents=insert(_agents, ["snapshot_id", *one_statement.AGENT_COLUMNS]),
        messages=insert(_messages, ["snapshot_id", *one_statement.MESSAGE_COLUMNS]),
        lease=f"SELECT owner, token FROM {_leases.name} WHERE run_id = {mark}{share}",  # noqa: S608
        replay=replay,
        replay_fenced=f"{replay} WHERE EXISTS ({holds})",
    )


class _Transaction:
    """``engine.begin()`` whose database errors come out as StoreError.

    With a lock, one transaction at a time: SQLite has a single writer, and writers queued
    on an asyncio lock cost nothing, where writers queued in SQLite's busy handler each hold
    a thread and a connection and retry on a timer.
    """

    def __init__(self, engine: AsyncEngine, lock: asyncio.Lock | None) -> None:
        self._context = engine.begin()
        self._lock = lock

    async def __aenter__(self) -> AsyncConnection:
        if self._lock is not None:
            await self._lock.acquire()
        try:
            return await self._context.__aenter__()
        except BaseException as exc:
            if self._lock is not None:
                self._lock.release()
            if isinstance(exc, SQLAlchemyError):
                raise StoreError(f"cannot reach the database: {exc}") from exc
            raise

    async def __aexit__(self, *exc_info: Any) -> None:
        error = exc_info[1]
        try:
            await self._context.__aexit__(*exc_info)
        except SQLAlchemyError as exc:
            if error is None:  # the commit failed
                raise StoreError(f"the database refused the write: {exc}") from exc
            # The rollback after a failure failed too (SQLite ends the transaction itself on
            # a full disk): the failure that made it necessary is the one to raise.
        finally:
            if self._lock is not None:
                self._lock.release()
        if isinstance(error, SQLAlchemyError):
            raise StoreError(f"the database refused the write: {error}") from error


def _check_limit(limit: int) -> None:
    if limit < 1:
        raise ConfigurationError(f"a page holds at least 1 item, not {limit}")


async def _tags_of(conn: AsyncConnection, run_ids: list[str] | None) -> dict[str, dict[str, str]]:
    """The tags of ``run_ids`` (of every run when ``None``), by run."""
    query = select(_tags.c.run_id, _tags.c.key, _tags.c.value)
    if run_ids is None:
        batches = [query]
    else:
        batches = [
            query.where(_tags.c.run_id.in_(run_ids[start : start + 500]))
            for start in range(0, len(run_ids), 500)
        ]
    tags: dict[str, dict[str, str]] = {}
    for batch in batches:
        for run_id, key, value in await conn.execute(batch):
            tags.setdefault(run_id, {})[key] = value
    return tags


def _run(row: Any, now: datetime, tags: dict[str, str] | None = None) -> RunInfo:
    """A run from a row of ``_RUN_AND_LEASE``: interrupted if running without a live owner."""
    status = RunStatus(row["status"])
    reason = row["status_reason"]
    if status is RunStatus.RUNNING:
        lease = (
            None
            if row["lease_token"] is None
            else RunLease(
                run_id=row["id"],
                owner=row["lease_owner"],
                token=row["lease_token"],
                expires_at=row["lease_expires_at"],
            )
        )
        if not owner_is_live(lease, now):
            status = RunStatus.INTERRUPTED
            reason = owner_gone(lease)
    # The run table's columns are the run's fields, by name; the lease's columns are not.
    return RunInfo.model_validate(
        {**row, "status": status, "status_reason": reason, "tags": tags or {}}
    )
