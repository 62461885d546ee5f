"""An OpenAI Agents SDK agent running as an agentsnap agent."""

from __future__ import annotations

import dataclasses
import inspect
import json
import re
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Collection,
    Iterable,
    Mapping,
    Sequence,
)
from typing import Any, NamedTuple, TypeAlias

from agents import Agent as SDKAgent
from agents import RunConfig, Runner
from agents.exceptions import OutputGuardrailTripwireTriggered
from agents.handoffs import Handoff, handoff
from agents.items import ModelResponse as SDKResponse
from agents.models.interface import Model
from agents.result import RunResultBase
from agents.stream_events import StreamEvent
from agents.tool import FunctionTool
from pydantic import BaseModel, Field

from agentsnap.agents import Agent, Context, Feedback
from agentsnap.bus import check_agent_name
from agentsnap.exceptions import AgentsnapError, ConfigurationError
from agentsnap.integrations import require_kind
from agentsnap.integrations._running import handling
from agentsnap.integrations.openai_agents._model import RecordedModel, as_json
from agentsnap.integrations.openai_agents._session import AgentsnapSession
from agentsnap.integrations.openai_agents._tools import ledgered, through_agentsnap
from agentsnap.messages import ENVIRONMENT, JsonValue, Message
from agentsnap.state import AgentState

__all__ = [
    "OnEvent",
    "OpenAIAgent",
    "OpenAIAgentState",
    "Outgoing",
    "agent_name",
    "guardrail_verdict",
]


OnEvent: TypeAlias = Callable[[str, StreamEvent], Awaitable[None] | None]
"""Takes the stream events of an SDK agent run streamed: the agentsnap agent's name and
the SDK's event (``raw_response_event``, ``run_item_stream_event``,
``agent_updated_stream_event``)."""


class OpenAIAgentState(AgentState):
    """State of an [`OpenAIAgent`][agentsnap.integrations.openai_agents.OpenAIAgent].

    The SDK agent's conversation is its session, kept here, so every snapshot holds it and
    a rollback or a resume sends it back with the rest of the team. Tool calls made by the
    SDK agent through agentsnap are in ``tool_calls``.
    """

    items: list[dict[str, JsonValue]] = Field(default_factory=list)
    """The SDK session's items, oldest first: inputs, the model's messages and tool calls,
    the tools' outputs, as the SDK gives them to the model (its Responses input items)."""
    output: JsonValue = None
    """The final output of the SDK agent's last run, as JSON."""
    runs: int = 0
    """How many messages the SDK agent answered (handoffs not counted)."""
    handed_off_to: str | None = None
    """The agentsnap agent the last message was handed off to, if it was."""
    feedback_seen: int = 0
    """How many of the agent's feedback items (``ctx.feedback``) its conversation holds;
    the others go into the next input."""
    last_response_id: str | None = None
    """With ``chain_responses``: the id of the provider's last response, from which the
    next run continues (the conversation is kept at the provider, not in ``items``)."""


class Outgoing(NamedTuple):
    """A message an OpenAI agent sends after its SDK agent answered."""

    to: str
    """The receiving agent."""
    payload: JsonValue | BaseModel
    """The payload: a JSON value or a pydantic model."""
    kind: str = "output"
    """What the message is."""


def agent_name(sdk_name: str) -> str:
    """The agentsnap agent name that stands for an SDK agent's name by default.

    Characters agentsnap names do not take become ``_`` (``"Billing agent"`` is
    ``"Billing_agent"``).

    Args:
        sdk_name: The SDK agent's ``name``.

    Returns:
        A valid agentsnap agent name.
    """
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", sdk_name).strip(".-")[:128] or "agent"
    return check_agent_name(name)


class _HandedOff(BaseException):
    """The SDK agent handed off: its run stops where the target agent would begin."""

    def __init__(self, target: str, items: list[Any]) -> None:
        super().__init__(target)
        self.target = target
        self.items = items


