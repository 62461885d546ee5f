"""A LangChain ``create_agent`` agent running as an agentsnap agent."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    messages_from_dict,
    messages_to_dict,
)
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.pregel import Pregel
from pydantic import Field
from pydantic_core import to_jsonable_python

from agentsnap._handler import engine_of
from agentsnap.agents import Agent, Context, Feedback
from agentsnap.exceptions import ConfigurationError
from agentsnap.integrations import require_kind
from agentsnap.integrations._running import handling
from agentsnap.integrations.langgraph._agent import Outgoing
from agentsnap.messages import ENVIRONMENT, JsonValue, Message
from agentsnap.state import AgentState

__all__ = ["ConversationState", "LangChainAgent"]


class ConversationState(AgentState):
    """State of a [`LangChainAgent`][agentsnap.integrations.langchain.LangChainAgent].

    The whole conversation is JSON in the state, so every snapshot holds it and a rollback
    restores it; ``agentsnap show`` prints it.
    """

    messages: list[dict[str, JsonValue]] = Field(default_factory=list)
    """The conversation, oldest first, as ``langchain_core.messages.messages_to_dict`` dumps
    it (``{"type": "human", "data": {...}}``)."""
    answer: str | None = None
    """The text of the agent's last answer."""
    structured_response: JsonValue = None
    """The last structured response, as JSON, when the agent has a response format."""
    feedback_seen: int = 0
    """How many of the agent's feedback items the conversation has been given; see
    [`unseen_feedback`][agentsnap.integrations.langchain.LangChainAgent.unseen_feedback]."""


