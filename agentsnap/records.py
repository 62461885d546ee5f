"""What a run leaves behind: runs and snapshots as plain data.

These are the types stores persist and return. They hold JSON only, so any store can keep
them and any reader can load them without running code.
"""

from __future__ import annotations

import enum
import json
import traceback
from collections.abc import Sequence
from datetime import UTC, datetime
from functools import cached_property
from typing import Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field

from agentsnap.messages import JsonValue
from agentsnap.state import compact_json

__all__ = [
    "TRACEBACK_LIMIT",
    "AgentCut",
    "AgentLease",
    "AgentVersion",
    "ChannelOffsets",
    "ChannelRecord",
    "GraphCheckpoint",
    "JournalMessage",
    "JournalSegment",
    "RecordedMessage",
    "ReplayDelivery",
    "ReplayInput",
    "ReplaySegment",
    "RollbackInfo",
    "RunInfo",
    "RunLease",
    "RunOwner",
    "RunStatus",
    "Snapshot",
    "SnapshotPart",
    "SnapshotStatus",
    "SnapshotSummary",
    "bounded_traceback",
    "utcnow",
]

TRACEBACK_LIMIT = 16_000
"""The most characters of tracebacks a run keeps
([`RunInfo.traceback`][agentsnap.RunInfo.traceback]): the head and the tail are kept, the
middle of a longer text is cut."""


def utcnow() -> datetime:
    """The current time, timezone-aware, in UTC."""
    return datetime.now(UTC)


def bounded_traceback(errors: Sequence[BaseException], limit: int = TRACEBACK_LIMIT) -> str:
    """The tracebacks of ``errors``, each with its chain (causes and contexts), as one text
    of at most ``limit`` characters.

    A longer text keeps its first and last parts (where the failure began and where it was
    raised) and says how much of the middle it left out.
    """  # noqa: D205
    text = "\n".join("".join(traceback.format_exception(error)) for error in errors)
    if len(text) <= limit:
        return text
    marker = "\n... ({} characters left out) ...\n"
    room = limit - len(marker.format(len(text)))
    head = room // 3
    tail = room - head
    return text[:head] + marker.format(len(text) - head - tail) + text[len(text) - tail :]


class RunStatus(enum.StrEnum):
    """Where a run stands."""

    RUNNING = "running"
    """Started and not finished (or its process died)."""
    SUCCEEDED = "succeeded"
    """Closed normally."""
    FAILED = "failed"
    """Stopped by a failure: rollbacks exhausted, a handler error, or an exception."""
    INTERRUPTED = "interrupted"
    """Not finished, and no runtime owns it any more (its process died, or its lease
    expired, or it was closed with messages still queued): resume it with
    ``Runtime.resume``."""
    CANCELLED = "cancelled"
    """Stopped on purpose before it finished (Ctrl-C, or the task running it was cancelled):
    resume it with ``Runtime.resume``."""
    CREATED = "created"
    """Recorded but never started: a fork that no runtime has run yet."""


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
    status: RunStatus = RunStatus.RUNNING
    """Where the run stands."""
    finished_at: datetime | None = None
    """When the run finished, if it has."""
    name: str | None = None
    """A name for people (``Runtime(name=)``): runs of one workflow usually share it."""
    tags: dict[str, str] = Field(default_factory=dict)
    """Labels to find the run by (``Runtime(tags=)``, ``agentsnap runs --tag k=v``)."""
    status_reason: str | None = None
    """Why the run ended as it did, in one line: what failed, or what interrupted it."""
    traceback: str | None = None
    """For a failed run, the tracebacks of what failed (each handler failure, then the
    exception that ended the run), exception chains included, as text of at most 16,000
    characters (the beginning and the end kept); ``None`` otherwise, and once the run is
    resumed."""
    cancel_requested: str | None = None
    """Why someone asked the run to stop (``agentsnap cancel``), while its owner has not
    stopped it yet; ``None`` when nobody asked, or once the run was resumed."""


class SnapshotStatus(enum.StrEnum):
    """Where a snapshot stands."""

    COMPLETE = "complete"
    """Every agent and every channel recorded, and written to the store."""
    FAILED = "failed"
    """The snapshot could not be completed; see its ``error``."""
    DAMAGED = "damaged"
    """Written complete, but what the store holds of it now is not a whole, consistent cut
    (rows deleted or changed behind agentsnap's back); ``error`` says what is wrong. Never
    written by agentsnap: a store reports it when it reads the snapshot back (see
    [`agentsnap.integrity`][agentsnap.integrity]). A run never rolls back to, resumes from or
    forks a damaged snapshot: it is treated like a failed one."""


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
    state_version: int = 1
    """The version of the agent's state class the state was written with (see
    [`agentsnap.versions`][agentsnap.versions]); 1 for states stored before versions were
    recorded, and for the environment."""

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


