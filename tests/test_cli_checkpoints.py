"""``agentsnap checkpoints RUN``: a graph agent's LangGraph checkpoints beside the snapshots."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

import pytest
from click.testing import CliRunner, Result
from langgraph_graphs import RoutingInbox, notes_graph

from agentsnap import RunInfo, Runtime
from agentsnap.cli import main
from agentsnap.integrations.langgraph import AgentsnapSaver, GraphAgent
from agentsnap.store.sql import SqlStore


@dataclass(frozen=True)
class GraphRun:
    db: str
    run_id: str
    cut_seq: int
    restored: str


@pytest.fixture(
    scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def graph_run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> GraphRun:
    if request.param == "sqlite":
        db = f"sqlite:///{tmp_path_factory.mktemp('checkpoints') / 'graph.db'}"
    else:
        from postgres_db import postgres_url_or_skip

        db = postgres_url_or_skip()

    async def feed(runtime: Runtime, agent: str, note: str) -> None:
        runtime.send("inbox", note, kind=agent)
        await runtime.run_until_idle()

    async def go() -> GraphRun:
        store = SqlStore(db)
        saver = AgentsnapSaver(db)
        try:
            async with Runtime(store=store) as runtime:
                runtime.add(RoutingInbox("inbox"))
                writer = runtime.add(GraphAgent("writer", notes_graph(), checkpointer=saver))
                runtime.add(GraphAgent("editor", notes_graph(), checkpointer=saver))
                await feed(runtime, "writer", "a")
                await feed(runtime, "editor", "x")
                cut = await runtime.snapshot()
                assert isinstance(writer.state.checkpoint_id, str)
                restored = writer.state.checkpoint_id
                await feed(runtime, "writer", "b")
                await runtime.rollback(cut.id)
                await runtime.run_until_idle()  # "b" again, on a second branch
                await runtime.snapshot()
            # Two more runs whose ids share a prefix, to make an ambiguous one.
            await store.create_run(RunInfo(id="abc1" + "0" * 28))
            await store.create_run(RunInfo(id="abc2" + "0" * 28))
        finally:
            await store.close()
            saver.close()
        return GraphRun(db, runtime.run_id, cut.seq, restored)

    return asyncio.run(go())


def cli(run: GraphRun, *args: str) -> Result:
    return CliRunner().invoke(main, [*args, "--db", run.db])


def test_checkpoints_lists_each_checkpoint_with_the_snapshots_holding_it(
    graph_run: GraphRun,
) -> None:
    result = cli(graph_run, "checkpoints", graph_run.run_id[:8], "--json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert {r["agent"] for r in rows} == {"writer", "editor"}
    assert [r["checkpoint_id"] for r in rows] == sorted(r["checkpoint_id"] for r in rows)
    (restored,) = [r for r in rows if r["checkpoint_id"] == graph_run.restored]
    assert restored["agent"] == "writer"
    assert graph_run.cut_seq in restored["snapshots"]
    assert len([r for r in rows if r["parent_id"] == graph_run.restored]) == 2
    assert {r["source"] for r in rows} == {"input", "loop"}
    assert all(r["created_at"] is not None for r in rows)

    writer = cli(graph_run, "checkpoints", graph_run.run_id, "--agent", "writer", "--json")
    assert writer.exit_code == 0, writer.output
    assert json.loads(writer.output) == [r for r in rows if r["agent"] == "writer"]

    text = cli(graph_run, "checkpoints", graph_run.run_id[:8])
    assert text.exit_code == 0, text.output
    header, *lines = text.output.splitlines()
    assert header.split() == [
        "AGENT",
        "THREAD",
        "CHECKPOINT",
        "PARENT",
        "STEP",
        "SOURCE",
        "CREATED",
        "SNAPSHOTS",
    ]
    assert len(lines) == len(rows)
    (line,) = [li for li in lines if graph_run.restored[:18] in li.split()[2]]
    cells = line.split()
    assert cells[:2] == ["writer", "1"]
    assert cells[-1] == ",".join(map(str, restored["snapshots"]))
    # A thread's first checkpoint has no parent, shown as "-".
    first = lines[0].split()
    assert first[3] == "-"


def test_a_run_without_graph_agents_lists_nothing(graph_run: GraphRun) -> None:
    result = cli(graph_run, "checkpoints", "abc1")
    assert result.exit_code == 0, result.output
    assert result.output.split() == [
        "AGENT",
        "THREAD",
        "CHECKPOINT",
        "PARENT",
        "STEP",
        "SOURCE",
        "CREATED",
        "SNAPSHOTS",
    ]
    assert json.loads(cli(graph_run, "checkpoints", "abc1", "--json").output) == []


@pytest.mark.parametrize(
    ("prefix", "message"),
    [
        ("ffff", "no run with id 'ffff'"),
        ("abc", "run id prefix 'abc' is ambiguous"),
    ],
)
def test_an_unknown_or_ambiguous_run_is_a_one_line_error(
    graph_run: GraphRun, prefix: str, message: str
) -> None:
    result = cli(graph_run, "checkpoints", prefix)
    assert result.exit_code == 1
    assert message in result.output
    assert len(result.output.strip().splitlines()) == 1
