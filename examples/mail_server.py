"""A tiny MCP mail server for ``sdk_team.py``: a contacts directory and an outbox.

``find_contact`` is marked ``readOnlyHint``; ``send_email`` is marked ``destructiveHint``
and reads the idempotency key agentsnap puts in the request's ``_meta``
(``io.agentsnap/idempotency-key``): it keeps each email it sends under its key and answers a
key it already holds with the email it sent, so a repeated request sends nothing twice.
Every request is logged in the ``requests`` table of the SQLite file ``MAIL_DB``, every email
sent in its ``outbox`` table: the log a test reads to count the emails.

``sdk_team.py`` starts it; to run it on its own (it speaks MCP on stdin and stdout):

    MAIL_DB=/tmp/mail.db python examples/mail_server.py
"""

from __future__ import annotations

import os
import sqlite3
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.types import ToolAnnotations

KEY = "io.agentsnap/idempotency-key"
ATTEMPT = "io.agentsnap/attempt"
CONTACTS = {"ada lovelace": {"name": "Ada Lovelace", "email": "ada@example.com"}}

server = MCPServer("mail")


def database() -> sqlite3.Connection:
    conn = sqlite3.connect(os.environ["MAIL_DB"], isolation_level=None, timeout=30)
    conn.execute("CREATE TABLE IF NOT EXISTS requests (tool TEXT, key TEXT, attempt INTEGER)")
    conn.execute(
        "CREATE TABLE IF NOT EXISTS outbox (id INTEGER PRIMARY KEY, key TEXT UNIQUE, "
        "recipient TEXT, subject TEXT, body TEXT)"
    )
    return conn


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def find_contact(name: str) -> dict[str, Any]:
    """Find a customer's name and email address."""
    with database() as conn:
        conn.execute("INSERT INTO requests VALUES ('find_contact', NULL, NULL)")
    found = CONTACTS.get(name.strip().lower())
    return found if found is not None else {"name": name, "email": None}


@server.tool(annotations=ToolAnnotations(destructive_hint=True))
def send_email(to: str, subject: str, body: str, ctx: Context) -> dict[str, Any]:
    """Send an email."""
    meta = ctx.request_context.meta or {}
    key, attempt = meta.get(KEY), meta.get(ATTEMPT)
    with database() as conn:
        conn.execute("INSERT INTO requests VALUES ('send_email', ?, ?)", (key, attempt))
        known = None
        if key is not None:
            known = conn.execute("SELECT id FROM outbox WHERE key = ?", (key,)).fetchone()
        if known is None:
            cursor = conn.execute(
                "INSERT INTO outbox (key, recipient, subject, body) VALUES (?, ?, ?, ?)",
                (key, to, subject, body),
            )
            known = (cursor.lastrowid,)
    return {"email_id": known[0], "to": to}


if __name__ == "__main__":
    server.run()
