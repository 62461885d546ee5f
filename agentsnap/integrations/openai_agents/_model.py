"""The SDK's model behind agentsnap's recording: every model call is a recorded step."""

from __future__ import annotations

import asyncio
import contextlib
import json
import typing
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any

from agents.exceptions import ModelBehaviorError
from agents.items import ModelResponse as SDKResponse
from agents.models.interface import Model, ModelProvider, ModelTracing
from agents.models.multi_provider import MultiProvider
from agents.tool import FunctionTool
from agents.usage import Usage as SDKUsage
from openai.types.responses import (
    Response,
    ResponseCompletedEvent,
    ResponseCreatedEvent,
    ResponseOutputItem,
    ResponseOutputItemAddedEvent,
    ResponseOutputItemDoneEvent,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseTextDeltaEvent,
    ResponseUsage,
)
from pydantic import TypeAdapter
from pydantic_core import to_jsonable_python

from agentsnap.exceptions import ConfigurationError
from agentsnap.integrations._records import offered, recorded_answer, tool_call
from agentsnap.integrations._running import current
from agentsnap.models import (
    ChatMessage,
    ModelRequest,
    ModelResponse,
    ModelToolCall,
)

if TYPE_CHECKING:
    from agents.agent_output import AgentOutputSchemaBase
    from agents.handoffs import Handoff
    from agents.items import TResponseInputItem, TResponseStreamEvent
    from agents.model_settings import ModelSettings
    from agents.tool import Tool as SDKTool
    from openai.types.responses.response_prompt_param import ResponsePromptParam

__all__ = ["RecordedModel", "as_json"]

_OUTPUT_ITEM: TypeAdapter[Any] = TypeAdapter(ResponseOutputItem)
_USAGE: TypeAdapter[SDKUsage] = TypeAdapter(SDKUsage)


def as_json(value: Any) -> Any:
    """``value`` as JSON data: pydantic models and dataclasses by their fields, else its repr.

    Args:
        value: What the SDK holds or returns (input items, a final output).

    Returns:
        JSON data (dicts, lists, strings, numbers, booleans, ``None``).
    """
    return to_jsonable_python(value, by_alias=True, exclude_none=False, fallback=repr)


