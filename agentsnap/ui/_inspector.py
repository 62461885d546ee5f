"""What every route of the inspector shares: the store, the ledger, the runs' indexes."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agentsnap.exceptions import NotFoundError
from agentsnap.inspect import ledger_calls, resolve_snapshot
from agentsnap.ui.queries import build_index

if TYPE_CHECKING:
    from pydantic import BaseModel

    from agentsnap.ledger import Ledger, LedgerEntry
    from agentsnap.records import RollbackInfo, RunInfo, Snapshot
    from agentsnap.store import Store
    from agentsnap.ui._live import LiveTokens
    from agentsnap.ui.queries import RunIndex

_CACHED_RUNS = 4  # runs whose index is kept


@dataclass
class IndexEntry:
    """A run's index and what was computed from it, with what says it is still current."""

    key: tuple[Any, ...]
    index: RunIndex
    rollbacks: list[RollbackInfo]
    recorded: dict[str, dict[str, dict[str, int]]] = field(default_factory=dict)


class Indexes:
    """The indexes of the runs looked at last, rebuilt when a run changes."""

    def __init__(self, store: Store, size: int = _CACHED_RUNS) -> None:
        self._store = store
        self._size = size
        self._entries: OrderedDict[str, IndexEntry] = OrderedDict()
        self._locks: dict[str, asyncio.Lock] = {}

    async def _key(self, run: RunInfo, rollbacks: list[RollbackInfo]) -> tuple[Any, ...]:
        counts = await self._store.snapshot_counts()
        return (run.status, run.finished_at, len(rollbacks), counts.get(run.id, 0))

    async def get(self, run: RunInfo) -> IndexEntry:
        lock = self._locks.setdefault(run.id, asyncio.Lock())
        async with lock:
            rollbacks = await self._store.list_rollbacks(run.id)
            key = await self._key(run, rollbacks)
            entry = self._entries.get(run.id)
            if entry is not None and entry.key == key and not await self._grew(run.id, entry):
                self._entries.move_to_end(run.id)
                return entry
            index = await build_index(self._store, run.id, rollbacks)
            entry = self._entries[run.id] = IndexEntry(key, index, rollbacks)
            self._entries.move_to_end(run.id)
            while len(self._entries) > self._size:
                self._entries.popitem(last=False)
            return entry

    async def _grew(self, run_id: str, entry: IndexEntry) -> bool:
        """Whether the run's journal has segments the index has not read."""
        page = await self._store.load_journal_page(run_id, after=entry.index.end_position, limit=1)
        return bool(page)


@dataclass
class Inspector:
    """The app's settings and shared parts, which each area's routes are built over."""

    store: Store
    """Where the runs are."""
    ledger: Ledger | None
    """Where the runs' tool calls are (``None``: the ledger in the store's database, if any)."""
    models: dict[str, type[BaseModel]]
    """The current state classes, by agent name."""
    indexes: Indexes
    """The indexes of the runs looked at last."""
    tokens: LiveTokens
    """What says that the runs, or one run, changed."""
    allow_fork: bool = False
    """Whether ``POST /api/runs/{run}/fork`` is accepted."""
    allow_answer: bool = False
    """Whether requests to people may be answered."""

    async def calls(self, run_id: str) -> list[LedgerEntry]:
        """The run's tool calls."""
        return await ledger_calls(self.store, run_id, self.ledger)

    async def schemas(self, run_id: str) -> dict[str, Any]:
        """The JSON schemas of the run's states, by agent name."""
        return dict(await self.store.load_state_schemas(run_id))

    async def counts(self, run: RunInfo) -> tuple[int, int]:
        """How many snapshots and rollbacks ``run`` has."""
        snapshots = (await self.store.snapshot_counts()).get(run.id, 0)
        return snapshots, len(await self.store.list_rollbacks(run.id))

    async def in_run(self, run: RunInfo, snapshot_id: str) -> Snapshot:
        """The snapshot ``snapshot_id`` (an id or a unique prefix), which must be ``run``'s."""
        snapshot = await resolve_snapshot(self.store, snapshot_id)
        if snapshot.run_id != run.id:
            raise NotFoundError(
                "snapshot", snapshot_id, f"snapshot {snapshot.id} belongs to run {snapshot.run_id}"
            )
        return snapshot
