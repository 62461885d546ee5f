"""The capability that runs a pydantic-ai agent's model and tool calls through agentsnap."""

from __future__ import annotations

import contextvars
import json
from collections.abc import AsyncGenerator, Awaitable, Callable, Collection, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from pydantic_ai import messages as pai
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.exceptions import (
    ApprovalRequired,
    CallDeferred,
    ModelRetry,
    ToolFailedError,
    ToolRetryError,
)
from pydantic_ai.models import Model, ModelRequestParameters, StreamedResponse
from pydantic_ai.models.wrapper import WrapperModel
from pydantic_ai.run import AgentRunResult
from pydantic_ai.settings import ModelSettings
from pydantic_ai.tool_manager import ToolManager
from pydantic_ai.tools import RunContext, ToolDefinition

from agentsnap.exceptions import ConfigurationError, ToolFailed
from agentsnap.integrations._running import current, running
from agentsnap.integrations.pydantic_ai._convert import (
    as_json,
    rebuilt_response,
    recorded_request,
    recorded_response,
)
from agentsnap.models import ModelRequest, ModelResponse
from agentsnap.tools import OnDivergence, OnRedo, Tool

__all__ = ["AgentsnapDurability", "RecordedModel", "ToolOptions", "idempotency_key"]

# The call a ledger-backed tool runs when the ledger lets it: the SDK's own execution of it.
_PENDING: contextvars.ContextVar[Callable[[], Awaitable[Any]] | None] = contextvars.ContextVar(
    "agentsnap_pydantic_ai_tool", default=None
)
# The idempotency key of the ledger-backed call running in this task.
_KEY: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "agentsnap_pydantic_ai_key", default=None
)
# Set while a recorded call runs, so that a second durability capability on the same agent
# (the agent's own and one added to a run, say) records nothing twice.
_RECORDING: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "agentsnap_pydantic_ai_recording", default=False
)

# pydantic-ai's control-flow exceptions a tool's execution raises: the ledger records them as
# the call's outcome (a failure of that type, with its message), and a replay raises them
# again, rebuilt from the record, so that pydantic-ai goes on as it did the first time.
_SIGNALS: dict[str, Callable[[pai.ToolCallPart, str], Exception]] = {
    "ToolRetryError": lambda call, detail: ToolRetryError(_answer(call, detail, "retried")),
    "ToolFailedError": lambda call, detail: ToolFailedError(_answer(call, detail, "failed")),
    "ModelRetry": lambda call, detail: ModelRetry(detail),
    "CallDeferred": lambda call, detail: CallDeferred(),
    "ApprovalRequired": lambda call, detail: ApprovalRequired(),
}


def _answer(call: pai.ToolCallPart, detail: str, outcome: Any) -> pai.ToolReturnPart:
    return pai.ToolReturnPart(
        tool_name=call.tool_name,
        content=detail,
        tool_call_id=call.tool_call_id,
        outcome=outcome,
    )


@dataclass(frozen=True)
class ToolOptions:
    """How a pydantic-ai tool's calls go through agentsnap's ledger.

    The options of [`tool`][agentsnap.tool] that concern side effects; see
    [Tools with side effects](../concepts/tools.md).

    Attributes:
        key_from: The arguments that name the call's effect (``("reservation_id",)``): its
            idempotency key is made of them instead of the call's place in the handler.
        on_redo: What a redo after a rollback does when it calls the tool where the undone
            path did, with other arguments (default ``"recorded"``: the effect that happened
            stands).
        on_divergence: What a re-execution after a crash does with other arguments.
        rerun_if_unknown: Running the tool again after an unknown outcome is safe.
        lease: Seconds a claim holds.
        wait: Seconds a call waits for the same key in progress elsewhere.
    """

    key_from: Sequence[str] | None = None
    on_redo: OnRedo = "recorded"
    on_divergence: OnDivergence = "raise"
    rerun_if_unknown: bool = False
    lease: float = 60.0
    wait: float = 10.0


_LEDGER_TOOLS: dict[tuple[str, ToolOptions, str], Tool[Any]] = {}


