"""The inspector's HTTP server: a FastAPI app over a store, read-only unless told otherwise.

[`create_app`][agentsnap.ui.server.create_app] gives the app; ``agentsnap ui`` serves it with
uvicorn. It answers the JSON API under ``/api`` (described at ``/docs`` and ``/openapi.json``),
serves the page at ``/`` and its files under ``/static``. All times on the wire are
microseconds since the Unix epoch (``*_us``), Lamport times are integers (``*_lc``); an error
is ``{"error": "what was wrong and what to do"}`` with a 4xx status. Names, payloads and
reasons that agents wrote are returned as data, never as markup.

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

import asyncio
import contextlib
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import orjson
from pydantic import BaseModel, Field

try:
    from fastapi import Body, FastAPI, HTTPException, Query, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import FileResponse, JSONResponse, Response
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
from agentsnap.fork import MessageEdits, ToolsMode
from agentsnap.inspect import (
    answer,
    bisect_run,
    diff_snapshots,
    fork_run,
    ledger_calls,
    list_requests,
    read_cut,
    resolve_run,
    resolve_snapshot,
)
from agentsnap.ledger import ToolCallStatus
from agentsnap.messages import ENVIRONMENT
from agentsnap.records import SnapshotStatus
from agentsnap.ui._actions import add_actions
from agentsnap.ui._live import LiveTokens
from agentsnap.ui._routes import inspector_routes
from agentsnap.ui.conditions import Condition
from agentsnap.ui.queries import (
    RunIndex,
    build_index,
    channel_counts,
    micros,
    model_calls_view,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Mapping

    from agentsnap.ledger import Ledger, LedgerEntry
    from agentsnap.records import RollbackInfo, RunInfo, Snapshot
    from agentsnap.requests import HumanRequest
    from agentsnap.store import Store

__all__ = ["STATIC", "create_app"]

STATIC = Path(__file__).resolve().parent / "static"
"""The folder served at ``/static`` (its ``index.html`` at ``/``)."""

_CACHED_RUNS = 4  # runs whose index is kept
_DEFAULT_BINS = 200
_MAX_BINS = 2000
_MAX_LIMIT = 100_000
_SNAPSHOT_PAGE = 50


def _json(document: Any) -> Response:
    return Response(orjson.dumps(document), media_type="application/json")


def _error(status: int, message: str, **extra: Any) -> JSONResponse:
    return JSONResponse({"error": message, **extra}, status_code=status)


@dataclass
class _Entry:
    """A run's index and what was computed from it, with what says it is still current."""

    key: tuple[Any, ...]
    index: RunIndex
    rollbacks: list[RollbackInfo]
    recorded: dict[str, dict[str, dict[str, int]]] = field(default_factory=dict)


class _Indexes:
    """The indexes of the runs looked at last, rebuilt when a run changes."""

    def __init__(self, store: Store, size: int = _CACHED_RUNS) -> None:
        self._store = store
        self._size = size
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._locks: dict[str, asyncio.Lock] = {}

    async def _key(self, run: RunInfo, rollbacks: list[RollbackInfo]) -> tuple[Any, ...]:
        counts = await self._store.snapshot_counts()
        return (run.status, run.finished_at, len(rollbacks), counts.get(run.id, 0))

    async def get(self, run: RunInfo) -> _Entry:
        lock = self._locks.setdefault(run.id, asyncio.Lock())
        async with lock:
            rollbacks = await self._store.list_rollbacks(run.id)
            key = await self._key(run, rollbacks)
            entry = self._entries.get(run.id)
            if entry is not None and entry.key == key and not await self._grew(run.id, entry):
                self._entries.move_to_end(run.id)
                return entry
            index = await build_index(self._store, run.id, rollbacks)
            entry = self._entries[run.id] = _Entry(key, index, rollbacks)
            self._entries.move_to_end(run.id)
            while len(self._entries) > self._size:
                self._entries.popitem(last=False)
            return entry

    async def _grew(self, run_id: str, entry: _Entry) -> bool:
        """Whether the run's journal has segments the index has not read."""
        page = await self._store.load_journal_page(run_id, after=entry.index.end_position, limit=1)
        return bool(page)


# --- What the API returns -----------------------------------------------------------------


