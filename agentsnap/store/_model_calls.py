"""Model calls in SQL: a row per call, and each distinct message of a run once.

A handler's conversation grows by a message or two per model call, and each call's request
holds the whole conversation so far: stored whole, a run of ``n`` calls would keep ``n²/2``
messages. So a request is stored split (see ``ModelCallRow``): its ``messages`` become
``message_hashes``, the SHA-256 of each message's canonical JSON, in the same place of the
request, and each message's text goes into ``agentsnap_model_bodies`` once per run. Reading
a call puts the messages back, so the request read is equal to the one written.

The operations here take a connection and are run by
[`SqlLedger`][agentsnap.store.sql_ledger.SqlLedger], which decides where (the event loop's
SQLite connection, the ledger's thread, PostgreSQL's asyncio engine) and how often (its
retry policy).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, bindparam, select, update
from sqlalchemy.dialects import postgresql, sqlite

from agentsnap.exceptions import StoreError
from agentsnap.liveness import lost
from agentsnap.messages import JsonValue
from agentsnap.model_calls import ModelCallRecord
from agentsnap.state import content_hash, plain_canonical_json
from agentsnap.store.dialect import SqliteDialect
from agentsnap.store.tables import ModelBodyRow, ModelCallRow, RunLeaseRow, table_of

__all__ = [
    "COLUMNS",
    "IDENTITY",
    "SQLITE_ANSWER",
    "SQLITE_REPLAYED",
    "StoredCall",
    "answer_of",
    "find_answer",
    "find_call",
    "find_row",
    "list_calls",
    "record_postgres",
    "record_sqlite",
    "replayed",
    "same_call",
    "split",
    "sqlite_values",
]

calls = table_of(ModelCallRow)
bodies = table_of(ModelBodyRow)
_leases = table_of(RunLeaseRow)

IDENTITY = ("run_id", "agent", "message_id", "position", "timeline")
"""The columns of a call's identity, its primary key."""
COLUMNS = tuple(column.name for column in calls.columns)
"""The columns of a call's row, in the table's order."""
_BODY_COLUMNS = ("run_id", "hash", "body")
_MESSAGES = "messages"
_HASHES = "message_hashes"
_IN_CHUNK = 500
"""Hashes per ``IN`` list when bodies are read (well under every database's limit)."""


@dataclass(frozen=True, slots=True)
class StoredCall:
    """A record as it is written: the call's row, and the bodies of its messages."""

    row: dict[str, Any]
    """The ``agentsnap_model_calls`` row, its request holding hashes instead of messages."""
    bodies: dict[str, str]
    """Canonical JSON text of each distinct message, by its hash."""


def split(record: ModelCallRecord) -> StoredCall:
    """``record`` as it is stored: the messages of its request replaced by their hashes."""
    request: dict[str, JsonValue] = record.request
    messages = request.get(_MESSAGES)
    texts: dict[str, str] = {}
    if isinstance(messages, list) and _HASHES not in request:
        hashes: list[JsonValue] = []
        for message in messages:
            text = plain_canonical_json(message)
            digest = content_hash(text)
            texts.setdefault(digest, text)
            hashes.append(digest)
        # The hashes take the messages' place, so the request reads back in its own order.
        request = {
            (_HASHES if name == _MESSAGES else name): (hashes if name == _MESSAGES else value)
            for name, value in request.items()
        }
    row = {name: getattr(record, name) for name in COLUMNS}
    row["request"] = request
    return StoredCall(row, texts)


def _hashes(request: Mapping[Any, Any]) -> list[str]:
    found = request.get(_HASHES)
    if _MESSAGES in request or not isinstance(found, list):
        return []
    return [str(digest) for digest in found]


def _whole(request: dict[str, Any], texts: Mapping[str, str], where: str) -> dict[str, Any]:
    """A stored request with its messages back in their place."""
    if _MESSAGES in request or _HASHES not in request:
        return request
    digests = _hashes(request)
    try:
        messages = [json.loads(texts[digest]) for digest in digests]
    except KeyError as exc:
        raise StoreError(
            f"the ledger's model call {where} names message {exc.args[0]}, which is not "
            "stored: the database was edited by hand or restored in part"
        ) from None
    return {
        (_MESSAGES if name == _HASHES else name): (messages if name == _HASHES else value)
        for name, value in request.items()
    }


def _record(row: Mapping[Any, Any], texts: Mapping[str, str]) -> ModelCallRecord:
    values = dict(row)
    where = "/".join(str(values[name]) for name in IDENTITY)
    values["request"] = _whole(values["request"], texts, where)
    return ModelCallRecord(**values)


# -- reads -----------------------------------------------------------------------------------

_ORDER = (calls.c.started_at, calls.c.agent, calls.c.position, calls.c.message_id)
_find = select(calls).where(*(calls.c[name] == bindparam(name) for name in IDENTITY))


