"""What an MCP tool call returns, as the JSON an agentsnap tool returns and the ledger keeps."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mcp.types import CallToolResult, TextContent

if TYPE_CHECKING:
    from agentsnap.messages import JsonValue

__all__ = ["McpToolError", "result_json"]


class McpToolError(Exception):
    """The MCP server answered a tool call with ``isError``: the tool failed.

    Raised inside the tool, so the call fails with [`ToolFailed`][agentsnap.ToolFailed]
    (``error_type`` ``"McpToolError"``, ``detail`` the server's text), which a model calling
    tools through [`run_tool_calls`][agentsnap.tools.run_tool_calls] is shown. For a
    side-effecting tool the failure is final and recorded: the same call after a rollback or
    a resume raises it again without asking the server.

    Attributes:
        tool: The tool's name on the server.
        content: The result's content blocks, as JSON.
    """

    def __init__(self, tool: str, content: list[JsonValue]) -> None:
        texts = [
            str(block["text"]) for block in content if isinstance(block, dict) and "text" in block
        ]
        super().__init__("; ".join(texts) or f"the MCP tool {tool!r} failed")
        self.tool = tool
        self.content = content


def result_json(tool: str, result: CallToolResult) -> JsonValue:
    """The JSON value of an MCP tool's result.

    - ``isError``: raises [`McpToolError`][agentsnap.integrations.mcp.McpToolError];
    - ``structuredContent``, when the server gives it: that object;
    - otherwise the content: one text block is its text, no block is ``None``, and several
      blocks (or an image, audio, a resource) are a list of the blocks as MCP writes them
      (``{"type": "text", "text": ...}``, ``{"type": "image", "data": ..., "mimeType":
      ...}``).

    Raises:
        McpToolError: The result is an error.
    """
    blocks: list[JsonValue] = [
        block.model_dump(mode="json", by_alias=True, exclude_none=True) for block in result.content
    ]
    if result.is_error:
        raise McpToolError(tool, blocks)
    structured: dict[str, Any] | None = result.structured_content
    if structured is not None:
        return structured
    if not result.content:
        return None
    if len(result.content) == 1 and isinstance(result.content[0], TextContent):
        return result.content[0].text
    return blocks
