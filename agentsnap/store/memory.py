"""A store that keeps everything in memory, for tests and quick experiments."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Literal

from agentsnap.exceptions import NotFoundError, StoreError
from agentsnap.records import (
    AgentCut,
    AgentVersion,
    GraphCheckpoint,
    JournalSegment,
    RollbackInfo,
    RunInfo,
    RunStatus,
    Snapshot,
    SnapshotStatus,
)

__all__ = ["MemoryStore"]


class MemoryStore:
    """Keeps runs and snapshots in dictionaries.

    Agent states are kept once per content hash, like the SQL store does, so a thousand
    snapshots of an agent that did not change hold its state once.
    """

    def __init__(self) -> None:
        self._runs: dict[str, RunInfo] = {}
        self._snapshots: dict[str, Snapshot] = {}
        self._by_run: dict[str, list[str]] = {}
        self._blobs: dict[str, str] = {}
        self._journals: dict[str, list[JournalSegment]] = {}
        self._rollbacks: dict[str, list[RollbackInfo]] = {}

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
        # Share one string per distinct state, the in-memory analogue of the blob table.
        agents = {
            name: AgentCut(
                state_json=self._blobs.setdefault(cut.state_hash, cut.state_json),
                state_hash=cut.state_hash,
                sent=cut.sent,
                received=cut.received,
            )
            for name, cut in snapshot.agents.items()
        }
        stored = snapshot.model_copy(update={"agents": agents})
        self._snapshots[snapshot.id] = stored
        self._by_run[snapshot.run_id].append(snapshot.id)

    async def finish_run(self, run_id: str, status: RunStatus, finished_at: datetime) -> None:  # noqa: D102
        run = await self.get_run(run_id)
        self._runs[run_id] = run.model_copy(update={"status": status, "finished_at": finished_at})

    async def set_parent(self, run_id: str, parent_run_id: str, parent_snapshot_id: str) -> None:  # noqa: D102
        run = await self.get_run(run_id)
        self._runs[run_id] = run.model_copy(
            update={"parent_run_id": parent_run_id, "parent_snapshot_id": parent_snapshot_id}
        )

    async def save_rollback(self, rollback: RollbackInfo) -> None:  # noqa: D102
        await self.get_run(rollback.run_id)
        if rollback.snapshot_id not in self._snapshots:
            raise NotFoundError("snapshot", rollback.snapshot_id)
        self._rollbacks.setdefault(rollback.run_id, []).append(rollback)

    async def list_rollbacks(self, run_id: str) -> list[RollbackInfo]:  # noqa: D102
        await self.get_run(run_id)
        return list(self._rollbacks.get(run_id, ()))

    async def get_run(self, run_id: str) -> RunInfo:  # noqa: D102
        try:
            return self._runs[run_id]
        except KeyError:
            raise NotFoundError("run", run_id) from None

    async def list_runs(self) -> list[RunInfo]:  # noqa: D102
        return sorted(self._runs.values(), key=lambda run: run.created_at)

    async def find_ids(  # noqa: D102
        self, kind: Literal["run", "snapshot"], prefix: str, limit: int = 10
    ) -> list[str]:
        ids = self._runs if kind == "run" else self._snapshots
        return sorted(i for i in ids if i.startswith(prefix))[:limit]

    async def list_snapshots(self, run_id: str) -> list[Snapshot]:  # noqa: D102
        ids = self._by_run.get(run_id)
        if ids is None:
            raise NotFoundError("run", run_id)
        return sorted((self._snapshots[i] for i in ids), key=lambda s: s.seq)

    async def snapshot_counts(self) -> dict[str, int]:  # noqa: D102
        return {run_id: len(ids) for run_id, ids in self._by_run.items() if ids}

    async def load_snapshot(self, snapshot_id: str) -> Snapshot:  # noqa: D102
        try:
            return self._snapshots[snapshot_id]
        except KeyError:
            raise NotFoundError("snapshot", snapshot_id) from None

    async def agent_history(self, run_id: str, agent: str) -> list[AgentVersion]:  # noqa: D102
        versions = [
            AgentVersion(
                snapshot_id=snapshot.id,
                snapshot_seq=snapshot.seq,
                completed_at=snapshot.completed_at,
                cut=snapshot.agents[agent],
            )
            for snapshot in await self.list_snapshots(run_id)
            if snapshot.status is SnapshotStatus.COMPLETE and agent in snapshot.agents
        ]
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
        await self.get_run(run_id)
        return []

    async def append_journal(self, run_id: str, segments: Sequence[JournalSegment]) -> None:  # noqa: D102
        if run_id not in self._runs:
            raise NotFoundError("run", run_id)
        self._journals.setdefault(run_id, []).extend(segments)

    async def load_journal(self, run_id: str) -> list[JournalSegment]:  # noqa: D102
        if run_id not in self._runs:
            raise NotFoundError("run", run_id)
        return list(self._journals.get(run_id, ()))

    async def close(self) -> None:  # noqa: D102
        return None
