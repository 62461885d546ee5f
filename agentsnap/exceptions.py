"""Every error agentsnap raises, in one tree.

```
AgentsnapError
├── ConfigurationError          a mistake in how the program uses agentsnap; fix the code
│   ├── InvalidAgentName
│   ├── DuplicateAgentError
│   ├── UnknownAgentError
│   ├── StateNotSerializable
│   ├── StateNotReadable        a stored state the current state class cannot read
│   ├── StateInvalid            edits given to fork a run that the state models refuse
│   ├── PayloadNotSerializable
│   ├── PayloadInvalid          defined beside Message, in agentsnap.messages
│   ├── ScheduleError
│   ├── SnapshotInProgress      also a RuntimeError
│   ├── ToolArgumentsInvalid
│   ├── IdempotencyConflict
│   ├── AnswerInvalid           an answer does not fit its request's schema
│   ├── AgentsHeld              another live worker hosts the agents (agentsnap.distributed)
│   └── MissingExtraError       an integration's extra is not installed; also an ImportError
│                               (agentsnap.integrations)
├── NotFoundError               an id that the store does not hold
├── RequestNotPending           answering a request that is no longer waiting
├── SpoolError                  the local spool of refused writes cannot be read (see
│                               agentsnap.store.spool)
├── DeleteRefused               runs cannot be deleted safely (a live runtime owns one, or
│                               a fork needs its checkpoints); see agentsnap.store.retention
└── RunError                    something went wrong while a run was executing
    ├── HandlerFailed
    ├── SnapshotFailed
    ├── SnapshotDamaged
    ├── RedactedValueNeeded     a resume or rollback needs a value the store keeps redacted
    ├── StoreError
    │   └── SchemaOutOfDate
    ├── RollbackExhausted
    ├── RunOwnedError
    ├── OwnershipLost
    ├── RunCancelled            someone asked the run to stop (agentsnap cancel)
    ├── ToolFailed
    │   └── ApprovalDenied      a person denied a side-effecting call
    ├── RequestRejected         a person (or a deadline) turned a request down
    ├── RequestExpired          a request's deadline passed, and it fails the run
    ├── EffectDiverged
    ├── ToolInProgress
    ├── ToolOutcomeUnknown
    ├── TransportError
    ├── RuntimeClosedError
    └── CheckpointMissing       a graph agent's LangGraph checkpoint is gone
                                (agentsnap.integrations.langgraph)

Signal (a BaseException)       control flow, not an error: the runtime handles it
└── OutputRejected              an output failed validation; the run rolls back
```

Developer mistakes (`ConfigurationError`) are raised where the mistake is made, so the
traceback points at the offending line. Run failures (`RunError`) are reported by the runtime
and carry what is needed to find their cause: the agent, the message, the snapshot. Signals
(`Signal`) travel from a handler to the runtime, which acts on them; they only reach
application code when it raises them itself.

Every error is importable from here (and from `agentsnap`), except those drawn with the
module that defines them (a worker's, an integration's, the spool's, retention's). The roots,
`AgentsnapError` and `ConfigurationError`, are defined in `agentsnap._errors`, which imports
nothing, and `PayloadInvalid` beside the `Message` it names: this module names `Message` as
well (a failed handler and a rejected output carry one), so it imports `agentsnap.messages`,
never the other way round.
"""

from __future__ import annotations

import json
from dataclasses import KW_ONLY, InitVar, dataclass
from typing import TYPE_CHECKING, Any

from agentsnap._errors import AgentsnapError, ConfigurationError
from agentsnap.messages import Message, PayloadInvalid

if TYPE_CHECKING:
    from datetime import datetime

