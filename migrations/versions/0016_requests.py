"""requests to people: questions handlers ask and approvals side-effecting calls await

``agentsnap_requests`` holds one row per request, keyed by an id derived from the step's
identity (run, agent, message, position, timeline), with the question, the answer's schema,
the deadline and its outcome, and the answer once given. The downgrade drops the table.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-09
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

REQUESTS = "agentsnap_requests"
INDEX = "ix_agentsnap_requests_run_id_asked_at"


def upgrade() -> None:
    op.create_table(
        REQUESTS,
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("agent", sa.String(length=128), nullable=False),
        sa.Column("message_id", sa.String(length=300), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("timeline", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("question", sa.Text(), nullable=False),
        sa.Column("answer_schema", sa.Text(), nullable=False),
        sa.Column("who", sa.Text(), nullable=True),
        sa.Column("deadline", sa.DateTime(timezone=True), nullable=True),
        sa.Column("on_deadline", sa.String(length=16), nullable=False),
        sa.Column("default_answer", sa.Text(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("answer", sa.Text(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("answered_by", sa.Text(), nullable=True),
        sa.Column("asked_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("answered_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_agentsnap_requests")),
    )
    op.create_index(INDEX, REQUESTS, ["run_id", "asked_at"], unique=False)


def downgrade() -> None:
    op.drop_index(INDEX, table_name=REQUESTS)
    op.drop_table(REQUESTS)
