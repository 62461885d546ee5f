"""The middleware that makes a LangChain ``create_agent`` agent's calls agentsnap steps."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, cast

from langchain.agents.middleware import AgentMiddleware
from langchain.agents.middleware.types import ModelRequest as LangChainRequest
from langchain.agents.middleware.types import ModelResponse as LangChainResponse
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    ToolMessage,
    message_to_dict,
    messages_from_dict,
    messages_to_dict,
)
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.types import Command
from pydantic import TypeAdapter, ValidationError
from pydantic_core import to_jsonable_python

from agentsnap.agents import Context
from agentsnap.exceptions import ConfigurationError, ToolArgumentsInvalid
from agentsnap.integrations._records import json_of, offered, recorded_answer, tool_call
from agentsnap.integrations._running import current
from agentsnap.messages import JsonValue
from agentsnap.models import (
    ChatMessage,
    ModelRequest,
    ModelResponse,
    ModelToolCall,
    ToolSpec,
)
from agentsnap.tools import OnDivergence, OnRedo, Tool

__all__ = ["AgentsnapMiddleware", "SideEffect", "idempotency_key"]

ToolResult = ToolMessage | Command[Any]


@dataclass(frozen=True)
class SideEffect:
    """How a side-effecting LangChain tool goes through the ledger.

    The options of [`tool`][agentsnap.tool] for side-effecting tools, given by tool name in
    ``AgentsnapMiddleware(side_effects={"send_email": SideEffect(...)})``.
    """

    key_from: tuple[str, ...] | None = None
    """Arguments whose values name the effect, instead of the call's place among this
    tool's calls in the handler; the other arguments are then wording."""
    on_redo: OnRedo = "recorded"
    """What a redo after a rollback does when the model words the call otherwise."""
    on_divergence: OnDivergence = "raise"
    """What a call re-executed after a resume does when its arguments differ."""
    rerun_if_unknown: bool = False
    """Run again under the same key when the outcome of a killed call is unknown: only for a
    tool whose service deduplicates by
    [`idempotency_key`][agentsnap.integrations.langchain.idempotency_key]."""
    lease: float = 60.0
    """Seconds a claim on the key is held before another process may take it over."""
    wait: float = 10.0
    """Seconds a call waits for the same key in progress elsewhere."""


@dataclass
class _Pending:
    """The LangChain tool call the ledger is about to run, for the agentsnap tool's function."""

    request: ToolCallRequest
    handler: Callable[[ToolCallRequest], Awaitable[ToolResult]]
    ctx: Context[Any]
    result: ToolResult | None = None
    key: str | None = None


_PENDING: ContextVar[_Pending | None] = ContextVar("agentsnap_langchain_tool", default=None)

# One agentsnap tool per name and declaration, shared by every middleware of the process: a
# runtime refuses two different tools of one name, so two agents with the same LangChain
# tool must hand it the same agentsnap tool.
_TOOLS: dict[tuple[str, bool, SideEffect | None, str, str], Tool[Any]] = {}


def idempotency_key() -> str | None:
    """The idempotency key of the side-effecting tool call running here, for a tool's body.

    A LangChain tool that calls a service able to deduplicate requests (a payment API, a
    mail service) passes it on, so that a call run again after a crash whose outcome was
    never recorded cannot repeat the effect.

    Returns:
        The key, or ``None`` in a read-only tool or outside a call the middleware routed.
    """
    pending = _PENDING.get()
    return None if pending is None else pending.key


@dataclass
class _Batch:
    """The tool calls of one model answer, run one after another in the answer's order."""

    order: tuple[str, ...]
    done: dict[str, asyncio.Event] = field(default_factory=dict)
    finished: int = 0

    def __post_init__(self) -> None:
        self.done = {call_id: asyncio.Event() for call_id in self.order}


