"""The inspector's routes over snapshots: the list, one cut, an agent across them, a diff."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

from fastapi import APIRouter, Query

from agentsnap.inspect import diff_snapshots, read_cut, resolve_run
from agentsnap.records import SnapshotStatus
from agentsnap.ui._wire import diff_view, optional_micros, snapshot_summary

if TYPE_CHECKING:
    from agentsnap.ui._inspector import Inspector

_SNAPSHOT_PAGE = 50


def snapshots_router(inspector: Inspector) -> APIRouter:
    """A run's snapshots, one snapshot, an agent's history and the diff of two."""
    router = APIRouter()
    store = inspector.store
    models = inspector.models

    @router.get("/api/runs/{run}/snapshots", summary="The run's snapshots, with their cut lines")
    async def list_snapshots(run: str) -> dict[str, Any]:
        found = await resolve_run(store, run)
        entry = await inspector.indexes.get(found)
        rows = []
        after = 0
        while True:
            page = await store.list_snapshots_page(found.id, after_seq=after, limit=_SNAPSHOT_PAGE)
            for snapshot in page:
                recorded = entry.recorded.get(snapshot.id)
                if recorded is None:
                    recorded = entry.recorded[snapshot.id] = entry.index.recorded(snapshot)
                rows.append(
                    {
                        **snapshot_summary(snapshot),
                        "initiator": snapshot.initiator,
                        "in_flight": sum(len(c.messages) for c in snapshot.channels),
                        "error": snapshot.error,
                        "recorded": recorded,
                    }
                )
            if len(page) < _SNAPSHOT_PAGE:
                break
            after = page[-1].seq
        return {"snapshots": rows}

    @router.get("/api/runs/{run}/snapshots/{sid}", summary="One snapshot: states and channels")
    async def get_snapshot(run: str, sid: str) -> dict[str, Any]:
        found = await resolve_run(store, run)
        snapshot = await inspector.in_run(found, sid)
        return {
            **snapshot_summary(snapshot),
            "initiator": snapshot.initiator,
            "error": snapshot.error,
            "damaged_agents": list(snapshot.damaged_agents),
            "agents": {
                name: {
                    "state": cut.state,
                    "state_hash": cut.state_hash,
                    "state_version": cut.state_version,
                    "counters": {"sent": cut.sent, "received": cut.received},
                    **read_cut(name, cut, models),
                }
                for name, cut in sorted(snapshot.agents.items())
            },
            "channels": [
                {
                    "src": channel.src,
                    "dst": channel.dst,
                    "in_flight": [
                        {
                            "id": m.id,
                            "src": channel.src,
                            "dst": channel.dst,
                            "seq": m.seq,
                            "kind": m.kind,
                            "epoch": m.epoch,
                            "payload": m.payload,
                            "headers": m.headers,
                        }
                        for m in channel.messages
                    ],
                }
                for channel in snapshot.channels
            ],
        }

    @router.get("/api/runs/{run}/agents/{agent}/history", summary="One agent across the snapshots")
    async def agent_history(run: str, agent: str) -> dict[str, Any]:
        found = await resolve_run(store, run)
        versions = await store.agent_history(found.id, agent)
        rows = []
        previous: str | None = None
        for version in versions:
            cut = version.cut
            state_hash = None if cut is None else cut.state_hash
            rows.append(
                {
                    "id": version.snapshot_id,
                    "seq": version.snapshot_seq,
                    "status": "damaged" if version.damaged else SnapshotStatus.COMPLETE.value,
                    "damaged": version.damaged,
                    "completed_at_us": optional_micros(version.completed_at),
                    "state_hash": state_hash,
                    "changed": state_hash is not None and state_hash != previous,
                    "state": None if cut is None else cut.state,
                    "state_version": None if cut is None else cut.state_version,
                    **({} if cut is None else read_cut(agent, cut, models)),
                }
            )
            if state_hash is not None:
                previous = state_hash
        return {"agent": agent, "snapshots": rows}

    @router.get("/api/runs/{run}/diff", summary="What changed between two snapshots")
    async def diff(
        run: str,
        a: Annotated[str, Query(description="The earlier snapshot.")],
        b: Annotated[str, Query(description="The later snapshot.")],
        agent: Annotated[str | None, Query(description="Only this agent.")] = None,
    ) -> dict[str, Any]:
        found = await resolve_run(store, run)
        first = await inspector.in_run(found, a)
        second = await inspector.in_run(found, b)
        raw = await diff_snapshots(store, first.id, second.id, agent, models=models)
        return diff_view(raw, first, second)

    return router
