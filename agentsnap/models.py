"""What agentsnap asks of a language model, and what it records of each call.

Two protocols, so that a scripted model (no network, same answers every run), a sampled one
and a real one are interchangeable:

* [`ChatModel`][agentsnap.models.ChatModel], the short form: text in, text out
  (``complete(prompt)``);
* [`ToolCallingModel`][agentsnap.models.ToolCallingModel], the full form: a
  [`ModelRequest`][agentsnap.models.ModelRequest] in (messages, the tools offered, an output
  schema, settings), a [`ModelResponse`][agentsnap.models.ModelResponse] out (text, tool
  calls, structured output, the model's name, token usage).

A handler calls a model through its context, ``await ctx.chat(model, messages, tools=...)``
or ``await ctx.complete(model, prompt)``, and a model kept on the agent (``self.model``) is
recorded the same way when the handler calls ``self.model.complete(prompt)``: the runtime
records each call's request and answer, keyed by the call's place in the run, and a handler
re-executed after a crash gets the recorded answers instead of asking again (see
[Model calls](../concepts/model-calls.md)).

```python
from agentsnap.models import ChatModel
from agentsnap.testing import ScriptedModel

model: ChatModel = ScriptedModel([("capital of France", "Paris")])
```

Any LangChain chat model fits through [`LangChainModel`][agentsnap.models.LangChainModel],
which offers both forms, and [`load_model`][agentsnap.models.load_model] builds one from a
``provider:model`` string when ``langchain`` is installed.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from agentsnap.exceptions import ConfigurationError
from agentsnap.messages import JsonValue

__all__ = [
    "ChatMessage",
    "ChatModel",
    "LangChainModel",
    "ModelRequest",
    "ModelResponse",
    "ModelToolCall",
    "ToolCallingModel",
    "ToolSpec",
    "Usage",
    "ask",
    "load_model",
    "prompt_of",
]


class ModelToolCall(BaseModel):
    """A tool call a model asks for."""

    model_config = ConfigDict(frozen=True)

    name: str
    """Name of the tool."""
    arguments: dict[str, JsonValue] = Field(default_factory=dict)
    """Arguments, as JSON."""
    id: str = ""
    """The model's id for the call, echoed by the tool's answer (``ChatMessage.tool_call_id``)."""


class ChatMessage(BaseModel):
    """One message of a conversation with a model."""

    model_config = ConfigDict(frozen=True)

    role: Literal["system", "user", "assistant", "tool"]
    """Who speaks: instructions, the user, the model, or a tool's answer."""
    content: str = ""
    """The text."""
    tool_calls: tuple[ModelToolCall, ...] = ()
    """The tool calls the model asked for (``assistant`` messages)."""
    tool_call_id: str | None = None
    """The call a ``tool`` message answers."""


def _empty_object_schema() -> dict[str, JsonValue]:
    return {"type": "object", "properties": {}}


class ToolSpec(BaseModel):
    """A tool offered to a model: its name, what it does and its arguments' JSON Schema.

    [`Tool.spec()`][agentsnap.Tool.spec] makes one from an ``@tool`` function.
    """

    model_config = ConfigDict(frozen=True)

    name: str
    """Name of the tool."""
    description: str = ""
    """What the tool does, for the model."""
    parameters: dict[str, JsonValue] = Field(default_factory=_empty_object_schema)
    """JSON Schema of the arguments (an ``object`` schema)."""


class Usage(BaseModel):
    """Tokens a model call used."""

    model_config = ConfigDict(frozen=True)

    input_tokens: int = 0
    """Tokens of the request."""
    output_tokens: int = 0
    """Tokens of the answer."""

    @property
    def total_tokens(self) -> int:
        """Input and output tokens together."""
        return self.input_tokens + self.output_tokens


class ModelRequest(BaseModel):
    """What a handler asks a model."""

    model_config = ConfigDict(frozen=True)

    messages: tuple[ChatMessage, ...]
    """The conversation so far, oldest first."""
    tools: tuple[ToolSpec, ...] = ()
    """The tools the model may ask to call."""
    output_schema: dict[str, JsonValue] | None = None
    """JSON Schema the answer's ``output`` must follow, for structured output."""
    settings: dict[str, JsonValue] = Field(default_factory=dict)
    """Model settings (temperature, max tokens, ...), passed on as they are."""
    native: dict[str, JsonValue] | None = None
    """The request as an agent SDK made it, in that SDK's own JSON form, when an integration
    made the call (see [the OpenAI Agents SDK](../how-to/openai-agents.md)); recorded with
    the call."""


