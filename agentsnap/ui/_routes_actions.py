"""What the inspector can do to runs, not only show: resume one, cancel one.

Both are writes, so both are guarded twice:

* the server must be started for them (``agentsnap ui --app MODULE:FACTORY --allow-run``);
  without it each route answers 403 with the exact command that does the same, which the
  page shows instead of a button;
* every action is a ``POST`` carrying the server's token in the ``X-Agentsnap-Token``
  header. The page asks ``GET /api/session`` for it: a page of another site can send a
  request to the inspector but cannot read the answer (no CORS headers are sent), so it can
  never present the token. A server given ``--token`` (or ``AGENTSNAP_UI_TOKEN``), as one
  listening beyond this machine must be, does not hand its token out: the person types it
  into the page, and every ``POST`` (forks and answers too) must carry it.

A resume runs ``agentsnap resume RUN --app MODULE:FACTORY`` in a process of its own, so that
the run's handlers never run in the server and the server does not import more of the
user's code than ``--app`` already does. A cancel is the cooperative one of
[`cancel_run`][agentsnap.inspect.cancel_run].
"""

from __future__ import annotations

import hmac
import secrets
import shlex
import subprocess
import sys
import threading
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from fastapi import APIRouter, FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse

from agentsnap.inspect import cancel_run, resolve_run
from agentsnap.records import RunStatus

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from starlette.responses import Response

    from agentsnap.store import Store

TOKEN_HEADER = "x-agentsnap-token"  # noqa: S105 (a header's name)

RESUMABLE = frozenset({RunStatus.INTERRUPTED, RunStatus.CREATED, RunStatus.CANCELLED})
"""The statuses a run can be resumed from in the inspector."""


def _database(store: Store) -> str | None:
    """The store's database URL as a command line may show it (no password)."""
    url = getattr(store, "url", None)
    if not isinstance(url, str):
        return None
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{parts.username}:***@{host}"))


class Actions:
    """The run actions of one inspector app, and the token they need."""

    def __init__(
        self, store: Store, *, allow_run: bool, app_spec: str | None, token: str | None
    ) -> None:
        self.store = store
        self.allow_run = allow_run
        self.app_spec = app_spec
        self.token_given = token is not None
        self.token = token or secrets.token_urlsafe(24)
        self.database = _database(store)

    def command(self, verb: str, run_id: str) -> str:
        """The command that does what the page would do, for a person to run."""
        parts = ["agentsnap", verb, run_id]
        if verb == "resume":
            parts += ["--app", self.app_spec or "MODULE:FACTORY"]
        if self.database is not None:
            parts += ["--db", self.database]
        return shlex.join(parts)

    def session(self) -> dict[str, Any]:
        """What the page learns of the server's actions (``GET /api/session``)."""
        return {
            "allow_run": self.allow_run,
            "app": self.app_spec,
            "token": None if self.token_given else self.token,
            "token_required": self.token_given,
            "commands": {
                "resume": self.command("resume", "RUN"),
                "cancel": self.command("cancel", "RUN"),
            },
        }

    def check_token(self, request: Request) -> None:
        """Refuse a request that does not carry the server's token."""
        given = request.headers.get(TOKEN_HEADER, "")
        if not hmac.compare_digest(given.encode(), self.token.encode()):
            raise HTTPException(
                403,
                "this action needs the server's token in the X-Agentsnap-Token header "
                + (
                    "(the one given to `agentsnap ui --token`)"
                    if self.token_given
                    else "(the page gets it from GET /api/session)"
                ),
            )

    def check_allowed(self, verb: str, run_id: str) -> None:
        """Refuse an action the server was not started for, naming the command instead."""
        if not self.allow_run:
            raise HTTPException(
                403,
                "running is off: start the inspector with `agentsnap ui --app MODULE:FACTORY "
                f"--allow-run`, or run `{self.command(verb, run_id)}`",
            )
        if verb == "resume" and self.app_spec is None:
            raise HTTPException(403, "resuming needs the app: start with `agentsnap ui --app`")

    def resume(self, run_id: str) -> subprocess.Popen[bytes]:
        """Start ``agentsnap resume RUN --app ...`` for ``run_id`` in a process of its own."""
        assert self.app_spec is not None
        url = getattr(self.store, "url", None)
        if not isinstance(url, str):
            raise HTTPException(409, "resuming from the inspector needs a store with a database")
        process = subprocess.Popen(  # noqa: S603
            [
                sys.executable,
                "-m",
                "agentsnap",
                "resume",
                run_id,
                "--app",
                self.app_spec,
                "--db",
                url,
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        # Reaped when it ends, however long the server lives.
        threading.Thread(target=process.wait, name=f"resume-{run_id}", daemon=True).start()
        return process


def add_actions(
    app: FastAPI,
    store: Store,
    *,
    allow_run: bool = False,
    app_spec: str | None = None,
    token: str | None = None,
) -> Actions:
    """Add ``GET /api/session`` and the run actions to ``app``.

    With ``token``, every ``POST`` must present it.
    """
    actions = Actions(store, allow_run=allow_run, app_spec=app_spec, token=token)

    if actions.token_given:

        @app.middleware("http")
        async def every_write_has_the_token(
            request: Request, call_next: Callable[[Request], Awaitable[Response]]
        ) -> Response:
            if request.method == "POST":
                try:
                    actions.check_token(request)
                except HTTPException as refused:
                    return JSONResponse({"error": refused.detail}, status_code=403)
            return await call_next(request)

    app.include_router(actions_router(store, actions))
    return actions


def actions_router(store: Store, actions: Actions) -> APIRouter:
    """``GET /api/session`` and the run actions (resume, cancel) over ``store``."""
    router = APIRouter()

    @router.get("/api/session", summary="What this server lets the page do, and its token")
    async def session() -> dict[str, Any]:
        return actions.session()

    @router.post("/api/runs/{run}/resume", status_code=202, summary="Resume an interrupted run")
    async def resume(run: str, request: Request) -> dict[str, Any]:
        found = await resolve_run(store, run)
        actions.check_allowed("resume", found.id)
        actions.check_token(request)
        if found.status not in RESUMABLE:
            raise HTTPException(
                409,
                f"run {found.id} is {found.status.value}: only an interrupted, created or "
                "cancelled run is resumed",
            )
        process = actions.resume(found.id)
        return {
            "run_id": found.id,
            "pid": process.pid,
            "command": actions.command("resume", found.id),
        }

    @router.post("/api/runs/{run}/cancel", summary="Ask a running run to stop")
    async def cancel(run: str, request: Request) -> dict[str, Any]:
        found = await resolve_run(store, run)
        actions.check_allowed("cancel", found.id)
        actions.check_token(request)
        if found.status is not RunStatus.RUNNING:
            raise HTTPException(409, f"run {found.id} is {found.status.value}, not running")
        done = await cancel_run(store, found.id, "cancelled from the inspector")
        return {"run_id": done.id, "status": done.status.value}

    return router
