"""What-if forks: a fork made with ``tools="dry"`` runs its handlers, and its side-effecting
tools do not run: each call is recorded in the ledger as ``dry`` with its arguments and
returns the tool's stand-in; a live fork's tools run for real."""

from __future__ import annotations

from typing import Any

import pytest

from agentsnap import (
    Agent,
    AgentState,
    ConfigurationError,
    Context,
    Message,
    Runtime,
    Snapshot,
    SnapshotStatus,
    tool,
)
from agentsnap.fork import TOOLS_KEY, MessageEdits, NewMessage, fork_snapshot
from agentsnap.inspect import fork_run, ledger_calls
from agentsnap.ledger import ToolCallStatus
from agentsnap.store import Store

SENT: list[dict[str, Any]] = []


@tool(
    side_effect=True,
    dry_run=lambda arguments: {"receipt": f"dry-{arguments['to']}"},
)
async def send_email(to: str, text: str) -> dict[str, str]:
    SENT.append({"to": to, "text": text})
    return {"receipt": f"sent-{to}-{len(SENT)}"}


class Relay(Agent[AgentState]):
    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        ctx.send("mailer", message.payload)


class Mailer(Agent[AgentState]):
    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        receipt = await send_email(ctx, to=str(message.payload), text="hello")
        ctx.state.memory[str(message.payload)] = dict(receipt)


def add_agents(runtime: Runtime) -> Mailer:
    runtime.add(Relay("relay"))
    return runtime.add(Mailer("mailer"))


async def cut_with_mail_in_flight(store: Store) -> Snapshot:
    async with Runtime(store=store) as original:
        add_agents(original)
        for n in range(3):
            original.send("relay", f"user{n}")
        handle = original.snapshot()
        await original.run_until_idle()
        cut = await handle
    assert cut.status is SnapshotStatus.COMPLETE
    assert any(c.dst == "mailer" for c in cut.channels), "mail in flight at the cut"
    return cut


def in_flight_to_mailer(cut: Snapshot) -> list[str]:
    return [str(m.payload) for c in cut.channels if c.dst == "mailer" for m in c.messages]


async def test_a_dry_fork_records_its_effects_and_sends_nothing(store: Store) -> None:
    SENT.clear()
    cut = await cut_with_mail_in_flight(store)
    sent_by_parent = len(SENT)
    flying = in_flight_to_mailer(cut)
    run = await fork_run(store, cut.id, tools="dry", name="what if")
    assert run.metadata[TOOLS_KEY] == "dry"
    async with Runtime(store=store, run_id=run.id) as fork:
        mailer = add_agents(fork)
        await fork.resume()
        await fork.run_until_idle()
        for to in flying:
            assert mailer.state.memory[to] == {"receipt": f"dry-{to}"}
        calls = [c for c in mailer.state.tool_calls if c.message_id is not None]
        dry = [c for c in calls if c.status == "dry"]
        assert len(dry) == len(flying)
        assert all(c.attempts == 0 for c in dry)
    assert len(SENT) == sent_by_parent, "a dry fork sends nothing"
    entries = await ledger_calls(store, run.id, fork.ledger if _memory(store) else None)
    assert sorted(str(e.arguments["to"]) for e in entries) == sorted(flying)
    assert {e.status for e in entries} == {ToolCallStatus.DRY}
    assert all(e.result == {"receipt": f"dry-{e.arguments['to']}"} for e in entries)


async def test_a_live_fork_sends_for_real(store: Store) -> None:
    SENT.clear()
    cut = await cut_with_mail_in_flight(store)
    sent_by_parent = len(SENT)
    flying = in_flight_to_mailer(cut)
    run = await fork_run(store, cut.id)
    assert TOOLS_KEY not in run.metadata
    async with Runtime(store=store, run_id=run.id) as fork:
        mailer = add_agents(fork)
        await fork.resume()
        await fork.run_until_idle()
        receipts = [mailer.state.memory[to] for to in flying]
        assert all(isinstance(r, dict) and str(r["receipt"]).startswith("sent-") for r in receipts)
    assert len(SENT) == sent_by_parent + len(flying)


class Twice(Agent[AgentState]):
    """Makes the same call twice under one key, as a handler re-executed after a crash does."""

    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        for _ in range(2):
            receipt = await send_email(
                ctx, key=f"mail:{message.payload}", to=str(message.payload), text="again"
            )
            ctx.state.memory["receipt"] = dict(receipt)


async def test_a_dry_call_made_again_gets_its_stand_in_and_nothing_runs(store: Store) -> None:
    SENT.clear()
    async with Runtime(store=store) as original:
        original.add(Twice("twice"))
        cut = await original.snapshot()
    run = await fork_run(
        store,
        cut.id,
        tools="dry",
        messages=MessageEdits(add=[NewMessage(src="$env", dst="twice", payload="ann")]),
    )
    async with Runtime(store=store, run_id=run.id) as fork:
        twice = fork.add(Twice("twice"))
        await fork.resume()
        await fork.run_until_idle()
    first, second = [c for c in twice.state.tool_calls if c.key == "mail:ann"]
    assert (first.status, first.replayed) == ("dry", False)
    assert (second.status, second.replayed) == ("dry", True)
    assert twice.state.memory["receipt"] == {"receipt": "dry-ann"}
    assert SENT == []
    (entry,) = await ledger_calls(store, run.id, fork.ledger if _memory(store) else None)
    assert entry.status is ToolCallStatus.DRY


def _memory(store: Store) -> bool:
    from agentsnap.store import MemoryStore

    return isinstance(store, MemoryStore)


async def test_a_dry_fork_is_refused_where_it_cannot_hold() -> None:
    from agentsnap.store import MemoryStore

    store = MemoryStore()
    cut = await cut_with_mail_in_flight(store)
    with pytest.raises(ConfigurationError, match='tools= is "live" or "dry"'):
        await fork_snapshot(store, cut, tools="maybe")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="dry_run= but not side_effect=True"):
        tool(dry_run=1)(lambda: 1)
