"""The data work behind the inspector's API: a run's journal indexed once, then windows.

[`build_index`][agentsnap.ui.queries.build_index] reads a run's journal a page at a time and
keeps a few numbers per message in arrays (no object per message): its channel, number, kind,
epoch, when it was sent and delivered, in wall time and in Lamport time, and whether a
rollback discarded it. Each channel's messages are kept in send order, which is also the
order of their send times on both axes, so a window is a pair of binary searches per channel.

**Lamport time.** Every process (the environment ``$env`` included) keeps a counter, taken
through the journal's events in the order they happened: a send's clock is the sender's clock
plus one; a delivery's is the larger of the receiver's clock and the send's, plus one.

**Discarded messages.** A rollback to snapshot S puts every agent back at S: what an agent
sent after it recorded S (its number on the channel is above the cut's ``sent`` count) and
before the rollback belongs to a timeline the rollback threw away, delivered or not. Only
messages sent between S's start and the rollback can be such messages: an earlier one was
either part of the cut or discarded by an earlier rollback. The environment's input is never
discarded: what it sent after the cut is sent again after the rollback, as are the messages
in flight across the cut.
"""

from __future__ import annotations

import bisect
from array import array
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from agentsnap.exceptions import NotFoundError
from agentsnap.inspect import (
    answer_line,
    discarded_calls,
    following_snapshots,
    model_call_totals,
    model_calls,
    previous_snapshot,
)
from agentsnap.journal import decode_segment
from agentsnap.messages import ENVIRONMENT

if TYPE_CHECKING:
    from collections.abc import Iterable

    from agentsnap.ledger import Ledger
    from agentsnap.records import RollbackInfo, Snapshot
    from agentsnap.store import Store

__all__ = [
    "NO_TIME",
    "RunIndex",
    "Window",
    "build_index",
    "micros",
    "model_calls_view",
]

NO_TIME = -(2**63)
"""What the arrays hold for a message not delivered."""

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_PAGE = 200  # journal segments read at a time


def micros(moment: datetime) -> int:
    """A time as microseconds since the Unix epoch (a naive time is taken to be UTC)."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    delta = moment - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


@dataclass
class _Channel:
    """One channel's messages in send order: their ordinals, and sorted keys to search."""

    src: str
    dst: str
    members: array[int] = field(default_factory=lambda: array("i"))
    sent_us: array[int] = field(default_factory=lambda: array("q"))
    sent_lc: array[int] = field(default_factory=lambda: array("q"))
    # The latest end (delivery, else send) of the messages up to each one: non-decreasing.
    reach_us: array[int] = field(default_factory=lambda: array("q"))
    reach_lc: array[int] = field(default_factory=lambda: array("q"))


@dataclass
class Window:
    """The messages touching a window: their ordinals, or, past the limit, only a count."""

    count: int
    ordinals: list[int] | None