class RecordedModel(Model):
    """An SDK ``Model`` whose calls are recorded steps of the agentsnap handler running it.

    [`OpenAIAgent`][agentsnap.integrations.openai_agents.OpenAIAgent] puts one in place of
    the model of every SDK agent it runs, so the SDK's own agent code is unchanged. Each
    ``get_response`` goes through
    [`Context.model_call`][agentsnap.Context.model_call]: the SDK's request and answer are
    kept as JSON in ``native`` (and shown as messages, tool calls and usage by ``agentsnap
    model-calls``), a handler re-executed after a crash gets the recorded answer, rebuilt
    into the SDK's ``ModelResponse``, without asking the model, and after a rollback the
    model is asked again. ``stream_response`` is recorded the same way, once the stream is
    complete, and a replayed one streams the recorded answer.

    A ``previous_response_id`` is recorded with the request; a ``conversation_id`` is
    refused ([`ConfigurationError`][agentsnap.ConfigurationError]), since a rollback cannot
    undo what the provider's conversation object holds (chain responses instead:
    ``OpenAIAgent(..., chain_responses=True)``).

    Args:
        model: The SDK model, or its name (``"gpt-4.1"``), resolved by ``provider`` the
            first time the model is really asked: a replayed call needs no client.
        provider: Resolves a model name; the SDK's ``MultiProvider`` by default.

    Raises:
        ConfigurationError: ``model`` is neither an SDK ``Model`` nor a name.
    """

    def __init__(self, model: Model | str | None, provider: ModelProvider | None = None) -> None:
        if isinstance(model, RecordedModel):
            provider = provider or model._provider
            model = model._model
        if model is not None and not isinstance(model, (Model, str)):
            raise ConfigurationError(
                f"RecordedModel takes an SDK Model or a model name, got {type(model).__name__}"
            )
        self._model: Model | str | None = model
        self._provider: ModelProvider | None = provider

    @property
    def name(self) -> str | None:
        """The model's name, when it is known."""
        if isinstance(self._model, str):
            return self._model
        named = getattr(self._model, "model", None)
        return named if isinstance(named, str) else None

    def resolved(self) -> Model:
        """The SDK model itself, resolved from its name if need be."""
        if not isinstance(self._model, Model):
            provider = self._provider if self._provider is not None else MultiProvider()
            self._model = provider.get_model(self._model)
        return self._model

    async def get_response(  # noqa: PLR0917 - the SDK's signature
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[SDKTool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff[Any, Any]],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: ResponsePromptParam | None,
    ) -> SDKResponse:
        """Ask the model through the running handler's recording (see the class).

        Raises:
            ConfigurationError: ``conversation_id`` is given (see the class).
        """
        ctx = current("a model call of the OpenAI Agents SDK")
        _refuse_conversation(conversation_id)
        request = _request(
            system_instructions,
            input,
            model_settings,
            tools,
            output_schema,
            handoffs,
            previous_response_id=previous_response_id,
            conversation_id=conversation_id,
        )

        async def ask(_: ModelRequest) -> ModelResponse:
            answer = await self.resolved().get_response(
                system_instructions,
                input,
                model_settings,
                tools,
                output_schema,
                handoffs,
                tracing,
                previous_response_id=previous_response_id,
                conversation_id=conversation_id,
                prompt=prompt,
            )
            return _response(answer, self.name)

        return sdk_response(await ctx.model_call(request, ask))

    async def stream_response(  # noqa: PLR0917 - the SDK's signature
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[SDKTool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff[Any, Any]],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: ResponsePromptParam | None,
    ) -> AsyncIterator[TResponseStreamEvent]:
        """Stream the model's answer, recorded as one step once it is complete.

        Asked afresh, the model's own events are passed on as they come, and the response
        its ``response.completed`` event carries is recorded through
        [`Context.model_call`][agentsnap.Context.model_call], as ``get_response`` records
        (a streamed call and a whole one are the same step). A handler re-executed after a
        crash gets the recorded answer, and the events are made from it: a
        ``response.created``, each output item added, its text as one delta, the item
        done, and ``response.completed`` with the recorded response.

        Raises:
            ConfigurationError: ``conversation_id`` is given (see the class).
            ModelBehaviorError: The model's stream ended without ``response.completed``.
        """
        ctx = current("a streamed model call of the OpenAI Agents SDK")
        _refuse_conversation(conversation_id)
        request = _request(
            system_instructions,
            input,
            model_settings,
            tools,
            output_schema,
            handoffs,
            previous_response_id=previous_response_id,
            conversation_id=conversation_id,
        )
        live: asyncio.Queue[TResponseStreamEvent | None] = asyncio.Queue()
        asked = False

        async def ask(_: ModelRequest) -> ModelResponse:
            nonlocal asked
            asked = True
            completed: Response | None = None
            done: list[Any] = []
            events = self.resolved().stream_response(
                system_instructions,
                input,
                model_settings,
                tools,
                output_schema,
                handoffs,
                tracing,
                previous_response_id=previous_response_id,
                conversation_id=conversation_id,
                prompt=prompt,
            )
            try:
                async for event in events:
                    live.put_nowait(event)
                    if isinstance(event, ResponseCompletedEvent):
                        completed = event.response
                    elif isinstance(event, ResponseOutputItemDoneEvent):
                        done.append(event.item)
            finally:
                close = getattr(events, "aclose", None)
                if close is not None:
                    await close()
            if completed is None:
                raise ModelBehaviorError(
                    "the model's stream ended without a response.completed event: there is "
                    "no answer to record"
                )
            return _response(_completed(completed, done), self.name)

        # The recording runs beside this generator, which passes the model's events on as
        # they come; the end of the recording (its answer, or its error) ends the stream.
        call = asyncio.ensure_future(ctx.model_call(request, ask))
        call.add_done_callback(lambda _: live.put_nowait(None))
        try:
            while (event := await live.get()) is not None:
                yield event
            answer = call.result()
        finally:
            if not call.done():
                call.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await call
        if not asked:  # replayed: the events of the recorded answer
            for event in replayed_events(sdk_response(answer), self.name):
                yield event

    async def close(self) -> None:
        """Close the SDK model, if it was resolved."""
        if isinstance(self._model, Model):
            await self._model.close()


def _refuse_conversation(conversation_id: str | None) -> None:
    if conversation_id is not None:
        raise ConfigurationError(
            f"a run of agentsnap cannot use conversation_id={conversation_id!r}: the "
            "provider changes a conversation object in place, and a rollback cannot undo "
            "what it holds. Keep the conversation in the agent's state (the default "
            "session), or chain responses by id: OpenAIAgent(..., chain_responses=True), "
            "whose state records the last response id so that a rollback continues from "
            "the cut's response"
        )