def _request(request: HumanRequest) -> dict[str, Any]:
    """A request on the wire: its JSON, its times in microseconds (``*_us``)."""
    shown = request.to_json()
    for name in ("asked_at", "answered_at", "deadline"):
        shown[f"{name}_us"] = _us(getattr(request, name))
        del shown[name]
    return shown


def _us(moment: Any) -> int | None:
    return None if moment is None else micros(moment)


def _tags(tags: dict[str, str]) -> list[str]:
    return [f"{key}={value}" if value else key for key, value in sorted(tags.items())]


def _run(run: RunInfo, snapshots: int, rollbacks: int) -> dict[str, Any]:
    return {
        "id": run.id,
        "name": run.name,
        "tags": _tags(run.tags),
        "tag_map": dict(run.tags),
        "status": run.status.value,
        "reason": run.status_reason,
        "traceback": run.traceback,
        "cancel_requested": run.cancel_requested,
        "created_at_us": micros(run.created_at),
        "updated_at_us": _us(run.finished_at),
        "snapshots": snapshots,
        "rollbacks": rollbacks,
        "parent_run_id": run.parent_run_id,
        "parent_snapshot_id": run.parent_snapshot_id,
        "metadata": run.metadata,
    }


def _summary(snapshot: Snapshot) -> dict[str, Any]:
    return {
        "id": snapshot.id,
        "seq": snapshot.seq,
        "status": snapshot.status.value,
        "started_at_us": micros(snapshot.started_at),
        "completed_at_us": _us(snapshot.completed_at),
    }


def _diff(raw: dict[str, Any], a: Snapshot, b: Snapshot) -> dict[str, Any]:
    agents = {}
    for entry in raw["agents"]:
        if entry["change"] == "unchanged":
            continue
        agents[entry["agent"]] = {k: v for k, v in entry.items() if k != "agent"}
    before = {(c.src, c.dst): {m.seq for m in c.messages} for c in a.channels}
    after = {(c.src, c.dst): {m.seq for m in c.messages} for c in b.channels}
    channels = {}
    for src, dst in sorted(set(before) | set(after)):
        old = before.get((src, dst), set())
        new = after.get((src, dst), set())
        if old != new:
            channels[f"{src}>{dst}"] = {
                "src": src,
                "dst": dst,
                "a": len(old),
                "b": len(new),
                "added": sorted(new - old),
                "removed": sorted(old - new),
            }
    return {"a": a.id, "b": b.id, "agents": agents, "channels": channels}


def _call(entry: LedgerEntry, index: RunIndex | None) -> dict[str, Any]:
    return {
        "key": entry.key,
        "tool": entry.tool,
        "agent": entry.agent,
        "status": entry.status.value,
        "attempts": entry.attempts,
        "outcome": entry.result,
        "error": entry.error,
        "unknown": entry.status is ToolCallStatus.UNKNOWN,
        "started_at_us": micros(entry.created_at),
        "finished_at_us": None
        if entry.status in {ToolCallStatus.IN_PROGRESS, ToolCallStatus.UNKNOWN}
        else micros(entry.updated_at),
        "arguments": entry.arguments,
        "at_us": micros(entry.created_at),
        "lc": 0 if index is None else index.clock_at(entry.agent, micros(entry.created_at)),
    }


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


class BisectRequest(BaseModel):
    """The body of a bisect: a condition on ``{agent: state}`` that holds while all is well."""

    path: str = Field(description="JSONPath-style path, as in $.writer.memory.drafts")
    op: str = Field(description="exists == != < <= > >= len== len< len<= len> len>=")
    value: Any = Field(default=None, description="What the value found is compared with.")


