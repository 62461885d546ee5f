"""Recovery of a run in one process: rollbacks one at a time, retry budgets, work lost to a
database fault redone once it answers, rollbacks on request, and resuming onto the run's
current cut.

It is the one-process `TeamEvents`: the team reports what is
rare to it. The rules it shares with a run spread over processes stay in
[`agentsnap.rollback`][agentsnap.rollback]: the retry policy and its budget, restoring a cut,
finding the current cut.
"""  # noqa: D205

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from agentsnap._phases import Phase
from agentsnap._team import PROBE_FIRST, PROBE_MAX, tell_rollback, until_answers
from agentsnap.exceptions import (
    ConfigurationError,
    HandlerFailed,
    OutputRejected,
    RunError,
    SnapshotDamaged,
)
from agentsnap.fork import check_complete
from agentsnap.messages import ENVIRONMENT
from agentsnap.records import RollbackInfo, SnapshotStatus
from agentsnap.redaction import unredact_snapshot
from agentsnap.replay import plan_replay
from agentsnap.requests import withdraw_discarded
from agentsnap.rollback import RetryBudget, RetryPolicy, current_cut, earlier_targets

if TYPE_CHECKING:
    from agentsnap._cadence import Cadence
    from agentsnap._following import Following
    from agentsnap._record import RunParts
    from agentsnap._team import Team
    from agentsnap.messages import Message
    from agentsnap.records import ReplaySegment, Snapshot
    from agentsnap.replay import InputLog, ReplayPlan

__all__ = ["Line", "Recovery"]

logger = logging.getLogger("agentsnap")

_PROBE_KEY = "agentsnap:probe"  # a ledger key read to see whether the ledger answers


class Line:
    """The run's timeline, for a runtime without a replay log (which keeps it otherwise)."""

    __slots__ = ("resumed", "timeline")

    def __init__(self) -> None:
        self.timeline = 0
        self.resumed = -1  # the newest timeline an earlier process may have recorded in


def _environment_sent(snapshot: Snapshot) -> Mapping[str, int]:
    """How many messages the environment had sent each agent at ``snapshot``'s cut."""
    environment = snapshot.agents.get(ENVIRONMENT)
    return environment.sent if environment is not None else {}


