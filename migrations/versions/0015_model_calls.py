"""model calls: each handler's model calls by their identity, and the ledger's timelines

``agentsnap_model_calls`` holds one row per model call, keyed by its identity (run, agent,
message, position, timeline), with the answer and a request whose messages are named by
hash; ``agentsnap_model_bodies`` holds each distinct message of a run once, by the SHA-256 of
its canonical JSON. ``agentsnap_tool_calls`` gains ``timeline``: the run's timeline when a key
was first claimed, ``NULL`` for every row claimed before. The downgrade drops the tables and
the column.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TOOL_CALLS = "agentsnap_tool_calls"
MODEL_CALLS = "agentsnap_model_calls"
MODEL_BODIES = "agentsnap_model_bodies"
INDEX = "ix_agentsnap_model_calls_run_id_started_at"


def upgrade() -> None:
    with op.batch_alter_table(TOOL_CALLS, schema=None) as batch_op:
        batch_op.add_column(sa.Column("timeline", sa.Integer(), nullable=True))
    op.create_table(
        MODEL_CALLS,
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("agent", sa.String(length=128), nullable=False),
        sa.Column("message_id", sa.String(length=300), nullable=False),
        sa.Column("position", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("timeline", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("request", sa.Text(), nullable=False),
        sa.Column("response", sa.Text(), nullable=False),
        sa.Column("model", sa.Text(), nullable=True),
        sa.Column("input_tokens", sa.Integer(), nullable=False),
        sa.Column("output_tokens", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("latency_ms", sa.Float(), nullable=False),
        sa.Column("replays", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.PrimaryKeyConstraint(
            "run_id",
            "agent",
            "message_id",
            "position",
            "timeline",
            name=op.f("pk_agentsnap_model_calls"),
        ),
    )
    op.create_index(INDEX, MODEL_CALLS, ["run_id", "started_at"], unique=False)
    op.create_table(
        MODEL_BODIES,
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("hash", sa.String(length=64), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("run_id", "hash", name=op.f("pk_agentsnap_model_bodies")),
    )


def downgrade() -> None:
    op.drop_table(MODEL_BODIES)
    op.drop_index(INDEX, table_name=MODEL_CALLS)
    op.drop_table(MODEL_CALLS)
    with op.batch_alter_table(TOOL_CALLS, schema=None) as batch_op:
        batch_op.drop_column("timeline")
