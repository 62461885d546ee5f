"""agentsnap tools as a pydantic-ai toolset."""

from __future__ import annotations

from typing import Any

from pydantic_ai.exceptions import ModelRetry
from pydantic_ai.tools import Tool as PydanticTool
from pydantic_ai.toolsets import FunctionToolset

from agentsnap.exceptions import ConfigurationError, ToolArgumentsInvalid, ToolFailed
from agentsnap.integrations._records import json_of
from agentsnap.integrations._running import current
from agentsnap.tools import Tool

__all__ = ["agentsnap_toolset"]


def agentsnap_toolset(*tools: Tool[Any], id: str | None = None) -> FunctionToolset[Any]:
    """A pydantic-ai toolset of agentsnap tools (``@tool`` functions).

    Each call runs the agentsnap tool with the running handler's context, as
    ``await tool.run(ctx, arguments)`` does: recorded in the agent's ``tool_calls``, and, for
    a side-effecting tool, through the ledger with the tool's own options (``key_from``,
    ``on_redo``, ``compensate``...). Arguments that do not fit the tool and the tool's
    failure go back to the model as a retry prompt; anything else (a divergence, an unknown
    outcome) fails the run.

    Args:
        *tools: The tools.
        id: The toolset's id, for pydantic-ai.

    Returns:
        A ``FunctionToolset`` to give the agent (``toolsets=[...]``).

    Raises:
        ConfigurationError: Two tools have one name.
    """
    names = [t.name for t in tools]
    if len(set(names)) != len(names):
        raise ConfigurationError(f"agentsnap_toolset() got two tools of one name: {names!r}")
    return FunctionToolset(
        [_pydantic_tool(t) for t in tools], id=id, metadata={"agentsnap": {"ledger": "own"}}
    )


def _pydantic_tool(tool: Tool[Any]) -> PydanticTool[Any]:
    async def call(**arguments: Any) -> Any:
        ctx = current(f"agentsnap tool {tool.name!r}")
        try:
            result = await tool.run(ctx, arguments)
        except (ToolArgumentsInvalid, ToolFailed) as exc:
            raise ModelRetry(str(exc)) from exc
        return json_of(result)

    return PydanticTool.from_schema(
        call, tool.name, tool.description or None, tool.arguments_schema()
    )
