"""An OpenAI Agents SDK agent killed with SIGKILL and resumed: recorded answers, one effect.

``openai_agents_child.py`` runs a writer, an SDK agent with a sampled model (other words on
every call, fresh randomness in every process) that emails through the ledger, and a critic
who rejects answers that do not apologise. The test kills the child while the model hangs at
a chosen ask, then resumes the run in a new child:

* a model call whose answer was recorded is not asked again: the resumed handler gets the
  recorded answer (and the SDK's response rebuilt from it);
* the email is sent once, under one idempotency key, across the rollback and the crash,
  however the redo's model words it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

from agentsnap import RunStatus
from agentsnap.store.sql import SqlStore
from agentsnap.store.sql_ledger import SqlLedger

from .openai_agents_child import SERVICE_SCHEMA

CHILD = Path(__file__).with_name("openai_agents_child.py")
ROOT = Path(__file__).parents[2]


def make_service(tmp_path: Path) -> Path:
    path = tmp_path / "service.db"
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.executescript(SERVICE_SCHEMA)
        conn.commit()
    return path


def rows(service: Path, query: str) -> list[tuple[object, ...]]:
    with contextlib.closing(sqlite3.connect(service, timeout=60)) as conn:
        return list(conn.execute(query).fetchall())


def spawn(url: str, service: Path, run_id: str, *args: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, str(CHILD), url, str(service), run_id, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )


def kill_at_ask(process: subprocess.Popen[bytes], service: Path, asks: int) -> None:
    """Kill the child once the model is asked for the ``asks``-th time (where it hangs)."""
    deadline = time.monotonic() + 60
    while len(rows(service, "SELECT step FROM asks")) < asks:
        if process.poll() is not None:
            _, err = process.communicate()
            pytest.fail(f"the child ended before ask {asks}: {err.decode()[-2000:]}")
        if time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"the child never reached ask {asks}")
        time.sleep(0.02)
    os.kill(process.pid, signal.SIGKILL)
    process.communicate(timeout=30)  # reaps it, and closes its pipes


def finish(process: subprocess.Popen[bytes]) -> dict[str, object]:
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err.decode()[-3000:]
    line = out.decode().strip().splitlines()[-1]
    result = json.loads(line)["result"]
    assert isinstance(result, dict)
    return result


async def stored(url: str, run_id: str) -> tuple[RunStatus, list[tuple[int, int, int]]]:
    """The run's status and its model calls: ``(timeline, position, replays)``."""
    store = SqlStore(url)
    ledger = SqlLedger(url, create=False)
    try:
        status = (await store.get_run(run_id)).status
        calls = await ledger.list_model_calls(run_id)
    finally:
        await ledger.close()
        await store.close()
    return status, [(c.timeline, c.position, c.replays) for c in calls]


def database(backend: str, tmp_path: Path) -> str:
    if backend == "postgres":
        from postgres_db import postgres_url_or_skip

        return postgres_url_or_skip()
    return f"sqlite:///{tmp_path / 'agentsnap.db'}"


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def test_a_recorded_model_call_is_replayed_after_sigkill_and_resume(
    tmp_path: Path, backend: str
) -> None:
    url = database(backend, tmp_path)
    service = make_service(tmp_path)
    run_id = uuid.uuid4().hex
    # Ask 1: the model asks for the email (recorded), which is sent; ask 2 hangs: killed.
    first = spawn(url, service, run_id, "--accept-all", "--hang-at", "2")
    kill_at_ask(first, service, 2)
    asked = rows(service, "SELECT step, timeline, pid FROM asks")
    assert [(s, t) for s, t, _ in asked] == [("call", 0), ("answer", 0)]

    result = finish(spawn(url, service, run_id, "--accept-all", "--resume"))

    asked = rows(service, "SELECT step, timeline, pid FROM asks")
    # The first call was recorded: the resumed handler got its answer without asking. The
    # second was never recorded (the process died while the model answered): asked again.
    assert Counter((s, t) for s, t, _ in asked) == {("call", 0): 1, ("answer", 0): 2}
    effects = rows(service, "SELECT key, pid FROM effects")
    assert len(effects) == 1
    assert effects[0][1] == asked[0][2]  # sent by the first process, never again
    assert result["tool_calls"] == ["replayed"]
    status, calls = asyncio.run(stored(url, run_id))
    assert status is RunStatus.SUCCEEDED
    assert calls == [(0, 0, 1), (0, 1, 0)]