__all__ = [
    "AgentsnapError",
    "AnswerInvalid",
    "ApprovalDenied",
    "ConfigurationError",
    "DuplicateAgentError",
    "EffectDiverged",
    "HandlerFailed",
    "IdempotencyConflict",
    "InvalidAgentName",
    "NotFoundError",
    "OutputRejected",
    "OwnershipLost",
    "PayloadInvalid",
    "PayloadNotSerializable",
    "RedactedValueNeeded",
    "RequestExpired",
    "RequestNotPending",
    "RequestRejected",
    "RollbackExhausted",
    "RunCancelled",
    "RunError",
    "RunOwnedError",
    "RuntimeClosedError",
    "ScheduleError",
    "SchemaOutOfDate",
    "Signal",
    "SnapshotDamaged",
    "SnapshotFailed",
    "SnapshotInProgress",
    "StateInvalid",
    "StateNotReadable",
    "StateNotSerializable",
    "StoreError",
    "ToolArgumentsInvalid",
    "ToolFailed",
    "ToolInProgress",
    "ToolOutcomeUnknown",
    "TransportError",
    "UnknownAgentError",
]


class InvalidAgentName(ConfigurationError):
    """An agent name is empty, too long, or uses characters outside ``[A-Za-z0-9_.-]``."""


@dataclass(eq=False, repr=False)
class StateInvalid(ConfigurationError):
    """Edits given to fork a run are not valid.

    They are agent states that the agents' state models do not accept, or edits of the
    messages in flight that do not fit the cut.

    Each problem names the agent, the place in its state as a JSONPath-style path (``$`` is
    the whole state, ``$.memory.notes[0]`` a part of it), or ``message ID`` for a message
    edit (the message's receiver as the agent), and what is wrong there.

    Attributes:
        problems: ``{"agent": name, "path": path, "message": text}``, one per problem.
    """

    problems: list[dict[str, str]]

    def __post_init__(self) -> None:
        shown = "; ".join(f"{p['agent']} at {p['path']}: {p['message']}" for p in self.problems[:5])
        more = f" (and {len(self.problems) - 5} more)" if len(self.problems) > 5 else ""
        of_messages = sum(p["path"].startswith("message ") for p in self.problems)
        advice = []
        if of_messages < len(self.problems):
            advice.append("fix the state so that it matches the agent's state model")
        if of_messages:
            advice.append(
                "name messages in flight by their id, src>dst#seq, as the cut lists them, "
                "and add messages only between the cut's agents"
            )
        what = (
            "edited state"
            if not of_messages
            else "message edit"
            if of_messages == len(self.problems)
            else "fork's edit"
        )
        super().__init__(
            f"the {what}{'s are' if len(self.problems) > 1 else ' is'} not valid: {shown}{more}; "
            + "; ".join(advice)
        )


@dataclass(eq=False, repr=False)
class DuplicateAgentError(ConfigurationError):
    """Two agents were registered under the same name in one runtime."""

    name: str

    def __post_init__(self) -> None:
        super().__init__(
            f"an agent named {self.name!r} is already registered; agent names must be unique "
            "within a runtime, so give this one another name"
        )


@dataclass(eq=False, repr=False)
class UnknownAgentError(ConfigurationError):
    """A message was addressed to an agent that is not registered."""

    sender: str
    recipient: str
    known: list[str]

    def __post_init__(self) -> None:
        names = ", ".join(repr(n) for n in self.known) if self.known else "none"
        super().__init__(
            f"{self.sender!r} sent a message to {self.recipient!r}, which is not a registered "
            "agent "
            f"(registered: {names}); register it with Runtime.add() before sending to it"
        )


@dataclass(eq=False, repr=False)
class StateNotSerializable(ConfigurationError):
    """An agent's state holds a value that cannot be stored as JSON.

    Raised at registration for the initial state, and reported through
    [`SnapshotFailed`][agentsnap.SnapshotFailed] when a snapshot meets such a value later.
    """

    agent: str
    field: str | None
    detail: InitVar[str]

    def __post_init__(self, detail: str) -> None:
        where = (
            f"field {self.field!r} of agent {self.agent!r}"
            if self.field
            else f"the state of agent {self.agent!r}"
        )
        super().__init__(
            f"{where} cannot be stored as JSON ({detail}); "
            "agent state must be JSON: use JSON types (str, int, float, bool, None, list, dict) "
            "or pydantic models of them"
        )


