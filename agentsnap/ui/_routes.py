"""The inspector's routes kept apart from the server module, gathered in one router."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import APIRouter

from agentsnap.ui._routes_compare import compare_router
from agentsnap.ui._routes_events import events_router
from agentsnap.ui._routes_resolve import resolve_router
from agentsnap.ui._routes_timeline import timeline_router

if TYPE_CHECKING:
    from agentsnap.ledger import Ledger
    from agentsnap.store import Store
    from agentsnap.ui._actions import Actions

__all__ = ["inspector_routes"]


def inspector_routes(
    store: Store,
    actions: Actions,
    *,
    ledger: Ledger | None = None,
) -> APIRouter:
    """The event history, resolving unknown tool outcomes, fork comparison, incidents."""
    router = APIRouter()
    router.include_router(events_router(store, ledger=ledger))
    router.include_router(resolve_router(store, actions, ledger=ledger))
    router.include_router(compare_router(store, ledger=ledger))
    router.include_router(timeline_router(store, ledger=ledger))
    return router
