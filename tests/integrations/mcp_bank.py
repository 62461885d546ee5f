"""A small MCP bank server that the MCP tests start as a real process over stdio.

Every request for a tool is appended to the ``calls`` table of a SQLite file (``BANK_DB``),
with the idempotency key found in the request's ``_meta``, so a test counts how often the
server was really asked. The tools:

- ``balance`` (``readOnlyHint``): an account's balance; changes nothing.
- ``transfer`` (``destructiveHint``): moves money. The server keeps each transfer by the
  idempotency key it is handed (``INSERT OR IGNORE``) and answers a key it already holds with
  the transfer it made, as a payment API does. A negative amount is refused (``isError``).
- ``send_email`` (no annotations): queues an email; answers with text.
- ``wire`` (``destructiveHint``, ``execution.taskSupport: "required"``): a transfer run as an
  MCP task (protocol 2025-11-25). The task is created, and its effect made, when the call
  arrives; its result is ready ``BANK_TASK_SECONDS`` later (default 0.3). Tasks live in the
  SQLite file, so a task started through one connection can be polled through another (a
  resumed client starts its own server process).

The MCP SDK serves no task methods on its own, so a middleware adds them: it answers a
task-augmented ``tools/call`` with a ``CreateTaskResult``, serves ``tasks/get`` and
``tasks/result``, and advertises ``capabilities.tasks`` and the tool's ``execution``.

Usage::

    BANK_DB=/tmp/bank.db python tests/integrations/mcp_bank.py
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import time
import uuid
from datetime import UTC, datetime
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.shared.exceptions import MCPError
from mcp.types import ToolAnnotations

KEY = "io.agentsnap/idempotency-key"
ATTEMPT = "io.agentsnap/attempt"
BALANCE = 1000

SCHEMA = (
    "CREATE TABLE IF NOT EXISTS calls (seq INTEGER PRIMARY KEY AUTOINCREMENT, tool TEXT, "
    "key TEXT, attempt INTEGER, arguments TEXT, task INTEGER, pid INTEGER)",
    "CREATE TABLE IF NOT EXISTS transfers (id INTEGER PRIMARY KEY AUTOINCREMENT, "
    "key TEXT UNIQUE, target TEXT, amount INTEGER, memo TEXT)",
    "CREATE TABLE IF NOT EXISTS emails (id INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT, "
    "recipient TEXT, subject TEXT)",
    "CREATE TABLE IF NOT EXISTS tasks (task_id TEXT PRIMARY KEY, key TEXT, result TEXT, "
    "created_at REAL, ready_at REAL)",
    "CREATE TABLE IF NOT EXISTS polls (task_id TEXT, method TEXT, pid INTEGER)",
)


def connect() -> sqlite3.Connection:
    conn = sqlite3.connect(os.environ["BANK_DB"], timeout=30, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    for statement in SCHEMA:
        conn.execute(statement)
    return conn


def log_call(tool: str, arguments: dict[str, Any], meta: dict[str, Any], task: bool) -> None:
    conn = connect()
    try:
        conn.execute(
            "INSERT INTO calls (tool, key, attempt, arguments, task, pid) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (
                tool,
                meta.get(KEY),
                meta.get(ATTEMPT),
                json.dumps(arguments, sort_keys=True),
                int(task),
                os.getpid(),
            ),
        )
    finally:
        conn.close()


def meta_of(ctx: Context) -> dict[str, Any]:
    meta = ctx.request_context.meta
    return dict(meta) if meta else {}


def make_transfer(key: str | None, to: str, amount: int, memo: str) -> dict[str, Any]:
    """The transfer made under ``key``: made now, or the one made before for that key."""
    conn = connect()
    try:
        conn.execute("BEGIN IMMEDIATE")
        if key is not None:
            row = conn.execute("SELECT id FROM transfers WHERE key = ?", (key,)).fetchone()
            if row is not None:
                conn.execute("COMMIT")
                return {"transfer_id": row[0], "to": to, "amount": amount, "repeated": True}
        cursor = conn.execute(
            "INSERT INTO transfers (key, target, amount, memo) VALUES (?, ?, ?, ?)",
            (key, to, amount, memo),
        )
        conn.execute("COMMIT")
        return {"transfer_id": cursor.lastrowid, "to": to, "amount": amount, "repeated": False}
    finally:
        conn.close()


def balance_of(account: str) -> int:
    conn = connect()
    try:
        row = conn.execute(
            "SELECT COALESCE(SUM(amount), 0) FROM transfers WHERE target != ?", (account,)
        ).fetchone()
        return BALANCE - int(row[0])
    finally:
        conn.close()


def now_iso() -> str:
    return datetime.now(UTC).isoformat()


async def tasks(ctx: Any, call_next: Any) -> Any:
    """Serve MCP tasks (2025-11-25) for ``wire`` on top of the SDK's server."""
    method = ctx.method
    params: dict[str, Any] = dict(ctx.params or {})
    if method == "tools/call" and params.get("task") is not None:
        return start_task(params)
    if method in ("tasks/get", "tasks/result"):
        return await task_state(method, str(params.get("taskId")))
    result = await call_next(ctx)
    if method == "initialize":
        result.setdefault("capabilities", {})["tasks"] = {"requests": {"tools": {"call": {}}}}
    elif method == "tools/list":
        for listed in result.get("tools", []):
            if listed.get("name") == "wire":
                listed["execution"] = {"taskSupport": "required"}
    return result