class _SnapshotHead(BaseModel):
    """What a snapshot and its summary both show, in this order: which snapshot it is and
    how it ended.
    """  # noqa: D205

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
    """Complete, failed, or damaged."""
    started_at: datetime
    """When it was initiated."""
    completed_at: datetime | None = None
    """When the last channel was recorded."""
    error: str | None = None
    """Why it failed, for a failed snapshot; what is wrong with it, in one line, for a
    damaged one."""


class Snapshot(_SnapshotHead):
    """A consistent cut of a run.

    Every process's state and counters, plus every channel's in-flight messages.
    """

    agents: dict[str, AgentCut] = Field(default_factory=dict)
    """Each process's cut, by name (the environment included, as ``$env``); for a damaged
    snapshot, the cuts that could be read intact."""
    channels: list[ChannelRecord] = Field(default_factory=list)
    """Channels with messages in flight at the cut, ordered by ``(src, dst)``; a channel not
    listed had nothing in flight. For a damaged snapshot, the messages that could be read."""
    damaged_agents: list[str] = Field(default_factory=list)
    """For a damaged snapshot, the processes whose part is missing or could not be read, as
    far as the stored rows show, sorted; empty otherwise."""

    def in_flight(self, src: str, dst: str) -> list[RecordedMessage]:
        """Messages in flight on channel ``src -> dst`` at this cut."""
        for channel in self.channels:
            if channel.src == src and channel.dst == dst:
                return list(channel.messages)
        return []


class ChannelOffsets(BaseModel):
    """Where the messages in flight on a channel between processes lie in the run's stream.

    A channel whose sender and receiver run in different processes carries its items on a
    NATS JetStream subject; the items in flight across a cut on it are those of its subject
    from ``first_seq`` up to, not including, ``end_seq`` (see the concepts page *Channel
    state as offsets*).
    """

    model_config = ConfigDict(frozen=True)

    src: str
    """Sending process."""
    dst: str
    """Receiving process."""
    subject: str
    """The channel's subject in the run's stream."""
    first_seq: int
    """Stream sequence of the first message in flight (``end_seq`` when none was)."""
    end_seq: int
    """Stream sequence of the item that closed the channel for the cut: its marker, or the
    first message its sender sent after recording."""
    count: int = 0
    """How many messages were in flight: the channel's messages in the range, copies and
    items of an earlier generation left out."""
    after: str | None = None
    """The id of the item before the first message in flight on the channel: where a replay
    of the range starts the channel's chain."""
    seqs: list[int] = Field(default_factory=list)
    """The stream sequence of each message in flight, in the order taken; a ``0`` for one a
    restore had put back from recorded bodies (the range cannot be replayed then)."""


class SnapshotPart(BaseModel):
    """One worker's part of a snapshot of a run spread over processes.

    A worker writes its part once every process it hosts has recorded the snapshot and
    every channel into them is closed for it; the run's coordinator joins the parts into
    one [`Snapshot`][agentsnap.Snapshot] when every process of the run has its part.
    """

    model_config = ConfigDict(frozen=True)

    run_id: str
    """The run."""
    seq: int
    """Number of the snapshot within its run."""
    worker: str
    """The worker that wrote it (unique within the run)."""
    agents: dict[str, AgentCut] = Field(default_factory=dict)
    """The cuts of the processes the worker hosts."""
    channels: list[ChannelRecord] = Field(default_factory=list)
    """Messages in flight on the channels into those processes, ordered by ``(src, dst)``."""
    offsets: list[ChannelOffsets] = Field(default_factory=list)
    """For each channel into those processes from another process: its range in flight."""
    error: str | None = None
    """Why the worker could not record its part (the snapshot fails), or ``None``."""
    written_at: datetime = Field(default_factory=utcnow)
    """When the part was written."""


class AgentLease(BaseModel):
    """Which worker hosts an agent of a run spread over processes, and until when."""

    model_config = ConfigDict(frozen=True)

    run_id: str
    """The run."""
    agent: str
    """The agent."""
    owner: str
    """The worker holding it (``host:pid:token``)."""
    expires_at: datetime
    """Until when the lease holds without renewal."""


