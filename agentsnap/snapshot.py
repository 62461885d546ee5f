"""Coordinated snapshots after Chandy and Lamport (1985).

Snapshots are numbered 1, 2, 3 … within a run. Every process (each agent, and the environment
that injects work) keeps an *epoch*: the highest snapshot number it has recorded. The protocol:

1. **Initiation.** The environment records at once and sends a marker to every agent, so the
   snapshot reaches agents that have never talked to anyone. An agent named as initiator
   records as soon as it is between two handler calls (for one that asked from its running
   handler, see *Recording as the handler returns*). Where the scheduler can tell that an
   agent waits for work (nothing is queued for it and nothing is being delivered to it, as
   the [`AsyncioScheduler`][agentsnap.AsyncioScheduler] can), that agent records right
   after the environment, in the same step, instead of at a marker: every channel to it is
   empty, so its state for the snapshot is empty whatever its sender does next, and the
   step costs no delivery. Schedulers that script deliveries (those of
   [`agentsnap.testing`][agentsnap.testing]) send the marker to every agent.
2. **Recording.** A process records when it takes a marker ``k`` off a channel, or a message
   whose epoch is ``k`` (the sender recorded before sending it, so the message must not count
   in the receiver's state); a process inside a handler records as soon as a marker ``k`` is
   put on one of its channels (see *Recording inside a handler*). Recording ``k`` records
   every snapshot up to ``k`` still in progress at the same point, which keeps each
   process's recordings in order and lets a single integer stand for "which snapshots had
   the sender recorded". After recording, the process sends marker ``k`` on each outgoing
   channel that needs one (see 3.).
3. **Channel state.** A channel is *closed* for ``k`` once a marker or a message with epoch
   ``>= k`` has come through it. A message the receiver takes after recording ``k`` from a
   channel not yet closed for ``k`` was in flight across the cut and is recorded with it.
   In one process the messages ahead of the marker are known as soon as both ends have
   recorded, so the channel is closed then, with those messages recorded, without waiting
   for the receiver to take them. A channel created after its sender recorded ``k`` starts
   closed, so channels that appear during a snapshot stay correct.

   **Channels closed without a marker.** In one process the coordinator sees what a
   channel holds, so it puts a marker only where one is needed: where messages sent before
   the recording are still queued (the marker says where they end), where a handler running
   at a receiver that has not recorded may have taken one of them (it may record inside
   that handler, with that message in flight), and on the environment's channels to agents
   that have not recorded (those markers are what tells every agent to record), except to
   agents at rest, which record at once (see 1.). Any other
   channel holds nothing of the sender's old epoch, so its state is empty for ``k`` whether
   or not its receiver has recorded: it is closed at once. Everything that comes through it
   later was sent after the sender's recording and carries epoch ``>= k``, so a receiver
   that has not recorded yet records before it counts, as it does at a marker. A team
   whose channels are idle therefore costs at most one marker per agent, however many
   channels connect them. This holds for channels whose items and both ends are in this
   process (``in_process``, see [`Channel`][agentsnap.bus.Channel]), as a
   [`LocalChannel`][agentsnap.bus.LocalChannel]'s are. A channel whose receiver runs in
   another process takes its marker unless
   [`marker_needed`][agentsnap.snapshot.SnapshotCoordinator.marker_needed] says otherwise
   (a run spread over processes closes its idle channels by count instead).
4. **Completion.** When every process has recorded ``k`` and every channel is closed for
   ``k``, the snapshot is a consistent cut and is handed to the store; the handle resolves once
   it is written. Several snapshots may be in progress at once; the bus never pauses.

**Recording inside a handler.** A handler may await a model for minutes; a snapshot does not
wait for it. A process whose handler runs when it must record records the state it had
*before* that handler began, and the message being handled counts as in flight on its
channel (first in that channel's state). The cut stays consistent because, at that point,
nothing the handler did is visible to another process: the process records only while the
handler has sent nothing anyone can see (messages held back for self-evaluation are not
counted as sent), and what the handler sends later follows the markers of the recording on
every outgoing channel, so it belongs to the next epoch. Restoring such a cut hands the
message to the agent again. The state before the handler is the agent's last recorded one
when nothing was delivered to it or marked since; otherwise it is the encoding
[`keep_before`][agentsnap.snapshot.SnapshotCoordinator.keep_before] kept as the handler began,
which the runtime does for agents whose handlers have been found running at a recording
before; such an agent also records a snapshot in progress as it takes a message, rather than
at the marker that may be queued behind it. A process that cannot record this way (it
already sent a message, or no state from before the handler is known) records as soon as
the handler returns, as a process between two handlers does.

**Recording as the handler returns.** A handler that starts a snapshot itself
(``ctx.snapshot()``) is not recorded inside it: its process records as the handler returns
(after the messages held back for self-evaluation are released), as a process between two
handlers does, so the cut holds everything the handler did: its state changes, the message
it handled counted as received, and every message it sent counted as sent. Those messages
are in flight in the cut: a receiver in this process that is about to take one before the
sender recorded records first (as any process may at any moment), and at the sender's
recording its receivers between two handlers record at once rather than at the marker
queued behind those messages. Only a message its receiver took before the call (the
handler awaited after sending it), or one that a receiver in another process took before
its marker, may count in the receiver's state instead. Going back to
such a cut never runs the handler again and loses nothing of it. The snapshot completes
only once the handler returns; if the handler's output is rejected, it never completes
before the rollback, and a rollback target precedes the handler (see
[`target_before`][agentsnap.snapshot.SnapshotCoordinator.target_before]).
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import orjson

from agentsnap.exceptions import ConfigurationError, SnapshotFailed, StateNotSerializable
from agentsnap.handles import SnapshotHandle
from agentsnap.integrity import cut_problems
from agentsnap.messages import ENVIRONMENT, Marker
from agentsnap.records import (
    AgentCut,
    ChannelRecord,
    RecordedMessage,
    Snapshot,
    SnapshotStatus,
    utcnow,
)
from agentsnap.state import (
    HasState,
    StateBlob,
    canonical_json,
    encode_checked,
)
from agentsnap.versions import state_version

if TYPE_CHECKING:
    from collections.abc import Sequence
    from datetime import datetime

    from agentsnap.bus import Bus, Channel, Endpoint
    from agentsnap.messages import Message

__all__ = [
    "Handling",
    "SnapshotCoordinator",
    "SnapshotObserver",
    "SnapshotPolicy",
    "SnapshotProgress",
]

logger = logging.getLogger("agentsnap.snapshot")

_EMPTY_STATE = StateBlob("{}")
_IMMUTABLE = frozenset({str, int, float, bool})


def _holds_message(channel: Channel) -> bool:
    """Whether a message (not a marker) is queued on ``channel``."""
    if not channel:
        return False
    return any(type(item) is not Marker for item in channel)


@dataclass(frozen=True, slots=True)
class SnapshotPolicy:
    """When the runtime takes snapshots on its own (besides on demand).

    Attributes:
        every_deliveries: Start a snapshot after every this many delivered messages.
        every_seconds: Start a snapshot every this many seconds of wall-clock time, or
            less often when snapshots take long: the next one starts no sooner than six
            times the time the latest one took from its start until it was written, so that
            recording and writing them takes about a sixth of the run's time at most, under
            a quarter even counting the store's writer thread beside the event loop (a
            snapshot of a big team during a round that keeps every agent busy completes only
            when the round does).
        at_start: Take a snapshot when the run gets its first input (the first message sent
            from the environment), so that a rollback always has a cut to go back to.
        at_end: Take a snapshot when the run goes idle (``run_until_idle`` returns) and when
            it closes, if anything was sent or delivered since the newest snapshot, so that
            every run's final agent states can be shown, diffed and forked. Not taken while a
            handler is half-way (a cancelled run keeps its newest cut), after a handler
            failed (resuming the failed run redoes that handler from the cut before it), or
            after the run stopped.
        max_in_progress: Skip a policy snapshot while this many are already in progress
            (and, for ``every_seconds``, while this many of its own are still being written),
            so that a slow store cannot make snapshots pile up.
    """

    every_deliveries: int | None = None
    every_seconds: float | None = None
    at_start: bool = True
    at_end: bool = True
    max_in_progress: int = 1

    def __post_init__(self) -> None:
        if self.every_deliveries is not None and self.every_deliveries < 1:
            raise ConfigurationError(
                f"SnapshotPolicy(every_deliveries={self.every_deliveries}) must be a positive "
                "number of messages (or None for no snapshot by count)"
            )
        if self.every_seconds is not None and not self.every_seconds > 0:
            raise ConfigurationError(
                f"SnapshotPolicy(every_seconds={self.every_seconds}) must be a positive number "
                "of seconds (or None for no snapshot by time)"
            )
        if self.max_in_progress < 1:
            raise ConfigurationError(
                f"SnapshotPolicy(max_in_progress={self.max_in_progress}) must be at least 1"
            )


class SnapshotObserver(Protocol):
    """Sees the snapshots of a coordinator go by (telemetry implements it).

    Set one as [`SnapshotCoordinator.observer`][agentsnap.snapshot.SnapshotCoordinator.observer].
    The hooks run inside the protocol's steps: keep them short, and never raise.
    """

    def snapshot_started(self, handle: SnapshotHandle, run_id: str) -> None:
        """A snapshot was started."""

    def snapshot_marker(self, snapshot_id: str, src: str, dst: str) -> None:
        """A marker of the snapshot came through the channel ``src -> dst``."""

    def snapshot_recorded(self, snapshot_id: str, process: str) -> None:
        """``process`` recorded its state for the snapshot."""

    def snapshot_written(
        self, snapshot: Snapshot, handle: SnapshotHandle, write: Awaitable[None]
    ) -> Awaitable[None]:
        """The snapshot finished (complete or failed), and ``write`` will store it.

        Return ``write``, or an awaitable that wraps it (to time it, say).
        """


class Handling(NamedTuple):
    """What the handler a process is running has done, for recording it without waiting.

    See *Recording inside a handler* above; the runtime gives it through
    [`SnapshotCoordinator.handling`][agentsnap.snapshot.SnapshotCoordinator.handling].
    """

    message: Message
    """The message being handled: in flight on ``channel`` for the recording."""
    channel: Channel
    """The channel it came from."""
    held: Sequence[Message]
    """Messages the handler sent that are not visible yet (held for self-evaluation): they
    have their sequence numbers, but do not count as sent at the recording."""


class SnapshotProgress(Protocol):
    """A snapshot in progress, as the coordinator's hooks for subclasses see it: read only.

    The coordinator alone fills it in, as processes record and channels close; see
    [`store_complete`][agentsnap.snapshot.SnapshotCoordinator.store_complete].
    """

    @property
    def handle(self) -> SnapshotHandle:
        """The snapshot's handle: its id, number and initiator."""

    @property
    def started_at(self) -> datetime:
        """When the snapshot started here."""

    @property
    def cuts(self) -> Mapping[str, AgentCut]:
        """Each process that has recorded the snapshot: its part of the cut, by name."""

    @property
    def inflight(self) -> Mapping[Channel, Sequence[RecordedMessage]]:
        """Per channel, the messages recorded in flight on it so far, oldest first."""


