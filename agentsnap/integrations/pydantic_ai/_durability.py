"""The capability that runs a pydantic-ai agent's model and tool calls through agentsnap."""

from __future__ import annotations

import contextvars
import copy
import json
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Self, cast

from pydantic_ai import messages as pai
from pydantic_ai.agent import AbstractAgent, EventStreamHandler
from pydantic_ai.capabilities.abstract import WrapRunHandler
from pydantic_ai.durable_exec import (
    IDENTITY_CODEC,
    BaseDurabilityCapability,
    CallableOperationBackend,
    DurabilityEngineSpec,
    DurableOperationBackend,
    DurableOperationId,
    EventStreamHandlerId,
    JournalOperationNamer,
    ModelRequestId,
    RoleBasedOperationConfig,
)
from pydantic_ai.durable_exec._utils import StreamedActivityResult
from pydantic_ai.exceptions import (
    ApprovalRequired,
    CallDeferred,
    ModelRetry,
    ToolFailedError,
    ToolRetryError,
)
from pydantic_ai.exceptions import ToolFailed as PydanticToolFailed
from pydantic_ai.models import Model, ModelRequestParameters
from pydantic_ai.run import AgentRunResult
from pydantic_ai.settings import ModelSettings
from pydantic_ai.tools import (
    DeferredToolRequests,
    DeferredToolResults,
    RunContext,
    ToolDefinition,
    ToolDenied,
)

from agentsnap.agents import Context
from agentsnap.exceptions import ApprovalDenied, ConfigurationError, RequestRejected, ToolFailed
from agentsnap.integrations._records import json_of
from agentsnap.integrations._running import current, running
from agentsnap.integrations.pydantic_ai._convert import (
    rebuilt_response,
    recorded_request,
    recorded_response,
)
from agentsnap.messages import JsonValue
from agentsnap.models import ModelRequest, ModelResponse
from agentsnap.requests import Approval, ApprovalPolicy, approval_of
from agentsnap.tools import OnDivergence, OnRedo, Tool

__all__ = ["AgentsnapDurability", "ToolOptions", "idempotency_key"]

# Per agent run, whether its last model call was a replayed answer: the events that follow it
# (its tool calls and their results) were handed to the event-stream handler the first time.
# A one-item list set by wrap_run, shared by the tasks the run starts.
_REPLAYING: contextvars.ContextVar[list[bool] | None] = contextvars.ContextVar(
    "agentsnap_pydantic_ai_replaying", default=None
)

