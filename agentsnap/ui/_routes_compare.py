"""A fork beside its parent: what the what-if changed.

``GET /api/runs/{run}/compare`` takes a fork and answers, from the snapshot it was forked
at onwards:

* ``cuts``: the corresponding cuts in pairs: the fork point with the fork's first snapshot
  (its copy), then the parent's and the fork's following complete snapshots in order; per
  agent its state on each side, whether it differs and the diff
  ([`diff_states`][agentsnap.inspect.diff_states]);
* ``tool_calls``: the side-effecting calls each side made after the fork point, in pairs
  where agent, tool and arguments agree (a dry fork's calls show ``dry``), the others alone;
* ``model_calls``: the model calls alike, paired by agent, message and position.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, HTTPException

from agentsnap._views import attributes
from agentsnap.fork import tools_of
from agentsnap.inspect import (
    call_summary,
    diff_states,
    discarded_calls,
    ledger_calls,
    model_calls,
    resolve_run,
    resolve_snapshot,
)
from agentsnap.records import SnapshotStatus
from agentsnap.ui.queries import micros

if TYPE_CHECKING:
    from collections.abc import Callable

    from agentsnap.ledger import Ledger, LedgerEntry
    from agentsnap.records import RunInfo, Snapshot
    from agentsnap.store import Store

__all__ = ["compare_router"]

_PAGE = 50


async def _complete(store: Store, run_id: str, after_seq: int = 0) -> list[Snapshot]:
    found: list[Snapshot] = []
    after = after_seq
    while True:
        page = await store.list_snapshots_page(run_id, after_seq=after, limit=_PAGE)
        found.extend(s for s in page if s.status is SnapshotStatus.COMPLETE)
        if len(page) < _PAGE:
            return found
        after = page[-1].seq


def _side(snapshot: Snapshot | None) -> dict[str, Any] | None:
    if snapshot is None:
        return None
    return {
        "id": snapshot.id,
        "seq": snapshot.seq,
        "completed_at_us": None if snapshot.completed_at is None else micros(snapshot.completed_at),
    }


def _pair_cut(parent: Snapshot | None, fork: Snapshot | None) -> dict[str, Any]:
    names = sorted(set(parent.agents if parent else ()) | set(fork.agents if fork else ()))
    agents = []
    for name in names:
        old = parent.agents.get(name) if parent else None
        new = fork.agents.get(name) if fork else None
        same = old is not None and new is not None and old.state_hash == new.state_hash
        diff = diff_states(None if old is None else old.state, None if new is None else new.state)
        agents.append(
            {
                "agent": name,
                "parent": None if old is None else old.state,
                "fork": None if new is None else new.state,
                "same": same or (old is not None and new is not None and diff.empty),
                "diff": diff.model_dump(mode="json"),
            }
        )
    return {"parent": _side(parent), "fork": _side(fork), "agents": agents}


def _pairs(
    left: list[dict[str, Any]], right: list[dict[str, Any]], key: Callable[[dict[str, Any]], Any]
) -> list[dict[str, Any]]:
    """Rows of ``left`` and ``right`` side by side, in order, where ``key`` agrees."""
    waiting: dict[Any, list[int]] = {}
    for i, row in enumerate(right):
        waiting.setdefault(key(row), []).append(i)
    used: set[int] = set()
    rows: list[dict[str, Any]] = []
    for row in left:
        match = waiting.get(key(row))
        if match:
            j = match.pop(0)
            used.add(j)
            rows.append({"parent": row, "fork": right[j]})
        else:
            rows.append({"parent": row, "fork": None})
    rows.extend({"parent": None, "fork": r} for j, r in enumerate(right) if j not in used)
    return rows


def _tool_row(entry: LedgerEntry) -> dict[str, Any]:
    return {
        **attributes(entry, "key", "tool", "agent", "arguments", "fingerprint"),
        "status": entry.status.value,
        "result": entry.result,
        "error": entry.error,
        "at_us": micros(entry.created_at),
    }


def compare_router(
    store: Store,
    *,
    ledger: Ledger | None = None,
) -> APIRouter:
    """The route that sets a fork beside its parent."""
    router = APIRouter()

    async def parent_of(fork: RunInfo) -> tuple[RunInfo, Snapshot]:
        if fork.parent_run_id is None or fork.parent_snapshot_id is None:
            raise HTTPException(
                409, f"run {fork.id} is not a fork: only a fork is compared with its parent"
            )
        parent = await store.get_run(fork.parent_run_id)
        point = await resolve_snapshot(store, fork.parent_snapshot_id)
        return parent, point

    @router.get("/api/runs/{run}/compare", summary="A fork beside its parent, from the fork point")
    async def compare(run: str) -> dict[str, Any]:
        fork = await resolve_run(store, run)
        parent, point = await parent_of(fork)
        theirs = [point, *await _complete(store, parent.id, point.seq)]
        ours = await _complete(store, fork.id)
        cuts = [
            {
                "index": i,
                **_pair_cut(
                    theirs[i] if i < len(theirs) else None, ours[i] if i < len(ours) else None
                ),
            }
            for i in range(max(len(theirs), len(ours)))
        ]
        since = point.completed_at or point.started_at
        parent_calls = [
            _tool_row(e)
            for e in await ledger_calls(store, parent.id, ledger)
            if e.created_at >= since
        ]
        fork_calls = [_tool_row(e) for e in await ledger_calls(store, fork.id, ledger)]
        parent_models = [
            r for r in await model_calls(store, parent.id, None, ledger) if r.started_at >= since
        ]
        fork_models = await model_calls(store, fork.id, None, ledger)
        return {
            "fork": {
                "id": fork.id,
                "name": fork.name,
                "status": fork.status.value,
                "tools": tools_of(fork),
            },
            "parent": {"id": parent.id, "name": parent.name, "status": parent.status.value},
            "fork_point": _side(point),
            "cuts": cuts,
            "tool_calls": _pairs(
                parent_calls, fork_calls, lambda c: (c["agent"], c["tool"], c["fingerprint"])
            ),
            "model_calls": _pairs(
                [
                    call_summary(r, d).model_dump(mode="json")
                    for r, d in zip(parent_models, discarded_calls(parent_models), strict=True)
                ],
                [
                    call_summary(r, d).model_dump(mode="json")
                    for r, d in zip(fork_models, discarded_calls(fork_models), strict=True)
                ],
                lambda c: (c["agent"], c["message"], c["position"]),
            ),
        }

    return router
