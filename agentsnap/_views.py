"""Typed results of the inspection queries, shared by ``agentsnap.inspect``, the CLI and the
web inspector's API: each is built once from the records, and printed as JSON with
``model_dump(mode="json")``.
"""  # noqa: D205

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Generic, Literal, Self, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    PlainSerializer,
    SerializerFunctionWrapHandler,
    model_serializer,
)

# pydantic reads the annotations at run time
from agentsnap.ledger import ToolCallStatus
from agentsnap.messages import JsonValue
from agentsnap.records import RunInfo, RunOwner, RunStatus, SnapshotStatus

if TYPE_CHECKING:
    from agentsnap.records import ChannelRecord, Snapshot

__all__ = ["IsoTime", "Picked", "View", "attributes", "picked"]
"""The results themselves are public as members of ``agentsnap.inspect``."""


View = TypeVar("View", bound=BaseModel)


def _iso(moment: datetime) -> str:
    return moment.isoformat()


IsoTime = Annotated[datetime, PlainSerializer(_iso, return_type=str, when_used="json")]
"""A time that JSON shows as ``datetime.isoformat()`` does (``2026-11-24T20:05:03.123456+00:00``),
as agentsnap has always printed times, where pydantic alone would write ``Z`` for UTC."""


class RunRow(BaseModel):
    """A run as listings show it: ``agentsnap runs``, ``runs_table`` and the inspector's list."""

    model_config = ConfigDict(frozen=True)

    id: str
    """The run's id."""
    name: str | None
    """Its name, if it was given one."""
    status: RunStatus
    """Where it stands."""
    status_reason: str | None
    """Why it ended so, in one line, when it is known."""
    traceback: str | None
    """A failed run's tracebacks (see [`RunInfo.traceback`][agentsnap.RunInfo.traceback])."""
    cancel_requested: str | None
    """Why someone asked it to stop, while it has not stopped yet."""
    tags: dict[str, str]
    """Its tags."""
    created_at: IsoTime
    """When it started."""
    finished_at: IsoTime | None
    """When it finished, if it has."""
    snapshots: int
    """How many snapshots it has."""
    parent_run_id: str | None
    """The run it was forked from, if any."""
    parent_snapshot_id: str | None
    """The snapshot of that run it started from, if any."""
    metadata: dict[str, JsonValue]
    """The JSON the application attached to it."""

    @classmethod
    def of(cls, run: RunInfo, snapshots: int) -> RunRow:
        """The row of ``run``, which has ``snapshots`` snapshots."""
        return picked(cls, run, snapshots=snapshots)


def attributes(source: object, *names: str) -> dict[str, Any]:
    """``source``'s attributes ``names``, by name, in that order."""
    return {name: getattr(source, name) for name in names}


def picked(model: type[View], source: object, **given: Any) -> View:
    """A ``model`` whose fields are ``given``, or else ``source``'s attributes of the same
    names (or of the names its ``renamed`` maps them to): how a result is built from the
    record it shows.
    """  # noqa: D205
    renamed: Mapping[str, str] = getattr(model, "renamed", {})
    return model.model_validate(
        {
            name: given[name] if name in given else getattr(source, renamed.get(name, name))
            for name in model.model_fields
        }
    )


class Picked(BaseModel):
    """A result built from a record: each field is the record's attribute of that name."""

    renamed: ClassVar[Mapping[str, str]] = {}
    """The fields whose attribute has another name: field name to attribute name."""

    @classmethod
    def of(cls, source: object, **given: Any) -> Self:
        """The result of ``source``, with the fields ``given`` (see ``picked``)."""
        return picked(cls, source, **given)


class _View(Picked):
    """A result: read-only, and only the fields it declares."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class SnapshotRow(_View):
    """A snapshot as ``snapshots_table`` (and ``agentsnap snapshots``) lists it."""

    seq: int
    """Its number in the run, from 1."""
    id: str
    """The snapshot's id."""
    run_id: str
    """The run it belongs to."""
    status: SnapshotStatus
    """Where it stands (``damaged`` for one found damaged in the store)."""
    initiator: str
    """Who started it (an agent, or ``$env``)."""
    started_at: IsoTime
    """When it started."""
    completed_at: IsoTime | None
    """When it completed, if it did."""
    agents: list[str]
    """The processes it recorded."""
    in_flight: int
    """How many messages it holds in flight."""
    error: str | None
    """Why it failed, or what is wrong with a damaged one."""
    damaged_agents: list[str]
    """The processes whose part of a damaged snapshot is missing or unreadable."""


