"""Where runs and snapshots are kept.

A store implements the [`Store`][agentsnap.store.Store] protocol. The runtime hands it each
snapshot once the snapshot is complete (or has failed), in one call; a store must make that
write atomic, so a snapshot is either entirely there or not at all.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Literal, Protocol, runtime_checkable

from agentsnap.records import (
    AgentVersion,
    GraphCheckpoint,
    JournalSegment,
    RollbackInfo,
    RunInfo,
    RunStatus,
    Snapshot,
)
from agentsnap.store.memory import MemoryStore

__all__ = ["MemoryStore", "Store"]


@runtime_checkable
class Store(Protocol):
    """The contract every store fulfils."""

    async def create_run(self, run: RunInfo) -> None:
        """Record that a run started (a run id already present is left as it is)."""

    async def save_snapshot(self, snapshot: Snapshot) -> None:
        """Write a completed or failed snapshot, all or nothing."""

    async def finish_run(self, run_id: str, status: RunStatus, finished_at: datetime) -> None:
        """Record how and when a run ended.

        Raises:
            NotFoundError: The store holds no such run.
        """

    async def set_parent(self, run_id: str, parent_run_id: str, parent_snapshot_id: str) -> None:
        """Record that a run was forked from a snapshot of another run.

        Raises:
            NotFoundError: The store holds no such run.
        """

    async def save_rollback(self, rollback: RollbackInfo) -> None:
        """Record a rollback of a run.

        Raises:
            NotFoundError: The store holds no such run or snapshot.
        """

    async def list_rollbacks(self, run_id: str) -> list[RollbackInfo]:
        """Every rollback of a run, oldest first.

        Raises:
            NotFoundError: The store holds no such run.
        """

    async def get_run(self, run_id: str) -> RunInfo:
        """The run with this id.

        Raises:
            NotFoundError: The store holds no such run.
        """

    async def list_runs(self) -> list[RunInfo]:
        """Every run, oldest first."""

    async def find_ids(
        self, kind: Literal["run", "snapshot"], prefix: str, limit: int = 10
    ) -> list[str]:
        """Ids of runs (or of snapshots, of any run) that start with ``prefix``.

        Sorted, at most ``limit`` of them; ``prefix`` is matched literally (no wildcards).
        """

    async def list_snapshots(self, run_id: str) -> list[Snapshot]:
        """Every snapshot of a run, in the order they were started."""

    async def snapshot_counts(self) -> dict[str, int]:
        """How many snapshots (complete or failed) each run has, by run id.

        Runs without a snapshot are left out. This reads no snapshot, so listing runs costs
        the same whatever the runs hold.
        """

    async def load_snapshot(self, snapshot_id: str) -> Snapshot:
        """The snapshot with this id.

        Raises:
            NotFoundError: The store holds no such snapshot.
        """

    async def agent_history(self, run_id: str, agent: str) -> list[AgentVersion]:
        """An agent's part of every complete snapshot of a run, oldest first.

        Raises:
            NotFoundError: The store holds no such run, or no snapshot of the run has
                recorded this agent.
        """

    async def list_graph_checkpoints(
        self, run_id: str, agent: str | None = None
    ) -> list[GraphCheckpoint]:
        """The LangGraph checkpoints the graph agents of a run (or only ``agent``) wrote.

        Oldest first (by checkpoint id, which LangGraph makes time-ordered), the root graph's
        checkpoints only (not a subgraph's), on every thread of the agent: its first thread
        and those started by rollbacks to before its first message. A store finds the
        checkpoints a graph agent's checkpointer put in the store's own database
        (``AgentsnapSaver`` on the same URL); a store that holds none returns ``[]``.

        Raises:
            NotFoundError: The store holds no such run.
        """

    async def append_journal(self, run_id: str, segments: Sequence[JournalSegment]) -> None:
        """Append journal segments to a run's journal, all or nothing, in the given order.

        Raises:
            NotFoundError: The store holds no such run.
        """

    async def load_journal(self, run_id: str) -> list[JournalSegment]:
        """Every journal segment of a run, in the order they were appended.

        Raises:
            NotFoundError: The store holds no such run.
        """

    async def close(self) -> None:
        """Release connections and files."""
