"""Agents' state schemas: ``agentsnap_state_schemas``, one JSON schema per run and agent

A runtime records the JSON schema of each agent's state model when it first writes a run, so
that edited states (a fork with new states, from the inspector or the command line) are
checked without the program's code. Runs stored before have no schemas: their edits are
checked only for being JSON objects.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-25
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "agentsnap_state_schemas",
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("agent", sa.String(length=128), nullable=False),
        sa.Column("json_schema", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["agentsnap_runs.id"],
            name=op.f("fk_agentsnap_state_schemas_run_id_agentsnap_runs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("run_id", "agent", name=op.f("pk_agentsnap_state_schemas")),
    )


def downgrade() -> None:
    op.drop_table("agentsnap_state_schemas")