def _completed(response: Response, done: list[Any]) -> SDKResponse:
    """The SDK's ``ModelResponse`` of a streamed answer's ``response.completed`` event."""
    usage = response.usage
    return SDKResponse(
        # Some backends leave the completed response's output empty and stream the items.
        output=list(response.output) or done,
        usage=SDKUsage(
            requests=1,
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            total_tokens=usage.total_tokens,
            input_tokens_details=usage.input_tokens_details,
            output_tokens_details=usage.output_tokens_details,
        )
        if usage is not None
        else SDKUsage(requests=1),
        response_id=response.id or None,
        request_id=getattr(response, "_request_id", None),
    )


def replayed_events(answer: SDKResponse, model: str | None) -> list[TResponseStreamEvent]:
    """The stream events of a recorded answer, as a streamed call replays it.

    ``response.created``; for each output item ``response.output_item.added``, the text of
    each of a message's text parts as one ``response.output_text.delta``, and
    ``response.output_item.done``; then ``response.completed`` with the whole response.

    Args:
        answer: The recorded answer, as the SDK's ``ModelResponse``.
        model: The model's name, for the response.

    Returns:
        The events, numbered in order.
    """
    usage = answer.usage
    # Constructed, not validated: the SDK's answers may have no id, a Response must.
    response = Response.model_construct(
        id=typing.cast("str", answer.response_id),
        created_at=0.0,
        model=model or "recorded",
        object="response",
        output=list(answer.output),
        parallel_tool_calls=False,
        tool_choice="auto",
        tools=[],
        status="completed",
        usage=ResponseUsage(
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            total_tokens=usage.total_tokens,
            input_tokens_details=usage.input_tokens_details,
            output_tokens_details=usage.output_tokens_details,
        ),
    )
    events: list[Any] = [
        ResponseCreatedEvent(
            type="response.created",
            response=response.model_copy(update={"output": [], "status": "in_progress"}),
            sequence_number=0,
        )
    ]
    for index, item in enumerate(answer.output):
        events.append(
            ResponseOutputItemAddedEvent(
                type="response.output_item.added",
                item=item,
                output_index=index,
                sequence_number=len(events),
            )
        )
        if isinstance(item, ResponseOutputMessage):
            for part_index, part in enumerate(item.content):
                if isinstance(part, ResponseOutputText):
                    events.append(
                        ResponseTextDeltaEvent(
                            type="response.output_text.delta",
                            item_id=item.id,
                            output_index=index,
                            content_index=part_index,
                            delta=part.text,
                            logprobs=[],
                            sequence_number=len(events),
                        )
                    )
        events.append(
            ResponseOutputItemDoneEvent(
                type="response.output_item.done",
                item=item,
                output_index=index,
                sequence_number=len(events),
            )
        )
    events.append(
        ResponseCompletedEvent(
            type="response.completed", response=response, sequence_number=len(events)
        )
    )
    return events


def sdk_response(response: ModelResponse) -> SDKResponse:
    """The SDK's ``ModelResponse`` from a recorded answer's ``native`` form.

    Raises:
        ConfigurationError: The answer was not recorded by this integration.
    """
    native = response.native
    if not isinstance(native, Mapping) or native.get("sdk") != "openai-agents":
        raise ConfigurationError(
            "a recorded model answer is not one of the OpenAI Agents SDK: the handler asked "
            "another model at this place before; a run must keep its agents' code"
        )
    output = native.get("output")
    usage = native.get("usage")
    raw_usage = native.get("raw_usage")
    return SDKResponse(
        output=[_OUTPUT_ITEM.validate_python(item) for item in output or ()]
        if isinstance(output, list)
        else [],
        usage=_USAGE.validate_python(usage) if isinstance(usage, Mapping) else SDKUsage(),
        response_id=_text_or_none(native.get("response_id")),
        request_id=_text_or_none(native.get("request_id")),
        raw_usage=dict(raw_usage) if isinstance(raw_usage, Mapping) else None,
    )


