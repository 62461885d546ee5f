"""Recording one worker's part of each snapshot: Chandy-Lamport for the processes hosted here.

A [`PartCoordinator`][agentsnap.distributed.PartCoordinator] is a
[`SnapshotCoordinator`][agentsnap.snapshot.SnapshotCoordinator] that knows which processes of
the run it hosts (``local``). It runs the protocol for them only:

- it learns of snapshot ``k`` from the first marker ``k`` (or message of epoch ``>= k``) that
  reaches one of its processes, as any process of the protocol does; snapshots are numbered
  by the run's coordinator alone, so every worker agrees on the numbers;
- a local process records at that first marker, and sends markers on every outgoing channel,
  whether its receiver is local or in another process (an
  [`OutgoingChannel`][agentsnap.jetstream.OutgoingChannel] publishes the marker in band);
- a channel into a local process from another process
  ([`IncomingChannel`][agentsnap.jetstream.IncomingChannel]) is closed for ``k`` only when its
  marker ``k`` (or a message sent after its sender recorded ``k``) is taken off it: the
  in-process shortcut that closes a channel when both ends recorded applies to channels
  whose two ends run here, since a remote sender's recording is not seen here. Its messages
  in flight are recorded as their receiver takes them, as for any channel, together with
  their **stream-sequence range**: from the first of them to the item that closed the channel
  ([`ChannelOffsets`][agentsnap.distributed.ChannelOffsets]);
- once every local process has recorded ``k`` and every channel into them is closed for
  ``k``, the part (cuts, channels in flight, offsets) is handed to ``write`` (the store, in
  one transaction); a part that cannot be recorded (a state that is not JSON) is written with
  its error, which fails the snapshot.

Every channel between a local process and another process exists from the start (the worker
makes them), so that a marker goes on every channel a message could take: a channel made
only at its first message would be unknown to the receiver's recording before it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from agentsnap.exceptions import ConfigurationError
from agentsnap.handles import SnapshotHandle
from agentsnap.jetstream import IncomingChannel
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

    @staticmethod
    async def _unused(_snapshot: Any) -> None:  # pragma: no cover - parts are written instead
        raise AssertionError("a worker writes parts, never whole snapshots")

    def recording_processes(self) -> list[str]:
        """The processes hosted here: they alone record here."""
        return [name for name in self.bus.endpoints if name in self.local]

    def recording_channels(self) -> Iterable[Channel]:
        """The channels into the processes hosted here: the others are recorded elsewhere."""
        local = self.local
        return [ch for ch in self.bus.channels.values() if ch.dst in local]

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
        super().on_message(endpoint, channel, message)

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
            # The item closing it was just taken off it, or is the marker next on it.
            end = self._early or channel.taken
            for seq, ranges in self._ranges.items():
                if channel.closed < seq <= upto and seq in self.active:
                    found = ranges.get(channel)
                    if found is None:
                        ranges[channel] = _Range(end, None, end)
                    elif not found.end:
                        found.end = end

    # -- parts ------------------------------------------------------------------------------

    def store_complete(self, seq: int, progress: SnapshotProgress) -> None:
        """Write this worker's part of snapshot ``seq``: its cuts, channels and offsets."""
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
        part = SnapshotPart(run_id=self.run_id, seq=seq, worker=self.worker, error=error)
        self.spawn_write(self._write_part_now(part))

    async def _write_part_now(self, part: SnapshotPart) -> None:
        try:
            await self._write_part(part)
        except Exception:
            logger.exception("%s: part of snapshot %d was not written", self.worker, part.seq)
            return
        self.parts_written += 1
