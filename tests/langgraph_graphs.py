"""The small LangGraph graph and forwarding agent the LangGraph tests share.

The graph keeps a list of notes (appended by a reducer) and their count, so that where a
graph continues from shows in its values.
"""

from __future__ import annotations

import operator
from typing import Annotated, Any, TypedDict

from langgraph.graph import END, START, StateGraph

from agentsnap import Agent, AgentState, Context, Message


class Notes(TypedDict, total=False):
    notes: Annotated[list[str], operator.add]
    count: int


def count_notes(state: Notes) -> Notes:
    return {"count": len(state.get("notes", []))}


def notes_graph(checkpointer: Any = None) -> Any:
    """The notes graph, compiled (with ``checkpointer`` when given)."""
    builder = StateGraph(Notes)
    builder.add_node("count", count_notes)
    builder.add_edge(START, "count")
    builder.add_edge("count", END)
    return builder.compile(checkpointer=checkpointer)


class RoutingInbox(Agent[AgentState]):
    """Forwards the environment's notes to the graph agent named in the message's kind."""

    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        if message.kind != "result":
            ctx.send(message.kind, {"notes": [message.payload]})