class _HandOver(Model):
    """The model of the stand-in for a handoff's target: stops the run with the target's input.

    The SDK gives the target agent's model the conversation as the target sees it (with the
    handoff's input filter applied); that is what the handoff message carries.
    """

    def __init__(self, target: str) -> None:
        self.target = target

    async def get_response(self, *args: Any, **kwargs: Any) -> SDKResponse:
        given = kwargs["input"] if "input" in kwargs else args[1]
        items = [{"role": "user", "content": given}] if isinstance(given, str) else given
        raise _HandedOff(self.target, as_json(list(items)))

    async def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        await self.get_response(*args, **kwargs)  # raises _HandedOff
        yield  # pragma: no cover - an async generator, as the SDK iterates it


class OpenAIAgent(Agent[OpenAIAgentState]):
    """Runs an OpenAI Agents SDK agent for each message, as an agentsnap agent.

    Each message becomes the SDK agent's input
    ([`sdk_input`][agentsnap.integrations.openai_agents.OpenAIAgent.sdk_input]) and the SDK
    runs it (``Runner.run``) inside this agent's handler, with:

    - its model behind a [`RecordedModel`][agentsnap.integrations.openai_agents.RecordedModel]:
      every model call is a recorded step, replayed after a crash and asked again after a
      rollback;
    - its session in this agent's state
      ([`AgentsnapSession`][agentsnap.integrations.openai_agents.AgentsnapSession]), in
      every consistent cut;
    - its handoffs as messages: a handoff to another SDK agent stops the run and sends the
      conversation, as the target would see it, to the agentsnap agent wrapping the target
      (kind ``"handoff"``), which goes on from there;
    - every function tool through the ledger
      ([`ledgered`][agentsnap.integrations.openai_agents.ledgered]), unless it is named in
      ``read_only``: a redo after a rollback or a resume gets the recorded result instead
      of running it again. Tools made with
      [`function_tool`][agentsnap.integrations.openai_agents.function_tool],
      [`as_sdk_tool`][agentsnap.integrations.openai_agents.as_sdk_tool] or ``ledgered``
      go through agentsnap already, as they declare.

    The final output is kept in the state and sent as an ``"output"`` message
    ([`outputs`][agentsnap.integrations.openai_agents.OpenAIAgent.outputs]) to the
    message's ``reply_to``, else to ``reply_to`` given here, else back to the agent that
    asked. A check, a schema, a critic or ``evaluate`` that rejects it rolls the team back;
    this agent runs the message again with the reason added to its input. So does one of
    the SDK agent's output guardrails that trips (``OutputGuardrailTripwireTriggered``): its
    ``output_info`` is the reason
    ([`guardrail_verdict`][agentsnap.integrations.openai_agents.guardrail_verdict]), within
    the run's retry budget.

    Args:
        name: The agentsnap agent's name (by default the SDK agent's, made valid).
        agent: The SDK agent.
        handoffs: The agentsnap agent wrapping each handoff target, by the target SDK
            agent's name; by default [`agent_name`][agentsnap.integrations.openai_agents.agent_name]
            of it.
        read_only: Names of the SDK agent's function tools that do not change the world
            (lookups, searches): they run directly, again on a redo. Every other function
            tool is ledger-backed.
        reply_to: Where the final output goes when the message does not say.
        run_config: The SDK's run configuration (its ``model``, if set, is recorded too).
        max_turns: The SDK's bound on model calls per message.
        context: The SDK's run context object, passed to every run.
        snapshot_at_handoff: Start a snapshot as a handoff is sent (the default), so that the
            handoff is in flight in a cut, the conversation it carries stored, and a later
            rejection of the target's output goes back to it instead of asking this agent's
            model again.
        chain_responses: Keep the conversation at the provider (the Responses API's
            ``previous_response_id``) instead of in the session. The state records the id
            of the last response (``last_response_id``); each run continues from it. A
            response id names the conversation up to that response and the provider keeps
            every one, so a rollback, which restores the cut's id, continues from the cut's
            point and the undone answers are never built on. ``conversation_id`` (the
            Conversations API) is refused: a conversation object at the provider is changed
            in place, and a rollback cannot undo that.
        on_event: Run the SDK agent streamed (``Runner.run_streamed``) and hand every
            stream event to this function, with this agent's name, as it comes. Each
            model call is still one recorded step, recorded once its stream is complete; a
            replayed call streams its recorded answer
            ([`RecordedModel.stream_response`][agentsnap.integrations.openai_agents.RecordedModel.stream_response]).
            Events of a handler that a rollback throws away have been handed on already:
            a consumer that shows them should start the agent's answer again at its next
            ``agent_updated_stream_event``.
        state: The initial state.

    Raises:
        ConfigurationError: ``agent`` is not an SDK agent, ``read_only`` names a tool the
            SDK agent does not have as a function tool, or the SDK agent has
            ``mcp_servers`` (their tools would bypass the ledger).
    """

    def __init__(
        self,
        name: str | None,
        agent: SDKAgent[Any],
        *,
        handoffs: Mapping[str, str] | None = None,
        read_only: Collection[str] = (),
        reply_to: str | None = None,
        run_config: RunConfig | None = None,
        max_turns: int = 10,
        context: Any = None,
        snapshot_at_handoff: bool = True,
        chain_responses: bool = False,
        on_event: OnEvent | None = None,
        state: OpenAIAgentState | None = None,
    ) -> None:
        require_kind(
            agent, SDKAgent, "OpenAIAgent takes an agent of the OpenAI Agents SDK (agents.Agent)"
        )
        super().__init__(name if name is not None else agent_name(agent.name), state)
        self.sdk_agent = agent
        """The SDK agent, as given."""
        self.session = AgentsnapSession(self)
        """The SDK session kept in this agent's state."""
        self.reply_to = reply_to
        """Where the final output goes when the message does not say."""
        self.max_turns = max_turns
        """The SDK's bound on model calls per message."""
        self.context = context
        """The SDK's run context object."""
        self.snapshot_at_handoff = snapshot_at_handoff
        """Whether a handoff starts a snapshot."""
        self.chain_responses = chain_responses
        """Whether the conversation is kept at the provider, chained by response ids."""
        self.on_event = on_event
        """Where the stream events go, when the SDK agent runs streamed."""
        config = run_config if run_config is not None else RunConfig()
        model: Model | str | None = agent.model
        if config.model is not None:
            # The run's model would replace every agent's, the handoff stand-ins' too: it
            # goes onto the agent instead, recorded.
            model = config.model
            config = dataclasses.replace(config, model=None)
        self.run_config = config
        """The SDK's run configuration this agent runs with."""
        self.targets: dict[str, str] = {}
        """The agentsnap agent each handoff goes to, by the target SDK agent's name."""
        self.runnable = agent.clone(
            model=RecordedModel(model, config.model_provider),
            tools=self._tools(agent, read_only),
            handoffs=[self._handoff(h, handoffs or {}) for h in agent.handoffs],
        )
        """The SDK agent as it runs: recorded model, ledgered tools, handoffs as messages."""

    def _tools(self, agent: SDKAgent[Any], read_only: Collection[str]) -> list[Any]:
        if isinstance(read_only, str):
            raise ConfigurationError(
                f"read_only of agent {self.name!r} takes tool names, got the string "
                f"{read_only!r}; pass [{read_only!r}]"
            )
        if agent.mcp_servers:
            raise ConfigurationError(
                f"SDK agent {agent.name!r} has mcp_servers, whose tools the SDK calls without "
                "agentsnap's ledger; give the agent the servers' tools instead: "
                "tools=[as_sdk_tool(t) for t in await mcp_tools(session)] "
                "(agentsnap.integrations.mcp)"
            )
        names = {t.name for t in agent.tools if isinstance(t, FunctionTool)}
        unknown = sorted(set(read_only) - names)
        if unknown:
            raise ConfigurationError(
                f"read_only of agent {self.name!r} names {unknown!r}, which are not "
                f"function tools of SDK agent {agent.name!r} (its function tools: "
                f"{sorted(names)!r})"
            )
        return [
            t
            if not isinstance(t, FunctionTool) or through_agentsnap(t) or t.name in read_only
            else ledgered(t)
            for t in agent.tools
        ]

    def _handoff(self, given: SDKAgent[Any] | Handoff[Any, Any], names: Mapping[str, str]) -> Any:
        made: Handoff[Any, Any] = handoff(given) if isinstance(given, SDKAgent) else given
        target = names.get(made.agent_name) or agent_name(made.agent_name)
        self.targets[made.agent_name] = target
        stand_in: SDKAgent[Any] = SDKAgent(name=made.agent_name, model=_HandOver(target))
        invoke = made.on_invoke_handoff

        async def hand_over(run_context: Any, arguments: str) -> SDKAgent[Any]:
            await invoke(run_context, arguments)  # the handoff's own on_handoff, if any
            return stand_in

        return dataclasses.replace(made, on_invoke_handoff=hand_over)

    async def handle(self, message: Message, ctx: Context[OpenAIAgentState]) -> None:
        """Run the SDK agent on the message; hand off or send its final output.

        Args:
            message: The delivered message.
            ctx: The agent's context.

        Raises:
            AgentsnapError: What agentsnap raised inside the SDK's run (a store fault, a
                divergence, an unknown outcome), unwrapped from the SDK's errors.
        """
        given = self.sdk_input(message, ctx)
        reply_to = self.reply_target(message)
        state = self.state
        try:
            with handling(ctx):
                result = await self._run(given)
        except _HandedOff as handed:
            state.feedback_seen = len(ctx.feedback)
            state.handed_off_to = handed.target
            payload: dict[str, JsonValue] = {
                "input": handed.items,
                "from": self.sdk_agent.name,
                "reply_to": reply_to,
            }
            ctx.send(handed.target, payload, kind="handoff")
            if self.snapshot_at_handoff:
                ctx.snapshot()
            return
        except OutputGuardrailTripwireTriggered as tripped:
            # The SDK's judge of the final output said no: a rejection like a check's, so
            # the team goes back to the last cut and this agent retries, told why.
            name, reason = guardrail_verdict(tripped)
            ctx.reject(self.name, reason, source=f"guardrail {name}")
        except Exception as exc:
            inner = _agentsnap_error(exc)
            if inner is not None and inner is not exc:
                raise inner from exc
            raise
        state.feedback_seen = len(ctx.feedback)
        state.handed_off_to = None
        if self.chain_responses:
            state.last_response_id = result.last_response_id
        state.output = as_json(result.final_output)
        state.runs += 1
        for outgoing in self.outputs(result, message, ctx):
            ctx.send(outgoing.to, outgoing.payload, kind=outgoing.kind)

    async def _run(self, given: str | list[Any]) -> RunResultBase:
        """Run the SDK agent, streamed when there is an ``on_event``."""
        if self.on_event is None:
            return await Runner.run(
                self.runnable,
                given,
                run_config=self.run_config,
                max_turns=self.max_turns,
                context=self.context,
                **self._conversation(),
            )
        streamed = Runner.run_streamed(
            self.runnable,
            given,
            run_config=self.run_config,
            max_turns=self.max_turns,
            context=self.context,
            **self._conversation(),
        )
        async for event in streamed.stream_events():
            handed = self.on_event(self.name, event)
            if inspect.isawaitable(handed):
                await handed
        return streamed

    def _conversation(self) -> dict[str, Any]:
        """Where the SDK keeps the conversation: the session, or the provider's chain."""
        if not self.chain_responses:
            return {"session": self.session}
        # The first run starts the chain; every later one continues from the state's id.
        previous = self.state.last_response_id
        return {"previous_response_id": previous, "auto_previous_response_id": previous is None}

    def sdk_input(self, message: Message, ctx: Context[OpenAIAgentState]) -> str | list[Any]:
        """The SDK agent's input for a message; override it to shape the input.

        A handoff's conversation, the ``input`` of an object payload, a string or a list of
        input items; any other payload as its JSON text. The reasons of rejections the
        conversation has not seen yet follow, one user item each
        ([`unseen_feedback`][agentsnap.integrations.openai_agents.OpenAIAgent.unseen_feedback]).

        Args:
            message: The delivered message.
            ctx: The agent's context.

        Returns:
            A string, or a list of the SDK's input items.
        """
        payload = message.payload
        given: Any = (
            payload["input"] if isinstance(payload, Mapping) and "input" in payload else payload
        )
        if not isinstance(given, (str, list)):
            given = json.dumps(given)
        unseen = self.unseen_feedback(ctx)
        if not unseen:
            return given if isinstance(given, str) else list(given)
        items = [{"role": "user", "content": given}] if isinstance(given, str) else list(given)
        items.extend(
            {
                "role": "user",
                "content": f"Your earlier answer to this was rejected by {f.source}: {f.text()}",
            }
            for f in unseen
        )
        return items

    def unseen_feedback(self, ctx: Context[OpenAIAgentState]) -> Sequence[Feedback]:
        """The feedback the conversation in the restored state has not seen, oldest first.

        Args:
            ctx: The agent's context.

        Returns:
            Feedback given since the state's conversation last took some in.
        """
        return ctx.feedback[self.state.feedback_seen :]

    def reply_target(self, message: Message) -> str | None:
        """Where the final output for ``message`` goes.

        The message's ``reply_to`` (an object payload's key, carried on by handoffs), else
        ``reply_to`` given to the agent, else the agent that sent a message other than a
        handoff; ``None``: the output stays in the state.

        Args:
            message: The delivered message.

        Returns:
            The receiving agent's name, or ``None``.
        """
        payload = message.payload
        if isinstance(payload, Mapping) and "reply_to" in payload:
            named = payload["reply_to"]
            return named if isinstance(named, str) else None
        if self.reply_to is not None:
            return self.reply_to
        if message.src != ENVIRONMENT and message.kind != "handoff":
            return message.src
        return None

    def outputs(
        self, result: RunResultBase, message: Message, ctx: Context[OpenAIAgentState]
    ) -> Iterable[Outgoing]:
        """The messages to send once the SDK agent answered; override it to route them.

        By default one ``"output"`` message to the
        [`reply_target`][agentsnap.integrations.openai_agents.OpenAIAgent.reply_target]:
        ``{"output": ..., "agent": ..., "by": ...}`` (the final output as JSON, the SDK
        agent's name, this agent's name). Raising
        [`OutputRejected`][agentsnap.OutputRejected] here, through ``ctx.reject``, rolls
        the run back as from any handler.

        Args:
            result: The SDK's result (a ``RunResultStreaming`` when streamed).
            message: The message the SDK agent ran on.
            ctx: The agent's context.

        Returns:
            The messages to send, in order.
        """
        target = self.reply_target(message)
        if target is None:
            return ()
        payload: dict[str, JsonValue] = {
            "output": self.state.output,
            "agent": result.last_agent.name,
            "by": self.name,
        }
        return (Outgoing(target, payload, "output"),)


def guardrail_verdict(tripped: OutputGuardrailTripwireTriggered) -> tuple[str, str]:
    """The name of the output guardrail that tripped, and its reason, for the feedback.

    The reason is the guardrail's ``output_info``: a string as it is, the ``reason`` of an
    object (a dict or a pydantic model with a ``reason`` field) or else its JSON; with no
    ``output_info``, a sentence naming the guardrail.

    Args:
        tripped: What the SDK raised.

    Returns:
        ``(name, reason)``.
    """
    result = tripped.guardrail_result
    name = result.guardrail.get_name()
    info = as_json(result.output.output_info)
    if isinstance(info, str) and info.strip():
        return name, info
    if isinstance(info, Mapping) and isinstance(info.get("reason"), str) and info["reason"]:
        return name, str(info["reason"])
    if info is None or info == "":
        return name, f"the output guardrail {name!r} rejected the answer"
    return name, json.dumps(info, ensure_ascii=False)


def _agentsnap_error(exc: BaseException) -> BaseException | None:
    """The agentsnap error an SDK error wraps (a tool's failure the SDK reports), if any."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, AgentsnapError):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None
