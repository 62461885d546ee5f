"""tool ledger: one row per side-effecting tool call, keyed by its idempotency key

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-22
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "agentsnap_tool_calls",
        sa.Column("key", sa.String(length=255), nullable=False),
        sa.Column("run_id", sa.String(length=64), nullable=True),
        sa.Column("agent", sa.String(length=128), nullable=True),
        sa.Column("message_id", sa.String(length=300), nullable=True),
        sa.Column("tool", sa.String(length=128), nullable=False),
        sa.Column("fingerprint", sa.String(length=64), nullable=False),
        sa.Column("arguments", sa.Text(), nullable=False),
        sa.Column("status", sa.String(length=24), nullable=False),
        sa.Column("owner", sa.String(length=255), nullable=True),
        sa.Column("lease_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("result", sa.Text(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("compensation", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_agentsnap_tool_calls")),
    )
    op.create_index(
        op.f("ix_agentsnap_tool_calls_run_id"), "agentsnap_tool_calls", ["run_id"], unique=False
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_agentsnap_tool_calls_run_id"), table_name="agentsnap_tool_calls")
    op.drop_table("agentsnap_tool_calls")
