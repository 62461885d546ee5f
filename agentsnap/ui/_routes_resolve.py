"""Resolving a tool call whose outcome is unknown, from the inspector.

A person checks the outside system (did the card get charged?) and records what they found,
as ``agentsnap tools resolve KEY`` does, with the same function
([`resolve`][agentsnap.ledger.resolve]):

* ``succeeded``: the effect happened; later calls with the key return ``result``;
* ``failed``: it did not; later calls fail with ``error``;
* ``retry``: it did not, and the next call with the key runs the tool again.

It is a write, under the rules of the other run actions (see
`agentsnap.ui._routes_actions`): the server must be started with
``--allow-run`` (without it the route answers 403 with the exact command, which
``GET .../resolution`` also gives the page to show), and the ``POST`` carries the server's
token. Only a call the ledger reports ``unknown`` is resolved.
"""

from __future__ import annotations

import json
import shlex
from typing import TYPE_CHECKING, Annotated, Any, Literal, Protocol

from fastapi import APIRouter, Body, HTTPException, Query, Request
from pydantic import BaseModel, Field

from agentsnap.inspect import ledger_calls, resolve_run
from agentsnap.ledger import ToolCallStatus, resolve
from agentsnap.store.ledger import ledger_for

if TYPE_CHECKING:
    from agentsnap.ledger import Ledger, LedgerEntry
    from agentsnap.store import Store

__all__ = ["Guard", "ResolveRequest", "resolve_command", "resolve_router"]

Outcome = Literal["succeeded", "failed", "retry"]


class Guard(Protocol):
    """What resolving needs of the run actions' rules (the server's ``Actions``)."""

    allow_run: bool
    """Whether the server was started with ``--allow-run``."""
    database: str | None
    """The store's URL as a command may show it."""

    def check_token(self, request: Request) -> None:
        """Refuse a request that does not carry the server's token."""


class ResolveRequest(BaseModel):
    """The body of a resolution: the call's key and what the person found."""

    key: str = Field(description="The tool call's idempotency key.")
    outcome: Outcome = Field(
        description="succeeded: the effect happened (give result); failed: it did not (give "
        "error); retry: it did not, run the tool again at the next call."
    )
    result: Any = Field(default=None, description="What the tool returned, as JSON.")
    error: str | None = Field(default=None, description="What went wrong.")


def resolve_command(
    database: str | None,
    key: str,
    outcome: Outcome,
    *,
    result: Any = None,
    error: str | None = None,
    given: bool = False,
) -> str:
    """The ``agentsnap tools resolve`` command that records ``outcome`` for ``key``.

    With ``given``, the command carries ``result`` (as JSON) or ``error``; without, it has
    ``JSON`` or ``TEXT`` where they go.
    """
    parts = ["agentsnap", "tools", "resolve", key]
    if outcome == "succeeded":
        parts += ["--result", json.dumps(result) if given else "JSON"]
    elif outcome == "failed":
        parts += ["--error", (error or "") if given else "TEXT"]
    else:
        parts.append("--retry")
    if database is not None:
        parts += ["--db", database]
    return shlex.join(parts)


def resolve_router(store: Store, actions: Guard, *, ledger: Ledger | None = None) -> APIRouter:
    """The routes that resolve unknown tool outcomes of the runs in ``store``."""
    router = APIRouter()

    async def unknown_call(run: str, key: str) -> tuple[str, LedgerEntry]:
        found = await resolve_run(store, run)
        for entry in await ledger_calls(store, found.id, ledger):
            if entry.key == key:
                return found.id, entry
        raise HTTPException(404, f"run {found.id} made no tool call with key {key!r}")

    def commands(key: str) -> dict[str, str]:
        return {
            outcome: resolve_command(actions.database, key, outcome)
            for outcome in ("succeeded", "failed", "retry")
        }

    @router.get(
        "/api/runs/{run}/tools/resolution",
        summary="Whether a tool call can be resolved here, and the commands that do it",
    )
    async def resolution(
        run: str, key: Annotated[str, Query(description="The call's idempotency key.")]
    ) -> dict[str, Any]:
        _, entry = await unknown_call(run, key)
        return {
            "key": entry.key,
            "status": entry.status.value,
            "unknown": entry.status is ToolCallStatus.UNKNOWN,
            "allow_run": actions.allow_run,
            "commands": commands(entry.key),
        }

    @router.post("/api/runs/{run}/tools/resolve", summary="Resolve an unknown tool outcome")
    async def resolve_call(
        run: str, body: Annotated[ResolveRequest, Body()], request: Request
    ) -> dict[str, Any]:
        run_id, entry = await unknown_call(run, body.key)
        if not actions.allow_run:
            command = resolve_command(
                actions.database,
                entry.key,
                body.outcome,
                result=body.result,
                error=body.error,
                given=True,
            )
            raise HTTPException(
                403,
                "running is off: start the inspector with `agentsnap ui --allow-run`, or run "
                f"`{command}`",
            )
        actions.check_token(request)
        if entry.status is not ToolCallStatus.UNKNOWN:
            raise HTTPException(
                409,
                f"tool call {entry.key!r} is {entry.status.value}: only a call whose outcome "
                "is unknown is resolved",
            )
        if body.outcome == "failed" and not (body.error or "").strip():
            raise HTTPException(422, "say what went wrong (error) to record a failure")
        opened = ledger if ledger is not None else ledger_for(store, create=False)
        if opened is None:
            raise HTTPException(409, "this store keeps no ledger to record the outcome in")
        try:
            if body.outcome == "succeeded":
                done = await resolve(opened, entry.key, result=body.result)
            elif body.outcome == "failed":
                done = await resolve(opened, entry.key, error=body.error)
            else:
                done = await resolve(opened, entry.key, retry=True)
        finally:
            if opened is not ledger:
                await opened.close()
        return {
            "run_id": run_id,
            "key": done.key,
            "status": done.status.value,
            "result": done.result,
            "error": done.error,
        }

    return router