class Recovery:
    """Rolls a one-process run back, one rollback at a time, and puts it on its current cut.

    Build it, then the `Team` with it as its events, then
    ``attach`` the team and the cadence.

    Args:
        run: The runtime's parts: rollbacks are recorded through its record, its ledger is
            probed while the database is away, its replay log keeps the run's timeline, and
            rollback spans go to its telemetry.
        policy: The retry policy.
        inputs: The environment's input, sent again after a rollback.
        line: The run's timeline when there is no replay log.

    Attributes:
        failures: Every handler failure so far, oldest first.
        history: Every rollback of this runtime, oldest first.
        exhausted: Set when the run stopped: the retry policy gave up
            (``RollbackExhausted``), or the snapshot to go back to is damaged in the store
            (``SnapshotDamaged``).
    """

    def __init__(self, run: RunParts, *, policy: RetryPolicy, inputs: InputLog, line: Line) -> None:
        self._run = run
        self._inputs = inputs
        self._line = line
        self._following: Following | None = None
        redaction = run.record.redaction
        self._redact = redaction.text if redaction is not None else None
        self._budget = RetryBudget(policy)
        self.redoing = self._budget.open
        """The episodes under way, by the message whose handling ends them once it passes;
        usually empty."""
        self.failures: list[HandlerFailed] = []
        self.history: list[RollbackInfo] = []
        self.exhausted: RunError | None = None
        self.rolling_back = False
        self.lock = asyncio.Lock()
        """Held by each rollback: one at a time."""
        # Rollbacks for a database that keeps failing are spaced out (see lost()).
        self._last_fault_rollback = -float("inf")
        self._fault_pause = 0.0
        self._team: Team | None = None
        self._cadence: Cadence | None = None

    def attach(self, team: Team, cadence: Cadence, following: Following | None) -> None:
        """Work on ``team``; have ``cadence`` take a snapshot when a redone output passed, and
        ``following`` (``None``: there is no replay log) follow a resumed run's plans.
        """  # noqa: D205
        self._team = team
        self._cadence = cadence
        self._following = following
        team.redoing = self.redoing

    @property
    def team(self) -> Team:
        """The team rolled back."""
        assert self._team is not None, "Recovery.attach() was not called"
        return self._team

    # -- what the team reports --------------------------------------------------------------

    def failed(self, failure: HandlerFailed) -> None:
        """A handler raised: the other agents go on; the run ends failed."""
        self.failures.append(failure)

    def passed(self, message: Message) -> None:
        """A message redone after a rejection passed: a cut after it keeps a later rollback
        from redoing it again.
        """  # noqa: D205
        if self._budget.passed((message.src, message.dst, message.seq)):
            self.snapshot_due()

    def snapshot_due(self) -> None:
        """A snapshot of the policy is due."""
        assert self._cadence is not None
        self._cadence.due()

    async def rejected(
        self, rejection: OutputRejected, generation: int, handling: Message | None = None
    ) -> None:
        """Act on a rejected output: at most one rollback at a time, for the live timeline.

        A rejection raised while a rollback is under way, or by a handler that began before
        the latest rollback (its work was thrown away), or after the run stopped, is dropped
        and uses no retry budget.
        """
        team = self.team
        if (
            generation != team.generation
            or self.rolling_back
            or self.exhausted is not None
            or self._run.phases.closed
        ):
            logger.debug("dropped a rejection from a discarded timeline: %s", rejection)
            return
        self.rolling_back = True
        team.generation += 1
        # Stop the world now, before any other handler sees what this one did.
        self._run.bus.scheduler.pause()
        coordinator = self._run.coordinator
        coordinator.suspended = "the run rolled back before the snapshot completed"
        coordinator.abort_all("an output was rejected before the snapshot completed")
        try:
            async with self.lock:
                work = self._reject(rejection, handling)
                if self._run.telemetry is not None:
                    work = self._run.telemetry.rolling_back(
                        work, self._run.id, rejection=rejection, redact=self._redact
                    )
                info = await work
                if info is None:
                    self._run.phases.stop(self.exhausted)
                else:
                    await self.after_rollback(info)
        except Exception as exc:
            # The rejected output was not redone: the run cannot end as succeeded, even when
            # the application catches this.
            self._run.phases.stop(exc)
            raise
        finally:
            self.rolling_back = False

    async def lost(self, error: Exception, agent: str, message: Message, generation: int) -> None:
        """A handler could not finish because the database did not answer in time.

        Its message was taken off its channel and what it did is half done, so the run goes
        back to its last cut once the database answers again, and redoes the work from
        there: nothing is lost, and the ledger makes the effects happen once. Like a
        rejection, at most one such rollback runs at a time, and one from a handler of a
        discarded timeline is dropped.
        """
        team = self.team
        if generation != team.generation or self.rolling_back or self._run.phases.closed:
            logger.debug("dropped a database failure from a discarded timeline: %s", error)
            return
        if self.exhausted is not None or self._run.record.lost is not None:
            return
        coordinator = self._run.coordinator
        target = coordinator.latest
        if target is None:  # no cut to redo the work from
            team.failed(agent, message, error)
            return
        self.rolling_back = True
        team.generation += 1
        self._run.bus.scheduler.pause()
        reason = f"the database was unavailable: {error}"
        coordinator.suspended = f"the run rolled back: {reason}"
        coordinator.abort_all(coordinator.suspended)
        logger.warning(
            "run %s: agent %r could not finish %s: %s; the run goes back to snapshot %d once "
            "the database answers",
            self._run.id,
            agent,
            message.id,
            error,
            target.seq,
        )
        try:
            async with self.lock:
                if not await self._until_store_answers():
                    return
                await self._pace_fault_rollbacks()
                work = self._redo(coordinator.latest or target, reason)
                if self._run.telemetry is not None:
                    work = self._run.telemetry.rolling_back(
                        work, self._run.id, reason=reason, redact=self._redact
                    )
                await self.after_rollback(await work)
        finally:
            self.rolling_back = False

    async def _pace_fault_rollbacks(self) -> None:
        """Space rollbacks for a database that answers reads and still refuses writes.

        A full disk answers the probe, then fails the redone work again: back off between
        such rollbacks, doubling the pause while they keep coming.
        """
        now = time.monotonic()
        if now - self._last_fault_rollback < 2 * PROBE_MAX:
            self._fault_pause = min(self._fault_pause * 2 or PROBE_FIRST, PROBE_MAX)
            await asyncio.sleep(self._fault_pause)
        else:
            self._fault_pause = 0.0
        self._last_fault_rollback = time.monotonic()

    async def _until_store_answers(self) -> bool:
        """Wait until the store and the ledger answer again; False if the run ended first."""

        async def probe() -> None:
            await self._run.record.store.get_run(self._run.id)
            await self._run.ledger.get(_PROBE_KEY)

        return await until_answers(
            probe,
            self._run.id,
            lambda: not self._run.phases.closed and self._run.record.lost is None,
        )

    # -- rolling back -----------------------------------------------------------------------

    async def _redo(self, snapshot: Snapshot, reason: str) -> RollbackInfo:
        """Roll back to ``snapshot`` because work was lost to a database fault.

        A handler could not finish (its tool call or the replay log could not be written
        before the store's retry deadline); going back to the last cut redoes it, and the
        ledger makes its effects happen once. No retry budget is used.
        """
        await self.team.quiesce("the run rolled back before the snapshot completed")
        return await self._roll_back(snapshot, None, reason, "database", 1)

    async def _reject(
        self, rejection: OutputRejected, handling: Message | None
    ) -> RollbackInfo | None:
        """Roll back for a rejected output; ``None`` when the run stops instead.

        ``handling`` is the message being handled when the output was rejected: the episode's
        failures count until a handling of it passes.

        The run stops (``exhausted`` says why, and the bus is left paused) when the retry
        policy gave up, or when the snapshot to go back to is damaged in the store.

        Raises:
            ConfigurationError: No complete snapshot this runtime can go back to precedes
                the rejected output (the run cannot go on: the runtime stops it).
        """
        await self.team.quiesce("the run rolled back before the snapshot completed")
        handled = None if handling is None else (handling.src, handling.dst, handling.seq)
        attempt, exhausted, pause = self._budget.spend(
            rejection.agent, rejection.source, rejection.reason, handled
        )
        if exhausted is not None:
            self.exhausted = exhausted
            logger.error("%s", self.exhausted)
            # The queues keep what was in flight when the run stopped, so the counters stay
            # consistent for inspection; the scheduler forgets it, so nothing is delivered.
            self._run.bus.scheduler.reset()
            return None
        coordinator = self._run.coordinator
        target = coordinator.target_before(rejection.output)
        endpoint = self._run.bus.endpoints.get(rejection.agent)
        if rejection.output is None and rejection.source != "self-evaluation" and endpoint:
            # A critic rejected the agent's work without naming a message: go back to before
            # the agent's latest output, not merely to the newest cut.
            sent = sum(channel.sent for channel in endpoint.outgoing.values())
            target = coordinator.target_before_work_of(rejection.agent, sent) or target
        if target is None:
            raise ConfigurationError(
                f"output of agent {rejection.agent!r} was rejected ({rejection.reason}) but no "
                "complete snapshot precedes it to roll back to; keep the default snapshot "
                "policy (a snapshot at the start of the run)"
            )
        latest = coordinator.latest
        if latest is not None and latest.id == target:
            snapshot = latest
        else:
            snapshot = await self._run.record.load_snapshot(target)
        if snapshot.status is not SnapshotStatus.COMPLETE:  # damaged in the store since
            self.exhausted = SnapshotDamaged(
                snapshot.id,
                snapshot.error or snapshot.status.value,
                f"the run could not roll back to it after {rejection.source} rejected the "
                f"output of {rejection.agent!r}, and stopped",
            )
            logger.error("%s", self.exhausted)
            self._run.bus.scheduler.reset()
            return None
        if pause > 0:
            await asyncio.sleep(pause)
        return await self._roll_back(
            snapshot, rejection.agent, rejection.reason, rejection.source, attempt
        )

    async def manual(self, snapshot_id: str | None, reason: str) -> RollbackInfo:
        """Roll back to ``snapshot_id`` (default: the newest complete snapshot) on request.

        Raises:
            NotFoundError: The store holds no such snapshot.
            SnapshotDamaged: The snapshot is damaged in the store.
            ConfigurationError: It failed, belongs to another run, is too old, or there is
                no complete snapshot yet.
        """
        async with self.lock:
            if self.exhausted is not None:
                raise self.exhausted
            coordinator = self._run.coordinator
            latest = coordinator.latest
            if snapshot_id is None and latest is None:
                raise ConfigurationError(
                    "there is no complete snapshot of this run to roll back to yet"
                )
            if latest is not None and snapshot_id in {None, latest.id}:
                snapshot = latest
            else:
                assert snapshot_id is not None
                snapshot = await self._run.record.load_snapshot(snapshot_id)
            self.rolling_back = True
            self.team.generation += 1
            try:
                work = self._manual(snapshot, reason)
                if self._run.telemetry is not None:
                    work = self._run.telemetry.rolling_back(
                        work, self._run.id, reason=reason, redact=self._redact
                    )
                info = await work
                await self.after_rollback(info)
            finally:
                self.rolling_back = False
            return info

    async def _manual(self, snapshot: Snapshot, reason: str) -> RollbackInfo:
        check_complete(snapshot, "the run cannot roll back to it", "roll back to")
        if snapshot.run_id != self._run.id:
            raise ConfigurationError(
                f"snapshot {snapshot.id} belongs to run {snapshot.run_id}, not to this run "
                f"({self._run.id}); to start from it, fork a new run (Runtime.fork_from)"
            )
        coordinator = self._run.coordinator
        oldest = coordinator.oldest_target()
        if oldest is not None and snapshot.seq < oldest[0]:
            raise ConfigurationError(
                f"snapshot {snapshot.seq} ({snapshot.id}) is older than the "
                f"{coordinator.max_targets} newest complete snapshots this runtime keeps "
                "as rollback targets, and the input sent after it is no longer held; fork a "
                "new run from it instead (Runtime.fork_from)"
            )
        await self.team.quiesce("the run rolled back before the snapshot completed")
        return await self._roll_back(snapshot, None, reason, "manual", 1)

    async def _roll_back(
        self, snapshot: Snapshot, agent: str | None, reason: str, source: str, attempt: int
    ) -> RollbackInfo:
        self._run.bus.scheduler.reset()
        discarded = self._restore(snapshot)
        self._run.coordinator.restored(snapshot)
        info = RollbackInfo(
            id=uuid.uuid4().hex,
            run_id=self._run.id,
            snapshot_id=snapshot.id,
            agent=agent,
            reason=reason,
            source=source,
            attempt=attempt,
            discarded=discarded,
        )
        self.history.append(info)
        logger.warning(
            "rolled back to snapshot %d (%s): %s rejected by %s: %s",
            snapshot.seq,
            snapshot.id,
            agent or "-",
            source,
            reason,
        )
        # Every rollback starts a new timeline, before it is recorded.
        if self._run.replay is not None:
            self._run.replay.new_timeline()
            timeline = self._run.replay.timeline
        else:
            self._line.timeline += 1
            timeline = self._line.timeline
        await self._run.record.save_rollback(info)
        # Nothing waits on the requests the left timeline asked: their handlers' work is gone.
        await withdraw_discarded(self._run.ledger, self._run.id, timeline, info.id)
        return info

    def _restore(self, snapshot: Snapshot) -> int:
        return self.team.restore(
            snapshot, epoch=self._run.coordinator.last_seq, inputs=self._inputs, local=None
        )

    async def after_rollback(self, info: RollbackInfo) -> None:
        """Tell the agents, and let the bus deliver again unless the run stopped."""
        await self.team.after_rollback(info)
        if self.exhausted is None and not self._run.phases.closed:
            self._run.coordinator.suspended = None
            self._run.bus.scheduler.resume()

    # -- resuming ---------------------------------------------------------------------------

    async def restore_current_cut(self) -> Snapshot:
        """Restore the run's current cut, and the input and replay plans logged after it."""
        store = self._run.record.store
        coordinator = self._run.coordinator
        snapshots = await store.list_snapshots(self._run.id)
        rollbacks = await store.list_rollbacks(self._run.id)
        segments = await store.load_replay(self._run.id) if self._run.replay is not None else []
        if snapshots:
            coordinator.last_seq = max(s.seq for s in snapshots)
        snapshot = current_cut(snapshots, rollbacks)
        if snapshot is None:
            # Stopped before its first cut was stored, so before anything was delivered:
            # the registered states are that cut.
            handle = coordinator.capture()
            if handle is None:  # pragma: no cover - a fresh runtime is always quiet
                raise ConfigurationError(f"run {self._run.id} cannot be resumed: the bus is busy")
            snapshot = await handle
        snapshot = unredact_snapshot(
            snapshot, self._run.record.redaction, doing=f"resume run {self._run.id}"
        )
        plan = plan_replay(segments, snapshot)
        inputs, before = self._rollback_targets(snapshots, rollbacks, segments, snapshot, plan)
        self._inputs.restore(inputs, before)
        if self._following is not None:
            self._following.follow(plan)
        else:
            # Model calls of the timeline the run stopped on may be recorded: look for them.
            self._line.resumed = self._line.timeline
        if plan.deliveries or plan.inputs:
            logger.info(
                "run %s resumes from snapshot %d: %d input(s) restored, %d deliveries replayed",
                self._run.id,
                snapshot.seq,
                len(plan.inputs),
                plan.deliveries,
            )
        await self.restart(snapshot, own=True, rollbacks=rollbacks)
        return snapshot

    async def _tell_again(self, rollbacks: Sequence[RollbackInfo]) -> None:
        """Give each agent again the feedback its rejected outputs got before the stop.

        Feedback lives in the agents' contexts, not in their states: without this, a redo
        re-executed after a resume would not know why its first try was rejected. The
        newest rollback of an agent also lists the effects its undone work performed.
        """
        contexts = self.team.contexts
        told = sorted((r for r in rollbacks if r.agent in contexts), key=lambda r: r.at)
        last = {info.agent: info.id for info in told}
        for info in told:
            assert info.agent is not None
            ctx = contexts[info.agent]
            if last[info.agent] == info.id:
                await tell_rollback(ctx, info.reason, info.source)
            else:
                ctx.add_feedback(info.reason, info.source)

    async def restart(
        self, snapshot: Snapshot, *, own: bool, rollbacks: Sequence[RollbackInfo] = ()
    ) -> None:
        """Put a runtime that has not run yet on ``snapshot``.

        ``own`` says whether the snapshot belongs to this run (resume), making it a rollback
        target, or to another (fork), whose snapshots this run must never go back to. The
        agents get the feedback of the run's earlier ``rollbacks`` before anything is
        delivered.
        """
        scheduler = self._run.bus.scheduler
        scheduler.pause()
        scheduler.reset()
        self._restore(snapshot)
        if own:
            self._run.coordinator.restored(snapshot)
        await self._tell_again(rollbacks)
        scheduler.resume()

    def _rollback_targets(
        self,
        snapshots: list[Snapshot],
        rollbacks: list[RollbackInfo],
        segments: list[ReplaySegment],
        cut: Snapshot,
        plan: ReplayPlan,
    ) -> tuple[list[Message], Mapping[str, int]]:
        """Make the stored cuts before ``cut`` rollback targets again, as they were before
        the run stopped; return the input to hold for them, and what was sent before it.

        An output in flight in ``cut`` was sent before it: only an older cut lets the agent
        redo it. A cut qualifies when the replay log holds all the input sent after it, which
        a rollback there replays.
        """  # noqa: D205
        coordinator = self._run.coordinator
        sent = _environment_sent(cut)
        earlier = earlier_targets(snapshots, rollbacks, cut)[: coordinator.max_targets - 1]
        for position in range(len(earlier) - 1, -1, -1):  # the oldest first
            target_sent = _environment_sent(earlier[position])
            inputs = plan_replay(segments, earlier[position]).inputs
            between = sum(sent.values()) - sum(target_sent.values())
            if len(inputs) >= between + len(plan.inputs):
                for target in earlier[: position + 1]:
                    coordinator.written(target)
                return inputs, target_sent
        return plan.inputs, sent

    def prune_inputs(self) -> None:
        """Seal the buffered input; forget what no rollback target can need."""
        coordinator = self._run.coordinator
        oldest = coordinator.oldest_target()
        if oldest is not None:
            self._inputs.forget(oldest[1])
        elif not coordinator.active:
            self._inputs.forget(None)  # no cut to go back to, and none coming
        else:
            self._inputs.seal()

    def check_fresh(self, what: str) -> None:
        """Refuse ``what`` (resume, fork) once the runtime took input or snapshots.

        Raises:
            ConfigurationError: It did, or a resume or fork is under way.
        """
        phases = self._run.phases
        phases.check_open()
        if phases.now is Phase.RESTORING:
            raise ConfigurationError(
                f"{what} called while resume() or fork_from() is under way; await it first"
            )
        if phases.now not in (Phase.NEW, Phase.STARTED) or (
            self._inputs or self._run.coordinator.last_seq
        ):
            raise ConfigurationError(
                f"{what} must come before the runtime takes input or snapshots; create a new "
                "Runtime, register the agents, then call it"
            )

    def raise_if_stopped(self) -> None:
        """Raise why the run stopped, if it did.

        Raises:
            OwnershipLost: Another runtime took the run over.
            RunError: The retry policy gave up, or a cut to go back to was damaged.
            RunCancelled: Someone asked the run to stop.
        """
        if self._run.record.lost is not None:
            raise self._run.record.lost
        if self.exhausted is not None:
            raise self.exhausted
        if self._run.record.cancelled is not None:
            raise self._run.record.cancelled

    def stopped(self) -> bool:
        """Whether the run stopped: its retry policy gave up, its lease was lost, or it was
        cancelled on request.
        """  # noqa: D205
        record = self._run.record
        return self.exhausted is not None or record.lost is not None or record.cancelled is not None
