"""SDK function tools whose calls go through agentsnap's tools, and so through the ledger."""

from __future__ import annotations

import dataclasses
import json
import weakref
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from typing import Any, TypedDict, Unpack, overload

from agents.strict_schema import ensure_strict_json_schema
from agents.tool import FunctionTool
from agents.tool_context import ToolContext

from agentsnap.exceptions import ConfigurationError, ToolArgumentsInvalid, ToolFailed
from agentsnap.integrations import require_keywords
from agentsnap.integrations._running import current
from agentsnap.integrations.openai_agents._model import as_json
from agentsnap.tools import OnDivergence, OnRedo, Tool, tool

__all__ = ["as_sdk_tool", "function_tool", "ledgered", "through_agentsnap"]

_TOOL_CONTEXT: ContextVar[ToolContext[Any] | None] = ContextVar(
    "agentsnap_sdk_tool_context", default=None
)

# The invoke functions of the SDK tools whose calls go through agentsnap already.
_THROUGH: weakref.WeakSet[Callable[..., Any]] = weakref.WeakSet()


def through_agentsnap(sdk_tool: object) -> bool:
    """Whether an SDK tool's calls go through agentsnap's tools already.

    True for the tools made by [`as_sdk_tool`][agentsnap.integrations.openai_agents.as_sdk_tool],
    [`function_tool`][agentsnap.integrations.openai_agents.function_tool] and
    [`ledgered`][agentsnap.integrations.openai_agents.ledgered].
    """
    return isinstance(sdk_tool, FunctionTool) and sdk_tool.on_invoke_tool in _THROUGH


def as_sdk_tool(
    agentsnap_tool: Tool[Any], *, description: str | None = None, strict: bool = True
) -> FunctionTool:
    """An agentsnap tool as an SDK ``FunctionTool``, to put in an SDK agent's ``tools``.

    The model sees the tool's name, description and arguments' JSON Schema. A call runs
    ``await agentsnap_tool.run(ctx, arguments)`` with the context of the agentsnap handler
    running the SDK agent: it is validated, recorded in the agent's ``tool_calls``, and a
    side-effecting tool's call goes through the ledger under a key bound to the call (the
    run, the agent, the message being handled, the n-th call of this tool in the handler, or
    the ``key_from`` arguments), so a redo after a rollback or a resume never repeats the
    effect. Arguments that do not fit and a tool's failure come back to the model as text;
    anything else (a divergence, an unknown outcome, a rejection) fails the handler.

    Args:
        agentsnap_tool: The tool, made with [`tool`][agentsnap.tool] or
            [`Tool.from_schema`][agentsnap.Tool.from_schema].
        description: What the model is told the tool does (default: the tool's).
        strict: Offer the arguments' schema in the SDK's strict mode (every argument
            required, optional ones nullable); falls back to the plain schema when it
            cannot be made strict.

    Returns:
        The SDK tool.
    """
    schema = agentsnap_tool.arguments_schema()
    if strict:
        try:
            schema = ensure_strict_json_schema(dict(schema))
        except Exception:
            strict = False

    async def invoke(tool_context: ToolContext[Any], raw: str) -> Any:
        ctx = current(f"tool {agentsnap_tool.name!r}")
        try:
            arguments = json.loads(raw) if raw else {}
        except ValueError as exc:
            return f"error: the arguments are not JSON: {exc}"
        if not isinstance(arguments, dict):
            return "error: the arguments must be a JSON object"
        token = _TOOL_CONTEXT.set(tool_context)
        try:
            result = await agentsnap_tool.run(ctx, _without_nulls(agentsnap_tool, arguments))
        except (ToolArgumentsInvalid, ToolFailed) as exc:
            return f"error: {exc}"
        finally:
            _TOOL_CONTEXT.reset(token)
        return result if isinstance(result, str) else json.dumps(as_json(result))

    _THROUGH.add(invoke)
    return FunctionTool(
        name=agentsnap_tool.name,
        description=description if description is not None else agentsnap_tool.description,
        params_json_schema=schema,
        on_invoke_tool=invoke,
        strict_json_schema=strict,
    )


def _without_nulls(agentsnap_tool: Tool[Any], arguments: dict[str, Any]) -> dict[str, Any]:
    """The arguments without the ``null`` of those the tool's own schema does not require.

    A strict schema makes every argument required, so a model sends ``null`` for one it
    leaves out.
    """
    required = set(agentsnap_tool.arguments_schema().get("required") or ())
    return {k: v for k, v in arguments.items() if v is not None or k in required}


class _Ledgering(TypedDict, total=False):
    """The options of an agentsnap tool that ``function_tool`` and ``ledgered`` take."""

    side_effect: bool
    """The tool changes the world (``True`` by default here, unlike ``tool``)."""
    key_from: Sequence[str] | None
    """The arguments that name the effect."""
    on_redo: OnRedo
    """What a redo after a rollback does with other arguments at the same place."""
    on_divergence: OnDivergence
    """What a re-execution after a crash does with other arguments."""
    rerun_if_unknown: bool
    """Running again after an unknown outcome is safe."""


def _ledgering(function: str, options: _Ledgering) -> _Ledgering:
    """The options given to ``function``, side-effecting unless they say otherwise.

    Raises:
        TypeError: An option is not one of ``_Ledgering``'s.
    """
    require_keywords(function, options, _Ledgering.__optional_keys__)
    return {"side_effect": True, **options}


