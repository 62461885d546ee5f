"""Snapshot and replay-log writes to SQLite in a single hop to a writer thread.

Through the asyncio driver every statement is a round trip between the event loop and the
driver's thread; a snapshot is several statements plus a commit. Here the whole transaction
runs in one call on a dedicated thread with the standard ``sqlite3`` module, so a snapshot
costs about what SQLite needs for its bytes, and the event loop is never blocked. A replay
segment, written before each side-effecting tool call, is one statement on the same thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, NamedTuple

from agentsnap.exceptions import StoreError
from agentsnap.liveness import lost
from agentsnap.store.dialect import connect_sqlite

if TYPE_CHECKING:
    from agentsnap.store.chunks import ChunkWrites

__all__ = ["SnapshotRows", "SqliteWriter", "Statements"]


class Statements(NamedTuple):
    """The statements of the store's fast writes, in the driver's placeholder style."""

    snapshot: str
    blobs: str
    agents: str
    messages: str
    lease: str
    """Reads ``(owner, token)`` of a run's lease (locking it against a takeover until the
    transaction ends, where the database has row locks)."""
    replay: str
    """Appends a replay segment: run, run, timeline, body."""
    replay_fenced: str
    """Appends a replay segment if the lease has the token: run, run, timeline, body, run,
    token."""


class SnapshotRows(NamedTuple):
    """A snapshot as the rows to insert, prepared before the write."""

    snapshot: tuple[Any, ...]
    blobs: list[tuple[str, str, str | None, str | None]]
    """``(hash, state, lists, roots)`` of the states not known to be stored."""
    agents: list[tuple[Any, ...]]
    messages: list[tuple[Any, ...]]
    fence: tuple[str, int] | None = None
    """``(run, token)``: write only if the run's lease still has this token."""
    chunks: ChunkWrites | None = None
    """The state chunks to write after the agents' rows, in the same transaction."""


class SqliteWriter:
    """Writes snapshots to one SQLite file from its own thread, one transaction each.

    Args:
        path: The database file.
        statements: The INSERT statements (``?`` placeholders).
        timeout: Seconds to wait for the write lock before failing with ``SQLITE_BUSY``.
    """

    def __init__(self, path: str, statements: Statements, *, timeout: float = 30.0) -> None:
        self._path = path
        self._statements = statements
        self._timeout = timeout
        self._connection: sqlite3.Connection | None = None
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="agentsnap-sqlite-writer")

    async def write(self, rows: SnapshotRows) -> None:
        """Insert ``rows`` in one transaction.

        Raises:
            StoreError: SQLite refused the write; nothing of it is stored. A constraint
                violation is the ``__cause__`` as ``sqlite3.IntegrityError``.
            OwnershipLost: ``rows.fence`` is set and the lease has another token; nothing
                is stored.
        """
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._thread, self._write, rows)

    async def execute(self, sql: str, values: tuple[Any, ...]) -> int:
        """Run one statement, committed on its own; how many rows it changed.

        Raises:
            StoreError: SQLite refused it, as for ``write``.
        """
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._thread, self._execute, sql, values)

    async def open(self) -> None:
        """Connect now rather than at the first write."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._thread, self._connect)

    def _connect(self) -> None:
        if self._connection is None:
            self._connection = self._open()

    def _open(self) -> sqlite3.Connection:
        return connect_sqlite(self._path, timeout=self._timeout)

    def _write(self, rows: SnapshotRows) -> None:
        try:
            connection = self._connection or self._open()
            self._connection = connection
            statements = self._statements
            connection.execute("BEGIN IMMEDIATE")
            try:
                if rows.fence is not None:
                    # The write lock is held from BEGIN IMMEDIATE: no takeover can commit
                    # between this check and the commit.
                    run_id, token = rows.fence
                    holder = connection.execute(statements.lease, (run_id,)).fetchone()
                    if holder is None or holder[1] != token:
                        raise lost(run_id, token, holder)
                connection.execute(statements.snapshot, rows.snapshot)
                if rows.blobs:
                    connection.executemany(statements.blobs, rows.blobs)
                if rows.agents:
                    connection.executemany(statements.agents, rows.agents)
                if rows.messages:
                    connection.executemany(statements.messages, rows.messages)
                if rows.chunks is not None:
                    rows.chunks.write(connection)
                connection.execute("COMMIT")
            except BaseException:
                _roll_back(connection)
                raise
        except sqlite3.Error as exc:
            raise StoreError(f"the database refused the write: {exc}") from exc

    def _execute(self, sql: str, values: tuple[Any, ...]) -> int:
        try:
            connection = self._connection or self._open()
            self._connection = connection
            cursor = connection.execute(sql, values)
            changed = cursor.rowcount
            cursor.close()
        except sqlite3.Error as exc:
            raise StoreError(f"the database refused the write: {exc}") from exc
        return changed

    async def close(self) -> None:
        """Close the connection and stop the thread."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._thread, self._close)
        self._thread.shutdown(wait=False)

    def _close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None


def _roll_back(connection: sqlite3.Connection) -> None:
    """End a failed transaction, if SQLite has not already (it does on a full disk).

    A failing ROLLBACK must not replace the error that made it necessary.
    """
    if connection.in_transaction:
        with contextlib.suppress(sqlite3.Error):
            connection.execute("ROLLBACK")
