"""Tools for agents; side-effecting ones go through the ledger, so that they happen once.

A tool is a function an agent calls from its handler. Decorate it with [`tool`][agentsnap.tool]:
its keyword arguments are validated by pydantic, and every call is recorded in the calling
agent's state (``tool_calls``), so snapshots carry the agent's tool-call history.

A tool declared ``side_effect=True`` touches the outside world (charges a card, sends an
email), so each of its calls is claimed in a ledger under an idempotency key before it runs,
and its outcome recorded after: [`agentsnap.ledger`][agentsnap.ledger] says how keys are made
and what the ledger decides for a key it already holds. [`Tool`][agentsnap.Tool] hands each
call to [`run_once`][agentsnap.once.run_once], which follows those rules; when a run ends,
[`reconcile`][agentsnap.once.reconcile] marks the effects a rollback abandoned and runs the
compensating actions of the tools the runtime knows (``Runtime.tools``). Two different
tools with one name in one runtime are an error.

Example:
    ```python
    import asyncio

    from agentsnap import Agent, AgentState, Context, Message, Runtime, tool

    CHARGES: list[int] = []

    @tool(side_effect=True)
    async def charge(card: str, amount: int) -> dict[str, int]:
        CHARGES.append(amount)
        return {"charge_id": len(CHARGES)}

    class Payer(Agent[AgentState]):
        async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
            receipt = await charge(ctx, card="4242", amount=message.payload["amount"])
            self.state.memory["receipt"] = receipt

    async def main() -> None:
        async with Runtime() as runtime:
            runtime.add(Payer("payer"))
            runtime.send("payer", {"amount": 500})
            await runtime.run_until_idle()
            print(runtime.agents["payer"].state.tool_calls[0].key, CHARGES)

    asyncio.run(main())
    ```
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import inspect
import logging
import typing
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import (
    TYPE_CHECKING,
    Any,
    Generic,
    Literal,
    Protocol,
    TypedDict,
    TypeVar,
    Unpack,
    overload,
)

import tenacity
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, create_model
from pydantic_core import PydanticSerializationError

from agentsnap._handler import engine_of
from agentsnap._uninterrupted import uninterrupted
from agentsnap.exceptions import (
    ConfigurationError,
    EffectDiverged,
    ToolArgumentsInvalid,
    ToolFailed,
    ToolOutcomeUnknown,
)
from agentsnap.ledger import (
    LedgerEntry,
    ToolCallStatus,
    call_key,
    check_key,
    fingerprint,
    owner_id,
)
from agentsnap.limits import MAX_TOOL_NAME, check_text
from agentsnap.models import ChatMessage, ModelResponse, ToolSpec
from agentsnap.once import Diverged, Outcome, PendingOutcomes, compensate, run_once
from agentsnap.records import utcnow
from agentsnap.redaction import unredact
from agentsnap.requests import Approval, ApprovalPolicy, approval_of
from agentsnap.state import ToolCallRecord, canonical_json
from agentsnap.telemetry import tool_call

if TYPE_CHECKING:
    from agentsnap.agents import Context
    from agentsnap.ledger import Ledger
    from agentsnap.messages import JsonValue
    from agentsnap.redaction import Redaction

__all__ = ["OnDivergence", "OnRedo", "Tool", "ToolCall", "ToolRetry", "run_tool_calls", "tool"]

logger = logging.getLogger("agentsnap")

R = TypeVar("R")

OnRedo = Literal["recorded", "new", "compensate"]
"""What a redo after a rollback does when it calls a side-effecting tool where the undone
path did, with other arguments: ``"recorded"`` (the effect that happened stands, its
recorded outcome is returned), ``"new"`` (the new call is a new effect and runs), or
``"compensate"`` (the tool's ``compensate`` action undoes the effect that happened, then
the new call runs)."""

DryRun = Any
"""What a side-effecting call returns in a run whose tools are dry (a what-if fork, see
[`fork_run`][agentsnap.inspect.fork_run]): a JSON value, or a function of the call's
arguments (as JSON) returning one. ``None`` by default."""

OnDivergence = Literal["raise", "recorded"]
"""What a re-execution on the same timeline (after a crash and ``resume()``) does when it
calls a side-effecting tool where it had before, with other arguments: ``"raise"``
([`EffectDiverged`][agentsnap.EffectDiverged]) or ``"recorded"`` (the recorded outcome is
returned). The effect never runs a second time."""

RESULT_SUMMARY_CHARS = 500
"""A result whose JSON is longer than this is summarised in the agent's state."""


# -- tools ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ToolRetry:
    """How a tool's declared transient errors are retried (with tenacity), under one key.

    ``stop`` and ``wait`` are tenacity strategies. Only the exceptions the tool declares
    ``transient`` are retried; any other error is final at once.

    Attributes:
        stop: When to give up (default: after 3 attempts).
        wait: Pause between attempts (default: random exponential, 50 ms doubling up to 2 s).
    """

    stop: Any = field(default_factory=lambda: tenacity.stop_after_attempt(3))
    wait: Any = field(
        default_factory=lambda: tenacity.wait_random_exponential(multiplier=0.05, max=2.0)
    )

    @classmethod
    def attempts(cls, count: int, *, wait: Any = None) -> ToolRetry:
        """Allow ``count`` attempts in all, pausing as ``wait`` says (default: none).

        Raises:
            ConfigurationError: ``count`` is below 1.
        """
        if count < 1:
            raise ConfigurationError("a tool retry policy needs at least 1 attempt")
        return cls(stop=tenacity.stop_after_attempt(count), wait=wait or tenacity.wait_none())


