"""Run leases by compare-and-set, and fencing: the ``RunLeases`` role."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Insert, Update

from agentsnap.records import RunLease, utcnow
from agentsnap.store._sql_base import SqlBase, _leases, retried

__all__ = ["SqlLeases"]


class SqlLeases(SqlBase):
    """Run leases by compare-and-set, and fencing: the ``RunLeases`` role."""

    @retried("read a lease")
    async def get_lease(self, run_id: str) -> RunLease | None:
        return await self._run_lease(run_id)

    async def take_lease(
        self, run_id: str, owner: str, expires_at: datetime, *, replacing: int | None
    ) -> RunLease | None:
        return await self.retrying(
            "take the lease of run {0}",
            self._take_lease,
            run_id,
            owner,
            expires_at,
            replacing,
        )

    async def _take_lease(
        self, again: bool, run_id: str, owner: str, expires_at: datetime, replacing: int | None
    ) -> RunLease | None:
        await self._gate.wait()
        token = 1 if replacing is None else replacing + 1
        if again:
            held = await self.get_lease(run_id)
            if held is not None and held.owner == owner and held.token == token:
                return held  # the attempt before took it, though its answer was lost
        values = {"owner": owner, "token": token, "expires_at": expires_at, "renewed_at": utcnow()}
        async with self._begin() as conn:
            await self._require_run(conn, run_id)
            statement: Insert | Update
            if replacing is None:
                statement = (
                    self._insert_ignore(_leases, ["run_id"])
                    .values(run_id=run_id, **values)
                    .execution_options(preserve_rowcount=True)
                )
            else:
                # PostgreSQL re-checks the token on the newest row version after waiting
                # for a concurrent takeover, so only one of two racers changes the row.
                statement = (
                    _leases.update()
                    .where(_leases.c.run_id == run_id, _leases.c.token == replacing)
                    .values(**values)
                )
            if (await conn.execute(statement)).rowcount != 1:
                return None
        return RunLease(run_id=run_id, owner=owner, token=token, expires_at=expires_at)

    @retried("renew a lease")
    async def renew_lease(self, run_id: str, token: int, expires_at: datetime) -> bool:
        return await self._set_lease(run_id, token, expires_at)

    @retried("release a lease")
    async def release_lease(self, run_id: str, token: int) -> None:
        await self._set_lease(run_id, token, None)

    async def _set_lease(self, run_id: str, token: int, expires_at: datetime | None) -> bool:
        await self._gate.wait()
        now = utcnow()
        async with self._begin() as conn:
            result = await conn.execute(
                _leases.update()
                .where(_leases.c.run_id == run_id, _leases.c.token == token)
                .values(expires_at=expires_at or now, renewed_at=now)
            )
            return bool(result.rowcount == 1)

    def fence(self, run_id: str, token: int) -> None:
        self._fences[run_id] = token
