"""The inspector's what-if routes: fork a run from a snapshot (when allowed), bisect a run."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

from fastapi import APIRouter, Body, HTTPException
from pydantic import BaseModel, Field

from agentsnap.fork import MessageEdits, ToolsMode
from agentsnap.inspect import bisect_run, fork_run, resolve_run
from agentsnap.ui._wire import diff_view, run_view, snapshot_summary
from agentsnap.ui.conditions import Condition

if TYPE_CHECKING:
    from agentsnap.ui._inspector import Inspector


class ForkRequest(BaseModel):
    """The body of a fork: the snapshot to start from, edited states, the new run's name."""

    snapshot: str = Field(description="The snapshot to fork from (an id or a unique prefix).")
    states: dict[str, Any] = Field(
        default_factory=dict, description="New states of some agents, by agent name."
    )
    name: str | None = Field(default=None, description="The new run's name.")
    messages: MessageEdits = Field(
        default_factory=MessageEdits,
        description="Messages in flight to drop (by id), edit (new payloads by id) or add.",
    )
    tools: ToolsMode = Field(
        default="dry",
        description="dry: a what-if fork whose side-effecting calls are recorded and return "
        "the tools' stand-ins; live: they run for real when the fork is continued.",
    )


class BisectRequest(BaseModel):
    """The body of a bisect: a condition on ``{agent: state}`` that holds while all is well."""

    path: str = Field(description="JSONPath-style path, as in $.writer.memory.drafts")
    op: str = Field(description="exists == != < <= > >= len== len< len<= len> len>=")
    value: Any = Field(default=None, description="What the value found is compared with.")


def fork_router(inspector: Inspector) -> APIRouter:
    """Fork a run from a snapshot with edited states, and bisect a run on a condition."""
    router = APIRouter()
    store = inspector.store
    models = inspector.models

    @router.post("/api/runs/{run}/fork", status_code=201, summary="Fork a run from a snapshot")
    async def fork(run: str, request: Annotated[ForkRequest, Body()]) -> dict[str, Any]:
        if not inspector.allow_fork:
            raise HTTPException(
                403, "forking is off: start the inspector with `agentsnap ui --allow-fork`"
            )
        found = await resolve_run(store, run)
        snapshot = await inspector.in_run(found, request.snapshot)
        made = await fork_run(
            store,
            snapshot.id,
            states=request.states or None,
            name=request.name,
            models=models,
            messages=request.messages or None,
            tools=request.tools,
        )
        return {"run": run_view(made, *await inspector.counts(made))}

    @router.post("/api/runs/{run}/bisect", summary="The first snapshot where a condition fails")
    async def bisect(run: str, request: Annotated[BisectRequest, Body()]) -> dict[str, Any]:
        found = await resolve_run(store, run)
        condition = Condition.parse(request.path, request.op, request.value)
        result = await bisect_run(store, found.id, condition)
        diffed = None
        if result.first_bad is not None and result.last_good is not None:
            assert result.diff is not None
            diffed = diff_view(result.diff, result.last_good, result.first_bad)
        return {
            "first_bad": None if result.first_bad is None else snapshot_summary(result.first_bad),
            "last_good": None if result.last_good is None else snapshot_summary(result.last_good),
            "diff": diffed,
            "checked": result.checked,
            "holds_at_first": result.holds_at_first,
            "snapshots": result.snapshots,
        }

    return router
