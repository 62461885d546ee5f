"""The inspector's HTTP server: a FastAPI app over a store, read-only unless told otherwise.

[`create_app`][agentsnap.ui.server.create_app] gives the app; ``agentsnap ui`` serves it with
uvicorn. It answers the JSON API under ``/api`` (described at ``/docs`` and ``/openapi.json``),
serves the page at ``/`` and its files under ``/static``. All times on the wire are
microseconds since the Unix epoch (``*_us``), Lamport times are integers (``*_lc``); an error
is ``{"error": "what was wrong and what to do"}`` with a 4xx status. Names, payloads and
reasons that agents wrote are returned as data, never as markup. Each area of the API (runs,
snapshots, messages, tool and model calls, requests to people, fork and bisect, the run
actions) has its routes in a private module of its own, built over what they all share;
`create_app` wires them.

Nothing here imports or runs user code: a fork's edited states are checked against the JSON
schemas stored with the run, and bisect takes a condition (a path, an operator and a value,
see [`agentsnap.ui.conditions`][agentsnap.ui.conditions]) rather than a function. The only
requests that write are the fork, only when the app was created with ``allow_fork=True``,
and an answer to a request to a person, only with ``allow_answer=True``.

Example:
    ```python
    from fastapi.testclient import TestClient

    from agentsnap import MemoryStore
    from agentsnap.ui.server import create_app

    client = TestClient(create_app(MemoryStore()))
    print(client.get("/api/runs").json())  # {'runs': [], 'total': 0}
    ```
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING

try:
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import FileResponse, JSONResponse
    from fastapi.staticfiles import StaticFiles
    from starlette.exceptions import HTTPException as StarletteHTTPException
except ModuleNotFoundError as exc:  # pragma: no cover - depends on what is installed
    raise ModuleNotFoundError(
        f"the web inspector needs {exc.name}: pip install 'agentsnap[ui]'", name=exc.name
    ) from exc

from agentsnap.exceptions import (
    AgentsnapError,
    ConfigurationError,
    NotFoundError,
    SnapshotDamaged,
    StateInvalid,
)
from agentsnap.ui._inspector import Indexes, Inspector
from agentsnap.ui._live import LiveTokens
from agentsnap.ui._routes_actions import add_actions
from agentsnap.ui._routes_compare import compare_router
from agentsnap.ui._routes_events import events_router
from agentsnap.ui._routes_fork import fork_router
from agentsnap.ui._routes_messages import messages_router
from agentsnap.ui._routes_requests import requests_router
from agentsnap.ui._routes_resolve import resolve_router
from agentsnap.ui._routes_runs import runs_router
from agentsnap.ui._routes_snapshots import snapshots_router
from agentsnap.ui._routes_timeline import timeline_router
from agentsnap.ui._routes_tools import tools_router
from agentsnap.ui._wire import error_response

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Mapping

    from pydantic import BaseModel

    from agentsnap.ledger import Ledger
    from agentsnap.store import Store

__all__ = ["STATIC", "create_app"]

STATIC = Path(__file__).resolve().parent / "static"
"""The folder served at ``/static`` (its ``index.html`` at ``/``)."""


def create_app(
    store: Store,
    *,
    allow_fork: bool = False,
    allow_answer: bool = False,
    allow_run: bool = False,
    app_spec: str | None = None,
    token: str | None = None,
    ledger: Ledger | None = None,
    close_store: bool = False,
    models: Mapping[str, type[BaseModel]] | None = None,
) -> FastAPI:
    """The inspector's app over ``store``.

    Args:
        store: Where the runs are.
        allow_fork: Accept ``POST /api/runs/{run}/fork`` (refused with 403 otherwise).
        allow_answer: Accept ``POST /api/requests/{id}/answer``: answering requests to
            people (refused with 403 otherwise).
        allow_run: Accept ``POST /api/runs/{run}/resume`` (in a process of its own, with
            ``app_spec``) and ``POST /api/runs/{run}/cancel``; without it they answer 403
            with the command that does the same.
        app_spec: The app's ``MODULE:FACTORY``, which a resume runs the run with.
        token: The token every ``POST`` must carry (``X-Agentsnap-Token``), never handed
            to the page; without it the run actions need a token made for this server,
            which ``GET /api/session`` gives the page.
        ledger: Where the runs' tool calls are; by default the ledger in the store's
            database (an ``SqlStore``'s), none for other stores.
        close_store: Close ``store`` when the app shuts down (a server that opened the
            store for the app); by default the caller closes it.
        models: The current state classes, by agent name (an app's
            [`state_models`][agentsnap.distributed.App.state_models]): states are shown as
            they read them now, through their upcasters, and a fork's edited states are
            validated against them (see [`read_cut`][agentsnap.inspect.read_cut]). Each
            state also says the version it was stored with (``"state_version"``).
    """
    models = dict(models or {})
    indexes = Indexes(store)
    tokens = LiveTokens(store, ledger)

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            if close_store:
                await store.close()

    app = FastAPI(
        title="agentsnap inspector",
        description="Read-only views of agentsnap runs: runs, snapshots, messages by window, "
        "tool calls; fork with edited states (when allowed) and bisect.",
        lifespan=lifespan,
    )
    actions = add_actions(app, store, allow_run=allow_run, app_spec=app_spec, token=token)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        return error_response(exc.status_code, detail)

    @app.exception_handler(RequestValidationError)
    async def bad_request(_request: Request, exc: RequestValidationError) -> JSONResponse:
        parts = []
        for problem in exc.errors():
            where = ".".join(str(p) for p in problem.get("loc", ()) if p != "body")
            parts.append(f"{where}: {problem.get('msg', 'invalid')}")
        return error_response(422, "invalid request: " + "; ".join(parts))

    @app.exception_handler(NotFoundError)
    async def not_found(_request: Request, exc: NotFoundError) -> JSONResponse:
        return error_response(404, str(exc))

    @app.exception_handler(StateInvalid)
    async def state_invalid(_request: Request, exc: StateInvalid) -> JSONResponse:
        return error_response(422, str(exc), problems=exc.problems)

    @app.exception_handler(SnapshotDamaged)
    async def damaged(_request: Request, exc: SnapshotDamaged) -> JSONResponse:
        return error_response(409, str(exc))

    @app.exception_handler(ConfigurationError)
    async def misuse(_request: Request, exc: ConfigurationError) -> JSONResponse:
        return error_response(422, str(exc))

    @app.exception_handler(AgentsnapError)
    async def failure(_request: Request, exc: AgentsnapError) -> JSONResponse:
        return error_response(409, str(exc))

    @app.exception_handler(ValueError)
    async def unreadable(_request: Request, exc: ValueError) -> JSONResponse:
        return error_response(422, f"the store holds data the inspector cannot read: {exc}")

    # Each area's routes, over what they share.
    inspector = Inspector(
        store=store,
        ledger=ledger,
        models=models,
        indexes=indexes,
        tokens=tokens,
        allow_fork=allow_fork,
        allow_answer=allow_answer,
    )
    for router in (
        runs_router(inspector),
        snapshots_router(inspector),
        messages_router(inspector),
        tools_router(inspector),
        requests_router(inspector),
        fork_router(inspector),
        events_router(store, ledger=ledger),
        resolve_router(store, actions, ledger=ledger),
        compare_router(store, ledger=ledger),
        timeline_router(store, ledger=ledger),
    ):
        app.include_router(router)

    @app.get("/", include_in_schema=False)
    async def page() -> FileResponse:
        return FileResponse(STATIC / "index.html", media_type="text/html")

    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    return app
