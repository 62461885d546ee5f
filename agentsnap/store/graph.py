"""LangGraph checkpoint storage: the rows of graph checkpoints, and the protocols over them.

Two optional protocols, apart from the core [`Store`][agentsnap.store.Store]:

- [`GraphCheckpointStore`][agentsnap.store.graph.GraphCheckpointStore] keeps a LangGraph
  checkpointer's rows: checkpoints, channel values and task writes, already encoded (this
  layer never decodes a value, except through functions its caller hands it).
  [`SqlGraphStore`][agentsnap.store.sql_graph.SqlGraphStore] implements it on agentsnap's
  database, and [`AgentsnapSaver`][agentsnap.integrations.langgraph.AgentsnapSaver] is
  LangGraph's ``BaseCheckpointSaver`` over it.
- [`GraphCheckpointIndex`][agentsnap.store.graph.GraphCheckpointIndex] lists the graph
  checkpoints of agentsnap runs; [`SqlStore`][agentsnap.store.sql.SqlStore] and
  [`MemoryStore`][agentsnap.store.MemoryStore] implement it, and
  [`agentsnap.inspect`][agentsnap.inspect] uses it when a store does.

The tables are ``agentsnap_lg_checkpoints`` (a checkpoint without its channel values),
``agentsnap_lg_blobs`` (each channel value, once per version of its channel) and
``agentsnap_lg_task_writes`` (the pending writes of a task, one row per task and checkpoint),
created by agentsnap's migrations.

A channel value that a task wrote (the usual case: a node wrote the channel, and the next
checkpoint holds the value) is stored once: its row in ``agentsnap_lg_blobs`` refers to the
write, kept in ``agentsnap_lg_task_writes`` against the checkpoint the task ran from, instead
of holding a second copy (see [`StoredValue`][agentsnap.store.graph.StoredValue]). Reads give
the written value back as the channel's; before a write that a value refers to is deleted
(pruning, deleting runs' checkpoints), the value is copied into its own row.

Example:
    ```python
    import tempfile

    from agentsnap.store.sql_graph import SqlGraphStore

    with tempfile.TemporaryDirectory() as folder:
        graphs = SqlGraphStore(f"sqlite:///{folder}/agentsnap.db")
        try:
            with graphs.reading() as reader:
                print(reader.checkpoint("thread-1", "", None))  # None: nothing saved
        finally:
            graphs.close()
    ```
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Collection, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, runtime_checkable

from agentsnap.exceptions import ConfigurationError, StoreError
from agentsnap.records import GraphCheckpoint

__all__ = [
    "EMPTY",
    "PRUNE_STRATEGIES",
    "AsyncGraphReader",
    "CheckpointFilter",
    "GraphCheckpointIndex",
    "GraphCheckpointStore",
    "GraphReader",
    "Load",
    "Merge",
    "StoredCheckpoint",
    "StoredValue",
    "TaskKey",
    "TaskWrites",
    "WriteEntry",
    "pack_writes",
    "unpack_writes",
    "written_value",
]

EMPTY = "empty"
"""The type tag of a stored channel value for a channel that had no value at that version."""

PRUNE_STRATEGIES = ("keep_latest", "delete")
"""The strategies ``prune`` knows."""

Load = Callable[[str, bytes], Any]
"""Decodes a value the checkpointer stored, given its type tag and bytes."""


class StoredCheckpoint(NamedTuple):
    """A row of ``agentsnap_lg_checkpoints``: a checkpoint, encoded, without stored values."""

    thread_id: str
    """The thread."""
    checkpoint_ns: str
    """The namespace (``""`` for the root graph)."""
    checkpoint_id: str
    """The checkpoint's id (LangGraph's, time-ordered)."""
    parent_checkpoint_id: str | None
    """The checkpoint it follows, if any."""
    checkpoint_type: str
    """The serializer's type tag of ``checkpoint``."""
    checkpoint: bytes
    """The checkpoint as the serializer encoded it."""
    meta_type: str
    """The type tag of ``meta`` (``"json"`` for plain JSON)."""
    meta: bytes
    """The metadata, encoded."""
    run_id: str | None
    """The LangGraph run that wrote it (the metadata's ``run_id``), if a string."""


