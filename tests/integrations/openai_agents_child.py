"""An SDK agent that emails through the ledger, run in a child process to be killed and resumed.

A writer (an OpenAI Agents SDK agent run by an ``OpenAIAgent``) is asked to tell Ann that the
report is late. Its model is sampled: fresh randomness in every process, so the email's
wording and the final answer change on every call. It first asks for ``send_email`` (an
agentsnap tool through the ledger, handed the call's idempotency key), then answers; the
answer goes to a critic, who rejects it unless it apologises (``--accept-all``: the critic
accepts anything). The model apologises only once a rejection is in its conversation.

The outside world is a SQLite file: ``effects`` gets one row per email actually sent, with
its idempotency key; ``asks`` one row per time the model is asked, with the step (``call``
or ``answer``) and the run's timeline. With ``--hang-at N`` the model hangs at this
process's N-th ask, once it is logged, for the test to kill the process there. With
``--sdk-tool`` the email goes through the SDK's own ``@function_tool``, declared nowhere:
the agent puts it through the ledger by default. With ``--stream`` the writer runs
streamed, and the result lists the model's stream events this process saw.

Usage::

    python tests/integrations/openai_agents_child.py URL SERVICE RUN_ID [--resume]
        [--hang-at N] [--accept-all] [--sdk-tool] [--stream]

The process prints one JSON line ``{"result": ...}`` when the run is idle.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sqlite3
import sys
from pathlib import Path
from typing import Any

# tests/ (as pytest puts it on sys.path), so the helpers import as the tests import them.
sys.path.insert(0, str(Path(__file__).parents[1]))

from agents import Agent as SDKAgent
from agents import RunConfig
from agents import function_tool as sdk_function_tool
from agents.testing import assistant_message, function_call

from agentsnap import (
    Agent,
    AgentState,
    Context,
    Message,
    RetryPolicy,
    Runtime,
    ToolCall,
    tool,
)
from agentsnap.integrations._running import running
from agentsnap.integrations.openai_agents import OpenAIAgent, as_sdk_tool
from agentsnap.store.sql import SqlStore
from integrations.openai_agents_models import FunctionSDKModel, answered_tool, text_of

SERVICE_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS effects (key TEXT NOT NULL, text TEXT NOT NULL, "
    "pid INTEGER NOT NULL);"
    "CREATE TABLE IF NOT EXISTS asks (step TEXT NOT NULL, timeline INTEGER NOT NULL, "
    "pid INTEGER NOT NULL)"
)


class Settings:
    service = ""
    hang_at = 0
    asked = 0
    streamed: list[list[str | None]] | None = None


def streamed(agent: str, event: Any) -> None:
    """Keeps the model's stream events this process saw: their type, and an item's type."""
    assert Settings.streamed is not None
    if event.type == "raw_response_event":
        item = getattr(event.data, "item", None)
        Settings.streamed.append([event.data.type, getattr(item, "type", None)])


def service() -> sqlite3.Connection:
    conn = sqlite3.connect(Settings.service, timeout=60)
    conn.execute("PRAGMA busy_timeout=60000")
    return conn


@tool(side_effect=True, rerun_if_unknown=True)
def send_email(call: ToolCall, to: str, text: str) -> str:
    """Send an email."""
    conn = service()
    try:
        with conn:
            conn.execute("INSERT INTO effects VALUES (?, ?, ?)", (call.key, text, os.getpid()))
    finally:
        conn.close()
    return f"sent to {to}"


@sdk_function_tool(name_override="send_email")
def send_email_sdk(to: str, text: str) -> str:
    """Send an email (the SDK's own tool: nothing declares its effect)."""
    conn = service()
    try:
        with conn:
            conn.execute("INSERT INTO effects VALUES (?, ?, ?)", ("sdk", text, os.getpid()))
    finally:
        conn.close()
    return f"sent to {to}"


async def sampled(items: list[dict[str, Any]]) -> list[Any]:
    """A model at a temperature above zero: other words on every call."""
    step = "answer" if answered_tool(items) else "call"
    ctx = running()
    conn = service()
    try:
        with conn:
            conn.execute(
                "INSERT INTO asks VALUES (?, ?, ?)",
                (step, ctx.timeline if ctx is not None else -1, os.getpid()),
            )
    finally:
        conn.close()
    Settings.asked += 1
    if Settings.asked == Settings.hang_at:
        await asyncio.sleep(3600)  # killed here
    number = random.randrange(10**6)
    if step == "call":
        text = random.choice(["The report is late", "Ann, the report will be late", "Late report"])
        return [
            function_call(
                "send_email",
                {"to": "ann@example.com", "text": f"{text} (#{number})"},
                call_id=f"call-{number}",
            )
        ]
    if "rejected" in text_of(items):
        return [assistant_message(f"Sorry, Ann: the report is late. (#{number})")]
    return [assistant_message(random.choice(["Done.", "Ann knows.", "Email sent."]))]


class Critic(Agent[AgentState]):
    accept_all = False

    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        output = str(message.payload_as(dict[str, Any])["output"])
        if not self.accept_all and "sorry" not in output.lower():
            ctx.reject("writer", "apologise for the delay")
        self.state.memory["accepted"] = output


def writer(sdk_tool: bool) -> OpenAIAgent:
    sdk_agent = SDKAgent(
        name="writer",
        instructions="Tell people what they need to know, by email.",
        model=FunctionSDKModel(sampled, name="sampled"),
        tools=[send_email_sdk if sdk_tool else as_sdk_tool(send_email)],
    )
    return OpenAIAgent(
        "writer",
        sdk_agent,
        reply_to="critic",
        run_config=RunConfig(tracing_disabled=True),
        on_event=streamed if Settings.streamed is not None else None,
    )


async def main(
    url: str, run_id: str, resume: bool, accept_all: bool, sdk_tool: bool
) -> dict[str, Any]:
    store = SqlStore(url)
    Critic.accept_all = accept_all
    runtime = Runtime(store=store, run_id=run_id, retry=RetryPolicy.attempts(5))
    async with runtime:
        agent = runtime.add(writer(sdk_tool))
        critic = runtime.add(Critic("critic"))
        if resume:
            await runtime.resume()
        else:
            runtime.send("writer", "Tell Ann that the report is late.")
        await runtime.run_until_idle()
    await store.close()
    return {
        "accepted": critic.state.memory.get("accepted"),
        "tool_calls": [c.status for c in agent.state.tool_calls],
        "items": len(agent.state.items),
        "streamed": Settings.streamed,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("service")
    parser.add_argument("run_id")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--hang-at", type=int, default=0)
    parser.add_argument("--accept-all", action="store_true")
    parser.add_argument("--sdk-tool", action="store_true")
    parser.add_argument("--stream", action="store_true")
    args = parser.parse_args()
    Settings.service = args.service
    Settings.hang_at = args.hang_at
    Settings.streamed = [] if args.stream else None
    result = asyncio.run(main(args.url, args.run_id, args.resume, args.accept_all, args.sdk_tool))
    print(json.dumps({"result": result}), flush=True)
