"""The replay log: what a resumed run needs to re-execute its handlers the same way.

A derived idempotency key names a call by the message being handled (``src>dst#seq``). After
a crash, a resumed run re-executes the handlers that ran after its last complete snapshot.
If an agent then took its messages from several channels in another order, its state would
differ, the messages it sends would carry other payloads under the same sequence numbers, and
the same logical effect would arrive under another key.

So the runtime logs, for every delivery, which message each agent took next, and every
message the environment sent; and before any side-effecting tool call is claimed in the
ledger it makes that log durable, together with everything logged before it (a group
commit: concurrent calls share one write). What an effect depends on (the deliveries and
inputs before it, at every agent) is then always in the store before the effect starts.

On resume, the runtime restores the environment's input sent after the cut and has each
agent take, first, the messages it took before the crash, in the same order. The handlers,
re-executed, get the recorded answers of the model calls they make through their context
(see [`agentsnap.model_calls`][agentsnap.model_calls]) and the recorded results of their
tool calls, so they send the same messages under the same ids and derive the same keys: the
ledger returns the recorded results instead of running the effects again. Deliveries logged
but not yet made durable had no effect depending on them, so losing them in a crash is
harmless.

Each segment carries a *timeline*: a rollback starts a new one, and a resumed run replays
only the deliveries of the timeline the run was on when it stopped.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Collection, Iterable, Iterator, Mapping
from itertools import groupby, islice, repeat
from types import MappingProxyType
from typing import TYPE_CHECKING

from agentsnap.messages import EMPTY_HEADERS, ENVIRONMENT, Message
from agentsnap.records import ReplaySegment, Snapshot
from agentsnap.state import compact_json

if TYPE_CHECKING:
    from agentsnap.bus import Channel
    from agentsnap.messages import JsonInput
    from agentsnap.redaction import Redaction

__all__ = ["InputLog", "Mirror", "ReplayLog", "ReplayPlan", "missing", "plan_replay"]

logger = logging.getLogger("agentsnap.replay")

Write = Callable[[ReplaySegment], Awaitable[None]]
Mirror = Callable[[ReplaySegment], Awaitable[int]]
"""Appends a segment to a second durable log and returns where it was stored there."""


class InputLog:
    """What the environment sent, kept for replay after a rollback (like a source's log).

    The environment records a cut at one instant, so the messages it sent before a cut are
    a prefix of this log: the cut's counters, summed, say where it falls. New messages go to
    ``buffer`` (appending costs a list append); every few hundred, ``seal`` turns them into
    JSON text, which the garbage collector never has to walk, so a run fed a million inputs
    does not slow down because of them.

    Attributes:
        buffer: Messages not sealed yet, oldest first; append new ones here.
    """

    __slots__ = ("_base", "_sealed", "buffer", "redaction", "sealed")

    def __init__(self) -> None:
        self.buffer: list[Message] = []
        self.sealed: Callable[[int, str], None] | None = None
        """Called with each piece sealed: how many messages, their rows as JSON."""
        self.redaction: Redaction | None = None
        """Applied to the payloads of the rows ``sealed`` is given (the rows kept here, to
        send again after a rollback in this process, are not redacted)."""
        # (how many messages, their rows as JSON), oldest first; _base is the position in
        # the run of the first message held.
        self._sealed: list[tuple[int, str]] = []
        self._base = 0

    def __len__(self) -> int:
        return sum(count for count, _ in self._sealed) + len(self.buffer)

    def seal(self) -> None:
        """Turn the buffered messages into JSON text."""
        buffer = self.buffer
        if buffer:
            _, dsts, seqs, kinds, payloads, headers, epochs = zip(*buffer, strict=True)
            rows: list[tuple[JsonInput, ...]]
            if any(headers):
                rows = [
                    (m.dst, m.seq, m.kind, m.payload, dict(m.headers) or None, m.epoch)
                    for m in buffer
                ]
            else:  # the common case, built without a line of Python per message
                rows = list(zip(dsts, seqs, kinds, payloads, repeat(None), epochs))
            text = compact_json(rows)
            self._sealed.append((len(rows), text))
            buffer.clear()
            if self.sealed is not None:
                redaction = self.redaction
                if redaction is not None:
                    text = compact_json(
                        [(r[0], *r[1:3], redaction.payload(str(r[0]), r[3]), *r[4:]) for r in rows]
                    )
                self.sealed(len(rows), text)

    def forget(self, before: Mapping[str, int] | None) -> None:
        """Drop what precedes a cut whose environment had sent ``before`` (all if ``None``)."""
        self.seal()
        if before is None:
            self._base += len(self)
            self._sealed.clear()
            return
        drop = sum(before.values()) - self._base
        while self._sealed and self._sealed[0][0] <= drop:
            count, _ = self._sealed.pop(0)
            self._base += count
            drop -= count
        if drop > 0 and self._sealed:
            rows = json.loads(self._sealed[0][1])[drop:]
            self._sealed[0] = (len(rows), compact_json(rows))
            self._base += drop

    def restore(self, messages: list[Message], before: Mapping[str, int]) -> None:
        """Hold ``messages``, sent after a cut whose environment had sent ``before`` (resume)."""
        self.seal()
        self._sealed.clear()
        self._base = sum(before.values())
        self.buffer.extend(messages)
        hook, self.sealed = self.sealed, None  # stored already: not news for the replay log
        try:
            self.seal()
        finally:
            self.sealed = hook

    def after(self, sent: Mapping[str, int]) -> Iterator[Message]:
        """The messages sent after a cut whose environment had sent ``sent``, in order."""
        skip = sum(sent.values()) - self._base
        # Read back with the standard library: orjson would turn integers beyond 64 bits
        # into floats.
        for count, text in self._sealed:
            if skip >= count:
                skip -= count
                continue
            for dst, seq, kind, payload, headers, epoch in json.loads(text)[max(skip, 0) :]:
                yield Message(
                    ENVIRONMENT,
                    dst,
                    seq,
                    kind,
                    payload,
                    MappingProxyType(headers) if headers else EMPTY_HEADERS,
                    epoch,
                )
            skip = 0
        yield from self.buffer[max(skip, 0) :]


class ReplayLog:
    """Deliveries and inputs of a run, made durable before the effects that follow them.

    The runtime appends to ``deliveries`` the channel of each message an agent takes, as it
    takes it (one list append: the sequence numbers are worked out when the log is written,
    since each channel is taken in order). The
    environment's input is taken from the run's [`InputLog`][agentsnap.replay.InputLog],
    which turns it into JSON every few hundred messages anyway: the replay log takes those
    pieces as they are made, so logging input costs nothing more.
    [`flush`][agentsnap.replay.ReplayLog.flush] writes everything appended so far.

    A log may have a *mirror*: a second durable log, quicker to append to than the store
    (a worker's is the run's stream on NATS JetStream).
    [`secure`][agentsnap.replay.ReplayLog.secure] then makes what was appended durable there,
    in one round trip to it, and the store takes the same segments in the background; a
    recovery copies into the store the mirrored segments it lacks before reading it.

    Args:
        write: Appends one segment to the store.
        inputs: The run's input log.
        every: Deliveries (or inputs) held in memory before they are written in the
            background, even when no effect asks for them.

    Attributes:
        timeline: The timeline new deliveries belong to.
        deliveries: The channels of the deliveries not written yet, oldest first; emptied
            in place, never replaced.
    """

    def __init__(self, write: Write, inputs: InputLog, *, every: int = 4096) -> None:
        self.timeline = 0
        self.resumed = -1
        """The newest timeline an earlier process of the run was on, once resumed (-1: the
        run began in this process): model calls of a later timeline have no recorded answer
        to look for."""
        self.written = -1
        """The newest timeline a written segment belongs to (-1: none written yet)."""
        self.deliveries: list[Channel] = []
        self.every = every
        self._write = write
        self._inputs = inputs
        inputs.sealed = self._sealed
        self._chunks: list[str] = []  # inputs sealed and not taken, as JSON arrays
        self._chunk_rows = 0
        self._taken = 0  # entries moved into segments so far
        self._durable = 0  # entries of segments written so far
        self._unwritten: deque[tuple[ReplaySegment, int]] = deque()
        self._writing: asyncio.Future[None] | None = None
        self._background: set[asyncio.Task[None]] = set()
        self._soon = False
        self.mirror: Mirror | None = None
        """Appends a segment to a second durable log (see
        [`secure`][agentsnap.replay.ReplayLog.secure]); ``None``: the store alone."""
        self.mirrored_at: dict[int, int] = {}
        """Per segment mirrored and not yet written to the store (by ``id``), where the
        mirror stored it."""
        self.on_written: Callable[[int], None] | None = None
        """Called, once a mirrored segment is in the store too, with where the mirror had
        stored it: what the mirror holds up to there is in the store."""
        self._mirrored = 0  # entries of segments the mirror holds
        self._securing: asyncio.Lock | None = None

    def _sealed(self, count: int, rows: str) -> None:
        self._chunks.append(rows)
        self._chunk_rows += count
        if self._chunk_rows >= self.every:
            self.flush_soon()

    def _appended(self) -> int:
        return self._taken + len(self.deliveries) + self._chunk_rows + len(self._inputs.buffer)

    def pending(self) -> int:
        """Entries appended and not yet durable."""
        return self._appended() - self._durable

    def flush_soon(self) -> None:
        """Write what is held in the background (errors are logged and kept for later)."""
        self._take()
        if self._soon or self._writing is not None:
            return  # a write under way, or about to start, takes this segment too
        self._soon = True
        task = asyncio.ensure_future(self._flush_logged())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _flush_logged(self) -> None:
        self._soon = False
        try:
            await self.flush()
        except Exception as exc:  # the next flush writes it again
            logger.warning("the replay log could not be written yet: %s", exc)

    async def flush(self) -> None:
        """Make durable every delivery and input appended so far.

        Raises:
            StoreError: The store could not write it; nothing appended is lost, and the next
                call writes it again.
        """
        want = self._appended()
        while self._durable < want or self._unwritten:  # a timeline's marker holds no entry
            writing = self._writing
            if writing is None:
                self._take()
                if not self._unwritten:
                    break
                writing = self._writing = asyncio.ensure_future(self._write_all())
            await asyncio.shield(writing)

    def secured(self) -> bool:
        """Whether everything appended so far is durable, in the store or the mirror."""
        appended = self._appended()
        return self._durable >= appended or (self.mirror is not None and self._mirrored >= appended)

    async def secure(self) -> None:
        """Make durable every delivery and input appended so far.

        In the mirror if there is one (the store then writes the same segments in the
        background), else in the store.
        A mirror's segments follow one another in the order taken, so what it holds is a
        prefix of this log beyond what the store holds: a recovery that copies the ones the
        store lacks (see [`missing`][agentsnap.replay.missing]) reads the whole order.

        Raises:
            StoreError: Without a mirror, the store could not write it.
            Exception: The mirror's error: it holds what it acknowledged before; nothing
                appended is lost, and [`flush`][agentsnap.replay.ReplayLog.flush] writes
                it to the store.
        """
        mirror = self.mirror
        if mirror is None:
            await self.flush()
            return
        if self.secured():
            return
        if self._securing is None:
            self._securing = asyncio.Lock()
        async with self._securing:  # one after the other: the mirror keeps their order
            want = self._appended()
            if self._durable >= want or self._mirrored >= want:
                return
            self._take()
            for segment, upto in list(self._unwritten):
                if upto <= self._mirrored or upto <= self._durable:
                    continue
                where = await mirror(segment)
                self._mirrored = max(self._mirrored, upto)
                if any(held is segment for held, _ in self._unwritten):
                    self.mirrored_at[id(segment)] = where
                elif self.on_written is not None:  # the store wrote it meanwhile
                    self.on_written(where)
        self.flush_soon()

    def _take(self, *, marker: bool = False) -> None:
        """Move what is held into a segment; ``marker`` makes one even when nothing is."""
        self._inputs.seal()
        if not self.deliveries and not self._chunks and not marker:
            return
        inputs = ",".join(chunk[1:-1] for chunk in self._chunks if len(chunk) > 2)
        log = self.deliveries
        body = f'{{"deliveries":{compact_json(_runs(log))},"inputs":[{inputs}]}}'
        self._taken += len(log) + self._chunk_rows
        log.clear()
        self._chunks = []
        self._chunk_rows = 0
        self._unwritten.append((ReplaySegment(self.timeline, body), self._taken))

    async def _write_all(self) -> None:
        try:
            unwritten = self._unwritten
            while unwritten:
                # The segments of one timeline waiting together are written as one: a log
                # secured in a mirror takes a segment per publish, quicker than the store.
                timeline = unwritten[0][0].timeline
                count = 1
                while (
                    self.mirror is not None
                    and count < len(unwritten)
                    and count < _JOINED
                    and unwritten[count][0].timeline == timeline
                ):
                    count += 1
                segment, upto = unwritten[count - 1]
                if count > 1:
                    segment = _joined([held for held, _ in islice(unwritten, count)])
                await self._write(segment)
                for _ in range(count):
                    written, _upto = unwritten.popleft()
                    where = self.mirrored_at.pop(id(written), None)
                    if where is not None and self.on_written is not None:
                        self.on_written(where)
                self._durable = max(self._durable, upto)
                self.written = max(self.written, timeline)
        finally:
            self._writing = None

    def new_timeline(self, timeline: int | None = None) -> None:
        """A rollback starts a new timeline: deliveries not written yet belong to the old one.

        They are dropped (no effect depends on them); the segment that starts the new
        timeline (with the input not written yet) marks where it starts, so that a resume
        never replays the old one's deliveries.

        Args:
            timeline: The new timeline's number (default: the next one). In a run spread
                over processes, the run's coordinator numbers the timelines.
        """
        # Dropped entries count as written once the segment that starts the timeline is.
        self._taken += len(self.deliveries)
        self.deliveries.clear()
        self.timeline = self.timeline + 1 if timeline is None else timeline
        self._take(marker=True)

    def take(self) -> None:
        """Hold what was appended so far as a segment to write, numbered as the channels
        stand now (before a rollback restores their counters).
        """  # noqa: D205
        self._take()

    def take_unwritten(self) -> list[ReplaySegment]:
        """Everything not yet durable, as segments, which this log then forgets.

        For a runtime closing while its database is away: it spools them.
        """
        self._take()
        segments = [segment for segment, _ in self._unwritten]
        self._unwritten.clear()
        self.mirrored_at.clear()
        self._durable = self._appended()
        return segments

    async def close(self) -> None:
        """Wait for background writes."""
        while self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)


_JOINED = 512
"""Segments written to the store as one at most."""
_BOUNDARY = '],"inputs":['
"""Where a segment's deliveries end and its inputs begin: the first occurrence in its body
(names and payloads inside the deliveries are JSON strings, whose quotes are escaped)."""


def _joined(segments: list[ReplaySegment]) -> ReplaySegment:
    """One segment holding the deliveries and inputs of ``segments`` (one timeline's)."""
    deliveries: list[str] = []
    inputs: list[str] = []
    head = len('{"deliveries":[')
    for segment in segments:
        body = segment.body
        cut = body.index(_BOUNDARY)
        if cut > head:
            deliveries.append(body[head:cut])
        if len(body) - 2 > cut + len(_BOUNDARY):
            inputs.append(body[cut + len(_BOUNDARY) : -2])
    body = f'{{"deliveries":[{",".join(deliveries)}],"inputs":[{",".join(inputs)}]}}'
    return ReplaySegment(segments[0].timeline, body)


def missing(
    stored: Iterable[ReplaySegment], mirrored: Iterable[ReplaySegment]
) -> list[ReplaySegment]:
    """The segments of ``mirrored`` that ``stored`` lacks, in the mirror's order.

    A segment is recognised by its timeline and body: two equal ones name the same
    deliveries and inputs, which a plan takes once (see
    [`plan_replay`][agentsnap.replay.plan_replay]), so one copy in the store is enough.
    """
    held = set(stored)
    found: list[ReplaySegment] = []
    for segment in mirrored:
        if segment not in held:
            held.add(segment)
            found.append(segment)
    return found


def _runs(log: list[Channel]) -> list[tuple[str, str, int, int]]:
    """The deliveries of ``log`` as runs ``(agent, src, first_seq, count)``.

    Every delivery since the log was last emptied is in it, and a channel is taken in order,
    so a channel's last delivery in the log is its ``delivered`` counter now: the runs are
    numbered from the newest back, without counting the deliveries one by one.
    """
    grouped = [(channel, len(list(group))) for channel, group in groupby(log)]
    runs: list[tuple[str, str, int, int]] = []
    last: dict[Channel, int] = {}  # per channel, the sequence number before the run seen last
    for channel, count in reversed(grouped):
        first = last.get(channel, channel.delivered) - count + 1
        last[channel] = first - 1
        runs.append((channel.dst, channel.src, first, count))
    runs.reverse()
    return runs


class ReplayPlan:
    """What a resumed run takes from its replay log.

    Attributes:
        timeline: The timeline the run was on.
        inputs: The environment's messages sent after the cut, in the order they were sent.
        order: Per agent, the messages it took after the cut, as ``(src, seq)``, in order.
    """

    def __init__(
        self, timeline: int, inputs: list[Message], order: dict[str, deque[tuple[str, int]]]
    ) -> None:
        self.timeline = timeline
        self.inputs = inputs
        self.order = order

    @property
    def deliveries(self) -> int:
        """How many deliveries the plan replays."""
        return sum(len(steps) for steps in self.order.values())


def plan_replay(
    segments: Iterable[ReplaySegment],
    cut: Snapshot,
    *,
    timeline: int | None = None,
    agents: Collection[str] | None = None,
) -> ReplayPlan:
    """What to replay on top of ``cut`` from a run's replay log.

    The timeline is the last segment's; its deliveries after the cut (a delivery of a
    channel's message ``seq`` comes after the cut when the agent had received fewer than
    ``seq`` messages on that channel at the cut) make each agent's order. Inputs are those the
    environment sent after the cut, up to the first one missing.

    In a run spread over processes, every worker appends its agents' deliveries to the run's
    one log: ``timeline`` is then the one the run's coordinator says the run is on, and
    ``agents`` those a worker hosts (the plan names only theirs). A delivery logged twice
    (a segment written again after its answer was lost) is planned once.
    """
    segments = list(segments)
    if timeline is None:
        timeline = segments[-1].timeline if segments else 0
    hosted = None if agents is None else frozenset(agents)
    received: Mapping[str, Mapping[str, int]] = {
        name: agent.received for name, agent in cut.agents.items()
    }
    order: dict[str, deque[tuple[str, int]]] = {}
    environment = cut.agents.get(ENVIRONMENT)
    sent_before = environment.sent if environment is not None else {}
    next_seq = {dst: count + 1 for dst, count in sent_before.items()}
    inputs: list[Message] = []
    gap: set[str] = set()
    planned: dict[tuple[str, str], int] = {}  # per (agent, src): the newest seq planned
    for segment in segments:
        deliveries, rows = segment.decode()
        for dst, seq, kind, payload, headers, epoch in rows:
            expected = next_seq.get(dst, 1)
            if seq < expected or dst in gap:
                continue
            if seq > expected:
                gap.add(dst)  # an input was lost: the ones after it cannot be delivered
                continue
            next_seq[dst] = expected + 1
            inputs.append(
                Message(
                    ENVIRONMENT,
                    dst,
                    seq,
                    kind,
                    payload,
                    MappingProxyType(dict(headers)) if headers else EMPTY_HEADERS,
                    epoch,
                )
            )
        if segment.timeline != timeline:
            continue
        for agent, src, seq in deliveries:
            if hosted is not None and agent not in hosted:
                continue
            taken = received.get(agent, {}).get(src, 0)
            if seq > taken and seq > planned.get((agent, src), taken):
                order.setdefault(agent, deque()).append((src, seq))
                planned[agent, src] = seq
    return ReplayPlan(timeline, inputs, order)
