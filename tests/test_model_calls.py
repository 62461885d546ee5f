"""Model calls are recorded steps: kept by their identity, replayed on the same timeline,
asked again after a rollback; effects keyed by the call, not by the model's wording."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import pytest
from payloads import get
from pydantic import Field

from agentsnap import (
    Agent,
    AgentState,
    Context,
    EffectDiverged,
    HandlerFailed,
    Message,
    ModelResponse,
    Runtime,
    tool,
)
from agentsnap.agents import BoundModel
from agentsnap.ledger import Ledger, call_key
from agentsnap.model_calls import ModelCallLog, ModelCallRecord, recorded_call
from agentsnap.models import ChatMessage, LangChainModel, ModelRequest, ModelToolCall
from agentsnap.store.ledger import MemoryLedger
from agentsnap.store.sql import SqlStore
from agentsnap.testing import FunctionModel, SampledModel, ScriptedModel
from agentsnap.tools import run_tool_calls

SENT: list[dict[str, Any]] = []
LOOKUPS: list[str] = []


@pytest.fixture(autouse=True)
def _clear() -> None:
    SENT.clear()
    LOOKUPS.clear()


@tool(side_effect=True, name="mc_send_email")
async def send_email(to: str, text: str) -> str:
    SENT.append({"to": to, "text": text})
    return f"sent #{len(SENT)}"


@tool(name="mc_lookup")
async def lookup(topic: str) -> str:
    LOOKUPS.append(topic)
    return f"facts about {topic}"


@tool(side_effect=True, name="mc_cancel", key_from=("reservation",))
async def cancel(reservation: str, reason: str) -> str:
    SENT.append({"cancel": reservation, "reason": reason})
    return f"cancelled {reservation}"


class WriterState(AgentState):
    drafts: list[str] = Field(default_factory=list)


class Writer(Agent[WriterState]):
    """Asks its model for an email, sends it, then asks for a summary."""

    def __init__(self, name: str, model: Any) -> None:
        super().__init__(name, WriterState())
        self.model = model

    async def handle(self, message: Message, ctx: Context[WriterState]) -> None:
        hint = " ".join(f.text() for f in ctx.feedback)
        text = await self.model.complete(f"write the email {hint}".strip())
        self.state.drafts.append(text)
        await send_email(ctx, to="ann@example.com", text=text)
        await self.model.complete("summarise the email")
        ctx.send("critic", {"draft": text}, kind="draft")


class Critic(Agent[AgentState]):
    """Rejects a draft that is not one line."""

    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        draft = get(message.payload, "draft", str)
        if "one line" not in draft:
            ctx.reject("writer", "too long; say it in one line")
        self.state.memory["accepted"] = draft


def sampled_email_model() -> SampledModel:
    return SampledModel(
        [
            ("summarise", ["short", "brief", "in short"]),
            ("one line", [f"Hi Ann, in one line ({i})" for i in range(50)]),
            ("write the email", [f"Hello Ann, variant {i}" for i in range(50)]),
        ],
        seed=random.randrange(1 << 30),
    )


async def test_a_model_kept_on_the_agent_is_recorded_by_position_and_timeline() -> None:
    ledger = MemoryLedger()
    model = sampled_email_model()
    runtime = Runtime(ledger=ledger)
    async with runtime:
        writer = runtime.add(Writer("writer", model))
        runtime.add(Critic("critic"))
        assert isinstance(writer.model, BoundModel), "the runtime records the agent's model"
        runtime.send("writer", {"go": True})
        await runtime.run_until_idle()

    calls = await ledger.list_model_calls(runtime.run_id)
    assert [(c.agent, c.message_id, c.position, c.timeline) for c in calls] == [
        ("writer", "$env>writer#1", 0, 0),
        ("writer", "$env>writer#1", 1, 0),
        ("writer", "$env>writer#1", 0, 1),
        ("writer", "$env>writer#1", 1, 1),
    ], "a rollback starts a new timeline, where the model is asked again"
    assert model.calls == 4
    first, _, redo, _ = calls
    assert first.asked().messages[0].content == "write the email"
    assert "too long" in redo.asked().messages[0].content, "the redo is asked with feedback"
    assert writer.state.drafts == [redo.answer().text], "the cut's state, then the redo"
    assert all(c.model == "sampled" and c.latency_ms >= 0 for c in calls)
    assert all(c.replays == 0 for c in calls), "nothing was replayed: the model was asked"


async def test_a_redo_that_words_the_effect_otherwise_does_not_send_it_again() -> None:
    for _ in range(20):  # a sampled model: every redo words the email otherwise
        SENT.clear()
        ledger = MemoryLedger()
        runtime = Runtime(ledger=ledger)
        async with runtime:
            writer = runtime.add(Writer("writer", sampled_email_model()))
            runtime.add(Critic("critic"))
            runtime.send("writer", {"go": True})
            await runtime.run_until_idle()
        assert len(runtime.rollbacks) == 1
        assert len(SENT) == 1, f"the email was sent {len(SENT)} times"
        (entry,) = await ledger.list_calls(runtime.run_id)
        assert entry.arguments["text"] == SENT[0]["text"]
        assert entry.timeline == 0
        (call,) = writer.state.tool_calls
        assert call.status == "replayed"


async def test_the_same_identity_gets_the_recorded_answer_without_asking() -> None:
    log = MemoryLedger()
    model = sampled_email_model()
    request = ModelRequest(messages=(ChatMessage(role="user", content="write the email"),))

    async def ask(r: ModelRequest) -> ModelResponse:
        return await model.respond(r)

    identity = {
        "run_id": "r",
        "agent": "writer",
        "message_id": "$env>writer#1",
        "position": 0,
        "timeline": 3,
    }
    first, replayed = await recorded_call(log, request, ask, **identity)  # type: ignore[arg-type]
    assert not replayed
    other = ModelRequest(messages=(ChatMessage(role="user", content="write the email, v2"),))
    again, replayed = await recorded_call(log, other, ask, **identity)  # type: ignore[arg-type]
    assert replayed, "keyed by the call's identity, not by its prompt"
    assert again == first
    assert model.calls == 1, "the model was not asked again"
    (record,) = await log.list_model_calls("r")
    assert record.replays == 1
    _, replayed = await recorded_call(
        log,
        request,
        ask,
        **{**identity, "timeline": 4},  # type: ignore[arg-type]
    )
    assert not replayed, "another timeline asks the model again"
    assert model.calls == 2


class SlowLog(MemoryLedger):
    """A ledger whose writes of model calls take a while (a busy database)."""

    def __init__(self) -> None:
        super().__init__()
        self.writing = asyncio.Event()
        self.proceed = asyncio.Event()

    async def record_model_call(self, record: ModelCallRecord) -> bool:
        self.writing.set()
        await self.proceed.wait()
        return await super().record_model_call(record)


async def test_a_handler_cancelled_while_its_answer_is_written_leaves_it_written() -> None:
    """A rollback cancels a handler whose model answered and whose answer is being written:
    the write ends first, so the redo finds the answer instead of asking again."""
    log = SlowLog()
    model = sampled_email_model()
    request = ModelRequest(messages=(ChatMessage(role="user", content="write the email"),))

    async def ask(r: ModelRequest) -> ModelResponse:
        return await model.respond(r)

    identity: dict[str, Any] = {
        "run_id": "r",
        "agent": "writer",
        "message_id": "$env>writer#1",
        "position": 0,
        "timeline": 0,
    }
    handler = asyncio.create_task(recorded_call(log, request, ask, **identity))
    await log.writing.wait()
    handler.cancel()  # the rollback
    await asyncio.sleep(0.01)
    assert not handler.done(), "the cancellation waits for the answer to be written"
    log.proceed.set()
    with pytest.raises(asyncio.CancelledError):
        await handler
    (record,) = await log.list_model_calls("r")
    again, replayed = await recorded_call(log, request, ask, **identity)
    assert replayed, "the redo got the recorded answer"
    assert model.calls == 1, "the model was not asked again"
    assert again == record.answer()


class Booker(Agent[AgentState]):
    """Follows the tool calls its model asks for: read-only lookups, then writes."""

    def __init__(self, name: str, model: Any) -> None:
        super().__init__(name)
        self.model = model

    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        answer = await ctx.chat(
            self.model,
            [
                ChatMessage(
                    role="user",
                    content=" ".join(["cancel the booking", *(f.text() for f in ctx.feedback)]),
                )
            ],
            tools=[lookup, cancel, send_email],
        )
        results = await run_tool_calls(ctx, answer, [lookup, cancel, send_email])
        assert all(not r.content.startswith("error") for r in results), results
        ctx.send("critic", {"draft": answer.text}, kind="draft")


def booking_answer(request: ModelRequest) -> ModelResponse:
    """A sampled answer: a random number of lookups first, a reason worded at random, and
    the confirmation email's text at random."""
    assert [t.name for t in request.tools] == ["mc_lookup", "mc_cancel", "mc_send_email"]
    calls = [
        ModelToolCall(name="mc_lookup", arguments={"topic": f"booking {i}"})
        for i in range(random.randrange(4))
    ]
    reason = random.choice(["asked by the client", "client request", "the client asked"])
    calls.append(ModelToolCall(name="mc_cancel", arguments={"reservation": "R7", "reason": reason}))
    text = random.choice(["Your booking is cancelled.", "Booking R7 cancelled.", "Done."])
    if "one line" in request.messages[-1].content:
        text += " (one line)"
    calls.append(ModelToolCall(name="mc_send_email", arguments={"to": "bo@x.org", "text": text}))
    return ModelResponse(text=text, tool_calls=tuple(calls))


