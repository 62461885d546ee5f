"""pydantic-ai's requests and answers as agentsnap records, and back.

A recorded model call keeps pydantic-ai's own JSON (``native``), which is what a replay gives
back to pydantic-ai, and a plain view of it (messages, tools, text, tool calls, usage) for
``agentsnap model-calls`` and the inspector.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import TypeAdapter
from pydantic_ai import messages as pai
from pydantic_ai.models import ModelRequestParameters
from pydantic_ai.settings import ModelSettings
from pydantic_ai.tools import ToolDefinition

from agentsnap.integrations._records import json_of, offered, recorded_answer, tool_call
from agentsnap.messages import JsonValue
from agentsnap.models import (
    ChatMessage,
    ModelRequest,
    ModelResponse,
    ToolSpec,
)

__all__ = ["rebuilt_response", "recorded_request", "recorded_response"]

_PARAMETERS: TypeAdapter[ModelRequestParameters] = TypeAdapter(ModelRequestParameters)


def messages_json(messages: Sequence[pai.ModelMessage]) -> list[dict[str, JsonValue]]:
    """A message history in pydantic-ai's own JSON form (``ModelMessagesTypeAdapter``)."""
    dumped: list[dict[str, JsonValue]] = pai.ModelMessagesTypeAdapter.dump_python(
        list(messages), mode="json"
    )
    return dumped


def messages_from_json(data: Sequence[Any]) -> list[pai.ModelMessage]:
    """A message history from its JSON form."""
    return pai.ModelMessagesTypeAdapter.validate_python(list(data))


def recorded_request(
    messages: Sequence[pai.ModelMessage],
    settings: ModelSettings | None,
    parameters: ModelRequestParameters,
) -> ModelRequest:
    """The request as agentsnap records it: pydantic-ai's JSON in ``native``, and a view."""
    try:
        parameters_json: Any = _PARAMETERS.dump_python(parameters, mode="json")
    except Exception:  # a native tool pydantic cannot dump: shown, not replayed
        parameters_json = json_of(parameters)
    native: dict[str, JsonValue] = {
        "messages": messages_json(messages),  # type: ignore[dict-item]
        "model_settings": json_of(dict(settings or {})),
        "model_request_parameters": parameters_json,
    }
    tools = [*parameters.function_tools, *parameters.output_tools]
    output_schema = parameters.output_object.json_schema if parameters.output_object else None
    return ModelRequest(
        messages=tuple(_chat_messages(messages)),
        tools=tuple(_spec(tool) for tool in tools),
        output_schema=json_of(output_schema) if output_schema is not None else None,
        settings=json_of(dict(settings or {})),
        native=native,
    )


def recorded_response(response: pai.ModelResponse) -> ModelResponse:
    """The answer as agentsnap records it: pydantic-ai's JSON in ``native``, and a view."""
    (native,) = messages_json([response])
    return recorded_answer(
        "".join(part.content for part in response.parts if isinstance(part, pai.TextPart)),
        (
            tool_call(part.tool_name, part.args_as_dict(), part.tool_call_id)
            for part in response.parts
            if isinstance(part, pai.ToolCallPart)
        ),
        response.model_name,
        response.usage.input_tokens,
        response.usage.output_tokens,
        native,
    )


def rebuilt_response(recorded: ModelResponse) -> pai.ModelResponse:
    """pydantic-ai's answer, rebuilt from a recorded one's ``native`` JSON.

    A record with no ``native`` form (made by other code at the same place) is rebuilt from
    its text and tool calls.
    """
    if recorded.native is not None:
        (message,) = messages_from_json([recorded.native])
        if isinstance(message, pai.ModelResponse):
            return message
    parts: list[pai.ModelResponsePart] = []
    if recorded.text:
        parts.append(pai.TextPart(recorded.text))
    parts.extend(
        pai.ToolCallPart(call.name, dict(call.arguments), tool_call_id=call.id or None)  # type: ignore[arg-type]
        for call in recorded.tool_calls
    )
    return pai.ModelResponse(parts=parts, model_name=recorded.model)


def _spec(tool: ToolDefinition) -> ToolSpec:
    return offered(tool.name, tool.description, tool.parameters_json_schema)


def _chat_messages(messages: Sequence[pai.ModelMessage]) -> list[ChatMessage]:
    chat: list[ChatMessage] = []
    for message in messages:
        if isinstance(message, pai.ModelRequest):
            if message.instructions:
                chat.append(ChatMessage(role="system", content=message.instructions))
            chat.extend(_request_parts(message.parts))
        else:
            chat.append(recorded_response(message).message())
    return chat


def _request_parts(parts: Sequence[Any]) -> list[ChatMessage]:
    chat: list[ChatMessage] = []
    for part in parts:
        if isinstance(part, pai.SystemPromptPart):
            chat.append(ChatMessage(role="system", content=part.content))
        elif isinstance(part, pai.UserPromptPart):
            chat.append(ChatMessage(role="user", content=_user_text(part.content)))
        elif isinstance(part, pai.ToolReturnPart):
            chat.append(
                ChatMessage(
                    role="tool", content=part.model_response_str(), tool_call_id=part.tool_call_id
                )
            )
        elif isinstance(part, pai.RetryPromptPart):
            if part.tool_name is None:
                chat.append(ChatMessage(role="user", content=part.model_response()))
            else:
                chat.append(
                    ChatMessage(
                        role="tool", content=part.model_response(), tool_call_id=part.tool_call_id
                    )
                )
    return chat


def _user_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(item if isinstance(item, str) else repr(item) for item in content)
