"""Runs a user can find, delete and prune: ``agentsnap.store.retention`` and ``agentsnap runs``.

The central property: after a run is deleted, nothing of it is left in any table, and every
other run, a fork of it included, still loads, exports and resumes as before.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from langgraph_graphs import notes_graph
from owners import dead_owner
from payloads import get
from postgres_db import postgres_url_or_skip
from pydantic import Field
from sqlalchemy import create_engine, select

from agentsnap import (
    Agent,
    AgentState,
    ConfigurationError,
    Context,
    Message,
    NotFoundError,
    RunInfo,
    RunStatus,
    Runtime,
    SnapshotStatus,
    tool,
)
from agentsnap.inspect import export_run, fork_run
from agentsnap.integrations.langgraph import AgentsnapSaver, GraphAgent
from agentsnap.ledger import owner_id
from agentsnap.messages import JsonValue
from agentsnap.model_calls import ModelCallRecord
from agentsnap.records import SnapshotPart, utcnow
from agentsnap.requests import HumanRequest
from agentsnap.store.migrate import sync_url
from agentsnap.store.retention import (
    LANGGRAPH_ROWS,
    DeleteRefused,
    delete_runs,
    prune_runs,
)
from agentsnap.store.sql import SqlStore
from agentsnap.store.sql_ledger import SqlLedger
from agentsnap.store.tables import Base

AGENTSNAP = Path(sys.executable).parent / "agentsnap"

# -- a workload that leaves something in every table ------------------------------------------

CHARGED: list[str] = []


@tool(side_effect=True)
async def charge(order: str, amount: int) -> dict[str, Any]:
    """The outside world: a payment, counted each time it really happens."""
    CHARGED.append(order)
    return {"order": order, "amount": amount, "receipt": f"r-{len(CHARGED)}"}


# Long enough to be stored in chunks shared by every state that holds it.
CATALOGUE = [f"item {i:04d}: " + "x" * 80 for i in range(300)]


class InboxState(AgentState):
    replies: list[Any] = Field(default_factory=list)


class Inbox(Agent[InboxState]):
    """Sends notes to the graph agent and orders to the shop; keeps the graph's replies."""

    async def handle(self, message: Message, ctx: Context[InboxState]) -> None:
        if message.kind == "result":
            ctx.state.replies.append(message.payload)
        elif message.kind == "note":
            ctx.send("graph", {"notes": [message.payload]})
        else:
            ctx.send("shop", message.payload, kind="order")


class ShopState(AgentState):
    catalogue: list[str] = Field(default_factory=lambda: list(CATALOGUE))
    sold: list[str] = Field(default_factory=list)


class Shop(Agent[ShopState]):
    """Charges each order once (the ledger sees to it), then asks the critic."""

    async def handle(self, message: Message, ctx: Context[ShopState]) -> None:
        order = get(message.payload, "order", str)
        paid = await charge(ctx, order=order, amount=12)
        ctx.state.sold.append(order)
        ctx.send(
            "critic", {"order": order, "receipt": paid["receipt"], "fixed": bool(ctx.feedback)}
        )


class CriticState(AgentState):
    accepted: list[Any] = Field(default_factory=list)


class Critic(Agent[CriticState]):
    """Rejects the shop's first answer to each order: the run rolls back once per order."""

    async def handle(self, message: Message, ctx: Context[CriticState]) -> None:
        if not get(message.payload, "fixed", bool):
            ctx.reject("shop", "say the order is fixed")
        ctx.state.accepted.append(message.payload)


def team(runtime: Runtime, saver: AgentsnapSaver) -> GraphAgent:
    """The workload's agents; returns the graph agent."""
    runtime.add(Inbox("inbox"))
    graph = runtime.add(GraphAgent("graph", notes_graph(), checkpointer=saver))
    runtime.add(Shop("shop"))
    runtime.add(Critic("critic"))
    assert isinstance(graph, GraphAgent)
    return graph


