"""SqlLedger: tool calls, model calls and requests to people, beside the runs.

Example:
    ```python
    import asyncio
    import tempfile

    from agentsnap import tool
    from agentsnap.store.sql_ledger import SqlLedger

    @tool(side_effect=True)
    async def send_invoice(order: str) -> str:
        return f"invoice for {order}"

    async def main(url: str) -> None:
        ledger = SqlLedger(url)
        try:
            first = await send_invoice.invoke(ledger, key="invoice-17", order="17")
            again = await send_invoice.invoke(ledger, key="invoice-17", order="17")
            assert first == again  # the second call returned the recorded result
            for entry in await ledger.list_calls():
                print(entry.key, entry.status, entry.attempts, entry.result)
        finally:
            await ledger.close()

    with tempfile.TemporaryDirectory() as folder:
        asyncio.run(main(f"sqlite:///{folder}/agentsnap.db"))
    ```

Every operation is one SQL statement in autocommit mode, atomic on its own: a claim is an
``INSERT … ON CONFLICT DO NOTHING`` on the primary key (then a ``SELECT`` only when the key
was taken), an outcome is an ``UPDATE … WHERE status IN … AND owner = … AND attempts = …``
that changes the row only if it is still as the caller last saw it. No transaction spans two
statements, so no lock is held while a tool runs.

**PostgreSQL** (SQLAlchemy's asyncio engine, psycopg): concurrent claims of one key wait for
each other on the key's index entry and exactly one inserts; a conditional update that lost
a race changes no row, because PostgreSQL re-checks the ``WHERE`` on the newest row version.
No ``SELECT … FOR UPDATE`` is needed, since no decision is taken between two statements
without being re-checked by the second.

**Fencing.** Once [`fence(run_id, token)`][agentsnap.store.sql_ledger.SqlLedger.fence] was
called, a claim or an update of an entry of that run also requires, in the same statement,
that the run's lease (``agentsnap_run_leases``, in the same database) still has ``token``:
``INSERT … SELECT … WHERE EXISTS (…)`` and ``UPDATE … AND (run_id IS NOT … OR EXISTS
(…))``. When it has not, nothing is written and
[`OwnershipLost`][agentsnap.OwnershipLost] is raised. On PostgreSQL the lease's row is read
``FOR SHARE``, so a takeover waits for the statement to commit.

**SQLite**: a claim and an outcome are one-row writes of about 50 µs; handing each to a
thread (as the asyncio driver does for every cursor call) would cost more than the write.
So the ledger runs them on the event loop's thread on a connection that never waits: its busy
timeout is 0, and a write that finds the database locked (a snapshot being written, another
process) is handed to the ledger's own thread, whose connection waits in SQLite's busy handler.
That connection also serves the reads and runs the WAL checkpoints, which the event-loop
connection never does. As for the store, ``synchronous=NORMAL``: a committed claim survives
the process being killed, but not a power cut; pass ``durable=True`` to have each write
flushed to disk (``synchronous=FULL``) if that matters more than a millisecond per call.

**Model calls** (the [`ModelCallLog`][agentsnap.model_calls.ModelCallLog] protocol) are kept
the same way, with one difference: recording one is a transaction of two statements, the
call's row (``INSERT … ON CONFLICT DO NOTHING`` on its identity) and, when it was new, the
messages of its request that the run has not stored yet (``agentsnap_model_bodies``, each
message once per run by its hash; see ``ModelCallRow``). On SQLite it runs on the event
loop's connection in ``BEGIN IMMEDIATE``, handed to the ledger's thread when the database is
locked, as a claim is; a fenced run's lease is read inside it (``FOR SHARE`` on PostgreSQL).

**Requests to people** (the [`RequestLog`][agentsnap.requests.RequestLog] protocol) are rows
of ``agentsnap_requests``, each operation one statement (see ``HumanRequestRow``); they are
rare and a person is slow, so they take the ordinary path: the ledger's thread on SQLite.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import sqlite3
from collections.abc import Awaitable, Callable, Collection, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar, Unpack

from sqlalchemy import (
    Connection,
    Engine,
    bindparam,
    create_engine,
    event,
    exists,
    literal,
    or_,
    select,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from agentsnap.exceptions import ConfigurationError, StoreError
from agentsnap.ledger import Change, Expected, LedgerEntry, ToolCallStatus
from agentsnap.liveness import lost
from agentsnap.model_calls import ModelCallRecord
from agentsnap.requests import HumanRequest, RequestStatus, Settlement, settled_fields
from agentsnap.store import _model_calls as model_rows
from agentsnap.store import _requests as request_rows
from agentsnap.store._sql_base import DEFAULT_URL, database_name, engine_options
from agentsnap.store.dialect import (
    async_url,
    connect_sqlite,
    sqlite_file,
    sqlite_setup,
    sync_url,
)
from agentsnap.store.faults import StoreRetry
from agentsnap.store.migrate import SchemaGate
from agentsnap.store.tables import RunLeaseRow, ToolCallRow, table_of

if TYPE_CHECKING:
    from sqlalchemy.sql.dml import Update

    from agentsnap.messages import JsonValue

__all__ = ["SqlLedger"]

logger = logging.getLogger("agentsnap")

P = ParamSpec("P")
T = TypeVar("T")

_calls = table_of(ToolCallRow)
_leases = table_of(RunLeaseRow)
_COLUMNS = tuple(column.name for column in _calls.columns)
_get = select(_calls).where(_calls.c.key == bindparam("k"))
_lease_of_key = (
    select(_calls.c.run_id, _leases.c.owner, _leases.c.token)
    .outerjoin(_leases, _leases.c.run_id == _calls.c.run_id)
    .where(_calls.c.key == bindparam("k"))
)
_lease_of_run = select(_leases.c.owner, _leases.c.token).where(_leases.c.run_id == bindparam("r"))
_INSERTED: Any = object()
CHECKPOINT_EVERY = 500
"""Writes on the event-loop connection between two WAL checkpoints (in the ledger's thread)."""


class SqlLedger:
    """A [`Ledger`][agentsnap.ledger.Ledger] and a
    [`ModelCallLog`][agentsnap.model_calls.ModelCallLog] in SQLite or PostgreSQL.

    Args:
        url: Database URL, as for [`SqlStore`][agentsnap.store.sql.SqlStore]; the ledger may
            share the database of the runs (the runtime's default) or have its own.
        create: Create the schema in an empty database on first use.
        durable: SQLite only: flush every ledger write to disk, so that claims also survive
            a power cut (``synchronous=FULL``; costs an fsync per write).
        echo: Log every SQL statement (the SQLite fast path is not logged).
        retry: How operations that fail for a passing reason (a lost connection, a lock, a
            full disk) are retried (see [`agentsnap.store.faults`][agentsnap.store.faults]).
            A claim whose commit reached the database but whose answer was lost is
            recognised on the retry as this caller's own (same owner, attempt and time),
            and an outcome already recorded is not recorded again.
        engine: PostgreSQL only: an asyncio engine on ``url`` in autocommit to use instead
            of opening one (the ledger leaves it open when it closes); see
            [`SqlStore.ledger`][agentsnap.store.sql.SqlStore.ledger], which hands its own out.
        schema: The check that the database is ready, when the caller makes it already (a
            store on the same database): the ledger then does not check it again.

    Attributes:
        retry: The retry policy.

    Raises:
        ConfigurationError: The URL is not SQLite or PostgreSQL, or is an in-memory SQLite
            database (each connection would see its own).
    """  # noqa: D205

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        create: bool = True,
        durable: bool = False,
        echo: bool = False,
        retry: StoreRetry | None = None,
        engine: AsyncEngine | None = None,
        schema: SchemaGate | None = None,
    ) -> None:
        self.url = url
        self.retry = retry or StoreRetry()
        self._where = database_name(url)
        parsed = make_url(sync_url(url))
        self._engine: AsyncEngine | None = None
        self._sqlite: _Sqlite | None = None
        self._owns_engine = engine is None
        if engine is not None and parsed.get_backend_name() != "postgresql":
            raise ConfigurationError(
                f"a ledger shares only a PostgreSQL engine, not one on {self._where}: "
                "pass no engine, and the ledger opens its own connections"
            )
        if engine is not None:
            self._engine = engine
        elif parsed.get_backend_name() == "sqlite":
            path = sqlite_file(url)
            if path is None:
                raise ConfigurationError(
                    "the ledger needs an SQLite file (sqlite:///path.db): an in-memory database "
                    "is private to one connection"
                )
            self._sqlite = _Sqlite(
                url, path, durable=durable, echo=echo, timeout=self.retry.timeout
            )
        else:
            # Every statement commits on its own, so a connection going back to the pool has
            # no transaction to roll back: skip the reset, a round trip per operation.
            self._engine = create_async_engine(
                async_url(url),
                echo=echo,
                isolation_level="AUTOCOMMIT",
                pool_reset_on_return=None,
                **engine_options(url, self.retry),
            )
        # Without preserve_rowcount psycopg leaves an INSERT's rowcount unset.
        self._claim = (
            postgresql.insert(_calls)
            .on_conflict_do_nothing(index_elements=["key"])
            .execution_options(preserve_rowcount=True)
        )
        self._updates: dict[tuple[tuple[str, ...], bool, bool, int], Update] = {}
        self._fenced_claim: Any = None
        # Runs whose entries may change only while their lease has this token.
        self._fences: dict[str, int] = {}
        then = self._sqlite.open if self._sqlite is not None else None
        self._gate: SchemaGate | _After = (
            SchemaGate(url, create=create, then=then) if schema is None else _After(schema, then)
        )

    def __repr__(self) -> str:
        return f"SqlLedger({make_url(self.url).render_as_string(hide_password=True)!r})"

    async def _run(
        self, what: str, op: Callable[Concatenate[Connection, P], T], *args: P.args, **kw: P.kwargs
    ) -> T:
        """Run ``op`` with a connection: in SQLite's thread, or through the asyncio engine."""
        await self._gate.wait()
        try:
            if self._sqlite is not None:
                return await self._sqlite.run(op, *args, **kw)
            assert self._engine is not None
            async with self._engine.connect() as conn:
                return await conn.run_sync(op, *args, **kw)
        except SQLAlchemyError as exc:
            raise StoreError(f"the ledger could not {what}: {exc}") from exc

    def fence(self, run_id: str, token: int) -> None:
        """From now on, claim and change entries of ``run_id`` only while its lease has
        ``token``; otherwise raise [`OwnershipLost`][agentsnap.OwnershipLost].

        The lease is read in the ledger's database: fence only a ledger that shares the
        database of the runs (the runtime's default ledger does).
        """  # noqa: D205
        self._fences[run_id] = token

    async def claim(self, entry: LedgerEntry) -> LedgerEntry | None:
        """Insert ``entry`` if no entry has its key (see [`Ledger`][agentsnap.ledger.Ledger]).

        Raises:
            OwnershipLost: The entry's run is fenced and its lease has another token now;
                nothing was written.
        """
        if self._sqlite is not None:  # the first attempt here: a claim per tool call
            try:
                return await self._claim_once(False, entry)
            except Exception as exc:
                return await self.retry.after(
                    exc, "claim key {0.key!r}", self._claim_once, entry, where=self._where
                )
        return await self.retry.call(
            "claim key {0.key!r}", self._claim_once, entry, where=self._where, bounded=True
        )

    async def _claim_once(self, again: bool, entry: LedgerEntry) -> LedgerEntry | None:
        what = f"claim key {entry.key!r}"
        token = None if entry.run_id is None else self._fences.get(entry.run_id)
        if self._sqlite is not None:
            await self._gate.wait()
            values = [_BIND[name](getattr(entry, name)) for name in _COLUMNS]
            sql = _SQLITE_CLAIM
            if token is not None:
                values.extend((entry.run_id, token))
                sql = _SQLITE_CLAIM_FENCED
            if await self._sqlite.write(what, sql, values):
                return None
            found, holder = await self._run(what, _one_and_lease, entry.key, entry.run_id)
        else:
            row = {name: getattr(entry, name) for name in _COLUMNS}
            statement = self._claim
            if token is not None:
                row.update(f_run=entry.run_id, f_token=token)
                statement = self._claim_fenced()
            found, holder = await self._run(what, _claim, statement, row)
            if found is _INSERTED:
                return None
        if token is not None and (holder is None or holder[1] != token):
            assert entry.run_id is not None
            raise lost(entry.run_id, token, holder)
        if found is None:  # nothing deletes rows; only a hand-edited ledger gets here
            raise StoreError(f"key {entry.key!r} is taken in the ledger, yet has no row")
        stored = _entry(found)
        if again and _same_claim(stored, entry):
            return None  # the attempt before inserted it, though its answer was lost
        return stored

    def _claim_fenced(self) -> Any:
        if self._fenced_claim is None:
            values = select(*(_typed_bind(column) for column in _calls.columns)).where(
                _holds_lease(share=True)
            )
            self._fenced_claim = (
                postgresql.insert(_calls)
                .from_select(list(_COLUMNS), values)
                .on_conflict_do_nothing(index_elements=["key"])
                .execution_options(preserve_rowcount=True)
            )
        return self._fenced_claim

    async def get(self, key: str) -> LedgerEntry | None:  # noqa: D102
        found = await self._retried("read key {0!r}", self._read, _one, key)
        return None if found is None else _entry(found)

    async def update(  # noqa: D102
        self, key: str, change: Change, **expected: Unpack[Expected]
    ) -> bool:
        what = "update key {0!r}"
        owner, attempts = expected.get("owner"), expected.get("attempts")
        args = (key, change, expected["statuses"], owner, attempts)
        if self._sqlite is not None:  # the first attempt here: an outcome per tool call
            try:
                return await self._update_once(False, *args)
            except Exception as exc:
                return await self.retry.after(
                    exc, what, self._update_once, *args, where=self._where
                )
        return await self.retry.call(
            what, self._update_once, *args, where=self._where, bounded=True
        )

    async def _update_once(  # noqa: PLR0917
        self,
        again: bool,
        key: str,
        change: Change,
        statuses: Collection[ToolCallStatus],
        owner: str | None,
        attempts: int | None,
    ) -> bool:
        what = f"update key {key!r}"
        if again:
            found = await self._run(what, _one, key)
            if found is not None and _has(_entry(found), change):
                return True  # the attempt before made the change, though its answer was lost
        fences = self._fences
        if self._sqlite is not None:
            await self._gate.wait()
            sql = _sqlite_update(
                tuple(change), len(statuses), owner is not None, attempts, len(fences)
            )
            values = [_BIND[name](value) for name, value in change.items()]
            values.append(key)
            values.extend(str(status) for status in statuses)
            if owner is not None:
                values.append(owner)
            if attempts is not None:
                values.append(attempts)
            for run_id, token in fences.items():
                values.extend((run_id, run_id, token))
            changed = await self._sqlite.write(what, sql, values)
        else:
            statement = self._update(
                tuple(sorted(change)), owner is not None, attempts is not None, len(fences)
            )
            params: dict[str, Any] = {f"v_{name}": value for name, value in change.items()}
            params.update(
                w_key=key,
                w_statuses=[str(status) for status in statuses],
                w_owner=owner,
                w_attempts=attempts,
            )
            for i, (run_id, token) in enumerate(fences.items()):
                params[f"f_run_{i}"] = run_id
                params[f"f_token_{i}"] = token
            changed = await self._run(what, _changed, statement, params)
        if not changed and fences:
            # Refused: by the compare-and-set, or because the entry's run changed hands.
            run, holder = await self._run(what, _lease_of, key)
            fenced = None if run is None else fences.get(run)
            if fenced is not None and (holder is None or holder[1] != fenced):
                assert run is not None
                raise lost(run, fenced, holder)
        return changed

    def _update(
        self, columns: tuple[str, ...], by_owner: bool, by_attempts: bool, fences: int
    ) -> Update:
        # One statement per shape, built once: its compiled form is then cached too.
        shape = (columns, by_owner, by_attempts, fences)
        statement = self._updates.get(shape)
        if statement is None:
            conditions = [
                _calls.c.key == bindparam("w_key"),
                _calls.c.status.in_(bindparam("w_statuses", expanding=True)),
            ]
            if by_owner:
                conditions.append(_calls.c.owner == bindparam("w_owner"))
            if by_attempts:
                conditions.append(_calls.c.attempts == bindparam("w_attempts"))
            conditions.extend(
                or_(
                    _calls.c.run_id.is_distinct_from(bindparam(f"f_run_{i}")),
                    _holds_lease(share=True, suffix=f"_{i}"),
                )
                for i in range(fences)
            )
            statement = (
                update(_calls)
                .where(*conditions)
                .values({name: bindparam(f"v_{name}") for name in columns})
            )
            self._updates[shape] = statement
        return statement

    async def list_calls(self, run_id: str | None = None) -> list[LedgerEntry]:  # noqa: D102
        rows = await self._retried("read the calls", self._read, _all, run_id)
        return [_entry(row) for row in rows]

    # -- model calls (the ModelCallLog protocol) --------------------------------------------

    async def record_model_call(self, record: ModelCallRecord) -> bool:
        """Write ``record`` unless a call of its identity is recorded already.

        One transaction writes the call's row and the messages of its request that the run
        has not stored yet (see [`ModelCallLog`][agentsnap.model_calls.ModelCallLog]); on
        PostgreSQL it is one statement, a single round trip to the server.

        Returns:
            Whether it was written (``False``: the identity was taken; the first answer stays).

        Raises:
            OwnershipLost: The run is fenced and its lease has another token now; nothing
                was written.
        """
        stored = model_rows.split(record)
        what = "record model call {0.position} of {0.agent!r} for message {0.message_id!r}"
        if self._sqlite is not None:  # the first attempt here: a record per model call
            try:
                return await self._record_once(False, record, stored)
            except Exception as exc:
                return await self.retry.after(
                    exc, what, self._record_once, record, stored, where=self._where
                )
        return await self.retry.call(
            what, self._record_once, record, stored, where=self._where, bounded=True
        )

    async def _record_once(
        self, again: bool, record: ModelCallRecord, stored: model_rows.StoredCall
    ) -> bool:
        what = f"record a model call of {record.agent!r}"
        if again:
            found = await self._run(what, model_rows.find_row, _identity_of(record))
            if found is not None:  # taken: by the attempt before (its answer lost), or not
                return model_rows.same_call(found, record)
        fence = self._fences.get(record.run_id)
        if self._sqlite is not None:
            await self._gate.wait()
            values, texts = model_rows.sqlite_values(stored)
            return await self._sqlite.transaction(
                what, model_rows.record_sqlite, record.run_id, values, texts, fence
            )
        # One statement in autocommit: its own transaction, one round trip.
        return await self._run(what, model_rows.record_postgres, stored, fence)

    async def find_model_call(
        self, run_id: str, agent: str, message_id: str, position: int, timeline: int
    ) -> ModelCallRecord | None:
        """The call of this identity, its request whole, or ``None``."""
        identity = dict(
            zip(model_rows.IDENTITY, (run_id, agent, message_id, position, timeline), strict=True)
        )
        return await self._retried(
            "read a model call of {1[agent]!r}", self._read, model_rows.find_call, identity
        )

    async def find_model_answer(
        self, run_id: str, agent: str, message_id: str, position: int, timeline: int
    ) -> dict[str, JsonValue] | None:
        """The answer recorded for the call of this identity, or ``None``.

        On SQLite a point read by the primary key on the event loop's connection (a reader
        never waits in WAL mode; a locked database is read in the ledger's thread instead):
        a resumed handler gets each answer in tens of microseconds.
        """
        identity = (run_id, agent, message_id, position, timeline)
        what = "read a model call's answer"
        if self._sqlite is not None:
            try:
                return await self._answer_once(False, identity)
            except Exception as exc:
                return await self.retry.after(
                    exc, what, self._answer_once, identity, where=self._where
                )
        return await self._retried(what, self._answer_once, identity)

    async def _answer_once(
        self, again: bool, identity: tuple[str, str, str, int, int]
    ) -> dict[str, JsonValue] | None:
        if self._sqlite is not None:
            await self._gate.wait()
            found = await self._sqlite.read_one(
                "read a model call's answer", model_rows.SQLITE_ANSWER, list(identity)
            )
            return None if found is None else model_rows.answer_of(found[0])
        params = dict(zip(model_rows.IDENTITY, identity, strict=True))
        return await self._run("read a model call's answer", model_rows.find_answer, params)

    async def replayed_model_call(
        self, run_id: str, agent: str, message_id: str, position: int, timeline: int
    ) -> None:
        """Count one more replay of the call of this identity (none recorded: nothing).

        Not fenced: the count is for the inspector, and a replay writes no answer.
        """
        identity = (run_id, agent, message_id, position, timeline)
        what = "count a replay of a model call of {0[1]!r}"
        if self._sqlite is not None:
            try:
                await self._replayed_once(False, identity)
            except Exception as exc:
                await self.retry.after(exc, what, self._replayed_once, identity, where=self._where)
            return
        await self.retry.call(what, self._replayed_once, identity, where=self._where, bounded=True)

    async def _replayed_once(self, again: bool, identity: tuple[str, str, str, int, int]) -> None:
        # A retry after a lost answer may count a replay twice: the count is a hint.
        what = "count a replay of a model call"
        if self._sqlite is not None:
            await self._gate.wait()
            await self._sqlite.write(what, model_rows.SQLITE_REPLAYED, list(identity))
            return
        params = {
            f"w_{name}": value for name, value in zip(model_rows.IDENTITY, identity, strict=True)
        }
        await self._run(what, _changed, model_rows.replayed, params)

    async def list_model_calls(
        self, run_id: str, agent: str | None = None
    ) -> list[ModelCallRecord]:
        """A run's model calls (of one agent, when given), in the order they were made."""
        return await self._retried(
            "read the model calls of run {1!r}", self._read, model_rows.list_calls, run_id, agent
        )

    # -- requests to people (the RequestLog protocol) ---------------------------------------

    async def add_request(self, request: HumanRequest) -> HumanRequest:
        """Store ``request`` unless its id is taken; the stored request either way.

        Not fenced: a request is keyed by its step, so a process that lost the run asking
        again adds nothing, and an answer reaches whichever process waits on it.
        """
        return await self._retried(
            "store request {1.id} of {1.agent!r}", self._read, request_rows.add, request
        )

    async def find_request(self, request_id: str) -> HumanRequest | None:
        """The request with this id, or ``None``."""
        return await self._retried("read request {1!r}", self._read, request_rows.find, request_id)

    async def settle_request(
        self, request_id: str, status: RequestStatus, **settlement: Unpack[Settlement]
    ) -> bool:
        """Close a pending request (see [`RequestLog`][agentsnap.requests.RequestLog]).

        Returns:
            Whether it was pending. A retry after a lost answer finds it closed, so reads it
            back: the close is this caller's when it holds this caller's time and status.
        """
        operation = request_rows.settle
        what = f"answer request {request_id!r}"
        closed = settled_fields(status, settlement)
        at = settlement["at"]

        async def once(again: bool) -> bool:
            if again:
                found = await self._run("read a request", request_rows.find, request_id)
                if found is not None and not found.pending:
                    return found.status == status and found.answered_at == at
            return await self._run("answer a request", operation, request_id, closed)

        return await self.retry.call(
            what, once, where=self._where, bounded=self._engine is not None
        )

    async def withdraw_requests(
        self, run_id: str, before_timeline: int, *, by: str, at: datetime
    ) -> list[str]:
        """Withdraw the run's pending requests of earlier timelines; their ids."""
        return await self._retried(
            "withdraw the requests of run {1!r}",
            self._read,
            request_rows.withdraw,
            run_id,
            before_timeline,
            by,
            at,
        )

    async def list_requests(
        self, run_id: str | None = None, *, pending: bool = False
    ) -> list[HumanRequest]:
        """The requests of a run (of every run, with ``None``), oldest first."""
        return await self._retried(
            "read the requests", self._read, request_rows.list_requests, run_id, pending
        )

    async def _retried(self, what: str, operation: Callable[..., Awaitable[T]], *args: Any) -> T:
        return await self.retry.call(
            what, operation, *args, where=self._where, bounded=self._engine is not None
        )

    async def _read(self, again: bool, op: Callable[..., T], *args: Any) -> T:
        return await self._run("read the ledger", op, *args)

    async def close(self) -> None:
        """Close the connections (and the SQLite thread)."""
        if self._sqlite is not None:
            await self._sqlite.close()
        if self._engine is not None and self._owns_engine:
            await self._engine.dispose()


