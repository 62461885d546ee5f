"""Deleting runs, and pruning old ones: everything a run owns goes, nothing else does.

[`delete_runs`][agentsnap.store.retention.delete_runs] removes runs from an SQL database with
everything they own: their snapshots (agent states and counters, messages in flight), journal,
replay log, rollbacks, lease and owners, tags, their side-effecting tool calls in the ledger
(``agentsnap_tool_calls`` rows filed under the run), their model calls and the messages of
those calls' requests (``agentsnap_model_calls`` and ``agentsnap_model_bodies``), their
requests to people (``agentsnap_requests``), the LangGraph
checkpoints of their graph agents' threads (see
[`agentsnap.store.langgraph`][agentsnap.store.langgraph]), and the stored agent states that no
snapshot of another run refers to any more. A state that another run's
snapshot holds too is kept: states are stored once per content. Snapshots are deleted with
their run only, never one by one: a snapshot stored as the changes to an earlier full one
(see [`agentsnap.store.sql`][agentsnap.store.sql]) has that base in its own run, so a delete
never leaves a kept snapshot without its base, and a kept run's states are all referred to by
its own rows.
[`prune_runs`][agentsnap.store.retention.prune_runs] picks the runs to delete by a policy: keep
the newest N, or delete those older than some time.

Each batch of runs (up to 100) is deleted in one transaction: a run is entirely there, or
entirely gone. The transaction first locks the runs' rows, then reads their leases: a run that
a live runtime owns is refused (its runtime would go on writing to it), unless the delete is
forced. What a run forked from a deleted one needs is its own: its snapshots hold full copies
of the states they restore, so it still loads, exports and resumes, and its
``parent_run_id`` and ``parent_snapshot_id`` keep naming where it came from (a run and
snapshot that ``get_run`` and ``load_snapshot`` then no longer find). The exception is a
graph agent's LangGraph checkpoint: a fork's snapshot names it on its parent's thread until
the fork has run the graph once, so a run whose forks' snapshots name its checkpoints is
refused too, unless those forks are deleted with it or the delete is forced.

Deleting forgets the runs' tool calls: a later call with an explicit ``key=`` that one of them
used runs again. Keys derived by agentsnap name their run, so no other run ever uses them.

**Space.** Deleted rows leave free pages behind. SQLite reuses them for new rows, but the file
does not shrink until ``VACUUM`` rewrites it: pass ``vacuum=True`` (``agentsnap runs delete
--vacuum``), which needs as much free disk as the database takes, and briefly holds every
writer off. PostgreSQL's autovacuum makes the space reusable on its own; ``vacuum=True`` runs
``VACUUM (ANALYZE)`` on agentsnap's tables at once. Neither returns PostgreSQL's space to the
operating system: that takes ``VACUUM FULL``, which locks the tables while it runs.

Example:
    ```python
    import asyncio
    import tempfile

    from agentsnap import Runtime
    from agentsnap.store.retention import delete_runs, prune_runs
    from agentsnap.store.sql import SqlStore


    async def main(url: str) -> None:
        store = SqlStore(url)
        try:
            for day in ("monday", "tuesday", "wednesday"):
                async with Runtime(store=store, name="nightly", tags={"day": day}) as runtime:
                    await runtime.snapshot()
            first, *_ = await store.list_runs()
            report = await delete_runs(store, [first.id])
            print(report.run_ids == [first.id], report.rows["agentsnap_snapshots"])  # True 1
            pruned = await prune_runs(store, keep=1, name="nightly")
            print(len(pruned.run_ids), len(await store.list_runs()))  # 1 1
        finally:
            await store.close()


    with tempfile.TemporaryDirectory() as folder:
        asyncio.run(main(f"sqlite:///{folder}/agentsnap.db"))
    ```
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from sqlalchemy import Connection, Table, delete, event, select, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from agentsnap.exceptions import AgentsnapError, ConfigurationError, NotFoundError
from agentsnap.liveness import owner_is_live
from agentsnap.records import RunLease, RunStatus, utcnow
from agentsnap.store._sql_base import (
    _agent_leases,
    _agents,
    _blobs,
    _journal,
    _leases,
    _messages,
    _owners,
    _parts,
    _replay,
    _rollbacks,
    _runs,
    _schemas,
    _snapshots,
    _tags,
    engine_options,
)
from agentsnap.store.chunks import delete_unreferenced_states
from agentsnap.store.dialect import async_url, sqlite_setup
from agentsnap.store.langgraph import delete_run_threads
from agentsnap.store.migrate import SchemaGate
from agentsnap.store.sql import SqlStore
from agentsnap.store.tables import (
    Base,
    HumanRequestRow,
    ModelBodyRow,
    ModelCallRow,
    ToolCallRow,
    table_of,
)

__all__ = ["LANGGRAPH_ROWS", "DeleteRefused", "DeleteReport", "delete_runs", "prune_runs"]

LANGGRAPH_ROWS = "agentsnap_lg_*"
"""The key of [`DeleteReport.rows`][agentsnap.store.retention.DeleteReport.rows] counting the
rows of the LangGraph saver's three tables together (checkpoints, channel values, writes)."""

