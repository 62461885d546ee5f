"""A third store backend, built from the role protocols alone: what a one-process run needs.

``OneProcessDouble`` implements [`RunStore`][agentsnap.store.RunStore],
[`RunLog`][agentsnap.store.RunLog] and [`RunLeases`][agentsnap.store.RunLeases], the roles of
a [`OneProcessStore`][agentsnap.store.OneProcessStore], and nothing else: no queries for
listings, no parts of distributed snapshots. It shares no code with the built-in stores: each
run is one record, and what a database would serialise (snapshots, rollbacks, journal and
replay segments, schemas) is kept as JSON text, so a caller never gets back the object it
gave. The contract suite runs it on the tests tagged with those roles (see conftest.py).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from agentsnap.exceptions import ConfigurationError, NotFoundError, StoreError
from agentsnap.liveness import lost, owner_gone, owner_is_live
from agentsnap.messages import JsonValue
from agentsnap.records import (
    JournalSegment,
    ReplaySegment,
    RollbackInfo,
    RunInfo,
    RunLease,
    RunStatus,
    Snapshot,
    utcnow,
)
from agentsnap.store import OneProcessStore, RunLeases, RunLog, RunStore

__all__ = ["ROLES", "OneProcessDouble"]

ROLES = frozenset({"runs", "log", "leases"})
"""The roles the double claims, as the contract suite's ``store_roles`` marker names them."""


@dataclass
class _Run:
    """Everything kept about one run."""

    info: RunInfo
    snapshots: dict[str, str] = field(default_factory=dict)
    """Snapshot id -> the snapshot as JSON, in the order they were saved."""
    seqs: set[int] = field(default_factory=set)
    rollbacks: list[str] = field(default_factory=list)
    journal: list[str] = field(default_factory=list)
    replay: list[str] = field(default_factory=list)
    schemas: dict[str, str] = field(default_factory=dict)
    lease: RunLease | None = None