async def work(runtime: Runtime, note: str, order: str) -> None:
    runtime.send("inbox", note, kind="note")
    # The graph records on the environment's marker, before the note the inbox sends it
    # arrives: the snapshot holds that note in flight.
    await runtime.snapshot()
    await runtime.run_until_idle()
    runtime.send("inbox", {"order": order}, kind="order")
    await runtime.run_until_idle()
    await runtime.snapshot()


def model_call(run_id: str, position: int) -> ModelCallRecord:
    """The shop's ``position``-th model call: the conversation so far, then the question."""
    messages: list[JsonValue] = [{"role": "system", "content": "You run a shop."}]
    for earlier in range(position):
        messages += [
            {"role": "user", "content": f"price of order {earlier}?"},
            {"role": "assistant", "content": "12"},
        ]
    messages.append({"role": "user", "content": f"price of order {position}?"})
    return ModelCallRecord(
        run_id=run_id,
        agent="shop",
        message_id="inbox>shop#1",
        position=position,
        timeline=0,
        request={"messages": messages},
        response={"text": "12"},
        model=None,
        input_tokens=len(messages),
        output_tokens=1,
        started_at=utcnow(),
        latency_ms=3.0,
    )


class Stop(Exception):
    """Leaves a runtime's block: its run is recorded failed, and can be resumed."""


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'agentsnap.db'}"
    return postgres_url_or_skip()


@dataclass
class Database:
    url: str
    store: SqlStore
    saver: AgentsnapSaver


@pytest.fixture
async def database(url: str) -> AsyncIterator[Database]:
    store = SqlStore(url)
    saver = AgentsnapSaver(url)
    try:
        yield Database(url, store, saver)
    finally:
        await store.close()
        saver.close()


def all_rows(url: str) -> dict[str, list[dict[str, Any]]]:
    """Every row of every agentsnap table, by table."""
    engine = create_engine(sync_url(url))
    try:
        with engine.connect() as connection:
            return {
                table.name: [dict(row._mapping) for row in connection.execute(select(table))]
                for table in Base.metadata.sorted_tables
            }
    finally:
        engine.dispose()


def mentions(value: object, needles: set[str]) -> bool:
    if isinstance(value, bytes | memoryview):
        text = bytes(value).decode("utf-8", "replace")
    elif isinstance(value, str):
        text = value
    else:
        return False
    return any(needle in text for needle in needles)


def orphan_states(rows: dict[str, list[dict[str, Any]]]) -> list[str]:
    """Stored states no snapshot refers to, and chunks no stored state reaches."""
    used = {row["state_hash"] for row in rows["agentsnap_snapshot_agents"]}
    states = rows["agentsnap_state_blobs"]
    orphans = [row["hash"] for row in states if row["hash"] not in used]
    chunks = {row["hash"]: row for row in rows.get("agentsnap_state_chunks", [])}
    if not chunks:
        return orphans
    reached: set[str] = set()
    todo = [
        row["roots"][i : i + 64] for row in states for i in range(0, len(row["roots"] or ""), 64)
    ]
    while todo:
        found = todo.pop()
        if found in reached or found not in chunks:
            continue
        reached.add(found)
        chunk = chunks[found]
        if chunk["height"] > 0:
            todo += [chunk["body"][i : i + 64] for i in range(0, len(chunk["body"]), 64)]
    return orphans + [found for found in chunks if found not in reached]