@dataclass(eq=False, repr=False)
class StateNotReadable(ConfigurationError):
    """A stored agent state that the agent's state class, as the code now declares it, cannot read.

    A state is stored with the version of its class (see
    [`agentsnap.versions`][agentsnap.versions]) and read through the class's upcasters, one
    version at a time. This is raised when a step of that chain is missing or fails, when the
    stored state is of a newer version than the class, or when the state, upcast, does not
    validate. Resume, rollback, fork and the inspector raise it before anything changes.

    Attributes:
        agent: The agent whose state it is.
        model: The name of the agent's state class.
        stored_version: The version the state was stored with.
        current_version: The version the class declares now.
        step: The version the failing step starts from: the upcaster that is missing (or that
            failed) goes from ``step`` to ``step + 1``; ``None`` when no step is at fault.
        detail: What went wrong, in one line.
    """

    agent: str
    model: str
    stored_version: int
    current_version: int
    _: KW_ONLY
    step: int | None
    detail: str

    def __post_init__(self) -> None:
        super().__init__(
            f"the stored state of agent {self.agent!r} (version {self.stored_version}) cannot be "
            "read "
            f"as {self.model} version {self.current_version}: {self.detail}"
        )


@dataclass(eq=False, repr=False)
class PayloadNotSerializable(ConfigurationError):
    """A message payload is not a JSON value."""

    sender: str
    recipient: str
    detail: InitVar[str]

    def __post_init__(self, detail: str) -> None:
        super().__init__(
            f"the payload {self.sender!r} sent to {self.recipient!r} is not JSON ({detail}); "
            "send JSON values (dict with str keys, list, str, int, finite float, bool, None) "
            "or a pydantic model"
        )


class ScheduleError(ConfigurationError):
    """A scripted schedule asked for a delivery that is not possible."""


@dataclass(eq=False, repr=False)
class SnapshotInProgress(ConfigurationError, RuntimeError):
    """A snapshot's outcome was asked for before the snapshot finished.

    Raised by [`SnapshotHandle.result`][agentsnap.SnapshotHandle.result]; it is also a
    ``RuntimeError``, which it used to be.

    Attributes:
        seq: Number of the snapshot within the run.
    """

    seq: int

    def __post_init__(self) -> None:
        super().__init__(
            f"snapshot {self.seq} is still in progress, so it has no result yet; await the handle "
            "(or its wait()) to get the snapshot once it completes, or check done() first"
        )


@dataclass(eq=False, repr=False)
class ToolArgumentsInvalid(ConfigurationError):
    """A tool was called with arguments that do not fit its signature; nothing ran.

    Attributes:
        tool: Name of the tool.
    """

    tool: str
    detail: InitVar[str]

    def __post_init__(self, detail: str) -> None:
        super().__init__(
            f"tool {self.tool!r} was called with invalid arguments ({detail}); pass keyword "
            "arguments that match the tool function's parameters"
        )


@dataclass(eq=False, repr=False)
class IdempotencyConflict(ConfigurationError):
    """An idempotency key was reused for a different call; nothing ran.

    A key names one effect. Reusing it with other arguments (or for another tool) would
    return the first call's outcome for a call that asked for something else.

    Attributes:
        key: The idempotency key.
        tool: The tool of the call that was refused.
    """

    key: str
    tool: str
    detail: InitVar[str]

    def __post_init__(self, detail: str) -> None:
        super().__init__(
            f"idempotency key {self.key!r} cannot be used for this call of tool {self.tool!r}: "
            f"{detail}; "
            "use a new key for a different call"
        )


