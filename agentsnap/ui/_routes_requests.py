"""The inspector's routes over requests to people: listing them and answering one."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

from fastapi import APIRouter, Body, HTTPException, Query
from pydantic import BaseModel, Field

from agentsnap.inspect import answer, list_requests, resolve_run
from agentsnap.ui._wire import request_view

if TYPE_CHECKING:
    from agentsnap.ui._inspector import Inspector


class AnswerRequest(BaseModel):
    """The body of an answer to a request to a person."""

    answer: Any = Field(default=None, description="The answer to a question, as JSON.")
    approve: bool | None = Field(
        default=None,
        description="For an approval: approve (true) or deny (false); false turns a question down.",
    )
    reason: str | None = Field(
        default=None, description="Why; a denial's reason reaches the agent."
    )
    by: str | None = Field(default=None, description="Who answers, recorded with the answer.")


def requests_router(inspector: Inspector) -> APIRouter:
    """Requests to people, of every run or of one, and answering one (when allowed)."""
    router = APIRouter()
    store = inspector.store
    ledger = inspector.ledger

    @router.get("/api/requests", summary="Requests to people, of every run")
    async def all_requests(
        pending: Annotated[bool, Query(description="Only those that wait.")] = False,
    ) -> dict[str, Any]:
        found = await list_requests(store, None, pending=pending, ledger=ledger)
        return {"requests": [request_view(r) for r in found], "can_answer": inspector.allow_answer}

    @router.get("/api/runs/{run}/requests", summary="The run's requests to people, oldest first")
    async def run_requests(
        run: str,
        pending: Annotated[bool, Query(description="Only those that wait.")] = False,
    ) -> dict[str, Any]:
        found = await resolve_run(store, run)
        listed = await list_requests(store, found.id, pending=pending, ledger=ledger)
        return {"requests": [request_view(r) for r in listed], "can_answer": inspector.allow_answer}

    @router.post("/api/requests/{request_id}/answer", summary="Answer a request to a person")
    async def answer_one(
        request_id: str, request: Annotated[AnswerRequest, Body()]
    ) -> dict[str, Any]:
        if not inspector.allow_answer:
            raise HTTPException(
                403, "answering is off: start the inspector with `agentsnap ui --allow-answer`"
            )
        done = await answer(
            store,
            request_id,
            request.answer,
            approve=request.approve,
            reason=request.reason,
            by=request.by,
            ledger=ledger,
        )
        return {"request": request_view(done)}

    return router
