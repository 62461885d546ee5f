"""What users expect of the ``agentsnap`` console script: colour, JSON, choices, URLs, times.

Most tests run the real console script in a subprocess, and check its exit status, that an
error is one line on standard error, and that no traceback is printed.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sqlite3
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from ledger_entries import claim_of
from postgres_db import POSTGRES_URL_VARIABLE
from sqlalchemy import make_url
from terminal import run_on_terminal

from agentsnap.cli import main
from agentsnap.cli._format import when
from agentsnap.cli._main import commands
from agentsnap.cli._tools import STATUSES
from agentsnap.demo import demo_model, run_demo
from agentsnap.inspect import fork_run
from agentsnap.ledger import ToolCallStatus
from agentsnap.records import RunInfo, RunStatus
from agentsnap.store.migrate import POSTGRES_INSTALL, sync_url
from agentsnap.store.spool import FinishRun, Spool
from agentsnap.store.sql import SqlStore
from agentsnap.store.sql_ledger import SqlLedger

AGENTSNAP = Path(sys.executable).parent / "agentsnap"
ROOT = Path(__file__).resolve().parent.parent
ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass(frozen=True)
class Done:
    """What a run of the console script printed, and how it ended."""

    code: int
    out: str
    err: str

    def one_line_error(self, code: int = 1) -> str:
        """The error line, checking it is the whole of standard error and no traceback."""
        assert self.code == code, (self.code, self.out, self.err)
        assert "Traceback" not in self.err + self.out
        assert self.err.startswith("Error: "), self.err
        assert self.err.count("\n") == 1, self.err
        return self.err.strip()


APPS = {"PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])}
"""The environment a worker needs to import the test's app (``teller_app``)."""