@dataclass(frozen=True, slots=True)
class ToolCall:
    """What a tool function learns about the call, if its first parameter asks for it.

    Example:
        ```python
        from agentsnap import ToolCall, tool

        @tool(side_effect=True, rerun_if_unknown=True)
        async def send_email(call: ToolCall, to: str, text: str) -> str:
            # The mail service drops a second request with the same idempotency key.
            return f"queued {call.key}"
        ```
    """

    tool: str
    """Name of the tool."""
    key: str | None
    """Idempotency key (``None`` for a tool without side effects); hand it to the service."""
    attempt: int
    """1 for the first run under this key, counting retries and earlier claims."""
    run_id: str | None
    """Id of the calling run."""
    agent: str | None
    """Name of the calling agent."""
    message_id: str | None
    """Id of the message being handled."""
    ledger: Ledger | None = field(default=None, repr=False, compare=False)
    """The ledger holding the call's claim (``None`` for a tool without side effects)."""

    async def note(self, progress: JsonValue) -> bool:
        """Keep a progress note with the call's claim, for a call that takes it over.

        A tool whose effect runs somewhere else for a while (a remote job, an MCP task)
        notes what it started, say ``{"job": "j-17"}``, once the service accepted it. If
        the process stops before the outcome is recorded, the call taken over under the same
        key (after ``resume()``, with ``rerun_if_unknown=True``) reads the note with
        [`noted`][agentsnap.ToolCall.noted] and polls the job instead of starting the effect
        again. A later note replaces an earlier one; the note stays with the ledger entry
        and is shown by ``agentsnap tools``. Notes are not redacted: keep secrets out.

        Args:
            progress: JSON data.

        Returns:
            Whether the note was kept: ``False`` when the claim is no longer this call's
            (its lease ran out and another caller took it over).

        Raises:
            ConfigurationError: The tool has no side effects (its calls have no claim), or
                ``progress`` is not JSON.
        """
        ledger, key = self._claim("note")
        try:
            canonical_json(progress)
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(
                f"the progress note of tool {self.tool!r} is not JSON ({exc}); note JSON "
                "values: strings, numbers, lists and objects of them"
            ) from exc
        return await ledger.update(
            key,
            {"note": progress, "updated_at": utcnow()},
            statuses=(ToolCallStatus.IN_PROGRESS,),
            owner=owner_id(),
        )

    async def noted(self) -> JsonValue:
        """The progress note kept with the call's claim, or ``None``.

        On a first attempt (``attempt == 1``) there is none yet; a call taken over after
        its owner stopped finds what that owner [`note`][agentsnap.ToolCall.note]d.

        Raises:
            ConfigurationError: The tool has no side effects (its calls have no claim).
        """
        ledger, key = self._claim("noted")
        entry = await ledger.get(key)
        return None if entry is None else entry.note

    def _claim(self, method: str) -> tuple[Ledger, str]:
        if self.ledger is None or self.key is None:
            raise ConfigurationError(
                f"ToolCall.{method}() of tool {self.tool!r}: the tool has no side effects, so "
                "its calls have no claim in the ledger to keep a note with; declare it "
                "side_effect=True"
            )
        return self.ledger, self.key


Compensation = Callable[[LedgerEntry], Any]
"""A compensating action: takes the abandoned entry, returns JSON (or an awaitable of it)."""


class _SchemaToolOptions(TypedDict, total=False):
    """The options [`Tool.from_schema`][agentsnap.Tool.from_schema] takes, as keywords."""

    description: str | None
    side_effect: bool
    key_from: Sequence[str] | None
    on_redo: OnRedo
    on_divergence: OnDivergence
    rerun_if_unknown: bool
    lease: float
    wait: float
    approval: ApprovalPolicy


class _ToolOptions(_SchemaToolOptions, total=False):
    """The options [`tool`][agentsnap.tool] takes, as keywords (``Tool``'s parameters)."""

    name: str | None
    transient: tuple[type[BaseException], ...]
    retry: ToolRetry | None
    compensate: Compensation | None
    dry_run: DryRun


def _known_options(caller: str, options: Mapping[str, object], known: frozenset[str]) -> None:
    """Refuse a keyword ``caller`` does not take, as Python does for a spelled-out one.

    Raises:
        TypeError: ``options`` holds a keyword not in ``known``.
    """
    for keyword in options:
        if keyword not in known:
            raise TypeError(f"{caller}() got an unexpected keyword argument {keyword!r}")


@dataclass(slots=True)
class _Ledgered:
    """A side-effecting call on its way through the ledger: what every path of it passes on.

    ``arguments`` are as the ledger records them (redacted, when the run redacts); ``values``
    are what the tool itself gets.
    """

    ledger: Ledger
    info: ToolCall
    values: dict[str, Any]
    arguments: dict[str, JsonValue]
    printed: str
    timeline: int | None = None
    redaction: Redaction | None = None
    pending: PendingOutcomes | None = None

    def filed(self) -> _Filed:
        """What the ledger files the call under: its run, agent and message."""
        info = self.info
        return {"run_id": info.run_id, "agent": info.agent, "message_id": info.message_id}


class _Filed(TypedDict):
    """The keywords naming where a call is filed, as ``LedgerEntry`` and ``run_once`` take them."""

    run_id: str | None
    agent: str | None
    message_id: str | None


