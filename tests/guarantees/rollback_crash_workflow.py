"""A run with rollbacks whose executor asks a sampled model for its tool calls; killed and
resumed by ``test_model_call_rollback_crashes.py``.

An executor takes tasks; for each it asks a sampled model what to do (``ctx.chat``), and the
model answers with tool calls as real ones do, after a random delay of up to 5 ms: a random
number of read-only lookups first, then two writes in a random order, each worded at random
(``rbc_cancel`` with its optional ``notify`` present or not and a reason phrased otherwise,
``rbc_refund`` with its lines in another order). The executor runs them with
``run_tool_calls`` and reports to an auditor, who rejects about one report in three: the run
rolls back and the executor's handler asks the model again, on a new timeline, and gets other
words. The model's randomness is fresh in every process.

``rbc_cancel``'s key is derived from its place in the handler, ``rbc_refund``'s from its
reservation (``key_from``). Both stand for an outside service: they record the write in the
service's ``writes`` table, keyed by the idempotency key they are handed (``INSERT OR
IGNORE``: the service deduplicates a key, as a payment API does), with the tool and the
task. The same ``(tool, task)`` under two keys is a write performed twice. Every execution
of a tool's body is logged in ``executions`` too, and every time the model is asked in
``asks``, with the first line of its prompt (the task, the message and the timeline).

Usage::

    python tests/guarantees/rollback_crash_workflow.py URL SERVICE_DB RUN_ID           # first run
    python tests/guarantees/rollback_crash_workflow.py URL SERVICE_DB RUN_ID --resume  # after kill

Each process prints ``RUNNING`` when its first handler starts, and one JSON line
``{"result": ...}`` at the end. ``AGENTSNAP_ROLLBACK_CRASH_TASKS`` sets the tasks of a run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sqlite3
import sys
import time
from collections.abc import Mapping
from typing import Any

from agentsnap import (
    Agent,
    AgentState,
    Context,
    Message,
    ModelResponse,
    RetryPolicy,
    Runtime,
    SnapshotPolicy,
    Tool,
    ToolCall,
    tool,
)
from agentsnap.models import ChatMessage, ModelRequest, ModelToolCall
from agentsnap.store.sql import SqlStore
from agentsnap.testing import FunctionModel
from agentsnap.tools import run_tool_calls

TASKS = int(os.environ.get("AGENTSNAP_ROLLBACK_CRASH_TASKS", "30"))
WRITE_TOOLS = ("rbc_cancel", "rbc_refund")
REJECT = 1 / 3
ATTEMPTS = 60
"""Rollbacks allowed per rejected report: 59 rejections of one report in a row, at one in
three, do not happen."""
SNAPSHOT_EVERY = 4

SERVICE_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS writes (key TEXT PRIMARY KEY, tool TEXT NOT NULL, "
    "task TEXT NOT NULL, pid INTEGER NOT NULL);"
    "CREATE TABLE IF NOT EXISTS executions (key TEXT NOT NULL, tool TEXT NOT NULL, "
    "task TEXT NOT NULL, pid INTEGER NOT NULL);"
    "CREATE TABLE IF NOT EXISTS asks (prompt TEXT NOT NULL, pid INTEGER NOT NULL, "
    "asked_at REAL NOT NULL)"
)


def tasks() -> list[str]:
    return [str(t) for t in range(TASKS)]


class Service:
    """Where the outside service keeps its tables (set from the command line)."""

    path = ""


def open_service(path: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, timeout=60)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA busy_timeout=60000")
    return conn


def perform(call: ToolCall, reservation: str) -> None:
    """The outside service: records the write once per idempotency key."""
    assert call.key is not None
    task = reservation.removeprefix("R-")
    row = (call.key, call.tool, task, os.getpid())
    conn = open_service(Service.path)
    try:
        with conn:
            conn.execute("INSERT INTO executions (key, tool, task, pid) VALUES (?, ?, ?, ?)", row)
            conn.execute(
                "INSERT OR IGNORE INTO writes (key, tool, task, pid) VALUES (?, ?, ?, ?)", row
            )
    finally:
        conn.close()


@tool(name="rbc_lookup")
async def lookup(reservation: str) -> dict[str, str]:
    """Look a reservation up."""
    return {"reservation": reservation, "status": "booked"}


@tool(side_effect=True, rerun_if_unknown=True, name="rbc_cancel")
def cancel(call: ToolCall, reservation: str, reason: str, notify: bool = True) -> str:
    """Cancel a reservation; its key is the call's place in the handler."""
    perform(call, reservation)
    return f"cancelled {reservation}"


