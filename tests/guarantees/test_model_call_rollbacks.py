"""Rollbacks redo an agent that asks a sampled model for its tool calls: no write twice.

An executor takes tasks; for each it asks a sampled model what to do, and the model answers
with tool calls as real ones do: a random number of read-only lookups first, then the writes
(a cancellation and a refund, in a random order), each worded at random (an optional field
present or not, a reason phrased otherwise, refund lines in another order). The executor runs
them through the tools and reports to an auditor, who rejects reports at random: every
rejection rolls the team back to the last cut before the report, and the executor's handler
runs again, asks the model again, and gets other words.

On the default scheduler, in memory and on SQLite: every write reaches the outside world
once, whatever the redo asked for; each redo's feedback names the writes already done.
``AGENTSNAP_ROLLBACK_TASKS`` sets the tasks per run (CI: 60; about 1.5 rollbacks each).
"""

from __future__ import annotations

import os
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import tenacity
from payloads import get

from agentsnap import (
    Agent,
    AgentState,
    Context,
    Message,
    ModelResponse,
    RetryPolicy,
    Runtime,
    Tool,
    tool,
)
from agentsnap.ledger import Ledger
from agentsnap.models import ChatMessage, ModelRequest, ModelToolCall
from agentsnap.store.ledger import MemoryLedger
from agentsnap.store.sql import SqlStore
from agentsnap.store.sql_ledger import SqlLedger
from agentsnap.testing import FunctionModel
from agentsnap.tools import run_tool_calls

TASKS = int(os.environ.get("AGENTSNAP_ROLLBACK_TASKS", "60"))
REJECT = 0.6

WRITES: list[tuple[str, str]] = []
"""``(tool, reservation)`` of every write that reached the outside world."""
REDOS: list[tuple[str, set[str], set[str]]] = []
"""Per redo of a task: the task, the writes already done for it, the writes feedback named."""


@pytest.fixture(autouse=True)
def _clear() -> None:
    WRITES.clear()
    REDOS.clear()


@tool(name="rb_lookup")
async def lookup(reservation: str) -> dict[str, str]:
    return {"reservation": reservation, "status": "booked"}


@tool(side_effect=True, name="rb_cancel")
async def cancel(reservation: str, reason: str, notify: bool = True) -> str:
    WRITES.append(("rb_cancel", reservation))
    return f"cancelled {reservation}"


@tool(side_effect=True, name="rb_refund")
async def refund(reservation: str, lines: list[str]) -> dict[str, object]:
    WRITES.append(("rb_refund", reservation))
    return {"refunded": reservation, "lines": sorted(lines)}


TOOLS: list[Tool[Any]] = [lookup, cancel, refund]


def sampled_answer(request: ModelRequest) -> ModelResponse:
    """What a sampled model asks for: other words, counts and orders on every call."""
    task = request.messages[0].content.split()[-1]
    reservation = f"R-{task}"
    calls = [
        ModelToolCall(name="rb_lookup", arguments={"reservation": reservation}, id=f"l{i}")
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
        ModelToolCall(name="rb_cancel", arguments=cancel_args, id="c"),
        ModelToolCall(name="rb_refund", arguments={"reservation": reservation, "lines": lines}),
    ]
    random.shuffle(writes)
    return ModelResponse(text=f"done with {task}", tool_calls=(*calls, *writes))


class Executor(Agent[AgentState]):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.model = FunctionModel(sampled_answer, name="sampled")

    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        task = get(message.payload, "task", str)
        already = {tool for tool, r in WRITES if r == f"R-{task}"}
        if already:
            named = set()
            if ctx.feedback:
                named = {
                    d.tool
                    for d in ctx.feedback[-1].done
                    if d.arguments.get("reservation") == f"R-{task}"
                }
            REDOS.append((task, already, named))
        prompt = [ChatMessage(role="user", content=f"handle task {task}")]
        prompt += [ChatMessage(role="user", content=f.text()) for f in ctx.feedback[-1:]]
        answer = await ctx.chat(self.model, prompt, tools=TOOLS)
        results = await run_tool_calls(ctx, answer, TOOLS)
        assert all(not r.content.startswith("error") for r in results), results
        ctx.send("auditor", {"task": task, "report": answer.text}, kind="report")


class Auditor(Agent[AgentState]):
    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        if random.random() < REJECT:
            ctx.reject("executor", "the report lacks the refund lines; check them")
        done = self.state.memory.setdefault("done", [])
        assert isinstance(done, list)
        done.append(get(message.payload, "task", str))


async def run_tasks(runtime: Runtime, ledger: Ledger) -> int:
    async with runtime:
        runtime.add(Executor("executor"))
        runtime.add(Auditor("auditor"))
        for task in range(TASKS):
            runtime.send("executor", {"task": str(task)})
        await runtime.run_until_idle()
        done = runtime.agents["auditor"].state.memory["done"]
    assert sorted(done, key=int) == [str(t) for t in range(TASKS)], "every task was reported"
    twice = {w: n for w, n in Counter(WRITES).items() if n > 1}
    assert not twice, f"writes performed more than once: {twice}"
    assert len(WRITES) == 2 * TASKS
    entries = await ledger.list_calls(runtime.run_id)
    assert len(entries) == 2 * TASKS, "one ledger entry per write"
    unnamed = [(task, already - named) for task, already, named in REDOS if already - named]
    assert not unnamed, f"redos whose feedback did not name the writes already done: {unnamed}"
    return len(runtime.rollbacks)


@pytest.mark.parametrize("seed", range(2))
async def test_rollbacks_of_a_sampled_executor_never_write_twice_in_memory(seed: int) -> None:
    ledger = MemoryLedger()
    runtime = Runtime(ledger=ledger, retry=RetryPolicy(stop=tenacity.stop_after_attempt(50)))
    rollbacks = await run_tasks(runtime, ledger)
    assert rollbacks >= TASKS // 2, "the auditor rejected reports after writes"
    assert REDOS, "redos met writes already done"


async def test_rollbacks_of_a_sampled_executor_never_write_twice_on_sqlite(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'agentsnap.db'}"
    store = SqlStore(url)
    ledger = SqlLedger(url)
    try:
        runtime = Runtime(
            store=store, ledger=ledger, retry=RetryPolicy(stop=tenacity.stop_after_attempt(50))
        )
        rollbacks = await run_tasks(runtime, ledger)
        assert rollbacks >= TASKS // 2
        calls = await ledger.list_model_calls(runtime.run_id)
        assert len({c.timeline for c in calls}) > 1, "rollbacks asked the model again"
        assert all(c.replays == 0 for c in calls), "no rollback replayed a recorded answer"
    finally:
        await ledger.close()
        await store.close()
