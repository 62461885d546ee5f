"""tool call notes: a running side-effecting call's progress note, kept with its claim

``agentsnap_tool_calls`` gains ``note``, JSON text (``null`` for none): what a running call
keeps with its claim to be taken over without starting its effect again (a remote job's id, see
``ToolCall.note``). Rows stored before it read ``null``. The downgrade drops the column: the
notes kept since are lost, and a call taken over after a crash finds none.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TOOL_CALLS = "agentsnap_tool_calls"


def upgrade() -> None:
    with op.batch_alter_table(TOOL_CALLS, schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("note", sa.Text(), server_default=sa.text("'null'"), nullable=False)
        )


def downgrade() -> None:
    with op.batch_alter_table(TOOL_CALLS, schema=None) as batch_op:
        batch_op.drop_column("note")