@dataclass(eq=False, repr=False)
class NotFoundError(AgentsnapError, LookupError):
    """A run, snapshot or agent that the store does not hold.

    Attributes:
        what: What was looked for (``"run"``, ``"snapshot"``, ``"agent"`` …).
        ident: The id or name that was not found.
    """

    what: str
    ident: str
    message: InitVar[str | None] = None

    def __post_init__(self, message: str | None) -> None:
        super().__init__(message or f"no {self.what} with id {self.ident!r} in this store")

    @classmethod
    def agent(cls, run_id: str, agent: str) -> NotFoundError:
        """The error for an agent that no complete snapshot of ``run_id`` recorded."""
        return cls(
            "agent",
            agent,
            f"no complete snapshot of run {run_id!r} recorded an agent named {agent!r}",
        )


class RunError(AgentsnapError):
    """A failure while a run was executing."""


@dataclass(eq=False, repr=False)
class HandlerFailed(RunError):
    """An agent's handler raised while handling a message.

    The original exception is the ``__cause__``. The other agents kept running.

    An agent's [`on_rollback`][agentsnap.Agent.on_rollback] that raises is one too, with no
    message: the other agents' hooks still run, and the run goes on.

    Attributes:
        agent: The agent whose handler raised.
        message: The message it was handling; ``None`` for ``on_rollback``.
    """

    agent: str
    message: Message | None
    error: InitVar[BaseException]

    def __post_init__(self, error: BaseException) -> None:
        # The context first, as a sentence of its own: the error's text may end in advice.
        text = str(error).strip()
        raised = f"{type(error).__name__}: {text}" if text else type(error).__name__
        where = (
            "in on_rollback after a rollback"
            if self.message is None
            else f"while handling message {self.message.id} (kind {self.message.kind!r})"
        )
        super().__init__(f"agent {self.agent!r} failed {where}. {raised}")


@dataclass(eq=False, repr=False)
class SnapshotFailed(RunError):
    """A snapshot could not be completed; earlier snapshots are untouched.

    Attributes:
        snapshot_id: Id of the failed snapshot.
        reason: Why it failed.
    """

    snapshot_id: str
    reason: str

    def __post_init__(self) -> None:
        super().__init__(f"snapshot {self.snapshot_id} failed: {self.reason}")


@dataclass(eq=False, repr=False)
class SnapshotDamaged(RunError):
    """The snapshot a run must go back to is damaged in the store: the run cannot use it.

    A store reads a snapshot whose rows were deleted or changed behind agentsnap's back as
    [`DAMAGED`][agentsnap.SnapshotStatus.DAMAGED]. A run never restores one: a rollback
    whose target is damaged stops the run with this error, and a resume whose only cut is
    damaged refuses with it. Inspect the snapshot with ``agentsnap show``; a run can still
    be forked from an intact snapshot.

    Attributes:
        snapshot_id: The damaged snapshot.
        reason: What is wrong with it.
    """

    snapshot_id: str
    reason: str
    what: InitVar[str]

    def __post_init__(self, what: str) -> None:
        super().__init__(
            f"snapshot {self.snapshot_id} is damaged in the store, so {what}: {self.reason}. "
            "Inspect it "
            f"with `agentsnap show {self.snapshot_id}`; a new run can be forked from an intact "
            "snapshot"
        )


@dataclass(eq=False, repr=False)
class RedactedValueNeeded(RunError):
    """A resume or a rollback needs a value that the store keeps only as a redaction marker.

    The run's [`Redaction`][agentsnap.Redaction] replaced it before it was
    written, and agentsnap never restores a marker by itself: its ``secret`` provider must
    give the value back (one that hashes to the marker), or the run cannot go back to that
    cut.

    Attributes:
        kind: What held the value: ``"state"``, ``"payload"``, ``"tool_result"``,
            ``"model_answer"``...
        owner: The agent (or the tool) it belongs to.
        path: Its place, as dotted keys.
        marker: The marker the store holds.
    """

    kind: str
    owner: str
    path: str
    marker: str
    doing: InitVar[str]
    _: KW_ONLY
    provided: InitVar[bool]

    def __post_init__(self, doing: str, provided: bool) -> None:
        where = self.path or "(all of it)"
        what = {
            "state": f"the state of agent {self.owner!r}, field {where}",
            "payload": f"a message to agent {self.owner!r}, payload key {where}",
            "tool_result": f"the recorded result of tool {self.owner!r} at {where}",
            "model_answer": f"a recorded model answer of agent {self.owner!r} at "
            f"{self.path or '(all)'}",
        }.get(self.kind, f"{self.kind} of {self.owner!r} at {self.path}")
        if provided:
            todo = (
                "the redaction's secret provider gave a value that does not hash to the "
                "marker (another value, or another redaction key): give the value the run had"
            )
        else:
            todo = (
                "pass Redaction(secret=...) a provider that returns it (it is called with a "
                "Where naming the agent, the place and the marker), or stop redacting it"
            )
        super().__init__(
            f"cannot {doing}: {what} is stored redacted ({self.marker}) and is needed; {todo}"
        )


