"""The inspector's event history, resolution of unknown tool outcomes and fork comparison,
over HTTP: executions filtered by agent, kind, status and text, placed between their cuts;
an unknown outcome resolved only with ``--allow-run`` and the token (else the command);
a dry fork beside its parent."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentsnap import Agent, AgentState, Context, Message, Runtime, tool
from agentsnap.inspect import events_table, fork_run
from agentsnap.ledger import ToolCallStatus
from agentsnap.records import SnapshotStatus
from agentsnap.store.ledger import ledger_for
from agentsnap.store.sql import SqlStore
from agentsnap.ui._routes_timeline import idle_gaps
from agentsnap.ui.server import create_app

from .workflows import Runs, counters_run

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from test_run_command import DEADLINE, Payroll, killed_on_exit, wait_until


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqlStore]:
    made = SqlStore(f"sqlite:///{tmp_path / 'events.db'}")
    try:
        yield made
    finally:
        await made.close()


def client_for(store: SqlStore, **options: Any) -> httpx.AsyncClient:
    app = create_app(store, **options)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://ui")


async def test_executions_are_the_events_table_with_their_cuts_and_filters(
    runs_db: tuple[str, Runs],
) -> None:
    url, runs = runs_db
    store = SqlStore(url, create=False)
    try:
        async with client_for(store) as client:
            base = f"/api/runs/{runs.counters}/executions"
            body = (await client.get(base)).json()
            table = await events_table(store, runs.counters)
            assert [r["message"] for r in body["executions"]] == [r.message for r in table]
            assert body["agents"] == ["alpha", "beta"]
            assert body["kinds"] == ["echo", "work"]
            first = body["executions"][0]
            assert (first["agent"], first["src"], first["seq"]) == ("alpha", "$env", 1)
            snapshots = [s.id for s in await store.list_snapshots(runs.counters)]
            assert first["cut_before"] == snapshots[0], "the run's first cut, before any"
            assert first["cut_after"] == snapshots[1], "the first round's cut holds it"
            assert first["started_at_us"] > 0
            # The call whose owner died was made handling it.
            assert [c["key"] for c in first["tool_calls"]] == ["stamp:lost"]
            assert first["status"] == "unknown"
            unknown = (await client.get(base, params={"status": "unknown"})).json()
            assert [r["message"] for r in unknown["executions"]] == [first["message"]]
            second = body["executions"][1]
            assert second["status"] == "ok"

            betas = (await client.get(base, params={"agent": "beta"})).json()["executions"]
            assert betas
            assert {r["agent"] for r in betas} == {"beta"}
            assert {r["kind"] for r in betas} == {"echo"}

            wrong = (await client.get(base, params={"q": "WRONG"})).json()["executions"]
            assert [(r["agent"], r["payload"]) for r in wrong] == [
                ("alpha", {"round": "wrong"}),
                ("beta", {"round": "wrong"}),
            ]
            # Text in the agent's state at the cut after the execution.
            labelled = (await client.get(base, params={"q": "seen 3"})).json()["executions"]
            assert labelled
            assert all("seen 3" not in str(r) for r in labelled)

            # The demo's critic rejected a draft: what the rollback undid is discarded.
            demo = f"/api/runs/{runs.demo}/executions"
            discarded = (await client.get(demo, params={"status": "discarded"})).json()
            assert discarded["executions"]
            assert {r["timeline"] for r in discarded["executions"]} == {0}
            everything = (await client.get(demo)).json()["executions"]
            assert any(r["timeline"] == 1 and r["status"] == "ok" for r in everything)

            refused = await client.get(base, params={"status": "lost"})
            assert refused.status_code == 422
            assert "use one of ok, discarded, failed, unknown" in refused.json()["error"]
    finally:
        await store.close()


async def test_an_unknown_outcome_is_resolved_only_when_allowed_and_with_the_token(
    store: SqlStore,
) -> None:
    run_id = await counters_run(store, store.url)
    path = f"/api/runs/{run_id}/tools"
    async with client_for(store) as client:
        told = (await client.get(f"{path}/resolution", params={"key": "stamp:lost"})).json()
        assert told["unknown"] is True
        assert told["allow_run"] is False
        assert told["commands"]["retry"] == (
            f"agentsnap tools resolve stamp:lost --retry --db {store.url}"
        )
        assert told["commands"]["succeeded"].startswith(
            "agentsnap tools resolve stamp:lost --result JSON"
        )
        token = (await client.get("/api/session")).json()["token"]
        refused = await client.post(
            f"{path}/resolve",
            json={"key": "stamp:lost", "outcome": "succeeded", "result": "stamp-99"},
            headers={"x-agentsnap-token": token},
        )
        assert refused.status_code == 403
        assert (
            "agentsnap tools resolve stamp:lost --result '\"stamp-99\"' --db"
            in refused.json()["error"]
        )
    async with client_for(store, allow_run=True) as client:
        token = (await client.get("/api/session")).json()["token"]
        body = {"key": "stamp:lost", "outcome": "failed", "error": "no stamp was made"}
        without = await client.post(f"{path}/resolve", json=body)
        assert without.status_code == 403
        assert "X-Agentsnap-Token" in without.json()["error"]
        missing = await client.post(
            f"{path}/resolve",
            json={**body, "key": "stamp:nope"},
            headers={"x-agentsnap-token": token},
        )
        assert missing.status_code == 404
        done = await client.post(f"{path}/resolve", json=body, headers={"x-agentsnap-token": token})
        assert done.status_code == 200, done.text
        assert done.json()["status"] == "failed"
        again = await client.post(
            f"{path}/resolve", json=body, headers={"x-agentsnap-token": token}
        )
        assert again.status_code == 409
        assert "only a call whose outcome is unknown" in again.json()["error"]
    ledger = ledger_for(store, create=False)
    assert ledger is not None
    try:
        entry = await ledger.get("stamp:lost")
    finally:
        await ledger.close()
    assert entry is not None
    assert entry.status is ToolCallStatus.FAILED
    assert entry.error == "ResolvedFailure: no stamp was made"


SENT: list[str] = []


@tool(side_effect=True, dry_run=lambda arguments: f"dry-{arguments['to']}")
async def mail(to: str) -> str:
    SENT.append(to)
    return f"sent-{to}"


class Relay(Agent[AgentState]):
    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        ctx.send("mailer", message.payload)


class Mailer(Agent[AgentState]):
    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        ctx.state.memory[str(message.payload)] = await mail(ctx, to=str(message.payload))


async def test_a_dry_fork_beside_its_parent(store: SqlStore) -> None:
    async with Runtime(store=store) as parent:
        parent.add(Relay("relay"))
        parent.add(Mailer("mailer"))
        for n in range(3):
            parent.send("relay", f"user{n}")
        handle = parent.snapshot()
        await parent.run_until_idle()
        cut = await handle
        await parent.snapshot()
    assert cut.status is SnapshotStatus.COMPLETE
    made = await fork_run(store, cut.id, tools="dry", name="what if")
    async with Runtime(store=store, run_id=made.id) as fork:
        fork.add(Relay("relay"))
        fork.add(Mailer("mailer"))
        await fork.resume()
        await fork.run_until_idle()
        await fork.snapshot()
    async with client_for(store) as client:
        body = (await client.get(f"/api/runs/{made.id}/compare")).json()
        not_a_fork = await client.get(f"/api/runs/{parent.run_id}/compare")
    assert not_a_fork.status_code == 409
    assert "only a fork is compared with its parent" in not_a_fork.json()["error"]
    assert body["fork"]["tools"] == "dry"
    assert body["parent"]["id"] == parent.run_id
    assert body["fork_point"]["id"] == cut.id
    first, second = body["cuts"][:2]
    assert first["parent"]["id"] == cut.id
    assert all(a["same"] for a in first["agents"]), "a fork starts as a copy of its cut"
    mailer = next(a for a in second["agents"] if a["agent"] == "mailer")
    assert not mailer["same"]
    assert mailer["fork"]["memory"]["user2"] == "dry-user2"
    assert mailer["parent"]["memory"]["user2"] == "sent-user2"
    paired = [row for row in body["tool_calls"] if row["parent"] and row["fork"]]
    assert paired, "the fork's dry calls stand beside the parent's calls with the same arguments"
    assert {row["fork"]["status"] for row in paired} == {"dry"}
    assert {row["parent"]["status"] for row in paired} == {"succeeded"}


def test_idle_gaps_are_the_long_silences() -> None:
    times = [0, 10, 20, 5_000_000, 5_000_010, 12_000_000]
    assert idle_gaps(times, 1_000_000) == [
        {"from_us": 20, "to_us": 5_000_000, "length_us": 4_999_980},
        {"from_us": 5_000_010, "to_us": 12_000_000, "length_us": 6_999_990},
    ]
    assert idle_gaps(times, 6_000_000) == [idle_gaps(times, 1_000_000)[1]]


async def test_a_killed_and_resumed_run_shows_its_stop_resume_and_new_owner(
    tmp_path: Path,
) -> None:
    payroll = Payroll(tmp_path)
    run_id = uuid.uuid4().hex
    with killed_on_exit(
        payroll.start(
            "run",
            "--app",
            "payroll_app:make_app",
            "--input",
            json.dumps({"employees": 8}),
            "--run-id",
            run_id,
        )
    ) as first:
        wait_until(lambda: payroll.progress_lines() >= 2, "a payment", first)
        first.send_signal(signal.SIGKILL)
        first.wait(DEADLINE)
    await asyncio.sleep(1.5)  # the run stays stopped a while: a silence the timeline can place
    resumed = payroll.run("resume", run_id, "--app", "payroll_app:make_app")
    assert resumed.returncode == 0, resumed.stderr
    store = SqlStore(payroll.db, create=False)
    try:
        async with client_for(store) as client:
            body = (await client.get(f"/api/runs/{run_id}/incidents")).json()
    finally:
        await store.close()
    (resume,) = body["resumes"]
    assert resume["stopped_us"] is not None
    assert resume["stopped_us"] <= resume["at_us"]
    assert body["owner_changes"] == 1, "the resuming process took the lease over"
    assert body["owner"] is not None
    assert resume["owner"] == body["owner"], "the resuming process holds the lease"
    assert resume["crashed"] is True, "the killed process never gave the run back"
    (crash,) = body["crashes"]
    assert crash["by"] == body["owner"]
    assert crash["stopped_us"] == resume["stopped_us"]
    assert body["min_gap_us"] >= 1_000_000


async def test_lamport_cuts_sit_between_the_events_they_hold_and_never_cross(
    runs_db: tuple[str, Runs],
) -> None:
    url, runs = runs_db
    store = SqlStore(url, create=False)
    try:
        async with client_for(store) as client:
            snapshots = (await client.get(f"/api/runs/{runs.counters}/snapshots")).json()
            messages = (
                await client.get(f"/api/runs/{runs.counters}/messages", params={"axis": "lamport"})
            ).json()
        cuts = {s.id: s for s in await store.list_snapshots(runs.counters)}
        rollbacks = await store.list_rollbacks(runs.counters)
    finally:
        await store.close()
    assert messages["mode"] == "exact"
    rolled = min(r.at for r in rollbacks)
    complete = [
        s
        for s in snapshots["snapshots"]
        if s["status"] == "complete" and cuts[s["id"]].started_at < rolled
    ]
    assert len(complete) > 3
    for agent in ("$env", "alpha", "beta"):
        clocks = [s["recorded"][agent]["lc"] for s in complete]
        assert clocks == sorted(clocks), f"{agent}'s cuts keep their order: none crosses another"
    for snapshot in complete:
        cut = cuts[snapshot["id"]]
        for agent in ("alpha", "beta"):
            lc = snapshot["recorded"][agent]["lc"]
            held = cut.agents[agent].received
            for m in messages["messages"]:
                if m["dst"] != agent or m["delivered_lc"] is None or m["discarded"]:
                    continue
                if m["seq"] <= held.get(m["src"], 0):
                    assert m["delivered_lc"] <= lc, "a delivery the cut holds is before it"
                else:
                    assert m["delivered_lc"] > lc, "a delivery it does not hold is after it"


async def test_a_cut_taken_between_rounds_stands_at_one_lamport_position(
    runs_db: tuple[str, Runs],
) -> None:
    """The environment, which only sends, keeps no low clock of its own to pull cuts to."""
    url, runs = runs_db
    store = SqlStore(url, create=False)
    try:
        async with client_for(store) as client:
            snapshots = (await client.get(f"/api/runs/{runs.counters}/snapshots")).json()
        rollbacks = await store.list_rollbacks(runs.counters)
        started = {s.id: s.started_at for s in await store.list_snapshots(runs.counters)}
    finally:
        await store.close()
    rolled = min(r.at for r in rollbacks)
    # Each of these was taken once the run was idle: nothing is between its agents.
    between_rounds = [
        s for s in snapshots["snapshots"] if s["status"] == "complete" and started[s["id"]] < rolled
    ]
    assert len(between_rounds) >= 4
    positions = []
    for snapshot in between_rounds:
        clocks = {agent: place["lc"] for agent, place in snapshot["recorded"].items()}
        assert set(clocks) == {"$env", "alpha", "beta"}
        assert len(set(clocks.values())) == 1, f"a straight cut, not a zig-zag: {clocks}"
        positions.append(clocks["$env"])
    assert positions == sorted(positions), "no cut is before the one taken before it"