class SnapshotSummary(_SnapshotHead):
    """A snapshot as a listing shows it: what it is and how much it holds, without its states.

    A store lists these (``list_snapshot_summaries``) without building the snapshots: its
    status is the one the whole snapshot would have when read (``damaged`` with the same
    ``error`` and ``damaged_agents``).
    """

    agents: list[str] = Field(default_factory=list)
    """The processes whose part it holds (read intact), sorted."""
    in_flight: int = 0
    """How many messages were in flight at the cut (those that could be read)."""
    damaged_agents: list[str] = Field(default_factory=list)
    """As ``Snapshot.damaged_agents``."""

    @classmethod
    def of(cls, snapshot: Snapshot) -> SnapshotSummary:
        """The summary of a whole snapshot."""
        return cls(
            # What it shares with the snapshot, as it is: every field but the two counted.
            **snapshot.model_dump(include=set(cls.model_fields) - {"agents", "in_flight"}),
            agents=sorted(snapshot.agents),
            in_flight=sum(len(channel.messages) for channel in snapshot.channels),
        )


class AgentVersion(BaseModel):
    """One agent's recorded part of one complete snapshot: a point in its state history.

    A snapshot found damaged when it was read back is listed too, with ``damaged`` set,
    when it holds the agent's part or the damage concerns the agent.
    """

    model_config = ConfigDict(frozen=True)

    snapshot_id: str
    """The snapshot that recorded it."""
    snapshot_seq: int
    """Number of that snapshot within the run."""
    completed_at: datetime | None
    """When that snapshot completed."""
    cut: AgentCut | None
    """The agent's state and channel counters at the cut; ``None`` when the snapshot is
    damaged and the agent's part of it is missing or could not be read."""
    damaged: str | None = None
    """What is wrong with the snapshot, when it is damaged (see
    [`SnapshotStatus.DAMAGED`][agentsnap.SnapshotStatus.DAMAGED])."""


class JournalSegment(NamedTuple):
    """A batch of journal events of one channel, as the store keeps it.

    The journal is written in segments rather than a row per message, so that keeping it
    costs the bus little; [`read_journal`][agentsnap.journal.read_journal] turns segments
    back into messages.
    """

    src: str
    """Sending process."""
    dst: str
    """Receiving process."""
    event: str
    """``"send"`` or ``"deliver"``."""
    first_seq: int
    """Sequence number of the first event in ``entries``."""
    last_seq: int
    """Sequence number of the last event in ``entries``."""
    entries: str
    """JSON array, oldest first. A send is ``[seq, kind, payload, epoch, at_us]`` with the
    headers object appended when there are headers; a delivery is ``[seq, at_us]``;
    ``at_us`` is microseconds since the Unix epoch."""


class JournalMessage(BaseModel):
    """A message as the journal saw it: when it was sent and when it was delivered."""

    model_config = ConfigDict(frozen=True)

    src: str
    """Sending process."""
    dst: str
    """Receiving process."""
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
    sent_at: datetime
    """When it was sent."""
    delivered_at: datetime | None = None
    """When the receiver took it off the channel, or ``None`` if it never did."""


class RollbackInfo(BaseModel):
    """One rollback of a run: who failed, why, which cut it returned to, what was lost."""

    model_config = ConfigDict(frozen=True)

    id: str
    """Rollback id (32 hex digits)."""
    run_id: str
    """The run rolled back."""
    snapshot_id: str
    """The complete snapshot every agent was restored from."""
    agent: str | None
    """The agent whose output was rejected (``None`` for a manual rollback)."""
    reason: str
    """Why."""
    source: str
    """What rejected the output (a check, ``"self-evaluation"``, a critic) or ``"manual"``."""
    attempt: int
    """Which failure of this agent and source this was: 1 for the first."""
    discarded: int
    """Messages that were queued and dropped, sent after the cut."""
    at: datetime = Field(default_factory=utcnow)
    """When it happened."""


ReplayDelivery = tuple[str, str, int]
"""``(agent, src, seq)``: the agent took message ``seq`` of channel ``src -> agent``."""

ReplayInput = tuple[str, int, str, JsonValue, "dict[str, str] | None", int]
"""``(dst, seq, kind, payload, headers or None, epoch)``: a message the environment sent."""


