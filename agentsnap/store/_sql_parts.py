"""Parts of distributed snapshots and agent leases: the ``DistributedParts`` role."""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime

from sqlalchemy import delete, or_, select

from agentsnap.records import AgentLease, SnapshotPart, utcnow
from agentsnap.store._sql_base import _PART_BODY, SqlBase, _agent_leases, _parts, retried

__all__ = ["SqlParts"]


class SqlParts(SqlBase):
    """Parts of distributed snapshots and agent leases: the ``DistributedParts`` role."""

    @retried("write a snapshot part")
    async def save_snapshot_part(self, part: SnapshotPart) -> None:
        await self._gate.wait()
        body = part.model_dump(mode="json", include=_PART_BODY)
        async with self._begin() as conn:
            await self._require_run(conn, part.run_id)
            await conn.execute(
                delete(_parts).where(
                    _parts.c.run_id == part.run_id,
                    _parts.c.seq == part.seq,
                    _parts.c.worker == part.worker,
                )
            )
            await conn.execute(
                _parts.insert().values(
                    run_id=part.run_id,
                    seq=part.seq,
                    worker=part.worker,
                    body=body,
                    error=part.error,
                    written_at=part.written_at,
                )
            )

    @retried("delete the parts of old snapshots")
    async def delete_snapshot_parts(self, run_id: str, below: int) -> int:
        await self._gate.wait()
        async with self._begin() as conn:
            await self._require_run(conn, run_id)
            result = await conn.execute(
                delete(_parts).where(_parts.c.run_id == run_id, _parts.c.seq < below)
            )
            return int(result.rowcount)

    @retried("read the parts of a snapshot")
    async def load_snapshot_parts(self, run_id: str, seq: int) -> list[SnapshotPart]:
        rows = await self._run_rows(
            run_id,
            select(_parts)
            .where(_parts.c.run_id == run_id, _parts.c.seq == seq)
            .order_by(_parts.c.worker),
        )
        return [
            SnapshotPart.model_validate(
                {
                    **row.body,
                    "run_id": row.run_id,
                    "seq": row.seq,
                    "worker": row.worker,
                    "error": row.error,
                    "written_at": row.written_at,
                }
            )
            for row in rows
        ]

    @retried("claim agents")
    async def claim_agents(
        self, run_id: str, owner: str, agents: Collection[str], expires_at: datetime
    ) -> list[AgentLease]:
        await self._gate.wait()
        now = utcnow()
        names = sorted(set(agents))
        try:
            await self._claim_agents(run_id, owner, names, expires_at, now)
        except _Refused as refused:
            return refused.held
        return []

    async def _claim_agents(
        self, run_id: str, owner: str, names: list[str], expires_at: datetime, now: datetime
    ) -> None:
        async with self._begin() as conn:
            await self._require_run(conn, run_id)
            refused: list[str] = []
            for agent in names:  # in one order, so that two claimants never deadlock
                inserted = await conn.execute(
                    self._insert_ignore(_agent_leases, ["run_id", "agent"])
                    .values(run_id=run_id, agent=agent, owner=owner, expires_at=expires_at)
                    .execution_options(preserve_rowcount=True)
                )
                if inserted.rowcount == 1:
                    continue
                # PostgreSQL re-checks the condition on the newest row version after
                # waiting for a concurrent claim, so one of two claimants wins.
                updated = await conn.execute(
                    _agent_leases.update()
                    .where(
                        _agent_leases.c.run_id == run_id,
                        _agent_leases.c.agent == agent,
                        or_(_agent_leases.c.owner == owner, _agent_leases.c.expires_at <= now),
                    )
                    .values(owner=owner, expires_at=expires_at)
                )
                if updated.rowcount != 1:
                    refused.append(agent)
            if not refused:
                return
            rows = await conn.execute(
                select(_agent_leases).where(
                    _agent_leases.c.run_id == run_id, _agent_leases.c.agent.in_(refused)
                )
            )
            held = [
                AgentLease(
                    run_id=row.run_id, agent=row.agent, owner=row.owner, expires_at=row.expires_at
                )
                for row in rows
            ]
            # All or none: raised out of the transaction, which lets the claims above go.
            raise _Refused(sorted(held, key=lambda lease: lease.agent))

    @retried("release agents")
    async def release_agents(self, run_id: str, owner: str) -> None:
        await self._gate.wait()
        now = utcnow()
        async with self._begin() as conn:
            await conn.execute(
                _agent_leases.update()
                .where(
                    _agent_leases.c.run_id == run_id,
                    _agent_leases.c.owner == owner,
                    _agent_leases.c.expires_at > now,
                )
                .values(expires_at=now)
            )

    @retried("list agent leases")
    async def list_agent_leases(self, run_id: str) -> list[AgentLease]:
        await self._gate.wait()
        async with self._engine.connect() as conn:
            rows = await conn.execute(
                select(_agent_leases)
                .where(_agent_leases.c.run_id == run_id)
                .order_by(_agent_leases.c.agent)
            )
            return [
                AgentLease(
                    run_id=row.run_id, agent=row.agent, owner=row.owner, expires_at=row.expires_at
                )
                for row in rows
            ]


class _Refused(Exception):
    """Some agents claimed are held by another owner: the claim's transaction is undone."""

    def __init__(self, held: list[AgentLease]) -> None:
        super().__init__(f"{len(held)} agents held by others")
        self.held = held
