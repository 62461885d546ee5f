"""A handler that reads the clock into a side-effecting tool's arguments, killed after the
effect; ``test_divergence_crash.py`` kills it and resumes it.

One agent, ``stamper``, handles one message: it reads the clock and passes the time to a
side-effecting tool, whose key is derived (the call's place in the handler). The tool stands
for an outside service: every execution of its body is a row in the service's
``executions`` table. Once the tool returned, the handler prints ``STAMPED`` and, in the first
process, waits to be killed. A resumed process re-executes the handler on the same timeline:
the clock reads otherwise, so the same call comes with other arguments.

``--lenient`` uses the tool declared ``on_divergence="recorded"``. ``--resume`` resumes the
run, runs it until idle and prints one JSON line ``{"result": ...}``: the failures
``run_until_idle`` raised and ``runtime.failures`` holds, and what the handler got.

Usage::

    python tests/guarantees/divergence_workflow.py URL SERVICE_DB RUN_ID [--lenient]
    python tests/guarantees/divergence_workflow.py URL SERVICE_DB RUN_ID --resume [--lenient]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sqlite3
import sys
import time
from typing import Any

from agentsnap import (
    Agent,
    AgentState,
    Context,
    EffectDiverged,
    HandlerFailed,
    Message,
    Runtime,
    ToolCall,
    tool,
)
from agentsnap.store.sql import SqlStore

SERVICE_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS executions (key TEXT NOT NULL, at REAL NOT NULL, "
    "pid INTEGER NOT NULL)"
)


class Service:
    path = ""


def perform(call: ToolCall, at: float) -> str:
    """The outside service: every execution is a row."""
    conn = sqlite3.connect(Service.path, timeout=60)
    try:
        with conn:
            conn.execute("INSERT INTO executions VALUES (?, ?, ?)", (call.key, at, os.getpid()))
    finally:
        conn.close()
    return f"stamped {at!r} in {os.getpid()}"


@tool(side_effect=True, name="dv_stamp")
def stamp(call: ToolCall, at: float) -> str:
    """Stamp a time; its key is derived from the call."""
    return perform(call, at)


@tool(side_effect=True, name="dv_stamp_lenient", on_divergence="recorded")
def stamp_lenient(call: ToolCall, at: float) -> str:
    """The same, with the recorded outcome standing for a diverged call."""
    return perform(call, at)


class Stamper(Agent[AgentState]):
    def __init__(self, lenient: bool, wait: bool) -> None:
        super().__init__("stamper")
        self.tool = stamp_lenient if lenient else stamp
        self.wait = wait

    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        at = time.time()  # read, not recorded: a re-execution reads another time
        self.state.memory["result"] = await self.tool(ctx, at=at)
        print("STAMPED", flush=True)
        if self.wait:
            await asyncio.sleep(600)  # killed here, after the effect, before the handler ends


def failure(exc: HandlerFailed) -> dict[str, Any]:
    cause = exc.__cause__
    described: dict[str, Any] = {
        "agent": exc.agent,
        "message": str(exc),
        "cause": type(cause).__name__,
        "cause_message": str(cause),
    }
    if isinstance(cause, EffectDiverged):
        described |= {
            "tool": cause.tool,
            "key": cause.key,
            "recorded": cause.recorded,
            "arguments": cause.arguments,
        }
    return described


async def main(options: argparse.Namespace) -> int:
    Service.path = options.service
    conn = sqlite3.connect(options.service)
    conn.execute(SERVICE_SCHEMA)
    conn.close()
    store = SqlStore(options.url)
    stamper = Stamper(options.lenient, wait=not options.resume)
    report: dict[str, Any] = {}
    try:
        runtime = Runtime(store=store, run_id=options.run_id)
        async with runtime:
            runtime.add(stamper)
            if not options.resume:
                runtime.send("stamper", {"stamp": 1})
                await runtime.run_until_idle()
                return 1  # never here: killed while the handler waits
            resumed = await runtime.resume()
            report["resumed_from"] = resumed.seq
            try:
                await runtime.run_until_idle()
            except HandlerFailed as exc:
                report["raised"] = failure(exc)
            report["failures"] = [failure(f) for f in runtime.failures]
            report["result"] = stamper.state.memory.get("result")
            report["tool_calls"] = [
                {"status": c.status, "error": c.error, "key": c.key}
                for c in stamper.state.tool_calls
            ]
    finally:
        await store.close()
    print(json.dumps({"result": report}, sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("service")
    parser.add_argument("run_id")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--lenient", action="store_true")
    sys.exit(asyncio.run(main(parser.parse_args())))
