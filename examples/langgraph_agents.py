"""Two LangGraph graphs on the agentsnap bus: a quoting worker and its reviewer.

The **worker** is a tool-calling graph (``StateGraph(MessagesState)``): a model node, driven
by one of langchain-core's fake chat models so the run needs no network and tells the same
story every time, and a ``ToolNode`` with two agentsnap tools wrapped by ``langchain_tool``:
``look_up_price`` (read-only) and ``reserve_stock`` (side-effecting, so every call goes
through the ledger under an idempotency key). ``tools_condition`` routes the model's tool
calls to the ``ToolNode`` and its final answer to the end. The worker sends that answer to
the reviewer.

The **reviewer** is a second graph, with no model: one node recomputes the quote's total
from the price list (calling ``look_up_price`` through ``current_context()``) and writes a
verdict. When the verdict fails, the reviewer agent rejects the worker's answer with
``ctx.reject``.

The customer asks for two quotes. The first passes review, and the program takes a
snapshot: a consistent cut of both agents, their graphs' checkpoints included. The worker
gets the second quote's total wrong; the reviewer rejects it, every agent rolls back to the
cut (both graphs continue from their checkpoints in it, the rejected answer gone), the
customer's request is delivered again, and the worker, given the reviewer's reason as a
message in its graph, quotes again and passes. Its second ``reserve_stock`` call has the
same idempotency key as the first, so it gets the ledger's recorded reservation: the stock
is reserved once.

The run and both graphs' checkpoints (``AgentsnapSaver``) are kept in one SQLite database, a
temporary file unless ``--db`` names one (SQLite or PostgreSQL). The program checks its own
outcome and exits with status 1 when it is not the expected one.

Run it with:

    python examples/langgraph_agents.py
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import tempfile
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from pydantic import BaseModel

from agentsnap import Context, JsonValue, LedgerEntry, Message, RollbackInfo, Runtime, tool
from agentsnap._hints import cli_command
from agentsnap.integrations.langgraph import (
    AgentsnapSaver,
    GraphAgent,
    GraphState,
    Outgoing,
    current_context,
    langchain_tool,
)
from agentsnap.runtime import interrupted_message
from agentsnap.store.sql import SqlStore

PRICES = {"office chair": 120, "desk lamp": 25}
RESERVED: list[tuple[str, int]] = []  # the warehouse: every reservation it ever made


@tool
def look_up_price(item: str) -> int:
    """Look up the unit price of an item, in dollars."""
    return PRICES[item]


@tool(side_effect=True)
def reserve_stock(item: str, quantity: int) -> str:
    """Reserve items in the warehouse for the customer; returns the reservation number."""
    RESERVED.append((item, quantity))
    return f"R-{len(RESERVED)}"


def call(name: str, number: int, **args: Any) -> dict[str, Any]:
    return {"name": name, "args": args, "id": f"call-{number}"}


def scripted_model() -> FakeMessagesListChatModel:
    """The worker's model: what a tool-calling model would answer, one reply per turn."""
    chair, lamp = {"item": "office chair"}, {"item": "desk lamp"}
    return FakeMessagesListChatModel(
        responses=[
            # First quote: 2 office chairs.
            AIMessage("", tool_calls=[call("look_up_price", 1, **chair)]),
            AIMessage("", tool_calls=[call("reserve_stock", 2, **chair, quantity=2)]),
            AIMessage("2 office chairs at $120 each: $240 in total, reserved under R-1."),
            # Second quote: 3 desk lamps, with the total wrong.
            AIMessage("", tool_calls=[call("look_up_price", 3, **lamp)]),
            AIMessage("", tool_calls=[call("reserve_stock", 4, **lamp, quantity=3)]),
            AIMessage("3 desk lamps at $25 each: $25 in total, reserved under R-2."),
            # The retry, after the reviewer's feedback.
            AIMessage("", tool_calls=[call("look_up_price", 5, **lamp)]),
            AIMessage("", tool_calls=[call("reserve_stock", 6, **lamp, quantity=3)]),
            AIMessage("3 desk lamps at $25 each: $75 in total, reserved under R-2."),
        ]
    )


def worker_graph(model: FakeMessagesListChatModel) -> Any:
    async def think(state: MessagesState) -> dict[str, list[AnyMessage]]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("model", think)
    builder.add_node(
        "tools", ToolNode([langchain_tool(look_up_price), langchain_tool(reserve_stock)])
    )
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", tools_condition)  # tool calls -> "tools", else END
    builder.add_edge("tools", "model")
    return builder.compile()


class Review(TypedDict, total=False):
    item: str
    quantity: int
    answer: str
    verdict: str
    reason: str


