"""Compiled LangGraph graphs as agents: replies, snapshots, rollback, resume, fork and tools.

The graph here keeps a list of notes (appended by a reducer) and their count, so that where
the graph continues from shows in its values. The central property: after a rollback the
graph continues exactly as a fresh run from the restored state would.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph_graphs import Notes, count_notes, notes_graph
from postgres_db import postgres_url_or_skip
from pydantic import BaseModel, Field

from agentsnap import (
    Agent,
    AgentState,
    ConfigurationError,
    Context,
    HandlerFailed,
    Message,
    Runtime,
    SnapshotPolicy,
    tool,
)
from agentsnap.integrations.langgraph import (
    AgentsnapSaver,
    CheckpointMissing,
    GraphAgent,
    GraphState,
    Outgoing,
    current_context,
    langchain_tool,
)
from agentsnap.store.sql import SqlStore


class InboxState(AgentState):
    replies: list[Any] = Field(default_factory=list)


class Inbox(Agent[InboxState]):
    """Forwards the environment's notes to the graph agent and keeps its replies."""

    async def handle(self, message: Message, ctx: Context[InboxState]) -> None:
        if message.kind == "result":
            self.state.replies.append(message.payload)
        else:
            ctx.send("graph", {"notes": [message.payload]})


async def feed(runtime: Runtime, *notes: str) -> None:
    for note in notes:
        runtime.send("inbox", note)
        await runtime.run_until_idle()