class AgentsnapMiddleware(AgentMiddleware):
    """Makes a LangChain agent's model calls recorded steps and its tools ledger calls.

    Give it to ``langchain.agents.create_agent(..., middleware=[AgentsnapMiddleware()])``,
    first in the list, and run the agent in an agentsnap handler: as a
    [`LangChainAgent`][agentsnap.integrations.langchain.LangChainAgent], or inside
    ``agentsnap.integrations._running.handling(ctx)`` in a handler of your own. One
    middleware serves any number of agents and handlers: it finds the running handler's
    context each time.

    - Each model call is made through
      [`Context.model_call`][agentsnap.Context.model_call]: LangChain's request and answer
      (messages dumped by ``langchain_core.messages``) are kept as the record's ``native``
      JSON, with text, tool calls and token usage filled in for the inspector. A handler
      re-executed after a crash and ``resume()`` gets the recorded ``AIMessage`` back, and
      the model is not asked; after a rollback it is asked again.
    - Each tool call goes through an agentsnap [`Tool`][agentsnap.Tool] made of the
      LangChain tool's name and JSON Schema, so it is in the agent's ``state.tool_calls``.
      A side-effecting tool's call goes through the ledger under a key bound to the call
      (the run, the agent, the message being handled and the call's place among this
      tool's calls): however the model words it after a rollback or a resume, the effect
      happens once, and the redo gets the recorded ``ToolMessage``. The tool calls of one
      answer run one at a time, in the answer's order, so that their places do not depend
      on which finishes first.

    Which tools change the world: by default every tool does, except those named in
    ``read_only``, so that a tool nobody declared is never run twice. Name the
    side-effecting tools in ``side_effects`` instead, and every other tool is read-only.

    Args:
        side_effects: The side-effecting tools, by name, or a mapping of their names to
            [`SideEffect`][agentsnap.integrations.langchain.SideEffect] options. ``None``
            (the default): every tool not in ``read_only``.
        read_only: Tools that only read: they run again whenever the agent calls them.

    Raises:
        ConfigurationError: A tool is named both side-effecting and read-only.
    """

    def __init__(
        self,
        *,
        side_effects: Iterable[str] | Mapping[str, SideEffect] | None = None,
        read_only: Iterable[str] = (),
    ) -> None:
        super().__init__()
        self.read_only = frozenset(read_only)
        """Tools that only read."""
        if side_effects is None:
            self.side_effects: Mapping[str, SideEffect] | None = None
        elif isinstance(side_effects, Mapping):
            self.side_effects = dict(side_effects)
        elif isinstance(side_effects, str):
            self.side_effects = {side_effects: SideEffect()}
        else:
            self.side_effects = {name: SideEffect() for name in side_effects}
        """The side-effecting tools and their options; ``None``: every tool not read-only."""
        both = sorted(self.read_only & set(self.side_effects or ()))
        if both:
            raise ConfigurationError(
                f"tools {both!r} are named both in side_effects= and in read_only=; a tool "
                "either changes the world or only reads"
            )
        self._batches: dict[tuple[str, str, str, tuple[str, ...]], _Batch] = {}

    def effect_of(self, name: str) -> SideEffect | None:
        """How the tool ``name`` goes through the ledger, or ``None`` when it only reads."""
        if name in self.read_only:
            return None
        if self.side_effects is None:
            return SideEffect()
        return self.side_effects.get(name)

    # -- model calls -----------------------------------------------------------------------

    async def awrap_model_call(
        self,
        request: LangChainRequest[Any],
        handler: Callable[[LangChainRequest[Any]], Awaitable[LangChainResponse[Any]]],
    ) -> LangChainResponse[Any]:
        """Make the model call a recorded step of the running handler.

        Raises:
            ConfigurationError: No agentsnap handler runs the agent.
            StoreError: The answer could not be recorded.
        """
        ctx = current("a LangChain agent's model call")
        asked: list[LangChainResponse[Any]] = []

        async def ask(_: ModelRequest) -> ModelResponse:
            answer = await handler(request)
            asked.append(answer)
            return response_of(answer)

        recorded = await ctx.model_call(request_of(request), ask)
        if asked:  # asked now: LangChain gets the model's own objects
            return asked[-1]
        return rebuilt(recorded, request)

    def wrap_model_call(
        self,
        request: LangChainRequest[Any],
        handler: Callable[[LangChainRequest[Any]], LangChainResponse[Any]],
    ) -> LangChainResponse[Any]:
        """Refused: a recorded model call is awaited, so run the agent with ``ainvoke``.

        Raises:
            ConfigurationError: Always.
        """
        raise ConfigurationError(_SYNC)

    # -- tool calls ------------------------------------------------------------------------

    async def awrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], Awaitable[ToolResult]],
    ) -> ToolResult:
        """Run the tool call through an agentsnap tool, and the ledger if it has effects.

        Raises:
            ConfigurationError: No agentsnap handler runs the agent, or a side-effecting
                tool's recorded outcome is not a tool message.
            ToolFailed: The tool raised (now, or as recorded for this call).
        """
        ctx = current("a LangChain agent's tool call")
        if request.tool is None:  # a tool the agent does not have: LangChain answers
            return await handler(request)
        call = request.tool_call
        call_id = str(call.get("id") or "")
        tool = self._agentsnap_tool(request.tool)
        pending = _Pending(request, handler, ctx)
        async with self._turn(ctx, request, call_id):
            token = _PENDING.set(pending)
            try:
                value = await tool.run(ctx, dict(call.get("args") or {}))
            except ToolArgumentsInvalid as exc:
                return ToolMessage(
                    content=f"Error: {exc}", tool_call_id=call_id, name=tool.name, status="error"
                )
            finally:
                _PENDING.reset(token)
        if pending.result is not None:  # the tool ran now
            return pending.result
        return _replayed_message(value, tool.name, call_id)

    def wrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], ToolResult],
    ) -> ToolResult:
        """Refused: a ledger call is awaited, so run the agent with ``ainvoke``.

        Raises:
            ConfigurationError: Always.
        """
        raise ConfigurationError(_SYNC)

    def _agentsnap_tool(self, lc_tool: BaseTool) -> Tool[Any]:
        name = lc_tool.name
        effect = self.effect_of(name)
        spec = _spec_of(lc_tool)
        cache_key = (
            name,
            effect is not None,
            effect,
            spec.description,
            json.dumps(spec.parameters, sort_keys=True),
        )
        made = _TOOLS.get(cache_key)
        if made is None:
            options: dict[str, Any] = {}
            if effect is not None:
                options = {
                    "key_from": effect.key_from,
                    "on_redo": effect.on_redo,
                    "on_divergence": effect.on_divergence,
                    "rerun_if_unknown": effect.rerun_if_unknown,
                    "lease": effect.lease,
                    "wait": effect.wait,
                }
            made = Tool.from_schema(
                name,
                spec.parameters,
                _run_langchain_tool,
                description=spec.description,
                side_effect=effect is not None,
                **options,
            )
            _TOOLS[cache_key] = made
        return made

    @contextlib.asynccontextmanager
    async def _turn(
        self, ctx: Context[Any], request: ToolCallRequest, call_id: str
    ) -> AsyncIterator[None]:
        """Wait for the calls the model listed before this one, then run it."""
        order = _pending_calls(request.state, call_id)
        message = ctx.message
        if len(order) < 2 or message is None:
            yield
            return
        key = (ctx.run_id, ctx.agent.name, message.id, order)
        batch = self._batches.get(key)
        if batch is None:
            batch = self._batches[key] = _Batch(order)
        try:
            for earlier in order[: order.index(call_id)]:
                await batch.done[earlier].wait()
            yield
        finally:  # a call that fails, or is cancelled while it waits, lets the next one go
            batch.done[call_id].set()
            batch.finished += 1
            if batch.finished >= len(order):
                self._batches.pop(key, None)


