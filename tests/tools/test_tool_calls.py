"""``@tool`` from handlers: validation, derived keys, the history in agent state, bad uses."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from payloads import get
from pydantic import BaseModel

from agentsnap import (
    Agent,
    AgentState,
    ConfigurationError,
    Context,
    Message,
    Runtime,
    ToolArgumentsInvalid,
    ToolCall,
    ToolFailed,
    tool,
)
from agentsnap.ledger import Ledger, call_key, fingerprint
from agentsnap.store.ledger import MemoryLedger


class Receipt(BaseModel):
    charge_id: str
    amount: int


CHARGED: list[int] = []


@tool(side_effect=True, name="calls_charge")
async def charge(call: ToolCall, card: str, amount: int, currency: str = "EUR") -> Receipt:
    CHARGED.append(amount)
    return Receipt(charge_id=f"ch-{call.key}", amount=amount)


@tool(name="calls_lookup")
def lookup(city: str) -> dict[str, Any]:
    """A plain (sync, no side effects) tool: runs in a worker thread."""
    return {"city": city, "thread": threading.current_thread() is not threading.main_thread()}


class Shopper(Agent[AgentState]):
    """Charges twice per order (the deposit, then the rest), then looks something up."""

    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        total = get(message.payload, "total", int)
        deposit = await charge(ctx, card="4242", amount=total // 2)
        rest = await charge(ctx, card="4242", amount=total - total // 2)
        found = await lookup(ctx, city="Lyon")
        self.state.memory[message.id] = [deposit.charge_id, rest.charge_id, found["thread"]]


async def run_orders(ledger: Ledger, run_id: str, totals: list[int]) -> Shopper:
    async with Runtime(run_id=run_id, ledger=ledger) as runtime:
        shopper = Shopper("shopper")
        runtime.add(shopper)
        for total in totals:
            runtime.send("shopper", {"total": total})
        await runtime.run_until_idle()
    return shopper


@pytest.fixture(autouse=True)
def _no_charges() -> None:
    CHARGED.clear()


async def test_calls_are_recorded_in_the_agent_state(ledger: Ledger) -> None:
    shopper = await run_orders(ledger, "run-1", [100, 31])
    calls = shopper.state.tool_calls
    assert [(c.tool, c.message_id) for c in calls] == [
        ("calls_charge", "$env>shopper#1"),
        ("calls_charge", "$env>shopper#1"),
        ("calls_lookup", "$env>shopper#1"),
        ("calls_charge", "$env>shopper#2"),
        ("calls_charge", "$env>shopper#2"),
        ("calls_lookup", "$env>shopper#2"),
    ]
    first = calls[0]
    assert first.arguments == {"card": "4242", "amount": 50, "currency": "EUR"}
    assert first.status == "ok"
    assert first.attempts == 1
    assert first.fingerprint == fingerprint(first.arguments)
    assert first.result == {"charge_id": f"ch-{first.key}", "amount": 50}
    assert calls[2].key is None, "a tool without side effects has no key"
    assert calls[2].result == {"city": "Lyon", "thread": True}
    assert CHARGED == [50, 50, 15, 16]


async def test_derived_keys_follow_the_call_and_its_place_among_the_tools_calls(
    ledger: Ledger,
) -> None:
    shopper = await run_orders(ledger, "run-2", [100])
    deposit, rest = shopper.state.tool_calls[:2]
    assert deposit.key == call_key("run-2", "shopper", "$env>shopper#1", "calls_charge", 0)
    assert rest.key == call_key("run-2", "shopper", "$env>shopper#1", "calls_charge", 1)
    assert deposit.key != rest.key, "same arguments, another index: another effect"
    recorded = {entry.key: entry for entry in await ledger.list_calls("run-2")}
    assert set(recorded) == {deposit.key, rest.key}
    assert recorded[deposit.key].agent == "shopper"
    assert recorded[deposit.key].message_id == "$env>shopper#1"


async def test_the_same_run_re_executed_gets_recorded_results(ledger: Ledger) -> None:
    first = await run_orders(ledger, "run-3", [100])
    again = await run_orders(ledger, "run-3", [100])  # e.g. a resumed process
    assert CHARGED == [50, 50], "the second execution charged nothing"
    assert [c.key for c in again.state.tool_calls] == [c.key for c in first.state.tool_calls]
    assert [c.status for c in again.state.tool_calls] == ["replayed", "replayed", "ok"]
    assert [c.replayed for c in again.state.tool_calls] == [True, True, False]
    assert [c.replayed for c in first.state.tool_calls] == [False, False, False]
    # One number: the ledger's attempts, whether the call ran or was replayed.
    recorded = {entry.key: entry.attempts for entry in await ledger.list_calls("run-3")}
    assert [c.attempts for c in again.state.tool_calls[:2]] == [
        recorded[c.key or ""] for c in again.state.tool_calls[:2]
    ]
    assert [c.attempts for c in again.state.tool_calls] == [1, 1, 1]
    # The recorded result comes back as the declared type.
    assert again.state.memory == first.state.memory

    await run_orders(ledger, "run-4", [100])  # another run: other keys
    assert CHARGED == [50, 50, 50, 50]


async def test_snapshots_carry_the_tool_call_history() -> None:
    async with Runtime() as runtime:
        runtime.add(Shopper("shopper"))
        runtime.send("shopper", {"total": 10})
        await runtime.run_until_idle()
        snapshot = await runtime.snapshot()
    calls = get(snapshot.agents["shopper"].state, "tool_calls", list)
    assert [get(c, "tool", str) for c in calls] == ["calls_charge", "calls_charge", "calls_lookup"]
    assert get(calls[0], "key", str) == runtime.agents["shopper"].state.tool_calls[0].key
    assert get(calls[0], "status", str) == "ok"


async def test_arguments_are_validated_before_anything_runs() -> None:
    ledger = MemoryLedger()
    with pytest.raises(ToolArgumentsInvalid, match="amount: Input should be a valid integer"):
        await charge.invoke(ledger, key="k", card="4242", amount="a lot")
    with pytest.raises(ToolArgumentsInvalid, match="colour: Extra inputs are not permitted"):
        await charge.invoke(ledger, key="k", card="4242", amount=1, colour="red")
    with pytest.raises(ToolArgumentsInvalid, match="card: Field required"):
        await charge.invoke(ledger, key="k", amount=1)
    assert CHARGED == []
    assert await ledger.list_calls() == []


async def test_a_side_effect_outside_a_handler_needs_a_key() -> None:
    async with Runtime() as runtime:
        runtime.add(Shopper("shopper"))
        ctx = runtime.context("shopper")
        with pytest.raises(ConfigurationError, match="outside a handler without an idempotency"):
            await charge(ctx, card="4242", amount=5)
        with pytest.raises(ConfigurationError, match="outside a handler without an idempotency"):
            await charge.invoke(runtime.ledger, card="4242", amount=5)
        assert CHARGED == []
        receipt = await charge(ctx, key="order-77", card="4242", amount=5)
        assert receipt.charge_id == "ch-order-77"
        (call,) = runtime.agents["shopper"].state.tool_calls
        assert (call.key, call.message_id) == ("order-77", None)


async def test_bad_keys_and_bad_tools_are_refused() -> None:
    ledger = MemoryLedger()
    with pytest.raises(ConfigurationError, match="1 to 255 characters"):
        await charge.invoke(ledger, key="", card="4242", amount=5)
    with pytest.raises(ConfigurationError, match="takes no key="):
        await lookup.invoke(ledger, key="x", city="Lyon")

    with pytest.raises(ConfigurationError, match="reserved for the idempotency key"):

        @tool
        async def bad_key(key: str) -> None: ...

    with pytest.raises(ConfigurationError, match=r"\*args or \*\*kwargs"):

        @tool
        async def bad_args(*amounts: int) -> None: ...

    with pytest.raises(ConfigurationError, match="must be the first parameter"):

        @tool
        async def bad_call(amount: int, call: ToolCall) -> None: ...

    with pytest.raises(ConfigurationError, match="compensate= but not side_effect=True"):
        tool(compensate=lambda entry: None)(lambda: None)


async def test_parameters_may_shadow_pydantic_names() -> None:
    @tool(name="odd_names")
    async def odd_names(json: str, schema: int, model_config: bool = False) -> list[object]:
        return [json, schema, model_config]

    assert await odd_names.invoke(None, json="j", schema=1) == ["j", 1, False]


async def test_a_result_that_is_not_json_fails_and_is_recorded() -> None:
    runs = 0

    @tool(side_effect=True, name="returns_a_set")
    async def returns_a_set() -> Any:
        nonlocal runs
        runs += 1
        return {1, object()}

    ledger = MemoryLedger()
    with pytest.raises(ToolFailed, match="not JSON"):
        await returns_a_set.invoke(ledger, key="s")
    with pytest.raises(ToolFailed, match="not JSON") as again:
        await returns_a_set.invoke(ledger, key="s")
    assert again.value.replayed
    assert runs == 1, "the effect happened once; its unstorable result is not a reason to redo it"


async def test_a_failed_call_is_recorded_as_an_error_in_the_state() -> None:
    @tool(side_effect=True, name="always_declines")
    async def always_declines(card: str) -> None:
        raise ValueError(f"card {card} declined")

    class Payer(Agent[AgentState]):
        async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
            try:
                await always_declines(ctx, card="0000")
            except ToolFailed as exc:
                self.state.memory["error"] = exc.error_type

    async with Runtime() as runtime:
        payer = runtime.add(Payer("payer"))
        runtime.send("payer", None)
        await runtime.run_until_idle()
    (call,) = payer.state.tool_calls
    assert (call.status, call.error, call.attempts) == (
        "error",
        "ValueError: card 0000 declined",
        1,
    )
    assert payer.state.memory == {"error": "ValueError"}


async def test_concurrent_calls_in_one_handler_get_distinct_keys() -> None:
    class Fanout(Agent[AgentState]):
        async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
            await asyncio.gather(*(charge(ctx, card="4242", amount=1) for _ in range(3)))

    async with Runtime() as runtime:
        fanout = runtime.add(Fanout("fanout"))
        runtime.send("fanout", None)
        await runtime.run_until_idle()
    keys = [call.key for call in fanout.state.tool_calls]
    assert len(set(keys)) == 3
    assert CHARGED == [1, 1, 1]


async def test_a_call_cut_short_by_closing_the_runtime_is_not_left_running() -> None:
    started = asyncio.Event()

    @tool(side_effect=True, name="never_returns")
    async def never_returns() -> None:
        started.set()
        await asyncio.Event().wait()

    class Caller(Agent[AgentState]):
        async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
            await never_returns(ctx)

    runtime = Runtime()
    async with runtime:
        caller = runtime.add(Caller("caller"))
        runtime.send("caller", None)
        await started.wait()
    (call,) = caller.state.tool_calls
    assert (call.status, call.error) == ("error", "CancelledError")
    (entry,) = await runtime.ledger.list_calls()
    assert entry.status == "unknown", "whether it had its effect is not known"


def test_tool_options_keep_their_defaults_and_refuse_unknown_keywords() -> None:
    @tool
    def plain(x: int) -> int:
        return x

    @tool(side_effect=True, lease=5.0, on_redo="new", description="Charges.")
    def charged(x: int) -> int:
        return x

    assert (plain.name, plain.side_effect, plain.transient, plain.lease, plain.wait) == (
        "plain",
        False,
        (),
        60.0,
        10.0,
    )
    assert (plain.on_redo, plain.on_divergence, plain.key_from, plain.dry_run) == (
        "recorded",
        "raise",
        None,
        None,
    )
    assert (charged.side_effect, charged.lease, charged.on_redo, charged.description) == (
        True,
        5.0,
        "new",
        "Charges.",
    )
    with pytest.raises(TypeError, match=r"tool\(\) got an unexpected keyword argument 'leese'"):
        tool(leese=5.0)  # type: ignore[call-overload]
    with pytest.raises(TypeError, match="unexpected keyword argument 'side_effects'"):
        tool(plain.fn, side_effects=True)  # type: ignore[call-overload]
