"""A fork's cut with its messages in flight edited, dropped or added, checked before anything
is written, and continued: the receiver gets exactly the messages the fork says."""

from __future__ import annotations

import math

import pytest
from pydantic import Field

from agentsnap import (
    Agent,
    AgentState,
    Context,
    MemoryStore,
    Message,
    Runtime,
    Snapshot,
    SnapshotStatus,
    StateInvalid,
)
from agentsnap.fork import MessageEdits, NewMessage
from agentsnap.inspect import fork_run
from agentsnap.messages import ENVIRONMENT, JsonValue
from agentsnap.store import Store


class Seen(AgentState):
    seen: list[JsonValue] = Field(default_factory=list)


class Collector(Agent[Seen]):
    async def handle(self, message: Message, ctx: Context[Seen]) -> None:
        self.state.seen.append(message.payload)


class Relay(Agent[AgentState]):
    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        ctx.send("c", message.payload)


class Quiet(Agent[AgentState]):
    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        return None


def add_agents(runtime: Runtime) -> Collector:
    runtime.add(Relay("f"))
    runtime.add(Quiet("q"))
    return runtime.add(Collector("c"))


async def cut_with_inputs_in_flight(store: Store) -> Snapshot:
    async with Runtime(store=store) as original:
        add_agents(original)
        for item in range(4):
            original.send("f", item)
        handle = original.snapshot()
        await original.run_until_idle()
        cut = await handle
    assert cut.status is SnapshotStatus.COMPLETE
    return cut


def in_flight(cut: Snapshot) -> list[tuple[str, JsonValue]]:
    return [
        (m.id, m.payload) for c in cut.channels if (c.src, c.dst) == ("f", "c") for m in c.messages
    ]


async def test_a_fork_drops_edits_and_adds_messages_in_flight(store: Store) -> None:
    cut = await cut_with_inputs_in_flight(store)
    flying = in_flight(cut)
    assert len(flying) >= 2, "the cut holds messages in flight"
    (dropped, _), (edited, _) = flying[0], flying[-1]
    edits = MessageEdits(
        drop=[dropped],
        edit={edited: {"edited": True}},
        add=[NewMessage(src="f", dst="c", payload="added", kind="note")],
    )
    run = await fork_run(store, cut.id, messages=edits)
    (first,) = await store.list_snapshots(run.id)
    # The fork's cut stays consistent: sent = received + in flight, seqs contiguous.
    received = first.agents["c"].received.get("f", 0)
    (channel,) = [c for c in first.channels if (c.src, c.dst) == ("f", "c")]
    assert [m.seq for m in channel.messages] == list(
        range(received + 1, received + len(channel.messages) + 1)
    )
    assert first.agents["f"].sent["c"] == received + len(channel.messages)
    assert [m.id for m in channel.messages] == [f"f>c#{m.seq}" for m in channel.messages]
    assert channel.messages[-1].kind == "note"
    # The parent's cut is not touched.
    assert in_flight(await store.load_snapshot(cut.id)) == flying

    recorded = list(Seen.model_validate_json(cut.agents["c"].state_json).seen)
    expected = recorded + [payload for _id, payload in flying[1:-1]] + [{"edited": True}, "added"]
    async with Runtime(store=store, run_id=run.id) as resumed:
        collector = add_agents(resumed)
        await resumed.resume()
        await resumed.run_until_idle()
        assert collector.state.seen == expected
        after = await resumed.snapshot()
    assert after.status is SnapshotStatus.COMPLETE


async def test_message_edits_are_checked_before_anything_is_written() -> None:
    store = MemoryStore()
    cut = await cut_with_inputs_in_flight(store)
    flying = in_flight(cut)
    runs = await store.list_runs()
    edits = MessageEdits(
        drop=["f>c#999", flying[0][0]],
        edit={flying[0][0]: 1, "nobody>c#1": 2, flying[-1][0]: math.nan},
        add=[
            NewMessage(src="ghost", dst="c", payload=1),
            NewMessage(src=ENVIRONMENT, dst="nowhere", payload=1),
            NewMessage(src="c", dst="c", payload=1),
        ],
    )
    with pytest.raises(StateInvalid) as raised:
        await fork_run(store, cut.id, messages=edits)
    text = " | ".join(p["message"] for p in raised.value.problems)
    assert str(raised.value).startswith("the message edits are not valid: ")
    for expected in (
        "drop names 'f>c#999', which is not in flight",
        "edit names 'nobody>c#1', which is not in flight",
        "the new payload is not JSON",
        "it is both dropped and edited",
        "its sender 'ghost' is not an agent of the cut",
        "its receiver 'nowhere' is not an agent of the cut",
        "an agent sends to itself",
    ):
        assert expected in text, expected
    assert len(raised.value.problems) == 7
    assert await store.list_runs() == runs


async def test_a_message_added_on_an_empty_channel_comes_after_what_was_received(
    store: Store,
) -> None:
    cut = await cut_with_inputs_in_flight(store)
    run = await fork_run(
        store,
        cut.id,
        messages=MessageEdits(add=[NewMessage(src="c", dst="q", payload={"hello": 1})]),
    )
    (first,) = await store.list_snapshots(run.id)
    (channel,) = [c for c in first.channels if (c.src, c.dst) == ("c", "q")]
    assert [m.id for m in channel.messages] == ["c>q#1"]
    assert first.agents["c"].sent == {**cut.agents["c"].sent, "q": 1}
