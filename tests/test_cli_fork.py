"""``agentsnap fork``: a new run from a snapshot, continued by a program with ``resume()``."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from agentsnap import (
    ConfigurationError,
    MemoryStore,
    NotFoundError,
    RunInfo,
    Runtime,
    Snapshot,
    SnapshotStatus,
)
from agentsnap.cli import main
from agentsnap.demo import Critic, CriticState, Planner, Researcher, Writer, demo_model, run_demo
from agentsnap.inspect import export_run, fork_run
from agentsnap.records import utcnow
from agentsnap.store.sql import SqlStore


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'fork.db'}"
    from postgres_db import postgres_url_or_skip

    return postgres_url_or_skip()


def snapshot_dump(snapshot: Snapshot) -> dict[str, Any]:
    return snapshot.model_dump(mode="json")


def test_fork_adds_a_run_that_resume_continues(db: str) -> None:
    async def original() -> tuple[str, list[Snapshot]]:
        store = SqlStore(db)
        try:
            result = await run_demo(store, demo_model(delay=0.01))
            return result.run.id, result.snapshots
        finally:
            await store.close()

    run_id, before = asyncio.run(original())
    # The researcher's snapshot: the notes are in flight to the writer.
    researched = before[1]
    assert researched.initiator == "researcher"

    forked = CliRunner().invoke(main, ["fork", researched.id[:10], "--db", db])
    assert forked.exit_code == 0, forked.output
    new_run = forked.output.strip()
    assert len(new_run) == 32
    assert new_run != run_id

    async def go_on() -> tuple[list[str], str | None, dict[str, Any], list[Snapshot]]:
        store = SqlStore(db)
        try:
            model = demo_model(delay=0.01)
            async with Runtime(store=store, run_id=new_run) as runtime:
                runtime.add(Planner(model))
                runtime.add(Researcher(model))
                writer = runtime.add(Writer(model))
                critic = runtime.add(Critic("critic", CriticState()))
                start = await runtime.resume()
                assert (start.run_id, start.seq) == (new_run, 1)
                await runtime.run_until_idle()
            document = await export_run(store, new_run)
            return (
                writer.state.drafts,
                critic.state.accepted,
                document,
                await store.list_snapshots(run_id),
            )
        finally:
            await store.close()

    drafts, accepted, document, after = asyncio.run(go_on())
    # The writer starts from the notes in flight; the critic rejects the first draft, the
    # run rolls back to its snapshot 1 (the copy), and the second draft passes.
    assert len(drafts) == 1
    assert accepted is not None
    assert "[1]" in accepted
    assert document["run"]["parent_run_id"] == run_id
    assert document["run"]["parent_snapshot_id"] == researched.id
    assert document["run"]["status"] == "succeeded"
    first = document["snapshots"][0]
    assert (first["seq"], first["status"]) == (1, "complete")
    assert first["id"] != researched.id
    assert first["agents"] == {
        name: {
            "state": cut.state,
            "state_hash": cut.state_hash,
            "state_version": cut.state_version,
            "sent": cut.sent,
            "received": cut.received,
        }
        for name, cut in researched.agents.items()
    }
    assert [(c["src"], c["dst"], len(c["messages"])) for c in first["channels"]] == [
        ("researcher", "writer", 1)
    ]
    assert [r["snapshot_id"] for r in document["rollbacks"]] == [first["id"]]
    # The original run is as it was.
    assert [snapshot_dump(s) for s in after] == [snapshot_dump(s) for s in before]

    runs = json.loads(CliRunner().invoke(main, ["runs", "--json", "--db", db]).output)
    assert [(r["id"], r["parent_run_id"]) for r in runs] == [(run_id, None), (new_run, run_id)]


def test_fork_json_and_errors(db: str) -> None:
    async def original() -> list[Snapshot]:
        store = SqlStore(db)
        try:
            return (await run_demo(store, demo_model(delay=0.01))).snapshots
        finally:
            await store.close()

    first = asyncio.run(original())[0]
    result = CliRunner().invoke(main, ["fork", first.id, "--json", "--db", db])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert (doc["parent_run_id"], doc["parent_snapshot_id"]) == (first.run_id, first.id)
    assert set(doc) == {"id", "name", "parent_run_id", "parent_snapshot_id"}

    missing = CliRunner().invoke(main, ["fork", "ffff", "--db", db])
    assert missing.exit_code == 1
    assert missing.output == "Error: no snapshot with id 'ffff' in this store\n"


async def test_fork_run_refuses_an_incomplete_snapshot_and_a_taken_id() -> None:
    store = MemoryStore()
    await store.create_run(RunInfo(id="a" * 32))
    for seq, status in [(1, SnapshotStatus.FAILED), (2, SnapshotStatus.COMPLETE)]:
        await store.save_snapshot(
            Snapshot(
                id=f"{seq}" * 32,
                run_id="a" * 32,
                seq=seq,
                initiator="$env",
                status=status,
                started_at=utcnow(),
            )
        )
    with pytest.raises(ConfigurationError, match="is failed; fork from a complete one"):
        await fork_run(store, "1")
    with pytest.raises(ConfigurationError, match="already a run with id"):
        await fork_run(store, "2", run_id="a" * 32)
    with pytest.raises(NotFoundError):
        await fork_run(store, "3")
    run = await fork_run(store, "2", run_id="b" * 32, metadata={"why": "try again"})
    assert (run.id, run.parent_run_id, run.parent_snapshot_id) == ("b" * 32, "a" * 32, "2" * 32)
    assert run.metadata == {"why": "try again"}
    (copy,) = await store.list_snapshots(run.id)
    assert (copy.seq, copy.run_id, copy.status) == (1, run.id, SnapshotStatus.COMPLETE)
    assert len(await store.list_snapshots("a" * 32)) == 2


def test_fork_with_messages_in_flight_edited_dropped_and_added(db: str, tmp_path: Path) -> None:
    async def original() -> Snapshot:
        store = SqlStore(db)
        try:
            return (await run_demo(store, demo_model(delay=0.01))).snapshots[1]
        finally:
            await store.close()

    researched = asyncio.run(original())
    (channel,) = [c for c in researched.channels if c.dst == "writer"]
    (notes, *_rest) = channel.messages
    payload = tmp_path / "notes.json"
    payload.write_text(json.dumps({"notes": ["edited in the CLI"]}))
    extra = tmp_path / "extra.json"
    extra.write_text(json.dumps("one more"))
    forked = CliRunner().invoke(
        main,
        [
            "fork",
            researched.id,
            "--edit-message",
            f"{notes.id}={payload}",
            "--add-message",
            f"researcher>writer={extra}",
            "--db",
            db,
        ],
    )
    assert forked.exit_code == 0, forked.output

    async def first_cut(run_id: str) -> Snapshot:
        store = SqlStore(db, create=False)
        try:
            (first,) = await store.list_snapshots(run_id)
            return first
        finally:
            await store.close()

    first = asyncio.run(first_cut(forked.output.strip()))
    (copied,) = [c for c in first.channels if c.dst == "writer"]
    assert copied.messages[0].payload == {"notes": ["edited in the CLI"]}
    assert copied.messages[-1].payload == "one more"
    assert len(copied.messages) == len(channel.messages) + 1

    # A message not in flight: exit 1, the problem named, no run added.
    refused = CliRunner().invoke(
        main, ["fork", researched.id, "--drop-message", "writer>critic#99", "--db", db]
    )
    assert refused.exit_code == 1
    assert "the message edits do not fit the cut" in refused.output
    assert "writer>critic#99" in refused.output
    # Not SRC>DST=FILE: a usage error.
    usage = CliRunner().invoke(
        main, ["fork", researched.id, "--add-message", f"writer={extra}", "--db", db]
    )
    assert usage.exit_code == 2
    assert "is not SRC>DST=FILE" in usage.output
