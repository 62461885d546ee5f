"""``agentsnap export``: a run as one JSON document, and the library call behind it."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from pydantic import Field

from agentsnap import (
    Agent,
    AgentState,
    Context,
    JournalMessage,
    MemoryStore,
    Message,
    Runtime,
    Snapshot,
    Store,
)
from agentsnap.cli import main
from agentsnap.inspect import EXPORT_FORMAT, export_run
from agentsnap.journal import read_journal
from agentsnap.store.sql import SqlStore
from agentsnap.testing import SeededScheduler


class RelayState(AgentState):
    seen: list[int] = Field(default_factory=list)


class Relay(Agent[RelayState]):
    """Remembers each number and passes it on, one less, to a random peer."""

    def __init__(self, name: str, peers: list[str], rng: random.Random) -> None:
        super().__init__(name, RelayState())
        self.peers = peers
        self.rng = rng

    async def handle(self, message: Message, ctx: Context[RelayState]) -> None:
        hops = message.payload_as(int)
        self.state.seen.append(hops)
        if hops > 0:
            ctx.send(self.rng.choice(self.peers), hops - 1, kind="relay")


async def make_run(store: Store, *, journal: bool, seed: int = 5) -> str:
    """A run with several snapshots, some with messages in flight across their cut."""
    names = ["ann", "bea", "cat"]
    rng = random.Random(seed)
    scheduler = SeededScheduler(seed)
    async with Runtime(
        store=store, scheduler=scheduler, journal=journal, metadata={"purpose": "export"}
    ) as runtime:
        for name in names:
            runtime.add(Relay(name, [n for n in names if n != name], random.Random(rng.random())))
        for i in range(12):
            runtime.send(rng.choice(names), 4, kind="start")
            if i % 3 == 0:
                runtime.snapshot(initiator=rng.choice([None, *names]))
            for _ in range(rng.randint(0, 5)):
                await scheduler.step()
        await runtime.run_until_idle()
        return runtime.run_id


def sql_run(db: str, *, journal: bool) -> str:
    """Make a run in the database at ``db`` (from synchronous code, as the CLI runs)."""

    async def go() -> str:
        store = SqlStore(db)
        try:
            return await make_run(store, journal=journal)
        finally:
            await store.close()

    return asyncio.run(go())


@pytest.fixture
def db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'runs.db'}"


def export_cli(*args: str) -> Any:
    result = CliRunner().invoke(main, ["export", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_export_holds_the_run_its_snapshots_and_its_journal(db: str) -> None:
    run_id = sql_run(db, journal=True)

    async def stored() -> tuple[list[Snapshot], list[JournalMessage]]:
        store = SqlStore(db)
        try:
            snapshots = await store.list_snapshots(run_id)
            return snapshots, read_journal(await store.load_journal(run_id))
        finally:
            await store.close()

    snapshots, messages = asyncio.run(stored())

    document = export_cli(run_id, "--db", db)

    assert document["format"] == EXPORT_FORMAT
    assert document["run"]["id"] == run_id
    assert document["run"]["metadata"] == {"purpose": "export"}
    assert document["run"]["parent_run_id"] is None
    assert len(document["snapshots"]) == len(snapshots) >= 3
    assert any(snapshot.channels for snapshot in snapshots), "no message was in flight"
    for exported, snapshot in zip(document["snapshots"], snapshots, strict=True):
        assert exported["id"] == snapshot.id
        assert exported["status"] == snapshot.status.value == "complete"
        assert exported["initiator"] == snapshot.initiator
        assert set(exported["agents"]) == {"$env", "ann", "bea", "cat"}
        for name, cut in snapshot.agents.items():
            assert exported["agents"][name]["state"] == cut.state
            assert exported["agents"][name]["sent"] == cut.sent
            assert exported["agents"][name]["received"] == cut.received
        assert [(c["src"], c["dst"]) for c in exported["channels"]] == [
            (c.src, c.dst) for c in snapshot.channels
        ]
        for channel, record in zip(exported["channels"], snapshot.channels, strict=True):
            assert [(m["seq"], m["kind"], m["payload"]) for m in channel["messages"]] == [
                (m.seq, m.kind, m.payload) for m in record.messages
            ]
    assert [
        (m["src"], m["dst"], m["seq"], m["kind"], m["payload"]) for m in document["messages"]
    ] == [(m.src, m.dst, m.seq, m.kind, m.payload) for m in messages]
    assert len(document["messages"]) == 12 * 5
    assert all(m["delivered_at"] >= m["sent_at"] for m in document["messages"])


async def test_export_without_a_journal_has_no_messages_key() -> None:
    store = MemoryStore()
    run_id = await make_run(store, journal=False)
    document = await export_run(store, run_id)
    assert "messages" not in document
    assert document["snapshots"]
    # The document is plain JSON: it survives a round trip unchanged.
    assert json.loads(json.dumps(document)) == document


def test_export_writes_a_file_and_pretty_prints(db: str, tmp_path: Path) -> None:
    run_id = sql_run(db, journal=False)
    out = tmp_path / "run.json"

    result = CliRunner().invoke(
        main, ["export", run_id, "--db", db, "-o", str(out), "--indent", "2"]
    )

    assert result.exit_code == 0, result.output
    assert result.output == ""
    text = out.read_text(encoding="utf-8")
    assert text.startswith('{\n  "format"')
    assert json.loads(text)["run"]["id"] == run_id


def test_export_reads_the_database_from_the_environment(db: str) -> None:
    result = CliRunner().invoke(main, ["export", "nope"], env={"AGENTSNAP_DB": db})
    # The variable was used: the error names that database, not the default one.
    assert result.exit_code == 1
    assert "runs.db" in result.output


def test_export_of_an_unknown_run_is_a_one_line_error(db: str) -> None:
    sql_run(db, journal=False)

    result = CliRunner().invoke(main, ["export", "no-such-run", "--db", db])

    assert result.exit_code == 1
    assert result.output == "Error: no run with id 'no-such-run' in this store\n"


def test_export_does_not_create_a_missing_database(tmp_path: Path) -> None:
    missing = tmp_path / "typo.db"
    result = CliRunner().invoke(main, ["export", "abc", "--db", f"sqlite:///{missing}"])
    assert result.exit_code == 1
    assert "there is no database at" in result.output
    assert "Traceback" not in result.output
    assert not missing.exists()


def test_export_from_a_database_without_agentsnap_tables(tmp_path: Path) -> None:
    empty = tmp_path / "empty.db"
    empty.touch()
    result = CliRunner().invoke(main, ["export", "abc", "--db", f"sqlite:///{empty}"])
    assert result.exit_code == 1
    assert "holds no agentsnap runs" in result.output
    assert empty.stat().st_size == 0


def test_export_takes_a_unique_prefix_of_the_run_id(db: str) -> None:
    run_id = sql_run(db, journal=False)
    document = export_cli(run_id[:8], "--db", db)
    assert document["run"]["id"] == run_id
