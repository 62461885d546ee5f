"""snapshot parts and agent leases: runs spread over processes

``agentsnap_snapshot_parts`` holds, per snapshot of a run spread over processes, each
worker's part (its processes' cuts, the channels into them, and the stream offsets of the
channels from other processes), written by the worker in one transaction; the run's
coordinator joins the parts into an ordinary snapshot once every process has its part.
``agentsnap_agent_leases`` says which worker hosts each agent of such a run, until when.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-27
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "agentsnap_snapshot_parts",
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("seq", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("worker", sa.String(length=255), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("written_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["agentsnap_runs.id"],
            name=op.f("fk_agentsnap_snapshot_parts_run_id_agentsnap_runs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint(
            "run_id", "seq", "worker", name=op.f("pk_agentsnap_snapshot_parts")
        ),
    )
    op.create_table(
        "agentsnap_agent_leases",
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("agent", sa.String(length=128), nullable=False),
        sa.Column("owner", sa.String(length=255), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["agentsnap_runs.id"],
            name=op.f("fk_agentsnap_agent_leases_run_id_agentsnap_runs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("run_id", "agent", name=op.f("pk_agentsnap_agent_leases")),
    )


def downgrade() -> None:
    op.drop_table("agentsnap_agent_leases")
    op.drop_table("agentsnap_snapshot_parts")
