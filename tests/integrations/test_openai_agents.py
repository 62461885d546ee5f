"""OpenAI Agents SDK agents as agentsnap agents: recorded model calls, ledgered tools,
rollback with feedback, handoffs as messages, sessions in the cut."""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any, cast

import pytest
from agents import Agent as SDKAgent
from agents import RunConfig, function_tool
from agents.testing import assistant_message, function_call
from click.testing import CliRunner

from agentsnap import (
    Agent,
    AgentState,
    Context,
    MemoryStore,
    Message,
    Runtime,
    SnapshotStatus,
    ToolCall,
)
from agentsnap.cli import main
from agentsnap.exceptions import ConfigurationError
from agentsnap.integrations.openai_agents import (
    AgentsnapRunner,
    OpenAIAgent,
    OpenAIAgentState,
    agent_name,
    ledgered,
    team,
)
from agentsnap.integrations.openai_agents import function_tool as durable_tool
from agentsnap.store.sql import SqlStore

from .openai_agents_models import FunctionSDKModel, answered_tool, text_of

QUIET = RunConfig(tracing_disabled=True)


class Sink(Agent[AgentState]):
    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        self.state.memory["got"] = message.payload


def reply(text: str) -> list[Any]:
    return [assistant_message(text)]


async def test_a_rejected_output_rolls_back_and_the_feedback_changes_the_answer() -> None:
    def answer(items: list[dict[str, Any]]) -> list[Any]:
        if "rejected" in text_of(items):
            return reply("Paris, the capital of France.")
        return reply("Paris.")

    model = FunctionSDKModel(answer)
    sdk_agent = SDKAgent(name="geographer", instructions="Answer in full.", model=model)

    def full_sentence(message: Message) -> str | None:
        output = str(message.payload_as(dict[str, Any])["output"])
        return None if "capital" in output else "say what Paris is"

    result = await AgentsnapRunner.run(
        sdk_agent,
        "What is the capital of France?",
        run_config=QUIET,
        setup=lambda runtime, _: runtime.check("geographer", kind="output", check=full_sentence),
    )
    assert result.final_output == "Paris, the capital of France."
    assert result.last_agent == "geographer"
    assert result.rollbacks == 1
    assert len(model.inputs) == 2  # asked again after the rollback
    first, second = model.inputs
    assert text_of(first) == "What is the capital of France?"  # the session went back too
    assert "rejected by full_sentence: say what Paris is" in text_of(second)


async def test_model_calls_are_recorded_with_the_sdks_request_and_answer() -> None:
    def answer(items: list[dict[str, Any]]) -> list[Any]:
        if answered_tool(items):
            return reply("It is sunny.")
        return [function_call("weather", {"city": "Paris"}, call_id="w1")]

    @function_tool
    def weather(city: str) -> str:
        """The weather in a city."""
        return f"sunny in {city}"

    sdk_agent = SDKAgent(
        name="forecaster", model=FunctionSDKModel(answer, name="fake-4"), tools=[weather]
    )
    async with Runtime() as runtime:
        agent = runtime.add(OpenAIAgent(None, sdk_agent, run_config=QUIET))
        runtime.send("forecaster", "Weather in Paris?")
        await runtime.run_until_idle()
        calls = await runtime.ledger.list_model_calls(runtime.run_id)  # type: ignore[attr-defined]
    assert agent.state.output == "It is sunny."
    first, second = (call.answer() for call in calls)
    assert [(c.name, c.arguments, c.id) for c in first.tool_calls] == [
        ("weather", {"city": "Paris"}, "w1")
    ]
    assert second.text == "It is sunny."
    assert second.model == "fake-4"
    assert second.usage.input_tokens > 0
    asked = calls[1].asked()
    assert [m.role for m in asked.messages] == ["user", "assistant", "tool"]
    assert [t.name for t in asked.tools] == ["weather"]
    assert asked.native is not None
    assert asked.native["input"][0] == {
        "role": "user",
        "content": "Weather in Paris?",
    }
    assert second.native is not None
    assert second.native["sdk"] == "openai-agents"