async def test_a_deleted_run_leaves_nothing_behind_and_its_fork_lives_on(
    database: Database,
) -> None:
    store, saver = database.store, database.saver
    CHARGED.clear()
    async with Runtime(
        store=store, journal=True, name="nightly", tags={"team": "billing"}
    ) as first:
        team(first, saver)
        await work(first, "a", "A-1")
    assert len(first.rollbacks) == 1
    assert CHARGED == ["A-1"]  # the retry got the ledger's outcome
    start = (await store.list_snapshots(first.run_id))[0]
    assert start.agents["graph"].state["thread_id"] is None  # before the graph ran

    fork = await fork_run(store, start.id)

    async def run_the_fork() -> None:
        async with Runtime(store=store, run_id=fork.id, journal=True) as second:
            team(second, saver)
            await second.resume()
            await work(second, "b", "B-1")
            raise Stop

    with pytest.raises(Stop):
        await run_the_fork()
    assert CHARGED == ["A-1", "B-1"]
    assert (await store.get_run(fork.id)).status is RunStatus.FAILED
    exported = await export_run(store, fork.id)
    assert exported["tool_calls"]
    assert exported["rollbacks"]
    assert exported["messages"]
    assert await store.list_graph_checkpoints(fork.id)

    # What only a run spread over processes writes: a worker's part and its agent leases.
    await store.save_snapshot_part(SnapshotPart(run_id=first.run_id, seq=1, worker="w1"))
    await store.claim_agents(first.run_id, "w1", ["graph"], utcnow() + timedelta(seconds=60))

    # What the handlers' model calls leave: a row per call, and each message once per run.
    ledger = SqlLedger(database.url)
    try:
        for run_id in (first.run_id, fork.id):
            for position in range(2):
                assert await ledger.record_model_call(model_call(run_id, position))
            # What a handler's question to a person leaves: its request.
            await ledger.add_request(
                HumanRequest(
                    id=f"{run_id[:8]}-ask",
                    run_id=run_id,
                    agent="shop",
                    message_id="inbox>shop#1",
                    position=2,
                    timeline=0,
                    kind="question",
                    question="may I?",
                    asked_at=utcnow(),
                )
            )
    finally:
        await ledger.close()
    exported = await export_run(store, fork.id)
    assert len(exported["model_calls"]) == 2

    before = all_rows(database.url)
    gone = {first.run_id}
    first_snapshots = await store.list_snapshots(first.run_id)
    gone |= {s.id for s in first_snapshots}
    gone |= {r.id for r in await store.list_rollbacks(first.run_id)}
    gone |= {row["key"] for row in before["agentsnap_tool_calls"] if row["run_id"] == first.run_id}
    assert {table for table, rows in before.items() if not rows} == set()

    report = await delete_runs(store, [first.run_id])

    assert report.run_ids == [first.run_id]
    assert not report.skipped
    assert not report.dry_run
    assert report.rows["agentsnap_runs"] == 1
    assert report.rows["agentsnap_snapshots"] == len(first_snapshots)
    assert report.rows["agentsnap_rollbacks"] == 1
    assert report.rows["agentsnap_tool_calls"] == 1
    assert report.rows["agentsnap_model_calls"] == 2
    assert report.rows["agentsnap_model_bodies"] == 4  # 6 messages in 2 requests, 4 distinct
    assert report.rows["agentsnap_run_tags"] == 1
    assert report.rows[LANGGRAPH_ROWS] > 0
    after = all_rows(database.url)
    left = [
        (table, column)
        for table, rows in after.items()
        for row in rows
        for column, value in row.items()
        if mentions(value, gone)
    ]
    # The fork still says where it came from; nothing else names the deleted run.
    assert left == [("agentsnap_runs", "parent_run_id"), ("agentsnap_runs", "parent_snapshot_id")]
    assert orphan_states(after) == []
    assert after["agentsnap_state_chunks"], "the fork's states share chunks that must stay"

    # The fork loads and exports as before, and resumes.
    assert await export_run(store, fork.id) == exported
    for snapshot in await store.list_snapshots(fork.id):
        assert snapshot.status is SnapshotStatus.COMPLETE
    with pytest.raises(NotFoundError):
        await store.get_run(first.run_id)
    async with Runtime(store=store, run_id=fork.id) as again:
        graph = team(again, saver)
        await again.resume()
        await work(again, "c", "B-2")
        assert graph.state.values["notes"] == ["b", "c"]
    assert (await store.get_run(fork.id)).status is RunStatus.SUCCEEDED
    assert CHARGED == ["A-1", "B-1", "B-2"]

    # And once the fork goes too, nothing is left at all.
    await delete_runs(database.url, [fork.id])
    assert {table for table, rows in all_rows(database.url).items() if rows} == set()


