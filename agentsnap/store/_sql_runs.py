"""Runs, rollbacks and state schemas: the rest of the ``RunStore`` role."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, Literal

from sqlalchemy import delete, select

from agentsnap.exceptions import NotFoundError
from agentsnap.messages import JsonValue
from agentsnap.records import RollbackInfo, RunInfo, RunStatus, utcnow
from agentsnap.store._sql_base import (
    _RUN_AND_LEASE,
    _rollbacks,
    _run,
    _runs,
    _schemas,
    _snapshots,
    _tags,
    _tags_of,
    retried,
)
from agentsnap.store._sql_snapshots import SqlSnapshots

__all__ = ["SqlRuns"]


class SqlRuns(SqlSnapshots):
    """Runs, rollbacks and state schemas: the rest of the ``RunStore`` role."""

    @retried("record run")
    async def create_run(self, run: RunInfo) -> None:
        await self._gate.wait()
        row = {
            "id": run.id,
            "created_at": run.created_at,
            "parent_run_id": run.parent_run_id,
            "parent_snapshot_id": run.parent_snapshot_id,
            "metadata": run.metadata,
            "status": run.status.value,
            "finished_at": run.finished_at,
            "name": run.name,
            "status_reason": run.status_reason,
        }
        async with self._begin() as conn:
            created = await conn.execute(self._insert_ignore(_runs, ["id"]).values(row))
            if created.rowcount and run.tags:
                await conn.execute(
                    _tags.insert(),
                    [{"run_id": run.id, "key": k, "value": v} for k, v in run.tags.items()],
                )

    @retried("record the run's status")
    async def finish_run(
        self,
        run_id: str,
        status: RunStatus,
        finished_at: datetime | None,
        reason: str | None = None,
    ) -> None:
        self._bases.forget(run_id)  # a run that ends needs no base; one resumed starts anew
        await self._update_run(
            run_id, status=status.value, finished_at=finished_at, status_reason=reason
        )

    @retried("record the run's tracebacks")
    async def save_traceback(self, run_id: str, traceback: str | None) -> None:
        await self._update_run(run_id, traceback=traceback)

    @retried("record a request to cancel the run")
    async def request_cancel(self, run_id: str, reason: str | None) -> None:
        await self._gate.wait()
        async with self._begin() as conn:  # not fenced: anyone may ask the owner to stop
            result = await conn.execute(
                _runs.update().where(_runs.c.id == run_id).values(cancel_requested=reason)
            )
            if result.rowcount == 0:
                raise NotFoundError("run", run_id)

    @retried("record the run's parent")
    async def set_parent(self, run_id: str, parent_run_id: str, parent_snapshot_id: str) -> None:
        await self._update_run(
            run_id, parent_run_id=parent_run_id, parent_snapshot_id=parent_snapshot_id
        )

    async def _update_run(self, run_id: str, **values: Any) -> None:
        await self._gate.wait()
        async with self._begin() as conn:
            result = await conn.execute(_runs.update().where(_runs.c.id == run_id).values(**values))
            if result.rowcount == 0:
                raise NotFoundError("run", run_id)
            await self._check_fence(conn, run_id)

    async def save_rollback(self, rollback: RollbackInfo) -> None:
        await self._saving("record rollback {0.id}", rollback, self._save_rollback, _rollbacks.c.id)

    async def _save_rollback(self, rollback: RollbackInfo) -> None:
        async with self._begin() as conn:
            await self._require_run(conn, rollback.run_id)
            found = await conn.scalar(
                select(_snapshots.c.id).where(_snapshots.c.id == rollback.snapshot_id)
            )
            if found is None:
                raise NotFoundError("snapshot", rollback.snapshot_id)
            await conn.execute(_rollbacks.insert().values(**rollback.model_dump()))
            await self._check_fence(conn, rollback.run_id)

    @retried("read rollbacks")
    async def list_rollbacks(self, run_id: str) -> list[RollbackInfo]:
        rows = await self._run_rows(
            run_id,
            select(_rollbacks)
            .where(_rollbacks.c.run_id == run_id)
            .order_by(_rollbacks.c.at, _rollbacks.c.id),
        )
        return [RollbackInfo.model_validate(dict(row._mapping)) for row in rows]

    @retried("record the state schemas of a run")
    async def save_state_schemas(
        self, run_id: str, schemas: Mapping[str, Mapping[str, JsonValue]]
    ) -> None:
        await self._gate.wait()
        async with self._begin() as conn:
            await self._require_run(conn, run_id)
            if schemas:
                names = list(schemas)
                await conn.execute(
                    delete(_schemas).where(_schemas.c.run_id == run_id, _schemas.c.agent.in_(names))
                )
                await conn.execute(
                    _schemas.insert(),
                    [
                        {"run_id": run_id, "agent": name, "json_schema": dict(schema)}
                        for name, schema in schemas.items()
                    ],
                )
            await self._check_fence(conn, run_id)

    @retried("read the state schemas of a run")
    async def load_state_schemas(self, run_id: str) -> dict[str, dict[str, JsonValue]]:
        rows = await self._run_rows(
            run_id,
            select(_schemas.c.agent, _schemas.c.json_schema)
            .where(_schemas.c.run_id == run_id)
            .order_by(_schemas.c.agent),
        )
        return {row.agent: row.json_schema for row in rows}

    @retried("read a run")
    async def get_run(self, run_id: str) -> RunInfo:
        await self._gate.wait()
        async with self._engine.connect() as conn:
            row = (await conn.execute(_RUN_AND_LEASE.where(_runs.c.id == run_id))).one_or_none()
            if row is None:
                raise NotFoundError("run", run_id)
            tags = await _tags_of(conn, [run_id])
        return _run(row._mapping, utcnow(), tags.get(run_id))

    @retried("find ids")
    async def find_ids(
        self, kind: Literal["run", "snapshot"], prefix: str, limit: int = 10
    ) -> list[str]:
        await self._gate.wait()
        column = (_runs if kind == "run" else _snapshots).c.id
        query = select(column).where(column.startswith(prefix, autoescape=True))
        async with self._engine.connect() as conn:
            rows = await conn.execute(query.order_by(column).limit(limit))
            return [row[0] for row in rows]
