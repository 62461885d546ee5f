"""A run whose writer's first draft is rejected; the redo waits, and is killed there.

``python feedback_child.py DB RUN`` runs it until the redo waits (it prints ``waiting`` and
sleeps); ``python feedback_child.py DB RUN --resume`` resumes it and prints, as JSON, the
feedback the redo saw and the draft that passed.
"""

from __future__ import annotations

import asyncio
import json
import sys

from agentsnap import Agent, AgentState, Context, Message, Runtime
from agentsnap.store.sql import SqlStore


class Writer(Agent[AgentState]):
    def __init__(self, name: str, *, wait: bool) -> None:
        super().__init__(name)
        self.wait = wait
        self.seen: list[str] = []

    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        self.seen = [f.reason for f in ctx.feedback]
        if not self.seen:
            ctx.send("sink", "a long long draft", kind="draft")
            return
        if self.wait:  # the redo of the first process: it is killed here
            print("waiting", flush=True)
            await asyncio.sleep(3600)
        ctx.send("sink", "short", kind="draft")


class Sink(Agent[AgentState]):
    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        self.state.memory["draft"] = message.payload


def short(message: Message) -> bool | str:
    return len(str(message.payload)) < 10 or "the draft is too long"


async def main(db: str, run_id: str, resume: bool) -> None:
    async with Runtime(store=SqlStore(db), run_id=run_id) as runtime:
        writer = runtime.add(Writer("writer", wait=not resume))
        sink = runtime.add(Sink("sink"))
        runtime.check("writer", kind="draft", check=short, name="length")
        if resume:
            await runtime.resume()
        else:
            runtime.send("writer", "write")
        await runtime.run_until_idle()
        print(json.dumps({"seen": writer.seen, "draft": sink.state.memory.get("draft")}))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], "--resume" in sys.argv))
