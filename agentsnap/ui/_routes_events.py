"""The inspector's event history: a run's handler executions as a table, with their cuts.

``GET /api/runs/{run}/executions`` answers the rows of
[`events_table`][agentsnap.inspect.events_table] (what ``agentsnap events RUN --json``
prints), each with what the page needs to place it:

* ``started_at_us``: when the agent took the message, in microseconds (``None`` for a run
  read from its replay log, which keeps no times);
* ``src``, ``dst`` and ``seq`` of the message taken, which the space-time view finds it by;
* ``cut_before`` and ``cut_after``: the last complete snapshot that does not hold the
  execution and the first, of the same timeline, that does (an agent's cut holds the
  execution when its count of messages received from the sender reaches the message's
  number), ``None`` when there is none;
* ``status``: ``discarded`` when a rollback undid it (the cut it restored does not hold it),
  ``unknown`` when one of its tool calls has an unknown outcome (as the tools view reports
  it: a claim whose owner stopped is unknown), ``failed`` when one failed,
  ``ok`` otherwise; ``reexecuted``: the run's history already had this execution on this
  timeline (a resume after a stop re-executes what the stop interrupted).

Filters: ``agent``, ``kind``, ``status`` and ``q``, text anywhere in the row (payloads, the
messages sent, tool calls) or in the agent's state at the cut after it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import APIRouter, HTTPException, Query

from agentsnap.inspect import events_table, ledger_calls, resolve_run
from agentsnap.records import SnapshotStatus
from agentsnap.ui._wire import Offset
from agentsnap.ui.queries import micros

if TYPE_CHECKING:
    from agentsnap.ledger import Ledger
    from agentsnap.records import RollbackInfo, Snapshot
    from agentsnap.store import Store

__all__ = ["STATUSES", "events_router"]

STATUSES = ("ok", "discarded", "failed", "unknown")
"""What an execution's ``status`` can be."""

_SNAPSHOT_PAGE = 50
_FAILED = {"failed", "compensation_failed"}
_UNKNOWN = {"unknown"}


@dataclass(frozen=True)
class _Cut:
    """What the table needs of one complete snapshot."""

    id: str
    seq: int
    started_us: int
    timeline: int
    received: dict[str, dict[str, int]]
    states: dict[str, str]


def _split(message: str) -> tuple[str, str, int]:
    """``src>dst#seq`` as its three parts."""
    channel, _, seq = message.rpartition("#")
    src, _, dst = channel.partition(">")
    return src, dst, int(seq)


def _holds(cut: _Cut, agent: str, src: str, seq: int) -> bool:
    return cut.received.get(agent, {}).get(src, 0) >= seq


async def _cuts(store: Store, run_id: str, rollbacks: list[RollbackInfo]) -> list[_Cut]:
    """The run's complete snapshots in order, each with its timeline."""
    rolled = sorted(micros(r.at) for r in rollbacks)
    found: list[_Cut] = []
    after = 0
    while True:
        page: list[Snapshot] = await store.list_snapshots_page(
            run_id, after_seq=after, limit=_SNAPSHOT_PAGE
        )
        for snapshot in page:
            if snapshot.status is not SnapshotStatus.COMPLETE:
                continue
            started = micros(snapshot.started_at)
            found.append(
                _Cut(
                    id=snapshot.id,
                    seq=snapshot.seq,
                    started_us=started,
                    timeline=sum(1 for at in rolled if at < started),
                    received={name: dict(cut.received) for name, cut in snapshot.agents.items()},
                    states={name: cut.state_json for name, cut in snapshot.agents.items()},
                )
            )
        if len(page) < _SNAPSHOT_PAGE:
            return found
        after = page[-1].seq