def _texts(conn: Connection, run_id: str, digests: Iterable[str]) -> dict[str, str]:
    wanted = sorted(set(digests))
    found: dict[str, str] = {}
    for start in range(0, len(wanted), _IN_CHUNK):
        rows = conn.execute(
            select(bodies.c.hash, bodies.c.body).where(
                bodies.c.run_id == run_id, bodies.c.hash.in_(wanted[start : start + _IN_CHUNK])
            )
        )
        found.update((row.hash, row.body) for row in rows)
    return found


def find_row(conn: Connection, identity: Mapping[Any, Any]) -> Mapping[Any, Any] | None:
    """The stored row of the call with ``identity`` (its request holding hashes), or ``None``."""
    found = conn.execute(_find, dict(identity)).one_or_none()
    return None if found is None else found._mapping


_find_answer = select(calls.c.response).where(
    *(calls.c[name] == bindparam(name) for name in IDENTITY)
)
_RESPONSE = calls.c.response.type


def find_answer(conn: Connection, identity: Mapping[Any, Any]) -> dict[str, JsonValue] | None:
    """The answer of the call with ``identity``, or ``None``."""
    found = conn.execute(_find_answer, dict(identity)).one_or_none()
    return None if found is None else dict(found.response)


def answer_of(stored: Any) -> dict[str, JsonValue]:
    """An answer as SQLite's driver returns its column (JSON text), decoded."""
    value = json.loads(stored) if isinstance(stored, (str, bytes)) else stored
    assert isinstance(value, dict), "an answer is a JSON object"
    return value


def find_call(conn: Connection, identity: Mapping[Any, Any]) -> ModelCallRecord | None:
    """The call with ``identity``, its request whole, or ``None``."""
    row = find_row(conn, identity)
    if row is None:
        return None
    return _record(row, _texts(conn, row["run_id"], _hashes(row["request"])))


def list_calls(conn: Connection, run_id: str, agent: str | None) -> list[ModelCallRecord]:
    """A run's calls (of ``agent``, when given) in the order they were made, requests whole."""
    query = select(calls).where(calls.c.run_id == run_id).order_by(*_ORDER)
    if agent is not None:
        query = query.where(calls.c.agent == agent)
    rows = [row._mapping for row in conn.execute(query)]
    texts = _texts(conn, run_id, (digest for row in rows for digest in _hashes(row["request"])))
    return [_record(row, texts) for row in rows]


def same_call(row: Mapping[Any, Any], record: ModelCallRecord) -> bool:
    """Whether the stored ``row`` is ``record`` (an earlier attempt wrote it)."""
    return bool(
        row["started_at"] == record.started_at
        and row["latency_ms"] == record.latency_ms
        and row["response"] == record.response
    )


# -- writes ----------------------------------------------------------------------------------


def _binder(column: Any, dialect: Any) -> Callable[[Any], Any]:
    """What ``dialect``'s driver is given for a value of ``column`` (its type's processing)."""
    process = column.type.dialect_impl(dialect).bind_processor(dialect)
    return process if process is not None else _same


def _same(value: Any) -> Any:
    return value


# -- writes on PostgreSQL ---------------------------------------------------------------------

replayed = (
    update(calls)
    .where(*(calls.c[name] == bindparam(f"w_{name}") for name in IDENTITY))
    .values(replays=calls.c.replays + 1)
)
"""Count one more replay of the call whose identity is bound as ``w_run_id``, ``w_agent``…"""


def _postgres_record(*, fenced: bool) -> str:
    """The one statement that records a call on PostgreSQL, in psycopg's ``%s`` style.

    One statement is one round trip, and in autocommit its own transaction: the call's row,
    then, only when that row is new, the bodies of its messages (a call already recorded has
    its own), both committed before the answer comes back. Fenced, the run's lease is read
    ``FOR SHARE`` first, so that no takeover commits before this write does, and the row is
    written only while the lease has the fence's token; the statement returns the lease it
    read, so that a refusal says who holds the run. Parameters: (fenced: the run) the
    columns of the call's row, (fenced: the token), the run, the hashes, the bodies (the
    arrays in binary, ``%b``: as text, every quote in the bodies would be escaped).
    """
    # Table and column names are the models' constants; values are bound.
    lease = (
        f"lease AS (SELECT owner, token FROM {_leases.name} WHERE run_id = %s FOR SHARE), "  # noqa: S608
        if fenced
        else ""
    )
    only_held = " WHERE EXISTS (SELECT 1 FROM lease WHERE token = %s)" if fenced else ""
    read_lease = ", (SELECT owner FROM lease), (SELECT token FROM lease)" if fenced else ""
    return (
        f"WITH {lease}"  # noqa: S608
        f"call AS (INSERT INTO {calls.name} ({', '.join(COLUMNS)}) "
        f"SELECT {', '.join(['%s'] * len(COLUMNS))}{only_held} "
        f"ON CONFLICT ({', '.join(IDENTITY)}) DO NOTHING RETURNING 1), "
        f"body AS (INSERT INTO {bodies.name} ({', '.join(_BODY_COLUMNS)}) "
        "SELECT %s, h, b FROM unnest(%b::text[], %b::text[]) AS t(h, b) "
        "WHERE EXISTS (SELECT 1 FROM call) "
        "ON CONFLICT (run_id, hash) DO NOTHING) "
        f"SELECT EXISTS (SELECT 1 FROM call){read_lease}"
    )