async def test_a_run_whose_fork_needs_its_graph_checkpoints_is_refused(
    database: Database,
) -> None:
    store, saver = database.store, database.saver
    async with Runtime(store=store) as parent:
        team(parent, saver)
        await work(parent, "a", "P-1")
    newest = (await store.list_snapshots(parent.run_id))[-1]
    fork = await fork_run(store, newest.id)  # names the parent's graph thread

    with pytest.raises(DeleteRefused) as refused:
        await delete_runs(store, [parent.run_id])
    assert list(refused.value.refused) == [parent.run_id]
    assert fork.id in str(refused.value)
    assert "LangGraph checkpoints" in str(refused.value)
    assert "nothing was deleted" in str(refused.value)
    assert await store.get_run(parent.run_id)

    skipped = await delete_runs(store, [parent.run_id], skip_refused=True)
    assert skipped.run_ids == []
    assert parent.run_id in skipped.skipped

    both = await delete_runs(store, [parent.run_id, fork.id])  # together: nothing is left over
    assert both.run_ids == [parent.run_id, fork.id]
    assert await store.list_runs() == []


async def test_a_run_a_live_runtime_owns_is_refused_unless_forced(database: Database) -> None:
    store = database.store
    async with Runtime(store=store, name="live") as live:
        await live.snapshot()
        with pytest.raises(DeleteRefused, match=r"is owned by a live runtime \(") as refused:
            await delete_runs(database.url, [live.run_id])
        assert owner_id() in str(refused.value)
        assert (await store.get_run(live.run_id)).status is RunStatus.RUNNING
    # Another host's unexpired lease: only force deletes it.
    elsewhere = RunInfo(id="elsewhere-run")
    await store.create_run(elsewhere)
    await store.take_lease(elsewhere.id, "far:1:a", utcnow() + timedelta(hours=1), replacing=None)
    with pytest.raises(DeleteRefused):
        await delete_runs(store, [elsewhere.id])
    forced = await delete_runs(store, [elsewhere.id], force=True)
    assert forced.run_ids == [elsewhere.id]
    assert forced.rows["agentsnap_run_leases"] == 1
    # A lease whose process is gone, or that expired, is no owner.
    for owner, until in [(dead_owner(), timedelta(hours=1)), ("far:2:b", -timedelta(hours=1))]:
        run = RunInfo(id=f"run-{len(owner)}")
        await store.create_run(run)
        await store.take_lease(run.id, owner, utcnow() + until, replacing=None)
        assert (await delete_runs(store, [run.id])).run_ids == [run.id]


async def test_unknown_runs_are_refused_and_nothing_is_deleted(database: Database) -> None:
    store = database.store
    kept = RunInfo(id="kept")
    await store.create_run(kept)
    with pytest.raises(NotFoundError, match="no run with id missing-1, missing-2 in"):
        await delete_runs(store, ["kept", "missing-1", "missing-2"])
    assert [run.id for run in await store.list_runs()] == ["kept"]
    with pytest.raises(ConfigurationError, match="MemoryStore"):
        await delete_runs(object(), ["kept"])  # type: ignore[arg-type]


async def test_a_dry_run_counts_what_a_delete_removes_and_removes_nothing(
    database: Database,
) -> None:
    store, saver = database.store, database.saver
    async with Runtime(store=store, journal=True) as runtime:
        team(runtime, saver)
        await work(runtime, "a", "D-1")
    before = all_rows(database.url)

    dry = await delete_runs(store, [runtime.run_id], dry_run=True)

    assert dry.dry_run
    assert dry.run_ids == [runtime.run_id]
    assert all_rows(database.url) == before
    done = await delete_runs(store, [runtime.run_id])
    assert done.rows == dry.rows
    assert done.total_rows == sum(len(rows) for rows in before.values())