class RunIndex:
    """A run's journal, decoded once: per-message columns and per-channel sorted keys.

    Ordinals number the messages in journal order. Build it with
    [`build_index`][agentsnap.ui.queries.build_index].
    """

    def __init__(self) -> None:
        self.channels: list[_Channel] = []
        self.channel_ids: dict[tuple[str, str], int] = {}
        self.kinds: list[str] = []
        self.channel = array("i")
        self.seq = array("q")
        self.kind = array("i")
        self.epoch = array("q")
        self.sent_us = array("q")
        self.delivered_us = array("q")
        self.sent_lc = array("q")
        self.delivered_lc = array("q")
        self.discarded = array("b")
        self.segment = array("i")  # which segment (in journal order) holds the message
        self.offset = array("i")  # its place in that segment
        self.positions = array("q")  # each segment's position in the store's journal
        self.end_position = 0  # the last position read
        self.agents: list[str] = []
        self.agent_ids: dict[str, int] = {}
        # Per process, its events in the order they were given clocks: times and clocks.
        self.agent_times: list[array[int]] = []
        self.agent_clocks: list[array[int]] = []
        self.lamport_max = 0
        self._span: tuple[int, int] | None = None

    def __len__(self) -> int:
        return len(self.seq)

    # --- building ------------------------------------------------------------------------

    def _agent(self, name: str) -> int:
        found = self.agent_ids.get(name)
        if found is None:
            found = self.agent_ids[name] = len(self.agents)
            self.agents.append(name)
            self.agent_times.append(array("q"))
            self.agent_clocks.append(array("q"))
        return found

    def _channel(self, src: str, dst: str) -> int:
        found = self.channel_ids.get((src, dst))
        if found is None:
            found = self.channel_ids[src, dst] = len(self.channels)
            self.channels.append(_Channel(src, dst))
            self._agent(src)
            self._agent(dst)
        return found

    def _clocks(self) -> None:
        """Give every send and delivery its Lamport clock, taking events in time order.

        At equal times a delivery goes first (a handler's sends follow the delivery that
        started it); a delivery whose send has not had its clock yet waits for it.

        The environment (``$env``, the runtime sending the program's input) receives nothing,
        so its own clock would stay low and every cut, which records it too, would dip to it.
        It is the runtime, which has seen every event so far, so each of its sends takes a
        clock above every clock given yet: still a Lamport clock (no event gets a clock below
        one that happened before it), whose input arrives at the run's present.
        """
        count = len(self.seq)
        sent = self.sent_us
        delivered = self.delivered_us
        sends = sorted(range(count), key=sent.__getitem__)
        deliveries = sorted(
            (i for i in range(count) if delivered[i] != NO_TIME), key=delivered.__getitem__
        )
        sent_lc = self.sent_lc = array("q", [0]) * count
        delivered_lc = self.delivered_lc = array("q", [0]) * count
        clocks = [0] * len(self.agents)
        src_of = [self.agent_ids[c.src] for c in self.channels]
        dst_of = [self.agent_ids[c.dst] for c in self.channels]
        channel = self.channel
        waiting: set[int] = set()
        highest = 0
        environment = self.agent_ids.get(ENVIRONMENT, -1)
        agent_times = self.agent_times
        agent_clocks = self.agent_clocks

        def deliver(i: int, when: int) -> None:
            nonlocal highest
            agent = dst_of[channel[i]]
            clock = max(clocks[agent], sent_lc[i]) + 1
            clocks[agent] = clock
            delivered_lc[i] = clock
            highest = max(highest, clock)
            agent_times[agent].append(when)
            agent_clocks[agent].append(clock)

        s = d = 0
        while s < count or d < len(deliveries):
            if d < len(deliveries) and (s >= count or delivered[deliveries[d]] <= sent[sends[s]]):
                i = deliveries[d]
                d += 1
                if sent_lc[i] == 0:  # its send comes later in this order
                    waiting.add(i)
                    continue
                deliver(i, delivered[i])
                continue
            i = sends[s]
            s += 1
            agent = src_of[channel[i]]
            clock = clocks[agent] = (highest if agent == environment else clocks[agent]) + 1
            sent_lc[i] = clock
            highest = max(highest, clock)
            when = sent[i]
            agent_times[agent].append(when)
            agent_clocks[agent].append(clock)
            if i in waiting:
                waiting.discard(i)
                deliver(i, max(when, delivered[i]))
        self.lamport_max = highest

    def _keys(self) -> None:
        """Each channel's sorted search keys, from the columns; the journal's span."""
        if self.seq:
            last_sent = max(self.sent_us)
            last_delivered = max(self.delivered_us)
            self._span = (min(self.sent_us), max(last_sent, last_delivered))
        for channel in self.channels:
            reach_us = reach_lc = NO_TIME
            for i in channel.members:
                sent_us = self.sent_us[i]
                sent_lc = self.sent_lc[i]
                channel.sent_us.append(sent_us)
                channel.sent_lc.append(sent_lc)
                delivered = self.delivered_us[i]
                reach_us = max(reach_us, sent_us if delivered == NO_TIME else delivered)
                reach_lc = max(reach_lc, sent_lc if delivered == NO_TIME else self.delivered_lc[i])
                channel.reach_us.append(reach_us)
                channel.reach_lc.append(reach_lc)

    def mark_discarded(self, rollbacks: Iterable[tuple[RollbackInfo, Snapshot]]) -> None:
        """Mark the messages each rollback threw away (see the module's description)."""
        for rollback, cut in rollbacks:
            begin = micros(cut.started_at)
            end = micros(rollback.at)
            for channel in self.channels:
                agent = cut.agents.get(channel.src)
                if agent is None or channel.src == ENVIRONMENT:
                    continue  # the environment's input after the cut is sent again
                kept = agent.sent.get(channel.dst, 0)
                lo = bisect.bisect_left(channel.sent_us, begin)
                hi = bisect.bisect_right(channel.sent_us, end)
                for j in range(lo, hi):
                    i = channel.members[j]
                    if self.seq[i] > kept:
                        self.discarded[i] = 1

    # --- reading -------------------------------------------------------------------------

    def clock_at(self, agent: str | None, when_us: int) -> int:
        """A process's Lamport clock at a wall time (the largest of all, for ``None``)."""
        if agent is None:
            return max((self.clock_at(name, when_us) for name in self.agents), default=0)
        number = self.agent_ids.get(agent)
        if number is None:
            return 0
        times, clocks = self.agent_times[number], self.agent_clocks[number]
        at = bisect.bisect_right(times, when_us) - 1
        return clocks[at] if at >= 0 else 0

    def span_us(self) -> tuple[int, int] | None:
        """The earliest send and the latest send or delivery, if any message was sent."""
        return self._span

    def selected(self, agents: set[str] | None) -> list[_Channel]:
        """The channels with an end among ``agents`` (all without a set)."""
        if agents is None:
            return self.channels
        return [c for c in self.channels if c.src in agents or c.dst in agents]

    def window(self, axis: str, low: int, high: int, agents: set[str] | None, limit: int) -> Window:
        """The messages whose line from send to delivery (or send alone) meets ``[low, high]``.

        Their ordinals sorted by send time on the axis, when there are at most ``limit``;
        else only how many there are.
        """
        lamport = axis == "lamport"
        count = 0
        spans: list[tuple[_Channel, int, int, int]] = []
        for channel in self.selected(agents):
            keys = channel.sent_lc if lamport else channel.sent_us
            reach = channel.reach_lc if lamport else channel.reach_us
            start = bisect.bisect_left(reach, low)
            inside = bisect.bisect_left(keys, low)
            stop = bisect.bisect_right(keys, high)
            if stop <= start:
                continue
            inside = max(inside, start)
            count += stop - inside
            if inside > start:  # sent before the window: only those reaching into it
                ends = self.delivered_lc if lamport else self.delivered_us
                members = channel.members
                count += sum(1 for j in range(start, inside) if ends[members[j]] >= low)
            spans.append((channel, start, inside, stop))
        if count > limit:
            return Window(count, None)
        ends = self.delivered_lc if lamport else self.delivered_us
        ordinals: list[int] = []
        for channel, start, inside, stop in spans:
            members = channel.members
            ordinals.extend(members[j] for j in range(start, inside) if ends[members[j]] >= low)
            ordinals.extend(members[inside:stop])
        keys_of = self.sent_lc if lamport else self.sent_us
        second = self.sent_us if lamport else self.sent_lc
        ordinals.sort(key=lambda i: (keys_of[i], second[i], i))
        return Window(count, ordinals)

    def density(
        self, axis: str, low: int, high: int, agents: set[str] | None, bins: int
    ) -> list[tuple[_Channel, list[int]]]:
        """How many messages each channel sent in each of ``bins`` equal parts of the window."""
        lamport = axis == "lamport"
        width = max(high - low + 1, 1)
        bounds = [low + (width * b) // bins for b in range(bins + 1)]
        result = []
        for channel in self.selected(agents):
            keys = channel.sent_lc if lamport else channel.sent_us
            cuts = [bisect.bisect_left(keys, bound) for bound in bounds]
            cuts[-1] = bisect.bisect_right(keys, high)
            counts = [cuts[b + 1] - cuts[b] for b in range(bins)]
            if any(counts):
                result.append((channel, counts))
        return result

    def find(self, src: str, dst: str, seq: int, sent_us: int | None = None) -> int:
        """The ordinal of the message ``seq`` of a channel: the latest sent, or the one sent
        at ``sent_us`` (a rollback reuses numbers).

        Raises:
            NotFoundError: The journal holds no such message.
        """  # noqa: D205
        number = self.channel_ids.get((src, dst))
        found = -1
        if number is not None:
            for i in self.channels[number].members:
                if self.seq[i] == seq and (sent_us is None or self.sent_us[i] == sent_us):
                    found = i
        if found < 0:
            raise NotFoundError(
                "message",
                f"{src}>{dst}#{seq}",
                f"the journal holds no message {seq} from {src!r} to {dst!r}"
                + ("" if sent_us is None else f" sent at {sent_us}"),
            )
        return found

    def row(self, i: int) -> dict[str, Any]:
        """What the API says of one message (without its payload)."""
        channel = self.channels[self.channel[i]]
        delivered = self.delivered_us[i]
        return {
            "src": channel.src,
            "dst": channel.dst,
            "seq": self.seq[i],
            "kind": self.kinds[self.kind[i]],
            "epoch": self.epoch[i],
            "sent_us": self.sent_us[i],
            "delivered_us": None if delivered == NO_TIME else delivered,
            "sent_lc": self.sent_lc[i],
            "delivered_lc": None if delivered == NO_TIME else self.delivered_lc[i],
            "discarded": bool(self.discarded[i]),
        }

    async def payload(self, store: Store, run_id: str, i: int) -> tuple[Any, dict[str, Any]]:
        """The payload and headers of message ``i``, read from its segment in the store."""
        number = self.segment[i]
        after = self.positions[number - 1] if number else 0
        page = await store.load_journal_page(run_id, after=after, limit=1)
        if not page:
            raise NotFoundError("message", str(i), "the run's journal changed; reload the run")
        _, segment = page[0]
        columns = decode_segment(segment)
        offset = self.offset[i]
        headers = columns.headers.get(str(offset), {})
        return columns.payloads[offset], dict(headers) if isinstance(headers, dict) else {}

    # --- where each process recorded a snapshot -----------------------------------------

    def _send_time(self, src: str, dst: str, seq: int, before: int) -> tuple[int, int] | None:
        """When message ``seq`` of a channel was last sent at or before ``before``: its wall
        time and the sender's Lamport clock then.
        """  # noqa: D205
        number = self.channel_ids.get((src, dst))
        if number is None or seq <= 0:
            return None
        channel = self.channels[number]
        j = self._seek(channel, bisect.bisect_right(channel.sent_us, before) - 1, seq)
        return None if j < 0 else (channel.sent_us[j], self.sent_lc[channel.members[j]])

    def _delivery_time(self, src: str, dst: str, seq: int, before: int) -> tuple[int, int] | None:
        """When message ``seq`` of a channel was last delivered at or before ``before``: its
        wall time and the receiver's Lamport clock then.
        """  # noqa: D205
        number = self.channel_ids.get((src, dst))
        if number is None or seq <= 0:
            return None
        channel = self.channels[number]
        j = bisect.bisect_right(channel.sent_us, before) - 1
        while j >= 0:
            j = self._seek(channel, j, seq)
            if j < 0:
                return None
            i = channel.members[j]
            when = self.delivered_us[i]
            if when != NO_TIME and when <= before:
                return when, self.delivered_lc[i]
            j -= 1
        return None

    def _seek(self, channel: _Channel, j: int, seq: int) -> int:
        """The last place at or before ``j`` in the channel holding number ``seq``."""
        members = self.seq
        while j >= 0:
            here = members[channel.members[j]]
            if here == seq:
                return j
            if here > seq:  # numbers count up by one within a timeline: jump
                jump = j - (here - seq)
                if jump >= 0 and members[channel.members[jump]] == seq:
                    return jump
            j -= 1
        return -1

    def _next_time(self, src: str, dst: str, seq: int, after: int, *, delivery: bool) -> int | None:
        """The first send (or delivery) of message ``seq`` of a channel at or after ``after``."""
        number = self.channel_ids.get((src, dst))
        if number is None:
            return None
        channel = self.channels[number]
        start = bisect.bisect_left(channel.reach_us, after)
        for j in range(start, len(channel.members)):
            i = channel.members[j]
            if self.seq[i] != seq:
                continue
            when = self.delivered_us[i] if delivery else self.sent_us[i]
            if when != NO_TIME and when >= after:
                return when
        return None

    def recorded(self, snapshot: Snapshot) -> dict[str, dict[str, int]]:
        """Where each process recorded ``snapshot``: its wall time and Lamport clock then.

        An agent recorded after the delivery numbered ``received[src]`` of each incoming
        channel and the send numbered ``sent[dst]`` of each outgoing one, and before the next
        ones; the earliest time those bounds and the snapshot's own times allow is taken. When
        the journal does not bound it, the snapshot's start.

        In Lamport time, a recording may sit anywhere after the last event the cut holds on
        the agent's lane and before the next one. Every agent's is placed at one common
        position, the clock of the latest event the cut holds on any lane, where its own
        events allow it (else just before its next event): a consistent cut drawn as
        straight as the clocks permit, and never crossing a later cut on a lane (the
        positions grow with the events held).
        """
        start = micros(snapshot.started_at)
        end = max(micros(snapshot.completed_at or snapshot.started_at), start)
        result: dict[str, dict[str, int]] = {}
        for name, cut in snapshot.agents.items():
            events = [
                self._delivery_time(src, name, count, end) for src, count in cut.received.items()
            ]
            events += [self._send_time(name, dst, count, end) for dst, count in cut.sent.items()]
            lows = [event[0] for event in events if event is not None]
            low = max(lows, default=None)
            # In Lamport time the recording comes right after the last event the cut holds
            # (and before the first it does not): read from the counters, not from the wall
            # time, so that successive cuts never cross on a lane, nor one another.
            clock = max((event[1] for event in events if event is not None), default=0)
            floor = low if low is not None else start
            highs = [
                self._next_time(src, name, count + 1, floor, delivery=True)
                for src, count in cut.received.items()
            ]
            highs += [
                self._next_time(name, dst, count + 1, floor, delivery=False)
                for dst, count in cut.sent.items()
            ]
            high = min((t for t in highs if t is not None), default=None)
            if low is None and high is None:
                when = start
            else:
                lo = max(low, start) if low is not None else start
                hi = min(high, end) if high is not None else end
                if lo <= hi:
                    when = lo
                elif low is not None:
                    when = low
                else:
                    assert high is not None
                    when = high
            result[name] = {"at_us": when, "lc": clock}
        common = max((place["lc"] for place in result.values()), default=0)
        for name, place in result.items():
            place["lc"] = max(place["lc"], min(common, self._next_clock(name, place["lc"]) - 1))
        return result

    def _next_clock(self, agent: str, clock: int) -> int:
        """The clock of the first event on ``agent``'s lane after ``clock`` (a lane's clocks
        grow), or one past the run's highest clock when there is none.
        """  # noqa: D205
        number = self.agent_ids.get(agent)
        if number is None:
            return self.lamport_max + 1
        clocks = self.agent_clocks[number]
        at = bisect.bisect_right(clocks, clock)
        return clocks[at] if at < len(clocks) else self.lamport_max + 1


async def build_index(store: Store, run_id: str, rollbacks: list[RollbackInfo]) -> RunIndex:
    """Read run ``run_id``'s journal, a page at a time, into a ``RunIndex``.

    A delivery is matched with the latest send of its channel and number made before it
    that is not delivered yet (else the latest one), as
    [`read_journal`][agentsnap.journal.read_journal] matches them.

    Args:
        store: The store holding the run.
        run_id: The run's full id.
        rollbacks: The run's rollbacks; each one's snapshot is read to mark the messages it
            discarded.

    Raises:
        NotFoundError: The store holds no such run.
        ValueError: A journal segment is not in the journal's format.
    """
    index = RunIndex()
    kinds: dict[str, int] = {}
    waiting: dict[tuple[int, int], list[int]] = {}
    after = 0
    while True:
        page = await store.load_journal_page(run_id, after=after, limit=_PAGE)
        for position, segment in page:
            number = len(index.positions)
            index.positions.append(position)
            columns = decode_segment(segment)
            channel = index._channel(segment.src, segment.dst)
            if segment.event == "send":
                for offset, (seq, when) in enumerate(zip(columns.seqs, columns.at, strict=True)):
                    kind = columns.kinds[offset]
                    kind_id = kinds.get(kind)
                    if kind_id is None:
                        kind_id = kinds[kind] = len(index.kinds)
                        index.kinds.append(str(kind))
                    ordinal = len(index.seq)
                    waiting.setdefault((channel, seq), []).append(ordinal)
                    index.channel.append(channel)
                    index.seq.append(seq)
                    index.kind.append(kind_id)
                    index.epoch.append(int(columns.epochs[offset]))
                    index.sent_us.append(when)
                    index.delivered_us.append(NO_TIME)
                    index.segment.append(number)
                    index.offset.append(offset)
                    index.channels[channel].members.append(ordinal)
                continue
            for seq, when in zip(columns.seqs, columns.at, strict=True):
                key = (channel, seq)
                ordinals = waiting.get(key)
                if not ordinals:
                    continue
                chosen = len(ordinals) - 1
                for k in range(len(ordinals) - 1, -1, -1):
                    if index.sent_us[ordinals[k]] <= when:
                        chosen = k
                        break
                index.delivered_us[ordinals.pop(chosen)] = when
                if not ordinals:
                    del waiting[key]
        if page:
            after = index.end_position = page[-1][0]
        if len(page) < _PAGE:
            break
    index.discarded = array("b", bytes(len(index.seq)))
    index._agent(ENVIRONMENT)
    index._clocks()
    index._keys()
    cuts: dict[str, Snapshot] = {}
    pairs = []
    for rollback in rollbacks:
        cut = cuts.get(rollback.snapshot_id)
        if cut is None:
            try:
                cut = cuts[rollback.snapshot_id] = await store.load_snapshot(rollback.snapshot_id)
            except NotFoundError:
                continue
        pairs.append((rollback, cut))
    index.mark_discarded(pairs)
    return index


async def model_calls_view(
    store: Store,
    run_id: str,
    ledger: Ledger | None = None,
    *,
    agent: str | None = None,
    snapshot: Snapshot | None = None,
) -> dict[str, Any]:
    """A run's model calls for the inspector: of one agent, or those before one cut.

    Each call is tied to the cut it leads to: the first snapshot started when or after the
    call started (see [`following_snapshots`][agentsnap.inspect.following_snapshots]), so
    that a cut's calls are those made since the previous cut.

    Args:
        store: The store holding the run.
        run_id: The run's full id.
        ledger: Where the calls are recorded; by default the ledger in the store's database.
        agent: Only this agent's calls.
        snapshot: Only the calls made since the cut before this snapshot, by the agents this
            snapshot recorded.

    Returns:
        ``{"calls", "totals", "timeline", "previous"}``: each call with ``agent, message,
        position, timeline, model, input_tokens, output_tokens, latency_ms, started_at_us,
        replays, discarded, answer`` (the answer's first line), ``request``, ``response``
        and the cut it leads to (``snapshot_id``, ``snapshot_seq``, ``None`` after the last
        one); ``totals`` as [`model_call_totals`][agentsnap.inspect.model_call_totals]
        counts the calls returned; ``timeline``, the latest a call of the run was made on;
        ``previous``, with ``snapshot``, the cut before it (``id``, ``seq``,
        ``started_at_us``) or ``None``.
    """
    records = await model_calls(store, run_id, ledger=ledger)
    summaries = await store.list_snapshot_summaries(run_id) if records or snapshot else []
    cuts = following_snapshots(records, summaries)
    before = None if snapshot is None else previous_snapshot(summaries, snapshot.id)
    previous = (
        None
        if before is None
        else {"id": before.id, "seq": before.seq, "started_at_us": micros(before.started_at)}
    )
    rows = []
    kept = []
    for record, cut, discarded in zip(records, cuts, discarded_calls(records), strict=True):
        if agent is not None and record.agent != agent:
            continue
        if snapshot is not None and (
            cut is None or cut.id != snapshot.id or record.agent not in snapshot.agents
        ):
            continue
        kept.append(record)
        rows.append(
            {
                "agent": record.agent,
                "message": record.message_id,
                "position": record.position,
                "timeline": record.timeline,
                "model": record.model,
                "input_tokens": record.input_tokens,
                "output_tokens": record.output_tokens,
                "latency_ms": record.latency_ms,
                "started_at_us": micros(record.started_at),
                "replays": record.replays,
                "discarded": discarded,
                "answer": answer_line(record.response),
                "request": record.request,
                "response": record.response,
                "snapshot_id": None if cut is None else cut.id,
                "snapshot_seq": None if cut is None else cut.seq,
            }
        )
    return {
        "calls": rows,
        "totals": model_call_totals(kept).model_dump(mode="json"),
        "timeline": max((r.timeline for r in records), default=0),
        "previous": previous,
    }


def channel_counts(index: RunIndex) -> dict[str, Any]:
    """Who talks to whom in a run: its agents, and per channel the messages it carried.

    Returns:
        ``{"agents": [name, ...], "channels": [{"src", "dst", "messages", "discarded"}]}``,
        channels ordered by ``(src, dst)``; ``discarded`` counts the messages a rollback
        undid.
    """
    sent = [0] * len(index.channels)
    undone = [0] * len(index.channels)
    for i, channel in enumerate(index.channel):
        sent[channel] += 1
        if index.discarded[i]:
            undone[channel] += 1
    channels = [
        {"src": c.src, "dst": c.dst, "messages": sent[i], "discarded": undone[i]}
        for i, c in enumerate(index.channels)
    ]
    channels.sort(key=lambda c: (c["src"], c["dst"]))
    return {"agents": sorted(index.agents), "channels": channels}
