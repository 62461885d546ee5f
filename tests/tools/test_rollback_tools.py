"""Rollbacks and the ledger: redone calls get recorded results, abandoned ones are undone.

The ledger is never rolled back. A rejected output takes every agent back to the last
consistent cut, and the handler that runs again derives the same keys for the calls it makes
at the same places, whatever their arguments: the effect that happened stands (unless the
tool declares ``on_redo``), and the agent's feedback lists it; the calls the new path does
not make are compensated when the run ends.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from payloads import get

from agentsnap import (
    Agent,
    AgentState,
    Context,
    Feedback,
    LedgerEntry,
    Message,
    Runtime,
    ToolCallRecord,
    ToolCallStatus,
    tool,
)
from agentsnap.cli import main
from agentsnap.ledger import Ledger
from agentsnap.store.sql import SqlStore

CHARGES: list[int] = []
REFUNDS: list[int] = []


def refund(entry: LedgerEntry) -> str:
    REFUNDS.append(get(entry.arguments, "amount", int))
    return f"refunded {entry.arguments['amount']}"


@tool(side_effect=True, name="rollback_charge", compensate=refund)
async def charge(card: str, amount: int) -> dict[str, int]:
    CHARGES.append(amount)
    return {"charge": len(CHARGES), "amount": amount}


@tool(side_effect=True, name="rollback_recharge", compensate=refund, on_redo="compensate")
async def recharge(card: str, amount: int) -> dict[str, int]:
    CHARGES.append(amount)
    return {"charge": len(CHARGES), "amount": amount}


@tool(side_effect=True, name="rollback_charge_again", on_redo="new")
async def charge_again(card: str, amount: int) -> dict[str, int]:
    CHARGES.append(amount)
    return {"charge": len(CHARGES), "amount": amount}


TOOLS = {"charge": charge, "recharge": recharge, "charge_again": charge_again}


@pytest.fixture(autouse=True)
def _clear() -> None:
    CHARGES.clear()
    REFUNDS.clear()


class Cashier(Agent[AgentState]):
    """Charges the order, then reports to the auditor.

    Without feedback it writes a sloppy report (rejected by the check below) and, when
    ``sloppy_amount`` is set, also charges the wrong amount.
    """

    def __init__(self, name: str, sloppy_amount: bool, tool: str = "charge") -> None:
        super().__init__(name)
        self.sloppy_amount = sloppy_amount
        self.tool = TOOLS[tool]
        self.feedback: list[Feedback] = []

    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        amount = get(message.payload, "amount", int)
        careful = bool(ctx.feedback)
        self.feedback = list(ctx.feedback)
        if self.sloppy_amount and not careful:
            amount *= 10
        receipt = await self.tool(ctx, card="4242", amount=amount)
        ctx.send("auditor", {"receipt": receipt, "checked": careful}, kind="report")


class Auditor(Agent[AgentState]):
    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        self.state.memory["report"] = message.payload


def checked(message: Message) -> bool | str:
    return get(message.payload, "checked", bool) or "check the receipt before you report it"


async def run_shop(ledger: Ledger, *, sloppy_amount: bool, tool: str = "charge") -> Runtime:
    runtime = Runtime(ledger=ledger)
    runtime.check("cashier", kind="report", check=checked)
    async with runtime:
        runtime.add(Cashier("cashier", sloppy_amount, tool))
        runtime.add(Auditor("auditor"))
        runtime.send("cashier", {"amount": 30})
        await runtime.run_until_idle()
    return runtime


async def test_a_repeated_call_after_a_rollback_gets_the_recorded_result(ledger: Ledger) -> None:
    runtime = await run_shop(ledger, sloppy_amount=False)

    assert len(runtime.rollbacks) == 1
    assert CHARGES == [30], "the card was charged once, though the handler ran twice"
    (call,) = runtime.agents["cashier"].state.tool_calls
    assert (call.status, call.replayed) == ("replayed", True)
    assert runtime.agents["auditor"].state.memory["report"] == {
        "receipt": {"charge": 1, "amount": 30},
        "checked": True,
    }
    (entry,) = await ledger.list_calls(runtime.run_id)
    assert (entry.key, entry.status) == (call.key, ToolCallStatus.SUCCEEDED)
    assert call.attempts == entry.attempts == 1  # one count: the ledger's
    assert REFUNDS == []


def test_the_command_line_shows_a_replayed_call_with_the_ledgers_attempts(
    tmp_path: Path,
) -> None:
    db = f"sqlite:///{tmp_path / 'shop.db'}"

    async def shop() -> tuple[str, str]:
        store = SqlStore(db)
        try:
            runtime = Runtime(store=store)
            runtime.check("cashier", kind="report", check=checked)
            async with runtime:
                runtime.add(Cashier("cashier", sloppy_amount=False))
                runtime.add(Auditor("auditor"))
                runtime.send("cashier", {"amount": 30})
                await runtime.run_until_idle()
                last = await runtime.snapshot()
            assert len(runtime.rollbacks) == 1
            return runtime.run_id, last.id
        finally:
            await store.close()

    run_id, last = asyncio.run(shop())

    def cli(*args: str) -> Any:
        result = CliRunner().invoke(main, [*args, "--json", "--db", db])
        assert result.exit_code == 0, result.output
        return json.loads(result.output)

    shown = cli("show", last, "--agent", "cashier")
    (call,) = shown["agents"]["cashier"]["state"]["tool_calls"]
    (entry,) = cli("tools", run_id)
    assert (call["key"], call["status"], call["replayed"]) == (entry["key"], "replayed", True)
    assert call["attempts"] == entry["attempts"] == 1


def test_a_state_stored_before_calls_said_whether_they_were_replayed_still_loads() -> None:
    stored = {"tool": "rollback_charge", "key": "k1", "status": "replayed", "attempts": 0}
    state = AgentState.model_validate({"tool_calls": [stored]})
    (call,) = state.tool_calls
    assert (call.status, call.attempts, call.replayed) == ("replayed", 0, False)
    assert ToolCallRecord.model_validate({"tool": "t"}).replayed is False


async def test_a_redo_with_other_arguments_gets_the_effect_that_happened(
    ledger: Ledger,
) -> None:
    runtime = await run_shop(ledger, sloppy_amount=True)

    assert len(runtime.rollbacks) == 1
    assert CHARGES == [300], "the redo worded the call otherwise; the card was charged once"
    (call,) = runtime.agents["cashier"].state.tool_calls
    assert call.status == "replayed"
    assert call.arguments == {"card": "4242", "amount": 30}, "what the redo asked"
    assert runtime.agents["auditor"].state.memory["report"] == {
        "receipt": {"charge": 1, "amount": 300},
        "checked": True,
    }, "the redo got the outcome of the effect that happened"
    (entry,) = await ledger.list_calls(runtime.run_id)
    assert (entry.key, entry.status) == (call.key, ToolCallStatus.SUCCEEDED)
    assert entry.arguments == {"card": "4242", "amount": 300}
    assert REFUNDS == []
    cashier = runtime.agents["cashier"]
    assert isinstance(cashier, Cashier)
    (feedback,) = cashier.feedback
    assert [(d.tool, d.arguments, d.result) for d in feedback.done] == [
        ("rollback_charge", {"card": "4242", "amount": 300}, {"charge": 1, "amount": 300})
    ], "the redo's feedback names what was already done"
    assert "rollback_charge" in feedback.text()
    assert "300" in feedback.text()


async def test_a_tool_that_compensates_a_redo_undoes_the_effect_then_runs_the_new_call(
    ledger: Ledger,
) -> None:
    runtime = await run_shop(ledger, sloppy_amount=True, tool="recharge")

    assert len(runtime.rollbacks) == 1
    assert CHARGES == [300, 30], "the new call ran as an effect of its own"
    assert REFUNDS == [300], "the effect it replaces was compensated, once"
    entries = {entry.arguments["amount"]: entry for entry in await ledger.list_calls()}
    assert entries[300].status == ToolCallStatus.COMPENSATED
    assert entries[300].compensation == {"result": "refunded 300"}
    assert entries[30].status == ToolCallStatus.SUCCEEDED
    (call,) = runtime.agents["cashier"].state.tool_calls
    assert call.key == entries[30].key


async def test_a_tool_that_allows_a_new_effect_runs_the_redo_and_abandons_the_first(
    ledger: Ledger,
) -> None:
    runtime = await run_shop(ledger, sloppy_amount=True, tool="charge_again")

    assert CHARGES == [300, 30]
    entries = {entry.arguments["amount"]: entry for entry in await ledger.list_calls()}
    assert entries[300].status == ToolCallStatus.ABANDONED, "not repeated by the final path"
    assert entries[30].status == ToolCallStatus.SUCCEEDED
    (call,) = runtime.agents["cashier"].state.tool_calls
    assert call.key == entries[30].key