# -- operations, each run with one connection ------------------------------------------------


def _claim(conn: Connection, statement: Any, row: dict[str, Any]) -> tuple[Any, Any]:
    if conn.execute(statement, row).rowcount == 1:
        return _INSERTED, None
    return _one_and_lease(conn, row["key"], row["run_id"])


def _one_and_lease(
    conn: Connection, key: str, run_id: str | None
) -> tuple[Mapping[Any, Any] | None, tuple[str, int] | None]:
    """The entry with ``key``, and ``(owner, token)`` of the lease of ``run_id`` (if any)."""
    found = _one(conn, key)
    if run_id is None:
        return found, None
    holder = conn.execute(_lease_of_run, {"r": run_id}).one_or_none()
    return found, None if holder is None else (holder.owner, holder.token)


def _lease_of(conn: Connection, key: str) -> tuple[str | None, tuple[str, int] | None]:
    """The run of the entry with ``key``, and ``(owner, token)`` of that run's lease."""
    found = conn.execute(_lease_of_key, {"k": key}).one_or_none()
    if found is None:
        return None, None
    return found.run_id, None if found.token is None else (found.owner, found.token)


def _holds_lease(*, share: bool, suffix: str = "") -> Any:
    """``EXISTS`` a lease of run ``f_run{suffix}`` with token ``f_token{suffix}``.

    With ``share``, PostgreSQL locks the lease's row against a takeover until the statement
    commits.
    """
    query = select(literal(1)).where(
        _leases.c.run_id == bindparam(f"f_run{suffix}"),
        _leases.c.token == bindparam(f"f_token{suffix}"),
    )
    if share:
        query = query.with_for_update(read=True)
    return exists(query)


