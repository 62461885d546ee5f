"""message journal: one row per segment of a channel's sends or deliveries

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "agentsnap_journal",
        sa.Column("pos", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("src", sa.String(length=128), nullable=False),
        sa.Column("dst", sa.String(length=128), nullable=False),
        sa.Column("event", sa.String(length=16), nullable=False),
        sa.Column("first_seq", sa.Integer(), nullable=False),
        sa.Column("last_seq", sa.Integer(), nullable=False),
        sa.Column("entries", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["agentsnap_runs.id"],
            name=op.f("fk_agentsnap_journal_run_id_agentsnap_runs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("pos", name=op.f("pk_agentsnap_journal")),
    )
    op.create_index(
        "ix_agentsnap_journal_run_id_pos", "agentsnap_journal", ["run_id", "pos"], unique=False
    )


def downgrade() -> None:
    op.drop_index("ix_agentsnap_journal_run_id_pos", table_name="agentsnap_journal")
    op.drop_table("agentsnap_journal")
