"""Agents that ask a sampled model what to do, hosted by worker processes.

``make_app`` is the factory ``agentsnap worker --app sampled_workers_app:make_app`` loads
(with this directory on ``PYTHONPATH``). The environment sends ``{"task": t, "hops": h}``
to an agent; the agent asks a sampled model (other words, other argument orders, another
next agent on every call, after a random delay of up to 5 ms), runs the tool calls the model
answers with, and, while hops remain, passes the task on, one hop less, to the agent the
model named. Two side-effecting tools stand for an outside service: ``sw_notify``'s key is
derived from its place in the handler, ``sw_charge``'s is given by the caller (``key=``,
from the task and the hop). Both insert a row in the service's table ``sampled_writes``
keyed by the idempotency key they are handed (``ON CONFLICT DO NOTHING``: the service
deduplicates a key, as a payment API does); the same ``(tool, task, hop)`` under two keys is
a write performed twice. Every question the model is asked is logged in ``sampled_asks``
with its prompt, which names the task, the hop, the message handled and the timeline.

``AGENTSNAP_EFFECTS_URL`` is the PostgreSQL database of the service's tables;
``SAMPLED_AGENTS`` says how many agents the app has.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from typing import Any

import psycopg
from outside_world import execute

from agentsnap import (
    Agent,
    AgentState,
    Context,
    Message,
    ModelResponse,
    Tool,
    ToolCall,
    tool,
)
from agentsnap.distributed import App
from agentsnap.models import ChatMessage, ModelRequest, ModelToolCall
from agentsnap.testing import FunctionModel
from agentsnap.tools import run_tool_calls

AGENTS = int(os.environ.get("SAMPLED_AGENTS", "6"))
WRITES = "sampled_writes"
ASKS = "sampled_asks"
WRITE_TOOLS = ("sw_notify", "sw_charge")


async def perform(call: ToolCall, task: int, hop: int) -> None:
    """The outside service: records the write once per idempotency key."""
    await execute(
        f"INSERT INTO {WRITES} (key, run_id, tool, task, hop, pid) "
        "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (key) DO NOTHING",
        (call.key, call.run_id, call.tool, task, hop, os.getpid()),
    )


@tool(side_effect=True, rerun_if_unknown=True, name="sw_notify")
async def notify(call: ToolCall, task: int, hop: int, text: str) -> str:
    """Tell the customer; the key is the call's place in the handler."""
    await perform(call, task, hop)
    return "sent"


@tool(side_effect=True, rerun_if_unknown=True, name="sw_charge")
async def charge(call: ToolCall, task: int, hop: int, lines: list[str]) -> int:
    """Charge the task's lines; the caller gives the key."""
    await perform(call, task, hop)
    return len(lines)


@tool(name="sw_look")
async def look(task: int) -> str:
    """Look the task up (no effect)."""
    return f"task {task} is open"


TOOLS: list[Tool[Any]] = [look, notify, charge]


def names(agents: int = AGENTS) -> list[str]:
    return [f"sampler-{i}" for i in range(agents)]


async def sampled_answer(request: ModelRequest) -> ModelResponse:
    """What a sampled model answers: other words, orders and next agent on every call."""
    prompt = str(request.messages[0].content)
    await execute(
        f"INSERT INTO {ASKS} (prompt, pid, asked_at) VALUES (%s, %s, %s)",
        (prompt, os.getpid(), time.time()),
    )
    await asyncio.sleep(random.uniform(0, 0.005))
    _, task_text, _, hop_text, *_ = prompt.split()
    task, hop = int(task_text), int(hop_text)
    lines = ["fare", "tax", "seat"]
    random.shuffle(lines)
    text = random.choice(["on its way", "it is done", "all set"])
    calls = [
        ModelToolCall(name="sw_look", arguments={"task": task}, id=f"l{i}")
        for i in range(random.randrange(2))
    ]
    writes = [
        ModelToolCall(name="sw_notify", arguments={"task": task, "hop": hop, "text": text}, id="n"),
        ModelToolCall(
            name="sw_charge", arguments={"task": task, "hop": hop, "lines": lines}, id="c"
        ),
    ]
    random.shuffle(writes)
    return ModelResponse(
        text=f"next {random.choice(names())} ({random.randrange(10**9)})",
        tool_calls=(*calls, *writes),
    )


class Sampler(Agent[AgentState]):
    """Asks the model, runs its tool calls, and passes the task to the agent it names."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.model = FunctionModel(sampled_answer, name="sampled")

    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        payload = message.payload_as(dict[str, int])
        task, hops = payload["task"], payload["hops"]
        # The prompt names the message and the timeline: the test finds its asks by them.
        asking = f"task {task} hop {hops} ({message.id} on timeline {ctx.timeline} of {ctx.run_id})"
        answer = await ctx.chat(self.model, [ChatMessage(role="user", content=asking)], tools=TOOLS)
        # sw_charge's key is given by the caller; run_tool_calls derives sw_notify's.
        charged = [c for c in answer.tool_calls if c.name == "sw_charge"]
        rest = answer.model_copy(
            update={"tool_calls": tuple(c for c in answer.tool_calls if c.name != "sw_charge")}
        )
        results = await run_tool_calls(ctx, rest, TOOLS)
        failed = [r.content for r in results if r.content.startswith("error")]
        if failed:
            raise RuntimeError(f"task {task}: tool calls failed: {failed}")
        for call in charged:
            await charge(ctx, key=f"{ctx.run_id}:{task}:{hops}", **call.arguments)
        done = self.state.memory.setdefault("done", [])
        assert isinstance(done, list)
        done.append(f"{task}:{hops}")
        if hops > 0:
            ctx.send(answer.text.split()[1], {"task": task, "hops": hops - 1}, kind="task")


def make_app() -> App:
    """Every sampler."""
    return App(agents=[Sampler(name) for name in names()])


def create_tables(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {WRITES} (key text PRIMARY KEY, run_id text, tool text, "
            "task int, hop int, pid int)"
        )
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {ASKS} (id serial PRIMARY KEY, prompt text, pid int, "
            "asked_at double precision)"
        )
