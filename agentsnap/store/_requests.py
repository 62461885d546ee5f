"""Requests to people in SQL: the ``agentsnap_requests`` rows, read and written.

Each function runs with one connection in autocommit mode and is one statement, atomic on
its own: asking is an ``INSERT … ON CONFLICT DO NOTHING`` on the id, closing a request an
``UPDATE … WHERE status = 'pending'``, so of several answers racing exactly one changes the
row. Used by [`SqlLedger`][agentsnap.store.sql_ledger.SqlLedger].
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, select, update

from agentsnap.requests import WITHDRAWN, HumanRequest
from agentsnap.store.dialect import PostgresDialect, SqliteDialect
from agentsnap.store.tables import HumanRequestRow, table_of

__all__ = ["add", "find", "list_requests", "settle", "withdraw"]

requests = table_of(HumanRequestRow)

_RENAMED = {"schema": "answer_schema", "default": "default_answer"}
"""The request's fields whose columns have other names (``schema`` and ``default`` are
words of SQL)."""
_FIELDS = {column: field for field, column in _RENAMED.items()}
_PENDING = "pending"


def row_of(request: HumanRequest) -> dict[str, Any]:
    """The row of ``request``."""
    return {
        _RENAMED.get(field, field): getattr(request, field)
        for field in HumanRequest.__dataclass_fields__
    }


def request_of(row: Mapping[Any, Any]) -> HumanRequest:
    """The request a row holds."""
    return HumanRequest(**{_FIELDS.get(name, name): value for name, value in row.items()})


def add(conn: Connection, request: HumanRequest) -> HumanRequest:
    """Insert ``request`` unless its id is taken; the stored request either way."""
    dialect = SqliteDialect() if conn.dialect.name == "sqlite" else PostgresDialect()
    conn.execute(dialect.insert_or_ignore(requests, ("id",)), row_of(request))
    found = find(conn, request.id)
    assert found is not None, "a request just inserted is found"
    return found


def find(conn: Connection, request_id: str) -> HumanRequest | None:
    """The request with ``request_id``, or ``None``."""
    row = conn.execute(select(requests).where(requests.c.id == request_id)).one_or_none()
    return None if row is None else request_of(row._mapping)


def settle(conn: Connection, request_id: str, closed: Mapping[str, Any]) -> bool:
    """Close the request if it is pending, setting the fields of ``closed``; whether it was.

    ``closed`` maps the fields a close sets (``status``, ``answer``, ``reason``,
    ``answered_by`` and ``answered_at``) to their values.
    """
    changed = conn.execute(
        update(requests)
        .where(requests.c.id == request_id, requests.c.status == _PENDING)
        .values(**{_RENAMED.get(field, field): value for field, value in closed.items()})
    )
    return changed.rowcount == 1


def withdraw(conn: Connection, run_id: str, before: int, by: str, at: datetime) -> list[str]:
    """Withdraw the run's pending requests of timelines before ``before``; their ids."""
    where = (
        requests.c.run_id == run_id,
        requests.c.status == _PENDING,
        requests.c.timeline < before,
    )
    ids = [row.id for row in conn.execute(select(requests.c.id).where(*where))]
    if ids:
        conn.execute(
            update(requests)
            .where(*where, requests.c.id.in_(ids))
            .values(status="withdrawn", reason=WITHDRAWN, answered_by=by, answered_at=at)
        )
    return ids


def list_requests(conn: Connection, run_id: str | None, pending: bool) -> list[HumanRequest]:
    """The requests of ``run_id`` (of every run with ``None``), oldest first."""
    query = select(requests).order_by(requests.c.asked_at, requests.c.position, requests.c.id)
    if run_id is not None:
        query = query.where(requests.c.run_id == run_id)
    if pending:
        query = query.where(requests.c.status == _PENDING)
    return [request_of(row._mapping) for row in conn.execute(query)]
