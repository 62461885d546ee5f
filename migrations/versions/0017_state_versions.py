"""state versions: each process's part of a snapshot records its state class's version

``agentsnap_snapshot_agents`` gains ``state_version``, the version of the agent's state class
the state was written with (see ``agentsnap.versions``), not null. Every row stored before it
reads 1, the version of a class that declares none. The downgrade drops the column: the
versions recorded since are lost, and every state reads as version 1 again.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

AGENTS = "agentsnap_snapshot_agents"


def upgrade() -> None:
    with op.batch_alter_table(AGENTS, schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("state_version", sa.Integer(), server_default=sa.text("1"), nullable=False)
        )


def downgrade() -> None:
    with op.batch_alter_table(AGENTS, schema=None) as batch_op:
        batch_op.drop_column("state_version")
