"""Streaming a pydantic-ai agent inside an agentsnap handler, and its event-stream handler.

``run_stream``, ``run_stream_events``, ``iter`` and ``run`` with an event-stream handler make
streamed model requests. Each is one recorded step: the stream runs inside it, its events go
to the event-stream handler as the model streams them, and the final response is recorded
through ``Context.model_call`` with pydantic-ai's own JSON; the caller's stream then gives
that response. A replayed answer is not streamed to the handler again: that half is in
``test_pydantic_ai_crash.py`` (killed and resumed, with ``--stream``).
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator
from typing import Any

from pydantic_ai import Agent as PydanticAgent
from pydantic_ai import AgentRunResultEvent, RunContext
from pydantic_ai.messages import (
    AgentStreamEvent,
    FunctionToolCallEvent,
    FunctionToolResultEvent,
    ModelMessage,
    ModelResponse,
    PartStartEvent,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, DeltaToolCalls, FunctionModel

from agentsnap import Agent, AgentState, Context, Message, Runtime
from agentsnap.integrations.pydantic_ai import AgentsnapDurability, PydanticAIAgent, handling
from agentsnap.messages import JsonValue
from agentsnap.store import Store
from agentsnap.store.ledger import MemoryLedger, ledger_for
from agentsnap.store.sql_ledger import SqlLedger


class Streamed:
    """A streaming model: a ``book`` tool call in two chunks, then a reply in three; asked
    without streaming (``iter`` without streaming its nodes), the same answers whole."""

    def __init__(self) -> None:
        self.asked = 0

    def respond(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.asked += 1
        if any(isinstance(part, ToolReturnPart) for part in messages[-1].parts):
            return ModelResponse(parts=[TextPart("Room 12 is booked.")])
        return ModelResponse(parts=[ToolCallPart("book", {"room": "12"})])

    async def __call__(
        self, messages: list[ModelMessage], info: AgentInfo
    ) -> AsyncIterator[str | DeltaToolCalls]:
        self.asked += 1
        if any(isinstance(part, ToolReturnPart) for part in messages[-1].parts):
            for chunk in ("Room ", "12 is ", "booked."):
                yield chunk
        else:
            yield {0: DeltaToolCall("book", '{"room": ')}
            yield {0: DeltaToolCall(None, '"12"}')}


class Events:
    """An event-stream handler that keeps what it is handed."""

    def __init__(self) -> None:
        self.seen: list[AgentStreamEvent] = []

    async def __call__(self, ctx: RunContext[Any], events: AsyncIterable[AgentStreamEvent]) -> None:
        async for event in events:
            self.seen.append(event)

    def kinds(self, kind: type[Any]) -> list[Any]:
        return [e for e in self.seen if isinstance(e, kind)]


def booking_agent(model: Streamed, events: Events | None = None) -> PydanticAgent[None, str]:
    agent = PydanticAgent(
        FunctionModel(model.respond, stream_function=model),
        capabilities=[AgentsnapDurability(event_stream_handler=events)],
    )
    booked: list[str] = []

    @agent.tool_plain
    def book(room: str) -> str:
        """Book a room."""
        booked.append(room)
        return f"booked {room}"

    agent.booked = booked  # type: ignore[attr-defined]
    return agent


class Streaming(Agent[AgentState]):
    """Runs the agent with one of pydantic-ai's streaming entry points."""

    def __init__(self, name: str, agent: PydanticAgent[None, str], how: str) -> None:
        super().__init__(name)
        self.agent = agent
        self.how = how

    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        memory = self.state.memory
        with handling(ctx):
            if self.how == "run_stream":
                async with self.agent.run_stream("book a room") as stream:
                    chunks: list[JsonValue] = [c async for c in stream.stream_text(delta=True)]
                    memory["chunks"] = chunks
                    memory["output"] = await stream.get_output()
            elif self.how == "run_stream_events":
                kinds: list[JsonValue] = []
                async with self.agent.run_stream_events("book a room") as events:
                    async for event in events:
                        kinds.append(type(event).__name__)
                        if isinstance(event, AgentRunResultEvent):
                            memory["output"] = event.result.output
                memory["kinds"] = kinds
            else:
                async with self.agent.iter("book a room") as run:
                    nodes: list[JsonValue] = [type(node).__name__ async for node in run]
                assert run.result is not None
                memory["nodes"], memory["output"] = nodes, run.result.output


async def recorded(ledger: MemoryLedger | SqlLedger, run_id: str) -> list[tuple[str, Any]]:
    return [
        (c.answer().text, [t.name for t in c.answer().tool_calls])
        for c in await ledger.list_model_calls(run_id)
    ]