async def test_each_message_runs_the_graph_and_the_result_goes_back() -> None:
    async with Runtime() as runtime:
        runtime.add(Inbox("inbox"))
        agent = runtime.add(GraphAgent("graph", notes_graph()))
        assert isinstance(agent, GraphAgent)
        await feed(runtime, "a", "b")
        inbox = runtime.agents["inbox"].state
        assert isinstance(inbox, InboxState)
        assert inbox.replies == [
            {"notes": ["a"], "count": 1},
            {"notes": ["a", "b"], "count": 2},
        ]
        assert agent.state.thread_id == f"{runtime.run_id}:graph"
        assert agent.state.values == {"notes": ["a", "b"], "count": 2}
        latest = await agent.graph.aget_state(
            {"configurable": {"thread_id": agent.state.thread_id}}
        )
        assert latest.config["configurable"]["checkpoint_id"] == agent.state.checkpoint_id


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def checkpointer(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """LangGraph's in-memory checkpointer, and AgentsnapSaver on SQLite and PostgreSQL."""
    if request.param == "memory":
        yield None  # the graph agent's default
        return
    url = f"sqlite:///{tmp_path / 'lg.db'}" if request.param == "sqlite" else postgres_url_or_skip()
    saver = AgentsnapSaver(url)
    try:
        yield saver
    finally:
        saver.close()


async def test_rollback_continues_like_a_fresh_run_from_the_restored_state(
    checkpointer: Any,
) -> None:
    async with Runtime() as runtime:
        runtime.add(Inbox("inbox"))
        agent = runtime.add(GraphAgent("graph", notes_graph(), checkpointer=checkpointer))
        assert isinstance(agent, GraphAgent)
        await feed(runtime, "a")
        cut = await runtime.snapshot()
        restored = agent.state.model_copy(deep=True)
        await feed(runtime, "b")
        # Make the graph's checkpoint diverge from the agent's: only a restore brings it back.
        await agent.graph.aupdate_state(
            {"configurable": {"thread_id": agent.state.thread_id}}, {"notes": ["stray"]}
        )
        await runtime.rollback(cut.id)
        assert agent.state == restored
        # The rollback replays the environment's input sent after the cut ("b"), then "c".
        await feed(runtime, "c")
        rolled_back = agent.state.values
        history = [
            s
            async for s in agent.graph.aget_state_history(
                {"configurable": {"thread_id": agent.state.thread_id}}
            )
        ]

    async with Runtime() as fresh:
        fresh.add(Inbox("inbox"))
        straight = fresh.add(GraphAgent("graph", notes_graph()))
        await feed(fresh, "a", "b", "c")
        assert rolled_back == straight.state.values == {"notes": ["a", "b", "c"], "count": 3}
    # The abandoned branch stays in the thread's history, as LangGraph's time travel keeps it:
    # the restored checkpoint has two children.
    children = [
        s
        for s in history
        if s.parent_config
        and s.parent_config["configurable"]["checkpoint_id"] == restored.checkpoint_id
    ]
    assert len(children) == 2
    assert any(s.values.get("notes") == ["a", "b", "stray"] for s in history)


async def test_rollback_to_before_the_first_message_starts_a_fresh_thread() -> None:
    async with Runtime() as runtime:  # the default policy snapshots at the first input
        runtime.add(Inbox("inbox"))
        agent = runtime.add(GraphAgent("graph", notes_graph()))
        assert isinstance(agent, GraphAgent)
        await feed(runtime, "a", "b")
        first = (await runtime.list_snapshots())[0]
        await runtime.rollback(first.id)
        assert agent.state.checkpoint_id is None
        # The environment's "a" and "b" are replayed, then "z": the graph starts empty on a
        # new thread, and the first thread keeps its history.
        await feed(runtime, "z")
        assert agent.state.values == {"notes": ["a", "b", "z"], "count": 3}
        assert agent.state.thread_id == f"{runtime.run_id}:graph:2"
        first_thread = await agent.graph.aget_state(
            {"configurable": {"thread_id": f"{runtime.run_id}:graph"}}
        )
        assert first_thread.values == {"notes": ["a", "b"], "count": 2}


class Revising(GraphAgent):
    """Passes the reasons of rejections to its graph as notes."""

    def graph_input(self, message: Message, ctx: Context[GraphState]) -> Any:
        notes = [f"feedback: {f.reason}" for f in self.unseen_feedback(ctx)]
        notes.append(message.payload_as(dict[str, str])["note"])
        return {"notes": notes}

    def graph_outputs(
        self, result: Any, message: Message, ctx: Context[GraphState]
    ) -> Sequence[Outgoing]:
        return [Outgoing("critic", result, "draft")]


class NotesPayload(BaseModel):
    notes: list[str]


class CriticState(AgentState):
    accepted: list[Any] = Field(default_factory=list)


class Critic(Agent[CriticState]):
    async def handle(self, message: Message, ctx: Context[CriticState]) -> None:
        notes = message.payload_as(NotesPayload).notes
        if not any(note.startswith("feedback:") for note in notes):
            ctx.reject("writer", "cite your sources")
        self.state.accepted.append(message.payload)


async def test_a_rejected_graph_output_rolls_the_graph_back_and_the_retry_sees_why() -> None:
    async with Runtime() as runtime:
        writer = runtime.add(Revising("writer", notes_graph()))
        critic = runtime.add(Critic("critic"))
        assert isinstance(writer, Revising)
        runtime.send("writer", {"note": "draft"})
        await runtime.run_until_idle()
        assert [r.reason for r in runtime.rollbacks] == ["cite your sources"]
        # The retry ran from the restored (empty) graph: the rejected draft is not in it.
        assert writer.state.values == {
            "notes": ["feedback: cite your sources", "draft"],
            "count": 2,
        }
        assert critic.state.accepted == [writer.state.values]
        # The graph has seen the feedback: the next message does not repeat it.
        runtime.send("writer", {"note": "second"})
        await runtime.run_until_idle()
        assert writer.state.values["notes"] == [
            "feedback: cite your sources",
            "draft",
            "second",
        ]
        assert writer.state.feedback_seen == 1


class Strict(Agent[CriticState]):
    async def handle(self, message: Message, ctx: Context[CriticState]) -> None:
        notes = message.payload_as(NotesPayload).notes
        if "bad" in notes and not any(note.startswith("feedback:") for note in notes):
            ctx.reject("writer", "no bad notes")
        self.state.accepted.append(message.payload)


async def test_a_retry_from_a_checkpoint_keeps_its_own_values(checkpointer: Any) -> None:
    # The retry continues the same thread from the checkpoint of the cut, so its values
    # and the abandoned attempt's stand at the same step of two branches.
    async with Runtime() as runtime:
        writer = runtime.add(Revising("writer", notes_graph(), checkpointer=checkpointer))
        runtime.add(Strict("critic"))
        assert isinstance(writer, Revising)
        runtime.send("writer", {"note": "good"})
        await runtime.run_until_idle()
        cut = await runtime.snapshot()
        runtime.send("writer", {"note": "bad"})
        await runtime.run_until_idle()
        assert [r.snapshot_id for r in runtime.rollbacks] == [cut.id]
        expected = {"notes": ["good", "feedback: no bad notes", "bad"], "count": 3}
        assert writer.state.values == expected
        assert writer.state.thread_id == f"{runtime.run_id}:writer"
        latest = await writer.graph.aget_state(
            {"configurable": {"thread_id": writer.state.thread_id}}
        )
        assert latest.values == expected


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'agentsnap.db'}"
    return postgres_url_or_skip()