async def test_only_a_tools_own_side_effecting_calls_place_it_and_key_from_names_it() -> None:
    for _ in range(20):
        SENT.clear()
        ledger = MemoryLedger()
        runtime = Runtime(ledger=ledger)
        async with runtime:
            runtime.add(Booker("writer", FunctionModel(booking_answer)))
            runtime.add(Critic("critic"))
            runtime.send("writer", {"go": True})
            await runtime.run_until_idle()
        assert len(runtime.rollbacks) == 1
        assert [s.get("cancel") for s in SENT if "cancel" in s] == ["R7"], SENT
        assert len([s for s in SENT if "to" in s]) == 1, "one confirmation email"
        keys = {e.tool: e.key for e in await ledger.list_calls(runtime.run_id)}
        assert keys["mc_cancel"] == call_key(
            runtime.run_id, "writer", "$env>writer#1", "mc_cancel", {"reservation": "R7"}
        )
        assert keys["mc_send_email"] == call_key(
            runtime.run_id, "writer", "$env>writer#1", "mc_send_email", 0
        )


@tool(side_effect=True, name="mc_stamp")
async def stamp(at: float) -> str:
    SENT.append({"stamp": at})
    return f"stamped {at}"


@tool(side_effect=True, name="mc_stamp_lenient", on_divergence="recorded")
async def stamp_lenient(at: float) -> str:
    SENT.append({"stamp": at})
    return f"stamped {at}"