BATCH = 100
"""Runs deleted in one transaction."""

_BY_RUN: tuple[Table, ...] = (
    _tags,
    _leases,
    _owners,
    _journal,
    _replay,
    _schemas,
    table_of(ToolCallRow),
    table_of(ModelCallRow),
    table_of(ModelBodyRow),
    table_of(HumanRequestRow),
    _parts,
    _agent_leases,
)
"""Tables whose rows belong to the run named in their ``run_id``."""

_STATES = _blobs.name
_THREAD = re.compile(r'"thread_id":("(?:[^"\\]|\\.)*")')


@dataclass(frozen=True)
class DeleteReport:
    """What [`delete_runs`][agentsnap.store.retention.delete_runs] or
    [`prune_runs`][agentsnap.store.retention.prune_runs] removed (or would remove, with
    ``dry_run``).
    """  # noqa: D205

    run_ids: list[str]
    """The runs deleted, in the order given (pruned runs oldest first)."""
    rows: dict[str, int]
    """Rows removed, by table: every table a run's rows are in, zeros included.
    ``agentsnap_state_blobs`` counts the stored states that no snapshot refers to any more,
    with the chunks of their long lists that no other state shares
    ([`agentsnap.store.chunks`][agentsnap.store.chunks]);
    [`LANGGRAPH_ROWS`][agentsnap.store.retention.LANGGRAPH_ROWS] the rows of the LangGraph
    saver's tables."""
    skipped: dict[str, str] = field(default_factory=dict)
    """Runs kept although asked for (or picked by the policy), with why: a live runtime owns
    the run, or a fork needs its LangGraph checkpoints."""
    dry_run: bool = False
    """Whether nothing was deleted: the counts are what a delete would remove."""
    reclaimed_bytes: int | None = None
    """By how many bytes the SQLite file shrank (``vacuum=True``), else ``None``."""

    @property
    def total_rows(self) -> int:
        """Rows removed, in every table together."""
        return sum(self.rows.values())


class DeleteRefused(AgentsnapError):
    """Runs asked to be deleted cannot be, safely: nothing was deleted.

    A live runtime owns one (stop it, or wait until its lease expires), or another run's
    snapshots name a run's LangGraph checkpoints (delete that run too). Either way, a forced
    delete (``force=True``) deletes it even so.

    Attributes:
        refused: Why each run was refused, by run id.
    """

    def __init__(self, refused: Mapping[str, str]) -> None:
        self.refused = dict(refused)
        count = len(self.refused)
        reasons = "; ".join(f"run {run_id} {why}" for run_id, why in self.refused.items())
        super().__init__(
            f"refused to delete {count} run{'' if count == 1 else 's'}, so nothing was "
            f"deleted: {reasons}. Pass force=True to delete even so"
        )


