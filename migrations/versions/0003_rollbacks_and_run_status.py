"""rollbacks, and the status of each run

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("agentsnap_runs", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("status", sa.String(length=16), server_default="running", nullable=False)
        )
        batch_op.add_column(sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True))

    op.create_table(
        "agentsnap_rollbacks",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("snapshot_id", sa.String(length=64), nullable=False),
        sa.Column("agent", sa.String(length=128), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("source", sa.String(length=128), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("discarded", sa.Integer(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["agentsnap_runs.id"],
            name=op.f("fk_agentsnap_rollbacks_run_id_agentsnap_runs"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["snapshot_id"],
            ["agentsnap_snapshots.id"],
            name=op.f("fk_agentsnap_rollbacks_snapshot_id_agentsnap_snapshots"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_agentsnap_rollbacks")),
    )
    op.create_index(
        op.f("ix_agentsnap_rollbacks_run_id"), "agentsnap_rollbacks", ["run_id"], unique=False
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_agentsnap_rollbacks_run_id"), table_name="agentsnap_rollbacks")
    op.drop_table("agentsnap_rollbacks")
    with op.batch_alter_table("agentsnap_runs", schema=None) as batch_op:
        batch_op.drop_column("finished_at")
        batch_op.drop_column("status")
