"""The SQL schema, declared once; Alembic migrations create and change it.

Agent states live in ``agentsnap_state_blobs`` keyed by their content hash, so a state that did
not change between snapshots is stored once; the long arrays of long states (a tool-call
history, a conversation) are in ``agentsnap_state_chunks``, so that what an array shares with
an earlier version of it is stored once too; and a snapshot that changes little since its
run's last full snapshot holds the agent rows of the processes that changed only (see
``SnapshotRow``). Every table carries the ``agentsnap_`` prefix so that the schema can share a
database with an application's own tables.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    TypeDecorator,
    UniqueConstraint,
    text,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

__all__ = [
    "VERSION_TABLE",
    "AgentLeaseRow",
    "Base",
    "JournalRow",
    "LangGraphBlobRow",
    "LangGraphCheckpointRow",
    "LangGraphTaskWritesRow",
    "ModelBodyRow",
    "ModelCallRow",
    "ReplayRow",
    "RollbackRow",
    "RunLeaseRow",
    "RunOwnerRow",
    "RunRow",
    "RunTagRow",
    "SnapshotAgentRow",
    "SnapshotMessageRow",
    "SnapshotPartRow",
    "SnapshotRow",
    "StateBlobRow",
    "StateChunkRow",
    "StateSchemaRow",
    "ToolCallRow",
    "table_of",
]

VERSION_TABLE = "agentsnap_alembic_version"
"""Alembic's version table for agentsnap's schema (apart from an application's own)."""


NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class UtcDateTime(TypeDecorator[datetime]):
    """A timezone-aware UTC timestamp on every backend (SQLite keeps no zone)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("agentsnap stores timezone-aware datetimes only")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        assert isinstance(value, datetime)
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Json(TypeDecorator[Any]):
    """JSON kept as text, exactly as Python wrote it.

    Native JSON columns change values: SQLite gives a bare number numeric affinity (``3.0``
    comes back as ``3``), PostgreSQL's ``jsonb`` turns ``1e16`` into an integer and refuses
    the NUL character. Nothing queries inside these columns, so text loses nothing.
    """

    impl = Text()
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Dialect) -> str:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)

    def process_result_value(self, value: Any, dialect: Dialect) -> Any:
        return None if value is None else json.loads(value)


class Base(DeclarativeBase):
    """Declarative base of agentsnap's tables."""

    metadata = MetaData(naming_convention=NAMING)


def table_of(row: type[Base]) -> Table:
    """The table of a declared row class (``row.__table__``, typed as the ``Table`` it is).

    Raises:
        TypeError: ``row`` is not mapped to a plain table.
    """
    table = row.__table__
    if not isinstance(table, Table):
        raise TypeError(f"{row.__name__} is not mapped to a table")
    return table


class RunRow(Base):
    """One run."""

    __tablename__ = "agentsnap_runs"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime())
    parent_run_id: Mapped[str | None] = mapped_column(String(64))
    parent_snapshot_id: Mapped[str | None] = mapped_column(String(64))
    run_metadata: Mapped[dict[str, Any]] = mapped_column("metadata", Json())
    status: Mapped[str] = mapped_column(String(16), server_default="running")
    finished_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    name: Mapped[str | None] = mapped_column(String(128), index=True)
    status_reason: Mapped[str | None] = mapped_column(Text)
    traceback: Mapped[str | None] = mapped_column(Text)
    cancel_requested: Mapped[str | None] = mapped_column(Text)


class RunTagRow(Base):
    """One label of a run (``Runtime(tags=)``): a key and its value."""

    __tablename__ = "agentsnap_run_tags"
    __table_args__ = (Index("ix_agentsnap_run_tags_key_value", "key", "value"),)

    run_id: Mapped[str] = mapped_column(
        String(64), ForeignKey("agentsnap_runs.id", ondelete="CASCADE"), primary_key=True
    )
    key: Mapped[str] = mapped_column(String(128), primary_key=True)
    value: Mapped[str] = mapped_column(String(255))