async def delete_runs(
    url_or_store: str | SqlStore,
    run_ids: Iterable[str],
    *,
    force: bool = False,
    skip_refused: bool = False,
    dry_run: bool = False,
    vacuum: bool = False,
) -> DeleteReport:
    """Delete runs and everything they own, each batch of runs in one transaction.

    See the module's description for what goes, what stays and what forks keep.

    Args:
        url_or_store: The database: its URL, or an ``SqlStore`` on it (whose retry policy
            is then used).
        run_ids: The runs' full ids (resolve prefixes first, with
            [`resolve_run`][agentsnap.inspect.resolve_run]).
        force: Delete even a run that a live runtime owns (its writes then fail) or whose
            LangGraph checkpoints another run's snapshots name (that run then cannot go back
            to those snapshots).
        skip_refused: Keep the runs that would be refused and delete the others, saying why
            in [`DeleteReport.skipped`][agentsnap.store.retention.DeleteReport.skipped],
            rather than raise. (A run that a runtime takes over while the delete is under
            way is kept and listed there in any case.)
        dry_run: Delete nothing: the report says what would go. Each batch is deleted in a
            transaction that is then rolled back, so the counts are exact.
        vacuum: Then give the space back: ``VACUUM`` on SQLite, ``VACUUM (ANALYZE)`` on
            PostgreSQL (see the module's description).

    Returns:
        What was deleted.

    Raises:
        NotFoundError: A run is not in the database (nothing was deleted).
        DeleteRefused: A run cannot be deleted safely, and neither ``force`` nor
            ``skip_refused`` was given (nothing was deleted).
        ConfigurationError: ``url_or_store`` is not an SQL database.
        StoreError: The database is unavailable or has no agentsnap schema.
    """
    wanted = list(dict.fromkeys(run_ids))
    async with _Database(url_or_store) as database:
        return await database.delete(
            wanted, force=force, skip_refused=skip_refused, dry_run=dry_run, vacuum=vacuum
        )


async def prune_runs(
    url_or_store: str | SqlStore,
    *,
    keep: int | None = None,
    older_than: timedelta | None = None,
    status: RunStatus | str | Collection[RunStatus | str] | None = None,
    name: str | None = None,
    tags: Mapping[str, str] | None = None,
    dry_run: bool = False,
    vacuum: bool = False,
) -> DeleteReport:
    """Delete the runs a retention policy leaves out, never one that a live runtime owns.

    The runs considered are those that ``status``, ``name`` and ``tags`` select (as
    [`Store.list_runs`][agentsnap.store.RunQueries.list_runs] does; every run by default). Of these,
    the newest ``keep`` stay, and so do those created less than ``older_than`` ago; both
    given, a run goes when it is outside the newest ``keep`` *and* older than ``older_than``.
    Runs that a live runtime owns, and runs whose LangGraph checkpoints a kept run's
    snapshots name, stay too, listed in
    [`DeleteReport.skipped`][agentsnap.store.retention.DeleteReport.skipped].

    Args:
        url_or_store: The database: its URL, or an ``SqlStore`` on it.
        keep: How many of the newest runs considered to keep (0 keeps none).
        older_than: Delete only runs created longer ago than this.
        status: Consider only runs in this status, or one of these.
        name: Consider only runs of this name (``*`` stands for any characters).
        tags: Consider only runs with every one of these tags.
        dry_run: Delete nothing: the report says what would go.
        vacuum: Then give the space back (as
            [`delete_runs`][agentsnap.store.retention.delete_runs] does).

    Returns:
        What was deleted.

    Raises:
        ConfigurationError: Neither ``keep`` nor ``older_than`` is given, ``keep`` is
            negative, ``older_than`` is negative, a filter is invalid, or ``url_or_store``
            is not an SQL database.
        StoreError: The database is unavailable or has no agentsnap schema.
    """
    if keep is None and older_than is None:
        raise ConfigurationError(
            "prune_runs needs keep= (how many of the newest runs to keep) or older_than= "
            "(delete runs older than this), or both"
        )
    if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int) or keep < 0):
        raise ConfigurationError(f"keep= must be a whole number of 0 or more, got {keep!r}")
    if older_than is not None and (
        not isinstance(older_than, timedelta) or older_than < timedelta(0)
    ):
        raise ConfigurationError(
            f"older_than= must be a timedelta of 0 or more, got {older_than!r}: pass "
            "timedelta(days=7), say"
        )
    async with _Database(url_or_store) as database:
        runs = await database.store.list_runs(status=status, name=name, tags=tags)
        if keep is not None:
            runs = runs[: max(0, len(runs) - keep)]
        if older_than is not None:
            cutoff = utcnow() - older_than
            runs = [run for run in runs if run.created_at < cutoff]
        # Live runs are refused, and kept: skip_refused lists them with their owners.
        return await database.delete(
            [run.id for run in runs],
            force=False,
            skip_refused=True,
            dry_run=dry_run,
            vacuum=vacuum,
        )


