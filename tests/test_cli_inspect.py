"""``agentsnap runs / snapshots / show / diff / history / rollbacks`` on the demo's run."""

from __future__ import annotations

import asyncio
import io
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner, Result

from agentsnap import MemoryStore, NotFoundError, RunInfo, Snapshot, SnapshotStatus
from agentsnap.cli import main
from agentsnap.demo import demo_model, run_demo
from agentsnap.inspect import (
    diff_states,
    is_empty_diff,
    resolve_run,
    resolve_snapshot,
    runs_table,
)
from agentsnap.store.sql import SqlStore


@dataclass(frozen=True)
class Demo:
    db: str
    run_id: str
    first: str
    second: str
    last: str


@pytest.fixture(
    scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def demo(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Demo:
    if request.param == "sqlite":
        db = f"sqlite:///{tmp_path_factory.mktemp('inspect') / 'demo.db'}"
    else:
        from postgres_db import postgres_url_or_skip

        db = postgres_url_or_skip()

    async def go() -> Demo:
        store = SqlStore(db)
        try:
            result = await run_demo(store, demo_model(delay=0.01))
            # Two more runs whose ids share a prefix, to make an ambiguous one.
            await store.create_run(RunInfo(id="abc1" + "0" * 28))
            await store.create_run(RunInfo(id="abc2" + "0" * 28))
        finally:
            await store.close()
        # The start of the run, the researcher's snapshot, and the end of the run.
        first, second, last = result.snapshots
        return Demo(db, result.run.id, first.id, second.id, last.id)

    return asyncio.run(go())


def cli(demo: Demo, *args: str) -> Result:
    return CliRunner().invoke(main, [*args, "--db", demo.db])


def as_json(demo: Demo, *args: str) -> Any:
    result = cli(demo, *args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_runs_lists_every_run_with_its_snapshot_count(demo: Demo) -> None:
    rows = as_json(demo, "runs")
    assert [r["id"] for r in rows] == [demo.run_id, "abc1" + "0" * 28, "abc2" + "0" * 28]
    (mine,) = [r for r in rows if r["id"] == demo.run_id]
    assert set(mine) == {
        "id",
        "status",
        "created_at",
        "finished_at",
        "snapshots",
        "parent_run_id",
        "parent_snapshot_id",
        "name",
        "tags",
        "status_reason",
        "traceback",
        "cancel_requested",
        "metadata",
    }
    assert (mine["status"], mine["snapshots"], mine["parent_run_id"]) == ("succeeded", 3, None)
    assert mine["metadata"] == {"demo": "research team"}
    assert (mine["traceback"], mine["cancel_requested"]) == (None, None)
    assert (mine["name"], mine["tags"], mine["status_reason"]) == ("demo", {}, None)

    text = cli(demo, "runs")
    assert text.exit_code == 0
    header, *lines = text.output.splitlines()
    assert header.split() == ["ID", "NAME", "STATUS", "TAGS", "CREATED", "SNAPSHOTS", "PARENT"]
    (line,) = [li for li in lines if li.startswith(demo.run_id)]
    assert line.split()[1:4] == ["demo", "succeeded", "-"]
    assert line.split()[-2:] == ["3", "-"]
    # Columns are aligned: every row's STATUS starts where the header's does. The runs
    # created without an owner are interrupted, and why is on a line under each.
    rows = [li for li in lines if not li.startswith("  why: ")]
    assert len(rows) == 3
    column = header.index("STATUS")
    assert all(li[column - 2 : column] == "  " and li[column] != " " for li in rows)


async def test_listing_runs_reads_no_snapshot() -> None:
    class CountOnly(MemoryStore):
        async def list_snapshots(self, run_id: str) -> list[Snapshot]:
            raise AssertionError("listing runs loaded a run's snapshots")

    store = CountOnly()
    run = RunInfo(id="f" * 32)
    await store.create_run(run)
    await store.save_snapshot(
        Snapshot(
            id="s1",
            run_id=run.id,
            seq=1,
            initiator="$env",
            status=SnapshotStatus.COMPLETE,
            started_at=datetime.now(UTC),
        )
    )
    rows = await runs_table(store)
    assert [(row.id, row.snapshots) for row in rows] == [(run.id, 1)]


async def test_runs_table_takes_the_filters_of_list_runs_and_no_other_keyword() -> None:
    store = MemoryStore()
    await store.create_run(RunInfo(id="a" * 32, name="nightly-1", tags={"team": "billing"}))
    await store.create_run(RunInfo(id="b" * 32, name="adhoc"))
    rows = await runs_table(store, name="nightly-*", tags={"team": "billing"}, limit=5)
    assert [row.id for row in rows] == ["a" * 32]
    assert [row.id for row in await runs_table(store, since=None)] == ["a" * 32, "b" * 32]
    with pytest.raises(TypeError, match=r"runs_table\(\) got an unexpected keyword argument 'tag'"):
        await runs_table(store, tag={"team": "billing"})  # type: ignore[call-arg]


def test_snapshots_lists_a_runs_snapshots_by_prefix(demo: Demo) -> None:
    rows = as_json(demo, "snapshots", demo.run_id[:6])
    assert [(r["seq"], r["id"], r["initiator"], r["in_flight"]) for r in rows] == [
        (1, demo.first, "$env", 0),
        (2, demo.second, "researcher", 1),
        (3, demo.last, "$env", 0),  # the end of the run
    ]
    assert rows[1]["agents"] == ["$env", "critic", "planner", "researcher", "writer"]
    assert rows[1]["status"] == "complete"

    text = cli(demo, "snapshots", demo.run_id)
    assert text.exit_code == 0
    header, one, two, _ = text.output.splitlines()
    assert header.split() == ["SEQ", "ID", "STATUS", "INITIATOR", "STARTED", "AGENTS", "IN-FLIGHT"]
    assert one.split()[:4] == ["1", demo.first, "complete", "$env"]
    assert two.split()[:4] == ["2", demo.second, "complete", "researcher"]
    assert two.split()[-1] == "1"


def test_show_prints_states_counters_and_messages_in_flight(demo: Demo) -> None:
    doc = as_json(demo, "show", demo.second[:8])
    assert doc["id"] == demo.second
    assert doc["run_id"] == demo.run_id
    assert sorted(doc["agents"]) == ["$env", "critic", "planner", "researcher", "writer"]
    assert doc["agents"]["researcher"]["sent"] == {"writer": 1}
    assert doc["agents"]["researcher"]["state"]["notes"].startswith("[1]")
    assert [(c["src"], c["dst"], [m["kind"] for m in c["messages"]]) for c in doc["channels"]] == [
        ("researcher", "writer", ["notes"])
    ]

    text = cli(demo, "show", demo.second)
    assert text.exit_code == 0
    lines = text.output.splitlines()
    assert lines[0].startswith(f"snapshot {demo.second}  run {demo.run_id}  seq 2")
    assert "agent researcher" in " ".join(lines)
    assert "  sent: writer=1" in lines
    assert "in flight: 1" in lines
    assert any(li.startswith("  researcher -> writer #1 notes: ") for li in lines)


def test_show_with_agent_keeps_that_agent_and_its_channels(demo: Demo) -> None:
    doc = as_json(demo, "show", demo.second, "--agent", "planner")
    assert list(doc["agents"]) == ["planner"]
    assert doc["channels"] == []
    doc = as_json(demo, "show", demo.second, "--agent", "writer")
    assert list(doc["agents"]) == ["writer"]
    assert len(doc["channels"]) == 1

    text = cli(demo, "show", demo.second, "--agent", "writer")
    assert [li for li in text.output.splitlines() if li.startswith("agent ")] == [
        li for li in text.output.splitlines() if li.startswith("agent writer")
    ]

    missing = cli(demo, "show", demo.second, "--agent", "nobody")
    assert missing.exit_code == 1
    assert missing.output == f"Error: snapshot {demo.second} recorded no agent 'nobody'\n"


def test_diff_shows_what_changed_per_agent(demo: Demo) -> None:
    doc = as_json(demo, "diff", demo.first[:6], demo.second[:6])
    assert (doc["a"], doc["b"]) == (demo.first, demo.second)
    changes = {entry["agent"]: entry["change"] for entry in doc["agents"]}
    assert changes == {
        "$env": "unchanged",
        "critic": "unchanged",
        "planner": "changed",
        "researcher": "changed",
        "writer": "unchanged",
    }
    (planner,) = [e for e in doc["agents"] if e["agent"] == "planner"]
    assert [(s["index"], s["change"], s["old"]) for s in planner["plan"]] == [
        (0, "added", None),
        (1, "added", None),
        (2, "added", None),
    ]
    assert planner["fields"]["changed"]["task"]["old"] == ""
    assert planner["fields"]["changed"]["task"]["new"].startswith("Explain")
    assert planner["memory"] == {"added": {}, "removed": {}, "changed": {}}
    assert planner["tool_calls"] == {"added": {}, "removed": {}, "changed": {}}

    text = cli(demo, "diff", demo.first, demo.second)
    assert text.exit_code == 0
    lines = text.output.splitlines()
    assert lines[0] == f"diff {demo.first} -> {demo.second}"
    assert "agent writer: unchanged" in lines
    assert "agent planner: changed" in lines
    assert any(li.startswith('  ~ task: "" -> "Explain') for li in lines)
    assert any(li.startswith("  + plan[2]: ") for li in lines)

    only = as_json(demo, "diff", demo.first, demo.second, "--agent", "researcher")
    assert [e["agent"] for e in only["agents"]] == ["researcher"]
    assert cli(demo, "diff", demo.first, demo.second, "--agent", "nobody").exit_code == 1


def test_diff_states_compares_memory_plan_tool_calls_and_fields() -> None:
    old = {
        "memory": {"kept": 1, "gone": 2, "edited": "a"},
        "plan": [{"description": "one", "status": "pending"}, {"description": "two"}],
        "tool_calls": [{"tool": "pay", "key": "k1", "status": "ok"}, {"tool": "log"}],
        "count": 1,
    }
    new = {
        "memory": {"kept": 1, "edited": "b", "fresh": True},
        "plan": [{"description": "one", "status": "done"}],
        "tool_calls": [{"tool": "pay", "key": "k1", "status": "replayed"}, {"tool": "log"}],
        "extra": [],
    }
    found = diff_states(old, new)
    diff = found.model_dump(mode="json")
    assert diff["memory"] == {
        "added": {"fresh": True},
        "removed": {"gone": 2},
        "changed": {"edited": {"old": "a", "new": "b"}},
    }
    assert diff["plan"] == [
        {
            "index": 0,
            "change": "changed",
            "old": {"description": "one", "status": "pending"},
            "new": {"description": "one", "status": "done"},
        },
        {"index": 1, "change": "removed", "old": {"description": "two"}, "new": None},
    ]
    assert diff["tool_calls"]["changed"] == {
        "k1": {
            "old": {"tool": "pay", "key": "k1", "status": "ok"},
            "new": {"tool": "pay", "key": "k1", "status": "replayed"},
        }
    }
    assert diff["tool_calls"]["added"] == diff["tool_calls"]["removed"] == {}
    assert diff["fields"] == {"added": {"extra": []}, "removed": {"count": 1}, "changed": {}}
    assert not is_empty_diff(found)
    assert not found.empty
    assert is_empty_diff(diff_states(new, new))


def test_history_follows_one_agent_across_snapshots(demo: Demo) -> None:
    rows = as_json(demo, "history", demo.run_id[:5], "--agent", "planner")
    assert [(r["seq"], r["snapshot_id"]) for r in rows] == [
        (1, demo.first),
        (2, demo.second),
        (3, demo.last),
    ]
    assert rows[0]["changes"] is None
    assert rows[1]["changes"]["fields"]["changed"]["task"]["old"] == ""
    assert len(rows[1]["changes"]["plan"]) == 3

    text = cli(demo, "history", demo.run_id, "--agent", "writer")
    assert text.exit_code == 0
    lines = text.output.splitlines()
    assert lines[0].startswith(f"snapshot 1  {demo.first}")
    assert "  drafts: []" in lines
    assert "  (unchanged)" in lines  # at the researcher's snapshot: not written yet
    assert lines[-1].startswith("  ~ drafts: [] -> [")  # at the end of the run: the draft

    unknown = cli(demo, "history", demo.run_id, "--agent", "nobody")
    assert unknown.exit_code == 1
    assert "nobody" in unknown.output
    assert len(unknown.output.splitlines()) == 1


def test_history_needs_an_agent(demo: Demo) -> None:
    result = cli(demo, "history", demo.run_id)
    assert result.exit_code == 2
    assert "Missing option '--agent'" in result.output


def test_rollbacks_lists_the_critics_rollback(demo: Demo) -> None:
    (row,) = as_json(demo, "rollbacks", demo.run_id[:4])
    assert set(row) == {
        "id",
        "snapshot_id",
        "agent",
        "reason",
        "source",
        "attempt",
        "discarded",
        "at",
    }
    assert (row["snapshot_id"], row["agent"], row["source"], row["attempt"]) == (
        demo.second,
        "writer",
        "critic",
        1,
    )

    text = cli(demo, "rollbacks", demo.run_id)
    header, line = text.output.splitlines()
    assert header.split() == ["AT", "SNAPSHOT", "AGENT", "SOURCE", "ATTEMPT", "DISCARDED", "REASON"]
    assert line.split()[3:7] == [demo.second, "writer", "critic", "1"]  # AT: date, time, zone
    assert "cites no sources" in line
    assert as_json(demo, "rollbacks", "abc1") == []


@pytest.mark.parametrize(
    "args",
    [
        ["snapshots", "ffff"],
        ["rollbacks", "ffff"],
        ["history", "ffff", "--agent", "writer"],
        ["show", "ffff"],
        ["diff", "ffff", "ffff"],
    ],
)
def test_an_unknown_id_is_a_one_line_error(demo: Demo, args: list[str]) -> None:
    what = "snapshot" if args[0] in {"show", "diff"} else "run"
    result = cli(demo, *args)
    assert result.exit_code == 1
    assert result.output == f"Error: no {what} with id 'ffff' in this store\n"


def test_an_ambiguous_prefix_names_the_candidates(demo: Demo) -> None:
    result = cli(demo, "snapshots", "abc")
    assert result.exit_code == 1
    assert result.output == (
        f"Error: run id prefix 'abc' is ambiguous: abc1{'0' * 28}, abc2{'0' * 28}\n"
    )
    assert cli(demo, "snapshots", "abc2").exit_code == 0


def test_an_empty_id_matches_nothing(demo: Demo) -> None:
    assert cli(demo, "snapshots", "").exit_code == 1
    assert cli(demo, "show", "").exit_code == 1


@pytest.mark.parametrize(
    "args",
    [
        ["runs"],
        ["snapshots", "abc"],
        ["show", "abc"],
        ["diff", "abc", "abd"],
        ["history", "abc", "--agent", "writer"],
        ["rollbacks", "abc"],
    ],
)
def test_a_missing_database_is_a_one_line_error(tmp_path: Path, args: list[str]) -> None:
    db = f"sqlite:///{tmp_path / 'nothing.db'}"
    result = CliRunner().invoke(main, [*args, "--db", db])
    assert result.exit_code == 1
    assert result.output == f"Error: there is no database at {db}: check the --db URL\n"
    assert not (tmp_path / "nothing.db").exists()


async def test_prefixes_resolve_in_any_store() -> None:
    store = MemoryStore()
    await store.create_run(RunInfo(id="12ab" + "0" * 28))
    assert (await resolve_run(store, "12")).id == "12ab" + "0" * 28


async def test_an_ambiguous_prefix_names_at_most_ten_candidates() -> None:
    store = MemoryStore()
    ids = [f"aa{i:02d}" + "0" * 28 for i in range(12)]
    for run_id in ids:
        await store.create_run(RunInfo(id=run_id))
    with pytest.raises(NotFoundError) as error:
        await resolve_run(store, "aa")
    assert str(error.value) == (f"run id prefix 'aa' is ambiguous: {', '.join(ids[:10])} and more")
    assert (await resolve_run(store, "aa11")).id == ids[11]


async def test_snapshot_prefixes_span_runs() -> None:
    store = MemoryStore()
    for n, snapshot_id in enumerate(["ee01" + "0" * 28, "ee02" + "0" * 28]):
        run_id = f"{n:032x}"
        await store.create_run(RunInfo(id=run_id))
        await store.save_snapshot(
            Snapshot(
                id=snapshot_id,
                run_id=run_id,
                seq=1,
                initiator="$env",
                status=SnapshotStatus.COMPLETE,
                started_at=datetime.now(UTC),
            )
        )
    with pytest.raises(NotFoundError, match="snapshot id prefix 'ee0' is ambiguous: ee01"):
        await resolve_snapshot(store, "ee0")
    assert (await resolve_snapshot(store, "ee02")).run_id == f"{1:032x}"


def test_export_and_timeline_print_no_progress_off_a_terminal(demo: Demo, tmp_path: Path) -> None:
    exported = CliRunner().invoke(main, ["export", demo.run_id, "--db", demo.db])
    assert exported.exit_code == 0
    assert exported.stderr == ""
    assert json.loads(exported.stdout)["run"]["id"] == demo.run_id

    page = tmp_path / "run.svg"
    drawn = CliRunner().invoke(main, ["timeline", demo.run_id, "-o", str(page), "--db", demo.db])
    assert drawn.exit_code == 0
    assert (drawn.stdout, drawn.stderr) == (f"wrote {page}\n", "")


def test_export_and_timeline_show_their_steps_on_a_terminal(
    demo: Demo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    terminal = io.StringIO()
    monkeypatch.setattr("agentsnap.cli._format.progress_stream", lambda: terminal)
    page = tmp_path / "run.html"
    drawn = CliRunner().invoke(main, ["timeline", demo.run_id, "-o", str(page), "--db", demo.db])
    assert drawn.exit_code == 0
    assert drawn.stdout == f"wrote {page}\n"
    shown = terminal.getvalue()
    assert f"timeline [1/3] reading run {demo.run_id}..." in shown
    assert "timeline [2/3] drawing " in shown
    assert f"timeline [3/3] writing {page}..." in shown
    assert shown.endswith("\r\033[K")  # erased at the end

    terminal.seek(0)
    terminal.truncate()
    exported = CliRunner().invoke(main, ["export", demo.run_id, "--db", demo.db])
    assert exported.exit_code == 0
    json.loads(exported.stdout)
    assert "export [2/2] writing 3 snapshots..." in terminal.getvalue()

    terminal.seek(0)
    terminal.truncate()
    failed = CliRunner().invoke(main, ["export", "ffff", "--db", demo.db])
    assert failed.exit_code == 1
    assert terminal.getvalue().endswith("\r\033[K")  # erased before the error is printed


def test_statuses_are_coloured_on_a_terminal_and_plain_in_a_pipe(demo: Demo) -> None:
    coloured = CliRunner().invoke(main, ["snapshots", demo.run_id, "--db", demo.db], color=True)
    assert coloured.exit_code == 0, coloured.output
    assert click.style("complete", fg="green") in coloured.output
    plain = cli(demo, "snapshots", demo.run_id)
    assert "\x1b[" not in plain.output
    assert "complete" in plain.output


def test_snapshots_says_why_a_snapshot_failed(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'failed.db'}"
    why = "agent 'writer' did not record within 30 s: the snapshot was abandoned"

    async def fill() -> str:
        store = SqlStore(db)
        try:
            run = RunInfo(id="f" * 32)
            await store.create_run(run)
            for seq, error in [(1, None), (2, why)]:
                await store.save_snapshot(
                    Snapshot(
                        id=f"s{seq}",
                        run_id=run.id,
                        seq=seq,
                        initiator="$env",
                        status=SnapshotStatus.FAILED,
                        started_at=datetime.now(UTC),
                        error=error,
                    )
                )
            return run.id
        finally:
            await store.close()

    run_id = asyncio.run(fill())
    result = CliRunner().invoke(main, ["snapshots", run_id, "--db", db])
    assert result.exit_code == 0, result.output
    _, one, two, note = result.output.splitlines()
    assert one.split()[:3] == ["1", "s1", "failed"]  # no reason recorded: no line
    assert two.split()[:3] == ["2", "s2", "failed"]
    assert note == f"! snapshot 2 failed: {why}"
    rows = json.loads(CliRunner().invoke(main, ["snapshots", run_id, "--json", "--db", db]).output)
    assert [row["error"] for row in rows] == [None, why]
