"""Closing a runtime: its last snapshot, its writes made or spooled, its status recorded, its
lease released; and closing it when its event loop ends while it is open.
"""  # noqa: D205

from __future__ import annotations

import asyncio
import functools
import logging
import warnings
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentsnap._phases import ENDED, NOT_STARTED, Phase, one_line
from agentsnap._team import lost_to_database
from agentsnap.exceptions import StoreError
from agentsnap.ledger import ToolCallStatus, owner_id
from agentsnap.messages import Message
from agentsnap.once import reconcile
from agentsnap.records import RunStatus, bounded_traceback, utcnow
from agentsnap.store.spool import (
    AppendJournal,
    AppendReplay,
    FinishRun,
    SaveRollback,
    Spool,
    SpoolError,
    SpoolOp,
    UpdateLedger,
)

if TYPE_CHECKING:
    from agentsnap._cadence import Cadence
    from agentsnap._following import Following
    from agentsnap._record import RunParts
    from agentsnap.agents import Agent
    from agentsnap.bus import Bus
    from agentsnap.exceptions import HandlerFailed
    from agentsnap.journal import Journal
    from agentsnap.ledger import Ledger
    from agentsnap.once import KnownTools, PendingOutcomes
    from agentsnap.store import OneProcessStore

__all__ = ["Closer", "replay_spool", "spool_for"]

logger = logging.getLogger("agentsnap")


def spool_for(store: OneProcessStore, directory: str | Path | None) -> Spool | None:
    """Where writes the database refused at close go: beside the database, by default."""
    url = getattr(store, "url", None)
    if not isinstance(url, str):
        return None  # a store in memory never refuses a write
    return Spool.for_url(url, directory)


async def replay_spool(
    store: OneProcessStore, ledger: Ledger, run_id: str, directory: str | Path | None
) -> None:
    """Write what an earlier runtime of run ``run_id`` spooled when it closed.

    Raises:
        StoreError: Some of it could not be written yet.
    """
    spool = spool_for(store, directory)
    if spool is None or not spool.file(run_id).exists():
        return
    report = await spool.replay(store, ledger, run_id)
    if not report.complete:
        raise StoreError(
            f"run {run_id} has writes spooled in {spool.file(run_id)} that could "
            f"not be written yet ({report}); resume it once the database answers, or run "
            "`agentsnap db recover`"
        )
    logger.info("run %s: wrote what was spooled at its last close", run_id)


class _LoopEnd(asyncio.Future[None]):
    """What a runtime's close-watch waits on: cancelled only as the event loop ends.

    It notes whether a handler was running the moment it is cancelled: the runner cancels
    every task before any of them runs again, so a handler cancelled with it has not ended
    yet, whichever task the runner cancelled first.
    """

    def __init__(self, bus: Bus) -> None:
        super().__init__()
        self._bus = bus
        self.busy = False

    def cancel(self, msg: Any = None) -> bool:
        self.busy = any(endpoint.busy for endpoint in self._bus.endpoints.values())
        return super().cancel(msg)


