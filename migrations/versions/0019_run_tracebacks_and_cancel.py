"""run tracebacks and cancel requests: a failed run keeps its tracebacks; a run can be asked to stop

``agentsnap_runs`` gains ``traceback`` (text, null: the tracebacks of a failed run's handler
failures and of the exception that ended it, size-bounded) and ``cancel_requested`` (text,
null: why someone asked the run to stop, until its owner stops it or it is resumed). Rows
stored before read null in both. The downgrade drops both columns, and what they held.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

RUNS = "agentsnap_runs"


def upgrade() -> None:
    with op.batch_alter_table(RUNS, schema=None) as batch_op:
        batch_op.add_column(sa.Column("traceback", sa.Text(), nullable=True))
        batch_op.add_column(sa.Column("cancel_requested", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table(RUNS, schema=None) as batch_op:
        batch_op.drop_column("cancel_requested")
        batch_op.drop_column("traceback")
