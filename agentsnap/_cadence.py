"""When a runtime takes snapshots without being asked: its snapshot policy, carried out."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from agentsnap._phases import Phase

if TYPE_CHECKING:
    from agentsnap._record import RunParts
    from agentsnap._team import Team
    from agentsnap.exceptions import HandlerFailed
    from agentsnap.handles import SnapshotHandle
    from agentsnap.snapshot import SnapshotPolicy

__all__ = ["Cadence"]

logger = logging.getLogger("agentsnap")

_WRITES_BEHIND = 16  # snapshot writes in flight at which policy snapshots are skipped
_STRETCH = 6  # timed snapshots start at most once per this many times the latest one took


class Cadence:
    """Takes the snapshots of a runtime's policy: the first cut, every so many deliveries or
    seconds, and the last one as the run goes idle or closes.

    Args:
        policy: The snapshot policy.
        run: The runtime's parts (no snapshot once the record's lease is lost; the replay
            log is written with the first cut).
        team: The team (its deliveries are counted, its first delivery waits for the first
            cut).
        failures: The run's handler failures (no last snapshot after one).
    """  # noqa: D205

    def __init__(
        self,
        policy: SnapshotPolicy,
        run: RunParts,
        *,
        team: Team,
        failures: Sequence[HandlerFailed],
    ) -> None:
        self.policy = policy
        self._run = run
        self._team = team
        self._failures = failures
        self._timer: asyncio.Task[None] | None = None
        team.count_from(policy.every_deliveries or 0)

    def start(self) -> None:
        """Start the timed snapshots, when the policy has them."""
        if self.policy.every_seconds is not None:
            self._timer = asyncio.get_running_loop().create_task(
                self._tick(self.policy.every_seconds), name="agentsnap:snapshot-timer"
            )

    async def stop(self) -> None:
        """Stop the timed snapshots."""
        if self._timer is not None:
            self._timer.cancel()
            await asyncio.gather(self._timer, return_exceptions=True)

    def first(self) -> None:
        """Take the run's first cut; nothing is delivered until it is stored.

        A crash can then never leave a run that did something without a cut to resume from.
        """
        handle = self._run.coordinator.capture()
        if handle is None:
            self._run.coordinator.begin(None)
            return
        self._team.gate = asyncio.ensure_future(self._first_cut_stored(handle))

    async def _first_cut_stored(self, handle: SnapshotHandle) -> None:
        """The first cut is stored, and with it the input sent so far."""
        await handle.settled()
        if self._run.replay is not None:
            try:  # a run killed before its first side effect still gets its input back
                await self._run.replay.flush()
            except Exception as exc:
                logger.warning(
                    "run %s: the replay log was not written: %s", self._run.record.run_id, exc
                )

    def last(self, live: bool | None = None) -> SnapshotHandle | None:
        """Record where the run stands as it goes idle or closes (``SnapshotPolicy.at_end``).

        Taken at once (no markers) when no handler is half-way and nothing was sent or
        delivered since the newest snapshot; ``None`` when none was taken. ``live``: the run
        was running (default: it is).
        """
        if live is None:
            live = self._run.phases.now is Phase.RUNNING
        coordinator = self._run.coordinator
        if (
            not (self.policy.at_end and live)
            or self._run.record.lost is not None
            or coordinator.suspended is not None
            # A cut after a failed handler would hold its message as handled: resuming the
            # failed run from the newest cut before it handles that message again.
            or self._failures
        ):
            return None
        newest = coordinator.newest
        if newest is not None:
            sent = delivered = 0
            for channel in self._run.bus.channels.values():
                sent += channel.sent
                delivered += channel.delivered
            then_sent = then_received = 0
            for cut in newest.agents.values():
                then_sent += sum(cut.sent.values())
                then_received += sum(cut.received.values())
            if (sent, delivered) == (then_sent, then_received):
                return None  # nothing happened since: that snapshot is where the run stands
        return coordinator.capture()

    def due(self) -> SnapshotHandle | None:
        """Begin a policy snapshot, unless one would not help now."""
        coordinator = self._run.coordinator
        if (
            # Not before the run has its first cut: input taken, or resume() or fork_from()
            # done (a timed snapshot must not take the place of the cut they restore).
            self._run.phases.taking_input
            and coordinator.suspended is None
            and len(coordinator.active) < self.policy.max_in_progress
            # While the store is behind (slow, or away), a policy snapshot is skipped rather
            # than queued: the next one records everything it would have.
            and coordinator.writing < _WRITES_BEHIND
        ):
            return coordinator.begin(None)
        return None

    async def _tick(self, seconds: float) -> None:
        # Snapshots by time: the next one waits until the store has taken the ones before
        # (up to max_in_progress of them), so that a slow store cannot make them pile up;
        # and the period stretches to _STRETCH times the time the latest one took from its
        # start until it was written, so that snapshots whose recording or writing takes
        # long (a big team, a round that keeps every agent busy) take a sixth of the run's
        # time at most (the store's writer thread works beside the loop: under a quarter
        # counting it), however short ``every_seconds`` is.
        loop = asyncio.get_running_loop()
        outstanding: list[SnapshotHandle] = []
        limit = self.policy.max_in_progress
        period = seconds
        started = loop.time()

        def settled(begun: float) -> Callable[[asyncio.Future[None]], None]:
            def took(_: asyncio.Future[None]) -> None:
                nonlocal period
                period = max(seconds, _STRETCH * (loop.time() - begun))

            return took

        while True:
            await asyncio.sleep(max(0.0, started + period - loop.time()))
            outstanding = [handle for handle in outstanding if not handle.done()]
            if len(outstanding) >= limit:
                await asyncio.sleep(seconds)  # then look again
                continue
            started = loop.time()
            handle = self.due()
            if handle is not None:
                outstanding.append(handle)
                asyncio.ensure_future(handle.settled()).add_done_callback(settled(started))