def _live_reason(lease: RunLease) -> str:
    return (
        f"is owned by a live runtime ({lease.owner}, lease until "
        f"{lease.expires_at.isoformat(timespec='seconds')}): stop it first"
    )


class _Database:
    """One database that runs are deleted from: an engine of its own, and a store."""

    def __init__(self, url_or_store: str | SqlStore) -> None:
        if isinstance(url_or_store, SqlStore):
            self.store = url_or_store
            self._owns_store = False
        elif isinstance(url_or_store, str):
            self.store = SqlStore(url_or_store, create=False)
            self._owns_store = True
        else:
            raise ConfigurationError(
                f"runs are deleted from an SQL database: pass its URL or an SqlStore, not "
                f"{type(url_or_store).__name__} (a MemoryStore's runs end with its process)"
            )
        self.url = self.store.url
        self.retry = self.store.retry
        self._engine: AsyncEngine | None = None

    async def __aenter__(self) -> _Database:
        await SchemaGate(self.url, create=False).wait()
        engine = create_async_engine(async_url(self.url), **engine_options(self.url, self.retry))
        if engine.dialect.name == "sqlite":
            event.listen(engine.sync_engine, "connect", sqlite_setup(timeout=self.retry.timeout))
        self._engine = engine
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._engine is not None:
            await self._engine.dispose()
        if self._owns_store:
            await self.store.close()

    @property
    def engine(self) -> AsyncEngine:
        assert self._engine is not None
        return self._engine

    async def _call(self, what: str, operation: Any, *args: Any) -> Any:
        return await self.retry.call(
            what, operation, *args, where=self.store.where, bounded=self.store.bounded
        )

    async def delete(
        self,
        run_ids: list[str],
        *,
        force: bool,
        skip_refused: bool,
        dry_run: bool,
        vacuum: bool,
    ) -> DeleteReport:
        refused: dict[str, str] = await self._call("check the runs to delete", self._check, run_ids)
        if force:
            refused = {}
        elif refused and not skip_refused:
            raise DeleteRefused(refused)
        rows = dict.fromkeys(_REPORTED, 0)
        deleted: list[str] = []
        skipped = dict(refused)
        todo = [run_id for run_id in run_ids if run_id not in refused]
        for start in range(0, len(todo), BATCH):
            batch = todo[start : start + BATCH]
            done, late = await self._call(
                "delete a batch of runs", self._delete_batch, batch, force, dry_run, rows
            )
            deleted += done
            skipped.update(late)
        reclaimed = None
        if vacuum and not dry_run and deleted:
            reclaimed = await self._call("vacuum the database", self._vacuum)
        return DeleteReport(
            run_ids=deleted, rows=rows, skipped=skipped, dry_run=dry_run, reclaimed_bytes=reclaimed
        )

    async def _check(self, again: bool, run_ids: list[str]) -> dict[str, str]:
        """Why each run cannot be deleted safely (the runs that can are not named).

        Raises:
            NotFoundError: A run is not in the database.
        """
        async with self.engine.connect() as conn:
            found: dict[str, RunLease | None] = {}
            for start in range(0, len(run_ids), 500):
                found.update(await _leases_of(conn, run_ids[start : start + 500]))
            missing = [run_id for run_id in run_ids if run_id not in found]
            if missing:
                shown = ", ".join(missing[:10]) + (" and more" if len(missing) > 10 else "")
                raise NotFoundError(
                    "run",
                    missing[0],
                    f"no run with id {shown} in {self.store.where}, so nothing was deleted",
                )
            now = utcnow()
            refused = {
                run_id: _live_reason(lease)
                for run_id, lease in found.items()
                if lease is not None and owner_is_live(lease, now)
            }
            for run_id, forks in (await _forks_needing(conn, run_ids)).items():
                names = ", ".join(forks)
                refused.setdefault(
                    run_id,
                    f"has its LangGraph checkpoints named by snapshots of {names} (forked from "
                    "it): delete those runs with it",
                )
        return refused

    async def _delete_batch(
        self, again: bool, batch: list[str], force: bool, dry_run: bool, rows: dict[str, int]
    ) -> tuple[list[str], dict[str, str]]:
        """Delete one batch in one transaction (rolled back for a dry run)."""
        counts = dict.fromkeys(_REPORTED, 0)
        async with self.engine.connect() as conn:
            transaction = await conn.begin()
            try:
                leases = await _lock(conn, batch)
                now = utcnow()
                late = {
                    run_id: _live_reason(lease)
                    for run_id, lease in leases.items()
                    if not force and lease is not None and owner_is_live(lease, now)
                }
                ids = [run_id for run_id in batch if run_id in leases and run_id not in late]
                if ids:
                    await _delete_rows(conn, ids, counts)
                    counts[LANGGRAPH_ROWS] += await conn.run_sync(_threads, ids)
                    counts[_STATES] += await conn.run_sync(delete_unreferenced_states)
            except BaseException:
                await transaction.rollback()
                raise
            if dry_run:
                await transaction.rollback()
            else:
                await transaction.commit()
        for table, count in counts.items():
            rows[table] += count
        return ids, late

    async def _vacuum(self, again: bool) -> int | None:
        """Give the space of deleted rows back; by how many bytes an SQLite file shrank."""
        async with self.engine.connect() as opened:
            conn = await opened.execution_options(isolation_level="AUTOCOMMIT")
            if self.engine.dialect.name != "sqlite":
                for table in _VACUUMED:
                    await conn.exec_driver_sql(f"VACUUM (ANALYZE) {table}")
                return None
            before = await _file_size(conn)
            await conn.exec_driver_sql("VACUUM")
            await conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
            return max(0, before - await _file_size(conn))


