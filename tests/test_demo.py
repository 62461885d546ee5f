"""``agentsnap demo`` (the README's main command): a rejected draft, a rollback, a good draft."""

from __future__ import annotations

import asyncio
import importlib
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from click.testing import CliRunner

from agentsnap import MemoryStore, RunStatus, SnapshotStatus
from agentsnap._hints import cli_command
from agentsnap.cli import main
from agentsnap.demo import demo_model, run_demo
from agentsnap.inspect import export_run
from agentsnap.store.sql import SqlStore
from agentsnap.testing import assert_consistent


async def test_the_demo_rolls_back_to_the_researchers_snapshot_and_recovers() -> None:
    store = MemoryStore()
    model = demo_model(delay=0.01)

    result = await run_demo(store, model)

    assert result.run.status is RunStatus.SUCCEEDED
    assert [(s.seq, s.initiator, s.status) for s in result.snapshots[:2]] == [
        (1, "$env", SnapshotStatus.COMPLETE),
        (2, "researcher", SnapshotStatus.COMPLETE),
    ]
    # Any later cut (the snapshot policy may take one as the run ends) completed too.
    assert all(s.status is SnapshotStatus.COMPLETE for s in result.snapshots)
    for snapshot in result.snapshots:
        assert_consistent(snapshot)
    (rollback,) = result.rollbacks
    assert rollback.snapshot_id == result.snapshots[1].id
    assert (rollback.agent, rollback.source, rollback.attempt) == ("writer", "critic", 1)
    assert "cites no sources" in rollback.reason
    # The researcher's cut holds the notes in flight to the writer, nothing else.
    cut = result.snapshots[1]
    assert [(c.src, c.dst, [m.kind for m in c.messages]) for c in cut.channels] == [
        ("researcher", "writer", ["notes"])
    ]
    # The writer started again from the notes, with the critic's reason in its prompt; the
    # planner and researcher did not run again.
    writer_prompts = [p for p in model.prompts if p.startswith("Write the report")]
    assert len(writer_prompts) == 2
    assert "Feedback: the draft cites no sources" in writer_prompts[1]
    assert sum(p.startswith("Plan the work") for p in model.prompts) == 1
    assert sum(p.startswith("Research") for p in model.prompts) == 1
    assert result.report is not None
    assert "[1]" in result.report
    assert result.drafts == [result.report]


async def test_the_demos_model_calls_are_recorded_and_the_redo_asks_again() -> None:
    model = demo_model(delay=0)

    result = await run_demo(MemoryStore(), model)

    calls = [(c.agent, c.position, c.timeline, c.replays) for c in result.model_calls]
    assert calls == [
        ("planner", 0, 0, 0),
        ("researcher", 0, 0, 0),
        ("writer", 0, 0, 0),
        ("writer", 0, 1, 0),
    ], "every agent's self.model call is recorded; the rollback's redo is a new timeline"
    first, redo = result.model_calls[2:]
    assert first.message_id == redo.message_id == "researcher>writer#1"
    assert "Feedback:" not in first.asked().messages[0].content
    assert "Feedback: the draft cites no sources" in redo.asked().messages[0].content
    assert redo.answer().text == result.report, "the recorded answer is the accepted report"
    assert all(c.model == "scripted" for c in result.model_calls)
    assert len(model.prompts) == 4, "the model was asked once per recorded call"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'demo.db'}"
    url: str = request.getfixturevalue("postgres_url")
    return url


def test_agentsnap_demo_tells_the_story_and_stores_the_run(db: str) -> None:
    result = CliRunner().invoke(main, ["demo", "--db", db])

    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "  snapshot 2 by researcher: complete" in lines
    assert any(
        line.startswith("  rollback to snapshot 2: critic rejected writer's output")
        for line in lines
    )
    assert "final report (succeeded):" in lines
    stored = lines[-5]
    assert stored.startswith("run ")
    assert stored.endswith(f" is stored in {db}; look at it with:")
    run_id = stored.split()[1]
    # The commands as they can be pasted here (tests/test_quickstart.py runs them).
    # The web inspector comes last, as it serves until Ctrl-C.
    assert lines[-4:] == [
        f"  {cli_command('rollbacks', run_id, '--db', db)}",
        f"  {cli_command('timeline', run_id, '--db', db, '-o', 'timeline.html')}",
        f"  {cli_command('export', run_id, '--db', db, '--indent', '2')}",
        f"  {cli_command('ui', '--db', db)}",
    ]

    async def exported() -> dict[str, Any]:
        store = SqlStore(db)
        try:
            return await export_run(store, run_id)
        finally:
            await store.close()

    document = asyncio.run(exported())
    assert document["run"]["status"] == "succeeded"
    (rollback,) = document["rollbacks"]
    assert rollback["agent"] == "writer"
    assert rollback["attempt"] == 1


def test_agentsnap_demo_names_what_a_real_model_needs(monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = importlib.import_module

    def without_langchain(name: str, package: str | None = None) -> ModuleType:
        if name.startswith("langchain"):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, package)

    monkeypatch.setattr("agentsnap.models.importlib.import_module", without_langchain)
    result = CliRunner().invoke(
        main, ["demo", "--db", "sqlite://", "--model", "openai:gpt-4o-mini"]
    )
    assert result.exit_code == 1
    assert "needs LangChain: pip install langchain" in result.output
    assert "Traceback" not in result.output


def test_agentsnap_demo_rejects_a_malformed_model_name() -> None:
    result = CliRunner().invoke(main, ["demo", "--db", "sqlite://", "--model", "gpt"])
    assert result.exit_code == 1
    assert "is not of the form provider:model" in result.output
