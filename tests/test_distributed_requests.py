"""A request to a person from an agent hosted by a worker, answered from another process.

A worker hosts a refund desk whose tool needs approval; the run's database is an SQLite
file. ``agentsnap answer`` approves the call in a process of its own: the worker, which
polls the store, gets the answer, and the refund happens once.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest
from distributed_teardown import Teardown
from test_distributed import PATIENCE, nats_url  # noqa: F401  # the fixture

from agentsnap import Agent, AgentState, Context, Message, tool
from agentsnap.distributed import App, DistributedRun, Worker
from agentsnap.store.sql import SqlStore

ROOT = Path(__file__).resolve().parent.parent
PAID: list[str] = []


@tool(side_effect=True, approval=True, name="distributed_refund")
async def refund(order: str) -> str:
    PAID.append(order)
    return f"refunded {order}"


class Desk(Agent[AgentState]):
    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        order = cast("dict[str, Any]", message.payload)["order"]
        self.state.memory["outcome"] = await refund(ctx, order=order)


@tool(side_effect=True, name="distributed_plain_refund")
async def plain_refund(order: str) -> str:
    PAID.append(order)
    return f"refunded {order}"


class PlainDesk(Agent[AgentState]):
    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        order = cast("dict[str, Any]", message.payload)["order"]
        self.state.memory["outcome"] = await plain_refund(ctx, order=order)


def desks() -> App:
    return App(agents=[Desk("desk")])


def policy_desks() -> App:
    """The tool declares no approval: the app's policy asks for one."""
    return App(agents=[PlainDesk("desk")], approvals={"distributed_plain_refund": True})


def cli(db: str, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "agentsnap", *args, "--db", db],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("make_app", [desks, policy_desks], ids=["tool-approval", "app-policy"])
async def test_a_workers_request_is_answered_from_another_process(
    nats_url: str,  # noqa: F811
    tmp_path: Path,
    make_app: Callable[[], App],
    teardown: Teardown,
) -> None:
    PAID.clear()
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    store = teardown.store(SqlStore(db))
    links = await teardown.links(nats_url, 2)
    run = DistributedRun(links[0], store, make_app(), part_timeout=30)
    app = make_app()
    worker = Worker(links[1], store, run.run_id, app, ["desk"], name="w0")
    teardown.worker(worker)
    teardown.stream(run)
    await run.start()
    await worker.start()
    run.send("desk", {"order": "Z-9"}, kind="refund")
    idle = asyncio.create_task(run.run_until_idle())
    found: list[dict[str, Any]] = []
    async with asyncio.timeout(PATIENCE):
        while not found:
            await asyncio.sleep(0.1)
            out = await asyncio.to_thread(cli, db, "requests", run.run_id, "--pending", "--json")
            found = json.loads(out)
    (request,) = found
    assert request["agent"] == "desk"
    await asyncio.to_thread(cli, db, "answer", request["id"], "--approve", "--by", "ops")
    async with asyncio.timeout(PATIENCE):
        await idle
    (desk,) = app.agents
    assert desk.state.memory["outcome"] == "refunded Z-9"
    assert PAID == ["Z-9"]
    await run.close()
