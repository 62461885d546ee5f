"""A pydantic-ai agent killed with SIGKILL and resumed: recorded answers, effects once.

``pydantic_ai_crash_run.py`` runs in a child process, which hangs at a chosen point and is
killed with SIGKILL; a new child ``resume()``s the run from its SQL store. The clerk's model
words its tool call at random each time it is asked, and its tool records its effect in an
outside table keyed by the idempotency key it was handed. Then:

* every asking of the model is a recorded call (the log of askings matches the ledger's
  calls one for one): no recorded answer was asked for again, the call recorded before the
  kill was replayed;
* the refund happened once, under the key of the ledger's entry, across the rollback (the
  redo worded it otherwise) and the crash;
* the critic accepted the answer written with its feedback;
* streamed (``--stream``, an event-stream handler): every asking of the model was streamed to
  the handler once, and no replayed answer again; no tool call's event was handed over twice;
* with the refund served by an MCP server (``--mcp``): the resumed process lists the server's
  tools again (tool listing is not a recorded step) and that is harmless: the answers are
  the recorded ones, the refund happened once.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from postgres_db import postgres_url_or_skip

from agentsnap import RunStatus
from agentsnap.store.sql import SqlStore
from agentsnap.store.sql_ledger import SqlLedger

RUN = Path(__file__).with_name("pydantic_ai_crash_run.py")
ROOT = RUN.parents[2]
TIMEOUT = 120


def child(*args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-W", "error", str(RUN), *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def kill_when_hanging(process: subprocess.Popen[str]) -> None:
    assert process.stdout is not None
    for line in process.stdout:
        if line.strip() == "HANG":
            break
    else:
        _, err = process.communicate(timeout=TIMEOUT)
        pytest.fail(f"the child ended without hanging:\n{err}")
    os.kill(process.pid, signal.SIGKILL)
    process.communicate(timeout=TIMEOUT)
    assert process.returncode == -signal.SIGKILL


@pytest.mark.parametrize("stream", [False, True], ids=["run", "streamed"])
@pytest.mark.parametrize("hang_at", ["effect", "critic"])
@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
async def test_a_killed_run_resumes_with_recorded_answers_and_one_effect(
    tmp_path: Path, hang_at: str, backend: str, stream: bool
) -> None:
    url = postgres_url_or_skip() if backend == "postgres" else f"sqlite:///{tmp_path / 'a.db'}"
    service, asks = tmp_path / "service.db", tmp_path / "asks.jsonl"
    events = tmp_path / "events.jsonl"
    run_id = uuid.uuid4().hex
    common = (url, str(service), str(asks), run_id, *(("--stream", str(events)) if stream else ()))
    with child(*common, "--hang-at", hang_at) as first:
        kill_when_hanging(first)
    asked_before = len(asks.read_text().splitlines())
    with child(*common, "--resume") as resumed:
        out, err = resumed.communicate(timeout=TIMEOUT)
    assert resumed.returncode == 0, err
    (report,) = [json.loads(line)["result"] for line in out.splitlines() if "result" in line]

    assert report["accepted"] == "Order A17 is refunded. Sorry for the trouble."
    store, ledger = SqlStore(url), SqlLedger(url, create=False)
    try:
        assert (await store.get_run(run_id)).status == RunStatus.SUCCEEDED
        calls = await ledger.list_model_calls(run_id, "clerk")
        entries = [e for e in await ledger.list_calls(run_id) if e.tool == "refund"]
    finally:
        await store.close()
        await ledger.close()

    # Every asking is one recorded call; the ones recorded before the kill were replayed.
    asked = len(asks.read_text().splitlines())
    assert asked == len(calls) == 4
    assert {call.timeline for call in calls} == {0, 1}
    assert asked_before >= 1
    assert sum(call.replays for call in calls) >= 1
    assert all(call.answer().native is not None for call in calls)

    # The refund happened once, under the ledger's key, though the redo worded it otherwise.
    with sqlite3.connect(service) as db:
        rows = db.execute("SELECT key, effect FROM effects").fetchall()
    (entry,) = entries
    assert rows == [(entry.key, "refund:A17")]

    if stream:
        handed = [json.loads(line) for line in events.read_text().splitlines()]
        # Each asking streamed once to the handler (one part per answer); replays not at all.
        assert sum(e["kind"] == "part_start" for e in handed) == asked
        calls = [e["call"] for e in handed if e["kind"] == "function_tool_call"]
        assert calls
        assert len(set(calls)) == len(calls), handed


async def test_a_resumed_run_lists_mcp_tools_again_and_that_changes_nothing(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'a.db'}"
    service, asks = tmp_path / "service.db", tmp_path / "asks.jsonl"
    listings = tmp_path / "listings.jsonl"
    run_id = uuid.uuid4().hex
    common = (url, str(service), str(asks), run_id, "--mcp", str(listings))
    with child(*common, "--hang-at", "critic") as first:
        kill_when_hanging(first)
    listed_before = {json.loads(line)["pid"] for line in listings.read_text().splitlines()}
    asked_before = len(asks.read_text().splitlines())
    with child(*common, "--resume") as resumed:
        out, err = resumed.communicate(timeout=TIMEOUT)
    assert resumed.returncode == 0, err
    (report,) = [json.loads(line)["result"] for line in out.splitlines() if "result" in line]
    assert report["accepted"] == "Order A17 is refunded. Sorry for the trouble."

    # The resumed process listed the tools again ...
    listed = [json.loads(line)["pid"] for line in listings.read_text().splitlines()]
    assert listed_before == {first.pid}
    assert resumed.pid in listed
    # ... and asked nothing: every answer it needed was recorded before the kill.
    assert len(asks.read_text().splitlines()) == asked_before == 4
    store, ledger = SqlStore(url), SqlLedger(url, create=False)
    try:
        calls = await ledger.list_model_calls(run_id, "clerk")
        entries = [e for e in await ledger.list_calls(run_id) if e.tool == "refund"]
    finally:
        await store.close()
        await ledger.close()
    assert len(calls) == 4
    assert sum(call.replays for call in calls) >= 1
    # One refund through the ledger, done once by the server.
    assert len(entries) == 1
    with sqlite3.connect(service) as db:
        rows = db.execute("SELECT effect, pid FROM effects").fetchall()
    assert rows == [("refund:A17", first.pid)]