async def test_every_sdk_function_tool_goes_through_the_ledger_unless_read_only() -> None:
    booked: list[str] = []
    looked: list[str] = []
    rng = random.Random()  # a sampled model: other arguments on every call

    def answer(items: list[dict[str, Any]]) -> list[Any]:
        if answered_tool(items) and items[-1].get("call_id") == "b":
            return reply("Booked, sorry for the wait." if "rejected" in text_of(items) else "Ok.")
        if answered_tool(items):
            party = rng.choice(["for two", "a table for 2", "two people"])
            return [
                function_call("book", {"party": f"{party} #{rng.randrange(10**6)}"}, call_id="b")
            ]
        return [function_call("free_tables", {"day": rng.choice(["fri", "friday"])}, call_id="f")]

    @function_tool
    def book(party: str) -> str:
        """Book a table."""
        booked.append(party)
        return f"table {len(booked)}"

    @function_tool
    def free_tables(day: str) -> str:
        """How many tables are free on a day."""
        looked.append(day)
        return "3 free"

    sdk_agent = SDKAgent(name="host", model=FunctionSDKModel(answer), tools=[book, free_tables])
    async with Runtime() as runtime:
        host = runtime.add(
            OpenAIAgent(None, sdk_agent, read_only=["free_tables"], run_config=QUIET)
        )
        runtime.check(
            "host", kind="output", check=lambda m: "sorry" in str(m.payload) or "apologise"
        )
        runtime.add(Sink("front-desk"))
        runtime.send("host", {"input": "Book for two.", "reply_to": "front-desk"})
        await runtime.run_until_idle()
        entries = await runtime.ledger.list_calls(runtime.run_id)
    assert len(booked) == 1  # the redo's other wording got the recorded table
    assert len(looked) == 2  # a read-only lookup runs again
    assert [(e.tool, e.arguments) for e in entries] == [("book", {"party": booked[0]})]
    # The read-only lookup ran as the SDK's own tool, outside agentsnap's records.
    assert [(c.tool, c.status) for c in host.state.tool_calls] == [("book", "replayed")]


async def test_a_durable_tool_hands_its_function_the_idempotency_key() -> None:
    keys: list[str | None] = []

    @durable_tool(side_effect=True)
    async def charge(call: ToolCall, amount: int, note: str | None = None) -> str:
        """Charge a card."""
        keys.append(call.key)
        return f"charged {amount}"

    assert charge.params_json_schema["required"] == ["amount", "note"]  # strict
    model = FunctionSDKModel(
        lambda items: (
            reply("Done.")
            if answered_tool(items)
            else [function_call("charge", {"amount": 5, "note": None}, call_id="c")]
        )
    )
    async with Runtime() as runtime:
        agent = runtime.add(
            OpenAIAgent(
                "till", SDKAgent(name="till", model=model, tools=[charge]), run_config=QUIET
            )
        )
        runtime.send("till", "Charge 5.")
        await runtime.run_until_idle()
    assert len(keys) == 1
    assert keys[0] == agent.state.tool_calls[0].key
    assert agent.state.tool_calls[0].arguments == {"amount": 5, "note": None}


async def test_a_handoff_travels_as_a_message_in_a_cut(tmp_path: Path) -> None:
    billing = SDKAgent(
        name="billing",
        instructions="Refund people.",
        model=FunctionSDKModel(lambda items: reply("Refunded 30 EUR.")),
    )
    triage = SDKAgent(
        name="triage",
        instructions="Send each request where it belongs.",
        model=FunctionSDKModel(
            lambda items: [function_call("transfer_to_billing", {}, call_id="h")]
        ),
        handoffs=[billing],
    )
    store = SqlStore(f"sqlite:///{tmp_path / 'agentsnap.db'}")
    async with Runtime(store=store) as runtime:
        agents = team(runtime, triage, run_config=QUIET, snapshot_at_handoff=True)
        assert list(agents) == ["triage", "billing"]
        assert agents["triage"].targets == {"billing": "billing"}
        runtime.send("triage", "I was charged twice.")
        await runtime.run_until_idle()
        snapshots = await store.list_snapshots(runtime.run_id)
    await store.close()
    cut = next(
        s
        for s in snapshots
        if s.status is SnapshotStatus.COMPLETE and s.in_flight("triage", "billing")
    )
    (handed,) = cut.in_flight("triage", "billing")
    assert handed.kind == "handoff"
    payload = handed.payload
    assert isinstance(payload, dict)
    assert payload["from"] == "triage"
    conversation = payload["input"]
    assert isinstance(conversation, list)
    assert conversation[0] == {"role": "user", "content": "I was charged twice."}
    assert cast(dict[str, Any], conversation[-2])["name"] == "transfer_to_billing"
    triage_state = OpenAIAgentState.model_validate(cut.agents["triage"].state)
    assert triage_state.handed_off_to == "billing"
    billing_state = agents["billing"].state
    assert billing_state.output == "Refunded 30 EUR."
    assert billing_state.items[0] == {"role": "user", "content": "I was charged twice."}


