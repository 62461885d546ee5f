"""Agents and the context handed to their handlers.

An agent is a named actor with a typed state. The runtime calls its
[`handle`][agentsnap.Agent.handle] method with one message at a time; the handler reads and
updates ``self.state`` and talks to other agents through the [`Context`][agentsnap.Context].

Example:
    ```python
    from agentsnap import Agent, AgentState, Context, Message

    class CounterState(AgentState):
        count: int = 0

    class Counter(Agent[CounterState]):
        async def handle(self, message: Message, ctx: Context) -> None:
            self.state.count += 1
            if message.payload.get("reply_to"):
                ctx.send(message.payload["reply_to"], {"count": self.state.count})
    ```
"""

from __future__ import annotations

import abc
import inspect
import json
import logging
import time
import typing
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, ClassVar, Generic, NoReturn, Protocol, TypeGuard, TypeVar

from pydantic import BaseModel

from agentsnap._handler import HandlerEngine, Timeline
from agentsnap.bus import check_agent_name
from agentsnap.checks import Guard, failure_reason
from agentsnap.exceptions import (
    ApprovalDenied,
    ConfigurationError,
    OutputRejected,
    RequestExpired,
    RequestRejected,
)
from agentsnap.messages import ENVIRONMENT, JsonValue
from agentsnap.model_calls import recorded_call
from agentsnap.models import (
    ChatMessage,
    ChatModel,
    ModelRequest,
    ModelResponse,
    ToolCallingModel,
    ToolSpec,
    ask,
    request_of,
)
from agentsnap.records import utcnow
from agentsnap.requests import (
    APPROVAL,
    QUESTION,
    Approval,
    HumanRequest,
    OnDeadline,
    approval_question,
    deadline_of,
    request_id,
    wait_for_answer,
)
from agentsnap.state import AgentState, plain_canonical_json

if TYPE_CHECKING:
    from agentsnap.bus import Bus, Endpoint
    from agentsnap.checks import CheckResult, OutputCheck
    from agentsnap.handles import SnapshotHandle
    from agentsnap.messages import JsonInput, Message
    from agentsnap.records import RollbackInfo

__all__ = [
    "Agent",
    "BoundModel",
    "Context",
    "DoneEffect",
    "Feedback",
    "Initiator",
    "Timeline",
    "evaluate_outputs",
    "guard_for",
]

S = TypeVar("S", bound=AgentState)

logger = logging.getLogger("agentsnap")


class DoneEffect(BaseModel):
    """A side effect that already happened on a path a rollback undid.

    The rejected agent finds them in its feedback ([`Feedback.done`][agentsnap.Feedback.done]).
    """

    tool: str
    """Name of the tool."""
    arguments: dict[str, JsonValue]
    """The arguments it ran with."""
    result: JsonValue = None
    """What it returned."""
    key: str
    """Its idempotency key in the ledger."""


class Feedback(BaseModel):
    """Something the runtime tells an agent about its earlier work (a rejection, say)."""

    reason: str
    """What was wrong."""
    source: str
    """Who said so: an agent name, a validator, the runtime."""
    done: tuple[DoneEffect, ...] = ()
    """Side effects the agent's undone work already performed (a rollback's feedback lists
    them; other feedback has none). They happened and stay done: calling the same tool at
    the same place again returns the recorded outcome instead of running it a second time,
    unless the tool declares ``on_redo``."""

    def text(self) -> str:
        """The feedback as words for a model: the reason, then what was already done.

        Put it into the redo's prompt, so that the model does not ask for an effect that
        happened already:

        ```python
        from agentsnap import DoneEffect, Feedback

        feedback = Feedback(
            reason="too long",
            source="critic",
            done=(DoneEffect(tool="send", arguments={"to": "ann"}, result="ok", key="k"),),
        )
        assert feedback.text().splitlines()[-1] == '- send({"to": "ann"}) -> "ok"'
        ```
        """
        if not self.done:
            return self.reason
        lines = [self.reason, "Already done (these happened and will not run again):"]
        lines.extend(
            f"- {effect.tool}({json.dumps(effect.arguments, sort_keys=True)}) -> "
            f"{json.dumps(effect.result, sort_keys=True, default=str)}"
            for effect in self.done
        )
        return "\n".join(lines)


