"""The JetStream transport: the bus's channels carried between processes on NATS JetStream."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections import deque
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

import orjson
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from agentsnap.bus import Bus, Channel, Endpoint, Item, LocalChannel, check_agent_name
from agentsnap.exceptions import ConfigurationError, PayloadNotSerializable
from agentsnap.jetstream.codec import (
    Envelope,
    cuts_subject,
    decode,
    decode_token,
    encode,
    inbox_subject,
)
from agentsnap.jetstream.link import JetStreamLink, Published
from agentsnap.limits import check_run_id
from agentsnap.messages import ENVIRONMENT, Marker, Message

if TYPE_CHECKING:
    from nats.aio.subscription import Subscription
    from nats.js import JetStreamContext

__all__ = ["ChannelOffset", "IncomingChannel", "JetStreamTransport", "OutgoingChannel"]

log = logging.getLogger("agentsnap.jetstream")

_HOLDBACK_MAX = 65536
"""Items a channel holds back waiting for the one before them, at most."""


class ChannelOffset(NamedTuple):
    """Where a channel's items start in the stream: what a snapshot records per channel.

    Attributes:
        stream_seq: The stream sequence to consume from.
        after: The id of the item that came before, on the channel, the first item to take
            from there; ``None`` to take whatever comes first.
    """

    stream_seq: int
    after: str | None = None


class _Ends:
    """What every channel here is before its direction: its two ends and its counters.

    The fields of a [`Channel`][agentsnap.bus.Channel]: ``sent`` and ``delivered`` start at
    0; ``closed`` is the count its sender's last recording closed it at.
    """

    __slots__ = ("closed", "delivered", "dst", "receiver", "sent", "src")

    def __init__(self, src: str, dst: str, receiver: Endpoint, closed: int) -> None:
        self.src = src
        self.dst = dst
        self.receiver = receiver
        self.sent = 0
        self.delivered = 0
        self.closed = closed


class OutgoingChannel(_Ends):
    """A channel whose receiver is in another process: what is appended goes to the stream.

    ``append`` encodes the item at once (with the transport's current generation) and queues
    it on the link's publisher; nothing stays here, so the channel is always empty to this
    process (its items in flight are in the stream, and the receiver's to record).

    Attributes:
        subject: The channel's subject.
        published: How far publishing got: items unconfirmed, newest stream sequence stored.
        used: A message was ever sent on it.
    """

    __slots__ = ("_last_seq", "_prev", "_transport", "published", "subject", "used")

    in_process: ClassVar[bool] = False
    """Its receiver is in another process: its sender cannot see what it holds."""

    def __init__(
        self, transport: JetStreamTransport, src: str, dst: str, receiver: Endpoint, closed: int
    ) -> None:
        super().__init__(src, dst, receiver, closed)
        self.published = Published()
        self._transport = transport
        self._prev: str | None = None
        self._last_seq = 0
        self.subject = ""
        self.used = False

    def append(self, item: Item, /) -> None:
        """Publish ``item`` after everything appended before it.

        Raises:
            PayloadNotSerializable: The item is larger than the server takes.
            TransportError: The link failed for good, or is closed.
        """
        transport = self._transport
        if type(item) is Message:
            self._last_seq = item.seq
            if not self.used:
                self.used = True
                transport.used.setdefault(self.src, set()).add(self.dst)
        else:
            transport.markers += 1
        subject, headers, body, msg_id = encode(
            transport.run, item, transport.generation, self._last_seq, self._prev
        )
        link = transport.link
        size = len(body) + sum(len(k) + len(v) + 4 for k, v in headers.items())
        if size > link.max_payload:
            if type(item) is Message and item.seq == self.sent:
                self.sent -= 1  # not sent: the next message takes its number
            raise PayloadNotSerializable(
                self.src,
                self.dst,
                f"it is {size} bytes on the wire, more than the {link.max_payload} the NATS "
                "server takes (its max_payload): send a reference to the data instead",
            )
        self.subject = subject
        link.publish(subject, headers, body, self.published)
        self._prev = msg_id

    def take(self) -> Item:
        """Nothing is taken here: the receiver is in another process."""
        raise IndexError(f"{self.src}>{self.dst} is received in another process")

    def clear(self) -> None:
        """Forget the last sequence sent: a restore numbers the channel again."""
        self._last_seq = 0

    async def flush(self) -> None:
        """Wait until the server has stored everything appended so far (on the whole link)."""
        await self._transport.link.flush()

    def __len__(self) -> int:
        return 0

    def __iter__(self) -> Iterator[Item]:
        return iter(())

    def __getitem__(self, index: int, /) -> Item:
        raise IndexError(index)

    def __repr__(self) -> str:
        return (
            f"<OutgoingChannel {self.src}>{self.dst} sent={self.sent} "
            f"pending={self.published.pending} acked={self.published.acked}>"
        )


class IncomingChannel(_Ends):
    """A channel whose sender is in another process, fed from the stream.

    Items are appended as they arrive, each with its stream sequence beside it, and the
    scheduler hears of each. The channel takes each item once and in the sender's order,
    whatever the stream holds:

    - an item at or below the highest stream sequence it has seen is a redelivery (or
      comes again after its consumer was rewound): dropped;
    - an item names the one its sender published before it (``prev``); one that arrives
      before its predecessor (a publish retried after a later one was stored) is held back
      until the predecessor arrives;
    - an item whose key (generation, sequence) is not above the last one taken in is a
      second copy (published again after the duplicate window): dropped;
    - an item from a generation before the channel's is from before a rollback: dropped,
      unless a replay names its stream sequence (a range a cut recorded in flight, put back
      by [`replay_from`][agentsnap.jetstream.IncomingChannel.replay_from]).

    Attributes:
        taken: Stream sequence of the newest item the receiver took off the channel (0 for
            none): how far the receiver has acknowledged.
        took: Stream sequence of the item taken last (0 when a restore put it back).
        took_after: The id of the item before it on the channel (``None`` when unknown):
            where a replay of the channel from ``took`` starts its chain.
        received: Stream sequence of the newest item that arrived (0 for none).
        generation: Items sent in an earlier generation are dropped.
        duplicates: Items dropped as copies.
        stale: Items dropped as sent before a rollback (an earlier generation).
    """

    __slots__ = (
        "_accept",
        "_chain",
        "_held",
        "_holdback",
        "_key",
        "_marks",
        "_notify",
        "_transport",
        "duplicates",
        "generation",
        "received",
        "stale",
        "taken",
        "took",
        "took_after",
    )

    in_process: ClassVar[bool] = False
    """Its sender is in another process: it always takes its marker."""

    def __init__(  # noqa: PLR0917 - a channel's fields, as LocalChannel takes them
        self,
        transport: JetStreamTransport,
        src: str,
        dst: str,
        receiver: Endpoint,
        closed: int,
        generation: int,
    ) -> None:
        super().__init__(src, dst, receiver, closed)
        self.generation = generation
        self.taken = 0
        self.took = 0
        self.took_after: str | None = None
        self.received = 0
        self.duplicates = 0
        self.stale = 0
        self._transport = transport
        self._held: deque[Item] = deque()
        # Per item: its stream sequence (0 when put back by a restore) and the id of the
        # item before it on the channel.
        self._marks: deque[tuple[int, str | None]] = deque()
        self._holdback: dict[str, tuple[Envelope, int]] = {}
        self._chain: str | None = None
        self._key: tuple[int, int, int] | None = None
        self._notify: Callable[[Channel], None] | None = None
        # Stream sequences taken in whatever their generation (a replayed range).
        self._accept: set[int] = set()

    # -- the Channel protocol ---------------------------------------------------------------

    def append(self, item: Item, /) -> None:
        """Put ``item`` at the end (a restore putting back what a cut recorded)."""
        self._held.append(item)
        self._marks.append((0, None))

    def take(self) -> Item:
        """Remove and return the oldest item."""
        item = self._held.popleft()
        seq, self.took_after = self._marks.popleft()
        self.took = seq
        if seq:
            self.taken = seq
        return item

    @property
    def next_seq(self) -> int:
        """Stream sequence of the oldest item held: the one taken next (0 for none, or when
        a restore put it back).
        """  # noqa: D205
        marks = self._marks
        return marks[0][0] if marks else 0

    def clear(self) -> None:
        """Drop every item held (what arrives later is still taken in)."""
        self._held.clear()
        self._marks.clear()

    def __len__(self) -> int:
        return len(self._held)

    def __iter__(self) -> Iterator[Item]:
        return iter(self._held)

    def __getitem__(self, index: int, /) -> Item:
        return self._held[index]

    def __repr__(self) -> str:
        return (
            f"<IncomingChannel {self.src}>{self.dst} delivered={self.delivered} "
            f"queued={len(self._held)} taken={self.taken} received={self.received}>"
        )

    # -- stream positions -------------------------------------------------------------------

    def stream_seqs(self) -> list[int]:
        """The stream sequence of each item held, oldest first (0 for an item put back)."""
        return [seq for seq, _ in self._marks]

    def in_flight(self) -> tuple[int, int] | None:
        """The lowest and highest stream sequences of the items held, or ``None``."""
        seqs = [seq for seq, _ in self._marks if seq]
        return (min(seqs), max(seqs)) if seqs else None

    @property
    def offset(self) -> ChannelOffset:
        """Where to consume from to hold again exactly what the channel holds now, and after.

        A snapshot records it per channel;
        [`replay_from`][agentsnap.jetstream.IncomingChannel.replay_from] puts the channel
        back on it.
        """
        held = [seq for _, seq in self._holdback.values()]
        for seq, after in self._marks:
            if seq:
                return ChannelOffset(min([seq, *held]), after)
        return ChannelOffset(min([self.received + 1, *held]), self._chain)

    async def replay_from(self, offset: ChannelOffset | int, accept: Collection[int] = ()) -> None:
        """Drop every item held and take the channel's items in again from ``offset``.

        Used by a restore, a rollback or a recovery: with a recorded
        [`offset`][agentsnap.jetstream.IncomingChannel.offset], the channel afterwards holds
        exactly the items it held then, and what came after them. As with
        [`Bus.restore`][agentsnap.bus.Bus.restore], call the scheduler's ``reset`` first
        (the items dropped were announced to it) and set the counters yourself.

        A rollback raises the generation first, so that what was sent before it is dropped;
        ``accept`` names the stream sequences taken in all the same: the messages a cut
        recorded in flight on the channel (see
        [`ChannelOffsets`][agentsnap.distributed.ChannelOffsets]).

        Args:
            offset: A recorded offset, or a stream sequence to take every item from.
            accept: Stream sequences taken in whatever their generation.
        """
        if isinstance(offset, int):
            offset = ChannelOffset(offset)
        await self._transport.rewind(self, offset, accept)

    def stop_accepting(self) -> None:
        """Take in nothing more of an earlier generation (a replay given up)."""
        self._accept.clear()

    def _reposition(self, offset: ChannelOffset, accept: Collection[int] = ()) -> None:
        self._held.clear()
        self._marks.clear()
        self._holdback.clear()
        self.received = offset.stream_seq - 1
        self._chain = offset.after
        self._key = None
        self._accept = set(accept)

    # -- arrivals ---------------------------------------------------------------------------

    def _arrive(self, envelope: Envelope, seq: int) -> None:
        if seq <= self.received:
            return  # redelivered, or read again after a rewind of the shared consumer
        self.received = seq
        prev = envelope.prev
        if prev is not None and self._chain is not None and prev != self._chain:
            if len(self._holdback) >= _HOLDBACK_MAX:
                log.error(
                    "%s>%s: %d items wait for one that never came; dropping the oldest",
                    self.src,
                    self.dst,
                    len(self._holdback),
                )
                self._holdback.pop(next(iter(self._holdback)))
            self._holdback[prev] = (envelope, seq)
            return
        self._link(envelope, seq)
        holdback = self._holdback
        while holdback:
            waiting = holdback.pop(envelope.id, None)
            if waiting is None:
                break
            envelope, seq = waiting
            self._link(envelope, seq)

    def _link(self, envelope: Envelope, seq: int) -> None:
        after = self._chain
        self._chain = envelope.id
        if envelope.generation < self.generation:
            accept = self._accept
            if not accept or seq not in accept:
                self.stale += 1
                return
            accept.discard(seq)
        key = self._key
        if key is not None and envelope.key <= key:
            self.duplicates += 1
            return
        self._key = envelope.key
        item = envelope.item
        self._held.append(item)
        self._marks.append((seq, after))
        notify = self._notify
        if notify is not None:
            notify(self)
        if type(item) is Marker:
            on_marker = self._transport.on_marker
            if on_marker is not None:
                on_marker(self, item.snapshot)


class _Inbox:
    """The consumer of everything one local agent receives, in stream order.

    A pull consumer with explicit (cumulative) acknowledgement, created at the stream
    sequence the inbox has reached. A delivery out of the consumer's order (a gap after a
    disconnect, a redelivery of something not acknowledged) makes the inbox drop the consumer
    and create a new one where it stopped, as does a reconnection; its channels drop anything
    they have seen.
    """

    def __init__(self, transport: JetStreamTransport, dst: str, start: int) -> None:
        self.transport = transport
        self.dst = dst
        self.subject = inbox_subject(transport.run, dst)
        self.next = max(1, start)
        self.task: asyncio.Task[None] | None = None
        self.consumers = 0
        self.redelivered = 0
        self.ack = True

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(
            self._run(), name=f"agentsnap:jetstream-inbox:{self.dst}"
        )

    async def stop(self) -> None:
        task, self.task = self.task, None
        if task is None:
            return
        # Cancelled again until it ends: on Python 3.11 a cancellation that arrives as an
        # awaited request completes (asyncio.wait_for inside the NATS client) can be lost.
        while not task.done():
            task.cancel()
            await asyncio.wait([task], timeout=0.5)
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def _run(self) -> None:
        backoff = 0.05
        while True:
            try:
                await self._consume()
                backoff = 0.05
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # any failure: a new consumer, after a pause
                log.debug("inbox of %s: %r; consuming again from %d", self.dst, exc, self.next)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)

    async def _consume(self) -> None:
        """Consume until something is out of order or the server was lost; then return.

        Pull requests for ``batch`` items are kept outstanding (another is sent once half
        of them arrived), so items flow without a round trip each; the consumer's heartbeats
        show the server is there while nothing is sent.
        """
        transport = self.transport
        link = transport.link
        nc = link.nc
        js: JetStreamContext = link.js
        loop = asyncio.get_running_loop()
        heartbeat = transport.heartbeat
        config = ConsumerConfig(
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=self.next,
            ack_policy=AckPolicy.ALL,
            ack_wait=transport.ack_wait,
            max_ack_pending=-1,
            filter_subject=self.subject,
            inactive_threshold=transport.inactive_threshold,
        )
        info = await js.add_consumer(transport.stream, config)
        self.consumers += 1
        next_subject = f"$JS.API.CONSUMER.MSG.NEXT.{transport.stream}.{info.name}"
        deliver = nc.new_inbox()
        batch = transport.batch
        request = orjson.dumps(
            {
                "batch": batch,
                "expires": int(transport.pull_expires * 1e9),
                "idle_heartbeat": int(heartbeat * 1e9),
            }
        )
        state = _Pull(loop.time())
        stop: asyncio.Future[None] = loop.create_future()

        async def pull() -> None:
            state.outstanding += batch
            await nc.publish(next_subject, request, reply=deliver)

        async def on_msg(msg: Msg) -> None:
            if stop.done():
                return
            state.seen = loop.time()
            headers = msg.headers
            status = headers.get("Status") if headers and not msg.data else None
            if status is not None:
                if status in {"404", "408"}:  # a request expired with items still owed
                    state.outstanding -= int(headers.get("Nats-Pending-Messages", 0))  # type: ignore[union-attr]
                elif status != "100":  # 409: the consumer is gone, or the server changed
                    stop.set_result(None)
                    return
                if state.outstanding <= batch // 2:
                    await pull()
                return
            state.outstanding -= 1
            meta = msg.metadata
            seq = meta.sequence.stream
            if seq < self.next:
                self.redelivered += 1  # delivered again: already taken in
            elif meta.sequence.consumer != state.expected:
                stop.set_result(None)  # something before it was lost on the way
                return
            else:
                state.expected += 1
                self.next = seq + 1
                transport.arrive(self.dst, msg, seq)
                state.unacked = msg
                if self.ack and (sub.pending_msgs == 0 or state.expected % batch == 0):
                    state.unacked = None
                    await msg.ack()
            if state.outstanding <= batch // 2:
                await pull()

        sub = await nc.subscribe(deliver, cb=on_msg, pending_msgs_limit=-1, pending_bytes_limit=-1)
        reconnects = link.reconnects
        try:
            await pull()
            while not stop.done():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(stop), heartbeat)
                if link.reconnects != reconnects or loop.time() - state.seen > 3 * heartbeat:
                    return  # the server was lost: the consumer may be gone with it
                unacked = state.unacked
                if unacked is not None and self.ack:
                    state.unacked = None
                    await unacked.ack()
        finally:
            stop.cancel()
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
            with contextlib.suppress(Exception):
                await js.delete_consumer(transport.stream, info.name)


class _Pull:
    """The state of one consumer's pull requests."""

    __slots__ = ("expected", "outstanding", "seen", "unacked")

    def __init__(self, now: float) -> None:
        self.outstanding = 0
        self.expected = 1
        self.seen = now
        self.unacked: Msg | None = None


class JetStreamTransport:
    """A [`Transport`][agentsnap.bus.Transport] carrying channels between processes on NATS.

    Every process of a run makes one, on its
    [`JetStreamLink`][agentsnap.jetstream.JetStreamLink], naming the processes it hosts
    (``local``); every process's bus knows every process of the run. A channel between two
    local processes is a plain [`LocalChannel`][agentsnap.bus.LocalChannel]. One to a
    process elsewhere is an [`OutgoingChannel`][agentsnap.jetstream.OutgoingChannel]. One
    from elsewhere to a local process is an
    [`IncomingChannel`][agentsnap.jetstream.IncomingChannel], created as its first item
    arrives if the bus had not made it yet.

    The environment (``$env``) is a process like the others: name it in the ``local`` set of
    exactly one process.

    Args:
        link: The connection.
        run: The run (its stream is ``agentsnap.<run>.>``).
        local: The processes hosted here.
        batch: Items a consumer asks the server for at once.
        ack_wait: Seconds before the server delivers again what a consumer did not
            acknowledge.

    Attributes:
        link: The connection.
        run: The run.
        local: The processes hosted here.
        stream: The run's stream.
        unroutable: Items dropped because their sender is not a process of this bus.
    """

    def __init__(
        self,
        link: JetStreamLink,
        run: str,
        local: Collection[str],
        *,
        batch: int = 512,
        ack_wait: float = 30.0,
    ) -> None:
        from agentsnap.jetstream.codec import stream_name  # noqa: PLC0415

        self.link = link
        self.run = check_run_id(run)
        self.local = frozenset(
            name if name == ENVIRONMENT else check_agent_name(name) for name in local
        )
        if not self.local:
            raise ConfigurationError(
                "JetStreamTransport(local=...) names no process: name the agents this process "
                "hosts (and $env in exactly one process)"
            )
        if batch < 1 or ack_wait <= 0:
            raise ConfigurationError(
                f"JetStreamTransport needs batch >= 1 and ack_wait > 0 (got {batch}, {ack_wait})"
            )
        self.stream = stream_name(self.run)
        self.batch = batch
        self.ack_wait = ack_wait
        self.heartbeat = 1.0
        self.pull_expires = 30.0
        self.inactive_threshold = 60.0
        self.unroutable = 0
        self.on_marker: Callable[[Channel, int], None] | None = None
        """Called as a marker arrives on a channel into a local process (with the channel and
        the marker's snapshot), before that process takes it: a process busy in a long
        handler may record the snapshot at once rather than when the handler returns."""
        self.on_cut: Callable[[dict[str, Any]], None] | None = None
        """Called with each notice another process of the run sends with
        [`tell_cut`][agentsnap.jetstream.JetStreamTransport.tell_cut] (while started)."""
        self.cuts_told = 0
        """Notices sent with ``tell_cut``."""
        self.markers = 0
        """Markers published (on channels to other processes)."""
        self.used: dict[str, set[str]] = {}
        """Per local process, the processes elsewhere it has sent a message to."""
        self._cuts: Subscription | None = None
        self._cuts_subject = cuts_subject(self.run)
        self._id = uuid.uuid4().hex
        self._telling: set[asyncio.Task[None]] = set()
        self._last_told: bytes | None = None
        link.on_reconnect(self._tell_again)
        self._generation = 0
        self._bus: Bus | None = None
        self._scheduler_notify: Callable[[Channel], None] | None = None
        self._incoming: dict[tuple[str, str], IncomingChannel] = {}
        self._outgoing: dict[tuple[str, str], OutgoingChannel] = {}
        self._inboxes: dict[str, _Inbox] = {}
        self._started = False
        link.on_close(self.close)

    # -- the Transport protocol -------------------------------------------------------------

    def bind(self, bus: Bus) -> Callable[[Channel], None]:
        """Called by the bus as it is created: returns its notify, which skips outgoing channels."""
        if self._bus is not None and self._bus is not bus:
            raise ConfigurationError("a JetStreamTransport serves one bus: make one per bus")
        self._bus = bus
        scheduler_notify = bus.scheduler.notify
        self._scheduler_notify = scheduler_notify
        for channel in self._incoming.values():
            channel._notify = scheduler_notify

        def notify(channel: Channel) -> None:
            # An outgoing channel's items are delivered in another process.
            if type(channel) is not OutgoingChannel:
                scheduler_notify(channel)

        return notify

    def channel(self, src: str, dst: str, receiver: Endpoint, closed: int) -> Channel:
        """A new channel: local, outgoing or incoming, by where ``src`` and ``dst`` run."""
        local = self.local
        if dst in local:
            if src in local:
                return LocalChannel(src, dst, receiver, closed)
            incoming = IncomingChannel(self, src, dst, receiver, closed, self._generation)
            incoming._notify = self._scheduler_notify
            self._incoming[src, dst] = incoming
            return incoming
        if src not in local:
            # Between two processes hosted elsewhere (the bus makes the environment's channel
            # to every process): nothing is ever sent on it from here.
            return LocalChannel(src, dst, receiver, closed)
        outgoing = OutgoingChannel(self, src, dst, receiver, closed)
        self._outgoing[src, dst] = outgoing
        return outgoing

    # -- generations ------------------------------------------------------------------------

    @property
    def generation(self) -> int:
        """The rollback generation: stamped on every item sent, and the oldest taken in.

        Raise it (on every process) before a rollback puts the channels back: what was sent
        before is then dropped by the receivers, and what is sent again has new ids, which
        the server does not mistake for copies of the old.
        """
        return self._generation

    @generation.setter
    def generation(self, value: int) -> None:
        if value < self._generation:
            raise ConfigurationError(
                f"the generation goes up only (it is {self._generation}, not {value})"
            )
        self._generation = value
        for channel in self._incoming.values():
            channel.generation = value

    # -- lifecycle --------------------------------------------------------------------------

    async def start(
        self, positions: Mapping[str, int] | None = None, **stream_limits: float | int
    ) -> None:
        """Create the run's stream if needed and start consuming for every local agent.

        Args:
            positions: Per local agent, the stream sequence to consume from (by default 1,
                the start of the stream: a run that begins).
            **stream_limits: Passed to
                [`ensure_stream`][agentsnap.jetstream.JetStreamLink.ensure_stream].
        """
        if self._started:
            return
        await self.link.ensure_stream(self.run, **stream_limits)  # type: ignore[arg-type]
        if self.on_cut is not None:
            self._cuts = await self.link.nc.subscribe(self._cuts_subject, cb=self._heard)
        positions = positions or {}
        for name in sorted(self.local):
            if name == ENVIRONMENT:
                continue  # nothing is ever sent to the environment
            inbox = _Inbox(self, name, positions.get(name, 1))
            self._inboxes[name] = inbox
            inbox.start()
        self._started = True

    async def flush(self) -> None:
        """Wait until the server has stored everything sent so far."""
        await self.link.flush()

    async def close(self) -> None:
        """Stop consuming and delete this transport's consumers (the stream stays)."""
        inboxes = list(self._inboxes.values())
        self._inboxes.clear()
        await asyncio.gather(*(inbox.stop() for inbox in inboxes))
        cuts, self._cuts = self._cuts, None
        if cuts is not None:
            with contextlib.suppress(Exception):
                await cuts.unsubscribe()
        self._started = False

    # -- notices of cuts --------------------------------------------------------------------

    def tell_cut(self, notice: Mapping[str, Any]) -> None:
        """Send ``notice`` (JSON) to every other process of the run, on plain NATS.

        Not stored, and not retried: a notice lost on the way (the server away) is made up
        for by the next one, which holds everything a receiver needs from the ones before it
        (see *Channels closed by count* on the concepts page *Channel state as offsets*).
        """
        body = orjson.dumps({**notice, "generation": self._generation, "from": self._id})
        self.cuts_told += 1
        self._last_told = body
        self._send_cut(body)

    def _tell_again(self) -> None:
        # Published while the connection was down, a notice may be lost: the newest holds
        # all the older ones said.
        if self._last_told is not None and self._cuts is not None:
            self._send_cut(self._last_told)

    def _send_cut(self, body: bytes) -> None:
        async def send() -> None:
            try:
                await self.link.nc.publish(self._cuts_subject, body)
            except Exception as exc:  # the next notice makes up for it
                log.debug("notice of a cut not sent: %r", exc)

        task = asyncio.ensure_future(send())
        self._telling.add(task)
        task.add_done_callback(self._telling.discard)

    async def _heard(self, msg: Msg) -> None:
        on_cut = self.on_cut
        try:
            notice = orjson.loads(msg.data)
        except orjson.JSONDecodeError:
            log.error("dropped a notice of a cut on %s: not JSON", msg.subject)
            return
        if on_cut is None or not isinstance(notice, dict) or notice.get("from") == self._id:
            return  # our own
        on_cut(notice)

    async def __aenter__(self) -> JetStreamTransport:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- channels ---------------------------------------------------------------------------

    @property
    def incoming(self) -> Mapping[tuple[str, str], IncomingChannel]:
        """The incoming channels, by ``(src, dst)``."""
        return self._incoming

    @property
    def outgoing(self) -> Mapping[tuple[str, str], OutgoingChannel]:
        """The outgoing channels, by ``(src, dst)``."""
        return self._outgoing

    async def rewind(
        self, channel: IncomingChannel, offset: ChannelOffset, accept: Collection[int] = ()
    ) -> None:
        """Put ``channel`` on ``offset``, and its agent's consumer back far enough to refill it.

        ``accept``: stream sequences the channel takes in whatever their generation.
        """
        inbox = self._inboxes.get(channel.dst)
        if inbox is None:
            channel._reposition(offset, accept)
            return
        await inbox.stop()
        channel._reposition(offset, accept)
        inbox.next = max(1, min(inbox.next, offset.stream_seq))
        inbox.start()

    def arrive(self, dst: str, msg: Msg, seq: int) -> None:
        """Place an item the consumer of ``dst`` read at stream sequence ``seq``."""
        try:
            envelope = decode(msg.headers or {}, msg.data)
        except ValueError as exc:
            log.error("dropped stream item %d on %s: %s", seq, msg.subject, exc)
            return
        src = envelope.item.src
        channel = self._incoming.get((src, dst))
        if channel is None:
            channel = self._discover(src, dst, msg.subject)
            if channel is None:
                return
        channel._arrive(envelope, seq)

    def _discover(self, src: str, dst: str, subject: str) -> IncomingChannel | None:
        bus = self._bus
        sender = bus.endpoints.get(src) if bus is not None else None
        if bus is None or sender is None or src in self.local:
            self.unroutable += 1
            log.error(
                "dropped an item from %r to %r (subject %s): the sender is not a remote "
                "process this bus knows; add every process of the run to every bus",
                src,
                dst,
                decode_token(subject.rsplit(".", 1)[-1]),
            )
            return None
        channel = bus.channel(sender, dst)
        assert isinstance(channel, IncomingChannel)
        return channel