async def test_only_vacuum_shrinks_an_sqlite_file(tmp_path: Path) -> None:
    path = tmp_path / "agentsnap.db"
    url = f"sqlite:///{path}"
    store = SqlStore(url)
    try:
        ids = []
        for n in range(3):
            async with Runtime(store=store, metadata={"padding": "x" * 200_000, "n": n}) as r:
                await r.snapshot()
            ids.append(r.run_id)
    finally:
        await store.close()  # the last connection: the log is written into the file
    full = path.stat().st_size

    kept = await delete_runs(url, ids[:1])
    assert kept.reclaimed_bytes is None
    assert path.stat().st_size == full  # free pages, reused by later writes

    shrunk = await delete_runs(url, ids[1:2], vacuum=True)
    assert shrunk.reclaimed_bytes is not None
    assert shrunk.reclaimed_bytes > 350_000
    assert path.stat().st_size < full - 350_000
    store = SqlStore(url)
    try:
        assert [run.id for run in await store.list_runs()] == ids[2:]
    finally:
        await store.close()


@pytest.mark.postgres
async def test_vacuum_on_postgresql_leaves_the_space_to_the_database(postgres_url: str) -> None:
    store = SqlStore(postgres_url)
    try:
        async with Runtime(store=store) as runtime:
            await runtime.snapshot()
        report = await delete_runs(store, [runtime.run_id], vacuum=True)
        assert report.run_ids == [runtime.run_id]
        assert report.reclaimed_bytes is None  # VACUUM (ANALYZE) ran; no file shrinks
        assert await store.list_runs() == []
    finally:
        await store.close()


# -- pruning ------------------------------------------------------------------------------------


async def finished(store: SqlStore, days_ago: float, **fields: Any) -> RunInfo:
    """A finished run created ``days_ago`` days ago."""
    run = RunInfo(
        id=f"run-{len(await store.list_runs()):02d}",
        created_at=utcnow() - timedelta(days=days_ago),
        status=fields.pop("status", RunStatus.SUCCEEDED),
        **fields,
    )
    await store.create_run(run)
    return run


def ids(runs: list[RunInfo]) -> list[str]:
    return [run.id for run in runs]


async def test_prune_keeps_the_newest_runs(database: Database) -> None:
    store = database.store
    runs = [await finished(store, days) for days in (5, 4, 3, 2, 1)]
    assert (await prune_runs(store, keep=6)).run_ids == []
    assert (await prune_runs(store, keep=5)).run_ids == []
    report = await prune_runs(store, keep=2)
    assert report.run_ids == ids(runs[:3])
    assert ids(await store.list_runs()) == ids(runs[3:])
    assert (await prune_runs(store, keep=2)).run_ids == []


async def test_prune_deletes_runs_older_than_a_time(database: Database) -> None:
    store = database.store
    runs = [await finished(store, days) for days in (10, 8, 6, 1)]
    report = await prune_runs(store, older_than=timedelta(days=7))
    assert report.run_ids == ids(runs[:2])
    # Both: outside the newest 2 and older than 3 days.
    more = await prune_runs(store, keep=2, older_than=timedelta(days=3), dry_run=True)
    assert more.run_ids == []
    assert more.dry_run
    assert (await prune_runs(store, keep=1, older_than=timedelta(days=3))).run_ids == [runs[2].id]


async def test_prune_looks_only_at_the_runs_the_filters_select(database: Database) -> None:
    store = database.store
    failed = [await finished(store, d, status=RunStatus.FAILED, name="etl") for d in (9, 8, 7)]
    done = await finished(store, 6, name="etl")
    other = await finished(store, 5, status=RunStatus.FAILED, name="report", tags={"k": "v"})
    report = await prune_runs(store, keep=1, status="failed", name="etl")
    assert report.run_ids == ids(failed[:2])
    assert ids(await store.list_runs()) == [failed[2].id, done.id, other.id]
    assert (await prune_runs(store, keep=0, tags={"k": "v"})).run_ids == [other.id]


