"""initial schema: runs, snapshots, state blobs, in-flight messages

Revision ID: 0001
Revises:
Create Date: 2026-11-22
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "agentsnap_runs",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("parent_run_id", sa.String(length=64), nullable=True),
        sa.Column("parent_snapshot_id", sa.String(length=64), nullable=True),
        sa.Column(
            "metadata",
            sa.Text(),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_agentsnap_runs")),
    )
    op.create_table(
        "agentsnap_state_blobs",
        sa.Column("hash", sa.String(length=64), nullable=False),
        sa.Column("state", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("hash", name=op.f("pk_agentsnap_state_blobs")),
    )
    op.create_table(
        "agentsnap_snapshots",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("initiator", sa.String(length=128), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("completed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["agentsnap_runs.id"],
            name=op.f("fk_agentsnap_snapshots_run_id_agentsnap_runs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_agentsnap_snapshots")),
        sa.UniqueConstraint("run_id", "seq", name=op.f("uq_agentsnap_snapshots_run_id")),
    )
    with op.batch_alter_table("agentsnap_snapshots", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_agentsnap_snapshots_run_id"), ["run_id"], unique=False)

    op.create_table(
        "agentsnap_snapshot_agents",
        sa.Column("snapshot_id", sa.String(length=64), nullable=False),
        sa.Column("agent", sa.String(length=128), nullable=False),
        sa.Column("state_hash", sa.String(length=64), nullable=False),
        sa.Column(
            "sent",
            sa.Text(),
            nullable=False,
        ),
        sa.Column(
            "received",
            sa.Text(),
            nullable=False,
        ),
        sa.ForeignKeyConstraint(
            ["snapshot_id"],
            ["agentsnap_snapshots.id"],
            name=op.f("fk_agentsnap_snapshot_agents_snapshot_id_agentsnap_snapshots"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["state_hash"],
            ["agentsnap_state_blobs.hash"],
            name=op.f("fk_agentsnap_snapshot_agents_state_hash_agentsnap_state_blobs"),
        ),
        sa.PrimaryKeyConstraint("snapshot_id", "agent", name=op.f("pk_agentsnap_snapshot_agents")),
    )
    with op.batch_alter_table("agentsnap_snapshot_agents", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_agentsnap_snapshot_agents_state_hash"), ["state_hash"], unique=False
        )

    op.create_table(
        "agentsnap_snapshot_messages",
        sa.Column("snapshot_id", sa.String(length=64), nullable=False),
        sa.Column("src", sa.String(length=128), nullable=False),
        sa.Column("dst", sa.String(length=128), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=128), nullable=False),
        sa.Column(
            "payload",
            sa.Text(),
            nullable=False,
        ),
        sa.Column(
            "headers",
            sa.Text(),
            nullable=False,
        ),
        sa.Column("epoch", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["snapshot_id"],
            ["agentsnap_snapshots.id"],
            name=op.f("fk_agentsnap_snapshot_messages_snapshot_id_agentsnap_snapshots"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint(
            "snapshot_id", "src", "dst", "seq", name=op.f("pk_agentsnap_snapshot_messages")
        ),
    )


def downgrade() -> None:
    op.drop_table("agentsnap_snapshot_messages")
    with op.batch_alter_table("agentsnap_snapshot_agents", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_agentsnap_snapshot_agents_state_hash"))

    op.drop_table("agentsnap_snapshot_agents")
    with op.batch_alter_table("agentsnap_snapshots", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_agentsnap_snapshots_run_id"))

    op.drop_table("agentsnap_snapshots")
    op.drop_table("agentsnap_state_blobs")
    op.drop_table("agentsnap_runs")
