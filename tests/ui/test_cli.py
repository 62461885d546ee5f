"""``agentsnap ui``, ``agentsnap fork --snapshot --edit`` and ``agentsnap bisect``."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from ctrl_c import DUMP_ON_ABORT, interrupt, stopped

import agentsnap.ui
from agentsnap import Snapshot, SnapshotStatus
from agentsnap.cli import main
from agentsnap.demo import demo_model, run_demo
from agentsnap.store.sql import SqlStore

STOP = 60  # seconds a served inspector gets to start or stop


@pytest.fixture
def demo_db(tmp_path: Path) -> tuple[str, str, list[Snapshot]]:
    """An SQLite database holding the demo run: its URL, the run id, its snapshots."""
    url = f"sqlite:///{tmp_path / 'runs.db'}"

    async def run() -> tuple[str, list[Snapshot]]:
        store = SqlStore(url)
        try:
            result = await run_demo(store, demo_model(delay=0.01))
            return result.run.id, await store.list_snapshots(result.run.id)
        finally:
            await store.close()

    run_id, snapshots = asyncio.run(run())
    return url, run_id, snapshots


def invoke(*args: str, input: str | None = None) -> Any:
    return CliRunner().invoke(main, list(args), input=input)


def stored(url: str, snapshot_id: str | None = None, run_id: str | None = None) -> Any:
    async def read() -> Any:
        store = SqlStore(url)
        try:
            if snapshot_id is not None:
                return await store.load_snapshot(snapshot_id)
            assert run_id is not None
            return await store.get_run(run_id)
        finally:
            await store.close()

    return asyncio.run(read())


def complete(snapshots: list[Snapshot], initiator: str) -> Snapshot:
    return next(
        s for s in snapshots if s.status is SnapshotStatus.COMPLETE and s.initiator == initiator
    )


# --- agentsnap ui ---


def serve(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "agentsnap", "ui", "--no-open", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **DUMP_ON_ABORT},
    )


def test_ui_serves_the_runs_until_ctrl_c(demo_db: tuple[str, str, list[Snapshot]]) -> None:
    url, run_id, _ = demo_db
    server = serve("--db", url, "--port", "0")
    try:
        assert server.stdout is not None
        first = server.stdout.readline()
        assert first.startswith("agentsnap inspector at http://127.0.0.1:"), first
        address = first.split()[3]
        with urllib.request.urlopen(f"{address}api/runs", timeout=STOP) as response:
            listed = json.load(response)
        assert [r["id"] for r in listed["runs"]] == [run_id]
        with urllib.request.urlopen(address, timeout=STOP) as response:
            assert response.headers["content-type"].startswith("text/html")
        interrupt(server)
        _, errors = stopped(server, timeout=STOP)
        assert server.returncode == 0, errors
        assert "Traceback" not in errors
    finally:
        if server.poll() is None:
            server.kill()
            server.communicate()


def test_ui_says_when_the_port_is_taken(demo_db: tuple[str, str, list[Snapshot]]) -> None:
    url, _, _ = demo_db
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = invoke("ui", "--db", url, "--port", str(port), "--no-open")
    assert result.exit_code == 1
    assert f"cannot listen on 127.0.0.1 port {port}" in result.output
    assert "--port" in result.output


def test_ui_needs_an_agentsnap_database(tmp_path: Path) -> None:
    missing = invoke("ui", "--db", f"sqlite:///{tmp_path / 'none.db'}", "--no-open")
    assert missing.exit_code == 1
    assert "there is no database at" in missing.output
    assert not (tmp_path / "none.db").exists()
    other = tmp_path / "other.db"
    import sqlite3

    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE notes (x TEXT)")
    found = invoke("ui", "--db", f"sqlite:///{other}", "--no-open")
    assert found.exit_code == 1
    assert "agentsnap db upgrade" in found.output


def test_ui_warns_when_it_listens_beyond_this_machine(
    demo_db: tuple[str, str, list[Snapshot]],
) -> None:
    url, _, _ = demo_db
    server = serve("--db", url, "--port", "0", "--host", "0.0.0.0")
    try:
        assert server.stdout is not None
        assert server.stdout.readline().startswith("agentsnap inspector at http://0.0.0.0:")
        interrupt(server)  # at once: while the server starts, before uvicorn handles Ctrl-C
        _, errors = stopped(server, timeout=STOP)
        assert server.returncode == 0, errors
        assert "warning: listening on 0.0.0.0, not only on this machine" in errors
    finally:
        if server.poll() is None:
            server.kill()
            server.communicate()


@pytest.mark.parametrize("write", ["--allow-fork", "--allow-answer", "--allow-run"])
def test_ui_refuses_to_let_others_write_without_a_token(
    demo_db: tuple[str, str, list[Snapshot]], write: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AGENTSNAP_UI_TOKEN", raising=False)
    url, _, _ = demo_db
    refused = invoke("ui", "--db", url, "--host", "0.0.0.0", write, "--no-open")
    assert refused.exit_code == 2
    assert f"listening on 0.0.0.0 with {write}" in refused.output
    assert "--token" in refused.output
    short = invoke("ui", "--db", url, "--host", "0.0.0.0", write, "--token", "short")
    assert short.exit_code == 2
    assert "at least 16 characters" in short.output


def test_ui_names_the_extra_when_it_is_missing(
    monkeypatch: pytest.MonkeyPatch, demo_db: tuple[str, str, list[Snapshot]]
) -> None:
    monkeypatch.setattr(agentsnap.ui, "MISSING", ("fastapi",))
    result = invoke("ui", "--db", demo_db[0], "--no-open")
    assert result.exit_code == 1
    assert "pip install 'agentsnap[ui]'" in result.output


# --- agentsnap fork --snapshot --edit ---


def test_fork_a_run_with_an_edited_state(
    tmp_path: Path, demo_db: tuple[str, str, list[Snapshot]]
) -> None:
    url, run_id, snapshots = demo_db
    cut = complete(snapshots, "researcher")
    writer = cut.agents["writer"].state
    writer["drafts"] = ["edited [1]"]
    path = tmp_path / "writer.json"
    path.write_text(json.dumps(writer))
    result = invoke(
        "fork",
        run_id[:8],
        "--snapshot",
        cut.id[:10],
        "--edit",
        f"writer={path}",
        "--name",
        "try again",
        "--db",
        url,
        "--json",
    )
    assert result.exit_code == 0, result.output
    made = json.loads(result.output)
    assert (made["parent_run_id"], made["parent_snapshot_id"]) == (run_id, cut.id)
    assert made["name"] == "try again"
    run = stored(url, run_id=made["id"])
    assert run.name == "try again"
    listed = invoke("runs", "--db", url, "--json")
    (row,) = [r for r in json.loads(listed.output) if r["id"] == made["id"]]
    assert row["parent_snapshot_id"] == cut.id

    # From standard input, and in the old form (a snapshot id alone).
    piped = invoke("fork", cut.id, "--edit", "writer=-", "--db", url, input=json.dumps(writer))
    assert piped.exit_code == 0, piped.output
    assert len(piped.output.strip()) == 32


def test_fork_refuses_an_edit_that_does_not_fit(
    tmp_path: Path, demo_db: tuple[str, str, list[Snapshot]]
) -> None:
    url, run_id, snapshots = demo_db
    cut = complete(snapshots, "researcher")
    path = tmp_path / "writer.json"
    path.write_text(json.dumps({"drafts": [1, 2], "memory": []}))
    result = invoke("fork", run_id, "--snapshot", cut.id, "--edit", f"writer={path}", "--db", url)
    assert result.exit_code == 1
    assert "the edited states do not match the agents' state schemas" in result.output
    assert "writer at $.drafts[0]: 1 is not of type 'string'" in result.output
    assert "writer at $.memory: [] is not of type 'object'" in result.output
    assert len(json.loads(invoke("runs", "--db", url, "--json").output)) == 1

    path.write_text("{not json")
    bad = invoke("fork", run_id, "--snapshot", cut.id, "--edit", f"writer={path}", "--db", url)
    assert bad.exit_code == 2
    assert "does not hold JSON" in bad.output
    shape = invoke("fork", run_id, "--snapshot", cut.id, "--edit", "writer", "--db", url)
    assert shape.exit_code == 2
    assert "is not AGENT=FILE" in shape.output
    other = invoke("fork", "feedbeef", "--snapshot", cut.id, "--db", url)
    assert other.exit_code == 1
    assert "feedbeef" in other.output


# --- agentsnap bisect ---


PREDICATES = """
def no_draft(states):
    return not states["writer"]["drafts"]