def _typed_bind(column: Any) -> Any:
    """A bound value for ``column`` in a ``SELECT`` list, typed as the column is."""
    return bindparam(column.name, type_=column.type)


def _one(conn: Connection, key: str) -> Mapping[Any, Any] | None:
    found = conn.execute(_get, {"k": key}).one_or_none()
    return None if found is None else found._mapping


def _changed(conn: Connection, statement: Update, values: dict[str, Any]) -> bool:
    return bool(conn.execute(statement, values).rowcount == 1)


def _all(conn: Connection, run_id: str | None) -> list[Mapping[Any, Any]]:
    query = select(_calls).order_by(_calls.c.created_at, _calls.c.key)
    if run_id is not None:
        query = query.where(_calls.c.run_id == run_id)
    return [row._mapping for row in conn.execute(query)]


def _same_claim(stored: LedgerEntry, claim: LedgerEntry) -> bool:
    """Whether ``stored`` is the row ``claim`` inserts: same owner, attempt and time."""
    return (
        stored.status == claim.status
        and stored.owner == claim.owner
        and stored.attempts == claim.attempts
        and stored.fingerprint == claim.fingerprint
        and _instant(stored.created_at) == _instant(claim.created_at)
    )


def _has(entry: LedgerEntry, change: Change) -> bool:
    """Whether ``entry`` already holds every value of ``change``."""
    for name, value in change.items():
        held = getattr(entry, name)
        if isinstance(value, datetime) or isinstance(held, datetime):
            if _instant(held) != _instant(value):
                return False
        elif held != value:
            return False
    return True


