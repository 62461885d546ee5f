"""A compiled LangGraph graph running as an agentsnap agent."""

from __future__ import annotations

import contextvars
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.pregel import Pregel
from pydantic import BaseModel, Field
from pydantic_core import to_jsonable_python

from agentsnap.agents import Agent, Context, Feedback
from agentsnap.exceptions import ConfigurationError, RunError
from agentsnap.integrations import require_kind
from agentsnap.messages import ENVIRONMENT, JsonValue, Message
from agentsnap.state import AgentState

if TYPE_CHECKING:
    from langgraph.types import StateSnapshot

__all__ = ["CheckpointMissing", "GraphAgent", "GraphState", "Outgoing", "current_context"]

_context: contextvars.ContextVar[Context[Any] | None] = contextvars.ContextVar(
    "agentsnap_graph_context", default=None
)


def current_context() -> Context[Any]:
    """The context of the graph agent whose graph is running, for code inside its nodes.

    A node, or a tool called by one, uses it to call agentsnap tools
    (``await charge(current_context(), ...)``), read ``feedback``, or reject a message.

    Returns:
        The running graph agent's context.

    Raises:
        ConfigurationError: No graph agent is running a graph in this task.
    """
    ctx = _context.get()
    if ctx is None:
        raise ConfigurationError(
            "current_context() was called outside a graph agent's graph; it works only in the "
            "nodes (and the tools they call) of a graph run by a GraphAgent"
        )
    return ctx


@dataclass(eq=False, repr=False)
class CheckpointMissing(RunError, LookupError):
    """A graph agent's state names a LangGraph checkpoint its checkpointer does not hold.

    This happens when a run is resumed or forked in another process while the graph keeps
    its checkpoints in memory: give the graph agent a persistent checkpointer, such as
    [`AgentsnapSaver`][agentsnap.integrations.langgraph.AgentsnapSaver].
    """

    agent: str
    thread_id: str
    checkpoint_id: str

    def __post_init__(self) -> None:
        super().__init__(
            f"graph agent {self.agent!r} was restored to LangGraph checkpoint "
            f"{self.checkpoint_id!r} of thread {self.thread_id!r}, which its checkpointer does "
            "not hold; to resume or fork "
            "runs in another process, give the agent a persistent checkpointer "
            "(GraphAgent(..., checkpointer=AgentsnapSaver(url)))"
        )


class GraphState(AgentState):
    """State of a [`GraphAgent`][agentsnap.integrations.langgraph.GraphAgent].

    Snapshots record where the graph stands: its LangGraph thread and checkpoint, which
    rollback restores, and a JSON copy of the graph's values for inspection (``agentsnap
    show``, ``diff``, ``history``). Tool calls made inside the graph are in ``tool_calls``.
    """

    thread_id: str | None = None
    """The LangGraph thread holding this agent's checkpoints (``None`` before the first
    message)."""
    checkpoint_id: str | None = None
    """The checkpoint the graph continues from at the next message."""
    values: dict[str, JsonValue] = Field(default_factory=dict)
    """The graph's state values after the last message, as JSON (a view; the checkpoint is
    what the graph resumes from)."""
    next: list[str] = Field(default_factory=list)
    """Nodes still to run, when the graph stopped at an interrupt."""
    feedback_seen: int = 0
    """How many of the agent's feedback items (``ctx.feedback``) the graph had been run
    with; see [`unseen_feedback`][agentsnap.integrations.langgraph.GraphAgent.unseen_feedback]."""


class Outgoing(NamedTuple):
    """A message a graph agent sends after its graph ran."""

    to: str
    """The receiving agent."""
    payload: JsonValue | BaseModel
    """The payload: a JSON value or a pydantic model."""
    kind: str = "message"
    """What the message is."""