async def test_resume_in_a_new_process_continues_the_graph(database: str) -> None:
    store = SqlStore(database)
    saver = AgentsnapSaver(database)
    try:
        async with Runtime(store=store) as first:
            first.add(Inbox("inbox"))
            first.add(GraphAgent("graph", notes_graph(), checkpointer=saver))
            await feed(first, "a", "b")
            snapshot = await first.snapshot()
        # A new runtime with new agent objects, as a new process would build them.
        async with Runtime(store=store) as second:
            second.add(Inbox("inbox"))
            agent = second.add(GraphAgent("graph", notes_graph(), checkpointer=saver))
            await second.fork_from(snapshot.id)
            await feed(second, "c")
            assert agent.state.values == {"notes": ["a", "b", "c"], "count": 3}
    finally:
        await store.close()
        saver.close()


async def test_a_fork_copies_the_graph_into_its_own_thread(database: str) -> None:
    store = SqlStore(database)
    saver = AgentsnapSaver(database)
    try:
        async with Runtime(store=store) as original:
            original.add(Inbox("inbox"))
            source = original.add(GraphAgent("graph", notes_graph(), checkpointer=saver))
            await feed(original, "a")
            cut = await original.snapshot()
            await feed(original, "b")
            source_thread = source.state.thread_id
        async with Runtime(store=store) as fork:
            fork.add(Inbox("inbox"))
            agent = fork.add(GraphAgent("graph", notes_graph(), checkpointer=saver))
            assert isinstance(agent, GraphAgent)
            await fork.fork_from(cut.id)
            await feed(fork, "x")
            assert agent.state.values == {"notes": ["a", "x"], "count": 2}
            assert agent.state.thread_id == f"{fork.run_id}:graph"
        # The original thread is untouched by the fork.
        latest = saver.get_tuple({"configurable": {"thread_id": source_thread}})
        assert latest is not None
        assert latest.checkpoint["channel_values"]["notes"] == ["a", "b"]
    finally:
        await store.close()
        saver.close()


async def test_a_checkpoint_lost_with_an_in_memory_checkpointer_is_a_clear_error(
    tmp_path: Path,
) -> None:
    store = SqlStore(f"sqlite:///{tmp_path / 'agentsnap.db'}")
    try:
        async with Runtime(store=store) as first:
            first.add(Inbox("inbox"))
            first.add(GraphAgent("graph", notes_graph()))
            await feed(first, "a")
            snapshot = await first.snapshot()
        async with Runtime(store=store) as second:
            second.add(Inbox("inbox"))
            second.add(GraphAgent("graph", notes_graph()))  # a new, empty InMemorySaver
            await second.fork_from(snapshot.id)
            second.send("inbox", "b")
            with pytest.raises(HandlerFailed) as failed:
                await second.run_until_idle()
        cause = failed.value.__cause__
        assert isinstance(cause, CheckpointMissing)
        assert "persistent checkpointer" in str(cause)
        assert "AgentsnapSaver" in str(cause)
    finally:
        await store.close()


# -- tools inside the graph ----------------------------------------------------------------

SHIPPED: list[str] = []


@tool(side_effect=True)
async def ship(order: str, quantity: int) -> dict[str, Any]:
    """Ship an order to the customer."""
    SHIPPED.append(order)
    return {"shipment": len(SHIPPED), "order": order, "quantity": quantity}