async def test_prune_never_deletes_a_run_a_live_runtime_owns(database: Database) -> None:
    store = database.store
    old = await finished(store, 30)
    async with Runtime(store=store) as live:
        report = await prune_runs(store, keep=0)
        assert report.run_ids == [old.id]
        assert list(report.skipped) == [live.run_id]
        assert "live runtime" in report.skipped[live.run_id]
    assert ids(await store.list_runs()) == [live.run_id]


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        ({}, "prune_runs needs keep="),
        ({"keep": -1}, "keep= must be a whole number of 0 or more, got -1"),
        ({"older_than": timedelta(days=-1)}, "older_than= must be a timedelta of 0 or more"),
        ({"keep": 1, "status": "sleeping"}, "'sleeping' is not a run status"),
    ],
)
async def test_prune_refuses_a_policy_that_means_nothing(
    database: Database, policy: dict[str, Any], message: str
) -> None:
    await finished(database.store, 3)
    with pytest.raises(ConfigurationError, match=re.escape(message)):
        await prune_runs(database.store, **policy)
    assert len(await database.store.list_runs()) == 1


# -- the command line ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Done:
    code: int
    out: str
    err: str

    def error(self, code: int = 1) -> str:
        """The one-line error, checked to be all of standard error, with no traceback."""
        assert self.code == code, (self.code, self.out, self.err)
        assert "Traceback" not in self.err + self.out
        lines = self.err.strip().splitlines()
        assert lines[-1].startswith("Error: "), self.err
        return lines[-1]


def agentsnap(
    *args: str, given: str | None = None, db: str | None = None, columns: int | None = None
) -> Done:
    env = {k: v for k, v in os.environ.items() if k not in {"AGENTSNAP_DB", "COLUMNS"}}
    env["TZ"] = "UTC"
    if columns is not None:
        env["COLUMNS"] = str(columns)
    if db is not None:
        env["AGENTSNAP_DB"] = db
    done = subprocess.run(
        [str(AGENTSNAP), *args],
        capture_output=True,
        text=True,
        env=env,
        input=given,
        timeout=60,
        check=False,
    )
    return Done(done.returncode, done.stdout, done.stderr)


@pytest.fixture
def runs_db(tmp_path: Path) -> str:
    """An SQLite database with five runs of several names, tags and statuses."""
    url = f"sqlite:///{tmp_path / 'runs.db'}"

    async def fill() -> None:
        store = SqlStore(url)
        now = datetime.now(UTC)
        labelled = [
            ("aaa1", 40, "nightly-1", {"team": "billing"}, RunStatus.SUCCEEDED, None),
            (
                "aaa2",
                20,
                "nightly-2",
                {"team": "billing", "env": "prod"},
                RunStatus.FAILED,
                "rollbacks exhausted: the critic rejected the output of agent 'writer' 3 times",
            ),
            ("bbb1", 10, "report", {"team": "search"}, RunStatus.CANCELLED, "Ctrl-C"),
            ("bbb2", 2, None, {}, RunStatus.SUCCEEDED, None),
        ]
        try:
            for run_id, days, name, tags, status, reason in labelled:
                await store.create_run(
                    RunInfo(
                        id=run_id,
                        created_at=now - timedelta(days=days),
                        name=name,
                        tags=tags,
                        status=status,
                        status_reason=reason,
                    )
                )
            async with Runtime(store=store, run_id="ccc1", name="live-ish") as runtime:
                await runtime.snapshot()
        finally:
            await store.close()

    asyncio.run(fill())
    return url


def listed(db: str, *args: str) -> list[str]:
    done = agentsnap("runs", "--db", db, "--json", *args)
    assert done.code == 0, done.err
    return [row["id"] for row in json.loads(done.out)]