_POSTGRES = postgresql.psycopg.dialect()  # type: ignore[no-untyped-call]
_POSTGRES_RECORD = _postgres_record(fenced=False)
_POSTGRES_RECORD_FENCED = _postgres_record(fenced=True)
_POSTGRES_BIND = tuple(_binder(calls.c[name], _POSTGRES) for name in COLUMNS)


def record_postgres(conn: Connection, stored: StoredCall, fence: int | None) -> bool:
    """Write ``stored`` with one statement; whether the call's row was inserted.

    ``conn`` must be in autocommit mode: the statement is then its own transaction, committed
    when this returns. With ``fence``, the row is written only while the run's lease has that
    token (see ``_postgres_record``).

    Raises:
        OwnershipLost: The run's lease has another token than ``fence``; nothing was written.
    """
    row = stored.row
    run_id: str = row["run_id"]
    values = [bind(row[name]) for bind, name in zip(_POSTGRES_BIND, COLUMNS, strict=True)]
    texts = (run_id, list(stored.bodies), list(stored.bodies.values()))
    if fence is None:
        found = conn.exec_driver_sql(_POSTGRES_RECORD, (*values, *texts)).one()
        return bool(found[0])
    found = conn.exec_driver_sql(_POSTGRES_RECORD_FENCED, (run_id, *values, fence, *texts)).one()
    inserted, owner, token = found
    if token != fence:
        raise lost(run_id, fence, None if token is None else (str(owner), int(token)))
    return bool(inserted)


# -- writes on SQLite's own connections ------------------------------------------------------

_DIALECT = sqlite.dialect()


def _compiled(statement: Any, columns: Iterable[str]) -> str:
    """``statement`` as SQLite text, with a ``?`` for each of ``columns``, in that order."""
    names = list(columns)
    compiled = statement.compile(dialect=_DIALECT, column_keys=names)
    assert list(compiled.positiontup) == names, "parameters in the order of the columns"
    return str(compiled)


_BIND = tuple(_binder(calls.c[name], _DIALECT) for name in COLUMNS)
_SQLITE_CALL = _compiled(SqliteDialect().insert_or_ignore(calls, IDENTITY), COLUMNS)
_SQLITE_BODY = _compiled(
    SqliteDialect().insert_or_ignore(bodies, ("run_id", "hash")), _BODY_COLUMNS
)
_SQLITE_LEASE = f"SELECT owner, token FROM {_leases.name} WHERE run_id = ?"  # noqa: S608
SQLITE_ANSWER = (
    f"SELECT response FROM {calls.name} WHERE "  # noqa: S608  # the model's names
    + " AND ".join(f"{name} = ?" for name in IDENTITY)
)
"""The answer of the call whose identity is bound in ``IDENTITY``'s order."""
SQLITE_REPLAYED = (
    f"UPDATE {calls.name} SET replays = replays + 1 WHERE "  # noqa: S608  # the model's names
    + " AND ".join(f"{name} = ?" for name in IDENTITY)
)
"""Count one more replay of the call whose identity is bound in ``IDENTITY``'s order."""


def sqlite_values(stored: StoredCall) -> tuple[list[Any], list[tuple[str, str, str]]]:
    """The parameters of the call's insert, and of its bodies' inserts."""
    row = stored.row
    values = [bind(row[name]) for bind, name in zip(_BIND, COLUMNS, strict=True)]
    run_id = row["run_id"]
    return values, [(run_id, digest, text) for digest, text in stored.bodies.items()]


def record_sqlite(
    conn: sqlite3.Connection,
    run_id: str,
    values: list[Any],
    texts: list[tuple[str, str, str]],
    fence: int | None,
) -> bool:
    """Write a call inside the transaction the caller opened on ``conn``; whether inserted.

    The transaction holds SQLite's write lock (``BEGIN IMMEDIATE``), so the lease read here
    cannot change before the commit.

    Raises:
        OwnershipLost: The run's lease has another token than ``fence``.
    """
    if fence is not None:
        found = conn.execute(_SQLITE_LEASE, (run_id,)).fetchone()
        holder = None if found is None else (str(found[0]), int(found[1]))
        if holder is None or holder[1] != fence:
            raise lost(run_id, fence, holder)
    inserted = conn.execute(_SQLITE_CALL, values).rowcount == 1
    if inserted and texts:
        conn.executemany(_SQLITE_BODY, texts)
    return inserted