def agentsnap(*args: str, env: dict[str, str] | None = None) -> Done:
    """Run the console script with ``args``, its output piped."""
    if args and args[0] == "worker":
        env = {**APPS, **(env or {})}
    done = subprocess.run(
        [str(AGENTSNAP), *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=60,
        check=False,
    )
    return Done(done.returncode, done.stdout, done.stderr)


def on_terminal(*args: str, env: dict[str, str] | None = None) -> str:
    """Run the console script with ``args``, its standard output a terminal; what it wrote."""
    environ = {k: v for k, v in os.environ.items() if k not in {"NO_COLOR", "TERM"}}
    environ.update(env or {})
    return run_on_terminal([str(AGENTSNAP), *args], environ)


@dataclass(frozen=True)
class Demo:
    """The demo's run in an SQLite file, and a fork of its second snapshot."""

    db: str
    run_id: str
    first: str
    second: str
    fork_run_id: str
    fork_snapshot: str


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Demo:
    db = f"sqlite:///{tmp_path_factory.mktemp('polish') / 'demo.db'}"

    async def go() -> Demo:
        store = SqlStore(db)
        try:
            result = await run_demo(store, demo_model(delay=0.01))
            first, second = result.snapshots[:2]
            forked = await fork_run(store, second.id)
            (copy,) = await store.list_snapshots(forked.id)
        finally:
            await store.close()
        ledger = SqlLedger(db)
        try:  # a claim whose owner is gone: listed as unknown
            await ledger.claim(claim_of("charge-1", result.run.id, owner="nowhere:1:gone"))
        finally:
            await ledger.close()
        return Demo(db, result.run.id, first.id, second.id, forked.id, copy.id)

    return asyncio.run(go())


# 1. Colour


def test_colour_only_on_a_terminal(demo: Demo) -> None:
    assert ANSI.search(on_terminal("runs", "--db", demo.db))
    piped = agentsnap("runs", "--db", demo.db)
    assert piped.code == 0
    assert not ANSI.search(piped.out)


@pytest.mark.parametrize(
    ("args", "env"),
    [
        pytest.param(["runs"], {"NO_COLOR": "1"}, id="NO_COLOR=1"),
        pytest.param(["runs"], {"NO_COLOR": "no"}, id="NO_COLOR=no"),
        pytest.param(["--no-color", "runs"], {}, id="--no-color-before"),
        pytest.param(["runs", "--no-color"], {}, id="--no-color-after"),
    ],
)
def test_no_color_and_NO_COLOR_turn_colour_off(  # noqa: N802
    demo: Demo, args: list[str], env: dict[str, str]
) -> None:
    text = on_terminal(*args, "--db", demo.db, env=env)
    assert "succeeded" in text
    assert not ANSI.search(text)


def test_an_empty_NO_COLOR_leaves_colour_on(demo: Demo) -> None:  # noqa: N802
    assert ANSI.search(on_terminal("runs", "--db", demo.db, env={"NO_COLOR": ""}))


# 2. --json


LISTS_OR_SHOWS = {
    "db upgrade",
    "db recover",
    "tools resolve",
    "runs",
    "snapshots",
    "show",
    "diff",
    "history",
    "owners",
    "rollbacks",
    "checkpoints",
    "fork",
    "db current",
    "tools list",
    "model-calls",
}


def test_every_command_that_lists_or_shows_takes_json() -> None:
    def command(path: str) -> click.Command:
        found: click.Command = main
        for name in path.split():
            assert isinstance(found, click.Group)
            found = found.commands[name]
        return found

    for path in sorted(LISTS_OR_SHOWS):
        options = {opt for param in command(path).params for opt in param.opts}
        assert "--json" in options, path


def test_tools_prints_one_table_or_one_json_document(demo: Demo) -> None:
    done = agentsnap("tools", "--json", "--db", demo.db)
    assert done.code == 0, done.err
    rows = json.loads(done.out)
    assert [(row["key"], row["status"], row["unknown"]) for row in rows] == [
        ("charge-1", "unknown", True)
    ]
    assert {"key", "run", "agent", "tool", "status", "attempts", "created_at"} <= set(rows[0])
    header, line, note = agentsnap("tools", "--db", demo.db).out.splitlines()
    assert header.split() == ["KEY", "STATUS", "TOOL", "ATTEMPTS", "RUN", "AGENT", "UPDATED"]
    assert line.split()[:3] == ["!", "charge-1", "unknown"]
    assert line.split()[5] == demo.run_id
    assert note.startswith("! 1 call with an unknown outcome")
    # Of one run (by a prefix), and under the older name `tools list`: the same.
    for args in ([demo.run_id[:8]], ["list"], ["list", demo.run_id]):
        again = agentsnap("tools", *args, "--json", "--db", demo.db)
        assert json.loads(again.out) == rows, args
        shown = agentsnap("tools", *args, "--db", demo.db).out.splitlines()
        assert shown == [header, line, note], args
    other = agentsnap("tools", demo.fork_run_id, "--json", "--db", demo.db)
    assert json.loads(other.out) == []


def test_tools_filters_by_status(demo: Demo) -> None:
    done = agentsnap("tools", "--status", "unknown", "--json", "--db", demo.db)
    assert done.code == 0, done.err
    assert [row["key"] for row in json.loads(done.out)] == ["charge-1"]
    done = agentsnap("tools", "--status", "succeeded", "--json", "--db", demo.db)
    assert json.loads(done.out) == []
    done = agentsnap("tools", "list", "--status", "succeeded", "--json", "--db", demo.db)
    assert json.loads(done.out) == []


def test_db_current_json(demo: Demo, tmp_path: Path) -> None:
    done = agentsnap("db", "current", "--json", "--db", demo.db)
    assert done.code == 0, done.err
    doc = json.loads(done.out)
    assert doc == {
        "exists": True,
        "revision": doc["newest"],
        "newest": doc["newest"],
        "up_to_date": True,
    }
    empty = tmp_path / "empty.db"
    empty.touch()
    doc = json.loads(agentsnap("db", "current", "--json", "--db", f"sqlite:///{empty}").out)
    assert doc["revision"] is None
    assert doc["up_to_date"] is False


def test_db_upgrade_json(tmp_path: Path) -> None:
    done = agentsnap("db", "upgrade", "--json", "--db", f"sqlite:///{tmp_path / 'new.db'}")
    assert done.code == 0, done.err
    doc = json.loads(done.out)
    assert doc == {"revision": doc["newest"], "newest": doc["newest"], "up_to_date": True}


def test_db_recover_json_lists_each_write_and_what_is_kept(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'spooled.db'}"
    ours, elsewhere = "a" * 32, "b" * 32

    async def make() -> None:
        store = SqlStore(db)
        try:
            await store.create_run(RunInfo(id=ours))
        finally:
            await store.close()

    asyncio.run(make())
    spool = Spool(tmp_path / "spool")
    at = datetime(2026, 11, 24, 20, 5, 3, tzinfo=UTC)
    spool.add(FinishRun(run_id=ours, status=RunStatus.SUCCEEDED, finished_at=at))
    spool.add(FinishRun(run_id=elsewhere, status=RunStatus.SUCCEEDED, finished_at=at))

    done = agentsnap("db", "recover", "--json", "--spool", str(spool.directory), "--db", db)

    line = done.one_line_error()  # writes are left: status 1 and why, as without --json
    assert "1 spooled write not recovered" in line
    doc = json.loads(done.out)
    assert doc["spool"] == str(spool.directory)
    assert doc["complete"] is False
    assert [(w["run_id"], w["op"], w["outcome"]) for w in doc["applied"]] == [
        (ours, "finish_run", "applied")
    ]
    assert doc["applied"][0]["description"].startswith("finish run: succeeded")
    (kept,) = doc["kept"]
    assert (kept["run_id"], kept["count"], kept["file"]) == (
        elsewhere,
        1,
        str(spool.file(elsewhere)),
    )
    assert kept["error"]
    again = agentsnap("db", "recover", "--json", "--spool", str(spool.directory), "--db", db)
    assert again.code == 1
    assert json.loads(again.out)["applied"] == []
    spool.file(elsewhere).unlink()
    empty = agentsnap("db", "recover", "--json", "--spool", str(spool.directory), "--db", db)
    assert empty.code == 0, empty.err
    assert json.loads(empty.out) == {
        "spool": str(spool.directory),
        "applied": [],
        "kept": [],
        "complete": True,
    }


def test_tools_resolve_json(demo: Demo, tmp_path: Path) -> None:
    copy = tmp_path / "copy.db"
    copy.write_bytes(Path(demo.db.removeprefix("sqlite:///")).read_bytes())
    db = f"sqlite:///{copy}"
    done = agentsnap("tools", "resolve", "charge-1", "--result", '{"ok": 1}', "--json", "--db", db)
    assert done.code == 0, done.err
    assert json.loads(done.out) == {
        "key": "charge-1",
        "status": "succeeded",
        "result": {"ok": 1},
        "error": None,
    }


# 3. Choices


def test_an_unknown_status_is_a_usage_error_listing_the_statuses(demo: Demo) -> None:
    done = agentsnap("tools", "--status", "wat", "--db", demo.db)
    assert done.code == 2
    assert "Traceback" not in done.err
    assert "'wat' is not one of" in done.err
    for status in ToolCallStatus:
        assert f"'{status.value}'" in done.err


def test_the_status_choices_are_the_ledger_statuses() -> None:
    assert list(STATUSES) == [status.value for status in ToolCallStatus]


# 4. postgres:// URLs


def test_postgres_urls_are_taken_for_postgresql() -> None:
    assert sync_url("postgres://u:p@host:5433/db") == "postgresql+psycopg://u:p@host:5433/db"
    assert sync_url("postgres://u:p@host:5433/db") == sync_url("postgresql://u:p@host:5433/db")


@pytest.mark.postgres
def test_the_cli_takes_a_postgres_url(postgres_url: str) -> None:
    url = re.sub(r"^postgresql(\+\w+)?://", "postgres://", postgres_url)
    assert url.startswith("postgres://")
    # The shared database may be emptied by another test run at any moment: ask something
    # whose answer is right either way.
    done = agentsnap("db", "current", "--json", "--db", url)
    assert done.code == 0, done.err
    assert set(json.loads(done.out)) == {"exists", "revision", "newest", "up_to_date"}


# 5. No PostgreSQL driver


def without_psycopg(*args: str) -> Done:
    """The console script's ``main`` in a Python where ``import psycopg`` fails."""
    code = (
        "import sys; sys.modules['psycopg'] = None; "
        "from agentsnap.cli import main; sys.argv[0] = 'agentsnap'; main()"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return Done(done.returncode, done.stdout, done.stderr)


@pytest.mark.parametrize(
    "url", ["postgresql://user@localhost/agentsnap", "postgres://user@localhost/agentsnap"]
)
@pytest.mark.parametrize("command", [["runs"], ["db", "current"], ["db", "upgrade"]])
def test_a_missing_driver_names_the_install_command(url: str, command: list[str]) -> None:
    line = without_psycopg(*command, "--db", url).one_line_error()
    assert "psycopg" in line
    assert POSTGRES_INSTALL in line
    assert "No module named" not in line


def test_the_install_command_is_the_declared_extra() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extra = POSTGRES_INSTALL.split("[")[1].split("]")[0]
    assert any(dep.startswith("psycopg") for dep in project["optional-dependencies"][extra])
    assert f"pip install '{project['name']}[{extra}]'" == POSTGRES_INSTALL


# 6. Not a database, and nothing created


READ_ONLY = [
    ["runs"],
    ["snapshots", "abc"],
    ["show", "abc"],
    ["diff", "abc", "def"],
    ["history", "abc", "--agent", "writer"],
    ["owners", "abc"],
    ["rollbacks", "abc"],
    ["checkpoints", "abc"],
    ["export", "abc"],
    ["db", "current"],
    ["tools"],
    ["tools", "list"],
    ["tools", "abc"],
    ["tools", "resolve", "abc", "--error", "no"],
]

WORKER = [
    "worker", "--nats", "nats://127.0.0.1:4222", "--app", "teller_app:make_app",
    "--run", "abc", "--group", "0/3",
]  # fmt: skip
"""A worker: it reads its run from the database before it connects to NATS."""

NEEDS_A_DATABASE = [*[c for c in READ_ONLY if c != ["db", "current"]], WORKER]


@pytest.mark.parametrize("command", NEEDS_A_DATABASE, ids=" ".join)
def test_a_missing_file_is_an_error_and_is_not_created(tmp_path: Path, command: list[str]) -> None:
    path = tmp_path / "typo.db"
    line = agentsnap(*command, "--db", f"sqlite:///{path}").one_line_error()
    assert line == f"Error: there is no database at sqlite:///{path}: check the --db URL"
    assert not path.exists()


@pytest.mark.parametrize("command", [["demo"], ["db", "upgrade"]], ids=" ".join)
def test_a_new_database_in_a_missing_directory_names_the_directory(
    tmp_path: Path, command: list[str]
) -> None:
    folder = tmp_path / "nope"
    line = agentsnap(*command, "--db", f"sqlite:///{folder / 'x.db'}").one_line_error()
    assert line == (
        f"Error: cannot create the SQLite database {folder / 'x.db'}: its directory {folder} "
        f"does not exist; create the directory (`mkdir -p {folder}`), or give a path in a "
        "directory that exists"
    )
    assert not folder.exists()


def test_a_reader_names_the_missing_directory(tmp_path: Path) -> None:
    folder = tmp_path / "nope"
    url = f"sqlite:///{folder / 'x.db'}"
    line = agentsnap("runs", "--db", url).one_line_error()
    assert line == (
        f"Error: there is no database at {url} (its directory {folder} does not exist): "
        "check the --db URL"
    )
    assert not folder.exists()


@pytest.mark.parametrize("command", [["demo"], ["runs"]], ids=" ".join)
def test_an_sqlite_url_with_two_slashes_says_how_to_write_it(command: list[str]) -> None:
    line = agentsnap(*command, "--db", "sqlite://tmp/x.db").one_line_error()
    assert line.startswith("Error: 'sqlite://tmp/x.db' is not a valid SQLite URL")
    assert "sqlite:///tmp/x.db" in line
    assert "sqlite:////tmp/x.db" in line
    assert "aiosqlite" not in line


@pytest.mark.postgres
@pytest.mark.parametrize("command", [["demo"], ["runs"]], ids=" ".join)
def test_a_postgres_database_that_does_not_exist_says_how_to_create_it(
    command: list[str],
) -> None:
    url = os.environ.get(POSTGRES_URL_VARIABLE)
    if not url:
        pytest.skip(f"{POSTGRES_URL_VARIABLE} is not set: no PostgreSQL to test against")
    name = f"agentsnap_missing_{os.urandom(6).hex()}"
    missing = make_url(url).set(database=name).render_as_string(hide_password=False)
    line = agentsnap(*command, "--db", missing).one_line_error()
    assert f"/{name} does not exist: create it with `createdb {name}`" in line
    assert "gave up after retrying" not in line


def test_db_current_says_there_is_no_database_and_creates_none(tmp_path: Path) -> None:
    path = tmp_path / "typo.db"
    done = agentsnap("db", "current", "--db", f"sqlite:///{path}")
    assert done.code == 0, done.err
    assert done.out.startswith(f"there is no database at sqlite:///{path} (newest schema is ")
    assert "agentsnap db upgrade" in done.out
    doc = json.loads(agentsnap("db", "current", "--json", "--db", f"sqlite:///{path}").out)
    assert (doc["exists"], doc["revision"], doc["up_to_date"]) == (False, None, False)
    assert not path.exists()


@pytest.mark.parametrize("command", [*READ_ONLY, ["db", "upgrade"], WORKER], ids=" ".join)
def test_a_directory_is_not_a_database(tmp_path: Path, command: list[str]) -> None:
    line = agentsnap(*command, "--db", f"sqlite:///{tmp_path}").one_line_error()
    assert f"{tmp_path} is a directory, not an SQLite database" in line
    assert f"--db sqlite:///{tmp_path / 'agentsnap.db'}" in line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", [*READ_ONLY, ["db", "upgrade"], WORKER], ids=" ".join)
def test_a_text_file_is_not_a_database(tmp_path: Path, command: list[str]) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("not a database\n", encoding="utf-8")
    line = agentsnap(*command, "--db", f"sqlite:///{path}").one_line_error()
    assert line == f"Error: {path} is not an SQLite database (it is some other file): check " + (
        "the --db URL"
    )
    assert path.read_text(encoding="utf-8") == "not a database\n"


@pytest.mark.parametrize("command", NEEDS_A_DATABASE, ids=" ".join)
def test_another_sqlite_database_holds_no_runs(tmp_path: Path, command: list[str]) -> None:

    path = tmp_path / "other.db"
    with sqlite3.connect(path) as connection:
        connection.execute("CREATE TABLE notes (text TEXT)")
    line = agentsnap(*command, "--db", f"sqlite:///{path}").one_line_error()
    assert "holds no agentsnap runs (it has no agentsnap tables)" in line
    assert "agentsnap db upgrade" in line
    with sqlite3.connect(path) as connection:
        tables = connection.execute("SELECT name FROM sqlite_master").fetchall()
    assert tables == [("notes",)]


def test_db_current_of_another_sqlite_database_says_it_has_no_schema(tmp_path: Path) -> None:

    path = tmp_path / "other.db"
    with sqlite3.connect(path) as connection:
        connection.execute("CREATE TABLE notes (text TEXT)")
    done = agentsnap("db", "current", "--db", f"sqlite:///{path}")
    assert done.code == 0, done.err
    assert done.out.startswith("no agentsnap schema")


# 7. Diff across runs


def test_diff_across_runs_names_both_runs(demo: Demo) -> None:
    done = agentsnap("diff", demo.first, demo.fork_snapshot, "--db", demo.db)
    assert done.code == 0, done.err
    assert done.out.splitlines()[0] == (
        f"diff {demo.first} (run {demo.run_id}) -> {demo.fork_snapshot} (run {demo.fork_run_id})"
    )
    doc = json.loads(
        agentsnap("diff", demo.first, demo.fork_snapshot, "--json", "--db", demo.db).out
    )
    assert (doc["a_run_id"], doc["b_run_id"]) == (demo.run_id, demo.fork_run_id)
    # The fork's snapshot 1 is a copy of the parent's second snapshot: no change.
    same = json.loads(
        agentsnap("diff", demo.second, demo.fork_snapshot, "--json", "--db", demo.db).out
    )
    assert {entry["change"] for entry in same["agents"]} == {"unchanged"}


def test_diff_within_a_run_keeps_its_header(demo: Demo) -> None:
    done = agentsnap("diff", demo.first, demo.second, "--db", demo.db)
    assert done.out.splitlines()[0] == f"diff {demo.first} -> {demo.second}"


# 8. Times


TIME = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d [+-]\d\d:\d\d")


def test_times_are_local_with_their_offset(demo: Demo) -> None:
    created = json.loads(agentsnap("runs", "--json", "--db", demo.db).out)[0]["created_at"]
    assert created.endswith("+00:00")  # JSON: ISO 8601, UTC
    moment = datetime.fromisoformat(created)
    local = agentsnap("runs", "--db", demo.db, env={"TZ": "CET-1"}).out
    shown = (moment + timedelta(hours=1)).strftime("%Y-%m-%d %H:%M:%S +01:00")
    assert shown in local
    for args in (["--utc", "runs"], ["runs", "--utc"]):
        utc = agentsnap(*args, "--db", demo.db, env={"TZ": "CET-1"}).out
        assert moment.strftime("%Y-%m-%d %H:%M:%S +00:00") in utc


def test_every_time_in_text_carries_an_offset(demo: Demo) -> None:
    for args in (
        ["snapshots", demo.run_id],
        ["show", demo.first],
        ["history", demo.run_id, "--agent", "writer"],
    ):
        done = agentsnap(*args, "--db", demo.db, env={"TZ": "CET-1"})
        assert done.code == 0, done.err
        assert TIME.search(done.out), args
        assert "+01:00" in done.out


def test_when_formats_times() -> None:
    with click.Context(main) as ctx:
        assert when(None) == "-"
        ctx.meta["agentsnap.utc"] = True
        assert when("2026-11-24T20:05:03.5+00:00") == "2026-11-24 20:05:03 +00:00"
        assert when("2026-11-24T21:05:03+01:00") == "2026-11-24 20:05:03 +00:00"
        assert when("2026-11-24T20:05:03") == "2026-11-24 20:05:03 +00:00"  # naive: UTC
    local = datetime(2026, 11, 24, 20, 5, 3, tzinfo=UTC).astimezone()
    expected = f"{local:%Y-%m-%d %H:%M:%S} {local:%z}"
    assert when("2026-11-24T20:05:03+00:00") == expected[:-2] + ":" + expected[-2:]


def test_the_help_shows_the_display_options() -> None:
    result = CliRunner().invoke(main, ["--help"])
    assert "--no-color" in result.output
    assert "--utc" in result.output


# 9. Every command


EVERY_COMMAND = {
    "db upgrade",
    "db current",
    "db recover",
    "export",
    "timeline",
    "demo",
    "tools list",
    "tools resolve",
    "model-calls",
    "requests",
    "answer",
    "runs",
    "runs delete",
    "runs prune",
    "snapshots",
    "show",
    "diff",
    "history",
    "owners",
    "rollbacks",
    "checkpoints",
    "fork",
    "bisect",
    "states check",
    "ui",
    "worker",
    "run",
    "resume",
    "cancel",
    "events",
}
"""Every command, so that a new one is looked at here on purpose."""


def test_every_command_is_listed_here() -> None:
    assert {path for path, _ in commands(main)} == EVERY_COMMAND


@pytest.mark.parametrize("path", sorted(EVERY_COMMAND))
def test_every_command_has_help_and_the_display_options(path: str) -> None:
    result = CliRunner().invoke(main, [*path.split(), "--help"])
    assert result.exit_code == 0, result.output
    assert result.exception is None
    assert result.output.startswith(f"Usage: main {path}")
    for option in ("--no-color", "--db"):
        if path != "demo" or option != "--db":
            assert option in result.output, (path, option)


PRINTS_TIMES = {
    "runs",  # CREATED
    "runs delete",  # each run's creation, in what is (or would be) deleted
    "runs prune",
    "snapshots",  # STARTED
    "show",  # started
    "history",  # each snapshot's completion
    "owners",  # ACQUIRED, ENDED, LAST SEEN
    "rollbacks",  # AT
    "checkpoints",  # CREATED
    "tools list",  # UPDATED
    "requests",  # ASKED
    "events",  # STARTED
}
"""The commands whose text shows times: local, or UTC with ``--utc``."""


@pytest.mark.parametrize("path", sorted(EVERY_COMMAND))
def test_only_the_commands_that_print_times_take_utc(path: str) -> None:
    command: click.Command = main
    for name in path.split():
        assert isinstance(command, click.Group)
        command = command.commands[name]
    options = {opt for param in command.params for opt in param.opts}
    assert ("--utc" in options) == (path in PRINTS_TIMES), path
    if path not in PRINTS_TIMES:
        result = CliRunner().invoke(main, [*path.split(), "--utc"])
        assert result.exit_code == 2
        assert "No such option" in result.output
        assert "--utc" in result.output


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (
            ["worker", "--app", "teller_app:make_app", "--run", "r", "--group", "0/3"],
            "--nats",
        ),
        (WORKER[:-2], "--agents"),
        ([*WORKER, "--nats-patience", "0"], "--nats-patience"),
        ([*WORKER, "--lease", "soon"], "--lease"),
    ],
    ids=["no-nats", "no-placement", "patience", "lease"],
)
def test_a_worker_given_bad_options_is_a_usage_error(args: list[str], says: str) -> None:
    done = agentsnap(*args, "--db", "sqlite:///nowhere.db")
    assert done.code == 2, (done.out, done.err)
    assert "Traceback" not in done.err
    assert says in done.err
    assert not Path("nowhere.db").exists()


