"""The pydantic-ai integration's contract: a pydantic-ai agent run as an agentsnap agent.

The shape of pydantic-ai's own durable-execution suites (a simple run, a run with tools,
structured output and ``deps``, model settings, a tool asking for a retry, a failing tool,
several agents, toolsets and MCP servers, behaviour outside the engine), run on ``TestModel``
and ``FunctionModel`` against agentsnap with its SQL store: every model request is a recorded
call keeping pydantic-ai's own JSON, every tool call that changes the world an entry in the
ledger, the conversation part of the agent's state and never its ``deps``.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations
from pydantic import BaseModel
from pydantic_ai import Agent as PydanticAgent
from pydantic_ai import ModelRetry, RunContext
from pydantic_ai.mcp import MCPToolset
from pydantic_ai.messages import (
    ModelMessage,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel
from pydantic_ai.usage import RequestUsage

from agentsnap import (
    Agent,
    AgentState,
    ConfigurationError,
    Context,
    HandlerFailed,
    Message,
    Runtime,
    tool,
)
from agentsnap.integrations.pydantic_ai import (
    AgentsnapDurability,
    PydanticAIAgent,
    ToolOptions,
    agentsnap_toolset,
)
from agentsnap.integrations.pydantic_ai._convert import rebuilt_response, recorded_response
from agentsnap.store import Store
from agentsnap.store.ledger import MemoryLedger, ledger_for
from agentsnap.store.sql_ledger import SqlLedger

ROOT = Path(__file__).resolve().parents[2]


def durable(model: Any, **options: Any) -> PydanticAgent[Any, Any]:
    return PydanticAgent(model, capabilities=[AgentsnapDurability(**options)])


@pytest.fixture
async def sql_ledger(sql_store: Store) -> AsyncIterator[SqlLedger]:
    """The ledger on the SQL store's database, left open after the run for the test to read."""
    ledger = ledger_for(sql_store)
    assert isinstance(ledger, SqlLedger)
    try:
        yield ledger
    finally:
        await ledger.close()


async def run_one(
    agent: Agent[Any],
    payload: Any = "go",
    store: Store | None = None,
    ledger: MemoryLedger | SqlLedger | None = None,
) -> tuple[Runtime, MemoryLedger | SqlLedger]:
    ledger = ledger or MemoryLedger()
    async with Runtime(store=store, ledger=ledger) as runtime:
        runtime.add(agent)
        runtime.send(agent.name, payload)
        await runtime.run_until_idle()
    return runtime, ledger


async def test_a_simple_run_is_one_recorded_call(sql_store: Store, sql_ledger: SqlLedger) -> None:
    assistant = PydanticAIAgent("assistant", durable(TestModel(custom_output_text="hello")))
    runtime, ledger = await run_one(assistant, "Say hello.", sql_store, sql_ledger)

    assert assistant.state.output == "hello"
    assert assistant.state.runs == 1
    kinds = [m["kind"] for m in assistant.state.messages]
    assert kinds == ["request", "response"]
    (call,) = await ledger.list_model_calls(runtime.run_id)
    answer, asked = call.answer(), call.asked()
    assert (answer.text, answer.model, call.model) == ("hello", "test", "test")
    assert answer.usage.input_tokens > 0
    assert answer.native is not None
    native: Any = answer.native
    assert native["parts"][0]["content"] == "hello"
    assert [m.content for m in asked.messages] == ["Say hello."]
    assert asked.native is not None
    native = asked.native
    assert native["messages"][0]["parts"][0]["content"] == "Say hello."


class Booking(BaseModel):
    reservation: str
    guest: str