async def test_a_re_execution_on_the_same_timeline_with_other_arguments_fails_closed() -> None:
    """What a resumed handler that reads the clock meets: the same call, other arguments."""
    ledger: Ledger = MemoryLedger()
    assert isinstance(ledger, ModelCallLog)

    class Stamper(Agent[AgentState]):
        async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
            self.state.memory["result"] = await stamp(ctx, at=random.random())

    for attempt in (1, 2):
        runtime = Runtime(ledger=ledger, run_id="stamp-run")
        async with runtime:
            stamper = runtime.add(Stamper("stamper"))
            runtime.send("stamper", {})
            if attempt == 1:
                await runtime.run_until_idle()
                continue
            with pytest.raises(HandlerFailed) as caught:
                await runtime.run_until_idle()
    diverged = caught.value.__cause__
    assert isinstance(diverged, EffectDiverged)
    assert diverged.tool == "mc_stamp"
    assert diverged.recorded == {"at": SENT[0]["stamp"]}
    assert diverged.arguments != diverged.recorded
    assert len(SENT) == 1, "the effect ran once"
    assert stamper.state.tool_calls[0].status == "error"
    assert "EffectDiverged" in (stamper.state.tool_calls[0].error or "")

    class LenientStamper(Agent[AgentState]):
        async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
            self.state.memory["result"] = await stamp_lenient(ctx, at=random.random())

    SENT.clear()
    results = []
    for _ in (1, 2):
        runtime = Runtime(ledger=ledger, run_id="lenient-run")
        async with runtime:
            lenient = runtime.add(LenientStamper("stamper"))
            runtime.send("stamper", {})
            await runtime.run_until_idle()
        results.append(lenient.state.memory["result"])
    assert len(SENT) == 1
    assert results[0] == results[1], "the recorded outcome stood for the re-executed call"


