"""The inspection queries return typed results, and ``--json`` prints exactly their JSON.

The keys and their order are those agentsnap has always printed: a result's fields are
declared in that order, and a key printed only sometimes (a state read through its class's
upcasters) is left out when it has no value.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pydantic
import pytest
from click.testing import CliRunner

from agentsnap import MemoryStore, RunInfo, RunStatus
from agentsnap._views import picked
from agentsnap.cli import main
from agentsnap.demo import demo_model, run_demo
from agentsnap.inspect import (
    AgentShown,
    EventRow,
    ModelCallsTable,
    RollbackRow,
    RunRow,
    SnapshotDiff,
    SnapshotRow,
    SnapshotView,
    StateDiff,
    agent_history_table,
    diff_snapshots,
    diff_states,
    events_table,
    ledger_calls_table,
    model_calls_table,
    rollbacks_table,
    runs_table,
    show_snapshot,
    snapshots_table,
)
from agentsnap.store.sql import SqlStore

Query = Callable[[SqlStore], Awaitable[Any]]


@dataclass(frozen=True)
class Demo:
    db: str
    run_id: str
    first: str
    second: str


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Demo:
    db = f"sqlite:///{tmp_path_factory.mktemp('views') / 'demo.db'}"

    async def go() -> Demo:
        store = SqlStore(db)
        try:
            result = await run_demo(store, demo_model(delay=0.01))
        finally:
            await store.close()
        first, second, _ = result.snapshots
        return Demo(db, result.run.id, first.id, second.id)

    return asyncio.run(go())


def printed(demo: Demo, *args: str) -> Any:
    result = CliRunner().invoke(main, [*args, "--db", demo.db, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def queried(demo: Demo, query: Callable[[SqlStore], Awaitable[Any]]) -> Any:
    async def go() -> Any:
        store = SqlStore(demo.db, create=False)
        try:
            return await query(store)
        finally:
            await store.close()

    return asyncio.run(go())


def dumped(result: Any) -> Any:
    if isinstance(result, list):
        return [item.model_dump(mode="json") for item in result]
    return result.model_dump(mode="json")


def test_the_cli_prints_the_queries_results_as_json(demo: Demo) -> None:
    run, first, second = demo.run_id, demo.first, demo.second
    cases: list[tuple[list[str], Query, type[pydantic.BaseModel]]] = [
        (["runs"], runs_table, RunRow),
        (["snapshots", run], lambda s: snapshots_table(s, run), SnapshotRow),
        (["rollbacks", run], lambda s: rollbacks_table(s, run), RollbackRow),
        (["show", second], lambda s: show_snapshot(s, second), SnapshotView),
        (["diff", first, second], lambda s: diff_snapshots(s, first, second), SnapshotDiff),
        (["events", run], lambda s: events_table(s, run), EventRow),
        (["model-calls", run], lambda s: model_calls_table(s, run), ModelCallsTable),
    ]
    for args, query, kind in cases:
        result = queried(demo, query)
        for item in result if isinstance(result, list) else [result]:
            assert isinstance(item, kind), args
        assert printed(demo, *args) == dumped(result), args
    history = queried(demo, lambda s: agent_history_table(s, run, "writer"))
    assert printed(demo, "history", run, "--agent", "writer") == dumped(history)
    assert printed(demo, "tools", run) == dumped(
        queried(demo, lambda s: ledger_calls_table(s, run))
    )


def test_the_json_keeps_the_keys_in_their_order(demo: Demo) -> None:
    shown = printed(demo, "show", demo.second)
    assert list(shown) == [
        "id",
        "seq",
        "status",
        "initiator",
        "started_at",
        "completed_at",
        "error",
        "damaged_agents",
        "agents",
        "channels",
        "run_id",
        "run",
        "previous",
    ]
    assert list(shown["agents"]["writer"]) == [
        "state",
        "state_hash",
        "state_version",
        "sent",
        "received",
        "model_calls",
    ], "read_as and unreadable are printed only for a state read through its class"
    assert list(shown["previous"]) == ["id", "seq", "started_at"]
    diff = printed(demo, "diff", demo.first, demo.second)
    assert list(diff) == ["a", "b", "a_run_id", "b_run_id", "a_damaged", "b_damaged", "agents"]
    assert list(diff["agents"][0]) == [
        "agent",
        "change",
        "a_version",
        "b_version",
        "memory",
        "plan",
        "tool_calls",
        "fields",
    ]
    (event, *_) = printed(demo, "events", demo.run_id)
    assert list(event) == [
        "index",
        "agent",
        "message",
        "kind",
        "payload",
        "started_at",
        "duration_ms",
        "timeline",
        "sent",
        "tool_calls",
        "model_calls",
    ]
    assert event["started_at"].endswith("+00:00"), "times as isoformat() writes them"


def test_results_are_frozen_and_take_only_their_fields(demo: Demo) -> None:
    shown = queried(demo, lambda s: show_snapshot(s, demo.second))
    with pytest.raises(pydantic.ValidationError):
        shown.seq = 7
    (rollback,) = queried(demo, lambda s: rollbacks_table(s, demo.run_id))
    assert RollbackRow.model_validate(rollback.model_dump()) == rollback
    with pytest.raises(pydantic.ValidationError):
        RollbackRow.model_validate({**rollback.model_dump(), "surprise": 1})
    writer = shown.agents["writer"]
    assert isinstance(writer, AgentShown)
    assert (writer.read_as, writer.unreadable) == (None, None)
    read = writer.model_copy(update={"read_as": 2, "unreadable": "no upcaster"})
    assert read.model_dump(mode="json")["read_as"] == 2
    assert read.model_dump(mode="json")["unreadable"] == "no upcaster"


def test_a_state_diff_is_typed_and_knows_when_it_is_empty() -> None:
    same = {"memory": {"a": 1}, "plan": [], "tool_calls": [], "n": 1}
    assert diff_states(same, same).empty
    changed = diff_states(same, {**same, "memory": {"a": 2}})
    assert isinstance(changed, StateDiff)
    assert not changed.empty
    assert changed.memory.changed["a"].model_dump() == {"old": 1, "new": 2}
    assert changed.fields.empty


def test_picked_takes_the_given_fields_and_the_sources_others() -> None:
    run = RunInfo(id="r" * 32, name="nightly", status=RunStatus.FAILED, tags={"team": "a"})
    row = picked(RunRow, run, snapshots=3)
    assert (row.id, row.name, row.status, row.snapshots) == ("r" * 32, "nightly", "failed", 3)
    assert row.tags == {"team": "a"}
    assert row.tags is not run.tags, "the row holds its own copy"


async def test_the_queries_are_typed_on_any_store() -> None:
    store = MemoryStore()
    result = await run_demo(store, demo_model(delay=0.01))
    rows = await snapshots_table(store, result.run.id)
    assert [row.seq for row in rows] == [1, 2, 3]
    assert all(row.status == "complete" for row in rows)
    calls = await model_calls_table(store, result.run.id)
    assert calls.calls == [], "a memory store keeps no model calls"
    assert calls.totals.calls == 0