_SNAPSHOT_ROWS: tuple[Table, ...] = (_snapshots, _agents, _messages, _rollbacks)
"""Tables whose rows belong to a run through its snapshots (deleted before the run's own)."""

_REPORTED = (
    _runs.name,
    *(table.name for table in _SNAPSHOT_ROWS),
    *(table.name for table in _BY_RUN),
    LANGGRAPH_ROWS,
    _STATES,
)
"""The keys of ``DeleteReport.rows``: the run, its snapshots, its other rows, then the rest."""

_VACUUMED = tuple(sorted(Base.metadata.tables))
"""The tables ``vacuum=True`` vacuums on PostgreSQL: every table of agentsnap's schema."""


async def _leases_of(conn: AsyncConnection, run_ids: list[str]) -> dict[str, RunLease | None]:
    """The runs of ``run_ids`` that exist, with their leases (``None``: never had one)."""
    rows = await conn.execute(
        select(_runs.c.id, _leases.c.owner, _leases.c.token, _leases.c.expires_at)
        .outerjoin(_leases, _leases.c.run_id == _runs.c.id)
        .where(_runs.c.id.in_(run_ids))
    )
    return {
        row.id: None
        if row.token is None
        else RunLease(run_id=row.id, owner=row.owner, token=row.token, expires_at=row.expires_at)
        for row in rows
    }