@tool(side_effect=True, rerun_if_unknown=True, name="rbc_refund", key_from=("reservation",))
def refund(call: ToolCall, reservation: str, lines: list[str]) -> dict[str, object]:
    """Refund a reservation; its key is the reservation."""
    perform(call, reservation)
    return {"refunded": reservation, "lines": sorted(lines)}


TOOLS: list[Tool[Any]] = [lookup, cancel, refund]


async def sampled_answer(request: ModelRequest) -> ModelResponse:
    """What a sampled model asks for: other words, counts and orders on every call; each
    ask is logged."""
    asked_at = time.time()
    prompt = request.messages[0].content
    conn = open_service(Service.path)
    try:
        with conn:
            conn.execute("INSERT INTO asks VALUES (?, ?, ?)", (prompt, os.getpid(), asked_at))
    finally:
        conn.close()
    await asyncio.sleep(random.uniform(0, 0.005))
    task = prompt.split()[2]
    reservation = f"R-{task}"
    calls = [
        ModelToolCall(name="rbc_lookup", arguments={"reservation": reservation}, id=f"l{i}")
        for i in range(random.randrange(3))
    ]
    cancel_args: dict[str, object] = {
        "reservation": reservation,
        "reason": random.choice(["client asked", "asked by the client", "client's request"]),
    }
    if random.random() < 0.5:
        cancel_args["notify"] = random.choice([True, False])
    lines = ["fare", "tax", "seat"]
    random.shuffle(lines)
    writes = [
        ModelToolCall(name="rbc_cancel", arguments=cancel_args, id="c"),
        ModelToolCall(name="rbc_refund", arguments={"reservation": reservation, "lines": lines}),
    ]
    random.shuffle(writes)
    return ModelResponse(
        text=f"done with {task} ({random.randrange(10**9)})", tool_calls=(*calls, *writes)
    )


class Executor(Agent[AgentState]):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.model = FunctionModel(sampled_answer, name="sampled")

    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        announce_running()
        task = str(message.payload_as(dict[str, str])["task"])
        # The message and the timeline name the model call: the test finds its asks by them.
        asking = f"handle task {task} ({message.id} on timeline {ctx.timeline})"
        prompt = [ChatMessage(role="user", content=asking)]
        prompt += [ChatMessage(role="user", content=f.text()) for f in ctx.feedback[-1:]]
        answer = await ctx.chat(self.model, prompt, tools=TOOLS)
        results = await run_tool_calls(ctx, answer, TOOLS)
        failed = [r.content for r in results if r.content.startswith("error")]
        if failed:
            raise RuntimeError(f"task {task}: tool calls failed: {failed}")
        ctx.send("auditor", {"task": task, "report": answer.text}, kind="report")


class Auditor(Agent[AgentState]):
    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        if random.random() < REJECT:
            ctx.reject("executor", "the report lacks the refund lines; check them")
        done = self.state.memory.setdefault("done", [])
        assert isinstance(done, list)
        done.append(str(message.payload_as(dict[str, str])["task"]))


_running = False


def announce_running() -> None:
    global _running  # noqa: PLW0603  # once per process
    if not _running:
        _running = True
        print("RUNNING", flush=True)


def emit(document: Mapping[str, Any]) -> None:
    print(json.dumps(document, sort_keys=True), flush=True)


async def main(options: argparse.Namespace) -> int:
    Service.path = options.service
    store = SqlStore(options.url)
    report: dict[str, Any] = {"pid": os.getpid()}
    try:
        runtime = Runtime(
            store=store,
            run_id=options.run_id,
            snapshot_policy=SnapshotPolicy(every_deliveries=SNAPSHOT_EVERY),
            retry=RetryPolicy.attempts(ATTEMPTS),
        )
        async with runtime:
            runtime.add(Executor("executor"))
            runtime.add(Auditor("auditor"))
            todo = tasks()
            if options.resume:
                snapshot = await runtime.resume()
                report["resumed_from"] = snapshot.seq
                todo = todo[runtime.inputs_sent.get("executor", 0) :]
            for task in todo:
                runtime.send("executor", {"task": task}, kind="task")
            await runtime.run_until_idle()
            report["done"] = list(runtime.agents["auditor"].state.memory.get("done", []))
            report["rollbacks"] = len(runtime.rollbacks)
    finally:
        await store.close()
    emit({"result": report})
    return 0


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", help="the agentsnap database URL")
    parser.add_argument("service", help="the service's SQLite file")
    parser.add_argument("run_id")
    parser.add_argument("--resume", action="store_true", help="resume the run")
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse(sys.argv[1:]))))
