"""The inspector's HTTP API, against real runs on every store backend."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from agentsnap import Agent, AgentState, Context, Message, Runtime, tool
from agentsnap.demo import demo_model, run_demo
from agentsnap.ledger import Ledger
from agentsnap.store import MemoryStore, Store
from agentsnap.ui.server import create_app

HOSTILE = '<img src=x onerror="alert(1)">&amp;</script>'


@dataclass
class Runs:
    """The runs every test looks at, in one store."""

    store: Store
    demo: str
    shipping: str
    ledger: Ledger | None


@tool(side_effect=True, name="ui_ship")
async def ship(parcel: str) -> dict[str, str]:
    return {"tracking": f"T-{parcel}"}


class Shipper(Agent[AgentState]):
    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        ctx.state.memory["last"] = message.payload
        await ship(ctx, parcel=str(message.payload))


@pytest.fixture
async def runs(store: Store) -> Runs:
    """The demo (a rejected draft, a rollback) and a run with tool calls and hostile text."""
    demo = await run_demo(store, demo_model(delay=0.01))
    async with Runtime(
        store=store, name=f"ship {HOSTILE}", tags={"team": "ops", "env": ""}, journal=True
    ) as runtime:
        runtime.add(Shipper("shipper"))
        runtime.send("shipper", HOSTILE)
        runtime.send("shipper", "p2")
        await runtime.run_until_idle()
        await runtime.snapshot()
    ledger = runtime.ledger if isinstance(store, MemoryStore) else None
    return Runs(store, demo.run.id, runtime.run_id, ledger)


@pytest.fixture
async def client(runs: Runs) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(runs.store, ledger=runs.ledger)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://inspector") as client:
        yield client


@pytest.fixture
async def forking(runs: Runs) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(runs.store, allow_fork=True, ledger=runs.ledger)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://inspector") as client:
        yield client


async def get(client: httpx.AsyncClient, url: str, expect: int = 200, **params: Any) -> Any:
    response = await client.get(url, params=params)
    assert response.status_code == expect, response.text
    assert response.headers["content-type"].startswith("application/json")
    return response.json()


# --- runs ---


async def test_runs_are_listed_newest_first_and_filtered(
    client: httpx.AsyncClient, runs: Runs
) -> None:
    listed = await get(client, "/api/runs")
    assert listed["total"] == 2
    assert [r["id"] for r in listed["runs"]] == [runs.shipping, runs.demo]
    demo = listed["runs"][1]
    assert demo["name"] == "demo"
    assert demo["status"] == "succeeded"
    assert demo["snapshots"] >= 2
    assert demo["rollbacks"] == 1
    assert demo["parent_run_id"] is None
    assert isinstance(demo["created_at_us"], int)
    shipping = listed["runs"][0]
    assert shipping["name"] == f"ship {HOSTILE}"  # as data, unescaped
    assert shipping["tags"] == ["env", "team=ops"]

    assert [r["id"] for r in (await get(client, "/api/runs", q=runs.demo[:6]))["runs"]] == [
        runs.demo
    ]
    assert [r["id"] for r in (await get(client, "/api/runs", q="SHIP"))["runs"]] == [runs.shipping]
    assert (await get(client, "/api/runs", tag="team=ops"))["total"] == 1
    assert (await get(client, "/api/runs", tag="team=dev"))["total"] == 0
    assert (await get(client, "/api/runs", tag="env"))["total"] == 1
    assert (await get(client, "/api/runs", status="failed"))["total"] == 0
    page = await get(client, "/api/runs", limit=1, offset=1)
    assert page["total"] == 2
    assert [r["id"] for r in page["runs"]] == [runs.demo]
    wrong = await get(client, "/api/runs", 422, status="sleeping")
    assert "sleeping" in wrong["error"]
    assert "error" in await get(client, "/api/runs", 422, limit=0)


async def test_a_run_shows_its_agents_span_clock_and_schemas(
    client: httpx.AsyncClient, runs: Runs
) -> None:
    run = await get(client, f"/api/runs/{runs.demo[:8]}")
    assert run["id"] == runs.demo
    assert run["agents"] == ["critic", "planner", "researcher", "writer"]
    assert run["start_us"] <= run["end_us"]
    assert run["messages"] > 0
    assert run["lamport_max"] >= run["messages"]  # every send and delivery ticks a clock
    assert run["forks"] == []
    assert run["tool_calls"] == 0
    writer = run["schemas"]["writer"]
    assert writer["properties"]["drafts"]["type"] == "array"
    shipping = await get(client, f"/api/runs/{runs.shipping}")
    assert shipping["tool_calls"] == 2
    missing = await get(client, "/api/runs/nope", 404)
    assert "nope" in missing["error"]


# --- snapshots ---


async def test_snapshots_carry_their_cut_line(client: httpx.AsyncClient, runs: Runs) -> None:
    snapshots = (await get(client, f"/api/runs/{runs.demo}/snapshots"))["snapshots"]
    assert [s["seq"] for s in snapshots] == sorted(s["seq"] for s in snapshots)
    complete = [s for s in snapshots if s["status"] == "complete"]
    assert len(complete) >= 2
    for snapshot in complete:
        assert set(snapshot["recorded"]) >= {"planner", "researcher", "writer", "critic"}
        for place in snapshot["recorded"].values():
            assert isinstance(place["at_us"], int)
            assert place["lc"] >= 0
    # The researcher snapshot (taken before the notes went out) holds them in flight.
    researched = next(s for s in complete if s["initiator"] == "researcher")
    assert researched["in_flight"] == 1
    # The researcher recorded after its own events so far: its clock is past the start.
    assert researched["recorded"]["researcher"]["lc"] > 0

    detail = await get(client, f"/api/runs/{runs.demo}/snapshots/{researched['id'][:10]}")
    assert detail["id"] == researched["id"]
    assert detail["agents"]["researcher"]["state"]["notes"]
    assert detail["agents"]["researcher"]["counters"]["sent"]["writer"] >= 0
    assert isinstance(detail["agents"]["writer"]["state_hash"], str)
    (channel,) = [c for c in detail["channels"] if c["in_flight"]]
    assert (channel["src"], channel["dst"]) == ("researcher", "writer")
    assert channel["in_flight"][0]["payload"]["notes"]
    await get(client, f"/api/runs/{runs.shipping}/snapshots/{researched['id']}", 404)
    await get(client, f"/api/runs/{runs.demo}/snapshots/feedbeef", 404)


async def test_an_agents_history_and_a_diff(client: httpx.AsyncClient, runs: Runs) -> None:
    history = await get(client, f"/api/runs/{runs.demo}/agents/writer/history")
    assert history["agent"] == "writer"
    versions = history["snapshots"]
    assert versions[0]["changed"] is True  # the first one is new
    assert versions[-1]["state"]["drafts"]
    assert any(not v["changed"] for v in versions) or len(versions) == len(
        {v["state_hash"] for v in versions}
    )
    await get(client, f"/api/runs/{runs.demo}/agents/nobody/history", 404)

    first, last = versions[0]["id"], versions[-1]["id"]
    diff = await get(client, f"/api/runs/{runs.demo}/diff", a=first, b=last)
    assert (diff["a"], diff["b"]) == (first, last)
    assert "drafts" in diff["agents"]["writer"]["fields"]["changed"]
    only = await get(client, f"/api/runs/{runs.demo}/diff", a=first, b=last, agent="critic")
    assert set(only["agents"]) <= {"critic"}
    assert "error" in await get(client, f"/api/runs/{runs.demo}/diff", 422, a=first)


# --- messages ---


async def test_the_whole_run_exactly_on_both_axes(client: httpx.AsyncClient, runs: Runs) -> None:
    url = f"/api/runs/{runs.demo}/messages"
    wall = await get(client, url)
    lamport = await get(client, url, axis="lamport")
    assert wall["mode"] == lamport["mode"] == "exact"
    messages = wall["messages"]
    assert len(messages) == len(lamport["messages"])
    assert [m["sent_us"] for m in messages] == sorted(m["sent_us"] for m in messages)
    lcs = [m["sent_lc"] for m in lamport["messages"]]
    assert lcs == sorted(lcs)
    for m in messages:
        if m["delivered_us"] is not None:
            assert m["delivered_lc"] > m["sent_lc"]  # a delivery comes after its send
            assert m["delivered_us"] >= m["sent_us"]
    # Each process's clock grows with its own events, in time order.
    for agent in {m["src"] for m in messages} | {m["dst"] for m in messages}:
        events = sorted(
            [(m["sent_us"], m["sent_lc"]) for m in messages if m["src"] == agent]
            + [
                (m["delivered_us"], m["delivered_lc"])
                for m in messages
                if m["dst"] == agent and m["delivered_us"] is not None
            ]
        )
        clocks = [lc for _, lc in events]
        assert clocks == sorted(clocks), agent


async def test_a_window_holds_what_touches_it(client: httpx.AsyncClient, runs: Runs) -> None:
    url = f"/api/runs/{runs.demo}/messages"
    everything = (await get(client, url))["messages"]
    middle = everything[len(everything) // 2]
    low = high = middle["sent_us"]
    window = await get(client, url, **{"from": low, "to": high})
    assert window["mode"] == "exact"
    found = window["messages"]
    assert middle in found
    for m in found:  # each line from send to delivery meets the window
        end = m["delivered_us"] if m["delivered_us"] is not None else m["sent_us"]
        assert m["sent_us"] <= high
        assert end >= low
    expected = [
        m
        for m in everything
        if m["sent_us"] <= high
        and (m["delivered_us"] if m["delivered_us"] is not None else m["sent_us"]) >= low
    ]
    assert sorted(map(repr, found)) == sorted(map(repr, expected))
    lc = middle["sent_lc"]
    by_clock = await get(client, url, axis="lamport", **{"from": lc, "to": lc})
    assert middle in by_clock["messages"]
    mine = await get(client, url, agents="critic")
    assert mine["messages"]
    assert all("critic" in (m["src"], m["dst"]) for m in mine["messages"])
    assert "error" in await get(client, url, 422, **{"from": 10, "to": 5})
    assert "error" in await get(client, url, 422, axis="sideways")


async def test_past_the_limit_a_window_is_counted_per_channel(
    client: httpx.AsyncClient, runs: Runs
) -> None:
    url = f"/api/runs/{runs.demo}/messages"
    everything = (await get(client, url))["messages"]
    for axis in ("wall", "lamport"):
        dense = await get(client, url, axis=axis, limit=2, bins=7)
        assert dense["mode"] == "density"
        assert dense["bins"] == 7
        assert "messages" not in dense
        total = 0
        for channel in dense["channels"]:
            assert len(channel["counts"]) == 7
            sent = [
                m for m in everything if (m["src"], m["dst"]) == (channel["src"], channel["dst"])
            ]
            assert sum(channel["counts"]) == len(sent)
            total += sum(channel["counts"])
        assert total == len(everything)


async def test_messages_a_rollback_threw_away_are_marked(
    client: httpx.AsyncClient, runs: Runs
) -> None:
    messages = (await get(client, f"/api/runs/{runs.demo}/messages"))["messages"]
    (rollback,) = (await get(client, f"/api/runs/{runs.demo}/events"))["rollbacks"]
    assert "cites no sources" in rollback["reason"]
    cut = await get(client, f"/api/runs/{runs.demo}/snapshots/{rollback['snapshot_id']}")
    discarded = [m for m in messages if m["discarded"]]
    # The rejected draft went to the critic after the cut: its timeline was thrown away.
    assert any(m["src"] == "writer" and m["dst"] == "critic" for m in discarded)
    for m in messages:
        sent_after_cut = m["seq"] > cut["agents"][m["src"]]["counters"]["sent"].get(m["dst"], 0)
        before_rollback = m["sent_us"] <= rollback["at_us"]
        thrown = m["src"] != "$env" and sent_after_cut and before_rollback
        assert m["discarded"] is (thrown and m["sent_us"] >= cut["started_at_us"]), m
    # What was sent after the rollback is the run's history.
    assert any(m["sent_us"] > rollback["at_us"] and not m["discarded"] for m in messages)


async def test_one_message_with_its_payload(client: httpx.AsyncClient, runs: Runs) -> None:
    messages = (await get(client, f"/api/runs/{runs.shipping}/messages"))["messages"]
    first = messages[0]
    assert (first["src"], first["dst"], first["seq"]) == ("$env", "shipper", 1)
    url = f"/api/runs/{runs.shipping}/messages/$env/shipper/1"
    found = await get(client, url)
    assert found["payload"] == HOSTILE  # as data
    assert isinstance(found["headers"], dict)
    assert found["sent_us"] == first["sent_us"]
    assert (await get(client, url, sent_us=first["sent_us"]))["payload"] == HOSTILE
    await get(client, url, 404, sent_us=1)
    await get(client, f"/api/runs/{runs.shipping}/messages/$env/shipper/99", 404)
    await get(client, f"/api/runs/{runs.shipping}/messages/$env/shipper/x", 422)


# --- events and tools ---


async def test_events_in_a_window(client: httpx.AsyncClient, runs: Runs) -> None:
    events = await get(client, f"/api/runs/{runs.demo}/events")
    (rollback,) = events["rollbacks"]
    assert rollback["agent"] == "writer"
    assert rollback["source"] == "critic"
    assert rollback["lc"] > 0
    before = await get(client, f"/api/runs/{runs.demo}/events", to=rollback["at_us"] - 1)
    assert before["rollbacks"] == []
    lamport = await get(client, f"/api/runs/{runs.demo}/events", axis="lamport", to=rollback["lc"])
    assert [r["id"] for r in lamport["rollbacks"]] == [rollback["id"]]
    shipping = await get(client, f"/api/runs/{runs.shipping}/events")
    assert [c["tool"] for c in shipping["tool_calls"]] == ["ui_ship", "ui_ship"]
    assert all(c["agent"] == "shipper" and c["lc"] > 0 for c in shipping["tool_calls"])


async def test_tool_calls_are_listed_and_filtered(client: httpx.AsyncClient, runs: Runs) -> None:
    url = f"/api/runs/{runs.shipping}/tools"
    listed = await get(client, url)
    assert listed["total"] == 2
    call = listed["calls"][0]
    assert call["tool"] == "ui_ship"
    assert call["status"] == "succeeded"
    assert call["unknown"] is False
    assert call["outcome"] == {"tracking": f"T-{HOSTILE}"}
    assert call["attempts"] == 1
    assert call["started_at_us"] <= call["finished_at_us"]
    assert (await get(client, url, tool="other"))["total"] == 0
    assert (await get(client, url, status="succeeded"))["total"] == 2
    assert (await get(client, url, q="SHIPPER"))["total"] == 2
    page = await get(client, url, limit=1, offset=1)
    assert (page["total"], len(page["calls"])) == (2, 1)
    assert "error" in await get(client, url, 422, status="weird")
    assert (await get(client, f"/api/runs/{runs.demo}/tools"))["calls"] == []


# --- fork and bisect ---


async def first_complete(client: httpx.AsyncClient, run: str, initiator: str) -> dict[str, Any]:
    snapshots = (await get(client, f"/api/runs/{run}/snapshots"))["snapshots"]
    return next(s for s in snapshots if s["status"] == "complete" and s["initiator"] == initiator)


async def test_forking_is_refused_unless_allowed(client: httpx.AsyncClient, runs: Runs) -> None:
    cut = await first_complete(client, runs.demo, "researcher")
    response = await client.post(f"/api/runs/{runs.demo}/fork", json={"snapshot": cut["id"]})
    assert response.status_code == 403
    assert "--allow-fork" in response.json()["error"]
    assert (await get(client, "/api/runs"))["total"] == 2


async def test_a_fork_with_edited_states(forking: httpx.AsyncClient, runs: Runs) -> None:
    cut = await first_complete(forking, runs.demo, "researcher")
    detail = await get(forking, f"/api/runs/{runs.demo}/snapshots/{cut['id']}")
    writer = dict(detail["agents"]["writer"]["state"])
    writer["drafts"] = ["an edited draft [1]"]
    response = await forking.post(
        f"/api/runs/{runs.demo}/fork",
        json={"snapshot": cut["id"][:12], "states": {"writer": writer}, "name": "edited"},
    )
    assert response.status_code == 201, response.text
    run = response.json()["run"]
    assert (run["parent_run_id"], run["parent_snapshot_id"]) == (runs.demo, cut["id"])
    assert run["name"] == "edited"
    assert run["snapshots"] == 1
    forked = await get(forking, f"/api/runs/{run['id']}")
    assert forked["schemas"] == (await get(forking, f"/api/runs/{runs.demo}"))["schemas"]
    (first,) = (await get(forking, f"/api/runs/{run['id']}/snapshots"))["snapshots"]
    copy = await get(forking, f"/api/runs/{run['id']}/snapshots/{first['id']}")
    assert copy["agents"]["writer"]["state"]["drafts"] == ["an edited draft [1]"]
    assert copy["agents"]["critic"] == detail["agents"]["critic"]
    parent = await get(forking, f"/api/runs/{runs.demo}")
    assert parent["forks"] == [{"run_id": run["id"], "snapshot_id": cut["id"]}]


@pytest.mark.parametrize(
    ("states", "agent", "path", "words"),
    [
        ({"writer": {"drafts": "one"}}, "writer", "$.drafts", "is not of type 'array'"),
        ({"writer": {"drafts": [1]}}, "writer", "$.drafts[0]", "is not of type 'string'"),
        ({"writer": [1]}, "writer", "$", "a JSON object"),
        ({"nobody": {}}, "nobody", "$", "not an agent"),
    ],
)
async def test_an_invalid_edit_is_refused_with_its_problems(
    forking: httpx.AsyncClient,
    runs: Runs,
    states: dict[str, Any],
    agent: str,
    path: str,
    words: str,
) -> None:
    cut = await first_complete(forking, runs.demo, "researcher")
    response = await forking.post(
        f"/api/runs/{runs.demo}/fork", json={"snapshot": cut["id"], "states": states}
    )
    assert response.status_code == 422, response.text
    body = response.json()
    assert words in body["error"]
    (problem,) = body["problems"]
    assert (problem["agent"], problem["path"]) == (agent, path)
    assert words in problem["message"]
    assert (await get(forking, "/api/runs"))["total"] == 2  # nothing was written


async def test_fork_errors(forking: httpx.AsyncClient, runs: Runs) -> None:
    response = await forking.post(f"/api/runs/{runs.demo}/fork", json={"snapshot": "feedbeef"})
    assert response.status_code == 404
    response = await forking.post(f"/api/runs/{runs.demo}/fork", json={"states": {}})
    assert response.status_code == 422
    assert "snapshot" in response.json()["error"]
    snapshots = (await get(forking, f"/api/runs/{runs.demo}/snapshots"))["snapshots"]
    failed = [s for s in snapshots if s["status"] == "failed"]
    if failed:
        response = await forking.post(
            f"/api/runs/{runs.demo}/fork", json={"snapshot": failed[0]["id"]}
        )
        assert response.status_code == 422
        assert "fork from a complete one" in response.json()["error"]


async def test_bisect_finds_where_a_condition_stopped_holding(
    client: httpx.AsyncClient, runs: Runs
) -> None:
    url = f"/api/runs/{runs.demo}/bisect"
    response = await client.post(url, json={"path": "$.writer.drafts", "op": "len<", "value": 1})
    assert response.status_code == 200, response.text
    found = response.json()
    history = (await get(client, f"/api/runs/{runs.demo}/agents/writer/history"))["snapshots"]
    first_bad = next(v for v in history if v["state"]["drafts"])
    assert found["first_bad"]["id"] == first_bad["id"]
    good = [v for v in history if v["seq"] < first_bad["seq"]]
    assert found["last_good"]["id"] == good[-1]["id"]
    assert "drafts" in found["diff"]["agents"]["writer"]["fields"]["changed"]
    assert found["holds_at_first"] is True
    assert 1 <= found["checked"] <= len(history)

    always = await client.post(url, json={"path": "$.writer", "op": "exists"})
    assert always.json()["first_bad"] is None
    assert always.json()["last_good"]["id"] == history[-1]["id"]
    never = await client.post(url, json={"path": "$.nobody", "op": "exists"})
    assert never.json()["holds_at_first"] is False
    assert never.json()["first_bad"]["id"] == history[0]["id"]
    bad = await client.post(url, json={"path": "writer", "op": "=="})
    assert bad.status_code == 422
    assert "must start with $" in bad.json()["error"]
    bad = await client.post(url, json={"path": "$.writer", "op": "~="})
    assert bad.status_code == 422
    assert "unknown operator" in bad.json()["error"]


# --- the page and the description ---


async def test_the_page_and_the_api_description(client: httpx.AsyncClient) -> None:
    page = await client.get("/")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    described = await get(client, "/openapi.json")
    assert "/api/runs/{run}/messages" in described["paths"]
    docs = await client.get("/docs")
    assert docs.status_code == 200
    missing = await client.get("/static/no-such-file.js")
    assert missing.status_code == 404
    assert "error" in missing.json()
    assert (await client.get("/api/nowhere")).status_code == 404


async def test_a_run_that_goes_on_is_read_again(store: Store) -> None:
    app = create_app(store)
    transport = httpx.ASGITransport(app=app)
    async with (
        httpx.AsyncClient(transport=transport, base_url="http://inspector") as client,
        Runtime(store=store, journal=True) as runtime,
    ):
        runtime.add(Shipper("shipper"))
        runtime.send("shipper", "p1")
        await runtime.run_until_idle()
        url = f"/api/runs/{runtime.run_id}/messages"
        assert len((await get(client, url))["messages"]) == 1
        assert (await get(client, url))["messages"][0]["src"] == "$env"
        runtime.send("shipper", "p2")
        runtime.send("shipper", "p3")
        await runtime.run_until_idle()
        assert [m["seq"] for m in (await get(client, url))["messages"]] == [1, 2, 3]


class Maker(Agent[AgentState]):
    """Sends a draft per message; the draft is good once it has had two rejections."""

    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        ctx.state.memory["seen"] = message.payload
        good = len(ctx.feedback) >= 2
        ctx.send("judge", {"good": good, "try": len(ctx.feedback)}, kind="draft")


class Judge(Agent[AgentState]):
    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        payload = message.payload
        assert isinstance(payload, dict)
        if not payload["good"]:
            ctx.reject("maker", f"try {payload['try']} is not good enough")
        ctx.state.memory["accepted"] = payload["try"]


async def test_each_rollback_discards_its_own_timeline(store: Store) -> None:
    async with Runtime(store=store, journal=True) as runtime:
        runtime.add(Maker("maker"))
        runtime.add(Judge("judge"))
        await runtime.snapshot()
        runtime.send("maker", "go")
        await runtime.run_until_idle()
    app = create_app(store)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://inspector") as client:
        run = runtime.run_id
        rollbacks = (await get(client, f"/api/runs/{run}/events"))["rollbacks"]
        assert len(rollbacks) == 2
        drafts = [
            m
            for m in (await get(client, f"/api/runs/{run}/messages"))["messages"]
            if m["kind"] == "draft"
        ]
        # Three drafts, all numbered 1 (each rollback took the number back): the two
        # rejected ones were thrown away, the accepted one is the run's history.
        assert [m["seq"] for m in drafts] == [1, 1, 1]
        assert [m["discarded"] for m in drafts] == [True, True, False]
        assert drafts[0]["sent_us"] <= rollbacks[0]["at_us"] <= drafts[1]["sent_us"]
        assert drafts[1]["sent_us"] <= rollbacks[1]["at_us"] <= drafts[2]["sent_us"]
        found = await get(client, f"/api/runs/{run}/messages/maker/judge/1")
        assert found["payload"] == {"good": True, "try": 2}  # the latest send of the number
        first = await get(
            client, f"/api/runs/{run}/messages/maker/judge/1", sent_us=drafts[0]["sent_us"]
        )
        assert first["payload"] == {"good": False, "try": 0}
        assert first["discarded"] is True


async def test_a_run_without_a_journal_has_snapshots_and_no_messages(store: Store) -> None:
    demo = await run_demo(store, demo_model(delay=0.01), journal=False)
    transport = httpx.ASGITransport(app=create_app(store))
    async with httpx.AsyncClient(transport=transport, base_url="http://inspector") as client:
        run = await get(client, f"/api/runs/{demo.run.id}")
        assert (run["messages"], run["lamport_max"], run["journal"]) == (0, 0, False)
        assert run["agents"] == ["critic", "planner", "researcher", "writer"]
        for axis in ("wall", "lamport"):
            window = await get(client, f"/api/runs/{demo.run.id}/messages", axis=axis)
            assert window == {
                "mode": "exact",
                "from": window["from"],
                "to": window["to"],
                "messages": [],
            }
        snapshots = (await get(client, f"/api/runs/{demo.run.id}/snapshots"))["snapshots"]
        for snapshot in snapshots:
            for place in snapshot["recorded"].values():
                assert place == {"at_us": snapshot["started_at_us"], "lc": 0}


async def test_live_tokens_move_on_when_a_run_changes_and_only_then(runs: Runs) -> None:
    app = create_app(runs.store, ledger=runs.ledger)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://inspector") as client:
        async with Runtime(store=runs.store, name="followed", journal=True) as runtime:
            runtime.add(Shipper("shipper"))
            first = await get(client, "/api/live", run=runtime.run_id)
            assert first["running"] is True
            again = await get(client, "/api/live", run=runtime.run_id)
            assert again == first, "nothing changed: the same tokens"
            runtime.send("shipper", "p3")
            await runtime.run_until_idle()
            await runtime.snapshot()
            moved = await get(client, "/api/live", run=runtime.run_id)
            assert moved["run"] != first["run"], "a message, a tool call and a snapshot"
            assert moved["runs"] != first["runs"], "the list counts the run's snapshots"
            other = await get(client, "/api/live", run=runs.demo)
            assert other["running"] is False
        ended = await get(client, "/api/live", run=runtime.run_id)
        assert ended["run"] != moved["run"]
        assert ended["runs"] != moved["runs"]
        assert ended["running"] is False
        assert (await get(client, "/api/live"))["run"] is None
        await get(client, "/api/live", expect=404, run="no-such-run")


class Relay(Agent[AgentState]):
    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        ctx.send("sink", message.payload)


class Sink(Agent[AgentState]):
    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        ctx.state.memory[str(len(ctx.state.memory))] = message.payload


async def test_a_fork_with_messages_in_flight_dropped_edited_and_added(
    forking: httpx.AsyncClient, runs: Runs
) -> None:
    async with Runtime(store=runs.store, name="relay") as runtime:
        runtime.add(Relay("relay"))
        runtime.add(Sink("sink"))
        for n in range(4):
            runtime.send("relay", n)
        handle = runtime.snapshot()
        await runtime.run_until_idle()
        cut = await handle
    detail = await get(forking, f"/api/runs/{runtime.run_id}/snapshots/{cut.id}")
    (channel,) = detail["channels"]
    flying = [m["id"] for m in channel["in_flight"]]
    assert len(flying) >= 2
    response = await forking.post(
        f"/api/runs/{runtime.run_id}/fork",
        json={
            "snapshot": cut.id,
            "messages": {
                "drop": [flying[0]],
                "edit": {flying[-1]: "edited"},
                "add": [{"src": "relay", "dst": "sink", "payload": "added"}],
            },
        },
    )
    assert response.status_code == 201, response.text
    run = response.json()["run"]
    (first,) = (await get(forking, f"/api/runs/{run['id']}/snapshots"))["snapshots"]
    copy = await get(forking, f"/api/runs/{run['id']}/snapshots/{first['id']}")
    (forked,) = copy["channels"]
    payloads = [m["payload"] for m in forked["in_flight"]]
    assert payloads[-2:] == ["edited", "added"]
    assert len(payloads) == len(flying) + 1 - 1
    # A message not in flight: 422 with the problem, and nothing written.
    total = (await get(forking, "/api/runs"))["total"]
    response = await forking.post(
        f"/api/runs/{runtime.run_id}/fork",
        json={"snapshot": cut.id, "messages": {"drop": ["relay>sink#999"]}},
    )
    assert response.status_code == 422, response.text
    (problem,) = response.json()["problems"]
    assert problem["path"] == "message relay>sink#999"
    assert "not in flight" in problem["message"]
    assert (await get(forking, "/api/runs"))["total"] == total