def _place(
    row: dict[str, Any], cuts: list[_Cut], by_id: dict[str, _Cut], rollbacks: list[RollbackInfo]
) -> None:
    """Add the execution's message parts, times, cuts and status to ``row``."""
    src, dst, seq = _split(row["message"])
    agent = row["agent"]
    timeline = row["timeline"]
    started = row["started_at"]
    started_us = None if started is None else micros(datetime.fromisoformat(started))
    after: _Cut | None = None
    for cut in cuts:
        if cut.timeline != timeline or (started_us is not None and cut.started_us < started_us):
            continue
        if _holds(cut, agent, src, seq):
            after = cut
            break
    before: _Cut | None = None
    for cut in cuts:
        if after is not None and cut.seq >= after.seq:
            break
        if started_us is not None and cut.started_us > started_us:
            break
        if not _holds(cut, agent, src, seq) or cut.timeline < timeline:
            before = cut
    statuses = {call["status"] for call in row["tool_calls"]}
    status = "ok"
    if statuses & _FAILED:
        status = "failed"
    if statuses & _UNKNOWN:
        status = "unknown"
    ordered = sorted(rollbacks, key=lambda r: r.at)
    if timeline < len(ordered):
        restored = by_id.get(ordered[timeline].snapshot_id)
        if restored is None or not _holds(restored, agent, src, seq):
            status = "discarded"
    row.update(
        src=src,
        dst=dst,
        seq=seq,
        started_at_us=started_us,
        cut_before=None if before is None else before.id,
        cut_after=None if after is None else after.id,
        status=status,
    )


def events_router(store: Store, *, ledger: Ledger | None = None) -> APIRouter:
    """The routes of the event history over ``store`` (``ledger``: where tool calls are)."""
    router = APIRouter()

    @router.get(
        "/api/runs/{run}/executions",
        summary="The run's handler executions, filtered, with the cuts around each",
    )
    async def executions(
        run: str,
        *,
        agent: Annotated[str | None, Query(description="Only this agent's executions.")] = None,
        kind: Annotated[str | None, Query(description="Only messages of this kind.")] = None,
        status: Annotated[
            str | None, Query(description="Only executions in this status: " + ", ".join(STATUSES))
        ] = None,
        q: Annotated[
            str | None, Query(description="Text in the row or in the agent's state after it.")
        ] = None,
        limit: Annotated[int, Query(ge=1, le=10_000)] = 500,
        offset: Offset = 0,
    ) -> dict[str, Any]:
        if status and status not in STATUSES:
            raise HTTPException(422, f"unknown status {status!r}: use one of {', '.join(STATUSES)}")
        found = await resolve_run(store, run)
        rows = [
            row.model_dump(mode="json")
            for row in await events_table(store, found.id, ledger=ledger)
        ]
        # A claim whose owner stopped is reported unknown, as the tools view reports it.
        reported = {e.key: e.status.value for e in await ledger_calls(store, found.id, ledger)}
        for row in rows:
            for call in row["tool_calls"]:
                call["status"] = reported.get(call["key"], call["status"])
        agents = sorted({row["agent"] for row in rows})
        kinds = sorted({str(row["kind"]) for row in rows if row["kind"] is not None})
        rollbacks = await store.list_rollbacks(found.id)
        cuts = await _cuts(store, found.id, rollbacks)
        by_id = {cut.id: cut for cut in cuts}
        seen: set[tuple[str, str, int]] = set()
        for row in rows:
            _place(row, cuts, by_id, rollbacks)
            again = (row["agent"], row["message"], row["timeline"])
            row["reexecuted"] = again in seen
            seen.add(again)
        rows = [
            row
            for row in rows
            if (not agent or row["agent"] == agent)
            and (not kind or row["kind"] == kind)
            and (not status or row["status"] == status)
        ]
        if q:
            needle = q.lower()

            def holds_text(row: dict[str, Any]) -> bool:
                text = json.dumps(row, ensure_ascii=False, default=str).lower()
                if needle in text:
                    return True
                after = by_id.get(row["cut_after"] or "")
                state = None if after is None else after.states.get(row["agent"])
                return state is not None and needle in state.lower()

            rows = [row for row in rows if holds_text(row)]
        return {
            "executions": rows[offset : offset + limit],
            "total": len(rows),
            "agents": agents,
            "kinds": kinds,
            "statuses": list(STATUSES),
        }

    return router