@dataclass
class Hotel:
    """``deps`` that are not JSON: a lock and a list of what was booked."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    booked: list[str] = field(default_factory=list)


def concierge() -> PydanticAgent[Hotel, Booking]:
    agent = PydanticAgent(
        TestModel(),
        deps_type=Hotel,
        output_type=Booking,
        capabilities=[AgentsnapDurability(read_only={"find_guest"})],
    )

    @agent.tool_plain
    def find_guest(name: str) -> str:
        """Look a guest up."""
        return f"guest {name}"

    @agent.tool
    def book(ctx: RunContext[Hotel], room: str) -> str:
        """Book a room."""
        with ctx.deps.lock:
            ctx.deps.booked.append(room)
        return f"R{len(ctx.deps.booked)}"

    return agent


async def test_tools_structured_output_and_deps(sql_store: Store, sql_ledger: SqlLedger) -> None:
    hotel = Hotel()
    agent = PydanticAIAgent("concierge", concierge(), deps=hotel)
    runtime, ledger = await run_one(agent, {"guest": "ada"}, sql_store, sql_ledger)

    assert agent.state.output == {"reservation": "a", "guest": "a"}
    assert hotel.booked == ["a"]
    assert "lock" not in str(agent.state.model_dump())  # deps are never stored
    # Only the tool that changes the world went through the ledger.
    (booked,) = agent.state.tool_calls
    assert (booked.tool, booked.status, booked.result) == ("book", "ok", "R1")
    assert booked.key is not None
    entries = await ledger.list_calls(runtime.run_id)
    assert [(e.tool, e.key) for e in entries] == [("book", booked.key)]
    calls = await ledger.list_model_calls(runtime.run_id)
    assert len(calls) == 2
    first = calls[0].answer()
    assert sorted(c.name for c in first.tool_calls) == ["book", "find_guest"]
    assert {t.name for t in calls[0].asked().tools} >= {"book", "find_guest", "final_result"}


def test_a_recorded_answer_is_rebuilt_as_it_came() -> None:
    answer = ModelResponse(
        parts=[TextPart("thinking aloud"), ToolCallPart("book", {"room": "12"}, tool_call_id="c1")],
        usage=RequestUsage(input_tokens=7, output_tokens=3),
        model_name="m-1",
    )
    recorded = recorded_response(answer)
    assert recorded.text == "thinking aloud"
    assert [(c.name, c.arguments, c.id) for c in recorded.tool_calls] == [
        ("book", {"room": "12"}, "c1")
    ]
    assert (recorded.usage.input_tokens, recorded.usage.output_tokens) == (7, 3)
    again = rebuilt_response(type(recorded).model_validate(recorded.model_dump(mode="json")))
    assert again.parts == answer.parts
    assert (again.model_name, again.usage) == (answer.model_name, answer.usage)
    # A record made without pydantic-ai's JSON is rebuilt from its text and tool calls.
    bare = rebuilt_response(recorded.model_copy(update={"native": None}))
    assert [type(p) for p in bare.parts] == [TextPart, ToolCallPart]


async def test_outside_a_handler_the_capability_stands_aside() -> None:
    agent = durable(TestModel(custom_output_text="plain"))
    assert (await agent.run("hi")).output == "plain"

    effects = durable(TestModel())

    @effects.tool_plain
    def charge(amount: int) -> str:
        """Charge a card."""
        return "charged"

    with pytest.raises(ConfigurationError, match="outside an agentsnap handler"):
        await effects.run("hi")


async def test_a_tool_asking_for_a_retry_is_recorded_and_retried() -> None:
    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        returns = [p for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
        if returns and returns[-1].outcome != "retried":
            return ModelResponse(parts=[TextPart("done")])
        room = "12" if returns else "unknown"
        return ModelResponse(parts=[ToolCallPart("book", {"room": room})])

    agent = durable(FunctionModel(model))

    @agent.tool_plain
    def book(room: str) -> str:
        """Book a room."""
        if not room.isdigit():
            raise ModelRetry("the room is a number")
        return f"booked {room}"

    clerk = PydanticAIAgent("clerk", agent)
    runtime, ledger = await run_one(clerk)
    assert clerk.state.output == "done"
    assert [(c.status, c.arguments["room"]) for c in clerk.state.tool_calls] == [
        ("error", "unknown"),
        ("ok", "12"),
    ]
    assert len({e.key for e in await ledger.list_calls(runtime.run_id)}) == 2


async def test_a_failing_tool_fails_the_handler() -> None:
    agent = durable(TestModel())

    @agent.tool_plain
    def explode() -> str:
        """Fail."""
        raise ValueError("the service is down")

    async with Runtime() as runtime:
        runtime.add(PydanticAIAgent("clerk", agent))
        runtime.send("clerk", "go")
        with pytest.raises(HandlerFailed) as failed:
            await runtime.run_until_idle()
    assert isinstance(failed.value.__cause__, ValueError)


async def test_model_settings_are_recorded(sql_store: Store, sql_ledger: SqlLedger) -> None:
    agent = PydanticAgent(
        TestModel(),
        model_settings={"temperature": 0.25},
        capabilities=[AgentsnapDurability()],
    )
    runtime, ledger = await run_one(PydanticAIAgent("a", agent), store=sql_store, ledger=sql_ledger)
    (call,) = await ledger.list_model_calls(runtime.run_id)
    assert call.asked().settings == {"temperature": 0.25}


class Sink(Agent[AgentState]):
    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        self.state.memory[message.src] = message.payload


async def test_several_agents_in_a_team_share_a_tool_name() -> None:
    noted: list[str] = []

    def with_note(text: str) -> PydanticAgent[None, str]:
        agent = durable(TestModel(custom_output_text=text))

        @agent.tool_plain
        def note(text: str) -> str:
            """Write a note."""
            noted.append(text)
            return "noted"

        return agent

    async with Runtime() as runtime:
        runtime.add(PydanticAIAgent("researcher", with_note("facts"), to="writer"))
        writer = runtime.add(PydanticAIAgent("writer", with_note("an essay"), to="sink"))
        sink = runtime.add(Sink("sink"))
        runtime.send("researcher", "research")
        await runtime.run_until_idle()
    assert writer.state.output == "an essay"
    assert sink.state.memory == {"writer": "an essay"}
    first: Any = writer.state.messages[0]
    assert first["parts"][0]["content"] == "facts"
    assert len(noted) == 2


async def test_the_agent_own_capability_is_used_once() -> None:
    own = AgentsnapDurability(read_only={"look"})
    agent = PydanticAgent(TestModel(custom_output_text="ok"), capabilities=[own])
    clerk = PydanticAIAgent("clerk", agent, durability=AgentsnapDurability())
    assert clerk.durability.read_only == {"look"}  # the agent's own (bound) capability
    runtime, ledger = await run_one(clerk)
    assert len(await ledger.list_model_calls(runtime.run_id)) == 1


async def test_agentsnap_tools_as_a_toolset_keep_their_own_options() -> None:
    cancelled: list[str] = []

    @tool(side_effect=True, key_from=("reservation",))
    async def cancel(reservation: str, reason: str) -> str:
        """Cancel a booking."""
        cancelled.append(reservation)
        return f"cancelled {reservation}"

    agent = PydanticAgent(
        TestModel(), toolsets=[agentsnap_toolset(cancel)], capabilities=[AgentsnapDurability()]
    )
    clerk = PydanticAIAgent("clerk", agent)
    runtime, ledger = await run_one(clerk)
    assert cancelled == ["a"]
    (call,) = clerk.state.tool_calls
    assert (call.tool, call.status) == ("cancel", "ok")
    (entry,) = await ledger.list_calls(runtime.run_id)  # once, by the tool itself
    assert entry.key == call.key


async def test_mcp_tools_go_through_the_ledger_unless_read_only() -> None:
    server = MCPServer("shop")
    reserved: list[str] = []

    @server.tool(annotations=ToolAnnotations(readOnlyHint=True))
    def stock(item: str) -> int:
        """How many are in stock."""
        return 3

    @server.tool()
    def reserve(item: str) -> str:
        """Reserve an item."""
        reserved.append(item)
        return f"reserved {item}"

    agent = PydanticAgent(
        TestModel(), toolsets=[MCPToolset(server)], capabilities=[AgentsnapDurability()]
    )
    clerk = PydanticAIAgent("clerk", agent)
    runtime, ledger = await run_one(clerk)
    assert reserved == ["a"]
    assert [c.tool for c in clerk.state.tool_calls] == ["reserve"]
    assert [e.tool for e in await ledger.list_calls(runtime.run_id)] == ["reserve"]


def test_a_pydantic_ai_agent_is_required() -> None:
    with pytest.raises(ConfigurationError, match="pydantic-ai agent"):
        PydanticAIAgent("x", object())  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="read-only"):
        AgentsnapDurability(read_only={"a"}, tools={"a": ToolOptions()})


def test_importing_without_pydantic_ai_names_the_extra() -> None:
    code = (
        "import sys; sys.modules['pydantic_ai'] = None\n"
        "from agentsnap.integrations import MissingExtraError\n"
        "try:\n"
        "    import agentsnap.integrations.pydantic_ai\n"
        "except MissingExtraError as exc:\n"
        "    print(exc.extra)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "pydantic-ai"
