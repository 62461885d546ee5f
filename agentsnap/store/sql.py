"""SqlStore: runs and snapshots in SQLite (the default) or PostgreSQL.

Example:
    ```python
    import asyncio

    from agentsnap.store.sql import SqlStore

    async def main() -> None:
        store = SqlStore("sqlite:///agentsnap.db")
        for run in await store.list_runs():
            print(run.id, run.created_at)
        await store.close()

    asyncio.run(main())
    ```

Each snapshot is written in one transaction: it is in the database whole, or not at all. A
state already stored under its content hash is not written again. On first use an empty
database gets the schema through the migrations; a database at another schema revision is
refused with a message saying how to upgrade it.

A snapshot holds one ``agentsnap_snapshot_agents`` row per process (its state's hash and its
channel counters), or, when little changed, only the rows that differ from its run's *base*:
the last full snapshot of the run this store wrote. Such a snapshot names its base in
``base_id`` and counts its own rows in ``agent_rows``; a reader takes every other process's
row from the base. A base is always full, so reading a snapshot takes at most its rows and
its base's. A complete snapshot is written this way when it holds every process of the base,
fewer than half of its processes changed (state hash or counters), and fewer than 100
snapshots were written over that base; otherwise it is written full and becomes the base. A
store that starts remembers no base, so its first snapshot of a run is full. With 10,000
agents of which 1 % changed, a snapshot then adds about 100 rows rather than 10,000.

A run's lease is one row of ``agentsnap_run_leases``, changed by compare-and-set statements
(``INSERT … ON CONFLICT DO NOTHING`` for the first lease, ``UPDATE … WHERE token = N`` for a
takeover), so that of two processes racing for a run exactly one wins. A fenced write reads
the lease's token in its own transaction, after taking SQLite's write lock or, on
PostgreSQL, with ``FOR SHARE``, which holds off a takeover until the write commits: a write
is either made before the takeover, or refused.
"""

from __future__ import annotations

from sqlalchemy.engine import make_url

from agentsnap.store._sql_base import (
    DEFAULT_URL,
    database_name,
    engine_options,  # noqa: F401  (importable from here, as before)
)
from agentsnap.store._sql_leases import SqlLeases
from agentsnap.store._sql_log import SqlLog
from agentsnap.store._sql_parts import SqlParts
from agentsnap.store._sql_queries import SqlQueries
from agentsnap.store._sql_runs import SqlRuns
from agentsnap.store.dialect import async_url
from agentsnap.store.sql_ledger import SqlLedger

__all__ = ["DEFAULT_URL", "SqlStore", "async_url", "database_name"]


class SqlStore(SqlRuns, SqlLog, SqlLeases, SqlQueries, SqlParts):
    """A [`Store`][agentsnap.Store] on SQLAlchemy's asyncio engine.

    Args:
        url: Database URL: ``sqlite:///path.db`` (WAL mode) or ``postgresql://…``; the driver
            is chosen for you (aiosqlite, psycopg 3).
        echo: Log every SQL statement (SQLAlchemy's ``echo``).
        create: Create the schema in an empty database on first use. Readers that must not
            create anything (the CLI) pass ``False`` and get a clear error instead.
        retry: How database operations that fail for a passing reason (a lost connection,
            a restarting server, a lock, a full disk) are retried, and how long one attempt
            may take (see [`agentsnap.store.faults`][agentsnap.store.faults]).

    Attributes:
        retry: The retry policy.
        where: How messages name the database.
    """

    def ledger(self) -> SqlLedger:
        """A ledger on this store's database, to read and answer what it holds (tool calls,
        model calls, requests to people): the inspector's and the CLI's.

        On PostgreSQL it runs on this store's connections (no second pool); on SQLite it
        opens connections of its own to the same file. Either way it trusts this store's
        check of the schema. Close it before the store. A runtime's ledger, on the hot path
        of every tool call, is opened on its own (see
        [`ledger_for`][agentsnap.store.ledger.ledger_for]).
        """  # noqa: D205
        return SqlLedger(
            self.url, create=False, retry=self.retry, engine=self._autocommit, schema=self._gate
        )

    def __repr__(self) -> str:
        return f"SqlStore({make_url(self.url).render_as_string(hide_password=True)!r})"