class LangChainAgent(Agent[ConversationState]):
    """Runs a LangChain agent made with ``langchain.agents.create_agent`` for each message.

    The agent must have an
    [`AgentsnapMiddleware`][agentsnap.integrations.langchain.AgentsnapMiddleware], which
    records its model calls and routes its tools through the ledger. Each delivered message
    becomes the user's next turn
    ([`agent_input`][agentsnap.integrations.langchain.LangChainAgent.agent_input]), after
    the conversation kept in the state; the LangChain agent runs to its answer; the whole
    conversation goes back into the state, and the answer is sent on
    ([`outputs`][agentsnap.integrations.langchain.LangChainAgent.outputs]).

    After a rollback, the state is the conversation of the cut and the message is
    delivered again: the user's turn then carries the reason (and the effects already
    done), so the model answers anew. After a crash and ``resume()``, the handler runs
    again and gets the recorded model answers and tool outcomes: the model is not asked
    again and no effect repeats.

    Args:
        name: The agent's name.
        agent: What ``create_agent`` returned, compiled without a checkpointer (the
            conversation lives in this agent's state).
        send_to: Where the answer goes: an agent's name. ``None`` (the default): back to
            the sender, or nowhere when the sender is the environment.
        kind: The kind of the answer's message.
        config: Extra LangChain config for every invocation (``recursion_limit``,
            callbacks, tags...).
        context: The LangChain agent's runtime context (``create_agent(context_schema=...)``).
        state: The initial state.

    Raises:
        ConfigurationError: ``agent`` is not a compiled LangChain agent, or has a
            checkpointer.
    """

    def __init__(
        self,
        name: str,
        agent: Pregel[Any, Any, Any, Any],
        *,
        send_to: str | None = None,
        kind: str = "answer",
        config: RunnableConfig | None = None,
        context: Any = None,
        state: ConversationState | None = None,
    ) -> None:
        super().__init__(name, state)
        require_kind(
            agent, Pregel, f"agent {name!r} needs what langchain.agents.create_agent() returns"
        )
        if isinstance(agent.checkpointer, BaseCheckpointSaver):
            raise ConfigurationError(
                f"the LangChain agent of {name!r} has a checkpointer; make it without one "
                "(create_agent(..., checkpointer=None)): its conversation is kept in the "
                "agentsnap agent's state, in every snapshot"
            )
        self.agent = agent
        """The LangChain agent."""
        self.send_to = send_to
        """Where the answer goes (``None``: back to the sender)."""
        self.kind = kind
        """The kind of the answer's message."""
        self.config: RunnableConfig = dict(config or {})  # type: ignore[assignment]
        """Extra config of every invocation."""
        self.context = context
        """The LangChain agent's runtime context."""

    async def handle(self, message: Message, ctx: Context[ConversationState]) -> None:
        """Run the LangChain agent on the message and send its answer on.

        Args:
            message: The delivered message.
            ctx: The agent's context.

        Raises:
            ConfigurationError: The LangChain agent made its model calls without the
                agentsnap middleware.
        """
        state = self.state
        conversation: list[BaseMessage] = [
            *messages_from_dict(list(state.messages)),
            *self.agent_input(message, ctx),
        ]
        engine = engine_of(ctx)
        before = engine.position
        options: dict[str, Any] = {} if self.context is None else {"context": self.context}
        with handling(ctx):
            result = await self.agent.ainvoke({"messages": conversation}, self.config, **options)
        if engine.model_calls is not None and engine.position == before:
            raise ConfigurationError(
                f"the LangChain agent of {self.name!r} answered without a recorded model "
                "call: make it with create_agent(..., middleware=[AgentsnapMiddleware(), ...])"
            )
        messages = list(result.get("messages", ()))
        state.messages = to_jsonable_python(messages_to_dict(messages), fallback=repr)
        answer = next((m for m in reversed(messages) if isinstance(m, AIMessage)), None)
        state.answer = answer.text if answer is not None else None
        state.structured_response = to_jsonable_python(
            result.get("structured_response"), fallback=repr
        )
        state.feedback_seen = len(ctx.feedback)
        for outgoing in self.outputs(result, message, ctx):
            ctx.send(outgoing.to, outgoing.payload, kind=outgoing.kind)

    def agent_input(self, message: Message, ctx: Context[ConversationState]) -> list[BaseMessage]:
        """The user's turn for a message; override it to shape the input.

        By default one ``HumanMessage``: the payload's text (a JSON payload other than a
        string is written as JSON), followed, after a rollback, by the feedback the
        conversation has not been given, each as [`Feedback.text`][agentsnap.Feedback.text]
        words it. Its id is the message's, so a turn run again has the same conversation.

        Args:
            message: The delivered message.
            ctx: The agent's context.

        Returns:
            The messages appended to the conversation.
        """
        payload = message.payload
        text = payload if isinstance(payload, str) else json.dumps(payload, sort_keys=True)
        unseen = self.unseen_feedback(ctx)
        if unseen:
            reasons = "\n".join(f"- {feedback.text()}" for feedback in unseen)
            text += f"\n\nYour earlier answer to this was rejected:\n{reasons}"
        return [HumanMessage(content=text, id=f"agentsnap:{message.id}")]

    def unseen_feedback(self, ctx: Context[ConversationState]) -> Sequence[Feedback]:
        """The feedback the conversation, as the state holds it, has not been given.

        Args:
            ctx: The agent's context.

        Returns:
            The newest items of ``ctx.feedback``, oldest first.
        """
        return ctx.feedback[self.state.feedback_seen :]

    def outputs(
        self, result: dict[str, Any], message: Message, ctx: Context[ConversationState]
    ) -> Iterable[Outgoing]:
        """The messages to send after the agent answered; override it to route answers.

        By default the answer (the structured response as JSON when the agent has a
        response format, else the last ``AIMessage``'s text) goes to ``send_to``, or back
        to the sender, as a message of kind ``kind``; nothing is sent for the environment.

        Args:
            result: What the LangChain agent returned (``messages``, and
                ``structured_response`` when it has a response format).
            message: The message the agent ran on.
            ctx: The agent's context.

        Returns:
            The messages to send, in order.
        """
        to = self.send_to or message.src
        if to == ENVIRONMENT:
            return ()
        state = self.state
        payload: JsonValue = (
            state.structured_response if state.structured_response is not None else state.answer
        )
        return (Outgoing(to, payload, self.kind),)
