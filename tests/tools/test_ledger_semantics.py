"""The ledger's rules, one test each, on every ledger backend (memory, SQLite, PostgreSQL).

Tools here count how often their body runs; "the tool did not run" is that count unchanged.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import TypedDict, Unpack

import pytest
import tenacity
from owners import dead_owner

from agentsnap import (
    ConfigurationError,
    IdempotencyConflict,
    LedgerEntry,
    Tool,
    ToolCall,
    ToolCallStatus,
    ToolFailed,
    ToolInProgress,
    ToolOutcomeUnknown,
    ToolRetry,
    tool,
)
from agentsnap.ledger import Ledger, fingerprint, owner_id, resolve
from agentsnap.messages import JsonValue
from agentsnap.records import utcnow


class Flaky(Exception):
    """A declared transient error: the effect did not happen."""


class Declined(Exception):
    """A final error."""


class Counter:
    def __init__(self) -> None:
        self.runs = 0
        self.keys: list[str | None] = []
        self.attempts: list[int] = []


class ChargeOptions(TypedDict, total=False):
    """The `tool` options the tests vary."""

    wait: float
    rerun_if_unknown: bool


def make_charge(counter: Counter, **options: Unpack[ChargeOptions]) -> Tool[dict[str, object]]:
    @tool(side_effect=True, name="charge", **options)
    async def charge(call: ToolCall, card: str, amount: int) -> dict[str, object]:
        counter.runs += 1
        counter.keys.append(call.key)
        counter.attempts.append(call.attempt)
        return {"charge": counter.runs, "card": card, "amount": amount}

    return charge


def entry(key: str, owner: str, lease: timedelta, **arguments: JsonValue) -> LedgerEntry:
    """A claim as another caller would have left it."""
    now = utcnow()
    return LedgerEntry(
        key=key,
        tool="charge",
        fingerprint=fingerprint(arguments),
        arguments=dict(arguments),
        status=ToolCallStatus.IN_PROGRESS,
        created_at=now,
        updated_at=now,
        owner=owner,
        lease_until=now + lease,
    )


async def test_a_recorded_result_is_returned_and_the_tool_does_not_run(ledger: Ledger) -> None:
    counter = Counter()
    charge = make_charge(counter)
    first = await charge.invoke(ledger, key="order-1", card="4242", amount=500)
    again = await charge.invoke(ledger, key="order-1", card="4242", amount=500)
    assert first == again == {"charge": 1, "card": "4242", "amount": 500}
    assert counter.runs == 1
    (recorded,) = await ledger.list_calls()
    assert recorded.key == "order-1"
    assert recorded.status == ToolCallStatus.SUCCEEDED
    assert recorded.result == first
    assert recorded.attempts == 1
    assert recorded.owner is None
    assert recorded.fingerprint == fingerprint({"card": "4242", "amount": 500})


async def test_a_recorded_final_error_is_raised_again_without_running(ledger: Ledger) -> None:
    runs = 0

    @tool(side_effect=True, name="decline")
    async def decline(card: str) -> None:
        nonlocal runs
        runs += 1
        raise Declined(f"card {card} declined")

    with pytest.raises(ToolFailed) as first:
        await decline.invoke(ledger, key="k", card="0000")
    assert isinstance(first.value.__cause__, Declined)
    assert not first.value.replayed
    with pytest.raises(ToolFailed) as again:
        await decline.invoke(ledger, key="k", card="0000")
    assert again.value.replayed
    assert again.value.error_type == "Declined"
    assert again.value.detail == "card 0000 declined"
    assert "did not run again" in str(again.value)
    assert runs == 1
    (recorded,) = await ledger.list_calls()
    assert recorded.status == ToolCallStatus.FAILED
    assert recorded.error == "Declined: card 0000 declined"


async def test_an_explicit_key_reused_with_other_arguments_is_a_conflict(ledger: Ledger) -> None:
    counter = Counter()
    charge = make_charge(counter)
    await charge.invoke(ledger, key="order-2", card="4242", amount=500)
    with pytest.raises(IdempotencyConflict) as info:
        await charge.invoke(ledger, key="order-2", card="4242", amount=900)
    assert counter.runs == 1
    assert info.value.key == "order-2"
    assert "other arguments" in str(info.value)
    assert '"amount":500' in str(info.value)  # what the key was first used for

    @tool(side_effect=True, name="refund")
    async def refund(card: str, amount: int) -> None:
        raise AssertionError("must not run")

    with pytest.raises(IdempotencyConflict, match="used for tool 'charge'"):
        await refund.invoke(ledger, key="order-2", card="4242", amount=500)
    (recorded,) = await ledger.list_calls()
    assert recorded.status == ToolCallStatus.SUCCEEDED
    assert recorded.arguments == {"card": "4242", "amount": 500}


async def test_a_key_in_progress_elsewhere_is_waited_for_then_refused(ledger: Ledger) -> None:
    counter = Counter()
    charge = make_charge(counter, wait=0.2)
    # Claimed by a process on another host whose lease still runs: it may be working on it.
    assert (
        await ledger.claim(
            entry("busy", "elsewhere:4711:aaaaaaaaaaaa", timedelta(minutes=5), card="1", amount=1)
        )
        is None
    )
    with pytest.raises(ToolInProgress) as info:
        await charge.invoke(ledger, key="busy", card="1", amount=1)
    assert counter.runs == 0
    assert info.value.owner == "elsewhere:4711:aaaaaaaaaaaa"
    assert "call again later" in str(info.value)
    found = await ledger.get("busy")
    assert found is not None
    assert found.status == ToolCallStatus.IN_PROGRESS


async def test_a_waiting_call_gets_the_result_once_it_is_recorded(ledger: Ledger) -> None:
    started = asyncio.Event()
    release = asyncio.Event()
    runs = 0

    @tool(side_effect=True, name="slow", wait=30)
    async def slow(order: str) -> str:
        nonlocal runs
        runs += 1
        started.set()
        await release.wait()
        return f"done {order}"

    first = asyncio.create_task(slow.invoke(ledger, key="slow-1", order="7"))
    await started.wait()
    second = asyncio.create_task(slow.invoke(ledger, key="slow-1", order="7"))
    await asyncio.sleep(0.05)
    assert not second.done(), "the second call waits for the first"
    release.set()
    assert await first == await second == "done 7"
    assert runs == 1


@pytest.mark.parametrize("how", ["dead process", "expired lease"])
async def test_a_claim_without_outcome_after_a_crash_is_unknown(ledger: Ledger, how: str) -> None:
    counter = Counter()
    charge = make_charge(counter, wait=30)
    if how == "dead process":
        claim = entry("lost", dead_owner(), timedelta(minutes=5), card="9", amount=9)
    else:
        claim = entry("lost", "elsewhere:1:bbbbbbbbbbbb", timedelta(seconds=-1), card="9", amount=9)
    assert await ledger.claim(claim) is None

    with pytest.raises(ToolOutcomeUnknown) as info:
        await charge.invoke(ledger, key="lost", card="9", amount=9)
    assert counter.runs == 0, "an unknown outcome is never re-run blindly"
    assert info.value.key == "lost"
    assert "agentsnap tools resolve lost" in str(info.value)
    found = await ledger.get("lost")
    assert found is not None
    assert found.status == ToolCallStatus.UNKNOWN  # what the inspector and export show

    with pytest.raises(ToolOutcomeUnknown):  # and it stays so until someone resolves it
        await charge.invoke(ledger, key="lost", card="9", amount=9)
    assert counter.runs == 0


async def test_an_unknown_outcome_is_run_again_when_the_tool_says_it_is_safe(
    ledger: Ledger,
) -> None:
    counter = Counter()
    charge = make_charge(counter, rerun_if_unknown=True)
    claim = entry("lost", dead_owner(), timedelta(minutes=5), card="9", amount=9)
    assert await ledger.claim(claim) is None
    result = await charge.invoke(ledger, key="lost", card="9", amount=9)
    assert result == {"charge": 1, "card": "9", "amount": 9}
    assert counter.keys == ["lost"], "the tool got the key to hand to the service"
    assert counter.attempts == [2], "the crashed claim was attempt 1"
    found = await ledger.get("lost")
    assert found is not None
    assert (found.status, found.attempts, found.owner) == (ToolCallStatus.SUCCEEDED, 2, None)


async def test_a_person_resolves_an_unknown_outcome(ledger: Ledger) -> None:
    counter = Counter()
    charge = make_charge(counter)
    assert await ledger.claim(entry("lost", dead_owner(), timedelta(0), card="9", amount=9)) is None
    with pytest.raises(ToolOutcomeUnknown):
        await charge.invoke(ledger, key="lost", card="9", amount=9)

    resolved = await resolve(ledger, "lost", result={"charge": "ch_from_the_bank"})
    assert resolved.status == ToolCallStatus.SUCCEEDED
    again = await charge.invoke(ledger, key="lost", card="9", amount=9)
    assert again == {"charge": "ch_from_the_bank"}
    assert counter.runs == 0

    with pytest.raises(ConfigurationError, match="outcome is known"):
        await resolve(ledger, "lost", error="no")
    with pytest.raises(ConfigurationError, match="exactly one of result=, error= and retry"):
        await resolve(ledger, "lost")
    with pytest.raises(ConfigurationError, match="exactly one of"):
        await resolve(ledger, "lost", error="no", retry=True)


async def test_a_person_records_that_an_unknown_effect_did_not_happen(ledger: Ledger) -> None:
    counter = Counter()
    charge = make_charge(counter)
    assert await ledger.claim(entry("lost", dead_owner(), timedelta(0), card="9", amount=9)) is None
    await resolve(ledger, "lost", error="the bank has no such charge")
    with pytest.raises(ToolFailed, match="the bank has no such charge") as info:
        await charge.invoke(ledger, key="lost", card="9", amount=9)
    assert info.value.replayed
    assert counter.runs == 0


async def test_a_person_has_an_unknown_effect_tried_again(ledger: Ledger) -> None:
    counter = Counter()
    charge = make_charge(counter)
    assert await ledger.claim(entry("lost", dead_owner(), timedelta(0), card="9", amount=9)) is None
    resolved = await resolve(ledger, "lost", retry=True)
    assert resolved.status == ToolCallStatus.RETRYABLE
    result = await charge.invoke(ledger, key="lost", card="9", amount=9)
    assert result == {"charge": 1, "card": "9", "amount": 9}
    assert counter.attempts == [2], "the lost claim was attempt 1"
    found = await ledger.get("lost")
    assert found is not None
    assert found.status == ToolCallStatus.SUCCEEDED


async def test_transient_errors_are_retried_under_the_same_key(ledger: Ledger) -> None:
    seen: list[tuple[str | None, int]] = []

    @tool(
        side_effect=True,
        name="flaky_charge",
        transient=(Flaky,),
        retry=ToolRetry.attempts(5),
    )
    async def flaky_charge(call: ToolCall, amount: int) -> int:
        seen.append((call.key, call.attempt))
        if len(seen) < 3:
            raise Flaky("gateway timeout")
        return amount

    assert await flaky_charge.invoke(ledger, key="t-1", amount=3) == 3
    assert seen == [("t-1", 1), ("t-1", 2), ("t-1", 3)]
    (recorded,) = await ledger.list_calls()
    assert (recorded.status, recorded.attempts, recorded.result) == (
        ToolCallStatus.SUCCEEDED,
        3,
        3,
    )
    assert await flaky_charge.invoke(ledger, key="t-1", amount=3) == 3
    assert len(seen) == 3, "the success is cached"


async def test_transient_failures_are_not_cached(ledger: Ledger) -> None:
    runs = 0
    down = True

    @tool(
        side_effect=True,
        name="outage",
        transient=(Flaky,),
        retry=ToolRetry(stop=tenacity.stop_after_attempt(2), wait=tenacity.wait_none()),
    )
    async def outage(amount: int) -> int:
        nonlocal runs
        runs += 1
        if down:
            raise Flaky("service unavailable")
        return amount

    with pytest.raises(ToolFailed) as info:
        await outage.invoke(ledger, key="t-2", amount=1)
    assert info.value.transient
    assert "tries again" in str(info.value)
    assert runs == 2
    (recorded,) = await ledger.list_calls()
    assert (recorded.status, recorded.attempts) == (ToolCallStatus.RETRYABLE, 2)
    assert recorded.error == "Flaky: service unavailable"

    down = False
    assert await outage.invoke(ledger, key="t-2", amount=1) == 1
    assert runs == 3
    (recorded,) = await ledger.list_calls()
    assert (recorded.status, recorded.attempts) == (ToolCallStatus.SUCCEEDED, 3)


async def test_a_final_error_is_not_retried(ledger: Ledger) -> None:
    runs = 0

    @tool(side_effect=True, name="strict", transient=(Flaky,), retry=ToolRetry.attempts(5))
    async def strict() -> None:
        nonlocal runs
        runs += 1
        raise Declined("no")

    with pytest.raises(ToolFailed):
        await strict.invoke(ledger, key="t-3")
    assert runs == 1
    (recorded,) = await ledger.list_calls()
    assert recorded.status == ToolCallStatus.FAILED


async def test_a_call_cancelled_mid_effect_has_an_unknown_outcome(ledger: Ledger) -> None:
    started = asyncio.Event()

    @tool(side_effect=True, name="hangs")
    async def hangs() -> None:
        started.set()
        await asyncio.Event().wait()

    task = asyncio.create_task(hangs.invoke(ledger, key="c-1"))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    found = await ledger.get("c-1")
    assert found is not None
    assert found.status == ToolCallStatus.UNKNOWN
    assert found.owner == owner_id()
    with pytest.raises(ToolOutcomeUnknown):
        await hangs.invoke(ledger, key="c-1")
