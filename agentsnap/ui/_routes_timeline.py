"""What the space-time view marks beyond messages and cuts: stops, resumes, owners, idle gaps.

``GET /api/runs/{run}/incidents`` answers, from what the store keeps:

* ``resumes``: each time the run went on after its process stopped. A resumed run
  re-executes, on the same timeline, the handlers the stop interrupted (the replay log
  makes it so), so the first re-executed handler marks the resume (``at_us``) and the last
  act recorded before it marks the stop (``stopped_us``). When the lease counts more owner
  changes than that shows (a process killed before its journal reached the store leaves
  nothing to re-execute in it), the longest idle gaps not yet explained are the stops and
  resumes. A resume's ``owner`` is the process
  that went on (``host:pid:token``), known for the last resume (its process holds the
  run's lease; the store keeps no older owners);
* ``owner``: who holds the run's lease, and ``owner_changes``: how many times the lease
  passed to another owner (its fencing token counts the owners);
* ``gaps``: the stretches of at least ``min_gap_us`` (a second, or a tenth of the run's
  span when that is longer) with nothing recorded, which the view folds, showing their
  length.
"""

from __future__ import annotations

import itertools
from datetime import datetime
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter

from agentsnap.inspect import events_table, resolve_run
from agentsnap.ui.queries import micros

if TYPE_CHECKING:
    from agentsnap.ledger import Ledger
    from agentsnap.store import Store

__all__ = ["idle_gaps", "timeline_router"]

_MIN_GAP_US = 1_000_000
_GAP_SHARE = 0.1


def idle_gaps(times: list[int], min_gap_us: int) -> list[dict[str, int]]:
    """The stretches between consecutive ``times`` of at least ``min_gap_us``."""
    ordered = sorted(times)
    return [
        {"from_us": a, "to_us": b, "length_us": b - a}
        for a, b in itertools.pairwise(ordered)
        if b - a >= min_gap_us
    ]


def timeline_router(store: Store, *, ledger: Ledger | None = None) -> APIRouter:
    """The route of the timeline's incidents."""
    router = APIRouter()

    @router.get(
        "/api/runs/{run}/incidents",
        summary="Stops and resumes, owners and idle gaps, for the space-time view",
    )
    async def incidents(run: str) -> dict[str, Any]:
        found = await resolve_run(store, run)
        rows = await events_table(store, found.id, ledger=ledger)
        acts: list[tuple[int, int]] = []  # (start, end) of each timed execution
        again: list[int] = []  # when re-executions began
        seen: set[tuple[str, str, int]] = set()
        for row in rows:
            place = (row["agent"], row["message"], row["timeline"])
            if row["started_at"] is not None:
                start = micros(datetime.fromisoformat(row["started_at"]))
                acts.append((start, start + round((row["duration_ms"] or 0) * 1000)))
                if place in seen:
                    again.append(start)
            seen.add(place)
        ends = sorted({t for act in acts for t in act})
        resumes: list[dict[str, Any]] = []
        for start in sorted(again):
            # The re-executions after one stop are one resume: a new one needs a silence
            # since the last (a process stopped and another went on).
            since = resumes[-1]["at_us"] if resumes else None
            window = [t for t in ends if (since is None or t >= since) and t <= start]
            silences = [(a, b) for a, b in itertools.pairwise(window) if b - a >= _MIN_GAP_US]
            if since is not None and not silences:
                continue
            before = [t for t in ends if t < start]
            stopped = silences[-1][0] if silences else max(before, default=None)
            resumes.append({"at_us": start, "stopped_us": stopped, "owner": None})
        times = [t for act in acts for t in act]
        times += [micros(r.at) for r in await store.list_rollbacks(found.id)]
        for snapshot in await store.list_snapshot_summaries(found.id):
            times.append(micros(snapshot.started_at))
            if snapshot.completed_at is not None:
                times.append(micros(snapshot.completed_at))
        span = max(times) - min(times) if times else 0
        min_gap = max(_MIN_GAP_US, round(span * _GAP_SHARE))
        gaps = idle_gaps(times, min_gap)
        lease = await store.get_lease(found.id)
        changes = 0 if lease is None else lease.token - 1
        if changes > len(resumes):
            # A process that died before its journal reached the store left nothing to
            # re-execute that the journal shows: the lease says another owner went on, and
            # the longest silences not explained yet are where.
            unexplained = [
                g
                for g in gaps
                if not any(g["from_us"] <= r["at_us"] <= g["to_us"] + min_gap for r in resumes)
            ]
            unexplained.sort(key=lambda g: g["length_us"], reverse=True)
            resumes += [
                {"at_us": g["to_us"], "stopped_us": g["from_us"], "owner": None}
                for g in unexplained[: changes - len(resumes)]
            ]
            resumes.sort(key=lambda r: r["at_us"])
        if resumes and lease is not None and changes >= len(resumes):
            resumes[-1]["owner"] = lease.owner  # the last resume's process holds the lease
        return {
            "resumes": resumes,
            "owner_changes": changes,
            "owner": None if lease is None else lease.owner,
            "gaps": gaps,
            "min_gap_us": min_gap,
        }

    return router