class _StateSlot:
    """``Agent.state``: assigning it marks the state changed for the next snapshot.

    Only ``__set__`` is defined, so reading ``agent.state`` finds the instance's own attribute
    as fast as a plain one; an assignment stores it there and tells the runtime.
    """

    __slots__ = ()

    def __set__(self, agent: Agent[Any], value: Any) -> None:
        attributes = agent.__dict__
        attributes["state"] = value
        changed = attributes.get("_state_changed")
        if changed is not None:
            changed.add(agent.name)


class Agent(abc.ABC, Generic[S]):
    """Base class of agents.

    Subclass it with the type of your state as parameter, ``Agent[MyState]``, and implement
    [`handle`][agentsnap.Agent.handle]. The state type is read from that parameter; set
    ``state_type`` yourself only when the parameter is a type variable.

    A model kept in an attribute (``self.model = model`` in ``__init__``) is put behind a
    [`BoundModel`][agentsnap.agents.BoundModel] when the agent is registered, so that its
    calls from a handler are recorded as [`Context.chat`][agentsnap.Context.chat] records
    them.

    Args:
        name: Unique name within the runtime: 1 to 128 characters of ``[A-Za-z0-9_.-]``.
        state: Initial state; by default the state type built with no arguments.

    Attributes:
        name: The agent's name.
        state: The agent's current state. Update it in the handler; snapshots never record
            it half-way through a handler (inside a long one, they record the state from
            before it, with its message in flight; the snapshot a handler starts itself
            with [`ctx.snapshot()`][agentsnap.Context.snapshot] records it as that handler
            returns). A snapshot encodes it
            again only if it may have changed since the last one: after a message was
            delivered to the agent, ``on_rollback``, or an assignment to ``agent.state``.
            Code that changes it in place anywhere else must say so with
            [`Runtime.mark_changed`][agentsnap.Runtime.mark_changed].
    """

    state_type: ClassVar[type[AgentState]] = AgentState
    """The pydantic model of this agent's state."""

    if TYPE_CHECKING:
        state: S
    else:
        state = _StateSlot()

    _state_changed: set[str] | None = None
    # Set by the runtime that registers the agent: where an assignment to ``state`` is noted.

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for base in getattr(cls, "__orig_bases__", ()):
            # Agent[S] itself, or a generic subclass of it given the state type.
            origin = typing.get_origin(base)
            if not (isinstance(origin, type) and issubclass(origin, Agent)):
                continue
            args = typing.get_args(base)
            if len(args) != 1:
                continue
            (arg,) = args
            if isinstance(arg, TypeVar):
                continue  # a generic subclass; its own subclasses name the state type
            if isinstance(arg, type) and issubclass(arg, AgentState):
                cls.state_type = arg
            else:
                shown = arg.__name__ if isinstance(arg, type) else repr(arg)
                raise ConfigurationError(
                    f"{cls.__name__} is declared as {origin.__name__}[{shown}], but the state "
                    "type must be a subclass of agentsnap.AgentState, given as the class itself"
                )

    def __init__(self, name: str, state: S | None = None) -> None:
        self.name = check_agent_name(name)
        if state is None:
            state = typing.cast("S", self.state_type())
        elif not isinstance(state, self.state_type):
            raise ConfigurationError(
                f"agent {name!r} of type {type(self).__name__} needs a state of type "
                f"{self.state_type.__name__}, got {type(state).__name__}"
            )
        self.state: S = state

    @abc.abstractmethod
    async def handle(self, message: Message, ctx: Context[S]) -> None:
        """Handle one message.

        Args:
            message: The message delivered to this agent.
            ctx: Sends messages, requests snapshots, tells the run and any feedback.
        """

    async def evaluate(self, outputs: Sequence[Message], ctx: Context[S]) -> CheckResult:
        """Judge what the handler just did (self-evaluation); the default accepts everything.

        Override it to check your own work: it is called after every ``handle`` that
        returned normally, with the messages that handler sent. Return ``True`` or ``None``
        to accept; ``False``, a reason string or ``Verdict.failed(reason)`` to reject, which
        rolls the run back to the last consistent cut and hands you the reason as feedback.

        Args:
            outputs: The messages the handler sent, in order.
            ctx: The handler's context; ``ctx.message`` is the message it handled.
        """
        return None

    async def on_rollback(self, rollback: RollbackInfo, ctx: Context[S]) -> None:
        """Called on every agent after a rollback restored its state; does nothing by default.

        Args:
            rollback: What happened: the agent whose output was rejected, why, by what, and
                the snapshot the run went back to.
            ctx: The agent's context (its ``feedback`` holds the reason when the rejected
                output was this agent's).
        """

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"