class StoreError(RunError):
    """The store could not do what was asked; what was stored before is intact."""


@dataclass(eq=False, repr=False)
class SchemaOutOfDate(StoreError):
    """The database schema is not the one this version of agentsnap needs."""

    url: InitVar[str]
    found: str | None
    needed: str

    def __post_init__(self, url: str) -> None:
        super().__init__(
            f"the agentsnap schema in {url} is at revision {self.found or 'none'}, this agentsnap "
            f"needs {self.needed}: run `agentsnap db upgrade --db {url}`"
        )


@dataclass(eq=False, repr=False)
class RollbackExhausted(RunError):
    """A failure kept coming back after every rollback the retry policy allowed.

    The run stops; everything it did stays in the store to inspect.

    Attributes:
        agent: The agent whose output kept failing.
        source: What rejected it (a check's name, ``"self-evaluation"``, a critic agent).
        attempts: How many times it failed.
        reasons: The reasons given, oldest first.
        per_run: The run's budget of rollbacks when it is what ran out
            (`per_run` of [`RetryPolicy`][agentsnap.rollback.RetryPolicy]), else ``None``.
    """

    agent: str
    source: str
    attempts: int
    reasons: list[str]
    _: KW_ONLY
    per_run: int | None = None

    def __post_init__(self) -> None:
        last = "; ".join(repr(r) for r in self.reasons[-3:])
        if self.per_run is not None:
            super().__init__(
                f"output of agent {self.agent!r} was rejected by {self.source} ({last}) after the "
                "run "
                f"had rolled back {self.per_run} time(s), the most the retry policy allows for a "
                "whole run. The run stopped; inspect it with `agentsnap export`, or raise "
                "RetryPolicy(per_run=...)"
            )
            return
        super().__init__(
            f"output of agent {self.agent!r} was rejected by {self.source} {self.attempts} time(s) "
            "in a row, "
            f"the most the retry policy allows; last reasons: {last}. The run stopped; inspect "
            "it with `agentsnap export`, or allow more attempts (RetryPolicy)"
        )


class Signal(BaseException):
    """Base of control-flow signals: raised in a handler, handled by the runtime.

    Like ``asyncio.CancelledError``, a signal derives from ``BaseException``, not from
    ``Exception``: application code that catches ``Exception`` around a send cannot swallow
    it. The runtime also remembers a signal raised in a handler, so it acts on it even when
    a handler catches ``BaseException``.
    """


@dataclass(eq=False, repr=False)
class OutputRejected(Signal):
    """An agent's output failed validation: a schema, a check, its own evaluation, or a critic.

    Raised inside a handler (by a check on ``ctx.send``, by ``ctx.reject``, or after
    ``Agent.evaluate``), it makes the runtime roll every agent back to the last consistent cut
    taken before the rejected output and hand ``reason`` to ``agent`` as feedback.

    Attributes:
        agent: The agent whose output was rejected.
        reason: Why, in words the agent can act on.
        source: What rejected it: a check's name, ``"schema"``, ``"self-evaluation"``, or the
            name of the critic agent.
        output: The rejected message, when there is one.
    """

    agent: str
    reason: str
    source: str
    output: Message | None = None

    def __post_init__(self) -> None:
        super().__init__(f"output of agent {self.agent!r} rejected by {self.source}: {self.reason}")


