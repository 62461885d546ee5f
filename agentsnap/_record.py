"""A run's record in the store: recorded once, its agents' state schemas, its lease, and
the writes that need the run recorded first.
"""  # noqa: D205

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from agentsnap._phases import NOT_STARTED, WITHOUT_CUT, Phases
from agentsnap.exceptions import (
    ConfigurationError,
    NotFoundError,
    OwnershipLost,
    RunCancelled,
    StoreError,
)
from agentsnap.ownership import RunOwnership
from agentsnap.records import ReplaySegment, RollbackInfo, RunInfo, RunStatus, Snapshot
from agentsnap.redaction import unredact_snapshot
from agentsnap.versions import state_schema

if TYPE_CHECKING:
    from agentsnap.agents import Agent
    from agentsnap.bus import Bus
    from agentsnap.journal import Journal
    from agentsnap.ledger import Ledger
    from agentsnap.messages import JsonValue
    from agentsnap.redaction import Redaction
    from agentsnap.replay import ReplayLog
    from agentsnap.snapshot import SnapshotCoordinator
    from agentsnap.store import OneProcessStore
    from agentsnap.telemetry import Telemetry

__all__ = ["RunParts", "RunRecord", "finished_error"]

KEPT_CUTS = 100
"""With a redaction, how many recent cuts are kept unredacted in memory to roll back to (as
many as the snapshot coordinator keeps as rollback targets)."""

logger = logging.getLogger("agentsnap")


def finished_error(run: RunInfo) -> ConfigurationError:
    """The error for resuming ``run``, which succeeded."""
    finished = run.finished_at.isoformat(timespec="seconds") if run.finished_at else "?"
    return ConfigurationError(
        f"run {run.id} already finished ({run.status.value}, at {finished}): there is "
        "nothing to resume; fork a new run from one of its snapshots (Runtime.fork_from, or "
        "`agentsnap fork`)"
    )


@dataclass(frozen=True, slots=True)
class RunParts:
    """What a runtime's collaborators (recovery, cadence, closing) all work on, made once.

    The runtime builds these first and hands the same parts to each collaborator, which
    keeps them as ``_run``; each is given what is its own job besides.
    """

    id: str
    """The run."""
    bus: Bus
    """The process's bus."""
    coordinator: SnapshotCoordinator
    """The snapshot coordinator."""
    phases: Phases
    """The runtime's phases."""
    record: RunRecord
    """The run's record and lease (rollbacks and the run's end are recorded through it)."""
    ledger: Ledger
    """The ledger (probed while the database is away; closed with the runtime when it owns
    it)."""
    replay: ReplayLog | None
    """The replay log, which keeps the run's timeline (``None``: none is kept)."""
    telemetry: Telemetry | None
    """Where spans and metrics go (``None``: nowhere)."""