class Initiator(Protocol):
    """What a handler's context needs of the snapshot layer: starting a snapshot.

    The runtime's [`SnapshotCoordinator`][agentsnap.snapshot.SnapshotCoordinator] is one.
    """

    def begin(
        self, initiator: Endpoint | None = None, *, at_return: bool = False
    ) -> SnapshotHandle:
        """Start a snapshot with ``initiator`` (an agent, or ``None`` for the runtime).

        ``at_return``: the initiator asks from inside its running handler, and records as
        that handler returns.
        """


class Context(Generic[S]):
    """What a handler can do besides changing its own state.

    One context belongs to each agent; ``message`` is the message being handled.
    """

    __slots__ = (
        "_bus",
        "_endpoint",
        "_engine",
        "_feedback",
        "_snapshots",
        "agent",
        "message",
        "run_id",
    )

    def __init__(
        self,
        agent: Agent[S],
        endpoint: Endpoint,
        bus: Bus,
        snapshots: Initiator,
        run_id: str,
    ) -> None:
        self.agent = agent
        """The agent handling the message."""
        self.run_id = run_id
        """Id of the run."""
        self.message: Message | None = None
        """The message being handled."""
        self._endpoint = endpoint
        self._bus = bus
        self._snapshots = snapshots
        self._feedback: list[Feedback] = []
        self._engine = HandlerEngine()
        _bind_models(self)

    @property
    def timeline(self) -> int:
        """The run's timeline: 0 at first, one more after each rollback.

        A resumed run goes on with the timeline it was on.
        """
        line = self._engine.line
        return 0 if line is None else line.timeline

    async def chat(
        self,
        model: ChatModel | ToolCallingModel,
        messages: str | Sequence[ChatMessage | Mapping[str, Any]],
        *,
        tools: Sequence[ToolSpec | Any] = (),
        output_schema: Mapping[str, JsonValue] | None = None,
        settings: Mapping[str, JsonValue] | None = None,
    ) -> ModelResponse:
        """Ask ``model`` and get its whole answer: text, tool calls, output, usage.

        The call is a recorded step (see [Model calls](../concepts/model-calls.md)): its
        request and answer are in the store before the answer is returned, keyed by the run,
        this agent, the message being handled, the call's position in this handler and the
        run's timeline. A handler re-executed after a crash and ``resume()`` gets the
        recorded answer without asking the model; after a rollback the model is asked
        again. Outside a handler (``on_rollback``, or with no store) the model is just asked.

        Args:
            model: A [`ToolCallingModel`][agentsnap.models.ToolCallingModel], or a
                [`ChatModel`][agentsnap.models.ChatModel] (asked with the conversation as
                one prompt; its answer is text only).
            messages: A prompt, or the conversation (``ChatMessage`` objects, or
                dictionaries of their fields).
            tools: Tools offered: ``ToolSpec`` objects or ``@tool`` functions.
            output_schema: JSON Schema for a structured ``output``.
            settings: Model settings, passed on as they are.

        Returns:
            The model's answer (recorded, or replayed).

        Raises:
            ConfigurationError: ``model`` is not a model, or a message or tool is not of a
                kind this takes.
            StoreError: The answer could not be recorded; the handler fails and is redone
                when the database answers, rather than act on an answer a crash would lose.
        """
        request = request_of(messages, tools=tools, output_schema=output_schema, settings=settings)
        if isinstance(model, BoundModel):
            # A model kept on the agent records its calls itself: asked through it, this call
            # would be recorded twice, at two positions, and a replay (which never reaches the
            # inner record) would give the handler's next call this call's answer.
            model = model.model
        chosen = model
        return await self.model_call(request, lambda r: ask(chosen, r))

    async def model_call(
        self,
        request: ModelRequest,
        ask: Callable[[ModelRequest], Awaitable[ModelResponse]],
    ) -> ModelResponse:
        """Make one model call a recorded step, however the model is asked.

        What [`chat`][agentsnap.Context.chat] does with a model it is given, for code that
        asks a model its own way: an agent SDK's integration, whose SDK builds the request
        and reads the answer. ``ask`` is awaited only when no answer is recorded for this
        call's identity (the run, this agent, the message being handled, the call's
        position in this handler, the run's timeline); its answer is in the store before it
        is returned. An integration keeps the SDK's own form of the request and the answer
        in their ``native`` fields, and gives the SDK back the recorded one on a replay.

        Args:
            request: The request, as it is recorded (and shown by ``agentsnap model-calls``).
            ask: Asks the model.

        Returns:
            The answer (recorded, or replayed).

        Raises:
            StoreError: The answer could not be recorded; the handler fails and is redone
                when the database answers, rather than act on an answer a crash would lose.
        """
        message = self.message
        engine = self._engine
        log = engine.model_calls
        if message is None or log is None:
            return await ask(request)
        position = engine.position
        engine.position = position + 1
        line = engine.line
        timeline = 0 if line is None else line.timeline
        replay = engine.replay
        if replay is not None and replay.written < timeline:
            # The timeline is durable before a call is recorded on it: a run resumed after a
            # crash goes on with it, instead of starting another timeline of the same number
            # whose calls would get this one's answers.
            await replay.flush()
        response, _ = await recorded_call(
            log,
            request,
            ask,
            run_id=self.run_id,
            agent=self.agent.name,
            message_id=message.id,
            position=position,
            timeline=timeline,
            look_up=line is None or timeline <= line.resumed,
            redaction=engine.redaction,
        )
        return response

    async def ask(
        self,
        question: JsonValue,
        *,
        schema: Mapping[str, JsonValue] | None = None,
        who: str | None = None,
        deadline: float | timedelta | datetime | None = None,
        on_deadline: OnDeadline = "fail",
        default: JsonValue = None,
    ) -> JsonValue:
        """Ask a person and wait for the answer; a durable step, as a model call is.

        The request is in the store before the handler waits, keyed by the run, this agent,
        the message being handled, the step's position in this handler and the run's
        timeline (see [Ask a person before acting](../how-to/ask-a-person.md)). It is
        answered from any process: ``agentsnap answer REQUEST --json '...'``,
        [`agentsnap.inspect.answer`][agentsnap.inspect.answer], the inspector's HTTP API.
        A handler re-executed after a crash and ``resume()`` finds the same request, and its
        answer if it was given meanwhile, even while no process ran. After a rollback the
        request is withdrawn, and the redone handler asks again.

        While the handler waits, a snapshot records the agent from before the handler, with
        its message in flight (unless the handler already sent a message another agent can
        see: ask before sending). So a cut taken during the wait holds the request as it
        holds the message: a rollback or a fork to it asks again.

        Args:
            question: What to ask: text, or any JSON the person's tools show.
            schema: JSON Schema the answer must fit (checked when it is given).
            who: Who may answer, a free label (a team, a role, a person).
            deadline: Seconds (or a ``timedelta``) from now, or a ``datetime``, when
                ``on_deadline`` applies if nobody answered. Kept with the request: a
                re-executed handler keeps the first deadline.
            on_deadline: ``"fail"`` (the default: ``RequestExpired``, the handler fails and
                so the run), ``"default"`` (the answer is ``default``), or ``"reject"``
                (``RequestRejected``).
            default: The answer the deadline gives with ``on_deadline="default"``.

        Returns:
            The answer, as JSON.

        Raises:
            RequestRejected: The person turned the request down (``--deny``), or the
                deadline passed with ``on_deadline="reject"``.
            RequestExpired: The deadline passed with ``on_deadline="fail"``.
            ConfigurationError: Called outside a handler, or the runtime's ledger keeps no
                requests, or an argument is not of a kind this takes.
            StoreError: The request could not be stored or read; the handler fails and is
                redone when the database answers.
        """
        if schema is not None and not isinstance(schema, Mapping):
            raise ConfigurationError(f"ask(schema=...) takes a JSON Schema object, got {schema!r}")
        request = await self._ask_person(
            QUESTION,
            question,
            schema=None if schema is None else dict(schema),
            who=who,
            deadline=deadline,
            on_deadline=on_deadline,
            default=default,
        )
        if request.status == "rejected":
            raise RequestRejected(request.id, request.reason or "declined")
        if request.status == "expired" and request.on_deadline == "fail":
            assert request.deadline is not None
            raise RequestExpired(request.id, request.deadline)
        return request.answer

    async def approve_call(
        self, tool: str, arguments: dict[str, JsonValue], key: str | None, approval: Approval
    ) -> HumanRequest:
        """Wait for a person to approve a side-effecting call; the tool calls it.

        Asked as [`ask`][agentsnap.Context.ask] asks (a durable step), before the call is
        claimed in the ledger.

        Returns:
            The approved request.

        Raises:
            ApprovalDenied: The call was denied (or its deadline passed, as the approval
                declared).
            RequestExpired: The deadline passed with ``on_deadline="fail"``.
        """
        request = await self._ask_person(
            APPROVAL,
            approval_question(tool, arguments, key),
            schema=None,
            who=approval.who,
            deadline=approval.deadline,
            on_deadline=approval.on_deadline,
            default=approval.default,
        )
        if request.status == "expired" and request.on_deadline == "fail":
            assert request.deadline is not None
            raise RequestExpired(request.id, request.deadline)
        if not request.approved:
            raise ApprovalDenied(tool, key, request.id, request.reason or "denied")
        return request

    async def _ask_person(
        self,
        kind: str,
        question: JsonValue,
        *,
        schema: dict[str, JsonValue] | None,
        who: str | None,
        deadline: float | timedelta | datetime | None,
        on_deadline: OnDeadline,
        default: JsonValue,
    ) -> HumanRequest:
        """Store a request at this step's identity (or find it), and wait until it closes."""
        message = self.message
        engine = self._engine
        log = engine.requests
        if message is None or not self._endpoint.busy:
            raise ConfigurationError(
                "a request to a person is asked from a handler (it is a step of the handler, "
                "redone with it); send a message to an agent that asks instead"
            )
        if log is None:
            raise ConfigurationError(
                "this runtime's ledger keeps no requests to people: use the default ledger, "
                "MemoryLedger or SqlLedger"
            )
        if on_deadline not in ("default", "reject", "fail"):
            raise ConfigurationError(
                f"on_deadline= is 'default', 'reject' or 'fail', got {on_deadline!r}"
            )
        try:
            plain_canonical_json(question)
            plain_canonical_json(default)
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(f"a request's question and default are JSON: {exc}") from None
        position = engine.position
        engine.position = position + 1
        line = engine.line
        timeline = 0 if line is None else line.timeline
        replay = engine.replay
        if replay is not None and (replay.written < timeline or replay.pending()):
            # The order of deliveries that led here is durable before a person can see the
            # request: a resumed run reaches the same step, under the same id.
            await replay.flush()
        now = utcnow()
        agent = self.agent.name
        asked = HumanRequest(
            id=request_id(self.run_id, agent, message.id, position, timeline),
            run_id=self.run_id,
            agent=agent,
            message_id=message.id,
            position=position,
            timeline=timeline,
            kind=kind,
            question=question,
            asked_at=now,
            schema=schema,
            who=who,
            deadline=deadline_of(deadline, now),
            on_deadline=on_deadline,
            default=default,
        )
        stored = await log.add_request(asked)
        telemetry = engine.telemetry
        if telemetry is not None:
            telemetry.request_asked(
                self.run_id, agent, stored.id, kind, who, stored.status, stored is not asked
            )
        if not stored.pending:
            return stored
        clock = time.perf_counter()
        if telemetry is not None:
            telemetry.request_waiting(kind, 1)
        engine.asking += 1
        try:
            done = await wait_for_answer(log, stored)
        finally:
            engine.asking -= 1
            if telemetry is not None:
                telemetry.request_waiting(kind, -1)
        if telemetry is not None:
            telemetry.request_answered(
                self.run_id, agent, done.id, kind, done.status, time.perf_counter() - clock
            )
        return done

    async def complete(self, model: ChatModel | ToolCallingModel, prompt: str) -> str:
        """Ask ``model`` about ``prompt`` and get the text of its answer; recorded as
        [`chat`][agentsnap.Context.chat] records.
        """  # noqa: D205
        return (await self.chat(model, prompt)).text

    @property
    def state(self) -> S:
        """The agent's state (the same object as ``agent.state``)."""
        return self.agent.state

    def mark_changed(self) -> None:
        """Say that the agent's state changed outside a handler, for the next snapshot.

        Not needed in a handler or ``on_rollback`` (a delivery, and the hook, count as
        changes); see [`Runtime.mark_changed`][agentsnap.Runtime.mark_changed].
        """
        agent = self.agent
        changed = agent._state_changed
        if changed is not None:
            changed.add(agent.name)

    @property
    def feedback(self) -> Sequence[Feedback]:
        """Feedback given to this agent, oldest first."""
        return tuple(self._feedback)

    def send(
        self,
        to: str,
        payload: JsonInput | BaseModel = None,
        *,
        kind: str = "message",
        headers: Mapping[str, str] | None = None,
    ) -> Message:
        """Send a message to agent ``to`` on the FIFO channel from this agent to it.

        Args:
            to: Name of the receiving agent.
            payload: A JSON value, or a pydantic model (sent as its JSON form).
            kind: What the message is; receivers usually dispatch on it.
            headers: Extra string headers.

        Returns:
            The message as sent, with its sequence number.

        A message that a check declared for this agent fails is never enqueued: no agent sees
        it. When the agent evaluates itself ([`Agent.evaluate`][agentsnap.Agent.evaluate]),
        what a handler sends is held back until the evaluation passes.

        Raises:
            UnknownAgentError: ``to`` is not a registered agent.
            PayloadNotSerializable: ``payload`` is not JSON.
            ConfigurationError: ``kind`` is longer than 128 characters (the longest kind
                every store can hold) or holds the NUL character.
            OutputRejected: A check declared for this agent failed the message. It is a
                control-flow signal (a ``BaseException``): let it propagate; the runtime
                rolls the run back even when a handler catches it.
        """
        engine = self._engine
        if engine.rejected is not None:
            raise engine.rejected  # the handler's output was rejected: it sends nothing more
        guard = engine.guard
        if guard is None:
            message = self._bus.send(self._endpoint, to, payload, kind, headers)
            engine.shown = self.message
            return message
        message = self._bus.send(self._endpoint, to, payload, kind, headers, post=False)
        try:
            guard(message)
        except OutputRejected as exc:
            self._bus.unsend(self._endpoint, message)
            if self._endpoint.busy:  # the running handler's output: the runtime acts on it
                engine.rejected = exc
            raise
        if guard.evaluates and self._endpoint.busy:
            guard.outputs.append(message)
        else:
            self._bus.post(self._endpoint, message)
            engine.shown = self.message
        return message

    def reject(self, agent: str, reason: str, *, source: str | None = None) -> NoReturn:
        """Reject another agent's output, as a critic: the run rolls back and ``agent`` is told.

        The rejected output is the message being handled when it came from ``agent``;
        the run goes back to the last consistent cut from before that message was sent.
        Otherwise the run goes back to the last cut from before ``agent``'s latest output
        (the newest cut, if it sent nothing since). Does not return.

        Args:
            agent: The agent whose work is rejected.
            reason: Why, in words that agent can act on.
            source: What rejected it, as the feedback and the rollback's record name it
                (default: this agent's name); an integration names the SDK's judge here
                (``"guardrail no_promises"``).

        Raises:
            OutputRejected: Always, for a registered agent; the runtime handles it.
            ConfigurationError: ``agent`` is not a registered agent (a typo would otherwise
                roll the run back for nothing until the retry policy gave up).
        """
        if agent not in self._bus.endpoints or agent == ENVIRONMENT:
            known = ", ".join(repr(n) for n in self._bus.endpoints if n != ENVIRONMENT)
            raise ConfigurationError(
                f"{self.agent.name!r} rejected the output of {agent!r}, which is not a "
                f"registered agent (registered: {known or 'none'}); name the agent whose work "
                "is rejected"
            )
        output = self.message if self.message is not None and self.message.src == agent else None
        rejection = OutputRejected(
            agent, reason, source if source is not None else self.agent.name, output
        )
        if self._endpoint.busy:
            self._engine.rejected = rejection
        raise rejection

    def snapshot(self) -> SnapshotHandle:
        """Start a snapshot with this agent as initiator.

        Called from a handler, the snapshot starts at once and the agent records as the
        handler returns, whatever sent the message being handled (the program or another
        agent). The cut holds everything the handler did, before and after the call:

        - the agent's state as the handler leaves it;
        - the message being handled counted as received, not in flight;
        - every message the handler sent in flight to its receiver (those held back for
          self-evaluation too, released once the evaluation passes). Only a message its
          receiver took before the call (the handler awaited after sending it) may count
          in that receiver's state instead.

        Going back to the snapshot (a rollback, ``resume()``, ``fork_from()``) therefore
        never runs the handler again and loses nothing of it: the agents it wrote to get its
        messages again. The snapshot completes only once the handler returns, so a long
        handler delays it; do not await the handle inside the handler, which would wait for
        itself. If the handler's output is rejected, a rollback goes back to a cut from
        before the handler, which runs again with the reason in ``ctx.feedback``.

        Called outside a handler (from ``on_rollback``, say), the agent records as soon as
        it is between two handler calls.

        Returns:
            A handle to await (after the handler returns) for the completed snapshot.
        """
        endpoint = self._endpoint
        inside = endpoint.busy and self.message is not None
        return self._snapshots.begin(initiator=endpoint, at_return=inside)

    def add_feedback(self, reason: str, source: str, done: Sequence[DoneEffect] = ()) -> None:
        """Record feedback for this agent (the runtime does after a rollback)."""
        self._feedback.append(Feedback(reason=reason, source=source, done=tuple(done)))


