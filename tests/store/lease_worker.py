"""A process that races others for the lease of one run.

Used by ``test_ownership_sql.py``: ``python tests/store/lease_worker.py MODE URL RUN_ID``.
It prints ``ready``, waits for a line on its standard input (so that the processes start
together), then races:

* ``cas``: tries ``ROUNDS`` times to take the lease over from the token it last saw
  (``take_lease``, compare and set), from several tasks at once; prints one JSON line, the
  tokens it won.
* ``acquire``: ``RunOwnership.acquire()`` once; prints one JSON line, ``{"token": N}`` or
  ``{"owned_by": OWNER}``; then waits for its standard input to close before it exits (and
  releases nothing), so that a winner is still alive while the others look at its lease.
* ``claim``: takes the run's lease and claims a ledger key for the run (in progress, owned
  by this process), prints ``claimed``, then kills itself with SIGKILL.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from datetime import timedelta

from agentsnap import RunOwnedError
from agentsnap.ledger import LedgerEntry, ToolCallStatus, fingerprint, owner_id
from agentsnap.messages import JsonValue
from agentsnap.ownership import RunOwnership
from agentsnap.records import utcnow
from agentsnap.store.sql import SqlStore
from agentsnap.store.sql_ledger import SqlLedger

ROUNDS = 30
TASKS = 3


async def cas(store: SqlStore, run_id: str) -> list[int]:
    won: list[int] = []

    async def task() -> None:
        seen = await store.get_lease(run_id)
        for _ in range(ROUNDS):
            lease = await store.take_lease(
                run_id,
                owner_id(),
                utcnow() + timedelta(hours=1),
                replacing=None if seen is None else seen.token,
            )
            if lease is not None:
                won.append(lease.token)
                seen = lease
            else:
                seen = await store.get_lease(run_id)

    await asyncio.gather(*(task() for _ in range(TASKS)))
    return won


async def claim(url: str, store: SqlStore, run_id: str) -> None:
    ownership = RunOwnership(store, run_id, ttl=3600)
    await ownership.acquire()
    ledger = SqlLedger(url)
    ownership.fence_ledger(ledger)
    now = utcnow()
    arguments: dict[str, JsonValue] = {"card": "4242", "amount": 500}
    found = await ledger.claim(
        LedgerEntry(
            key="orphan-1",
            tool="charge",
            fingerprint=fingerprint(arguments),
            arguments=arguments,
            status=ToolCallStatus.IN_PROGRESS,
            created_at=now,
            updated_at=now,
            run_id=run_id,
            agent="payer",
            owner=owner_id(),
            lease_until=now + timedelta(hours=1),
        )
    )
    assert found is None
    print("claimed", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


async def main(mode: str, url: str, run_id: str) -> None:
    store = SqlStore(url)
    try:
        await store.get_lease(run_id)  # the schema is there before the race starts
        print("ready", flush=True)
        await asyncio.to_thread(sys.stdin.readline)
        if mode == "cas":
            print(json.dumps(await cas(store, run_id)), flush=True)
        elif mode == "acquire":
            try:
                lease = await RunOwnership(store, run_id, ttl=3600).acquire()
            except RunOwnedError as exc:
                print(json.dumps({"owned_by": exc.owner}), flush=True)
            else:
                print(json.dumps({"token": lease.token, "owner": lease.owner}), flush=True)
            await asyncio.to_thread(sys.stdin.read)
        else:
            await claim(url, store, run_id)
    finally:
        await store.close()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