class SnapshotRow(Base):
    """One snapshot (complete or failed) of a run.

    A snapshot with a ``base_id`` is stored as the changes to that full snapshot of the same
    run: its ``agentsnap_snapshot_agents`` rows are those of the processes whose part differs
    from the base's (or that the base does not have), ``agent_rows`` of them, and every other
    process's part is the base's row. A base is always a full snapshot (``base_id`` ``NULL``,
    a row per process), so a snapshot is read from at most two snapshots' rows (see
    [`agentsnap.store.sql`][agentsnap.store.sql]).
    """

    __tablename__ = "agentsnap_snapshots"
    __table_args__ = (UniqueConstraint("run_id", "seq"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    run_id: Mapped[str] = mapped_column(
        String(64), ForeignKey("agentsnap_runs.id", ondelete="CASCADE"), index=True
    )
    seq: Mapped[int] = mapped_column(Integer)
    initiator: Mapped[str] = mapped_column(String(128))
    status: Mapped[str] = mapped_column(String(16))
    started_at: Mapped[datetime] = mapped_column(UtcDateTime())
    completed_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    error: Mapped[str | None] = mapped_column(Text)
    base_id: Mapped[str | None] = mapped_column(
        String(64), ForeignKey("agentsnap_snapshots.id"), index=True
    )
    agent_rows: Mapped[int | None] = mapped_column(Integer)


class StateBlobRow(Base):
    """A distinct agent state, keyed by the SHA-256 of its canonical JSON text.

    A short state is its text in ``state``, with ``lists`` and ``roots`` ``NULL``. In a long
    one, ``state`` is the text without the leaves of its long arrays, which are in
    ``agentsnap_state_chunks``: ``lists`` says where each array's leaves go back and how
    many there are, ``roots`` names the chunk trees that hold them (see
    [`agentsnap.store.chunks`][agentsnap.store.chunks]).
    """

    __tablename__ = "agentsnap_state_blobs"

    hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    state: Mapped[str] = mapped_column(Text)
    lists: Mapped[str | None] = mapped_column(Text)
    roots: Mapped[str | None] = mapped_column(Text)


class StateChunkRow(Base):
    """A piece of the long arrays of agent states, keyed by the SHA-256 of its ``body``.

    At ``height`` 0 a leaf: consecutive items of an array, as their JSON text separated by
    commas. Above, a tree node: the hashes of its children (one height down), 64 hex digits
    each, one after the other. Chunks are shared by every state that holds the same items.
    (On SQLite the table keeps its rowid: rows of a kilobyte or more would overflow the pages
    of a table without one.)
    """

    __tablename__ = "agentsnap_state_chunks"

    hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    height: Mapped[int] = mapped_column(Integer)
    body: Mapped[str] = mapped_column(Text)


class SnapshotAgentRow(Base):
    """One process's part of a snapshot: its state (by hash), the version of the state class
    it was written with, and its channel counters.
    """  # noqa: D205

    __tablename__ = "agentsnap_snapshot_agents"

    snapshot_id: Mapped[str] = mapped_column(
        String(64), ForeignKey("agentsnap_snapshots.id", ondelete="CASCADE"), primary_key=True
    )
    agent: Mapped[str] = mapped_column(String(128), primary_key=True)
    state_hash: Mapped[str] = mapped_column(
        String(64), ForeignKey("agentsnap_state_blobs.hash"), index=True
    )
    sent: Mapped[dict[str, int]] = mapped_column(Json())
    received: Mapped[dict[str, int]] = mapped_column(Json())
    state_version: Mapped[int] = mapped_column(Integer, server_default=text("1"))


class SnapshotMessageRow(Base):
    """A message in flight on a channel at a snapshot's cut."""

    __tablename__ = "agentsnap_snapshot_messages"

    snapshot_id: Mapped[str] = mapped_column(
        String(64), ForeignKey("agentsnap_snapshots.id", ondelete="CASCADE"), primary_key=True
    )
    src: Mapped[str] = mapped_column(String(128), primary_key=True)
    dst: Mapped[str] = mapped_column(String(128), primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    kind: Mapped[str] = mapped_column(String(128))
    payload: Mapped[Any] = mapped_column(Json())
    headers: Mapped[dict[str, str]] = mapped_column(Json())
    epoch: Mapped[int] = mapped_column(Integer)


class JournalRow(Base):
    """A segment of a run's message journal: one channel's sends or deliveries in a batch.

    ``entries`` is a JSON array in the format described by
    [`JournalSegment`][agentsnap.records.JournalSegment]; ``pos`` orders the segments.
    """

    __tablename__ = "agentsnap_journal"
    __table_args__ = (Index("ix_agentsnap_journal_run_id_pos", "run_id", "pos"),)

    pos: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(
        String(64), ForeignKey("agentsnap_runs.id", ondelete="CASCADE")
    )
    src: Mapped[str] = mapped_column(String(128))
    dst: Mapped[str] = mapped_column(String(128))
    event: Mapped[str] = mapped_column(String(16))
    first_seq: Mapped[int] = mapped_column(Integer)
    last_seq: Mapped[int] = mapped_column(Integer)
    entries: Mapped[str] = mapped_column(Text)


class RollbackRow(Base):
    """A rollback of a run to one of its complete snapshots: who failed, why, what was lost."""

    __tablename__ = "agentsnap_rollbacks"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    run_id: Mapped[str] = mapped_column(
        String(64), ForeignKey("agentsnap_runs.id", ondelete="CASCADE"), index=True
    )
    snapshot_id: Mapped[str] = mapped_column(
        String(64), ForeignKey("agentsnap_snapshots.id", ondelete="CASCADE")
    )
    agent: Mapped[str | None] = mapped_column(String(128))
    reason: Mapped[str] = mapped_column(Text)
    source: Mapped[str] = mapped_column(String(128))
    attempt: Mapped[int] = mapped_column(Integer)
    discarded: Mapped[int] = mapped_column(Integer)
    at: Mapped[datetime] = mapped_column(UtcDateTime())


class StateSchemaRow(Base):
    """The JSON schema of an agent's state model in a run, recorded when the run starts.

    Edited states are checked against it (when a run is forked with new states) without the
    program's code.
    """

    __tablename__ = "agentsnap_state_schemas"

    run_id: Mapped[str] = mapped_column(
        String(64), ForeignKey("agentsnap_runs.id", ondelete="CASCADE"), primary_key=True
    )
    agent: Mapped[str] = mapped_column(String(128), primary_key=True)
    json_schema: Mapped[Any] = mapped_column(Json(), nullable=False)


class RunLeaseRow(Base):
    """Who owns a run: one row per run that ever had an owner.

    The row is never deleted while the run exists: a released lease just expires, so that
    the fencing ``token`` only ever grows. Every write of an owner that fenced its store
    checks, in the same statement or transaction, that ``token`` is still its own.
    """

    __tablename__ = "agentsnap_run_leases"

    run_id: Mapped[str] = mapped_column(
        String(64), ForeignKey("agentsnap_runs.id", ondelete="CASCADE"), primary_key=True
    )
    owner: Mapped[str] = mapped_column(String(255))
    token: Mapped[int] = mapped_column(Integer)
    expires_at: Mapped[datetime] = mapped_column(UtcDateTime())
    renewed_at: Mapped[datetime] = mapped_column(UtcDateTime())


class RunOwnerRow(Base):
    """A run's history of owners: one row each time its lease was taken, by fencing token.

    Written in the transaction that takes the lease; the row of the owner it replaces is
    ended there too (``taken_over``), and a release ends the owner's row (``released``).
    See [`RunOwner`][agentsnap.RunOwner].
    """

    __tablename__ = "agentsnap_run_owners"

    run_id: Mapped[str] = mapped_column(
        String(64), ForeignKey("agentsnap_runs.id", ondelete="CASCADE"), primary_key=True
    )
    token: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    owner: Mapped[str] = mapped_column(String(255))
    acquired_at: Mapped[datetime] = mapped_column(UtcDateTime())
    ended_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    ended: Mapped[str | None] = mapped_column(String(16))
    last_renewed_at: Mapped[datetime | None] = mapped_column(UtcDateTime())


class SnapshotPartRow(Base):
    """One worker's part of a snapshot of a run spread over processes, written at once.

    ``body`` holds the part's cuts, channels in flight and stream offsets as JSON. The run's
    coordinator joins the parts into an ordinary snapshot once every process has its part;
    the parts stay, with the offsets a replay across processes starts from.
    """

    __tablename__ = "agentsnap_snapshot_parts"

    run_id: Mapped[str] = mapped_column(
        String(64), ForeignKey("agentsnap_runs.id", ondelete="CASCADE"), primary_key=True
    )
    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    worker: Mapped[str] = mapped_column(String(255), primary_key=True)
    body: Mapped[Any] = mapped_column(Json(), nullable=False)
    error: Mapped[str | None] = mapped_column(Text())
    written_at: Mapped[datetime] = mapped_column(UtcDateTime())


class AgentLeaseRow(Base):
    """Which worker hosts each agent of a run spread over processes, until when."""

    __tablename__ = "agentsnap_agent_leases"

    run_id: Mapped[str] = mapped_column(
        String(64), ForeignKey("agentsnap_runs.id", ondelete="CASCADE"), primary_key=True
    )
    agent: Mapped[str] = mapped_column(String(128), primary_key=True)
    owner: Mapped[str] = mapped_column(String(255))
    expires_at: Mapped[datetime] = mapped_column(UtcDateTime())


class ReplayRow(Base):
    """A segment of a run's replay log: deliveries and inputs since the previous segment.

    ``position`` numbers a run's segments from 1 in the order they were appended; ``body``
    is the segment's [`body`][agentsnap.records.ReplaySegment.body], the JSON text of its
    deliveries and inputs, stored as it is. On SQLite the table has no rowid: the primary
    key is its only b-tree.
    """

    __tablename__ = "agentsnap_replay"
    __table_args__ = {"sqlite_with_rowid": False}  # noqa: RUF012 (SQLAlchemy's declaration)

    run_id: Mapped[str] = mapped_column(
        String(64), ForeignKey("agentsnap_runs.id", ondelete="CASCADE"), primary_key=True
    )
    position: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    timeline: Mapped[int] = mapped_column(Integer)
    body: Mapped[str] = mapped_column(Text)


class ToolCallRow(Base):
    """The ledger: one side-effecting tool call per idempotency key.

    The key is the primary key, so two callers can never both claim it. Rows are never
    deleted or rolled back; ``status`` moves as described in
    [`ToolCallStatus`][agentsnap.ledger.ToolCallStatus]. There is no foreign key to the runs:
    a call may be made outside a run, or through a ledger in another database than the run.
    ``timeline`` is the run's timeline when the key was first claimed (``NULL`` outside a
    run, and for the rows claimed before the column existed). ``note`` is the progress note
    the running call kept with its claim (see [`ToolCall.note`][agentsnap.ToolCall.note]).
    """

    __tablename__ = "agentsnap_tool_calls"

    key: Mapped[str] = mapped_column(String(255), primary_key=True)
    run_id: Mapped[str | None] = mapped_column(String(64), index=True)
    agent: Mapped[str | None] = mapped_column(String(128))
    message_id: Mapped[str | None] = mapped_column(String(300))
    tool: Mapped[str] = mapped_column(String(128))
    fingerprint: Mapped[str] = mapped_column(String(64))
    arguments: Mapped[Any] = mapped_column(Json())
    status: Mapped[str] = mapped_column(String(24))
    owner: Mapped[str | None] = mapped_column(String(255))
    lease_until: Mapped[datetime | None] = mapped_column(UtcDateTime())
    attempts: Mapped[int] = mapped_column(Integer)
    result: Mapped[Any] = mapped_column(Json())
    error: Mapped[str | None] = mapped_column(Text)
    compensation: Mapped[Any] = mapped_column(Json())
    created_at: Mapped[datetime] = mapped_column(UtcDateTime())
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime())
    timeline: Mapped[int | None] = mapped_column(Integer)
    note: Mapped[Any] = mapped_column(Json(), server_default=text("'null'"))


class ModelCallRow(Base):
    """One model call of a handler: what it asked, and what the model answered.

    The primary key is the call's identity (see
    [`agentsnap.model_calls`][agentsnap.model_calls]), so a call is recorded once and a
    re-executed handler finds its answer by it. ``request``
    is the [`ModelRequest`][agentsnap.models.ModelRequest] as JSON with its ``messages``
    replaced by ``message_hashes``: the SHA-256 of each message's canonical JSON, whose text
    is in ``agentsnap_model_bodies``. A conversation grows by a message or two a call, so
    keeping every request whole would store it over and over (quadratic in its length);
    this way each distinct message of a run is stored once. As for the tool calls, there is
    no foreign key to the runs: the ledger may be in another database than the run.
    """

    __tablename__ = "agentsnap_model_calls"
    __table_args__ = (Index("ix_agentsnap_model_calls_run_id_started_at", "run_id", "started_at"),)

    run_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    agent: Mapped[str] = mapped_column(String(128), primary_key=True)
    message_id: Mapped[str] = mapped_column(String(300), primary_key=True)
    position: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    timeline: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    request: Mapped[Any] = mapped_column(Json())
    response: Mapped[Any] = mapped_column(Json())
    model: Mapped[str | None] = mapped_column(Text)
    input_tokens: Mapped[int] = mapped_column(Integer)
    output_tokens: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[datetime] = mapped_column(UtcDateTime())
    latency_ms: Mapped[float] = mapped_column(Float)
    replays: Mapped[int] = mapped_column(Integer, server_default=text("0"))


class ModelBodyRow(Base):
    """A message of a run's model calls, stored once per run and content.

    ``hash`` is the SHA-256 (hex) of ``body``, the message's canonical JSON text (sorted
    keys, compact). Rows are filed under their run so that they go with it.
    """

    __tablename__ = "agentsnap_model_bodies"

    run_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    body: Mapped[str] = mapped_column(Text)


class HumanRequestRow(Base):
    """A request to a person: a question a handler asked, or an approval a tool call awaits.

    ``id`` is derived from the step's identity (run, agent, message, position, timeline; see
    [`agentsnap.requests`][agentsnap.requests]), so a re-executed handler finds its request
    by it; the identity is kept beside it, and a run's requests are found through the
    ``(run_id, asked_at)`` index. ``status`` is ``pending`` until an answer, a rejection, the
    deadline or a rollback closes it; a close is one ``UPDATE … WHERE status = 'pending'``,
    so exactly one of several answers racing wins. No foreign key to the runs, as for the
    tool calls: the ledger may be in another database than the run.
    """

    __tablename__ = "agentsnap_requests"
    __table_args__ = (Index("ix_agentsnap_requests_run_id_asked_at", "run_id", "asked_at"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    run_id: Mapped[str] = mapped_column(String(64))
    agent: Mapped[str] = mapped_column(String(128))
    message_id: Mapped[str] = mapped_column(String(300))
    position: Mapped[int] = mapped_column(Integer)
    timeline: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(16))
    question: Mapped[Any] = mapped_column(Json())
    answer_schema: Mapped[Any] = mapped_column(Json())
    who: Mapped[str | None] = mapped_column(Text)
    deadline: Mapped[datetime | None] = mapped_column(UtcDateTime())
    on_deadline: Mapped[str] = mapped_column(String(16))
    default_answer: Mapped[Any] = mapped_column(Json())
    status: Mapped[str] = mapped_column(String(16))
    answer: Mapped[Any] = mapped_column(Json())
    reason: Mapped[str | None] = mapped_column(Text)
    answered_by: Mapped[str | None] = mapped_column(Text)
    asked_at: Mapped[datetime] = mapped_column(UtcDateTime())
    answered_at: Mapped[datetime | None] = mapped_column(UtcDateTime())


class _LangGraphThread:
    """The columns every LangGraph row's key starts with: the thread, and the namespace of
    its checkpoints within it (``""`` for the graph itself); first in the table too.
    """  # noqa: D205

    thread_id: Mapped[str] = mapped_column(Text, primary_key=True, sort_order=-1)
    checkpoint_ns: Mapped[str] = mapped_column(Text, primary_key=True, sort_order=-1)


class LangGraphCheckpointRow(_LangGraphThread, Base):
    """A LangGraph checkpoint, without its channel values (those are in the blobs).

    ``checkpoint`` and ``meta`` are the checkpoint and its metadata as encoded by the saver's
    serializer, whose type tag is in ``checkpoint_type`` and ``meta_type``. ``run_id`` is the
    metadata's ``run_id`` when it is a string (the LangGraph run that wrote the checkpoint),
    kept apart and indexed so that a run's checkpoints are found without decoding metadata
    (the index holds only the checkpoints that have one). On SQLite the table has no rowid:
    the primary key and that index are its only b-trees.
    """

    __tablename__ = "agentsnap_lg_checkpoints"
    __table_args__ = (
        Index(
            "ix_agentsnap_lg_checkpoints_run_id",
            "run_id",
            sqlite_where=text("run_id IS NOT NULL"),
            postgresql_where=text("run_id IS NOT NULL"),
        ),
        {"sqlite_with_rowid": False},
    )

    checkpoint_id: Mapped[str] = mapped_column(Text, primary_key=True)
    parent_checkpoint_id: Mapped[str | None] = mapped_column(Text)
    checkpoint_type: Mapped[str] = mapped_column(String(32))
    checkpoint: Mapped[bytes] = mapped_column(LargeBinary)
    meta_type: Mapped[str] = mapped_column(String(32))
    meta: Mapped[bytes] = mapped_column(LargeBinary)
    run_id: Mapped[str | None] = mapped_column(Text)


class LangGraphBlobRow(_LangGraphThread, Base):
    """One LangGraph channel value, stored once per version of its channel.

    ``value_type`` is ``"empty"`` for a channel that had no value at that version. A value
    that a task wrote refers to the write instead of holding a copy: ``value`` is ``NULL``
    and ``write_checkpoint_id``, ``write_task_id`` and ``write_idx`` name the entry of the
    ``agentsnap_lg_task_writes`` row (same thread and namespace) that holds it. On SQLite the
    table has no rowid: the primary key is its only b-tree.
    """

    __tablename__ = "agentsnap_lg_blobs"
    __table_args__ = {"sqlite_with_rowid": False}  # noqa: RUF012 (SQLAlchemy's declaration)

    channel: Mapped[str] = mapped_column(Text, primary_key=True)
    version: Mapped[str] = mapped_column(Text, primary_key=True)
    value_type: Mapped[str] = mapped_column(String(32))
    value: Mapped[bytes | None] = mapped_column(LargeBinary)
    write_checkpoint_id: Mapped[str | None] = mapped_column(Text)
    write_task_id: Mapped[str | None] = mapped_column(Text)
    write_idx: Mapped[int | None] = mapped_column(Integer, autoincrement=False)


class LangGraphTaskWritesRow(_LangGraphThread, Base):
    """The pending writes of one LangGraph task, recorded against the checkpoint they follow.

    One row per task rather than one per write: a super-step's task records its writes in one
    insert. ``writes`` is a msgpack array of ``[idx, channel, value_type, value]`` entries,
    one per index: ``idx`` is the write's position in the task's output, or LangGraph's
    negative index of a special channel (errors, interrupts…); ``value`` is the value as the
    saver's serializer encoded it, with its type tag in ``value_type``. On SQLite the table has
    no rowid: the primary key is its only b-tree.
    """

    __tablename__ = "agentsnap_lg_task_writes"
    __table_args__ = {"sqlite_with_rowid": False}  # noqa: RUF012 (SQLAlchemy's declaration)

    checkpoint_id: Mapped[str] = mapped_column(Text, primary_key=True)
    task_id: Mapped[str] = mapped_column(Text, primary_key=True)
    task_path: Mapped[str] = mapped_column(Text)
    writes: Mapped[bytes] = mapped_column(LargeBinary)