class ModelResponse(BaseModel):
    """A model's answer."""

    model_config = ConfigDict(frozen=True)

    text: str = ""
    """The answer's text."""
    tool_calls: tuple[ModelToolCall, ...] = ()
    """The tool calls the model asks for."""
    output: JsonValue = None
    """Structured output, when the request gave an ``output_schema``."""
    model: str | None = None
    """Name of the model that answered."""
    usage: Usage = Usage()
    """Tokens used."""
    native: dict[str, JsonValue] | None = None
    """The answer in its agent SDK's own JSON form, when an integration made the call: what
    a replay gives back to that SDK."""

    def message(self) -> ChatMessage:
        """The answer as the ``assistant`` message to append to the conversation."""
        return ChatMessage(role="assistant", content=self.text, tool_calls=self.tool_calls)


@runtime_checkable
class ChatModel(Protocol):
    """A model that answers a prompt with text (the short form)."""

    async def complete(self, prompt: str) -> str:
        """The model's answer to ``prompt``."""
        ...


@runtime_checkable
class ToolCallingModel(Protocol):
    """A model that answers a conversation: messages and tools in; text, tool calls, usage out."""

    async def respond(self, request: ModelRequest) -> ModelResponse:
        """The model's answer to ``request``."""
        ...


def prompt_of(request: ModelRequest) -> str:
    """The request as one prompt, for a model that only takes text.

    A single user message is its own text; a longer conversation is one line per message,
    ``role: content``.
    """
    messages = request.messages
    if len(messages) == 1 and messages[0].role == "user" and not request.tools:
        return messages[0].content
    lines = []
    for message in messages:
        text = message.content
        if message.tool_calls:
            calls = ", ".join(
                f"{call.name}({json.dumps(call.arguments, sort_keys=True)})"
                for call in message.tool_calls
            )
            text = f"{text} [calls: {calls}]".strip()
        lines.append(f"{message.role}: {text}")
    return "\n".join(lines)


async def ask(model: ChatModel | ToolCallingModel, request: ModelRequest) -> ModelResponse:
    """Ask ``model``, whichever protocol it follows; this records nothing.

    Raises:
        ConfigurationError: ``model`` follows neither protocol.
    """
    if isinstance(model, ToolCallingModel):
        return await model.respond(request)
    if isinstance(model, ChatModel):
        return ModelResponse(text=await model.complete(prompt_of(request)))
    raise ConfigurationError(
        f"{type(model).__name__} is not a model: give an object with "
        "`async def complete(prompt) -> str` or `async def respond(request) -> ModelResponse`"
    )


def request_of(
    messages: str | Sequence[ChatMessage | Mapping[str, Any]],
    *,
    tools: Sequence[ToolSpec | Any] = (),
    output_schema: Mapping[str, JsonValue] | None = None,
    settings: Mapping[str, JsonValue] | None = None,
) -> ModelRequest:
    """A [`ModelRequest`][agentsnap.models.ModelRequest] from what a handler has at hand.

    Args:
        messages: A prompt (one user message), or the conversation as ``ChatMessage``
            objects or dictionaries of their fields.
        tools: Tool specs, or ``@tool`` functions (anything with a ``spec()`` method).
        output_schema: JSON Schema for structured output.
        settings: Model settings.

    Raises:
        ConfigurationError: A message or tool is not of a kind this takes.
    """
    if isinstance(messages, str):
        listed: tuple[ChatMessage, ...] = (ChatMessage(role="user", content=messages),)
    else:
        try:
            listed = tuple(
                m if isinstance(m, ChatMessage) else ChatMessage.model_validate(m) for m in messages
            )
        except ValueError as exc:
            raise ConfigurationError(
                f"a model call's messages do not fit ChatMessage: {exc}"
            ) from None
    specs = []
    for item in tools:
        if isinstance(item, ToolSpec):
            specs.append(item)
        elif callable(getattr(item, "spec", None)):
            specs.append(item.spec())
        else:
            raise ConfigurationError(
                f"tools= takes ToolSpec objects or @tool functions, got {type(item).__name__}"
            )
    return ModelRequest(
        messages=listed,
        tools=tuple(specs),
        output_schema=dict(output_schema) if output_schema is not None else None,
        settings=dict(settings or {}),
    )