class Tool(Generic[R]):
    """A function agents call as a tool; made by the [`tool`][agentsnap.tool] decorator.

    Call it from a handler with the handler's context and keyword arguments:
    ``await charge(ctx, card="4242", amount=500)``; pass ``key=`` to give the idempotency
    key yourself. Outside a runtime, [`invoke`][agentsnap.Tool.invoke] calls it against a
    ledger directly.

    Attributes:
        name: Name of the tool (in the ledger and in agent states).
        fn: The decorated function, unchanged.
        side_effect: Calls go through the ledger.
        transient: Exceptions retried under the same key.
        retry: How they are retried.
        rerun_if_unknown: Run again when a claim's outcome is unknown.
        compensate: Undoes an abandoned effect, once.
        lease: Seconds a claim holds before another caller may find it unknown.
        wait: Seconds a call waits for the same key in progress elsewhere.
        key_from: The arguments that name the call's effect, when the key is derived.
        on_redo: What a redo after a rollback does with other arguments at the same place.
        on_divergence: What a re-execution after a crash does with other arguments.
        description: What the tool does, for a model (default: the function's docstring).
        approval: When a call waits for a person's approval, or ``None``.
        dry_run: What a call returns in a run whose tools are dry, instead of running.
    """

    def __init__(  # noqa: PLR0917
        self,
        fn: Callable[..., Any],
        name: str | None = None,
        side_effect: bool = False,
        transient: tuple[type[BaseException], ...] = (),
        retry: ToolRetry | None = None,
        rerun_if_unknown: bool = False,
        compensate: Compensation | None = None,
        lease: float = 60.0,
        wait: float = 10.0,
        key_from: Sequence[str] | None = None,
        on_redo: OnRedo = "recorded",
        on_divergence: OnDivergence = "raise",
        description: str | None = None,
        approval: ApprovalPolicy = False,
        dry_run: DryRun = None,
    ) -> None:
        if not callable(fn):
            raise ConfigurationError(f"@tool decorates a function, got {type(fn).__name__}")
        self.fn = fn
        self.name: str = check_text(
            name or str(getattr(fn, "__name__", "")),
            "a tool's name",
            MAX_TOOL_NAME,
            f"pass @tool(name=...) a name of 1 to {MAX_TOOL_NAME} characters",
        )
        if not all(isinstance(t, type) and issubclass(t, BaseException) for t in transient):
            raise ConfigurationError(
                f"transient= of tool {self.name!r} takes a tuple of exception classes, "
                f"got {transient!r}"
            )
        if lease <= 0 or wait < 0:
            raise ConfigurationError(
                f"tool {self.name!r} needs lease > 0 and wait >= 0 (seconds), got "
                f"lease={lease!r}, wait={wait!r}"
            )
        if compensate is not None and not side_effect:
            raise ConfigurationError(
                f"tool {self.name!r} declares compensate= but not side_effect=True; only "
                "side-effecting calls are recorded, so only they can be compensated"
            )
        self.side_effect = side_effect
        self.transient = tuple(transient)
        self.retry = retry or ToolRetry()
        self.rerun_if_unknown = rerun_if_unknown
        self.compensate = compensate
        self.lease = lease
        self.wait = wait
        self._is_async = inspect.iscoroutinefunction(fn)
        self._wants_call, self._arguments, self._names, self._returns = _signature(fn, self.name)
        self._load = None if self._returns is None else self._returns.validate_python
        if on_redo not in ("recorded", "new", "compensate"):
            raise ConfigurationError(
                f"on_redo= of tool {self.name!r} is 'recorded', 'new' or 'compensate', got "
                f"{on_redo!r}"
            )
        if on_divergence not in ("raise", "recorded"):
            raise ConfigurationError(
                f"on_divergence= of tool {self.name!r} is 'raise' or 'recorded', got "
                f"{on_divergence!r}"
            )
        if on_redo == "compensate" and compensate is None:
            raise ConfigurationError(
                f'tool {self.name!r} declares on_redo="compensate" without compensate=; give '
                "the action that undoes an effect"
            )
        if (key_from is not None or on_redo != "recorded" or on_divergence != "raise") and (
            not side_effect
        ):
            raise ConfigurationError(
                f"tool {self.name!r} declares key_from=, on_redo= or on_divergence= but not "
                "side_effect=True; only side-effecting calls have keys"
            )
        if key_from is not None:
            if isinstance(key_from, str):
                key_from = (key_from,)
            unknown = [n for n in key_from if n not in self._names]
            if unknown or not key_from:
                raise ConfigurationError(
                    f"key_from= of tool {self.name!r} names {list(key_from)!r}, but its "
                    f"arguments are {sorted(self._names)!r}; name one or more of them"
                )
        self.key_from: tuple[str, ...] | None = None if key_from is None else tuple(key_from)
        self.approval: Approval | None = approval_of(approval)
        if self.approval is not None and not side_effect:
            raise ConfigurationError(
                f"tool {self.name!r} declares approval= but not side_effect=True; a call "
                "waits for approval before it is claimed in the ledger, so only "
                "side-effecting calls can need one"
            )
        if dry_run is not None and not side_effect:
            raise ConfigurationError(
                f"tool {self.name!r} declares dry_run= but not side_effect=True; only "
                "side-effecting calls are held back in a run whose tools are dry"
            )
        self.dry_run: DryRun = dry_run
        self.on_redo: OnRedo = on_redo
        self.on_divergence: OnDivergence = on_divergence
        self.description = (
            description if description is not None else inspect.getdoc(fn) or ""
        ).strip()

    @classmethod
    def from_schema(
        cls,
        name: str,
        parameters: Mapping[str, Any],
        fn: Callable[..., Awaitable[Any]],
        **options: Unpack[_SchemaToolOptions],
    ) -> Tool[Any]:
        """A tool that comes as a name, a JSON Schema of its arguments and a function.

        For tools defined elsewhere: an MCP server's, or an agent SDK's. ``fn`` is awaited
        with the arguments as one dictionary, after a [`ToolCall`][agentsnap.ToolCall] when
        it takes two parameters (``fn(call, arguments)``: the call's idempotency key, to hand
        to the service that deduplicates by it); what it returns must be JSON. The call goes
        through the ledger like a decorated tool's when ``side_effect`` is true (its key
        bound to the call: the run, the agent, the message being handled, and the n-th call
        of this tool in the handler, or the ``key_from`` arguments). The arguments are
        checked against the schema's ``required`` and, when it forbids others,
        ``properties``; the rest of the schema is for whoever defined the tool to enforce.

        Args:
            name: Name of the tool.
            parameters: JSON Schema of its arguments (an ``object`` schema).
            fn: The async function running a call.
            **options: ``description`` (default ``""``), ``side_effect``, ``key_from``,
                ``on_redo``, ``on_divergence``, ``rerun_if_unknown``, ``lease``, ``wait``
                and ``approval``, as [`tool`][agentsnap.tool] takes them, with its defaults.

        Raises:
            ConfigurationError: ``parameters`` is not an ``object`` schema, ``fn`` is not
                an async function, or an option is wrong as for [`tool`][agentsnap.tool].
            TypeError: An option is not one of these.
        """
        _known_options("from_schema", options, _SchemaToolOptions.__optional_keys__)
        return _SchemaTool(name, parameters, fn, **options)

    def __repr__(self) -> str:
        where = f"{getattr(self.fn, '__module__', '?')}.{getattr(self.fn, '__qualname__', '?')}"
        return f"<Tool {self.name!r}{' side_effect' if self.side_effect else ''} of {where}>"

    async def run(self, ctx: Context[Any], arguments: Mapping[str, Any], /) -> R:
        """Call the tool from a handler with its arguments as a mapping (as a model gives
        them); the same as ``await tool(ctx, **arguments)``.
        """  # noqa: D205
        return await self(ctx, **dict(arguments))

    def spec(self) -> ToolSpec:
        """The tool as offered to a model: name, description, arguments' JSON Schema.

        [`Context.chat`][agentsnap.Context.chat] calls it for the tools it is given
        (``tools=[charge]``).
        """
        return ToolSpec(
            name=self.name, description=self.description, parameters=self.arguments_schema()
        )

    def arguments_schema(self) -> dict[str, Any]:
        """The JSON Schema of the tool's keyword arguments, as tool-calling models take it.

        Returns:
            An ``object`` schema whose properties are the tool's parameters.
        """
        return self._arguments.model_json_schema(by_alias=True)

    async def __call__(
        self, ctx: Context[Any], /, *, key: str | None = None, **arguments: Any
    ) -> R:
        """Call the tool from a handler; the call is recorded in the agent's state.

        Args:
            ctx: The handler's context.
            key: Idempotency key; derived from the call when omitted (side-effecting tools).
            **arguments: The tool's arguments.

        Returns:
            What the tool returned, or the result recorded for this key.

        Raises:
            ToolArgumentsInvalid: The arguments do not fit the tool.
            ConfigurationError: A side-effecting call outside a handler without ``key``, or
                the runtime knows another tool of this name.
            IdempotencyConflict: ``key`` was used for another call.
            ToolFailed: The tool failed (now, or as recorded for this key).
            ToolInProgress: The same key is in progress elsewhere beyond the tool's wait.
            ToolOutcomeUnknown: The key's outcome is unknown and re-running is not safe.
        """
        engine = engine_of(ctx)
        known = engine.tools
        if known is not None:
            known.add(self)
        values, args_json, printed = self._validate(arguments)
        # What the ledger records and fingerprints: the arguments as the run's redaction
        # leaves them (the tool itself gets the real values).
        recorded = args_json
        redaction = engine.redaction
        if redaction is not None:
            recorded = redaction.tool_arguments(self.name, args_json)
            if recorded is not args_json:
                printed = fingerprint(recorded)
        message = ctx.message
        message_id = message.id if message is not None else None
        agent = ctx.agent.name
        calls = ctx.state.tool_calls
        ledger: Ledger | None = None
        place: int | dict[str, JsonValue] | None = None
        timeline = ctx.timeline
        if self.side_effect:
            if key is None:
                if message_id is None:
                    raise ConfigurationError(
                        f"side-effecting tool {self.name!r} was called outside a handler "
                        "without an idempotency key; pass key= (a string naming this effect)"
                    )
                if self.key_from is not None:
                    place = {name: recorded[name] for name in self.key_from if name in recorded}
                else:
                    # The n-th side-effecting call of this tool in this handler execution:
                    # how many other calls (read-only lookups, other tools) a model chose to
                    # make first does not shift it.
                    place = 0
                    for earlier in reversed(calls):  # this handler's calls are the last ones
                        if earlier.message_id != message_id:
                            break
                        if earlier.tool == self.name and earlier.key is not None:
                            place += 1
                key = call_key(ctx.run_id, agent, message_id, self.name, place)
            else:
                check_key(key)
            ledger = engine.ledger
            if ledger is None:
                raise ConfigurationError(
                    f"side-effecting tool {self.name!r} needs a ledger, and this context has "
                    "none: register the agent with Runtime.add() and call the tool from its "
                    "handler, or use Tool.invoke(ledger, ...)"
                )
        elif key is not None:
            raise ConfigurationError(self._no_key())
        record = ToolCallRecord(
            tool=self.name,
            arguments=args_json,
            key=key,
            status="running",
            message_id=message_id,
            fingerprint=printed,
            attempts=0,
        )
        calls.append(record)
        info = ToolCall(self.name, key, 1, ctx.run_id, agent, message_id, ledger)
        traced = tool_call(
            engine.telemetry,
            self.name,
            key,
            side_effect=self.side_effect,
            run_id=ctx.run_id,
            agent=agent,
        )
        try:
            with traced:
                ledgered = None
                if ledger is not None:
                    ledgered = _Ledgered(
                        ledger,
                        info,
                        values,
                        recorded,
                        printed,
                        timeline,
                        redaction,
                        engine.pending,
                    )
                if ledgered is not None and engine.dry_tools:
                    outcome = await self._dry(ledgered)
                    record.status = "dry"
                    record.attempts = 0
                    record.replayed = outcome.replayed
                    record.result = _summary(outcome.result)
                    return typing.cast("R", outcome.value)
                if ledger is not None and message is not None:
                    approval = self._approval(ctx, args_json)
                    if approval is not None:
                        # Before the claim: a denied call leaves its key free.
                        await ctx.approve_call(self.name, args_json, key, approval)
                if ledgered is not None:
                    replay = engine.replay
                    if replay is not None and replay.pending():
                        # What this call depends on is durable before it can have an effect.
                        await replay.flush()
                    outcome = await self._bound_once(ledgered, place, record)
                else:
                    outcome = await self._run(values, info, 1)
                traced.deduplicated(outcome.replayed)
        except ToolFailed as exc:
            record.status = "error"
            record.error = f"{exc.error_type}: {exc.detail}"
            record.attempts = exc.attempts
            record.replayed = exc.replayed
            raise
        except BaseException as exc:  # a cancelled call is not left "running" either
            record.status = "error"
            record.error = f"{type(exc).__name__}: {exc}".rstrip(": ")
            raise
        else:
            record.status = "replayed" if outcome.replayed else "ok"
            record.attempts = outcome.attempts
            record.replayed = outcome.replayed
            record.result = _summary(outcome.result)
        finally:
            if message is None:  # outside a handler: nothing else marks the record's change
                ctx.mark_changed()
        return typing.cast("R", outcome.value)

    async def invoke(
        self,
        ledger: Ledger | None,
        /,
        *,
        key: str | None = None,
        run_id: str | None = None,
        agent: str | None = None,
        **arguments: Any,
    ) -> R:
        """Call the tool outside a handler, against ``ledger``; no agent state records it.

        Args:
            ledger: The ledger (may be ``None`` for a tool without side effects).
            key: Idempotency key; required for a side-effecting tool.
            run_id: Run to file the call under, if any.
            agent: Agent to file the call under, if any.
            **arguments: The tool's arguments.

        Returns:
            What the tool returned, or the result recorded for this key.

        Raises:
            ConfigurationError: A side-effecting tool without ``key`` or ``ledger``.
            ToolArgumentsInvalid: As for a call from a handler.
            IdempotencyConflict: As for a call from a handler.
            ToolFailed: As for a call from a handler.
            ToolInProgress: As for a call from a handler.
            ToolOutcomeUnknown: As for a call from a handler.
        """
        values, args_json, printed = self._validate(arguments)
        info = ToolCall(self.name, key, 1, run_id, agent, None, ledger if key else None)
        if not self.side_effect:
            if key is not None:
                raise ConfigurationError(self._no_key())
            return typing.cast("R", (await self._run(values, info, 1)).value)
        if key is None:
            raise ConfigurationError(
                f"side-effecting tool {self.name!r} was called outside a handler without an "
                "idempotency key; pass key= (a string naming this effect)"
            )
        if ledger is None:
            raise ConfigurationError(f"side-effecting tool {self.name!r} needs a ledger")
        check_key(key)
        outcome = await self._once(_Ledgered(ledger, info, values, args_json, printed))
        return typing.cast("R", outcome.value)

    async def _dry(self, call: _Ledgered) -> Outcome:
        """Record the call as one that would have run, and return the tool's stand-in.

        The entry takes the call's key, so that a re-executed call (after a crash, in the
        same run) gets the stand-in it got before.
        """
        info = call.info
        assert info.key is not None
        stand_in = self.dry_run(dict(call.arguments)) if callable(self.dry_run) else self.dry_run
        try:
            canonical_json(stand_in)
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(
                f"the dry_run= stand-in of tool {self.name!r} is not JSON ({exc}); give a "
                "JSON value, or a function of the arguments returning one"
            ) from exc
        now = utcnow()
        entry = LedgerEntry(
            key=info.key,
            tool=self.name,
            fingerprint=call.printed,
            arguments=call.arguments,
            status=ToolCallStatus.DRY,
            created_at=now,
            updated_at=now,
            attempts=0,
            result=stand_in,
            timeline=call.timeline,
            **call.filed(),
        )
        found = await call.ledger.claim(entry)
        if found is None:
            return Outcome(self._loaded(stand_in), stand_in, 0)
        if found.status is not ToolCallStatus.DRY:
            raise ConfigurationError(
                f"tool {self.name!r} is dry in this run, but its key {info.key!r} already "
                f"holds a {found.status.value} call: a run's tools are dry from its start or "
                "not at all"
            )
        return Outcome(self._loaded(found.result), found.result, 0, replayed=True)

    def _loaded(self, result: JsonValue) -> Any:
        """``result`` as the tool's declared return type gives it (as is without one)."""
        if self._load is None or result is None:
            return result
        try:
            return self._load(result)
        except ValueError:
            return result

    def _approval(self, ctx: Context[Any], arguments: dict[str, JsonValue]) -> Approval | None:
        """How this call asks for approval, if the tool or the runtime's policy wants one."""
        for rule in (self.approval, engine_of(ctx).approvals.get(self.name)):
            if rule is not None and rule.needed(arguments):
                return rule
        return None

    def _no_key(self) -> str:
        return (
            f"tool {self.name!r} has no side effects, so it takes no key=; declare it "
            "@tool(side_effect=True) if it touches the outside world"
        )

    async def _bound_once(
        self, call: _Ledgered, place: int | dict[str, JsonValue] | None, record: ToolCallRecord
    ) -> Outcome:
        """Run a handler's call through the ledger under its key.

        A derived key (``place`` given) names the call, not its arguments: the ledger may
        hold it with other arguments, and ``on_redo``/``on_divergence`` decide.
        """
        if place is None:  # an explicit key keeps its meaning: other arguments conflict
            return await self._uninterrupted(self._once(call))
        assert call.timeline is not None
        diverged = self._diverged(call.ledger, call.arguments, call.timeline)
        try:
            return await self._uninterrupted(self._once(call, diverged))
        except _NewEffect:
            pass
        # The redo's call is an effect of its own, once for each set of arguments.
        info = call.info
        assert info.run_id is not None
        assert info.agent is not None
        assert info.message_id is not None
        key = call_key(info.run_id, info.agent, info.message_id, self.name, place, call.printed)
        record.key = key
        redo = dataclasses.replace(call, info=dataclasses.replace(info, key=key))
        return await self._uninterrupted(self._once(redo, diverged))

    def _diverged(self, ledger: Ledger, arguments: dict[str, JsonValue], timeline: int) -> Diverged:
        """What to do when the ledger holds this call's key with other arguments."""

        async def decide(found: LedgerEntry) -> None:
            if self.key_from is not None:
                # The key holds the arguments that name the effect: the others are wording.
                return
            if found.timeline is not None and found.timeline < timeline:
                # A redo after a rollback: the undone path's effect happened.
                if self.on_redo == "recorded":
                    logger.info(
                        "tool %r: key %s is redone with other arguments after a rollback; "
                        "the effect that happened stands (recorded %s, asked %s)",
                        self.name,
                        found.key,
                        found.arguments,
                        arguments,
                    )
                    return
                if self.on_redo == "compensate":
                    await compensate(ledger, found, self)
                raise _NewEffect
            # The same timeline: a re-execution after a crash that is not deterministic.
            if self.on_divergence == "recorded":
                logger.warning(
                    "tool %r: key %s was called again with other arguments after a resume; "
                    "the recorded outcome stands (recorded %s, asked %s)",
                    self.name,
                    found.key,
                    found.arguments,
                    arguments,
                )
                return
            raise EffectDiverged(self.name, found.key, dict(found.arguments), dict(arguments))

        return decide

    async def _once(self, call: _Ledgered, diverged: Diverged | None = None) -> Outcome:
        """Run the call through the ledger, at most once for its key.

        With a ``redaction`` the result is recorded redacted (the caller gets the real one);
        a recorded result holding markers gets their values from its ``secret`` provider.
        """
        info, redaction = call.info, call.redaction
        assert info.key is not None
        run: Callable[[int], Awaitable[Outcome]] = functools.partial(self._run, call.values, info)
        if redaction is not None:
            run = functools.partial(_redacted_outcome, run, redaction, self.name)
        return await run_once(
            call.ledger,
            info.key,
            tool=self.name,
            arguments=call.arguments,
            call=run,
            fingerprint=call.printed,
            load=functools.partial(_restored_result, self.name, redaction, self._load),
            lease=self.lease,
            wait=self.wait,
            rerun_if_unknown=self.rerun_if_unknown,
            timeline=call.timeline,
            diverged=diverged,
            pending=call.pending,
            **call.filed(),
        )

    async def _uninterrupted(self, call: Coroutine[Any, Any, Outcome]) -> Outcome:
        """Run a handler's call through the ledger; a cancellation waits for its outcome.

        A rollback that throws the handler's work away (or the run closing) cancels the
        handler; the call finishes first and its outcome is recorded, for up to the tool's
        ``lease`` seconds, then the cancellation reaches the handler. The effect happened
        once and the ledger says so: the handler's replay gets the recorded outcome. A call
        still running after its lease is cancelled as well, and its claim rules: its outcome
        is unknown, so a later call under its key raises ``ToolOutcomeUnknown`` unless the
        tool has ``rerun_if_unknown=True``.
        """
        return await uninterrupted(call, self.lease)

    async def _run(self, values: dict[str, Any], info: ToolCall, first_attempt: int) -> Outcome:
        """Run the function, retrying declared transient errors; wrap failures in ToolFailed."""
        attempts = 0
        try:
            if self.transient:
                retrying = tenacity.AsyncRetrying(
                    stop=self.retry.stop,
                    wait=self.retry.wait,
                    retry=tenacity.retry_if_exception_type(self.transient),
                    reraise=True,
                )
                async for attempt in retrying:
                    with attempt:
                        attempts += 1
                        value = await self._call_fn(values, info, first_attempt + attempts - 1)
            else:
                attempts = 1
                value = await self._call_fn(values, info, first_attempt)
        except ToolOutcomeUnknown:
            raise  # the tool found it cannot know what an earlier attempt did: not a failure
        except Exception as exc:
            raise ToolFailed(
                self.name,
                info.key,
                type(exc).__name__,
                str(exc),
                transient=isinstance(exc, self.transient),
                attempts=attempts,
            ) from exc
        try:
            result = self._dump(value)
        except (PydanticSerializationError, TypeError, ValueError) as exc:
            raise ToolFailed(
                self.name,
                info.key,
                "ResultNotSerializable",
                f"the tool returned a value that is not JSON ({_first_line(exc)}); return JSON "
                "values or pydantic models, and annotate the return type",
                attempts=attempts,
            ) from exc
        return Outcome(value, result, attempts)

    async def _call_fn(self, values: dict[str, Any], info: ToolCall, attempt: int) -> Any:
        if self._wants_call:
            call = dataclasses.replace(info, attempt=attempt)
            if self._is_async:
                return await self.fn(call, **values)
            return await asyncio.to_thread(self.fn, call, **values)
        if self._is_async:
            return await self.fn(**values)
        return await asyncio.to_thread(self.fn, **values)

    def _validate(self, arguments: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], str]:
        try:
            model = self._arguments.model_validate(arguments)
        except ValidationError as exc:
            detail = "; ".join(
                f"{'.'.join(str(p) for p in error['loc']) or 'arguments'}: {error['msg']}"
                for error in exc.errors()
            )
            raise ToolArgumentsInvalid(self.name, detail) from exc
        try:
            args_json: dict[str, Any] = model.model_dump(mode="json", by_alias=True)
            printed = fingerprint(args_json)
        except (PydanticSerializationError, TypeError, ValueError) as exc:
            raise ToolArgumentsInvalid(self.name, f"they are not JSON: {_first_line(exc)}") from exc
        values = dict(zip(self._names, model.__dict__.values(), strict=True))
        return values, args_json, printed

    def _dump(self, value: Any) -> JsonValue:
        adapter = self._returns or _ANY
        dumped: JsonValue = adapter.dump_python(value, mode="json")
        canonical_json(dumped)  # refuses NaN and other non-JSON the dump let through
        return dumped

    @property
    def compensates(self) -> bool:
        """Whether the tool declares a compensating action (``compensate=``)."""
        return self.compensate is not None

    async def compensation(self, entry: LedgerEntry) -> JsonValue:
        """Run the compensating action for ``entry``, an effect a rollback abandoned.

        Declared transient errors are retried as the tool's ``retry`` says.
        [`reconcile`][agentsnap.once.reconcile] calls this once per abandoned entry.

        Args:
            entry: The abandoned ledger entry (its arguments, result and key).

        Returns:
            What the action returned, as JSON.

        Raises:
            ConfigurationError: The tool declares no compensating action.
            Exception: Whatever the action raised last.
        """
        if self.compensate is None:
            raise ConfigurationError(f"tool {self.name!r} declares no compensate= action")
        retrying = tenacity.AsyncRetrying(
            stop=self.retry.stop if self.transient else tenacity.stop_after_attempt(1),
            wait=self.retry.wait,
            retry=tenacity.retry_if_exception_type(self.transient),
            reraise=True,
        )
        value: Any = None
        async for attempt in retrying:
            with attempt:
                value = self.compensate(entry)
                if inspect.isawaitable(value):
                    value = await value
        dumped: JsonValue = _ANY.dump_python(value, mode="json")
        canonical_json(dumped)
        return dumped


