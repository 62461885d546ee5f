"""The inspector's routes over a run's journal: messages by window, one message, events."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

from fastapi import APIRouter, HTTPException, Query

from agentsnap.inspect import resolve_run
from agentsnap.ui._wire import (
    Axis,
    SpanQuery,
    WindowEnd,
    WindowStart,
    call_view,
    json_response,
)
from agentsnap.ui.queries import micros

if TYPE_CHECKING:
    from agentsnap.ui._inspector import Inspector

_DEFAULT_BINS = 200
_MAX_BINS = 2000
_MAX_LIMIT = 100_000


def messages_router(inspector: Inspector) -> APIRouter:
    """Messages touching a window (exact or as density), one message, and events."""
    router = APIRouter()
    store = inspector.store

    @router.get("/api/runs/{run}/messages", summary="The messages touching a window")
    async def messages(
        run: str,
        *,
        # Spelled out, not a SpanQuery: FastAPI lists a dependency's parameters last.
        axis: Axis = "wall",
        low: WindowStart = None,
        high: WindowEnd = None,
        agents: Annotated[str | None, Query(description="Comma-separated agent names.")] = None,
        limit: Annotated[int, Query(ge=1, le=_MAX_LIMIT)] = 5000,
        bins: Annotated[int, Query(ge=1, le=_MAX_BINS)] = _DEFAULT_BINS,
    ) -> Any:
        found = await resolve_run(store, run)
        index = (await inspector.indexes.get(found)).index
        if axis == "lamport":
            first, last = 0, index.lamport_max
        else:
            whole = index.span_us()
            first, last = whole if whole else (micros(found.created_at),) * 2
        low = first if low is None else low
        high = last if high is None else high
        if high < low:
            raise HTTPException(422, f"the window ends ({high}) before it starts ({low})")
        chosen = None if not agents else {a for a in agents.split(",") if a}
        window = index.window(axis, low, high, chosen, limit)
        if window.ordinals is not None:
            # Encoded at once (as the counts below): FastAPI's own encoder would walk every
            # value first, which costs more than finding them.
            return json_response(
                {
                    "mode": "exact",
                    "from": low,
                    "to": high,
                    "messages": [index.row(i) for i in window.ordinals],
                }
            )
        return json_response(
            {
                "mode": "density",
                "from": low,
                "to": high,
                "bins": bins,
                "count": window.count,
                "channels": [
                    {"src": channel.src, "dst": channel.dst, "counts": counts}
                    for channel, counts in index.density(axis, low, high, chosen, bins)
                ],
            }
        )

    @router.get(
        "/api/runs/{run}/messages/{src}/{dst}/{seq}", summary="One message, with its payload"
    )
    async def message(
        run: str,
        src: str,
        dst: str,
        seq: int,
        sent_us: Annotated[
            int | None, Query(description="Which send of the number (a rollback reuses them).")
        ] = None,
    ) -> dict[str, Any]:
        found = await resolve_run(store, run)
        index = (await inspector.indexes.get(found)).index
        i = index.find(src, dst, seq, sent_us)
        payload, headers = await index.payload(store, found.id, i)
        return {**index.row(i), "payload": payload, "headers": headers}

    @router.get("/api/runs/{run}/events", summary="Rollbacks and tool calls in a window")
    async def events(
        run: str,
        *,
        span: SpanQuery,
    ) -> dict[str, Any]:
        found = await resolve_run(store, run)
        entry = await inspector.indexes.get(found)
        index = entry.index

        def inside(at_us: int, lc: int) -> bool:
            where = lc if span.axis == "lamport" else at_us
            return (span.low is None or where >= span.low) and (
                span.high is None or where <= span.high
            )

        rollbacks = []
        for r in entry.rollbacks:
            at_us = micros(r.at)
            lc = index.clock_at(r.agent, at_us)
            if inside(at_us, lc):
                rollbacks.append(
                    {
                        "id": r.id,
                        "at_us": at_us,
                        "lc": lc,
                        "agent": r.agent,
                        "reason": r.reason,
                        "source": r.source,
                        "snapshot_id": r.snapshot_id,
                        "attempt": r.attempt,
                        "discarded": r.discarded,
                    }
                )
        tool_calls = []
        for call in await inspector.calls(found.id):
            row = call_view(call, index)
            if inside(row["at_us"], row["lc"]):
                tool_calls.append(
                    {k: row[k] for k in ("key", "tool", "agent", "status", "at_us", "lc")}
                    | {"unknown": row["unknown"]}
                )
        return {"rollbacks": rollbacks, "tool_calls": tool_calls}

    return router
