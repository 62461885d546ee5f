"""What the space-time view marks beyond messages and cuts: stops, resumes, owners, idle gaps.

``GET /api/runs/{run}/incidents`` answers, from what the store keeps:

* ``resumes``: each time an owner took the run's lease after another (a ``resume()``, a
  takeover by ``agentsnap resume``, a coordinator's takeover), from the run's history of
  owners ([`list_run_owners`][agentsnap.store.RunQueries.list_run_owners]): ``at_us`` is
  when the new ``owner`` (``host:pid:token``) took the lease, ``token`` its fencing token,
  ``stopped_us`` where the previous owner stopped (its release, for a clean stop; else the
  last act recorded before the takeover, or failing one its last lease renewal), and
  ``crashed`` whether the previous owner stopped without giving the run back (``None`` when
  the history does not tell: an owner from before the store kept it);
* ``crashes``: every owner that stopped without giving the run back (its lease was taken
  over, or expired and nobody took the run over yet): its ``owner``, ``token``, where it
  stopped (``stopped_us``) and who took over (``taken_over_us``, ``by``; ``None`` if nobody
  did);
* ``owners``: the history itself, each with ``acquired_us``, ``ended_us`` and ``ended``
  (``released``, ``taken_over`` or ``None``);
* ``owner``: who holds the run's lease, and ``owner_changes``: how many times the lease
  passed to another owner (its fencing token counts the owners);
* ``history``: whether the run has a history of owners. A run whose owners all came
  before the store kept it has none; its resumes are then found as before: a resumed run
  re-executes, on the same timeline, the handlers the stop interrupted (the replay log
  makes it so), so the first re-executed handler marks a resume and the last act recorded
  before it the stop, and when the lease counts more owner changes than that shows, the
  longest idle gaps not yet explained; only the last resume's owner is known (it holds the
  lease);
* ``gaps``: the stretches of at least ``min_gap_us`` (a second, or a tenth of the run's
  span when that is longer) with nothing recorded, which the view folds, showing their
  length.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter

from agentsnap.inspect import events_table, resolve_run
from agentsnap.liveness import owner_is_live
from agentsnap.records import utcnow
from agentsnap.ui.queries import micros

if TYPE_CHECKING:
    from datetime import datetime

    from agentsnap.ledger import Ledger
    from agentsnap.records import RunLease, RunOwner
    from agentsnap.store import Store

__all__ = ["idle_gaps", "owner_incidents", "timeline_router"]

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


def owner_incidents(
    owners: list[RunOwner], ends: list[int], lease: RunLease | None, now: datetime
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The resumes and the crashes a run's history of owners shows.

    Args:
        owners: The run's owners, by token.
        ends: The starts and ends of every act recorded (microseconds), sorted.
        lease: The run's lease as it stands.
        now: The present: an owner that never ended crashed if its lease is not live now.
    """
    resumes: list[dict[str, Any]] = []
    crashes: list[dict[str, Any]] = []

    def last_act(since: datetime | None, until: datetime | None) -> int | None:
        low = None if since is None else micros(since)
        high = None if until is None else micros(until)
        inside = [t for t in ends if (low is None or t >= low) and (high is None or t <= high)]
        return max(inside, default=None)

    for before, after in itertools.pairwise([None, *owners]):
        assert after is not None
        if before is None and after.token == 1:
            continue  # the run's first owner started it
        at = micros(after.acquired_at)
        if before is None or before.token != after.token - 1:
            # The owner before is from before the history was kept: how it ended is unknown.
            stopped = last_act(None, after.acquired_at)
            resumes.append(_resume(after, at, stopped, None))
            continue
        crashed = before.ended != "released"
        if crashed:
            stopped = last_act(before.acquired_at, after.acquired_at)
            if stopped is None and before.last_renewed_at is not None:
                stopped = micros(before.last_renewed_at)
            crashes.append(_crash(before, stopped, after, at))
        else:
            stopped = micros(before.ended_at) if before.ended_at is not None else None
        resumes.append(_resume(after, at, stopped, crashed))
    last = owners[-1] if owners else None
    if (
        last is not None
        and last.ended is None
        and not owner_is_live(
            lease if lease is not None and lease.token == last.token else None, now
        )
    ):
        stopped = last_act(last.acquired_at, None)
        crashes.append(_crash(last, micros(last.acquired_at) if stopped is None else stopped))
    return resumes, crashes


