"""agentsnap tools as LangChain tools, for tool-calling models and LangGraph's ``ToolNode``."""

from __future__ import annotations

import inspect
from typing import Any

from langchain_core.tools import StructuredTool

from agentsnap.exceptions import ConfigurationError
from agentsnap.integrations.langgraph._agent import current_context
from agentsnap.tools import Tool

__all__ = ["langchain_tool"]


def langchain_tool(tool: Tool[Any], *, description: str | None = None) -> StructuredTool:
    """Wrap an agentsnap tool as a LangChain tool, to run inside a graph agent's graph.

    The LangChain tool calls the agentsnap tool with the running graph agent's context
    ([`current_context`][agentsnap.integrations.langgraph.current_context]), so each call is
    validated, recorded in the agent's ``tool_calls``, and, for a side-effecting tool, goes
    through the ledger under an idempotency key derived from the message being handled: a
    graph re-run after a rollback gets the recorded outcome instead of repeating the effect.

    Args:
        tool: The agentsnap tool.
        description: What the model is told the tool does; by default the first paragraph
            of the tool function's docstring.

    Returns:
        A ``StructuredTool`` with the tool's name and argument schema.

    Raises:
        ConfigurationError: The tool has no description (no docstring and no
            ``description``), which tool-calling models need.
    """
    text = description or _first_paragraph(tool.fn)
    if not text:
        raise ConfigurationError(
            f"tool {tool.name!r} has no docstring; give it one or pass description=, since "
            "a model chooses tools by their descriptions"
        )

    async def call(**arguments: Any) -> Any:
        return await tool(current_context(), **arguments)

    return StructuredTool(
        name=tool.name,
        description=text,
        args_schema=tool.arguments_schema(),
        coroutine=call,
    )


def _first_paragraph(fn: Any) -> str:
    doc = inspect.getdoc(fn) or ""
    return doc.split("\n\n", 1)[0].strip()