class RollbackRow(_View):
    """A rollback, as ``rollbacks_table`` lists it and the export document holds it."""

    id: str
    """The rollback's id."""
    snapshot_id: str
    """The snapshot the run went back to."""
    agent: str | None
    """Whose output was rejected, if an agent's."""
    reason: str
    """Why."""
    source: str
    """What rejected it (a check, a schema, the agent's own evaluation, ...)."""
    attempt: int
    """Which attempt of the rejected output this was."""
    discarded: int
    """How many messages the rollback discarded."""
    at: IsoTime
    """When it happened."""


class ToolCall(_View):
    """A side-effecting tool call of the ledger, as the export document holds it."""

    renamed: ClassVar[Mapping[str, str]] = {"run": "run_id", "message": "message_id"}

    key: str
    """Its idempotency key."""
    run: str | None
    """The run that made it."""
    agent: str | None
    """The agent that made it."""
    message: str | None
    """The id of the message its handler was handling."""
    tool: str
    """The tool's name."""
    arguments: dict[str, JsonValue]
    """Its arguments."""
    fingerprint: str
    """The fingerprint of its arguments."""
    status: ToolCallStatus
    """Where it stands."""
    attempts: int
    """How many times the tool was run."""
    result: JsonValue
    """What it returned, once it succeeded."""
    error: str | None
    """Why it failed, once it did."""
    compensation: JsonValue
    """What its compensating action returned, if one ran."""
    note: JsonValue
    """What was recorded when its outcome was settled by hand."""
    owner: str | None
    """The process holding it while it runs."""
    lease_until: IsoTime | None
    """Until when that process holds it."""
    created_at: IsoTime
    """When it was claimed."""
    updated_at: IsoTime
    """When it last changed."""


class ToolCallRow(ToolCall):
    """A tool call as ``tool_calls_table`` and ``ledger_calls_table`` list it."""

    unknown: bool
    """Whether its outcome is unknown (it may or may not have happened; settle it with
    ``agentsnap tools resolve``)."""


class _ModelCallBase(_View):
    """What every listing of a model call shows."""

    renamed: ClassVar[Mapping[str, str]] = {"run": "run_id", "message": "message_id"}

    run: str
    """The run that made it."""
    agent: str
    """The agent that made it."""
    message: str
    """The id of the message its handler was handling."""
    position: int
    """Its place among that handler's model calls."""
    timeline: int
    """How many rollbacks came before it."""
    model: str | None
    """The model asked."""
    input_tokens: int
    """Tokens in."""
    output_tokens: int
    """Tokens out."""
    started_at: IsoTime
    """When it started."""
    latency_ms: int | float
    """How long the model took, in milliseconds (the number as recorded)."""
    replays: int
    """How often a re-execution got the recorded answer instead of asking again."""


class ModelCall(_ModelCallBase):
    """A model call with its request and answer, as the export document holds it."""

    request: dict[str, JsonValue]
    """What the model was asked."""
    response: dict[str, JsonValue]
    """What it answered."""


class ModelCallRow(ModelCall):
    """A model call as ``model_calls_table`` lists it."""

    discarded: bool
    """Whether it was made on a timeline a rollback discarded."""


class CallSummary(_ModelCallBase):
    """A model call without its request and answer (see ``call_summary``)."""

    discarded: bool
    """Whether it was made on a timeline a rollback discarded."""
    answer: str
    """The first line of its answer's text (see ``answer_line``)."""


class CallTotals(_View):
    """How many model calls, and their tokens."""

    calls: int
    """How many calls."""
    input_tokens: int
    """Their tokens in."""
    output_tokens: int
    """Their tokens out."""


class ModelCallTotals(CallTotals):
    """Calls and tokens in all, and by agent (see ``model_call_totals``)."""

    agents: dict[str, CallTotals]
    """The same, by agent, in the agents' order."""


class ModelCallsTable(_View):
    """A run's model calls with their totals: what ``model_calls_table`` returns."""

    run_id: str
    """The run's id."""
    timeline: int
    """The latest timeline a call of the run was made on."""
    calls: list[ModelCallRow]
    """The calls, in the order they were made."""
    totals: ModelCallTotals
    """The calls listed, counted, and their tokens."""


