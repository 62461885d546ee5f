"""What a page that follows runs asks for: short tokens that change when what it shows changes.

The inspector's pages poll ``GET /api/live`` (about once a second while the page is visible
and not paused) and redraw when a token differs from the one taken as they were drawn. A
token is a digest of what the pages show and the store can tell cheaply: for the runs list,
each run's status, end, reason, snapshot count and waiting requests; for one run, also its
snapshots' statuses, its rollbacks, how far its journal reached, its tool calls' statuses and
its requests. The journal is read incrementally: the server keeps how far it read each run
followed, so a long run costs one small query per poll, not a read of its journal.

The server never imports user code for this: everything comes from the store.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

import orjson

from agentsnap.inspect import ledger_calls, list_requests
from agentsnap.records import RunStatus

if TYPE_CHECKING:
    from agentsnap.ledger import Ledger
    from agentsnap.records import RunInfo
    from agentsnap.store import Store

_FOLLOWED_RUNS = 64
"""How many runs' journal ends the server keeps (the least recently followed go first)."""

_JOURNAL_PAGE = 1000


def _digest(parts: Any) -> str:
    return hashlib.blake2b(orjson.dumps(parts, default=str), digest_size=12).hexdigest()


class LiveTokens:
    """The tokens of ``GET /api/live``, with how far each followed run's journal was read."""

    def __init__(self, store: Store, ledger: Ledger | None) -> None:
        self._store = store
        self._ledger = ledger
        self._ends: OrderedDict[str, int] = OrderedDict()

    async def runs(self) -> str:
        """The runs list's token.

        It changes when a run is added, ends, or takes a snapshot, when a running run rolls
        back, or when a request to a person starts or stops waiting.
        """
        runs = await self._store.list_runs()
        counts = await self._store.snapshot_counts()
        waiting = await list_requests(self._store, None, pending=True, ledger=self._ledger)
        rollbacks = {
            run.id: len(await self._store.list_rollbacks(run.id))
            for run in runs
            if run.status is RunStatus.RUNNING
        }
        return _digest(
            [
                [
                    [r.id, r.status.value, r.finished_at, r.status_reason, counts.get(r.id, 0)]
                    for r in runs
                ],
                sorted(request.id for request in waiting),
                sorted(rollbacks.items()),
            ]
        )

    async def run(self, run: RunInfo) -> str:
        """One run's token.

        It changes with the run's status, each message journaled, each snapshot's status,
        each rollback, each tool call's status and each request's.
        """
        snapshots = await self._store.list_snapshot_summaries(run.id)
        rollbacks = await self._store.list_rollbacks(run.id)
        calls = await ledger_calls(self._store, run.id, self._ledger)
        requests = await list_requests(self._store, run.id, ledger=self._ledger)
        return _digest(
            [
                [run.status.value, run.finished_at, run.status_reason],
                [[s.id, s.status.value] for s in snapshots],
                len(rollbacks),
                await self._journal_end(run.id),
                [[c.key, c.status.value] for c in calls],
                [[r.id, r.status] for r in requests],
            ]
        )

    async def _journal_end(self, run_id: str) -> int:
        end = self._ends.pop(run_id, 0)
        while True:
            page = await self._store.load_journal_page(run_id, after=end, limit=_JOURNAL_PAGE)
            if page:
                end = page[-1][0]
            if len(page) < _JOURNAL_PAGE:
                break
        self._ends[run_id] = end
        while len(self._ends) > _FOLLOWED_RUNS:
            self._ends.popitem(last=False)
        return end