class TransportError(RunError):
    """A transport cannot carry the channels: its server is unreachable or refused a message.

    Raised by [`agentsnap.jetstream`][agentsnap.jetstream] when the NATS server cannot be
    reached or has no JetStream, and when it refuses a publish for good (a full stream).
    """


class RuntimeClosedError(RunError):
    """The runtime was closed, or its run stopped; create a new one to continue."""


@dataclass(eq=False, repr=False)
class RunOwnedError(RunError):
    """Another runtime owns the run: its lease is live.

    Attributes:
        run_id: The run.
        owner: The owning process, ``host:pid:token``.
        expires_at: When its lease ends unless it renews it.
    """

    run_id: str
    owner: str
    expires_at: datetime

    def __post_init__(self) -> None:
        super().__init__(
            f"run {self.run_id} is owned by {self.owner}, whose lease holds until "
            f"{self.expires_at.isoformat(timespec='seconds')}; stop that process, or wait for its "
            "lease to expire and resume again"
        )


@dataclass(eq=False, repr=False)
class OwnershipLost(RunError):
    """This runtime's lease on its run was taken over: its writes to the run are refused.

    Another runtime resumed the run after this one's lease expired (it stopped renewing it,
    for example because its process was suspended). Stop this runtime; the new owner goes on.
    """

    run_id: str
    token: int
    detail: InitVar[str] = ""

    def __post_init__(self, detail: str) -> None:
        super().__init__(
            f"this runtime no longer owns run {self.run_id} (its lease, token {self.token}, was "
            "taken "
            f"over{': ' + detail if detail else ''}); its writes are refused"
        )


@dataclass(eq=False, repr=False)
class RunCancelled(RunError):
    """Someone asked the run to stop (``agentsnap cancel``, or
    [`cancel_run`][agentsnap.inspect.cancel_run]), and its runtime stopped it.

    The runtime saw the request at a renewal of its lease, delivered nothing more (the
    handlers under way finished), and records the run as cancelled when it is closed:
    ``resume()`` (or ``agentsnap resume``) continues it from its last complete snapshot.

    A run spread over processes is stopped the same way by its coordinator, in every worker
    at once; ``DistributedRun.take_over`` continues it.

    Attributes:
        run_id: The run.
        reason: Why it was cancelled, as the request said.
    """  # noqa: D205

    run_id: str
    reason: str
    _: KW_ONLY
    resume: InitVar[str | None] = None

    def __post_init__(self, resume: str | None) -> None:
        how = (
            resume or f"`agentsnap resume {self.run_id} --app MODULE:FACTORY`, or Runtime.resume()"
        )
        super().__init__(
            f"run {self.run_id} was cancelled on request ({self.reason}); resume it to continue "
            f"({how})"
        )


@dataclass(eq=False, repr=False)
class EffectDiverged(RunError):
    """A re-executed handler called a side-effecting tool where it had before, with other
    arguments; nothing ran a second time.

    A derived idempotency key names the call (the run, the agent, the message being handled,
    the tool and its place among that tool's calls in the handler), not its arguments. When a
    handler is re-executed on the same timeline (after a crash and ``resume()``), its model
    calls are replayed, so the same call should come with the same arguments; other
    arguments mean something the handler read was not recorded (the clock, a random
    number, a model called around the context). The effect already happened with the
    recorded arguments, so the call is refused instead of running a second effect. Declare
    ``@tool(on_divergence="recorded")`` for a tool whose recorded outcome may stand for the
    new call, or give the arguments that name the effect with ``key_from=``.

    Attributes:
        tool: Name of the tool.
        key: The call's idempotency key.
        recorded: The arguments the effect ran with, as recorded in the ledger.
        arguments: The arguments of the re-executed call.
    """  # noqa: D205

    tool: str
    key: str
    recorded: dict[str, Any]
    arguments: dict[str, Any]

    def __post_init__(self) -> None:
        super().__init__(
            f"tool {self.tool!r} was called again at the same place of a re-executed handler (key "
            f"{self.key!r}) with other arguments: it ran with {_brief(self.recorded)}, and now "
            "gets "
            f"{_brief(self.arguments)}; the effect was not run a second time. Record what the "
            "handler reads (call models through ctx.chat()/ctx.complete()), name the "
            "arguments that identify the effect with @tool(key_from=...), or declare "
            '@tool(on_divergence="recorded") to let the recorded outcome stand'
        )