async def test_a_scripted_model_answers_with_tool_calls_and_usage() -> None:
    answer = ModelResponse(
        text="calling",
        tool_calls=(ModelToolCall(name="mc_lookup", arguments={"topic": "x"}, id="c1"),),
    )
    model = ScriptedModel([("look", answer)])
    got = await model.respond(
        ModelRequest(messages=(ChatMessage(role="user", content="look it up"),))
    )
    assert got.tool_calls[0].name == "mc_lookup"
    assert got.model == "scripted"
    assert got.message().role == "assistant"
    assert await model.complete("look") == "calling"


async def test_a_langchain_chat_model_answers_with_tool_calls_and_usage() -> None:
    from langchain_core.language_models.fake_chat_models import (
        FakeMessagesListChatModel,
    )
    from langchain_core.messages import AIMessage

    class ToolFake(FakeMessagesListChatModel):
        def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
            self.__dict__["bound"] = tools
            return self

    fake = ToolFake(
        responses=[
            AIMessage(
                content="looking",
                tool_calls=[{"name": "mc_lookup", "args": {"topic": "x"}, "id": "c1"}],
                usage_metadata={"input_tokens": 12, "output_tokens": 3, "total_tokens": 15},
                response_metadata={"model_name": "fake-1"},
            )
        ]
    )
    model = LangChainModel(fake)
    answer = await model.respond(
        ModelRequest(
            messages=(ChatMessage(role="user", content="look it up"),),
            tools=(lookup.spec(),),
        )
    )
    assert answer.tool_calls == (
        ModelToolCall(name="mc_lookup", arguments={"topic": "x"}, id="c1"),
    )
    assert (answer.usage.input_tokens, answer.usage.output_tokens) == (12, 3)
    assert answer.model == "fake-1"
    assert fake.__dict__["bound"][0]["function"]["name"] == "mc_lookup"


@tool(side_effect=True, name="mc_refund", key_from=("reservation",))
async def refund(reservation: str, note: str) -> str:
    SENT.append({"refund": reservation, "note": note})
    return f"refunded {reservation} ({note})"


async def test_a_tool_that_names_its_effect_takes_other_wording_after_a_resume_as_the_same() -> (
    None
):
    ledger: Ledger = MemoryLedger()

    class Refunder(Agent[AgentState]):
        async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
            note = f"refund at {random.random()}"  # an unrecorded detail in the wording
            self.state.memory["result"] = await refund(ctx, reservation="R1", note=note)

    results = []
    for _ in (1, 2):  # the second runtime re-executes the handler, as a resumed one does
        runtime = Runtime(ledger=ledger, run_id="refund-run")
        async with runtime:
            refunder = runtime.add(Refunder("refunder"))
            runtime.send("refunder", {})
            await runtime.run_until_idle()
        results.append(refunder.state.memory["result"])
    assert [s["refund"] for s in SENT] == ["R1"], "refunded once"
    assert results[0] == results[1], "the recorded outcome, not a divergence"