def test_a_worker_with_an_unreachable_nats_server_says_which(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    processes = sorted(["$env", *(f"teller-{i}" for i in range(9))])

    async def make() -> None:
        store = SqlStore(db)
        try:
            await store.create_run(RunInfo(id="abc", metadata={"processes": processes}))
        finally:
            await store.close()

    asyncio.run(make())
    nowhere = "nats://127.0.0.1:9"
    args = [nowhere if arg == "nats://127.0.0.1:4222" else arg for arg in WORKER]
    line = agentsnap(*args, "--db", db, env={"BANK_TELLERS": "9"}).one_line_error()
    assert f"cannot reach a NATS server at {nowhere}" in line


# 10. A reader that stops early


def closed_pipe(*args: str) -> Done:
    """Run the console script with its standard output a pipe whose reader is gone."""
    reader, writer = os.pipe()
    os.close(reader)  # as `| head` does once it has read enough
    try:
        done = subprocess.run(
            [str(AGENTSNAP), *args],
            stdout=writer,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        os.close(writer)
    return Done(done.returncode, "", done.stderr)


@pytest.mark.parametrize(
    "command",
    [
        ["export", "RUN"],
        ["export", "RUN", "-o", "-"],
        ["runs"],
        ["snapshots", "RUN"],
        ["history", "RUN", "--agent", "writer"],
        ["tools", "--json"],
        ["--help"],
    ],
    ids=" ".join,
)
def test_a_closed_pipe_ends_the_command_quietly(demo: Demo, command: list[str]) -> None:
    args = [demo.run_id if arg == "RUN" else arg for arg in command]
    done = closed_pipe(*args) if args == ["--help"] else closed_pipe(*args, "--db", demo.db)
    assert (done.code, done.err) == (0, "")


def test_the_commands_print_json_from_typed_results() -> None:
    """No command builds a JSON document by hand: each prints a model of ``_results`` or
    ``agentsnap.inspect``'s result, so a key is named once, in a field.
    """
    import ast

    def by_hand(node: ast.AST) -> bool:
        return (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "print_json"
            and any(
                isinstance(arg, (ast.Dict, ast.DictComp, ast.List, ast.ListComp))
                for arg in node.args
            )
        )

    built = [
        f"{path.name}:{getattr(node, 'lineno', 0)}"
        for path in sorted((ROOT / "agentsnap" / "cli").glob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if by_hand(node)
    ]
    assert not built, f"JSON built by hand at {built}: add a model to agentsnap/cli/_results.py"
