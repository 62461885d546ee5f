"""The message journal: every send and every delivery of a run, kept in the store.

Snapshots say what the run looked like at a few cuts; the journal says what happened in
between, and is what a space-time diagram of the run is drawn from. It is off by default:

```python
import asyncio

from agentsnap import Runtime
from agentsnap.journal import read_journal

async def main() -> None:
    async with Runtime(journal=True) as runtime:
        ...  # add agents, send work, run_until_idle()
        messages = read_journal(await runtime.store.load_journal(runtime.run_id))
        print(len(messages))

asyncio.run(main())
```

Keeping the journal must not slow the bus down much: it watches the bus as a
[`BusObserver`][agentsnap.bus.BusObserver], and each send and delivery only appends the
message (or its sequence number) and the time to the channel's list. Every
``interval`` seconds, whenever the run goes idle, and when the runtime closes, the lists are
taken, encoded as one JSON segment per channel and event, and written to the store in one
call, off the hot path. A write that fails is logged and kept for the next flush, so the
journal loses nothing while the database is briefly away; what the database still refuses
when the runtime closes is spooled to a local file and written later (see
[`agentsnap.store.spool`][agentsnap.store.spool]). What was not yet written when a process
dies is lost (the snapshots, not the journal, are what a run is recovered from).
"""

from __future__ import annotations

import asyncio
import heapq
import json
import logging
import time
from array import array
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, NamedTuple

from agentsnap.bus import BusObserver
from agentsnap.exceptions import ConfigurationError
from agentsnap.records import JournalMessage, JournalSegment
from agentsnap.state import compact_json

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterable, Mapping, Sequence

    from agentsnap.bus import Bus, Channel
    from agentsnap.messages import Message
    from agentsnap.redaction import Redaction
    from agentsnap.store import RunLog

__all__ = ["Journal", "JournalReader", "SegmentColumns", "decode_segment", "read_journal"]

logger = logging.getLogger("agentsnap.journal")

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_encode = compact_json
_now_ns = time.time_ns