_SYNC = (
    "the agentsnap middleware records model calls and tool calls, which is awaited: run the "
    "LangChain agent with `await agent.ainvoke(...)` (or astream), not invoke()"
)


async def _run_langchain_tool(arguments: dict[str, Any]) -> JsonValue:
    """The agentsnap tool's function: run the LangChain tool call waiting in this task."""
    pending = _PENDING.get()
    if pending is None:  # pragma: no cover - the middleware always sets it
        raise ConfigurationError("a LangChain tool was called outside the agentsnap middleware")
    name = pending.request.tool_call["name"]
    for record in reversed(pending.ctx.state.tool_calls):
        if record.tool == name and record.status == "running":
            pending.key = record.key
            break
    result = await pending.handler(pending.request)
    if isinstance(result, ToolMessage) and result.id is None:
        # An id of its own, the same when the handler runs again: a conversation replayed
        # after a crash is the same conversation.
        result.id = f"{result.tool_call_id}:result"
    pending.result = result
    return _result_json(result)


def _result_json(result: ToolResult) -> JsonValue:
    """What the ledger and the agent's history keep of a tool's answer."""
    if isinstance(result, ToolMessage):
        return cast("JsonValue", to_jsonable_python(message_to_dict(result), fallback=repr))
    return {"type": "command", "data": to_jsonable_python(result, fallback=repr)}


def _replayed_message(value: Any, name: str, call_id: str) -> ToolMessage:
    """The recorded answer of a tool call, as the answer to the call the model made now."""
    if not (isinstance(value, Mapping) and value.get("type") == "tool"):
        raise ConfigurationError(
            f"the recorded outcome of LangChain tool {name!r} is not a tool message "
            f"({str(value)[:80]!r}); a side-effecting tool must return content or a "
            "ToolMessage, not a Command, for its outcome to be given back"
        )
    (message,) = messages_from_dict([dict(value)])
    assert isinstance(message, ToolMessage)
    if message.tool_call_id != call_id:  # the model named the call otherwise this time
        message = message.model_copy(update={"tool_call_id": call_id, "id": f"{call_id}:result"})
    return message


def _pending_calls(state: Any, call_id: str) -> tuple[str, ...]:
    """The ids of the tool calls the tools node runs with ``call_id``, in the model's order."""
    messages = state.get("messages") if isinstance(state, Mapping) else None
    if not call_id or not isinstance(messages, Sequence):
        return ()
    answered: set[str] = set()
    for message in reversed(messages):
        if isinstance(message, ToolMessage):
            answered.add(message.tool_call_id)
        elif isinstance(message, AIMessage):
            ids = tuple(
                str(c["id"]) for c in message.tool_calls if c.get("id") and c["id"] not in answered
            )
            return ids if call_id in ids else ()
    return ()


