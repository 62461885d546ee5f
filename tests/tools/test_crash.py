"""SIGKILL between a tool's effect and its recorded outcome, then resume.

The charge reached the payment service (its own table says so), but the process died before
the ledger recorded the outcome. Resuming the run re-executes the handler, which derives the
same key: the ledger reports the outcome as unknown instead of charging again, the export
shows it, and once a person resolves it the run goes on with the recorded result.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import sqlalchemy
from click.testing import CliRunner

from agentsnap.cli import main as cli
from agentsnap.store import migrate

WORKER = Path(__file__).with_name("crash_worker.py")
RUN_ID = "c0ffee" * 4


def worker(mode: str, url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(WORKER), mode, url, RUN_ID],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def charges(url: str) -> list[tuple[Any, ...]]:
    engine = sqlalchemy.create_engine(migrate.sync_url(url))
    try:
        with engine.connect() as conn:
            return [
                tuple(row)
                for row in conn.execute(
                    sqlalchemy.text("SELECT card, amount FROM crash_test_charges")
                )
            ]
    finally:
        engine.dispose()


def export(url: str) -> dict[str, Any]:
    result = CliRunner().invoke(cli, ["export", RUN_ID, "--db", url])
    assert result.exit_code == 0, result.output
    document: dict[str, Any] = json.loads(result.output)
    return document


def test_a_kill_after_the_effect_is_reported_on_resume_not_re_run(db_url: str) -> None:
    migrate.upgrade(db_url)
    engine = sqlalchemy.create_engine(migrate.sync_url(db_url))
    with engine.begin() as conn:
        conn.execute(sqlalchemy.text("CREATE TABLE crash_test_charges (card TEXT, amount INT)"))
    engine.dispose()

    crashed = worker("crash", db_url)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    assert charges(db_url) == [("4242", 500)], "the charge happened before the kill"
    (claim,) = export(db_url)["tool_calls"]
    assert claim["status"] == "in_progress", "claimed, and no outcome recorded"

    resumed = worker("resume", db_url)
    assert resumed.returncode == 0, resumed.stderr
    report = json.loads(resumed.stdout)
    ((error_type, message),) = report["failures"]
    assert error_type == "ToolOutcomeUnknown"
    assert f"agentsnap tools resolve {claim['key']}" in message
    assert charges(db_url) == [("4242", 500)], "the charge was not silently made again"
    (call,) = report["tool_calls"]
    assert (call["key"], call["status"]) == (claim["key"], "error")
    (entry,) = export(db_url)["tool_calls"]
    assert (entry["key"], entry["status"]) == (claim["key"], "unknown")

    # A person checks the payment service, sees the charge, and records it.
    resolved = CliRunner().invoke(
        cli, ["tools", "resolve", claim["key"], "--result", '{"amount": 500}', "--db", db_url]
    )
    assert resolved.exit_code == 0, resolved.output
    again = worker("resume", db_url)
    assert again.returncode == 0, again.stderr
    report = json.loads(again.stdout)
    assert report["failures"] == []
    assert report["memory"] == {"receipt": {"amount": 500}}
    assert [call["status"] for call in report["tool_calls"]] == ["replayed"]
    assert charges(db_url) == [("4242", 500)]
    (entry,) = export(db_url)["tool_calls"]
    assert entry["status"] == "succeeded"