class _Progress:
    """Book-keeping for one snapshot in progress; hooks see it as a ``SnapshotProgress``."""

    __slots__ = ("cuts", "handle", "inflight", "started_at", "unclosed", "unrecorded")

    def __init__(self, handle: SnapshotHandle, processes: Iterable[str]) -> None:
        self.handle = handle
        self.started_at: datetime = utcnow()
        self.unrecorded = set(processes)
        self.cuts: dict[str, AgentCut] = {}
        self.inflight: dict[Channel, list[RecordedMessage]] = {}
        # Filled once every process has recorded: the channels still to be closed.
        self.unclosed: set[Channel] | None = None


Persist = Callable[[Snapshot], Awaitable[None]]


class SnapshotCoordinator:
    """Runs the snapshot protocol on a bus.

    The runtime calls [`on_marker`][agentsnap.snapshot.SnapshotCoordinator.on_marker] and
    [`on_message`][agentsnap.snapshot.SnapshotCoordinator.on_message] as items are delivered;
    everything here is synchronous and runs between two handler calls of the process concerned.

    A recording encodes only the states that may have changed since their agent's last
    recording (the [`changed`][agentsnap.snapshot.SnapshotCoordinator.changed] set) and
    reuses the JSON and hash of the others, so a snapshot in which few agents changed costs
    little; [`mark_changed`][agentsnap.snapshot.SnapshotCoordinator.mark_changed] says when
    a state counts as changed.

    **Subclasses** (a coordinator recording only the processes of a run that it hosts, as
    [`PartCoordinator`][agentsnap.distributed.PartCoordinator] does) change it through the
    methods declared for them, and never through its private ones:
    [`recording_processes`][agentsnap.snapshot.SnapshotCoordinator.recording_processes] and
    [`recording_channels`][agentsnap.snapshot.SnapshotCoordinator.recording_channels] (what
    a snapshot records here),
    [`start_recording`][agentsnap.snapshot.SnapshotCoordinator.start_recording] (follow a
    snapshot numbered elsewhere),
    [`in_flight_recorded`][agentsnap.snapshot.SnapshotCoordinator.in_flight_recorded] and
    [`channel_closing`][agentsnap.snapshot.SnapshotCoordinator.channel_closing] (see the
    channels' state as it is recorded), and
    [`store_complete`][agentsnap.snapshot.SnapshotCoordinator.store_complete] and
    [`store_failed`][agentsnap.snapshot.SnapshotCoordinator.store_failed] (where a finished
    snapshot goes).
    """

    def __init__(
        self,
        bus: Bus,
        agents: Mapping[str, HasState],
        run_id: str,
        persist: Persist,
    ) -> None:
        self.bus = bus
        self.run_id = run_id
        self.active: dict[int, _Progress] = {}
        """Snapshots in progress, by number, oldest first."""
        self.last_seq = 0
        self.observer: SnapshotObserver | None = None
        """Who sees the snapshots go by (telemetry, set by the runtime), or ``None``."""
        self.wanted: dict[str, int] = {}
        """Per process whose handler is running and that could not record inside it: the
        snapshot number it must record as soon as that handler returns."""
        self.handling: Callable[[Endpoint], Handling | None] | None = None
        """What the handler ``endpoint`` is running has done so far, or ``None`` when it cannot
        record inside it (it made a message visible); set by the runtime. Without it, a
        process inside a handler records when the handler returns."""
        self.at_rest: Callable[[Endpoint], bool] | None = None
        """Whether a process waits for work (nothing is queued for it and nothing is being
        delivered to it), when the scheduler can tell (set by the runtime), or ``None``. Such
        a process records as a snapshot starts, without a marker (see 1. above)."""
        # Per agent, its state and received counters as a handler began (see keep_before).
        self._before: dict[str, tuple[StateBlob, dict[str, int]]] = {}
        # Agents whose running handler started a snapshot (ctx.snapshot()): they record as
        # that handler returns, never inside it (see *Recording as the handler returns*).
        self._at_return: set[str] = set()
        # Processes to record, and whether record() is working through them already: a
        # recording can make others record (their channels got a marker while they were in
        # a handler), without recursion however many there are.
        self._to_record: list[tuple[Endpoint, int, tuple[Channel, Message] | None]] = []
        # Those of them found at rest: nothing is queued on any channel to them.
        self._resting: set[Endpoint] = set()
        self._recording = False
        # Per agent, why its state could not be encoded (for the snapshots that fail).
        self._unencodable: dict[str, str] = {}
        self._agents = agents
        self._persist = persist
        self._tasks: set[asyncio.Task[None]] = set()
        # Per agent, the hash of the last state shown to survive a JSON round trip.
        self._verified: dict[str, str] = {}
        self.changed: set[str] = set()
        """Agents marked as changed since they were last recorded: these, and those that
        received a message since, are encoded again by the next recording; the others reuse
        their last encoding. See
        [`mark_changed`][agentsnap.snapshot.SnapshotCoordinator.mark_changed]."""
        # Per agent, the state as last encoded, and how many messages the agent had received
        # from each sender then: reused while nothing was delivered to it and nothing marked it.
        self._recorded: dict[str, tuple[StateBlob, dict[str, int]]] = {}
        # Per agent, its part of the last cut it recorded: reused as it is by a recording
        # with the same state and counters (cuts are immutable), so that an agent nothing
        # happened to costs no new cut, and stores can recognise it.
        self._cuts: dict[str, AgentCut] = {}
        # Complete, written snapshots of the current timeline (rollback targets), by number,
        # with each process's sent counters; and the newest of them in full.
        self._targets: dict[int, tuple[str, dict[str, dict[str, int]]]] = {}
        self.latest: Snapshot | None = None
        """The newest complete snapshot written to the store, in this timeline."""
        self.newest: Snapshot | None = None
        """The newest snapshot completed (written or not yet), or restored."""
        self.suspended: str | None = None
        """While set (a rollback is under way, or the run stopped), a snapshot that is
        started fails at once with this reason."""

    # -- initiation -----------------------------------------------------------------------

    def begin(
        self, initiator: Endpoint | None = None, *, at_return: bool = False
    ) -> SnapshotHandle:
        """Start a new snapshot; ``initiator`` is an agent, or ``None`` for the runtime.

        Args:
            initiator: The agent that asks for it, or ``None`` for the runtime.
            at_return: The initiator asks from inside its running handler
                (``ctx.snapshot()``): it records as that handler returns, with everything
                the handler did (see *Recording as the handler returns*).
        """
        self.last_seq = seq = self.last_seq + 1
        name = initiator.name if initiator is not None else ENVIRONMENT
        handle = SnapshotHandle(uuid.uuid4().hex, seq, name)
        self.start_recording(handle, self.recording_processes())
        if self.observer is not None:
            self.observer.snapshot_started(handle, self.run_id)
        if self.suspended is not None:
            self.fail(seq, self.suspended)
            return handle
        logger.debug("snapshot %d started by %s", seq, name)
        if initiator is not None and at_return and initiator.busy:
            # Known before the environment records: its marker may reach the initiator first.
            self._at_return.add(name)
        self.record(self.bus.environment, seq)
        if initiator is not None and seq in self.active:
            self.request(initiator, seq)
        return handle

    def recording_processes(self) -> list[str]:
        """The processes that must record a snapshot begun here: every process on the bus.

        For subclasses to override: a coordinator of a run spread over processes records
        only the processes it hosts.
        """
        return list(self.bus.endpoints)

    def recording_channels(self) -> Iterable[Channel]:
        """The channels a snapshot waits for once its processes recorded: every channel.

        Each of them must be closed for the snapshot before it completes. For subclasses
        to override: a coordinator recording part of a run waits only for the channels
        into the processes it hosts.
        """
        return self.bus.channels.values()

    def start_recording(self, handle: SnapshotHandle, processes: Iterable[str]) -> None:
        """Follow snapshot ``handle.seq`` as in progress, for ``processes`` to record.

        For subclasses whose snapshots are numbered elsewhere (``begin`` calls it for the
        snapshots it numbers). Nothing is recorded yet: each process records at its first
        marker of the snapshot (or message of its epoch), and the snapshot completes once
        they all have and the
        [`recording_channels`][agentsnap.snapshot.SnapshotCoordinator.recording_channels]
        are closed for it.
        """
        self.active[handle.seq] = _Progress(handle, processes)

    def capture(self) -> SnapshotHandle | None:
        """Take a whole snapshot at once, when no handler runs and no snapshot is in progress.

        With no handler half-way, the agents' states and the messages queued on the channels
        are together a consistent cut, so no markers are needed: this is how the run's first
        snapshot is taken, and a fork's. Returns ``None`` when the bus is not quiet enough.
        """
        if (
            self.active
            or self.suspended is not None
            or self.wanted
            or any(e.busy for e in self.bus.endpoints.values())
        ):
            return None
        self.last_seq = seq = self.last_seq + 1
        handle = SnapshotHandle(uuid.uuid4().hex, seq, ENVIRONMENT)
        self.start_recording(handle, ())
        progress = self.active[seq]
        if self.observer is not None:
            self.observer.snapshot_started(handle, self.run_id)
        for endpoint in self.bus.endpoints.values():
            cut = self._cut(endpoint, [seq])
            if cut is None:
                return handle  # failed, and reported, by _cut
            progress.cuts[endpoint.name] = cut
            endpoint.epoch = seq
        for channel in self.bus.channels.values():
            channel.closed = seq
            for item in channel:
                if type(item) is Marker:
                    continue
                self._record_in_flight(seq, progress, channel, item)  # type: ignore[arg-type]
                if seq not in self.active:
                    return handle
        self._complete(seq)
        return handle

    def request(self, endpoint: Endpoint, seq: int) -> None:
        """Have ``endpoint`` record ``seq`` now.

        Inside its running handler when it can, otherwise as soon as that handler returns.
        """
        self.record(endpoint, seq)

    def keep_before(self, endpoint: Endpoint, channel: Channel, message: Message) -> None:
        """Keep the state of ``endpoint``'s agent as it takes ``message`` to handle it.

        Called before the message counts. A recording while the handler runs then records
        this state (see *Recording inside a handler*). A process that has not recorded a
        snapshot in progress records it now instead (any process may record at any moment),
        so that a marker queued behind the message does not wait for the handler. The
        runtime calls it for agents whose handlers were found running at a recording before;
        it costs an encoding when the state changed since it was last encoded, and nothing
        otherwise.
        """
        newest = next(reversed(self.active), 0)
        if newest > endpoint.epoch:
            self.record(endpoint, newest, (channel, message))
        name = endpoint.name
        received = {src: ch.delivered for src, ch in endpoint.incoming.items()}
        last = self._recorded.get(name)
        if last is not None and last[1] == received and name not in self.changed:
            self._before[name] = (last[0], received)
            return
        blob = self._encode(name)
        if blob is None:  # not JSON: the recording after the handler reports it
            self._unencodable.pop(name, None)
            self._before.pop(name, None)
            return
        self._before[name] = (blob, received)

    def forget_handlers(self) -> None:
        """Drop what was kept about running handlers: the runtime restored a cut."""
        self.wanted.clear()
        self._before.clear()
        self._at_return.clear()

    def joined(self, endpoint: Endpoint, verified_hash: str) -> None:
        """A process joined: it records every snapshot in progress at its first moment.

        ``verified_hash`` is the hash of its state, already shown to survive a JSON round trip.
        """
        self._verified[endpoint.name] = verified_hash
        self.changed.add(endpoint.name)
        for progress in self.active.values():
            progress.unrecorded.add(endpoint.name)
        if self.active:
            self.record(endpoint, self.last_seq)

    def mark_changed(self, *names: str) -> None:
        """The states of ``names`` may have changed: encode them again when next recorded.

        A recording encodes an agent's state only if it may have changed since the agent's
        last recording, and otherwise reuses that recording's JSON and hash, so a snapshot
        costs what changed. An agent that received a message since (its delivered counters
        moved, whatever the handler did) counts as changed without a mark, so deliveries cost
        nothing here. The runtime marks an agent when it is registered, when a rollback, a
        resume or a fork restores the states, and after ``on_rollback``; assigning
        ``agent.state`` marks it too. Code that changes a state in place anywhere else
        (outside the agent's handlers and hooks) must mark it, with
        [`Runtime.mark_changed`][agentsnap.Runtime.mark_changed], or a later snapshot may
        record the state as it was before.
        """
        self.changed.update(names)

    # -- the protocol ---------------------------------------------------------------------

    def on_marker(self, endpoint: Endpoint, channel: Channel, seq: int) -> None:
        """``endpoint`` took a marker for snapshot ``seq`` off ``channel``."""
        if self.observer is not None and seq in self.active and seq > channel.closed:
            self.observer.snapshot_marker(self.active[seq].handle.id, channel.src, channel.dst)
        # Closed before recording: what follows the marker on it is after the cut.
        if seq > channel.closed:
            self._close(channel, seq)
        if seq > endpoint.epoch:
            self.record(endpoint, seq)

    def on_message(self, endpoint: Endpoint, channel: Channel, message: Message) -> None:
        """``endpoint`` is about to take ``message`` off ``channel`` (snapshots in progress)."""
        if self._at_return and channel.src in self._at_return:
            upto = self.wanted.get(channel.src, 0)
            if upto > endpoint.epoch and self.active:
                # The sender records as its handler returns, with this message counted as
                # sent: the receiver records first, as any process may, so that the message
                # is in flight in the cut rather than taken.
                self.record(endpoint, upto)
        epoch = message.epoch
        if epoch > channel.closed:
            # The sender recorded up to ``epoch`` before sending it: it is after those cuts.
            self._close(channel, epoch)
        closed = channel.closed
        mine = endpoint.epoch
        recorded: RecordedMessage | None = None
        for seq, progress in list(self.active.items()):
            if closed < seq <= mine:
                if recorded is None:
                    recorded = self._frozen(seq, message)
                    if recorded is None:
                        continue
                self._record_in_flight(seq, progress, channel, message, recorded)
        if epoch > mine:
            # Recorded before the message counts; it is in flight for none of these.
            self.record(endpoint, epoch)

    def record(
        self, endpoint: Endpoint, upto: int, taking: tuple[Channel, Message] | None = None
    ) -> None:
        """``endpoint`` records every snapshot in progress up to ``upto`` it has not recorded.

        ``taking`` is a message the process takes off a channel right after recording: it
        is in flight on that channel for the snapshots recorded now, if the channel is open.
        A process inside a handler records as *Recording inside a handler* says, or as soon
        as the handler returns.
        """
        self._to_record.append((endpoint, upto, taking))
        if self._recording:
            return  # the loop below gets to it
        self._recording = True
        try:
            todo = self._to_record
            while todo:
                self._record(*todo.pop(0))
        finally:
            self._recording = False
            self._to_record.clear()
            self._resting.clear()

    def _record(
        self, endpoint: Endpoint, upto: int, taking: tuple[Channel, Message] | None
    ) -> None:
        if upto <= endpoint.epoch:
            return
        name = endpoint.name
        before: tuple[StateBlob, dict[str, int]] | None = None
        held: Sequence[Message] = ()
        returned = False
        if endpoint.busy:
            if name in self._at_return:
                # Its handler asked for the snapshot: recorded as the handler returns.
                wanted = self.wanted
                wanted[name] = max(wanted.get(name, 0), upto)
                return
            handling = self.handling(endpoint) if self.handling is not None else None
            if handling is not None:
                before = self._state_before(endpoint, handling)
            if handling is None or before is None:
                wanted = self.wanted
                wanted[name] = max(wanted.get(name, 0), upto)
                return
            taking = (handling.channel, handling.message)
            held = handling.held
        if self.wanted:
            self.wanted.pop(name, None)
        if self._at_return and name in self._at_return:
            self._at_return.discard(name)
            returned = True
        due = [seq for seq in self.active if endpoint.epoch < seq <= upto]
        endpoint.epoch = upto
        if not due:
            return
        cut = self._cut(endpoint, due, before, held)
        for seq in due:
            progress = self.active.get(seq)
            if progress is None or cut is None:
                continue
            if taking is not None and taking[0].closed < seq:
                self._record_in_flight(seq, progress, *taking)
                if seq not in self.active:
                    continue
            progress.cuts[name] = cut
            progress.unrecorded.discard(name)
            if self.observer is not None:
                self.observer.snapshot_recorded(progress.handle.id, name)
            if not progress.unrecorded:
                self._all_recorded(seq, progress)
        endpoints = self.bus.endpoints
        if endpoint in self._resting:
            self._resting.discard(endpoint)  # its channels are empty: no marker on them
        else:
            for channel in endpoint.incoming.values():
                if channel.closed < upto and endpoints[channel.src].epoch > channel.closed:
                    self._close_queued(channel)  # the sender's marker is on it already
        # A marker is needed where it tells a process to record (the environment's reach
        # every agent) or where it ends the messages sent before this recording; a handler
        # running at the receiver may have a message of the old epoch in hand, which it
        # records as in flight if it records inside that handler.
        wakes = name == ENVIRONMENT
        # While no snapshot waits for its channels to close, closing one is only raising
        # its number.
        waiting = any(progress.unclosed is not None for progress in self.active.values())
        at_rest = self.at_rest if wakes else None
        for channel in endpoint.outgoing.values():
            receiver = channel.receiver
            if (
                at_rest is not None
                and receiver.epoch < upto
                and channel.in_process
                and at_rest(receiver)
            ):
                # Nothing is queued for it: the channel is empty, and the process records
                # now, as any process may at any moment, rather than at a marker.
                if waiting:
                    self._close(channel, upto)
                else:
                    channel.closed = upto
                self._to_record.append((receiver, upto, None))
                self._resting.add(receiver)
                continue
            if (
                # Only a channel kept in this process shows all it holds to its sender; one
                # whose receiver is elsewhere always takes its marker.
                channel.in_process
                and (receiver.epoch >= upto or not (wakes or receiver.busy))
                and (
                    # Every message sent was taken (and counted), or only markers are queued.
                    channel.sent == channel.delivered or not _holds_message(channel)
                )
            ):
                # Nothing sent before this recording is on the channel or in hand: its state
                # is empty for every snapshot up to ``upto``, and whatever comes through it
                # from now on carries the new epoch, which makes the receiver record first.
                if waiting:
                    self._close(channel, upto)
                else:
                    channel.closed = upto
                continue
            if not channel.in_process and not self.marker_needed(channel, upto):
                continue
            self.bus.post_marker(channel, upto)
            if receiver.epoch > channel.closed:
                self._close_queued(channel)
            elif receiver.busy:
                self._to_record.append((receiver, upto, None))
            elif returned and channel.in_process:
                # Between two handlers, so it may record now, as any process may: what the
                # returning handler sent is then in flight in the cut rather than taken
                # before the marker.
                self._to_record.append((receiver, upto, None))

    def _state_before(
        self, endpoint: Endpoint, handling: Handling
    ) -> tuple[StateBlob, dict[str, int]] | None:
        """The state ``endpoint``'s agent had before its running handler, if known."""
        name = endpoint.name
        received = {src: ch.delivered for src, ch in endpoint.incoming.items()}
        received[handling.channel.src] -= 1  # the message being handled does not count
        before = self._before.get(name)
        if before is not None and before[1] == received:
            return before
        last = self._recorded.get(name)
        if last is not None and last[1] == received and name not in self.changed:
            # Nothing was delivered to it or marked since its last recording.
            return last
        return None

    def _close_queued(self, channel: Channel) -> None:
        """Close ``channel`` up to what its receiver recorded, as far as its markers allow.

        Both ends have recorded, so the channel's state for a snapshot is what lies ahead of
        that snapshot's marker (or of the first message sent after the sender's recording):
        it is recorded now, and the receiver takes the messages later as usual.
        """
        closed = start = channel.closed
        mine = channel.receiver.epoch
        ahead: list[Message] = []
        frozen: list[RecordedMessage] = []
        for item in channel:
            marker = type(item) is Marker
            stop = item.snapshot if marker else item.epoch  # type: ignore[union-attr]
            if stop > closed:
                upto = stop if stop < mine else mine
                if ahead or self.observer is not None:  # else nothing to record or report
                    for seq, progress in list(self.active.items()):
                        if closed < seq <= upto:
                            if marker and seq == stop and self.observer is not None:
                                handle = progress.handle
                                self.observer.snapshot_marker(handle.id, channel.src, channel.dst)
                            while len(frozen) < len(ahead):  # each message copied once
                                copy = self._frozen(seq, ahead[len(frozen)])
                                if copy is None:
                                    return
                                frozen.append(copy)
                            progress.inflight.setdefault(channel, []).extend(frozen)
                closed = upto
                if closed >= mine:
                    break
            if not marker:
                ahead.append(item)  # type: ignore[arg-type]
        if closed > start:
            self._close(channel, closed)

    def _cut(
        self,
        endpoint: Endpoint,
        due: list[int],
        before: tuple[StateBlob, dict[str, int]] | None = None,
        held: Sequence[Message] = (),
    ) -> AgentCut | None:
        name = endpoint.name
        sent = {dst: ch.sent for dst, ch in endpoint.outgoing.items()}
        for message in held:
            sent[message.dst] -= 1  # numbered, but nobody can see it yet
        if before is not None:
            # Inside a handler: the state, and what it had received, before that handler.
            blob, received = before
            self._recorded[name] = before
            return self._agent_cut(name, blob, sent, received)
        received = {src: ch.delivered for src, ch in endpoint.incoming.items()}
        last = self._recorded.get(name)
        if name == ENVIRONMENT:
            blob = _EMPTY_STATE
        elif last is not None and last[1] == received and name not in self.changed:
            # Nothing delivered, restored or marked since its last recording: unchanged.
            blob = last[0]
        else:
            encoded = self._encode(name)
            if encoded is None:
                reason = self._unencodable.pop(name, f"the state of {name!r} is not JSON")
                for seq in due:
                    self.fail(seq, reason)
                return None
            blob = encoded
            self._recorded[name] = (blob, received)
            self.changed.discard(name)
        return self._agent_cut(name, blob, sent, received)

    def _agent_cut(
        self, name: str, blob: StateBlob, sent: dict[str, int], received: dict[str, int]
    ) -> AgentCut:
        """``name``'s part of a cut: its last one when nothing in it changed, else a new one."""
        last = self._cuts.get(name)
        if (
            last is not None
            and last.state_hash == blob.hash
            and last.sent == sent
            and last.received == received
        ):
            return last
        # Built from values made here, of the model's types: validating them again would
        # only copy them.
        cut = AgentCut.model_construct(
            state_json=blob.json,
            state_hash=blob.hash,
            sent=sent,
            received=received,
            state_version=1
            if name == ENVIRONMENT
            else state_version(type(self._agents[name].state)),
        )
        self._cuts[name] = cut
        return cut

    def _encode(self, name: str) -> StateBlob | None:
        """The agent's state encoded now, or ``None`` (the reason kept) when it is not JSON.

        Shown to survive a JSON round trip once per change.
        """
        state = self._agents[name].state
        try:
            # Only a state that changed since it was last verified pays for the check.
            blob = encode_checked(name, state, self._verified.get(name))
            self._verified[name] = blob.hash
        except StateNotSerializable as exc:
            self._unencodable[name] = str(exc)
            return None
        return blob

    def _record_in_flight(
        self,
        seq: int,
        progress: _Progress,
        channel: Channel,
        message: Message,
        recorded: RecordedMessage | None = None,
    ) -> None:
        if recorded is None:
            recorded = self._frozen(seq, message)
            if recorded is None:
                return
        progress.inflight.setdefault(channel, []).append(recorded)
        self.in_flight_recorded(seq, channel, recorded)

    def in_flight_recorded(self, seq: int, channel: Channel, message: RecordedMessage) -> None:
        """``message`` was recorded in flight on ``channel`` for snapshot ``seq``.

        For subclasses to override (the base does nothing): called for each message its
        receiver takes off ``channel`` that is in flight for ``seq`` (taken after the
        receiver recorded ``seq``, before ``channel`` was closed for it; or the message a
        handler runs on as its process records inside it), and by ``capture`` for the
        messages queued on a quiet bus. The messages a channel in this process holds when
        both its ends have recorded are recorded all at once as it is closed, without it.
        """

    def _frozen(self, seq: int, message: Message) -> RecordedMessage | None:
        """``message`` as a snapshot records it, or ``None`` (snapshot ``seq`` fails).

        Its payload is a copy frozen now: the receiver may change the payload while handling
        it. ``None`` when the payload is not JSON.
        """
        payload = message.payload
        if payload is not None and type(payload) not in _IMMUTABLE:
            try:
                payload = orjson.loads(orjson.dumps(payload))
            except TypeError:  # beyond what orjson writes (integers over 64 bits)
                try:
                    payload = json.loads(canonical_json(message.payload))
                except (TypeError, ValueError) as exc:
                    self.fail(seq, f"message {message.id} in flight is not JSON: {exc}")
                    return None
        # Sent through the bus, so the fields are valid already.
        return RecordedMessage.model_construct(
            id=message.id,
            seq=message.seq,
            kind=message.kind,
            payload=payload,
            headers=dict(message.headers),
            epoch=message.epoch,
        )

    def _all_recorded(self, seq: int, progress: _Progress) -> None:
        progress.unclosed = {ch for ch in self.recording_channels() if ch.closed < seq}
        if not progress.unclosed:
            self._complete(seq)

    def channel_closing(self, channel: Channel, upto: int) -> None:
        """``channel`` is being closed for the snapshots above ``channel.closed`` up to ``upto``.

        For subclasses to override (the base does nothing): called before ``channel.closed``
        is raised and before any snapshot completes because of it, so ``active`` still holds
        them. Where no snapshot in progress waits for its channels to close, a channel in
        this process found empty of the old epoch (and every channel, in ``capture``) has
        ``closed`` raised without this call.
        """

    def marker_needed(self, channel: Channel, upto: int) -> bool:
        """Whether a recording up to ``upto`` sends its marker on ``channel``.

        Asked, as the sender of ``channel`` records, for a channel whose items are not all in
        this process (``in_process`` false), where the base always sends one. For subclasses
        to override: a coordinator whose receivers learn where the channel's snapshots end
        in another way (the count of messages its sender had sent, see
        [`PartCoordinator`][agentsnap.distributed.PartCoordinator]) skips it.
        """
        return True

    def close(self, channel: Channel, upto: int) -> None:
        """Close ``channel`` for every snapshot up to ``upto``: nothing more is in flight on it.

        For subclasses that learn where a channel's messages in flight end otherwise than by
        its marker: the messages its receiver took after recording and before this are its
        state in the cut. Does nothing when the channel is closed up to ``upto`` already.
        """
        if upto > channel.closed:
            self._close(channel, upto)

    def _close(self, channel: Channel, upto: int) -> None:
        self.channel_closing(channel, upto)
        before = channel.closed
        channel.closed = upto
        complete: list[int] = []
        for seq, progress in self.active.items():
            if before < seq <= upto:
                unclosed = progress.unclosed
                if unclosed is not None:
                    unclosed.discard(channel)
                    if not unclosed:
                        complete.append(seq)
        for seq in complete:
            self._complete(seq)

    # -- completion -----------------------------------------------------------------------

    def _complete(self, seq: int) -> None:
        self.store_complete(seq, self.active.pop(seq))

    def store_complete(self, seq: int, progress: SnapshotProgress) -> None:
        """Hand on snapshot ``seq``, complete: every process recorded it, every channel closed.

        It is out of ``active`` already. The base checks that the cut is consistent (or
        fails it, through
        [`store_failed`][agentsnap.snapshot.SnapshotCoordinator.store_failed]) and writes
        it to the store. For subclasses to override: a coordinator recording part of a run
        writes its part instead.
        """
        channels = [
            ChannelRecord(src=ch.src, dst=ch.dst, messages=messages)
            for ch, messages in sorted(
                progress.inflight.items(), key=lambda item: (item[0].src, item[0].dst)
            )
        ]
        snapshot = self._snapshot(
            seq,
            progress,
            status=SnapshotStatus.COMPLETE,
            completed_at=utcnow(),
            agents=dict(sorted(progress.cuts.items())),
            channels=channels,
        )
        problems = cut_problems(snapshot)
        if problems:
            # Never store a cut a rollback or a resume could not stand on.
            reason = "the recorded cut is not consistent: " + "; ".join(problems[:5])
            logger.error("snapshot %d: %s", seq, reason)
            self.store_failed(seq, progress, reason)
            return
        logger.debug("snapshot %d complete", seq)
        self.newest = snapshot
        self._write_finished(snapshot, progress.handle)

    def fail(self, seq: int, reason: str) -> None:
        """Abandon snapshot ``seq``: it stays failed; other snapshots are unaffected."""
        progress = self.active.pop(seq, None)
        if progress is None:
            return
        logger.warning("snapshot %d failed: %s", seq, reason)
        self.store_failed(seq, progress, reason)

    def _snapshot(self, seq: int, progress: SnapshotProgress, **outcome: Any) -> Snapshot:
        handle = progress.handle
        return Snapshot(
            id=handle.id,
            run_id=self.run_id,
            seq=seq,
            initiator=handle.initiator,
            started_at=progress.started_at,
            **outcome,
        )

    def store_failed(self, seq: int, progress: SnapshotProgress, error: str) -> None:
        """Hand on snapshot ``seq``, failed because of ``error``; it is out of ``active``.

        The base writes it to the store as failed. For subclasses to override: a
        coordinator recording part of a run writes its part with the error instead.
        """
        snapshot = self._snapshot(seq, progress, status=SnapshotStatus.FAILED, error=error)
        self._write_finished(snapshot, progress.handle)

    def _write_finished(self, snapshot: Snapshot, handle: SnapshotHandle) -> None:
        work: Awaitable[None] = self._write(snapshot, handle)
        if self.observer is not None:
            work = self.observer.snapshot_written(snapshot, handle, work)
        self.spawn_write(work)

    def abort_all(self, reason: str) -> None:
        """Fail every snapshot in progress (the runtime is closing or rolling back)."""
        for seq in list(self.active):
            self.fail(seq, reason)

    @property
    def writing(self) -> int:
        """How many finished snapshots are being written to the store now."""
        return len(self._tasks)

    def spawn_write(self, work: Awaitable[None]) -> None:
        """Run ``work``, the writing of a finished snapshot, in the background.

        [`drain`][agentsnap.snapshot.SnapshotCoordinator.drain] waits for it and
        [`writing`][agentsnap.snapshot.SnapshotCoordinator.writing] counts it; for
        subclasses' ``store_complete`` and ``store_failed``, which must not block.
        """
        task: asyncio.Task[None] = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _write(self, snapshot: Snapshot, handle: SnapshotHandle) -> None:
        try:
            await self._persist(snapshot)
        except Exception as exc:
            reason = f"the store could not write it: {type(exc).__name__}: {exc}"
            logger.exception("snapshot %d (%s) was not written", snapshot.seq, snapshot.id)
            handle.resolve(None, SnapshotFailed(snapshot.id, reason))
            if snapshot.status is SnapshotStatus.COMPLETE:
                await self._record_failure(snapshot, reason)
            return
        if snapshot.status is SnapshotStatus.COMPLETE:
            self.written(snapshot)
            handle.resolve(snapshot, None)
        else:
            handle.resolve(None, SnapshotFailed(snapshot.id, snapshot.error or "unknown"))

    async def _record_failure(self, snapshot: Snapshot, reason: str) -> None:
        """Leave a failed record in place of a snapshot whose write failed, if the store can.

        The write was one transaction, so nothing of the snapshot is stored; the record says
        why it is missing. When the store is down this fails too, and the log says so.
        """
        failed = snapshot.model_copy(
            update={"status": SnapshotStatus.FAILED, "error": reason, "agents": {}, "channels": []}
        )
        try:
            await self._persist(failed)
        except Exception as exc:  # already reported above; keep the run going
            logger.warning(
                "snapshot %d (%s) could not be marked failed either: %s: %s",
                snapshot.seq,
                snapshot.id,
                type(exc).__name__,
                exc,
            )

    # -- rollback targets -----------------------------------------------------------------

    max_targets = 100
    """How many of the newest complete snapshots are kept as rollback targets."""

    def written(self, snapshot: Snapshot) -> None:
        """``snapshot`` is complete and in the store: a cut the run can go back to."""
        self._targets[snapshot.seq] = (
            snapshot.id,
            {name: cut.sent for name, cut in snapshot.agents.items()},
        )
        while len(self._targets) > self.max_targets:
            del self._targets[min(self._targets)]
        if self.latest is None or snapshot.seq > self.latest.seq:
            self.latest = snapshot

    def oldest_target(self) -> tuple[int, dict[str, int]] | None:
        """Number of the oldest rollback target and what the environment had sent by then."""
        if not self._targets:
            return None
        seq = min(self._targets)
        return seq, self._targets[seq][1].get(ENVIRONMENT, {})

    def target_before(self, output: Message | None) -> str | None:
        """Id of the newest rollback target whose cut precedes ``output`` (or the newest)."""
        for seq in sorted(self._targets, reverse=True):
            snapshot_id, sent = self._targets[seq]
            if output is None or sent.get(output.src, {}).get(output.dst, 0) < output.seq:
                return snapshot_id
        return None

    def target_before_work_of(self, agent: str, sent: int) -> str | None:
        """Id of the newest rollback target taken before ``agent`` had sent ``sent`` messages.

        That is the newest cut from before the agent's latest output, for a critic that
        rejects the agent's work without naming a message; ``None`` when there is none.
        """
        for seq in sorted(self._targets, reverse=True):
            snapshot_id, counters = self._targets[seq]
            if sum(counters.get(agent, {}).values()) < sent:
                return snapshot_id
        return None

    def restored(self, snapshot: Snapshot) -> None:
        """The run went back to ``snapshot``: snapshots taken after it are another future."""
        self.forget_handlers()
        for seq in [seq for seq in self._targets if seq > snapshot.seq]:
            del self._targets[seq]
        self.written(snapshot)
        self.latest = self.newest = snapshot

    async def drain(self) -> None:
        """Wait until every completed or failed snapshot has been handed to the store."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