def test_agentsnap_show_prints_the_session_in_the_cut(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'agentsnap.db'}"

    async def go() -> str:
        store = SqlStore(db)
        sdk_agent = SDKAgent(
            name="poet", model=FunctionSDKModel(lambda items: reply("Roses are red."))
        )
        async with Runtime(store=store) as runtime:
            runtime.add(OpenAIAgent(None, sdk_agent, run_config=QUIET))
            runtime.send("poet", "A line about roses, please.")
            await runtime.run_until_idle()
            snapshot = await runtime.snapshot()
        await store.close()
        return snapshot.id

    snapshot_id = asyncio.run(go())
    shown = CliRunner().invoke(main, ["show", snapshot_id, "--db", db, "--json"])
    assert shown.exit_code == 0, shown.output
    state = json.loads(shown.output)["agents"]["poet"]["state"]
    assert state["items"][0] == {"role": "user", "content": "A line about roses, please."}
    assert state["items"][1]["content"][0]["text"] == "Roses are red."
    assert state["output"] == "Roses are red."
    text = CliRunner().invoke(main, ["show", snapshot_id, "--db", db])
    assert "Roses are red." in text.output


def test_names_and_mistakes() -> None:
    assert agent_name("Billing agent") == "Billing_agent"
    sdk_agent = SDKAgent(name="a", model=FunctionSDKModel(lambda items: reply("x")))
    with pytest.raises(ConfigurationError, match="not function tools"):
        OpenAIAgent(None, sdk_agent, read_only=["nope"])
    with pytest.raises(ConfigurationError, match="takes tool names"):
        OpenAIAgent(None, sdk_agent, read_only="nope")
    with pytest.raises(ConfigurationError, match="mcp_servers"):
        OpenAIAgent(None, sdk_agent.clone(mcp_servers=[object()]))
    made = durable_tool(lambda x: x)
    with pytest.raises(ConfigurationError, match="goes through agentsnap already"):
        ledgered(made)
    with pytest.raises(ConfigurationError, match="SDK FunctionTool"):
        ledgered(object())  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="OpenAI Agents SDK"):
        OpenAIAgent("x", object())  # type: ignore[arg-type]


async def test_options_reach_every_agent_and_unknown_keywords_are_refused_by_name() -> None:
    sdk_agent = SDKAgent(name="a", model=FunctionSDKModel(lambda items: reply("x")))
    runtime = Runtime()
    made = team(runtime, sdk_agent, max_turns=3, reply_to="sink")
    assert (made["a"].max_turns, made["a"].reply_to) == (3, "sink")
    assert made["a"].snapshot_at_handoff  # the default, kept by OpenAIAgent
    assert made["a"].on_event is None
    with pytest.raises(TypeError, match=r"^team\(\) got an unexpected keyword argument 'max_turn'"):
        team(Runtime(), sdk_agent, max_turn=3)  # type: ignore[call-arg]
    with pytest.raises(
        TypeError, match=r"\(it takes chain_responses, context, max_turns, on_event, "
    ):
        team(Runtime(), sdk_agent, turns=3)  # type: ignore[call-arg]
    with pytest.raises(
        TypeError, match=r"^AgentsnapRunner\.run\(\) got an unexpected keyword argument 'reply_to'"
    ):
        await AgentsnapRunner.run(sdk_agent, "hi", reply_to="x")  # type: ignore[call-arg]
    with pytest.raises(
        TypeError, match=r"^AgentsnapRunner\.run_streamed\(\) got .* argument 'on_event'"
    ):
        AgentsnapRunner.run_streamed(sdk_agent, "hi", on_event=print)  # type: ignore[call-arg]
    with pytest.raises(
        TypeError, match=r"^AgentsnapRunner\.resume\(\) got .* argument 'snapshot_at_handoff'"
    ):
        await AgentsnapRunner.resume(
            sdk_agent,
            store=MemoryStore(),
            run_id="r",
            snapshot_at_handoff=False,  # type: ignore[call-arg]
        )
    with pytest.raises(TypeError, match=r"^function_tool\(\) got .* argument 'side_effects'"):
        durable_tool(side_effects=False)  # type: ignore[call-overload]
    with pytest.raises(TypeError, match=r"^ledgered\(\) got .* argument 'key'"):
        ledgered(answer_tool, key=["x"])  # type: ignore[call-arg]


@function_tool
def answer_tool(x: int) -> int:
    """Give ``x`` back."""
    return x


def test_importing_without_the_sdk_names_the_extra() -> None:
    code = (
        "import sys; sys.modules['agents'] = None\n"
        "from agentsnap.integrations import MissingExtraError\n"
        "try:\n"
        "    import agentsnap.integrations.openai_agents\n"
        "except MissingExtraError as exc:\n"
        "    print(exc.extra)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    assert done.stdout.strip() == "openai-agents"
