"""Recording one worker's part of each snapshot: Chandy-Lamport for the processes hosted here.

A [`PartCoordinator`][agentsnap.distributed.PartCoordinator] is a
[`SnapshotCoordinator`][agentsnap.snapshot.SnapshotCoordinator] that knows which processes of
the run it hosts (``local``). It runs the protocol for them only:

- it learns of snapshot ``k`` from the first marker ``k`` (or message of epoch ``>= k``) that
  reaches one of its processes, as any process of the protocol does; snapshots are numbered
  by the run's coordinator alone, so every worker agrees on the numbers;
- a local process records at that first marker, and sends markers on its outgoing channels
  (an [`OutgoingChannel`][agentsnap.jetstream.OutgoingChannel] publishes the marker in band):
  on a channel to another process only if a message was numbered on it since the process's
  previous recording ([`marker_needed`][agentsnap.distributed.PartCoordinator.marker_needed]);
  the environment's channels always take theirs;
- once every local process has recorded ``k``, the worker tells the other processes what
  its agents' cuts say they had sent on each channel to another process that ever carried a
  message (``tell``, one notice per snapshot);
- a channel into a local process from another process
  ([`IncomingChannel`][agentsnap.jetstream.IncomingChannel]) is closed for ``k`` when its
  marker ``k`` (or a message sent after its sender recorded ``k``) is taken off it, or **by
  count**: once its receiver took as many messages off it as a notice of ``k`` (or of a
  later snapshot) says its sender had sent
  ([`heard`][agentsnap.distributed.PartCoordinator.heard]). The in-process shortcut that
  closes a channel when both ends recorded applies to channels whose two ends run here,
  since a remote sender's recording is not seen here. Its messages in flight are recorded
  as their receiver takes them, as for any channel, together with their **stream-sequence
  range**: from the first of them to the item that closed the channel, or to the last of
  them when a count closed it ([`ChannelOffsets`][agentsnap.distributed.ChannelOffsets]);
- once every local process has recorded ``k`` and every channel into them is closed for
  ``k``, the part (cuts, channels in flight, offsets) is handed to ``write`` (the store, in
  one transaction); a part that cannot be recorded (a state that is not JSON) is written with
  its error, which fails the snapshot.

A channel between a local process and another one is made on first use: by its sender's
first message, at its receiver by the first item that comes through it, or by a notice that
names it with messages sent. So a worker holds the channels its agents used, not one per
pair of agents. The receiver's recording of ``k`` therefore also waits, per agent of the
other processes, for a notice of ``k`` (or later) naming it: the notice names each channel
that carried messages before that agent recorded, and the channel, made then if it was not
yet, is closed by count as above; any other channel from that agent carried nothing before
the recording, and what comes through it later has an epoch that closes ``k`` at once.
Why a count closes a channel where its marker would have: the concepts page *Channel state
as offsets*, *Markers only where messages went*.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping
from typing import TYPE_CHECKING, Any, cast

from agentsnap.exceptions import ConfigurationError
from agentsnap.handles import SnapshotHandle
from agentsnap.jetstream import IncomingChannel, JetStreamTransport, OutgoingChannel
from agentsnap.jetstream.codec import channel_subject
from agentsnap.messages import ENVIRONMENT
from agentsnap.records import ChannelOffsets, ChannelRecord, SnapshotPart
from agentsnap.snapshot import SnapshotCoordinator

if TYPE_CHECKING:
    from agentsnap.bus import Bus, Channel, Endpoint
    from agentsnap.messages import Message
    from agentsnap.records import RecordedMessage
    from agentsnap.snapshot import SnapshotProgress
    from agentsnap.state import HasState

__all__ = ["PartCoordinator", "WritePart"]

logger = logging.getLogger("agentsnap.distributed")

WritePart = Callable[[SnapshotPart], Awaitable[None]]
"""Writes a part (to the store), in one transaction."""


class _Range:
    """A channel's range in flight for one snapshot, as it is recorded."""

    __slots__ = ("after", "end", "first", "seqs")

    def __init__(self, first: int, after: str | None, end: int = 0) -> None:
        self.first = first
        self.after = after
        self.end = end  # the item that closed the channel (0: not yet)
        self.seqs: list[int] = []


