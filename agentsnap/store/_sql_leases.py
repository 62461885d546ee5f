"""Run leases by compare-and-set, fencing, and each run's history of owners."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from sqlalchemy import Insert, Update, exists, insert, literal, select
from sqlalchemy.ext.asyncio import AsyncConnection

from agentsnap.records import RunLease, RunOwner, utcnow
from agentsnap.store._sql_base import SqlBase, _leases, _owners, retried

__all__ = ["SqlLeases"]


class _Lost(Exception):
    """The lease was not as the caller saw it: the transaction is rolled back."""


def _end_owner(
    run_id: str, token: int, how: Literal["released", "taken_over"], now: datetime
) -> Update:
    """End the history of the owner with ``token``, if it has not ended yet.

    Its last renewal is the lease's, read in the same statement (before a takeover
    changes the lease).
    """
    last = (
        select(_leases.c.renewed_at)
        .where(_leases.c.run_id == run_id, _leases.c.token == token)
        .scalar_subquery()
    )
    return (
        _owners.update()
        .where(_owners.c.run_id == run_id, _owners.c.token == token, _owners.c.ended_at.is_(None))
        .values(ended_at=now, ended=how, last_renewed_at=last)
    )


class SqlLeases(SqlBase):
    """Run leases by compare-and-set, fencing, and each run's history of owners: the
    ``RunLeases`` role, and ``list_run_owners`` of ``RunQueries``.
    """  # noqa: D205

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
        now = utcnow()
        values = {"owner": owner, "token": token, "expires_at": expires_at, "renewed_at": now}
        try:
            async with self._begin() as conn:
                await self._require_run(conn, run_id)
                if self._backend == "postgresql":
                    # One statement: the lease, the end of the owner it replaces and the new
                    # owner's entry, each only if the compare-and-set took the lease.
                    taken = self._take_and_record(run_id, replacing, values, now)
                    if (await conn.execute(taken)).first() is None:
                        raise _Lost
                else:
                    await self._take_then_record(conn, run_id, replacing, values, now)
        except _Lost:
            return None
        return RunLease(run_id=run_id, owner=owner, token=token, expires_at=expires_at)

    def _lease_write(
        self, run_id: str, replacing: int | None, values: dict[str, Any]
    ) -> Insert | Update:
        if replacing is None:
            return (
                self._insert_ignore(_leases, ["run_id"])
                .values(run_id=run_id, **values)
                .execution_options(preserve_rowcount=True)
            )
        # PostgreSQL re-checks the token on the newest row version after waiting for a
        # concurrent takeover, so only one of two racers changes the row.
        return (
            _leases.update()
            .where(_leases.c.run_id == run_id, _leases.c.token == replacing)
            .values(**values)
        )

    def _take_and_record(
        self,
        run_id: str,
        replacing: int | None,
        values: dict[str, Any],
        now: datetime,
    ) -> Insert:
        taken = (
            self._lease_write(run_id, replacing, values).returning(_leases.c.run_id).cte("taken")
        )
        statement = insert(_owners).from_select(
            ["run_id", "token", "owner", "acquired_at"],
            select(
                taken.c.run_id,
                literal(values["token"], _owners.c.token.type),
                literal(values["owner"], _owners.c.owner.type),
                literal(now, _owners.c.acquired_at.type),
            ),
        )
        if replacing is not None:
            # Every part of the statement sees the lease as it was before it: the replaced
            # owner's last renewal.
            ended = (
                _end_owner(run_id, replacing, "taken_over", now)
                .where(exists(select(taken.c.run_id)))
                .cte("ended")
            )
            statement = statement.add_cte(ended)
        return statement.returning(_owners.c.token)

    async def _take_then_record(
        self,
        conn: AsyncConnection,
        run_id: str,
        replacing: int | None,
        values: dict[str, Any],
        now: datetime,
    ) -> None:
        if replacing is not None:
            # The replaced owner's entry ends first, while the lease still shows its last
            # renewal; a lost race below rolls it back.
            await conn.execute(_end_owner(run_id, replacing, "taken_over", now))
        if (await conn.execute(self._lease_write(run_id, replacing, values))).rowcount != 1:
            raise _Lost
        await conn.execute(
            insert(_owners).values(
                run_id=run_id, token=values["token"], owner=values["owner"], acquired_at=now
            )
        )

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
            if expires_at is None:
                # A release ends the owner's history, unless a takeover ended it already.
                await conn.execute(_end_owner(run_id, token, "released", now))
            result = await conn.execute(
                _leases.update()
                .where(_leases.c.run_id == run_id, _leases.c.token == token)
                .values(expires_at=expires_at or now, renewed_at=now)
            )
            return bool(result.rowcount == 1)

    @retried("read a run's owners")
    async def list_run_owners(self, run_id: str) -> list[RunOwner]:
        await self._gate.wait()
        async with self._engine.connect() as conn:
            rows = (
                await conn.execute(
                    select(_owners).where(_owners.c.run_id == run_id).order_by(_owners.c.token)
                )
            ).all()
            if not rows:
                await self._require_run(conn, run_id)
        return [
            RunOwner(
                run_id=row.run_id,
                token=row.token,
                owner=row.owner,
                acquired_at=row.acquired_at,
                ended_at=row.ended_at,
                ended=row.ended,
                last_renewed_at=row.last_renewed_at,
            )
            for row in rows
        ]

    def fence(self, run_id: str, token: int) -> None:
        self._fences[run_id] = token