class LangChainModel:
    """A LangChain chat model as a [`ChatModel`][agentsnap.models.ChatModel] and a
    [`ToolCallingModel`][agentsnap.models.ToolCallingModel].

    Args:
        model: Anything with LangChain's ``ainvoke``, returning a message with ``content``
            (and, for tool calls, ``tool_calls`` and ``bind_tools``).
    """  # noqa: D205

    def __init__(self, model: Any) -> None:
        if not callable(getattr(model, "ainvoke", None)):
            raise ConfigurationError(
                f"{type(model).__name__} has no ainvoke(); pass a LangChain chat model"
            )
        self.model = model

    async def complete(self, prompt: str) -> str:  # noqa: D102
        return _text(await self.model.ainvoke(prompt))

    async def respond(self, request: ModelRequest) -> ModelResponse:  # noqa: D102
        model = self.model
        if request.tools:
            if not callable(getattr(model, "bind_tools", None)):
                raise ConfigurationError(
                    f"{type(model).__name__} cannot take tools (it has no bind_tools())"
                )
            model = model.bind_tools(
                [
                    {
                        "type": "function",
                        "function": {
                            "name": spec.name,
                            "description": spec.description,
                            "parameters": spec.parameters,
                        },
                    }
                    for spec in request.tools
                ]
            )
        messages: list[dict[str, Any]] = []
        for message in request.messages:
            entry: dict[str, Any] = {"role": message.role, "content": message.content}
            if message.tool_calls:
                entry["tool_calls"] = [
                    {"name": c.name, "args": c.arguments, "id": c.id, "type": "tool_call"}
                    for c in message.tool_calls
                ]
            if message.tool_call_id is not None:
                entry["tool_call_id"] = message.tool_call_id
            messages.append(entry)
        answer = await model.ainvoke(messages, **request.settings)
        calls = tuple(
            ModelToolCall(
                name=str(call.get("name", "")),
                arguments=dict(call.get("args") or {}),
                id=str(call.get("id") or ""),
            )
            for call in getattr(answer, "tool_calls", None) or ()
        )
        usage = getattr(answer, "usage_metadata", None) or {}
        meta = getattr(answer, "response_metadata", None) or {}
        name = meta.get("model_name") or meta.get("model")
        return ModelResponse(
            text=_text(answer),
            tool_calls=calls,
            model=str(name) if name else None,
            usage=Usage(
                input_tokens=int(usage.get("input_tokens", 0)),
                output_tokens=int(usage.get("output_tokens", 0)),
            ),
        )


def _text(answer: Any) -> str:
    content = getattr(answer, "content", answer)
    if isinstance(content, list):  # content blocks: keep the text ones
        content = "".join(
            block if isinstance(block, str) else str(block.get("text", "")) for block in content
        )
    return str(content)


def load_model(spec: str) -> LangChainModel:
    """A LangChain chat model from ``"provider:model"`` (for example ``openai:gpt-4o-mini``).

    Raises:
        ConfigurationError: ``langchain`` is not installed, or the spec is not understood;
            the message says what to install or write.
    """
    if ":" not in spec:
        raise ConfigurationError(
            f"model {spec!r} is not of the form provider:model (for example openai:gpt-4o-mini)"
        )
    try:
        chat_models = importlib.import_module("langchain.chat_models")
    except ImportError:
        raise ConfigurationError(
            f"using model {spec!r} needs LangChain: pip install langchain and the provider's "
            "package (for example langchain-openai)"
        ) from None
    try:
        model = chat_models.init_chat_model(spec)
    except (ImportError, ValueError) as exc:
        raise ConfigurationError(f"cannot load model {spec!r}: {exc}") from exc
    return LangChainModel(model)
