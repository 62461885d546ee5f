"""A process that calls the same side-effecting tool on the same keys from 8 tasks at once.

Used by ``test_concurrency.py``: ``python tests/tools/ledger_worker.py URL NAME``. It prints
``ready``, waits for a line on its standard input (so that the processes start together),
then prints one JSON line: every call's outcome. The tool's body records each run in a table of
its own, ``ledger_test_effects``, so the test can count how often each body ran.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import os
import random
import sys
from typing import Any

import sqlalchemy
from sqlalchemy.ext.asyncio import create_async_engine

from agentsnap import ToolInProgress, tool
from agentsnap.store.sql import async_url
from agentsnap.store.sql_ledger import SqlLedger

TASKS = 8
KEYS = [f"key-{i}" for i in range(6)]
EFFECTS = sqlalchemy.table(
    "ledger_test_effects", sqlalchemy.column("key"), sqlalchemy.column("runner")
)
RUNNER: contextvars.ContextVar[str] = contextvars.ContextVar("runner")


async def main(url: str, name: str) -> None:
    engine = create_async_engine(async_url(url), isolation_level="AUTOCOMMIT")
    ledger = SqlLedger(url)

    @tool(side_effect=True, name="concurrent_effect", wait=0.05)
    async def effect(key_name: str) -> dict[str, str]:
        runner = RUNNER.get()
        async with engine.connect() as conn:
            await conn.execute(sqlalchemy.insert(EFFECTS).values(key=key_name, runner=runner))
        await asyncio.sleep(0.1)  # others arrive while this one is in progress
        return {"done_by": runner}

    async def task(number: int) -> list[dict[str, Any]]:
        runner = f"{name}/{os.getpid()}/{number}"
        RUNNER.set(runner)
        order = KEYS[:]
        random.Random(number).shuffle(order)
        outcomes: list[dict[str, Any]] = []
        for key in order:
            try:
                result = await effect.invoke(ledger, key=key, key_name=key)
            except ToolInProgress:
                outcomes.append({"key": key, "outcome": "in_progress", "runner": runner})
            else:
                outcomes.append({"key": key, "outcome": "result", "result": result})
        return outcomes

    await ledger.get("warm-up")  # the schema is there before the race starts
    print("ready", flush=True)
    await asyncio.to_thread(sys.stdin.readline)
    try:
        results = await asyncio.gather(*(task(n) for n in range(TASKS)))
    finally:
        await ledger.close()
        await engine.dispose()
    print(json.dumps([outcome for outcomes in results for outcome in outcomes]), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
