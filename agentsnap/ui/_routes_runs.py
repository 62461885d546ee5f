"""The inspector's routes over runs: the list, one run, its topology, and the live tokens."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

from fastapi import APIRouter, Query

from agentsnap.inspect import RunRow, resolve_run, runs_table
from agentsnap.messages import ENVIRONMENT
from agentsnap.ui._wire import Offset, run_view
from agentsnap.ui.queries import channel_counts, micros

if TYPE_CHECKING:
    from agentsnap.ui._inspector import Inspector


def runs_router(inspector: Inspector) -> APIRouter:
    """``/api/runs``, one run, its topology, and ``/api/live``."""
    router = APIRouter()
    store = inspector.store

    @router.get("/api/runs", summary="The runs, newest first")
    async def list_runs(
        q: Annotated[str | None, Query(description="Id prefix or part of the name.")] = None,
        status: Annotated[str | None, Query(description="Only runs in this status.")] = None,
        tag: Annotated[
            str | None, Query(description="Only runs with this tag (KEY or KEY=VALUE).")
        ] = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
        offset: Offset = 0,
    ) -> dict[str, Any]:
        runs = await runs_table(store, status=status or None)
        runs.reverse()
        if q:
            needle = q.lower()
            runs = [r for r in runs if r.id.startswith(q) or (r.name and needle in r.name.lower())]
        if tag:
            key, has_value, value = tag.partition("=")
            runs = [r for r in runs if key in r.tags and (not has_value or r.tags[key] == value)]
        page = runs[offset : offset + limit]
        rows = [run_view(r, len(await store.list_rollbacks(r.id))) for r in page]
        return {"runs": rows, "total": len(runs)}

    @router.get("/api/live", summary="Tokens that change when the runs, or one run, change")
    async def live(
        run: Annotated[str | None, Query(description="Also this run's token.")] = None,
    ) -> dict[str, Any]:
        found = None if run is None else await resolve_run(store, run)
        return {
            "runs": await inspector.tokens.runs(),
            "run": None if found is None else await inspector.tokens.run(found),
            "running": None if found is None else found.status.value == "running",
        }

    @router.get("/api/runs/{run}", summary="One run, with its span, agents, forks and schemas")
    async def get_run(run: str) -> dict[str, Any]:
        found = await resolve_run(store, run)
        entry = await inspector.indexes.get(found)
        index = entry.index
        snapshots = await store.list_snapshot_summaries(found.id)
        tool_calls = await inspector.calls(found.id)
        agents = set(index.agents) - {ENVIRONMENT}
        times: list[int] = []
        span = index.span_us()
        if span:
            times.extend(span)
        for s in snapshots:
            agents.update(a for a in s.agents if a != ENVIRONMENT)
            times.append(micros(s.started_at))
            if s.completed_at is not None:
                times.append(micros(s.completed_at))
        times.extend(micros(r.at) for r in entry.rollbacks)
        for call in tool_calls:
            times.extend((micros(call.created_at), micros(call.updated_at)))
        if not times:
            times.append(micros(found.created_at))
            if found.finished_at is not None:
                times.append(micros(found.finished_at))
        forks = [
            {"run_id": r.id, "snapshot_id": r.parent_snapshot_id}
            for r in await store.list_runs()
            if r.parent_run_id == found.id
        ]
        return {
            **run_view(RunRow.of(found, len(snapshots)), len(entry.rollbacks)),
            "agents": sorted(agents),
            "start_us": min(times),
            "end_us": max(times),
            "lamport_max": index.lamport_max,
            "messages": len(index),
            "journal": bool(index.positions),
            "tool_calls": len(tool_calls),
            "forks": forks,
            "schemas": await inspector.schemas(found.id),
        }

    @router.get("/api/runs/{run}/topology", summary="Who talks to whom: messages per channel")
    async def topology(run: str) -> dict[str, Any]:
        found = await resolve_run(store, run)
        return channel_counts((await inspector.indexes.get(found)).index)

    return router
