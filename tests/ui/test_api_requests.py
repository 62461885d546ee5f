"""The inspector's requests to people: listed by run, answered only with ``allow_answer``."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from agentsnap import Agent, AgentState, Context, Message, Runtime
from agentsnap.store import MemoryStore
from agentsnap.store.ledger import MemoryLedger
from agentsnap.ui.server import create_app


class Asker(Agent[AgentState]):
    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        self.state.memory["answer"] = await ctx.ask(
            "How many seats?", schema={"type": "integer", "minimum": 1}, who="ops"
        )


def client_of(store: MemoryStore, ledger: MemoryLedger, *, allow: bool) -> httpx.AsyncClient:
    app = create_app(store, ledger=ledger, allow_answer=allow)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://inspector")


async def pending(client: httpx.AsyncClient, run: str) -> list[dict[str, Any]]:
    for _ in range(1000):
        response = await client.get(f"/api/runs/{run[:8]}/requests", params={"pending": True})
        assert response.status_code == 200, response.text
        found: list[dict[str, Any]] = response.json()["requests"]
        if found:
            return found
        await asyncio.sleep(0.005)
    raise AssertionError("no pending request")


async def test_a_request_is_listed_and_answered_through_the_api() -> None:
    store, ledger = MemoryStore(), MemoryLedger()
    async with Runtime(store=store, ledger=ledger) as runtime:
        asker = runtime.add(Asker("asker"))
        runtime.send("asker", "book")
        running = asyncio.create_task(runtime.run_until_idle())
        async with client_of(store, ledger, allow=False) as readonly:
            (request,) = await pending(readonly, runtime.run_id)
            assert request["question"] == "How many seats?"
            assert request["who"] == "ops"
            assert request["status"] == "pending"
            assert isinstance(request["asked_at_us"], int)
            url = f"/api/requests/{request['id']}/answer"
            refused = await readonly.post(url, json={"answer": 3})
            assert refused.status_code == 403
            assert "--allow-answer" in refused.json()["error"]
            listed = (await readonly.get("/api/requests", params={"pending": True})).json()
            assert listed["can_answer"] is False
            assert [r["id"] for r in listed["requests"]] == [request["id"]]
        async with client_of(store, ledger, allow=True) as client:
            wrong = await client.post(url, json={"answer": 0})
            assert wrong.status_code == 422
            assert "minimum" in wrong.json()["error"]
            done = await client.post(url, json={"answer": 3, "by": "ann"})
            assert done.status_code == 200, done.text
            assert done.json()["request"]["status"] == "answered"
            again = await client.post(url, json={"answer": 4})
            assert again.status_code == 409
            assert "answered already" in again.json()["error"]
            missing = await client.post("/api/requests/ffff/answer", json={"answer": 4})
            assert missing.status_code == 404
        await asyncio.wait_for(running, 10)
        assert asker.state.memory["answer"] == 3
