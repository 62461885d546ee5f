"""LangGraph checkpoint storage in memory, for tests and short-lived programs.

[`MemoryGraphStore`][agentsnap.store.memory_graph.MemoryGraphStore] implements
[`GraphCheckpointStore`][agentsnap.store.graph.GraphCheckpointStore] with the semantics of
[`SqlGraphStore`][agentsnap.store.sql_graph.SqlGraphStore]: a channel value stored once per
version, a value that refers to a task's write read from the write (and copied into its own
entry before that write is deleted), and the same copying, pruning and deleting of threads.
Nothing outlives the process.

Example:
    ```python
    from agentsnap.store.graph import StoredCheckpoint
    from agentsnap.store.memory_graph import MemoryGraphStore

    graphs = MemoryGraphStore()
    graphs.put_checkpoint(
        StoredCheckpoint("t", "", "1", None, "json", b"{}", "json", b"{}", None), []
    )
    with graphs.reading() as reader:
        print(reader.checkpoint("t", "", None).checkpoint_id)  # 1
    ```
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from agentsnap.store._graph_history import check_strategy, needed_ancestors, stored_values
from agentsnap.store.graph import (
    EMPTY,
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

__all__ = ["MemoryGraphStore"]

_Key3 = tuple[str, str, str]
_Key4 = tuple[str, str, str, str]


class _Reader(GraphReader):
    """A ``GraphReader`` on the store's dictionaries (each read under the store's lock)."""

    def __init__(self, store: MemoryGraphStore) -> None:
        self._store = store

    def checkpoints(self, where: CheckpointFilter) -> Iterator[StoredCheckpoint]:
        with self._store.lock:
            rows = where.apply(self._store.checkpoints.values())
        yield from rows

    def values(
        self, thread_id: str, checkpoint_ns: str, versions: Mapping[str, str]
    ) -> list[tuple[str, str, bytes]]:
        found: list[tuple[str, str, bytes]] = []
        with self._store.lock:
            for channel, version in versions.items():
                stored = self._store.values.get((thread_id, checkpoint_ns, channel, version))
                if stored is None or stored.value_type == EMPTY:
                    continue
                value = self._store.resolve(stored)
                if value is not None:
                    found.append((channel, stored.value_type, value))
        return found

    def task_writes(
        self, thread_id: str, checkpoint_ns: str, checkpoint_id: str
    ) -> list[TaskWrites]:
        with self._store.lock:
            return [
                TaskWrites(key[3], task_path, writes)
                for key, (task_path, writes) in self._store.writes.items()
                if key[:3] == (thread_id, checkpoint_ns, checkpoint_id)
            ]

    def lineage(
        self, thread_id: str, checkpoint_ns: str, checkpoint_id: str | None
    ) -> Iterator[StoredCheckpoint]:
        with self._store.lock:
            checkpoints = self._store.checkpoints
            if not checkpoint_id:
                newest = self.checkpoint(thread_id, checkpoint_ns, None)
                checkpoint_id = None if newest is None else newest.checkpoint_id
            found: list[StoredCheckpoint] = []
            seen: set[str] = set()
            while checkpoint_id and checkpoint_id not in seen:
                row = checkpoints.get((thread_id, checkpoint_ns, checkpoint_id))
                if row is None:
                    break
                seen.add(checkpoint_id)
                found.append(row)
                checkpoint_id = row.parent_checkpoint_id
        yield from found

    def values_at(
        self, thread_id: str, checkpoint_ns: str, versions: Collection[tuple[str, str]]
    ) -> dict[tuple[str, str], tuple[str, bytes]]:
        found: dict[tuple[str, str], tuple[str, bytes]] = {}
        for channel, version in versions:
            for _, value_type, value in self.values(thread_id, checkpoint_ns, {channel: version}):
                found[channel, version] = (value_type, value)
        return found

    def writes_at(
        self, thread_id: str, checkpoint_ns: str, checkpoint_ids: Collection[str]
    ) -> dict[str, list[TaskWrites]]:
        found: dict[str, list[TaskWrites]] = {}
        for checkpoint_id in set(checkpoint_ids):
            writes = self.task_writes(thread_id, checkpoint_ns, checkpoint_id)
            if writes:
                found[checkpoint_id] = writes
        return found


class MemoryGraphStore:
    """A [`GraphCheckpointStore`][agentsnap.store.graph.GraphCheckpointStore] in memory.

    Safe to use from several threads; each write is atomic (one lock).
    """

    def __init__(self) -> None:
        self.lock = threading.RLock()
        """Held by every read and write."""
        self.checkpoints: dict[_Key3, StoredCheckpoint] = {}
        """The checkpoints, by thread, namespace and id."""
        self.values: dict[_Key4, StoredValue] = {}
        """The channel values, by thread, namespace, channel and version."""
        self.writes: dict[TaskKey, tuple[str, bytes]] = {}
        """Each task's path and packed writes, by thread, namespace, checkpoint and task."""

    def __repr__(self) -> str:
        return f"MemoryGraphStore({len(self.checkpoints)} checkpoints)"

    def resolve(self, stored: StoredValue) -> bytes | None:
        """A stored value's bytes: its own, or those of the write it refers to (if kept)."""
        if stored.write_idx is None:
            return stored.value
        found = self.writes.get(
            (
                stored.thread_id,
                stored.checkpoint_ns,
                stored.write_checkpoint_id or "",
                stored.write_task_id or "",
            )
        )
        return None if found is None else written_value(found[1], stored.write_idx)

    @contextmanager
    def reading(self) -> Iterator[GraphReader]:
        """A reader, for the block's duration."""
        yield _Reader(self)

    def put_checkpoint(self, checkpoint: StoredCheckpoint, values: Sequence[StoredValue]) -> None:
        """Store a checkpoint (replacing one with its key) and new values (kept if present)."""
        with self.lock:
            for value in values:
                key = (value.thread_id, value.checkpoint_ns, value.channel, value.version)
                self.values.setdefault(key, value)
            self.checkpoints[
                checkpoint.thread_id, checkpoint.checkpoint_ns, checkpoint.checkpoint_id
            ] = checkpoint

    def put_task_writes(self, key: TaskKey, task_path: str, writes: bytes, merge: Merge) -> bool:
        """Store a task's writes, or merge them into the ones stored for its key.

        Returns:
            Whether ``writes`` went in as given (the task had none stored).
        """
        with self.lock:
            found = self.writes.get(key)
            self.writes[key] = (task_path, writes) if found is None else merge(*found)
            return found is None

    def delete_thread(self, thread_id: str) -> None:
        """Delete every checkpoint, value and write of a thread."""
        with self.lock:
            for write_key in [key for key in self.writes if key[0] == thread_id]:
                del self.writes[write_key]
            for value_key in [key for key in self.values if key[0] == thread_id]:
                del self.values[value_key]
            for checkpoint_key in [key for key in self.checkpoints if key[0] == thread_id]:
                del self.checkpoints[checkpoint_key]

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every row of a thread onto another (a value the target has is kept)."""
        if source_thread_id == target_thread_id:
            return
        with self.lock:
            for (thread_id, checkpoint_ns, channel, version), value in list(self.values.items()):
                if thread_id == source_thread_id:
                    self.values.setdefault(
                        (target_thread_id, checkpoint_ns, channel, version),
                        value._replace(thread_id=target_thread_id),
                    )
            for (thread_id, checkpoint_ns, checkpoint_id, task_id), row in list(
                self.writes.items()
            ):
                if thread_id == source_thread_id:
                    self.writes[target_thread_id, checkpoint_ns, checkpoint_id, task_id] = row
            for (thread_id, checkpoint_ns, checkpoint_id), checkpoint in list(
                self.checkpoints.items()
            ):
                if thread_id == source_thread_id:
                    self.checkpoints[target_thread_id, checkpoint_ns, checkpoint_id] = (
                        checkpoint._replace(thread_id=target_thread_id)
                    )

    def delete_for_runs(self, run_ids: Sequence[str], load: Load) -> None:
        """Delete the checkpoints of LangGraph runs, their writes and the values only they used."""
        wanted = set(run_ids)
        with self.lock:
            doomed = [key for key, row in self.checkpoints.items() if row.run_id in wanted]
            for key in doomed:
                del self.checkpoints[key]
            for thread_id, checkpoint_ns in sorted({key[:2] for key in doomed}):
                self._collect_values(load, thread_id, checkpoint_ns)
            self._delete_writes(set(doomed))

    def prune(
        self, thread_ids: Sequence[str], strategy: str, load: Load, load_metadata: Load
    ) -> None:
        """Delete threads' history: all of it, or all but what each namespace's newest needs.

        Raises:
            ConfigurationError: ``strategy`` is not one of ``PRUNE_STRATEGIES``.
        """
        check_strategy(strategy)
        with self.lock:
            for thread_id in dict.fromkeys(thread_ids):
                if strategy == "delete":
                    self.delete_thread(thread_id)
                    continue
                newest: dict[str, str] = {}
                for found_thread, checkpoint_ns, checkpoint_id in self.checkpoints:
                    if found_thread == thread_id:
                        newest[checkpoint_ns] = max(newest.get(checkpoint_ns, ""), checkpoint_id)
                kept = {
                    (thread_id, checkpoint_ns, kept_id)
                    for checkpoint_ns, checkpoint_id in newest.items()
                    for kept_id in needed_ancestors(
                        _Rows(self),
                        thread_id,
                        checkpoint_ns,
                        checkpoint_id,
                        load=load,
                        load_metadata=load_metadata,
                    )
                }
                # The rows of namespaces that have no checkpoint at all.
                for write_key in [
                    k for k in self.writes if k[0] == thread_id and k[1] not in newest
                ]:
                    del self.writes[write_key]
                for value_key in [
                    k for k in self.values if k[0] == thread_id and k[1] not in newest
                ]:
                    del self.values[value_key]
                for checkpoint_key in [
                    k for k in self.checkpoints if k[0] == thread_id and k not in kept
                ]:
                    del self.checkpoints[checkpoint_key]
                for checkpoint_ns in newest:
                    self._collect_values(load, thread_id, checkpoint_ns)
                self._delete_writes(
                    {(k[0], k[1], k[2]) for k in self.writes if k[0] == thread_id} - kept
                )

    def close(self) -> None:
        """Nothing to release."""

    # The history's parts, under the lock.

    def _collect_values(self, load: Load, thread_id: str, checkpoint_ns: str) -> None:
        """Delete the values of a thread's namespace that no checkpoint refers to."""
        referenced: set[tuple[str, str]] = set()
        for key, row in self.checkpoints.items():
            if key[:2] == (thread_id, checkpoint_ns):
                referenced |= stored_values(load(row.checkpoint_type, row.checkpoint))
        for value_key in list(self.values):
            if value_key[:2] == (thread_id, checkpoint_ns) and (
                (value_key[2], value_key[3]) not in referenced
            ):
                del self.values[value_key]

    def _delete_writes(self, checkpoints: set[_Key3]) -> None:
        """Delete the writes of ``checkpoints``, copying the values that refer to them first."""
        for key, stored in list(self.values.items()):
            if stored.write_idx is not None and (
                (stored.thread_id, stored.checkpoint_ns, stored.write_checkpoint_id) in checkpoints
            ):
                value = self.resolve(stored)
                if value is None:
                    del self.values[key]
                else:
                    self.values[key] = stored._replace(
                        value=value, write_checkpoint_id=None, write_task_id=None, write_idx=None
                    )
        for write_key in [k for k in self.writes if (k[0], k[1], k[2]) in checkpoints]:
            del self.writes[write_key]


@dataclass(frozen=True)
class _Rows:
    """The store's rows as ``needed_ancestors`` reads them (under the store's lock)."""

    store: MemoryGraphStore

    def checkpoint_row(
        self, thread_id: str, checkpoint_ns: str, checkpoint_id: str
    ) -> Sequence[Any] | None:
        row = self.store.checkpoints.get((thread_id, checkpoint_ns, checkpoint_id))
        return None if row is None else (row.parent_checkpoint_id, *row[4:8])

    def stored_versions(
        self, thread_id: str, checkpoint_ns: str, wanted: set[tuple[str, str]]
    ) -> set[tuple[str, str]]:
        found = set()
        for channel, version in wanted:
            value = self.store.values.get((thread_id, checkpoint_ns, channel, version))
            if value is not None and value.value_type != EMPTY:
                found.add((channel, version))
        return found
