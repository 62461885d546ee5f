"""``list_runs``'s filters as SQL: the query that reads only the runs asked for.

A run's reported status is computed for runs recorded as running: ``interrupted`` unless a
live owner holds its lease. The database can tell an expired lease from one that has not
expired, but not whether the owner of an unexpired lease is a process of this host that is
gone (only this process can check that). So a filter on ``running`` without ``interrupted``
(or the reverse) reads the runs recorded as running with an unexpired lease as candidates,
and the caller keeps those whose reported status passes (``RunsQuery.refine``); the limit is
then applied as the caller goes, newest first, rather than in SQL.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import ColumnElement, Select, and_, exists, false, or_, select

from agentsnap.records import RunStatus
from agentsnap.store._run_filter import RunFilter
from agentsnap.store.tables import RunLeaseRow, RunRow, RunTagRow, table_of

__all__ = ["RunsQuery", "runs_query"]

_runs = table_of(RunRow)
_tags = table_of(RunTagRow)
_leases = table_of(RunLeaseRow)

_LIVE_OR_NOT = frozenset({RunStatus.RUNNING, RunStatus.INTERRUPTED})


@dataclass(frozen=True)
class RunsQuery:
    """The query for one ``list_runs`` call."""

    select: Select[tuple[object, ...]]
    """The runs' rows: oldest first, or newest first when the filter has a limit."""
    newest_first: bool
    """Whether ``select`` reads the newest first (the caller reverses what it keeps)."""
    refine: bool
    """Whether some rows may fail the status filter once their status is computed; then
    ``select`` has no SQL limit, and the caller stops once it has kept ``limit`` runs."""


def runs_query(
    base: Select[tuple[object, ...]], wanted: RunFilter, now: datetime, dialect: str
) -> RunsQuery:
    """The query reading the runs that pass ``wanted`` (as candidates when ``refine``).

    Args:
        base: The runs joined with their leases (``SqlStore``'s select of both).
        wanted: The filters.
        now: The present, which tells expired leases apart.
        dialect: The database's dialect name.
    """
    conditions: list[ColumnElement[bool]] = []
    refine = False
    if wanted.statuses is not None:
        condition, refine = _status(wanted.statuses, now)
        conditions.append(condition)
    if wanted.name is not None:
        conditions.append(_name(wanted.name, dialect))
    for key, value in wanted.tags.items():
        conditions.append(
            exists(
                select(_tags.c.run_id).where(
                    _tags.c.run_id == _runs.c.id, _tags.c.key == key, _tags.c.value == value
                )
            )
        )
    if wanted.since is not None:
        conditions.append(_runs.c.created_at >= wanted.since)
    query = base.where(*conditions)
    newest_first = wanted.limit is not None
    if newest_first:
        query = query.order_by(_runs.c.created_at.desc(), _runs.c.id.desc())
        if not refine:
            query = query.limit(wanted.limit)
    else:
        query = query.order_by(_runs.c.created_at, _runs.c.id)
    return RunsQuery(query, newest_first, refine)


def _status(statuses: frozenset[RunStatus], now: datetime) -> tuple[ColumnElement[bool], bool]:
    """The condition on the recorded status and the lease, and whether rows need refining."""
    stored = [s.value for s in statuses - _LIVE_OR_NOT]
    either: list[ColumnElement[bool]] = [_runs.c.status.in_(stored)] if stored else []
    running = _runs.c.status == RunStatus.RUNNING.value
    unexpired = and_(_leases.c.token.is_not(None), _leases.c.expires_at > now)
    live_or_not = statuses & _LIVE_OR_NOT
    if live_or_not == _LIVE_OR_NOT:
        either.append(_runs.c.status.in_([RunStatus.RUNNING.value, RunStatus.INTERRUPTED.value]))
        return or_(false(), *either), False
    if RunStatus.RUNNING in live_or_not:  # live owners only; refined: is the owner gone?
        either.append(and_(running, unexpired))
        return or_(false(), *either), True
    if RunStatus.INTERRUPTED in live_or_not:  # an unexpired lease is refined likewise
        either.append(_runs.c.status.in_([RunStatus.RUNNING.value, RunStatus.INTERRUPTED.value]))
        return or_(false(), *either), True
    return or_(false(), *either), False


_LIKE_ESCAPE = "\\"


def _name(name: str, dialect: str) -> ColumnElement[bool]:
    """``name`` exactly, or as a pattern where ``*`` stands for any characters.

    Case-sensitive on every database: SQLite's ``GLOB`` (its ``LIKE`` ignores case), with
    its other wildcards (``?``, ``[``) escaped; PostgreSQL's ``LIKE``, with ``%`` and ``_``
    escaped.
    """
    if "*" not in name:
        return _runs.c.name == name
    if dialect == "sqlite":
        pattern = "".join({"[": "[[]", "?": "[?]"}.get(char, char) for char in name)
        return _runs.c.name.op("GLOB")(pattern)
    pattern = (
        name.replace(_LIKE_ESCAPE, _LIKE_ESCAPE * 2)
        .replace("%", _LIKE_ESCAPE + "%")
        .replace("_", _LIKE_ESCAPE + "_")
        .replace("*", "%")
    )
    return _runs.c.name.like(pattern, escape=_LIKE_ESCAPE)