# -- conversions -------------------------------------------------------------------------------

_ROLES = {"system": "system", "human": "user", "ai": "assistant", "tool": "tool"}


def chat_message(message: BaseMessage) -> ChatMessage:
    """A LangChain message as agentsnap's [`ChatMessage`][agentsnap.models.ChatMessage]."""
    role = _ROLES.get(message.type, "user")
    calls: tuple[ModelToolCall, ...] = ()
    if isinstance(message, AIMessage):
        calls = tuple(
            tool_call(c["name"], c.get("args") or {}, c.get("id")) for c in message.tool_calls
        )
    return ChatMessage(
        role=role,
        content=message.text,
        tool_calls=calls,
        tool_call_id=message.tool_call_id if isinstance(message, ToolMessage) else None,
    )


def _spec_of(lc_tool: BaseTool | Mapping[str, Any]) -> ToolSpec:
    try:
        function = convert_to_openai_tool(lc_tool)["function"]
    except (KeyError, TypeError, ValueError, NotImplementedError):
        named = lc_tool if isinstance(lc_tool, Mapping) else {}
        return ToolSpec(name=str(named.get("name") or named.get("type") or "tool"))
    return offered(
        str(function["name"]),
        str(function.get("description") or ""),
        function.get("parameters") or {"type": "object", "properties": {}},
    )


def request_of(request: LangChainRequest[Any]) -> ModelRequest:
    """The agentsnap record of a LangChain model request, its own JSON in ``native``."""
    messages = list(request.messages)
    if request.system_message is not None:
        messages = [request.system_message, *messages]
    model = request.model
    name = getattr(model, "model_name", None) or getattr(model, "model", None)
    native: dict[str, Any] = {
        "messages": messages_to_dict(messages),
        "tools": [
            json_of(convert_to_openai_tool(t)) if isinstance(t, BaseTool) else json_of(t)
            for t in request.tools
        ],
        "tool_choice": json_of(request.tool_choice),
        "model": str(name) if isinstance(name, str) else type(model).__name__,
        "model_settings": json_of(request.model_settings),
    }
    if request.response_format is not None:
        native["response_format"] = repr(request.response_format)
    return ModelRequest(
        messages=tuple(chat_message(m) for m in messages),
        tools=tuple(_spec_of(t) for t in request.tools),
        settings=json_of(request.model_settings),
        native=json_of(native),
    )


def response_of(response: LangChainResponse[Any]) -> ModelResponse:
    """The agentsnap record of a LangChain model answer, its own JSON in ``native``."""
    ai = next((m for m in response.result if isinstance(m, AIMessage)), None)
    native = {
        "result": messages_to_dict(response.result),
        "structured_response": json_of(response.structured_response),
    }
    if ai is None:
        return ModelResponse(output=native["structured_response"], native=json_of(native))
    usage: Mapping[str, Any] = ai.usage_metadata or {}
    meta = ai.response_metadata or {}
    name = meta.get("model_name") or meta.get("model")
    return recorded_answer(
        ai.text,
        chat_message(ai).tool_calls,
        str(name) if name else None,
        int(usage.get("input_tokens", 0)),
        int(usage.get("output_tokens", 0)),
        json_of(native),
        output=native["structured_response"],
    )


def rebuilt(recorded: ModelResponse, request: LangChainRequest[Any]) -> LangChainResponse[Any]:
    """The LangChain answer a recorded model call gives back, from its ``native`` JSON."""
    native = recorded.native
    if native is None or not isinstance(native.get("result"), list):
        # Recorded without LangChain's own form: the answer's text and tool calls.
        message = AIMessage(
            content=recorded.text,
            tool_calls=[
                {"name": c.name, "args": dict(c.arguments), "id": c.id, "type": "tool_call"}
                for c in recorded.tool_calls
            ],
        )
        return LangChainResponse(result=[message], structured_response=recorded.output)
    result = messages_from_dict(cast("list[dict[str, Any]]", native["result"]))
    structured = native.get("structured_response")
    return LangChainResponse(
        result=result, structured_response=_structured(structured, request.response_format)
    )


def _structured(value: Any, response_format: Any) -> Any:
    """A recorded structured response as the type the agent's response format names."""
    if value is None or response_format is None:
        return value
    schema = getattr(response_format, "schema", response_format)
    if not isinstance(schema, type):
        return value  # a JSON Schema: the response is a dictionary already
    try:
        return TypeAdapter(schema).validate_python(value)
    except (ValidationError, TypeError):
        return value