def _ledger_tool(name: str, options: ToolOptions, schema: Mapping[str, Any]) -> Tool[Any]:
    """The agentsnap tool standing for a pydantic-ai tool: one per name, options and schema.

    The runtime knows a tool by its name, so every agent calling ``name`` the same way
    shares one; what it runs is the pending call of the task that calls it.
    """
    identity = (name, options, json.dumps(schema, sort_keys=True, default=str))
    found = _LEDGER_TOOLS.get(identity)
    if found is None:
        found = _LEDGER_TOOLS[identity] = Tool.from_schema(
            name,
            {"type": "object", **dict(schema)},
            _run_pending,
            side_effect=True,
            key_from=options.key_from,
            on_redo=options.on_redo,
            on_divergence=options.on_divergence,
            rerun_if_unknown=options.rerun_if_unknown,
            lease=options.lease,
            wait=options.wait,
        )
    return found


async def _run_pending(arguments: dict[str, Any]) -> Any:
    call = _PENDING.get()
    assert call is not None, "a ledger-backed pydantic-ai tool runs only inside its hook"
    ctx = running()
    key = None
    if ctx is not None:  # the call's record, appended as it was claimed, holds its key
        key = next(
            (r.key for r in reversed(ctx.state.tool_calls) if r.status == "running" and r.key),
            None,
        )
    token = _KEY.set(key)
    try:
        return as_json(await call())
    finally:
        _KEY.reset(token)


def idempotency_key() -> str:
    """The idempotency key of the ledger-backed tool call running now.

    Call it in a pydantic-ai tool that
    [`AgentsnapDurability`][agentsnap.integrations.pydantic_ai.AgentsnapDurability] runs
    through the ledger, and hand the key to the service the tool calls, so that the service
    drops a second request with the same key (a payment API does): a call whose outcome a
    crash left unknown can then run again safely (``ToolOptions(rerun_if_unknown=True)``).

    Raises:
        ConfigurationError: No ledger-backed tool call runs here.
    """
    key = _KEY.get()
    if key is None:
        raise ConfigurationError(
            "idempotency_key() was called outside a ledger-backed tool call; call it in a "
            "pydantic-ai tool that AgentsnapDurability runs through the ledger"
        )
    return key