def _instant(moment: Any) -> Any:
    """A timestamp as an aware UTC value (SQLite hands back naive UTC ones)."""
    if isinstance(moment, datetime) and moment.tzinfo is None:
        return moment.replace(tzinfo=UTC)
    return moment


def _entry(row: Mapping[Any, Any]) -> LedgerEntry:
    values = dict(row)
    values["status"] = ToolCallStatus(values["status"])
    return LedgerEntry(**values)


def _identity_of(record: ModelCallRecord) -> dict[str, Any]:
    return {name: getattr(record, name) for name in model_rows.IDENTITY}


# -- SQLite ----------------------------------------------------------------------------------

# The fast path writes plain SQL on the driver's connection, with values converted by the
# columns' own SQLAlchemy types: what it writes is exactly what SQLAlchemy writes and reads.
_DIALECT = sqlite.dialect()


def _binder(column: Any) -> Callable[[Any], Any]:
    if column.name == "status":
        return str  # the enum's value
    process = column.type.dialect_impl(_DIALECT).bind_processor(_DIALECT)
    return process if process is not None else _same


def _same(value: Any) -> Any:
    return value


_BIND: dict[str, Callable[[Any], Any]] = {column.name: _binder(column) for column in _calls.columns}
_SQLITE_CLAIM = (
    f"INSERT INTO {_calls.name} ({', '.join(_COLUMNS)}) "  # noqa: S608  # names from the model
    f"VALUES ({', '.join('?' for _ in _COLUMNS)}) ON CONFLICT (key) DO NOTHING"
)
_SQLITE_HOLDS = f"EXISTS (SELECT 1 FROM {_leases.name} WHERE run_id = ? AND token = ?)"  # noqa: S608
# SQLite's write lock makes the check and the insert one step. (An upsert's SELECT needs a
# WHERE clause, which it has, to be parsed as one.)
_SQLITE_CLAIM_FENCED = (
    f"INSERT INTO {_calls.name} ({', '.join(_COLUMNS)}) "  # names from the model
    f"SELECT {', '.join('?' for _ in _COLUMNS)} WHERE {_SQLITE_HOLDS} "
    "ON CONFLICT (key) DO NOTHING"
)
_sqlite_updates: dict[tuple[tuple[str, ...], int, bool, bool, int], str] = {}


