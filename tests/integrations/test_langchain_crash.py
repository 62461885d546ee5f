"""A LangChain agent killed with SIGKILL and resumed: recorded answers, effects once.

``langchain_team.py`` runs the writer (a ``create_agent`` agent with the agentsnap
middleware, its model wording each email at random) and its critic in a child process, on
an SQLite store. The child stops at a chosen point and prints ``HANG``; the test kills it
with SIGKILL, then a new child resumes the run to its end. Then:

* a model call whose answer was recorded was not asked again: the resumed handler got the
  recorded ``AIMessage`` (the record counts the replay);
* the email went out once, under one idempotency key, across the rollback (the redo words
  it otherwise) and the crash, wherever the child was killed; the mail service counts every
  run of the tool's body and keeps each effect under the key it was handed;
* the critic accepted the redone answer, and the run succeeded.

The first test runs on SQLite and PostgreSQL, the others on SQLite. A run killed after its
rollback is resumed without the rollback's feedback (the runtime keeps ``ctx.feedback`` in
the process), so the writer may be rejected once more there; the effect still happens once.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path
from typing import IO

import pytest
from postgres_db import postgres_url_or_skip

from agentsnap import RunStatus
from agentsnap.model_calls import ModelCallRecord
from agentsnap.store.sql import SqlStore
from agentsnap.store.sql_ledger import SqlLedger

TEAM = Path(__file__).with_name("langchain_team.py")
ROOT = TEAM.parents[2]
TIMEOUT = 120


def _spawn(args: list[str], out: IO[bytes]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, str(TEAM), *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=out,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def _kill_at_hang(process: subprocess.Popen[bytes]) -> None:
    """Wait for the child to stop at its point, then kill it with SIGKILL."""
    assert process.stdout is not None
    for line in process.stdout:
        if line.strip() == b"HANG":
            break
    else:
        pytest.fail(f"the child ended (status {process.wait()}) without reaching its point")
    process.send_signal(signal.SIGKILL)
    assert process.wait(timeout=TIMEOUT) == -signal.SIGKILL
    process.stdout.close()


def _finish(process: subprocess.Popen[bytes]) -> dict[str, object]:
    out, _ = process.communicate(timeout=TIMEOUT)
    assert process.returncode == 0, out.decode()
    (line,) = [x for x in out.decode().splitlines() if x.startswith('{"result"')]
    result: dict[str, object] = json.loads(line)["result"]
    return result


async def _records(url: str, run_id: str) -> tuple[list[ModelCallRecord], RunStatus]:
    ledger, store = SqlLedger(url), SqlStore(url)
    try:
        calls = await ledger.list_model_calls(run_id)
        status = (await store.get_run(run_id)).status
    finally:
        await ledger.close()
        await store.close()
    return calls, status


def _service(path: Path) -> tuple[Counter[str], list[tuple[str, str]], list[tuple[str, str]]]:
    with sqlite3.connect(path) as db:
        asks = Counter(what for (what,) in db.execute("SELECT what FROM asks"))
        attempts = list(db.execute("SELECT key, text FROM attempts"))
        effects = list(db.execute("SELECT key, text FROM effects"))
    db.close()
    return asks, attempts, effects


def _crash_and_resume(
    tmp_path: Path, hang: str, url: str | None = None
) -> tuple[str, str, dict[str, object]]:
    url = url or f"sqlite:///{tmp_path / 'agentsnap.db'}"
    run_id = uuid.uuid4().hex
    with (tmp_path / "children.err").open("wb") as err:
        first = _spawn([url, str(tmp_path / "service.db"), run_id, "--hang", hang], err)
        try:
            _kill_at_hang(first)
        finally:
            if first.poll() is None:
                first.kill()
                first.wait()
            if first.stdout is not None:
                first.stdout.close()
        resumed = _spawn([url, str(tmp_path / "service.db"), run_id, "--resume"], err)
        result = _finish(resumed)
    return url, run_id, result


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def test_a_recorded_model_call_is_not_asked_again_after_sigkill(
    tmp_path: Path, backend: str
) -> None:
    given = postgres_url_or_skip() if backend == "postgres" else None
    # Killed in the read-only lookup: the model's first answer (its tool calls) is recorded.
    url, run_id, result = _crash_and_resume(tmp_path, "lookup", given)
    asks, attempts, effects = _service(tmp_path / "service.db")
    assert asks["plan"] == 1  # asked before the kill, replayed after it
    calls, status = asyncio.run(_records(url, run_id))
    first = calls[0]
    assert (first.timeline, first.position, first.replays) == (0, 0, 1)
    assert [c.replays for c in calls[1:]] == [0] * (len(calls) - 1)
    # The resumed handler called the tools the recorded answer asked for, with its words.
    (sent,) = first.answer().tool_calls[1:]
    assert len(effects) == 1
    assert attempts == [(effects[0][0], sent.arguments["text"])]
    assert status == RunStatus.SUCCEEDED
    assert str(result["accepted"]).startswith("Sorry for the delay")
    assert result["rollbacks"] == 1


@pytest.mark.parametrize(
    "hang",
    [
        pytest.param("final", id="killed-before-the-rollback"),
        pytest.param("redo-final", id="killed-after-the-rollback"),
        pytest.param("effect", id="killed-in-the-effect"),
    ],
)
def test_an_email_worded_at_random_goes_out_once_across_rollback_and_crash(
    tmp_path: Path, hang: str
) -> None:
    url, run_id, result = _crash_and_resume(tmp_path, hang)
    asks, attempts, effects = _service(tmp_path / "service.db")
    calls, status = asyncio.run(_records(url, run_id))
    # One effect, under one key, whatever the model wrote on each timeline.
    assert len(effects) == 1, effects
    (key, text) = effects[0]
    plans = [c for c in calls if c.position == 0]
    assert [c.timeline for c in plans][:2] == [0, 1]
    worded = [c.answer().tool_calls[1].arguments["text"] for c in plans]
    assert len(set(worded)) == len(worded)  # every redo words the email otherwise...
    assert text == worded[0]  # ...and gets the outcome of the one that went out
    # The tool's body ran once; killed inside it, the outcome was unknown, and it ran again
    # under the same key, which the service deduplicated.
    assert [k for k, _ in attempts] == [key] * (2 if hang == "effect" else 1)
    emails = [c for c in calls if c.answer().tool_calls]
    # No recorded call was asked again: one question per record, and the one the kill cut
    # short (asked, never answered).
    assert sum(asks.values()) == len(calls) + (hang != "effect")
    assert asks["plan"] == 1
    assert any(c.replays for c in emails)  # the resumed handler got a recorded answer
    assert status == RunStatus.SUCCEEDED
    assert str(result["accepted"]).startswith("Sorry for the delay")