def shipping_graph(model: FakeMessagesListChatModel) -> Any:
    async def call_model(state: MessagesState) -> dict[str, list[BaseMessage]]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("model", call_model)
    builder.add_node("tools", ToolNode([langchain_tool(ship)]))
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", tools_condition)
    builder.add_edge("tools", "model")
    return builder.compile()


class Shipper(GraphAgent):
    def graph_input(self, message: Message, ctx: Context[GraphState]) -> Any:
        return {"messages": [HumanMessage(message.payload_as(dict[str, str])["request"])]}

    def graph_outputs(
        self, result: Any, message: Message, ctx: Context[GraphState]
    ) -> Sequence[Outgoing]:
        return [Outgoing("checker", {"answer": result["messages"][-1].content}, "answer")]


class Checker(Agent[CriticState]):
    async def handle(self, message: Message, ctx: Context[CriticState]) -> None:
        if "tracking" not in message.payload_as(dict[str, str])["answer"]:
            ctx.reject("shipper", "give the customer a tracking number")
        self.state.accepted.append(message.payload)


async def test_a_side_effecting_tool_in_the_graph_runs_once_across_a_rollback() -> None:
    SHIPPED.clear()
    call = {"name": "ship", "args": {"order": "A-1", "quantity": 2}, "id": "call-1"}
    model = FakeMessagesListChatModel(
        responses=[
            AIMessage("", tool_calls=[call]),
            AIMessage("Shipped."),
            AIMessage("", tool_calls=[call]),  # the retry asks for the same shipment
            AIMessage("Shipped, tracking number 1."),
        ]
    )
    async with Runtime() as runtime:
        shipper = runtime.add(Shipper("shipper", shipping_graph(model)))
        checker = runtime.add(Checker("checker"))
        runtime.send("shipper", {"request": "ship order A-1"})
        await runtime.run_until_idle()
        assert len(runtime.rollbacks) == 1
        assert SHIPPED == ["A-1"]  # the retry got the ledger's recorded outcome
        calls = shipper.state.tool_calls
        assert [(c.tool, c.status) for c in calls] == [("ship", "replayed")]
        assert calls[0].result == {"shipment": 1, "order": "A-1", "quantity": 2}
        assert checker.state.accepted == [{"answer": "Shipped, tracking number 1."}]
        entries = await runtime.ledger.list_calls(runtime.run_id)
        assert [(e.tool, e.status.value) for e in entries] == [("ship", "succeeded")]


def test_current_context_outside_a_graph_agent_says_where_it_works() -> None:
    with pytest.raises(ConfigurationError, match="only in the nodes"):
        current_context()


def test_langchain_tool_needs_a_description() -> None:
    @tool
    def undocumented(x: int) -> int:
        return x

    with pytest.raises(ConfigurationError, match="has no docstring"):
        langchain_tool(undocumented)
    wrapped = langchain_tool(undocumented, description="Echo a number.")
    assert wrapped.name == "undocumented"
    assert wrapped.args["x"]["type"] == "integer"


def test_graph_agent_configuration_errors() -> None:
    with pytest.raises(ConfigurationError, match="needs a compiled LangGraph graph"):
        GraphAgent("graph", StateGraph(Notes))  # type: ignore[arg-type]
    builder = StateGraph(Notes)
    builder.add_node("count", count_notes)
    builder.add_edge(START, "count")
    with pytest.raises(ConfigurationError, match="checkpointer=False"):
        GraphAgent("graph", builder.compile(checkpointer=False))


async def test_a_payload_that_is_not_an_object_is_a_clear_error() -> None:
    async with Runtime(snapshot_policy=SnapshotPolicy(at_start=False)) as runtime:
        runtime.add(GraphAgent("graph", notes_graph()))
        runtime.send("graph", "just text")
        with pytest.raises(HandlerFailed) as failed:
            await runtime.run_until_idle()
    assert "payload is not a JSON object" in str(failed.value.__cause__)
    assert "override graph_input()" in str(failed.value.__cause__)