_ANY: TypeAdapter[Any] = TypeAdapter(Any)


class _SchemaTool(Tool[Any]):
    """A tool whose arguments are a JSON object described by a schema (see ``from_schema``)."""

    def __init__(
        self,
        name: str,
        parameters: Mapping[str, Any],
        fn: Callable[..., Awaitable[Any]],
        **options: Unpack[_SchemaToolOptions],
    ) -> None:
        if not inspect.iscoroutinefunction(fn) and not inspect.iscoroutinefunction(
            getattr(fn, "__call__", None)  # noqa: B004 - an object with an async __call__
        ):
            raise ConfigurationError(
                f"Tool.from_schema({name!r}) takes an async function of the arguments"
            )
        schema = dict(parameters) if isinstance(parameters, Mapping) else None
        if schema is None or schema.get("type", "object") != "object":
            raise ConfigurationError(
                f"the arguments of tool {name!r} must be described by an 'object' JSON Schema, "
                f"got {parameters!r}"
            )

        async def arguments() -> None:  # the signature of the base: none of its own
            """Stands in for ``fn``, whose arguments the schema describes."""

        key_from = options.pop("key_from", None)
        if options.get("description") is None:
            options["description"] = ""  # not the stand-in's docstring
        super().__init__(arguments, name=name, **options)
        properties = schema.get("properties") or {}
        self.fn = fn
        try:
            takes = len(inspect.signature(fn).parameters)
        except (TypeError, ValueError):  # no signature to read: the arguments alone
            takes = 1
        self._wants_call = takes >= 2
        self._returns = None  # any JSON
        self._load = None
        self._schema = schema
        self._names = [str(n) for n in properties] if isinstance(properties, Mapping) else []
        required = schema.get("required") or []
        self._required = [str(n) for n in required] if isinstance(required, list) else []
        self._closed = schema.get("additionalProperties") is False
        if key_from is not None:
            if not self.side_effect:
                raise ConfigurationError(
                    f"tool {self.name!r} declares key_from= but not side_effect=True; only "
                    "side-effecting calls have keys"
                )
            chosen = (key_from,) if isinstance(key_from, str) else tuple(key_from)
            unknown = [n for n in chosen if n not in self._names]
            if unknown or not chosen:
                raise ConfigurationError(
                    f"key_from= of tool {self.name!r} names {list(chosen)!r}, but its "
                    f"arguments are {sorted(self._names)!r}; name one or more of them"
                )
            self.key_from = chosen

    def arguments_schema(self) -> dict[str, Any]:
        return dict(self._schema)

    def _validate(self, arguments: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], str]:
        missing = [n for n in self._required if n not in arguments]
        if missing:
            raise ToolArgumentsInvalid(self.name, f"missing required {', '.join(missing)}")
        if self._closed:
            extra = sorted(n for n in arguments if n not in self._names)
            if extra:
                raise ToolArgumentsInvalid(self.name, f"unexpected {', '.join(extra)}")
        try:
            args_json: dict[str, Any] = _ANY.dump_python(dict(arguments), mode="json")
            printed = fingerprint(args_json)
        except (PydanticSerializationError, TypeError, ValueError) as exc:
            raise ToolArgumentsInvalid(self.name, f"they are not JSON: {_first_line(exc)}") from exc
        return dict(arguments), args_json, printed

    async def _call_fn(self, values: dict[str, Any], info: ToolCall, attempt: int) -> Any:
        if self._wants_call:
            return await self.fn(dataclasses.replace(info, attempt=attempt), values)
        return await self.fn(values)