class BoundModel:
    """A model kept on an agent, seen through the agent's context: its calls are recorded.

    The runtime puts one in place of every model an agent holds in an attribute when the
    agent is registered, so that ``await self.model.complete(prompt)`` in a handler is a
    recorded step, as ``ctx.complete(model, prompt)`` is. Everything else is the model's
    own: other attributes and methods are read from it.

    Attributes:
        model: The model itself.
    """

    __slots__ = ("_ctx", "model")

    def __init__(self, model: ChatModel | ToolCallingModel, ctx: Context[Any]) -> None:
        self.model = model
        self._ctx = ctx

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)

    def __repr__(self) -> str:
        return f"<recorded {self.model!r} of agent {self._ctx.agent.name!r}>"

    async def complete(self, prompt: str) -> str:
        """The model's answer to ``prompt``, recorded (see
        [`Context.complete`][agentsnap.Context.complete]).
        """  # noqa: D205
        return await self._ctx.complete(self.model, prompt)

    async def respond(self, request: Any) -> ModelResponse:
        """The model's answer to ``request`` (a [`ModelRequest`][agentsnap.ModelRequest]),
        recorded (see [`Context.chat`][agentsnap.Context.chat]).
        """  # noqa: D205
        return await self._ctx.chat(
            self.model,
            request.messages,
            tools=request.tools,
            output_schema=request.output_schema,
            settings=request.settings,
        )