def _brief(arguments: dict[str, Any]) -> str:
    text = json.dumps(arguments, sort_keys=True, default=str)
    return text if len(text) <= 200 else text[:197] + "..."


@dataclass(eq=False, repr=False)
class ToolFailed(RunError):
    """A tool call failed; the original exception is the ``__cause__`` when the tool ran.

    A final failure is recorded in the ledger: calling again with the same key raises this
    error again (``replayed`` is then true) and does not run the tool. A transient failure
    that outlasted its retries (``transient``) is not recorded as final: the next call with
    the same key runs the tool again.

    Attributes:
        tool: Name of the tool.
        key: Idempotency key of the call (``None`` for a tool without side effects).
        error_type: Name of the exception the tool raised.
        detail: Its message.
        transient: The failure was a declared transient error, retried until the retry
            policy gave up.
        replayed: The failure was read from the ledger; the tool did not run.
        attempts: How many times the tool ran for this call, retries included: for a
            side-effecting call, the ledger's count under its key (when replayed, the count
            recorded when it ran).
    """

    tool: str
    key: str | None
    error_type: str
    detail: str
    transient: bool = False
    replayed: bool = False
    attempts: int = 1

    def __post_init__(self) -> None:
        super().__init__(self._says())

    def _says(self) -> str:
        """The error's message, from its fields."""
        where = f"tool {self.tool!r}" + (f" (key {self.key!r})" if self.key else "")
        if self.transient:
            after = (
                "a transient error, retried until the retry policy gave up; it is not recorded "
                "as final, so a later call with the same key tries again"
            )
        elif self.replayed:
            after = (
                "recorded in the ledger by an earlier call with this key, so the tool did not "
                "run again; fix the cause and call with a new key"
            )
        elif self.key is not None:
            after = "recorded in the ledger: a call with the same key raises it without running"
        else:
            after = "the tool has no side effects, nothing was recorded"
        return f"{where} failed with {self.error_type}: {self.detail} ({after})"


@dataclass(eq=False, repr=False)
class ToolInProgress(RunError):
    """A call with the same idempotency key is still running elsewhere; this one gave up waiting.

    Attributes:
        key: The idempotency key.
        tool: Name of the tool.
        owner: Who is running it (``host:pid:token``).
        waited: How long this call waited, in seconds.
    """

    key: str
    tool: str
    owner: str | None
    waited: float

    def __post_init__(self) -> None:
        super().__init__(
            f"tool {self.tool!r} with key {self.key!r} is in progress in "
            f"{self.owner or 'another process'} and "
            f"recorded no outcome within {self.waited:g} s; call again later to get its outcome, "
            "or "
            "give the tool a longer wait (@tool(wait=...))"
        )


@dataclass(eq=False, repr=False)
class ToolOutcomeUnknown(RunError):
    """A side-effecting call was claimed but its outcome was never recorded.

    Its owner stopped (a crash, a kill, a cancelled task) between claiming the key and
    recording the outcome, so the effect may or may not have happened. The tool does not
    declare that running it again is safe, so it is not run again: a person must check the
    outside system and record what happened with ``agentsnap tools resolve`` (or
    [`agentsnap.ledger.resolve`][agentsnap.ledger.resolve]).

    Attributes:
        key: The idempotency key.
        tool: Name of the tool.
        owner: Who had claimed it (``host:pid:token``).
    """

    key: str
    tool: str
    owner: str | None

    def __post_init__(self) -> None:
        super().__init__(
            f"the outcome of tool {self.tool!r} with key {self.key!r} is unknown: "
            f"{self.owner or 'its owner'} claimed it and stopped before recording an outcome, so "
            "the "
            "effect may or may not have happened. Check the outside system, then record what "
            f"happened: `agentsnap tools resolve {self.key} --result JSON` (or --error TEXT, or "
            "--retry to run it again), or agentsnap.ledger.resolve(), or the inspector's Tools "
            "tab; a tool that passes its key to the service may declare "
            "@tool(rerun_if_unknown=True) to be run again instead"
        )