async def _redacted_outcome(
    call: Callable[[int], Awaitable[Outcome]], redaction: Redaction, tool: str, attempt: int
) -> Outcome:
    """``call``'s outcome with its result as the ledger records it: redacted."""
    outcome = await call(attempt)
    result = redaction.tool_result(tool, outcome.result)
    return outcome if result is outcome.result else outcome._replace(result=result)


def _restored_result(
    tool: str,
    redaction: Redaction | None,
    load: Callable[[JsonValue], Any] | None,
    result: JsonValue,
) -> Any:
    """A recorded result, its markers given back by the redaction's provider, then loaded."""
    value = unredact(result, "tool_result", tool, redaction, doing=f"replay tool {tool!r}")
    return load(value) if load is not None else value


async def run_tool_calls(
    ctx: Context[Any], response: ModelResponse, tools: Sequence[Tool[Any]]
) -> list[ChatMessage]:
    """Run the tool calls a model's answer asks for, in order; return the ``tool`` messages.

    Each call goes through its tool as ``await tool(ctx, **arguments)`` would: recorded in
    the agent's state, and through the ledger when the tool has side effects. A call of a
    tool not in ``tools``, arguments that do not fit, and a tool's failure come back as a
    ``tool`` message saying what went wrong, for the model to act on; anything else (an
    [`EffectDiverged`][agentsnap.EffectDiverged], an unknown outcome, a rejection)
    propagates.

    Args:
        ctx: The handler's context.
        response: The model's answer.
        tools: The tools the model was offered.

    Returns:
        One ``tool`` message per call, answering it (``tool_call_id`` is the call's id).
    """
    by_name = {t.name: t for t in tools}
    answers: list[ChatMessage] = []
    for call in response.tool_calls:
        found = by_name.get(call.name)
        if found is None:
            content = f"error: no tool named {call.name!r} (tools: {', '.join(sorted(by_name))})"
        else:
            try:
                result = await found.run(ctx, call.arguments)
            except (ToolArgumentsInvalid, ToolFailed) as exc:
                content = f"error: {exc}"
            else:
                content = canonical_json(_ANY.dump_python(result, mode="json"))
        answers.append(ChatMessage(role="tool", content=content, tool_call_id=call.id or None))
    return answers