def test_runs_lists_names_statuses_with_reasons_and_tags(runs_db: str) -> None:
    done = agentsnap("runs", "--db", runs_db)
    assert done.code == 0, done.err
    header, *lines = done.out.splitlines()
    assert header.split() == ["ID", "NAME", "STATUS", "TAGS", "CREATED", "SNAPSHOTS", "PARENT"]
    reason = "rollbacks exhausted: the critic rejected the output of agent 'writer' 3 times"
    # Why a run ended so is on a line of its own under its row, whole, not in STATUS.
    (at,) = [n for n, line in enumerate(lines) if line.startswith("aaa2")]
    assert lines[at].split()[1:4] == ["nightly-2", "failed", "env=prod,team=billing"]
    assert lines[at + 1] == f"  why: {reason}"
    (at,) = [n for n, line in enumerate(lines) if line.startswith("bbb1")]
    assert lines[at].split()[1:4] == ["report", "cancelled", "team=search"]
    assert lines[at + 1] == "  why: Ctrl-C"
    assert not any(line.startswith("  why:") for line in lines[at + 2 :])  # none without one
    # STATUS holds the status word alone, so the rows stay narrow.
    assert header.index("TAGS") - header.index("STATUS") <= len("interrupted  ")
    # On a narrow terminal the reason is wrapped under its row, never cut.
    on_screen = agentsnap("runs", "--db", runs_db, columns=60).out.splitlines()
    (at,) = [n for n, line in enumerate(on_screen) if line.startswith("aaa2")]
    assert "failed" in on_screen[at]
    under = list(itertools.takewhile(lambda line: line.startswith("  "), on_screen[at + 1 :]))
    assert len(under) > 1
    assert all(len(line) <= 60 for line in under)
    assert " ".join(line.strip() for line in under) == f"why: {reason}"
    rows = json.loads(agentsnap("runs", "--db", runs_db, "--json").out)
    by_id = {row["id"]: row for row in rows}
    assert by_id["aaa2"]["status_reason"].endswith("rejected the output of agent 'writer' 3 times")
    assert by_id["aaa2"]["tags"] == {"team": "billing", "env": "prod"}
    assert by_id["aaa2"]["name"] == "nightly-2"
    assert by_id["ccc1"]["snapshots"] == 1
    assert list(by_id) == ["aaa1", "aaa2", "bbb1", "bbb2", "ccc1"]  # oldest first


def test_runs_filters(runs_db: str) -> None:
    assert listed(runs_db, "--status", "failed", "--status", "cancelled") == ["aaa2", "bbb1"]
    assert listed(runs_db, "--name", "nightly-*") == ["aaa1", "aaa2"]
    assert listed(runs_db, "--tag", "team=billing", "--tag", "env=prod") == ["aaa2"]
    assert listed(runs_db, "--since", "15d") == ["bbb1", "bbb2", "ccc1"]
    assert listed(runs_db, "--since", "72h") == ["bbb2", "ccc1"]
    day = (datetime.now(UTC) - timedelta(days=5)).date().isoformat()
    assert listed(runs_db, "--since", day) == ["bbb2", "ccc1"]
    assert listed(runs_db, "--since", f"{day}T00:00:00+00:00", "--limit", "1") == ["ccc1"]
    assert listed(runs_db, "--limit", "2") == ["bbb2", "ccc1"]
    assert listed(runs_db, "--status", "succeeded", "--name", "*-*", "--limit", "1") == ["ccc1"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--status", "paused"], "Invalid value for '--status': 'paused' is not one of"),
        (["--tag", "team"], "'team' is not KEY=VALUE: give a tag like team=billing"),
        (["--since", "yesterday"], "'yesterday' is not a time: give a span back from now"),
        (["--limit", "0"], "Invalid value for '--limit'"),
        (["--status", "failed", "prune", "--keep", "1"], "--status list runs: give `prune`"),
    ],
)
def test_runs_refuses_bad_filters_as_usage_errors(
    runs_db: str, args: list[str], message: str
) -> None:
    assert message in agentsnap("runs", "--db", runs_db, *args).error(code=2)


