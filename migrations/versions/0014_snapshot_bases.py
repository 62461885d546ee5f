"""snapshot bases: a snapshot may hold only the agent rows that changed since a full one

``agentsnap_snapshots`` gains ``base_id`` (a foreign key to the full snapshot of the same run
whose agent rows the snapshot extends, indexed) and ``agent_rows`` (how many agent rows such a
snapshot holds itself). Both are ``NULL`` for every snapshot stored before, each of which
holds a row per process. The downgrade first copies into each snapshot stored against a base
the base's rows of the processes it holds no row of, so that every snapshot is full again,
then drops the columns.

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-28
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SNAPSHOTS = "agentsnap_snapshots"
AGENTS = "agentsnap_snapshot_agents"
FOREIGN_KEY = "fk_agentsnap_snapshots_base_id_agentsnap_snapshots"
INDEX = "ix_agentsnap_snapshots_base_id"

snapshots = sa.table(SNAPSHOTS, sa.column("id"), sa.column("base_id"))
agents = sa.table(
    AGENTS,
    *(sa.column(name) for name in ("snapshot_id", "agent", "state_hash", "sent", "received")),
)


def upgrade() -> None:
    with op.batch_alter_table(SNAPSHOTS, schema=None) as batch_op:
        batch_op.add_column(sa.Column("base_id", sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column("agent_rows", sa.Integer(), nullable=True))
        batch_op.create_foreign_key(op.f(FOREIGN_KEY), SNAPSHOTS, ["base_id"], ["id"])
        batch_op.create_index(op.f(INDEX), ["base_id"], unique=False)


def _materialize() -> None:
    """Give every snapshot stored against a base the base's rows it does not hold itself."""
    base = agents.alias("base")
    own = agents.alias("own")
    inherited = (
        sa.select(snapshots.c.id, base.c.agent, base.c.state_hash, base.c.sent, base.c.received)
        .select_from(snapshots.join(base, base.c.snapshot_id == snapshots.c.base_id))
        .where(
            snapshots.c.base_id.is_not(None),
            ~sa.select(sa.literal_column("1"))
            .where(own.c.snapshot_id == snapshots.c.id, own.c.agent == base.c.agent)
            .exists(),
        )
    )
    op.execute(
        agents.insert().from_select(
            ["snapshot_id", "agent", "state_hash", "sent", "received"], inherited
        )
    )


def downgrade() -> None:
    _materialize()
    with op.batch_alter_table(SNAPSHOTS, schema=None) as batch_op:
        batch_op.drop_index(op.f(INDEX))
        batch_op.drop_constraint(op.f(FOREIGN_KEY), type_="foreignkey")
        batch_op.drop_column("agent_rows")
        batch_op.drop_column("base_id")