def always(states):
    return True


def never(states):
    return False
"""


@pytest.fixture
def predicates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A module of predicates in the current directory; its name."""
    (tmp_path / "ui_predicates.py").write_text(PREDICATES)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "ui_predicates", raising=False)
    monkeypatch.setattr(sys, "path", list(sys.path))
    return "ui_predicates"


def test_bisect_finds_the_first_bad_snapshot(
    predicates: str, demo_db: tuple[str, str, list[Snapshot]]
) -> None:
    url, run_id, snapshots = demo_db
    good = [s for s in snapshots if s.status is SnapshotStatus.COMPLETE]
    first_bad = next(s for s in good if s.agents["writer"].state["drafts"])
    last_good = [s for s in good if s.seq < first_bad.seq][-1]
    result = invoke("bisect", run_id, "--predicate", f"{predicates}:no_draft", "--db", url)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == f"first bad:  snapshot {first_bad.seq}  {first_bad.id}"
    assert lines[1] == f"last good:  snapshot {last_good.seq}  {last_good.id}"
    assert "  writer (changed)" in lines
    assert any(line.startswith("    ~ drafts: []") for line in lines)
    command = f"agentsnap fork {run_id} --snapshot {last_good.id} --db {url}"
    assert lines[-1] == f"  {command}"
    forked = invoke(*command.split()[1:])
    assert forked.exit_code == 0, forked.output

    document = json.loads(
        invoke(
            "bisect", run_id, "--predicate", f"{predicates}:no_draft", "--db", url, "--json"
        ).output
    )
    assert document["first_bad"]["id"] == first_bad.id
    assert document["last_good"]["id"] == last_good.id
    assert document["holds_at_first"] is True
    assert document["fork_command"] == command