class ValueChange(_View):
    """A value that changed."""

    old: JsonValue
    """Before."""
    new: JsonValue
    """After."""


class MappingDiff(_View):
    """What differs between two mappings, by key (keys sorted)."""

    added: dict[str, JsonValue]
    """Keys only the new one has, with their values."""
    removed: dict[str, JsonValue]
    """Keys only the old one has, with their values."""
    changed: dict[str, ValueChange]
    """Keys both have with different values."""

    @classmethod
    def between(cls, old: Mapping[str, Any], new: Mapping[str, Any]) -> MappingDiff:
        """What differs from ``old`` to ``new``."""
        return cls(
            added={k: new[k] for k in sorted(new) if k not in old},
            removed={k: old[k] for k in sorted(old) if k not in new},
            changed={
                k: ValueChange(old=old[k], new=new[k])
                for k in sorted(old)
                if k in new and old[k] != new[k]
            },
        )

    @property
    def empty(self) -> bool:
        """Whether nothing differs."""
        return not (self.added or self.removed or self.changed)


class PlanChange(_View):
    """A step of the plan that differs."""

    index: int
    """The step's place in the plan."""
    change: Literal["added", "removed", "changed"]
    """How it differs."""
    old: JsonValue
    """The step before (``None`` for an added one)."""
    new: JsonValue
    """The step after (``None`` for a removed one)."""


class StateDiff(_View):
    """A structured diff of two agent states: what ``diff_states`` returns."""

    memory: MappingDiff
    """The memory, by key."""
    plan: list[PlanChange]
    """The plan, step by step."""
    tool_calls: MappingDiff
    """The tool-call history, by idempotency key (else ``#index``)."""
    fields: MappingDiff
    """Every other field of the state."""

    @property
    def empty(self) -> bool:
        """Whether it records no change at all."""
        return not self.plan and self.memory.empty and self.tool_calls.empty and self.fields.empty


AgentChange = Literal["added", "removed", "changed", "unchanged", "damaged"]
"""How an agent's state differs between two snapshots."""


class AgentDiff(_View):
    """One agent's entry of ``diff_snapshots``: how its state changed, field by field."""

    agent: str
    """The agent."""
    change: AgentChange
    """Whether it was added, removed, changed, unchanged, or is damaged in either snapshot."""
    a_version: int | None
    """The version its state was stored with in snapshot A (``None`` without one)."""
    b_version: int | None
    """The same in snapshot B."""
    memory: MappingDiff
    """See [`StateDiff`][agentsnap.inspect.StateDiff]."""
    plan: list[PlanChange]
    """See [`StateDiff`][agentsnap.inspect.StateDiff]."""
    tool_calls: MappingDiff
    """See [`StateDiff`][agentsnap.inspect.StateDiff]."""
    fields: MappingDiff
    """See [`StateDiff`][agentsnap.inspect.StateDiff]."""

    @property
    def diff(self) -> StateDiff:
        """The state diff alone."""
        return StateDiff(
            memory=self.memory, plan=self.plan, tool_calls=self.tool_calls, fields=self.fields
        )


class SnapshotDiff(_View):
    """What changed in each agent's state from snapshot A to snapshot B (``diff_snapshots``)."""

    a: str
    """Snapshot A's id."""
    b: str
    """Snapshot B's id."""
    a_run_id: str
    """Its run."""
    b_run_id: str
    """Snapshot B's run."""
    a_damaged: str | None
    """What is wrong with snapshot A, if it is damaged."""
    b_damaged: str | None
    """What is wrong with snapshot B, if it is damaged."""
    agents: list[AgentDiff]
    """Each agent, by name."""


class InFlightMessage(_View):
    """A message in flight across a cut."""

    seq: int
    """Its number on its channel."""
    kind: str | None
    """Its kind."""
    payload: JsonValue
    """Its payload."""
    headers: dict[str, JsonValue]
    """Its headers."""
    epoch: int
    """The sender's snapshot epoch when it was sent."""


