"""SqlStore: runs and snapshots in SQLite (the default) or PostgreSQL.

Example:
    ```python
    import asyncio

    from agentsnap.store.sql import SqlStore

    async def main() -> None:
        store = SqlStore("sqlite:///agentsnap.db")
        for run in await store.list_runs():
            print(run.id, run.created_at)
        await store.close()

    asyncio.run(main())
    ```

Each snapshot is written in one transaction: it is in the database whole, or not at all. A
state already stored under its content hash is not written again. On first use an empty
database gets the schema through the migrations; a database at another schema revision is
refused with a message saying how to upgrade it.

A snapshot holds one ``agentsnap_snapshot_agents`` row per process (its state's hash and its
channel counters), or, when little changed, only the rows that differ from its run's *base*:
the last full snapshot of the run this store wrote. Such a snapshot names its base in
``base_id`` and counts its own rows in ``agent_rows``; a reader takes every other process's
row from the base. A base is always full, so reading a snapshot takes at most its rows and
its base's. A complete snapshot is written this way when it holds every process of the base,
fewer than half of its processes changed (state hash or counters), and fewer than 100
snapshots were written over that base; otherwise it is written full and becomes the base. A
store that starts remembers no base, so its first snapshot of a run is full. With 10,000
agents of which 1 % changed, a snapshot then adds about 100 rows rather than 10,000.

A run's lease is one row of ``agentsnap_run_leases``, changed by compare-and-set statements
(``INSERT … ON CONFLICT DO NOTHING`` for the first lease, ``UPDATE … WHERE token = N`` for a
takeover), so that of two processes racing for a run exactly one wins. A fenced write reads
the lease's token in its own transaction, after taking SQLite's write lock or, on
PostgreSQL, with ``FOR SHARE``, which holds off a takeover until the write commits: a write
is either made before the takeover, or refused.
"""

from __future__ import annotations

import asyncio
import functools
import json
import sqlite3
from collections.abc import Callable, Collection, Coroutine, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, ParamSpec, TypeVar

from sqlalchemy import (
    CompoundSelect,
    Insert,
    Select,
    Table,
    Text,
    Update,
    delete,
    event,
    func,
    literal,
    literal_column,
    or_,
    select,
    type_coerce,
    union_all,
)
from sqlalchemy.engine import Row, make_url
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from agentsnap.exceptions import ConfigurationError, NotFoundError, StoreError
from agentsnap.integrity import SnapshotReader, agent_versions
from agentsnap.liveness import lost, owner_gone, owner_is_live
from agentsnap.messages import JsonValue
from agentsnap.records import (
    AgentCut,
    AgentLease,
    AgentVersion,
    GraphCheckpoint,
    JournalSegment,
    ReplaySegment,
    RollbackInfo,
    RunInfo,
    RunLease,
    RunStatus,
    Snapshot,
    SnapshotPart,
    SnapshotStatus,
    SnapshotSummary,
    utcnow,
)
from agentsnap.state import compact_json
from agentsnap.store._bases import AgentRow, Bases
from agentsnap.store._run_filter import run_filter
from agentsnap.store._run_query import runs_query
from agentsnap.store.chunks import ChunkWrites, SplitMemo, StateLoader
from agentsnap.store.dialect import Dialect, async_url, dialect_of, sqlite_file, sqlite_setup
from agentsnap.store.faults import StoreRetry
from agentsnap.store.migrate import SchemaGate
from agentsnap.store.sqlite_writer import SnapshotRows, SqliteWriter, Statements
from agentsnap.store.tables import (
    AgentLeaseRow,
    JournalRow,
    LangGraphCheckpointRow,
    ReplayRow,
    RollbackRow,
    RunLeaseRow,
    RunRow,
    RunTagRow,
    SnapshotAgentRow,
    SnapshotMessageRow,
    SnapshotPartRow,
    SnapshotRow,
    StateBlobRow,
    StateSchemaRow,
)

__all__ = ["DEFAULT_URL", "SqlStore", "async_url", "database_name"]

P = ParamSpec("P")
T = TypeVar("T")

_dumps = compact_json
_KNOWN_BLOBS_MAX = 100_000
_KNOWN_CHUNKS_MAX = 100_000
_PAGE = 500  # snapshots whose parts are read in one query


def _counters(counts: dict[str, int]) -> str:
    """Channel counters as JSON (orjson writes a hundred of them in microseconds)."""
    return _dumps(counts)


DEFAULT_URL = "sqlite:///agentsnap.db"
"""Where runs go when no database is named."""

_runs: Table = RunRow.__table__  # type: ignore[assignment]
_tags: Table = RunTagRow.__table__  # type: ignore[assignment]
_snapshots: Table = SnapshotRow.__table__  # type: ignore[assignment]
_blobs: Table = StateBlobRow.__table__  # type: ignore[assignment]
_agents: Table = SnapshotAgentRow.__table__  # type: ignore[assignment]
_messages: Table = SnapshotMessageRow.__table__  # type: ignore[assignment]
_journal: Table = JournalRow.__table__  # type: ignore[assignment]
_rollbacks: Table = RollbackRow.__table__  # type: ignore[assignment]
_lg_checkpoints: Table = LangGraphCheckpointRow.__table__  # type: ignore[assignment]
_leases: Table = RunLeaseRow.__table__  # type: ignore[assignment]
_replay: Table = ReplayRow.__table__  # type: ignore[assignment]
_schemas: Table = StateSchemaRow.__table__  # type: ignore[assignment]
_parts: Table = SnapshotPartRow.__table__  # type: ignore[assignment]
_agent_leases: Table = AgentLeaseRow.__table__  # type: ignore[assignment]
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