class _NewEffect(Exception):  # a signal between two methods, never raised out
    """A redo's call with other arguments is to run as an effect of its own."""


def _signature(
    fn: Callable[..., Any], name: str
) -> tuple[bool, type[BaseModel], list[str], TypeAdapter[Any] | None]:
    """Read the tool's parameters into a pydantic model, and its return type."""
    try:
        hints = typing.get_type_hints(fn)
    except Exception as exc:
        raise ConfigurationError(
            f"the annotations of tool {name!r} cannot be resolved ({_first_line(exc)}); import "
            "the types they name at module level"
        ) from exc
    parameters = list(inspect.signature(fn).parameters.values())
    wants_call = bool(parameters) and hints.get(parameters[0].name) is ToolCall
    if wants_call:
        parameters = parameters[1:]
    fields: dict[str, Any] = {}
    names: list[str] = []
    for position, parameter in enumerate(parameters):
        if parameter.kind in {parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD}:
            raise ConfigurationError(
                f"tool {name!r} takes *args or **kwargs; a tool's parameters must be named, "
                "so that its calls can be validated and fingerprinted"
            )
        if parameter.kind == parameter.POSITIONAL_ONLY:
            raise ConfigurationError(
                f"parameter {parameter.name!r} of tool {name!r} is positional-only; tools are "
                "called with keyword arguments"
            )
        if parameter.name == "key":
            raise ConfigurationError(
                f"tool {name!r} has a parameter named 'key', which is reserved for the "
                "idempotency key; rename it"
            )
        if hints.get(parameter.name) is ToolCall:
            raise ConfigurationError(
                f"tool {name!r} asks for a ToolCall in parameter {parameter.name!r}; it must be "
                "the first parameter"
            )
        annotation = hints.get(parameter.name, Any)
        default = ... if parameter.default is parameter.empty else parameter.default
        # Fields get neutral names and the parameter names as aliases, so that a parameter
        # may be called anything (``json``, ``schema``, ``_private``) without clashing with
        # pydantic's own attributes.
        fields[f"p{position}"] = (annotation, Field(default, alias=parameter.name))
        names.append(parameter.name)
    config = ConfigDict(extra="forbid", arbitrary_types_allowed=False)
    model = create_model(f"{name}_arguments", __config__=config, **fields)
    returns = hints.get("return")
    adapter = None if returns is None or returns is Any else TypeAdapter(returns)
    return wants_call, model, names, adapter


