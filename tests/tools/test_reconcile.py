"""When a run ends: effects no final state holds are abandoned, and compensated exactly once."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from agentsnap import AgentState, IdempotencyConflict, LedgerEntry, ToolCallStatus, tool
from agentsnap.ledger import Ledger
from agentsnap.once import reconcile
from agentsnap.state import ToolCallRecord
from agentsnap.store.sql_ledger import SqlLedger

REFUNDS: list[str] = []
RELEASES: list[str] = []


async def refund(entry: LedgerEntry) -> dict[str, object]:
    REFUNDS.append(entry.key)
    await asyncio.sleep(0.01)  # long enough for a second reconciler to try its luck
    return {"refunded": entry.result}


def release(entry: LedgerEntry) -> None:
    RELEASES.append(entry.key)
    raise RuntimeError("the warehouse is closed")


@tool(side_effect=True, name="reconcile_charge", compensate=refund)
async def charge(amount: int) -> str:
    return f"charged {amount}"


@tool(side_effect=True, name="reconcile_reserve", compensate=release)
async def reserve(item: str) -> str:
    return f"reserved {item}"


@tool(side_effect=True, name="reconcile_notify")
async def notify(text: str) -> str:
    return f"sent {text}"


TOOLS = {t.name: t for t in (charge, reserve, notify)}


@pytest.fixture(autouse=True)
def _clear() -> None:
    REFUNDS.clear()
    RELEASES.clear()


def state_holding(*keys: str) -> AgentState:
    return AgentState(tool_calls=[ToolCallRecord(tool="t", key=key) for key in keys])


async def make_calls(ledger: Ledger, run_id: str = "run") -> None:
    await charge.invoke(ledger, key="kept", run_id=run_id, agent="a", amount=1)
    await charge.invoke(ledger, key="dropped", run_id=run_id, agent="a", amount=2)
    await reserve.invoke(ledger, key="reserved", run_id=run_id, agent="b", item="chair")
    await notify.invoke(ledger, key="notified", run_id=run_id, agent="b", text="hi")


async def statuses(ledger: Ledger) -> dict[str, ToolCallStatus]:
    return {entry.key: entry.status for entry in await ledger.list_calls()}


async def test_abandoned_effects_are_compensated_once(ledger: Ledger) -> None:
    await make_calls(ledger)
    changed = await reconcile(ledger, "run", [state_holding("kept"), AgentState()], TOOLS)

    assert REFUNDS == ["dropped"]
    assert RELEASES == ["reserved"]
    assert await statuses(ledger) == {
        "kept": ToolCallStatus.SUCCEEDED,
        "dropped": ToolCallStatus.COMPENSATED,
        "reserved": ToolCallStatus.COMPENSATION_FAILED,
        "notified": ToolCallStatus.ABANDONED,  # no compensating action declared
    }
    by_key = {entry.key: entry for entry in await ledger.list_calls()}
    assert by_key["dropped"].compensation == {"result": {"refunded": "charged 2"}}
    assert by_key["reserved"].compensation == {"error": "RuntimeError: the warehouse is closed"}
    assert by_key["dropped"].result == "charged 2", "the effect's own record is kept"
    assert {entry.key for entry in changed} == {"dropped", "reserved", "notified"}

    assert await reconcile(ledger, "run", [state_holding("kept")], TOOLS) == []
    assert REFUNDS == ["dropped"], "a second reconciliation runs nothing again"
    assert RELEASES == ["reserved"], "a failed compensation is recorded, not retried blindly"


async def test_other_runs_and_failed_calls_are_left_alone(ledger: Ledger) -> None:
    await make_calls(ledger, run_id="other")

    @tool(side_effect=True, name="reconcile_fails")
    async def fails() -> None:
        raise ValueError("no")

    with pytest.raises(Exception, match="no"):
        await fails.invoke(ledger, key="failed", run_id="run")
    assert await reconcile(ledger, "run", [AgentState()], TOOLS) == []
    assert REFUNDS == []
    assert set((await statuses(ledger)).values()) == {
        ToolCallStatus.SUCCEEDED,
        ToolCallStatus.FAILED,
    }


async def test_two_reconcilers_compensate_once(tmp_path: Path, ledger: Ledger) -> None:
    await make_calls(ledger)
    # A second ledger object on the same database is what another process would hold.
    url = getattr(ledger, "url", None)
    other: Ledger = SqlLedger(url) if url else ledger
    try:
        await asyncio.gather(
            reconcile(ledger, "run", [state_holding("kept")], TOOLS),
            reconcile(other, "run", [state_holding("kept")], TOOLS),
        )
    finally:
        if other is not ledger:
            await other.close()
    assert REFUNDS == ["dropped"]
    assert RELEASES == ["reserved"]


async def test_an_abandoned_effect_repeated_later_is_live_again(ledger: Ledger) -> None:
    await notify.invoke(ledger, key="n", run_id="run", text="hi")
    await reconcile(ledger, "run", [AgentState()], TOOLS)
    assert (await statuses(ledger))["n"] == ToolCallStatus.ABANDONED
    assert await notify.invoke(ledger, key="n", run_id="run", text="hi") == "sent hi"
    assert (await statuses(ledger))["n"] == ToolCallStatus.SUCCEEDED


async def test_a_compensated_key_cannot_be_used_again(ledger: Ledger) -> None:
    await charge.invoke(ledger, key="c", run_id="run", amount=5)
    await reconcile(ledger, "run", [AgentState()], TOOLS)
    with pytest.raises(IdempotencyConflict, match="abandoned by a rollback and is compensated"):
        await charge.invoke(ledger, key="c", run_id="run", amount=5)
    assert REFUNDS == ["c"]


async def test_without_its_tool_an_abandoned_effect_waits_for_a_later_reconcile(
    ledger: Ledger,
) -> None:
    # No global registry: a tool nobody named is not compensated, and the entry waits.
    await charge.invoke(ledger, key="d", run_id="run", amount=5)
    await reconcile(ledger, "run", [AgentState()])
    assert REFUNDS == []
    assert (await statuses(ledger))["d"] == ToolCallStatus.ABANDONED
    await reconcile(ledger, "run", [AgentState()], TOOLS)
    assert REFUNDS == ["d"]
    assert (await statuses(ledger))["d"] == ToolCallStatus.COMPENSATED