@overload
def function_tool(fn: Callable[..., Any], /) -> FunctionTool: ...
@overload
def function_tool(
    *,
    name: str | None = None,
    description: str | None = None,
    strict: bool = True,
    **options: Unpack[_Ledgering],
) -> Callable[[Callable[..., Any]], FunctionTool]: ...
def function_tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    strict: bool = True,
    **options: Unpack[_Ledgering],
) -> Any:
    """Make a function an SDK tool whose calls go through agentsnap and, for effects, the ledger.

    The SDK's ``@function_tool``, for agents run by agentsnap. The function becomes an
    agentsnap [`tool`][agentsnap.tool] (its parameters validated by pydantic; a first
    parameter annotated [`ToolCall`][agentsnap.ToolCall] receives the call's idempotency
    key, to hand to the service it calls) and that tool an SDK ``FunctionTool``
    ([`as_sdk_tool`][agentsnap.integrations.openai_agents.as_sdk_tool]).

    Example:
        ```python
        from agentsnap import ToolCall
        from agentsnap.integrations.openai_agents import function_tool


        @function_tool  # side-effecting: through the ledger
        async def send_email(call: ToolCall, to: str, text: str) -> str:
            \"\"\"Send an email.\"\"\"
            return f"sent under {call.key}"


        print(send_email.name, sorted(send_email.params_json_schema["properties"]))
        # send_email ['text', 'to']
        ```

    Args:
        fn: The function (when used as ``@function_tool`` without parentheses).
        name: The tool's name (default: the function's).
        description: What the model is told it does (default: the docstring).
        strict: Offer the schema in the SDK's strict mode (the default).
        **options: The ledger's options below, each optional.

    Keyword Args:
        side_effect (bool): The tool changes the world: its calls go through the ledger
            (``True``, the default and the safe choice); ``False`` declares it read-only,
            run again on a redo.
        key_from (Sequence[str] | None): The arguments that name the effect, as for
            [`tool`][agentsnap.tool] (``None`` by default).
        on_redo (OnRedo): What a redo after a rollback does with other arguments at the
            same place (``"recorded"`` by default).
        on_divergence (OnDivergence): What a re-execution after a crash does with other
            arguments (``"raise"`` by default).
        rerun_if_unknown (bool): Running again after an unknown outcome is safe (``False``
            by default).

    Returns:
        An SDK ``FunctionTool`` (or a decorator making one, when called with options).

    Raises:
        TypeError: A keyword argument is not one of those above.
    """
    ledgering = _ledgering("function_tool()", options)

    def decorate(function: Callable[..., Any]) -> FunctionTool:
        made = tool(name=name, description=description, **ledgering)(function)
        return as_sdk_tool(made, strict=strict)

    return decorate(fn) if fn is not None else decorate


def ledgered(sdk_tool: FunctionTool, **options: Unpack[_Ledgering]) -> FunctionTool:
    """An SDK ``FunctionTool`` made elsewhere, its calls through agentsnap and the ledger.

    For a tool made with the SDK's ``@function_tool``: its calls are recorded in the agent's
    ``tool_calls`` and, with side effects, claimed in the ledger under a key bound to the call
    before the tool's own code runs.
    [`OpenAIAgent`][agentsnap.integrations.openai_agents.OpenAIAgent] does this with the
    defaults for every function tool not declared ``read_only``; call it yourself to give a
    tool other options (``key_from``, ``on_redo``, ``rerun_if_unknown``).

    What the tool returns is recorded as JSON (its text, or its fields), and a replayed
    call gives the model that. A tool that turns its own errors into text for the model (the
    SDK's default) has that text recorded as its outcome: the failed effect is not tried
    again by a redo.

    Args:
        sdk_tool: The SDK tool.
        **options: The ledger's options of
            [`function_tool`][agentsnap.integrations.openai_agents.function_tool], each optional:
            ``side_effect`` (``True`` by default: the tool changes the world, the reason to
            call this), ``key_from``, ``on_redo``, ``on_divergence`` and
            ``rerun_if_unknown``, with the same defaults and meanings.

    Returns:
        A copy of the tool whose calls go through agentsnap.

    Raises:
        TypeError: A keyword argument is not one of those named above.
        ConfigurationError: ``sdk_tool`` is not a ``FunctionTool``, or goes through
            agentsnap already.
    """
    ledgering = _ledgering("ledgered()", options)
    if not isinstance(sdk_tool, FunctionTool):
        raise ConfigurationError(
            f"ledgered() takes an SDK FunctionTool, got {type(sdk_tool).__name__}; hosted "
            "tools run on the provider's side and their results come with the recorded answer"
        )
    if through_agentsnap(sdk_tool):
        raise ConfigurationError(
            f"tool {sdk_tool.name!r} goes through agentsnap already (made by function_tool, "
            "as_sdk_tool or ledgered); give its options where it was made"
        )
    original = sdk_tool.on_invoke_tool

    async def run_original(arguments: dict[str, Any]) -> Any:
        tool_context = _TOOL_CONTEXT.get()
        assert tool_context is not None  # set by invoke, in the task the call runs in
        return as_json(await original(tool_context, json.dumps(arguments)))

    inner = Tool.from_schema(
        sdk_tool.name,
        sdk_tool.params_json_schema,
        run_original,
        description=sdk_tool.description,
        **ledgering,
    )
    through = as_sdk_tool(inner, strict=sdk_tool.strict_json_schema)
    return dataclasses.replace(
        sdk_tool,
        on_invoke_tool=through.on_invoke_tool,
        params_json_schema=sdk_tool.params_json_schema,
    )
