"""Typed results of the inspection queries, shared by ``agentsnap.inspect``, the CLI and the
web inspector's API: each is built once from the records, and printed as JSON with
``model_dump(mode="json")``.
"""  # noqa: D205

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import BaseModel, ConfigDict, PlainSerializer

from agentsnap.messages import JsonValue  # pydantic reads the annotations at run time
from agentsnap.records import RunInfo, RunStatus

__all__ = ["IsoTime", "RunRow"]


def _iso(moment: datetime) -> str:
    return moment.isoformat()


IsoTime = Annotated[datetime, PlainSerializer(_iso, return_type=str, when_used="json")]
"""A time that JSON shows as ``datetime.isoformat()`` does (``2026-11-24T20:05:03.123456+00:00``),
as agentsnap has always printed times, where pydantic alone would write ``Z`` for UTC."""


class RunRow(BaseModel):
    """A run as listings show it: ``agentsnap runs``, ``runs_table`` and the inspector's list."""

    model_config = ConfigDict(frozen=True)

    id: str
    """The run's id."""
    name: str | None
    """Its name, if it was given one."""
    status: RunStatus
    """Where it stands."""
    status_reason: str | None
    """Why it ended so, in one line, when it is known."""
    traceback: str | None
    """A failed run's tracebacks (see [`RunInfo.traceback`][agentsnap.RunInfo.traceback])."""
    cancel_requested: str | None
    """Why someone asked it to stop, while it has not stopped yet."""
    tags: dict[str, str]
    """Its tags."""
    created_at: IsoTime
    """When it started."""
    finished_at: IsoTime | None
    """When it finished, if it has."""
    snapshots: int
    """How many snapshots it has."""
    parent_run_id: str | None
    """The run it was forked from, if any."""
    parent_snapshot_id: str | None
    """The snapshot of that run it started from, if any."""
    metadata: dict[str, JsonValue]
    """The JSON the application attached to it."""

    @classmethod
    def of(cls, run: RunInfo, snapshots: int) -> RunRow:
        """The row of ``run``, which has ``snapshots`` snapshots."""
        return cls(
            id=run.id,
            name=run.name,
            status=run.status,
            status_reason=run.status_reason,
            traceback=run.traceback,
            cancel_requested=run.cancel_requested,
            tags=dict(run.tags),
            created_at=run.created_at,
            finished_at=run.finished_at,
            snapshots=snapshots,
            parent_run_id=run.parent_run_id,
            parent_snapshot_id=run.parent_snapshot_id,
            metadata=run.metadata,
        )