class ApprovalDenied(ToolFailed):
    """A person denied a side-effecting call that needs approval; the tool did not run.

    An ordinary failed output of the handler: the agent catches it and tries something
    else, or lets it fail the handler; its checks, feedback and rollback apply as for any
    failure. Nothing was claimed in the ledger, so the call's key stays free.

    Attributes:
        request_id: The approval request that was denied.
        reason: Why, in the words of whoever denied it.
    """

    def __init__(self, tool: str, key: str | None, request_id: str, reason: str) -> None:
        self.request_id = request_id
        self.reason = reason
        super().__init__(tool, key, "ApprovalDenied", reason, attempts=0)

    def _says(self) -> str:
        return (
            f"tool {self.tool!r} was not approved (request {self.request_id}): {self.reason}; "
            "it did not run and nothing was claimed in the ledger"
        )


@dataclass(eq=False, repr=False)
class RequestRejected(RunError):
    """A request to a person was turned down instead of answered.

    [`Context.ask`][agentsnap.Context.ask] raises it when the person declined to answer
    (``agentsnap answer REQUEST --deny --reason ...``), or when the request's deadline
    passed and it declared ``on_deadline="reject"``.

    Attributes:
        request_id: The request.
        reason: Why.
    """

    request_id: str
    reason: str

    def __post_init__(self) -> None:
        super().__init__(f"request {self.request_id} was rejected: {self.reason}")


@dataclass(eq=False, repr=False)
class RequestExpired(RunError):
    """A request's deadline passed unanswered, and it declared ``on_deadline="fail"``.

    Raised in the handler that asked, so the handler fails and the run ends failed.

    Attributes:
        request_id: The request.
        deadline: When it was due.
    """

    request_id: str
    deadline: datetime

    def __post_init__(self) -> None:
        super().__init__(
            f"request {self.request_id} was not answered by its deadline, "
            f"{self.deadline.isoformat(timespec='seconds')}; the run fails, as the request "
            "declared "
            '(ask with on_deadline="default" or "reject" to let the handler go on)'
        )


@dataclass(eq=False, repr=False)
class RequestNotPending(AgentsnapError):
    """A request cannot be answered: it is no longer waiting for an answer.

    Attributes:
        request_id: The request.
        status: What became of it: ``answered``, ``rejected``, ``expired`` or ``withdrawn``.
    """

    request_id: str
    status: str
    detail: InitVar[str] = ""

    def __post_init__(self, detail: str) -> None:
        why = {
            "withdrawn": (
                "a rollback discarded the timeline it was asked on, so nothing waits for its "
                "answer; answer the request the redone handler asked instead "
                "(agentsnap requests RUN --pending)"
            ),
            "expired": "its deadline passed and its declared outcome was applied",
        }.get(self.status, "it was answered already; an answer is given once")
        super().__init__(f"request {self.request_id} is {self.status}: {detail or why}")


@dataclass(eq=False, repr=False)
class AnswerInvalid(ConfigurationError):
    """An answer does not fit its request: the schema the asker gave, or the request's kind.

    Attributes:
        request_id: The request.
        problems: What is wrong, one line each.
    """

    request_id: str
    problems: list[str]

    def __post_init__(self) -> None:
        shown = "; ".join(self.problems[:5])
        super().__init__(
            f"the answer to request {self.request_id} is not valid: {shown}; answer with a value "
            "that fits the request's schema (agentsnap requests shows it)"
        )
