"""What the inspector's API returns: runs, snapshots, diffs, tool calls and requests as JSON.

Also the query parameters its routes share (a window on a time axis, a listing's offset).
Times are microseconds since the Unix epoch (``*_us``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal

import orjson
from fastapi import Depends, Query
from fastapi.responses import JSONResponse, Response

from agentsnap.ledger import ToolCallStatus
from agentsnap.ui.queries import micros

if TYPE_CHECKING:
    from agentsnap.inspect import RunRow, SnapshotDiff
    from agentsnap.ledger import LedgerEntry
    from agentsnap.records import Snapshot
    from agentsnap.requests import HumanRequest
    from agentsnap.ui.queries import RunIndex


Axis = Literal["wall", "lamport"]
"""A run's time axis: wall time (microseconds) or Lamport time."""
WindowStart = Annotated[int | None, Query(alias="from")]
"""Where a window on an axis starts (the parameter ``from``), by default the run's start."""
WindowEnd = Annotated[int | None, Query(alias="to")]
"""Where it ends (``to``), by default the run's end."""
Offset = Annotated[int, Query(ge=0)]
"""How many rows of a listing to skip."""


@dataclass(frozen=True)
class Span:
    """A window on a run's time axis, as a route's query gives it (``None``: open ended)."""

    axis: Axis
    low: int | None
    high: int | None


def span(axis: Axis = "wall", low: WindowStart = None, high: WindowEnd = None) -> Span:
    """The window the query parameters ``axis``, ``from`` and ``to`` say."""
    return Span(axis, low, high)


SpanQuery = Annotated[Span, Depends(span)]
"""A route's parameter taking its window from the query."""


def json_response(document: Any) -> Response:
    """``document`` encoded at once by orjson (FastAPI's encoder would walk it first)."""
    return Response(orjson.dumps(document), media_type="application/json")


def error_response(status: int, message: str, **extra: Any) -> JSONResponse:
    """An error on the wire: ``{"error": message, ...}`` with ``status``."""
    return JSONResponse({"error": message, **extra}, status_code=status)


def request_view(request: HumanRequest) -> dict[str, Any]:
    """A request on the wire: its JSON, its times in microseconds (``*_us``)."""
    shown = request.to_json()
    for name in ("asked_at", "answered_at", "deadline"):
        shown[f"{name}_us"] = optional_micros(getattr(request, name))
        del shown[name]
    return shown


def optional_micros(moment: Any) -> int | None:
    """``moment`` in microseconds since the Unix epoch, ``None`` for ``None``."""
    return None if moment is None else micros(moment)


def tag_list(tags: dict[str, str]) -> list[str]:
    """A run's tags as ``KEY=VALUE`` (``KEY`` for an empty value), sorted."""
    return [f"{key}={value}" if value else key for key, value in sorted(tags.items())]


def run_view(row: RunRow, rollbacks: int) -> dict[str, Any]:
    """A run on the wire: its row (as ``runs_table`` gives it), times in microseconds."""
    return {
        "id": row.id,
        "name": row.name,
        "tags": tag_list(row.tags),
        "tag_map": dict(row.tags),
        "status": row.status.value,
        "reason": row.status_reason,
        "traceback": row.traceback,
        "cancel_requested": row.cancel_requested,
        "created_at_us": micros(row.created_at),
        "updated_at_us": optional_micros(row.finished_at),
        "snapshots": row.snapshots,
        "rollbacks": rollbacks,
        "parent_run_id": row.parent_run_id,
        "parent_snapshot_id": row.parent_snapshot_id,
        "metadata": row.metadata,
    }


def snapshot_summary(snapshot: Snapshot) -> dict[str, Any]:
    """A snapshot's id, number, status and times."""
    return {
        "id": snapshot.id,
        "seq": snapshot.seq,
        "status": snapshot.status.value,
        "started_at_us": micros(snapshot.started_at),
        "completed_at_us": optional_micros(snapshot.completed_at),
    }


def diff_view(raw: SnapshotDiff, a: Snapshot, b: Snapshot) -> dict[str, Any]:
    """What changed from ``a`` to ``b``: agents, and channels' messages in flight."""
    agents = {
        entry.agent: entry.model_dump(mode="json", exclude={"agent"})
        for entry in raw.agents
        if entry.change != "unchanged"
    }
    before = {(c.src, c.dst): {m.seq for m in c.messages} for c in a.channels}
    after = {(c.src, c.dst): {m.seq for m in c.messages} for c in b.channels}
    channels = {}
    for src, dst in sorted(set(before) | set(after)):
        old = before.get((src, dst), set())
        new = after.get((src, dst), set())
        if old != new:
            channels[f"{src}>{dst}"] = {
                "src": src,
                "dst": dst,
                "a": len(old),
                "b": len(new),
                "added": sorted(new - old),
                "removed": sorted(old - new),
            }
    return {"a": a.id, "b": b.id, "agents": agents, "channels": channels}


def call_view(entry: LedgerEntry, index: RunIndex | None) -> dict[str, Any]:
    """A tool call of the ledger, placed on the run's clocks when ``index`` is given."""
    return {
        "key": entry.key,
        "tool": entry.tool,
        "agent": entry.agent,
        "status": entry.status.value,
        "attempts": entry.attempts,
        "outcome": entry.result,
        "error": entry.error,
        "unknown": entry.status is ToolCallStatus.UNKNOWN,
        "started_at_us": micros(entry.created_at),
        "finished_at_us": None
        if entry.status in {ToolCallStatus.IN_PROGRESS, ToolCallStatus.UNKNOWN}
        else micros(entry.updated_at),
        "arguments": entry.arguments,
        "at_us": micros(entry.created_at),
        "lc": 0 if index is None else index.clock_at(entry.agent, micros(entry.created_at)),
    }