def test_runs_delete_asks_first_and_takes_prefixes(runs_db: str) -> None:
    refused = agentsnap("runs", "delete", "aaa1", "--db", runs_db, given="n\n")
    assert "nothing deleted: not confirmed (--yes deletes without asking)" in refused.error()
    assert "aaa1  nightly-1  succeeded" in refused.err
    assert "Delete 1 run (0 snapshots, 2 rows in all)? This cannot be undone [y/N]" in refused.err
    no_answer = agentsnap("runs", "delete", "aaa1", "--db", runs_db)  # standard input closed
    assert "not confirmed" in no_answer.error()
    assert listed(runs_db) == ["aaa1", "aaa2", "bbb1", "bbb2", "ccc1"]

    ambiguous = agentsnap("runs", "delete", "aaa", "--db", runs_db, "--yes")
    assert "run id prefix 'aaa' is ambiguous: aaa1, aaa2" in ambiguous.error()

    done = agentsnap("runs", "delete", "aaa1", "cc", "--db", runs_db, given="y\n")
    assert done.code == 0, done.err
    assert done.out.startswith("deleted 2 runs:\n  aaa1  nightly-1  succeeded")
    assert "agentsnap_run_tags" in done.out
    assert listed(runs_db) == ["aaa2", "bbb1", "bbb2"]


def test_runs_delete_dry_run_and_json(runs_db: str) -> None:
    dry = agentsnap("runs", "delete", "ccc1", "--db", runs_db, "--dry-run")
    assert dry.code == 0, dry.err
    assert dry.out.startswith("would delete 1 run:\n  ccc1  live-ish")
    assert re.search(r"^  agentsnap_snapshots\s+1$", dry.out, re.MULTILINE)
    report = json.loads(agentsnap("runs", "delete", "ccc", "--db", runs_db, "--yes", "--json").out)
    assert report["run_ids"] == ["ccc1"]
    assert not report["dry_run"]
    assert report["rows"]["agentsnap_snapshots"] == 1
    assert report["total_rows"] > 1
    assert listed(runs_db) == ["aaa1", "aaa2", "bbb1", "bbb2"]


def test_runs_delete_refuses_a_live_run_with_what_to_do(runs_db: str) -> None:
    async def hold() -> None:
        store = SqlStore(runs_db)
        try:
            await store.take_lease("bbb2", "far:1:a", utcnow() + timedelta(hours=1), replacing=None)
        finally:
            await store.close()

    asyncio.run(hold())
    refused = agentsnap("runs", "delete", "bbb2", "--db", runs_db, "--yes").error()
    assert "refused to delete 1 run, so nothing was deleted: run bbb2 is owned by a live" in refused
    assert refused.endswith("pass --force to delete even so")
    assert "bbb2" in listed(runs_db)
    assert agentsnap("runs", "delete", "bbb2", "--db", runs_db, "--yes", "--force").code == 0
    assert "bbb2" not in listed(runs_db)


def test_runs_prune(runs_db: str) -> None:
    missing = agentsnap("runs", "prune", "--db", runs_db).error(code=2)
    assert "give --keep N, --older-than DURATION" in missing
    bad = agentsnap("runs", "prune", "--older-than", "a week", "--db", runs_db).error(code=2)
    assert "'a week' is not a duration" in bad

    dry = agentsnap("runs", "prune", "--older-than", "15d", "--db", runs_db, "--dry-run")
    assert dry.code == 0, dry.err
    assert dry.out.startswith("would delete 2 runs:\n  aaa1")
    not_asked = agentsnap("runs", "prune", "--older-than", "15d", "--db", runs_db, given="n\n")
    assert "not confirmed" in not_asked.error()
    assert len(listed(runs_db)) == 5

    done = agentsnap(
        "runs",
        "prune",
        "--keep",
        "1",
        "--status",
        "failed",
        "--status",
        "succeeded",
        "--db",
        runs_db,
        "--yes",
        "--json",
    )
    assert done.code == 0, done.err
    assert json.loads(done.out)["run_ids"] == ["aaa1", "aaa2", "bbb2"]
    assert listed(runs_db) == ["bbb1", "ccc1"]
    nothing = agentsnap("runs", "--db", runs_db, "prune", "--keep", "5", "--yes")
    assert nothing.code == 0
    assert nothing.out == "nothing to delete\n"
