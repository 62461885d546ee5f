"""A LangChain ``create_agent`` writer and an agentsnap critic; a child process for crash tests.

The writer is a LangChain agent with the agentsnap middleware. Its model (``SampledChat``,
a LangChain ``BaseChatModel`` with no network) answers the user's turn with two tool calls,
``look_up`` (read-only) then ``send_email`` (side-effecting), whose text it words at random
each time it is asked, with call ids of its own; once the tools answered, it writes the final
answer, with an apology when the conversation says an earlier answer was rejected. The critic
rejects an answer without an apology, so every run rolls back once.

``send_email`` stands for a mail service with a table of its own in the *service* SQLite
file: every run of its body is a row of ``attempts``, and the effect is a row of ``effects``
keyed by the idempotency key it is handed (``INSERT OR IGNORE``: the service deduplicates a
key). Every time the model is asked, a row of ``asks`` says what about: ``plan`` (the user's
turn), ``final`` (after the tools), ``redo-plan`` and ``redo-final`` (the same, after the
rejection).

Usage::

    python tests/integrations/langchain_team.py URL SERVICE RUN_ID [--hang POINT] [--resume]

``--hang`` makes the process print ``HANG`` and stop at a point (``lookup``: in
``look_up``'s body; ``effect``: in ``send_email``'s body after the effect; ``final`` /
``redo-final``: when the model is asked for that answer) for the test to kill it with
SIGKILL. ``--resume`` resumes the run, sending the user's turn again only when
``runtime.inputs_sent`` says it never was sent. At the end the process prints one JSON line
``{"result": ...}``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import sqlite3
import sys
import time
from collections.abc import Sequence
from typing import Any

from langchain.agents import create_agent
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool as lc_tool
from langgraph.pregel import Pregel
from pydantic import Field

from agentsnap import Agent, AgentState, Context, Message, Runtime
from agentsnap.integrations.langchain import (
    AgentsnapMiddleware,
    LangChainAgent,
    SideEffect,
    idempotency_key,
)
from agentsnap.store.sql import SqlStore

TASK = "Tell ann@example.com that the report is late."
WORDINGS = ["the report is late", "the report will be late", "expect the report later"]
_RANDOM = random.SystemRandom()


class Service:
    """The mail service's tables, and where the process stops for the test to kill it."""

    path: str | None = None
    hang: str | None = None

    @classmethod
    def connect(cls) -> sqlite3.Connection:
        assert cls.path is not None
        db = sqlite3.connect(cls.path, timeout=30, isolation_level=None)
        db.execute("CREATE TABLE IF NOT EXISTS asks (what TEXT)")
        db.execute("CREATE TABLE IF NOT EXISTS attempts (key TEXT, text TEXT)")
        db.execute("CREATE TABLE IF NOT EXISTS effects (key TEXT PRIMARY KEY, text TEXT)")
        return db

    @classmethod
    def write(cls, sql: str, *args: Any) -> None:
        if cls.path is None:
            return
        with contextlib.closing(cls.connect()) as db:
            db.execute(sql, args)

    @classmethod
    def stop_at(cls, point: str) -> None:
        if cls.hang == point:
            print("HANG", flush=True)
            time.sleep(3600)


SENT: list[tuple[str | None, str]] = []
"""The emails sent in this process (key, text), for tests that run the team in-process."""


@lc_tool
def look_up(name: str) -> str:
    """Look up a person's email address."""
    Service.stop_at("lookup")
    return f"{name}@example.com"


@lc_tool
async def send_email(to: str, text: str) -> str:
    """Send an email."""
    key = idempotency_key()
    SENT.append((key, text))
    Service.write("INSERT INTO attempts VALUES (?, ?)", key, text)
    Service.write("INSERT OR IGNORE INTO effects VALUES (?, ?)", key, text)
    Service.stop_at("effect")
    return f"sent to {to}"


def rejected(messages: Sequence[BaseMessage]) -> bool:
    return any(isinstance(m, HumanMessage) and "rejected" in m.text for m in messages)