def _is_model(value: object) -> TypeGuard[ChatModel | ToolCallingModel]:
    """Whether ``value`` is a model: its class has ``async def complete`` or ``respond``."""
    kind = type(value)
    return any(
        inspect.iscoroutinefunction(getattr(kind, method, None))
        for method in ("complete", "respond")
    )


def _bind_models(ctx: Context[Any]) -> None:
    """Record the calls of the models ``ctx``'s agent holds in its attributes."""
    agent = ctx.agent
    try:
        attributes = vars(agent)
    except TypeError:  # an agent class with __slots__ only
        return
    for name, value in list(attributes.items()):
        if name.startswith("__") or isinstance(value, (BoundModel, type)):
            continue
        if _is_model(value):
            setattr(agent, name, BoundModel(value, ctx))
        elif isinstance(value, BoundModel):
            setattr(agent, name, BoundModel(value.model, ctx))


def guard_for(agent: Agent[Any], checks: Sequence[OutputCheck]) -> Guard | None:
    """The guard for ``agent``'s context: its declared checks, and whether it evaluates itself.

    ``None`` when there is nothing to check (no check declared, ``evaluate`` not overridden).
    """
    evaluates = type(agent).evaluate is not Agent.evaluate
    if not checks and not evaluates:
        return None
    guard = Guard(agent.name, evaluates)
    for declared in checks:
        guard.add(declared)
    return guard


async def evaluate_outputs(ctx: Context[Any]) -> None:
    """Have the agent judge what its handler sent (self-evaluation), once the handler returned.

    Raises:
        OutputRejected: The agent's ``evaluate`` failed the outputs.
    """
    guard = ctx._engine.guard
    assert guard is not None
    outputs = list(guard.outputs)
    reason = failure_reason(
        await ctx.agent.evaluate(outputs, ctx), f"self-evaluation of {ctx.agent.name!r}"
    )
    if reason is not None:
        raise OutputRejected(
            ctx.agent.name, reason, "self-evaluation", outputs[0] if outputs else None
        )