async def test_only_models_kept_on_an_agent_are_recorded() -> None:
    class Counter:
        complete = 3  # not a model: no `async def complete`

    class Holder(Agent[AgentState]):
        def __init__(self, name: str) -> None:
            super().__init__(name)
            self.counter = Counter()
            self.model = ScriptedModel([("", "hi")])
            self.sampler = FunctionModel(lambda request: "hello")

        async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
            self.state.memory["said"] = await self.model.complete("say hi")

    async with Runtime() as runtime:
        holder = runtime.add(Holder("holder"))
        runtime.send("holder", {})
        await runtime.run_until_idle()
    assert isinstance(holder.counter, Counter)
    assert isinstance(holder.model, BoundModel)
    assert isinstance(holder.sampler, BoundModel)
    assert holder.state.memory["said"] == "hi"


async def test_a_model_kept_on_the_agent_and_passed_to_chat_is_recorded_once(
    tmp_path: Path,
) -> None:
    """``ctx.chat(self.model, ...)``: one record per call, so a resumed handler's second call
    gets the second answer, not the first."""
    url = f"sqlite:///{tmp_path / 'agentsnap.db'}"
    asked: list[str] = []

    def answer(request: ModelRequest) -> str:
        asked.append(str(request.messages[-1].content))
        return f"answer {len(asked)} to {request.messages[-1].content}"

    class Asker(Agent[AgentState]):
        def __init__(self, fail: bool) -> None:
            super().__init__("asker")
            self.model = FunctionModel(answer)
            self.fail = fail

        async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
            first = await ctx.chat(self.model, "first")
            second = await ctx.chat(self.model, "second")
            self.state.memory["answers"] = [first.text, second.text]
            if self.fail:
                raise RuntimeError("stopped after the model calls")

    answers = []
    for attempt in (1, 2):
        store = SqlStore(url)
        try:
            runtime = Runtime(store=store, run_id="ab" * 16)
            async with runtime:
                asker = runtime.add(Asker(fail=attempt == 1))
                if attempt == 1:
                    runtime.send("asker", {})
                else:
                    await runtime.resume()  # re-executes the failed handler, same timeline
                await runtime.run_until_idle(raise_failures=False)
                ledger = runtime.ledger
                assert isinstance(ledger, ModelCallLog)
                calls = await ledger.list_model_calls(runtime.run_id)
            answers.append(asker.state.memory["answers"])
        finally:
            await store.close()
    assert asked == ["first", "second"], "the resumed handler was not asked again"
    assert answers[1] == answers[0] == ["answer 1 to first", "answer 2 to second"]
    assert [(c.position, c.answer().text, c.replays) for c in calls] == [
        (0, "answer 1 to first", 1),
        (1, "answer 2 to second", 1),
    ]


async def test_a_model_is_asked_on_a_new_timeline_only_once_that_timeline_is_stored(
    tmp_path: Path,
) -> None:
    """A run resumed after a crash goes on with the newest stored timeline; a model call
    recorded on a newer one would be answered again by the resumed run's next rollback, which
    starts a timeline of the same number."""
    url = f"sqlite:///{tmp_path / 'agentsnap.db'}"
    run_id = "cd" * 16
    store = SqlStore(url)
    asked: list[tuple[int, int]] = []
    rejections: list[str] = []

    async def answer(request: ModelRequest) -> str:
        timeline = int(str(request.messages[-1].content).split()[-1])
        stored = max(s.timeline for s in await store.load_replay(run_id))
        asked.append((timeline, stored))
        return "a draft"

    class Drafter(Agent[AgentState]):
        def __init__(self) -> None:
            super().__init__("drafter")
            self.model = FunctionModel(answer)

        async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
            text = await self.model.complete(f"draft on timeline {ctx.timeline}")
            ctx.send("reviewer", {"draft": text}, kind="draft")

    class Reviewer(Agent[AgentState]):
        async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
            if len(rejections) < 2:
                rejections.append(message.id)
                ctx.reject("drafter", "again")

    try:
        async with Runtime(store=store, run_id=run_id) as runtime:
            runtime.add(Drafter())
            runtime.add(Reviewer("reviewer"))
            runtime.send("drafter", {})
            await runtime.run_until_idle()
    finally:
        await store.close()
    assert asked == [(0, 0), (1, 1), (2, 2)]
