"""The store's frequent writes on PostgreSQL, each one statement: one round trip, one commit.

A transaction of several statements costs a round trip per statement plus its ``BEGIN``
and ``COMMIT``, and every round trip waits for the server and then for the event loop. The
writes a run makes at every turn (its journal, its replay log, its snapshots) are each one
statement here instead, run in autocommit, so that it is its own transaction: whatever it
writes is committed, and whole, when it returns, or nothing is written.

Rows of a batch go in as arrays, one per column, which ``unnest`` turns back into rows; the
statement's text is then the same for any number of rows, so psycopg prepares it once. The
arrays are sent in binary (psycopg's ``%b``): as text, each quote in their JSON would be
escaped, one regular-expression substitution at a time. Rows
of several tables go in as data-modifying ``WITH`` queries of one statement: the foreign
keys between them are checked at the statement's end, when every row is in.

A fenced write reads the run's lease ``FOR SHARE`` in the same statement, as the store's
transactions do, and writes only while the lease has the fence's token: no takeover can
commit before the write does.

The statements take psycopg's ``%s`` placeholders, in the order each one's description says.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Column, Table
from sqlalchemy.dialects import postgresql

from agentsnap.store.tables import (
    JournalRow,
    RunLeaseRow,
    SnapshotAgentRow,
    SnapshotMessageRow,
    SnapshotRow,
    StateBlobRow,
    StateChunkRow,
    table_of,
)

__all__ = [
    "AGENT_COLUMNS",
    "BLOB_COLUMNS",
    "JOURNAL",
    "JOURNAL_FENCED",
    "MESSAGE_COLUMNS",
    "SNAPSHOT",
    "SNAPSHOT_COLUMNS",
    "SNAPSHOT_FENCED",
    "journal_values",
    "snapshot_values",
]

_snapshots = table_of(SnapshotRow)
_blobs = table_of(StateBlobRow)
_agents = table_of(SnapshotAgentRow)
_messages = table_of(SnapshotMessageRow)
_journal = table_of(JournalRow)
_leases = table_of(RunLeaseRow)
_chunks = table_of(StateChunkRow)

_DIALECT = postgresql.psycopg.dialect()  # type: ignore[no-untyped-call]


def _type(column: Column[Any]) -> str:
    """The SQL type a value of ``column`` is cast to: ``text`` for every kind of string.

    A cast to ``varchar(n)`` would cut a long value short where the column refuses it.
    """
    name = str(column.type.compile(dialect=_DIALECT)).lower()
    return "text" if name.startswith(("varchar", "text")) else name


def _marks(table: Table, columns: list[str]) -> str:
    """A ``%s`` per column, each cast to its column's type."""
    return ", ".join(f"%s::{_type(table.c[name])}" for name in columns)


def _arrays(table: Table, columns: list[str]) -> str:
    """``unnest`` of an array per column (sent in binary), each cast to its column's type."""
    return f"unnest({', '.join(f'%b::{_type(table.c[name])}[]' for name in columns)})"


_JOURNAL_COLUMNS = ["src", "dst", "event", "first_seq", "last_seq", "entries"]
# The columns of the rows a snapshot writes, in the order of the rows' values; the SQLite
# statements (``agentsnap.store._sql_base``) take the same rows, an agent's and a message's
# with the snapshot's id first.
SNAPSHOT_COLUMNS = [
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
]
BLOB_COLUMNS = ["hash", "state", "lists", "roots"]
AGENT_COLUMNS = ["agent", "state_hash", "sent", "received", "state_version"]
MESSAGE_COLUMNS = ["src", "dst", "seq", "kind", "payload", "headers", "epoch"]
_CHUNK_COLUMNS = ["hash", "height", "body"]

# Table and column names below are the models' constants; values are bound.
_HOLDS = f"EXISTS (SELECT 1 FROM {_leases.name} WHERE run_id = %s AND token = %s FOR SHARE)"  # noqa: S608


def _journal_statement(*, fenced: bool) -> str:
    # unnest yields the rows in the arrays' order, which numbers them (``pos``) in it.
    return (
        f"INSERT INTO {_journal.name} (run_id, {', '.join(_JOURNAL_COLUMNS)}) "  # noqa: S608
        f"SELECT %s, {', '.join(_JOURNAL_COLUMNS)} "
        f"FROM {_arrays(_journal, _JOURNAL_COLUMNS)} AS s({', '.join(_JOURNAL_COLUMNS)})"
        + (f" WHERE {_HOLDS}" if fenced else "")
    )


JOURNAL = _journal_statement(fenced=False)
"""Appends journal segments: the run, then an array per column (see ``journal_values``)."""
JOURNAL_FENCED = _journal_statement(fenced=True)
"""As ``JOURNAL`` while the lease has the token: ``JOURNAL``'s values, the run, the token.
No row changed: the run is not there, or its lease has another token."""