class ChannelCut(_View):
    """A channel's messages in flight across a cut."""

    src: str
    """The sender."""
    dst: str
    """The receiver."""
    messages: list[InFlightMessage]
    """The messages, in order."""

    @classmethod
    def recorded(cls, channel: ChannelRecord) -> ChannelCut:
        """The messages a snapshot recorded on a channel."""
        return picked(cls, channel, messages=[picked(InFlightMessage, m) for m in channel.messages])


class AgentPart(_View):
    """An agent's part of a snapshot, as the export document holds it."""

    state: dict[str, JsonValue]
    """Its state, as stored."""
    state_hash: str
    """The state's content hash."""
    state_version: int
    """The version of its state class the state was stored with."""
    sent: dict[str, int]
    """How many messages it had sent, by receiver."""
    received: dict[str, int]
    """How many it had received, by sender."""


Part = TypeVar("Part", bound=AgentPart)


class _WholeSnapshot(_View, Generic[Part]):
    """A snapshot with its agents' parts and the messages in flight."""

    id: str
    """The snapshot's id."""
    seq: int
    """Its number in the run."""
    status: SnapshotStatus
    """Where it stands."""
    initiator: str
    """Who started it."""
    started_at: IsoTime
    """When it started."""
    completed_at: IsoTime | None
    """When it completed, if it did."""
    error: str | None
    """Why it failed, or what is wrong with a damaged one."""
    damaged_agents: list[str]
    """The processes whose part is missing or unreadable."""
    agents: dict[str, Part]
    """Each agent's part."""
    channels: list[ChannelCut]
    """The messages in flight, by channel."""


class SnapshotDocument(_WholeSnapshot[AgentPart]):
    """A snapshot whole, as the export document holds it."""

    @classmethod
    def whole(cls, snapshot: Snapshot) -> SnapshotDocument:
        """The document of ``snapshot``."""
        return picked(
            cls,
            snapshot,
            channels=[ChannelCut.recorded(channel) for channel in snapshot.channels],
            agents={name: picked(AgentPart, cut) for name, cut in snapshot.agents.items()},
        )


