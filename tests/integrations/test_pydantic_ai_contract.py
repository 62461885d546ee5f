"""More of pydantic-ai's durable-execution contract, as its ``tests/test_dbos.py`` states it.

The cases of that suite that apply to an engine whose steps run in the handler's own process:
a model chosen at run time, ``deps`` given per run and overridden, ``run_sync``, tool approval
and deferred calls, several toolsets (given with the agent, made per run, given at run time,
overridden), an output tool and its validator asking for a retry, usage limits, an agent
without a model.
Each runs in an agentsnap handler on the SQL store, with recorded model calls, the ledger
holding the tool calls that changed the world. ``test_pydantic_ai.py`` holds the first part
(a simple run, tools with structured output and ``deps``, model settings, ``ModelRetry``, a
failing tool, several agents, MCP servers, outside a handler), and
``test_pydantic_ai_streaming.py`` the streaming entry points and the event-stream handler.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pytest
from pydantic import BaseModel
from pydantic_ai import Agent as PydanticAgent
from pydantic_ai import ModelRetry, RunContext, ToolOutput
from pydantic_ai.exceptions import UsageLimitExceeded, UserError
from pydantic_ai.messages import (
    ModelMessage,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel
from pydantic_ai.tools import ToolDefinition
from pydantic_ai.toolsets import ExternalToolset, FunctionToolset
from pydantic_ai.usage import UsageLimits

from agentsnap import Agent, AgentState, Context, HandlerFailed, Message, Runtime
from agentsnap.inspect import answer, approve, deny, list_requests
from agentsnap.integrations.pydantic_ai import (
    AgentsnapDurability,
    PydanticAIAgent,
    PydanticAIState,
    ToolOptions,
    handling,
)
from agentsnap.requests import Approval, HumanRequest
from agentsnap.store import Store
from agentsnap.store.ledger import MemoryLedger, ledger_for
from agentsnap.store.sql_ledger import SqlLedger


@pytest.fixture
async def sql_ledger(sql_store: Store) -> AsyncIterator[SqlLedger]:
    ledger = ledger_for(sql_store)
    assert isinstance(ledger, SqlLedger)
    try:
        yield ledger
    finally:
        await ledger.close()


def replying(text: str, name: str) -> FunctionModel:
    return FunctionModel(lambda m, i: ModelResponse(parts=[TextPart(text)]), model_name=name)


class Options(PydanticAIAgent):
    """A ``PydanticAIAgent`` whose runs take the options the message names."""

    def __init__(self, name: str, agent: PydanticAgent[Any, Any], **options: Any) -> None:
        super().__init__(name, agent)
        self.options = options

    def run_options(self, message: Message, ctx: Context[PydanticAIState]) -> Mapping[str, Any]:
        return self.options


async def run_agents(
    store: Store, ledger: SqlLedger, *agents: Agent[Any], payload: Any = "go"
) -> Runtime:
    async with Runtime(store=store, ledger=ledger) as runtime:
        for agent in agents:
            runtime.add(agent)
            runtime.send(agent.name, payload)
        await runtime.run_until_idle()
    return runtime


async def test_a_model_chosen_at_run_time_is_the_one_recorded(
    sql_store: Store, sql_ledger: SqlLedger
) -> None:
    """``test_dbos_agent_run_in_workflow_with_model``, ``..._override_model_in_workflow``,
    ``..._override_registered_model``, ``..._unregistered_model_instance_errors``."""
    other = replying("from the other model", "other")
    durability = AgentsnapDurability(models={"other": other})
    agent = PydanticAgent(TestModel(custom_output_text="default"), capabilities=[durability])

    class Overriding(Agent[AgentState]):
        async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
            with handling(ctx), agent.override(model=other):
                self.state.memory["output"] = (await agent.run("hi")).output

    by_instance = Options("by_instance", agent, model=other)
    by_name = Options("by_name", agent, model="other")
    overriding = Overriding("overriding")
    default = PydanticAIAgent("default", agent)
    runtime = await run_agents(sql_store, sql_ledger, by_instance, by_name, overriding, default)
    assert by_instance.state.output == by_name.state.output == "from the other model"
    assert overriding.state.memory["output"] == "from the other model"
    assert default.state.output == "default"
    calls = await sql_ledger.list_model_calls(runtime.run_id)
    assert sorted((c.agent, c.model) for c in calls) == [
        ("by_instance", "other"),
        ("by_name", "other"),
        ("default", "test"),
        ("overriding", "other"),
    ]

    # An instance not registered is refused, saying how to register it.
    unregistered = Options("unregistered", agent, model=TestModel())
    async with Runtime() as runtime:
        runtime.add(unregistered)
        runtime.send("unregistered", "go")
        with pytest.raises(HandlerFailed) as failed:
            await runtime.run_until_idle()
    assert isinstance(failed.value.__cause__, UserError)
    assert "models=" in str(failed.value.__cause__)


@dataclass
class Teller:
    """``deps`` that are not JSON."""

    branch: str
    lock: asyncio.Lock


async def test_deps_per_run_and_overridden_are_used_and_never_stored(
    sql_store: Store, sql_ledger: SqlLedger
) -> None:
    """``test_dbos_agent_override_deps_in_workflow``, ``..._with_unserializable_deps_type``."""
    agent = PydanticAgent(
        TestModel(), deps_type=Teller, capabilities=[AgentsnapDurability(read_only={"branch"})]
    )

    @agent.tool
    async def branch(ctx: RunContext[Teller]) -> str:
        """The branch serving the customer."""
        async with ctx.deps.lock:
            return ctx.deps.branch

    class PerMessage(PydanticAIAgent):
        def deps_for(self, message: Message, ctx: Context[PydanticAIState]) -> Any:
            return Teller(str(message.payload), asyncio.Lock())

    class Overridden(Agent[AgentState]):
        async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
            with handling(ctx), agent.override(deps=Teller("Leeds", asyncio.Lock())):
                result = await agent.run("hi", deps=Teller("ignored", asyncio.Lock()))
            self.state.memory["output"] = result.output

    per_message, overridden = PerMessage("per_message", agent), Overridden("overridden")
    await run_agents(sql_store, sql_ledger, per_message, overridden, payload="York")
    assert per_message.state.output == '{"branch":"York"}'
    assert overridden.state.memory["output"] == '{"branch":"Leeds"}'
    assert "Lock" not in str(per_message.state.model_dump())


async def test_run_sync_runs_outside_a_handler_and_is_refused_inside_one() -> None:
    """``test_dbos_agent_run_sync`` and ``..._run_sync_in_workflow``.

    A handler runs on the event loop, where ``run_sync`` cannot start one of its own: the
    handler fails with pydantic-ai's ``RuntimeError`` and nothing is recorded; await
    ``agent.run`` there instead.
    """
    agent = PydanticAgent(
        TestModel(custom_output_text="synced"), capabilities=[AgentsnapDurability()]
    )

    def synced() -> str:
        try:
            return agent.run_sync("hi").output
        finally:  # the loop run_sync made for this thread
            asyncio.get_event_loop().close()
            asyncio.set_event_loop(None)

    assert await asyncio.to_thread(synced) == "synced"

    class Syncing(Agent[AgentState]):
        async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
            with handling(ctx):
                agent.run_sync("hi")

    ledger = MemoryLedger()
    async with Runtime(ledger=ledger) as runtime:
        runtime.add(Syncing("syncing"))
        runtime.send("syncing", "go")
        with pytest.raises(HandlerFailed) as failed:
            await runtime.run_until_idle()
    assert await ledger.list_model_calls(runtime.run_id) == []
    assert isinstance(failed.value.__cause__, RuntimeError)
    assert "already running" in str(failed.value.__cause__)


def paying(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Pays once, then reports what the tool said."""
    returns = [p for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
    if returns:
        return ModelResponse(parts=[TextPart(f"pay: {returns[-1].model_response_str()}")])
    return ModelResponse(parts=[ToolCallPart("pay", {"invoice": "I-9", "amount": 40})])


async def pending(runtime: Runtime, count: int = 1) -> list[HumanRequest]:
    """The run's pending requests once there are ``count``."""
    for _ in range(4000):
        found = await list_requests(
            runtime.store, runtime.run_id, pending=True, ledger=runtime.ledger
        )
        if len(found) >= count:
            return found
        await asyncio.sleep(0.005)
    raise AssertionError(f"fewer than {count} pending requests")


@pytest.mark.parametrize("verdict", ["approve", "deny"])
async def test_a_tool_requiring_approval_waits_for_a_person(verdict: str) -> None:
    """``test_dbos_agent_with_hitl_tool``: the approval is agentsnap's request to a person,
    answered with ``agentsnap answer``; an approved call goes through the ledger."""
    paid: list[str] = []
    durability = AgentsnapDurability(tools={"pay": ToolOptions(approval=Approval(who="finance"))})
    agent = PydanticAgent(FunctionModel(paying), capabilities=[durability])

    @agent.tool_plain(requires_approval=True)
    def pay(invoice: str, amount: int) -> str:
        """Pay an invoice."""
        paid.append(invoice)
        return f"paid {amount} on {invoice}"

    async with Runtime() as runtime:
        clerk = runtime.add(PydanticAIAgent("clerk", agent))
        runtime.send("clerk", "pay the invoice")
        running = asyncio.create_task(runtime.run_until_idle())
        (request,) = await pending(runtime)
        assert (request.kind, request.who) == ("approval", "finance")
        question: Any = request.question
        assert (question["tool"], question["arguments"]) == (
            "pay",
            {"invoice": "I-9", "amount": 40},
        )
        assert paid == []  # nothing ran before the answer
        if verdict == "approve":
            await approve(runtime.store, request.id, ledger=runtime.ledger)
        else:
            await deny(runtime.store, request.id, "not this month", ledger=runtime.ledger)
        await asyncio.wait_for(running, 30)
        entries = await runtime.ledger.list_calls(runtime.run_id)

    if verdict == "approve":
        assert paid == ["I-9"]
        assert clerk.state.output == "pay: paid 40 on I-9"
        assert [(e.tool, e.status) for e in entries] == [("pay", "succeeded")]
    else:
        assert paid == []
        assert clerk.state.output == "pay: A person denied the call: not this month"
        assert entries == []


async def test_tool_options_give_any_tool_an_approval_before_its_claim() -> None:
    """``ToolOptions(approval=...)``: a plain pydantic-ai tool waits for a person as an
    agentsnap tool declared ``approval=`` does, its key in the question."""
    paid: list[str] = []
    durability = AgentsnapDurability(
        tools={"pay": ToolOptions(approval=lambda a: a["amount"] > 10)}
    )
    agent = PydanticAgent(FunctionModel(paying), capabilities=[durability])

    @agent.tool_plain
    def pay(invoice: str, amount: int) -> str:
        """Pay an invoice."""
        paid.append(invoice)
        return f"paid {amount} on {invoice}"

    async with Runtime() as runtime:
        clerk = runtime.add(PydanticAIAgent("clerk", agent))
        runtime.send("clerk", "pay the invoice")
        running = asyncio.create_task(runtime.run_until_idle())
        (request,) = await pending(runtime)
        question: Any = request.question
        assert paid == []
        await approve(runtime.store, request.id, ledger=runtime.ledger)
        await asyncio.wait_for(running, 30)
        (entry,) = await runtime.ledger.list_calls(runtime.run_id)
    assert (request.kind, question["tool"], question["key"]) == ("approval", "pay", entry.key)
    assert paid == ["I-9"]
    assert clerk.state.output == "pay: paid 40 on I-9"


async def test_an_external_tool_call_is_a_question_whose_answer_is_its_result() -> None:
    """``test_dbos_agent_run_in_workflow_with_runtime_external_toolset``: the call is
    deferred to the world; agentsnap asks a person for its result."""

    def checking(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        returns = [p for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
        if returns:
            return ModelResponse(parts=[TextPart(f"stock: {returns[-1].content}")])
        return ModelResponse(parts=[ToolCallPart("count_stock", {"item": "bolts"})])

    external = ExternalToolset(
        [
            ToolDefinition(
                name="count_stock",
                parameters_json_schema={
                    "type": "object",
                    "properties": {"item": {"type": "string"}},
                    "required": ["item"],
                },
            )
        ],
        id="warehouse",
    )
    agent = PydanticAgent(
        FunctionModel(checking), toolsets=[external], capabilities=[AgentsnapDurability()]
    )
    async with Runtime() as runtime:
        clerk = runtime.add(PydanticAIAgent("clerk", agent))
        runtime.send("clerk", "how many bolts?")
        running = asyncio.create_task(runtime.run_until_idle())
        (request,) = await pending(runtime)
        assert request.kind == "question"
        assert request.question == {
            "tool": "count_stock",
            "arguments": {"item": "bolts"},
            "kind": "external",
        }
        await answer(runtime.store, request.id, 12, ledger=runtime.ledger)
        await asyncio.wait_for(running, 30)
    assert clerk.state.output == "stock: 12"


async def test_tools_of_several_toolsets_each_reach_their_own_and_the_ledger(
    sql_store: Store, sql_ledger: SqlLedger
) -> None:
    """``test_dbos_agent_run_in_workflow_with_toolsets``, ``..._runtime_function_toolset``,
    ``test_dynamic_toolset``, ``..._override_toolsets_in_workflow``, ``..._override_tools``."""
    done: list[str] = []

    def recorder(name: str) -> Callable[[str], str]:
        def call(what: str) -> str:
            done.append(f"{name}:{what}")
            return f"{name} {what}"

        return call

    lookups = FunctionToolset(id="lookups")
    lookups.add_function(recorder("look"), name="look")
    writes = FunctionToolset(id="writes")
    writes.add_function(recorder("write"), name="write")
    agent = PydanticAgent(
        TestModel(),
        toolsets=[lookups, writes],
        capabilities=[AgentsnapDurability(read_only={"look"})],
    )

    @agent.toolset(id="per_run")
    def per_run(ctx: RunContext[object]) -> FunctionToolset[object]:
        made = FunctionToolset[object]()
        made.add_function(recorder("made"), name="made")
        return made

    given = FunctionToolset(id="given")
    given.add_function(recorder("given"), name="given")
    clerk = Options("clerk", agent, toolsets=[given])
    runtime = await run_agents(sql_store, sql_ledger, clerk)

    assert sorted(done) == ["given:a", "look:a", "made:a", "write:a"]
    # Every tool changing the world went through the ledger once; the read-only one did not.
    entries = await sql_ledger.list_calls(runtime.run_id)
    assert sorted(e.tool for e in entries) == ["given", "made", "write"]
    assert sorted(c.tool for c in clerk.state.tool_calls) == ["given", "made", "write"]
    (first, _) = await sql_ledger.list_model_calls(runtime.run_id)
    assert {t.name for t in first.asked().tools} == {"look", "write", "made", "given"}


async def test_toolsets_overridden_for_a_run_replace_the_agent_own() -> None:
    """``test_dbos_agent_override_toolsets_in_workflow``, ``..._override_tools``."""
    done: list[str] = []
    own = FunctionToolset(id="own")
    own.add_function(lambda what: done.append(f"own:{what}"), name="own_tool")
    replacement = FunctionToolset(id="replacement")
    replacement.add_function(lambda what: done.append(f"new:{what}"), name="new_tool")
    agent = PydanticAgent(TestModel(), toolsets=[own], capabilities=[AgentsnapDurability()])

    class Overriding(Agent[AgentState]):
        async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
            with handling(ctx), agent.override(toolsets=[replacement]):
                await agent.run("go")

    ledger = MemoryLedger()
    async with Runtime(ledger=ledger) as runtime:
        overriding = runtime.add(Overriding("overriding"))
        runtime.send("overriding", "go")
        await runtime.run_until_idle()
    assert done == ["new:a"]
    assert [c.tool for c in overriding.state.tool_calls] == ["new_tool"]
    assert [e.tool for e in await ledger.list_calls(runtime.run_id)] == ["new_tool"]


class Booking(BaseModel):
    room: str
    nights: int


async def test_an_output_tool_is_no_effect_and_its_validator_asks_a_retry(
    sql_store: Store, sql_ledger: SqlLedger
) -> None:
    """``test_dbos_agent_with_model_retry`` (the output's retry) and structured output by a
    tool (``ToolOutput``)."""

    def booking(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        (tool,) = info.output_tools
        retried = any(
            isinstance(p, ToolReturnPart) and p.outcome == "retried"
            for m in messages
            for p in m.parts
        )
        nights = 2 if retried else 0
        return ModelResponse(parts=[ToolCallPart(tool.name, {"room": "12", "nights": nights})])

    agent = PydanticAgent(
        FunctionModel(booking),
        output_type=ToolOutput(Booking, name="book_room"),
        capabilities=[AgentsnapDurability()],
    )

    @agent.output_validator
    def at_least_one_night(output: Booking) -> Booking:
        if output.nights < 1:
            raise ModelRetry("a booking is for one night or more")
        return output

    clerk = PydanticAIAgent("clerk", agent)
    runtime = await run_agents(sql_store, sql_ledger, clerk)
    assert clerk.state.output == {"room": "12", "nights": 2}
    calls = await sql_ledger.list_model_calls(runtime.run_id)
    assert [[t.arguments["nights"] for t in c.answer().tool_calls] for c in calls] == [[0], [2]]
    assert "one night or more" in str(calls[1].asked().native)
    assert await sql_ledger.list_calls(runtime.run_id) == []  # the output tool is no effect
    assert clerk.state.tool_calls == []


async def test_a_usage_limit_ends_the_run_before_the_model_is_asked_again(
    sql_store: Store, sql_ledger: SqlLedger
) -> None:
    """Usage limits: the run fails at the limit, having asked and recorded what it could."""
    counted: list[int] = []

    def counting(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        return ModelResponse(parts=[ToolCallPart("count", {"n": len(counted)})])

    agent = PydanticAgent(FunctionModel(counting), capabilities=[AgentsnapDurability()])

    @agent.tool_plain
    def count(n: int) -> int:
        """Count once more."""
        counted.append(n)
        return n

    clerk = Options("clerk", agent, usage_limits=UsageLimits(request_limit=2))
    async with Runtime(store=sql_store, ledger=sql_ledger) as runtime:
        runtime.add(clerk)
        runtime.send("clerk", "count")
        with pytest.raises(HandlerFailed) as failed:
            await runtime.run_until_idle()
    assert isinstance(failed.value.__cause__, UsageLimitExceeded)
    assert len(await sql_ledger.list_model_calls(runtime.run_id)) == 2
    assert counted == [0, 1]
    assert len(await sql_ledger.list_calls(runtime.run_id)) == 2


def test_an_agent_without_a_model_is_refused() -> None:
    """``test_dbos_durability_requires_model``: the model is asked in the handler, so the
    agent needs one of its own."""
    with pytest.raises(UserError, match="needs to have a `model`"):
        PydanticAgent(capabilities=[AgentsnapDurability()])