class ReplaySegment(NamedTuple):
    """A piece of a run's replay log: deliveries and inputs since the previous segment.

    Before a side-effecting tool call is claimed in the ledger, the runtime makes durable the
    order in which each agent took its messages, and the messages the environment sent, so
    that a run resumed after a crash re-executes its handlers in the same order and derives
    the same idempotency keys. A segment is kept as JSON text, made once by the runtime:
    stores write it as it is, and holding it costs the garbage collector nothing.
    """

    timeline: int
    """How many timelines the run had started (rollbacks, given-up replays) when these
    deliveries happened; a resumed run replays only the deliveries of its last timeline."""
    body: str
    """``{"deliveries": [[agent, src, first_seq, count], ...], "inputs": [[dst, seq, kind,
    payload, headers, epoch], ...]}``: deliveries in the order they happened, as runs of
    consecutive messages of one channel; inputs in the order the environment sent them."""

    @classmethod
    def of(
        cls,
        timeline: int,
        deliveries: list[ReplayDelivery] | tuple[()] = (),
        inputs: list[ReplayInput] | tuple[()] = (),
    ) -> ReplaySegment:
        """A segment holding ``deliveries`` and ``inputs``."""
        runs: list[list[str | int]] = []
        for agent, src, seq in deliveries:
            last = runs[-1] if runs else None
            if last and last[:2] == [agent, src] and last[2] + last[3] == seq:  # type: ignore[operator]
                last[3] += 1  # type: ignore[operator]
            else:
                runs.append([agent, src, seq, 1])
        return cls(timeline, compact_json({"deliveries": runs, "inputs": inputs}))

    def decode(self) -> tuple[list[ReplayDelivery], list[ReplayInput]]:
        """The segment's deliveries, one by one, and inputs.

        Read with the standard library: orjson would turn integers beyond 64 bits into
        floats.
        """
        data = json.loads(self.body)
        deliveries = [
            (agent, src, seq)
            for agent, src, first, count in data["deliveries"]
            for seq in range(first, first + count)
        ]
        inputs: list[ReplayInput] = [
            (dst, seq, kind, payload, headers, epoch)
            for dst, seq, kind, payload, headers, epoch in data["inputs"]
        ]
        return deliveries, inputs


class RunLease(BaseModel):
    """Who owns a run: one runtime at a time holds its lease and renews it.

    Every write the owner makes for the run carries ``token``; a store refuses a write whose
    token is not the current one, so an owner that lost its lease cannot change the run.
    """

    model_config = ConfigDict(frozen=True)

    run_id: str
    """The run."""
    owner: str
    """The owning process, ``host:pid:token``."""
    token: int
    """Fencing token: 1 for the first owner, one more for each owner after."""
    expires_at: datetime
    """Until when the lease holds unless renewed."""


class RunOwner(BaseModel):
    """One owner in a run's history of owners: who took the run's lease, when, and how it
    ended (see [`agentsnap.ownership`][agentsnap.ownership]).

    A store appends one each time the run's lease is taken (the run's first start, a resume,
    a takeover), in the same transaction as the take; runs that ran before the store kept
    this history have none for those owners.
    """  # noqa: D205

    model_config = ConfigDict(frozen=True)

    run_id: str
    """The run."""
    token: int
    """The lease's fencing token while this owner held it: 1 for the first owner, one more
    for each owner after (the history is ordered by it)."""
    owner: str
    """The owning process, ``host:pid:token``."""
    acquired_at: datetime
    """When this owner took the lease."""
    ended_at: datetime | None = None
    """When its lease ended: released, or taken over by the next owner; ``None`` while it
    holds the lease (or held it when its process died, until another takes the run over)."""
    ended: Literal["released", "taken_over"] | None = None
    """How it ended: ``released`` by the owner (the run stopped cleanly, whatever its
    status), or ``taken_over`` by the next owner because its lease had expired or its process
    was gone (a crash); ``None`` while it has not ended."""
    last_renewed_at: datetime | None = None
    """When the lease was last renewed (or taken) before it ended: the last moment the owner
    is known to have been alive, for an owner whose lease was taken over."""

    @property
    def crashed(self) -> bool:
        """Whether the owner stopped without giving the run back (its lease was taken over)."""
        return self.ended == "taken_over"


class GraphCheckpoint(BaseModel):
    """A LangGraph checkpoint of a graph agent of a run, as its checkpointer stored it.

    Only the checkpoint's identity and its metadata are read, never the graph's values: the
    values of a checkpoint a snapshot holds are in that snapshot's state of the agent.
    """

    model_config = ConfigDict(frozen=True)

    run_id: str
    """The run whose graph agent wrote it."""
    agent: str
    """The graph agent."""
    thread_id: str
    """The LangGraph thread: ``"{run}:{agent}"``, or ``"{run}:{agent}:N"`` for the thread a
    rollback to before the agent's first message started."""
    checkpoint_id: str
    """LangGraph's checkpoint id (a time-ordered UUID)."""
    parent_id: str | None = None
    """The checkpoint this one follows on its thread, if any; a checkpoint with two children
    is where a rollback made the thread branch."""
    step: int | None = None
    """LangGraph's step number (``-1`` for the input), when the metadata says so."""
    source: str | None = None
    """What made it: ``"input"``, ``"loop"``, ``"update"`` or ``"fork"``, when the metadata
    says so."""
    created_at: datetime | None = None
    """When LangGraph made it, read from the id; ``None`` when the id carries no time."""
    metadata: dict[str, JsonValue] | None = None
    """The checkpoint's metadata, when it is stored as JSON (``None`` otherwise: it is not
    decoded)."""
