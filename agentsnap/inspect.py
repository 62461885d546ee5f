"""Read-only views of what runs left in a store, shared by Python code and the CLI.

Example:
    ```python
    import asyncio
    import json

    from agentsnap import MemoryStore, Runtime
    from agentsnap.inspect import export_run

    async def main() -> None:
        store = MemoryStore()
        async with Runtime(store=store) as runtime:
            await runtime.snapshot()
        document = await export_run(store, runtime.run_id)
        print(json.dumps(document, indent=2))

    asyncio.run(main())
    ```

The export document is described, key by key, in ``docs/reference/export.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agentsnap.journal import read_journal
from agentsnap.store.ledger import ledger_for

if TYPE_CHECKING:
    from datetime import datetime

    from agentsnap.records import JournalMessage, RollbackInfo, RunInfo, Snapshot
    from agentsnap.store import Store
    from agentsnap.tools import Ledger, LedgerEntry

__all__ = ["EXPORT_FORMAT", "export_run"]

EXPORT_FORMAT = 1
"""Version of the export document's layout, in its ``"format"`` key."""


async def export_run(store: Store, run_id: str, ledger: Ledger | None = None) -> dict[str, Any]:
    """Everything a store holds about a run, as one JSON-ready document.

    The ``"messages"`` key is present only when the run kept a journal. ``"tool_calls"``
    lists the run's side-effecting tool calls from ``ledger``: by default the ledger in the
    store's database (an ``SqlStore``'s), none for other stores.

    Raises:
        NotFoundError: The store holds no such run.
    """
    run = await store.get_run(run_id)
    snapshots = await store.list_snapshots(run_id)
    document: dict[str, Any] = {
        "format": EXPORT_FORMAT,
        "run": _run(run),
        "snapshots": [_snapshot(snapshot) for snapshot in snapshots],
        "rollbacks": [_rollback(r) for r in await store.list_rollbacks(run_id)],
    }
    document["tool_calls"] = [
        _tool_call(entry) for entry in await _ledger_calls(store, run_id, ledger)
    ]
    segments = await store.load_journal(run_id)
    if segments:
        document["messages"] = [_message(m) for m in read_journal(segments)]
    return document


async def _ledger_calls(store: Store, run_id: str, ledger: Ledger | None) -> list[LedgerEntry]:
    if ledger is not None:
        return await ledger.list_calls(run_id)
    opened = ledger_for(store, create=False)
    if opened is None:
        return []
    try:
        return await opened.list_calls(run_id)
    finally:
        await opened.close()


def _tool_call(entry: LedgerEntry) -> dict[str, Any]:
    return {
        "key": entry.key,
        "run": entry.run_id,
        "agent": entry.agent,
        "message": entry.message_id,
        "tool": entry.tool,
        "arguments": entry.arguments,
        "fingerprint": entry.fingerprint,
        "status": entry.status.value,
        "attempts": entry.attempts,
        "result": entry.result,
        "error": entry.error,
        "compensation": entry.compensation,
        "owner": entry.owner,
        "lease_until": _time(entry.lease_until),
        "created_at": _time(entry.created_at),
        "updated_at": _time(entry.updated_at),
    }


def _time(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()


def _run(run: RunInfo) -> dict[str, Any]:
    return {
        "id": run.id,
        "status": run.status.value,
        "created_at": _time(run.created_at),
        "finished_at": _time(run.finished_at),
        "parent_run_id": run.parent_run_id,
        "parent_snapshot_id": run.parent_snapshot_id,
        "metadata": run.metadata,
    }


def _rollback(rollback: RollbackInfo) -> dict[str, Any]:
    return {
        "id": rollback.id,
        "snapshot_id": rollback.snapshot_id,
        "agent": rollback.agent,
        "reason": rollback.reason,
        "source": rollback.source,
        "attempt": rollback.attempt,
        "discarded": rollback.discarded,
        "at": _time(rollback.at),
    }


def _snapshot(snapshot: Snapshot) -> dict[str, Any]:
    return {
        "id": snapshot.id,
        "seq": snapshot.seq,
        "status": snapshot.status.value,
        "initiator": snapshot.initiator,
        "started_at": _time(snapshot.started_at),
        "completed_at": _time(snapshot.completed_at),
        "error": snapshot.error,
        "agents": {
            name: {
                "state": cut.state,
                "state_hash": cut.state_hash,
                "sent": cut.sent,
                "received": cut.received,
            }
            for name, cut in snapshot.agents.items()
        },
        "channels": [
            {
                "src": channel.src,
                "dst": channel.dst,
                "messages": [
                    {
                        "seq": m.seq,
                        "kind": m.kind,
                        "payload": m.payload,
                        "headers": m.headers,
                        "epoch": m.epoch,
                    }
                    for m in channel.messages
                ],
            }
            for channel in snapshot.channels
        ],
    }


def _message(message: JournalMessage) -> dict[str, Any]:
    return {
        "src": message.src,
        "dst": message.dst,
        "seq": message.seq,
        "kind": message.kind,
        "payload": message.payload,
        "headers": message.headers,
        "epoch": message.epoch,
        "sent_at": _time(message.sent_at),
        "delivered_at": _time(message.delivered_at),
    }