def start_task(params: dict[str, Any]) -> dict[str, Any]:
    if params.get("name") != "wire":
        raise MCPError(code=-32602, message=f"tool {params.get('name')!r} does not run as a task")
    arguments = dict(params.get("arguments") or {})
    meta = dict(params.get("_meta") or {})
    log_call("wire", arguments, meta, task=True)
    key = meta.get(KEY)
    done = make_transfer(key, str(arguments["to"]), int(arguments["amount"]), "wire")
    task_id = str(uuid.uuid4())
    created = time.time()
    result = {"content": [], "structuredContent": done, "isError": False}
    conn = connect()
    try:
        conn.execute(
            "INSERT INTO tasks (task_id, key, result, created_at, ready_at) VALUES (?, ?, ?, ?, ?)",
            (
                task_id,
                key,
                json.dumps(result),
                created,
                created + float(os.environ.get("BANK_TASK_SECONDS", "0.3")),
            ),
        )
    finally:
        conn.close()
    return {"task": task_json(task_id, "working", created), "_meta": {}}


def task_json(task_id: str, status: str, created: float) -> dict[str, Any]:
    return {
        "taskId": task_id,
        "status": status,
        "createdAt": datetime.fromtimestamp(created, UTC).isoformat(),
        "lastUpdatedAt": now_iso(),
        "ttl": None,
        "pollInterval": 100,
    }


async def task_state(method: str, task_id: str) -> dict[str, Any]:
    conn = connect()
    try:
        conn.execute(
            "INSERT INTO polls (task_id, method, pid) VALUES (?, ?, ?)",
            (task_id, method, os.getpid()),
        )
        row = conn.execute(
            "SELECT result, created_at, ready_at FROM tasks WHERE task_id = ?", (task_id,)
        ).fetchone()
    finally:
        conn.close()
    if row is None:
        raise MCPError(code=-32602, message=f"no task {task_id!r}")
    result, created, ready = str(row[0]), float(row[1]), float(row[2])
    if method == "tasks/get":
        status = "completed" if time.time() >= ready else "working"
        return task_json(task_id, status, created)
    await asyncio.sleep(max(0.0, ready - time.time()))  # tasks/result waits for the end
    payload: dict[str, Any] = json.loads(result)
    payload["_meta"] = {"io.modelcontextprotocol/related-task": {"taskId": task_id}}
    return payload


server = MCPServer("bank", middleware=[tasks])


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def balance(account: str, ctx: Context) -> dict[str, Any]:
    """The balance of an account."""
    log_call("balance", {"account": account}, meta_of(ctx), task=False)
    return {"account": account, "balance": balance_of(account)}


@server.tool(annotations=ToolAnnotations(destructive_hint=True))
def transfer(to: str, amount: int, memo: str, ctx: Context) -> dict[str, Any]:
    """Move money to an account."""
    meta = meta_of(ctx)
    log_call("transfer", {"to": to, "amount": amount, "memo": memo}, meta, task=False)
    if amount <= 0:
        raise ToolError(f"amount must be positive, got {amount}")
    time.sleep(float(os.environ.get("BANK_TRANSFER_SECONDS", "0")))
    return make_transfer(meta.get(KEY), to, amount, memo)


@server.tool(structured_output=False)
def send_email(to: str, subject: str, ctx: Context) -> str:
    """Queue an email."""
    meta = meta_of(ctx)
    log_call("send_email", {"to": to, "subject": subject}, meta, task=False)
    conn = connect()
    try:
        cursor = conn.execute(
            "INSERT INTO emails (key, recipient, subject) VALUES (?, ?, ?)",
            (meta.get(KEY), to, subject),
        )
    finally:
        conn.close()
    return f"queued email {cursor.lastrowid} to {to}"


@server.tool(annotations=ToolAnnotations(destructive_hint=True))
def wire(to: str, amount: int, ctx: Context) -> dict[str, Any]:
    """Wire money to an account (runs as an MCP task)."""
    meta = meta_of(ctx)
    log_call("wire", {"to": to, "amount": amount}, meta, task=False)
    return make_transfer(meta.get(KEY), to, amount, "wire")


if __name__ == "__main__":
    server.run()