def _text_or_none(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _response(answer: SDKResponse, model: str | None) -> ModelResponse:
    """The SDK's answer as agentsnap records it: the inspector's fields, and ``native``."""
    output = [
        _OUTPUT_ITEM.dump_python(item, mode="json", by_alias=True, exclude_unset=True)
        for item in answer.output
    ]
    texts: list[str] = []
    calls: list[ModelToolCall] = []
    for item in output:
        kind = item.get("type")
        if kind == "message":
            texts.extend(
                str(part.get("text") or part.get("refusal") or "")
                for part in item.get("content") or ()
                if isinstance(part, Mapping)
            )
        elif kind == "function_call":
            calls.append(_call(item))
    usage = answer.usage
    return recorded_answer(
        "".join(texts),
        calls,
        model,
        usage.input_tokens,
        usage.output_tokens,
        {
            "sdk": "openai-agents",
            "output": output,
            "usage": _USAGE.dump_python(usage, mode="json"),
            "response_id": answer.response_id,
            "request_id": answer.request_id,
            "raw_usage": as_json(answer.raw_usage),
        },
    )


def _call(item: Mapping[str, Any]) -> ModelToolCall:
    """A ``function_call`` item as the view's tool call."""
    return tool_call(
        str(item.get("name", "")), _arguments(item.get("arguments")), str(item.get("call_id") or "")
    )


def _arguments(raw: object) -> dict[str, Any]:
    """A function call's arguments as an object (a model may send broken JSON)."""
    if not isinstance(raw, str) or not raw:
        return {}
    try:
        parsed = json.loads(raw)
    except ValueError:
        return {"arguments": raw}
    return parsed if isinstance(parsed, dict) else {"arguments": parsed}


def _request(  # noqa: PLR0917 - the SDK's call, field by field
    system_instructions: str | None,
    items: str | list[TResponseInputItem],
    model_settings: ModelSettings,
    tools: list[SDKTool],
    output_schema: AgentOutputSchemaBase | None,
    handoffs: list[Handoff[Any, Any]],
    *,
    previous_response_id: str | None,
    conversation_id: str | None,
) -> ModelRequest:
    """The SDK's request as agentsnap records it: messages and tools, and ``native``."""
    specs = [
        offered(t.name, t.description, t.params_json_schema)
        for t in tools
        if isinstance(t, FunctionTool)
    ]
    specs += [
        offered(
            h.tool_name,
            h.tool_description,
            as_json(h.input_json_schema) or {"type": "object", "properties": {}},
        )
        for h in handoffs
    ]
    schema = (
        as_json(output_schema.json_schema())
        if output_schema is not None and not output_schema.is_plain_text()
        else None
    )
    native_input = as_json(items)
    messages = (
        [ChatMessage(role="system", content=system_instructions)] if system_instructions else []
    )
    messages += _messages(native_input)
    return ModelRequest(
        messages=tuple(messages),
        tools=tuple(specs),
        output_schema=schema,
        settings=as_json(model_settings.to_json_dict()),
        native={
            "sdk": "openai-agents",
            "system_instructions": system_instructions,
            "input": native_input,
            "model_settings": as_json(model_settings.to_json_dict()),
            "tools": [getattr(t, "name", type(t).__name__) for t in tools],
            "handoffs": [h.tool_name for h in handoffs],
            "output_schema": schema,
            "previous_response_id": previous_response_id,
            "conversation_id": conversation_id,
        },
    )


def _messages(items: Any) -> list[ChatMessage]:
    """The SDK's input items as chat messages, for reading (``native`` keeps them whole)."""
    if isinstance(items, str):
        return [ChatMessage(role="user", content=items)]
    messages: list[ChatMessage] = []
    for item in items if isinstance(items, list) else ():
        if not isinstance(item, Mapping):
            continue
        kind = item.get("type")
        role = item.get("role")
        if kind == "function_call":
            messages.append(ChatMessage(role="assistant", tool_calls=(_call(item),)))
        elif kind == "function_call_output":
            output = item.get("output")
            messages.append(
                ChatMessage(
                    role="tool",
                    content=output if isinstance(output, str) else json.dumps(output),
                    tool_call_id=str(item.get("call_id") or "") or None,
                )
            )
        elif role in ("user", "assistant", "system", "developer"):
            messages.append(
                ChatMessage(
                    role="system" if role == "developer" else role,
                    content=_content(item.get("content")),
                )
            )
    return messages


def _content(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(part.get("text") or part.get("refusal") or "")
            for part in content
            if isinstance(part, Mapping)
        )
    return ""