class StoredValue(NamedTuple):
    """A row of ``agentsnap_lg_blobs``: a channel's value at one version, encoded.

    A value that a task wrote may be stored as a reference to that write instead: ``value``
    is then ``None`` and ``write_checkpoint_id``, ``write_task_id`` and ``write_idx`` name the
    entry of a row of ``agentsnap_lg_task_writes`` of the same thread and namespace whose
    value (with the same ``value_type``) is the channel's. Only a regular write (``idx`` 0 and
    up) is referred to: it keeps the value it was first recorded with. A value given with
    its bytes and a reference (to writes stored in the same transaction, see
    ``SqlGraphStore.put_checkpoint_with_writes``) refers to the write if the task's row holds
    the writes as stored there, and is stored in its own row otherwise.
    """

    thread_id: str
    """The thread."""
    checkpoint_ns: str
    """The namespace."""
    channel: str
    """The channel."""
    version: str
    """The channel's version."""
    value_type: str
    """The serializer's type tag (``EMPTY`` when the channel had no value)."""
    value: bytes | None
    """The value, encoded (``None`` when empty, or when it refers to a write)."""
    write_checkpoint_id: str | None = None
    """The checkpoint whose task wrote the value, when the value refers to the write."""
    write_task_id: str | None = None
    """The task that wrote it."""
    write_idx: int | None = None
    """The write's index among the task's writes."""


class TaskWrites(NamedTuple):
    """A row of ``agentsnap_lg_task_writes``: a task's pending writes, packed as one value."""

    task_id: str
    """The task."""
    task_path: str
    """The task's path in the graph."""
    writes: bytes
    """The writes, packed by the checkpointer."""


TaskKey = tuple[str, str, str, str]
"""The key of a task's writes: thread, namespace, checkpoint id and task id."""

Merge = Callable[[str, bytes], tuple[str, bytes]]
"""Given a task's stored path and packed writes, the path and writes to store instead."""

WriteEntry = tuple[int, str, str, bytes]
"""One pending write as stored: index, channel, and the value as the serializer typed it."""


def pack_writes(entries: Sequence[WriteEntry]) -> bytes:
    """A task's writes as one value: a msgpack array of ``[idx, channel, type, value]``."""
    packed: bytes = _msgpack().packb([list(entry) for entry in entries])
    return packed


def unpack_writes(data: bytes) -> list[WriteEntry]:
    """The writes [`pack_writes`][agentsnap.store.graph.pack_writes] packed.

    Plain msgpack (no extension types), so reading it never builds an object of any class.

    Raises:
        StoreError: The value is not a list of writes (the row was changed by something
            other than the saver).
    """
    try:
        items = _msgpack().unpackb(data)
        entries: list[WriteEntry] = []
        for idx, channel, value_type, value in items:
            if not (
                type(idx) is int
                and type(channel) is str
                and type(value_type) is str
                and type(value) is bytes
            ):
                raise TypeError(f"unexpected entry {[idx, channel, value_type]!r}")
            entries.append((idx, channel, value_type, value))
    except (TypeError, ValueError) as exc:  # msgpack's decode errors are ValueErrors
        raise StoreError(
            "a row of agentsnap_lg_task_writes does not hold a task's writes "
            f"({exc}); was it changed outside agentsnap? Delete the row or restore the database"
        ) from exc
    return entries


def written_value(writes: bytes, idx: int) -> bytes | None:
    """The encoded value of the write at ``idx`` in a task's packed writes, if there is one."""
    for entry in unpack_writes(writes):
        if entry[0] == idx:
            return entry[3]
    return None


def _msgpack() -> Any:
    # ormsgpack comes with LangGraph; only the saver's rows (written with LangGraph) need it.
    try:
        import ormsgpack  # noqa: PLC0415
    except ImportError as exc:  # pragma: no cover (installed with the langgraph extra)
        raise StoreError(
            "reading LangGraph's task writes needs ormsgpack: pip install 'agentsnap[langgraph]'"
        ) from exc
    return ormsgpack