# --- The app ------------------------------------------------------------------------------


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
    indexes = _Indexes(store)
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
    app.include_router(inspector_routes(store, actions, ledger=ledger))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        return _error(exc.status_code, detail)

    @app.exception_handler(RequestValidationError)
    async def bad_request(_request: Request, exc: RequestValidationError) -> JSONResponse:
        parts = []
        for problem in exc.errors():
            where = ".".join(str(p) for p in problem.get("loc", ()) if p != "body")
            parts.append(f"{where}: {problem.get('msg', 'invalid')}")
        return _error(422, "invalid request: " + "; ".join(parts))

    @app.exception_handler(NotFoundError)
    async def not_found(_request: Request, exc: NotFoundError) -> JSONResponse:
        return _error(404, str(exc))

    @app.exception_handler(StateInvalid)
    async def state_invalid(_request: Request, exc: StateInvalid) -> JSONResponse:
        return _error(422, str(exc), problems=exc.problems)

    @app.exception_handler(SnapshotDamaged)
    async def damaged(_request: Request, exc: SnapshotDamaged) -> JSONResponse:
        return _error(409, str(exc))

    @app.exception_handler(ConfigurationError)
    async def misuse(_request: Request, exc: ConfigurationError) -> JSONResponse:
        return _error(422, str(exc))

    @app.exception_handler(AgentsnapError)
    async def failure(_request: Request, exc: AgentsnapError) -> JSONResponse:
        return _error(409, str(exc))

    @app.exception_handler(ValueError)
    async def unreadable(_request: Request, exc: ValueError) -> JSONResponse:
        return _error(422, f"the store holds data the inspector cannot read: {exc}")

    async def calls(run_id: str) -> list[LedgerEntry]:
        return await ledger_calls(store, run_id, ledger)

    async def schemas(run_id: str) -> dict[str, Any]:
        return dict(await store.load_state_schemas(run_id))

    async def counts(run: RunInfo) -> tuple[int, int]:
        snapshots = (await store.snapshot_counts()).get(run.id, 0)
        return snapshots, len(await store.list_rollbacks(run.id))

    async def in_run(run: RunInfo, snapshot_id: str) -> Snapshot:
        snapshot = await resolve_snapshot(store, snapshot_id)
        if snapshot.run_id != run.id:
            raise NotFoundError(
                "snapshot", snapshot_id, f"snapshot {snapshot.id} belongs to run {snapshot.run_id}"
            )
        return snapshot

    # --- runs ---

    @app.get("/api/runs", summary="The runs, newest first")
    async def list_runs(
        q: Annotated[str | None, Query(description="Id prefix or part of the name.")] = None,
        status: Annotated[str | None, Query(description="Only runs in this status.")] = None,
        tag: Annotated[
            str | None, Query(description="Only runs with this tag (KEY or KEY=VALUE).")
        ] = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
        offset: Annotated[int, Query(ge=0)] = 0,
    ) -> dict[str, Any]:
        runs = await store.list_runs(status=status or None)
        runs.reverse()
        if q:
            needle = q.lower()
            runs = [r for r in runs if r.id.startswith(q) or (r.name and needle in r.name.lower())]
        if tag:
            key, has_value, value = tag.partition("=")
            runs = [r for r in runs if key in r.tags and (not has_value or r.tags[key] == value)]
        page = runs[offset : offset + limit]
        snapshot_counts = await store.snapshot_counts() if page else {}
        rows = [
            _run(r, snapshot_counts.get(r.id, 0), len(await store.list_rollbacks(r.id)))
            for r in page
        ]
        return {"runs": rows, "total": len(runs)}

    @app.get("/api/live", summary="Tokens that change when the runs, or one run, change")
    async def live(
        run: Annotated[str | None, Query(description="Also this run's token.")] = None,
    ) -> dict[str, Any]:
        found = None if run is None else await resolve_run(store, run)
        return {
            "runs": await tokens.runs(),
            "run": None if found is None else await tokens.run(found),
            "running": None if found is None else found.status.value == "running",
        }

    @app.get("/api/runs/{run}", summary="One run, with its span, agents, forks and schemas")
    async def get_run(run: str) -> dict[str, Any]:
        found = await resolve_run(store, run)
        entry = await indexes.get(found)
        index = entry.index
        snapshots = await store.list_snapshot_summaries(found.id)
        tool_calls = await calls(found.id)
        agents = set(index.agents) - {ENVIRONMENT}
        times: list[int] = []
        span = index.span_us()
        if span:
            times.extend(span)
        for s in snapshots:
            agents.update(a for a in s.agents if a != ENVIRONMENT)
            times.append(micros(s.started_at))
            if s.completed_at is not None:
                times.append(micros(s.completed_at))
        times.extend(micros(r.at) for r in entry.rollbacks)
        for call in tool_calls:
            times.extend((micros(call.created_at), micros(call.updated_at)))
        if not times:
            times.append(micros(found.created_at))
            if found.finished_at is not None:
                times.append(micros(found.finished_at))
        forks = [
            {"run_id": r.id, "snapshot_id": r.parent_snapshot_id}
            for r in await store.list_runs()
            if r.parent_run_id == found.id
        ]
        return {
            **_run(found, len(snapshots), len(entry.rollbacks)),
            "agents": sorted(agents),
            "start_us": min(times),
            "end_us": max(times),
            "lamport_max": index.lamport_max,
            "messages": len(index),
            "journal": bool(index.positions),
            "tool_calls": len(tool_calls),
            "forks": forks,
            "schemas": await schemas(found.id),
        }

    @app.get("/api/runs/{run}/topology", summary="Who talks to whom: messages per channel")
    async def topology(run: str) -> dict[str, Any]:
        found = await resolve_run(store, run)
        return channel_counts((await indexes.get(found)).index)

    # --- snapshots ---

    @app.get("/api/runs/{run}/snapshots", summary="The run's snapshots, with their cut lines")
    async def list_snapshots(run: str) -> dict[str, Any]:
        found = await resolve_run(store, run)
        entry = await indexes.get(found)
        rows = []
        after = 0
        while True:
            page = await store.list_snapshots_page(found.id, after_seq=after, limit=_SNAPSHOT_PAGE)
            for snapshot in page:
                recorded = entry.recorded.get(snapshot.id)
                if recorded is None:
                    recorded = entry.recorded[snapshot.id] = entry.index.recorded(snapshot)
                rows.append(
                    {
                        **_summary(snapshot),
                        "initiator": snapshot.initiator,
                        "in_flight": sum(len(c.messages) for c in snapshot.channels),
                        "error": snapshot.error,
                        "recorded": recorded,
                    }
                )
            if len(page) < _SNAPSHOT_PAGE:
                break
            after = page[-1].seq
        return {"snapshots": rows}

    @app.get("/api/runs/{run}/snapshots/{sid}", summary="One snapshot: states and channels")
    async def get_snapshot(run: str, sid: str) -> dict[str, Any]:
        found = await resolve_run(store, run)
        snapshot = await in_run(found, sid)
        return {
            **_summary(snapshot),
            "initiator": snapshot.initiator,
            "error": snapshot.error,
            "damaged_agents": list(snapshot.damaged_agents),
            "agents": {
                name: {
                    "state": cut.state,
                    "state_hash": cut.state_hash,
                    "state_version": cut.state_version,
                    "counters": {"sent": cut.sent, "received": cut.received},
                    **read_cut(name, cut, models),
                }
                for name, cut in sorted(snapshot.agents.items())
            },
            "channels": [
                {
                    "src": channel.src,
                    "dst": channel.dst,
                    "in_flight": [
                        {
                            "id": m.id,
                            "src": channel.src,
                            "dst": channel.dst,
                            "seq": m.seq,
                            "kind": m.kind,
                            "epoch": m.epoch,
                            "payload": m.payload,
                            "headers": m.headers,
                        }
                        for m in channel.messages
                    ],
                }
                for channel in snapshot.channels
            ],
        }

    @app.get("/api/runs/{run}/agents/{agent}/history", summary="One agent across the snapshots")
    async def agent_history(run: str, agent: str) -> dict[str, Any]:
        found = await resolve_run(store, run)
        versions = await store.agent_history(found.id, agent)
        rows = []
        previous: str | None = None
        for version in versions:
            cut = version.cut
            state_hash = None if cut is None else cut.state_hash
            rows.append(
                {
                    "id": version.snapshot_id,
                    "seq": version.snapshot_seq,
                    "status": "damaged" if version.damaged else SnapshotStatus.COMPLETE.value,
                    "damaged": version.damaged,
                    "completed_at_us": _us(version.completed_at),
                    "state_hash": state_hash,
                    "changed": state_hash is not None and state_hash != previous,
                    "state": None if cut is None else cut.state,
                    "state_version": None if cut is None else cut.state_version,
                    **({} if cut is None else read_cut(agent, cut, models)),
                }
            )
            if state_hash is not None:
                previous = state_hash
        return {"agent": agent, "snapshots": rows}

    @app.get("/api/runs/{run}/diff", summary="What changed between two snapshots")
    async def diff(
        run: str,
        a: Annotated[str, Query(description="The earlier snapshot.")],
        b: Annotated[str, Query(description="The later snapshot.")],
        agent: Annotated[str | None, Query(description="Only this agent.")] = None,
    ) -> dict[str, Any]:
        found = await resolve_run(store, run)
        first = await in_run(found, a)
        second = await in_run(found, b)
        raw = await diff_snapshots(store, first.id, second.id, agent, models=models)
        return _diff(raw, first, second)

    # --- messages ---

    @app.get("/api/runs/{run}/messages", summary="The messages touching a window")
    async def messages(
        run: str,
        *,
        axis: Literal["wall", "lamport"] = "wall",
        low: Annotated[int | None, Query(alias="from")] = None,
        high: Annotated[int | None, Query(alias="to")] = None,
        agents: Annotated[str | None, Query(description="Comma-separated agent names.")] = None,
        limit: Annotated[int, Query(ge=1, le=_MAX_LIMIT)] = 5000,
        bins: Annotated[int, Query(ge=1, le=_MAX_BINS)] = _DEFAULT_BINS,
    ) -> Any:
        found = await resolve_run(store, run)
        index = (await indexes.get(found)).index
        if axis == "lamport":
            first, last = 0, index.lamport_max
        else:
            span = index.span_us()
            first, last = span if span else (micros(found.created_at),) * 2
        low = first if low is None else low
        high = last if high is None else high
        if high < low:
            raise HTTPException(422, f"the window ends ({high}) before it starts ({low})")
        chosen = None if not agents else {a for a in agents.split(",") if a}
        window = index.window(axis, low, high, chosen, limit)
        if window.ordinals is not None:
            # Encoded at once (as the counts below): FastAPI's own encoder would walk every
            # value first, which costs more than finding them.
            return _json(
                {
                    "mode": "exact",
                    "from": low,
                    "to": high,
                    "messages": [index.row(i) for i in window.ordinals],
                }
            )
        return _json(
            {
                "mode": "density",
                "from": low,
                "to": high,
                "bins": bins,
                "count": window.count,
                "channels": [
                    {"src": channel.src, "dst": channel.dst, "counts": counts}
                    for channel, counts in index.density(axis, low, high, chosen, bins)
                ],
            }
        )

    @app.get("/api/runs/{run}/messages/{src}/{dst}/{seq}", summary="One message, with its payload")
    async def message(
        run: str,
        src: str,
        dst: str,
        seq: int,
        sent_us: Annotated[
            int | None, Query(description="Which send of the number (a rollback reuses them).")
        ] = None,
    ) -> dict[str, Any]:
        found = await resolve_run(store, run)
        index = (await indexes.get(found)).index
        i = index.find(src, dst, seq, sent_us)
        payload, headers = await index.payload(store, found.id, i)
        return {**index.row(i), "payload": payload, "headers": headers}

    @app.get("/api/runs/{run}/events", summary="Rollbacks and tool calls in a window")
    async def events(
        run: str,
        *,
        axis: Literal["wall", "lamport"] = "wall",
        low: Annotated[int | None, Query(alias="from")] = None,
        high: Annotated[int | None, Query(alias="to")] = None,
    ) -> dict[str, Any]:
        found = await resolve_run(store, run)
        entry = await indexes.get(found)
        index = entry.index

        def inside(at_us: int, lc: int) -> bool:
            where = lc if axis == "lamport" else at_us
            return (low is None or where >= low) and (high is None or where <= high)

        rollbacks = []
        for r in entry.rollbacks:
            at_us = micros(r.at)
            lc = index.clock_at(r.agent, at_us)
            if inside(at_us, lc):
                rollbacks.append(
                    {
                        "id": r.id,
                        "at_us": at_us,
                        "lc": lc,
                        "agent": r.agent,
                        "reason": r.reason,
                        "source": r.source,
                        "snapshot_id": r.snapshot_id,
                        "attempt": r.attempt,
                        "discarded": r.discarded,
                    }
                )
        tool_calls = []
        for call in await calls(found.id):
            row = _call(call, index)
            if inside(row["at_us"], row["lc"]):
                tool_calls.append(
                    {k: row[k] for k in ("key", "tool", "agent", "status", "at_us", "lc")}
                    | {"unknown": row["unknown"]}
                )
        return {"rollbacks": rollbacks, "tool_calls": tool_calls}

    # --- tools ---

    @app.get("/api/runs/{run}/tools", summary="The run's side-effecting tool calls")
    async def tools(
        run: str,
        *,
        status: str | None = None,
        tool: str | None = None,
        q: Annotated[str | None, Query(description="Part of the key, tool or agent.")] = None,
        limit: Annotated[int, Query(ge=1, le=10_000)] = 100,
        offset: Annotated[int, Query(ge=0)] = 0,
    ) -> dict[str, Any]:
        found = await resolve_run(store, run)
        entries = await calls(found.id)
        if status:
            known = {s.value for s in ToolCallStatus}
            if status not in known:
                raise HTTPException(
                    422, f"unknown status {status!r}: use one of {', '.join(sorted(known))}"
                )
            entries = [e for e in entries if e.status.value == status]
        if tool:
            entries = [e for e in entries if e.tool == tool]
        if q:
            needle = q.lower()
            entries = [
                e
                for e in entries
                if needle in e.key.lower()
                or needle in e.tool.lower()
                or (e.agent is not None and needle in e.agent.lower())
            ]
        page = entries[offset : offset + limit]
        index = (await indexes.get(found)).index if page else None
        return {"calls": [_call(e, index) for e in page], "total": len(entries)}

    # --- model calls ---

    @app.get("/api/runs/{run}/model-calls", summary="The run's model calls, by agent or cut")
    async def list_model_calls(
        run: str,
        agent: Annotated[str | None, Query(description="Only this agent's calls.")] = None,
        snapshot: Annotated[
            str | None,
            Query(description="Only the calls made since the cut before this snapshot."),
        ] = None,
    ) -> Any:
        found = await resolve_run(store, run)
        cut = None if snapshot is None else await in_run(found, snapshot)
        return _json(await model_calls_view(store, found.id, ledger, agent=agent, snapshot=cut))

    # --- requests to people ---

    @app.get("/api/requests", summary="Requests to people, of every run")
    async def all_requests(
        pending: Annotated[bool, Query(description="Only those that wait.")] = False,
    ) -> dict[str, Any]:
        found = await list_requests(store, None, pending=pending, ledger=ledger)
        return {"requests": [_request(r) for r in found], "can_answer": allow_answer}

    @app.get("/api/runs/{run}/requests", summary="The run's requests to people, oldest first")
    async def run_requests(
        run: str,
        pending: Annotated[bool, Query(description="Only those that wait.")] = False,
    ) -> dict[str, Any]:
        found = await resolve_run(store, run)
        listed = await list_requests(store, found.id, pending=pending, ledger=ledger)
        return {"requests": [_request(r) for r in listed], "can_answer": allow_answer}

    @app.post("/api/requests/{request_id}/answer", summary="Answer a request to a person")
    async def answer_one(
        request_id: str, request: Annotated[AnswerRequest, Body()]
    ) -> dict[str, Any]:
        if not allow_answer:
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
        return {"request": _request(done)}

    # --- fork and bisect ---

    @app.post("/api/runs/{run}/fork", status_code=201, summary="Fork a run from a snapshot")
    async def fork(run: str, request: Annotated[ForkRequest, Body()]) -> dict[str, Any]:
        if not allow_fork:
            raise HTTPException(
                403, "forking is off: start the inspector with `agentsnap ui --allow-fork`"
            )
        found = await resolve_run(store, run)
        snapshot = await in_run(found, request.snapshot)
        made = await fork_run(
            store,
            snapshot.id,
            states=request.states or None,
            name=request.name,
            models=models,
            messages=request.messages or None,
            tools=request.tools,
        )
        return {"run": _run(made, *await counts(made))}

    @app.post("/api/runs/{run}/bisect", summary="The first snapshot where a condition fails")
    async def bisect(run: str, request: Annotated[BisectRequest, Body()]) -> dict[str, Any]:
        found = await resolve_run(store, run)
        condition = Condition.parse(request.path, request.op, request.value)
        result = await bisect_run(store, found.id, condition)
        diffed = None
        if result.first_bad is not None and result.last_good is not None:
            assert result.diff is not None
            diffed = _diff(result.diff, result.last_good, result.first_bad)
        return {
            "first_bad": None if result.first_bad is None else _summary(result.first_bad),
            "last_good": None if result.last_good is None else _summary(result.last_good),
            "diff": diffed,
            "checked": result.checked,
            "holds_at_first": result.holds_at_first,
            "snapshots": result.snapshots,
        }

    # --- the page ---

    @app.get("/", include_in_schema=False)
    async def page() -> FileResponse:
        return FileResponse(STATIC / "index.html", media_type="text/html")

    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    return app
