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

    def __init__(self, problems: list[dict[str, str]]) -> None:
        self.problems = problems
        shown = "; ".join(f"{p['agent']} at {p['path']}: {p['message']}" for p in problems[:5])
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        of_messages = sum(p["path"].startswith("message ") for p in problems)
        advice = []
        if of_messages < len(problems):
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
            if of_messages == len(problems)
            else "fork's edit"
        )
        super().__init__(
            f"the {what}{'s are' if len(problems) > 1 else ' is'} not valid: {shown}{more}; "
            + "; ".join(advice)
        )


class DuplicateAgentError(ConfigurationError):
    """Two agents were registered under the same name in one runtime."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(
            f"an agent named {name!r} is already registered; agent names must be unique "
            "within a runtime, so give this one another name"
        )


class UnknownAgentError(ConfigurationError):
    """A message was addressed to an agent that is not registered."""

    def __init__(self, sender: str, recipient: str, known: list[str]) -> None:
        self.sender = sender
        self.recipient = recipient
        self.known = known
        names = ", ".join(repr(n) for n in known) if known else "none"
        super().__init__(
            f"{sender!r} sent a message to {recipient!r}, which is not a registered agent "
            f"(registered: {names}); register it with Runtime.add() before sending to it"
        )


class StateNotSerializable(ConfigurationError):
    """An agent's state holds a value that cannot be stored as JSON.

    Raised at registration for the initial state, and reported through
    [`SnapshotFailed`][agentsnap.SnapshotFailed] when a snapshot meets such a value later.
    """

    def __init__(self, agent: str, field: str | None, detail: str) -> None:
        self.agent = agent
        self.field = field
        where = f"field {field!r} of agent {agent!r}" if field else f"the state of agent {agent!r}"
        super().__init__(
            f"{where} cannot be stored as JSON ({detail}); "
            "agent state must be JSON: use JSON types (str, int, float, bool, None, list, dict) "
            "or pydantic models of them"
        )


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

    def __init__(
        self,
        agent: str,
        model: str,
        stored_version: int,
        current_version: int,
        *,
        step: int | None,
        detail: str,
    ) -> None:
        self.agent = agent
        self.model = model
        self.stored_version = stored_version
        self.current_version = current_version
        self.step = step
        self.detail = detail
        super().__init__(
            f"the stored state of agent {agent!r} (version {stored_version}) cannot be read "
            f"as {model} version {current_version}: {detail}"
        )


class PayloadNotSerializable(ConfigurationError):
    """A message payload is not a JSON value."""

    def __init__(self, sender: str, recipient: str, detail: str) -> None:
        self.sender = sender
        self.recipient = recipient
        super().__init__(
            f"the payload {sender!r} sent to {recipient!r} is not JSON ({detail}); "
            "send JSON values (dict with str keys, list, str, int, finite float, bool, None) "
            "or a pydantic model"
        )


class ScheduleError(ConfigurationError):
    """A scripted schedule asked for a delivery that is not possible."""


class SnapshotInProgress(ConfigurationError, RuntimeError):
    """A snapshot's outcome was asked for before the snapshot finished.

    Raised by [`SnapshotHandle.result`][agentsnap.SnapshotHandle.result]; it is also a
    ``RuntimeError``, which it used to be.

    Attributes:
        seq: Number of the snapshot within the run.
    """

    def __init__(self, seq: int) -> None:
        self.seq = seq
        super().__init__(
            f"snapshot {seq} is still in progress, so it has no result yet; await the handle "
            "(or its wait()) to get the snapshot once it completes, or check done() first"
        )


class ToolArgumentsInvalid(ConfigurationError):
    """A tool was called with arguments that do not fit its signature; nothing ran.

    Attributes:
        tool: Name of the tool.
    """

    def __init__(self, tool: str, detail: str) -> None:
        self.tool = tool
        super().__init__(
            f"tool {tool!r} was called with invalid arguments ({detail}); pass keyword "
            "arguments that match the tool function's parameters"
        )


class IdempotencyConflict(ConfigurationError):
    """An idempotency key was reused for a different call; nothing ran.

    A key names one effect. Reusing it with other arguments (or for another tool) would
    return the first call's outcome for a call that asked for something else.

    Attributes:
        key: The idempotency key.
        tool: The tool of the call that was refused.
    """

    def __init__(self, key: str, tool: str, detail: str) -> None:
        self.key = key
        self.tool = tool
        super().__init__(
            f"idempotency key {key!r} cannot be used for this call of tool {tool!r}: {detail}; "
            "use a new key for a different call"
        )


class NotFoundError(AgentsnapError, LookupError):
    """A run, snapshot or agent that the store does not hold.

    Attributes:
        what: What was looked for (``"run"``, ``"snapshot"``, ``"agent"`` …).
        ident: The id or name that was not found.
    """

    def __init__(self, what: str, ident: str, message: str | None = None) -> None:
        self.what = what
        self.ident = ident
        super().__init__(message or f"no {what} with id {ident!r} in this store")

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


class HandlerFailed(RunError):
    """An agent's handler raised while handling a message.

    The original exception is the ``__cause__``. The other agents kept running.

    An agent's [`on_rollback`][agentsnap.Agent.on_rollback] that raises is one too, with no
    message: the other agents' hooks still run, and the run goes on.

    Attributes:
        agent: The agent whose handler raised.
        message: The message it was handling; ``None`` for ``on_rollback``.
    """

    def __init__(self, agent: str, message: Message | None, error: BaseException) -> None:
        self.agent = agent
        self.message = message
        # The context first, as a sentence of its own: the error's text may end in advice.
        text = str(error).strip()
        raised = f"{type(error).__name__}: {text}" if text else type(error).__name__
        where = (
            "in on_rollback after a rollback"
            if message is None
            else f"while handling message {message.id} (kind {message.kind!r})"
        )
        super().__init__(f"agent {agent!r} failed {where}. {raised}")


class SnapshotFailed(RunError):
    """A snapshot could not be completed; earlier snapshots are untouched.

    Attributes:
        snapshot_id: Id of the failed snapshot.
        reason: Why it failed.
    """

    def __init__(self, snapshot_id: str, reason: str) -> None:
        self.snapshot_id = snapshot_id
        self.reason = reason
        super().__init__(f"snapshot {snapshot_id} failed: {reason}")


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

    def __init__(self, snapshot_id: str, reason: str, what: str) -> None:
        self.snapshot_id = snapshot_id
        self.reason = reason
        super().__init__(
            f"snapshot {snapshot_id} is damaged in the store, so {what}: {reason}. Inspect it "
            f"with `agentsnap show {snapshot_id}`; a new run can be forked from an intact "
            "snapshot"
        )


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

    def __init__(
        self, kind: str, owner: str, path: str, marker: str, doing: str, *, provided: bool
    ) -> None:
        self.kind = kind
        self.owner = owner
        self.path = path
        self.marker = marker
        what = {
            "state": f"the state of agent {owner!r}, field {path or '(all of it)'}",
            "payload": f"a message to agent {owner!r}, payload key {path or '(all of it)'}",
            "tool_result": f"the recorded result of tool {owner!r} at {path or '(all of it)'}",
            "model_answer": f"a recorded model answer of agent {owner!r} at {path or '(all)'}",
        }.get(kind, f"{kind} of {owner!r} at {path}")
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
            f"cannot {doing}: {what} is stored redacted ({marker}) and is needed; {todo}"
        )


class StoreError(RunError):
    """The store could not do what was asked; what was stored before is intact."""


class SchemaOutOfDate(StoreError):
    """The database schema is not the one this version of agentsnap needs."""

    def __init__(self, url: str, found: str | None, needed: str) -> None:
        self.found = found
        self.needed = needed
        super().__init__(
            f"the agentsnap schema in {url} is at revision {found or 'none'}, this agentsnap "
            f"needs {needed}: run `agentsnap db upgrade --db {url}`"
        )


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

    def __init__(
        self,
        agent: str,
        source: str,
        attempts: int,
        reasons: list[str],
        *,
        per_run: int | None = None,
    ) -> None:
        self.agent = agent
        self.source = source
        self.attempts = attempts
        self.reasons = reasons
        self.per_run = per_run
        last = "; ".join(repr(r) for r in reasons[-3:])
        if per_run is not None:
            super().__init__(
                f"output of agent {agent!r} was rejected by {source} ({last}) after the run "
                f"had rolled back {per_run} time(s), the most the retry policy allows for a "
                "whole run. The run stopped; inspect it with `agentsnap export`, or raise "
                "RetryPolicy(per_run=...)"
            )
            return
        super().__init__(
            f"output of agent {agent!r} was rejected by {source} {attempts} time(s) in a row, "
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

    def __init__(self, agent: str, reason: str, source: str, output: Message | None = None) -> None:
        self.agent = agent
        self.reason = reason
        self.source = source
        self.output = output
        super().__init__(f"output of agent {agent!r} rejected by {source}: {reason}")


class TransportError(RunError):
    """A transport cannot carry the channels: its server is unreachable or refused a message.

    Raised by [`agentsnap.jetstream`][agentsnap.jetstream] when the NATS server cannot be
    reached or has no JetStream, and when it refuses a publish for good (a full stream).
    """


class RuntimeClosedError(RunError):
    """The runtime was closed, or its run stopped; create a new one to continue."""


class RunOwnedError(RunError):
    """Another runtime owns the run: its lease is live.

    Attributes:
        run_id: The run.
        owner: The owning process, ``host:pid:token``.
        expires_at: When its lease ends unless it renews it.
    """

    def __init__(self, run_id: str, owner: str, expires_at: datetime) -> None:
        self.run_id = run_id
        self.owner = owner
        self.expires_at = expires_at
        super().__init__(
            f"run {run_id} is owned by {owner}, whose lease holds until "
            f"{expires_at.isoformat(timespec='seconds')}; stop that process, or wait for its "
            "lease to expire and resume again"
        )


class OwnershipLost(RunError):
    """This runtime's lease on its run was taken over: its writes to the run are refused.

    Another runtime resumed the run after this one's lease expired (it stopped renewing it,
    for example because its process was suspended). Stop this runtime; the new owner goes on.
    """

    def __init__(self, run_id: str, token: int, detail: str = "") -> None:
        self.run_id = run_id
        self.token = token
        super().__init__(
            f"this runtime no longer owns run {run_id} (its lease, token {token}, was taken "
            f"over{': ' + detail if detail else ''}); its writes are refused"
        )


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

    def __init__(self, run_id: str, reason: str, *, resume: str | None = None) -> None:
        self.run_id = run_id
        self.reason = reason
        how = resume or f"`agentsnap resume {run_id} --app MODULE:FACTORY`, or Runtime.resume()"
        super().__init__(
            f"run {run_id} was cancelled on request ({reason}); resume it to continue ({how})"
        )


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

    def __init__(
        self, tool: str, key: str, recorded: dict[str, Any], arguments: dict[str, Any]
    ) -> None:
        self.tool = tool
        self.key = key
        self.recorded = recorded
        self.arguments = arguments
        super().__init__(
            f"tool {tool!r} was called again at the same place of a re-executed handler (key "
            f"{key!r}) with other arguments: it ran with {_brief(recorded)}, and now gets "
            f"{_brief(arguments)}; the effect was not run a second time. Record what the "
            "handler reads (call models through ctx.chat()/ctx.complete()), name the "
            "arguments that identify the effect with @tool(key_from=...), or declare "
            '@tool(on_divergence="recorded") to let the recorded outcome stand'
        )


def _brief(arguments: dict[str, Any]) -> str:
    text = json.dumps(arguments, sort_keys=True, default=str)
    return text if len(text) <= 200 else text[:197] + "..."


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

    def __init__(  # noqa: PLR0917
        self,
        tool: str,
        key: str | None,
        error_type: str,
        detail: str,
        transient: bool = False,
        replayed: bool = False,
        attempts: int = 1,
    ) -> None:
        self.tool = tool
        self.key = key
        self.error_type = error_type
        self.detail = detail
        self.transient = transient
        self.replayed = replayed
        self.attempts = attempts
        where = f"tool {tool!r}" + (f" (key {key!r})" if key else "")
        if transient:
            after = (
                "a transient error, retried until the retry policy gave up; it is not recorded "
                "as final, so a later call with the same key tries again"
            )
        elif replayed:
            after = (
                "recorded in the ledger by an earlier call with this key, so the tool did not "
                "run again; fix the cause and call with a new key"
            )
        elif key is not None:
            after = "recorded in the ledger: a call with the same key raises it without running"
        else:
            after = "the tool has no side effects, nothing was recorded"
        super().__init__(f"{where} failed with {error_type}: {detail} ({after})")


class ToolInProgress(RunError):
    """A call with the same idempotency key is still running elsewhere; this one gave up waiting.

    Attributes:
        key: The idempotency key.
        tool: Name of the tool.
        owner: Who is running it (``host:pid:token``).
        waited: How long this call waited, in seconds.
    """

    def __init__(self, key: str, tool: str, owner: str | None, waited: float) -> None:
        self.key = key
        self.tool = tool
        self.owner = owner
        self.waited = waited
        super().__init__(
            f"tool {tool!r} with key {key!r} is in progress in {owner or 'another process'} and "
            f"recorded no outcome within {waited:g} s; call again later to get its outcome, or "
            "give the tool a longer wait (@tool(wait=...))"
        )


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

    def __init__(self, key: str, tool: str, owner: str | None) -> None:
        self.key = key
        self.tool = tool
        self.owner = owner
        super().__init__(
            f"the outcome of tool {tool!r} with key {key!r} is unknown: "
            f"{owner or 'its owner'} claimed it and stopped before recording an outcome, so the "
            "effect may or may not have happened. Check the outside system, then record what "
            f"happened: `agentsnap tools resolve {key} --result JSON` (or --error TEXT, or "
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
        self.tool = tool
        self.key = key
        self.error_type = "ApprovalDenied"
        self.detail = reason
        self.transient = False
        self.replayed = False
        self.attempts = 0
        RunError.__init__(
            self,
            f"tool {tool!r} was not approved (request {request_id}): {reason}; it did not run "
            "and nothing was claimed in the ledger",
        )


class RequestRejected(RunError):
    """A request to a person was turned down instead of answered.

    [`Context.ask`][agentsnap.Context.ask] raises it when the person declined to answer
    (``agentsnap answer REQUEST --deny --reason ...``), or when the request's deadline
    passed and it declared ``on_deadline="reject"``.

    Attributes:
        request_id: The request.
        reason: Why.
    """

    def __init__(self, request_id: str, reason: str) -> None:
        self.request_id = request_id
        self.reason = reason
        super().__init__(f"request {request_id} was rejected: {reason}")


class RequestExpired(RunError):
    """A request's deadline passed unanswered, and it declared ``on_deadline="fail"``.

    Raised in the handler that asked, so the handler fails and the run ends failed.

    Attributes:
        request_id: The request.
        deadline: When it was due.
    """

    def __init__(self, request_id: str, deadline: datetime) -> None:
        self.request_id = request_id
        self.deadline = deadline
        super().__init__(
            f"request {request_id} was not answered by its deadline, "
            f"{deadline.isoformat(timespec='seconds')}; the run fails, as the request declared "
            '(ask with on_deadline="default" or "reject" to let the handler go on)'
        )


class RequestNotPending(AgentsnapError):
    """A request cannot be answered: it is no longer waiting for an answer.

    Attributes:
        request_id: The request.
        status: What became of it: ``answered``, ``rejected``, ``expired`` or ``withdrawn``.
    """

    def __init__(self, request_id: str, status: str, detail: str = "") -> None:
        self.request_id = request_id
        self.status = status
        why = {
            "withdrawn": (
                "a rollback discarded the timeline it was asked on, so nothing waits for its "
                "answer; answer the request the redone handler asked instead "
                "(agentsnap requests RUN --pending)"
            ),
            "expired": "its deadline passed and its declared outcome was applied",
        }.get(status, "it was answered already; an answer is given once")
        super().__init__(f"request {request_id} is {status}: {detail or why}")


class AnswerInvalid(ConfigurationError):
    """An answer does not fit its request: the schema the asker gave, or the request's kind.

    Attributes:
        request_id: The request.
        problems: What is wrong, one line each.
    """

    def __init__(self, request_id: str, problems: list[str]) -> None:
        self.request_id = request_id
        self.problems = problems
        shown = "; ".join(problems[:5])
        super().__init__(
            f"the answer to request {request_id} is not valid: {shown}; answer with a value "
            "that fits the request's schema (agentsnap requests shows it)"
        )
