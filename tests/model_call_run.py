"""A run whose agents ask models, with a rollback: model calls on two timelines.

A writer asks its model for a draft and a summary, then sends the draft to a reviewer, who
asks its own model for a verdict. The first draft is too long: the reviewer rejects it, the
run rolls back and the writer asks again with the feedback (timeline 1), the reviewer asks
again and accepts. The run goes idle and snapshot ``first`` is taken; a second round follows
(message 2 of each channel), and snapshot ``second`` when it is idle again. Tokens are
counted in words.
"""

from __future__ import annotations

from dataclasses import dataclass

from payloads import get

from agentsnap import (
    Agent,
    AgentState,
    Context,
    Message,
    ModelResponse,
    Runtime,
    Store,
)
from agentsnap.ledger import Ledger
from agentsnap.models import ModelRequest, Usage
from agentsnap.testing import FunctionModel


def _answer(text: str, request: ModelRequest) -> ModelResponse:
    prompt = " ".join(m.content for m in request.messages)
    return ModelResponse(
        text=text,
        usage=Usage(input_tokens=len(prompt.split()), output_tokens=len(text.split())),
    )


def writer_model() -> FunctionModel:
    def answer(request: ModelRequest) -> ModelResponse:
        prompt = request.messages[-1].content
        if prompt.startswith("summarise"):
            return _answer("a summary", request)
        if "too long" in prompt:
            return _answer("a draft in one line\nsecond line", request)
        return _answer("a long long long draft", request)

    return FunctionModel(answer, name="writer-model")


def reviewer_model() -> FunctionModel:
    def answer(request: ModelRequest) -> ModelResponse:
        ok = "one line" in request.messages[-1].content
        return _answer("verdict: ok" if ok else "verdict: too long", request)

    return FunctionModel(answer, name="reviewer-model")


class Writer(Agent[AgentState]):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.model = writer_model()

    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        hint = " ".join(f.text() for f in ctx.feedback)
        draft = await self.model.complete(f"write a draft {hint}".strip())
        await self.model.complete(f"summarise {draft}")
        self.state.memory["draft"] = draft
        ctx.send("reviewer", {"draft": draft}, kind="draft")


class Reviewer(Agent[AgentState]):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.model = reviewer_model()

    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        draft = get(message.payload, "draft", str)
        verdict = await self.model.complete(f"review: {draft}")
        if verdict != "verdict: ok":
            ctx.reject("writer", "too long; say it in one line")
        self.state.memory["accepted"] = draft


@dataclass(frozen=True)
class ModelCallRun:
    run_id: str
    first: str
    """A snapshot taken after the first round (the rollback and the redo)."""
    second: str
    """A snapshot taken after the second round."""


async def make_model_call_run(store: Store, ledger: Ledger | None = None) -> ModelCallRun:
    """Make the run in ``store`` (its model calls in ``ledger``, else the store's own)."""
    async with Runtime(store=store, ledger=ledger, name="model calls") as runtime:
        runtime.add(Writer("writer"))
        runtime.add(Reviewer("reviewer"))
        runtime.send("writer", {"round": 1})
        await runtime.run_until_idle()
        assert len(runtime.rollbacks) == 1
        first = await latest_snapshot(store, runtime.run_id)
        runtime.send("writer", {"round": 2})
        await runtime.run_until_idle()
        second = await latest_snapshot(store, runtime.run_id)
    return ModelCallRun(runtime.run_id, first, second)


async def latest_snapshot(store: Store, run_id: str) -> str:
    """The run's latest snapshot: the one taken when the run went idle."""
    return (await store.list_snapshot_summaries(run_id))[-1].id
