"""state chunks: long arrays of agent states stored once, in shared content-addressed chunks

``agentsnap_state_blobs`` gains ``lists`` and ``roots``, ``NULL`` for a state stored whole
(every state stored before this revision); ``agentsnap_state_chunks`` holds the leaves and
tree nodes that the long arrays of longer states are stored in (see
``agentsnap.store.chunks``). Nothing stored changes on the upgrade. The downgrade first
writes every chunked state whole again (a state whose chunks are missing or damaged keeps
its text without them, and stays damaged), then drops the chunks.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-25
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from agentsnap.store.chunks import StateLoader

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_BATCH = 200


def upgrade() -> None:
    with op.batch_alter_table("agentsnap_state_blobs") as batch:
        batch.add_column(sa.Column("lists", sa.Text(), nullable=True))
        batch.add_column(sa.Column("roots", sa.Text(), nullable=True))
    op.create_table(
        "agentsnap_state_chunks",
        sa.Column("hash", sa.String(length=64), nullable=False),
        sa.Column("height", sa.Integer(), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("hash", name=op.f("pk_agentsnap_state_chunks")),
    )


def downgrade() -> None:
    connection = op.get_bind()
    chunked = [
        row[0]
        for row in connection.execute(
            sa.text("SELECT hash FROM agentsnap_state_blobs WHERE roots IS NOT NULL ORDER BY hash")
        )
    ]
    loader = StateLoader()
    for start in range(0, len(chunked), _BATCH):
        loaded = loader.load_sync(connection, chunked[start : start + _BATCH])
        if loaded.texts:
            connection.execute(
                sa.text(
                    "UPDATE agentsnap_state_blobs SET state = :state, lists = NULL, roots = NULL "
                    "WHERE hash = :hash"
                ),
                [{"hash": key, "state": state} for key, state in loaded.texts.items()],
            )
    op.drop_table("agentsnap_state_chunks")
    with op.batch_alter_table("agentsnap_state_blobs") as batch:
        batch.drop_column("roots")
        batch.drop_column("lists")