@dataclass(frozen=True)
class CheckpointFilter:
    """Which checkpoints [`GraphReader.checkpoints`][agentsnap.store.graph.GraphReader.checkpoints] lists.

    A thread or namespace given as ``None`` is no filter; a checkpoint id or ``before``
    bound that is ``None`` or empty is none either (LangGraph passes ``""`` for "no
    checkpoint"); a negative limit lists nothing. Every store reads its checkpoints through
    one of these, so the rules hold the same in each.

    Raises:
        ConfigurationError: ``limit`` is not a whole number.
    """  # noqa: E501

    thread_id: str | None = None
    """Only this thread's."""
    checkpoint_ns: str | None = None
    """Only this namespace's."""
    checkpoint_id: str | None = None
    """Only the checkpoint with this id (``None`` once normalised when empty)."""
    before: str | None = None
    """Only checkpoints with a smaller id (``None`` once normalised when empty)."""
    limit: int | None = None
    """At most this many (never below 0)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "checkpoint_id", self.checkpoint_id or None)
        object.__setattr__(self, "before", self.before or None)
        if self.limit is not None:
            if isinstance(self.limit, bool) or not isinstance(self.limit, int):
                raise ConfigurationError(
                    f"a checkpoint limit is a whole number or None, not {self.limit!r}"
                )
            object.__setattr__(self, "limit", max(self.limit, 0))

    @classmethod
    def one(cls, thread_id: str, checkpoint_ns: str, checkpoint_id: str | None) -> CheckpointFilter:
        """The checkpoint with this id, or the namespace's newest one when ``None``."""
        return cls(thread_id, checkpoint_ns, checkpoint_id, limit=1)

    def equal(self) -> dict[str, str]:
        """The columns that must equal a value, by column name."""
        given = {
            "thread_id": self.thread_id,
            "checkpoint_ns": self.checkpoint_ns,
            "checkpoint_id": self.checkpoint_id,
        }
        return {column: value for column, value in given.items() if value is not None}

    def matches(self, row: StoredCheckpoint) -> bool:
        """Whether ``row`` passes every filter (the limit aside)."""
        if any(getattr(row, column) != value for column, value in self.equal().items()):
            return False
        return self.before is None or row.checkpoint_id < self.before

    def apply(self, rows: Collection[StoredCheckpoint]) -> list[StoredCheckpoint]:
        """The rows that pass, newest first, then by thread and namespace, up to the limit."""
        found = [row for row in rows if self.matches(row)]
        found.sort(key=lambda row: (row.thread_id, row.checkpoint_ns))
        found.sort(key=lambda row: row.checkpoint_id, reverse=True)
        return found if self.limit is None else found[: self.limit]


class GraphReader(Protocol):
    """Reads of graph checkpoints, all in one connection (see ``GraphCheckpointStore``).

    A store's reader may subclass it to inherit ``checkpoint``, read through ``checkpoints``.
    """

    def checkpoint(
        self, thread_id: str, checkpoint_ns: str, checkpoint_id: str | None
    ) -> StoredCheckpoint | None:
        """The checkpoint with this id, or the namespace's newest one when ``None``."""
        found = list(
            self.checkpoints(CheckpointFilter.one(thread_id, checkpoint_ns, checkpoint_id))
        )
        return found[0] if found else None

    def checkpoints(self, where: CheckpointFilter) -> Iterator[StoredCheckpoint]:
        """The checkpoints that pass ``where``, newest first."""

    def values(
        self, thread_id: str, checkpoint_ns: str, versions: Mapping[str, str]
    ) -> list[tuple[str, str, bytes]]:
        """The stored values of these channels at these versions (empty ones left out).

        A value stored as a reference to a task's write is read from the write.

        Returns:
            ``(channel, value_type, value)`` for each one found.
        """

    def task_writes(
        self, thread_id: str, checkpoint_ns: str, checkpoint_id: str
    ) -> list[TaskWrites]:
        """The pending writes of the tasks of a checkpoint, one entry per task."""

    def lineage(
        self, thread_id: str, checkpoint_ns: str, checkpoint_id: str | None
    ) -> Iterator[StoredCheckpoint]:
        """A checkpoint (the namespace's newest when ``None``), then its ancestors.

        Parent by parent, nearest first, read a page at a time as the caller goes on: a
        caller that stops early reads little of a long history. Ends at a checkpoint
        without a parent, at a parent not stored, or at a checkpoint already given (a
        checkpoint put again under a descendant makes a loop). Nothing for an unknown
        checkpoint.
        """

    def values_at(
        self, thread_id: str, checkpoint_ns: str, versions: Collection[tuple[str, str]]
    ) -> dict[tuple[str, str], tuple[str, bytes]]:
        """The stored values of these ``(channel, version)`` pairs (empty ones left out).

        Several versions of one channel may be asked for at once; a value stored as a
        reference to a task's write is read from the write.

        Returns:
            ``(value_type, value)`` by ``(channel, version)``, for each one found.
        """

    def writes_at(
        self, thread_id: str, checkpoint_ns: str, checkpoint_ids: Collection[str]
    ) -> dict[str, list[TaskWrites]]:
        """The pending writes of the tasks of these checkpoints, by checkpoint id.

        A checkpoint without writes is left out.
        """


