"""What a run spread over processes keeps of its stream and snapshot parts.

A run's JetStream stream holds every item sent between its processes, and the store holds
every worker's part of every snapshot: both grow for as long as the run goes on. With a
[`StreamRetention`][agentsnap.distributed.StreamRetention], the run's coordinator drops what
no snapshot it keeps can need: it keeps the newest ``keep`` complete snapshots restorable
from the stream, and, at most once every ``every`` complete snapshots,

- purges the stream below the lowest stream sequence the oldest of them needs: the lowest
  ``first_seq`` among its parts' [`ChannelOffsets`][agentsnap.distributed.ChannelOffsets]
  (the first message in flight on a channel, or the item that closed it), and below no
  consumer's position (the lowest sequence a worker's consumer has not acknowledged);
- deletes the parts of the snapshots before it (only the parts held their stream ranges).

The snapshots themselves stay in the store, complete and inspectable, whatever is purged:
each holds its agents' states and the messages in flight across its cut. Only restoring from
the stream (replaying a channel from its recorded range) needs what the retention keeps.
A pass that cannot reach the NATS server or the store is logged and tried again at the next
one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from agentsnap.exceptions import ConfigurationError

if TYPE_CHECKING:
    from agentsnap.jetstream import JetStreamLink
    from agentsnap.store import DistributedParts

__all__ = ["Retained", "StreamRetention", "retain"]

logger = logging.getLogger("agentsnap.distributed")


@dataclass(frozen=True)
class StreamRetention:
    """How much of a run's stream and snapshot parts its coordinator keeps.

    Attributes:
        keep: The newest complete snapshots kept restorable from the stream (at least 1).
        every: Look at what can go at most once every this many complete snapshots.
    """

    keep: int = 3
    every: int = 10

    def __post_init__(self) -> None:
        if self.keep < 1 or self.every < 1:
            raise ConfigurationError(
                f"StreamRetention keeps at least 1 snapshot and looks at least every 1 "
                f"(got keep={self.keep}, every={self.every})"
            )


@dataclass(frozen=True)
class Retained:
    """What one pass of the retention did.

    Attributes:
        oldest: The oldest snapshot kept restorable (its number).
        purged_below: The stream was purged below this sequence (0: not purged).
        parts_deleted: Parts of snapshots before ``oldest`` deleted from the store.
    """

    oldest: int
    purged_below: int
    parts_deleted: int


async def retain(
    link: JetStreamLink, store: DistributedParts, run_id: str, oldest: int
) -> Retained:
    """Purge ``run_id``'s stream below what snapshot ``oldest`` needs, and older parts.

    Args:
        link: The connection to NATS.
        store: The run's store.
        run_id: The run.
        oldest: The oldest complete snapshot to keep restorable.

    Raises:
        TransportError: The NATS server did not answer.
    """
    parts = await store.load_snapshot_parts(run_id, oldest)
    starts = [offsets.first_seq for part in parts for offsets in part.offsets]
    floor = min(starts, default=0)
    if floor > 1:
        consumers = await link.consumer_floor(run_id)
        if consumers is not None:
            floor = min(floor, consumers)
    purged = 0
    if floor > 1:
        await link.purge_below(run_id, floor)
        purged = floor
    deleted = await store.delete_snapshot_parts(run_id, oldest)
    logger.debug(
        "run %s: stream purged below %d, %d parts before snapshot %d deleted",
        run_id,
        purged,
        deleted,
        oldest,
    )
    return Retained(oldest=oldest, purged_below=purged, parts_deleted=deleted)


class Retainer:
    """Runs the retention of one run as its snapshots complete, one pass at a time."""

    def __init__(
        self, link: JetStreamLink, store: DistributedParts, run_id: str, policy: StreamRetention
    ) -> None:
        self.policy = policy
        self.passes: list[Retained] = []
        """What each pass did, oldest first."""
        self._link = link
        self._store = store
        self._run_id = run_id
        self._complete: list[int] = []
        self._since = 0
        self._task: asyncio.Task[None] | None = None

    def completed(self, seq: int) -> None:
        """Snapshot ``seq`` is complete: run a pass if ``every`` of them came since the last."""
        self._complete.append(seq)
        self._since += 1
        policy = self.policy
        if len(self._complete) < policy.keep or self._since < policy.every:
            return
        if self._task is not None and not self._task.done():
            return  # the pass under way covers it; the next one goes further
        self._since = 0
        oldest = self._complete[-policy.keep]
        del self._complete[: -policy.keep]
        self._task = asyncio.get_running_loop().create_task(
            self._pass(oldest), name="agentsnap:retention"
        )

    async def _pass(self, oldest: int) -> None:
        try:
            self.passes.append(await retain(self._link, self._store, self._run_id, oldest))
        except Exception as exc:  # the server or store is away: the next pass tries again
            logger.warning("run %s: retention not applied: %r", self._run_id, exc)

    async def close(self) -> None:
        """Wait for the pass under way, if any."""
        task, self._task = self._task, None
        if task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await task
