"""A pydantic-ai agent running as an agentsnap agent."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from pydantic import BaseModel, Field
from pydantic_ai.agent import AbstractAgent
from pydantic_ai.capabilities import AbstractCapability

from agentsnap.agents import Agent, Context, Feedback
from agentsnap.integrations import require_kind
from agentsnap.integrations._records import json_of
from agentsnap.integrations._running import handling
from agentsnap.integrations.pydantic_ai._convert import messages_from_json, messages_json
from agentsnap.integrations.pydantic_ai._durability import AgentsnapDurability
from agentsnap.messages import ENVIRONMENT, JsonValue, Message
from agentsnap.state import AgentState

__all__ = ["Outgoing", "PydanticAIAgent", "PydanticAIState"]


class PydanticAIState(AgentState):
    """State of a [`PydanticAIAgent`][agentsnap.integrations.pydantic_ai.PydanticAIAgent].

    Every snapshot holds the agent's conversation, so a rollback takes it back with the
    other agents and a resumed run goes on from it. Its tool calls are in ``tool_calls``;
    its ``deps`` are never stored.
    """

    messages: list[dict[str, JsonValue]] = Field(default_factory=list)
    """The message history, in pydantic-ai's own JSON form (``ModelMessagesTypeAdapter``):
    what the next run continues."""
    output: JsonValue = None
    """The output of the last run, as JSON."""
    runs: int = 0
    """How many messages the agent has answered."""
    feedback_seen: int = 0
    """How many of the agent's feedback items (``ctx.feedback``) its conversation has been
    told; see
    [`unseen_feedback`][agentsnap.integrations.pydantic_ai.PydanticAIAgent.unseen_feedback]."""


class Outgoing(NamedTuple):
    """A message a pydantic-ai agent sends once its run ended."""

    to: str
    """The receiving agent."""
    payload: JsonValue | BaseModel
    """The payload: a JSON value or a pydantic model."""
    kind: str = "result"
    """What the message is."""


class PydanticAIAgent(Agent[PydanticAIState]):
    """Runs a pydantic-ai agent on each message it is sent, as an agentsnap agent.

    The message becomes the run's user prompt
    ([`user_prompt`][agentsnap.integrations.pydantic_ai.PydanticAIAgent.user_prompt]), with
    the reasons of rejections the conversation has not been told; the run continues the
    conversation kept in the agent's state; its output is sent on
    ([`outputs`][agentsnap.integrations.pydantic_ai.PydanticAIAgent.outputs]). The run goes
    through [`AgentsnapDurability`][agentsnap.integrations.pydantic_ai.AgentsnapDurability]
    (the agent's own, or ``durability`` added to each run), so its model calls are recorded
    steps and its tool calls go through the ledger.

    Args:
        name: The agentsnap agent's name.
        agent: The pydantic-ai agent.
        to: Where the output goes: an agent's name, or ``None`` (the default) for the sender
            of the message (nothing is sent when that is the program: the output is in the
            state).
        kind: The kind of the messages sent.
        deps: The pydantic-ai ``deps`` of every run (or override
            [`deps_for`][agentsnap.integrations.pydantic_ai.PydanticAIAgent.deps_for]); never
            stored.
        durability: The capability added to each run when the agent holds none (default:
            ``AgentsnapDurability()``).
        state: The initial state.
    """

    def __init__(
        self,
        name: str,
        agent: AbstractAgent[Any, Any],
        *,
        to: str | None = None,
        kind: str = "result",
        deps: Any = None,
        durability: AgentsnapDurability | None = None,
        state: PydanticAIState | None = None,
    ) -> None:
        super().__init__(name, state)
        require_kind(
            agent, AbstractAgent, f"agent {name!r} needs a pydantic-ai agent (pydantic_ai.Agent)"
        )
        self.agent = agent
        """The pydantic-ai agent."""
        self.to = to
        """Where the output goes (``None``: the sender)."""
        self.kind = kind
        """The kind of the messages sent."""
        self.deps = deps
        """The ``deps`` of every run."""
        own = _durability_of(agent)
        self.durability = own or durability or AgentsnapDurability()
        """The capability that records the agent's calls."""
        self._added: list[AbstractCapability[Any]] | None = None if own else [self.durability]

    async def handle(self, message: Message, ctx: Context[PydanticAIState]) -> None:
        """Run the pydantic-ai agent on the message and send its output on.

        Args:
            message: The delivered message.
            ctx: The agent's context.
        """
        state = self.state
        history = messages_from_json(state.messages)
        prompt = self.user_prompt(message, ctx)
        with handling(ctx):
            result = await self.agent.run(
                prompt,
                message_history=history or None,
                deps=self.deps_for(message, ctx),
                capabilities=self._added,
                **self.run_options(message, ctx),
            )
        state.messages = messages_json(result.all_messages())
        state.output = json_of(result.output)
        state.runs += 1
        state.feedback_seen = len(ctx.feedback)
        for outgoing in self.outputs(result.output, message, ctx):
            ctx.send(outgoing.to, outgoing.payload, kind=outgoing.kind)

    def user_prompt(self, message: Message, ctx: Context[PydanticAIState]) -> str:
        """The run's user prompt for a message; override it to shape the prompt.

        By default the payload (a string as it is, other JSON as JSON text), followed by the
        feedback the conversation has not been told, one paragraph each
        ([`Feedback.text`][agentsnap.Feedback.text]: the reason, then the effects that
        already happened).

        Args:
            message: The delivered message.
            ctx: The agent's context.
        """
        payload = message.payload
        text = payload if isinstance(payload, str) else json.dumps(payload, sort_keys=True)
        for feedback in self.unseen_feedback(ctx):
            text += f"\n\nYour earlier answer was rejected by {feedback.source}: {feedback.text()}"
        return text

    def unseen_feedback(self, ctx: Context[PydanticAIState]) -> Sequence[Feedback]:
        """The feedback the conversation, as restored, has not been told, oldest first.

        ``ctx.feedback`` keeps every reason the agent was given in the run; a rollback takes
        the conversation back to before the rejected answer, so the reasons given since are
        told again, once per branch.
        """
        return ctx.feedback[self.state.feedback_seen :]

    def deps_for(self, message: Message, ctx: Context[PydanticAIState]) -> Any:
        """The ``deps`` of the run for a message; by default the agent's ``deps``."""
        return self.deps

    def run_options(self, message: Message, ctx: Context[PydanticAIState]) -> Mapping[str, Any]:
        """More keyword arguments of the run for a message (none by default).

        Override it to pass what pydantic-ai's ``Agent.run`` takes besides the prompt, the
        history, ``deps`` and the capabilities: ``model`` (a model name, or an instance
        registered in ``AgentsnapDurability(models=...)``), ``usage_limits``,
        ``model_settings``, ``toolsets``, ``output_type``, ``instructions``...

        Args:
            message: The delivered message.
            ctx: The agent's context.
        """
        return {}

    def outputs(
        self, output: Any, message: Message, ctx: Context[PydanticAIState]
    ) -> Iterable[Outgoing]:
        """The messages to send once the run ended; override it to route the output.

        By default the output, as JSON, goes to ``to``, or back to the sender (nothing is
        sent when the sender is the program). Rejecting here (``ctx.reject``) rolls the run
        back as from any handler.

        Args:
            output: The run's output.
            message: The message the agent ran on.
            ctx: The agent's context.
        """
        to = self.to if self.to is not None else message.src
        if to == ENVIRONMENT:
            return ()
        payload = output if isinstance(output, BaseModel) else json_of(output)
        return (Outgoing(to, payload, self.kind),)


def _durability_of(agent: AbstractAgent[Any, Any]) -> AgentsnapDurability | None:
    """The agent's own durability capability, if it holds one."""
    root = getattr(agent, "_root_capability", None)
    found: list[AgentsnapDurability] = []
    if isinstance(root, AbstractCapability):
        root.apply(lambda c: found.append(c) if isinstance(c, AgentsnapDurability) else None)
    return found[0] if found else None