def journal_values(run_id: str, segments: Any) -> tuple[Any, ...]:
    """``JOURNAL``'s parameters for ``segments`` (``JournalSegment``s) of ``run_id``."""
    return (run_id, *([getattr(s, name) for s in segments] for name in _JOURNAL_COLUMNS))


def _snapshot_statement(*, fenced: bool) -> str:
    lease = (
        f"lease AS (SELECT owner, token FROM {_leases.name} WHERE run_id = %s FOR SHARE), "  # noqa: S608
        if fenced
        else ""
    )
    only_held = " AND EXISTS (SELECT 1 FROM lease WHERE token = %s)" if fenced else ""
    read_lease = ", (SELECT owner FROM lease), (SELECT token FROM lease)" if fenced else ""
    agents = ", ".join(AGENT_COLUMNS)
    messages = ", ".join(MESSAGE_COLUMNS)
    # Every row waits for the snapshot's: a refused snapshot writes nothing. So does one
    # whose states rely on chunks that are gone (retention deleted them since).
    return (
        f"WITH {lease}"  # noqa: S608
        f"relied AS (SELECT count(*) = %s AS whole FROM {_chunks.name} "
        "WHERE hash = ANY(%b::text[])), "
        f"snap AS (INSERT INTO {_snapshots.name} ({', '.join(SNAPSHOT_COLUMNS)}) "
        f"SELECT {_marks(_snapshots, SNAPSHOT_COLUMNS)} "
        f"WHERE (SELECT whole FROM relied){only_held} RETURNING id), "
        f"blobs AS (INSERT INTO {_blobs.name} ({', '.join(BLOB_COLUMNS)}) "
        f"SELECT * FROM {_arrays(_blobs, BLOB_COLUMNS)} "
        "WHERE EXISTS (SELECT 1 FROM snap) ON CONFLICT (hash) DO NOTHING), "
        f"agents AS (INSERT INTO {_agents.name} (snapshot_id, {agents}) "
        f"SELECT snap.id, a.* FROM snap, {_arrays(_agents, AGENT_COLUMNS)} AS a({agents})), "
        f"messages AS (INSERT INTO {_messages.name} (snapshot_id, {messages}) "
        f"SELECT snap.id, m.* FROM snap, {_arrays(_messages, MESSAGE_COLUMNS)} AS m({messages})), "
        f"chunks AS (INSERT INTO {_chunks.name} ({', '.join(_CHUNK_COLUMNS)}) "
        f"SELECT * FROM {_arrays(_chunks, _CHUNK_COLUMNS)} "
        "WHERE EXISTS (SELECT 1 FROM snap) ON CONFLICT (hash) DO NOTHING) "
        "SELECT EXISTS (SELECT 1 FROM snap), (SELECT whole FROM relied)"
        f"{read_lease}"
    )


SNAPSHOT = _snapshot_statement(fenced=False)
"""Writes a snapshot's row, its new states, its agents' rows, its channels' messages and its
states' new chunks (see ``snapshot_values``), if every chunk its states rely on is stored.
Returns one row: whether the snapshot was written, and whether those chunks were there."""
SNAPSHOT_FENCED = _snapshot_statement(fenced=True)
"""As ``SNAPSHOT`` while the lease has the token. Returns ``SNAPSHOT``'s row, then the owner
and token of the lease read (``NULL``: none)."""


def snapshot_values(  # noqa: PLR0917 (a statement's parameters, in their order)
    snapshot: tuple[Any, ...],
    blobs: list[tuple[Any, ...]],
    agents: list[tuple[Any, ...]],
    messages: list[tuple[Any, ...]],
    chunks: list[tuple[str, int, str]],
    relied: list[str],
    fence: tuple[str, int] | None,
) -> tuple[Any, ...]:
    """``SNAPSHOT``'s (or, with ``fence``, ``SNAPSHOT_FENCED``'s) parameters.

    The rows are those the store writes in a transaction elsewhere: ``agents`` and
    ``messages`` start with the snapshot's id, which the statement takes from its own row.
    ``chunks`` are the new chunks, ``relied`` the hashes of the stored ones the states need.
    """
    arrays = (
        *_columns(blobs, len(BLOB_COLUMNS), 0),
        *_columns(agents, len(AGENT_COLUMNS), 1),
        *_columns(messages, len(MESSAGE_COLUMNS), 1),
        *_columns(chunks, len(_CHUNK_COLUMNS), 0),
    )
    if fence is None:
        return (len(relied), relied, *snapshot, *arrays)
    return (fence[0], len(relied), relied, *snapshot, fence[1], *arrays)


def _columns(rows: list[tuple[Any, ...]], width: int, skip: int) -> list[list[Any]]:
    """``rows`` as a list per column, leaving out the first ``skip`` columns."""
    return [[row[i] for row in rows] for i in range(skip, skip + width)]