def _retried(
    what: str,
) -> Callable[[Callable[P, Coroutine[Any, Any, T]]], Callable[P, Coroutine[Any, Any, T]]]:
    """Run the decorated store method under the store's retry policy."""

    def decorate(
        method: Callable[P, Coroutine[Any, Any, T]],
    ) -> Callable[P, Coroutine[Any, Any, T]]:
        @functools.wraps(method)
        async def retried(*args: P.args, **kwargs: P.kwargs) -> T:
            store: SqlStore = args[0]  # type: ignore[assignment]
            return await store.retry.call(
                what,
                lambda _again: method(*args, **kwargs),
                where=store.where,
                bounded=store.bounded,
            )

        return retried

    return decorate


class SqlStore:
    """A [`Store`][agentsnap.Store] on SQLAlchemy's asyncio engine.

    Args:
        url: Database URL: ``sqlite:///path.db`` (WAL mode) or ``postgresql://…``; the driver
            is chosen for you (aiosqlite, psycopg 3).
        echo: Log every SQL statement (SQLAlchemy's ``echo``).
        create: Create the schema in an empty database on first use. Readers that must not
            create anything (the CLI) pass ``False`` and get a clear error instead.
        retry: How database operations that fail for a passing reason (a lost connection,
            a restarting server, a lock, a full disk) are retried, and how long one attempt
            may take (see [`agentsnap.store.faults`][agentsnap.store.faults]).

    Attributes:
        retry: The retry policy.
        where: How messages name the database.
    """

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

    def __repr__(self) -> str:
        return f"SqlStore({make_url(self.url).render_as_string(hide_password=True)!r})"

    # -- writes ---------------------------------------------------------------------------

    @_retried("record run")
    async def create_run(self, run: RunInfo) -> None:  # noqa: D102
        await self._gate.wait()
        row = {
            "id": run.id,
            "created_at": run.created_at,
            "parent_run_id": run.parent_run_id,
            "parent_snapshot_id": run.parent_snapshot_id,
            "metadata": run.metadata,
            "status": run.status.value,
            "finished_at": run.finished_at,
            "name": run.name,
            "status_reason": run.status_reason,
        }
        async with self._begin() as conn:
            created = await conn.execute(self._insert_ignore(_runs, ["id"]).values(row))
            if created.rowcount and run.tags:
                await conn.execute(
                    _tags.insert(),
                    [{"run_id": run.id, "key": k, "value": v} for k, v in run.tags.items()],
                )

    @_retried("record the run's status")
    async def finish_run(  # noqa: D102
        self,
        run_id: str,
        status: RunStatus,
        finished_at: datetime | None,
        reason: str | None = None,
    ) -> None:
        self._bases.forget(run_id)  # a run that ends needs no base; one resumed starts anew
        await self._update_run(
            run_id, status=status.value, finished_at=finished_at, status_reason=reason
        )

    @_retried("record the run's tracebacks")
    async def save_traceback(self, run_id: str, traceback: str | None) -> None:  # noqa: D102
        await self._update_run(run_id, traceback=traceback)

    @_retried("record a request to cancel the run")
    async def request_cancel(self, run_id: str, reason: str | None) -> None:  # noqa: D102
        await self._gate.wait()
        async with self._begin() as conn:  # not fenced: anyone may ask the owner to stop
            result = await conn.execute(
                _runs.update().where(_runs.c.id == run_id).values(cancel_requested=reason)
            )
            if result.rowcount == 0:
                raise NotFoundError("run", run_id)

    @_retried("record the run's parent")
    async def set_parent(self, run_id: str, parent_run_id: str, parent_snapshot_id: str) -> None:  # noqa: D102
        await self._update_run(
            run_id, parent_run_id=parent_run_id, parent_snapshot_id=parent_snapshot_id
        )

    async def _update_run(self, run_id: str, **values: Any) -> None:
        await self._gate.wait()
        async with self._begin() as conn:
            result = await conn.execute(_runs.update().where(_runs.c.id == run_id).values(**values))
            if result.rowcount == 0:
                raise NotFoundError("run", run_id)
            await self._check_fence(conn, run_id)

    async def save_rollback(self, rollback: RollbackInfo) -> None:  # noqa: D102
        await self.retry.call(
            "record rollback {0.id}",
            self._save_rollback,
            rollback,
            where=self.where,
            bounded=self.bounded,
        )

    async def _save_rollback(self, again: bool, rollback: RollbackInfo) -> None:
        await self._gate.wait()
        if again and await self._stored(_rollbacks.c.id == rollback.id):
            return  # the attempt before was committed, though its answer was lost
        async with self._begin() as conn:
            await self._require_run(conn, rollback.run_id)
            found = await conn.scalar(
                select(_snapshots.c.id).where(_snapshots.c.id == rollback.snapshot_id)
            )
            if found is None:
                raise NotFoundError("snapshot", rollback.snapshot_id)
            await conn.execute(_rollbacks.insert().values(**rollback.model_dump()))
            await self._check_fence(conn, rollback.run_id)

    @_retried("read rollbacks")
    async def list_rollbacks(self, run_id: str) -> list[RollbackInfo]:  # noqa: D102
        await self._gate.wait()
        async with self._engine.connect() as conn:
            await self._require_run(conn, run_id)
            rows = await conn.execute(
                select(_rollbacks)
                .where(_rollbacks.c.run_id == run_id)
                .order_by(_rollbacks.c.at, _rollbacks.c.id)
            )
            return [RollbackInfo.model_validate(dict(row._mapping)) for row in rows]

    async def save_snapshot(self, snapshot: Snapshot) -> None:  # noqa: D102
        await self.retry.call(
            "write snapshot {0.seq} of run {0.run_id}",
            self._save_snapshot,
            snapshot,
            where=self.where,
            bounded=self.bounded,
        )

    async def _save_snapshot(self, again: bool, snapshot: Snapshot) -> None:
        await self._gate.wait()
        if again and await self._stored(_snapshots.c.id == snapshot.id):
            return  # the attempt before was committed, though its answer was lost
        try:
            await self._write_snapshot(snapshot)
        except StoreError as exc:
            if not isinstance(exc.__cause__, (IntegrityError, sqlite3.IntegrityError)):
                raise
            await self._explain_refusal(snapshot)
            if not self._known_blobs and snapshot.run_id not in self._bases:
                raise
            # A state this store knew to be stored, or the base snapshot, may have been
            # deleted since (with the runs that referred to it): send every state and chunk
            # again, and every agent row, once.
            self._known_blobs.clear()
            self._known_chunks.clear()
            self._bases.clear()
            await self._write_snapshot(snapshot)

    async def _write_snapshot(self, snapshot: Snapshot) -> None:
        """Write the snapshot's rows in one transaction, with the states not known stored.

        A long state goes in as its row and its chunks (see
        [`agentsnap.store.chunks`][agentsnap.store.chunks]), which the write sends after the
        agents' rows and checks in the same transaction. A snapshot that changes little
        since its run's base holds only the agent rows that differ (see the module's
        description).
        """
        known = self._known_blobs
        chunks = ChunkWrites(self._known_chunks, self._mark, self._split_memo)
        new = {
            cut.state_hash: cut.state_json
            for cut in snapshot.agents.values()
            if cut.state_hash not in known
        }
        plan = self._bases.plan(snapshot, self._agent_rows(snapshot))
        rows = SnapshotRows(
            snapshot=(
                snapshot.id,
                snapshot.run_id,
                snapshot.seq,
                snapshot.initiator,
                snapshot.status.value,
                self._when(snapshot.started_at),
                self._when(snapshot.completed_at),
                snapshot.error,
                plan.base_id,
                plan.agent_rows,
            ),
            blobs=[(state_hash, *chunks.add(text)) for state_hash, text in new.items()],
            agents=plan.rows,
            messages=[
                (
                    snapshot.id,
                    channel.src,
                    channel.dst,
                    message.seq,
                    message.kind,
                    _dumps(message.payload),
                    _dumps(message.headers),
                    message.epoch,
                )
                for channel in snapshot.channels
                for message in channel.messages
            ],
            fence=self._fence_of(snapshot.run_id),
            chunks=chunks if chunks else None,
        )
        if self._writer is not None:
            assert self._write_lock is not None
            async with self._write_lock:
                await self._writer.write(rows)
        else:
            await self._write_rows(rows)
        # Only now, committed: another snapshot with these states need not send them again,
        # nor one of this run the agent rows it shares with a new base.
        self._bases.committed(plan)
        if len(known) > _KNOWN_BLOBS_MAX:
            known.clear()
        known.update(new)
        if chunks:
            chunks.committed(_KNOWN_CHUNKS_MAX)

    def _agent_rows(self, snapshot: Snapshot) -> list[AgentRow]:
        """The snapshot's ``agentsnap_snapshot_agents`` rows, one per process.

        A process's part that is the same object as in the snapshot written before (the
        coordinator reuses the part of a process nothing happened to) reuses its counters'
        JSON.
        """
        texts = self._counter_texts
        if len(texts) > _KNOWN_BLOBS_MAX:
            texts.clear()
        rows = []
        snapshot_id = snapshot.id
        for name, cut in snapshot.agents.items():
            held = texts.get(name)
            if held is None or held[0] is not cut:
                held = texts[name] = (cut, _counters(cut.sent), _counters(cut.received))
            rows.append((snapshot_id, name, cut.state_hash, held[1], held[2], cut.state_version))
        return rows

    async def _write_rows(self, rows: SnapshotRows) -> None:
        # The rows go straight to the driver, prepared: per-row work in SQLAlchemy would cost
        # more than the database does.
        sql = self._statements
        async with self._begin() as conn:
            await conn.exec_driver_sql(sql.snapshot, rows.snapshot)
            if rows.fence is not None:
                await self._check_fence(conn, rows.fence[0])
            if rows.blobs:
                await conn.exec_driver_sql(sql.blobs, rows.blobs)
            if rows.agents:
                await conn.exec_driver_sql(sql.agents, rows.agents)
            if rows.messages:
                await conn.exec_driver_sql(sql.messages, rows.messages)
            if rows.chunks is not None:
                await rows.chunks.write_async(conn)

    async def _explain_refusal(self, snapshot: Snapshot) -> None:
        """Turn a constraint violation into what it means, when it is a known one."""
        async with self._engine.connect() as conn:
            await self._require_run(conn, snapshot.run_id)
            clash = await conn.scalar(
                select(_snapshots.c.id).where(
                    (_snapshots.c.id == snapshot.id)
                    | (
                        (_snapshots.c.run_id == snapshot.run_id)
                        & (_snapshots.c.seq == snapshot.seq)
                    )
                )
            )
        if clash is not None:
            raise StoreError(
                f"snapshot {snapshot.id} (number {snapshot.seq} of run {snapshot.run_id}) "
                "is already stored"
            )

    def _when(self, moment: datetime | None) -> datetime | str | None:
        """A timestamp as the driver takes it (SQLite: UTC text, as SQLAlchemy stores it)."""
        if moment is None or self._backend != "sqlite":
            return moment
        return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")

    async def append_journal(self, run_id: str, segments: Sequence[JournalSegment]) -> None:  # noqa: D102
        if not segments:
            return
        await self.retry.call(
            "write journal segments of run {0}",
            self._append_journal,
            run_id,
            segments,
            where=self.where,
            bounded=self.bounded,
        )

    async def _append_journal(
        self, again: bool, run_id: str, segments: Sequence[JournalSegment]
    ) -> None:
        await self._gate.wait()
        first = segments[0]
        if again and await self._stored(
            _journal.c.run_id == run_id,
            _journal.c.src == first.src,
            _journal.c.dst == first.dst,
            _journal.c.event == first.event,
            _journal.c.first_seq == first.first_seq,
        ):
            return  # written in one transaction with the rest, which its answer did not say
        async with self._begin() as conn:
            await self._require_run(conn, run_id)
            await conn.execute(
                _journal.insert(),
                [
                    {
                        "run_id": run_id,
                        "src": segment.src,
                        "dst": segment.dst,
                        "event": segment.event,
                        "first_seq": segment.first_seq,
                        "last_seq": segment.last_seq,
                        "entries": segment.entries,
                    }
                    for segment in segments
                ],
            )
            await self._check_fence(conn, run_id)

    @_retried("record the state schemas of a run")
    async def save_state_schemas(  # noqa: D102
        self, run_id: str, schemas: Mapping[str, Mapping[str, JsonValue]]
    ) -> None:
        await self._gate.wait()
        async with self._begin() as conn:
            await self._require_run(conn, run_id)
            if schemas:
                names = list(schemas)
                await conn.execute(
                    delete(_schemas).where(_schemas.c.run_id == run_id, _schemas.c.agent.in_(names))
                )
                await conn.execute(
                    _schemas.insert(),
                    [
                        {"run_id": run_id, "agent": name, "json_schema": dict(schema)}
                        for name, schema in schemas.items()
                    ],
                )
            await self._check_fence(conn, run_id)

    @_retried("read the state schemas of a run")
    async def load_state_schemas(self, run_id: str) -> dict[str, dict[str, JsonValue]]:  # noqa: D102
        await self._gate.wait()
        async with self._engine.connect() as conn:
            await self._require_run(conn, run_id)
            rows = await conn.execute(
                select(_schemas.c.agent, _schemas.c.json_schema)
                .where(_schemas.c.run_id == run_id)
                .order_by(_schemas.c.agent)
            )
            return {row.agent: row.json_schema for row in rows}

    async def append_replay(self, run_id: str, segment: ReplaySegment) -> None:  # noqa: D102
        await self.retry.call(
            "write the replay log of run {0}",
            self._append_replay,
            run_id,
            segment,
            where=self.where,
            bounded=self.bounded,
        )

    async def _append_replay(self, again: bool, run_id: str, segment: ReplaySegment) -> None:
        await self._gate.wait()
        if again and await self._last_replay(run_id) == segment:
            return  # the attempt before was committed, though its answer was lost
        token = self._fences.get(run_id)
        sql = self._statements
        body = segment.body
        values: tuple[Any, ...] = (run_id, run_id, segment.timeline, body)
        if token is not None:
            values = (*values, run_id, token)
        statement = sql.replay if token is None else sql.replay_fenced
        try:
            if self._writer is not None:
                assert self._write_lock is not None
                async with self._write_lock:
                    changed = await self._writer.execute(statement, values)
            else:
                async with self._begin() as conn:
                    changed = (await conn.exec_driver_sql(statement, values)).rowcount
        except StoreError as exc:
            if isinstance(exc.__cause__, (IntegrityError, sqlite3.IntegrityError)):
                await self._explain_missing_run(run_id)
            raise
        if changed != 1:
            await self._explain_missing_run(run_id)
            assert token is not None
            raise lost(run_id, token, await self._holder(run_id))

    async def _last_replay(self, run_id: str) -> ReplaySegment | None:
        async with self._engine.connect() as conn:
            row = (
                await conn.execute(
                    select(_replay.c.timeline, _replay.c.body)
                    .where(_replay.c.run_id == run_id)
                    .order_by(_replay.c.position.desc())
                    .limit(1)
                )
            ).one_or_none()
        return None if row is None else ReplaySegment(row.timeline, row.body)

    async def _stored(self, *where: Any) -> bool:
        """Whether a row matching ``where`` exists (in the table the columns name)."""
        async with self._engine.connect() as conn:
            return await conn.scalar(select(literal(1)).where(*where).limit(1)) is not None

    async def _explain_missing_run(self, run_id: str) -> None:
        async with self._engine.connect() as conn:
            await self._require_run(conn, run_id)

    # -- runs spread over processes ------------------------------------------------------

    @_retried("write a snapshot part")
    async def save_snapshot_part(self, part: SnapshotPart) -> None:  # noqa: D102
        await self._gate.wait()
        body = part.model_dump(mode="json", include=_PART_BODY)
        async with self._begin() as conn:
            await self._require_run(conn, part.run_id)
            await conn.execute(
                delete(_parts).where(
                    _parts.c.run_id == part.run_id,
                    _parts.c.seq == part.seq,
                    _parts.c.worker == part.worker,
                )
            )
            await conn.execute(
                _parts.insert().values(
                    run_id=part.run_id,
                    seq=part.seq,
                    worker=part.worker,
                    body=body,
                    error=part.error,
                    written_at=part.written_at,
                )
            )

    @_retried("delete the parts of old snapshots")
    async def delete_snapshot_parts(self, run_id: str, below: int) -> int:  # noqa: D102
        await self._gate.wait()
        async with self._begin() as conn:
            await self._require_run(conn, run_id)
            result = await conn.execute(
                delete(_parts).where(_parts.c.run_id == run_id, _parts.c.seq < below)
            )
            return int(result.rowcount)

    @_retried("read the parts of a snapshot")
    async def load_snapshot_parts(self, run_id: str, seq: int) -> list[SnapshotPart]:  # noqa: D102
        await self._gate.wait()
        async with self._engine.connect() as conn:
            await self._require_run(conn, run_id)
            rows = await conn.execute(
                select(_parts)
                .where(_parts.c.run_id == run_id, _parts.c.seq == seq)
                .order_by(_parts.c.worker)
            )
            return [
                SnapshotPart.model_validate(
                    {
                        **row.body,
                        "run_id": row.run_id,
                        "seq": row.seq,
                        "worker": row.worker,
                        "error": row.error,
                        "written_at": row.written_at,
                    }
                )
                for row in rows
            ]

    @_retried("claim agents")
    async def claim_agents(  # noqa: D102
        self, run_id: str, owner: str, agents: Collection[str], expires_at: datetime
    ) -> list[AgentLease]:
        await self._gate.wait()
        now = utcnow()
        names = sorted(set(agents))
        try:
            await self._claim_agents(run_id, owner, names, expires_at, now)
        except _Refused as refused:
            return refused.held
        return []

    async def _claim_agents(
        self, run_id: str, owner: str, names: list[str], expires_at: datetime, now: datetime
    ) -> None:
        async with self._begin() as conn:
            await self._require_run(conn, run_id)
            refused: list[str] = []
            for agent in names:  # in one order, so that two claimants never deadlock
                inserted = await conn.execute(
                    self._insert_ignore(_agent_leases, ["run_id", "agent"])
                    .values(run_id=run_id, agent=agent, owner=owner, expires_at=expires_at)
                    .execution_options(preserve_rowcount=True)
                )
                if inserted.rowcount == 1:
                    continue
                # PostgreSQL re-checks the condition on the newest row version after
                # waiting for a concurrent claim, so one of two claimants wins.
                updated = await conn.execute(
                    _agent_leases.update()
                    .where(
                        _agent_leases.c.run_id == run_id,
                        _agent_leases.c.agent == agent,
                        or_(_agent_leases.c.owner == owner, _agent_leases.c.expires_at <= now),
                    )
                    .values(owner=owner, expires_at=expires_at)
                )
                if updated.rowcount != 1:
                    refused.append(agent)
            if not refused:
                return
            rows = await conn.execute(
                select(_agent_leases).where(
                    _agent_leases.c.run_id == run_id, _agent_leases.c.agent.in_(refused)
                )
            )
            held = [
                AgentLease(
                    run_id=row.run_id, agent=row.agent, owner=row.owner, expires_at=row.expires_at
                )
                for row in rows
            ]
            # All or none: raised out of the transaction, which lets the claims above go.
            raise _Refused(sorted(held, key=lambda lease: lease.agent))

    @_retried("release agents")
    async def release_agents(self, run_id: str, owner: str) -> None:  # noqa: D102
        await self._gate.wait()
        now = utcnow()
        async with self._begin() as conn:
            await conn.execute(
                _agent_leases.update()
                .where(
                    _agent_leases.c.run_id == run_id,
                    _agent_leases.c.owner == owner,
                    _agent_leases.c.expires_at > now,
                )
                .values(expires_at=now)
            )

    @_retried("list agent leases")
    async def list_agent_leases(self, run_id: str) -> list[AgentLease]:  # noqa: D102
        await self._gate.wait()
        async with self._engine.connect() as conn:
            rows = await conn.execute(
                select(_agent_leases)
                .where(_agent_leases.c.run_id == run_id)
                .order_by(_agent_leases.c.agent)
            )
            return [
                AgentLease(
                    run_id=row.run_id, agent=row.agent, owner=row.owner, expires_at=row.expires_at
                )
                for row in rows
            ]

    # -- ownership ------------------------------------------------------------------------

    @_retried("read a lease")
    async def get_lease(self, run_id: str) -> RunLease | None:  # noqa: D102
        await self._gate.wait()
        async with self._engine.connect() as conn:
            row = (
                await conn.execute(select(_leases).where(_leases.c.run_id == run_id))
            ).one_or_none()
        if row is None:
            return None
        return RunLease(
            run_id=row.run_id, owner=row.owner, token=row.token, expires_at=row.expires_at
        )

    async def take_lease(  # noqa: D102
        self, run_id: str, owner: str, expires_at: datetime, *, replacing: int | None
    ) -> RunLease | None:
        return await self.retry.call(
            "take the lease of run {0}",
            self._take_lease,
            run_id,
            owner,
            expires_at,
            replacing,
            where=self.where,
            bounded=self.bounded,
        )

    async def _take_lease(
        self, again: bool, run_id: str, owner: str, expires_at: datetime, replacing: int | None
    ) -> RunLease | None:
        await self._gate.wait()
        token = 1 if replacing is None else replacing + 1
        if again:
            held = await self.get_lease(run_id)
            if held is not None and held.owner == owner and held.token == token:
                return held  # the attempt before took it, though its answer was lost
        values = {"owner": owner, "token": token, "expires_at": expires_at, "renewed_at": utcnow()}
        async with self._begin() as conn:
            await self._require_run(conn, run_id)
            statement: Insert | Update
            if replacing is None:
                statement = (
                    self._insert_ignore(_leases, ["run_id"])
                    .values(run_id=run_id, **values)
                    .execution_options(preserve_rowcount=True)
                )
            else:
                # PostgreSQL re-checks the token on the newest row version after waiting
                # for a concurrent takeover, so only one of two racers changes the row.
                statement = (
                    _leases.update()
                    .where(_leases.c.run_id == run_id, _leases.c.token == replacing)
                    .values(**values)
                )
            if (await conn.execute(statement)).rowcount != 1:
                return None
        return RunLease(run_id=run_id, owner=owner, token=token, expires_at=expires_at)

    @_retried("renew a lease")
    async def renew_lease(self, run_id: str, token: int, expires_at: datetime) -> bool:  # noqa: D102
        return await self._set_lease(run_id, token, expires_at)

    @_retried("release a lease")
    async def release_lease(self, run_id: str, token: int) -> None:  # noqa: D102
        await self._set_lease(run_id, token, None)

    async def _set_lease(self, run_id: str, token: int, expires_at: datetime | None) -> bool:
        await self._gate.wait()
        now = utcnow()
        async with self._begin() as conn:
            result = await conn.execute(
                _leases.update()
                .where(_leases.c.run_id == run_id, _leases.c.token == token)
                .values(expires_at=expires_at or now, renewed_at=now)
            )
            return bool(result.rowcount == 1)

    def fence(self, run_id: str, token: int) -> None:  # noqa: D102
        self._fences[run_id] = token

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

    async def _holder(self, run_id: str) -> tuple[str, int] | None:
        lease = await self.get_lease(run_id)
        return None if lease is None else (lease.owner, lease.token)

    # -- reads ----------------------------------------------------------------------------

    @_retried("read a run")
    async def get_run(self, run_id: str) -> RunInfo:  # noqa: D102
        await self._gate.wait()
        async with self._engine.connect() as conn:
            row = (await conn.execute(_RUN_AND_LEASE.where(_runs.c.id == run_id))).one_or_none()
            if row is None:
                raise NotFoundError("run", run_id)
            tags = await _tags_of(conn, [run_id])
        return _run(row._mapping, utcnow(), tags.get(run_id))

    @_retried("list runs")
    async def list_runs(  # noqa: D102
        self,
        *,
        status: RunStatus | str | Collection[RunStatus | str] | None = None,
        name: str | None = None,
        tags: Mapping[str, str] | None = None,
        since: datetime | None = None,
        limit: int | None = None,
    ) -> list[RunInfo]:
        wanted = run_filter(status, name, tags, since, limit)
        await self._gate.wait()
        now = utcnow()
        query = runs_query(_RUN_AND_LEASE, wanted, now, self._backend)
        async with self._engine.connect() as conn:
            if not query.refine:
                runs = [_run(row._mapping, now) for row in await conn.execute(query.select)]
            else:  # statuses computed here decide: read newest first until enough are kept
                runs = []
                result = await conn.stream(query.select)
                async for row in result:
                    run = _run(row._mapping, now)
                    if wanted.matches(run):
                        runs.append(run)
                        if len(runs) == wanted.limit:
                            break
                await result.close()
            if query.newest_first:
                runs.reverse()
            labels = await _tags_of(conn, None if wanted.selects_all else [r.id for r in runs])
        return [r.model_copy(update={"tags": labels.get(r.id, {})}) for r in runs]

    @_retried("find ids")
    async def find_ids(  # noqa: D102
        self, kind: Literal["run", "snapshot"], prefix: str, limit: int = 10
    ) -> list[str]:
        await self._gate.wait()
        column = (_runs if kind == "run" else _snapshots).c.id
        query = select(column).where(column.startswith(prefix, autoescape=True))
        async with self._engine.connect() as conn:
            rows = await conn.execute(query.order_by(column).limit(limit))
            return [row[0] for row in rows]

    @_retried("list snapshots")
    async def list_snapshots(self, run_id: str) -> list[Snapshot]:  # noqa: D102
        await self._gate.wait()
        async with self._engine.connect() as conn:
            rows = await self._snapshot_rows(conn, run_id)
            return await self._assemble(conn, [row._mapping for row in rows])

    async def _snapshot_rows(
        self, conn: AsyncConnection, run_id: str, after_seq: int = 0, limit: int | None = None
    ) -> Sequence[Row[Any]]:
        """The snapshot rows of a run after ``after_seq``, in order (``limit`` of them)."""
        await self._require_run(conn, run_id)
        query = (
            select(_snapshots)
            .where(_snapshots.c.run_id == run_id, _snapshots.c.seq > after_seq)
            .order_by(_snapshots.c.seq)
        )
        return (await conn.execute(query if limit is None else query.limit(limit))).all()

    @_retried("list snapshots")
    async def list_snapshots_page(  # noqa: D102
        self, run_id: str, *, after_seq: int = 0, limit: int = 100
    ) -> list[Snapshot]:
        _check_limit(limit)
        await self._gate.wait()
        async with self._engine.connect() as conn:
            rows = await self._snapshot_rows(conn, run_id, after_seq, limit)
            return await self._assemble(conn, [row._mapping for row in rows])

    @_retried("list snapshots")
    async def list_snapshot_summaries(self, run_id: str) -> list[SnapshotSummary]:  # noqa: D102
        await self._gate.wait()
        async with self._engine.connect() as conn:
            rows = await self._snapshot_rows(conn, run_id)
            # Each distinct state is read once, checked, and let go.
            reader = SnapshotReader(keep_states=False)
            summaries: list[SnapshotSummary] = []
            for start in range(0, len(rows), _PAGE):
                page: list[Any] = [row._mapping for row in rows[start : start + _PAGE]]
                await self._read_parts(conn, reader, page)
                summaries.extend(reader.summary(row) for row in page)
            return summaries

    @_retried("count snapshots")
    async def snapshot_counts(self) -> dict[str, int]:  # noqa: D102
        await self._gate.wait()
        query = select(_snapshots.c.run_id, func.count()).group_by(_snapshots.c.run_id)
        async with self._engine.connect() as conn:
            return {row[0]: row[1] for row in await conn.execute(query)}

    @_retried("load a snapshot")
    async def load_snapshot(self, snapshot_id: str) -> Snapshot:  # noqa: D102
        await self._gate.wait()
        async with self._engine.connect() as conn:
            row = (
                await conn.execute(select(_snapshots).where(_snapshots.c.id == snapshot_id))
            ).one_or_none()
            if row is None:
                raise NotFoundError("snapshot", snapshot_id)
            (snapshot,) = await self._assemble(conn, [row._mapping])
            return snapshot

    @_retried("read an agent's history")
    async def agent_history(self, run_id: str, agent: str) -> list[AgentVersion]:  # noqa: D102
        # Whole snapshots are read, so that a version is marked damaged exactly when its
        # snapshot is (an agent's row may be missing, found only from the other rows).
        await self._gate.wait()
        async with self._engine.connect() as conn:
            await self._require_run(conn, run_id)
            rows = (
                await conn.execute(
                    select(_snapshots)
                    .where(
                        _snapshots.c.run_id == run_id,
                        _snapshots.c.status == SnapshotStatus.COMPLETE.value,
                    )
                    .order_by(_snapshots.c.seq)
                )
            ).all()
            snapshots = await self._assemble(conn, [row._mapping for row in rows])
        versions = agent_versions(snapshots, agent)
        if not versions:
            raise NotFoundError.agent(run_id, agent)
        return versions

    @_retried("load the journal")
    async def load_journal(self, run_id: str) -> list[JournalSegment]:  # noqa: D102
        await self._gate.wait()
        async with self._engine.connect() as conn:
            await self._require_run(conn, run_id)
            rows = await conn.execute(
                select(
                    _journal.c.src,
                    _journal.c.dst,
                    _journal.c.event,
                    _journal.c.first_seq,
                    _journal.c.last_seq,
                    _journal.c.entries,
                )
                .where(_journal.c.run_id == run_id)
                .order_by(_journal.c.pos)
            )
            return [JournalSegment(*row) for row in rows]

    @_retried("load the journal")
    async def load_journal_page(  # noqa: D102
        self, run_id: str, *, after: int = 0, limit: int = 1000
    ) -> list[tuple[int, JournalSegment]]:
        _check_limit(limit)
        await self._gate.wait()
        async with self._engine.connect() as conn:
            await self._require_run(conn, run_id)
            rows = await conn.execute(
                select(
                    _journal.c.pos,
                    _journal.c.src,
                    _journal.c.dst,
                    _journal.c.event,
                    _journal.c.first_seq,
                    _journal.c.last_seq,
                    _journal.c.entries,
                )
                .where(_journal.c.run_id == run_id, _journal.c.pos > after)
                .order_by(_journal.c.pos)
                .limit(limit)
            )
            return [(row[0], JournalSegment(*row[1:])) for row in rows]

    @_retried("load the replay log")
    async def load_replay(self, run_id: str) -> list[ReplaySegment]:  # noqa: D102
        await self._gate.wait()
        async with self._engine.connect() as conn:
            await self._require_run(conn, run_id)
            rows = await conn.execute(
                select(_replay.c.timeline, _replay.c.body)
                .where(_replay.c.run_id == run_id)
                .order_by(_replay.c.position)
            )
            return [ReplaySegment(row.timeline, row.body) for row in rows]

    @_retried("list graph checkpoints")
    async def list_graph_checkpoints(
        self, run_id: str, agent: str | None = None
    ) -> list[GraphCheckpoint]:
        """The LangGraph checkpoints the graph agents of a run (or only ``agent``) wrote.

        They are found when each graph agent's checkpointer is an ``AgentsnapSaver`` on this
        store's database: it keeps them in ``agentsnap_lg_checkpoints``, on the agent's threads
        (``"{run}:{agent}"`` and ``"{run}:{agent}:N"``). Checkpoints kept elsewhere (LangGraph's
        ``InMemorySaver``, another database) are not seen. Oldest first (by checkpoint id,
        which LangGraph makes time-ordered, then by thread), the root graph's checkpoints
        only. Step, source and metadata are read from metadata stored as JSON; other metadata
        is not decoded and they are ``None``.

        Raises:
            NotFoundError: The store holds no such run.
        """
        await self._gate.wait()
        table = _lg_checkpoints
        threads = table.c.thread_id.startswith(f"{run_id}:", autoescape=True)
        if agent is not None:
            home = f"{run_id}:{agent}"
            threads = (table.c.thread_id == home) | table.c.thread_id.startswith(
                f"{home}:", autoescape=True
            )
        async with self._engine.connect() as conn:
            await self._require_run(conn, run_id)
            rows = await conn.execute(
                select(
                    table.c.thread_id,
                    table.c.checkpoint_id,
                    table.c.parent_checkpoint_id,
                    table.c.meta_type,
                    table.c.meta,
                )
                .where(table.c.checkpoint_ns == "", threads)
                .order_by(table.c.checkpoint_id, table.c.thread_id)
            )
            found = []
            for row in rows:
                # Exactly (SQLite's LIKE ignores case), and only threads graph agents name.
                name = _thread_agent(run_id, row.thread_id)
                if name is None or (agent is not None and name != agent):
                    continue
                metadata = _json_metadata(row.meta_type, row.meta)
                step = None if metadata is None else metadata.get("step")
                source = None if metadata is None else metadata.get("source")
                found.append(
                    GraphCheckpoint(
                        run_id=run_id,
                        agent=name,
                        thread_id=row.thread_id,
                        checkpoint_id=row.checkpoint_id,
                        parent_id=row.parent_checkpoint_id,
                        step=step if type(step) is int else None,
                        source=source if isinstance(source, str) else None,
                        created_at=_uuid6_time(row.checkpoint_id),
                        metadata=metadata,
                    )
                )
            return found

    async def _require_run(self, conn: AsyncConnection, run_id: str) -> None:
        if await conn.scalar(select(_runs.c.id).where(_runs.c.id == run_id)) is None:
            raise NotFoundError("run", run_id)

    async def _assemble(self, conn: AsyncConnection, rows: Sequence[Any]) -> list[Snapshot]:
        """The snapshots of these snapshot rows, each checked as it is read.

        A snapshot whose rows are missing or unreadable comes back damaged, with the reason
        (see [`agentsnap.integrity`][agentsnap.integrity]), never as an error. Counters,
        payloads and headers are read as the text stored, so the reader sees text that is
        not JSON; each distinct state is read once.
        """
        if not rows:
            return []
        reader = SnapshotReader()
        states = StateLoader()
        for start in range(0, len(rows), _PAGE):
            await self._read_parts(conn, reader, rows[start : start + _PAGE], states)
        return [reader.snapshot(row) for row in rows]

    async def _read_parts(
        self,
        conn: AsyncConnection,
        reader: SnapshotReader,
        rows: Sequence[Any],
        states: StateLoader | None = None,
    ) -> None:
        """Give ``reader`` the cuts, states and messages in flight of these snapshot rows.

        A snapshot stored as the changes to a base gets its own agent rows and, for every
        other process, the base's row (in the database's order of the agents' names, as a
        full snapshot's rows come). States already given to the reader are not read again.
        """
        states = states or StateLoader()
        ids = [row["id"] for row in rows]
        own = select(
            _agents.c.snapshot_id,
            _agents.c.agent,
            _agents.c.state_hash,
            type_coerce(_agents.c.sent, Text()).label("sent"),
            type_coerce(_agents.c.received, Text()).label("received"),
            _agents.c.state_version,
            literal_column("1").label("own"),
        ).where(_agents.c.snapshot_id.in_(ids))
        query: Select[Any] | CompoundSelect[Any] = own
        deltas = {row["id"]: row for row in rows if row["base_id"] is not None}
        if deltas:
            based = _agents.alias("based")
            kept = _agents.alias("kept")
            inherited = (
                select(
                    _snapshots.c.id,
                    based.c.agent,
                    based.c.state_hash,
                    type_coerce(based.c.sent, Text()),
                    type_coerce(based.c.received, Text()),
                    based.c.state_version,
                    literal_column("0"),
                )
                .join(based, based.c.snapshot_id == _snapshots.c.base_id)
                .where(
                    _snapshots.c.id.in_(list(deltas)),
                    ~select(literal_column("1"))
                    .where(kept.c.snapshot_id == _snapshots.c.id, kept.c.agent == based.c.agent)
                    .exists(),
                )
            )
            query = union_all(own, inherited)
        columns = query.selected_columns
        cuts = (await conn.execute(query.order_by(columns.snapshot_id, columns.agent))).all()
        loaded = await states.load(conn, reader.wanted(cut.state_hash for cut in cuts))
        for state_hash, state in loaded.texts.items():
            reader.blob(state_hash, state)
        for state_hash, problem in loaded.problems.items():
            reader.unreadable(state_hash, problem)
        del loaded
        held = dict.fromkeys(deltas, 0)
        for cut in cuts:
            reader.cut(
                cut.snapshot_id,
                cut.agent,
                cut.state_hash,
                cut.sent,
                cut.received,
                state_version=cut.state_version,
            )
            if cut.own and cut.snapshot_id in held:
                held[cut.snapshot_id] += 1
        for snapshot_id, count in held.items():
            delta = deltas[snapshot_id]
            if count != delta["agent_rows"]:
                reader.problem(
                    snapshot_id,
                    f"it holds {count} agent rows of its own where {delta['agent_rows']} were "
                    f"written (it is stored as the changes to snapshot {delta['base_id']})",
                )
        messages = await conn.execute(
            select(
                _messages.c.snapshot_id,
                _messages.c.src,
                _messages.c.dst,
                _messages.c.seq,
                _messages.c.kind,
                type_coerce(_messages.c.payload, Text()).label("payload"),
                type_coerce(_messages.c.headers, Text()).label("headers"),
                _messages.c.epoch,
            )
            .where(_messages.c.snapshot_id.in_(ids))
            .order_by(_messages.c.snapshot_id, _messages.c.src, _messages.c.dst, _messages.c.seq)
        )
        for m in messages:
            reader.message(
                m.snapshot_id, m.src, m.dst, m.seq, m.kind, m.payload, m.headers, m.epoch
            )

    # -- plumbing -------------------------------------------------------------------------

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
        snapshot=insert(
            _snapshots,
            [
                "id",
                "run_id",
                "seq",
                "initiator",
                "status",
                "started_at",
                "completed_at",
                "error",
                "base_id",
                "agent_rows",
            ],
        ),
        blobs=insert(_blobs, ["hash", "state", "lists", "roots"], " ON CONFLICT (hash) DO NOTHING"),
        agents=insert(
            _agents, ["snapshot_id", "agent", "state_hash", "sent", "received", "state_version"]
        ),
        messages=insert(
            _messages, ["snapshot_id", "src", "dst", "seq", "kind", "payload", "headers", "epoch"]
        ),
        lease=f"SELECT owner, token FROM {_leases.name} WHERE run_id = {mark}{share}",  # noqa: S608
        replay=replay,
        replay_fenced=f"{replay} WHERE EXISTS ({holds})",
    )