class RecordedModel(WrapperModel):
    """A pydantic-ai model whose requests are recorded steps of the running agentsnap handler.

    [`AgentsnapDurability`][agentsnap.integrations.pydantic_ai.AgentsnapDurability] puts
    one around the model that serves each request. In a handler, a request goes through
    [`Context.model_call`][agentsnap.Context.model_call]: the answer recorded for the call is
    given back, rebuilt from pydantic-ai's own JSON, or the model is asked and its answer
    recorded before pydantic-ai sees it. Outside a handler the model is just asked.
    """

    async def request(
        self,
        messages: list[pai.ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
    ) -> pai.ModelResponse:
        """The model's answer to the request: recorded, or replayed from the record."""
        ctx = running()
        if ctx is None or _RECORDING.get():
            return await self.wrapped.request(messages, model_settings, model_request_parameters)
        asked: list[tuple[ModelResponse, pai.ModelResponse]] = []

        async def ask(_: ModelRequest) -> ModelResponse:
            token = _RECORDING.set(True)
            try:
                answer = await self.wrapped.request(
                    messages, model_settings, model_request_parameters
                )
            finally:
                _RECORDING.reset(token)
            recorded = recorded_response(answer)
            asked.append((recorded, answer))
            return recorded

        request = recorded_request(messages, model_settings, model_request_parameters)
        response = await ctx.model_call(request, ask)
        if asked and asked[0][0] is response:
            return asked[0][1]  # asked now: pydantic-ai gets its own answer as it came
        return rebuilt_response(response)

    @asynccontextmanager
    async def request_stream(
        self,
        messages: list[pai.ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
        run_context: RunContext[Any] | None = None,
    ) -> AsyncGenerator[StreamedResponse]:
        """A streamed request: not recorded, so refused inside a handler.

        Raises:
            ConfigurationError: An agentsnap handler is running the agent.
        """
        if running() is not None and not _RECORDING.get():
            raise ConfigurationError(
                "a pydantic-ai agent streamed a model request inside an agentsnap handler; "
                "streamed requests are not recorded, so run the agent with run() "
                "(PydanticAIAgent does) and without event_stream_handler"
            )
        async with self.wrapped.request_stream(
            messages, model_settings, model_request_parameters, run_context
        ) as stream:
            yield stream


class AgentsnapDurability(AbstractCapability[Any]):
    """Makes a pydantic-ai agent's model and tool calls agentsnap's recorded steps and effects.

    Give it to the agent, ``Agent(model, capabilities=[AgentsnapDurability()])``, and run
    the agent in an agentsnap handler:
    [`PydanticAIAgent`][agentsnap.integrations.pydantic_ai.PydanticAIAgent] does, or a
    handler of your own inside ``with handling(ctx):``. There:

    - every model request is a recorded step
      ([`RecordedModel`][agentsnap.integrations.pydantic_ai.RecordedModel]): a handler
      re-executed after a crash and ``resume()`` gets the recorded answers, and after a
      rollback the model is asked again;
    - every tool call, from any toolset (function tools, MCP servers), goes through the
      ledger under an idempotency key bound to the call, unless the tool is read-only
      (named in ``read_only``, or an MCP tool annotated ``readOnlyHint``), or is an
      agentsnap tool given with
      [`agentsnap_toolset`][agentsnap.integrations.pydantic_ai.agentsnap_toolset], which
      calls the ledger itself. Its result reaches the model as JSON, the same on the
      first call and on a replay;
    - tools run one at a time, in the order the model asked for them, so that a call's
      place among the calls of its tool is the same in every execution of the handler.

    Outside a handler the capability does nothing: the model is asked, read-only tools run,
    and a tool that goes through the ledger raises, having no call to be bound to.

    Args:
        read_only: Names of tools that change nothing: they run as they are.
        tools: Ledger options of single tools, by name (``key_from``, ``on_redo`` and so
            on); a tool not named gets the defaults.
    """

    def __init__(
        self,
        *,
        read_only: Collection[str] = (),
        tools: Mapping[str, ToolOptions] | None = None,
    ) -> None:
        self.read_only = frozenset(read_only)
        """Names of the tools that run without the ledger."""
        self.tools: dict[str, ToolOptions] = dict(tools or {})
        """Ledger options of single tools."""
        clash = sorted(self.read_only & set(self.tools))
        if clash:
            raise ConfigurationError(
                f"tools {clash!r} are declared read-only and given ledger options; a tool is "
                "one or the other"
            )

    def __repr__(self) -> str:
        return f"AgentsnapDurability(read_only={sorted(self.read_only)!r})"

    def get_wrapper_model(self, model: Model) -> Model | None:
        """Record the requests of the model that serves each attempt."""
        if isinstance(model, RecordedModel):
            return None
        return RecordedModel(model)

    async def wrap_run(self, ctx: RunContext[Any], *, handler: Any) -> AgentRunResult[Any]:
        """Run the tools one at a time while a handler runs the agent."""
        if running() is None:
            result: AgentRunResult[Any] = await handler()
            return result
        with ToolManager.parallel_execution_mode("sequential"):
            return await handler()  # type: ignore[no-any-return]

    async def wrap_tool_execute(
        self,
        ctx: RunContext[Any],
        *,
        call: pai.ToolCallPart,
        tool_def: ToolDefinition,
        args: dict[str, Any],
        handler: Callable[[dict[str, Any]], Awaitable[Any]],
    ) -> Any:
        """Run a tool that changes the world through the ledger, keyed by the call."""
        if _RECORDING.get() or not self.changes_world(tool_def):
            return await handler(args)
        handler_ctx = current(f"pydantic-ai tool {tool_def.name!r}, which goes through the ledger,")
        options = self.tools.get(tool_def.name, ToolOptions())
        tool = _ledger_tool(tool_def.name, options, tool_def.parameters_json_schema)

        async def execute() -> Any:
            recording = _RECORDING.set(True)
            try:
                return await handler(args)
            finally:
                _RECORDING.reset(recording)

        token = _PENDING.set(execute)
        try:
            return await tool.run(handler_ctx, as_json(call.args_as_dict()))
        except ToolFailed as exc:
            cause = exc.__cause__
            if isinstance(cause, Exception):  # failed now: pydantic-ai gets its own exception
                raise cause from None
            signal = _SIGNALS.get(exc.error_type)
            if signal is not None:  # failed as recorded: rebuilt
                raise signal(call, exc.detail) from None
            raise
        finally:
            _PENDING.reset(token)

    def changes_world(self, tool_def: ToolDefinition) -> bool:
        """Whether a call of this tool goes through the ledger.

        Function tools (from any toolset) do, unless named in ``read_only``, annotated
        ``readOnlyHint`` (MCP), or agentsnap tools that call the ledger themselves.
        """
        if tool_def.kind != "function" or tool_def.name in self.read_only:
            return False
        metadata = tool_def.metadata or {}
        if metadata.get("agentsnap") is not None:
            return False
        annotations = metadata.get("annotations") or {}
        read_only = (
            annotations.get("readOnlyHint")
            if isinstance(annotations, Mapping)
            else getattr(annotations, "readOnlyHint", None)
        )
        return read_only is not True
