"""The LangGraph checkpoint saver on agentsnap's tables."""

from __future__ import annotations

import asyncio
import builtins
import random
import sqlite3
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, cast

import orjson
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    PendingWrite,
    get_checkpoint_id,
    get_checkpoint_metadata,
    writes_sort_key,
)
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from sqlalchemy import Connection, Engine, Table, create_engine, delete, event, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from agentsnap.exceptions import ConfigurationError, StoreError
from agentsnap.integrations.langgraph._history import (
    PRUNE_STRATEGIES,
    Transaction,
    copy_thread,
    delete_runs,
    prune_threads,
)
from agentsnap.integrations.langgraph._rows import (
    EMPTY,
    JSON,
    WriteEntry,
    checkpoint_config,
    inline,
    insert_sql,
    merge_writes,
    named,
    pack_writes,
    plain_json,
    unpack_writes,
)
from agentsnap.store.faults import Fault, classify
from agentsnap.store.migrate import ensure_schema, sync_url
from agentsnap.store.sql import DEFAULT_URL
from agentsnap.store.tables import (
    LangGraphBlobRow,
    LangGraphCheckpointRow,
    LangGraphTaskWritesRow,
)

__all__ = ["AgentsnapSaver"]

_checkpoints: Table = LangGraphCheckpointRow.__table__  # type: ignore[assignment]
_blobs: Table = LangGraphBlobRow.__table__  # type: ignore[assignment]
_writes: Table = LangGraphTaskWritesRow.__table__  # type: ignore[assignment]

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