@dataclass(eq=False, kw_only=True)
class Closer:
    """Closes a runtime once, whatever the database says."""

    run: RunParts
    """The runtime's parts: the record and lease, the ledger (closed when ``owns_ledger``),
    the replay log, and where metrics go."""
    cadence: Cadence
    """Takes the last snapshot."""
    agents: Mapping[str, Agent[Any]]
    """The registered agents (their final states settle abandoned effects)."""
    failures: Sequence[HandlerFailed]
    """The run's handler failures."""
    owns_ledger: bool
    """The runtime made the ledger."""
    tools: KnownTools
    """The tools the runtime knows (their compensations run at close)."""
    pending: PendingOutcomes
    """The outcomes of tool calls the ledger could not record when they ran, written at
    close."""
    asking: Callable[[], int]
    """How many of the run's handlers wait for a person's answer now."""
    journal: Journal | None
    """The journal, if kept."""
    following: Following | None
    """Writes the replay log in the background, if kept."""
    spool: str | Path | None
    """The spool directory (see ``Runtime``)."""
    _asking: int = field(default=0, init=False)
    """Handlers of the run waiting on a person as it closed."""
    _watch: asyncio.Task[None] | None = field(default=None, init=False)

    def watch_the_loop(self) -> None:
        """Close the runtime if its event loop ends while it is open (``close()`` forgotten)."""
        self._watch = asyncio.get_running_loop().create_task(
            self._close_with_the_loop(), name="agentsnap:close-watch"
        )

    async def _close_with_the_loop(self) -> None:
        """``asyncio.run`` (and any runner) cancels the tasks left when the program's main
        coroutine returns, and lets them finish: this one then closes the runtime, so the run
        is recorded, its writes made and its lease released, and warns with a
        ``ResourceWarning``. It costs one idle task per runtime, nothing per message.
        """  # noqa: D205
        loop_end = _LoopEnd(self.run.bus)
        try:
            await loop_end
        except asyncio.CancelledError:
            if self.run.phases.closed:
                raise
            busy = loop_end.busy
            self._watch = None
            await self.close(
                failed=None, cancelled=asyncio.CancelledError() if busy else None, cut_off=busy
            )
            text = (
                f"the Runtime of run {self.run.id} was never closed; it was closed as its "
                "event loop ended. Use `async with Runtime(...) as runtime:` or call "
                "`await runtime.close()`"
            )
            logger.warning("%s", text)
            warnings.warn(text, ResourceWarning, stacklevel=1)

    async def close(
        self,
        *,
        failed: BaseException | None,
        cancelled: BaseException | None = None,
        cut_off: bool = False,
    ) -> None:
        """Close the runtime once; ``cut_off``: a handler was cancelled half-way."""
        phases = self.run.phases
        phase = phases.now
        if phase in ENDED:
            return
        phases.enter(Phase.CLOSING)
        try:
            await self._shut_down(
                failed,
                cancelled,
                started=phase not in NOT_STARTED,
                live=phase is Phase.RUNNING and not cut_off,
            )
        finally:
            phases.enter(Phase.CLOSED)

    async def _shut_down(
        self,
        failed: BaseException | None,
        cancelled: BaseException | None,
        *,
        started: bool,
        live: bool,
    ) -> None:
        """Close a runtime that was ``started`` (and ``live``: running) when closing began."""
        if self._watch is not None:
            self._watch.cancel()  # closed as it should be: nothing left to watch for
            self._watch = None
        if self.run.telemetry is not None:
            self.run.telemetry.unwatch(self.run.bus)
        await self.cadence.stop()
        if self.run.record.stopping is not None:  # a cancel's interruption of the handlers
            await self.run.record.stopping
        if self.following is not None:
            self.following.unwatch()
        self.cadence.last(live)  # none while a handler is half-way (a cancelled run)
        # Handlers waiting on a person are stopped here; their run is not done.
        self._asking = self.asking()
        await self.run.bus.scheduler.close()
        coordinator = self.run.coordinator
        coordinator.abort_all("the runtime was closed before the snapshot completed")
        await coordinator.drain()
        record = self.run.record
        if live and not record.created:
            try:  # a named run whose recording at its first input failed
                await record.ensure()
            except StoreError as exc:
                logger.error("run %s could not be recorded: %s", self.run.id, exc)
        # A runtime that never owned its run (a refused resume) leaves it as it found it.
        owner = record.ownership.lease is not None and record.lost is None
        closing = _Closing(self.run.id, spool_for(record.store, self.spool))
        if self.journal is not None:
            left = await self.journal.close()
            if left and owner:
                closing.spool(AppendJournal(run_id=self.run.id, segments=left))
        replay = self.run.replay
        if replay is not None:
            await replay.close()
            if owner:
                # Input not handled yet is then restored by a resume.
                await closing.write(
                    replay.flush,
                    lambda: [AppendReplay.of(self.run.id, s) for s in replay.take_unwritten()],
                )
        unreconciled: Exception | None = None
        try:
            if owner:
                await self._record_outcomes(closing)
            if started and owner:  # effects no final state holds were abandoned
                await reconcile(
                    self.run.ledger,
                    self.run.id,
                    [a.state for a in self.agents.values()],
                    self.tools,
                    store=record.store,
                )
        except Exception as exc:  # the run's status is still recorded; then it is raised
            unreconciled = exc
        finally:
            if self.owns_ledger:
                await self.run.ledger.close()
        if owner:
            await self._finish(closing, failed, cancelled, unreconciled)
        elif record.lost is not None:
            await record.ownership.release()  # stops the heartbeat; the run is another's
        closing.finish()
        if unreconciled is not None:
            raise unreconciled

    async def _finish(
        self,
        closing: _Closing,
        failed: BaseException | None,
        cancelled: BaseException | None,
        unreconciled: Exception | None,
    ) -> None:
        """Record the run's outcome and its last rollbacks, and let go of its lease."""
        record = self.run.record
        try:  # agents registered after the run started
            await record.save_schemas()
        except Exception as exc:  # only the inspector's checks of edits miss them
            logger.warning("run %s: state schemas not recorded: %s", self.run.id, exc)
        status, reason = self._outcome(failed, cancelled, unreconciled)
        if status is RunStatus.FAILED:
            causes = [*self.failures, failed or self.run.phases.stopped_by or unreconciled]
            text = bounded_traceback([c for c in causes if c is not None])
            if record.redaction is not None:
                text = record.redaction.text(text)
            # Lost, not spooled, if the database is away: the status and reason are kept.
            await closing.write(
                functools.partial(record.store.save_traceback, self.run.id, text or None), []
            )
        for info in record.unsaved_rollbacks:
            await closing.write(
                functools.partial(record.store.save_rollback, info), [SaveRollback(info=info)]
            )
        record.unsaved_rollbacks.clear()
        finished_at = utcnow()
        token = record.ownership.lease.token if record.ownership.lease else None
        await closing.write(
            functools.partial(record.store.finish_run, self.run.id, status, finished_at, reason),
            lambda: [
                FinishRun(
                    run_id=self.run.id,
                    status=status,
                    finished_at=finished_at,
                    reason=reason,
                    token=token,
                )
            ],
        )
        try:
            await record.ownership.release()
        except StoreError as exc:  # it expires by itself
            logger.warning("run %s: its lease was not released: %s", self.run.id, exc)

    def _outcome(
        self,
        failed: BaseException | None,
        cancelled: BaseException | None,
        unreconciled: Exception | None,
    ) -> tuple[RunStatus, str | None]:
        """How the run ends, and why in one line."""
        if failed is not None:
            return RunStatus.FAILED, one_line(failed)
        phases = self.run.phases
        if phases.status_on_close is RunStatus.FAILED:
            return RunStatus.FAILED, phases.stopped_because or "the run stopped"
        if self.failures:
            first = self.failures[0]
            more = len(self.failures) - 1
            return RunStatus.FAILED, one_line(first) + (
                f" (and {more} more handler failure{'s' * (more > 1)})" if more else ""
            )
        if unreconciled is not None:
            return RunStatus.FAILED, one_line(unreconciled)
        if phases.status_on_close is RunStatus.CANCELLED:
            return RunStatus.CANCELLED, phases.stopped_because or "cancelled on request"
        if cancelled is not None:
            how = "Ctrl-C" if isinstance(cancelled, KeyboardInterrupt) else "task cancelled"
            return RunStatus.CANCELLED, f"{how}; resume() continues it"
        if self._asking:
            return RunStatus.INTERRUPTED, (
                f"closed while {self._asking} handler{'s' * (self._asking != 1)} waited for "
                "a person's answer; resume() continues it, and the answers given meanwhile "
                "reach them"
            )
        channels = self.run.bus.channels.values()
        if any(channels):
            queued = sum(type(item) is Message for ch in channels for item in ch)
            return RunStatus.INTERRUPTED, (
                f"closed with {queued} message{'s' * (queued != 1)} not delivered yet; "
                "resume() continues it"
            )
        return RunStatus.SUCCEEDED, None

    async def _record_outcomes(self, closing: _Closing) -> None:
        """Write the outcomes of tool calls the ledger could not record when they ran."""
        for pending in self.pending.of_run(self.run.id):
            await closing.write(
                functools.partial(pending.record, self.run.ledger),
                [
                    UpdateLedger.of(
                        self.run.id,
                        pending.key,
                        pending.change,
                        (ToolCallStatus.IN_PROGRESS, ToolCallStatus.UNKNOWN),
                        owner_id(),
                        pending.attempt,
                    )
                ],
            )
            self.pending.recorded(pending.key)


