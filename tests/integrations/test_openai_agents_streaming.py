"""SDK agents run streamed under agentsnap: live events, one recorded step per model call.

The fake model streams like a provider (text word by word). A streamed model call is
recorded once its stream is complete; a rollback streams the redo; a handoff stops the
streamed run and travels as a message; a rejected stream's tool effect happens once.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from agents import Agent as SDKAgent
from agents import (
    GuardrailFunctionOutput,
    RunConfig,
    RunContextWrapper,
    function_tool,
    output_guardrail,
)
from agents.stream_events import StreamEvent
from agents.testing import assistant_message, function_call

from agentsnap import Agent, AgentState, Context, Message, Runtime
from agentsnap.exceptions import ConfigurationError
from agentsnap.integrations.openai_agents import AgentsnapRunner, OpenAIAgent, team

from .openai_agents_models import FunctionSDKModel, answered_tool, text_of

QUIET = RunConfig(tracing_disabled=True)


class Sink(Agent[AgentState]):
    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        self.state.memory["got"] = message.payload


def deltas(events: list[tuple[str, StreamEvent]]) -> list[str]:
    return [
        e.data.delta
        for _, e in events
        if e.type == "raw_response_event" and e.data.type == "response.output_text.delta"
    ]


async def test_a_streamed_run_passes_the_models_events_on_and_records_each_call() -> None:
    booked: list[str] = []
    rng = random.Random()

    def answer(items: list[dict[str, Any]]) -> list[Any]:
        if answered_tool(items):
            return [assistant_message("Your table for two is booked for eight.")]
        party = f"two #{rng.randrange(10**6)}"
        return [function_call("book", {"party": party}, call_id="b")]

    @function_tool
    def book(party: str) -> str:
        """Book a table."""
        booked.append(party)
        return "table 4"

    model = FunctionSDKModel(answer)
    host = SDKAgent(name="host", model=model, tools=[book])
    stream = AgentsnapRunner.run_streamed(host, "A table for two, please.", run_config=QUIET)
    with pytest.raises(ConfigurationError, match="not over"):
        _ = stream.result
    events = [pair async for pair in stream.stream_events()]
    result = stream.result
    assert stream.is_complete
    assert result.final_output == "Your table for two is booked for eight."
    assert model.streamed == 2
    # The provider's own deltas, word by word, as they came.
    assert deltas(events) == ["Your ", "table ", "for ", "two ", "is ", "booked ", "for ", "eight."]
    assert {agent for agent, _ in events} == {"host"}
    kinds = [e.item.type for _, e in events if e.type == "run_item_stream_event"]
    assert kinds == ["tool_call_item", "tool_call_output_item", "message_output_item"]
    assert len(booked) == 1


async def test_a_streamed_answer_rejected_rolls_back_and_streams_the_redo() -> None:
    booked: list[str] = []
    rng = random.Random()

    def answer(items: list[dict[str, Any]]) -> list[Any]:
        if not answered_tool(items):
            return [function_call("book", {"party": f"p{rng.randrange(10**6)}"}, call_id="b")]
        if "rejected" in text_of(items):
            return [assistant_message("Booked, sorry for the wait.")]
        return [assistant_message("Booked.")]

    @function_tool
    def book(party: str) -> str:
        """Book a table."""
        booked.append(party)
        return f"table {len(booked)}"

    events: list[tuple[str, StreamEvent]] = []
    model = FunctionSDKModel(answer)
    async with Runtime() as runtime:
        agent = runtime.add(
            OpenAIAgent(
                None,
                SDKAgent(name="host", model=model, tools=[book]),
                run_config=QUIET,
                on_event=lambda name, event: events.append((name, event)),
            )
        )
        runtime.check(
            "host", kind="output", check=lambda m: "sorry" in str(m.payload) or "apologise"
        )
        runtime.add(Sink("desk"))
        runtime.send("host", {"input": "Book for two.", "reply_to": "desk"})
        await runtime.run_until_idle()
        calls = await runtime.ledger.list_model_calls(runtime.run_id)  # type: ignore[attr-defined]
    assert agent.state.output == "Booked, sorry for the wait."
    assert len(booked) == 1  # the redo's other arguments got the recorded table
    assert "".join(deltas(events)) == "Booked.Booked, sorry for the wait."
    # Four streamed calls, each one recorded step: two before the rollback, two after.
    assert model.streamed == 4
    assert [(c.timeline, c.position) for c in calls] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert [c.answer().text for c in calls][1::2] == ["Booked.", "Booked, sorry for the wait."]


async def test_a_streamed_handoff_travels_as_a_message() -> None:
    billing = SDKAgent(
        name="billing",
        model=FunctionSDKModel(lambda items: [assistant_message("Refunded 30 EUR.")]),
    )
    triage = SDKAgent(
        name="triage",
        model=FunctionSDKModel(
            lambda items: [function_call("transfer_to_billing", {}, call_id="h")]
        ),
        handoffs=[billing],
    )
    events: list[tuple[str, StreamEvent]] = []
    async with Runtime() as runtime:
        agents = team(
            runtime, triage, run_config=QUIET, on_event=lambda n, e: events.append((n, e))
        )
        runtime.send("triage", "I was charged twice.")
        await runtime.run_until_idle()
    assert agents["triage"].state.handed_off_to == "billing"
    assert agents["billing"].state.output == "Refunded 30 EUR."
    assert deltas(events) == ["Refunded ", "30 ", "EUR."]
    assert next(n for n, e in events if e.type == "raw_response_event") == "triage"


async def test_a_guardrail_tripped_in_a_streamed_run_rolls_back_too() -> None:
    @output_guardrail(name="no_promises")
    async def no_promises(
        context: RunContextWrapper[Any], agent: SDKAgent[Any], output: Any
    ) -> GuardrailFunctionOutput:
        return GuardrailFunctionOutput(
            output_info="never promise a date", tripwire_triggered="promise" in str(output)
        )

    def answer(items: list[dict[str, Any]]) -> list[Any]:
        if "never promise a date" in text_of(items):
            return [assistant_message("Around Friday.")]
        return [assistant_message("I promise: Friday.")]

    clerk = SDKAgent(name="clerk", model=FunctionSDKModel(answer), output_guardrails=[no_promises])
    stream = AgentsnapRunner.run_streamed(clerk, "When?", run_config=QUIET)
    events = [pair async for pair in stream.stream_events()]
    assert stream.result.final_output == "Around Friday."
    assert stream.result.rollbacks == 1
    assert "".join(deltas(events)) == "I promise: Friday.Around Friday."