class AgentsnapSaver(BaseCheckpointSaver[str]):
    """A LangGraph checkpoint saver on agentsnap's database (SQLite or PostgreSQL).

    Pass it as a graph's ``checkpointer`` (``builder.compile(checkpointer=saver)``).

    The saver keeps three tables next to agentsnap's own, created by agentsnap's migrations:
    ``agentsnap_lg_checkpoints`` (a checkpoint without its channel values),
    ``agentsnap_lg_blobs`` (each channel value, once per version of its channel) and
    ``agentsnap_lg_task_writes`` (the pending writes of tasks, one row per task and
    checkpoint). A checkpoint that leaves a channel
    unchanged refers to the value already stored for its version instead of storing it again;
    small scalars (``None``, booleans, numbers, strings up to 256 characters) are kept in the
    checkpoint's own row instead, which costs less than a row of their own.

    Values are encoded by LangGraph's ``JsonPlusSerializer`` in strict mode: JSON and msgpack
    only, with the pickle fallback off and msgpack extension types limited to LangGraph's
    safe types and the modules you allow (``allowed_msgpack_modules``). Reading the database
    never unpickles anything or imports a module that is not on that allowlist. A checkpoint's
    metadata is stored as plain JSON (type tag ``"json"``) when it is plain JSON data, so that
    other tools can read a checkpoint's ``step`` and ``source`` without LangGraph; other
    metadata goes through the serializer.

    Besides LangGraph's base methods, the saver manages the history of threads:
    [`copy_thread`][agentsnap.integrations.langgraph.AgentsnapSaver.copy_thread],
    [`prune`][agentsnap.integrations.langgraph.AgentsnapSaver.prune] and
    [`delete_for_runs`][agentsnap.integrations.langgraph.AgentsnapSaver.delete_for_runs],
    each one transaction, in SQL, that also deletes the channel values no checkpoint
    refers to any more.

    The synchronous methods run on the calling thread; the asynchronous ones run the same
    code in a worker thread, so they do not block the event loop.

    Args:
        url: Database URL, as for [`SqlStore`][agentsnap.store.sql.SqlStore]: the saver may
            share the database of agentsnap's runs or have its own.
        create: Create agentsnap's schema in an empty database on first use.
        allowed_msgpack_modules: Types, as ``(module, class)`` tuples, that may be rebuilt
            from msgpack besides LangGraph's safe types (messages, dates, UUIDs…). Values of
            other types are read back as plain data.
        echo: Log every SQL statement.

    Raises:
        ConfigurationError: The URL is not SQLite or PostgreSQL, or is an in-memory SQLite
            database (each connection would see its own).
    """

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        create: bool = True,
        allowed_msgpack_modules: Sequence[tuple[str, ...]] | None = None,
        echo: bool = False,
    ) -> None:
        super().__init__(
            serde=JsonPlusSerializer(
                pickle_fallback=False,
                allowed_msgpack_modules=list(allowed_msgpack_modules or ()) or None,
            )
        )
        self.url = url
        self._create = create
        parsed = make_url(sync_url(url))
        self._sqlite = parsed.get_backend_name() == "sqlite"
        if self._sqlite and parsed.database in {None, "", ":memory:"}:
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
            event.listen(self._engine, "connect", _sqlite_pragmas)
        self._dialect: Any = sqlite if self._sqlite else postgresql
        # SQLite has one writer at a time: take turns here rather than in its busy handler.
        self._lock = threading.Lock()
        self._ready = False
        # On SQLite the writes go through one plain sqlite3 connection (opened on first use,
        # used under the lock) with the statements' text ready: SQLAlchemy would cost more
        # than the writes themselves. It is in autocommit mode, so that a write of one
        # statement (most puts) is one step of SQLite, without BEGIN and COMMIT around it.
        # PostgreSQL takes SQLAlchemy statements built here once.
        self._raw: sqlite3.Connection | None = None
        self._raw_connect_args = (
            self._engine.dialect.create_connect_args(parsed) if self._sqlite else None
        )
        insert = self._dialect.insert
        upsert = insert(_checkpoints)
        self._put_checkpoint = upsert.on_conflict_do_update(
            index_elements=list(_CHECKPOINT_KEY),
            set_={name: upsert.excluded[name] for name in _CHECKPOINT_UPDATED},
        )
        self._put_blob = insert(_blobs).on_conflict_do_nothing(index_elements=list(_BLOB_KEY))
        # RETURNING says whether the row went in (no row on a conflict).
        self._add_writes = (
            insert(_writes)
            .on_conflict_do_nothing(index_elements=list(_WRITES_KEY))
            .returning(_writes.c.task_id)
        )

    def __repr__(self) -> str:
        return f"AgentsnapSaver({make_url(self.url).render_as_string(hide_password=True)!r})"

    def close(self) -> None:
        """Close the saver's database connections."""
        with self._lock:
            if self._raw is not None:
                self._raw.close()
                self._raw = None
        self._engine.dispose()

    async def aclose(self) -> None:
        """Close the saver's database connections (off the event loop)."""
        await asyncio.to_thread(self.close)

    def _ensure_schema(self) -> None:
        if not self._ready:
            with self._lock:
                if not self._ready:
                    ensure_schema(self.url, create=self._create)
                    self._ready = True

    def _connect(self) -> Connection:
        self._ensure_schema()
        return self._engine.connect()

    def _raw_connection(self) -> sqlite3.Connection:
        """The SQLite write connection; the caller holds the lock."""
        if self._raw is None:
            assert self._raw_connect_args is not None
            args, kwargs = self._raw_connect_args
            connect: Any = sqlite3.connect
            raw: sqlite3.Connection = connect(
                *args, **{**kwargs, "check_same_thread": False, "isolation_level": None}
            )
            try:
                _sqlite_pragmas(raw, None)
            except BaseException:
                raw.close()
                raise
            self._raw = raw
        return self._raw

    def _load_value(self, value_type: str, value: bytes) -> Any:
        return self.serde.loads_typed((value_type, value))

    def _load_metadata(self, meta_type: str, meta: bytes) -> Any:
        # Metadata stored as JSON is plain data: read it as such, without LangGraph's reviver
        # (which would turn some dicts into objects).
        if meta_type == JSON:
            return orjson.loads(meta)
        return self.serde.loads_typed((meta_type, meta))

    def _dump_metadata(self, metadata: Any) -> tuple[str, bytes]:
        if plain_json(metadata):
            try:
                return JSON, orjson.dumps(metadata)
            except orjson.JSONEncodeError:  # an integer beyond 64 bits
                pass
        return self.serde.dumps_typed(metadata)

    # Reads.

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint ``config`` names, or the thread's newest one without an id.

        Args:
            config: ``configurable`` holds ``thread_id``, optionally ``checkpoint_ns`` and
                ``checkpoint_id``.

        Returns:
            The checkpoint with its values, metadata, parent and pending writes, or ``None``.
        """
        configurable = config["configurable"]
        query = select(_checkpoints).where(
            _checkpoints.c.thread_id == configurable["thread_id"],
            _checkpoints.c.checkpoint_ns == configurable.get("checkpoint_ns", ""),
        )
        checkpoint_id = get_checkpoint_id(config)
        if checkpoint_id:
            query = query.where(_checkpoints.c.checkpoint_id == checkpoint_id)
        query = query.order_by(_checkpoints.c.checkpoint_id.desc()).limit(1)
        with self._connect() as connection:
            row = connection.execute(query).mappings().first()
            if row is None:
                return None
            return self._tuple(connection, row)

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """The checkpoints that match, newest first.

        Args:
            config: Restricts to a thread (``thread_id``), a namespace (``checkpoint_ns``) and
                a checkpoint (``checkpoint_id``); ``None`` lists every thread.
            filter: Metadata that the checkpoints must have (equal values).
            before: Only checkpoints older than this one.
            limit: At most this many checkpoints.

        Yields:
            The matching checkpoint tuples.
        """
        query = select(_checkpoints)
        if config is not None:
            configurable = config["configurable"]
            query = query.where(_checkpoints.c.thread_id == configurable["thread_id"])
            checkpoint_ns = configurable.get("checkpoint_ns")
            if checkpoint_ns is not None:
                query = query.where(_checkpoints.c.checkpoint_ns == checkpoint_ns)
            checkpoint_id = get_checkpoint_id(config)
            if checkpoint_id:
                query = query.where(_checkpoints.c.checkpoint_id == checkpoint_id)
        if before is not None and (before_id := get_checkpoint_id(before)):
            query = query.where(_checkpoints.c.checkpoint_id < before_id)
        query = query.order_by(
            _checkpoints.c.checkpoint_id.desc(),
            _checkpoints.c.thread_id,
            _checkpoints.c.checkpoint_ns,
        )
        if limit is not None and not filter:
            query = query.limit(max(limit, 0))
        found: list[CheckpointTuple] = []
        with self._connect() as connection:
            for row in connection.execute(query).mappings():
                if limit is not None and len(found) >= limit:
                    break
                metadata = self._load_metadata(row["meta_type"], row["meta"])
                if filter and not all(
                    key in metadata and metadata[key] == value for key, value in filter.items()
                ):
                    continue
                found.append(self._tuple(connection, row, metadata))
        yield from found

    def _tuple(
        self, connection: Connection, row: Any, metadata: Any | None = None
    ) -> CheckpointTuple:
        thread_id: str = row["thread_id"]
        checkpoint_ns: str = row["checkpoint_ns"]
        checkpoint_id: str = row["checkpoint_id"]
        checkpoint = self.serde.loads_typed((row["checkpoint_type"], row["checkpoint"]))
        if metadata is None:
            metadata = self._load_metadata(row["meta_type"], row["meta"])
        inline: dict[str, Any] = checkpoint.get("channel_values") or {}
        versions = checkpoint["channel_versions"]
        stored = {channel: versions[channel] for channel in versions if channel not in inline}
        checkpoint["channel_values"] = {
            **inline,
            **self._load_values(connection, thread_id, checkpoint_ns, stored),
        }
        parent: str | None = row["parent_checkpoint_id"]
        return CheckpointTuple(
            config=checkpoint_config(thread_id, checkpoint_ns, checkpoint_id),
            checkpoint=checkpoint,
            metadata=cast(CheckpointMetadata, metadata),
            parent_config=checkpoint_config(thread_id, checkpoint_ns, parent) if parent else None,
            pending_writes=self._load_writes(connection, thread_id, checkpoint_ns, checkpoint_id),
        )

    def _load_values(
        self,
        connection: Connection,
        thread_id: str,
        checkpoint_ns: str,
        versions: ChannelVersions,
    ) -> dict[str, Any]:
        if not versions:
            return {}
        wanted = {(channel, str(version)) for channel, version in versions.items()}
        # Only the versions wanted (with other channels' at those versions, dropped below),
        # rather than every version the thread ever had.
        rows = connection.execute(
            select(_blobs.c.channel, _blobs.c.version, _blobs.c.value_type, _blobs.c.value).where(
                _blobs.c.thread_id == thread_id,
                _blobs.c.checkpoint_ns == checkpoint_ns,
                _blobs.c.channel.in_(list(versions)),
                _blobs.c.version.in_(sorted({version for _, version in wanted})),
            )
        )
        values: dict[str, Any] = {}
        for channel, version, value_type, value in rows:
            if (channel, version) in wanted and value_type != EMPTY:
                values[channel] = self.serde.loads_typed((value_type, value))
        return values

    def _load_writes(
        self, connection: Connection, thread_id: str, checkpoint_ns: str, checkpoint_id: str
    ) -> builtins.list[PendingWrite]:
        rows = connection.execute(
            select(_writes.c.task_id, _writes.c.task_path, _writes.c.writes).where(
                _writes.c.thread_id == thread_id,
                _writes.c.checkpoint_ns == checkpoint_ns,
                _writes.c.checkpoint_id == checkpoint_id,
            )
        ).all()
        found = [
            (task_path, task_id, idx, channel, value_type, value)
            for task_id, task_path, writes in rows
            for idx, channel, value_type, value in unpack_writes(writes)
        ]
        found.sort(key=lambda w: writes_sort_key(w[0], w[1], w[2]))
        loads_typed = self.serde.loads_typed
        return [
            (task_id, channel, loads_typed((value_type, value)))
            for _, task_id, _, channel, value_type, value in found
        ]

    # Writes.

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Save a checkpoint, storing the values of the channels in ``new_versions``.

        Args:
            config: The thread, namespace and parent checkpoint (``checkpoint_id``).
            checkpoint: The checkpoint.
            metadata: Its metadata.
            new_versions: The channels whose value changed, with their new version.

        Returns:
            The config naming the saved checkpoint.
        """
        configurable = config["configurable"]
        thread_id: str = configurable["thread_id"]
        checkpoint_ns: str = configurable.get("checkpoint_ns", "")
        values = checkpoint["channel_values"]
        # Small scalars ride in the checkpoint row (cheaper than a row of their own each);
        # every other value is stored once per version of its channel.
        small = {channel: value for channel, value in values.items() if inline(value)}
        stored: dict[str, Any] = {**checkpoint, "channel_values": small}
        dumps_typed = self.serde.dumps_typed
        blobs: list[tuple[Any, ...]] = []
        for channel, version in new_versions.items():
            if channel in small:
                continue
            if channel in values:
                value_type, value = dumps_typed(values[channel])
            else:
                value_type, value = EMPTY, None
            blobs.append((thread_id, checkpoint_ns, channel, str(version), value_type, value))
        checkpoint_type, encoded = dumps_typed(stored)
        full_metadata = get_checkpoint_metadata(config, metadata)
        meta_type, meta = self._dump_metadata(full_metadata)
        run_id = full_metadata.get("run_id")
        row = (
            thread_id,
            checkpoint_ns,
            checkpoint["id"],
            configurable.get("checkpoint_id"),
            checkpoint_type,
            encoded,
            meta_type,
            meta,
            run_id if isinstance(run_id, str) else None,
        )
        if self._sqlite:
            if not blobs:
                self._sqlite_write(_SQLITE_PUT_CHECKPOINT, row)
            else:
                with self._sqlite_transaction() as raw:
                    raw.executemany(_SQLITE_PUT_BLOB, blobs)
                    raw.execute(_SQLITE_PUT_CHECKPOINT, row)
        else:
            with self._writing() as connection:
                if blobs:
                    connection.execute(self._put_blob, named(_blobs, blobs))
                connection.execute(self._put_checkpoint, named(_checkpoints, [row]))
                connection.commit()
        return checkpoint_config(thread_id, checkpoint_ns, checkpoint["id"])

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Save a task's writes against the checkpoint ``config`` names.

        A write already saved for the same task and index is kept as it was, except for the
        special channels (errors, interrupts…), whose newest write replaces the older one.
        The task's writes are stored as one row, in one insert the first time.

        Args:
            config: The thread, namespace and checkpoint.
            writes: ``(channel, value)`` pairs.
            task_id: The task that made the writes.
            task_path: The task's path in the graph.
        """
        if not writes:
            return
        configurable = config["configurable"]
        key = (
            configurable["thread_id"],
            configurable.get("checkpoint_ns", ""),
            configurable["checkpoint_id"],
            task_id,
        )
        dumps_typed = self.serde.dumps_typed
        # One entry per index, by the rules for writes sent again (a special channel written
        # twice keeps its last value).
        entries = merge_writes(
            (),
            [
                (WRITES_IDX_MAP.get(channel, idx), channel, *dumps_typed(value))
                for idx, (channel, value) in enumerate(writes)
            ],
        )
        if self._sqlite:
            row = (*key, task_path, pack_writes(entries))
            if self._sqlite_write(_SQLITE_ADD_WRITES, row) == 0:
                # The task has writes already: merge the new ones into them.
                with self._sqlite_transaction() as raw:
                    found = raw.execute(_SQLITE_GET_WRITES, key).fetchone()
                    if found is None:  # deleted in between
                        raw.execute(_SQLITE_ADD_WRITES, row)
                    else:
                        path, stored = found
                        merged = _merged(path, stored, entries, task_path)
                        raw.execute(_SQLITE_SET_WRITES, (*merged, *key))
            return
        with self._writing() as connection:
            (added,) = named(_writes, [(*key, task_path, pack_writes(entries))])
            if connection.execute(self._add_writes, added).first() is None:
                where = [
                    _writes.c[name] == value for name, value in zip(_WRITES_KEY, key, strict=True)
                ]
                found = connection.execute(
                    select(_writes.c.task_path, _writes.c.writes).where(*where).with_for_update()
                ).first()
                if found is None:  # deleted in between
                    connection.execute(self._add_writes, added)
                else:
                    path, stored = _merged(found.task_path, found.writes, entries, task_path)
                    connection.execute(
                        update(_writes).where(*where).values(task_path=path, writes=stored)
                    )
            connection.commit()

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

    def delete_thread(self, thread_id: str) -> None:
        """Delete every checkpoint, value and write of a thread.

        Args:
            thread_id: The thread.
        """
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
        """Copy a thread's whole history onto another thread.

        Every checkpoint of every namespace is copied with its id, parent, metadata, channel
        values and pending writes, in one transaction of ``INSERT … SELECT`` statements: the
        values are not decoded. The target thread then continues from any of them as the
        source would. A checkpoint or task write the target already holds under the same
        id is replaced by the copy; the target's other checkpoints stay. Copying a thread
        that holds nothing copies nothing.

        Args:
            source_thread_id: The thread to copy.
            target_thread_id: The thread that receives the copy.

        Raises:
            StoreError: On PostgreSQL, concurrent writes to the same threads aborted it each
                time it was tried.
        """
        if source_thread_id != target_thread_id:
            self._maintain(
                "copy_thread", lambda found: copy_thread(found, source_thread_id, target_thread_id)
            )

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints written by LangGraph runs, on every thread and namespace.

        A checkpoint belongs to the run its metadata's ``run_id`` names (a string, as the
        LangGraph server and ``config["metadata"]["run_id"]`` give it); the saver keeps it in
        an indexed column, so the run's checkpoints are found without reading any metadata.
        Their pending writes are deleted with them, and so are the channel values that no
        remaining checkpoint refers to; unknown run ids delete nothing.

        A checkpoint left behind whose parent was deleted still loads, with its values; a
        ``DeltaChannel`` whose history ran through a deleted checkpoint's writes is rebuilt
        from what remains, as LangGraph warns.

        Args:
            run_ids: The LangGraph run ids (not agentsnap's run ids: for those, see
                [`delete_run_threads`][agentsnap.store.langgraph.delete_run_threads]).

        Raises:
            ConfigurationError: ``run_ids`` is one string rather than a sequence of them.
            StoreError: On PostgreSQL, concurrent writes to the same threads aborted it each
                time it was tried.
        """
        _not_one_string("delete_for_runs", "run ids", run_ids)
        if run_ids:
            ids = list(run_ids)
            self._maintain(
                "delete_for_runs", lambda found: delete_runs(found, ids, self._load_value)
            )

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Delete older checkpoints of threads, or all of them.

        ``"keep_latest"`` keeps, in each namespace of each thread, the newest checkpoint with
        its pending writes, and deletes the others with their writes and the channel values
        only they referred to. When the graph uses LangGraph's ``DeltaChannel``, whose value
        is rebuilt from the writes of earlier checkpoints back to the last one that stored
        it, those earlier checkpoints are kept too (as the metadata's
        ``counters_since_delta_snapshot`` says which channels need them), so the kept
        checkpoint still loads with its full state. ``"delete"`` deletes the threads
        entirely, as
        [`delete_thread`][agentsnap.integrations.langgraph.AgentsnapSaver.delete_thread]
        does. Unknown threads are skipped.

        Args:
            thread_ids: The threads.
            strategy: ``"keep_latest"`` or ``"delete"``.

        Raises:
            ConfigurationError: ``strategy`` is neither of those, or ``thread_ids`` is one
                string rather than a sequence of them.
            StoreError: On PostgreSQL, concurrent writes to the same threads aborted it each
                time it was tried.
        """
        if strategy not in PRUNE_STRATEGIES:
            raise ConfigurationError(
                f"unknown prune strategy {strategy!r}: use 'keep_latest' (keep each "
                "namespace's newest checkpoint) or 'delete' (delete the threads)"
            )
        _not_one_string("prune", "thread ids", thread_ids)
        if thread_ids:
            ids = list(thread_ids)
            self._maintain(
                "prune",
                lambda found: prune_threads(
                    found, ids, strategy, self._load_value, self._load_metadata
                ),
            )

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

    def _writing(self) -> _Writing:
        return _Writing(self)

    # Asynchronous versions: the same code in a worker thread.

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """Asynchronous [`get_tuple`][agentsnap.integrations.langgraph.AgentsnapSaver.get_tuple]."""
        return await asyncio.to_thread(self.get_tuple, config)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """Asynchronous [`list`][agentsnap.integrations.langgraph.AgentsnapSaver.list]."""
        found = await asyncio.to_thread(
            lambda: [*self.list(config, filter=filter, before=before, limit=limit)]
        )
        for item in found:
            yield item

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Asynchronous [`put`][agentsnap.integrations.langgraph.AgentsnapSaver.put]."""
        return await asyncio.to_thread(self.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Asynchronous [`put_writes`][agentsnap.integrations.langgraph.AgentsnapSaver.put_writes]."""  # noqa: E501
        await asyncio.to_thread(self.put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        """Asynchronous [`delete_thread`][agentsnap.integrations.langgraph.AgentsnapSaver.delete_thread]."""  # noqa: E501
        await asyncio.to_thread(self.delete_thread, thread_id)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Asynchronous [`copy_thread`][agentsnap.integrations.langgraph.AgentsnapSaver.copy_thread]."""  # noqa: E501
        await asyncio.to_thread(self.copy_thread, source_thread_id, target_thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Asynchronous [`delete_for_runs`][agentsnap.integrations.langgraph.AgentsnapSaver.delete_for_runs]."""  # noqa: E501
        await asyncio.to_thread(self.delete_for_runs, run_ids)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Asynchronous [`prune`][agentsnap.integrations.langgraph.AgentsnapSaver.prune]."""
        await asyncio.to_thread(self.prune, thread_ids, strategy=strategy)

    def get_next_version(self, current: str | int | None, channel: None) -> str:
        """The version after ``current``: a zero-padded counter and a random suffix.

        The counter makes versions sort as strings; the suffix keeps apart the values two
        branches of a thread give a channel at the same count (a graph continued from an
        older checkpoint, as after a rollback), since a value is stored once per version.

        Args:
            current: The channel's current version (``None`` for a new channel).
            channel: Unused (kept by LangGraph for compatibility).

        Returns:
            The next version.
        """
        if current is None:
            number = 0
        elif isinstance(current, int):
            number = current
        else:
            number = int(str(current).split(".")[0])
        return f"{number + 1:016}.{random.getrandbits(32):08x}"


class _Writing:
    """A SQLAlchemy connection for writing (PostgreSQL; on SQLite, under the saver's lock)."""

    def __init__(self, saver: AgentsnapSaver) -> None:
        self._saver = saver
        self._connection: Connection | None = None

    def __enter__(self) -> Connection:
        connection = self._saver._connect()
        if self._saver._sqlite:
            self._saver._lock.acquire()
        self._connection = connection
        return connection

    def __exit__(self, *exc: object) -> None:
        try:
            assert self._connection is not None
            self._connection.close()
        finally:
            if self._saver._sqlite:
                self._saver._lock.release()


def _not_one_string(method: str, what: str, given: Sequence[str]) -> None:
    """Refuse one string where a sequence of strings is expected (it would be its letters)."""
    if isinstance(given, str):
        raise ConfigurationError(
            f"{method} takes a list of {what}, not one string: pass [{given!r}]"
        )


def _merged(
    path: str, packed: bytes, entries: Sequence[WriteEntry], task_path: str
) -> tuple[str, bytes]:
    """A task's stored row (path and packed writes) once ``entries`` are recorded after it."""
    return task_path or path, pack_writes(merge_writes(unpack_writes(packed), entries))


def _sqlite_pragmas(connection: Any, record: Any) -> None:
    cursor = connection.cursor()
    try:
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA busy_timeout=30000")
    finally:
        cursor.close()