def _summary(result: JsonValue) -> JsonValue:
    text = canonical_json(result)
    if len(text) <= RESULT_SUMMARY_CHARS:
        return result
    return f"{text[: RESULT_SUMMARY_CHARS - 40]}… ({len(text)} characters of JSON)"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


# -- the decorator --------------------------------------------------------------------------


class _Decorator(Protocol):
    @overload
    def __call__(self, fn: Callable[..., Awaitable[R]], /) -> Tool[R]: ...
    @overload
    def __call__(self, fn: Callable[..., R], /) -> Tool[R]: ...


@overload
def tool(fn: Callable[..., Awaitable[R]], /) -> Tool[R]: ...
@overload
def tool(fn: Callable[..., R], /) -> Tool[R]: ...
@overload
def tool(**options: Unpack[_ToolOptions]) -> _Decorator: ...
def tool(fn: Callable[..., Any] | None = None, /, **options: Unpack[_ToolOptions]) -> Any:
    """Make a function (sync or async) a tool agents call from their handlers.

    Its parameters become the tool's keyword arguments, validated by pydantic; a first
    parameter annotated [`ToolCall`][agentsnap.ToolCall] receives the call's key and attempt
    instead. Its return value must be JSON (or a pydantic model, with the return type
    annotated, so that a replayed result comes back as the same type). Sync functions run in
    a worker thread.

    Args:
        fn: The function (when used as ``@tool`` without parentheses).

    Other Parameters:
        name (str | None): Name in the ledger and in agent states (default: the function's
            name), 1 to 128 characters. Keep it stable: derived keys and compensation depend
            on it.
        side_effect (bool): The tool touches the outside world: every call is claimed in the
            ledger under an idempotency key before it runs, and its outcome recorded (default
            ``False``).
        transient (tuple[type[BaseException], ...]): Exceptions meaning "the effect did not
            happen, try again": retried under the same key as ``retry`` says, and never
            cached (default: none).
        retry (ToolRetry | None): How transient errors are retried (default: 3 attempts,
            exponential wait).
        rerun_if_unknown (bool): Running the tool again after an unknown outcome (its owner
            crashed mid-call) is safe, because it passes its key to the service, which
            deduplicates. Without it (the default) such a call raises
            [`ToolOutcomeUnknown`][agentsnap.ToolOutcomeUnknown].
        compensate (Compensation | None): Undoes the effect of a call that a rollback
            abandoned: called once with the [`LedgerEntry`][agentsnap.ledger.LedgerEntry]
            (arguments, result, key) when the run ends; its JSON result (or error) is
            recorded (default: none).
        lease (float): Seconds a claim holds (default 60). A call still in progress after its
            lease, or whose owning process on this host has died, has an unknown outcome.
        wait (float): Seconds a call waits for the same key in progress elsewhere before it
            raises [`ToolInProgress`][agentsnap.ToolInProgress] (default 10).
        key_from (Sequence[str] | None): The arguments that name the effect
            (``("reservation_id",)``): a derived key is made of them instead of the call's
            place in the handler (the default, with ``None``), so that other
            calls made first, or their order, never make a new effect, and the other
            arguments are wording: a re-executed call that words them otherwise (after a
            rollback or a resume) gets the recorded outcome, neither a new effect nor a
            divergence.
        on_redo (OnRedo): What a redo after a rollback does when it calls the tool where the undone
            path did, with other arguments: see [`OnRedo`][agentsnap.tools.OnRedo]
            (default ``"recorded"``: the effect that happened stands).
        on_divergence (OnDivergence): What a re-execution after a crash does when it calls
            the tool where it had before, with other arguments: see
            [`OnDivergence`][agentsnap.tools.OnDivergence] (default ``"raise"``).
        description (str | None): What the tool does, as a model is told (default: the
            docstring).
        approval (ApprovalPolicy): A call from a handler waits for a person's approval before
            it is claimed in the ledger (default: none): ``True``, a predicate on the call's
            arguments (as JSON), or an [`Approval`][agentsnap.requests.Approval] (who,
            deadline and its outcome). A denial raises
            [`ApprovalDenied`][agentsnap.ApprovalDenied], a ``ToolFailed`` the agent sees;
            nothing is claimed. Each call asks on its own, so each answer binds to one call
            (see [Ask a person before acting](../how-to/ask-a-person.md)). Only for
            side-effecting tools.
        dry_run (DryRun): What a call returns in a run whose tools are dry (a what-if fork
            made with ``tools="dry"``), where the tool does not run and the call is recorded
            in the ledger as ``dry`` with its arguments: a JSON value, or a function of the
            arguments (as JSON) returning one (default ``None``). Only for side-effecting
            tools.

    Returns:
        A [`Tool`][agentsnap.Tool] (or a decorator making one, when called with options).

    Raises:
        ConfigurationError: The function cannot be a tool (``*args``, a parameter named
            ``key``, annotations that cannot be resolved, a name longer than 128 characters);
            the message says why.
        TypeError: An option is not one of these.
    """
    _known_options("tool", options, _ToolOptions.__optional_keys__)
    if fn is not None:
        return Tool(fn, **options)

    def decorate(function: Callable[..., Any]) -> Tool[Any]:
        return Tool(function, **options)

    return decorate