async def _lock(conn: AsyncConnection, batch: list[str]) -> dict[str, RunLease | None]:
    """Lock the runs' rows, so no runtime can take them over, and read their leases.

    On PostgreSQL ``FOR UPDATE`` on the runs' rows holds off a new lease (its foreign key
    needs a share lock on them) until the transaction ends; a takeover of a lease changes
    the lease's row, which is read ``FOR UPDATE`` too. SQLite has one writer: a first write
    takes its lock.
    """
    if conn.dialect.name == "sqlite":
        await conn.execute(update(_runs).where(_runs.c.id.in_(batch)).values(status=_runs.c.status))
    else:
        await conn.execute(select(_runs.c.id).where(_runs.c.id.in_(batch)).with_for_update())
        await conn.execute(
            select(_leases.c.run_id).where(_leases.c.run_id.in_(batch)).with_for_update()
        )
    return await _leases_of(conn, batch)


async def _delete_rows(conn: AsyncConnection, ids: list[str], counts: dict[str, int]) -> None:
    """Delete the runs' own rows, those referring to others first."""
    snapshots = select(_snapshots.c.id).where(_snapshots.c.run_id.in_(ids)).scalar_subquery()

    async def gone(table: Table, condition: Any) -> None:
        counts[table.name] += (await conn.execute(delete(table).where(condition))).rowcount

    # A rollback row refers to a snapshot: of its own run, by how runtimes write them.
    await gone(_rollbacks, _rollbacks.c.run_id.in_(ids) | _rollbacks.c.snapshot_id.in_(snapshots))
    await gone(_messages, _messages.c.snapshot_id.in_(snapshots))
    await gone(_agents, _agents.c.snapshot_id.in_(snapshots))
    await gone(_snapshots, _snapshots.c.run_id.in_(ids))
    for table in _BY_RUN:
        await gone(table, table.c.run_id.in_(ids))
    await gone(_runs, _runs.c.id.in_(ids))


def _threads(connection: Connection, ids: list[str]) -> int:
    return delete_run_threads(connection, ids)


async def _forks_needing(conn: AsyncConnection, run_ids: list[str]) -> dict[str, list[str]]:
    """The runs kept whose snapshots name a LangGraph thread of a run in ``run_ids``.

    Only a run's descendants (forks, forks of forks…) can hold such a snapshot: a fork's
    first snapshot is a copy of its parent's, graph agents' thread included.
    """
    deleting = set(run_ids)
    descendants: set[str] = set()
    frontier = list(deleting)
    while frontier:
        found: set[str] = set()
        for start in range(0, len(frontier), 500):
            rows = await conn.execute(
                select(_runs.c.id).where(_runs.c.parent_run_id.in_(frontier[start : start + 500]))
            )
            found.update(row.id for row in rows)
        frontier = sorted(found - deleting - descendants)
        descendants.update(frontier)
    needing: dict[str, set[str]] = {}
    kept = sorted(descendants)
    for start in range(0, len(kept), 500):
        rows = await conn.execute(
            select(_snapshots.c.run_id, _blobs.c.state)
            .distinct()
            .select_from(
                _snapshots.join(_agents, _agents.c.snapshot_id == _snapshots.c.id).join(
                    _blobs, _blobs.c.hash == _agents.c.state_hash
                )
            )
            .where(
                _snapshots.c.run_id.in_(kept[start : start + 500]),
                _blobs.c.state.contains('"thread_id":"', autoescape=True),
            )
        )
        for row in rows:
            for owner in _thread_runs(row.state, deleting):
                needing.setdefault(owner, set()).add(row.run_id)
    return {owner: sorted(forks) for owner, forks in needing.items()}


def _thread_runs(state: str, runs: set[str]) -> set[str]:
    """The runs of ``runs`` whose threads (``"{run}:{agent}…"``) a state names."""
    owners = set()
    for quoted in _THREAD.findall(state):
        try:
            thread = json.loads(quoted)
        except ValueError:
            continue
        for at, char in enumerate(thread):
            if char == ":" and thread[:at] in runs:
                owners.add(thread[:at])
    return owners


async def _file_size(conn: AsyncConnection) -> int:
    """The SQLite database's size: its pages times their size."""
    pages = (await conn.exec_driver_sql("PRAGMA page_count")).scalar()
    size = (await conn.exec_driver_sql("PRAGMA page_size")).scalar()
    return int(pages or 0) * int(size or 0)