def test_a_streamed_call_recorded_before_a_crash_streams_its_recorded_answer(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'agentsnap.db'}"
    service = make_service(tmp_path)
    run_id = uuid.uuid4().hex
    first = spawn(url, service, run_id, "--accept-all", "--stream", "--hang-at", "2")
    kill_at_ask(first, service, 2)

    result = finish(spawn(url, service, run_id, "--accept-all", "--stream", "--resume"))

    asked = rows(service, "SELECT step, timeline FROM asks")
    assert Counter(asked) == {("call", 0): 1, ("answer", 0): 2}  # the call: not asked again
    assert len(rows(service, "SELECT key FROM effects")) == 1
    seen = result["streamed"]
    assert isinstance(seen, list)
    events = [tuple(e) for e in seen]
    # The resumed process streamed the recorded call (made from its record: the function
    # call added and done, the response completed), then the answer the model streamed.
    added = [item for kind, item in events if kind == "response.output_item.added"]
    assert added == ["function_call", "message"]
    assert events.count(("response.completed", None)) == 2
    assert ("response.output_text.delta", None) in events
    status, calls = asyncio.run(stored(url, run_id))
    assert status is RunStatus.SUCCEEDED
    assert calls == [(0, 0, 1), (0, 1, 0)]


@pytest.mark.parametrize(
    ("hang_at", "replayed", "tool"),
    [
        pytest.param(2, True, "agentsnap", id="before-the-first-answer"),
        pytest.param(3, False, "agentsnap", id="as-the-redo-asks-again"),
        pytest.param(4, True, "agentsnap", id="before-the-redos-answer"),
        # The SDK's own @function_tool, declared nowhere: ledger-backed by default.
        pytest.param(2, True, "sdk", id="sdk-tool-before-the-first-answer"),
        pytest.param(4, True, "sdk", id="sdk-tool-before-the-redos-answer"),
    ],
)
def test_an_email_is_sent_once_across_a_rollback_and_a_crash(
    tmp_path: Path, hang_at: int, replayed: bool, tool: str
) -> None:
    url = f"sqlite:///{tmp_path / 'agentsnap.db'}"
    service = make_service(tmp_path)
    run_id = uuid.uuid4().hex
    options = ("--sdk-tool",) if tool == "sdk" else ()
    first = spawn(url, service, run_id, "--hang-at", str(hang_at), *options)
    kill_at_ask(first, service, hang_at)

    result = finish(spawn(url, service, run_id, "--resume", *options))

    # Every email the service received, by idempotency key: one, once.
    effects = rows(service, "SELECT key, text FROM effects")
    assert len(effects) == 1, effects
    assert "sorry" in str(result["accepted"]).lower()
    tool_calls = result["tool_calls"]
    assert isinstance(tool_calls, list)
    assert set(tool_calls) == {"replayed"}
    asked = rows(service, "SELECT step, timeline, pid FROM asks")
    counts = Counter((str(s), int(t)) for s, t, _ in asked)  # type: ignore[call-overload]
    # The model was asked for the email once on the first timeline: the resumed handler
    # got the recorded answer, and the redo after the rollback asked again, with other
    # words (a sampled model), and got the recorded email instead of a second one.
    assert counts[("call", 0)] == 1
    assert max(t for _, t in counts) >= 1
    status, calls = asyncio.run(stored(url, run_id))
    assert status is RunStatus.SUCCEEDED
    # Killed after a call was recorded, the resumed handler replays it; killed while the
    # redo's first call was asked, there was nothing recorded on that timeline to replay.
    assert (sum(replays for *_, replays in calls) >= 1) is replayed
