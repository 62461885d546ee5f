"""Snapshots written whole and read back checked: the snapshot half of the ``RunStore`` role."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    ColumnElement,
    CompoundSelect,
    FromClause,
    Select,
    Text,
    literal_column,
    select,
    type_coerce,
    union_all,
)
from sqlalchemy.engine import Row
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from agentsnap.exceptions import NotFoundError, StoreError
from agentsnap.integrity import SnapshotReader
from agentsnap.liveness import lost
from agentsnap.records import Snapshot
from agentsnap.store import _postgres_writes as one_statement
from agentsnap.store._bases import AgentRow
from agentsnap.store._sql_base import (
    _KNOWN_BLOBS_MAX,
    _KNOWN_CHUNKS_MAX,
    _PAGE,
    SqlBase,
    _agents,
    _counters,
    _dumps,
    _messages,
    _snapshots,
    retried,
)
from agentsnap.store.chunks import ChunkWrites, StateLoader
from agentsnap.store.sqlite_writer import SnapshotRows

__all__ = ["SqlSnapshots"]


class SqlSnapshots(SqlBase):
    """Snapshots written whole and read back checked: the snapshot half of the ``RunStore`` role."""

    async def save_snapshot(self, snapshot: Snapshot) -> None:
        await self._saving(
            "write snapshot {0.seq} of run {0.run_id}",
            snapshot,
            self._save_snapshot,
            _snapshots.c.id,
        )

    async def _save_snapshot(self, snapshot: Snapshot) -> None:
        try:
            await self._write_snapshot(snapshot)
        except StoreError as exc:
            if not isinstance(exc.__cause__, (IntegrityError, sqlite3.IntegrityError)):
                raise
            await self._explain_refusal(snapshot)
            if not self._known_blobs and snapshot.run_id not in self._bases:
                raise
            # A state this store knew to be stored, or the base snapshot, may have been
            # deleted since (with the runs that referred to it): send every state and chunk
            # again, and every agent row, once.
            self._known_blobs.clear()
            self._known_chunks.clear()
            self._bases.clear()
            await self._write_snapshot(snapshot)

    async def _write_snapshot(self, snapshot: Snapshot) -> None:
        """Write the snapshot's rows in one transaction, with the states not known stored.

        A long state goes in as its row and its chunks (see
        [`agentsnap.store.chunks`][agentsnap.store.chunks]), which the write sends after the
        agents' rows and checks in the same transaction. A snapshot that changes little
        since its run's base holds only the agent rows that differ (see the module's
        description).
        """
        known = self._known_blobs
        chunks = ChunkWrites(self._known_chunks, self._mark, self._split_memo)
        new = {
            cut.state_hash: cut.state_json
            for cut in snapshot.agents.values()
            if cut.state_hash not in known
        }
        plan = self._bases.plan(snapshot, self._agent_rows(snapshot))
        rows = SnapshotRows(
            snapshot=(
                snapshot.id,
                snapshot.run_id,
                snapshot.seq,
                snapshot.initiator,
                snapshot.status.value,
                self._when(snapshot.started_at),
                self._when(snapshot.completed_at),
                snapshot.error,
                plan.base_id,
                plan.agent_rows,
            ),
            blobs=[(state_hash, *chunks.add(text)) for state_hash, text in new.items()],
            agents=plan.rows,
            messages=[
                (
                    snapshot.id,
                    channel.src,
                    channel.dst,
                    message.seq,
                    message.kind,
                    _dumps(message.payload),
                    _dumps(message.headers),
                    message.epoch,
                )
                for channel in snapshot.channels
                for message in channel.messages
            ],
            fence=self._fence_of(snapshot.run_id),
            chunks=chunks if chunks else None,
        )
        if self._writer is not None:
            assert self._write_lock is not None
            async with self._write_lock:
                await self._writer.write(rows)
        elif self._autocommit is not None:
            await self._write_statement(rows)
        else:
            await self._write_rows(rows)
        # Only now, committed: another snapshot with these states need not send them again,
        # nor one of this run the agent rows it shares with a new base.
        self._bases.committed(plan)
        if len(known) > _KNOWN_BLOBS_MAX:
            known.clear()
        known.update(new)
        if chunks:
            chunks.committed(_KNOWN_CHUNKS_MAX)

    def _agent_rows(self, snapshot: Snapshot) -> list[AgentRow]:
        """The snapshot's ``agentsnap_snapshot_agents`` rows, one per process.

        A process's part that is the same object as in the snapshot written before (the
        coordinator reuses the part of a process nothing happened to) reuses its counters'
        JSON.
        """
        texts = self._counter_texts
        if len(texts) > _KNOWN_BLOBS_MAX:
            texts.clear()
        rows = []
        snapshot_id = snapshot.id
        for name, cut in snapshot.agents.items():
            held = texts.get(name)
            if held is None or held[0] is not cut:
                held = texts[name] = (cut, _counters(cut.sent), _counters(cut.received))
            rows.append((snapshot_id, name, cut.state_hash, held[1], held[2], cut.state_version))
        return rows

    async def _write_rows(self, rows: SnapshotRows) -> None:
        # The rows go straight to the driver, prepared: per-row work in SQLAlchemy would cost
        # more than the database does.
        sql = self._statements
        async with self._begin() as conn:
            await conn.exec_driver_sql(sql.snapshot, rows.snapshot)
            if rows.fence is not None:
                await self._check_fence(conn, rows.fence[0])
            if rows.blobs:
                await conn.exec_driver_sql(sql.blobs, rows.blobs)
            if rows.agents:
                await conn.exec_driver_sql(sql.agents, rows.agents)
            if rows.messages:
                await conn.exec_driver_sql(sql.messages, rows.messages)
            if rows.chunks is not None:
                await rows.chunks.write_async(conn)

    async def _write_statement(self, rows: SnapshotRows) -> None:
        """Write the snapshot's rows with one statement (PostgreSQL).

        When a chunk the states rely on is gone, nothing is written: the transaction then
        writes the snapshot with every chunk of its states.
        """
        chunks = rows.chunks
        values = one_statement.snapshot_values(
            rows.snapshot,
            rows.blobs,
            rows.agents,
            rows.messages,
            [] if chunks is None else chunks.rows,
            [] if chunks is None else chunks.relied,
            rows.fence,
        )
        sql = one_statement.SNAPSHOT if rows.fence is None else one_statement.SNAPSHOT_FENCED
        _, found = await self._one_statement(sql, values)
        assert found is not None
        if found[0]:
            return
        if not found[1]:
            await self._write_rows(rows)
            return
        assert rows.fence is not None  # refused with its chunks there: by the fence only
        run_id, fence = rows.fence
        owner, token = found[2], found[3]
        raise lost(run_id, fence, None if token is None else (str(owner), int(token)))

    async def _explain_refusal(self, snapshot: Snapshot) -> None:
        """Turn a constraint violation into what it means, when it is a known one."""
        async with self._engine.connect() as conn:
            await self._require_run(conn, snapshot.run_id)
            clash = await conn.scalar(
                select(_snapshots.c.id).where(
                    (_snapshots.c.id == snapshot.id)
                    | (
                        (_snapshots.c.run_id == snapshot.run_id)
                        & (_snapshots.c.seq == snapshot.seq)
                    )
                )
            )
        if clash is not None:
            raise StoreError(
                f"snapshot {snapshot.id} (number {snapshot.seq} of run {snapshot.run_id}) "
                "is already stored"
            )

    @retried("list snapshots")
    async def list_snapshots(self, run_id: str) -> list[Snapshot]:
        await self._gate.wait()
        async with self._engine.connect() as conn:
            rows = await self._snapshot_rows(conn, run_id)
            return await self._assemble(conn, [row._mapping for row in rows])

    async def _snapshot_rows(
        self, conn: AsyncConnection, run_id: str, after_seq: int = 0, limit: int | None = None
    ) -> Sequence[Row[Any]]:
        """The snapshot rows of a run after ``after_seq``, in order (``limit`` of them)."""
        await self._require_run(conn, run_id)
        query = (
            select(_snapshots)
            .where(_snapshots.c.run_id == run_id, _snapshots.c.seq > after_seq)
            .order_by(_snapshots.c.seq)
        )
        return (await conn.execute(query if limit is None else query.limit(limit))).all()

    @retried("load a snapshot")
    async def load_snapshot(self, snapshot_id: str) -> Snapshot:
        await self._gate.wait()
        async with self._engine.connect() as conn:
            row = (
                await conn.execute(select(_snapshots).where(_snapshots.c.id == snapshot_id))
            ).one_or_none()
            if row is None:
                raise NotFoundError("snapshot", snapshot_id)
            (snapshot,) = await self._assemble(conn, [row._mapping])
            return snapshot

    async def _assemble(self, conn: AsyncConnection, rows: Sequence[Any]) -> list[Snapshot]:
        """The snapshots of these snapshot rows, each checked as it is read.

        A snapshot whose rows are missing or unreadable comes back damaged, with the reason
        (see [`agentsnap.integrity`][agentsnap.integrity]), never as an error. Counters,
        payloads and headers are read as the text stored, so the reader sees text that is
        not JSON; each distinct state is read once.
        """
        if not rows:
            return []
        reader = SnapshotReader()
        states = StateLoader()
        for start in range(0, len(rows), _PAGE):
            await self._read_parts(conn, reader, rows[start : start + _PAGE], states)
        return [reader.snapshot(row) for row in rows]

    async def _read_parts(
        self,
        conn: AsyncConnection,
        reader: SnapshotReader,
        rows: Sequence[Any],
        states: StateLoader | None = None,
    ) -> None:
        """Give ``reader`` the cuts, states and messages in flight of these snapshot rows.

        A snapshot stored as the changes to a base gets its own agent rows and, for every
        other process, the base's row (in the database's order of the agents' names, as a
        full snapshot's rows come). States already given to the reader are not read again.
        """
        states = states or StateLoader()
        ids = [row["id"] for row in rows]
        own = select(
            _agents.c.snapshot_id, *_cut_columns(_agents), literal_column("1").label("own")
        ).where(_agents.c.snapshot_id.in_(ids))
        query: Select[Any] | CompoundSelect[Any] = own
        deltas = {row["id"]: row for row in rows if row["base_id"] is not None}
        if deltas:
            based = _agents.alias("based")
            kept = _agents.alias("kept")
            inherited = (
                select(_snapshots.c.id, *_cut_columns(based), literal_column("0"))
                .join(based, based.c.snapshot_id == _snapshots.c.base_id)
                .where(
                    _snapshots.c.id.in_(list(deltas)),
                    ~select(literal_column("1"))
                    .where(kept.c.snapshot_id == _snapshots.c.id, kept.c.agent == based.c.agent)
                    .exists(),
                )
            )
            query = union_all(own, inherited)
        columns = query.selected_columns
        cuts = (await conn.execute(query.order_by(columns.snapshot_id, columns.agent))).all()
        loaded = await states.load(conn, reader.wanted(cut.state_hash for cut in cuts))
        for state_hash, state in loaded.texts.items():
            reader.blob(state_hash, state)
        for state_hash, problem in loaded.problems.items():
            reader.unreadable(state_hash, problem)
        del loaded
        held = dict.fromkeys(deltas, 0)
        for cut in cuts:
            reader.cut(
                cut.snapshot_id,
                cut.agent,
                cut.state_hash,
                cut.sent,
                cut.received,
                state_version=cut.state_version,
            )
            if cut.own and cut.snapshot_id in held:
                held[cut.snapshot_id] += 1
        for snapshot_id, count in held.items():
            delta = deltas[snapshot_id]
            if count != delta["agent_rows"]:
                reader.problem(
                    snapshot_id,
                    f"it holds {count} agent rows of its own where {delta['agent_rows']} were "
                    f"written (it is stored as the changes to snapshot {delta['base_id']})",
                )
        messages = await conn.execute(
            select(
                _messages.c.snapshot_id,
                _messages.c.src,
                _messages.c.dst,
                _messages.c.seq,
                _messages.c.kind,
                type_coerce(_messages.c.payload, Text()).label("payload"),
                type_coerce(_messages.c.headers, Text()).label("headers"),
                _messages.c.epoch,
            )
            .where(_messages.c.snapshot_id.in_(ids))
            .order_by(_messages.c.snapshot_id, _messages.c.src, _messages.c.dst, _messages.c.seq)
        )
        for m in messages:
            reader.message(
                m.snapshot_id, m.src, m.dst, m.seq, m.kind, m.payload, m.headers, m.epoch
            )


def _cut_columns(agents: FromClause) -> list[ColumnElement[Any]]:
    """The columns of an agent row (of ``agents``, the table or an alias of it) that make
    its cut: the agent, its state's hash, its counters (as JSON text) and its state's version.
    """  # noqa: D205
    return [
        agents.c.agent,
        agents.c.state_hash,
        type_coerce(agents.c.sent, Text()).label("sent"),
        type_coerce(agents.c.received, Text()).label("received"),
        agents.c.state_version,
    ]