def _sqlite_update(
    columns: tuple[str, ...], statuses: int, by_owner: bool, attempts: Any, fences: int
) -> str:
    shape = (columns, statuses, by_owner, attempts is not None, fences)
    sql = _sqlite_updates.get(shape)
    if sql is None:
        if not set(columns) <= set(_COLUMNS):
            raise ConfigurationError(
                f"the ledger has no columns {sorted(set(columns) - set(_COLUMNS))}"
            )
        sets = ", ".join(f"{name} = ?" for name in columns)
        where = f"key = ? AND status IN ({', '.join('?' for _ in range(statuses))})"
        if by_owner:
            where += " AND owner = ?"
        if attempts is not None:
            where += " AND attempts = ?"
        where += f" AND (run_id IS NOT ? OR {_SQLITE_HOLDS})" * fences
        sql = f"UPDATE {_calls.name} SET {sets} WHERE {where}"  # noqa: S608  # model's names
        _sqlite_updates[shape] = sql
    return sql


def _in_transaction(
    conn: sqlite3.Connection,
    work: Callable[Concatenate[sqlite3.Connection, P], T],
    *args: P.args,
    **kw: P.kwargs,
) -> T:
    """``work(conn, …)`` between ``BEGIN IMMEDIATE`` and ``COMMIT``; rolled back if it fails."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        result = work(conn, *args, **kw)
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return result


class _After:
    """Another object's schema check, then what this ledger opens once it passed."""

    def __init__(self, gate: SchemaGate, then: Callable[[], Awaitable[None]] | None) -> None:
        self._gate = gate
        self._then = then
        self._lock = asyncio.Lock()

    async def wait(self) -> None:
        await self._gate.wait()
        if self._then is None:
            return
        async with self._lock:
            if self._then is not None:
                await self._then()
                self._then = None


