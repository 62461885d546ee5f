"""An MCP server given as a command: started, connected, initialized, and stopped again."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import TextIO

from mcp import ClientSession, StdioServerParameters, stdio_client

from agentsnap.exceptions import ConfigurationError

__all__ = ["mcp_server"]


@contextlib.asynccontextmanager
async def mcp_server(
    command: str | StdioServerParameters,
    args: Sequence[str] = (),
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    errlog: TextIO | None = None,
) -> AsyncIterator[ClientSession]:
    """Start an MCP server as a subprocess (stdio) and hand out a session connected to it.

    The session is initialized, ready for
    [`mcp_tools`][agentsnap.integrations.mcp.mcp_tools]; leaving the ``async with`` block
    closes the session and stops the server. Tools made from the session call it, so use
    them inside the block.

    Example:
        ```python
        import sys

        from agentsnap.integrations.mcp import mcp_server, mcp_tools

        async def main() -> None:
            async with mcp_server(sys.executable, ["examples/mcp_server.py"]) as session:
                tools = await mcp_tools(session)
        ```

    Args:
        command: The executable (``"npx"``, ``sys.executable``), or the MCP SDK's
            ``StdioServerParameters`` (then ``args``, ``env`` and ``cwd`` must be left out).
        args: Its arguments.
        env: Environment variables, over the SDK's default environment.
        cwd: Its working directory.
        errlog: Where the server's standard error goes (default: this process's).

    Yields:
        The initialized ``ClientSession``.

    Raises:
        ConfigurationError: ``command`` is empty, or parameters are given twice.
        OSError: The server cannot be started.
    """
    if isinstance(command, StdioServerParameters):
        if args or env is not None or cwd is not None:
            raise ConfigurationError(
                "mcp_server() takes either StdioServerParameters or a command with args=, "
                "env= and cwd=, not both"
            )
        parameters = command
    else:
        if not isinstance(command, str) or not command.strip():
            raise ConfigurationError(
                f"mcp_server() needs the command that starts the server, got {command!r}"
            )
        if isinstance(args, str):
            raise ConfigurationError(
                f"mcp_server() takes args= as a list of arguments, got the string {args!r}"
            )
        parameters = StdioServerParameters(
            command=command,
            args=list(args),
            env=dict(env) if env is not None else None,
            cwd=cwd,
        )
    async with (
        stdio_client(parameters, errlog=errlog or sys.stderr) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session