class GraphAgent(Agent[GraphState]):
    """Runs a compiled LangGraph graph (a ``StateGraph`` or any ``Pregel``) for each message.

    Each delivered message becomes the graph's input
    ([`graph_input`][agentsnap.integrations.langgraph.GraphAgent.graph_input]); the graph
    runs to its end on this agent's own thread, continuing from the checkpoint recorded in
    the agent's state; what it returns becomes outgoing messages
    ([`graph_outputs`][agentsnap.integrations.langgraph.GraphAgent.graph_outputs]).

    The agent's state ([`GraphState`][agentsnap.integrations.langgraph.GraphState]) names the
    checkpoint, so a snapshot captures the graph, and a rollback sends it back: the next
    message continues from the restored checkpoint, as LangGraph's time travel does, and the
    abandoned checkpoints stay in the thread's history. The thread is ``"{run}:{agent}"``,
    so runs and agents never share one; a rollback to before the first message starts a
    fresh thread (``"{run}:{agent}:2"``…), and a fork copies its checkpoint into its own.

    Inside the graph, [`current_context`][agentsnap.integrations.langgraph.current_context]
    returns this agent's context, so nodes can call agentsnap tools, with idempotency keys
    and the ledger for side-effecting ones;
    [`langchain_tool`][agentsnap.integrations.langgraph.langchain_tool] wraps an agentsnap
    tool for LangChain tool-calling models and ``ToolNode``.

    Args:
        name: The agent's name.
        graph: The compiled graph.
        checkpointer: Where the graph's checkpoints go. By default the graph's own, or a
            LangGraph ``InMemorySaver`` when it was compiled without one; that is enough
            for rollback within a process, but resuming or forking a run in another process
            needs a persistent one such as
            [`AgentsnapSaver`][agentsnap.integrations.langgraph.AgentsnapSaver].
        config: Extra LangGraph config for every invocation (``recursion_limit``,
            callbacks, tags…); ``thread_id`` and ``checkpoint_id`` are set by the agent.
        state: The initial state.

    Raises:
        ConfigurationError: ``graph`` is not a compiled graph, or was compiled with
            ``checkpointer=False``.
    """

    def __init__(
        self,
        name: str,
        graph: Pregel[Any, Any, Any, Any],
        *,
        checkpointer: BaseCheckpointSaver[Any] | None = None,
        config: RunnableConfig | None = None,
        state: GraphState | None = None,
    ) -> None:
        super().__init__(name, state)
        require_kind(
            graph,
            Pregel,
            f"graph agent {name!r} needs a compiled LangGraph graph (builder.compile())",
        )
        saver: BaseCheckpointSaver[Any]
        if checkpointer is not None:
            saver = checkpointer
        elif isinstance(graph.checkpointer, BaseCheckpointSaver):
            saver = graph.checkpointer
        elif graph.checkpointer is False:
            raise ConfigurationError(
                f"the graph of agent {name!r} was compiled with checkpointer=False, so "
                "its state cannot be snapshotted; compile it without that argument"
            )
        else:
            saver = InMemorySaver()
        if graph.checkpointer is not saver:
            graph = graph.copy(update={"checkpointer": saver})
        self.graph = graph
        """The graph, with the agent's checkpointer."""
        self.checkpointer = saver
        """Where the graph's checkpoints go."""
        self.config: RunnableConfig = dict(config or {})  # type: ignore[assignment]
        """Extra config of every invocation."""
        # The (thread, checkpoint) this process wrote or found in the checkpointer; a state
        # naming another one was restored (rollback, resume, fork) and is checked first.
        self._known: tuple[str, str] | None = None

    async def handle(self, message: Message, ctx: Context[GraphState]) -> None:
        """Run the graph on the message and send what it returns.

        Args:
            message: The delivered message.
            ctx: The agent's context.

        Raises:
            CheckpointMissing: The state names a checkpoint the checkpointer lost.
        """
        config = await self._invocation_config(ctx)
        token = _context.set(ctx)
        try:
            result = await self.graph.ainvoke(self.graph_input(message, ctx), config)
        finally:
            _context.reset(token)
        thread_id = config["configurable"]["thread_id"]
        latest = await self.graph.aget_state({"configurable": {"thread_id": thread_id}})
        self._record(thread_id, latest)
        self.state.feedback_seen = len(ctx.feedback)
        for outgoing in self.graph_outputs(result, message, ctx):
            ctx.send(outgoing.to, outgoing.payload, kind=outgoing.kind)

    def graph_input(self, message: Message, ctx: Context[GraphState]) -> Any:
        """The graph's input for a message; override it to shape the input or add feedback.

        By default the payload, which must then be a JSON object of the graph's state keys.

        Args:
            message: The delivered message.
            ctx: The agent's context; ``self.unseen_feedback(ctx)`` gives the reasons of
                rejections the graph has not seen yet.

        Returns:
            The input passed to the graph.

        Raises:
            ConfigurationError: The payload is not a JSON object.
        """
        if not isinstance(message.payload, Mapping):
            raise ConfigurationError(
                f"graph agent {self.name!r} got a {message.kind!r} message whose payload is "
                f"not a JSON object ({type(message.payload).__name__}); send the graph's "
                "input as an object of its state keys, or override graph_input()"
            )
        return dict(message.payload)

    def unseen_feedback(self, ctx: Context[GraphState]) -> Sequence[Feedback]:
        """The feedback the graph has not been run with, in its restored state: give it these.

        ``ctx.feedback`` keeps every reason the agent was given during the run. The graph,
        once rolled back, has seen only those given before the checkpoint it was restored
        to, so this returns the rest, oldest first; each is given once per branch.

        Args:
            ctx: The agent's context.

        Returns:
            Feedback the graph's current state has not seen.
        """
        return ctx.feedback[self.state.feedback_seen :]

    def graph_outputs(
        self, result: Any, message: Message, ctx: Context[GraphState]
    ) -> Iterable[Outgoing]:
        """The messages to send after the graph ran; override it to route results.

        By default the graph's result, as JSON, goes back to the sender as a ``"result"``
        message (nothing is sent when the sender is the environment: the result is in the
        agent's state). Raising [`OutputRejected`][agentsnap.OutputRejected] here, through
        ``ctx.reject``, rolls the run back as from any handler.

        Args:
            result: What the graph returned.
            message: The message the graph ran on.
            ctx: The agent's context.

        Returns:
            The messages to send, in order.
        """
        if message.src == ENVIRONMENT:
            return ()
        return (Outgoing(message.src, as_json(result), "result"),)

    async def _invocation_config(self, ctx: Context[GraphState]) -> RunnableConfig:
        """The config that runs the graph from the checkpoint the agent's state names."""
        state = self.state
        home = f"{ctx.run_id}:{self.name}"
        thread_id, checkpoint_id = state.thread_id, state.checkpoint_id
        if thread_id is not None and checkpoint_id is not None:
            if (thread_id, checkpoint_id) != self._known:
                await self._check_restored(thread_id, checkpoint_id)
            if not _belongs(thread_id, home):  # restored from another run: a fork
                thread_id = await self._copy_into(await self._free_thread(home), checkpoint_id)
        else:  # the graph starts empty, on a thread with no history
            thread_id = await self._free_thread(home)
        state.thread_id = thread_id
        configurable: dict[str, Any] = {
            **self.config.get("configurable", {}),
            "thread_id": thread_id,
        }
        if state.checkpoint_id is not None:
            configurable["checkpoint_id"] = state.checkpoint_id
        return {**self.config, "configurable": configurable}

    async def _check_restored(self, thread_id: str, checkpoint_id: str) -> None:
        found = await self.checkpointer.aget_tuple(_config(thread_id, checkpoint_id))
        if found is None:
            raise CheckpointMissing(self.name, thread_id, checkpoint_id)
        self._known = (thread_id, checkpoint_id)

    async def _free_thread(self, home: str) -> str:
        """The first of ``home``, ``home:2``, ``home:3``… that holds no checkpoint yet."""
        candidate, number = home, 1
        while await self.checkpointer.aget_tuple({"configurable": {"thread_id": candidate}}):
            number += 1
            candidate = f"{home}:{number}"
        return candidate

    async def _copy_into(self, thread_id: str, checkpoint_id: str) -> str:
        """Copy the restored checkpoint into this run's own thread."""
        assert self.state.thread_id is not None
        found = await self.checkpointer.aget_tuple(_config(self.state.thread_id, checkpoint_id))
        assert found is not None  # checked by _check_restored
        checkpoint = found.checkpoint
        saved = await self.checkpointer.aput(
            {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}},
            checkpoint,
            found.metadata,
            dict(checkpoint["channel_versions"]),
        )
        self._known = (thread_id, saved["configurable"]["checkpoint_id"])
        return thread_id

    def _record(self, thread_id: str, latest: StateSnapshot) -> None:
        checkpoint_id: str = latest.config["configurable"]["checkpoint_id"]
        state = self.state
        state.thread_id = thread_id
        state.checkpoint_id = checkpoint_id
        state.values = as_json(dict(latest.values)) if latest.values else {}
        state.next = list(latest.next)
        self._known = (thread_id, checkpoint_id)


def as_json(value: Any) -> Any:
    """``value`` as JSON data: pydantic models and LangChain messages by their fields.

    Values with no JSON form become their ``repr``; this is for display and messages, never
    for restoring a graph (checkpoints do that).

    Args:
        value: Any value a graph returns or holds.

    Returns:
        JSON data (dicts, lists, strings, numbers, booleans, ``None``).
    """
    return to_jsonable_python(value, fallback=repr)


def _belongs(thread_id: str, home: str) -> bool:
    return thread_id == home or thread_id.startswith(f"{home}:")


def _config(thread_id: str, checkpoint_id: str) -> RunnableConfig:
    return {
        "configurable": {
            "thread_id": thread_id,
            "checkpoint_ns": "",
            "checkpoint_id": checkpoint_id,
        }
    }