class _Sqlite:
    """Two connections to one SQLite file.

    One is used on the event loop and never waits; the other lives in a thread of its own and
    does everything else: waiting writes, reads, checkpoints.
    """

    def __init__(self, url: str, path: str, *, durable: bool, echo: bool, timeout: float) -> None:
        self._url = url
        self._timeout = max(0.001, timeout)
        self._path = path
        self._synchronous = "FULL" if durable else "NORMAL"
        self._echo = echo
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="agentsnap-ledger"
        )
        self._engine: Engine | None = None
        self._conn: Connection | None = None
        self._fast: sqlite3.Connection | None = None
        self._writes = 0

    # the thread's connection

    def _connection(self) -> Connection:
        if self._conn is None:
            self._engine = create_engine(
                sync_url(self._url), echo=self._echo, isolation_level="AUTOCOMMIT"
            )
            event.listen(
                self._engine,
                "connect",
                sqlite_setup(timeout=self._timeout, synchronous=self._synchronous),
            )
            self._conn = self._engine.connect()
        return self._conn

    async def open(self) -> None:
        """Open both connections (the thread's first: it puts the database in WAL mode)."""
        await asyncio.get_running_loop().run_in_executor(self._executor, self._connection)
        if self._fast is None:
            self._open_fast()

    async def run(
        self, op: Callable[Concatenate[Connection, P], T], *args: P.args, **kw: P.kwargs
    ) -> T:
        def call() -> T:
            return op(self._connection(), *args, **kw)

        return await asyncio.get_running_loop().run_in_executor(self._executor, call)

    def _write_waiting(self, sql: str, values: list[Any]) -> bool:
        cursor = self._connection().connection.driver_connection.cursor()  # type: ignore[union-attr]
        try:
            return bool(cursor.execute(sql, values).rowcount == 1)
        finally:
            cursor.close()

    def _checkpoint(self) -> None:
        try:
            self._connection().exec_driver_sql("PRAGMA wal_checkpoint(PASSIVE)")
        except SQLAlchemyError as exc:  # a later checkpoint will do
            logger.warning("ledger WAL checkpoint failed: %s", exc)

    # the event loop's connection

    async def write(self, what: str, sql: str, values: list[Any]) -> bool:
        """Run one write; True when it changed a row.

        On the event loop when the database is free, else (locked) in the thread, waiting.
        """
        try:
            fast = self._fast or self._open_fast()
            cursor = fast.execute(sql, values)
            changed = cursor.rowcount == 1
            cursor.close()
        except sqlite3.Error as exc:
            return await self._when_locked(what, exc, lambda _: self._write_waiting(sql, values))
        self._wrote()
        return changed

    async def read_one(self, what: str, sql: str, values: list[Any]) -> tuple[Any, ...] | None:
        """Read one row by its key on the event loop's connection (in the thread when the
        database is locked); ``None`` when there is none.
        """  # noqa: D205
        try:
            fast = self._fast or self._open_fast()
            row = fast.execute(sql, values).fetchone()
        except sqlite3.Error as exc:

            def waiting(conn: Connection) -> tuple[Any, ...] | None:
                driver = conn.connection.driver_connection
                assert isinstance(driver, sqlite3.Connection)
                found = driver.execute(sql, values).fetchone()
                return None if found is None else tuple(found)

            return await self._when_locked(what, exc, waiting)
        return None if row is None else tuple(row)

    async def transaction(
        self,
        what: str,
        work: Callable[Concatenate[sqlite3.Connection, P], T],
        *args: P.args,
        **kw: P.kwargs,
    ) -> T:
        """Run ``work`` in one write transaction, as ``write`` runs one statement.

        On the event loop when the database is free, else (locked) in the thread, waiting.
        ``work`` gets the driver's connection inside ``BEGIN IMMEDIATE``: it holds the write
        lock from the start, so no statement of ``work`` can find the database locked.
        """
        try:
            fast = self._fast or self._open_fast()
            result = _in_transaction(fast, work, *args, **kw)
        except sqlite3.Error as exc:

            def waiting(conn: Connection) -> T:
                driver = conn.connection.driver_connection
                assert isinstance(driver, sqlite3.Connection)
                return _in_transaction(driver, work, *args, **kw)

            return await self._when_locked(what, exc, waiting)
        self._wrote()
        return result

    async def _when_locked(
        self, what: str, error: sqlite3.Error, waiting: Callable[[Connection], T]
    ) -> T:
        """Go on after the event loop's connection failed with ``error``: when the database
        was locked, nothing was written, so run ``waiting`` in the thread, where waiting for
        the lock blocks nobody; otherwise raise.

        Raises:
            StoreError: ``error`` was not a lock, or ``waiting`` failed too.
        """  # noqa: D205
        locked = {sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED}
        if not isinstance(error, sqlite3.OperationalError) or (
            error.sqlite_errorcode & 0xFF not in locked
        ):
            raise StoreError(f"the ledger could not {what}: {error}") from error
        try:
            return await self.run(waiting)
        except (SQLAlchemyError, sqlite3.Error) as waited:
            raise StoreError(f"the ledger could not {what}: {waited}") from waited

    def _wrote(self) -> None:
        self._writes += 1
        if self._writes % CHECKPOINT_EVERY == 0:
            self._executor.submit(self._checkpoint)

    def _open_fast(self) -> sqlite3.Connection:
        fast = connect_sqlite(self._path, timeout=0, synchronous=self._synchronous)
        # Checkpoints copy the WAL into the database and fsync: the thread runs them.
        fast.execute("PRAGMA wal_autocheckpoint=0")
        self._fast = fast
        return fast

    async def close(self) -> None:
        def shut() -> None:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
            if self._engine is not None:
                self._engine.dispose()
                self._engine = None

        if self._fast is not None:
            self._fast.close()
            self._fast = None
        await asyncio.get_running_loop().run_in_executor(self._executor, shut)
        self._executor.shutdown(wait=False)