def test_bisect_reports_a_predicate_that_never_or_always_holds(
    predicates: str, demo_db: tuple[str, str, list[Snapshot]]
) -> None:
    url, run_id, _ = demo_db
    never = invoke("bisect", run_id, "--predicate", f"{predicates}:never", "--db", url)
    assert never.exit_code == 0, never.output
    assert "the predicate is false already at the first snapshot" in never.output
    always = invoke("bisect", run_id, "--predicate", f"{predicates}:always", "--db", url)
    assert "the predicate holds at every snapshot" in always.output


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ("ui_predicates", "is not MODULE:FUNCTION"),
        ("no_such_module_here:f", "cannot import 'no_such_module_here'"),
        ("ui_predicates:missing", "has no function 'missing'"),
    ],
)
def test_bisect_says_what_is_wrong_with_the_predicate(
    predicates: str, demo_db: tuple[str, str, list[Snapshot]], spec: str, words: str
) -> None:
    del predicates
    url, run_id, _ = demo_db
    result = invoke("bisect", run_id, "--predicate", spec, "--db", url)
    assert result.exit_code == 2
    assert words in result.output


def test_the_server_module_names_the_extra_when_fastapi_is_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import importlib

    monkeypatch.setitem(sys.modules, "fastapi", None)
    monkeypatch.delitem(sys.modules, "agentsnap.ui.server", raising=False)
    with pytest.raises(ModuleNotFoundError, match=r"pip install 'agentsnap\[ui\]'"):
        importlib.import_module("agentsnap.ui.server")
