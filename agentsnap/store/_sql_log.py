"""A run's journal and replay log: the ``RunLog`` role."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from agentsnap.exceptions import StoreError
from agentsnap.liveness import lost
from agentsnap.records import JournalSegment, ReplaySegment
from agentsnap.store import _postgres_writes as one_statement
from agentsnap.store._sql_base import SqlBase, _check_limit, _journal, _replay, retried

__all__ = ["SqlLog"]


_SEGMENT = (
    _journal.c.src,
    _journal.c.dst,
    _journal.c.event,
    _journal.c.first_seq,
    _journal.c.last_seq,
    _journal.c.entries,
)
"""A journal row's columns that make a ``JournalSegment``, in its fields' order."""


class SqlLog(SqlBase):
    """A run's journal and replay log: the ``RunLog`` role."""

    async def append_journal(self, run_id: str, segments: Sequence[JournalSegment]) -> None:
        if not segments:
            return
        await self.retrying(
            "write journal segments of run {0}",
            self._append_journal,
            run_id,
            segments,
        )

    async def _append_journal(
        self, again: bool, run_id: str, segments: Sequence[JournalSegment]
    ) -> None:
        await self._gate.wait()
        first = segments[0]
        if again and await self._stored(
            _journal.c.run_id == run_id,
            _journal.c.src == first.src,
            _journal.c.dst == first.dst,
            _journal.c.event == first.event,
            _journal.c.first_seq == first.first_seq,
        ):
            return  # written in one transaction with the rest, which its answer did not say
        if self._autocommit is not None:
            await self._append_journal_statement(run_id, segments)
            return
        async with self._begin() as conn:
            await self._require_run(conn, run_id)
            await conn.execute(
                _journal.insert(),
                [
                    {
                        "run_id": run_id,
                        "src": segment.src,
                        "dst": segment.dst,
                        "event": segment.event,
                        "first_seq": segment.first_seq,
                        "last_seq": segment.last_seq,
                        "entries": segment.entries,
                    }
                    for segment in segments
                ],
            )
            await self._check_fence(conn, run_id)

    async def _append_journal_statement(
        self, run_id: str, segments: Sequence[JournalSegment]
    ) -> None:
        """Append with one statement (PostgreSQL), which a missing run's foreign key refuses."""
        values = one_statement.journal_values(run_id, segments)
        token = self._fences.get(run_id)
        sql = one_statement.JOURNAL
        if token is not None:
            values = (*values, run_id, token)
            sql = one_statement.JOURNAL_FENCED
        try:
            changed, _ = await self._one_statement(sql, values)
        except StoreError as exc:
            if isinstance(exc.__cause__, IntegrityError):
                await self._explain_missing_run(run_id)
            raise
        if changed == 0:
            await self._explain_missing_run(run_id)
            assert token is not None
            raise lost(run_id, token, await self._holder(run_id))

    @retried("load the journal")
    async def load_journal(self, run_id: str) -> list[JournalSegment]:
        rows = await self._run_rows(
            run_id, select(*_SEGMENT).where(_journal.c.run_id == run_id).order_by(_journal.c.pos)
        )
        return [JournalSegment(*row) for row in rows]

    @retried("load the journal")
    async def load_journal_page(
        self, run_id: str, *, after: int = 0, limit: int = 1000
    ) -> list[tuple[int, JournalSegment]]:
        _check_limit(limit)
        rows = await self._run_rows(
            run_id,
            select(_journal.c.pos, *_SEGMENT)
            .where(_journal.c.run_id == run_id, _journal.c.pos > after)
            .order_by(_journal.c.pos)
            .limit(limit),
        )
        return [(row[0], JournalSegment(*row[1:])) for row in rows]

    async def append_replay(self, run_id: str, segment: ReplaySegment) -> None:
        await self.retrying(
            "write the replay log of run {0}",
            self._append_replay,
            run_id,
            segment,
        )

    async def _append_replay(self, again: bool, run_id: str, segment: ReplaySegment) -> None:
        await self._gate.wait()
        if again and await self._last_replay(run_id) == segment:
            return  # the attempt before was committed, though its answer was lost
        token = self._fences.get(run_id)
        sql = self._statements
        body = segment.body
        values: tuple[Any, ...] = (run_id, run_id, segment.timeline, body)
        if token is not None:
            values = (*values, run_id, token)
        statement = sql.replay if token is None else sql.replay_fenced
        try:
            if self._writer is not None:
                assert self._write_lock is not None
                async with self._write_lock:
                    changed = await self._writer.execute(statement, values)
            elif self._autocommit is not None:
                changed, _ = await self._one_statement(statement, values)
            else:
                async with self._begin() as conn:
                    changed = (await conn.exec_driver_sql(statement, values)).rowcount
        except StoreError as exc:
            if isinstance(exc.__cause__, (IntegrityError, sqlite3.IntegrityError)):
                await self._explain_missing_run(run_id)
            raise
        if changed != 1:
            await self._explain_missing_run(run_id)
            assert token is not None
            raise lost(run_id, token, await self._holder(run_id))

    async def _last_replay(self, run_id: str) -> ReplaySegment | None:
        row = await self._row(
            select(_replay.c.timeline, _replay.c.body)
            .where(_replay.c.run_id == run_id)
            .order_by(_replay.c.position.desc())
            .limit(1)
        )
        return None if row is None else ReplaySegment(row.timeline, row.body)

    @retried("load the replay log")
    async def load_replay(self, run_id: str) -> list[ReplaySegment]:
        rows = await self._run_rows(
            run_id,
            select(_replay.c.timeline, _replay.c.body)
            .where(_replay.c.run_id == run_id)
            .order_by(_replay.c.position),
        )
        return [ReplaySegment(row.timeline, row.body) for row in rows]

    async def _holder(self, run_id: str) -> tuple[str, int] | None:
        """Who holds the run's lease now: whom a refused append names."""
        lease = await self.retrying("read a lease", lambda _again: self._run_lease(run_id))
        return None if lease is None else (lease.owner, lease.token)