class RunRecord:
    """Records a run in the store once, with its schemas, and holds its lease.

    A run the caller named may be one to resume: it is recorded once it takes input or a
    snapshot, not at start, so that resuming an id the store does not hold writes nothing.

    Args:
        store: The store.
        ledger: The ledger, fenced by the run's lease once it is held.
        run_id: The run.
        named: Whether the caller named the run.
        phases: The runtime's phases (a lost lease stops the run).
        agents: The registered agents, by name (their state schemas are recorded).
        journal: The journal, started once the run is recorded.
        lease: Seconds the lease holds without renewal.
        metadata: Recorded with the run.
        name: Recorded with the run.
        tags: Recorded with the run.
        redaction: Applied to each snapshot before it is written (see
            [`agentsnap.redaction`][agentsnap.redaction]); the cut kept in memory is not.

    Attributes:
        created: The store holds the run (this runtime recorded it, or found it).
        stored_before: The store held the run before this runtime started: it must be
            resumed, not written to as if new (its snapshot numbers would collide).
        ownership: The run's lease.
        lost: Set when another runtime took the run over.
        cancelled: Set when someone asked the run to stop, and it stopped.
        interrupt: Cancels the handlers under way, given why (the team's ``quiesce``): set
            by the runtime once its team is built, used when the run is cancelled.
        stopping: That interruption, under way or done, for closing to wait for.
        unsaved_rollbacks: Rollback records the store could not write yet (written after
            the next snapshot, or at close).
    """

    def __init__(
        self,
        store: OneProcessStore,
        ledger: Ledger,
        run_id: str,
        *,
        named: bool,
        phases: Phases,
        agents: Mapping[str, Agent[Any]],
        journal: Journal | None,
        lease: float,
        metadata: dict[str, Any],
        name: str | None,
        tags: dict[str, str],
        redaction: Redaction | None = None,
    ) -> None:
        self.store = store
        self.redaction = redaction
        # With a redaction, the store holds cuts that need secrets to go back to: the
        # recent ones are kept here as they were, for the rollbacks of this process.
        self._kept: dict[str, Snapshot] = {}
        self.run_id = run_id
        self.named = named
        self.metadata = metadata
        self.name = name
        self.tags = tags
        self._ledger = ledger
        self._phases = phases
        self._agents = agents
        self._journal = journal
        self.created = False
        self._looked_up = False  # whether the store was asked if it holds the run
        self._recording = asyncio.Lock()
        self._schemas_saved: set[str] = set()  # agents whose state schema the store has
        self.stored_before = False
        self.ownership = RunOwnership(store, run_id, ttl=lease)
        self.lost: OwnershipLost | None = None
        self.cancelled: RunCancelled | None = None
        self.interrupt: Callable[[str], Awaitable[None]] | None = None
        self.stopping: asyncio.Future[None] | None = None
        self.unsaved_rollbacks: list[RollbackInfo] = []

    async def ensure(self, *, create: bool = True) -> None:
        """Find out whether the store held the run before, and record it (``create``).

        Without ``create``, a run the store does not hold is left unrecorded: a named run
        started without input is recorded once it takes input or a snapshot.
        """
        if not self.created:
            async with self._recording:  # one recording, whoever asks first
                if not self.created:
                    if not self._looked_up:
                        try:
                            await self.store.get_run(self.run_id)
                        except NotFoundError:
                            pass
                        else:
                            self.stored_before = True
                        self._looked_up = True
                    if not (create or self.stored_before):
                        return
                    await self.store.create_run(
                        RunInfo(
                            id=self.run_id, metadata=self.metadata, name=self.name, tags=self.tags
                        )
                    )
                    self.created = True
                    if not self.stored_before:
                        await self.own(wait=0.0)  # a new run: nobody else can hold it
                    if self._journal is not None and self._phases.now not in NOT_STARTED:
                        self._journal.start()  # deferred by start() until the run was recorded
        await self.save_schemas()

    async def record_named(self) -> None:
        """Record a named run at its first input, when no first snapshot will."""
        try:
            await self.ensure()
        except Exception as exc:  # recorded by the next write that needs it, or at close
            logger.warning("run %s was not recorded yet: %s", self.run_id, exc)

    async def save_schemas(self) -> None:
        """Record the state schemas of the agents registered since the last time.

        An inspector checks edited states against them without importing this program.
        Each records the version of its state class (under
        [`VERSION_KEY`][agentsnap.versions.VERSION_KEY]).
        """
        new = [name for name in self._agents if name not in self._schemas_saved]
        if not new:
            return
        # Claimed before the write: the writes of concurrent snapshots must not repeat it.
        self._schemas_saved.update(new)
        try:
            schemas: dict[str, dict[str, JsonValue]] = {}
            for name in new:
                model: type[BaseModel] = type(self._agents[name].state)
                schema = state_schema(model)
                if schema is not None:
                    schemas[name] = schema
            if schemas:
                await self.store.save_state_schemas(self.run_id, schemas)
        except BaseException:
            self._schemas_saved.difference_update(new)  # written by a later call
            raise

    async def own(self, *, wait: float) -> None:
        """Take the run's lease, fence every write with its token, and keep it renewed."""
        if self.ownership.lease is not None:
            return
        await self.ownership.acquire(wait=wait, refuse_live=True)
        self.ownership.fence_ledger(self._ledger)
        self.ownership.start_heartbeat(self._ownership_lost, self._cancel_requested)

    def _ownership_lost(self, lost: OwnershipLost) -> None:
        """Another runtime took the run over: stop at once, writing nothing more."""
        logger.error("%s", lost)
        self.lost = lost
        self._phases.stop(lost)

    def _cancel_requested(self, reason: str) -> None:
        """Someone asked the run to stop: deliver nothing more, cancel the handlers under way
        (a side-effecting tool call under way finishes first); it closes cancelled.
        """  # noqa: D205
        if self.lost is not None or self._phases.closed:
            return
        self.cancelled = RunCancelled(self.run_id, reason)
        self._phases.stop(self.cancelled, RunStatus.CANCELLED)
        if self.interrupt is not None:  # a handler awaiting a model need not be waited for
            self.stopping = asyncio.ensure_future(
                self.interrupt("the run was cancelled before the snapshot completed")
            )

    def check_not_stored_before(self, what: str) -> None:
        """Refuse ``what`` on a run the store held before, that was not resumed.

        Raises:
            ConfigurationError: The store held the run, and it has no cut in this runtime.
        """
        if self.stored_before and self._phases.now in WITHOUT_CUT:
            raise self.stored_run_error(what)

    def stored_run_error(self, what: str) -> ConfigurationError:
        """The error for ``what`` done on a run the store held before, not resumed."""
        return ConfigurationError(
            f"{what} on run {self.run_id}, which the store already holds: call "
            "`await runtime.resume()` first to continue it, or leave run_id out to start "
            "a new run (fork_from() starts one from a snapshot of it)"
        )

    async def unknown_run(self) -> NotFoundError:
        """The error for resuming a run the store does not hold, naming the runs it may mean."""
        found = await self.store.find_ids("run", self.run_id)
        if not found:
            return NotFoundError(
                "run",
                self.run_id,
                f"no run with id {self.run_id!r} in this store: nothing to resume (list the "
                "runs with `agentsnap runs`)",
            )
        runs = f"run {found[0]}" if len(found) == 1 else "runs " + ", ".join(found)
        return NotFoundError(
            "run",
            self.run_id,
            f"no run with id {self.run_id!r} in this store, but it starts the id of {runs}: "
            "pass the whole id of the run to resume",
        )

    # -- writes that need the run recorded ---------------------------------------------------

    async def persist(self, snapshot: Snapshot) -> None:
        """Write a completed snapshot, then the rollback records the store refused before."""
        await self.ensure()
        redaction = self.redaction
        if redaction is None:
            await self.store.save_snapshot(snapshot)
        else:
            await self.store.save_snapshot(redaction.snapshot(snapshot))
            kept = self._kept
            kept[snapshot.id] = snapshot
            if len(kept) > KEPT_CUTS:
                del kept[next(iter(kept))]
        if self.unsaved_rollbacks:
            try:
                while self.unsaved_rollbacks:  # oldest first
                    await self.store.save_rollback(self.unsaved_rollbacks[0])
                    del self.unsaved_rollbacks[0]
            except StoreError as exc:
                logger.warning("run %s: rollback records still not written: %s", self.run_id, exc)

    async def load_snapshot(self, snapshot_id: str) -> Snapshot:
        """A snapshot of the run to go back to: as it was taken, when this process took it.

        One read back from the store has the values it holds redacted given back by the
        redaction's ``secret`` provider.

        Raises:
            NotFoundError: The store holds no such snapshot.
            RedactedValueNeeded: It holds a value stored redacted that no provider gives.
        """
        kept = self._kept.get(snapshot_id)
        if kept is not None:
            return kept
        snapshot = await self.store.load_snapshot(snapshot_id)
        return unredact_snapshot(snapshot, self.redaction, doing=f"roll back to {snapshot_id}")

    async def append_replay(self, segment: ReplaySegment) -> None:
        """Write a segment of the replay log."""
        await self.ensure()
        await self.store.append_replay(self.run_id, segment)

    async def save_rollback(self, info: RollbackInfo) -> None:
        """Record a rollback that has happened; a failure to write it stops nothing.

        The rollback is done in memory whatever the store says. A record the store's retries
        could not write is kept and written later: after the next snapshot, or at close
        (spooled if the database is still away).
        """
        if self.redaction is not None:
            info = info.model_copy(update={"reason": self.redaction.text(info.reason)})
        try:
            await self.ensure()
            await self.store.save_rollback(info)
        except StoreError as exc:
            logger.error(
                "run %s: rollback %s was not recorded yet, and will be: %s",
                self.run_id,
                info.id,
                exc,
            )
            self.unsaved_rollbacks.append(info)
