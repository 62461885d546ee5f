"""What a run leaves behind: runs and snapshots as plain data.

These are the types stores persist and return. They hold JSON only, so any store can keep
them and any reader can load them without running code.
"""

from __future__ import annotations

import enum
import json
from datetime import UTC, datetime
from functools import cached_property

from pydantic import BaseModel, ConfigDict, Field

from agentsnap.messages import JsonValue

__all__ = [
    "AgentCut",
    "ChannelRecord",
    "RecordedMessage",
    "RunInfo",
    "Snapshot",
    "SnapshotStatus",
    "utcnow",
]


def utcnow() -> datetime:
    """The current time, timezone-aware, in UTC."""
    return datetime.now(UTC)


class RunInfo(BaseModel):
    """One execution of a workflow."""

    model_config = ConfigDict(frozen=True)

    id: str
    """Run id (32 hex digits)."""
    created_at: datetime = Field(default_factory=utcnow)
    """When the run started."""
    parent_run_id: str | None = None
    """The run this one was forked from, if any."""
    parent_snapshot_id: str | None = None
    """The snapshot of the parent run this one started from, if any."""
    metadata: dict[str, JsonValue] = Field(default_factory=dict)
    """Free-form JSON the application attached to the run."""


class SnapshotStatus(enum.StrEnum):
    """Where a snapshot stands."""

    COMPLETE = "complete"
    """Every agent and every channel recorded, and written to the store."""
    FAILED = "failed"
    """The snapshot could not be completed; see its ``error``."""


class AgentCut(BaseModel):
    """One process's part of a consistent cut."""

    model_config = ConfigDict(frozen=True)

    state_json: str
    """The state as canonical JSON (``"{}"`` for the environment)."""
    state_hash: str
    """SHA-256 of ``state_json``; equal hashes mean equal states."""
    sent: dict[str, int] = Field(default_factory=dict)
    """Messages sent on each outgoing channel, by receiver, at the recording point."""
    received: dict[str, int] = Field(default_factory=dict)
    """Messages received on each incoming channel, by sender, at the recording point."""

    @cached_property
    def state(self) -> dict[str, JsonValue]:
        """The recorded state as a JSON object."""
        loaded: dict[str, JsonValue] = json.loads(self.state_json)
        return loaded


class RecordedMessage(BaseModel):
    """A message that was in flight across a cut."""

    model_config = ConfigDict(frozen=True)

    id: str
    """Message id, ``src>dst#seq``."""
    seq: int
    """Position on its channel."""
    kind: str
    """Message kind."""
    payload: JsonValue = None
    """JSON payload, as it was sent."""
    headers: dict[str, str] = Field(default_factory=dict)
    """Message headers."""
    epoch: int = 0
    """The sender's snapshot epoch when it sent the message."""


class ChannelRecord(BaseModel):
    """The messages in flight on one channel at a cut, in FIFO order."""

    model_config = ConfigDict(frozen=True)

    src: str
    """Sending process."""
    dst: str
    """Receiving process."""
    messages: list[RecordedMessage]
    """Messages sent before the sender's recording point and received after the
    receiver's, oldest first."""


class Snapshot(BaseModel):
    """A consistent cut of a run.

    Every process's state and counters, plus every channel's in-flight messages.
    """

    model_config = ConfigDict(frozen=True)

    id: str
    """Snapshot id (32 hex digits), unique across runs."""
    run_id: str
    """The run the snapshot belongs to."""
    seq: int
    """Number of the snapshot within its run, from 1, in the order snapshots were started."""
    initiator: str
    """Who started it: an agent, or ``$env`` for the runtime."""
    status: SnapshotStatus
    """Complete or failed."""
    started_at: datetime
    """When it was initiated."""
    completed_at: datetime | None = None
    """When the last channel was recorded."""
    error: str | None = None
    """Why it failed, for a failed snapshot."""
    agents: dict[str, AgentCut] = Field(default_factory=dict)
    """Each process's cut, by name (the environment included, as ``$env``)."""
    channels: list[ChannelRecord] = Field(default_factory=list)
    """Channels with messages in flight at the cut, ordered by ``(src, dst)``; a channel not
    listed had nothing in flight."""

    def in_flight(self, src: str, dst: str) -> list[RecordedMessage]:
        """Messages in flight on channel ``src -> dst`` at this cut."""
        for channel in self.channels:
            if channel.src == src and channel.dst == dst:
                return list(channel.messages)
        return []
