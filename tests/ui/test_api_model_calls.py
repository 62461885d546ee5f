"""The inspector's model calls: by agent, and those made since the cut before a snapshot."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from model_call_run import ModelCallRun, make_model_call_run

from agentsnap.ledger import Ledger
from agentsnap.store import MemoryStore, Store
from agentsnap.store.ledger import MemoryLedger
from agentsnap.ui.server import create_app


@pytest.fixture
async def made(store: Store) -> tuple[ModelCallRun, Ledger | None]:
    ledger = MemoryLedger() if isinstance(store, MemoryStore) else None
    return await make_model_call_run(store, ledger), ledger


@pytest.fixture
async def client(
    store: Store, made: tuple[ModelCallRun, Ledger | None]
) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=create_app(store, ledger=made[1]))
    async with httpx.AsyncClient(transport=transport, base_url="http://inspector") as client:
        yield client


async def get(client: httpx.AsyncClient, url: str, expect: int = 200, **params: Any) -> Any:
    response = await client.get(url, params=params)
    assert response.status_code == expect, response.text
    return response.json()


def identities(calls: list[dict[str, Any]]) -> list[tuple[str, str, int, int, bool]]:
    return [(c["agent"], c["message"], c["position"], c["timeline"], c["discarded"]) for c in calls]


async def test_a_cut_shows_the_calls_made_since_the_cut_before(
    client: httpx.AsyncClient, made: tuple[ModelCallRun, Ledger | None]
) -> None:
    run = made[0]
    url = f"/api/runs/{run.run_id[:8]}/model-calls"
    second = await get(client, url, snapshot=run.second[:8])
    assert second["previous"]["id"] == run.first
    assert identities(second["calls"]) == [
        ("writer", "$env>writer#2", 0, 1, False),
        ("writer", "$env>writer#2", 1, 1, False),
        ("reviewer", "writer>reviewer#2", 0, 1, False),
    ]
    call = second["calls"][0]
    assert call["model"] == "writer-model"
    assert call["answer"] == "a draft in one line"
    assert call["response"]["text"] == "a draft in one line\nsecond line"
    assert call["request"]["messages"][0]["content"].startswith("write a draft too long")
    assert (call["input_tokens"], call["output_tokens"]) == (10, 7)
    assert isinstance(call["started_at_us"], int)
    assert call["snapshot_id"] == run.second
    assert second["totals"]["calls"] == 3
    assert second["totals"]["agents"]["reviewer"]["calls"] == 1
    assert second["timeline"] == 1

    first = await get(client, url, snapshot=run.first)
    assert [c["discarded"] for c in first["calls"]] == [True, True, True, False, False, False]
    assert {c["timeline"] for c in first["calls"]} == {0, 1}


async def test_an_agent_has_its_calls_each_with_the_cut_it_leads_to(
    client: httpx.AsyncClient, made: tuple[ModelCallRun, Ledger | None]
) -> None:
    run = made[0]
    calls = (await get(client, f"/api/runs/{run.run_id}/model-calls", agent="reviewer"))["calls"]
    assert identities(calls) == [
        ("reviewer", "writer>reviewer#1", 0, 0, True),
        ("reviewer", "writer>reviewer#1", 0, 1, False),
        ("reviewer", "writer>reviewer#2", 0, 1, False),
    ]
    assert [c["snapshot_id"] for c in calls] == [run.first, run.first, run.second]
    everything = await get(client, f"/api/runs/{run.run_id}/model-calls")
    assert everything["totals"]["calls"] == 9
    assert everything["previous"] is None


async def test_unknown_runs_and_snapshots_are_404(
    client: httpx.AsyncClient, made: tuple[ModelCallRun, Ledger | None]
) -> None:
    run = made[0]
    assert "error" in await get(client, "/api/runs/ffff/model-calls", 404)
    missing = await get(client, f"/api/runs/{run.run_id}/model-calls", 404, snapshot="ffff")
    assert "ffff" in missing["error"]
