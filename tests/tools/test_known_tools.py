"""A runtime knows the tools its agents call: one tool per name, compensated at close."""

from __future__ import annotations

import pytest

from agentsnap import (
    Agent,
    AgentState,
    ConfigurationError,
    Context,
    HandlerFailed,
    LedgerEntry,
    Message,
    Runtime,
    Tool,
    ToolCallStatus,
    tool,
)
from agentsnap.once import KnownTools
from agentsnap.store.ledger import MemoryLedger

REFUNDS: list[str] = []


def refund(entry: LedgerEntry) -> str:
    REFUNDS.append(entry.key)
    return "refunded"


@pytest.fixture(autouse=True)
def _clear() -> None:
    REFUNDS.clear()


def lookup_named(name: str, answer: str) -> Tool[str]:
    @tool(name=name)
    def lookup(query: str) -> str:
        return answer

    return lookup


class Caller(Agent[AgentState]):
    """Calls each of its tools once per message."""

    def __init__(self, name: str, *tools: Tool[str]) -> None:
        super().__init__(name)
        self.tools = tools

    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        for each in self.tools:
            self.state.memory[each.name] = await each(ctx, query="q")


async def test_two_tools_with_one_name_in_one_runtime_are_refused() -> None:
    first, second = lookup_named("lookup", "a"), lookup_named("lookup", "b")
    async with Runtime() as runtime:
        runtime.add(Caller("one", first))
        runtime.add(Caller("two", second))
        runtime.send("one", None)
        await runtime.run_until_idle()
        runtime.send("two", None)
        with pytest.raises(HandlerFailed) as failed:
            await runtime.run_until_idle()
    assert runtime.agents["one"].state.memory == {"lookup": "a"}
    assert runtime.agents["two"].state.memory == {}
    assert runtime.failures == [failed.value]
    refused = failed.value.__cause__
    assert isinstance(refused, ConfigurationError)
    assert "two different tools are named 'lookup' in one runtime" in str(refused)
    assert "lookup_named.<locals>.lookup" in str(refused)
    assert runtime.tools["lookup"] is first


async def test_declaring_a_second_tool_of_a_known_name_is_refused() -> None:
    first, second = lookup_named("lookup", "a"), lookup_named("lookup", "b")
    known = KnownTools([first])
    known.add(first)  # the same tool again is fine
    with pytest.raises(ConfigurationError, match=r"@tool\(name=\.\.\.\)"):
        known.add(second)
    assert dict(known) == {"lookup": first}


async def test_tools_of_one_name_in_different_runtimes_are_independent() -> None:
    first, second = lookup_named("lookup", "a"), lookup_named("lookup", "b")
    answers = []
    for each in (first, second):
        async with Runtime() as runtime:
            runtime.add(Caller("caller", each))
            runtime.send("caller", None)
            await runtime.run_until_idle()
        assert runtime.failures == []
        assert runtime.tools["lookup"] is each
        answers.append(runtime.agents["caller"].state.memory["lookup"])
    assert answers == ["a", "b"]


@tool(side_effect=True, name="declared_charge", compensate=refund)
async def charge(amount: int) -> str:
    return f"charged {amount}"


@pytest.mark.parametrize("declared", [True, False])
async def test_a_declared_tool_is_compensated_at_close_without_being_called(
    declared: bool,
) -> None:
    # An effect of the run that no final state holds (a path a rollback discarded, made by
    # an earlier process): only a runtime that knows its tool can compensate it.
    ledger = MemoryLedger()
    runtime = Runtime(ledger=ledger)
    await charge.invoke(ledger, key="earlier", run_id=runtime.run_id, amount=5)
    if declared:
        runtime.tools.add(charge)
    async with runtime:
        pass
    entry = await ledger.get("earlier")
    assert entry is not None
    if declared:
        assert REFUNDS == ["earlier"]
        assert entry.status == ToolCallStatus.COMPENSATED
    else:
        assert REFUNDS == []
        assert entry.status == ToolCallStatus.ABANDONED
