"""run names, tags and status reasons: runs a person can find and tell apart

``agentsnap_runs`` gains ``name`` (indexed) and ``status_reason``, the one line saying why a
run ended as it did. ``agentsnap_run_tags`` holds a run's labels, one row per key, indexed by
key and value so that runs can be filtered by them.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-24
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("agentsnap_runs") as batch:
        batch.add_column(sa.Column("name", sa.String(length=128), nullable=True))
        batch.add_column(sa.Column("status_reason", sa.Text(), nullable=True))
        batch.create_index(batch.f("ix_agentsnap_runs_name"), ["name"], unique=False)
    op.create_table(
        "agentsnap_run_tags",
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("key", sa.String(length=128), nullable=False),
        sa.Column("value", sa.String(length=255), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["agentsnap_runs.id"],
            name=op.f("fk_agentsnap_run_tags_run_id_agentsnap_runs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("run_id", "key", name=op.f("pk_agentsnap_run_tags")),
    )
    op.create_index(
        "ix_agentsnap_run_tags_key_value", "agentsnap_run_tags", ["key", "value"], unique=False
    )


def downgrade() -> None:
    op.drop_index("ix_agentsnap_run_tags_key_value", table_name="agentsnap_run_tags")
    op.drop_table("agentsnap_run_tags")
    with op.batch_alter_table("agentsnap_runs") as batch:
        batch.drop_index(batch.f("ix_agentsnap_runs_name"))
        batch.drop_column("status_reason")
        batch.drop_column("name")