class _Closing:
    """The writes of a closing runtime: what the database refuses is spooled, not lost.

    Once one write failed for a passing reason after the store's retries, the database is
    taken to be away and the writes after it are spooled at once.
    """

    def __init__(self, run_id: str, spool: Spool | None) -> None:
        self._run_id = run_id
        self._spool = spool
        self.ops: list[SpoolOp] = []
        self.away: StoreError | None = None
        self.error: StoreError | None = None

    def spool(self, op: SpoolOp) -> None:
        """Spool ``op`` whatever happens."""
        self.ops.append(op)

    async def write(
        self,
        attempt: Callable[[], Awaitable[object]],
        spooled: Sequence[SpoolOp] | Callable[[], Sequence[SpoolOp]],
    ) -> None:
        """``attempt`` the write; if the database is away, spool ``spooled`` (or what it
        gives) instead.
        """  # noqa: D205
        if self.away is None:
            try:
                await attempt()
            except StoreError as exc:
                if not lost_to_database(exc):
                    self.error = self.error or exc  # raised once the rest is done
                    return
                self.away = exc
            else:
                return
        self.ops.extend(spooled() if callable(spooled) else spooled)

    def finish(self) -> None:
        """Spool what the database refused; raise what could not be kept at all.

        Raises:
            StoreError: A write failed for good, or could not even be spooled.
        """
        run_id = self._run_id
        if self.ops:
            spool = self._spool
            if spool is None:  # pragma: no cover - only SQL stores fail like this
                raise StoreError(
                    f"run {run_id}: {len(self.ops)} write(s) at close failed and "
                    f"cannot be spooled: {self.away}"
                )
            try:
                for op in self.ops:
                    spool.add(op)
            except (OSError, SpoolError) as exc:
                raise StoreError(
                    f"run {run_id}: {len(self.ops)} write(s) at close failed "
                    f"({self.away}), and spooling them to {spool.directory} failed too ({exc}): "
                    "they are lost"
                ) from exc
            logger.warning(
                "run %s: the database did not take %d write(s) at close (%s); they are kept "
                "in %s and written when the run is resumed, or by `agentsnap db recover`",
                run_id,
                len(self.ops),
                self.away,
                spool.file(run_id),
            )
        if self.error is not None:
            raise self.error