class Journal(BusObserver):
    """Collects a run's sends and deliveries and writes them to the store in segments.

    The runtime creates one when it is given ``journal=True``; applications do not need to.

    Args:
        bus: The bus whose channels are journaled (existing and future ones).
        store: Where segments are written.
        run_id: The run they belong to.
        interval: Seconds between background flushes.
        segment_size: Sends are encoded once about this many per channel are logged, so the
            journal holds on to few live messages (which would slow Python's garbage
            collector down) and mostly to encoded text until the next flush.

    Attributes:
        failures: Errors of journal writes that failed (the segments were kept and retried).
    """

    def __init__(
        self,
        bus: Bus,
        store: RunLog,
        run_id: str,
        *,
        interval: float = 0.25,
        segment_size: int = 64,
        redaction: Redaction | None = None,
    ) -> None:
        if not interval > 0:
            raise ConfigurationError(
                f"the journal interval ({interval}) must be a positive number of seconds"
            )
        if segment_size < 1:
            raise ConfigurationError(
                f"the journal segment size ({segment_size}) must be at least 1 message"
            )
        self._bus = bus
        self._store = store
        self._run_id = run_id
        self._redaction = redaction
        self._interval = interval
        self._pending: list[JournalSegment] = []
        self._lock = asyncio.Lock()
        self._timer: asyncio.Task[None] | None = None
        self.failures: list[Exception] = []
        # Sends as ``channel, message, microseconds since the epoch`` triples laid out flat,
        # and deliveries as ``channel, seq, microseconds``, in the order they happened.
        self._sends: list[Any] = []
        self._deliveries: list[Any] = []
        self._segment_size = segment_size
        self._spill_at = 3 * segment_size
        bus.observe(self)

    # -- the bus's observer: the hot path -----------------------------------------------------

    def on_enqueue(self, channel: Channel, message: Message) -> None:
        """Log a send."""
        log = self._sends
        log.append(channel)
        log.append(message)
        log.append(_now_ns() // 1000)
        if len(log) >= self._spill_at:
            self._full()

    def on_deliver(self, channel: Channel, message: Message) -> None:
        """Log a delivery."""
        log = self._deliveries
        log.append(channel)
        log.append(message.seq)
        log.append(_now_ns() // 1000)

    def start(self) -> None:
        """Start flushing in the background (called from the running event loop)."""
        if self._timer is None:
            self._timer = asyncio.get_running_loop().create_task(
                self._tick(), name="agentsnap:journal"
            )

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            await self.flush()

    def _full(self) -> None:
        """The send log reached its bound: about ``segment_size`` sends per channel."""
        self._spill_at = 3 * self._segment_size * max(1, len(self._bus.channels))
        if len(self._sends) >= self._spill_at:
            self.spill()

    def spill(self) -> None:
        """Encode the sends logged so far; they are written at the next flush.

        Encoded, they are text the garbage collector never walks, where the logged messages
        would be live objects.
        """
        sends, self._sends = self._sends, []
        self._pending.extend(
            _send_segment(channel.src, channel.dst, messages, at, self._redaction)
            for channel, messages, at in _by_channel(sends)
        )

    def take(self) -> list[JournalSegment]:
        """Take every event logged since the last call, as segments (sends first)."""
        sends, self._sends = self._sends, []
        deliveries, self._deliveries = self._deliveries, []
        segments = [
            _send_segment(channel.src, channel.dst, messages, at, self._redaction)
            for channel, messages, at in _by_channel(sends)
        ]
        segments.extend(
            _deliver_segment(channel.src, channel.dst, seqs, at)
            for channel, seqs, at in _by_channel(deliveries)
        )
        return segments

    async def flush(self) -> None:
        """Write everything logged so far; a failed write is logged and retried next time."""
        async with self._lock:
            segments = self._pending + self.take()
            self._pending = []
            if not segments:
                return
            try:
                await self._store.append_journal(self._run_id, segments)
            except Exception as exc:
                # Keep the order: these first, then whatever was spilled meanwhile.
                self._pending[:0] = segments
                self.failures.append(exc)
                logger.error(
                    "journal write of %d segment(s) failed, will retry: %s: %s",
                    len(segments),
                    type(exc).__name__,
                    exc,
                )

    async def close(self) -> list[JournalSegment]:
        """Stop the background flushes and write what is left.

        Returns:
            The segments the store refused even then, which this journal forgets: the
            caller keeps them elsewhere (the runtime spools them to a local file).
        """
        if self._timer is not None:
            self._timer.cancel()
            await asyncio.gather(self._timer, return_exceptions=True)
            self._timer = None
        await self.flush()
        left, self._pending = self._pending, []
        return left


# Segments are encoded column by column: one JSON array per field, which the C encoder turns
# out far faster than an object per message. A column whose values are all equal (the kind,
# the epoch) is kept as that single value, and consecutive sequence numbers as the first one.


def _sent(  # noqa: PLR0917
    segment: JournalSegment,
    i: int,
    seqs: Sequence[int],
    at: Sequence[int],
    kinds: Sequence[str],
    payloads: Sequence[Any],
    epochs: Sequence[int],
    headers: Mapping[str, Any],
) -> dict[str, Any]:
    """The fields of the ``i``-th message of a send segment, not delivered yet."""
    return {
        "src": segment.src,
        "dst": segment.dst,
        "seq": seqs[i],
        "kind": kinds[i],
        "payload": payloads[i],
        "headers": headers.get(str(i), {}),
        "epoch": epochs[i],
        "sent_at": _EPOCH + timedelta(microseconds=at[i]),
        "delivered_at": None,
    }


def _by_channel(log: list[Any]) -> list[tuple[Channel, list[Any], list[Any]]]:
    """Split a flat log of ``channel, a, b`` triples into the ``a`` and ``b`` of each channel.

    Each channel's entries keep their order; the channels come in the order they first
    appear.
    """
    channels = log[0::3]
    if not channels:
        return []
    first = channels[0]
    if channels.count(first) == len(channels):
        # All on one channel (a busy sender's log, often): sliced without a line of Python
        # per entry.
        return [(first, log[1::3], log[2::3])]
    pairs: dict[Channel, list[Any]] = {}
    for i in range(0, len(log), 3):
        channel = log[i]
        found = pairs.get(channel)
        if found is None:
            found = pairs[channel] = []
        found.append(log[i + 1])
        found.append(log[i + 2])
    return [(channel, found[0::2], found[1::2]) for channel, found in pairs.items()]


def _send_segment(
    src: str, dst: str, messages: list[Message], at: list[int], redaction: Redaction | None
) -> JournalSegment:
    _, _, seqs, kinds, payloads, headers, epochs = zip(*messages, strict=True)
    if redaction is not None:
        payloads = tuple(redaction.payload(dst, payload) for payload in payloads)
    columns: dict[str, Any] = {
        "seq": _sequence(seqs),
        "kind": _constant(kinds),
        "payload": payloads,
        "epoch": _constant(epochs),
        "at": at,
    }
    if any(headers):
        columns["headers"] = {str(i): dict(h) for i, h in enumerate(headers) if h}
    return JournalSegment(src, dst, "send", seqs[0], seqs[-1], _encode(columns))


def _deliver_segment(src: str, dst: str, seqs: list[int], at: list[int]) -> JournalSegment:
    columns = {"seq": _sequence(seqs), "at": at}
    return JournalSegment(src, dst, "deliver", seqs[0], seqs[-1], _encode(columns))


def _sequence(seqs: Sequence[int]) -> int | Sequence[int]:
    """The first number when the numbers count up by one (as they do on a channel)."""
    first = seqs[0]
    if seqs[-1] - first + 1 == len(seqs) and list(seqs) == list(range(first, first + len(seqs))):
        return first
    return seqs


def _constant(values: Sequence[Any]) -> Any:
    first = values[0]
    return first if values.count(first) == len(values) else values


def _column(columns: dict[str, Any], name: str, count: int) -> list[Any]:
    value = columns[name]
    if isinstance(value, list):
        if len(value) != count:
            raise ValueError(f"journal column {name!r} has {len(value)} values, not {count}")
        return value
    if name == "seq":
        return list(range(value, value + count))
    return [value] * count


class SegmentColumns(NamedTuple):
    """A journal segment's columns, one value per event (see ``decode_segment``).

    ``at`` holds microseconds since the Unix epoch; a delivery segment's ``kinds``,
    ``payloads`` and ``epochs`` are empty, and ``headers`` maps an event's index (as text)
    to its headers, for the events that have any.
    """

    seqs: list[Any]
    at: list[Any]
    kinds: list[Any]
    payloads: list[Any]
    epochs: list[Any]
    headers: dict[str, Any]


def decode_segment(segment: JournalSegment) -> SegmentColumns:
    """The columns of a journal segment as written: what a reader indexing a long journal
    reads without building a message per event.

    Raises:
        ValueError: The segment is not in the journal's format.
    """  # noqa: D205
    where = f"journal segment {segment.event} {segment.src}>{segment.dst}"
    try:
        columns = json.loads(segment.entries)
        at = columns["at"]
        count = len(at)
        seqs = _column(columns, "seq", count)
        if segment.event == "send":
            return SegmentColumns(
                seqs,
                at,
                _column(columns, "kind", count),
                _column(columns, "payload", count),
                _column(columns, "epoch", count),
                columns.get("headers", {}),
            )
        if segment.event != "deliver":
            raise ValueError(f"unknown event {segment.event!r}")
        return SegmentColumns(seqs, at, [], [], [], {})
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{where} is damaged: {exc}") from exc


def read_journal(segments: Iterable[JournalSegment]) -> list[JournalMessage]:
    """Turn journal segments (in the order they were written) into messages, in send order.

    Messages are ordered by the time they were sent; those of one channel always in the
    order they were sent on it.

    A delivery is matched with the latest send of the same channel and sequence number that
    was made before it and has not been delivered yet (a rollback reuses sequence numbers, and
    one flush can write both sends of a number before either delivery).

    Raises:
        ValueError: A segment is not in the journal's format.
    """
    messages: list[dict[str, Any]] = []
    sends: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for segment in segments:
        seqs, at, kinds, payloads, epochs, headers = decode_segment(segment)
        if segment.event == "send":
            for i in range(len(at)):
                message = _sent(segment, i, seqs, at, kinds, payloads, epochs, headers)
                messages.append(message)
                sends.setdefault((segment.src, segment.dst, seqs[i]), []).append(message)
        else:
            for seq, when in zip(seqs, at, strict=True):
                delivered_at = _EPOCH + timedelta(microseconds=when)
                waiting = [
                    m
                    for m in sends.get((segment.src, segment.dst, seq), ())
                    if m["delivered_at"] is None
                ]
                before = [m for m in waiting if m["sent_at"] <= delivered_at]
                if before or waiting:
                    (before or waiting)[-1]["delivered_at"] = delivered_at
    # Segments come channel by channel; the clock puts the channels back together (sort is
    # stable, so each channel keeps its own order even where the clock ticked too coarsely).
    messages.sort(key=lambda message: message["sent_at"])
    return [JournalMessage.model_validate(message) for message in messages]


_UNDELIVERED = -(2**63)


class JournalReader:
    """A run's journal read from the store a page at a time, in the order ``read_journal``
    gives, holding a few numbers per message rather than the messages.

    [`index`][agentsnap.journal.JournalReader.index] reads the journal once, checks every
    segment, matches deliveries with sends and notes, per send, its time and when it was
    delivered (16 bytes a message); [`messages`][agentsnap.journal.JournalReader.messages]
    then reads it again and yields the messages sorted by the time they were sent, keeping
    only those sent out of order until every earlier one has come (with one flush of the
    journal at a time, a flush's worth).

    Example:
        ```python
        reader = JournalReader(store, run_id)
        if await reader.index():
            async for message in reader.messages():
                print(message.src, message.dst, message.seq)
        ```

    Args:
        store: The store holding the run.
        run_id: The run.
        page: How many segments to read at a time.

    Attributes:
        segments: How many segments ``index`` read (the run kept a journal if any).
    """  # noqa: D205

    def __init__(self, store: RunLog, run_id: str, *, page: int = 100) -> None:
        self._store = store
        self._run_id = run_id
        self._page = page
        self._end = 0  # position of the last segment indexed
        self.segments = 0
        self._sent = array("q")  # per send, in journal order: microseconds since the epoch
        self._delivered = array("q")  # when it was delivered, or _UNDELIVERED
        self._floor = array("q")  # the earliest send time from this send on

    async def _pages(self, end: int | None = None) -> AsyncIterator[list[JournalSegment]]:
        after = 0
        while True:
            page = await self._store.load_journal_page(self._run_id, after=after, limit=self._page)
            if end is not None:
                page = [(position, found) for position, found in page if position <= end]
            if not page:
                return
            after = page[-1][0]
            if end is None:
                self._end = after
            yield [found for _, found in page]
            if len(page) < self._page:
                return

    async def index(self) -> int:
        """Read the journal through once; how many messages it holds.

        Raises:
            NotFoundError: The store holds no such run.
            ValueError: A segment is not in the journal's format.
        """
        sent = self._sent = array("q")
        delivered = self._delivered = array("q")
        # The sends not delivered yet, by channel and number, in journal order.
        waiting: dict[tuple[str, str, int], list[int]] = {}
        self.segments = 0
        async for segments in self._pages():
            self.segments += len(segments)
            for segment in segments:
                seqs, at, _, _, _, _ = decode_segment(segment)
                src, dst = segment.src, segment.dst
                if segment.event == "send":
                    for seq, when in zip(seqs, at, strict=True):
                        waiting.setdefault((src, dst, seq), []).append(len(sent))
                        sent.append(when)
                        delivered.append(_UNDELIVERED)
                    continue
                for seq, when in zip(seqs, at, strict=True):
                    key = (src, dst, seq)
                    ordinals = waiting.get(key)
                    if not ordinals:
                        continue
                    # The latest send made before the delivery, else the latest one.
                    chosen = len(ordinals) - 1
                    for i in range(len(ordinals) - 1, -1, -1):
                        if sent[ordinals[i]] <= when:
                            chosen = i
                            break
                    delivered[ordinals.pop(chosen)] = when
                    if not ordinals:
                        del waiting[key]
        floor = self._floor = array("q", sent)
        for i in range(len(floor) - 2, -1, -1):
            floor[i] = min(floor[i], floor[i + 1])
        return len(sent)

    async def messages(self) -> AsyncIterator[JournalMessage]:
        """The messages indexed, in send order (call ``index`` first)."""
        floor = self._floor
        delivered = self._delivered
        count = len(floor)
        held: list[tuple[int, int, JournalMessage]] = []
        ordinal = 0
        async for segments in self._pages(self._end):
            for segment in segments:
                if segment.event != "send":
                    continue
                seqs, at, kinds, payloads, epochs, headers = decode_segment(segment)
                for i in range(len(at)):
                    if ordinal >= count:
                        break
                    when = delivered[ordinal]
                    fields = _sent(segment, i, seqs, at, kinds, payloads, epochs, headers)
                    if when != _UNDELIVERED:
                        fields["delivered_at"] = _EPOCH + timedelta(microseconds=when)
                    message = JournalMessage.model_validate(fields)
                    heapq.heappush(held, (at[i], ordinal, message))
                    ordinal += 1
                    # Every message still to come was sent at or after ``floor[ordinal]``.
                    coming = floor[ordinal] if ordinal < count else None
                    while held and (coming is None or held[0][0] <= coming):
                        yield heapq.heappop(held)[2]
        while held:
            yield heapq.heappop(held)[2]
