"""langgraph values once: a channel value that a task wrote refers to the write

``agentsnap_lg_blobs`` gains ``write_checkpoint_id``, ``write_task_id`` and ``write_idx``
(``NULL`` for a value stored in its own row, as every value stored before is): a value equal
to a task's pending write is then stored once, in ``agentsnap_lg_task_writes``. On SQLite the
table is rebuilt without a rowid, its primary key being its only b-tree. The downgrade copies
each referred value back into its row (which needs ``ormsgpack``, installed with LangGraph,
only when there are such values) and drops the columns.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-27
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLE = "agentsnap_lg_blobs"
KEY = ("thread_id", "checkpoint_ns", "channel", "version")
VALUE_COLUMNS = ("value_type", "value")
REFERENCE = ("write_checkpoint_id", "write_task_id", "write_idx")
WRITES_KEY = ("thread_id", "checkpoint_ns", "checkpoint_id", "task_id")

blobs = sa.table(TABLE, *(sa.column(name) for name in (*KEY, *VALUE_COLUMNS, *REFERENCE)))
task_writes = sa.table(
    "agentsnap_lg_task_writes", *(sa.column(name) for name in WRITES_KEY), sa.column("writes")
)


def _columns(with_reference: bool) -> list[sa.Column[Any]]:
    columns: list[sa.Column[Any]] = [sa.Column(name, sa.Text(), nullable=False) for name in KEY]
    columns += [
        sa.Column("value_type", sa.String(length=32), nullable=False),
        sa.Column("value", sa.LargeBinary(), nullable=True),
    ]
    if with_reference:
        columns += [
            sa.Column("write_checkpoint_id", sa.Text(), nullable=True),
            sa.Column("write_task_id", sa.Text(), nullable=True),
            sa.Column("write_idx", sa.Integer(), autoincrement=False, nullable=True),
        ]
    return columns


def _rebuild_sqlite(with_reference: bool) -> None:
    """Rebuild the SQLite table with or without the reference (and with or without rowid)."""
    names = [*KEY, *VALUE_COLUMNS]
    op.create_table(
        f"_new_{TABLE}",
        *_columns(with_reference),
        sa.PrimaryKeyConstraint(*KEY, name=op.f(f"pk_{TABLE}")),
        sqlite_with_rowid=not with_reference,
    )
    listed = ", ".join(names)
    op.execute(f"INSERT INTO _new_{TABLE} ({listed}) SELECT {listed} FROM {TABLE}")  # noqa: S608
    op.drop_table(TABLE)
    op.rename_table(f"_new_{TABLE}", TABLE)


def upgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        _rebuild_sqlite(with_reference=True)
        return
    for column in _columns(with_reference=True)[len(KEY) + len(VALUE_COLUMNS) :]:
        op.add_column(TABLE, column)


def _copy_values_back() -> None:
    """Store each referred value in its own row again (a row whose write is gone is deleted)."""
    bind = op.get_bind()
    found = bind.execute(
        sa.select(*(blobs.c[name] for name in KEY), blobs.c.write_idx, task_writes.c.writes)
        .select_from(
            blobs.outerjoin(
                task_writes,
                sa.and_(
                    task_writes.c.thread_id == blobs.c.thread_id,
                    task_writes.c.checkpoint_ns == blobs.c.checkpoint_ns,
                    task_writes.c.checkpoint_id == blobs.c.write_checkpoint_id,
                    task_writes.c.task_id == blobs.c.write_task_id,
                ),
            )
        )
        .where(blobs.c.write_idx.is_not(None))
    ).all()
    if not found:
        return
    try:
        import ormsgpack  # noqa: PLC0415 (only where there are values to copy)
    except ImportError as exc:
        raise RuntimeError(
            "copying LangGraph's channel values back needs ormsgpack: "
            "pip install 'agentsnap[langgraph]', then run the migration again"
        ) from exc
    where = sa.and_(*(blobs.c[name] == sa.bindparam(f"k_{name}") for name in KEY))
    for *key, idx, writes in found:
        bound = {f"k_{name}": value for name, value in zip(KEY, key, strict=True)}
        value = None
        if writes is not None:
            value = next(
                (entry[3] for entry in ormsgpack.unpackb(bytes(writes)) if entry[0] == idx), None
            )
        if value is None:
            bind.execute(sa.delete(blobs).where(where), bound)
        else:
            bind.execute(
                sa.update(blobs)
                .where(where)
                .values(value=value, write_checkpoint_id=None, write_task_id=None, write_idx=None),
                bound,
            )


def downgrade() -> None:
    _copy_values_back()
    if op.get_bind().dialect.name == "sqlite":
        _rebuild_sqlite(with_reference=False)
        return
    for name in reversed(REFERENCE):
        op.drop_column(TABLE, name)
