"""A payroll as an app that ``agentsnap run --app payroll_app:make_app`` runs in one process.

The clerk takes ``{"employees": N}`` (or ``{"names": [...]}``) and sends one ``pay`` message
per employee to the payer, which pays through the side-effecting tool ``pay`` and tells the
auditor, who adds the payment up. ``pay`` stands for a payment service: it inserts the payment
into the service's own SQLite table (the file ``PAYROLL_SERVICE``) keyed by the idempotency
key it is handed (``INSERT OR IGNORE``: the service deduplicates a key, as a payment API
does), so an employee paid under two keys is a payment made twice. Handlers and payments
take a random while (up to ``PAYROLL_DELAY`` seconds). Paying an employee named ``boom``
fails, with a chained cause. Each payment is also written to ``PAYROLL_PROGRESS`` (one line)
after the tool returned, so a test knows how far a run got; then the payer waits as long as
the file ``PAYROLL_HOLD`` exists.
"""

from __future__ import annotations

import asyncio
import os
import random
import sqlite3
from typing import Any, cast

from agentsnap import Agent, AgentState, Context, Message, ToolCall, tool
from agentsnap.distributed import App


def _delay() -> float:
    return random.uniform(0, float(os.environ.get("PAYROLL_DELAY", "0.01")))


def _service() -> sqlite3.Connection:
    conn = sqlite3.connect(os.environ["PAYROLL_SERVICE"], timeout=60)
    conn.execute("PRAGMA busy_timeout=60000")
    conn.execute(
        "CREATE TABLE IF NOT EXISTS payments (key TEXT PRIMARY KEY, employee TEXT, pid INT)"
    )
    return conn


@tool(side_effect=True, rerun_if_unknown=True)
async def pay(call: ToolCall, employee: str, amount: int) -> str:
    """Pay ``employee``: the service records the payment once per idempotency key."""
    await asyncio.sleep(_delay())
    if employee == "boom":
        try:
            raise KeyError(employee)
        except KeyError as exc:
            raise ValueError(f"the bank refused to pay {employee}") from exc
    conn = _service()
    try:
        with conn:
            conn.execute(
                "INSERT OR IGNORE INTO payments (key, employee, pid) VALUES (?, ?, ?)",
                (call.key, employee, os.getpid()),
            )
    finally:
        conn.close()
    return f"paid {amount} to {employee}"


def _note_progress(employee: str) -> None:
    progress = os.environ.get("PAYROLL_PROGRESS")
    if progress:
        with open(progress, "a", encoding="utf-8") as file:
            file.write(f"{employee}\n")


def _held() -> bool:
    hold = os.environ.get("PAYROLL_HOLD")
    return hold is not None and os.path.exists(hold)


class Clerk(Agent[AgentState]):
    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        payload = cast("dict[str, Any]", message.payload)
        names = payload.get("names") or [f"e{i}" for i in range(int(payload["employees"]))]
        for name in names:
            ctx.send("payer", {"employee": name, "amount": 100}, kind="pay")


class Payer(Agent[AgentState]):
    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        payload = cast("dict[str, Any]", message.payload)
        receipt = await pay(ctx, employee=payload["employee"], amount=payload["amount"])
        _note_progress(payload["employee"])
        while _held():  # noqa: ASYNC110 - the test, another process, lets it go on (or cancels)
            await asyncio.sleep(0.01)
        await asyncio.sleep(_delay())
        ctx.send("auditor", {"receipt": receipt, "amount": payload["amount"]}, kind="paid")


class AuditState(AgentState):
    paid: int = 0
    total: int = 0


class Auditor(Agent[AuditState]):
    async def handle(self, message: Message, ctx: Context[AuditState]) -> None:
        payload = cast("dict[str, Any]", message.payload)
        self.state.paid += 1
        self.state.total += int(payload["amount"])


def make_app() -> App:
    """The clerk, the payer and the auditor."""
    return App(agents=[Clerk("clerk"), Payer("payer"), Auditor("auditor", AuditState())])
