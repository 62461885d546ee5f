"""``examples/sdk_team.py`` killed with SIGKILL at its email, resumed, and the email sent once.

The example runs a pydantic-ai researcher, an OpenAI Agents SDK writer, a hand-written critic
and an MCP mail server it starts over stdio. ``--crash-after`` makes it kill itself at a
point of the email's call; the test resumes the run in a new process and counts, in the mail
server's own outbox, the emails sent.
"""

from __future__ import annotations

import re
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "sdk_team.py"
SUCCESS = "the critic's rejection took the whole team back, and the email went out once"
TIMEOUT = 60


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(EXAMPLE), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )


def requests(outbox: Path) -> list[tuple[str, int]]:
    """The ``send_email`` requests the mail server got: their key and attempt."""
    conn = sqlite3.connect(outbox)
    try:
        return conn.execute(
            "SELECT key, attempt FROM requests WHERE tool = 'send_email' ORDER BY rowid"
        ).fetchall()
    finally:
        conn.close()


def emails(outbox: Path) -> list[tuple[str, str]]:
    conn = sqlite3.connect(outbox)
    try:
        return conn.execute("SELECT key, body FROM outbox").fetchall()
    finally:
        conn.close()


@pytest.mark.parametrize(
    ("point", "attempts", "tool_status"),
    [
        # The server sent the email, its answer never recorded: the claim's outcome is
        # unknown, and the resumed run sends the call again under the same key.
        ("email-sent", [1, 2], "ok"),
        # The answer was recorded: the resumed run gets it without asking the server.
        ("email-recorded", [1], "replayed"),
    ],
)
def test_the_email_goes_out_once_across_a_kill_and_resume(
    tmp_path: Path, point: str, attempts: list[int], tool_status: str
) -> None:
    crashed = run("--crash-after", point, "--dir", str(tmp_path))
    report = f"stdout:\n{crashed.stdout}\nstderr:\n{crashed.stderr}"
    assert crashed.returncode == -signal.SIGKILL, report
    assert f"killed at {point} (SIGKILL)" in crashed.stdout, report
    (run_id,) = re.findall(r"^run ([0-9a-f]{32}) in ", crashed.stdout, re.MULTILINE)
    outbox = tmp_path / "mail.db"
    assert len(emails(outbox)) == 1, "the email went out before the kill"

    resumed = run("--resume", run_id, "--dir", str(tmp_path))
    report = f"stdout:\n{resumed.stdout}\nstderr:\n{resumed.stderr}"
    assert resumed.returncode == 0, report
    assert SUCCESS in resumed.stdout, report
    assert f"writer's tool send_email: {tool_status} " in resumed.stdout, report
    # Only the writer's last answer, never recorded before the kill, is asked for again.
    assert "model answers asked for by this process: 1 of 7 recorded" in resumed.stdout, report

    sent = emails(outbox)
    assert len(sent) == 1, sent
    key, body = sent[0]
    assert body.endswith("The Acme team")
    assert requests(outbox) == [(key, attempt) for attempt in attempts]