class SampledChat(BaseChatModel):
    """A chat model that words its tool calls at random, like one at a temperature above 0."""

    asked: list[str] = Field(default_factory=list)
    """What the model was asked about, in order."""

    @property
    def _llm_type(self) -> str:
        return "sampled-chat"

    def bind_tools(self, tools: Any, **kwargs: Any) -> SampledChat:
        return self

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: Any = None,
        **kwargs: Any,
    ) -> ChatResult:
        redo = rejected(messages)
        what = ("redo-" if redo else "") + (
            "final" if isinstance(messages[-1], ToolMessage) else "plan"
        )
        self.asked.append(what)
        Service.write("INSERT INTO asks VALUES (?)", what)
        Service.stop_at(what)
        tag = f"{_RANDOM.randrange(16**8):08x}"
        if what.endswith("plan"):
            text = f"{_RANDOM.choice(WORDINGS)} ({tag})"
            message = AIMessage(
                content="",
                tool_calls=[
                    {"name": "look_up", "args": {"name": "ann"}, "id": f"lookup-{tag}"},
                    {
                        "name": "send_email",
                        "args": {"to": "ann", "text": text},
                        "id": f"send-{tag}",
                    },
                ],
                usage_metadata={"input_tokens": 20, "output_tokens": 8, "total_tokens": 28},
                response_metadata={"model_name": "sampled-chat"},
            )
        else:
            sent = next(m.text for m in reversed(messages) if isinstance(m, ToolMessage))
            apology = "Sorry for the delay: " if redo else ""
            message = AIMessage(
                content=f"{apology}I told Ann ({sent}).",
                usage_metadata={"input_tokens": 30, "output_tokens": 6, "total_tokens": 36},
                response_metadata={"model_name": "sampled-chat"},
            )
        return ChatResult(generations=[ChatGeneration(message=message)])


class ToolingFake(GenericFakeChatModel):
    """LangChain's fake chat model, its answers given, taking the agent's tools."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> ToolingFake:
        return self


class Critic(Agent[AgentState]):
    """Rejects an answer that does not apologise."""

    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        answer = str(message.payload)
        if "sorry" not in answer.lower():
            ctx.reject("writer", "apologise for the delay")
        self.state.memory["accepted"] = answer


def writer_agent(
    model: BaseChatModel | None = None, **middleware: Any
) -> Pregel[Any, Any, Any, Any]:
    """The LangChain agent: ``look_up`` read-only, ``send_email`` side-effecting."""
    options = middleware or {"read_only": ["look_up"]}
    return create_agent(
        model or SampledChat(),
        tools=[look_up, send_email],
        system_prompt="You write short emails.",
        middleware=[AgentsnapMiddleware(**options)],
    )


def add_team(runtime: Runtime, **middleware: Any) -> LangChainAgent:
    writer = runtime.add(LangChainAgent("writer", writer_agent(**middleware), send_to="critic"))
    runtime.add(Critic("critic"))
    return writer


async def main(options: argparse.Namespace) -> int:
    Service.path = options.service
    Service.hang = options.hang
    store = SqlStore(options.url)
    try:
        runtime = Runtime(store=store, run_id=options.run_id)
        # A service that deduplicates by key may run an effect whose outcome is unknown again.
        writer = add_team(
            runtime,
            read_only=["look_up"],
            side_effects={"send_email": SideEffect(rerun_if_unknown=True)},
        )
        if options.resume:
            await runtime.resume()
            if not runtime.inputs_sent.get("writer"):
                runtime.send("writer", TASK)
        else:
            runtime.send("writer", TASK)
        await runtime.run_until_idle()
        await runtime.close()
        result = {
            "answer": writer.state.answer,
            "accepted": runtime.agents["critic"].state.memory.get("accepted"),
            "rollbacks": len(runtime.rollbacks),
        }
        print(json.dumps({"result": result}), flush=True)
    finally:
        await store.close()
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("service")
    parser.add_argument("run_id")
    parser.add_argument("--hang", default=None)
    parser.add_argument("--resume", action="store_true")
    sys.exit(asyncio.run(main(parser.parse_args())))
