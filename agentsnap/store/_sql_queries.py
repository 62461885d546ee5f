"""What listings read: the ``RunQueries`` role, and the LangGraph checkpoints of runs."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import func, select

from agentsnap.exceptions import NotFoundError
from agentsnap.integrity import SnapshotReader, agent_versions
from agentsnap.records import (
    AgentVersion,
    GraphCheckpoint,
    RunInfo,
    Snapshot,
    SnapshotStatus,
    SnapshotSummary,
    utcnow,
)
from agentsnap.store._run_filter import RunFilter, RunListing
from agentsnap.store._run_query import runs_query
from agentsnap.store._sql_base import (
    _PAGE,
    _RUN_AND_LEASE,
    _check_limit,
    _lg_checkpoints,
    _run,
    _snapshots,
    _tags_of,
    retried,
)
from agentsnap.store._sql_snapshots import SqlSnapshots

__all__ = ["SqlQueries"]


class SqlQueries(SqlSnapshots, RunListing):
    """What listings read: the ``RunQueries`` role, and the LangGraph checkpoints of runs."""

    @retried("list runs")
    async def _list_runs(self, wanted: RunFilter) -> list[RunInfo]:
        await self._gate.wait()
        now = utcnow()
        query = runs_query(_RUN_AND_LEASE, wanted, now, self._backend)
        async with self._engine.connect() as conn:
            if not query.refine:
                runs = [_run(row._mapping, now) for row in await conn.execute(query.select)]
            else:  # statuses computed here decide: read newest first until enough are kept
                runs = []
                result = await conn.stream(query.select)
                async for row in result:
                    run = _run(row._mapping, now)
                    if wanted.matches(run):
                        runs.append(run)
                        if len(runs) == wanted.limit:
                            break
                await result.close()
            if query.newest_first:
                runs.reverse()
            labels = await _tags_of(conn, None if wanted.selects_all else [r.id for r in runs])
        return [r.model_copy(update={"tags": labels.get(r.id, {})}) for r in runs]

    @retried("list snapshots")
    async def list_snapshots_page(
        self, run_id: str, *, after_seq: int = 0, limit: int = 100
    ) -> list[Snapshot]:
        _check_limit(limit)
        await self._gate.wait()
        async with self._engine.connect() as conn:
            rows = await self._snapshot_rows(conn, run_id, after_seq, limit)
            return await self._assemble(conn, [row._mapping for row in rows])

    @retried("list snapshots")
    async def list_snapshot_summaries(self, run_id: str) -> list[SnapshotSummary]:
        await self._gate.wait()
        async with self._engine.connect() as conn:
            rows = await self._snapshot_rows(conn, run_id)
            # Each distinct state is read once, checked, and let go.
            reader = SnapshotReader(keep_states=False)
            summaries: list[SnapshotSummary] = []
            for start in range(0, len(rows), _PAGE):
                page: list[Any] = [row._mapping for row in rows[start : start + _PAGE]]
                await self._read_parts(conn, reader, page)
                summaries.extend(reader.summary(row) for row in page)
            return summaries

    @retried("count snapshots")
    async def snapshot_counts(self) -> dict[str, int]:
        await self._gate.wait()
        query = select(_snapshots.c.run_id, func.count()).group_by(_snapshots.c.run_id)
        async with self._engine.connect() as conn:
            return {row[0]: row[1] for row in await conn.execute(query)}

    @retried("read an agent's history")
    async def agent_history(self, run_id: str, agent: str) -> list[AgentVersion]:
        # Whole snapshots are read, so that a version is marked damaged exactly when its
        # snapshot is (an agent's row may be missing, found only from the other rows).
        await self._gate.wait()
        async with self._engine.connect() as conn:
            await self._require_run(conn, run_id)
            rows = (
                await conn.execute(
                    select(_snapshots)
                    .where(
                        _snapshots.c.run_id == run_id,
                        _snapshots.c.status == SnapshotStatus.COMPLETE.value,
                    )
                    .order_by(_snapshots.c.seq)
                )
            ).all()
            snapshots = await self._assemble(conn, [row._mapping for row in rows])
        versions = agent_versions(snapshots, agent)
        if not versions:
            raise NotFoundError.agent(run_id, agent)
        return versions

    @retried("list graph checkpoints")
    async def list_graph_checkpoints(
        self, run_id: str, agent: str | None = None
    ) -> list[GraphCheckpoint]:
        """The LangGraph checkpoints the graph agents of a run (or only ``agent``) wrote.

        They are found when each graph agent's checkpointer is an ``AgentsnapSaver`` on this
        store's database: it keeps them in ``agentsnap_lg_checkpoints``, on the agent's threads
        (``"{run}:{agent}"`` and ``"{run}:{agent}:N"``). Checkpoints kept elsewhere (LangGraph's
        ``InMemorySaver``, another database) are not seen. Oldest first (by checkpoint id,
        which LangGraph makes time-ordered, then by thread), the root graph's checkpoints
        only. Step, source and metadata are read from metadata stored as JSON; other metadata
        is not decoded and they are ``None``.

        Raises:
            NotFoundError: The store holds no such run.
        """
        table = _lg_checkpoints
        threads = table.c.thread_id.startswith(f"{run_id}:", autoescape=True)
        if agent is not None:
            home = f"{run_id}:{agent}"
            threads = (table.c.thread_id == home) | table.c.thread_id.startswith(
                f"{home}:", autoescape=True
            )
        rows = await self._run_rows(
            run_id,
            select(
                table.c.thread_id,
                table.c.checkpoint_id,
                table.c.parent_checkpoint_id,
                table.c.meta_type,
                table.c.meta,
            )
            .where(table.c.checkpoint_ns == "", threads)
            .order_by(table.c.checkpoint_id, table.c.thread_id),
        )
        found = []
        for row in rows:
            # Exactly (SQLite's LIKE ignores case), and only threads graph agents name.
            name = _thread_agent(run_id, row.thread_id)
            if name is None or (agent is not None and name != agent):
                continue
            metadata = _json_metadata(row.meta_type, row.meta)
            step = None if metadata is None else metadata.get("step")
            source = None if metadata is None else metadata.get("source")
            found.append(
                GraphCheckpoint(
                    run_id=run_id,
                    agent=name,
                    thread_id=row.thread_id,
                    checkpoint_id=row.checkpoint_id,
                    parent_id=row.parent_checkpoint_id,
                    step=step if type(step) is int else None,
                    source=source if isinstance(source, str) else None,
                    created_at=_uuid6_time(row.checkpoint_id),
                    metadata=metadata,
                )
            )
        return found


def _thread_agent(run_id: str, thread_id: str) -> str | None:
    """The graph agent of thread ``"{run}:{agent}"`` or ``"{run}:{agent}:N"``, else ``None``."""
    if not thread_id.startswith(f"{run_id}:"):
        return None
    agent, _, number = thread_id[len(run_id) + 1 :].partition(":")
    if not agent or (number and not (number.isascii() and number.isdigit())):
        return None
    return agent


def _json_metadata(meta_type: str, meta: bytes | None) -> dict[str, Any] | None:
    """Checkpoint metadata the saver stored as JSON; other encodings are not decoded."""
    if meta_type != "json" or meta is None:
        return None
    try:
        loaded = json.loads(bytes(meta))
    except ValueError:
        return None
    return loaded if isinstance(loaded, dict) else None


_UUID_EPOCH = datetime(1582, 10, 15, tzinfo=UTC)


def _uuid6_time(uuid_text: str) -> datetime | None:
    """When a version-6 UUID (LangGraph's checkpoint ids) was made; ``None`` for another id.

    Its 60-bit timestamp counts 100 ns since 1582-10-15: the first 48 bits of the UUID,
    then the 12 bits after the version digit.
    """
    digits = uuid_text.replace("-", "")
    if len(digits) != 32 or digits[12] != "6":
        return None
    try:
        ticks = int(digits[:12] + digits[13:16], 16)
        return _UUID_EPOCH + timedelta(microseconds=ticks // 10)
    except (ValueError, OverflowError):
        return None
