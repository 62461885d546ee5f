"""One connection to a PostgreSQL table standing for the outside world, per event loop.

The apps whose side-effecting tools write there run in a worker process and, in the
in-process tests, in the test process, where each test has an event loop of its own: an
asyncio lock or an async connection belongs to the loop it was first used in, so each loop
gets its own.
"""

from __future__ import annotations

import asyncio
import os
import weakref
from typing import Any

import psycopg


class _World:
    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.connection: psycopg.AsyncConnection[tuple[Any, ...]] | None = None


_worlds: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _World] = weakref.WeakKeyDictionary()


async def execute(sql: str, values: tuple[object, ...]) -> None:
    """Run ``sql`` on ``AGENTSNAP_EFFECTS_URL``, one statement at a time in this loop.

    One at a time, so that a call through the ledger is finished even when its handler is
    not (a cancelled handler's statement still completes).
    """
    world = _worlds.setdefault(asyncio.get_running_loop(), _World())
    async with world.lock:
        if world.connection is None or world.connection.closed:
            world.connection = await psycopg.AsyncConnection.connect(
                os.environ["AGENTSNAP_EFFECTS_URL"], autocommit=True
            )
        await world.connection.execute(sql, values)