class AsyncGraphReader(Protocol):
    """``GraphReader``'s reads on an asyncio driver, all in one connection.

    A store's reader may subclass it to inherit ``checkpoint``, read through ``checkpoints``.
    """

    async def checkpoint(
        self, thread_id: str, checkpoint_ns: str, checkpoint_id: str | None
    ) -> StoredCheckpoint | None:
        """The checkpoint with this id, or the namespace's newest one when ``None``."""
        found = await self.checkpoints(
            CheckpointFilter.one(thread_id, checkpoint_ns, checkpoint_id)
        )
        return found[0] if found else None

    async def checkpoints(self, where: CheckpointFilter) -> list[StoredCheckpoint]:
        """The checkpoints that pass ``where``, newest first."""

    async def values(
        self, thread_id: str, checkpoint_ns: str, versions: Mapping[str, str]
    ) -> list[tuple[str, str, bytes]]:
        """The stored values of these channels at these versions (empty ones left out)."""

    async def task_writes(
        self, thread_id: str, checkpoint_ns: str, checkpoint_id: str
    ) -> list[TaskWrites]:
        """The pending writes of the tasks of a checkpoint, one entry per task."""

    def lineage(
        self, thread_id: str, checkpoint_ns: str, checkpoint_id: str | None
    ) -> AsyncIterator[StoredCheckpoint]:
        """A checkpoint, then its ancestors, nearest first (see ``GraphReader.lineage``)."""

    async def values_at(
        self, thread_id: str, checkpoint_ns: str, versions: Collection[tuple[str, str]]
    ) -> dict[tuple[str, str], tuple[str, bytes]]:
        """The stored values of these ``(channel, version)`` pairs (empty ones left out)."""

    async def writes_at(
        self, thread_id: str, checkpoint_ns: str, checkpoint_ids: Collection[str]
    ) -> dict[str, list[TaskWrites]]:
        """The pending writes of the tasks of these checkpoints, by checkpoint id."""


class GraphCheckpointStore(Protocol):
    """Where a LangGraph checkpointer keeps its rows.

    Every method runs on the calling thread and blocks; each write is one transaction.
    """

    def reading(self) -> AbstractContextManager[GraphReader]:
        """A reader on one connection, for the block's duration."""

    def put_checkpoint(self, checkpoint: StoredCheckpoint, values: Sequence[StoredValue]) -> None:
        """Store a checkpoint (replacing one with its key) and new values (kept if present)."""

    def put_task_writes(self, key: TaskKey, task_path: str, writes: bytes, merge: Merge) -> bool:
        """Store a task's writes, or merge them into the ones stored for its key.

        Args:
            key: Thread, namespace, checkpoint id and task id.
            task_path: The task's path in the graph.
            writes: The task's writes, packed.
            merge: When the task has writes stored already, what to store instead.

        Returns:
            Whether ``writes`` went in as given (the task had none stored), so that a value
            stored later may refer to them.
        """

    def delete_thread(self, thread_id: str) -> None:
        """Delete every checkpoint, value and write of a thread."""

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every row of a thread onto another, in one transaction.

        Raises:
            StoreError: Concurrent writes aborted it each time it was tried.
        """

    def delete_for_runs(self, run_ids: Sequence[str], load: Load) -> None:
        """Delete the checkpoints of LangGraph runs, their writes and the values only they used.

        Args:
            run_ids: The LangGraph run ids.
            load: Decodes a stored checkpoint (to find which values remain in use).

        Raises:
            StoreError: Concurrent writes aborted it each time it was tried.
        """

    def prune(
        self, thread_ids: Sequence[str], strategy: str, load: Load, load_metadata: Load
    ) -> None:
        """Delete threads' history: all of it, or all but what each namespace's newest needs.

        Args:
            thread_ids: The threads.
            strategy: ``"keep_latest"`` or ``"delete"``.
            load: Decodes a stored checkpoint.
            load_metadata: Decodes stored metadata.

        Raises:
            StoreError: Concurrent writes aborted it each time it was tried.
        """

    def close(self) -> None:
        """Release connections."""


@runtime_checkable
class GraphCheckpointIndex(Protocol):
    """A store that can list the LangGraph checkpoints of its runs' graph agents."""

    async def list_graph_checkpoints(
        self, run_id: str, agent: str | None = None
    ) -> list[GraphCheckpoint]:
        """The LangGraph checkpoints the graph agents of a run (or only ``agent``) wrote.

        Oldest first (by checkpoint id, which LangGraph makes time-ordered), the root graph's
        checkpoints only (not a subgraph's), on every thread of the agent: its first thread
        and those started by rollbacks to before its first message. A store finds the
        checkpoints a graph agent's checkpointer put in the store's own database
        (``AgentsnapSaver`` on the same URL); a store that holds none returns ``[]``.

        Raises:
            NotFoundError: The store holds no such run.
        """
