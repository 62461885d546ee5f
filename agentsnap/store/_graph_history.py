"""How LangGraph checkpoint storage copies, prunes and deletes the history of threads, in SQL.

Each operation runs in one ``Transaction`` that the graph store opens (on SQLite, its write
connection with the write lock taken; on PostgreSQL, a repeatable-read transaction), so it
sees the database as of one moment and leaves it changed entirely or not at all.

A channel value (a row of ``agentsnap_lg_blobs``) is shared by every checkpoint of its
thread and namespace that has its channel at its version. When checkpoints are deleted, the
values that no remaining checkpoint refers to are deleted too: which ones that is comes from
the remaining checkpoints' channel versions, decoded by the saver's serializer (never
unpickled). A value that refers to a task's write (see
[`StoredValue`][agentsnap.store.graph.StoredValue]) is copied into its own row before that
write is deleted, so a remaining checkpoint keeps it.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol, TypeVar, cast

from sqlalchemy import (
    ColumnElement,
    Connection,
    Executable,
    Table,
    Text,
    and_,
    bindparam,
    delete,
    func,
    literal,
    select,
    update,
)
from sqlalchemy.dialects import sqlite
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.expression import ClauseElement

from agentsnap.exceptions import ConfigurationError
from agentsnap.store.dialect import Dialect, dialect_of
from agentsnap.store.graph import EMPTY, PRUNE_STRATEGIES, Load, written_value
from agentsnap.store.tables import (
    LangGraphBlobRow,
    LangGraphCheckpointRow,
    LangGraphTaskWritesRow,
    table_of,
)

__all__ = [
    "EMPTY",
    "PRUNE_STRATEGIES",
    "HistoryRows",
    "Load",
    "Transaction",
    "check_strategy",
    "copy_thread",
    "delete_runs",
    "needed_ancestors",
    "prune_threads",
    "stored_values",
]

_checkpoints = table_of(LangGraphCheckpointRow)
_blobs = table_of(LangGraphBlobRow)
_writes = table_of(LangGraphTaskWritesRow)
VALUES_WITH_WRITES = _blobs.outerjoin(
    _writes,
    and_(
        _writes.c.thread_id == _blobs.c.thread_id,
        _writes.c.checkpoint_ns == _blobs.c.checkpoint_ns,
        _writes.c.checkpoint_id == _blobs.c.write_checkpoint_id,
        _writes.c.task_id == _blobs.c.write_task_id,
    ),
)
"""Channel values beside the task write a value refers to (``NULL`` for a value in its own row)."""

_CHECKPOINT_KEY = ("thread_id", "checkpoint_ns", "checkpoint_id")
_BLOB_KEY = ("thread_id", "checkpoint_ns", "channel", "version")
_WRITES_KEY = ("thread_id", "checkpoint_ns", "checkpoint_id", "task_id")

_BATCH = 500
"""Values bound in one ``IN (…)`` list (well under SQLite's limit on bound values)."""

_SQLITE = sqlite.dialect()

T = TypeVar("T")


class Transaction:
    """One transaction of the graph store's, running statements of SQLAlchemy Core.

    On SQLite it runs them on the store's own ``sqlite3`` write connection, compiled to
    SQLite's text; on other databases, on a SQLAlchemy connection.

    Args:
        target: The ``sqlite3`` connection (in a transaction) or the SQLAlchemy connection.
    """

    def __init__(self, target: sqlite3.Connection | Connection) -> None:
        self._target = target
        self.dialect: Dialect = dialect_of(
            "sqlite" if isinstance(target, sqlite3.Connection) else target.dialect.name
        )
        """The database's dialect (its inserts on a conflict)."""

    def rows(self, statement: Executable) -> list[Sequence[Any]]:
        """The rows a query returns."""
        target = self._target
        if isinstance(target, sqlite3.Connection):
            text, parameters = _sqlite_text(statement, None)
            return list(target.execute(text, parameters[0]).fetchall())
        return [tuple(row) for row in target.execute(statement)]

    def checkpoint_row(
        self, thread_id: str, checkpoint_ns: str, checkpoint_id: str
    ) -> Sequence[Any] | None:
        """``HistoryRows.checkpoint_row``, read in this transaction."""
        found = self.rows(
            select(
                _checkpoints.c.parent_checkpoint_id,
                _checkpoints.c.checkpoint_type,
                _checkpoints.c.checkpoint,
                _checkpoints.c.meta_type,
                _checkpoints.c.meta,
            ).where(
                _checkpoints.c.thread_id == thread_id,
                _checkpoints.c.checkpoint_ns == checkpoint_ns,
                _checkpoints.c.checkpoint_id == checkpoint_id,
            )
        )
        return found[0] if found else None

    def stored_versions(
        self, thread_id: str, checkpoint_ns: str, wanted: set[tuple[str, str]]
    ) -> set[tuple[str, str]]:
        """``HistoryRows.stored_versions``, read in this transaction."""
        found = self.rows(
            select(_blobs.c.channel, _blobs.c.version).where(
                _blobs.c.thread_id == thread_id,
                _blobs.c.checkpoint_ns == checkpoint_ns,
                _blobs.c.channel.in_(sorted({channel for channel, _ in wanted})),
                _blobs.c.version.in_(sorted({version for _, version in wanted})),
                _blobs.c.value_type != EMPTY,
            )
        )
        return {(channel, version) for channel, version in found if (channel, version) in wanted}

    def run(self, statement: Executable, rows: Sequence[Mapping[str, Any]] | None = None) -> None:
        """Run a statement, once for each of ``rows`` (its bound values by name) if given."""
        if rows is not None and not rows:
            return
        target = self._target
        if isinstance(target, sqlite3.Connection):
            text, parameters = _sqlite_text(statement, rows)
            if rows is None:
                target.execute(text, parameters[0])
            else:
                target.executemany(text, parameters)
        elif rows is None:
            target.execute(statement)
        else:
            target.execute(statement, [dict(row) for row in rows])


def _sqlite_text(
    statement: Executable, rows: Sequence[Mapping[str, Any]] | None
) -> tuple[str, list[tuple[Any, ...]]]:
    """SQLite's text of ``statement`` and its positional values (one tuple per row)."""
    compiled = cast(
        SQLCompiler,
        cast(ClauseElement, statement).compile(
            dialect=_SQLITE, compile_kwargs={"render_postcompile": True}
        ),
    )
    names = compiled.positiontup or []
    values = [compiled.construct_params(dict(row)) for row in (rows if rows is not None else [{}])]
    return str(compiled), [tuple(bound[name] for name in names) for bound in values]


def _batches(items: Sequence[T]) -> Iterator[Sequence[T]]:
    for start in range(0, len(items), _BATCH):
        yield items[start : start + _BATCH]


def _key_is(table: Table, names: Sequence[str]) -> list[ColumnElement[bool]]:
    """The columns ``names`` of ``table`` equal to bound values of the same names."""
    return [table.c[name] == bindparam(f"k_{name}") for name in names]


def _key_rows(names: Sequence[str], keys: Iterable[Sequence[Any]]) -> list[dict[str, Any]]:
    return [{f"k_{name}": value for name, value in zip(names, key, strict=True)} for key in keys]


# Copying.


def copy_thread(transaction: Transaction, source: str, target: str) -> None:
    """Copy every checkpoint, channel value and task write of ``source`` onto ``target``.

    Each namespace, checkpoint id, parent, metadata and pending write is kept as it is; a
    row that ``target`` already has under the same key is replaced by the copy (a channel
    value, which its version names, is kept).
    """
    for table, key, updated in (
        (_blobs, _BLOB_KEY, ()),
        (_writes, _WRITES_KEY, ("task_path", "writes")),
        (
            _checkpoints,
            _CHECKPOINT_KEY,
            tuple(c.name for c in _checkpoints.columns if c.name not in _CHECKPOINT_KEY),
        ),
    ):
        names = [column.name for column in table.columns]
        copied = select(
            *(
                literal(target, Text).label(name) if name == "thread_id" else table.c[name]
                for name in names
            )
        ).where(table.c.thread_id == source)
        insert = transaction.dialect.insert(table).from_select(names, copied)
        transaction.run(
            insert.on_conflict_do_update(
                index_elements=list(key), set_={name: insert.excluded[name] for name in updated}
            )
            if updated
            else insert.on_conflict_do_nothing(index_elements=list(key))
        )


# Deleting a run's checkpoints.


def delete_runs(transaction: Transaction, run_ids: Sequence[str], load: Load) -> None:
    """Delete the checkpoints whose metadata's ``run_id`` is one of ``run_ids``.

    Their task writes go with them, and so do the channel values that no remaining
    checkpoint refers to.
    """
    doomed: list[Sequence[Any]] = []
    for batch in _batches(list(dict.fromkeys(run_ids))):
        doomed += transaction.rows(
            select(*(_checkpoints.c[name] for name in _CHECKPOINT_KEY)).where(
                _checkpoints.c.run_id.in_(batch)
            )
        )
    if not doomed:
        return
    rows = _key_rows(_CHECKPOINT_KEY, doomed)
    transaction.run(delete(_checkpoints).where(*_key_is(_checkpoints, _CHECKPOINT_KEY)), rows)
    namespaces: dict[tuple[str, str], list[str]] = {}
    for thread_id, checkpoint_ns, checkpoint_id in doomed:
        namespaces.setdefault((thread_id, checkpoint_ns), []).append(checkpoint_id)
    for (thread_id, checkpoint_ns), checkpoint_ids in sorted(namespaces.items()):
        _collect_values(transaction, load, thread_id, checkpoint_ns)
        for batch in _batches(sorted(checkpoint_ids)):
            _copy_out_written(
                transaction, thread_id, checkpoint_ns, _blobs.c.write_checkpoint_id.in_(batch)
            )
    transaction.run(delete(_writes).where(*_key_is(_writes, _CHECKPOINT_KEY)), rows)


def _collect_values(
    transaction: Transaction, load: Load, thread_id: str, checkpoint_ns: str
) -> None:
    """Delete the channel values of a thread's namespace that no checkpoint refers to."""
    referenced: set[tuple[str, str]] = set()
    for checkpoint_type, encoded in transaction.rows(
        select(_checkpoints.c.checkpoint_type, _checkpoints.c.checkpoint).where(
            _checkpoints.c.thread_id == thread_id, _checkpoints.c.checkpoint_ns == checkpoint_ns
        )
    ):
        referenced |= stored_values(load(checkpoint_type, encoded))
    stale = [
        (thread_id, checkpoint_ns, channel, version)
        for channel, version in transaction.rows(
            select(_blobs.c.channel, _blobs.c.version).where(
                _blobs.c.thread_id == thread_id, _blobs.c.checkpoint_ns == checkpoint_ns
            )
        )
        if (channel, version) not in referenced
    ]
    transaction.run(delete(_blobs).where(*_key_is(_blobs, _BLOB_KEY)), _key_rows(_BLOB_KEY, stale))


def _copy_out_written(
    transaction: Transaction,
    thread_id: str,
    checkpoint_ns: str,
    written_at: ColumnElement[bool],
) -> None:
    """Store in its own row each value of a namespace that refers to a write about to go.

    ``written_at`` selects, on ``write_checkpoint_id``, the checkpoints whose task writes
    are about to be deleted. A value whose write is gone already (which reading leaves out)
    is deleted.
    """
    found = transaction.rows(
        select(_blobs.c.channel, _blobs.c.version, _blobs.c.write_idx, _writes.c.writes)
        .select_from(VALUES_WITH_WRITES)
        .where(
            _blobs.c.thread_id == thread_id,
            _blobs.c.checkpoint_ns == checkpoint_ns,
            _blobs.c.write_idx.is_not(None),
            written_at,
        )
    )
    copied: list[dict[str, Any]] = []
    lost: list[tuple[str, str, str, str]] = []
    for channel, version, write_idx, writes in found:
        key = (thread_id, checkpoint_ns, channel, version)
        value = None if writes is None else written_value(bytes(writes), write_idx)
        if value is None:
            lost.append(key)
        else:
            copied.append({**_key_rows(_BLOB_KEY, [key])[0], "copied_value": value})
    transaction.run(
        update(_blobs)
        .where(*_key_is(_blobs, _BLOB_KEY))
        .values(
            value=bindparam("copied_value"),
            write_checkpoint_id=None,
            write_task_id=None,
            write_idx=None,
        ),
        copied,
    )
    transaction.run(delete(_blobs).where(*_key_is(_blobs, _BLOB_KEY)), _key_rows(_BLOB_KEY, lost))


def stored_values(checkpoint: Mapping[str, Any]) -> set[tuple[str, str]]:
    """The ``(channel, version)`` of the values a stored checkpoint keeps as rows of their own."""
    inline = checkpoint.get("channel_values") or {}
    versions: Mapping[str, Any] = checkpoint.get("channel_versions") or {}
    return {
        (channel, str(version)) for channel, version in versions.items() if channel not in inline
    }


# Pruning.


def check_strategy(strategy: str) -> None:
    """Raise ``ConfigurationError`` unless ``strategy`` is one of ``PRUNE_STRATEGIES``."""
    if strategy not in PRUNE_STRATEGIES:
        raise ConfigurationError(
            f"unknown prune strategy {strategy!r}: use 'keep_latest' (keep each "
            "namespace's newest checkpoint) or 'delete' (delete the threads)"
        )


def prune_threads(
    transaction: Transaction,
    thread_ids: Sequence[str],
    strategy: str,
    load: Load,
    load_metadata: Load,
) -> None:
    """Delete threads' history: all of it, or all but each namespace's newest checkpoint.

    With ``"keep_latest"``, each namespace keeps its newest checkpoint with its task writes,
    and the ancestors that LangGraph's ``DeltaChannel`` needs to rebuild its values (see
    ``needed_ancestors``);
    every other checkpoint, task write and channel value of the thread is deleted.
    """
    for batch in _batches(list(dict.fromkeys(thread_ids))):
        if strategy == "delete":
            for table in (_writes, _blobs, _checkpoints):
                transaction.run(delete(table).where(table.c.thread_id.in_(batch)))
            continue
        kept: dict[str, dict[str, set[str]]] = {thread_id: {} for thread_id in batch}
        for thread_id, checkpoint_ns, newest in transaction.rows(
            select(
                _checkpoints.c.thread_id,
                _checkpoints.c.checkpoint_ns,
                func.max(_checkpoints.c.checkpoint_id),
            )
            .where(_checkpoints.c.thread_id.in_(batch))
            .group_by(_checkpoints.c.thread_id, _checkpoints.c.checkpoint_ns)
        ):
            kept[thread_id][checkpoint_ns] = needed_ancestors(
                transaction,
                thread_id,
                checkpoint_ns,
                newest,
                load=load,
                load_metadata=load_metadata,
            )
        for thread_id, namespaces in kept.items():
            _keep_only(transaction, load, thread_id, namespaces)


def _keep_only(
    transaction: Transaction, load: Load, thread_id: str, namespaces: Mapping[str, set[str]]
) -> None:
    """Delete a thread's rows but the checkpoints ``namespaces`` names and their values."""
    for table in (_writes, _blobs):  # rows of namespaces that have no checkpoint at all
        transaction.run(
            delete(table).where(
                table.c.thread_id == thread_id, table.c.checkpoint_ns.not_in(list(namespaces))
            )
        )
    for checkpoint_ns, checkpoint_ids in namespaces.items():
        kept = sorted(checkpoint_ids)
        transaction.run(
            delete(_checkpoints).where(
                _checkpoints.c.thread_id == thread_id,
                _checkpoints.c.checkpoint_ns == checkpoint_ns,
                _checkpoints.c.checkpoint_id.not_in(kept),
            )
        )
        _collect_values(transaction, load, thread_id, checkpoint_ns)
        # The kept checkpoint's values usually refer to its parent's writes, deleted here.
        _copy_out_written(
            transaction, thread_id, checkpoint_ns, _blobs.c.write_checkpoint_id.not_in(kept)
        )
        transaction.run(
            delete(_writes).where(
                _writes.c.thread_id == thread_id,
                _writes.c.checkpoint_ns == checkpoint_ns,
                _writes.c.checkpoint_id.not_in(kept),
            )
        )


class HistoryRows(Protocol):
    """The stored rows that ``needed_ancestors`` reads (``Transaction`` reads them in SQL)."""

    def checkpoint_row(
        self, thread_id: str, checkpoint_ns: str, checkpoint_id: str
    ) -> Sequence[Any] | None:
        """A checkpoint's parent's id, checkpoint type, encoded checkpoint, metadata type
        and encoded metadata, if it is stored.
        """  # noqa: D205

    def stored_versions(
        self, thread_id: str, checkpoint_ns: str, wanted: set[tuple[str, str]]
    ) -> set[tuple[str, str]]:
        """Which of these ``(channel, version)`` pairs of a namespace have a stored value
        that is not empty.
        """  # noqa: D205


def needed_ancestors(
    rows: HistoryRows,
    thread_id: str,
    checkpoint_ns: str,
    newest: str,
    *,
    load: Load,
    load_metadata: Load,
) -> set[str]:
    """The checkpoint ``newest`` and the ancestors that its delta channels are rebuilt from.

    A ``DeltaChannel`` keeps its value in a checkpoint only now and then (a snapshot); in
    between, LangGraph rebuilds it from the task writes of the checkpoint's ancestors, back
    to the nearest one that has a value for it. The channels that need this are those of
    the metadata's ``counters_since_delta_snapshot`` that have a version but no value in
    ``newest``; the ancestors are walked (by parent) until each has found a value, or the
    thread's first checkpoint is reached.

    Args:
        rows: Where the rows are read.
        thread_id: The checkpoint's thread.
        checkpoint_ns: Its namespace.
        newest: The checkpoint's id.
        load: Decodes a stored checkpoint.
        load_metadata: Decodes stored metadata.
    """
    kept = {newest}
    found = rows.checkpoint_row(thread_id, checkpoint_ns, newest)
    if found is None:
        return kept
    parent, checkpoint_type, encoded, meta_type, meta = found
    metadata = load_metadata(meta_type, meta)
    counters = metadata.get("counters_since_delta_snapshot") if isinstance(metadata, dict) else None
    if not isinstance(counters, dict) or not counters:
        return kept
    checkpoint = load(checkpoint_type, encoded)
    versions = checkpoint.get("channel_versions") or {}
    needed = {channel for channel in counters if channel in versions}
    needed -= _with_values(rows, thread_id, checkpoint_ns, checkpoint, needed)
    while needed and parent is not None and parent not in kept:
        found = rows.checkpoint_row(thread_id, checkpoint_ns, parent)
        if found is None:
            break
        kept.add(parent)
        ancestor = load(found[1], found[2])
        needed -= _with_values(rows, thread_id, checkpoint_ns, ancestor, needed)
        parent = found[0]
    return kept


def _with_values(
    rows: HistoryRows,
    thread_id: str,
    checkpoint_ns: str,
    checkpoint: Mapping[str, Any],
    channels: set[str],
) -> set[str]:
    """Which of ``channels`` have a value in a stored checkpoint (as reading it would find)."""
    inline = checkpoint.get("channel_values") or {}
    found = {channel for channel in channels if channel in inline}
    versions: Mapping[str, Any] = checkpoint.get("channel_versions") or {}
    wanted = {
        (channel, str(versions[channel])) for channel in channels - found if channel in versions
    }
    if wanted:
        found |= {channel for channel, _ in rows.stored_versions(thread_id, checkpoint_ns, wanted)}
    return found
