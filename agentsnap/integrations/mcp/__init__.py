"""MCP integration: an MCP server's tools as agentsnap tools, side effects through the ledger.

Install it with ``pip install 'agentsnap[mcp]'``. Importing ``agentsnap`` alone never imports
the MCP SDK; importing this module does, and raises
[`MissingExtraError`][agentsnap.integrations.MissingExtraError] when it is missing.

- [`mcp_server`][agentsnap.integrations.mcp.mcp_server] starts a server given as a command
  (stdio), connects to it and stops it again: ``async with mcp_server("python", ["srv.py"])
  as session``.
- [`mcp_tools`][agentsnap.integrations.mcp.mcp_tools] lists the server's tools and makes each
  an agentsnap [`Tool`][agentsnap.Tool]: read-only ones plain, the others ledger-backed (a
  call is claimed under an idempotency key bound to the call before the server is asked,
  and its result recorded after), chosen by the server's annotations, by name, or by a
  predicate ([`SideEffect`][agentsnap.integrations.mcp.SideEffect]). The key is handed to
  the server in the request's ``_meta`` under
  [`IDEMPOTENCY_KEY`][agentsnap.integrations.mcp.IDEMPOTENCY_KEY].
- A tool the server runs as an MCP task (protocol 2025-11-25) is started as a task, and the
  task's id is recorded in the ledger before the call waits: a run resumed after a crash
  polls the task for its result instead of calling the tool again.

Example:
    ```python
    from agentsnap.integrations.mcp import IDEMPOTENCY_KEY, by_annotations

    print(IDEMPOTENCY_KEY)  # io.agentsnap/idempotency-key
    print(by_annotations)  # the default choice of side-effecting tools
    ```
"""

from __future__ import annotations

from agentsnap.integrations import needs_extra

with needs_extra("mcp", "mcp"):
    import mcp  # noqa: F401

from agentsnap.integrations.mcp._results import McpToolError, result_json
from agentsnap.integrations.mcp._server import mcp_server
from agentsnap.integrations.mcp._tools import (
    ATTEMPT,
    IDEMPOTENCY_KEY,
    SideEffect,
    by_annotations,
    mcp_tools,
)

__all__ = [
    "ATTEMPT",
    "IDEMPOTENCY_KEY",
    "McpToolError",
    "SideEffect",
    "by_annotations",
    "mcp_server",
    "mcp_tools",
    "result_json",
]
