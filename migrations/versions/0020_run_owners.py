"""run owners: each run keeps the history of who took its lease, when, and how it ended

``agentsnap_run_owners`` holds one row per lease taken, keyed by run and fencing token: the
owner (``host:pid:token``), when it took the lease, and, once it ended, when and how
(``released``, or ``taken_over`` by the next owner) with the lease's last renewal before.
Runs from before this revision have no rows for their earlier owners. The downgrade drops
the table and the history it held.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OWNERS = "agentsnap_run_owners"


def upgrade() -> None:
    op.create_table(
        OWNERS,
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("token", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("owner", sa.String(length=255), nullable=False),
        sa.Column("acquired_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("ended", sa.String(length=16), nullable=True),
        sa.Column("last_renewed_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["agentsnap_runs.id"],
            name=op.f("fk_agentsnap_run_owners_run_id_agentsnap_runs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("run_id", "token", name=op.f("pk_agentsnap_run_owners")),
    )


def downgrade() -> None:
    op.drop_table(OWNERS)
