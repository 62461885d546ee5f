"""The runtime's state of one agent's handlers, kept out of the handler's context.

A [`Context`][agentsnap.Context] shows a handler its API (send, reject, snapshot, feedback,
state, model calls, requests to people); what the runtime needs to carry out those calls (the
guard on outputs, the ledger, the replay log, the rejection to act on, where recording may
start) lives in a [`HandlerEngine`][agentsnap._handler.HandlerEngine] that the runtime owns
and fills. The engine code below the public face (the kernel, ``@tool``) and the integrations
reach it with [`engine_of`][agentsnap._handler.engine_of]; user code has no business there.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from agentsnap.checks import Guard
    from agentsnap.exceptions import OutputRejected
    from agentsnap.ledger import Ledger
    from agentsnap.messages import Message
    from agentsnap.model_calls import ModelCallLog
    from agentsnap.once import KnownTools, PendingOutcomes
    from agentsnap.redaction import Redaction
    from agentsnap.replay import ReplayLog
    from agentsnap.requests import Approval, RequestLog
    from agentsnap.telemetry import Telemetry

__all__ = ["Engined", "HandlerEngine", "Timeline", "engine_of"]


class Timeline(Protocol):
    """Where a context reads the run's timeline (the runtime's replay log, say)."""

    @property
    def timeline(self) -> int:
        """The run's current timeline."""
        ...

    @property
    def resumed(self) -> int:
        """The newest timeline an earlier process may have recorded model calls in.

        -1: none, the run began in this process. A call on a later timeline has no recorded
        answer to look for.
        """
        ...


_NO_APPROVALS: Mapping[str, Approval] = {}


class HandlerEngine:
    """What the runtime keeps for one agent's handlers: set by it, read by the context.

    One belongs to each context. The runtime fills the collaborators as the agent joins,
    and resets the per-handler fields (``position``, ``rejected``) as each handler begins
    and ends.
    """

    __slots__ = (
        "approvals",
        "asking",
        "dry_tools",
        "guard",
        "keep_before",
        "ledger",
        "line",
        "model_calls",
        "pending",
        "position",
        "redaction",
        "rejected",
        "replay",
        "requests",
        "shown",
        "telemetry",
        "tools",
    )

    def __init__(self) -> None:
        self.guard: Guard | None = None
        """The checks on the agent's outgoing messages, if any."""
        self.rejected: OutputRejected | None = None
        """The rejection raised in the running handler, if any: the runtime acts on it even
        when the handler caught it."""
        self.shown: Message | None = None
        """The message whose handler made a message visible to another agent, the latest
        such: while it is the message being handled, the running handler cannot be recorded
        from before it began."""
        self.keep_before = False
        """Whether the runtime keeps the agent's state as each handler begins (set once a
        handler of the agent was found running at a recording)."""
        self.position = 0
        """How many recorded steps (model calls, requests to people) the running handler
        made so far (reset as each handler begins)."""
        self.asking = 0
        """How many of the agent's handlers wait for a person's answer now."""
        self.ledger: Ledger | None = None
        """Where side-effecting tool calls are recorded."""
        self.replay: ReplayLog | None = None
        """The run's replay log, made durable before each side-effecting tool call."""
        self.tools: KnownTools | None = None
        """The tools the runtime knows; a tool called from the handler joins them."""
        self.pending: PendingOutcomes | None = None
        """Where the outcomes of tool calls the ledger could not record are kept until they
        are written (the runtime's)."""
        self.telemetry: Telemetry | None = None
        """Where the run's spans and metrics go, or ``None`` when nothing is recorded."""
        self.redaction: Redaction | None = None
        """What the run keeps out of what it records, or ``None``."""
        self.model_calls: ModelCallLog | None = None
        """Where the handler's model calls are recorded; ``None``: models are asked without
        recording."""
        self.line: Timeline | None = None
        """Where the run's current timeline is read."""
        self.requests: RequestLog | None = None
        """Where the handler's requests to people are kept; ``None``: ``ask`` cannot be
        used."""
        self.approvals: Mapping[str, Approval] = _NO_APPROVALS
        """The runtime's approval policy: which tools' calls need a person's approval."""
        self.dry_tools = False
        """The run's side-effecting tools are dry: calls are recorded, tools do not run (a
        what-if fork)."""


class Engined(Protocol):
    """What holds a [`HandlerEngine`][agentsnap._handler.HandlerEngine]: a handler's context."""

    @property
    def _engine(self) -> HandlerEngine: ...


def engine_of(ctx: Engined) -> HandlerEngine:
    """The runtime's state behind the handler context ``ctx``."""
    return ctx._engine