class OneProcessDouble:
    """A store for one-process runs, in dictionaries, that knows nothing of other roles."""

    def __init__(self) -> None:
        self._runs: dict[str, _Run] = {}
        self._run_of_snapshot: dict[str, str] = {}
        self._fences: dict[str, int] = {}

    def _run(self, run_id: str) -> _Run:
        found = self._runs.get(run_id)
        if found is None:
            raise NotFoundError("run", run_id)
        return found

    def _writable(self, run_id: str) -> _Run:
        """The run, if this object's fence for it (if any) still matches its lease."""
        run = self._run(run_id)
        token = self._fences.get(run_id)
        if token is not None:
            held = run.lease
            if held is None:
                raise lost(run_id, token, None)
            if held.token != token:
                raise lost(run_id, token, (held.owner, held.token))
        return run

    # -- RunStore ------------------------------------------------------------------------

    async def create_run(self, run: RunInfo) -> None:
        """Record a run (kept as it is when its id is known)."""
        self._runs.setdefault(run.id, _Run(info=run))

    async def save_snapshot(self, snapshot: Snapshot) -> None:
        """Keep a snapshot as JSON; a second id or number of a run is refused."""
        run = self._writable(snapshot.run_id)
        if snapshot.id in self._run_of_snapshot:
            raise StoreError(f"a snapshot with id {snapshot.id} is already stored")
        if snapshot.seq in run.seqs:
            raise StoreError(f"run {snapshot.run_id} already has a snapshot number {snapshot.seq}")
        run.snapshots[snapshot.id] = snapshot.model_dump_json()
        run.seqs.add(snapshot.seq)
        self._run_of_snapshot[snapshot.id] = snapshot.run_id

    async def finish_run(
        self,
        run_id: str,
        status: RunStatus,
        finished_at: datetime | None,
        reason: str | None = None,
    ) -> None:
        """Record where the run stands."""
        run = self._writable(run_id)
        run.info = run.info.model_copy(
            update={"status": status, "finished_at": finished_at, "status_reason": reason}
        )

    async def save_traceback(self, run_id: str, traceback: str | None) -> None:
        """Record what made the run fail."""
        run = self._writable(run_id)
        run.info = run.info.model_copy(update={"traceback": traceback})

    async def request_cancel(self, run_id: str, reason: str | None) -> None:
        """Ask the run's owner to stop it (not fenced)."""
        run = self._run(run_id)
        run.info = run.info.model_copy(update={"cancel_requested": reason})

    async def set_parent(self, run_id: str, parent_run_id: str, parent_snapshot_id: str) -> None:
        """Record the snapshot the run was forked from."""
        run = self._writable(run_id)
        run.info = run.info.model_copy(
            update={"parent_run_id": parent_run_id, "parent_snapshot_id": parent_snapshot_id}
        )

    async def save_rollback(self, rollback: RollbackInfo) -> None:
        """Keep a rollback of a run, to one of its snapshots."""
        run = self._run(rollback.run_id)
        if rollback.snapshot_id not in self._run_of_snapshot:
            raise NotFoundError("snapshot", rollback.snapshot_id)
        self._writable(rollback.run_id)
        run.rollbacks.append(rollback.model_dump_json())

    async def list_rollbacks(self, run_id: str) -> list[RollbackInfo]:
        """The run's rollbacks, oldest first."""
        return [RollbackInfo.model_validate_json(text) for text in self._run(run_id).rollbacks]

    async def get_run(self, run_id: str) -> RunInfo:
        """The run, ``interrupted`` when it is running without a live owner."""
        run = self._run(run_id)
        if run.info.status is RunStatus.RUNNING and not owner_is_live(run.lease, utcnow()):
            return run.info.model_copy(
                update={"status": RunStatus.INTERRUPTED, "status_reason": owner_gone(run.lease)}
            )
        return run.info

    async def find_ids(
        self, kind: Literal["run", "snapshot"], prefix: str, limit: int = 10
    ) -> list[str]:
        """Run or snapshot ids starting with ``prefix``, sorted."""
        known = self._runs if kind == "run" else self._run_of_snapshot
        return sorted(i for i in known if i.startswith(prefix))[:limit]

    async def list_snapshots(self, run_id: str) -> list[Snapshot]:
        """The run's snapshots by number."""
        loaded = [Snapshot.model_validate_json(t) for t in self._run(run_id).snapshots.values()]
        return sorted(loaded, key=lambda s: s.seq)

    async def load_snapshot(self, snapshot_id: str) -> Snapshot:
        """The snapshot with this id."""
        run_id = self._run_of_snapshot.get(snapshot_id)
        if run_id is None:
            raise NotFoundError("snapshot", snapshot_id)
        return Snapshot.model_validate_json(self._runs[run_id].snapshots[snapshot_id])

    async def save_state_schemas(
        self, run_id: str, schemas: Mapping[str, Mapping[str, JsonValue]]
    ) -> None:
        """Keep (or replace) agents' state schemas."""
        run = self._writable(run_id)
        run.schemas.update({name: json.dumps(schema) for name, schema in schemas.items()})

    async def load_state_schemas(self, run_id: str) -> dict[str, dict[str, JsonValue]]:
        """The run's state schemas, by agent."""
        kept = self._run(run_id).schemas
        return {name: json.loads(kept[name]) for name in sorted(kept)}

    async def close(self) -> None:
        """Nothing to release."""

    # -- RunLog --------------------------------------------------------------------------

    async def append_journal(self, run_id: str, segments: Sequence[JournalSegment]) -> None:
        """Append journal segments, in order."""
        run = self._writable(run_id)
        run.journal.extend(json.dumps(list(s)) for s in segments)

    async def load_journal(self, run_id: str) -> list[JournalSegment]:
        """The run's journal, in append order."""
        return [JournalSegment(*json.loads(t)) for t in self._run(run_id).journal]

    async def load_journal_page(
        self, run_id: str, *, after: int = 0, limit: int = 1000
    ) -> list[tuple[int, JournalSegment]]:
        """At most ``limit`` segments after position ``after`` (positions count from 1)."""
        if limit < 1:
            raise ConfigurationError(f"a page holds at least 1 segment, not {limit}")
        journal = self._run(run_id).journal
        start = max(after, 0)
        return [
            (start + i, JournalSegment(*json.loads(text)))
            for i, text in enumerate(journal[start : start + limit], 1)
        ]

    async def append_replay(self, run_id: str, segment: ReplaySegment) -> None:
        """Append a replay-log segment."""
        self._writable(run_id).replay.append(json.dumps(list(segment)))

    async def load_replay(self, run_id: str) -> list[ReplaySegment]:
        """The run's replay log, in append order."""
        return [ReplaySegment(*json.loads(t)) for t in self._run(run_id).replay]

    # -- RunLeases -----------------------------------------------------------------------

    async def get_lease(self, run_id: str) -> RunLease | None:
        """The run's lease, or ``None``."""
        run = self._runs.get(run_id)
        return None if run is None else run.lease

    async def take_lease(
        self, run_id: str, owner: str, expires_at: datetime, *, replacing: int | None
    ) -> RunLease | None:
        """Take the lease if it is as the caller saw it."""
        run = self._run(run_id)
        seen = None if run.lease is None else run.lease.token
        if seen != replacing:
            return None
        token = 1 if replacing is None else replacing + 1
        run.lease = RunLease(run_id=run_id, owner=owner, token=token, expires_at=expires_at)
        return run.lease

    async def renew_lease(self, run_id: str, token: int, expires_at: datetime) -> bool:
        """Extend the lease while ``token`` holds it."""
        run = self._runs.get(run_id)
        if run is None or run.lease is None or run.lease.token != token:
            return False
        run.lease = run.lease.model_copy(update={"expires_at": expires_at})
        return True

    async def release_lease(self, run_id: str, token: int) -> None:
        """End the lease now, if ``token`` still holds it."""
        await self.renew_lease(run_id, token, utcnow())

    def fence(self, run_id: str, token: int) -> None:
        """Refuse this object's writes for the run unless its lease keeps ``token``."""
        self._fences[run_id] = token


# The roles, checked by the type checker rather than by inheriting from them.
_runs: type[RunStore] = OneProcessDouble
_log: type[RunLog] = OneProcessDouble
_leases: type[RunLeases] = OneProcessDouble
_one_process: type[OneProcessStore] = OneProcessDouble
