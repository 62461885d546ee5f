"""langgraph values once: a channel value that a task wrote refers to the write

``agentsnap_lg_blobs`` gains ``write_checkpoint_id``, ``write_task_id`` and ``write_idx``
(``NULL`` for a value stored in its own row, as every value stored before is): a value equal
to a task's pending write is then stored once, in ``agentsnap_lg_task_writes``. The index on
``agentsnap_lg_checkpoints.run_id`` keeps only the checkpoints that have a run id (the only
ones it is searched for). On SQLite both tables are rebuilt without a rowid, their primary
key being their only b-tree. The downgrade copies each referred value back into its row
(which needs ``ormsgpack``, installed with LangGraph, only when there are such values), drops
the columns and indexes every checkpoint's run id again.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-27
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
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


CHECKPOINTS = "agentsnap_lg_checkpoints"
CHECKPOINT_KEY = ("thread_id", "checkpoint_ns", "checkpoint_id")
RUN_INDEX = "ix_agentsnap_lg_checkpoints_run_id"
HAS_RUN = "run_id IS NOT NULL"


def _checkpoint_columns() -> list[sa.Column[Any]]:
    return [
        *(sa.Column(name, sa.Text(), nullable=False) for name in CHECKPOINT_KEY),
        sa.Column("parent_checkpoint_id", sa.Text(), nullable=True),
        sa.Column("checkpoint_type", sa.String(length=32), nullable=False),
        sa.Column("checkpoint", sa.LargeBinary(), nullable=False),
        sa.Column("meta_type", sa.String(length=32), nullable=False),
        sa.Column("meta", sa.LargeBinary(), nullable=False),
        sa.Column("run_id", sa.Text(), nullable=True),
    ]


def _rebuild_sqlite(
    name: str, key: Sequence[str], columns: list[sa.Column[Any]], *, rowid: bool
) -> None:
    """Rebuild an SQLite table with ``columns`` (those it shares with the old one copied)."""
    op.create_table(
        f"_new_{name}",
        *columns,
        sa.PrimaryKeyConstraint(*key, name=op.f(f"pk_{name}")),
        sqlite_with_rowid=rowid,
    )
    found = {column["name"] for column in sa.inspect(op.get_bind()).get_columns(name)}
    listed = ", ".join(column.name for column in columns if column.name in found)
    op.execute(f"INSERT INTO _new_{name} ({listed}) SELECT {listed} FROM {name}")  # noqa: S608
    op.drop_table(name)
    op.rename_table(f"_new_{name}", name)


def _index_runs(*, only_with_run: bool) -> None:
    where = sa.text(HAS_RUN) if only_with_run else None
    op.create_index(
        op.f(RUN_INDEX), CHECKPOINTS, ["run_id"], sqlite_where=where, postgresql_where=where
    )


def upgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        _rebuild_sqlite(TABLE, KEY, _columns(with_reference=True), rowid=False)
        _rebuild_sqlite(CHECKPOINTS, CHECKPOINT_KEY, _checkpoint_columns(), rowid=False)
    else:
        for column in _columns(with_reference=True)[len(KEY) + len(VALUE_COLUMNS) :]:
            op.add_column(TABLE, column)
        op.drop_index(op.f(RUN_INDEX), table_name=CHECKPOINTS)
    _index_runs(only_with_run=True)


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
        _rebuild_sqlite(TABLE, KEY, _columns(with_reference=False), rowid=True)
        _rebuild_sqlite(CHECKPOINTS, CHECKPOINT_KEY, _checkpoint_columns(), rowid=True)
    else:
        for name in reversed(REFERENCE):
            op.drop_column(TABLE, name)
        op.drop_index(op.f(RUN_INDEX), table_name=CHECKPOINTS)
    _index_runs(only_with_run=False)