class _Unheard:
    """Stands for every channel from one agent of another process, in a recording.

    Closed for ``k`` once a notice of ``k`` (or later) named that agent.
    """

    __slots__ = ("closed", "src")

    def __init__(self, src: str) -> None:
        self.src = src
        self.closed = 0


class PartCoordinator(SnapshotCoordinator):
    """Runs the snapshot protocol for the processes one worker hosts, and writes its parts.

    Args:
        bus: The worker's bus (every process of the run on it, most of them remote).
        agents: The agents hosted here, by name.
        run_id: The run.
        worker: The worker's name, unique within the run: its parts are stored under it.
        local: The processes hosted here (the agents, and ``$env`` in the coordinator).
        write: Writes a part; a part that fails to be written is logged, and the run's
            coordinator fails the snapshot when the part does not come.
    """

    def __init__(
        self,
        bus: Bus,
        agents: Mapping[str, HasState],
        run_id: str,
        *,
        worker: str,
        local: Collection[str],
        write: WritePart,
    ) -> None:
        super().__init__(bus, agents, run_id, self._unused)
        self.worker = worker
        self.local = frozenset(local)
        self.parts_written = 0
        """How many parts this worker has written."""
        self._write_part = write
        # Per snapshot in progress: per channel from another process, its range in flight.
        self._ranges: dict[int, dict[IncomingChannel, _Range]] = {}
        self._early = 0  # the stream sequence of a marker closing its channel before taken
        self.tell: Callable[[dict[str, Any]], None] | None = None
        """Sends a notice of a recording to every other process of the run (the transport's
        [`tell_cut`][agentsnap.jetstream.JetStreamTransport.tell_cut]), whose
        [`heard`][agentsnap.distributed.PartCoordinator.heard] takes it in. While ``None``,
        every channel to another process takes its marker at every recording."""
        self.markers_skipped = 0
        """Markers not sent: channels to another process idle since their sender's last
        recording, closed by count instead."""
        # Per channel to another process, how many messages its sender had numbered at its
        # last recording.
        self._numbered: dict[tuple[str, str], int] = {}
        # Snapshots whose recording here is not yet told to the other processes, with how
        # many processes record them here.
        self._untold: dict[int, int] = {}
        # Per channel from another process: the snapshot a notice closes it up to, once its
        # receiver took that many messages off it.
        self._counts: dict[IncomingChannel, tuple[int, int]] = {}
        self._counting = False  # a channel closes by count: no item of its own closes it
        self._receivers = sorted(name for name in self.local if name != ENVIRONMENT)
        # Per agent of another process, what its channels into the agents here wait for.
        self._unheard: dict[str, _Unheard] | None = None

    @staticmethod
    async def _unused(_snapshot: Any) -> None:  # pragma: no cover - parts are written instead
        raise AssertionError("a worker writes parts, never whole snapshots")

    def recording_processes(self) -> list[str]:
        """The processes hosted here: they alone record here."""
        return [name for name in self.bus.endpoints if name in self.local]

    def recording_channels(self) -> Iterable[Channel]:
        """The channels into the processes hosted here: the others are recorded elsewhere.

        With notices (``tell``), also one stand-in per agent of another process, closed
        by its notice: a channel from it not made yet may still carry messages of the cut.
        """
        local = self.local
        channels: list[Channel] = [ch for ch in self.bus.channels.values() if ch.dst in local]
        if self.tell is not None and self._receivers:
            channels.extend(cast("Iterable[Channel]", self._stand_ins().values()))
        return channels

    def _stand_ins(self) -> dict[str, _Unheard]:
        unheard = self._unheard
        if unheard is None:  # made once every process of the run is on the bus
            local = self.local
            unheard = self._unheard = {
                name: _Unheard(name)
                for name in self.bus.endpoints
                if name not in local and name != ENVIRONMENT
            }
        return unheard

    # -- learning of snapshots --------------------------------------------------------------

    def learn(self, upto: int) -> None:
        """Snapshots up to ``upto`` were begun by the run's coordinator: record them here."""
        processes = self.recording_processes()
        while self.last_seq < upto:
            self.last_seq = seq = self.last_seq + 1
            self.start_recording(SnapshotHandle("", seq, ENVIRONMENT), processes)
            self._ranges[seq] = {}

    def on_marker(self, endpoint: Endpoint, channel: Channel, seq: int) -> None:  # noqa: D102
        if seq > self.last_seq:
            self.learn(seq)
        super().on_marker(endpoint, channel, seq)

    def marker_arrived(self, channel: Channel, seq: int) -> None:
        """A marker for snapshot ``seq`` arrived on ``channel``, not taken yet.

        A local process inside a handler records now, as any process may at any moment: from
        before that handler when it made nothing visible yet (*Recording inside a handler*),
        else as it returns. What it takes off its channels before their markers is then in
        flight in the cut, as for any process that recorded before its markers came. A
        marker with nothing ahead of it on its channel is in effect taken at once: the
        channel closes, with nothing in flight after what the process took already, so the
        snapshot need not wait for the handler. A process between two handlers takes the
        marker soon enough.
        """
        receiver = channel.receiver
        if not receiver.busy or receiver.name not in self.local or seq <= channel.closed:
            return
        if seq > self.last_seq:
            self.learn(seq)
        if seq > receiver.epoch:
            self.record(receiver, seq)
        if receiver.epoch >= seq and len(channel) == 1 and type(channel) is IncomingChannel:
            self._early = channel.next_seq  # the marker's place ends the channel's ranges
            try:
                self.on_marker(receiver, channel, seq)
            finally:
                self._early = 0

    def on_message(self, endpoint: Endpoint, channel: Channel, message: Message) -> None:  # noqa: D102
        if message.epoch > self.last_seq:
            self.learn(message.epoch)
        counted = self._counts.get(channel) if self._counts else None  # type: ignore[call-overload]
        if counted is None or message.seq < counted[1]:
            super().on_message(endpoint, channel, message)
            return
        upto = counted[0]
        if endpoint.epoch < upto and upto > channel.closed:
            # The last message its sender had sent at its recording: the receiver records
            # first (as any process may), so that it is in flight rather than taken.
            self.record(endpoint, upto)
        super().on_message(endpoint, channel, message)
        self._close_counted(channel, upto)  # type: ignore[arg-type]

    # -- channels closed by count -----------------------------------------------------------

    def marker_needed(self, channel: Channel, upto: int) -> bool:
        """Only a channel that carried a message since its sender's last recording takes one.

        A channel to another process on which nothing was numbered since its sender last
        recorded is closed by count at its receiver (see the module's description); the
        environment's channels always take theirs, since they tell each agent to record.
        """
        if self.tell is None or channel.src == ENVIRONMENT or type(channel) is not OutgoingChannel:
            return True
        key = (channel.src, channel.dst)
        numbered = channel.sent
        before = self._numbered.get(key, 0)
        self._numbered[key] = numbered
        if numbered != before:
            return True
        self.markers_skipped += 1
        return False

    def start_recording(self, handle: SnapshotHandle, processes: Iterable[str]) -> None:  # noqa: D102
        processes = list(processes)
        super().start_recording(handle, processes)
        if self.tell is not None and processes:
            self._untold[handle.seq] = len(processes)

    def record(  # noqa: D102
        self, endpoint: Endpoint, upto: int, taking: tuple[Channel, Message] | None = None
    ) -> None:
        super().record(endpoint, upto, taking)
        if self._untold:
            for seq, expected in list(self._untold.items()):
                progress = self.active.get(seq)
                if progress is None:
                    self._untold.pop(seq, None)  # failed (a completed one was told)
                elif len(progress.cuts) >= expected:
                    self._tell(seq, progress)

    def _tell(self, seq: int, progress: SnapshotProgress) -> None:
        """Tell the other processes how many messages each agent here had sent at ``seq``.

        Per agent hosted here, the count of each channel to another process that ever
        carried a message: those it sent on from this worker, and those its cut counts
        messages on, which a restore gave it (sent before the cut, maybe by another worker
        that hosted it, or while the receiver ran here). Any other channel from it had
        carried none.
        """
        self._untold.pop(seq, None)
        tell = self.tell
        if tell is None or not self._receivers:
            return
        transport = self.bus.transport
        used = transport.used if isinstance(transport, JetStreamTransport) else {}
        local = self.local
        sent: dict[str, dict[str, int]] = {}
        for name, cut in progress.cuts.items():
            if name == ENVIRONMENT:
                continue
            counts = cut.sent
            told = {dst: counts.get(dst, 0) for dst in used.get(name, ())}
            told.update({dst: n for dst, n in counts.items() if n and dst not in local})
            sent[name] = told
        tell({"cut": seq, "worker": self.worker, "sent": sent})

    def heard(self, notice: Mapping[str, Any]) -> None:
        """Another process recorded snapshot ``notice["cut"]``: close its channels by count.

        Each channel from an agent the notice names into an agent hosted here closes, for
        every snapshot up to that one, once its receiver took as many messages off it as
        its sender had sent at that recording (at once when it had).
        """
        try:
            upto = int(notice["cut"])
            sent: Mapping[str, Mapping[str, int]] = notice["sent"]
            generation = int(notice.get("generation", 0))
        except (KeyError, TypeError, ValueError):
            logger.error("%s: dropped a notice that is not one: %.200r", self.worker, notice)
            return
        transport = self.bus.transport
        if isinstance(transport, JetStreamTransport) and generation != transport.generation:
            return  # from before a rollback (or after one not carried out here yet)
        if upto > self.last_seq:
            self.learn(upto)
        if not self.active or next(iter(self.active)) > upto:
            return  # nothing in progress here that it closes
        endpoints = self.bus.endpoints
        local = self.local
        unheard = self._stand_ins() if self._receivers else {}
        for src, counts in sent.items():
            sender = endpoints.get(src)
            if sender is None or src in local:
                continue
            outgoing = sender.outgoing  # here: the channels from ``src`` into local agents
            for dst, count in counts.items():
                if count and dst in local and dst not in outgoing and dst != ENVIRONMENT:
                    self.bus.channel(sender, dst)  # messages of the cut may be on it
            for channel in list(outgoing.values()):
                if type(channel) is not IncomingChannel or channel.closed >= upto:
                    continue
                self._await(channel, upto)
                count = counts.get(channel.dst, 0)
                if channel.delivered >= count:
                    self._close_counted(channel, upto)
                    continue
                pending = self._counts.get(channel)
                if pending is None or pending[0] < upto:
                    self._counts[channel] = (upto, count)
            stand_in = unheard.get(src)
            if stand_in is not None and stand_in.closed < upto:
                self._close(cast("Channel", stand_in), upto)

    def _await(self, channel: IncomingChannel, upto: int) -> None:
        """Have the snapshots up to ``upto`` wait for ``channel`` too (made after they began)."""
        for seq, progress in self.active.items():
            if seq > upto:
                continue
            unclosed = progress.unclosed
            if unclosed is not None and channel.closed < seq:
                unclosed.add(channel)

    def _close_counted(self, channel: IncomingChannel, upto: int) -> None:
        """Close ``channel`` up to ``upto``: its receiver took all its sender had sent then."""
        self._counts.pop(channel, None)
        if upto <= channel.closed:
            return
        receiver = channel.receiver
        if receiver.epoch < upto:
            # Recorded first: a handler running on the last of those messages may record
            # inside it, with that message in flight on the channel (still open).
            self.record(receiver, upto)
        self._counting = True
        try:
            self.close(channel, upto)
        finally:
            self._counting = False

    def forget_handlers(self) -> None:  # noqa: D102
        super().forget_handlers()
        self._counts.clear()  # a restore: the counts told before it are of another timeline
        for unheard in (self._unheard or {}).values():
            unheard.closed = 0

    def begin(
        self, initiator: Endpoint | None = None, *, at_return: bool = False
    ) -> SnapshotHandle:
        """Begin a snapshot here: only the process hosting the environment numbers them.

        Raises:
            ConfigurationError: This process does not host the environment (an agent's
                ``ctx.snapshot()`` in a worker): ask the coordinator with
                [`Worker.request_snapshot`][agentsnap.distributed.Worker.request_snapshot].
        """
        if ENVIRONMENT not in self.local:
            raise ConfigurationError(
                "a worker does not begin snapshots: the run's coordinator numbers them "
                "(ask it with Worker.request_snapshot())"
            )
        handle = super().begin(initiator, at_return=at_return)
        self._ranges.setdefault(handle.seq, {})
        return handle

    # -- channels from other processes ------------------------------------------------------

    def in_flight_recorded(self, seq: int, channel: Channel, message: RecordedMessage) -> None:
        """A message from another process in flight for ``seq``: its stream sequence counts."""
        if type(channel) is IncomingChannel:
            ranges = self._ranges.setdefault(seq, {})
            found = ranges.get(channel)
            # The message was just taken off the channel: ``took`` is its stream sequence.
            if found is None:
                ranges[channel] = _Range(channel.took or channel.taken, channel.took_after)
                ranges[channel].seqs.append(channel.took)
            else:
                found.seqs.append(channel.took)

    def channel_closing(self, channel: Channel, upto: int) -> None:
        """A channel from another process closes: the item closing it ends its ranges."""
        if type(channel) is IncomingChannel:
            counting = self._counting
            # The item closing it was just taken off it, or is the marker next on it; closed
            # by count, the range ends after the last message taken.
            end = channel.taken + 1 if counting else self._early or channel.taken
            for seq, ranges in self._ranges.items():
                if channel.closed < seq <= upto and seq in self.active:
                    found = ranges.get(channel)
                    if found is None:
                        if not counting:  # closed by count with nothing in flight: no range
                            ranges[channel] = _Range(end, None, end)
                    elif not found.end:
                        found.end = end

    # -- parts ------------------------------------------------------------------------------

    def store_complete(self, seq: int, progress: SnapshotProgress) -> None:
        """Write this worker's part of snapshot ``seq``: its cuts, channels and offsets."""
        if seq in self._untold:
            self._tell(seq, progress)
        ranges = self._ranges.pop(seq, {})
        channels = [
            ChannelRecord(src=ch.src, dst=ch.dst, messages=messages)
            for ch, messages in sorted(
                progress.inflight.items(), key=lambda item: (item[0].src, item[0].dst)
            )
        ]
        offsets = [
            ChannelOffsets(
                src=ch.src,
                dst=ch.dst,
                subject=channel_subject(self.run_id, ch.src, ch.dst),
                first_seq=found.first,
                end_seq=found.end,
                count=len(found.seqs),
                after=found.after,
                seqs=found.seqs,
            )
            for ch, found in sorted(ranges.items(), key=lambda item: (item[0].src, item[0].dst))
        ]
        part = SnapshotPart(
            run_id=self.run_id,
            seq=seq,
            worker=self.worker,
            agents=dict(sorted(progress.cuts.items())),
            channels=channels,
            offsets=offsets,
        )
        logger.debug("%s: part of snapshot %d recorded", self.worker, seq)
        self.spawn_write(self._write_part_now(part))

    def store_failed(self, seq: int, progress: SnapshotProgress, error: str) -> None:
        """Write a part saying why snapshot ``seq`` failed here, to fail it at once.

        A state that is not JSON, or the worker is closing: the run's coordinator fails the
        snapshot as the part comes.
        """
        self._ranges.pop(seq, None)
        self._untold.pop(seq, None)
        part = SnapshotPart(run_id=self.run_id, seq=seq, worker=self.worker, error=error)
        self.spawn_write(self._write_part_now(part))

    async def _write_part_now(self, part: SnapshotPart) -> None:
        try:
            await self._write_part(part)
        except Exception:
            logger.exception("%s: part of snapshot %d was not written", self.worker, part.seq)
            return
        self.parts_written += 1