class _Refused(Exception):
    """Some agents claimed are held by another owner: the claim's transaction is undone."""

    def __init__(self, held: list[AgentLease]) -> None:
        super().__init__(f"{len(held)} agents held by others")
        self.held = held


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


def _thread_agent(run_id: str, thread_id: str) -> str | None:
    """The graph agent of thread ``"{run}:{agent}"`` or ``"{run}:{agent}:N"``, else ``None``."""
    if not thread_id.startswith(f"{run_id}:"):
        return None
    agent, _, number = thread_id[len(run_id) + 1 :].partition(":")
    if not agent or (number and not (number.isascii() and number.isdigit())):
        return None
    return agent


def _json_metadata(meta_type: str, meta: bytes | None) -> dict[str, Any] | None:
    """Checkpoint metadata the saver stored as JSON; other encodings are not decoded."""
    if meta_type != "json" or meta is None:
        return None
    try:
        loaded = json.loads(bytes(meta))
    except ValueError:
        return None
    return loaded if isinstance(loaded, dict) else None


_UUID_EPOCH = datetime(1582, 10, 15, tzinfo=UTC)


def _uuid6_time(uuid_text: str) -> datetime | None:
    """When a version-6 UUID (LangGraph's checkpoint ids) was made; ``None`` for another id.

    Its 60-bit timestamp counts 100 ns since 1582-10-15: the first 48 bits of the UUID,
    then the 12 bits after the version digit.
    """
    digits = uuid_text.replace("-", "")
    if len(digits) != 32 or digits[12] != "6":
        return None
    try:
        ticks = int(digits[:12] + digits[13:16], 16)
        return _UUID_EPOCH + timedelta(microseconds=ticks // 10)
    except (ValueError, OverflowError):
        return None


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
    return RunInfo(
        id=row["id"],
        created_at=row["created_at"],
        parent_run_id=row["parent_run_id"],
        parent_snapshot_id=row["parent_snapshot_id"],
        metadata=row["metadata"],
        status=status,
        finished_at=row["finished_at"],
        name=row["name"],
        tags=tags or {},
        status_reason=reason,
        traceback=row["traceback"],
        cancel_requested=row["cancel_requested"],
    )
