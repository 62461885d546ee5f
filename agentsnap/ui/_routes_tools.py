"""The inspector's routes over what agents called: side-effecting tool calls and model calls."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

from fastapi import APIRouter, HTTPException, Query

from agentsnap.inspect import resolve_run
from agentsnap.ledger import ToolCallStatus
from agentsnap.ui._wire import Offset, call_view, json_response
from agentsnap.ui.queries import model_calls_view

if TYPE_CHECKING:
    from agentsnap.ui._inspector import Inspector


def tools_router(inspector: Inspector) -> APIRouter:
    """A run's tool calls (the ledger's) and its model calls."""
    router = APIRouter()
    store = inspector.store
    ledger = inspector.ledger

    @router.get("/api/runs/{run}/tools", summary="The run's side-effecting tool calls")
    async def tools(
        run: str,
        *,
        status: str | None = None,
        tool: str | None = None,
        q: Annotated[str | None, Query(description="Part of the key, tool or agent.")] = None,
        limit: Annotated[int, Query(ge=1, le=10_000)] = 100,
        offset: Offset = 0,
    ) -> dict[str, Any]:
        found = await resolve_run(store, run)
        entries = await inspector.calls(found.id)
        if status:
            known = {s.value for s in ToolCallStatus}
            if status not in known:
                raise HTTPException(
                    422, f"unknown status {status!r}: use one of {', '.join(sorted(known))}"
                )
            entries = [e for e in entries if e.status.value == status]
        if tool:
            entries = [e for e in entries if e.tool == tool]
        if q:
            needle = q.lower()
            entries = [
                e
                for e in entries
                if needle in e.key.lower()
                or needle in e.tool.lower()
                or (e.agent is not None and needle in e.agent.lower())
            ]
        page = entries[offset : offset + limit]
        index = (await inspector.indexes.get(found)).index if page else None
        return {"calls": [call_view(e, index) for e in page], "total": len(entries)}

    @router.get("/api/runs/{run}/model-calls", summary="The run's model calls, by agent or cut")
    async def list_model_calls(
        run: str,
        agent: Annotated[str | None, Query(description="Only this agent's calls.")] = None,
        snapshot: Annotated[
            str | None,
            Query(description="Only the calls made since the cut before this snapshot."),
        ] = None,
    ) -> Any:
        found = await resolve_run(store, run)
        cut = None if snapshot is None else await inspector.in_run(found, snapshot)
        return json_response(
            await model_calls_view(store, found.id, ledger, agent=agent, snapshot=cut)
        )

    return router
