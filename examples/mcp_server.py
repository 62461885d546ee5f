"""A tiny MCP server for ``mcp_tools.py``: a bank with a read-only and a side-effecting tool.

``balance`` is marked ``readOnlyHint``; ``transfer`` is marked ``destructiveHint`` and reads
the idempotency key agentsnap puts in the request's ``_meta``
(``io.agentsnap/idempotency-key``): it keeps each transfer under its key and answers a key
it already holds with the transfer it made, so a repeated request moves no money twice.
Every request it gets is logged in the ``requests`` table of the SQLite file ``BANK_DB``.

``mcp_tools.py`` starts it; to run it on its own (it speaks MCP on stdin and stdout):

    BANK_DB=/tmp/bank.db python examples/mcp_server.py
"""

from __future__ import annotations

import os
import sqlite3
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.types import ToolAnnotations

KEY = "io.agentsnap/idempotency-key"

server = MCPServer("bank")


def database() -> sqlite3.Connection:
    conn = sqlite3.connect(os.environ["BANK_DB"], isolation_level=None)
    conn.execute("CREATE TABLE IF NOT EXISTS requests (tool TEXT, key TEXT, memo TEXT)")
    conn.execute(
        "CREATE TABLE IF NOT EXISTS transfers (id INTEGER PRIMARY KEY, key TEXT UNIQUE, "
        "payee TEXT, amount INTEGER)"
    )
    return conn


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def balance(account: str) -> dict[str, Any]:
    """The balance of an account, in cents."""
    with database() as conn:
        conn.execute("INSERT INTO requests VALUES ('balance', NULL, NULL)")
        (paid,) = conn.execute("SELECT COALESCE(SUM(amount), 0) FROM transfers").fetchone()
    return {"account": account, "balance": 100_000 - paid}


@server.tool(annotations=ToolAnnotations(destructive_hint=True))
def transfer(payee: str, amount: int, memo: str, ctx: Context) -> dict[str, Any]:
    """Pay ``amount`` cents to ``payee``."""
    meta = ctx.request_context.meta or {}
    key = meta.get(KEY)
    with database() as conn:
        conn.execute("INSERT INTO requests VALUES ('transfer', ?, ?)", (key, memo))
        known = conn.execute("SELECT id FROM transfers WHERE key = ?", (key,)).fetchone()
        if known is None:
            cursor = conn.execute(
                "INSERT INTO transfers (key, payee, amount) VALUES (?, ?, ?)",
                (key, payee, amount),
            )
            known = (cursor.lastrowid,)
    return {"transfer_id": known[0], "payee": payee, "amount": amount}


if __name__ == "__main__":
    server.run()
