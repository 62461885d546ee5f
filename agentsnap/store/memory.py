"""A store that keeps everything in memory, for tests and quick experiments."""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from typing import Literal, TypeVar

from agentsnap.exceptions import ConfigurationError, NotFoundError, StoreError
from agentsnap.integrity import agent_versions
from agentsnap.liveness import lost, owner_gone, owner_is_live
from agentsnap.messages import JsonValue
from agentsnap.records import (
    AgentCut,
    AgentLease,
    AgentVersion,
    GraphCheckpoint,
    JournalSegment,
    ReplaySegment,
    RollbackInfo,
    RunInfo,
    RunLease,
    RunOwner,
    RunStatus,
    Snapshot,
    SnapshotPart,
    SnapshotSummary,
    utcnow,
)
from agentsnap.store._run_filter import RunFilter, RunListing

_T = TypeVar("_T")

__all__ = ["MemoryStore"]


class MemoryStore(RunListing):
    """Keeps runs and snapshots in dictionaries.

    Agent states are kept once per content hash, like the SQL store does, so a thousand
    snapshots of an agent that did not change hold its state once.

    Leases and fencing behave as in the SQL store, among the users of this one object (a
    memory store is private to its process).
    """

    def __init__(self) -> None:
        self._runs: dict[str, RunInfo] = {}
        self._snapshots: dict[str, Snapshot] = {}
        self._by_run: dict[str, list[str]] = {}
        self._blobs: dict[str, str] = {}
        self._journals: dict[str, list[JournalSegment]] = {}
        self._rollbacks: dict[str, list[RollbackInfo]] = {}
        self._replays: dict[str, list[ReplaySegment]] = {}
        self._leases: dict[str, RunLease] = {}
        self._owners: dict[str, list[RunOwner]] = {}
        self._renewed: dict[str, datetime] = {}
        self._fences: dict[str, int] = {}
        self._schemas: dict[str, dict[str, str]] = {}
        self._parts: dict[tuple[str, int], dict[str, SnapshotPart]] = {}
        self._agent_leases: dict[tuple[str, str], AgentLease] = {}

    @property
    def blob_count(self) -> int:
        """How many distinct agent states are held."""
        return len(self._blobs)

    async def create_run(self, run: RunInfo) -> None:  # noqa: D102
        if run.id not in self._runs:
            self._runs[run.id] = run
            self._by_run[run.id] = []

    async def save_snapshot(self, snapshot: Snapshot) -> None:  # noqa: D102
        if snapshot.run_id not in self._runs:
            raise NotFoundError("run", snapshot.run_id)
        if snapshot.id in self._snapshots:
            raise StoreError(f"a snapshot with id {snapshot.id} is already stored")
        if any(self._snapshots[i].seq == snapshot.seq for i in self._by_run[snapshot.run_id]):
            raise StoreError(f"run {snapshot.run_id} already has a snapshot number {snapshot.seq}")
        self._check_fence(snapshot.run_id)
        # Share one string per distinct state, the in-memory analogue of the blob table.
        agents = {
            name: AgentCut(
                state_json=self._blobs.setdefault(cut.state_hash, cut.state_json),
                state_hash=cut.state_hash,
                sent=cut.sent,
                received=cut.received,
                state_version=cut.state_version,
            )
            for name, cut in snapshot.agents.items()
        }
        stored = snapshot.model_copy(update={"agents": agents})
        self._snapshots[snapshot.id] = stored
        self._by_run[snapshot.run_id].append(snapshot.id)

    async def finish_run(  # noqa: D102
        self,
        run_id: str,
        status: RunStatus,
        finished_at: datetime | None,
        reason: str | None = None,
    ) -> None:
        self._update_run(run_id, status=status, finished_at=finished_at, status_reason=reason)

    async def save_traceback(self, run_id: str, traceback: str | None) -> None:  # noqa: D102
        self._update_run(run_id, traceback=traceback)

    async def request_cancel(self, run_id: str, reason: str | None) -> None:  # noqa: D102
        # Not fenced: anyone may ask the owner to stop.
        self._update_run(run_id, fenced=False, cancel_requested=reason)

    async def set_parent(self, run_id: str, parent_run_id: str, parent_snapshot_id: str) -> None:  # noqa: D102
        self._update_run(run_id, parent_run_id=parent_run_id, parent_snapshot_id=parent_snapshot_id)

    def _update_run(self, run_id: str, *, fenced: bool = True, **values: object) -> None:
        run = self._run(run_id)
        if fenced:
            self._check_fence(run_id)
        self._runs[run_id] = run.model_copy(update=values)

    async def save_rollback(self, rollback: RollbackInfo) -> None:  # noqa: D102
        self._run(rollback.run_id)
        if rollback.snapshot_id not in self._snapshots:
            raise NotFoundError("snapshot", rollback.snapshot_id)
        self._check_fence(rollback.run_id)
        self._rollbacks.setdefault(rollback.run_id, []).append(rollback)

    async def list_rollbacks(self, run_id: str) -> list[RollbackInfo]:  # noqa: D102
        self._run(run_id)
        return list(self._rollbacks.get(run_id, ()))

    async def get_run(self, run_id: str) -> RunInfo:  # noqa: D102
        return self._as_seen(self._run(run_id), utcnow())

    async def _list_runs(self, wanted: RunFilter) -> list[RunInfo]:
        now = utcnow()
        runs = sorted(self._runs.values(), key=lambda run: (run.created_at, run.id))
        found = [seen for seen in (self._as_seen(run, now) for run in runs) if wanted.matches(seen)]
        return found if wanted.limit is None else found[-wanted.limit :]

    def _run(self, run_id: str) -> RunInfo:
        """The run as recorded."""
        try:
            return self._runs[run_id]
        except KeyError:
            raise NotFoundError("run", run_id) from None

    def _as_seen(self, run: RunInfo, now: datetime) -> RunInfo:
        """The run, interrupted if it is running without a live owner."""
        lease = self._leases.get(run.id)
        if run.status is RunStatus.RUNNING and not owner_is_live(lease, now):
            return run.model_copy(
                update={"status": RunStatus.INTERRUPTED, "status_reason": owner_gone(lease)}
            )
        return run

    async def find_ids(  # noqa: D102
        self, kind: Literal["run", "snapshot"], prefix: str, limit: int = 10
    ) -> list[str]:
        ids = self._runs if kind == "run" else self._snapshots
        return sorted(i for i in ids if i.startswith(prefix))[:limit]

    async def list_snapshots(self, run_id: str) -> list[Snapshot]:  # noqa: D102
        return self._of_run(run_id)

    def _of_run(self, run_id: str) -> list[Snapshot]:
        ids = self._by_run.get(run_id)
        if ids is None:
            raise NotFoundError("run", run_id)
        return sorted((self._snapshots[i] for i in ids), key=lambda s: s.seq)

    async def list_snapshots_page(  # noqa: D102
        self, run_id: str, *, after_seq: int = 0, limit: int = 100
    ) -> list[Snapshot]:
        _check_limit(limit)
        return [s for s in self._of_run(run_id) if s.seq > after_seq][:limit]

    async def list_snapshot_summaries(self, run_id: str) -> list[SnapshotSummary]:  # noqa: D102
        return [SnapshotSummary.of(s) for s in self._of_run(run_id)]

    async def snapshot_counts(self) -> dict[str, int]:  # noqa: D102
        return {run_id: len(ids) for run_id, ids in self._by_run.items() if ids}

    async def load_snapshot(self, snapshot_id: str) -> Snapshot:  # noqa: D102
        try:
            return self._snapshots[snapshot_id]
        except KeyError:
            raise NotFoundError("snapshot", snapshot_id) from None

    async def agent_history(self, run_id: str, agent: str) -> list[AgentVersion]:  # noqa: D102
        versions = agent_versions(await self.list_snapshots(run_id), agent)
        if not versions:
            raise NotFoundError.agent(run_id, agent)
        return versions

    async def list_graph_checkpoints(
        self, run_id: str, agent: str | None = None
    ) -> list[GraphCheckpoint]:
        """Always ``[]`` for a run it holds: LangGraph checkpoints are never kept here.

        A graph agent's checkpointer (LangGraph's ``InMemorySaver`` by default) keeps them
        apart from this store.

        Raises:
            NotFoundError: The store holds no such run.
        """
        self._run(run_id)
        return []

    async def append_journal(self, run_id: str, segments: Sequence[JournalSegment]) -> None:  # noqa: D102
        self._appending(self._journals, run_id).extend(segments)

    async def load_journal(self, run_id: str) -> list[JournalSegment]:  # noqa: D102
        self._run(run_id)
        return list(self._journals.get(run_id, ()))

    async def load_journal_page(  # noqa: D102
        self, run_id: str, *, after: int = 0, limit: int = 1000
    ) -> list[tuple[int, JournalSegment]]:
        self._run(run_id)
        _check_limit(limit)
        # A segment's position is its index in the journal, from 1.
        start = max(after, 0)
        segments = self._journals.get(run_id, [])[start : start + limit]
        return [(start + i, segment) for i, segment in enumerate(segments, 1)]

    async def save_state_schemas(  # noqa: D102
        self, run_id: str, schemas: Mapping[str, Mapping[str, JsonValue]]
    ) -> None:
        self._run(run_id)
        self._check_fence(run_id)
        # Kept as JSON text, as an SQL store keeps them: what is read back is a fresh copy.
        encoded = {name: json.dumps(schema, allow_nan=False) for name, schema in schemas.items()}
        self._schemas.setdefault(run_id, {}).update(encoded)

    async def load_state_schemas(self, run_id: str) -> dict[str, dict[str, JsonValue]]:  # noqa: D102
        self._run(run_id)
        return {
            name: json.loads(text) for name, text in sorted(self._schemas.get(run_id, {}).items())
        }

    async def append_replay(self, run_id: str, segment: ReplaySegment) -> None:  # noqa: D102
        self._appending(self._replays, run_id).append(segment)

    async def load_replay(self, run_id: str) -> list[ReplaySegment]:  # noqa: D102
        self._run(run_id)
        return list(self._replays.get(run_id, ()))

    def _appending(self, logs: dict[str, list[_T]], run_id: str) -> list[_T]:
        """The run's list in ``logs``, to append to: the run is there and not fenced off."""
        self._run(run_id)
        self._check_fence(run_id)
        return logs.setdefault(run_id, [])

    # -- ownership ------------------------------------------------------------------------

    async def save_snapshot_part(self, part: SnapshotPart) -> None:  # noqa: D102
        self._run(part.run_id)
        # A copy, as a database would keep it: the caller's object is not shared.
        self._parts.setdefault((part.run_id, part.seq), {})[part.worker] = part.model_copy(
            deep=True
        )

    async def load_snapshot_parts(self, run_id: str, seq: int) -> list[SnapshotPart]:  # noqa: D102
        self._run(run_id)
        parts = self._parts.get((run_id, seq), {})
        return [parts[worker] for worker in sorted(parts)]

    async def delete_snapshot_parts(self, run_id: str, below: int) -> int:  # noqa: D102
        self._run(run_id)
        gone = [key for key in self._parts if key[0] == run_id and key[1] < below]
        return sum(len(self._parts.pop(key)) for key in gone)

    async def claim_agents(  # noqa: D102
        self, run_id: str, owner: str, agents: Collection[str], expires_at: datetime
    ) -> list[AgentLease]:
        self._run(run_id)
        now = utcnow()
        held = [
            lease
            for agent in sorted(set(agents))
            if (lease := self._agent_leases.get((run_id, agent))) is not None
            and lease.owner != owner
            and lease.expires_at > now
        ]
        if held:
            return held
        for agent in agents:
            self._agent_leases[run_id, agent] = AgentLease(
                run_id=run_id, agent=agent, owner=owner, expires_at=expires_at
            )
        return []

    async def release_agents(self, run_id: str, owner: str) -> None:  # noqa: D102
        now = utcnow()
        for key, lease in list(self._agent_leases.items()):
            if key[0] == run_id and lease.owner == owner and lease.expires_at > now:
                self._agent_leases[key] = lease.model_copy(update={"expires_at": now})

    async def list_agent_leases(self, run_id: str) -> list[AgentLease]:  # noqa: D102
        return [lease for key, lease in sorted(self._agent_leases.items()) if key[0] == run_id]

    async def get_lease(self, run_id: str) -> RunLease | None:  # noqa: D102
        return self._leases.get(run_id)

    async def take_lease(  # noqa: D102
        self, run_id: str, owner: str, expires_at: datetime, *, replacing: int | None
    ) -> RunLease | None:
        self._run(run_id)
        found = self._leases.get(run_id)
        if (found is None) != (replacing is None) or (
            found is not None and found.token != replacing
        ):
            return None
        lease = RunLease(
            run_id=run_id,
            owner=owner,
            token=1 if replacing is None else replacing + 1,
            expires_at=expires_at,
        )
        now = utcnow()
        if replacing is not None:
            self._end_owner(run_id, replacing, "taken_over", now)
        self._leases[run_id] = lease
        self._renewed[run_id] = now
        self._owners.setdefault(run_id, []).append(
            RunOwner(run_id=run_id, token=lease.token, owner=owner, acquired_at=now)
        )
        return lease

    def _end_owner(
        self, run_id: str, token: int, how: Literal["released", "taken_over"], now: datetime
    ) -> None:
        owners = self._owners.get(run_id, [])
        for i, found in enumerate(owners):
            if found.token == token and found.ended_at is None:
                owners[i] = found.model_copy(
                    update={
                        "ended_at": now,
                        "ended": how,
                        "last_renewed_at": self._renewed.get(run_id),
                    }
                )

    async def renew_lease(self, run_id: str, token: int, expires_at: datetime) -> bool:  # noqa: D102
        found = self._leases.get(run_id)
        if found is None or found.token != token:
            return False
        self._leases[run_id] = found.model_copy(update={"expires_at": expires_at})
        self._renewed[run_id] = utcnow()
        return True

    async def release_lease(self, run_id: str, token: int) -> None:  # noqa: D102
        found = self._leases.get(run_id)
        if found is not None and found.token == token:
            now = utcnow()
            self._end_owner(run_id, token, "released", now)
            self._leases[run_id] = found.model_copy(update={"expires_at": now})
            self._renewed[run_id] = now

    async def list_run_owners(self, run_id: str) -> list[RunOwner]:  # noqa: D102
        self._run(run_id)
        return list(self._owners.get(run_id, []))

    def fence(self, run_id: str, token: int) -> None:  # noqa: D102
        self._fences[run_id] = token

    def _check_fence(self, run_id: str) -> None:
        token = self._fences.get(run_id)
        if token is None:
            return
        found = self._leases.get(run_id)
        if found is None:
            raise lost(run_id, token, None)
        if found.token != token:
            raise lost(run_id, token, (found.owner, found.token))

    async def close(self) -> None:  # noqa: D102
        return None


def _check_limit(limit: int) -> None:
    if limit < 1:
        raise ConfigurationError(f"a page holds at least 1 item, not {limit}")
