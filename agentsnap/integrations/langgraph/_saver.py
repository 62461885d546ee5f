"""The LangGraph checkpoint saver on agentsnap's tables."""

from __future__ import annotations

import asyncio
import builtins
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any, cast

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
from sqlalchemy import Connection, Engine, Table, create_engine, delete, event, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import make_url

from agentsnap.exceptions import ConfigurationError
from agentsnap.store.migrate import ensure_schema, sync_url
from agentsnap.store.sql import DEFAULT_URL
from agentsnap.store.tables import LangGraphBlobRow, LangGraphCheckpointRow, LangGraphWriteRow

__all__ = ["AgentsnapSaver"]

_checkpoints: Table = LangGraphCheckpointRow.__table__  # type: ignore[assignment]
_blobs: Table = LangGraphBlobRow.__table__  # type: ignore[assignment]
_writes: Table = LangGraphWriteRow.__table__  # type: ignore[assignment]

_EMPTY = "empty"
"""The type tag of a blob for a channel that had no value at that version."""


class AgentsnapSaver(BaseCheckpointSaver[str]):
    """A LangGraph checkpoint saver on agentsnap's database (SQLite or PostgreSQL).

    Pass it as a graph's ``checkpointer`` (``builder.compile(checkpointer=saver)``).

    The saver keeps three tables next to agentsnap's own, created by agentsnap's migrations:
    ``agentsnap_lg_checkpoints`` (a checkpoint without its channel values),
    ``agentsnap_lg_blobs`` (each channel value, once per version of its channel) and
    ``agentsnap_lg_writes`` (the pending writes of tasks). A checkpoint that leaves a channel
    unchanged refers to the value already stored for its version instead of storing it again.

    Values are encoded by LangGraph's ``JsonPlusSerializer`` in strict mode: JSON and msgpack
    only, with the pickle fallback off and msgpack extension types limited to LangGraph's
    safe types and the modules you allow (``allowed_msgpack_modules``). Reading the database
    never unpickles anything or imports a module that is not on that allowlist.

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

    def __repr__(self) -> str:
        return f"AgentsnapSaver({make_url(self.url).render_as_string(hide_password=True)!r})"

    def close(self) -> None:
        """Close the saver's database connections."""
        self._engine.dispose()

    async def aclose(self) -> None:
        """Close the saver's database connections (off the event loop)."""
        await asyncio.to_thread(self.close)

    def _connect(self) -> Connection:
        if not self._ready:
            with self._lock:
                if not self._ready:
                    ensure_schema(self.url, create=self._create)
                    self._ready = True
        return self._engine.connect()

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
                metadata = self.serde.loads_typed((row["meta_type"], row["meta"]))
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
            metadata = self.serde.loads_typed((row["meta_type"], row["meta"]))
        checkpoint["channel_values"] = self._load_values(
            connection, thread_id, checkpoint_ns, checkpoint["channel_versions"]
        )
        parent: str | None = row["parent_checkpoint_id"]
        return CheckpointTuple(
            config=_config(thread_id, checkpoint_ns, checkpoint_id),
            checkpoint=checkpoint,
            metadata=cast(CheckpointMetadata, metadata),
            parent_config=_config(thread_id, checkpoint_ns, parent) if parent else None,
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
        rows = connection.execute(
            select(_blobs.c.channel, _blobs.c.version, _blobs.c.value_type, _blobs.c.value).where(
                _blobs.c.thread_id == thread_id,
                _blobs.c.checkpoint_ns == checkpoint_ns,
                _blobs.c.channel.in_(list(versions)),
            )
        )
        values: dict[str, Any] = {}
        for channel, version, value_type, value in rows:
            if (channel, version) in wanted and value_type != _EMPTY:
                values[channel] = self.serde.loads_typed((value_type, value))
        return values

    def _load_writes(
        self, connection: Connection, thread_id: str, checkpoint_ns: str, checkpoint_id: str
    ) -> builtins.list[PendingWrite]:
        found = connection.execute(
            select(
                _writes.c.task_id,
                _writes.c.idx,
                _writes.c.channel,
                _writes.c.value_type,
                _writes.c.value,
                _writes.c.task_path,
            ).where(
                _writes.c.thread_id == thread_id,
                _writes.c.checkpoint_ns == checkpoint_ns,
                _writes.c.checkpoint_id == checkpoint_id,
            )
        ).all()
        rows = sorted(found, key=lambda r: writes_sort_key(r.task_path, r.task_id, r.idx))
        return [
            (r.task_id, r.channel, self.serde.loads_typed((r.value_type, r.value))) for r in rows
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
        stored: dict[str, Any] = {
            key: value for key, value in checkpoint.items() if key != "channel_values"
        }
        values = checkpoint["channel_values"]
        blobs: list[dict[str, Any]] = []
        for channel, version in new_versions.items():
            if channel in values:
                value_type, value = self.serde.dumps_typed(values[channel])
            else:
                value_type, value = _EMPTY, None
            blobs.append(
                {
                    "thread_id": thread_id,
                    "checkpoint_ns": checkpoint_ns,
                    "channel": channel,
                    "version": str(version),
                    "value_type": value_type,
                    "value": value,
                }
            )
        checkpoint_type, encoded = self.serde.dumps_typed(stored)
        meta_type, meta = self.serde.dumps_typed(get_checkpoint_metadata(config, metadata))
        row = {
            "thread_id": thread_id,
            "checkpoint_ns": checkpoint_ns,
            "checkpoint_id": checkpoint["id"],
            "parent_checkpoint_id": configurable.get("checkpoint_id"),
            "checkpoint_type": checkpoint_type,
            "checkpoint": encoded,
            "meta_type": meta_type,
            "meta": meta,
        }
        upsert = self._dialect.insert(_checkpoints)
        upsert = upsert.on_conflict_do_update(
            index_elements=["thread_id", "checkpoint_ns", "checkpoint_id"],
            set_={
                name: upsert.excluded[name]
                for name in (
                    "parent_checkpoint_id",
                    "checkpoint_type",
                    "checkpoint",
                    "meta_type",
                    "meta",
                )
            },
        )
        with self._writing() as connection:
            if blobs:
                connection.execute(
                    self._dialect.insert(_blobs).on_conflict_do_nothing(
                        index_elements=["thread_id", "checkpoint_ns", "channel", "version"]
                    ),
                    blobs,
                )
            connection.execute(upsert, [row])
            connection.commit()
        return _config(thread_id, checkpoint_ns, checkpoint["id"])

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

        Args:
            config: The thread, namespace and checkpoint.
            writes: ``(channel, value)`` pairs.
            task_id: The task that made the writes.
            task_path: The task's path in the graph.
        """
        if not writes:
            return
        configurable = config["configurable"]
        rows = []
        for idx, (channel, value) in enumerate(writes):
            value_type, encoded = self.serde.dumps_typed(value)
            rows.append(
                {
                    "thread_id": configurable["thread_id"],
                    "checkpoint_ns": configurable.get("checkpoint_ns", ""),
                    "checkpoint_id": configurable["checkpoint_id"],
                    "task_id": task_id,
                    "idx": WRITES_IDX_MAP.get(channel, idx),
                    "channel": channel,
                    "value_type": value_type,
                    "value": encoded,
                    "task_path": task_path,
                }
            )
        keys = ["thread_id", "checkpoint_ns", "checkpoint_id", "task_id", "idx"]
        insert = self._dialect.insert(_writes)
        replace = insert.on_conflict_do_update(
            index_elements=keys,
            set_={
                name: insert.excluded[name]
                for name in ("channel", "value_type", "value", "task_path")
            },
        )
        keep = insert.on_conflict_do_nothing(index_elements=keys)
        special = [row for row in rows if row["channel"] in WRITES_IDX_MAP]
        regular = [row for row in rows if row["channel"] not in WRITES_IDX_MAP]
        with self._writing() as connection:
            if special:
                connection.execute(replace, special)
            if regular:
                connection.execute(keep, regular)
            connection.commit()

    def delete_thread(self, thread_id: str) -> None:
        """Delete every checkpoint, value and write of a thread.

        Args:
            thread_id: The thread.
        """
        with self._writing() as connection:
            for table in (_writes, _blobs, _checkpoints):
                connection.execute(delete(table).where(table.c.thread_id == thread_id))
            connection.commit()

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

    def get_next_version(self, current: str | int | None, channel: None) -> str:
        """The version after ``current``: a zero-padded counter, so versions sort as strings.

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
        return f"{number + 1:032}"


class _Writing:
    """A connection for writing; on SQLite, writers take turns on the saver's lock."""

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


def _config(thread_id: str, checkpoint_ns: str, checkpoint_id: str) -> RunnableConfig:
    return {
        "configurable": {
            "thread_id": thread_id,
            "checkpoint_ns": checkpoint_ns,
            "checkpoint_id": checkpoint_id,
        }
    }


def _sqlite_pragmas(connection: Any, record: Any) -> None:
    cursor = connection.cursor()
    try:
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA busy_timeout=30000")
    finally:
        cursor.close()
