"""What a coordinator that takes a run over reads back: the run's timeline, numbering and input.

The coordinator of a run spread over processes keeps little of its own: the snapshots and
rollbacks are in the store, and what the environment sent is in the run's stream. A
coordinator started again for a run (``DistributedRun.take_over``) reads them back here:

- the complete snapshots, the rollbacks, and from them which snapshots lie on a timeline a
  rollback left (those are never a rollback's target again);
- the run's timeline: the newest one its replay log marks (a coordinator marks each one it
  starts there before ordering it, and a worker logs its order on it before any effect
  depends on it), so that the takeover redoes the work after the cut on the same timeline;
- the newest snapshot number any process may have seen: the highest stored, or carried by an
  item the environment published (a marker's snapshot, a message's epoch), since every
  snapshot begins at the environment;
- every message the environment sent, in the order it sent them, so that a rollback sends
  again what was sent after its cut, as the dead coordinator would have.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from agentsnap.exceptions import RunError
from agentsnap.jetstream.codec import ROOT, decode, encode_token, stream_name
from agentsnap.messages import ENVIRONMENT, Marker, Message
from agentsnap.records import RollbackInfo, Snapshot, SnapshotStatus

if TYPE_CHECKING:
    from agentsnap.jetstream import JetStreamLink
    from agentsnap.store import DistributedStore

__all__ = [
    "GENERATIONS_PER_COORDINATOR",
    "MAX_COORDINATORS",
    "EnvironmentLog",
    "StoredTimeline",
    "generation_floor",
]

GENERATIONS_PER_COORDINATOR = 1 << 20
"""Generations one coordinator may order: the coordinator holding the run's lease with token
``t`` numbers its rollbacks from ``(t - 1) * 2**20 + 1`` on, above every generation a
coordinator before it could have ordered (even one it never recorded, whose processes are
still in it). Generations are stored as 32-bit integers (the timeline of ledger entries and
model calls): a run has at most ``MAX_COORDINATORS`` coordinators."""

MAX_COORDINATORS = (1 << 31) // GENERATIONS_PER_COORDINATOR - 1
"""Coordinators a run may have, the first included (2,047)."""

_BATCH = 512
_FETCH_TIMEOUT = 5.0


def generation_floor(token: int) -> int:
    """The generation a coordinator holding the run's lease with ``token`` starts from.

    Raises:
        RunError: ``token`` is beyond ``MAX_COORDINATORS``: the run's generations would no
            longer fit the store.
    """
    if token > MAX_COORDINATORS:
        raise RunError(
            f"the run has had {token} coordinators, more than the {MAX_COORDINATORS} a run "
            "may have (each numbers its rollbacks in a range of its own): fork the run from "
            "its last complete snapshot instead of taking it over again"
        )
    return (max(token, 1) - 1) * GENERATIONS_PER_COORDINATOR


@dataclass
class StoredTimeline:
    """A run's snapshots and rollbacks as its store holds them.

    Attributes:
        complete: The complete snapshots, by number.
        failed: The failed snapshots, by number.
        rollbacks: The rollbacks, oldest first.
        left: Per rollback, the snapshot numbers ``(lo, hi]`` of the timeline it left: the
            snapshots after its target begun before it.
        last_seq: The highest snapshot number stored.
        line: The run's timeline: the newest one its replay log marks (0: the first).
    """

    complete: list[Snapshot] = field(default_factory=list)
    failed: list[Snapshot] = field(default_factory=list)
    rollbacks: list[RollbackInfo] = field(default_factory=list)
    left: list[tuple[int, int]] = field(default_factory=list)
    last_seq: int = 0
    line: int = 0

    @classmethod
    async def load(cls, store: DistributedStore, run_id: str) -> StoredTimeline:
        """Read the run's snapshots, rollbacks and timeline."""
        snapshots = sorted(await store.list_snapshots(run_id), key=lambda s: s.seq)
        rollbacks = sorted(await store.list_rollbacks(run_id), key=lambda r: r.at)
        complete = [s for s in snapshots if s.status is SnapshotStatus.COMPLETE]
        by_id = {s.id: s for s in complete}
        left: list[tuple[int, int]] = []
        for rollback in rollbacks:
            target = by_id.get(rollback.snapshot_id)
            lo = target.seq if target is not None else 0
            # A rollback is recorded once every process went back: every snapshot begun
            # before then and numbered after its target is of the timeline it left (those
            # begun during it failed).
            begun = [s.seq for s in snapshots if s.started_at < rollback.at and s.seq > lo]
            if begun:
                left.append((lo, max(begun)))
        return cls(
            complete=complete,
            failed=[s for s in snapshots if s.status is SnapshotStatus.FAILED],
            rollbacks=rollbacks,
            left=left,
            last_seq=max((s.seq for s in snapshots), default=0),
            line=max((segment.timeline for segment in await store.load_replay(run_id)), default=0),
        )

    def missing(self, upto: int) -> list[int]:
        """The snapshot numbers up to ``upto`` with nothing stored: begun, never finished."""
        stored = {s.seq for s in self.complete} | {s.seq for s in self.failed}
        return [seq for seq in range(1, upto + 1) if seq not in stored]


@dataclass
class EnvironmentLog:
    """What the environment published to the run's stream.

    Attributes:
        messages: Every message it sent, once each, in the order it sent them.
        before: Per agent, the messages sent to it that the stream no longer holds (dropped
            by retention): ``messages`` follows a cut that had sent these.
        epoch: The newest snapshot number its items carry (0: none).
    """

    messages: list[Message] = field(default_factory=list)
    before: dict[str, int] = field(default_factory=dict)
    epoch: int = 0

    @classmethod
    async def read(cls, link: JetStreamLink, run_id: str) -> EnvironmentLog:
        """Read every item the environment published to the run's stream, oldest first."""
        subject = f"{ROOT}.{encode_token(run_id)}.*.{encode_token(ENVIRONMENT)}"
        config = ConsumerConfig(
            deliver_policy=DeliverPolicy.ALL,
            ack_policy=AckPolicy.NONE,
            inactive_threshold=30.0,
        )
        subscription = await link.js.pull_subscribe(
            subject, stream=stream_name(run_id), config=config
        )
        log = cls()
        seen: set[tuple[str, int]] = set()
        try:
            pending = (await subscription.consumer_info()).num_pending
            while pending:
                try:
                    batch = await subscription.fetch(min(_BATCH, pending), timeout=_FETCH_TIMEOUT)
                except TimeoutError:
                    break  # the stream gave what it holds; nothing newer is needed
                for msg in batch:
                    pending = msg.metadata.num_pending
                    log._take(msg.headers or {}, msg.data, seen)
                await asyncio.sleep(0)
        finally:
            await subscription.unsubscribe()
        return log

    def _take(self, headers: dict[str, str], body: bytes, seen: set[tuple[str, int]]) -> None:
        try:
            item = decode(headers, body).item
        except ValueError:
            return  # not an item of the run's channels
        if type(item) is Marker:
            self.epoch = max(self.epoch, item.snapshot)
            return
        assert type(item) is Message
        self.epoch = max(self.epoch, item.epoch)
        key = (item.dst, item.seq)
        if key in seen:
            return  # sent again after a rollback: its first publication placed it
        seen.add(key)
        if item.dst not in self.before:
            self.before[item.dst] = item.seq - 1
        self.messages.append(item)