# The call a ledger-backed tool runs when the ledger lets it: the SDK's own execution of it.
_PENDING: contextvars.ContextVar[Callable[[], Awaitable[Any]] | None] = contextvars.ContextVar(
    "agentsnap_pydantic_ai_tool", default=None
)
# The idempotency key of the ledger-backed call running in this task.
_KEY: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "agentsnap_pydantic_ai_key", default=None
)
# Set while a ledger-backed tool runs, so that what the tool runs (another agent, say) is
# not bound to the same call.
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
        approval: A call waits for a person's approval before it is claimed (``True``, a
            predicate on the arguments, or an [`Approval`][agentsnap.requests.Approval]
            saying who approves and by when); for a tool declared
            ``requires_approval=True`` in pydantic-ai, how its approval is asked.
    """

    key_from: Sequence[str] | None = None
    on_redo: OnRedo = "recorded"
    on_divergence: OnDivergence = "raise"
    rerun_if_unknown: bool = False
    lease: float = 60.0
    wait: float = 10.0
    approval: ApprovalPolicy = False


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
            approval=options.approval,
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
        return json_of(await call())
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


class _Backend(CallableOperationBackend[None]):
    """Runs pydantic-ai's durable units in the handler running the agent.

    A model request is a recorded step through
    [`Context.model_call`][agentsnap.Context.model_call]; an event-stream handler's call
    is made only while the handler asks the model afresh (not for a replayed answer); the
    other units run as they are, the ledger being the durable record of tool calls (see
    ``wrap_tool_execute``).
    """

    def __init__(self) -> None:
        super().__init__(
            namer=JournalOperationNamer("agentsnap"),
            config=RoleBasedOperationConfig(model=None, event=None, capability=None, tool=None),
        )

    async def execute(
        self,
        *,
        operation_id: DurableOperationId,
        name: str,
        body: Callable[[], Awaitable[object]],
        cache_key: tuple[object, ...],
        config: None,
    ) -> object:
        ctx = running()
        if ctx is None:
            return await body()
        if isinstance(operation_id, ModelRequestId):
            return await _model_request(ctx, body, cache_key)
        replaying = _REPLAYING.get()
        if isinstance(operation_id, EventStreamHandlerId) and replaying and replaying[0]:
            return None  # the events of a replayed answer reached the handler the first time
        return await body()


async def _model_request(
    ctx: Context[Any], body: Callable[[], Awaitable[object]], cache_key: tuple[object, ...]
) -> pai.ModelResponse:
    """One model request (streamed or not) as a recorded step of the handler ``ctx``.

    ``body`` is pydantic-ai's unit: it asks the model (a streamed request is consumed in it,
    its events handed to the event-stream handler) and gives the final response, which is
    recorded before pydantic-ai sees it. A recorded answer is given back without ``body``.
    """
    # The base's cache identity of a model request: (model id, messages, settings, parameters,
    # run context).
    _, messages, settings, parameters, _ = cache_key
    assert isinstance(messages, list)
    assert isinstance(parameters, ModelRequestParameters)
    asked: list[tuple[ModelResponse, pai.ModelResponse]] = []

    async def ask(_: ModelRequest) -> ModelResponse:
        answer = await body()
        if isinstance(answer, StreamedActivityResult):
            answer = answer.response
        assert isinstance(answer, pai.ModelResponse)
        recorded = recorded_response(answer)
        asked.append((recorded, answer))
        return recorded

    request = recorded_request(messages, cast("ModelSettings | None", settings), parameters)
    response = await ctx.model_call(request, ask)
    fresh = bool(asked) and asked[0][0] is response
    replaying = _REPLAYING.get()
    if replaying is not None:
        replaying[0] = not fresh
    if fresh:
        return asked[0][1]  # asked now: pydantic-ai gets its own answer as it came
    return rebuilt_response(response)


class AgentsnapDurability(BaseDurabilityCapability[Any]):
    """Makes a pydantic-ai agent's model and tool calls agentsnap's recorded steps and effects.

    pydantic-ai's durable-execution capability for agentsnap, built on its
    ``BaseDurabilityCapability`` as its Temporal, DBOS and Prefect ones are. Give it to the
    agent, ``Agent(model, capabilities=[AgentsnapDurability()])``, and run the agent in an
    agentsnap handler:
    [`PydanticAIAgent`][agentsnap.integrations.pydantic_ai.PydanticAIAgent] does, or a
    handler of your own inside ``with handling(ctx):``. There:

    - every model request, streamed or not (``run``, ``run_stream``, ``run_stream_events``,
      ``iter``), is a recorded step through
      [`Context.model_call`][agentsnap.Context.model_call]: a handler re-executed after a
      crash and ``resume()`` gets the recorded answers (a streamed one is streamed to
      pydantic-ai from the record), and after a rollback the model is asked again;
    - ``event_stream_handler`` gets each event once: the events of a streamed request as the
      model streams it, the others as pydantic-ai makes them; while a re-executed handler
      replays recorded answers, their events are not handed to it again;
    - every tool call, from any toolset (function tools, MCP servers), goes through the
      ledger under an idempotency key bound to the call, unless the tool is read-only
      (named in ``read_only``, or an MCP tool annotated ``readOnlyHint``), or is an
      agentsnap tool given with
      [`agentsnap_toolset`][agentsnap.integrations.pydantic_ai.agentsnap_toolset], which
      calls the ledger itself. Its result reaches the model as JSON, the same on the
      first call and on a replay;
    - tools run one at a time, in the order the model asked for them, so that a call's
      place among the calls of its tool is the same in every execution of the handler.

    Tool listing (``get_tools`` of an MCP server, a dynamic toolset) is not recorded: it
    runs again when a handler is re-executed. It changes nothing, and a replayed answer is
    given by its place in the handler, not matched to the tools listed, so the listing
    decides nothing a replay depends on.

    Models: pydantic-ai's durable base serves a request with the agent's own model, a
    model named by a string, or an instance registered in ``models``
    (``agent.run(model=...)`` with an instance not registered is refused inside a
    handler, with a ``UserError`` saying so).

    Outside a handler the capability does nothing: the model is asked, read-only tools run,
    and a tool that goes through the ledger raises, having no call to be bound to.

    Args:
        read_only: Names of tools that change nothing: they run as they are.
        tools: Ledger options of single tools, by name (``key_from``, ``on_redo`` and so
            on); a tool not named gets the defaults.
        models: Model instances a run may select (``agent.run(model=...)``), by name.
        event_stream_handler: Gets the run's events, each once (see above).
        name: The name of the agent's durable units (default: the agent's name, or
            ``"agentsnap"``); agentsnap keys its records by the handler, not by it.
    """

    engine_spec = DurabilityEngineSpec(
        engine_name="agentsnap",
        durable_unit_noun="recorded step",
        durable_container_noun="handler of an agentsnap agent",
        codec=IDENTITY_CODEC,
        # Tools are not wrapped in units: a call that changes the world goes through the
        # ledger (wrap_tool_execute), the rest runs as it is.
        wrapped_toolset_kinds=frozenset(),
        toolset_lifecycles={},
        journal_discovery=False,
        sequential_tools_in_durable_context=True,
    )

    def __init__(
        self,
        *,
        read_only: Collection[str] = (),
        tools: Mapping[str, ToolOptions] | None = None,
        models: Mapping[str, Model] | None = None,
        event_stream_handler: EventStreamHandler[Any] | None = None,
        name: str | None = None,
    ) -> None:
        super().__init__(models=models, event_stream_handler=event_stream_handler, name=name)
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
        self._backend = _Backend()

    def __repr__(self) -> str:
        return f"AgentsnapDurability(read_only={sorted(self.read_only)!r})"

    def _bind_for_agent(self, agent: AbstractAgent[Any, Any]) -> Self:
        if not (self.name or agent.name):
            named = copy.copy(self)
            named.name = "agentsnap"
            return BaseDurabilityCapability._bind_for_agent(named, agent)
        return super()._bind_for_agent(agent)

    @property
    def in_durable_context(self) -> bool:
        """Whether an agentsnap handler runs the agent here."""
        return running() is not None

    def get_durable_operation_backend(self) -> DurableOperationBackend[Any]:
        """The backend that runs pydantic-ai's durable units in the running handler."""
        return self._backend

    async def wrap_run(
        self, ctx: RunContext[Any], *, handler: WrapRunHandler
    ) -> AgentRunResult[Any]:
        """Run the agent, its tools one at a time, while a handler runs it."""
        token = _REPLAYING.set([False])
        try:
            return await super().wrap_run(ctx, handler=handler)
        finally:
            _REPLAYING.reset(token)

    async def handle_deferred_tool_calls(
        self, ctx: RunContext[Any], *, requests: DeferredToolRequests
    ) -> DeferredToolResults | None:
        """Ask people for what deferred tool calls wait on, as durable requests of the handler.

        A call of a tool declared ``requires_approval=True`` (or raising ``ApprovalRequired``)
        waits for an approval request ([`Context.approve_call`][agentsnap.Context.approve_call],
        asked as ``ToolOptions.approval`` says, by default of anyone without deadline); once
        approved it runs through the ledger, and a denial's reason goes to the model. A call
        deferred for an outside result (an external tool, ``CallDeferred``) is a question
        ([`Context.ask`][agentsnap.Context.ask]) whose answer is the call's result; a
        declined question is a failed call the model is told about. Either request is in the
        store before the handler waits; it is answered with ``agentsnap answer``, and a
        re-executed handler finds it. Outside a handler the calls are left to pydantic-ai
        (``DeferredToolRequests`` as output).
        """
        handler_ctx = running()
        if handler_ctx is None:
            return None
        results = DeferredToolResults()
        for call in requests.approvals:
            options = self.tools.get(call.tool_name, ToolOptions())
            approval = approval_of(options.approval) or Approval()
            try:
                await handler_ctx.approve_call(
                    call.tool_name, json_of(call.args_as_dict()), None, approval
                )
            except ApprovalDenied as exc:
                results.approvals[call.tool_call_id] = ToolDenied(
                    f"A person denied the call: {exc.reason}"
                )
            else:
                results.approvals[call.tool_call_id] = True
        for call in requests.calls:
            question: JsonValue = {
                "tool": call.tool_name,
                "arguments": json_of(call.args_as_dict()),
                "kind": requests.kind(call.tool_call_id),
            }
            try:
                results.calls[call.tool_call_id] = await handler_ctx.ask(question)
            except RequestRejected as exc:
                results.calls[call.tool_call_id] = PydanticToolFailed(
                    f"The call was declined: {exc.reason}"
                )
        return results

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
        if tool_def.kind == "unapproved":  # approved already (handle_deferred_tool_calls)
            options = replace(options, approval=False)
        tool = _ledger_tool(tool_def.name, options, tool_def.parameters_json_schema)

        async def execute() -> Any:
            recording = _RECORDING.set(True)
            try:
                return await handler(args)
            finally:
                _RECORDING.reset(recording)

        token = _PENDING.set(execute)
        try:
            return await tool.run(handler_ctx, json_of(call.args_as_dict()))
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

        Function tools (from any toolset, ``requires_approval`` ones too) do, unless named
        in ``read_only``, annotated
        ``readOnlyHint`` (MCP), or agentsnap tools that call the ledger themselves.
        """
        if tool_def.kind not in ("function", "unapproved") or tool_def.name in self.read_only:
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
