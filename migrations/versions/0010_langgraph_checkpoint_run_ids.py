"""LangGraph checkpoints name their run: ``run_id`` on ``agentsnap_lg_checkpoints``, indexed

The LangGraph saver deletes a LangGraph run's checkpoints (``delete_for_runs``) by the
``run_id`` of their metadata. Metadata is stored encoded (JSON or msgpack), which SQL cannot
search without decoding every row, so the run id gets a column of its own, with an index.

The upgrade fills the column for the checkpoints already stored: from metadata stored as
JSON in SQL, and from metadata stored as msgpack by reading its plain fields with ``ormsgpack``
(installed with LangGraph; without it those rows are left without a run id). Nothing is
unpickled and no class is imported: msgpack extension values are skipped.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-25
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLE = "agentsnap_lg_checkpoints"
INDEX = "ix_agentsnap_lg_checkpoints_run_id"
KEY = ("thread_id", "checkpoint_ns", "checkpoint_id")


def upgrade() -> None:
    with op.batch_alter_table(TABLE) as batch:
        batch.add_column(sa.Column("run_id", sa.Text(), nullable=True))
        batch.create_index(batch.f(INDEX), ["run_id"], unique=False)
    bind = op.get_bind()
    if bind.dialect.name == "sqlite":
        document = "CAST(meta AS TEXT)"
        op.execute(
            f"UPDATE {TABLE} SET run_id = json_extract({document}, '$.run_id') "  # noqa: S608
            f"WHERE meta_type = 'json' AND json_type({document}, '$.run_id') = 'text'"
        )
    else:
        document = "convert_from(meta, 'UTF8')::jsonb"
        op.execute(
            f"UPDATE {TABLE} SET run_id = {document} ->> 'run_id' "  # noqa: S608
            f"WHERE meta_type = 'json' AND jsonb_typeof({document} -> 'run_id') = 'string'"
        )
    _fill_from_msgpack(bind)


def _fill_from_msgpack(bind: sa.Connection) -> None:
    try:
        import ormsgpack  # noqa: PLC0415 (installed with LangGraph, which is optional)
    except ImportError:
        return
    table = sa.table(TABLE, *(sa.column(name) for name in (*KEY, "meta_type", "meta", "run_id")))
    rows = bind.execute(
        sa.select(*(table.c[name] for name in KEY), table.c.meta).where(
            table.c.meta_type == "msgpack"
        )
    )
    found: list[dict[str, Any]] = []
    for *key, meta in rows:
        try:
            metadata = ormsgpack.unpackb(bytes(meta), ext_hook=lambda code, data: None)
        except (TypeError, ValueError):  # not msgpack after all: leave the row as it is
            continue
        run_id = metadata.get("run_id") if isinstance(metadata, dict) else None
        if isinstance(run_id, str):
            found.append({**dict(zip(("t", "ns", "id"), key, strict=True)), "value": run_id})
    if found:
        bind.execute(
            table.update()
            .where(
                table.c.thread_id == sa.bindparam("t"),
                table.c.checkpoint_ns == sa.bindparam("ns"),
                table.c.checkpoint_id == sa.bindparam("id"),
            )
            .values(run_id=sa.bindparam("value")),
            found,
        )


def downgrade() -> None:
    with op.batch_alter_table(TABLE) as batch:
        batch.drop_index(batch.f(INDEX))
        batch.drop_column("run_id")