def _resume(owner: RunOwner, at: int, stopped: int | None, crashed: bool | None) -> dict[str, Any]:
    return {
        "at_us": at,
        "stopped_us": stopped,
        "owner": owner.owner,
        "token": owner.token,
        "crashed": crashed,
    }


def _crash(
    owner: RunOwner, stopped: int | None, by: RunOwner | None = None, at: int | None = None
) -> dict[str, Any]:
    return {
        "owner": owner.owner,
        "token": owner.token,
        "stopped_us": stopped,
        "taken_over_us": at,
        "by": None if by is None else by.owner,
    }


def _replays_as_resumes(
    again: list[int], ends: list[int], gaps: list[dict[str, int]], changes: int, min_gap: int
) -> list[dict[str, Any]]:
    """Resumes found without a history of owners: from re-executed handlers, then silences."""
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
        resumes.append(_guessed(start, stopped))
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
            _guessed(g["to_us"], g["from_us"]) for g in unexplained[: changes - len(resumes)]
        ]
        resumes.sort(key=lambda r: r["at_us"])
    return resumes


def _guessed(at: int, stopped: int | None) -> dict[str, Any]:
    return {"at_us": at, "stopped_us": stopped, "owner": None, "token": None, "crashed": None}


def timeline_router(store: Store, *, ledger: Ledger | None = None) -> APIRouter:
    """The route of the timeline's incidents."""
    router = APIRouter()

    @router.get(
        "/api/runs/{run}/incidents",
        summary="Stops and resumes, owners and crashes, and idle gaps, for the space-time view",
    )
    async def incidents(run: str) -> dict[str, Any]:
        found = await resolve_run(store, run)
        rows = await events_table(store, found.id, ledger=ledger)
        acts: list[tuple[int, int]] = []  # (start, end) of each timed execution
        again: list[int] = []  # when re-executions began
        seen: set[tuple[str, str, int]] = set()
        for row in rows:
            place = (row.agent, row.message, row.timeline)
            if row.started_at is not None:
                start = micros(row.started_at)
                acts.append((start, start + round((row.duration_ms or 0) * 1000)))
                if place in seen:
                    again.append(start)
            seen.add(place)
        ends = sorted({t for act in acts for t in act})
        times = [t for act in acts for t in act]
        times += [micros(r.at) for r in await store.list_rollbacks(found.id)]
        for snapshot in await store.list_snapshot_summaries(found.id):
            times.append(micros(snapshot.started_at))
            if snapshot.completed_at is not None:
                times.append(micros(snapshot.completed_at))
        owners = await store.list_run_owners(found.id)
        lease = await store.get_lease(found.id)
        changes = 0 if lease is None else lease.token - 1
        crashes: list[dict[str, Any]] = []
        if owners:
            resumes, crashes = owner_incidents(owners, ends, lease, utcnow())
            times += [micros(o.acquired_at) for o in owners]
            times += [micros(o.ended_at) for o in owners if o.ended_at is not None]
        span = max(times) - min(times) if times else 0
        min_gap = max(_MIN_GAP_US, round(span * _GAP_SHARE))
        gaps = idle_gaps(times, min_gap)
        if not owners:
            resumes = _replays_as_resumes(again, ends, gaps, changes, min_gap)
            if resumes and lease is not None and changes >= len(resumes):
                resumes[-1]["owner"] = lease.owner  # the last resume's process holds the lease
        return {
            "resumes": resumes,
            "crashes": crashes,
            "owners": [
                {
                    "token": o.token,
                    "owner": o.owner,
                    "acquired_us": micros(o.acquired_at),
                    "ended_us": None if o.ended_at is None else micros(o.ended_at),
                    "ended": o.ended,
                }
                for o in owners
            ],
            "history": bool(owners),
            "owner_changes": changes,
            "owner": None if lease is None else lease.owner,
            "gaps": gaps,
            "min_gap_us": min_gap,
        }

    return router
