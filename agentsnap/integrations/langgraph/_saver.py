"""The LangGraph checkpoint saver on agentsnap's tables."""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import random
import threading
from collections.abc import AsyncIterator, Collection, Iterable, Iterator, Mapping, Sequence
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
    DeltaChannelHistory,
    PendingWrite,
    get_checkpoint_id,
    get_checkpoint_metadata,
    writes_sort_key,
)
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from agentsnap.exceptions import ConfigurationError
from agentsnap.integrations.langgraph._history import DeltaWalk, achunks, chunks
from agentsnap.integrations.langgraph._rows import (
    EMPTY,
    JSON,
    WriteEntry,
    checkpoint_config,
    inline,
    merge_writes,
    pack_writes,
    plain_json,
    unpack_writes,
)
from agentsnap.store.dialect import redacted_url
from agentsnap.store.graph import (
    AsyncGraphReader,
    CheckpointFilter,
    GraphCheckpointStore,
    GraphReader,
    Merge,
    StoredCheckpoint,
    StoredValue,
    TaskKey,
    TaskWrites,
)
from agentsnap.store.sql import DEFAULT_URL
from agentsnap.store.sql_graph import CarriedWrites, SqlGraphStore

__all__ = ["AgentsnapSaver"]


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
    checkpoint's own row instead, which costs less than a row of their own. A new value that
    a task of the parent checkpoint wrote, exactly as the checkpoint holds it (the usual
    case: a node wrote the channel), refers to that pending write, which the saver put
    earlier in the same process, rather than storing the value a second time. LangGraph
    puts a step's writes and the next checkpoint at once: a task's writes wait a few
    milliseconds for the next checkpoint, which stores them in its own transaction (one
    commit for both; ``put_writes`` returns once it is committed), and are stored by
    themselves when no checkpoint comes. A checkpoint that comes later refers to the
    writes already stored; on SQLite, whose writes take turns anyway, it also waits for
    the writes still being stored.

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

    The synchronous methods run on the calling thread. On PostgreSQL, ``aget_tuple``,
    ``alist``, ``aput`` and ``aput_writes`` run on an asyncio driver (psycopg's async
    connections, from a pool of their own, opened on first use; close it with
    [`aclose`][agentsnap.integrations.langgraph.AgentsnapSaver.aclose]); the other
    asynchronous methods, and all of them on SQLite, run the synchronous code in a worker
    thread, so they do not block the event loop.

    Args:
        url: Database URL, as for [`SqlStore`][agentsnap.store.sql.SqlStore]: the saver may
            share the database of agentsnap's runs or have its own.
        create: Create agentsnap's schema in an empty database on first use.
        allowed_msgpack_modules: Types, as ``(module, class)`` tuples, that may be rebuilt
            from msgpack besides LangGraph's safe types (messages, dates, UUIDs…). Values of
            other types are read back as plain data.
        echo: Log every SQL statement.

    Raises:
        ConfigurationError: [`SqlGraphStore`][agentsnap.store.sql_graph.SqlGraphStore], the
            saver's storage, refuses the URL (neither SQLite nor PostgreSQL, or an in-memory
            SQLite database, which each connection would see on its own).
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
        self._storage: GraphCheckpointStore = SqlGraphStore(url, create=create, echo=echo)
        # On PostgreSQL a checkpoint never waits for writes being stored by themselves
        # (that would put a second commit on the step's path).
        self._written = _Written(wait=self._native() is None)

    def __repr__(self) -> str:
        return f"AgentsnapSaver({redacted_url(self.url)!r})"

    def close(self) -> None:
        """Close the saver's database connections."""
        self._storage.close()

    async def aclose(self) -> None:
        """Close the saver's database connections, those of its asyncio methods included."""
        native = self._native()
        if native is None:
            await asyncio.to_thread(self.close)
        else:
            await native.aclose()

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
        with self._storage.reading() as reader:
            row = reader.checkpoint(*_named(config))
            if row is None:
                return None
            return self._tuple(reader, row)

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
        where = _list_where(config, filter, before, limit)
        with self._storage.reading() as reader:
            rows = self._listed(reader.checkpoints(where), filter, limit)
            found = [self._tuple(reader, row, metadata) for row, metadata in rows]
        yield from found

    def _listed(
        self, rows: Iterable[StoredCheckpoint], filter: dict[str, Any] | None, limit: int | None
    ) -> Iterator[tuple[StoredCheckpoint, Any]]:
        """The rows whose metadata has the filter's values, with it decoded: at most ``limit``."""
        count = 0
        for row in rows:
            if limit is not None and count >= limit:
                break
            metadata = self._load_metadata(row.meta_type, row.meta)
            if _filtered_out(metadata, filter):
                continue
            count += 1
            yield row, metadata

    def _tuple(
        self, reader: GraphReader, row: StoredCheckpoint, metadata: Any | None = None
    ) -> CheckpointTuple:
        thread_id, checkpoint_ns, checkpoint_id = row[:3]
        checkpoint, stored = self._stored_checkpoint(row)
        found = reader.values(thread_id, checkpoint_ns, stored)
        writes = reader.task_writes(thread_id, checkpoint_ns, checkpoint_id)
        return self._assemble(row, checkpoint, found, writes, metadata)

    async def _atuple(
        self, reader: AsyncGraphReader, row: StoredCheckpoint, metadata: Any | None = None
    ) -> CheckpointTuple:
        thread_id, checkpoint_ns, checkpoint_id = row[:3]
        checkpoint, stored = self._stored_checkpoint(row)
        found = await reader.values(thread_id, checkpoint_ns, stored)
        writes = await reader.task_writes(thread_id, checkpoint_ns, checkpoint_id)
        return self._assemble(row, checkpoint, found, writes, metadata)

    def get_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        """What LangGraph rebuilds the value of each ``DeltaChannel`` at a checkpoint from.

        For each channel, the walk goes up the checkpoint's ancestors, parent by parent (a
        branch's history is its own, not that of the branches beside it), to the nearest
        one that holds a value of the channel: a snapshot LangGraph stored, or a plain
        value from before the channel was a ``DeltaChannel``. That value is the ``seed``;
        the ``writes`` are the channel's writes at the ancestors walked, the seed's own
        included, oldest first, and within one checkpoint in LangGraph's
        ``writes_sort_key`` order. The checkpoint's own writes are pending, not history.
        A walk that reaches the thread's first checkpoint gives no seed (the channel
        starts empty). The ancestors are read with a recursive query, a few at a time,
        and the walk stops as soon as every channel has its seed.

        Args:
            config: The checkpoint (the namespace's newest without a ``checkpoint_id``).
            channels: The channels; none gives an empty mapping.

        Returns:
            Each channel's writes and seed; no writes and no seed for every channel of an
            unknown checkpoint.
        """
        if not channels:
            return {}
        thread_id, checkpoint_ns, checkpoint_id = _named(config)
        walk = DeltaWalk(channels, self._decoded_versions)
        with self._storage.reading() as reader:
            lineage = reader.lineage(thread_id, checkpoint_ns, checkpoint_id)
            next(lineage, None)  # the checkpoint itself
            for ancestors in chunks(lineage):
                walk.visit(reader.values_at(thread_id, checkpoint_ns, walk.wanted(ancestors)))
                if walk.done:
                    break
            writes = reader.writes_at(thread_id, checkpoint_ns, walk.walked())
        return walk.histories(writes, self._load_value)

    async def aget_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        """Asynchronous [`get_delta_channel_history`][agentsnap.integrations.langgraph.AgentsnapSaver.get_delta_channel_history]."""  # noqa: E501
        native = self._native()
        if native is None:
            return await asyncio.to_thread(
                lambda: self.get_delta_channel_history(config=config, channels=channels)
            )
        if not channels:
            return {}
        thread_id, checkpoint_ns, checkpoint_id = _named(config)
        walk = DeltaWalk(channels, self._decoded_versions)
        async with native.areading() as reader:
            lineage = reader.lineage(thread_id, checkpoint_ns, checkpoint_id)
            await anext(lineage, None)  # the checkpoint itself
            async for ancestors in achunks(lineage):
                found = await reader.values_at(thread_id, checkpoint_ns, walk.wanted(ancestors))
                walk.visit(found)
                if walk.done:
                    break
            writes = await reader.writes_at(thread_id, checkpoint_ns, walk.walked())
        return walk.histories(writes, self._load_value)

    def _decoded_versions(self, row: StoredCheckpoint) -> tuple[dict[str, Any], dict[str, str]]:
        """A stored checkpoint's values kept in its row, and the versions of the others."""
        checkpoint, stored = self._stored_checkpoint(row)
        return checkpoint.get("channel_values") or {}, stored

    def _stored_checkpoint(self, row: StoredCheckpoint) -> tuple[Any, dict[str, str]]:
        """A stored checkpoint, decoded, and the versions of its values stored as rows."""
        checkpoint = self.serde.loads_typed((row.checkpoint_type, row.checkpoint))
        inline: dict[str, Any] = checkpoint.get("channel_values") or {}
        versions = checkpoint["channel_versions"]
        stored = {channel: str(versions[channel]) for channel in versions if channel not in inline}
        return checkpoint, stored

    def _assemble(
        self,
        row: StoredCheckpoint,
        checkpoint: Any,
        values: Iterable[tuple[str, str, bytes]],
        writes: Iterable[TaskWrites],
        metadata: Any | None,
    ) -> CheckpointTuple:
        thread_id, checkpoint_ns, checkpoint_id = row[:3]
        if metadata is None:
            metadata = self._load_metadata(row.meta_type, row.meta)
        loads_typed = self.serde.loads_typed
        checkpoint["channel_values"] = {
            **(checkpoint.get("channel_values") or {}),
            **{channel: loads_typed((value_type, value)) for channel, value_type, value in values},
        }
        parent = row.parent_checkpoint_id
        return CheckpointTuple(
            config=checkpoint_config(thread_id, checkpoint_ns, checkpoint_id),
            checkpoint=checkpoint,
            metadata=cast(CheckpointMetadata, metadata),
            parent_config=checkpoint_config(thread_id, checkpoint_ns, parent) if parent else None,
            pending_writes=self._load_writes(writes),
        )

    def _load_writes(self, rows: Iterable[TaskWrites]) -> builtins.list[PendingWrite]:
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
        # Everything is encoded before waiting for the parent's writes still being stored,
        # so that the encoding runs while they are.
        row, blobs = self._put_rows(config, checkpoint, metadata, new_versions)
        parent = _parent_of(config)
        storage = self._storage
        if not isinstance(storage, SqlGraphStore):
            written = self._written.take(parent, _value_channels(blobs))
            storage.put_checkpoint(row, _referring(blobs, written, row.parent_checkpoint_id))
        else:
            # The writes offered to this checkpoint go in its transaction; it waits (SQLite)
            # only for writes that are being stored by themselves.
            offers = self._written.claim(parent, None)
            written = self._written.take(parent, _value_channels(blobs))
            stored: builtins.list[bool] | None = None
            try:
                stored = storage.put_checkpoint_with_writes(
                    row,
                    _referring(blobs, written, row.parent_checkpoint_id, offers),
                    [offer.carried() for offer in offers],
                )
            finally:
                _Offer.settle(offers, stored)
        return checkpoint_config(row.thread_id, row.checkpoint_ns, row.checkpoint_id)

    def _put_rows(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> tuple[StoredCheckpoint, builtins.list[StoredValue]]:
        """A checkpoint's row and the rows of its new values, each value in its row."""
        configurable = config["configurable"]
        thread_id: str = configurable["thread_id"]
        checkpoint_ns: str = configurable.get("checkpoint_ns", "")
        values = checkpoint["channel_values"]
        # Small scalars ride in the checkpoint row (cheaper than a row of their own each);
        # every other value is stored once per version of its channel (``_referring`` then
        # makes a value that the parent's tasks wrote as it is refer to the stored write).
        small = {channel: value for channel, value in values.items() if inline(value)}
        stored: dict[str, Any] = {**checkpoint, "channel_values": small}
        dumps_typed = self.serde.dumps_typed
        blobs: builtins.list[StoredValue] = []
        for channel, version in new_versions.items():
            if channel in small:
                continue
            if channel not in values:
                blobs.append(
                    StoredValue(thread_id, checkpoint_ns, channel, str(version), EMPTY, None)
                )
                continue
            blobs.append(
                StoredValue(
                    thread_id, checkpoint_ns, channel, str(version), *dumps_typed(values[channel])
                )
            )
        checkpoint_type, encoded = dumps_typed(stored)
        full_metadata = get_checkpoint_metadata(config, metadata)
        meta_type, meta = self._dump_metadata(full_metadata)
        run_id = full_metadata.get("run_id")
        row = StoredCheckpoint(
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
        return row, blobs

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
        args, entries = self._writes_args(config, writes, task_id, task_path)
        if isinstance(self._storage, SqlGraphStore):
            # Offered to the next checkpoint's transaction first (one commit for both).
            offer = _Offer(args, entries, _Signal(), None)
            self._written.offer(offer)
            done = offer.done
            assert isinstance(done, _Signal)
            if not done.wait(_LINGER) and self._written.withdraw(offer):
                self._store_writes(args, entries)
                return
            done.wait()
            if not offer.stored:  # the checkpoint failed, or the task had writes already
                self._store_writes(args, entries)
            return
        self._store_writes(args, entries)

    def _store_writes(self, args: _WritesArgs, entries: builtins.list[WriteEntry]) -> None:
        """Store a task's writes, noting them for the checkpoint that follows."""
        pending = threading.Event()
        self._written.begin(args[0], pending, entries)
        stored = False
        try:
            stored = self._storage.put_task_writes(*args)
        finally:
            self._written.end(args[0], pending, entries if stored else ())

    def _writes_args(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str,
    ) -> tuple[_WritesArgs, builtins.list[WriteEntry]]:
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
        return (
            key,
            task_path,
            pack_writes(entries),
            lambda path, stored: _merged(path, stored, entries, task_path),
        ), entries

    def delete_thread(self, thread_id: str) -> None:
        """Delete every checkpoint, value and write of a thread.

        Args:
            thread_id: The thread.
        """
        self._storage.delete_thread(thread_id)
        self._written.forget([thread_id])

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
        self._storage.copy_thread(source_thread_id, target_thread_id)

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
        self._storage.delete_for_runs(list(run_ids), self._load_value)
        self._written.forget(None)

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
        _not_one_string("prune", "thread ids", thread_ids)
        self._storage.prune(list(thread_ids), strategy, self._load_value, self._load_metadata)
        self._written.forget(thread_ids)

    # Asynchronous versions: on PostgreSQL, on the asyncio driver; otherwise the same code
    # in a worker thread.

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """Asynchronous [`get_tuple`][agentsnap.integrations.langgraph.AgentsnapSaver.get_tuple]."""
        native = self._native()
        if native is None:
            return await asyncio.to_thread(self.get_tuple, config)
        async with native.areading() as reader:
            row = await reader.checkpoint(*_named(config))
            return None if row is None else await self._atuple(reader, row)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """Asynchronous [`list`][agentsnap.integrations.langgraph.AgentsnapSaver.list]."""
        native = self._native()
        if native is None:
            found = await asyncio.to_thread(
                lambda: [*self.list(config, filter=filter, before=before, limit=limit)]
            )
            for item in found:
                yield item
            return
        where = _list_where(config, filter, before, limit)
        tuples: builtins.list[CheckpointTuple] = []
        async with native.areading() as reader:
            for row, metadata in self._listed(await reader.checkpoints(where), filter, limit):
                tuples.append(await self._atuple(reader, row, metadata))
        for item in tuples:
            yield item

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Asynchronous [`put`][agentsnap.integrations.langgraph.AgentsnapSaver.put]."""
        native = self._native()
        if native is None:
            return await asyncio.to_thread(self.put, config, checkpoint, metadata, new_versions)
        row, blobs = self._put_rows(config, checkpoint, metadata, new_versions)
        parent = _parent_of(config)
        offers = self._written.claim(parent, asyncio.get_running_loop())
        written = await self._written.atake(parent, _value_channels(blobs))
        stored: builtins.list[bool] | None = None
        try:
            stored = await native.aput_checkpoint(
                row,
                _referring(blobs, written, row.parent_checkpoint_id, offers),
                [offer.carried() for offer in offers],
            )
        finally:
            _Offer.settle(offers, stored)
        return checkpoint_config(row.thread_id, row.checkpoint_ns, row.checkpoint_id)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Asynchronous [`put_writes`][agentsnap.integrations.langgraph.AgentsnapSaver.put_writes]."""  # noqa: E501
        native = self._native()
        if native is None:
            await asyncio.to_thread(self.put_writes, config, writes, task_id, task_path)
        elif writes:
            args, entries = self._writes_args(config, writes, task_id, task_path)
            # Offered to the next checkpoint's transaction first (one commit for both).
            loop = asyncio.get_running_loop()
            offer = _Offer(args, entries, asyncio.Event(), loop)
            self._written.offer(offer)
            done = offer.done
            assert isinstance(done, asyncio.Event)
            try:
                await asyncio.wait_for(done.wait(), _LINGER)
            except TimeoutError:
                if self._written.withdraw(offer):
                    await self._astore_writes(native, args, entries)
                    return
                await done.wait()
            except asyncio.CancelledError:
                self._written.withdraw(offer)  # unless a checkpoint is storing them already
                raise
            if not offer.stored:  # the checkpoint failed, or the task had writes already
                await self._astore_writes(native, args, entries)

    async def _astore_writes(
        self, native: SqlGraphStore, args: _WritesArgs, entries: builtins.list[WriteEntry]
    ) -> None:
        """``_store_writes`` on the asyncio driver."""
        pending = (asyncio.get_running_loop(), asyncio.Event())
        self._written.begin(args[0], pending, entries)
        stored = False
        try:
            stored = await native.aput_task_writes(*args)
        finally:
            self._written.end(args[0], pending, entries if stored else ())

    def _native(self) -> SqlGraphStore | None:
        """The storage when it has native asyncio methods (PostgreSQL), else ``None``."""
        storage = self._storage
        if isinstance(storage, SqlGraphStore) and storage.native_async:
            return storage
        return None

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


class _Written:
    """The regular writes stored lately, by the checkpoint they were written against.

    A task's writes are noted once their row is committed, and taken when the checkpoint
    that follows is put, so that a value equal to one of them refers to it. LangGraph puts
    a step's writes and the next checkpoint from its background threads (or tasks) at the
    same time: with ``wait``, taking the writes of a checkpoint first waits for those still
    being stored to the channels it stores values of (on the caller's kind of concurrency:
    threads, or the running event loop's tasks); on SQLite, whose writes take turns anyway,
    that costs no commit. At most ``keep`` checkpoints' writes are kept (the oldest go
    first), for the graphs that never put a checkpoint after them.
    """

    def __init__(self, *, wait: bool, keep: int = 256) -> None:
        self._wait = wait
        self._keep = keep
        self._lock = threading.Lock()
        self._by_checkpoint: dict[tuple[str, str, str], dict[str, builtins.list[_Write]]] = {}
        self._pending: dict[
            tuple[str, str, str], builtins.list[tuple[_Pending, frozenset[str]]]
        ] = {}
        self._offers: dict[tuple[str, str, str], builtins.list[_Offer]] = {}

    def begin(self, key: TaskKey, pending: _Pending, entries: Iterable[WriteEntry]) -> None:
        """Note that a task's writes (``entries``) are being stored under ``key``."""
        channels = frozenset(entry[1] for entry in entries if entry[0] >= 0)
        with self._lock:
            self._pending.setdefault(key[:3], []).append((pending, channels))

    def end(self, key: TaskKey, pending: _Pending, stored: Iterable[WriteEntry]) -> None:
        """Note that a task's writes are stored (``stored``: the entries stored as given)."""
        checkpoint = key[:3]
        # A special channel's write (negative index) may be replaced later: never referred to.
        entries = [entry for entry in stored if entry[0] >= 0]
        with self._lock:
            waiting = self._pending.get(checkpoint, [])
            waiting[:] = [found for found in waiting if found[0] is not pending]
            if not waiting:
                self._pending.pop(checkpoint, None)
            if entries:
                found = self._by_checkpoint.setdefault(checkpoint, {})
                for idx, channel, value_type, value in entries:
                    found.setdefault(channel, []).append((key[3], idx, value_type, value))
                while len(self._by_checkpoint) > self._keep:
                    del self._by_checkpoint[next(iter(self._by_checkpoint))]
        if isinstance(pending, threading.Event):
            pending.set()
        else:
            pending[1].set()

    def offer(self, offer: _Offer) -> None:
        """Offer a task's writes to the transaction of the checkpoint that follows."""
        with self._lock:
            self._offers.setdefault(offer.args[0][:3], []).append(offer)

    def withdraw(self, offer: _Offer) -> bool:
        """Take an offer back, unless a checkpoint claimed it already."""
        with self._lock:
            if offer.claimed:
                return False
            offers = self._offers.get(offer.args[0][:3], [])
            offers[:] = [found for found in offers if found is not offer]
            if not offers:
                self._offers.pop(offer.args[0][:3], None)
            return True

    def claim(
        self, checkpoint: tuple[str, str, str], loop: asyncio.AbstractEventLoop | None
    ) -> builtins.list[_Offer]:
        """The writes offered against ``checkpoint``, claimed: the caller stores them.

        Only those offered by the caller's kind of concurrency: threads for ``None``, else
        the loop's tasks.
        """
        with self._lock:
            offers = self._offers.get(checkpoint)
            if not offers:
                return []
            claimed = [offer for offer in offers if offer.loop is loop]
            offers[:] = [offer for offer in offers if offer.loop is not loop]
            if not offers:
                del self._offers[checkpoint]
            for offer in claimed:
                offer.claimed = True
            return claimed

    def forget(self, thread_ids: Iterable[str] | None) -> None:
        """Forget the writes noted on these threads (all of them for ``None``): deleted."""
        with self._lock:
            if thread_ids is None:
                self._by_checkpoint.clear()
                return
            threads = set(thread_ids)
            for key in [key for key in self._by_checkpoint if key[0] in threads]:
                del self._by_checkpoint[key]

    def _waiting(
        self, checkpoint: tuple[str, str, str], channels: Collection[str]
    ) -> builtins.list[_Pending]:
        """The writes being stored against ``checkpoint`` to some of ``channels``."""
        if not self._wait or not channels:
            return []
        with self._lock:
            return [
                pending
                for pending, written in self._pending.get(checkpoint, ())
                if not written.isdisjoint(channels)
            ]

    def take(
        self, checkpoint: tuple[str, str, str], channels: Collection[str]
    ) -> dict[str, builtins.list[_Write]]:
        """The writes stored against a checkpoint, by channel, forgotten here.

        With ``wait``, waits (a while at most) for the writes to ``channels`` that other
        threads are storing.
        """
        waiting = [p for p in self._waiting(checkpoint, channels) if isinstance(p, threading.Event)]
        for pending in waiting:
            pending.wait(_WAIT_FOR_WRITES)
        with self._lock:
            return self._by_checkpoint.pop(checkpoint, {})

    async def atake(
        self, checkpoint: tuple[str, str, str], channels: Collection[str]
    ) -> dict[str, builtins.list[_Write]]:
        """``take``, waiting for the writes that the running loop's tasks are storing."""
        loop = asyncio.get_running_loop()
        waiting = [
            p[1]
            for p in self._waiting(checkpoint, channels)
            if not isinstance(p, threading.Event) and p[0] is loop
        ]
        for pending in waiting:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(pending.wait(), _WAIT_FOR_WRITES)
        with self._lock:
            return self._by_checkpoint.pop(checkpoint, {})


class _Offer:
    """A task's writes offered to the transaction of the checkpoint that follows.

    ``put_writes`` offers them and waits ``_LINGER`` at most for a checkpoint put against
    the same checkpoint (by the same kind of concurrency) to claim them: that checkpoint then
    stores them in its own transaction, which is one commit for both, and its values refer
    to them instead of holding copies. Unclaimed, the offer is withdrawn and ``put_writes``
    stores the writes itself. Claimed, ``put_writes`` returns once the checkpoint's
    transaction has committed (``stored``), or stores the writes itself when it failed or
    when the task had writes stored already, which are then merged as always.
    """

    def __init__(
        self,
        args: _WritesArgs,
        entries: Iterable[WriteEntry],
        done: _Signal | asyncio.Event,
        loop: asyncio.AbstractEventLoop | None,
    ) -> None:
        self.args = args
        self.regular = [entry for entry in entries if entry[0] >= 0]
        """The regular writes (index 0 and up), which a value may refer to."""
        self.done = done
        self.loop = loop
        self.claimed = False
        self.stored = False
        """Whether the claiming checkpoint's transaction stored the writes as given."""

    def carried(self) -> CarriedWrites:
        """The writes as a checkpoint's transaction carries them."""
        key, task_path, packed, _ = self.args
        return key, task_path, packed

    @staticmethod
    def settle(offers: Sequence[_Offer], stored: Sequence[bool] | None) -> None:
        """Tell the ``put_writes`` calls waiting on ``offers`` how their writes fared."""
        for index, offer in enumerate(offers):
            offer.stored = stored is not None and stored[index]
            offer.done.set()  # an asyncio offer is claimed on its own loop only


class _Signal:
    """A one-shot signal between threads, as ``threading.Event`` without its Python code.

    A lock held from the start and released once set: one C call each way.
    """

    __slots__ = ("_lock", "_set")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()
        self._set = False

    def set(self) -> None:
        """Wake the threads waiting, and those that will (once only; later calls do nothing)."""
        if not self._set:
            self._set = True
            self._lock.release()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the signal, ``timeout`` seconds at most; whether it was set."""
        if not self._lock.acquire(timeout=-1 if timeout is None else timeout):
            return False
        self._lock.release()  # for the other waiters
        return True


_WritesArgs = tuple[TaskKey, str, bytes, Merge]
"""A task's writes as the storage takes them: key, task path, packed writes, merge."""

_LINGER = 0.005
"""Seconds a task's writes wait for the next checkpoint to carry them."""

_Write = tuple[str, int, str, bytes]
"""A write noted by ``_Written``: task id, index, type tag and value."""

_Pending = threading.Event | tuple[asyncio.AbstractEventLoop, asyncio.Event]
"""Writes being stored: by a thread, or by a task of an event loop."""

_WAIT_FOR_WRITES = 10.0
"""Seconds a checkpoint waits for its parent's writes; after that its values are copies."""


def _value_channels(blobs: Iterable[StoredValue]) -> builtins.list[str]:
    """The channels whose new value a checkpoint stores in a row (not inline, not empty)."""
    return [blob.channel for blob in blobs if blob.value is not None]


def _referring(
    blobs: builtins.list[StoredValue],
    written: dict[str, builtins.list[_Write]],
    parent_id: str | None,
    offers: Sequence[_Offer] = (),
) -> builtins.list[StoredValue]:
    """``blobs``, a value that a write of the parent holds as it is referring to the write.

    As it is: the same type tag and the same bytes. A value that refers to a write that
    the checkpoint's transaction carries (``offers``) keeps its bytes too, for the storage
    to store them when the task's row turns out to hold other writes.
    """
    if not parent_id or not (written or offers):
        return blobs
    carried: dict[str, builtins.list[_Write]] = {}
    for offer in offers:
        task_id = offer.args[0][3]
        for idx, channel, value_type, value in offer.regular:
            carried.setdefault(channel, []).append((task_id, idx, value_type, value))
    found: builtins.list[StoredValue] = []
    for blob in blobs:
        if blob.value is None:
            found.append(blob)
            continue
        for candidates, keep in ((written, False), (carried, True)):
            same = next(
                (
                    (task_id, idx)
                    for task_id, idx, written_type, value in candidates.get(blob.channel, ())
                    if written_type == blob.value_type and value == blob.value
                ),
                None,
            )
            if same is not None:
                blob = blob._replace(  # noqa: PLW2901
                    value=blob.value if keep else None,
                    write_checkpoint_id=parent_id,
                    write_task_id=same[0],
                    write_idx=same[1],
                )
                break
        found.append(blob)
    return found


def _parent_of(config: RunnableConfig) -> tuple[str, str, str]:
    """The thread, namespace and id of the checkpoint a new one follows (``""`` for none)."""
    configurable = config["configurable"]
    return (
        configurable["thread_id"],
        configurable.get("checkpoint_ns", ""),
        configurable.get("checkpoint_id") or "",
    )


def _named(config: RunnableConfig) -> tuple[str, str, str | None]:
    """The thread, namespace and checkpoint id ``config`` names (``None``: the newest)."""
    configurable = config["configurable"]
    return (
        configurable["thread_id"],
        configurable.get("checkpoint_ns", ""),
        get_checkpoint_id(config) or None,
    )


def _list_where(
    config: RunnableConfig | None,
    filter: dict[str, Any] | None,
    before: RunnableConfig | None,
    limit: int | None,
) -> CheckpointFilter:
    """The storage's filter for ``list``'s arguments (the metadata filter is applied after)."""
    thread_id = checkpoint_ns = checkpoint_id = None
    if config is not None:
        configurable = config["configurable"]
        thread_id = configurable["thread_id"]
        checkpoint_ns = configurable.get("checkpoint_ns")
        checkpoint_id = get_checkpoint_id(config)
    return CheckpointFilter(
        thread_id,
        checkpoint_ns,
        checkpoint_id,
        before=None if before is None else get_checkpoint_id(before),
        limit=None if filter else limit,
    )


def _filtered_out(metadata: Any, filter: dict[str, Any] | None) -> bool:
    """Whether metadata lacks one of the filter's values."""
    return bool(filter) and not all(
        key in metadata and metadata[key] == value for key, value in (filter or {}).items()
    )


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
