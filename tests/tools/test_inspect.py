"""The ledger seen from outside: the runtime's default ledger, ``agentsnap export``, the CLI."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from agentsnap import Agent, AgentState, Context, MemoryStore, Message, Runtime, tool
from agentsnap.cli import main as cli
from agentsnap.inspect import export_run
from agentsnap.ledger import LedgerEntry, ToolCallStatus
from agentsnap.store.ledger import MemoryLedger
from agentsnap.store.sql import SqlStore
from agentsnap.store.sql_ledger import SqlLedger

EXPORT_KEYS = {
    "key",
    "run",
    "agent",
    "tool",
    "fingerprint",
    "status",
    "attempts",
    "result",
    "error",
}


@tool(side_effect=True, name="inspect_ship")
async def ship(parcel: str) -> dict[str, str]:
    return {"tracking": f"T-{parcel}"}


class Shipper(Agent[AgentState]):
    async def handle(self, message: Message, ctx: Context[AgentState]) -> None:
        await ship(ctx, parcel=message.payload)


async def shipping_run(store: Any) -> Runtime:
    async with Runtime(store=store) as runtime:
        runtime.add(Shipper("shipper"))
        runtime.send("shipper", "p1")
        runtime.send("shipper", "p2")
        await runtime.run_until_idle()
    return runtime


def invoke(*args: str) -> Any:
    return CliRunner().invoke(cli, list(args))


def test_a_sql_store_gets_a_ledger_in_the_same_database(db_url: str) -> None:
    async def run() -> tuple[Runtime, dict[str, Any]]:
        store = SqlStore(db_url)
        try:
            runtime = await shipping_run(store)
            assert isinstance(runtime.ledger, SqlLedger)
            assert runtime.ledger.url == db_url
            return runtime, await export_run(store, runtime.run_id)
        finally:
            await store.close()

    runtime, document = asyncio.run(run())
    calls = document["tool_calls"]
    assert [call["result"] for call in calls] == [{"tracking": "T-p1"}, {"tracking": "T-p2"}]
    for call in calls:
        assert set(call) >= EXPORT_KEYS
        assert (call["run"], call["agent"], call["tool"]) == (
            runtime.run_id,
            "shipper",
            "inspect_ship",
        )
        assert (call["status"], call["attempts"], call["error"]) == ("succeeded", 1, None)
    assert [call["key"] for call in calls] == [
        c.key for c in runtime.agents["shipper"].state.tool_calls
    ]

    exported = invoke("export", runtime.run_id, "--db", db_url)
    assert exported.exit_code == 0, exported.output
    assert json.loads(exported.output)["tool_calls"] == calls

    listed = invoke("tools", runtime.run_id, "--db", db_url)
    assert listed.exit_code == 0, listed.output
    header, *lines = listed.output.splitlines()
    assert header.split()[:3] == ["KEY", "STATUS", "TOOL"]
    assert [line.split()[:3] for line in lines] == [
        [call["key"], "succeeded", "inspect_ship"] for call in calls
    ]
    # `tools list` is the same command under its older name.
    assert invoke("tools", "list", runtime.run_id, "--db", db_url).output == listed.output
    unknown = invoke("tools", "--status", "unknown", "--db", db_url).output
    assert unknown.splitlines()[1:] == []


async def test_a_memory_store_exports_the_calls_of_the_ledger_given() -> None:
    store = MemoryStore()
    runtime = await shipping_run(store)
    assert isinstance(runtime.ledger, MemoryLedger)
    assert (await export_run(store, runtime.run_id))["tool_calls"] == []
    document = await export_run(store, runtime.run_id, ledger=runtime.ledger)
    assert [call["status"] for call in document["tool_calls"]] == ["succeeded", "succeeded"]


def test_resolve_refuses_what_it_cannot_do(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'agentsnap.db'}"

    async def ship_once() -> None:
        ledger = SqlLedger(url)
        try:
            await ship.invoke(ledger, key="done", parcel="p")
        finally:
            await ledger.close()

    asyncio.run(ship_once())

    both = invoke("tools", "resolve", "done", "--result", "1", "--error", "x", "--db", url)
    assert both.exit_code != 0
    assert "one of --result JSON, --error TEXT and --retry" in both.output
    bad = invoke("tools", "resolve", "done", "--result", "{oops", "--db", url)
    assert bad.exit_code != 0
    assert "not JSON" in bad.output
    known = invoke("tools", "resolve", "done", "--result", "1", "--db", url)
    assert known.exit_code == 1
    assert "its outcome is known" in known.output
    missing = invoke("tools", "resolve", "nope", "--error", "x", "--db", url)
    assert missing.exit_code == 1
    assert "no tool call with key 'nope'" in missing.output
    nowhere = invoke("tools", "list", "--db", f"sqlite:///{tmp_path / 'missing.db'}")
    assert nowhere.exit_code == 1
    assert "Traceback" not in nowhere.output
    assert invoke("tools", "--db", f"sqlite:///{tmp_path / 'missing.db'}").exit_code == 1


async def test_a_locked_sqlite_database_is_waited_for_off_the_event_loop(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'agentsnap.db'}"
    ledger = SqlLedger(url)
    try:
        await ship.invoke(ledger, key="first", parcel="p0")  # schema and connections ready
        other = sqlite3.connect(tmp_path / "agentsnap.db", isolation_level=None)
        other.execute("BEGIN IMMEDIATE")  # another writer holds the lock
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.001)

        beat = asyncio.create_task(ticker())
        call = asyncio.create_task(ship.invoke(ledger, key="second", parcel="p1"))
        await asyncio.sleep(0.05)
        assert not call.done(), "the claim waits for the lock"
        assert ticks > 1, "and the event loop goes on meanwhile"
        other.execute("COMMIT")
        other.close()
        assert await call == {"tracking": "T-p1"}
        beat.cancel()
        with pytest.raises(asyncio.CancelledError):
            await beat
        assert [entry.status for entry in await ledger.list_calls()] == ["succeeded"] * 2
    finally:
        await ledger.close()


def test_tools_run_prints_the_ledger_of_one_run_unknown_outcomes_marked(db_url: str) -> None:
    async def run() -> str:
        store = SqlStore(db_url)
        try:
            runtime = await shipping_run(store)
            await shipping_run(store)  # another run: its calls are not listed
            now = datetime.now(UTC)
            assert isinstance(runtime.ledger, SqlLedger)
            ledger = SqlLedger(db_url)
            try:
                await ledger.claim(
                    LedgerEntry(
                        key="lost-parcel",
                        tool="inspect_ship",
                        fingerprint="f",
                        arguments={"parcel": "p3"},
                        status=ToolCallStatus.UNKNOWN,
                        created_at=now,
                        updated_at=now,
                        run_id=runtime.run_id,
                        agent="shipper",
                    )
                )
            finally:
                await ledger.close()
            return runtime.run_id
        finally:
            await store.close()

    run_id = asyncio.run(run())

    rows = json.loads(invoke("tools", run_id[:8], "--json", "--db", db_url).output)
    assert [(r["status"], r["unknown"]) for r in rows] == [
        ("succeeded", False),
        ("succeeded", False),
        ("unknown", True),
    ]
    assert {r["run"] for r in rows} == {run_id}
    assert set(rows[0]) >= EXPORT_KEYS | {"unknown"}

    text = invoke("tools", run_id, "--db", db_url)
    assert text.exit_code == 0, text.output
    header, *lines, note = text.output.splitlines()
    assert header.split() == ["KEY", "STATUS", "TOOL", "ATTEMPTS", "RUN", "AGENT", "UPDATED"]
    assert [line.split()[1] for line in lines[:2]] == ["succeeded", "succeeded"]
    assert not any(line.startswith("!") for line in lines[:2])
    assert lines[2].split()[:3] == ["!", "lost-parcel", "unknown"]
    assert note.startswith("! 1 call with an unknown outcome")

    # `tools list` is the same command, and `tools` without a run lists every run's calls.
    assert invoke("tools", "list", run_id, "--db", db_url).output == text.output
    assert lines[2] in invoke("tools", "--db", db_url).output.splitlines()
    usage = invoke("tools", "--help").output
    assert " tools [RUN] [--status S] [--json] [--wide] [--db URL]" in usage
    assert " tools resolve KEY (--result JSON | --error TEXT | --retry)" in usage
    missing = invoke("tools", "ffff", "--db", db_url)
    assert missing.exit_code == 1
    assert missing.output == "Error: no run with id 'ffff' in this store\n"
