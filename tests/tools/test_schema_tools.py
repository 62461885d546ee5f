"""Tools that come as a name, a JSON Schema and a function (an MCP server's, an SDK's), and
model calls made by code that asks the model its own way: both through the run's ledger.
"""

from __future__ import annotations

from typing import Any

import pytest

from agentsnap import (
    Agent,
    AgentState,
    ConfigurationError,
    Context,
    Message,
    Runtime,
    Tool,
    ToolCall,
)
from agentsnap.exceptions import ToolArgumentsInvalid
from agentsnap.models import ChatMessage, ModelRequest, ModelResponse

SCHEMA = {
    "type": "object",
    "properties": {"to": {"type": "string"}, "text": {"type": "string"}},
    "required": ["to", "text"],
    "additionalProperties": False,
}


class Sent:
    def __init__(self) -> None:
        self.emails: list[dict[str, Any]] = []

    async def __call__(self, arguments: dict[str, Any]) -> dict[str, Any]:
        self.emails.append(arguments)
        return {"id": len(self.emails)}


class Mailer(Agent[AgentState]):
    def __init__(self, name: str, send: Tool[Any], answers: list[str]) -> None:
        super().__init__(name)
        self.send = send
        self.answers = answers
        self.asked = 0

    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        async def ask(request: ModelRequest) -> ModelResponse:
            self.asked += 1
            text = self.answers[self.asked - 1]
            return ModelResponse(text=text, native={"parts": [{"text": text}]})

        request = ModelRequest(
            messages=(ChatMessage(role="user", content=str(message.payload)),),
            native={"sdk": "example", "prompt": message.payload},
        )
        answer = await ctx.model_call(request, ask)
        assert answer.native == {"parts": [{"text": answer.text}]}
        await self.send.run(ctx, {"to": "a@example.com", "text": answer.text})
        ctx.send("sink", answer.text)


class Sink(Agent[AgentState]):
    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        pass


async def test_a_schema_tool_sends_once_across_a_rollback_with_a_new_answer() -> None:
    sent = Sent()
    send = Tool.from_schema("send_email", SCHEMA, sent, side_effect=True)
    assert send.arguments_schema() == SCHEMA
    rejected: list[str] = []

    def once(message: Message) -> bool | str:
        if rejected:
            return True
        rejected.append(str(message.payload))
        return "say it otherwise"

    async with Runtime() as runtime:
        mailer = runtime.add(Mailer("mailer", send, ["first words", "other words"]))
        runtime.add(Sink("sink"))
        runtime.check("mailer", check=once)
        runtime.send("mailer", "write")
        await runtime.run_until_idle()
        entries = await runtime.ledger.list_calls(runtime.run_id)
    assert mailer.asked == 2  # asked again after the rollback: another answer
    assert [r.source for r in runtime.rollbacks] == ["once"]
    assert [e.tool for e in entries] == ["send_email"]
    assert sent.emails == [{"to": "a@example.com", "text": "first words"}]


async def test_a_schema_tool_refuses_arguments_its_schema_does_not_take() -> None:
    send = Tool.from_schema("send_email", SCHEMA, Sent(), side_effect=True)
    with pytest.raises(ToolArgumentsInvalid, match="missing required text"):
        send._validate({"to": "x"})
    with pytest.raises(ToolArgumentsInvalid, match="unexpected cc"):
        send._validate({"to": "x", "text": "y", "cc": "z"})


def test_a_schema_tool_needs_an_object_schema_and_an_async_function() -> None:
    with pytest.raises(ConfigurationError, match="'object' JSON Schema"):
        Tool.from_schema("t", {"type": "string"}, Sent())

    def plain(arguments: dict[str, Any]) -> None:
        return None

    with pytest.raises(ConfigurationError, match="async function"):
        Tool.from_schema("t", SCHEMA, plain)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="key_from= of tool 't' names"):
        Tool.from_schema("t", SCHEMA, Sent(), side_effect=True, key_from=["nope"])


async def test_a_model_call_made_its_own_way_is_recorded_with_its_native_form() -> None:
    sent = Sent()
    send = Tool.from_schema("send_email", SCHEMA, sent, side_effect=True, key_from=["to"])
    async with Runtime() as runtime:
        mailer = runtime.add(Mailer("mailer", send, ["hello"]))
        runtime.add(Sink("sink"))
        runtime.send("mailer", "write")
        await runtime.run_until_idle()
        calls = await runtime.ledger.list_model_calls(runtime.run_id)  # type: ignore[attr-defined]
    assert mailer.asked == 1
    assert [c.request["native"] for c in calls] == [{"sdk": "example", "prompt": "write"}]
    assert [c.response["native"] for c in calls] == [{"parts": [{"text": "hello"}]}]


async def test_a_schema_tool_taking_the_call_is_handed_its_idempotency_key() -> None:
    keys: list[str | None] = []

    async def send(call: ToolCall, arguments: dict[str, Any]) -> str:
        keys.append(call.key)
        return f"sent to {arguments['to']}"

    tool = Tool.from_schema("send_email", SCHEMA, send, side_effect=True)
    async with Runtime() as runtime:
        runtime.add(Mailer("mailer", tool, ["hello"]))
        runtime.add(Sink("sink"))
        runtime.send("mailer", "write")
        await runtime.run_until_idle()
        entries = await runtime.ledger.list_calls(runtime.run_id)
    assert keys == [entries[0].key]


def test_schema_tool_options_keep_their_defaults_and_refuse_unknown_keywords() -> None:
    async def send(arguments: dict[str, Any]) -> str:
        return "sent"

    made = Tool.from_schema("send", SCHEMA, send)
    assert (made.description, made.side_effect, made.lease, made.wait) == ("", False, 60.0, 10.0)
    assert (made.on_redo, made.on_divergence, made.key_from, made.approval) == (
        "recorded",
        "raise",
        None,
        None,
    )
    keyed = Tool.from_schema("send", SCHEMA, send, side_effect=True, key_from=["to"], wait=1.0)
    assert (keyed.key_from, keyed.wait) == (("to",), 1.0)
    with pytest.raises(
        TypeError, match=r"from_schema\(\) got an unexpected keyword argument 'transient'"
    ):
        Tool.from_schema("send", SCHEMA, send, transient=(OSError,))  # type: ignore[call-arg]
