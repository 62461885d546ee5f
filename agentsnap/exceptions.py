"""Every error agentsnap raises, in one tree.

```
AgentsnapError
├── ConfigurationError          a mistake in how the program uses agentsnap; fix the code
│   ├── InvalidAgentName
│   ├── DuplicateAgentError
│   ├── UnknownAgentError
│   ├── StateNotSerializable
│   ├── PayloadNotSerializable
│   └── ScheduleError
├── NotFoundError               an id that the store does not hold
└── RunError                    something went wrong while a run was executing
    ├── HandlerFailed
    ├── SnapshotFailed
    ├── StoreError
    │   └── SchemaOutOfDate
    └── RuntimeClosedError
```

Developer mistakes (`ConfigurationError`) are raised where the mistake is made, so the
traceback points at the offending line. Run failures (`RunError`) are reported by the runtime
and carry what is needed to find their cause: the agent, the message, the snapshot.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agentsnap.messages import Message

__all__ = [
    "AgentsnapError",
    "ConfigurationError",
    "DuplicateAgentError",
    "HandlerFailed",
    "InvalidAgentName",
    "NotFoundError",
    "PayloadNotSerializable",
    "RunError",
    "RuntimeClosedError",
    "ScheduleError",
    "SchemaOutOfDate",
    "SnapshotFailed",
    "StateNotSerializable",
    "StoreError",
    "UnknownAgentError",
]


class AgentsnapError(Exception):
    """Base class of every exception raised by agentsnap."""


class ConfigurationError(AgentsnapError):
    """The program uses agentsnap in a way that cannot work; the message says how to fix it."""


class InvalidAgentName(ConfigurationError):
    """An agent name is empty, too long, or uses characters outside ``[A-Za-z0-9_.-]``."""


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

    Attributes:
        agent: The agent whose handler raised.
        message: The message it was handling.
    """

    def __init__(self, agent: str, message: Message, error: BaseException) -> None:
        self.agent = agent
        self.message = message
        super().__init__(
            f"agent {agent!r} raised {type(error).__name__}: {error} "
            f"while handling message {message.id} (kind {message.kind!r})"
        )


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


class RuntimeClosedError(RunError):
    """The runtime was closed; create a new one to continue."""
