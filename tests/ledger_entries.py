"""A ledger entry as a tool call's claim makes it, for tests that claim keys by hand."""

from __future__ import annotations

from datetime import datetime, timedelta

from agentsnap.ledger import LedgerEntry, ToolCallStatus, owner_id
from agentsnap.records import utcnow


def claim_of(
    key: str,
    run_id: str,
    *,
    owner: str | None = None,
    at: datetime | None = None,
    agent: str = "writer",
) -> LedgerEntry:
    """The in-progress entry that claims ``key`` for a call of ``charge(amount=5)``.

    By default it is this process's claim, made now, with a lease of five minutes.
    """
    now = at or utcnow()
    return LedgerEntry(
        key=key,
        tool="charge",
        fingerprint="f" * 64,
        arguments={"amount": 5},
        status=ToolCallStatus.IN_PROGRESS,
        created_at=now,
        updated_at=now,
        run_id=run_id,
        agent=agent,
        message_id=f"$env>{agent}#1",
        owner=owner or owner_id(),
        lease_until=now + timedelta(minutes=5),
        attempts=1,
    )
