"""Requests to people inside one process: asking, answering, approvals, deadlines, rollback, fork.

The runtime runs on the default scheduler; answers come from another task through
``agentsnap.inspect`` (the runtime's ledger, as a program holding its run would), so the
waiting handler is woken in its own process.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, cast

import pytest

from agentsnap import (
    Agent,
    AgentState,
    AnswerInvalid,
    ApprovalDenied,
    ConfigurationError,
    Context,
    Message,
    RequestExpired,
    RequestNotPending,
    RequestRejected,
    RunStatus,
    Runtime,
    tool,
)
from agentsnap.inspect import answer, approve, deny, list_requests
from agentsnap.requests import Approval, HumanRequest
from agentsnap.store import MemoryStore
from agentsnap.store.ledger import MemoryLedger

REFUNDS: list[tuple[str, int]] = []


@tool(side_effect=True, approval=lambda arguments: arguments["amount"] > 100)
async def refund(order: str, amount: int) -> str:
    REFUNDS.append((order, amount))
    return f"refunded {amount} on {order}"


@tool(side_effect=True)
async def store_credit(order: str, amount: int) -> str:
    return f"credit {amount} on {order}"


class Refunder(Agent[AgentState]):
    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        payload = cast("dict[str, Any]", message.payload)
        order, amount = payload["order"], payload["amount"]
        try:
            self.state.memory[order] = await refund(ctx, order=order, amount=amount)
        except ApprovalDenied as denied:
            self.state.memory[order] = await store_credit(ctx, order=order, amount=amount)
            self.state.memory[f"{order}:why"] = denied.reason


class Asker(Agent[AgentState]):
    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        options = cast("dict[str, Any]", message.payload or {})
        try:
            self.state.memory["answer"] = await ctx.ask("Which colour?", **options)
        except (RequestRejected, RequestExpired) as exc:
            self.state.memory["error"] = type(exc).__name__


@pytest.fixture(autouse=True)
def no_refunds() -> None:
    REFUNDS.clear()


async def pending(
    runtime: Runtime, count: int = 1, where: Callable[[HumanRequest], bool] | None = None
) -> list[HumanRequest]:
    """Wait until the run has ``count`` pending requests; return them."""
    for _ in range(2000):
        found = await list_requests(
            runtime.store, runtime.run_id, pending=True, ledger=runtime.ledger
        )
        found = [r for r in found if where is None or where(r)]
        if len(found) >= count:
            return found
        await asyncio.sleep(0.005)
    raise AssertionError(f"fewer than {count} pending requests")


async def test_a_question_is_answered_and_the_handler_goes_on() -> None:
    async with Runtime() as runtime:
        asker = runtime.add(Asker("asker"))
        runtime.send("asker", {"schema": {"type": "string", "enum": ["red", "blue"]}, "who": "ops"})
        running = asyncio.create_task(runtime.run_until_idle())
        (request,) = await pending(runtime)
        assert request.question == "Which colour?"
        assert request.who == "ops"
        assert request.kind == "question"
        with pytest.raises(AnswerInvalid, match="not one of"):
            await answer(runtime.store, request.id, "green", ledger=runtime.ledger)
        done = await answer(runtime.store, request.id, "blue", by="ann", ledger=runtime.ledger)
        assert done.status == "answered"
        assert done.answered_by == "ann"
        await asyncio.wait_for(running, 10)
        assert asker.state.memory["answer"] == "blue"
        with pytest.raises(RequestNotPending, match="answered already"):
            await answer(runtime.store, request.id, "red", ledger=runtime.ledger)


async def test_two_pending_approvals_each_answer_reaches_its_own_call() -> None:
    async with Runtime() as runtime:
        refunder = runtime.add(Refunder("refunder"))
        runtime.add(Refunder("second"))
        runtime.send("refunder", {"order": "A-1", "amount": 500})
        runtime.send("second", {"order": "B-2", "amount": 700})
        running = asyncio.create_task(runtime.run_until_idle())
        requests = await pending(runtime, 2)
        by_order = {r.question["arguments"]["order"]: r for r in requests}  # type: ignore[index,call-overload]
        assert set(by_order) == {"A-1", "B-2"}
        assert by_order["A-1"].id != by_order["B-2"].id
        await deny(runtime.store, by_order["B-2"].id, "over the limit", ledger=runtime.ledger)
        await approve(runtime.store, by_order["A-1"].id, ledger=runtime.ledger)
        await asyncio.wait_for(running, 10)
        assert REFUNDS == [("A-1", 500)]
        assert refunder.state.memory["A-1"] == "refunded 500 on A-1"
        second = runtime.agents["second"]
        assert second.state.memory["B-2"] == "credit 700 on B-2"
        assert second.state.memory["B-2:why"] == "over the limit"
        (denied_call, credit) = second.state.tool_calls
        assert denied_call.status == "error"
        assert "over the limit" in (denied_call.error or "")
        assert credit.status == "ok"


async def test_a_call_the_predicate_lets_through_asks_nobody() -> None:
    async with Runtime() as runtime:
        runtime.add(Refunder("refunder"))
        runtime.send("refunder", {"order": "C-3", "amount": 20})
        await asyncio.wait_for(runtime.run_until_idle(), 10)
        assert REFUNDS == [("C-3", 20)]
        assert await list_requests(runtime.store, runtime.run_id, ledger=runtime.ledger) == []


async def test_a_runtime_policy_asks_for_a_tool_that_declares_no_approval() -> None:
    async with Runtime(approvals={"store_credit": Approval(who="finance")}) as runtime:
        runtime.add(Refunder("refunder"))
        runtime.send("refunder", {"order": "D-4", "amount": 20})
        running = asyncio.create_task(runtime.run_until_idle())
        await asyncio.sleep(0.05)
        assert REFUNDS == [("D-4", 20)]  # refund needs none under 100
        runtime.send("refunder", {"order": "D-5", "amount": 200})
        (first,) = await pending(runtime)
        await deny(runtime.store, first.id, "no", ledger=runtime.ledger)
        (second,) = await pending(runtime, where=lambda r: r.id != first.id)
        assert second.who == "finance"
        assert second.question["tool"] == "store_credit"  # type: ignore[index,call-overload]
        await approve(runtime.store, second.id, ledger=runtime.ledger)
        await asyncio.wait_for(running, 10)


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"deadline": 0.05, "on_deadline": "default", "default": "grey"}, ("answer", "grey")),
        ({"deadline": 0.05, "on_deadline": "reject"}, ("error", "RequestRejected")),
        ({"deadline": 0.05, "on_deadline": "fail"}, ("error", "RequestExpired")),
    ],
)
async def test_a_deadline_applies_its_declared_outcome(
    options: dict[str, Any], expected: tuple[str, str]
) -> None:
    async with Runtime() as runtime:
        asker = runtime.add(Asker("asker"))
        runtime.send("asker", options)
        await asyncio.wait_for(runtime.run_until_idle(), 10)
        key, value = expected
        assert asker.state.memory[key] == value
        (request,) = await list_requests(runtime.store, runtime.run_id, ledger=runtime.ledger)
        assert request.status == ("rejected" if value == "RequestRejected" else "expired")
        assert request.answered_by == "deadline"
        with pytest.raises(RequestNotPending):
            await answer(runtime.store, request.id, "late", ledger=runtime.ledger)


async def test_a_question_turned_down_raises_in_the_handler() -> None:
    async with Runtime() as runtime:
        asker = runtime.add(Asker("asker"))
        runtime.send("asker", {"deadline": 300})
        running = asyncio.create_task(runtime.run_until_idle())
        (request,) = await pending(runtime)
        assert request.deadline is not None
        await deny(runtime.store, request.id, "not mine to say", ledger=runtime.ledger)
        await asyncio.wait_for(running, 10)
        assert asker.state.memory["error"] == "RequestRejected"


class Gate(Agent[AgentState]):
    """Asks before passing the message on; the downstream critic rejects the first pass."""

    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        verdict = await ctx.ask({"pass": message.payload})
        verdicts = cast("list[Any]", self.state.memory.get("verdicts", []))
        self.state.memory["verdicts"] = [*verdicts, verdict]


async def test_a_rollback_withdraws_the_pending_request_and_the_redo_asks_again() -> None:
    async with Runtime() as runtime:
        gate = runtime.add(Gate("gate"))
        runtime.send("gate", "order 7")
        running = asyncio.create_task(runtime.run_until_idle())
        (first,) = await pending(runtime)
        snapshot = await runtime.snapshot()  # taken while the handler waits: holds the request
        assert any(m.id == first.message_id for c in snapshot.channels for m in c.messages)
        await runtime.rollback(snapshot.id, reason="start over")
        (withdrawn,) = [
            r
            for r in await list_requests(runtime.store, runtime.run_id, ledger=runtime.ledger)
            if r.id == first.id
        ]
        assert withdrawn.status == "withdrawn"
        assert str(withdrawn.answered_by).startswith("rollback")
        with pytest.raises(RequestNotPending, match=r"withdrawn.*rollback"):
            await answer(runtime.store, first.id, "yes", ledger=runtime.ledger)
        (again,) = await pending(runtime)
        assert again.id != first.id
        assert (again.timeline, again.message_id) == (1, first.message_id)
        await answer(runtime.store, again.id, "yes", ledger=runtime.ledger)
        await asyncio.wait_for(running, 10)
        assert gate.state.memory["verdicts"] == ["yes"]


async def test_a_fork_from_a_cut_holding_a_pending_request_carries_it() -> None:
    store, ledger = MemoryStore(), MemoryLedger()
    async with Runtime(store=store, ledger=ledger) as runtime:
        runtime.add(Gate("gate"))
        runtime.send("gate", "order 8")
        running = asyncio.create_task(runtime.run_until_idle())
        (asked,) = await pending(runtime)
        snapshot = await runtime.snapshot()
        running.cancel()
    async with Runtime(store=store, ledger=ledger) as fork:
        gate = fork.add(Gate("gate"))
        await fork.fork_from(snapshot.id)
        (carried,) = await list_requests(store, fork.run_id, ledger=ledger)
        assert carried.run_id == fork.run_id
        assert carried.pending
        assert (carried.question, carried.message_id) == (asked.question, asked.message_id)
        running = asyncio.create_task(fork.run_until_idle())
        await answer(store, carried.id, "forked yes", ledger=ledger)
        await asyncio.wait_for(running, 10)
        assert gate.state.memory["verdicts"] == ["forked yes"]
        assert len(await list_requests(store, fork.run_id, ledger=ledger)) == 1
    (original,) = await list_requests(store, runtime.run_id, ledger=ledger)
    assert original.pending  # the original run is not touched


async def test_asking_outside_a_handler_is_a_clear_error() -> None:
    async with Runtime() as runtime:
        runtime.add(Asker("asker"))
        with pytest.raises(ConfigurationError, match="from a handler"):
            await runtime.context("asker").ask("hello?")


async def test_a_runtime_closed_while_a_handler_waits_leaves_its_run_interrupted() -> None:
    store, ledger = MemoryStore(), MemoryLedger()
    async with Runtime(store=store, ledger=ledger) as runtime:
        runtime.add(Gate("gate"))
        runtime.send("gate", "order 9")
        running = asyncio.create_task(runtime.run_until_idle())
        (asked,) = await pending(runtime)
        running.cancel()
    run = await store.get_run(runtime.run_id)
    assert run.status == RunStatus.INTERRUPTED
    assert "waited for a person" in (run.status_reason or "")
    await answer(store, asked.id, "later", ledger=ledger)
    async with Runtime(store=store, ledger=ledger, run_id=runtime.run_id) as again:
        gate = again.add(Gate("gate"))
        await again.resume()
        await asyncio.wait_for(again.run_until_idle(), 10)
        assert gate.state.memory["verdicts"] == ["later"]
    assert (await store.get_run(runtime.run_id)).status == RunStatus.SUCCEEDED