TOTAL = re.compile(r"\$(\d+) in total")


async def check_total(state: Review) -> Review:
    """The reviewer's rule: the quoted total is the quantity times the listed price."""
    price = await look_up_price(current_context(), item=state["item"])
    expected = price * state["quantity"]
    found = TOTAL.search(state["answer"])
    if found and int(found.group(1)) == expected:
        return {"verdict": "pass", "reason": ""}
    quoted = f"${found.group(1)}" if found else "no total"
    reason = (
        f"the quote gives {quoted} for {state['quantity']} x {state['item']}, "
        f"but at ${price} each the total is ${expected}"
    )
    return {"verdict": "fail", "reason": reason}


def reviewer_graph() -> Any:
    builder = StateGraph(Review)
    builder.add_node("check_total", check_total)
    builder.add_edge(START, "check_total")
    builder.add_edge("check_total", END)
    return builder.compile()


class Request(BaseModel):
    item: str
    quantity: int


class Worker(GraphAgent):
    """Puts the customer's request, and any reviewer feedback, into its graph's messages."""

    def graph_input(self, message: Message, ctx: Context[GraphState]) -> Any:
        request = message.payload_as(Request)
        say(f"worker    <- {message.src}: quote {request.quantity} x {request.item}")
        text = f"Quote {request.quantity} x {request.item} and reserve them."
        messages: list[AnyMessage] = [HumanMessage(text)]
        if feedback := self.unseen_feedback(ctx):
            reasons = "; ".join(f.reason for f in feedback)
            messages.append(HumanMessage(f"A reviewer rejected your last quote: {reasons}."))
            say(f"             (with the reviewer's feedback: {reasons})")
        return {"messages": messages}

    def graph_outputs(
        self, result: Any, message: Message, ctx: Context[GraphState]
    ) -> Iterable[Outgoing]:
        answer = result["messages"][-1].content
        say(f"worker    -> reviewer: {answer}")
        request = message.payload_as(dict[str, JsonValue])
        return [Outgoing("reviewer", {**request, "answer": answer}, "quote")]

    async def on_rollback(self, rollback: RollbackInfo, ctx: Context[GraphState]) -> None:
        say(f"ROLLBACK  {rollback.source} rejected {rollback.agent}'s quote: {rollback.reason}")
        say(f"          every agent is back at the cut; the worker's graph at {where(self)}")


class Reviewer(GraphAgent):
    """Runs the review graph on each quote and rejects the worker's quote when it fails."""

    def graph_outputs(
        self, result: Any, message: Message, ctx: Context[GraphState]
    ) -> Iterable[Outgoing]:
        verdict, reason = result["verdict"], result["reason"]
        say(f"reviewer  :  {verdict}" + (f" ({reason})" if reason else ""))
        if verdict != "pass":
            ctx.reject("worker", reason)
        return ()

    async def on_rollback(self, rollback: RollbackInfo, ctx: Context[GraphState]) -> None:
        say(f"          the reviewer's graph at {where(self)}")


def where(agent: GraphAgent) -> str:
    checkpoint = agent.state.checkpoint_id or "no checkpoint"
    messages = agent.state.values.get("messages")
    held = f", {len(messages)} messages" if isinstance(messages, list) else ""
    return f"checkpoint {checkpoint[-8:]} of thread {agent.state.thread_id}{held}"


def say(line: str) -> None:
    print(line, flush=True)


@dataclass
class Outcome:
    run_id: str
    cut: str
    rollbacks: list[RollbackInfo]
    worker: GraphState
    reviewer: GraphState
    ledger: list[LedgerEntry]
    snapshots: int
    checkpoints: int


async def simulate(url: str, run_id: str | None = None) -> Outcome:
    store = SqlStore(url)
    saver = AgentsnapSaver(url)  # the graphs' checkpoints, in the same database
    try:
        metadata = {"example": "langgraph_agents"}
        async with Runtime(
            store=store, run_id=run_id, name="langgraph_agents", metadata=metadata
        ) as runtime:
            worker = runtime.add(
                Worker("worker", worker_graph(scripted_model()), checkpointer=saver)
            )
            reviewer = runtime.add(Reviewer("reviewer", reviewer_graph(), checkpointer=saver))
            assert isinstance(worker, Worker)
            runtime.send("worker", Request(item="office chair", quantity=2), kind="request")
            await runtime.run_until_idle()
            cut = await runtime.snapshot()
            say(f"snapshot {cut.seq}: a consistent cut; the worker's graph at {where(worker)}")
            runtime.send("worker", Request(item="desk lamp", quantity=3), kind="request")
            await runtime.run_until_idle()
            ledger = await runtime.ledger.list_calls(runtime.run_id)
            checkpoints = [
                c
                async for c in saver.alist({"configurable": {"thread_id": worker.state.thread_id}})
            ]
        return Outcome(
            run_id=runtime.run_id,
            cut=cut.id,
            rollbacks=list(runtime.rollbacks),
            worker=worker.state,
            reviewer=reviewer.state,
            ledger=ledger,
            snapshots=len(await store.list_snapshots(runtime.run_id)),
            checkpoints=len(checkpoints),
        )
    finally:
        await store.close()
        saver.close()


