"""The inspector's run actions over HTTP: resume and cancel, each refused unless the server
allows it (with the command to run instead) and unless the request carries the server's
token; a server given a token of its own wants it on every write."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentsnap import Agent, AgentState, Context, Message, Runtime
from agentsnap.inspect import fork_run
from agentsnap.store.sql import SqlStore
from agentsnap.ui.server import create_app


class Quiet(Agent[AgentState]):
    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        ctx.state.memory["seen"] = message.payload


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqlStore]:
    made = SqlStore(f"sqlite:///{tmp_path / 'actions.db'}")
    try:
        yield made
    finally:
        await made.close()


def client_for(store: SqlStore, **options: Any) -> httpx.AsyncClient:
    app = create_app(store, **options)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://ui")


async def test_actions_are_refused_without_allow_run_and_name_the_command(
    store: SqlStore,
) -> None:
    async with Runtime(store=store) as runtime:
        runtime.add(Quiet("q"))
        async with client_for(store) as client:
            session = (await client.get("/api/session")).json()
            assert session["allow_run"] is False
            assert session["token_required"] is False
            assert len(session["token"]) >= 16
            headers = {"x-agentsnap-token": session["token"]}
            refused = await client.post(f"/api/runs/{runtime.run_id}/cancel", headers=headers)
            assert refused.status_code == 403
            error = refused.json()["error"]
            assert "--allow-run" in error
            assert f"agentsnap cancel {runtime.run_id} --db sqlite:///" in error


async def test_a_cancel_needs_the_token_and_then_reaches_the_running_owner(
    store: SqlStore,
) -> None:
    async with Runtime(store=store) as runtime:
        runtime.add(Quiet("q"))
        async with client_for(store, allow_run=True) as client:
            token = (await client.get("/api/session")).json()["token"]
            url = f"/api/runs/{runtime.run_id}/cancel"
            for headers in ({}, {"x-agentsnap-token": "not-the-token-at-all"}):
                refused = await client.post(url, headers=headers)
                assert refused.status_code == 403
                assert "X-Agentsnap-Token" in refused.json()["error"]
            assert (await store.get_run(runtime.run_id)).status.value == "running"
            done = await client.post(url, headers={"x-agentsnap-token": token})
            assert done.status_code == 200, done.text
            listed = (await client.get(f"/api/runs/{runtime.run_id}")).json()
            assert listed["cancel_requested"] is not None


async def test_a_resume_starts_a_process_only_for_a_run_that_can_be_resumed(
    store: SqlStore,
) -> None:
    async with Runtime(store=store) as runtime:
        runtime.add(Quiet("q"))
        cut = await runtime.snapshot()
    fork = await fork_run(store, cut.id, tools="dry")
    async with client_for(store, allow_run=True, app_spec="no_such_module:app") as client:
        token = {"x-agentsnap-token": (await client.get("/api/session")).json()["token"]}
        finished = await client.post(f"/api/runs/{runtime.run_id}/resume", headers=token)
        assert finished.status_code == 409
        assert "only an interrupted, created or cancelled run is resumed" in finished.text
        started = await client.post(f"/api/runs/{fork.id}/resume", headers=token)
        assert started.status_code == 202, started.text
        body = started.json()
        assert body["command"].startswith(f"agentsnap resume {fork.id} --app no_such_module:app")
        assert body["pid"] > 0


async def test_a_server_with_a_token_of_its_own_wants_it_on_every_write(
    store: SqlStore,
) -> None:
    async with Runtime(store=store) as runtime:
        runtime.add(Quiet("q"))
        cut = await runtime.snapshot()
    secret = "a-secret-of-this-deployment"
    async with client_for(store, allow_fork=True, token=secret) as client:
        session = (await client.get("/api/session")).json()
        assert session["token"] is None, "a token given to the server is never handed out"
        assert session["token_required"] is True
        body = {"snapshot": cut.id}
        refused = await client.post(f"/api/runs/{runtime.run_id}/fork", json=body)
        assert refused.status_code == 403
        made = await client.post(
            f"/api/runs/{runtime.run_id}/fork", json=body, headers={"x-agentsnap-token": secret}
        )
        assert made.status_code == 201, made.text
        assert (await client.get("/api/runs")).status_code == 200, "reading needs no token"
