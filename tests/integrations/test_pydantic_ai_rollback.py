"""A rejected answer rolls the team back; the pydantic-ai agent is asked again with the reason.

A critic (or the agent's own ``evaluate``) rejects the clerk's first answer. The run goes back
to the last consistent cut, the conversation in the clerk's state with it, and the clerk's
model, a ``FunctionModel``, finds the reason in its prompt and answers otherwise. The cut
holds the clerk's conversation, as ``agentsnap show`` prints it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path

from click.testing import CliRunner
from pydantic_ai import Agent as PydanticAgent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, UserPromptPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from agentsnap import Agent, AgentState, Context, Message, Runtime
from agentsnap.checks import CheckResult
from agentsnap.cli import main as cli
from agentsnap.integrations.pydantic_ai import (
    AgentsnapDurability,
    PydanticAIAgent,
    PydanticAIState,
)
from agentsnap.store.ledger import MemoryLedger
from agentsnap.store.sql import SqlStore


class Clerk:
    """A model that apologises once its prompt says an answer was rejected."""

    def __init__(self) -> None:
        self.prompts: list[str] = []

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        prompt = next(
            str(part.content)
            for part in reversed(messages[-1].parts)
            if isinstance(part, UserPromptPart)
        )
        self.prompts.append(prompt)
        if "apologise" in prompt:
            return ModelResponse(parts=[TextPart("Sorry: your parcel is late.")])
        return ModelResponse(parts=[TextPart("Your parcel is late.")])


class Critic(Agent[AgentState]):
    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        if "Sorry" not in str(message.payload):
            ctx.reject("clerk", "apologise to the customer")
        self.state.memory["accepted"] = message.payload


def clerk_agent(model: Clerk) -> PydanticAgent[None, str]:
    return PydanticAgent(FunctionModel(model), capabilities=[AgentsnapDurability()])


async def test_a_critic_rejection_reaches_the_next_prompt_and_changes_the_answer() -> None:
    model = Clerk()
    ledger = MemoryLedger()
    async with Runtime(ledger=ledger) as runtime:
        clerk = runtime.add(PydanticAIAgent("clerk", clerk_agent(model), to="critic"))
        critic = runtime.add(Critic("critic"))
        runtime.send("clerk", "Where is my parcel?")
        await runtime.run_until_idle()

    (rollback,) = runtime.rollbacks
    assert (rollback.agent, rollback.source) == ("clerk", "critic")
    assert model.prompts[0] == "Where is my parcel?"
    assert "rejected by critic: apologise to the customer" in model.prompts[1]
    assert critic.state.memory["accepted"] == "Sorry: your parcel is late."
    # The conversation went back with the cut: the rejected answer is not in it.
    texts = json.dumps(clerk.state.messages)
    assert "Your parcel is late." not in texts
    assert clerk.state.feedback_seen == 1
    calls = await ledger.list_model_calls(runtime.run_id)
    assert [(c.timeline, c.answer().text) for c in calls] == [
        (0, "Your parcel is late."),
        (1, "Sorry: your parcel is late."),
    ]


class SelfCritical(PydanticAIAgent):
    async def evaluate(
        self, outputs: Sequence[Message], ctx: Context[PydanticAIState]
    ) -> CheckResult:
        text = str(self.state.output)
        return None if text.startswith("Sorry") else "apologise to the customer"


async def test_the_agent_own_evaluation_rejects_and_the_redo_is_told() -> None:
    model = Clerk()
    async with Runtime() as runtime:
        clerk = runtime.add(SelfCritical("clerk", clerk_agent(model), to="sink"))
        runtime.add(Sink("sink"))
        runtime.send("clerk", "Where is my parcel?")
        await runtime.run_until_idle()
    (rollback,) = runtime.rollbacks
    assert rollback.source == "self-evaluation"
    assert clerk.state.output == "Sorry: your parcel is late."
    assert clerk.state.runs == 1


class Sink(Agent[AgentState]):
    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        self.state.memory["got"] = message.payload


async def make_run(url: str) -> str:
    """A run with the rollback above in ``url``; the id of a cut taken once it is idle."""
    store = SqlStore(url)
    try:
        async with Runtime(store=store) as runtime:
            runtime.add(PydanticAIAgent("clerk", clerk_agent(Clerk()), to="critic"))
            runtime.add(Critic("critic"))
            runtime.send("clerk", "Where is my parcel?")
            await runtime.run_until_idle()
            cut = await runtime.snapshot()
    finally:
        await store.close()
    return cut.id


def test_the_conversation_is_in_the_cut_shown_by_agentsnap_show(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'agentsnap.db'}"
    cut = asyncio.run(make_run(url))

    shown = CliRunner().invoke(cli, ["show", cut, "--agent", "clerk", "--json", "--db", url])
    assert shown.exit_code == 0, shown.output
    state = json.loads(shown.output)["agents"]["clerk"]["state"]
    assert state["output"] == "Sorry: your parcel is late."
    parts = [part for message in state["messages"] for part in message["parts"]]
    assert [p["part_kind"] for p in parts] == ["user-prompt", "text"]
    assert "rejected by critic" in parts[0]["content"]
    text = CliRunner().invoke(cli, ["show", cut, "--agent", "clerk", "--db", url])
    assert text.exit_code == 0, text.output
    assert "Sorry: your parcel is late." in text.output