def graph_messages(state: GraphState) -> list[dict[str, JsonValue]]:
    """The messages in an agent's graph state, as the state keeps them (JSON objects)."""
    messages = state.values["messages"]
    assert isinstance(messages, list)
    return [message for message in messages if isinstance(message, dict)]


def report(outcome: Outcome) -> None:
    print()
    print("the worker's graph messages, as the retry left them:")
    for message in graph_messages(outcome.worker):
        calls = message.get("tool_calls")
        named = [c for c in calls if isinstance(c, dict)] if isinstance(calls, list) else []
        text = "; ".join(f"{c['name']}({c['args']})" for c in named) or message["content"]
        print(f"  {message['type']:<6} {text}")
    print()
    print("tool calls in the agents' state (the rejected attempt's were rolled back):")
    for agent, state in (("worker", outcome.worker), ("reviewer", outcome.reviewer)):
        for record in state.tool_calls:
            shown = f"{record.result} [{record.status}]"
            print(f"  {agent:<9} {record.tool}({record.arguments}) -> {shown}")
    print()
    print("the ledger (side-effecting calls only):")
    for entry in outcome.ledger:
        print(f"  {entry.tool}({entry.arguments}) -> {entry.result} [{entry.status.value}]")
    print(f"the warehouse made {len(RESERVED)} reservations: {RESERVED}")


def problems_of(outcome: Outcome) -> list[str]:
    problems = []
    if [r.agent for r in outcome.rollbacks] != ["worker"]:
        problems.append(f"expected one rollback of the worker, got {outcome.rollbacks}")
    elif outcome.rollbacks[0].snapshot_id != outcome.cut:
        problems.append("the rollback did not go back to the cut taken after the first quote")
    if RESERVED != [("office chair", 2), ("desk lamp", 3)]:
        problems.append(f"expected each reservation made once, got {RESERVED}")
    statuses = [(r.tool, r.status) for r in outcome.worker.tool_calls if r.tool == "reserve_stock"]
    if statuses != [("reserve_stock", "ok"), ("reserve_stock", "replayed")]:
        problems.append(f"expected the retry's reservation to be replayed, got {statuses}")
    if [e.status.value for e in outcome.ledger] != ["succeeded", "succeeded"]:
        problems.append(f"expected two succeeded calls in the ledger, got {outcome.ledger}")
    contents = [m["content"] for m in graph_messages(outcome.worker)]
    if any("$25 in total" in str(c) for c in contents):
        problems.append("the rejected quote is still in the worker's graph")
    if not any("A reviewer rejected" in str(c) for c in contents):
        problems.append("the reviewer's feedback did not reach the worker's graph")
    if outcome.reviewer.values.get("verdict") != "pass":
        problems.append(f"the last review did not pass: {outcome.reviewer.values}")
    return problems


def interrupted(run_id: str, db: str | None) -> int:
    """Ctrl-C: say in one line what became of the run, and exit with 130, like a shell."""
    print(interrupted_message(run_id, db), file=sys.stderr)
    return 130


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", help="keep the run in this database (sqlite:/// or postgresql://)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        url = args.db or f"sqlite:///{Path(folder) / 'langgraph_agents.db'}"
        run_id = uuid.uuid4().hex
        try:
            outcome = asyncio.run(simulate(url, run_id))
        except KeyboardInterrupt:
            return interrupted(run_id, args.db)
    report(outcome)
    print()
    print(
        f"run {outcome.run_id}: {outcome.snapshots} snapshots, {len(outcome.rollbacks)} "
        f"rollback, {outcome.checkpoints} LangGraph checkpoints on the worker's thread "
        "(the abandoned branch included)"
    )
    if args.db:
        print(f"stored in {args.db}; list its snapshots with:")
        print(f"  {cli_command('snapshots', outcome.run_id, '--db', args.db)}")
    else:
        print("kept in a temporary database; pass --db sqlite:///langgraph_agents.db to keep it")
    problems = problems_of(outcome)
    for problem in problems:
        print("PROBLEM:", problem)
    if problems:
        return 1
    print("the quote was fixed after the review, and the stock was reserved once")
    return 0


if __name__ == "__main__":
    sys.exit(main())
