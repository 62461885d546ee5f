"""An SDK agent's own judges and server-side state under agentsnap's rollback.

An output guardrail that trips is a rejection: the team goes back to the last cut and the
agent retries, told the guardrail's reason, within the retry budget. A chain of server-side
responses (``previous_response_id``) is kept in the agent's state, so a rollback continues
from the cut's response.
"""

from __future__ import annotations

import random
import uuid
from typing import Any

import pytest
from agents import Agent as SDKAgent
from agents import (
    GuardrailFunctionOutput,
    RunConfig,
    RunContextWrapper,
    Runner,
    output_guardrail,
)
from agents.items import ModelResponse
from agents.models.interface import Model
from agents.testing import assistant_message
from agents.usage import Usage
from pydantic import BaseModel

from agentsnap import Agent, AgentState, Context, Message, RetryPolicy, Runtime
from agentsnap.exceptions import ConfigurationError, RollbackExhausted
from agentsnap.integrations._running import handling
from agentsnap.integrations.openai_agents import (
    AgentsnapRunner,
    OpenAIAgent,
    RecordedModel,
    as_json,
)

from .openai_agents_models import FunctionSDKModel, text_of

QUIET = RunConfig(tracing_disabled=True)


class Verdict(BaseModel):
    reason: str
    promised: list[str]


@output_guardrail(name="no_promises")
async def no_promises(
    context: RunContextWrapper[Any], agent: SDKAgent[Any], output: Any
) -> GuardrailFunctionOutput:
    promised = [w for w in ("guarantee", "promise") if w in str(output).lower()]
    return GuardrailFunctionOutput(
        output_info=Verdict(reason="never promise a delivery date", promised=promised),
        tripwire_triggered=bool(promised),
    )


async def test_a_tripped_output_guardrail_rolls_back_and_the_agent_retries_told_why() -> None:
    rng = random.Random()  # a sampled model: other words on every ask

    def answer(items: list[dict[str, Any]]) -> list[Any]:
        day = rng.choice(["Monday", "Tuesday", "Friday"])
        if "never promise" in text_of(items):
            return [assistant_message(f"It should arrive around {day}, no certainty.")]
        verb = rng.choice(["I guarantee", "I promise", "We guarantee"])
        return [assistant_message(f"{verb} it arrives on {day}.")]

    model = FunctionSDKModel(answer)
    clerk = SDKAgent(name="clerk", model=model, output_guardrails=[no_promises])
    result = await AgentsnapRunner.run(clerk, "When does my parcel arrive?", run_config=QUIET)
    assert result.rollbacks == 1
    assert isinstance(result.final_output, str)
    assert "no certainty" in result.final_output
    assert len(model.inputs) == 2
    first, second = model.inputs
    assert text_of(first) == "When does my parcel arrive?"  # the session went back too
    assert "rejected by guardrail no_promises: never promise a delivery date" in text_of(second)


async def test_a_guardrail_that_keeps_tripping_exhausts_the_retry_budget() -> None:
    model = FunctionSDKModel(lambda items: [assistant_message("I promise: tomorrow.")])
    clerk = SDKAgent(name="clerk", model=model, output_guardrails=[no_promises])
    async with Runtime(retry=RetryPolicy.attempts(2)) as runtime:
        agent = runtime.add(OpenAIAgent(None, clerk, run_config=QUIET))
        runtime.send("clerk", "When?")
        with pytest.raises(RollbackExhausted, match="never promise"):
            await runtime.run_until_idle()
        rollbacks = list(runtime.rollbacks)
    assert [r.reason for r in rollbacks] == ["never promise a delivery date"] * len(rollbacks)
    assert rollbacks
    assert agent.state.output is None  # no rejected answer was kept
    assert len(model.inputs) == len(rollbacks) + 1


class Provider(Model):
    """A provider keeping every response, as the Responses API does: a response id names the
    conversation up to that response (``previous_response_id`` continues from it)."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.kept: dict[str, list[dict[str, Any]]] = {}
        self.previous: list[str | None] = []
        self.model = "provider"

    async def get_response(
        self,
        system_instructions: Any,
        input: Any,
        model_settings: Any,
        tools: Any,
        output_schema: Any,
        handoffs: Any,
        tracing: Any,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: Any,
    ) -> ModelResponse:
        self.previous.append(previous_response_id)
        given = [{"role": "user", "content": input}] if isinstance(input, str) else list(input)
        before = self.kept[previous_response_id] if previous_response_id is not None else []
        conversation = before + given
        output = self.answer(conversation)
        response_id = f"resp_{uuid.uuid4().hex[:12]}"
        self.kept[response_id] = conversation + [as_json(item) for item in output]
        return ModelResponse(output=output, usage=Usage(), response_id=response_id)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


async def test_a_rollback_continues_the_providers_conversation_from_the_cuts_response() -> None:
    rng = random.Random()

    def answer(conversation: list[dict[str, Any]]) -> list[Any]:
        said = text_of(conversation)
        if "second" not in said:
            return [assistant_message(f"Noted the first thing (#{rng.randrange(1000)}).")]
        if "rejected" in said:
            return [assistant_message("Both noted, in order.")]
        return [assistant_message("Noted.")]

    provider = Provider(answer)
    sdk_agent = SDKAgent(name="notary", model=provider)

    def in_order(message: Message) -> str | None:
        output = str(message.payload_as(dict[str, Any])["output"])
        return None if output != "Noted." else "say that both are noted, in order"

    async with Runtime() as runtime:
        agent = runtime.add(OpenAIAgent(None, sdk_agent, chain_responses=True, run_config=QUIET))
        runtime.add(Sink("desk"))
        runtime.check("notary", kind="output", check=in_order)
        runtime.send("notary", {"input": "The first thing.", "reply_to": "desk"})
        await runtime.run_until_idle()
        first = agent.state.last_response_id
        assert first is not None
        await runtime.snapshot()
        runtime.send("notary", {"input": "The second thing.", "reply_to": "desk"})
        await runtime.run_until_idle()
        assert len(runtime.rollbacks) == 1
    # Asked three times: the first message, the rejected answer, the redo. The redo
    # continued from the cut's response, never from the rejected one.
    assert provider.previous == [None, first, first]
    last = agent.state.last_response_id
    assert last is not None
    assert last not in (first, None)
    kept = text_of(provider.kept[last])
    assert "Noted." not in kept.splitlines()  # the undone answer is not in the conversation
    assert "Both noted, in order." in kept
    assert agent.state.items == []  # the conversation is at the provider, chained by id
    assert agent.state.output == "Both noted, in order."


async def test_a_conversation_id_is_refused_with_what_to_do_instead() -> None:
    errors: list[BaseException] = []
    sdk_agent = SDKAgent(
        name="chat", model=RecordedModel(Provider(lambda c: [assistant_message("hi")]))
    )

    class Chat(Agent[AgentState]):
        async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
            with handling(ctx):
                try:
                    await Runner.run(sdk_agent, "hello", conversation_id="conv_1", run_config=QUIET)
                except ConfigurationError as exc:
                    errors.append(exc)

    async with Runtime() as runtime:
        runtime.add(Chat("chat"))
        runtime.send("chat", "go")
        await runtime.run_until_idle()
    (error,) = errors
    assert "conversation_id='conv_1'" in str(error)
    assert "chain_responses=True" in str(error)


class Sink(Agent[AgentState]):
    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        self.state.memory["got"] = message.payload