class AgentShown(AgentPart):
    """An agent's part of a snapshot as ``show_snapshot`` shows it: its ``state`` as stored,
    or as the current state class reads it (with ``models``).
    """  # noqa: D205

    read_as: int | None = None
    """With ``models``, the version its class is at now (JSON leaves the key out without)."""
    unreadable: str | None = None
    """Why the class cannot read the state, if it cannot (JSON leaves the key out else)."""
    model_calls: list[CallSummary]
    """Its model calls since the previous cut."""

    @model_serializer(mode="wrap")
    def _leave_out_unread(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        shown: dict[str, Any] = handler(self)
        if self.read_as is None:
            del shown["read_as"]
        if self.unreadable is None:
            del shown["unreadable"]
        return shown


class PreviousSnapshot(_View):
    """A snapshot named by another result: its id, number and start."""

    id: str
    """The snapshot's id."""
    seq: int
    """Its number in the run."""
    started_at: IsoTime
    """When it started."""


class RunStanding(_View):
    """Where a run stands."""

    status: RunStatus
    """Its status."""
    status_reason: str | None
    """Why it ended so, when it is known."""
    traceback: str | None
    """A failed run's tracebacks."""


class SnapshotView(_WholeSnapshot[AgentShown]):
    """One snapshot as ``show_snapshot`` (and ``agentsnap show``) shows it: with ``agent``,
    only that agent's part (or its name in ``damaged_agents``) and its channels.
    """  # noqa: D205

    run_id: str
    """The run it belongs to."""
    run: RunStanding
    """Where that run stands."""
    previous: PreviousSnapshot | None
    """The run's snapshot started before it, whose start bounds the calls shown."""


class StoredStates(_View):
    """A row of ``check_stored_states``: one run, agent and stored version."""

    run_id: str
    """The run."""
    agent: str
    """The agent."""
    stored_version: int
    """The version the states were stored with."""
    current_version: int | None
    """The version the agent's class is at now (``None`` for an agent the code lacks)."""
    snapshots: list[int]
    """The numbers of the snapshots holding such states."""
    readable: int
    """How many distinct states the code reads."""
    unreadable: int
    """How many it cannot."""
    error: str | None
    """Why, for the first state it cannot read."""


class HistoryEntry(_View):
    """A row of ``agent_history_table``: an agent's state in one snapshot."""

    snapshot_id: str
    """The snapshot."""
    seq: int
    """Its number in the run."""
    completed_at: IsoTime | None
    """When it completed."""
    damaged: str | None
    """What is wrong with the snapshot, if it is damaged."""
    state_hash: str | None
    """The state's content hash (``None`` when the agent's part is lost)."""
    state: dict[str, JsonValue] | None
    """The state."""
    sent: dict[str, int] | None
    """How many messages the agent had sent, by receiver."""
    received: dict[str, int] | None
    """How many it had received, by sender."""
    changes: StateDiff | None
    """What changed from the previous entry with a state (``None`` for the first)."""


class CheckpointRow(_View):
    """A LangGraph checkpoint, as ``graph_checkpoints_table`` lists it."""

    agent: str
    """The graph agent."""
    thread_id: str
    """The checkpoint's thread."""
    checkpoint_id: str
    """Its id."""
    parent_id: str | None
    """The checkpoint before it."""
    step: int | None
    """The graph's step."""
    source: str | None
    """What made it (``input``, ``loop``, ``update``, ...)."""
    created_at: IsoTime | None
    """When it was written."""
    snapshots: list[int]
    """The numbers of the run's complete snapshots whose state names it."""
    metadata: dict[str, JsonValue] | None
    """LangGraph's metadata of it."""


class SentMessage(_View):
    """A message a handler sent."""

    to: str
    """Its receiver."""
    seq: int
    """Its number on the channel."""
    kind: str | None
    """Its kind."""
    payload: JsonValue
    """Its payload."""


class HandlerToolCall(_View):
    """A side-effecting tool call a handler made."""

    tool: str
    """The tool."""
    key: str
    """Its idempotency key."""
    status: ToolCallStatus
    """Where it stands."""
    arguments: dict[str, JsonValue]
    """Its arguments."""
    attempts: int
    """How many times the tool was run."""


class HandlerModelCall(_View):
    """A model call a handler made."""

    position: int
    """Its place among the handler's model calls."""
    model: str | None
    """The model asked."""
    latency_ms: int | float
    """How long the model took, in milliseconds (the number as recorded)."""
    input_tokens: int
    """Tokens in."""
    output_tokens: int
    """Tokens out."""
    replays: int
    """How often a re-execution got the recorded answer."""


class EventRow(_View):
    """A handler execution, as ``events_table`` (and ``agentsnap events``) lists it."""

    index: int
    """Its place in the run's history, from 1."""
    agent: str
    """The agent."""
    message: str
    """The id of the message taken, ``src>dst#seq``."""
    kind: str | None
    """That message's kind (``None`` read from the replay log)."""
    payload: JsonValue
    """Its payload (``None`` read from the replay log)."""
    started_at: IsoTime | None
    """When the agent took it."""
    duration_ms: float | None
    """From then to the last act recorded for it, ``None`` when it did none."""
    timeline: int
    """How many rollbacks came before it."""
    sent: list[SentMessage]
    """The messages it sent."""
    tool_calls: list[HandlerToolCall]
    """Its side-effecting tool calls."""
    model_calls: list[HandlerModelCall]
    """Its model calls."""


class OwnerRow(BaseModel):
    """An owner of a run, as ``agentsnap owners`` and ``owners_table`` show it."""

    model_config = ConfigDict(frozen=True)

    token: int
    """The lease's fencing token while it owned the run (1: the run's first owner)."""
    owner: str
    """The owning process, ``host:pid:token``."""
    acquired_at: IsoTime
    """When it took the run's lease."""
    ended_at: IsoTime | None
    """When its lease ended: released, or taken over by the next owner."""
    ended: str
    """How it ended: ``released`` (the run stopped cleanly), ``crashed`` (it stopped
    without giving the run back, and the next owner took it over), or ``holds`` (it has
    not ended: it owns the run, or died and nobody took the run over yet)."""
    last_renewed_at: IsoTime | None
    """Its last renewal of the lease before it ended: for a crashed owner, the last moment
    it is known to have been alive."""

    @classmethod
    def of(cls, owner: RunOwner) -> OwnerRow:
        """The row of ``owner``."""
        return cls(
            token=owner.token,
            owner=owner.owner,
            acquired_at=owner.acquired_at,
            ended_at=owner.ended_at,
            ended="crashed" if owner.crashed else owner.ended or "holds",
            last_renewed_at=owner.last_renewed_at,
        )