async def test_each_streaming_entry_point_records_its_requests(
    sql_store: Store,
) -> None:
    ledger = ledger_for(sql_store)
    assert isinstance(ledger, SqlLedger)
    models = {how: Streamed() for how in ("run_stream", "run_stream_events", "iter")}
    agents = {how: booking_agent(model) for how, model in models.items()}
    try:
        async with Runtime(store=sql_store, ledger=ledger) as runtime:
            streamers = {how: runtime.add(Streaming(how, agents[how], how)) for how in agents}
            for how in agents:
                runtime.send(how, "go")
            await runtime.run_until_idle()
        for how, streamer in streamers.items():
            memory = streamer.state.memory
            assert memory["output"] == "Room 12 is booked.", how
            assert agents[how].booked == ["12"], how  # type: ignore[attr-defined]
            assert models[how].asked == 2
            calls = await ledger.list_model_calls(runtime.run_id, how)
            assert [(c.answer().text, [t.name for t in c.answer().tool_calls]) for c in calls] == [
                ("", ["book"]),
                ("Room 12 is booked.", []),
            ], how
            assert all(c.answer().native is not None for c in calls)
            # The tool call changed the world: through the ledger.
            (booked,) = streamer.state.tool_calls
            assert (booked.tool, booked.status, booked.arguments) == ("book", "ok", {"room": "12"})
        # The caller's stream gives the recorded response once it is complete.
        chunks: Any = streamers["run_stream"].state.memory["chunks"]
        assert "".join(chunks) == "Room 12 is booked."
        kinds: Any = streamers["run_stream_events"].state.memory["kinds"]
        assert "AgentRunResultEvent" in kinds
        nodes: Any = streamers["iter"].state.memory["nodes"]
        assert "ModelRequestNode" in nodes
    finally:
        await ledger.close()


async def test_the_event_stream_handler_gets_the_live_stream_once() -> None:
    model, events = Streamed(), Events()
    agent = booking_agent(model, events)
    ledger = MemoryLedger()
    async with Runtime(ledger=ledger) as runtime:
        clerk = runtime.add(PydanticAIAgent("clerk", agent))
        runtime.send("clerk", "book a room")
        await runtime.run_until_idle()

    assert clerk.state.output == "Room 12 is booked."
    # run() with an event-stream handler streams its requests: each a recorded step.
    assert await recorded(ledger, runtime.run_id) == [("", ["book"]), ("Room 12 is booked.", [])]
    # One start per streamed part, one tool call and one result, each handed over once.
    assert len(events.kinds(PartStartEvent)) == 2
    (called,) = events.kinds(FunctionToolCallEvent)
    (returned,) = events.kinds(FunctionToolResultEvent)
    assert called.part.tool_name == "book"
    assert returned.part.content == "booked 12"
    assert called.part.tool_call_id == returned.tool_call_id


async def test_iter_hands_the_events_of_its_run_to_the_handler() -> None:
    """``test_dbos_agent_iter_in_workflow_fires_event_stream_handler``."""
    model, events = Streamed(), Events()
    agent = booking_agent(model, events)
    ledger = MemoryLedger()
    async with Runtime(ledger=ledger) as runtime:
        streamer = runtime.add(Streaming("iterating", agent, "iter"))
        runtime.send("iterating", "go")
        await runtime.run_until_idle()
    assert streamer.state.memory["output"] == "Room 12 is booked."
    assert await recorded(ledger, runtime.run_id) == [("", ["book"]), ("Room 12 is booked.", [])]
    (called,) = events.kinds(FunctionToolCallEvent)
    (returned,) = events.kinds(FunctionToolResultEvent)
    assert called.part.tool_call_id == returned.tool_call_id


async def test_outside_a_handler_streaming_is_pydantic_ai_own() -> None:
    events = Events()
    # Outside a handler nothing is recorded and a tool changing the world has no call to be
    # bound to: an agent whose tools are read-only streams as pydantic-ai does.
    plain = PydanticAgent(
        FunctionModel(stream_function=Streamed()),
        capabilities=[AgentsnapDurability(read_only={"book"}, event_stream_handler=events)],
    )

    @plain.tool_plain
    def book(room: str) -> str:
        """Book a room."""
        return f"booked {room}"

    async with plain.run_stream("book a room") as stream:
        assert await stream.get_output() == "Room 12 is booked."
    assert len(events.kinds(FunctionToolCallEvent)) == 1
    assert len(events.kinds(PartStartEvent)) == 2
