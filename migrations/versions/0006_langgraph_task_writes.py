"""langgraph task writes: one row per task's pending writes instead of one per write

Each row of ``agentsnap_lg_task_writes`` holds a task's writes as a msgpack array of
``[idx, channel, value_type, value]``. The upgrade moves the rows of ``agentsnap_lg_writes``
into it and the downgrade moves them back; either needs ``ormsgpack`` (installed with
LangGraph) only when there are pending writes to move.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-24
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import groupby
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

KEY = ("thread_id", "checkpoint_ns", "checkpoint_id", "task_id")
BATCH = 500

old_writes = sa.table(
    "agentsnap_lg_writes",
    *(sa.column(name) for name in KEY),
    sa.column("idx"),
    sa.column("channel"),
    sa.column("value_type"),
    sa.column("value"),
    sa.column("task_path"),
)
task_writes = sa.table(
    "agentsnap_lg_task_writes",
    *(sa.column(name) for name in KEY),
    sa.column("task_path"),
    sa.column("writes"),
)


def _key_columns() -> list[sa.Column[str]]:
    return [sa.Column(name, sa.Text(), nullable=False) for name in KEY]


def _msgpack() -> Any:
    try:
        import ormsgpack  # noqa: PLC0415 (only where there are writes to move)
    except ImportError as exc:
        raise RuntimeError(
            "moving LangGraph's pending writes needs ormsgpack: "
            "pip install 'agentsnap[langgraph]', then run the migration again"
        ) from exc
    return ormsgpack


def _batches(rows: Iterator[dict[str, Any]]) -> Iterator[list[dict[str, Any]]]:
    batch: list[dict[str, Any]] = []
    for row in rows:
        batch.append(row)
        if len(batch) == BATCH:
            yield batch
            batch = []
    if batch:
        yield batch


def upgrade() -> None:
    op.create_table(
        "agentsnap_lg_task_writes",
        *_key_columns(),
        sa.Column("task_path", sa.Text(), nullable=False),
        sa.Column("writes", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint(*KEY, name=op.f("pk_agentsnap_lg_task_writes")),
        sqlite_with_rowid=False,
    )
    bind = op.get_bind()
    found = bind.execute(
        sa.select(old_writes).order_by(*(old_writes.c[name] for name in KEY), old_writes.c.idx)
    ).mappings()

    def tasks() -> Iterator[dict[str, Any]]:
        packb = None
        for key, group in groupby(found, key=lambda row: tuple(row[name] for name in KEY)):
            rows = list(group)
            packb = packb or _msgpack().packb
            yield {
                **dict(zip(KEY, key, strict=True)),
                "task_path": rows[-1]["task_path"],
                "writes": packb(
                    [[r["idx"], r["channel"], r["value_type"], bytes(r["value"])] for r in rows]
                ),
            }

    for batch in _batches(tasks()):
        bind.execute(sa.insert(task_writes), batch)
    op.drop_table("agentsnap_lg_writes")


def downgrade() -> None:
    op.create_table(
        "agentsnap_lg_writes",
        *_key_columns(),
        sa.Column("idx", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("channel", sa.Text(), nullable=False),
        sa.Column("value_type", sa.String(length=32), nullable=False),
        sa.Column("value", sa.LargeBinary(), nullable=False),
        sa.Column("task_path", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint(*KEY, "idx", name=op.f("pk_agentsnap_lg_writes")),
    )
    bind = op.get_bind()
    found = bind.execute(sa.select(task_writes)).mappings()

    def writes() -> Iterator[dict[str, Any]]:
        unpackb = None
        for row in found:
            unpackb = unpackb or _msgpack().unpackb
            for idx, channel, value_type, value in unpackb(bytes(row["writes"])):
                yield {
                    **{name: row[name] for name in KEY},
                    "idx": idx,
                    "channel": channel,
                    "value_type": value_type,
                    "value": value,
                    "task_path": row["task_path"],
                }

    for batch in _batches(writes()):
        bind.execute(sa.insert(old_writes), batch)
    op.drop_table("agentsnap_lg_task_writes")
